//! How a contender judges a *bound* record (see [`Binding`]): by its member's object, and by
//! what that object lists as handed on ([`HANDED_SHARDS_ANNOTATION`](super::HANDED_SHARDS_ANNOTATION)).
//! The decisions are [`protocol`]'s (`member_verdict`, `bound_record`, `handed_record`); this
//! module is the I/O around them: the namespace watch first, then a read, then the release of an
//! expired version.
//!
//! # The member's object
//!
//! The member's object is not the one a claim writes, so the compare-and-swap of the claim
//! cannot tell what happened to the member meanwhile, and the namespace watch may lag (after a
//! broken watch resumes, the changes it missed arrive after it counts as synced again): a view
//! can show an *older* incarnation, a release before the holder's new claim, or no object
//! before its creation. So only "held" and "handed on" are taken from the watch's view (a
//! lagging view only makes it more careful; an entry, once written, stays until the record it
//! lists moved on); every "free" is confirmed by a read of the member object (a quorum read:
//! the object as it is now). In that read, any other holder or incarnation, a release or no
//! object means the bound incarnation is over for good (an incarnation never lives again); the
//! bound incarnation itself is free only once its version has stood for the member's duration
//! since this process first received it. A member object whose deletion the namespace watch
//! received (by its `uid`) needs no read: that object is gone for good. What a read found over
//! is remembered per session, and one read at a time is made per member object: when a node
//! dies, the claims of its shards on one node read its member object once, not once each.
//!
//! # Handed on, and why an expired member is released first
//!
//! A member tenure that ends with [`Lease::retire_handing`](crate::Lease::retire_handing)
//! releases its object in one compare-and-swap that lists, for its incarnation, each bound
//! shard and its target (an owner and that owner's member incarnation). A record bound to that
//! incarnation and listed is the target's to claim while the target's member object shows the
//! target's incarnation held: the target claims it at once with a compare-and-swap (the record's
//! fencing token plus one, its own binding), and no other contender claims it meanwhile; once
//! the target's incarnation is over, it is free for anyone.
//!
//! The handover is written on the member object, a claim on the shard's: a handover sent before
//! the member's deadline could land after a contender judged the member's last version expired
//! and claimed a shard, and the target, seeing the list, would claim that shard too (and lose
//! its compare-and-swap, but only after the contender's worker started). So a contender that
//! finds the member expired first *releases the member object* with a compare-and-swap on the
//! expired version, and counts its shards free only once that write landed (or the object shows
//! the incarnation over): of the handover and the release, only the first to land succeeds, and
//! the other is refused.
//!
//! # A member found expired hands its shards on too
//!
//! That release may carry a list of its own: where this session planned the expired tenure's
//! shards to go ([`Lease::plan_hand_on`](crate::Lease::plan_hand_on): the sharded workers plan
//! it from their placement as soon as their view shows the member expired). Only records the
//! namespace watch shows held by that tenure are listed ([`protocol::listable`]), and entries of
//! earlier incarnations stay. The list is written after the same confirmation as any claim by
//! expiry (the tenure's holder has passed its own deadline by then): one write names a dead
//! node's targets, each of which then claims its shards at once. The records still name the dead
//! holder until claimed, so a record of *this* owner bound to another member tenure than the one
//! it claims under is judged by this same rule, not as its own.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use kube::api::Api;
use tokio::time::Instant;

use super::record::{
    duration_of, handed_shards_of, holder_of, incarnation_of, post_params, set_handed_shards, slim,
};
use super::{object_name, KubernetesBackend, KubernetesError};
use crate::binding::{Binding, HandedShard, HandedShards};
use crate::group::GroupRecord;
use crate::protocol::{self, MemberSeen, MemberVerdict, RecordSeen, Source, Step};

/// How many member objects a session remembers an ended incarnation of.
const ENDED_KEPT: usize = 1024;

/// How many times a confirmation reads the member object again after its release of an
/// expired version met a newer one.
const CONFIRM_ATTEMPTS: u32 = 3;

