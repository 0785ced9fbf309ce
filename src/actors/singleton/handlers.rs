//! The manager's answers to its public messages.

use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{AfterStop, ClusterSingletonManager, Phase};
use crate::actors::candidacy::same_address;
use crate::actors::singleton_messages::{
    GetLeader, GetSingleton, GetStatus, LeaderInfo, SetEligible, Shutdown, SingletonStatus,
    TransferLeadership,
};
use crate::group::GroupError;
use crate::lease::{FencingToken, Lease, LeaseError};

impl<A, L> Handler<Shutdown> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ResponseFuture<Result<bool, LeaseError>>;

    fn handle(&mut self, _: Shutdown, ctx: &mut Self::Context) -> Self::Result {
        if let Some(result) = &self.release_result {
            let result = result.clone();
            return Box::pin(async move { result });
        }
        let (tx, rx) = oneshot::channel();
        self.shutdown_waiters.push(tx);
        self.begin_shutdown(ctx);
        release_answer(rx)
    }
}

/// The answer of a release this manager will make: what it sends, or, when the sender is dropped
/// (the manager was dropped without a graceful shutdown, `System::stop`; it answers every waiter
/// before it stops otherwise), [`LeaseError::NoRuntime`].
fn release_answer(
    rx: oneshot::Receiver<Result<bool, LeaseError>>,
) -> ResponseFuture<Result<bool, LeaseError>> {
    Box::pin(async move {
        rx.await.unwrap_or(Err(LeaseError::NoRuntime {
            operation: crate::lease::Operation::Release,
        }))
    })
}

impl<A, L> Handler<TransferLeadership> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ResponseFuture<Result<bool, LeaseError>>;

    fn handle(
        &mut self,
        TransferLeadership { to }: TransferLeadership,
        ctx: &mut Self::Context,
    ) -> Self::Result {
        let Some(to) = to.or_else(|| self.best_other()) else {
            return Box::pin(async { Ok(false) }); // no other live candidate
        };
        if let Some(result) = &self.release_result {
            // Shut down: the answer is the final release's, if it went to `to`.
            let result = transfer_answer(result, self.released_to.as_deref(), &to);
            return Box::pin(async move { result });
        }
        if let Err(error) = crate::lease::check_transfer_target(&*self.lease, &to) {
            return Box::pin(async move { Err(error) });
        }
        let leading = matches!(self.phase, Phase::Running { .. } | Phase::Stopping { .. });
        if !leading && !self.shutting_down {
            return Box::pin(async { Ok(false) });
        }
        if let Some(reason) = self.transfer_refusal(&to) {
            tracing::debug!(lease = %self.lease.name(), owner = %self.lease.owner(), %to, reason, "transfer refused");
            let error = LeaseError::InvalidTransferTarget {
                name: self.lease.name().to_owned(),
                target: to,
                reason,
            };
            return Box::pin(async move { Err(error) });
        }
        tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), %to, "transferring leadership: stopping the singleton, then releasing the lease to the preferred owner");
        let (tx, rx) = oneshot::channel();
        self.transfer_waiters.push((to.clone(), tx));
        self.stop_singleton(AfterStop::Transfer { to }, ctx);
        release_answer(rx)
    }
}

/// What a transfer to `to` answers after a release that went to `released_to` with `result`: that
/// result if the release went to `to`, or did not release anything held (`Ok(false)`) or failed;
/// [`LeaseError::Superseded`] when the lease was released, but not to `to` (a shutdown that found
/// `to` gone, or another transfer, took the transfer's place).
pub(super) fn transfer_answer(
    result: &Result<bool, LeaseError>,
    released_to: Option<&str>,
    to: &str,
) -> Result<bool, LeaseError> {
    match result {
        Ok(true) if released_to != Some(to) => Err(LeaseError::Superseded {
            operation: crate::lease::Operation::Release,
        }),
        other => other.clone(),
    }
}

impl<A, L> Handler<GetLeader> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = Option<LeaderInfo>;

    /// `here` only while the singleton runs under a live tenure; `this_node` whenever the holder
    /// is this node (its singleton starting or stopping) or advertises this node's own address
    /// (see [`LeaderInfo`]).
    fn handle(&mut self, _: GetLeader, _: &mut Self::Context) -> Option<LeaderInfo> {
        let owner = self.lease.owner();
        if let Phase::Running { guard, .. } = &self.phase {
            if guard.check_alive() {
                return Some(
                    LeaderInfo::new(owner, Some(guard.token()), true, self.address_of(owner))
                        .with_lease(self.lease.name()),
                );
            }
        }
        if self.leader_watch.is_none() {
            match self.lease.watch_group(self.lease.name()) {
                Ok(watch) => self.leader_watch = Some(watch),
                Err(GroupError::Unsupported { .. }) => {
                    return self
                        .lease
                        .observed_holder()
                        .map(|holder| self.not_running_leader(&holder, None));
                }
                Err(error) => {
                    tracing::debug!(%error, lease = %self.lease.name(), "cannot watch the lease's record to answer who leads");
                    return None;
                }
            }
        }
        let snapshot = self.leader_watch.as_ref()?.snapshot();
        let record = snapshot.get(self.lease.name())?;
        let holder = record.live_holder(Instant::now())?;
        Some(self.not_running_leader(holder, record.token))
    }
}

