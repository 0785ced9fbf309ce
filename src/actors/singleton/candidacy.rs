//! The manager's candidacy: publishing it, reading the other candidates, and applying the
//! handover policy (see [`crate::actors::candidacy`] for the model).

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{AfterStop, ClusterSingletonManager, Phase, SingletonSettings};
use crate::actors::candidacy::{
    live_candidates, CandidacyError, CandidacyStatus, Candidate, HandoverPolicy,
};
use crate::actors::member::Member;
use crate::actors::singleton_messages::{SetEligible, Shutdown};
use crate::group::GroupWatch;
use crate::lease::Lease;
use crate::settings::LeaseSettings;
use crate::vocab::BoxError;

/// Builds a candidacy lease from its settings.
type LeaseFor<L> = Box<dyn Fn(LeaseSettings) -> Result<L, BoxError>>;

/// A manager's candidacy: its own candidacy lease and the watch of every candidacy.
pub(super) struct Candidacy<L: Lease> {
    me: Candidate,
    lease: Arc<L>,
    /// The lease built first (its watch is `watch`), kept while a rebuilt one is held.
    _first: Option<Arc<L>>,
    /// Builds the candidacy lease again with the metadata known at publication.
    lease_for: LeaseFor<L>,
    prefix: String,
    watch: GroupWatch,
    /// Holds the candidacy lease while the node competes; started with the manager.
    holder: Option<Addr<ClusterSingletonManager<Member, L>>>,
    /// Whether the holder is told to hold the candidacy lease now.
    holding: bool,
    /// Withdrawn after giving up on a singleton that keeps failing: the generation of the pause
    /// (a later give-up starts a new one).
    paused: Option<u64>,
    pause_generation: u64,
    /// Whether the candidacy is published, for [`CandidacyStatus`].
    published: tokio::sync::watch::Sender<bool>,
    /// Tells the manager when the candidates change (aborted when dropped).
    feed: Option<AbortOnDrop>,
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Internal: the candidates changed (or one's claim expired): apply the policy.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Reconsider;

impl<A, L> Handler<Reconsider> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, _: Reconsider, ctx: &mut Self::Context) {
        self.reconsider(ctx);
    }
}