/// A bound record as this lease's contender judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BoundState {
    /// Held by `holder` (the record's, or the target it was listed to) until at least `until`.
    Held {
        holder: String,
        until: Option<Instant>,
    },
    /// Free for this owner: a claim (a compare-and-swap on the version judged) writes the
    /// record's `leaseTransitions` plus one. A record listed to this very owner under the member
    /// tenure it claims with is free for it alone, at once.
    Free,
}

/// A member object: its namespace and name.
type ObjectKey = (String, String);

/// An incarnation over for good, with what its object listed as handed on.
type Ended = (String, Option<Arc<HandedShards>>);

/// An incarnation, and where its bound shards go should it be found expired.
type Planned = (String, Arc<Vec<HandedShard>>);

/// What a session knows of member incarnations that are over (shared by its leases).
#[derive(Default)]
pub(super) struct EndedMembers {
    /// Per `(namespace, object)`: an incarnation over for good, with what its object listed as
    /// handed on when that was found.
    ended: Mutex<HashMap<ObjectKey, Ended>>,
    /// One confirmation at a time per member object.
    locks: Mutex<HashMap<ObjectKey, Arc<tokio::sync::Mutex<()>>>>,
    /// Per `(namespace, object)`: where the shards bound to an incarnation go should a claim of
    /// this session find it expired ([`Lease::plan_hand_on`](crate::Lease::plan_hand_on)).
    planned: Mutex<HashMap<ObjectKey, Planned>>,
    /// Per `(namespace, object)`: a version the watch showed expired that a read found renewed
    /// since, and until when the member lives at least (the confirmations waiting behind that
    /// read, which saw the same version expire, need not read again).
    lives: Mutex<HashMap<ObjectKey, (String, Instant)>>,
}

impl EndedMembers {
    /// Whether incarnation `incarnation` of `object` is known over, with its object's list.
    fn ended(
        &self,
        namespace: &str,
        object: &str,
        incarnation: &str,
    ) -> Option<Option<Arc<HandedShards>>> {
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        ended
            .get(&(namespace.to_owned(), object.to_owned()))
            .filter(|(known, _)| known == incarnation)
            .map(|(_, handed)| handed.clone())
    }

    fn set_ended(
        &self,
        namespace: &str,
        object: &str,
        incarnation: &str,
        handed: Option<Arc<HandedShards>>,
    ) {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        if ended.len() >= ENDED_KEPT {
            ended.clear();
        }
        ended.insert(
            (namespace.to_owned(), object.to_owned()),
            (incarnation.to_owned(), handed),
        );
    }

    /// Until when the member of `object` lives, as a read found when the watch showed version
    /// `version` expired, if that is still ahead.
    fn lives_until(&self, namespace: &str, object: &str, version: &str) -> Option<Instant> {
        let lives = self.lives.lock().unwrap_or_else(|p| p.into_inner());
        lives
            .get(&(namespace.to_owned(), object.to_owned()))
            .filter(|(known, until)| known == version && Instant::now() < *until)
            .map(|(_, until)| *until)
    }

    fn set_lives(&self, namespace: &str, object: &str, version: &str, until: Instant) {
        let mut lives = self.lives.lock().unwrap_or_else(|p| p.into_inner());
        if lives.len() >= ENDED_KEPT {
            let now = Instant::now();
            lives.retain(|_, (_, until)| now < *until);
        }
        lives.insert(
            (namespace.to_owned(), object.to_owned()),
            (version.to_owned(), until),
        );
    }

    /// Keeps `handed` as the plan for incarnation `incarnation` of `object` (replacing any
    /// earlier plan for that object).
    pub(super) fn plan(
        &self,
        namespace: &str,
        object: &str,
        incarnation: &str,
        handed: Vec<HandedShard>,
    ) {
        let mut planned = self.planned.lock().unwrap_or_else(|p| p.into_inner());
        if planned.len() >= ENDED_KEPT {
            planned.clear();
        }
        planned.insert(
            (namespace.to_owned(), object.to_owned()),
            (incarnation.to_owned(), Arc::new(handed)),
        );
    }