impl<A, L> ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    /// `holder` leads (as the store says) and the singleton does not run here: this node when
    /// `holder` is its owner identity or advertises its own address.
    fn not_running_leader(&self, holder: &str, token: Option<FencingToken>) -> LeaderInfo {
        let owner = self.lease.owner();
        let address = self.address_of(holder);
        let this_node = holder == owner
            || match (&address, self.address_of(owner)) {
                (Some(theirs), Some(mine)) => same_address(theirs, &mine),
                _ => false,
            };
        LeaderInfo::new(holder, token, false, address)
            .with_this_node(this_node)
            .with_lease(self.lease.name())
    }
}

impl<A, L> Handler<SetEligible> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, SetEligible(eligible): SetEligible, ctx: &mut Self::Context) {
        self.with_health(|h| h.eligible = eligible);
        if self.eligible == eligible || self.shutting_down {
            self.eligible = eligible;
            return;
        }
        self.eligible = eligible;
        // An ineligible node is no candidate.
        self.sync_candidacy();
        if eligible {
            if matches!(self.phase, Phase::Idle) && self.competing() {
                self.compete(Duration::ZERO, ctx);
            }
        } else {
            tracing::debug!(lease = %self.lease.name(), owner = %self.lease.owner(), "not eligible any more: stopping the singleton and releasing");
            self.stop_singleton(AfterStop::Release { then_pause: None }, ctx);
        }
    }
}

impl<A, L> Handler<GetSingleton<A>> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = Option<Addr<A>>;

    fn handle(&mut self, _: GetSingleton<A>, _: &mut Self::Context) -> Option<Addr<A>> {
        match &self.phase {
            Phase::Running { addr, .. } => Some(addr.clone()),
            _ => None,
        }
    }
}

impl<A, L> Handler<GetStatus> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = SingletonStatus;

    fn handle(&mut self, _: GetStatus, _: &mut Self::Context) -> SingletonStatus {
        SingletonStatus {
            state: self.state(),
            fencing_token: match &self.phase {
                Phase::Running { guard, .. } => Some(guard.token()),
                _ => None,
            },
            started: self.instances,
            unstopped: self.unstopped,
        }
    }
}

/// Internal: the next plain release of the lease hands it over to this target
/// ([`Lease::hand_over`]), or releases it plainly (`None`). Sent by the sharded workers before
/// they make a shard's manager ineligible or shut it down.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct HandOverTo(pub(crate) Option<HandoverTarget>);

/// Whom a release hands the lease to, and how to tell, right before the write, that it still
/// counts: a sharded node names the node its placement targets, which may leave between the
/// placement and the release (a worker can take up to its stop timeout to stop). A handover to a
/// node that left would keep the shard in its name, unrun, for a TTL (and on etcd for as long as
/// that node's session lives): such a release is a plain one.
#[derive(Debug, Clone)]
pub(crate) struct HandoverTarget {
    owner: String,
    /// The group watch, and the target's member record in it: the target counts while that
    /// record shows it a live member ([`GroupRecord::live_member`](crate::GroupRecord::live_member):
    /// a member that died before this process first saw its record is no target).
    member: Option<(crate::group::GroupWatch, String)>,
}

impl HandoverTarget {
    /// `owner`, which counts while `watch` shows its member record `record` live in its name.
    pub(crate) fn member(
        owner: impl Into<String>,
        watch: crate::group::GroupWatch,
        record: impl Into<String>,
    ) -> Self {
        Self {
            owner: owner.into(),
            member: Some((watch, record.into())),
        }
    }

    /// The target's owner identity.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// Whether the target still counts now (see the type's docs).
    pub(crate) fn counts(&self) -> bool {
        self.member.as_ref().is_none_or(|(watch, record)| {
            let snapshot = watch.snapshot();
            let member = snapshot.get(record);
            member.and_then(|m| m.live_member(Instant::now(), std::time::SystemTime::now()))
                == Some(self.owner.as_str())
        })
    }
}

/// Sent by a sharded node that leaves with bound shard leases: with `true`, the next
/// [`Shutdown`] stops the singleton and leaves the lease held (the node's member lease, retired
/// next, frees it); with `false` (the leave's grace passed) it gives the lease up as usual once
/// the singleton stopped, to the target of the last [`HandOverTo`].
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct KeepLeaseOnShutdown(pub(crate) bool);

impl<A, L> Handler<KeepLeaseOnShutdown> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, KeepLeaseOnShutdown(keep): KeepLeaseOnShutdown, _: &mut Self::Context) {
        self.keep_on_shutdown = keep;
    }
}

/// Sent by a sharded node that leaves with bound shard leases, to its member lease's manager:
/// the release at the next [`Shutdown`] retires the member lease handing these shards on in the
/// same write ([`Lease::retire_handing`]).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct RetireHanding(pub(crate) Vec<crate::HandedShard>);

impl<A, L> Handler<RetireHanding> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, RetireHanding(handed): RetireHanding, _: &mut Self::Context) {
        self.retire_handing = Some(handed);
    }
}

impl<A, L> Handler<HandOverTo> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, HandOverTo(target): HandOverTo, _: &mut Self::Context) {
        self.hand_to = target.filter(|target| target.owner() != self.lease.owner());
    }
}