impl<A, L> ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    /// Publishes this node's candidacy for the singleton's lease `L` (see
    /// [`HandoverPolicy`] for what the managers do with it): while the node competes, it holds
    /// its candidacy lease `L-candidate-<owner>`, whose claim carries `candidate` (its owner is
    /// filled in from the lease). `lease_for(settings)` builds that lease from `settings` (the
    /// singleton lease's own, with the candidacy's name and metadata) on the same store, owning
    /// what it uses: `move |s| Ok::<_, Infallible>(store.lease(s))` (with a clone of the store),
    /// `move |s| provider.lease_with_settings("singleton", s)` (with a clone of the provider). It
    /// is called here, and once more when the node publishes its candidacy if the node inherits
    /// an older age for its revision than its own start ([`Candidate::revision_since_ms`]: the
    /// metadata changes); should that call fail, the node publishes the first lease, with its own
    /// start (logged as a warning).
    ///
    /// Call it inside the runtime that will run the manager (the candidates' watch starts here).
    /// The policy is [`HandoverPolicy::NewestRevision`] unless [`handover`](Self::handover) says
    /// otherwise.
    ///
    /// # Errors
    ///
    /// [`CandidacyError`] when the candidate's advertised address is invalid (see
    /// [`Candidate::address`]), the candidacy's settings are invalid, `lease_for` fails or builds
    /// another lease, or the backend cannot watch groups.
    pub fn candidacy<E: Into<BoxError>>(
        mut self,
        mut candidate: Candidate,
        lease_for: impl Fn(LeaseSettings) -> Result<L, E> + 'static,
    ) -> Result<Self, CandidacyError> {
        candidate.validate()?;
        let (name, owner) = (self.lease.name(), self.lease.owner().to_owned());
        let prefix = format!("{name}-candidate-");
        let candidacy_name = format!("{prefix}{owner}");
        candidate.owner = owner.clone();
        let settings = self
            .lease
            .settings()
            .to_builder()
            .name(&candidacy_name)
            .metadata(candidate.to_metadata())
            .build()
            .map_err(|source| CandidacyError::Settings {
                name: candidacy_name.clone(),
                source,
            })?;
        let lease = lease_for(settings).map_err(|e| CandidacyError::Build {
            name: candidacy_name.clone(),
            source: e.into(),
        })?;
        if lease.name() != candidacy_name || lease.owner() != owner {
            return Err(CandidacyError::WrongLease {
                got_name: lease.name().to_owned(),
                got_owner: lease.owner().to_owned(),
                name: candidacy_name,
                owner,
            });
        }
        let watch = lease
            .watch_group(&prefix)
            .map_err(|source| CandidacyError::Watch {
                lease: name.to_owned(),
                source,
            })?;
        self.candidacy = Some(Candidacy {
            me: candidate,
            lease: Arc::new(lease),
            _first: None,
            lease_for: Box::new(move |settings| lease_for(settings).map_err(Into::into)),
            prefix,
            watch,
            holder: None,
            holding: false,
            paused: None,
            pause_generation: 0,
            published: tokio::sync::watch::Sender::new(false),
            feed: None,
        });
        Ok(self)
    }

    /// Whether this node's candidacy is published, as it changes (`None` without a
    /// [`candidacy`](Self::candidacy)): published once the node holds its candidacy lease and its
    /// own watch of the candidates lists that claim, so that the other nodes see it too (up to
    /// their watch's delay). A readiness that should wait for it, for a rolling update driven by
    /// readiness, is a [`HealthCheck`](crate::HealthCheck) the manager reports to
    /// ([`health`](Self::health)): it is not ready until the candidacy was published once.
    pub fn candidacy_status(&self) -> Option<CandidacyStatus> {
        let candidacy = self.candidacy.as_ref()?;
        Some(CandidacyStatus::new(candidacy.published.subscribe()))
    }

    /// The handover policy (default [`HandoverPolicy::NewestRevision`]); it applies only with a
    /// [`candidacy`](Self::candidacy).
    pub fn handover(mut self, policy: HandoverPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Starts holding the candidacy lease (if the node competes) and reading the candidates.
    ///
    /// The candidacy is published once this node's watch of the singleton's lease and its watch
    /// of the candidates have listed them (at most one TTL after the start): a candidate is ready
    /// when it would notice a release to it at once, so that a leader that hands over to it is
    /// not kept waiting, and it publishes the age of its revision it inherits from the live
    /// candidates of that revision ([`Candidate::revision_since_ms`]).
    pub(super) fn start_candidacy(&mut self, ctx: &mut Context<Self>) {
        if self.candidacy.is_none() {
            return;
        }
        // Who leads is asked for with a candidacy (it answers where the leader is): watch it now.
        if self.leader_watch.is_none() {
            self.leader_watch = self.lease.watch_group(self.lease.name()).ok();
        }
        let lease_watch = self.leader_watch.clone();
        let candidates_watch = self.candidacy.as_ref().map(|c| c.watch.clone());
        let ttl = self.lease.settings().ttl();
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(async move {
                let give_up = tokio::time::sleep(ttl);
                tokio::pin!(give_up);
                for mut watch in [lease_watch, candidates_watch].into_iter().flatten() {
                    while !watch.snapshot_and_mark().is_synced() {
                        tokio::select! {
                            changed = watch.changed() => if changed.is_err() { return },
                            () = &mut give_up => return,
                        }
                    }
                }
            })
            .map(|(), act, _| act.publish_candidacy()),
        );
        let me = ctx.address().downgrade();
        let Some(candidacy) = self.candidacy.as_mut() else {
            return;
        };
        let mut watch = candidacy.watch.clone();
        candidacy.feed = Some(AbortOnDrop(actix_rt::spawn(async move {
            loop {
                let snapshot = watch.snapshot_and_mark();
                match me.upgrade() {
                    Some(manager) => manager.do_send(Reconsider),
                    None => return,
                }
                let wake = snapshot.next_expiry(Instant::now());
                tokio::select! {
                    changed = watch.changed() => if changed.is_err() { return },
                    () = async {
                        match wake {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    } => {}
                }
            }
        })));
    }

    /// Starts holding the candidacy lease (while it should be held, see
    /// [`hold_candidacy`](Self::hold_candidacy)), unless the manager is shutting down; first
    /// rebuilds it with the age of its revision it inherits, if that is older than its start.
    fn publish_candidacy(&mut self) {
        let hold = self.hold_candidacy();
        let max_error_backoff = self.settings.max_error_backoff;
        let others: Vec<Candidate> = self.other_candidates().into_values().collect();
        let Some(candidacy) = self.candidacy.as_mut() else {
            return;
        };
        if self.shutting_down || candidacy.holder.is_some() {
            return;
        }
        let me = candidacy.me.inheriting(&others);
        if me != candidacy.me {
            match rebuild(candidacy, &me) {
                Ok(lease) => {
                    tracing::debug!(lease = %candidacy.prefix, owner = %me.owner, revision_since_ms = ?me.revision_since_ms, "publishing the candidacy with the age of its revision");
                    candidacy._first = Some(std::mem::replace(&mut candidacy.lease, lease));
                    candidacy.me = me;
                }
                Err(error) => {
                    tracing::warn!(error = &*error as &dyn std::error::Error, lease = %candidacy.prefix, owner = %me.owner, "cannot build the candidacy lease with the age of its revision; publishing the node's own start");
                }
            }
        }
        let mut holder =
            ClusterSingletonManager::from_arc(Arc::clone(&candidacy.lease), |_, _| Member)
                .settings(SingletonSettings {
                    max_error_backoff,
                    ..SingletonSettings::default()
                })
                .retire_on_shutdown();
        if !hold {
            holder = holder.not_eligible();
        }
        candidacy.holding = hold;
        candidacy.holder = Some(holder.start());
    }

    /// Whether the candidacy lease should be held now: while the node is eligible, not shutting
    /// down, and has not withdrawn after giving up on its singleton.
    fn hold_candidacy(&self) -> bool {
        self.eligible
            && !self.shutting_down
            && self.candidacy.as_ref().is_some_and(|c| c.paused.is_none())
    }

    /// Tells the candidacy lease's holder whether to hold it, after a change of what decides it
    /// ([`hold_candidacy`](Self::hold_candidacy)).
    pub(super) fn sync_candidacy(&mut self) {
        let hold = self.hold_candidacy();
        let Some(candidacy) = self.candidacy.as_mut() else {
            return;
        };
        if let Some(holder) = &candidacy.holder {
            if candidacy.holding != hold {
                holder.do_send(SetEligible(hold));
            }
        }
        candidacy.holding = hold;
        self.update_published();
    }

    /// After giving up on a singleton that keeps failing: withdraws the candidacy for `pause`,
    /// so that the other nodes stop deferring to this one and one of them runs the singleton;
    /// then publishes it again.
    pub(super) fn pause_candidacy(&mut self, pause: std::time::Duration, ctx: &mut Context<Self>) {
        let Some(candidacy) = self.candidacy.as_mut() else {
            return;
        };
        candidacy.pause_generation += 1;
        let generation = candidacy.pause_generation;
        candidacy.paused = Some(generation);
        tracing::debug!(lease = %self.lease.name(), owner = %self.lease.owner(), ?pause, "withdrawing the candidacy while the singleton cannot run here");
        self.sync_candidacy();
        ctx.run_later(pause, move |act, _| {
            let Some(candidacy) = act.candidacy.as_mut() else {
                return;
            };
            if candidacy.paused == Some(generation) {
                candidacy.paused = None;
                act.sync_candidacy();
            }
        });
    }

    /// Publishes whether the candidacy is published: it is meant to be held, and this node's
    /// watch lists it live in this node's name. The first publication makes the node ready.
    pub(super) fn update_published(&mut self) {
        let owner = self.lease.owner().to_owned();
        let Some(candidacy) = self.candidacy.as_ref() else {
            return;
        };
        let name = format!("{}{owner}", candidacy.prefix);
        let published = candidacy.holding
            && candidacy.holder.is_some()
            && candidacy
                .watch
                .snapshot()
                .live_holder(&name, Instant::now())
                == Some(owner.as_str());
        candidacy
            .published
            .send_if_modified(|old| std::mem::replace(old, published) != published);
        if published {
            self.with_health(|h| h.candidacy_pending = false);
        }
    }

    /// Withdraws the candidacy (releases its lease), then does `then`; at once without one.
    pub(super) fn withdraw_then(
        &mut self,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, &mut Context<Self>) + 'static,
    ) {
        let Some(holder) = self.candidacy.as_mut().and_then(|c| c.holder.take()) else {
            then(self, ctx);
            return;
        };
        self.update_published();
        self.withdrawing = true;
        tracing::debug!(lease = %self.lease.name(), owner = %self.lease.owner(), "withdrawing the candidacy");
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(holder.send(Shutdown)).map(
                move |result, act, ctx| {
                    if let Ok(Err(error)) = &result {
                        tracing::warn!(error = error as &dyn std::error::Error, lease = %act.lease.name(), owner = %act.lease.owner(), "withdrawing the candidacy failed; it expires after its TTL");
                    }
                    act.withdrawing = false;
                    then(act, ctx);
                    // A shutdown that finished its release meanwhile waited for the withdrawal.
                    if let Some(result) = act.finish_after_withdrawal.take() {
                        act.finish_shutdown(result, ctx);
                    }
                },
            ),
        );
    }

    /// The live candidates other than this node, by owner.
    pub(super) fn other_candidates(&self) -> BTreeMap<String, Candidate> {
        match &self.candidacy {
            Some(c) => live_candidates(
                &c.watch.snapshot(),
                &c.prefix,
                self.lease.owner(),
                Instant::now(),
            ),
            None => BTreeMap::new(),
        }
    }

    /// The advertised address of candidate `owner` (this node's own included), if known.
    pub(super) fn address_of(&self, owner: &str) -> Option<String> {
        let candidacy = self.candidacy.as_ref()?;
        if owner == self.lease.owner() {
            return candidacy.me.address.clone();
        }
        self.other_candidates().remove(owner)?.address
    }

    /// The best other live candidate under the policy (with [`HandoverPolicy::Off`], the earliest
    /// started), if any.
    pub(super) fn best_other(&self) -> Option<String> {
        let me = &self.candidacy.as_ref()?.me;
        let others: Vec<Candidate> = self.other_candidates().into_values().collect();
        self.policy.best(me, &others).map(|c| c.owner)
    }

    /// Why a transfer to `to` cannot happen under the policy, if it cannot: `to` is no live
    /// candidate (it left, crashed, withdrew or never was one: naming it would leave the lease
    /// unrun for a TTL), or a live candidate (this node included) ranks above it (it would defer
    /// to that one, or hand the lease on to it). `None` without a candidacy.
    pub(super) fn transfer_refusal(&self, to: &str) -> Option<&'static str> {
        let me = &self.candidacy.as_ref()?.me;
        let others = self.other_candidates();
        let Some(target) = others.get(to).cloned() else {
            return Some("it is not a live candidate");
        };
        if matches!(self.policy, HandoverPolicy::Off) {
            return None;
        }
        let others: Vec<Candidate> = others.into_values().collect();
        // A node on its way out does not count: it will not lead.
        let me = if self.shutting_down { &target } else { me };
        self.policy
            .outranked(&target, me, &others)
            .then_some("a live candidate ranks above it under the handover policy")
    }

    /// Where a leader that shuts down hands the lease: the best live candidate that ranks above
    /// this node, if one does. Among equals a plain release is better: a candidate can look live
    /// for up to a TTL after it died, and naming it would leave the lease to a dead node for a
    /// TTL; after a plain release the worse candidates still defer to the best live one.
    pub(super) fn shutdown_target(&self) -> Option<String> {
        let me = &self.candidacy.as_ref()?.me;
        let others: Vec<Candidate> = self.other_candidates().into_values().collect();
        self.policy.better_than(me, &others).map(|c| c.owner)
    }

    /// Applies the policy to the candidates seen now: a leader hands over to a better candidate;
    /// a node that is not leading defers to one (stops competing) while it is live.
    fn reconsider(&mut self, ctx: &mut Context<Self>) {
        self.update_published();
        let Some(candidacy) = &self.candidacy else {
            return;
        };
        if self.shutting_down || matches!(self.policy, HandoverPolicy::Off) {
            return;
        }
        let others: Vec<Candidate> = self.other_candidates().into_values().collect();
        let better = self.policy.better_than(&candidacy.me, &others);
        let defer = better.is_some();
        let was_deferring = std::mem::replace(&mut self.deferring, defer);
        match &self.phase {
            Phase::Running { guard, .. } if guard.check_alive() => {
                if let Some(best) = better {
                    tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), to = %best.owner, revision = ?best.revision, "a better candidate is live: handing leadership over to it");
                    self.stop_singleton(AfterStop::Transfer { to: best.owner }, ctx);
                }
            }
            Phase::Acquiring if defer && !was_deferring => {
                tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), "a better candidate is live: leaving the lease to it");
                self.stop_singleton(AfterStop::Release { then_pause: None }, ctx);
            }
            Phase::Idle if !defer && was_deferring && self.competing() => {
                tracing::debug!(lease = %self.lease.name(), owner = %self.lease.owner(), "no better candidate is live any more: competing again");
                self.compete(std::time::Duration::ZERO, ctx);
            }
            _ => {}
        }
    }
}

/// The candidacy lease built again with `me`'s metadata (checked like the first).
fn rebuild<L: Lease>(candidacy: &Candidacy<L>, me: &Candidate) -> Result<Arc<L>, BoxError> {
    let settings = candidacy
        .lease
        .settings()
        .with_metadata(Some(me.to_metadata()))?;
    let lease = (candidacy.lease_for)(settings)?;
    if lease.name() != candidacy.lease.name() || lease.owner() != candidacy.lease.owner() {
        return Err(format!(
            "the candidacy lease built is {:?} of {:?}, not {:?} of {:?}",
            lease.name(),
            lease.owner(),
            candidacy.lease.name(),
            candidacy.lease.owner()
        )
        .into());
    }
    Ok(Arc::new(lease))
}
