//! A leaving member that hands its bound shards on in one write
//! ([`Lease::retire_handing`](crate::Lease::retire_handing)), and the targets that take them up
//! without a write and rebind them afterwards (see the `bound` module for the rule).
//!
//! # The leaving member
//!
//! Its bound tenures have ended (every worker stopped before). It releases its object with one
//! compare-and-swap on its tenure's `resourceVersion` that adds, under its incarnation, each
//! listed shard whose record its namespace watch shows bound to this incarnation, with the
//! target (entries of earlier incarnations whose records are still bound to them are kept).
//! From that write on, each listed shard is held by its target. The member then waits, within
//! half its operation timeout, until its watch shows every listed record moved on (rebound by its target, or claimed
//! after the target died), and deletes its object with a precondition on the released version;
//! if they do not, the object stays released with its list (a later tenure of the same member
//! keeps the entries that are still needed).
//!
//! # The target
//!
//! A bound claim that finds a record bound to a member incarnation that handed it to this owner
//! under the member tenure the claim binds to takes it up with no write: its fencing token is
//! the record's plus one, its deadline its member tenure's. Right after, off the path of the
//! acquire, the tenure's task rebinds the record to the target's member tenure (a merge patch
//! naming the version handed on: the holder, that token, the binding), after which it is an
//! ordinary bound record. A release before that reads the record first.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use tokio::time::Instant;

use super::record::{
    bind, handed_shards_of, holder_of, incarnation_of, released, set_handed_shards, transitions_of,
};
use super::{object_name, KubernetesBackend, KubernetesError, KubernetesTenure};
use crate::backend::{AcquireAttempt, ReleaseOutcome};
use crate::binding::{Binding, HandedShard};
use crate::lease::{FencingToken, LostReason};
use crate::settings::LeaseSettings;

/// How often a leaving member looks whether the records it handed on moved on.
const MOVED_ON_POLL: Duration = Duration::from_millis(50);

/// The shortest pause before a target rebinds a shard taken up without a write.
const SETTLE_AFTER: Duration = Duration::from_millis(250);

/// How long after the take-up the target rebinds shard lease `name`: between
/// [`SETTLE_AFTER`] and four times that, spread over the shards by their names, and at most a
/// quarter of `operation_timeout`.
fn settle_delay(name: &str, operation_timeout: Duration) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    let spread = (SETTLE_AFTER * 3).as_millis() as u64;
    let delay = SETTLE_AFTER + Duration::from_millis(hasher.finish() % spread.max(1));
    delay.min(operation_timeout / 4)
}

/// Adds `hops` to the `leaseTransitions` of `claim` (the tenures taken up without a write since
/// the record was written: see the `bound` module).
pub(super) fn add_hops(
    claim: &mut LeaseObject,
    hops: i32,
    object: &str,
) -> Result<(), KubernetesError> {
    if hops == 0 {
        return Ok(());
    }
    let transitions =
        transitions_of(claim)
            .checked_add(hops)
            .ok_or_else(|| KubernetesError::InvalidRecord {
                object: object.to_owned(),
                reason: "leaseTransitions cannot grow any more".into(),
            })?;
    if let Some(spec) = claim.spec.as_mut() {
        spec.lease_transitions = Some(transitions);
    }
    Ok(())
}

/// The record of a tenure taken up without a write and not rebound, as a read finds it.
enum Unsettled {
    /// Rebound by this tenure already (this owner, its token): the record as it is.
    Ours(LeaseObject),
    /// Still the version handed on: this tenure's claim of it (this owner, its token, its
    /// binding), to write over that version.
    Handed(LeaseObject),
    /// No object.
    Gone,
    /// Another tenure's record, with its holder.
    Other(Option<String>),
}

impl KubernetesBackend {
    /// `current` (a record handed on to this owner under member tenure `to`) taken up without
    /// a write, with its `leaseTransitions` plus one; `None` when that is no newer than a
    /// tenure this instance had (then it is claimed with a write).
    pub(super) fn take_up_handed(
        &self,
        current: LeaseObject,
        to: &Binding,
    ) -> Option<AcquireAttempt<KubernetesTenure>> {
        let transitions = transitions_of(&current).checked_add(1)?;
        {
            let mut state = self.lock();
            let token = transitions.max(0) as u64;
            if state.highest_token.is_some_and(|highest| token <= highest) {
                return None;
            }
            state.highest_token = Some(token);
            state.tenure_version = current.metadata.resource_version.clone();
            state.unanswered.clear();
        }
        self.counters.taken_up.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(object = %self.object, fencing_token = transitions, "took up a shard handed on to this owner");
        Some(AcquireAttempt::Acquired {
            token: FencingToken::new(transitions as u64),
            tenure: KubernetesTenure::taken_up(Arc::new(current), transitions, to.clone()),
            valid_from: None,
        })
    }

