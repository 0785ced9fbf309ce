//! Gating a sharding coordinator on a lease: [`CoordinatorGate`] and the reference
//! [`ShardCoordinator`] built on it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::backoff::{acquire_round, error_backoff, jitter, MIN_ROUND};
use crate::lease::{FencingToken, Lease, LeaseLost, LostReason, LostSubscription};

/// The default cap of the coordinator's backoff after acquire errors.
const DEFAULT_MAX_ERROR_BACKOFF: Duration = Duration::from_secs(10);

/// Why a gated request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// The coordinator does not hold its lease right now (not yet acquired, or past its deadline).
    #[error("the coordinator does not hold its lease")]
    NotHeld,
    /// The coordinator lost its lease; it rejects everything and stops.
    #[error("the coordinator lost its lease: {0}")]
    LeaseLost(LostReason),
    /// The coordinator stopped before answering.
    #[error("the coordinator stopped")]
    Stopped,
    /// No region is registered to take the shard.
    #[error("no region is registered")]
    NoRegions,
}

/// Where a gate is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateState {
    /// Acquiring the lease: requests wait.
    Acquiring,
    /// The lease is held with this token: requests are processed, each after a check.
    Open(FencingToken),
    /// The lease was lost or the coordinator stopped: requests are refused.
    Closed(GateError),
}

/// Answers one queued request.
#[derive(Debug)]
pub struct Responder<Res>(oneshot::Sender<Result<Res, GateError>>);

impl<Res> Responder<Res> {
    /// Sends the answer (ignored if the requester gave up).
    pub fn send(self, result: Result<Res, GateError>) {
        let _ = self.0.send(result);
    }
}

/// A request that waited for the lease, with the responder for its answer.
pub type Queued<Req, Res> = (Req, Responder<Res>);

/// What [`CoordinatorGate::submit`] decided.
#[derive(Debug)]
pub enum Submission<Req, Res> {
    /// The lease is alive: process `Req` now under this token.
    Admitted(Req, FencingToken),
    /// The lease is being acquired: the request is queued; await the receiver for its answer.
    Queued(oneshot::Receiver<Result<Res, GateError>>),
    /// Refused.
    Refused(GateError),
}

/// The lease gate of a coordinator actor.
///
/// During a network partition two sides of a cluster can each elect a coordinator; if both allocate
/// shards, one shard ends up hosted twice. A coordinator that holds a lease cannot have a twin:
///
/// 1. it acquires the lease before it processes allocation requests; requests that arrive meanwhile
///    wait (they are queued in the gate);
/// 2. it checks the lease ([`CoordinatorGate::admit`]) right before each allocation, and refuses with
///    [`GateError`] when the lease is not alive;
/// 3. when the lease is lost, it rejects every pending request with [`GateError::LeaseLost`] and
///    stops ([`CoordinatorGate::close`]).
///
/// [`ShardCoordinator`] is a complete coordinator built that way: regions register by address, and
/// each new shard goes to the region hosting the fewest shards. Use it as is, or as the pattern for
/// your own coordinator.
#[derive(Debug)]
pub struct CoordinatorGate<L: Lease, Req, Res> {
    lease: Arc<L>,
    state: GateState,
    pending: VecDeque<Queued<Req, Res>>,
}

impl<L: Lease, Req, Res> CoordinatorGate<L, Req, Res> {
    /// A gate on `lease`, acquiring.
    pub fn new(lease: Arc<L>) -> Self {
        Self {
            lease,
            state: GateState::Acquiring,
            pending: VecDeque::new(),
        }
    }

    /// The lease.
    pub fn lease(&self) -> &Arc<L> {
        &self.lease
    }

    /// The gate's state.
    pub fn state(&self) -> &GateState {
        &self.state
    }

    /// How many requests wait for the lease.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Checks the lease right before an allocation: the token to fence it with, or why not.
    pub fn admit(&self) -> Result<FencingToken, GateError> {
        match &self.state {
            GateState::Open(token) => {
                if self.lease.check_alive() && self.lease.fencing_token() == Some(*token) {
                    Ok(*token)
                } else {
                    Err(GateError::NotHeld)
                }
            }
            GateState::Acquiring => Err(GateError::NotHeld),
            GateState::Closed(error) => Err(error.clone()),
        }
    }

    /// Admits `request` now, queues it while acquiring, or refuses it.
    pub fn submit(&mut self, request: Req) -> Submission<Req, Res> {
        match &self.state {
            GateState::Acquiring => {
                let (tx, rx) = oneshot::channel();
                self.pending.push_back((request, Responder(tx)));
                Submission::Queued(rx)
            }
            GateState::Open(_) => match self.admit() {
                Ok(token) => Submission::Admitted(request, token),
                Err(error) => Submission::Refused(error),
            },
            GateState::Closed(error) => Submission::Refused(error.clone()),
        }
    }

