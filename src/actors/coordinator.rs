//! [`ShardCoordinator`]: a reference shard coordinator gated on a lease.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::fut::{wrap_future, ActorFutureExt};
use actix::prelude::*;

use super::compete::{Competition, EndWatch, Next, RoundDone, TenureEnded};
use super::gate::{
    CoordinatorGate, GateError, GateState, Responder, Submission, DEFAULT_ACK_TIMEOUT,
};
use crate::lease::{FencingToken, Lease};
use crate::settings::{LeaseSettings, SettingsError};
use crate::tenure::{TenureEnd, TenureGuard};

/// The default cap of the coordinator's backoff after acquire errors.
const DEFAULT_MAX_ERROR_BACKOFF: Duration = Duration::from_secs(10);

/// A shard identifier.
pub type ShardId = String;

/// Told to a region when a shard is allocated to it.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct HostShard {
    /// The shard.
    pub shard: ShardId,
    /// The coordinator's fencing token at allocation time.
    pub fencing_token: FencingToken,
}

/// Register a region (by its address) to host shards; answers how many regions are registered.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<usize, GateError>")]
pub struct RegisterRegion(pub Recipient<HostShard>);

/// Allocate `0` to a region (or tell where it already is).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<ShardAllocation, GateError>")]
pub struct AllocateShard(pub ShardId);

/// Where a shard lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardAllocation {
    /// The shard.
    pub shard: ShardId,
    /// The region hosting it.
    pub region: Recipient<HostShard>,
    /// The fencing token under which it was allocated.
    pub fencing_token: FencingToken,
}

/// Query the coordinator's gate state.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "GateState")]
pub struct GetGateState;

enum Request {
    Register(Recipient<HostShard>),
    Allocate(ShardId),
}

enum Answer {
    Registered(usize),
    Allocated(ShardAllocation),
}

/// The reference shard coordinator, built on [`CoordinatorGate`] (see there for the pattern).
///
/// Regions register by address, and each new shard goes to the region hosting the fewest shards.
///
/// It competes for the lease like [`ClusterSingletonManager`](crate::ClusterSingletonManager):
/// in rounds of [`Lease::acquire_within`]`(2 × ttl)` that wait on the backend's change
/// notification, the next round after the lease's `acquire_retry_delay` ±20 %. After an acquire
/// error it logs it (`warn`) and backs off exponentially: `max(acquire_retry_delay, 100 ms)` first,
/// doubling after every further error, capped at
/// [`with_max_error_backoff`](Self::with_max_error_backoff) (default 10 s); the first answer from
/// the backend ends the backoff.
///
/// Requests that arrive while it has no tenure wait in a bounded queue (see
/// [`with_queue_bound`](Self::with_queue_bound)). An allocation completes when the chosen region
/// has acknowledged [`HostShard`]; until then it is *pending*, for at most the acknowledgement
/// timeout ([`with_ack_timeout`](Self::with_ack_timeout), default
/// [`DEFAULT_ACK_TIMEOUT`](crate::DEFAULT_ACK_TIMEOUT), 10 s): a region that does not answer in
/// time (a wedged region) fails it with [`GateError::AckTimeout`], and the shard stays allocated
/// to that region (its `HostShard` may still be handled; allocating it elsewhere could host it
/// twice) until the region is gone or the tenure ends. So every wait of the coordinator is
/// bounded (test `an_allocation_waits_for_a_wedged_region_at_most_the_ack_timeout`). When the
/// tenure ends (loss,
/// deadline, a release through any handle of the lease), every pending allocation is rejected with
/// [`GateError::TenureEnded`], the shard table is forgotten (another coordinator may have moved
/// shards meanwhile; regions stay registered) and the coordinator competes again.
///
/// It stops when it is stopped from a handler or when its last address is dropped (it holds no
/// address to itself); it then rejects what is pending with [`GateError::Stopped`], lets an acquire
/// round in flight finish and releases the lease. Started with
/// `actix::Supervisor::start(|_| ShardCoordinator::new(lease))` it is restarted after it stops
/// (a panic in a handler is not caught by actix and is not restarted): it competes again from
/// scratch.
///
/// # Example
///
/// ```
/// use actix::prelude::*;
/// use actix_coordination::prelude::*;
///
/// /// A region: hosts the shards the coordinator allocates to it.
/// struct Region;
/// impl Actor for Region {
///     type Context = Context<Self>;
/// }
/// impl Handler<HostShard> for Region {
///     type Result = ();
///     fn handle(&mut self, host: HostShard, _: &mut Context<Self>) {
///         // Start the shard's entities; stamp their writes with `host.fencing_token`.
///         let _ = (host.shard, host.fencing_token);
///     }
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// System::new().block_on(async {
///     let store = InMemoryStore::new();
///     let settings = LeaseSettings::new("shard-coordinator", "node-1")?;
///     let coordinator = ShardCoordinator::new(InMemoryLease::new(settings, &store)).start();
///     // Requests wait (in a bounded queue) until the coordinator holds its lease.
///     coordinator.send(RegisterRegion(Region.start().recipient())).await??;
///     let home = coordinator.send(AllocateShard("customer-42".into())).await??;
///     assert_eq!(home.shard, "customer-42");
///     // Asked again, it answers where the shard already is.
///     let again = coordinator.send(AllocateShard("customer-42".into())).await??;
///     assert_eq!(again.region, home.region);
///     Ok::<_, Box<dyn std::error::Error>>(())
/// })
/// # }
/// ```
pub struct ShardCoordinator<L: Lease> {
    gate: CoordinatorGate<L, Request, Answer>,
    regions: Vec<Recipient<HostShard>>,
    shards: BTreeMap<ShardId, Recipient<HostShard>>,
    awaiting_ack: BTreeMap<u64, Responder<Answer>>,
    next_allocation: u64,
    competition: Option<Competition<L>>,
    end_watch: Option<EndWatch>,
    /// Refuses queued requests that waited too long; a task outside the context (it must not
    /// keep the coordinator alive).
    expiry: Option<tokio::task::JoinHandle<()>>,
    max_error_backoff: Duration,
    ack_timeout: Duration,
}