    /// Rebinds a tenure taken up without a write (see the module docs): `Ok(None)` once the
    /// record names this owner, this token and this binding; `Ok(Some(reason))` when the
    /// record shows the tenure lost.
    pub(super) async fn settle_taken_up(
        &self,
        settings: &LeaseSettings,
        tenure: &mut KubernetesTenure,
    ) -> Result<Option<LostReason>, KubernetesError> {
        let Some(to) = tenure.taken_up.clone() else {
            return Ok(None);
        };
        // After a moment, spread over the shards: the move completes first, and the targets'
        // rebinds (and the watch events they cause on every node) do not compete with it.
        tokio::time::sleep(settle_delay(&self.name, settings.operation_timeout())).await;
        let api = self.api()?;
        let handed = (*tenure.lease).clone();
        let mut claim = self.claimed(handed, settings)?;
        bind(&mut claim, &to);
        if !self.patch_forbidden.load(Ordering::Relaxed) {
            match self.patch_claim(&api, &claim).await {
                Ok(rebound) => {
                    self.rebound(tenure, rebound);
                    return Ok(None);
                }
                Err(e) if matches!(e.status_code(), Some(409) | Some(404)) => {}
                Err(KubernetesError::Forbidden { .. }) => {
                    self.patch_forbidden.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        // Read, and decide: still the version handed on (replace it), or rebound already by
        // this tenure (an answer lost), or lost.
        match self.read_unsettled(settings, tenure).await? {
            Unsettled::Ours(current) => {
                self.rebound(tenure, Arc::new(current));
                Ok(None)
            }
            Unsettled::Handed(claim) => match self.update(&api, &claim).await {
                Ok(rebound) => {
                    self.rebound(tenure, rebound);
                    Ok(None)
                }
                Err(e) if matches!(e.status_code(), Some(409) | Some(404)) => {
                    Ok(Some(LostReason::TakenOver { holder: None }))
                }
                Err(e) => Err(e),
            },
            Unsettled::Gone => Ok(Some(LostReason::Deleted)),
            Unsettled::Other(holder) => Ok(Some(LostReason::TakenOver { holder })),
        }
    }

    fn rebound(&self, tenure: &mut KubernetesTenure, lease: Arc<LeaseObject>) {
        tracing::debug!(object = %self.object, "rebound a shard taken up without a write");
        self.adopt(tenure, lease);
        tenure.taken_up = None;
    }

    /// The record of a tenure taken up but not rebound, read and made this tenure's (this
    /// owner, its token, its binding), to release it from: `Err(outcome)` when there is nothing
    /// of this tenure to release.
    pub(super) async fn unsettled_record(
        &self,
        settings: &LeaseSettings,
        tenure: &KubernetesTenure,
    ) -> Result<Result<LeaseObject, ReleaseOutcome>, KubernetesError> {
        Ok(match self.read_unsettled(settings, tenure).await? {
            Unsettled::Ours(record) | Unsettled::Handed(record) => Ok(record),
            Unsettled::Gone => Err(ReleaseOutcome::Released),
            Unsettled::Other(holder) => Err(ReleaseOutcome::HeldByOther { holder }),
        })
    }

    /// The record of a tenure taken up but not rebound, as a read finds it (see [`Unsettled`]).
    async fn read_unsettled(
        &self,
        settings: &LeaseSettings,
        tenure: &KubernetesTenure,
    ) -> Result<Unsettled, KubernetesError> {
        let api = self.api()?;
        let Some(current) = self.get(&api).await? else {
            return Ok(Unsettled::Gone);
        };
        if holder_of(&current) == Some(settings.owner())
            && transitions_of(&current) == tenure.transitions
        {
            return Ok(Unsettled::Ours(current));
        }
        if current.metadata.resource_version == tenure.lease.metadata.resource_version {
            let mut claim = self.claimed(current, settings)?;
            if let Some(to) = &tenure.taken_up {
                bind(&mut claim, to);
            }
            return Ok(Unsettled::Handed(claim));
        }
        Ok(Unsettled::Other(holder_of(&current).map(str::to_owned)))
    }

    /// Releases the member object of `tenure` handing `handed` on (see the module docs).
    pub(super) async fn retire_handing_inner(
        &self,
        settings: &LeaseSettings,
        tenure: KubernetesTenure,
        handed: &[HandedShard],
    ) -> Result<ReleaseOutcome, KubernetesError> {
        let started = Instant::now();
        let Some(incarnation) = incarnation_of(&tenure.lease) else {
            return self.retire_plainly(settings, tenure).await;
        };
        let owner = settings.owner();
        // Only records bound to this incarnation are listed (one the watch does not show so yet
        // is freed and claimed, as by `retire`).
        let bound_here = |lease: &str, incarnation: &str| {
            let object = object_name(lease);
            self.hub
                .record_of(&self.namespace, &object)
                .flatten()
                .is_some_and(|(record, _)| {
                    record.holder.as_deref() == Some(owner)
                        && record.bound_to.as_ref().is_some_and(|b| {
                            b.member() == self.name && b.incarnation() == incarnation
                        })
                })
        };
        let listed: Vec<HandedShard> = handed
            .iter()
            .filter(|shard| bound_here(shard.lease(), &incarnation))
            .cloned()
            .collect();
        let mut entries = handed_shards_of(&tenure.lease).unwrap_or_default();
        entries.retain(|earlier, lease| earlier != incarnation && bound_here(lease, earlier));
        if listed.is_empty() && entries.is_empty() {
            return self.retire_plainly(settings, tenure).await;
        }
        entries.add(&incarnation, &listed);
        let mut next = released((*tenure.lease).clone());
        set_handed_shards(&mut next, &entries);
        let api = self.api()?;
        self.lock().tenure_version = None;
        tracing::debug!(object = %self.object, handed = listed.len(), "releasing the member object, handing its shards on");
        let written = match self.update(&api, &next).await {
            Ok(written) => written,
            Err(e) if e.status_code() == Some(404) => return Ok(ReleaseOutcome::Released),
            // Another version stands (a contender released it as expired, or a renewal whose
            // answer was lost): decide by a plain release, which reads; nothing is handed on.
            Err(e) if e.status_code() == Some(409) => {
                return self.retire_plainly(settings, tenure).await;
            }
            Err(e) => return Err(e),
        };
        self.counters
            .handed_over
            .fetch_add(listed.len() as u64, Ordering::Relaxed);
        // Wait until every listed record moved on, then delete the object: at most half the
        // operation timeout in all (the call is bounded by it, and the handover has landed).
        let until = started + settings.operation_timeout() / 2;
        loop {
            let pending = entries
                .entries()
                .any(|(incarnation, lease, _, _)| self.still_bound(lease, incarnation));
            if !pending {
                break;
            }
            if Instant::now() >= until {
                tracing::debug!(object = %self.object, "the shards handed on were not all rebound in time: the member object stays released, with its list");
                return Ok(ReleaseOutcome::Released);
            }
            tokio::time::sleep(MOVED_ON_POLL).await;
        }
        // Deleted at the released version, as `retire` deletes (a Role without `delete` is
        // warned about once there); an object not deleted stays released, with its list.
        match self
            .delete_retired(written.metadata.resource_version.clone())
            .await
        {
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::debug!(object = %self.object, "the released member object was not deleted: it stays");
            }
            Err(error) => {
                tracing::debug!(error = &error as &dyn std::error::Error, object = %self.object, "the released member object was not deleted: it stays");
            }
        }
        Ok(ReleaseOutcome::Released)
    }

    /// Whether the namespace watch still shows (or cannot tell whether) the record of `lease`
    /// bound to incarnation `incarnation` of this lease.
    pub(super) fn still_bound(&self, lease: &str, incarnation: &str) -> bool {
        match self.hub.record_of(&self.namespace, &object_name(lease)) {
            None => true,
            Some(None) => false,
            Some(Some((record, _))) => record
                .bound_to
                .as_ref()
                .is_some_and(|b| b.member() == self.name && b.incarnation() == incarnation),
        }
    }
}

impl KubernetesTenure {
    pub(super) fn taken_up(lease: Arc<LeaseObject>, transitions: i32, to: Binding) -> Self {
        Self {
            lease,
            transitions,
            unconfirmed: Vec::new(),
            taken_up: Some(to),
        }
    }
}