    /// The plan for incarnation `incarnation` of `object`, if one is kept.
    fn planned(
        &self,
        namespace: &str,
        object: &str,
        incarnation: &str,
    ) -> Option<Arc<Vec<HandedShard>>> {
        let planned = self.planned.lock().unwrap_or_else(|p| p.into_inner());
        planned
            .get(&(namespace.to_owned(), object.to_owned()))
            .filter(|(known, _)| known == incarnation)
            .map(|(_, handed)| Arc::clone(handed))
    }

    fn lock_of(&self, namespace: &str, object: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        if locks.len() >= ENDED_KEPT {
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        }
        Arc::clone(
            locks
                .entry((namespace.to_owned(), object.to_owned()))
                .or_default(),
        )
    }
}

/// What `handed` lists for shard lease `lease` bound to incarnation `incarnation`.
fn listed_in<'a>(
    handed: Option<&'a HandedShards>,
    incarnation: &str,
    lease: &str,
) -> Option<(&'a str, &'a Binding)> {
    handed?.target(incarnation, lease)
}

/// `record` (a member record of the namespace watch, or one read) as [`protocol`] takes it, with
/// what it lists for `lease` under `incarnation`.
fn member_seen<'a>(
    record: &'a GroupRecord,
    expires_at: Option<Instant>,
    incarnation: &str,
    lease: &str,
) -> MemberSeen<'a> {
    MemberSeen {
        holder: record.holder.as_deref(),
        incarnation: record.incarnation.as_deref(),
        expires_at,
        listed: listed_in(record.handed.as_deref(), incarnation, lease),
    }
}

impl KubernetesBackend {
    /// This lease's record, held by `holder` and bound to `binding`, as this process judges it
    /// (see the module docs, and [`protocol`] for the rules); `me` is this owner with the member
    /// tenure it would bind to.
    pub(super) async fn bound_state(
        &self,
        api: &Api<LeaseObject>,
        binding: &Binding,
        holder: &str,
        me: Option<(&str, &Binding)>,
    ) -> Result<BoundState, KubernetesError> {
        let member = self.member_state(api, binding, holder).await?;
        let step = match protocol::bound_record(holder, member, me) {
            Step::Target { owner, to } => {
                let target = self.member_state(api, &to, &owner).await?;
                protocol::handed_record(&owner, target)
            }
            step => step,
        };
        Ok(match step {
            Step::Held { holder, until } => BoundState::Held { holder, until },
            Step::Claim => BoundState::Free,
            // `member_state` reads and confirms itself: it answers neither.
            Step::Target { .. } | Step::Confirm | Step::Read => {
                unreachable!("member_state answers only Lives, Over or Handed")
            }
        })
    }