/// Internal: refuse the queued requests that waited too long.
#[derive(Message)]
#[rtype(result = "()")]
struct ExpireQueued;

impl<L: Lease> ShardCoordinator<L> {
    /// A coordinator gated on `lease`.
    pub fn new(lease: L) -> Self {
        Self::from_arc(Arc::new(lease))
    }

    /// Like [`new`](Self::new), sharing the lease.
    pub fn from_arc(lease: Arc<L>) -> Self {
        Self {
            gate: CoordinatorGate::new(lease),
            regions: Vec::new(),
            shards: BTreeMap::new(),
            awaiting_ack: BTreeMap::new(),
            next_allocation: 0,
            competition: None,
            end_watch: None,
            expiry: None,
            max_error_backoff: DEFAULT_MAX_ERROR_BACKOFF,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
        }
    }

    /// Bounds the wait of an allocation for its region's acknowledgement of [`HostShard`]
    /// (default [`DEFAULT_ACK_TIMEOUT`](crate::DEFAULT_ACK_TIMEOUT), 10 s); past it the
    /// allocation fails with [`GateError::AckTimeout`].
    ///
    /// # Errors
    ///
    /// [`SettingsError::Zero`] for a zero timeout (every allocation would fail) and
    /// [`SettingsError::DurationTooLong`] beyond [`LeaseSettings::MAX_DURATION`] (one day), both
    /// naming the field `ack-timeout`.
    pub fn with_ack_timeout(mut self, timeout: Duration) -> Result<Self, SettingsError> {
        const FIELD: &str = "ack-timeout";
        if timeout.is_zero() {
            return Err(SettingsError::Zero { field: FIELD });
        }
        if timeout > LeaseSettings::MAX_DURATION {
            return Err(SettingsError::DurationTooLong {
                field: FIELD,
                value: timeout,
                max: LeaseSettings::MAX_DURATION,
            });
        }
        self.ack_timeout = timeout;
        Ok(self)
    }

    /// Caps the exponential backoff after acquire errors (default 10 s; at least 100 ms).
    pub fn with_max_error_backoff(mut self, cap: Duration) -> Self {
        self.max_error_backoff = cap;
        self
    }

    /// Bounds the queue of requests that wait for the lease (default
    /// [`DEFAULT_MAX_QUEUED`](crate::DEFAULT_MAX_QUEUED) requests, each at most
    /// [`DEFAULT_MAX_QUEUE_WAIT`](crate::DEFAULT_MAX_QUEUE_WAIT)); see
    /// [`CoordinatorGate::with_queue_bound`].
    pub fn with_queue_bound(mut self, max_queued: usize, max_wait: Duration) -> Self {
        self.gate = self.gate.with_queue_bound(max_queued, max_wait);
        self
    }

    fn competition(&mut self) -> &mut Competition<L> {
        let lease = Arc::clone(self.gate.lease());
        let cap = self.max_error_backoff;
        self.competition.get_or_insert_with(|| {
            let retry = lease.settings().acquire_retry_delay();
            Competition::new(lease, retry, cap)
        })
    }