    /// The lease was acquired: opens the gate and hands back the queued requests to process (each
    /// still goes through [`admit`](Self::admit) first). `None` if the lease is not alive after all.
    pub fn open(&mut self) -> Option<(FencingToken, Vec<Queued<Req, Res>>)> {
        if let GateState::Closed(_) = self.state {
            return None;
        }
        let token = self
            .lease
            .fencing_token()
            .filter(|_| self.lease.check_alive())?;
        self.state = GateState::Open(token);
        Some((token, self.pending.drain(..).collect()))
    }

    /// Closes the gate for good and rejects every queued request with `error`. Returns how many
    /// were rejected.
    pub fn close(&mut self, error: GateError) -> usize {
        self.state = GateState::Closed(error.clone());
        let n = self.pending.len();
        for (_, responder) in self.pending.drain(..) {
            responder.send(Err(error.clone()));
        }
        n
    }
}

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

impl<A, M> actix::dev::MessageResponse<A, M> for GateState
where
    A: Actor,
    M: Message<Result = GateState>,
{
    fn handle(self, _: &mut A::Context, tx: Option<actix::dev::OneshotSender<GateState>>) {
        if let Some(tx) = tx {
            let _ = tx.send(self);
        }
    }
}

enum Request {
    Register(Recipient<HostShard>),
    Allocate(ShardId),
}

enum Answer {
    Registered(usize),
    Allocated(ShardAllocation),
}

#[derive(Message)]
#[rtype(result = "()")]
struct Acquired(Result<bool, crate::lease::LeaseError>);

/// The reference shard coordinator, built on [`CoordinatorGate`] (see there for the pattern).
///
/// It competes for the lease like [`ClusterSingletonManager`](crate::ClusterSingletonManager):
/// in rounds of [`Lease::acquire_within`]`(2 × ttl)` that wait on the backend's change
/// notification, the next round after the lease's `acquire_retry_delay` ±20 %. After an acquire
/// error it logs it (`warn`) and backs off exponentially: `max(acquire_retry_delay, 100 ms)` first,
/// doubling after every further error, capped at
/// [`with_max_error_backoff`](Self::with_max_error_backoff) (default 10 s); the first answer from
/// the backend ends the backoff.
///
/// An allocation completes when the chosen region has acknowledged [`HostShard`]; until then it
/// is *pending*, and a lease loss rejects it. The coordinator stops after losing its lease. It also
/// stops when it is stopped from a handler or when its last address is dropped (it holds no address
/// to itself); it then rejects what is pending with [`GateError::Stopped`] and releases the lease.
pub struct ShardCoordinator<L: Lease> {
    gate: CoordinatorGate<L, Request, Answer>,
    regions: Vec<Recipient<HostShard>>,
    shards: BTreeMap<ShardId, Recipient<HostShard>>,
    awaiting_ack: BTreeMap<u64, Responder<Answer>>,
    next_allocation: u64,
    /// The acquire in flight: a task outside this actor's context (it must not keep the
    /// coordinator alive once every address is gone).
    acquiring: Option<tokio::task::JoinHandle<()>>,
    /// Acquire errors in a row.
    errors: u32,
    max_error_backoff: Duration,
    _lost: Option<LostSubscription>,
}

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
            acquiring: None,
            errors: 0,
            max_error_backoff: DEFAULT_MAX_ERROR_BACKOFF,
            _lost: None,
        }
    }

    /// Caps the exponential backoff after acquire errors (default 10 s; at least 100 ms).
    pub fn with_max_error_backoff(mut self, cap: Duration) -> Self {
        self.max_error_backoff = cap;
        self
    }

    /// The backend answered: ends the error backoff.
    fn recovered(&mut self) {
        if self.errors > 0 {
            tracing::info!(lease = %self.gate.lease().name(), errors = self.errors, "coordinator lease store reachable again");
            self.errors = 0;
        }
    }

    fn acquire(&mut self, ctx: &mut Context<Self>) {
        let lease = Arc::clone(self.gate.lease());
        let me = ctx.address().downgrade();
        // After an error a single attempt (the backoff paces them), otherwise a round that waits
        // on the backend's change notification.
        let window = if self.errors > 0 {
            Duration::ZERO
        } else {
            lease.settings().ttl().saturating_mul(2)
        };
        if let Some(task) = self.acquiring.take() {
            task.abort();
        }
        self.acquiring = Some(actix_rt::spawn(async move {
            let result = acquire_round(&*lease, window).await;
            match me.upgrade() {
                Some(me) => me.do_send(Acquired(result)),
                // The coordinator is gone: do not keep a lease nobody uses.
                None => {
                    if matches!(result, Ok(true)) {
                        let _ = lease.release().await;
                    }
                }
            }
        }));
    }

    /// Processes an admitted request; answers now or once the region acknowledged.
    fn process(&mut self, request: Request, responder: Responder<Answer>, ctx: &mut Context<Self>) {
        // Check the lease right before the allocation, whatever happened since admission.
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
                let ack = region.send(host);
                ctx.spawn(ack.into_actor(self).map(move |acked, act, _| {
                    // Rejected meanwhile (lease lost)? Then it is answered already.
                    let Some(responder) = act.awaiting_ack.remove(&id) else {
                        return;
                    };
                    if acked.is_err() {
                        act.shards.remove(&shard);
                        return responder.send(Err(GateError::Stopped));
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
        let (tx, rx) = oneshot::channel();
        match self.gate.submit(request) {
            Submission::Admitted(request, _) => self.process(request, Responder(tx), ctx),
            Submission::Queued(queued) => return Either::Left(queued),
            Submission::Refused(error) => {
                let _ = tx.send(Err(error));
            }
        }
        Either::Right(rx)
    }
}

/// Two receivers of the same answer type.
enum Either<T> {
    Left(oneshot::Receiver<T>),
    Right(oneshot::Receiver<T>),
}

impl<T> std::future::Future for Either<Result<T, GateError>> {
    type Output = Result<T, GateError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let rx = match self.get_mut() {
            Either::Left(rx) | Either::Right(rx) => rx,
        };
        std::pin::Pin::new(rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(GateError::Stopped)))
    }
}

impl<L: Lease> Actor for ShardCoordinator<L> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Weak: the lease's handler table must not keep the coordinator alive.
        let me = ctx.address().downgrade();
        self._lost = Some(self.gate.lease().on_lost(move |lost| {
            if let Some(me) = me.upgrade() {
                me.do_send(lost.clone());
            }
        }));
        self.acquire(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(task) = self.acquiring.take() {
            task.abort();
        }
        self.gate.close(GateError::Stopped);
        for (_, responder) in std::mem::take(&mut self.awaiting_ack) {
            responder.send(Err(GateError::Stopped));
        }
        let lease = Arc::clone(self.gate.lease());
        if lease.check_alive() {
            actix_rt::spawn(async move {
                if let Err(error) = lease.release().await {
                    tracing::warn!(%error, lease = %lease.name(), "coordinator lease release failed");
                }
            });
        }
    }
}