    /// Member incarnation `binding` held by `holder`: whether it lives (until when, at least),
    /// is over, or listed this lease's record ([`MemberVerdict::Lives`], [`Over`] or
    /// [`Handed`]: the namespace watch first, then a read, and the release of an expired
    /// version, as [`protocol::member_verdict`] asks).
    ///
    /// [`Over`]: MemberVerdict::Over
    /// [`Handed`]: MemberVerdict::Handed
    async fn member_state(
        &self,
        api: &Api<LeaseObject>,
        binding: &Binding,
        holder: &str,
    ) -> Result<MemberVerdict, KubernetesError> {
        let object = object_name(binding.member());
        let incarnation = binding.incarnation();
        let namespace = self.namespace.as_str();
        let now = Instant::now();
        // The version the watch shows held but expired, if it does.
        let mut seen_version = None;
        if let Some(Some((record, version))) = self.hub.record_of(namespace, &object) {
            let seen = member_seen(&record, record.expires_at, incarnation, &self.name);
            match protocol::member_verdict(Some(seen), Source::Watch, incarnation, holder, now) {
                verdict @ (MemberVerdict::Lives { .. } | MemberVerdict::Handed { .. }) => {
                    return Ok(verdict)
                }
                _ => {
                    let holds = record.holder.as_deref() == Some(holder)
                        && record.incarnation.as_deref() == Some(incarnation);
                    if holds {
                        seen_version = version;
                    }
                }
            }
        }
        let known_over = |this: &Self| {
            this.hub
                .ended
                .ended(namespace, &object, incarnation)
                .map(
                    |handed| match listed_in(handed.as_deref(), incarnation, &this.name) {
                        Some((owner, to)) => MemberVerdict::Handed {
                            owner: owner.to_owned(),
                            to: to.clone(),
                        },
                        None => MemberVerdict::Over,
                    },
                )
        };
        if let Some(verdict) = known_over(self) {
            return Ok(verdict);
        }
        // The bound incarnation's object was deleted (its holder retired it once every shard it
        // handed on had moved on): a deletion the watch received is final, judged as a read
        // that finds no object (an object's `uid` never lives again).
        let uid = incarnation.split('/').next().unwrap_or_default();
        // The verdict of a read that finds no object.
        let gone = |now| protocol::member_verdict(None, Source::Read, incarnation, holder, now);
        if !uid.is_empty() && self.hub.was_deleted(namespace, uid) {
            return Ok(gone(now));
        }
        let lock = self.hub.ended.lock_of(namespace, &object);
        let _one_at_a_time = lock.lock().await;
        if let Some(verdict) = known_over(self) {
            return Ok(verdict);
        }
        // The version the watch shows expired was read live meanwhile (by the confirmation
        // this one waited behind).
        if let Some(until) = seen_version
            .as_deref()
            .and_then(|v| self.hub.ended.lives_until(namespace, &object, v))
        {
            return Ok(MemberVerdict::Lives { until: Some(until) });
        }
        for _ in 0..CONFIRM_ATTEMPTS {
            self.counters.gets.fetch_add(1, Ordering::Relaxed);
            let read = api
                .get_opt(&object)
                .await
                .map_err(|e| self.error("get", e))?;
            let now = Instant::now();
            let Some(member) = read else {
                self.hub
                    .ended
                    .set_ended(namespace, &object, incarnation, None);
                return Ok(gone(now));
            };
            let handed = handed_shards_of(&member).map(Arc::new);
            let version = member.metadata.resource_version.clone();
            // From when this process first received the version read (by the namespace watch,
            // or by an earlier read of this instance): the observed-time rule.
            let first_seen = match version.as_deref() {
                None => now,
                Some(v) => {
                    let mut state = self.lock();
                    let read_before = state
                        .member_seen
                        .as_ref()
                        .filter(|(o, seen, _)| *o == object && seen == v)
                        .map(|(_, _, at)| *at);
                    let at = read_before.unwrap_or(now);
                    state.member_seen = Some((object.clone(), v.to_owned(), at));
                    self.hub
                        .first_seen(namespace, &object, v)
                        .map_or(at, |watched| watched.min(at))
                }
            };
            let record = GroupRecord::new(holder_of(&member).map(str::to_owned), None, None)
                .with_incarnation(incarnation_of(&member));
            let record = GroupRecord {
                handed: handed.clone(),
                ..record
            };
            let seen = member_seen(
                &record,
                Some(first_seen + duration_of(&member)),
                incarnation,
                &self.name,
            );
            match protocol::member_verdict(Some(seen), Source::Read, incarnation, holder, now) {
                verdict @ (MemberVerdict::Over | MemberVerdict::Handed { .. }) => {
                    // Over for good: released (handing on or not), another holder or
                    // incarnation.
                    self.hub
                        .ended
                        .set_ended(namespace, &object, incarnation, handed);
                    return Ok(verdict);
                }
                MemberVerdict::Lives { until } => {
                    // Remembered against the version the watch showed expired: the claims that
                    // saw the same need not read again.
                    if let (Some(seen), Some(until)) = (seen_version.as_deref(), until) {
                        self.hub.ended.set_lives(namespace, &object, seen, until);
                    }
                    return Ok(MemberVerdict::Lives { until });
                }
                MemberVerdict::Expired => {}
                MemberVerdict::Unsure => unreachable!("a read is never unsure"),
            }
            // Expired: released here before anything bound to it counts free (see the module
            // docs), listing the shards this session planned to hand on; a newer version met
            // instead is read and judged again.
            if let Some(handed) = self.release_expired(api, &object, member, binding).await? {
                let verdict = match listed_in(handed.as_deref(), incarnation, &self.name) {
                    Some((owner, to)) => MemberVerdict::Handed {
                        owner: owner.to_owned(),
                        to: to.clone(),
                    },
                    None => MemberVerdict::Over,
                };
                self.hub
                    .ended
                    .set_ended(namespace, &object, incarnation, handed);
                return Ok(verdict);
            }
        }
        Err(KubernetesError::Conflict {
            object: object.clone(),
            attempts: CONFIRM_ATTEMPTS,
        })
    }