    fn compete(&mut self, delay: Duration, ctx: &mut Context<Self>) {
        let me = ctx.address().downgrade().recipient();
        self.competition().start(delay, me);
    }

    fn acquired(&mut self, guard: TenureGuard, ctx: &mut Context<Self>) {
        let Some((token, queued)) = self.gate.open(guard.clone()) else {
            return self.compete(Duration::ZERO, ctx);
        };
        tracing::info!(lease = %self.gate.lease().name(), fencing_token = %token, queued = queued.len(), "coordinator holds its lease");
        self.end_watch = Some(EndWatch::start(
            &guard,
            ctx.address().downgrade().recipient(),
        ));
        for (request, responder) in queued {
            self.process(request, responder, ctx);
        }
    }

    fn tenure_ended(&mut self, token: FencingToken, end: TenureEnd, ctx: &mut Context<Self>) {
        if !self.gate.tenure_ended(token) {
            return;
        }
        self.end_watch = None;
        let error = GateError::TenureEnded(end.clone());
        let rejected = self.reject_in_progress(&error);
        self.shards.clear();
        tracing::warn!(lease = %self.gate.lease().name(), fencing_token = %token, %end, rejected, "coordinator's tenure ended: competing again");
        self.compete(Duration::ZERO, ctx);
    }

    /// Rejects the allocations waiting for a region's acknowledgement.
    fn reject_in_progress(&mut self, error: &GateError) -> usize {
        let awaiting = std::mem::take(&mut self.awaiting_ack);
        let n = awaiting.len();
        for (_, responder) in awaiting {
            responder.send(Err(error.clone()));
        }
        n
    }

    /// Processes an admitted request; answers now or once the region acknowledged.
    fn process(&mut self, request: Request, responder: Responder<Answer>, ctx: &mut Context<Self>) {
        // Check the tenure right before the allocation, whatever happened since admission.
        let token = match self.gate.admit() {
            Ok(token) => token,
            Err(error) => return responder.send(Err(error)),
        };
        match request {
            Request::Register(region) => {
                if !self.regions.contains(&region) {
                    self.regions.push(region);
                }
                responder.send(Ok(Answer::Registered(self.regions.len())));
            }
            Request::Allocate(shard) => {
                self.regions.retain(|r| r.connected());
                if let Some(region) = self.shards.get(&shard).filter(|r| r.connected()) {
                    let allocation = ShardAllocation {
                        shard,
                        region: region.clone(),
                        fencing_token: token,
                    };
                    return responder.send(Ok(Answer::Allocated(allocation)));
                }
                let Some(region) = self.least_loaded_region() else {
                    return responder.send(Err(GateError::NoRegions));
                };
                self.shards.insert(shard.clone(), region.clone());
                let id = self.next_allocation;
                self.next_allocation += 1;
                self.awaiting_ack.insert(id, responder);
                tracing::debug!(%shard, fencing_token = %token, "allocating shard");
                let host = HostShard {
                    shard: shard.clone(),
                    fencing_token: token,
                };
                let timeout = self.ack_timeout;
                let ack = region.send(host).timeout(timeout);
                ctx.spawn(wrap_future::<_, Self>(ack).map(move |acked, act, _| {
                    // Rejected meanwhile (tenure ended)? Then it is answered already.
                    let Some(responder) = act.awaiting_ack.remove(&id) else {
                        return;
                    };
                    match acked {
                        Ok(()) => {}
                        // Wedged: the shard stays with the region, whose `HostShard` is still
                        // on its way; only the wait ends.
                        Err(MailboxError::Timeout) => {
                            tracing::warn!(lease = %act.gate.lease().name(), %shard, ?timeout, "region did not acknowledge the shard in time");
                            return responder.send(Err(GateError::AckTimeout { timeout }));
                        }
                        Err(MailboxError::Closed) => {
                            act.shards.remove(&shard);
                            return responder.send(Err(GateError::Stopped));
                        }
                    }
                    let answer = act.gate.admit().map(|fencing_token| {
                        Answer::Allocated(ShardAllocation {
                            shard,
                            region,
                            fencing_token,
                        })
                    });
                    responder.send(answer);
                }));
            }
        }
    }

    /// Makes sure queued requests are refused once they waited too long: one timer at a time,
    /// for the oldest.
    fn schedule_expiry(&mut self, ctx: &mut Context<Self>) {
        if self.expiry.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Some(at) = self.gate.next_expiry() else {
            return;
        };
        let me = ctx.address().downgrade();
        self.expiry = Some(actix_rt::spawn(async move {
            tokio::time::sleep_until(at).await;
            if let Some(me) = me.upgrade() {
                me.do_send(ExpireQueued);
            }
        }));
    }