impl<L: Lease> Handler<Acquired> for ShardCoordinator<L> {
    type Result = ();

    fn handle(&mut self, Acquired(result): Acquired, ctx: &mut Self::Context) {
        self.acquiring = None;
        let retry = self.gate.lease().settings().acquire_retry_delay();
        match result {
            Ok(true) => {
                self.recovered();
                match self.gate.open() {
                    Some((token, queued)) => {
                        tracing::info!(lease = %self.gate.lease().name(), fencing_token = %token, queued = queued.len(), "coordinator holds its lease");
                        for (request, responder) in queued {
                            self.process(request, responder, ctx);
                        }
                    }
                    None => {
                        ctx.run_later(Duration::ZERO, |act, ctx| act.acquire(ctx));
                    }
                }
            }
            Ok(false) => {
                // Held elsewhere for a whole round (which waited on the watch): the next round
                // after the retry delay, with jitter.
                self.recovered();
                ctx.run_later(jitter(retry.max(MIN_ROUND)), |act, ctx| act.acquire(ctx));
            }
            Err(error) => {
                self.errors = self.errors.saturating_add(1);
                let delay = error_backoff(retry, self.max_error_backoff, self.errors);
                tracing::warn!(%error, lease = %self.gate.lease().name(), errors = self.errors, retry_in = ?delay, "coordinator lease acquire failed");
                ctx.run_later(delay, |act, ctx| act.acquire(ctx));
            }
        }
    }
}

impl<L: Lease> Handler<LeaseLost> for ShardCoordinator<L> {
    type Result = ();

    fn handle(&mut self, lost: LeaseLost, ctx: &mut Self::Context) {
        if matches!(self.gate.state(), GateState::Open(token) if Some(*token) == lost.fencing_token)
        {
            let error = GateError::LeaseLost(lost.reason.clone());
            let mut rejected = self.gate.close(error.clone());
            for (_, responder) in std::mem::take(&mut self.awaiting_ack) {
                responder.send(Err(error.clone()));
                rejected += 1;
            }
            tracing::warn!(lease = %lost.name, reason = %lost.reason, rejected, "coordinator lost its lease: stopping");
            ctx.stop();
        }
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