    /// Releases `member` (object `object`, expired at the version read, member tenure
    /// `binding`) with a compare-and-swap on that version, keeping everything else it holds,
    /// and adding to its list of shards handed on those this session planned for that tenure
    /// (see [`plan`](EndedMembers::plan)) that the watch shows bound to it: `Some` with what
    /// the object lists once it is released (`Some(None)` when gone), `None` when a newer
    /// version stands (read it again).
    async fn release_expired(
        &self,
        api: &Api<LeaseObject>,
        object: &str,
        member: LeaseObject,
        binding: &Binding,
    ) -> Result<Option<Option<Arc<HandedShards>>>, KubernetesError> {
        let incarnation = binding.incarnation();
        let holder = holder_of(&member).unwrap_or_default().to_owned();
        let holder = holder.as_str();
        let mut entries = handed_shards_of(&member);
        let mut released = slim(member);
        if let Some(spec) = released.spec.as_mut() {
            spec.holder_identity = None;
        }
        let listed: Vec<HandedShard> = self
            .hub
            .ended
            .planned(&self.namespace, object, incarnation)
            .map(|plan| {
                plan.iter()
                    .filter(|shard| self.listable(shard.lease(), holder, binding))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if !listed.is_empty() {
            // (entries of earlier incarnations stay as they are: a record may still follow one)
            entries
                .get_or_insert_with(HandedShards::default)
                .add(incarnation, &listed);
            if let Some(entries) = &entries {
                set_handed_shards(&mut released, entries);
            }
        }
        self.counters.updates.fetch_add(1, Ordering::Relaxed);
        match api.replace(object, &post_params(), &released).await {
            Ok(_) => {
                tracing::debug!(object = %object, lease = %self.name, handed = listed.len(), "released an expired member object before claiming a record bound to it");
                Ok(Some(entries.map(Arc::new)))
            }
            Err(error) => {
                let error = self.write_error("update", error);
                match error.status_code() {
                    Some(404) => Ok(Some(None)),
                    Some(409) => Ok(None),
                    _ => Err(error),
                }
            }
        }
    }

    /// Whether the namespace watch shows the record of shard lease `lease` held by `holder`
    /// bound to its member tenure `binding`: what a list of `binding` may name
    /// ([`protocol::listable`]).
    pub(super) fn listable(&self, lease: &str, holder: &str, binding: &Binding) -> bool {
        self.hub
            .record_of(&self.namespace, &object_name(lease))
            .flatten()
            .is_some_and(|(record, _)| protocol::listable(record_seen(&record), holder, binding))
    }
}

/// A shard record of the namespace watch as [`protocol`] takes it.
pub(super) fn record_seen(record: &GroupRecord) -> RecordSeen<'_> {
    RecordSeen {
        holder: record.holder.as_deref(),
        token: record.token.map_or(0, |t| t.value()),
        binding: record.bound_to.as_ref(),
    }
}