    fn least_loaded_region(&self) -> Option<Recipient<HostShard>> {
        let load =
            |region: &Recipient<HostShard>| self.shards.values().filter(|r| *r == region).count();
        self.regions
            .iter()
            .enumerate()
            .min_by_key(|(i, r)| (load(r), *i))
            .map(|(_, r)| r.clone())
    }

    fn handle_request(
        &mut self,
        request: Request,
        ctx: &mut Context<Self>,
    ) -> impl std::future::Future<Output = Result<Answer, GateError>> + 'static {
        let (responder, answer) = Responder::new();
        match self.gate.submit(request) {
            Submission::Admitted(request, _) => self.process(request, responder, ctx),
            Submission::Queued(queued) => {
                self.schedule_expiry(ctx);
                return futures_util::future::Either::Left(receive(queued));
            }
            Submission::Refused(error) => responder.send(Err(error)),
        }
        futures_util::future::Either::Right(receive(answer))
    }
}

async fn receive<T>(
    rx: tokio::sync::oneshot::Receiver<Result<T, GateError>>,
) -> Result<T, GateError> {
    rx.await.unwrap_or(Err(GateError::Stopped))
}

impl<L: Lease> Actor for ShardCoordinator<L> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.compete(Duration::ZERO, ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.end_watch = None;
        if let Some(expiry) = self.expiry.take() {
            expiry.abort();
        }
        self.gate.close(GateError::Stopped);
        self.reject_in_progress(&GateError::Stopped);
        self.shards.clear();
        // Let an acquire round in flight finish, then release whatever is held.
        let round_over = self.competition().cancel();
        let lease = Arc::clone(self.gate.lease());
        actix_rt::spawn(async move {
            round_over.await;
            if let Err(error) = lease.release().await {
                tracing::warn!(error = &error as &dyn std::error::Error, lease = %lease.name(), "coordinator lease release failed");
            }
        });
    }
}

impl<L: Lease> Supervised for ShardCoordinator<L> {
    fn restarting(&mut self, _: &mut Self::Context) {
        tracing::debug!(lease = %self.gate.lease().name(), "coordinator restarting");
        self.gate.reset();
    }
}

impl<L: Lease> Handler<RoundDone> for ShardCoordinator<L> {
    type Result = ();

    fn handle(&mut self, done: RoundDone, ctx: &mut Self::Context) {
        if !self.competition().take_current(&done) {
            return;
        }
        match self.competition().next(done.result) {
            Next::Acquired(guard) => self.acquired(guard, ctx),
            Next::Compete(delay) => self.compete(delay, ctx),
        }
    }
}

impl<L: Lease> Handler<ExpireQueued> for ShardCoordinator<L> {
    type Result = ();

    fn handle(&mut self, _: ExpireQueued, ctx: &mut Self::Context) {
        self.expiry = None;
        let expired = self.gate.expire();
        if expired > 0 {
            tracing::warn!(lease = %self.gate.lease().name(), expired, "queued requests waited too long for the lease");
        }
        self.schedule_expiry(ctx);
    }
}

impl<L: Lease> Handler<TenureEnded> for ShardCoordinator<L> {
    type Result = ();

    fn handle(&mut self, TenureEnded { token, end }: TenureEnded, ctx: &mut Self::Context) {
        self.tenure_ended(token, end, ctx);
    }
}

impl<L: Lease> Handler<RegisterRegion> for ShardCoordinator<L> {
    type Result = ResponseFuture<Result<usize, GateError>>;

    fn handle(
        &mut self,
        RegisterRegion(region): RegisterRegion,
        ctx: &mut Self::Context,
    ) -> Self::Result {
        let answer = self.handle_request(Request::Register(region), ctx);
        Box::pin(async move {
            match answer.await? {
                Answer::Registered(n) => Ok(n),
                Answer::Allocated(_) => Err(GateError::Stopped),
            }
        })
    }
}

impl<L: Lease> Handler<AllocateShard> for ShardCoordinator<L> {
    type Result = ResponseFuture<Result<ShardAllocation, GateError>>;

    fn handle(
        &mut self,
        AllocateShard(shard): AllocateShard,
        ctx: &mut Self::Context,
    ) -> Self::Result {
        let answer = self.handle_request(Request::Allocate(shard), ctx);
        Box::pin(async move {
            match answer.await? {
                Answer::Allocated(a) => Ok(a),
                Answer::Registered(_) => Err(GateError::Stopped),
            }
        })
    }
}

impl<L: Lease> Handler<GetGateState> for ShardCoordinator<L> {
    type Result = GateState;

    fn handle(&mut self, _: GetGateState, _: &mut Self::Context) -> GateState {
        self.gate.state().clone()
    }
}
