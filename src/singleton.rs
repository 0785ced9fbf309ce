//! [`ClusterSingletonManager`]: run one instance of an actor across a fleet, guarded by a lease.

use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backoff::{acquire_round, error_backoff, jitter, MIN_ROUND};
use crate::lease::{FencingToken, Lease, LeaseError, LeaseLost, LostSubscription};

/// What a singleton learns when it is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SingletonInfo {
    /// The lease name.
    pub lease_name: String,
    /// This node's owner identity.
    pub owner: String,
    /// The fencing token of the tenure this instance runs under: pass it with every write.
    pub fencing_token: FencingToken,
    /// How many times the singleton was restarted within this tenure (0 for the first start).
    pub restart: u32,
}

/// Settings of a [`ClusterSingletonManager`]; plain data with documented defaults.
///
/// # How a node competes for the lease
///
/// While another node holds the lease, the manager waits for it in *rounds* of
/// [`Lease::acquire_within`]`(2 × ttl)` (at least `retry_delay`): each round tries once, then waits
/// on the backend's change notification (a watch, on every backend of this crate) and tries again
/// as soon as the lease is released or expires. So a waiting node takes over within a round trip
/// of a graceful release and right at the expiry of a crashed holder's claim, and costs the backend
/// next to nothing while it waits (on Kubernetes: two `GET`s and one watch per round, about three
/// requests a minute with a 30 s TTL, where client-go's leader election polls 20 times). The
/// round's first attempt is a single one: an error goes straight to the backoff below. A round
/// that ends with the lease still held elsewhere is followed by the next one after `retry_delay`
/// ±20 % of jitter, so that nodes do not retry in lockstep. (The acquire-layer's own retries
/// inside a round, every `acquire_retry_delay` on a transient error, are logged by the lease.)
///
/// After an error the manager logs it (`warn`) and backs off exponentially: single attempts,
/// `max(retry_delay, 100 ms)` apart, doubling after every further error, capped at
/// `max_error_backoff` (each pause is 80–100 % of its nominal value, never more than the cap). The
/// first answer from the backend (held elsewhere, or acquired) ends the backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SingletonSettings {
    /// The pause between two acquire rounds while the lease is held elsewhere, ±20 % (default: the
    /// lease's `acquire_retry_delay`; at least 10 ms), and the first pause of the error backoff
    /// (at least 100 ms).
    pub retry_delay: Option<Duration>,
    /// The cap of the exponential backoff after acquire errors (default 10 s; at least 100 ms).
    pub max_error_backoff: Duration,
    /// Restarts of a singleton that stopped on its own, within `restart_window` (default 3).
    pub max_restarts: u32,
    /// The window in which restarts are counted (default 60 s).
    pub restart_window: Duration,
    /// How long the node stays out of the competition after giving up on a failing singleton
    /// (default 5 s).
    pub give_up_pause: Duration,
    /// Shut down gracefully on SIGTERM and ctrl-c, then stop the actix `System` (default `false`).
    /// The manager then keeps running when its last address is dropped, until a signal or
    /// [`Shutdown`].
    pub handle_signals: bool,
}

impl Default for SingletonSettings {
    fn default() -> Self {
        Self {
            retry_delay: None,
            max_error_backoff: Duration::from_secs(10),
            max_restarts: 3,
            restart_window: Duration::from_secs(60),
            give_up_pause: Duration::from_secs(5),
            handle_signals: false,
        }
    }
}

/// Stop the singleton, wait until it stopped, release the lease, then stop the manager. Answers
/// whether the release succeeded (`Ok(true)` also when the lease was not held).
///
/// This is the way to shut a node down gracefully: await it before `System::stop` (which drops
/// actors without running their `stopping` hooks, so the lease would only expire after its TTL).
/// Sending it again, or to a manager that shut down already, answers the same result.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<bool, LeaseError>")]
pub struct Shutdown;

/// Whether this node may run the singleton (default `true` on every node).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct SetEligible(pub bool);

/// The address of the singleton if it runs on this node.
#[derive(Message)]
#[rtype(result = "Option<Addr<A>>")]
pub struct GetSingleton<A: Actor>(PhantomData<fn() -> A>);

impl<A: Actor> GetSingleton<A> {
    /// The query.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<A: Actor> Default for GetSingleton<A> {
    fn default() -> Self {
        Self::new()
    }
}

impl<A: Actor> fmt::Debug for GetSingleton<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GetSingleton")
    }
}

/// What the manager is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SingletonState {
    /// Not competing (ineligible).
    Idle,
    /// Competing for the lease: a round is in flight, or the next attempt is scheduled (after an
    /// error, or after giving up on a failing singleton).
    Acquiring,
    /// The singleton runs on this node.
    Running,
    /// The singleton is being stopped.
    Stopping,
    /// The lease is being released.
    Releasing,
    /// Shut down.
    ShutDown,
}

/// A snapshot of a manager, for monitoring and tests.
#[derive(Debug, Clone, PartialEq, Eq, MessageResponse)]
pub struct SingletonStatus {
    /// What the manager is doing.
    pub state: SingletonState,
    /// The fencing token the singleton runs under, when it runs here.
    pub fencing_token: Option<FencingToken>,
    /// How many singleton instances this manager has started.
    pub started: u64,
}

/// Ask a manager for its [`SingletonStatus`].
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "SingletonStatus")]
pub struct GetStatus;

/// Internal: the singleton instance `0` has stopped.
#[derive(Message)]
#[rtype(result = "()")]
struct SingletonStopped(u64);

/// Internal: the acquire round `round` ended with `result`.
#[derive(Message)]
#[rtype(result = "()")]
struct RoundDone {
    round: u64,
    result: Result<bool, LeaseError>,
}

/// Lives in the singleton's context: when the context is dropped (the singleton stopped or
/// panicked), tells the manager, if it still exists. Holds the manager weakly, so that the
/// singleton does not keep its manager alive.
struct GoneGuard<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    manager: actix::WeakAddr<ClusterSingletonManager<A, L>>,
    instance: u64,
}

impl<A, L> Drop for GoneGuard<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    fn drop(&mut self) {
        if let Some(manager) = self.manager.upgrade() {
            manager.do_send(SingletonStopped(self.instance));
        }
    }
}

/// What to do once the singleton has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterStop {
    /// The lease was lost: compete again.
    Reacquire,
    /// Release the lease, then stay idle (ineligible) or pause (gave up).
    Release { then_pause: Option<Duration> },
    /// Release the lease, then stop the manager.
    Shutdown,
}

enum Phase<A: Actor> {
    Idle,
    Acquiring,
    Running {
        instance: u64,
        addr: Addr<A>,
        stop: Option<oneshot::Sender<()>>,
        token: FencingToken,
    },
    Stopping {
        instance: u64,
        then: AfterStop,
    },
    Releasing,
    ShutDown,
}

type Factory<A> = dyn Fn(&SingletonInfo, &mut Context<A>) -> A;

/// Runs a singleton actor on whichever node holds the lease.
///
/// Start one manager on every node, each with a lease of the same name and its own owner identity.
/// The manager that acquires the lease starts the singleton; the others keep trying.
///
/// # The lifecycle on one node
///
/// 1. **Acquire.** The manager competes in rounds of [`Lease::acquire_within`], one every
///    [`SingletonSettings::retry_delay`] (±20 % jitter) while another node holds the lease; within a
///    round it waits on the backend's watch, so a release elsewhere is noticed within a round trip.
///    `Ok(true)` starts the singleton, telling it its [`FencingToken`] through [`SingletonInfo`].
///    An error is logged (`warn`) and retried with an exponential backoff capped at
///    [`SingletonSettings::max_error_backoff`]. See [`SingletonSettings`] for the details.
/// 2. **Lease lost.** The singleton is stopped at once; only when it *has* stopped does the manager
///    try to acquire again, so this node never runs two instances, and the instance of a node that
///    lost its lease stops at the holder's local deadline, before any other node can acquire.
/// 3. **The singleton stops or panics on its own** while the lease is held: it is restarted, at most
///    [`SingletonSettings::max_restarts`] times within [`SingletonSettings::restart_window`]; past that
///    the manager releases the lease, lets another node try, and competes again after
///    [`SingletonSettings::give_up_pause`].
/// 4. **Graceful shutdown**: the singleton is stopped, the manager waits until it has stopped,
///    then releases the lease, so another node takes over at once instead of after the TTL. It
///    happens on
///    * [`Shutdown`] (its answer comes after the release);
///    * the manager being stopped: `ctx.stop()` from one of its handlers, or the last address of
///      the manager being dropped (keep its [`Addr`] for as long as the node should compete);
///    * SIGTERM or ctrl-c when [`SingletonSettings::handle_signals`] is set; the manager then stops
///      the actix `System` once the lease is released. With `handle_signals` the manager also keeps
///      running when its last address is dropped, until a signal or [`Shutdown`].
///
///    `System::stop` cannot be intercepted: it ends the arbiters and drops every actor without
///    running its `stopping` hook, so the singleton is dropped (not stopped first) and the lease is
///    not released: it expires after its TTL, as after a crash. To stop a process gracefully,
///    `manager.send(Shutdown).await` before `System::stop`, or use `handle_signals`.
/// 5. **Eligibility.** [`SetEligible(false)`](SetEligible) (for example on a membership component's
///    leader-changed event) stops the singleton, releases the lease and stops competing;
///    `SetEligible(true)` competes again. Every node is eligible by default.
///
/// ```
/// use actix::prelude::*;
/// use actix_coordination::{ClusterSingletonManager, GetSingleton, InMemoryStore, LeaseSettings};
///
/// struct Scheduler { token: u64 }
/// impl Actor for Scheduler { type Context = Context<Self>; }
///
/// # #[actix_rt::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let lease = store.lease(LeaseSettings::new("scheduler", "node-1")?);
/// let manager = ClusterSingletonManager::new(lease, |info, _ctx| Scheduler {
///     token: info.fencing_token.value(),
/// })
/// .start();
/// # tokio::time::sleep(std::time::Duration::from_millis(50)).await;
/// assert!(manager.send(GetSingleton::<Scheduler>::new()).await?.is_some());
/// # Ok(()) }
/// ```
pub struct ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    lease: Arc<L>,
    factory: Rc<Factory<A>>,
    settings: SingletonSettings,
    phase: Phase<A>,
    eligible: bool,
    shutting_down: bool,
    shutdown_waiters: Vec<oneshot::Sender<Result<bool, LeaseError>>>,
    release_result: Option<Result<bool, LeaseError>>,
    /// The acquire round in flight (or scheduled): a task outside this actor's context, so that
    /// it does not keep the manager alive once every address is gone.
    round: Option<tokio::task::JoinHandle<()>>,
    rounds: u64,
    errors: u32,
    instances: u64,
    restarts: VecDeque<Instant>,
    restart_count: u32,
    _lost: Option<LostSubscription>,
}

impl<A, L> ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    /// A manager for `lease` that builds the singleton with `factory` whenever it starts one.
    pub fn new(lease: L, factory: impl Fn(&SingletonInfo, &mut Context<A>) -> A + 'static) -> Self {
        Self::from_arc(Arc::new(lease), factory)
    }

    /// Like [`new`](Self::new), sharing the lease.
    pub fn from_arc(
        lease: Arc<L>,
        factory: impl Fn(&SingletonInfo, &mut Context<A>) -> A + 'static,
    ) -> Self {
        Self {
            lease,
            factory: Rc::new(factory),
            settings: SingletonSettings::default(),
            phase: Phase::Idle,
            eligible: true,
            shutting_down: false,
            shutdown_waiters: Vec::new(),
            release_result: None,
            round: None,
            rounds: 0,
            errors: 0,
            instances: 0,
            restarts: VecDeque::new(),
            restart_count: 0,
            _lost: None,
        }
    }

    /// Replaces the settings.
    pub fn settings(mut self, settings: SingletonSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Starts not eligible: the node competes only after [`SetEligible(true)`](SetEligible).
    pub fn not_eligible(mut self) -> Self {
        self.eligible = false;
        self
    }

    fn retry_delay(&self) -> Duration {
        self.settings
            .retry_delay
            .unwrap_or_else(|| self.lease.settings().acquire_retry_delay())
    }

    fn state(&self) -> SingletonState {
        match self.phase {
            Phase::Idle => SingletonState::Idle,
            Phase::Acquiring => SingletonState::Acquiring,
            Phase::Running { .. } => SingletonState::Running,
            Phase::Stopping { .. } => SingletonState::Stopping,
            Phase::Releasing => SingletonState::Releasing,
            Phase::ShutDown => SingletonState::ShutDown,
        }
    }

    fn competing(&self) -> bool {
        self.eligible && !self.shutting_down
    }

    /// Starts an acquire round after `delay`: after an error a single attempt, otherwise a round
    /// of `2 × ttl` (at least `retry_delay`) that waits on the backend's watch (see
    /// [`SingletonSettings`]).
    fn schedule_acquire(&mut self, delay: Duration, ctx: &mut Context<Self>) {
        self.cancel_acquire();
        self.rounds += 1;
        let round = self.rounds;
        let window = if self.errors > 0 {
            Duration::ZERO
        } else {
            (self.lease.settings().ttl().saturating_mul(2)).max(self.retry_delay().max(MIN_ROUND))
        };
        let lease = Arc::clone(&self.lease);
        let manager = ctx.address().downgrade();
        self.phase = Phase::Acquiring;
        self.round = Some(actix_rt::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let result = acquire_round(&*lease, window).await;
            match manager.upgrade() {
                Some(manager) => manager.do_send(RoundDone { round, result }),
                // The manager is gone: do not keep a lease nobody uses.
                None => {
                    if matches!(result, Ok(true)) {
                        let _ = lease.release().await;
                    }
                }
            }
        }));
    }

    fn try_acquire(&mut self, ctx: &mut Context<Self>) {
        self.schedule_acquire(Duration::ZERO, ctx);
    }

    /// Abandons the acquire round in flight or scheduled (shutdown, not eligible).
    fn cancel_acquire(&mut self) {
        if let Some(task) = self.round.take() {
            task.abort();
        }
        if matches!(self.phase, Phase::Acquiring) {
            self.phase = Phase::Idle;
        }
    }

    /// The pause after the `errors`-th error in a row.
    fn error_backoff(&self) -> Duration {
        error_backoff(
            self.retry_delay(),
            self.settings.max_error_backoff,
            self.errors,
        )
    }

    fn acquired(&mut self, result: Result<bool, LeaseError>, ctx: &mut Context<Self>) {
        self.phase = Phase::Idle;
        if !self.competing() {
            // Became ineligible or started shutting down while acquiring.
            let then = if self.shutting_down {
                AfterStop::Shutdown
            } else {
                AfterStop::Release { then_pause: None }
            };
            self.release(then, ctx);
            return;
        }
        match result {
            Ok(true) => {
                self.recovered();
                match self.lease.fencing_token() {
                    Some(token) => {
                        self.restarts.clear();
                        self.restart_count = 0;
                        self.start_singleton(token, ctx);
                    }
                    // Lost again already: compete again.
                    None => self.schedule_acquire(Duration::ZERO, ctx),
                }
            }
            Ok(false) => {
                // Held elsewhere for a whole round (which waited on the watch): the next round
                // after the retry delay, with jitter.
                self.recovered();
                self.schedule_acquire(jitter(self.retry_delay().max(MIN_ROUND)), ctx);
            }
            Err(error) => {
                self.errors = self.errors.saturating_add(1);
                let delay = self.error_backoff();
                tracing::warn!(%error, lease = %self.lease.name(), owner = %self.lease.owner(), errors = self.errors, retry_in = ?delay, "singleton lease acquire failed");
                self.schedule_acquire(delay, ctx);
            }
        }
    }

    /// The backend answered: ends the error backoff.
    fn recovered(&mut self) {
        if self.errors > 0 {
            tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), errors = self.errors, "singleton lease store reachable again");
            self.errors = 0;
        }
    }

    fn start_singleton(&mut self, token: FencingToken, ctx: &mut Context<Self>) {
        self.instances += 1;
        let instance = self.instances;
        let (stop, stop_rx) = oneshot::channel::<()>();
        let gone = GoneGuard {
            manager: ctx.address().downgrade(),
            instance,
        };
        let info = SingletonInfo {
            lease_name: self.lease.name().to_owned(),
            owner: self.lease.owner().to_owned(),
            fencing_token: token,
            restart: self.restart_count,
        };
        let factory = Rc::clone(&self.factory);
        let addr = A::create(move |sctx| {
            // Stops the singleton when the manager says so, or when the manager is gone.
            sctx.spawn(
                async move {
                    let _ = stop_rx.await;
                }
                .into_actor_any()
                .map(|(), _, sctx: &mut Context<A>| sctx.stop()),
            );
            // Dropped with the singleton's context, whether it stopped or panicked; then tells
            // the manager.
            sctx.spawn(
                async move {
                    let _gone = gone;
                    std::future::pending::<()>().await
                }
                .into_actor_any(),
            );
            factory(&info, sctx)
        });
        tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), fencing_token = %token, instance, "singleton started");
        self.phase = Phase::Running {
            instance,
            addr,
            stop: Some(stop),
            token,
        };
    }

    /// Stops the running singleton (if any) and does `then` once it has stopped.
    fn stop_singleton(&mut self, then: AfterStop, ctx: &mut Context<Self>) {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Running {
                instance, mut stop, ..
            } => {
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
                self.phase = Phase::Stopping { instance, then };
            }
            Phase::Stopping {
                instance,
                then: old,
            } => {
                // A shutdown wins over everything; a release over a reacquire.
                let then = match (old, then) {
                    (AfterStop::Shutdown, _) | (_, AfterStop::Shutdown) => AfterStop::Shutdown,
                    (AfterStop::Release { then_pause }, AfterStop::Reacquire) => {
                        AfterStop::Release { then_pause }
                    }
                    (_, then) => then,
                };
                self.phase = Phase::Stopping { instance, then };
            }
            other @ (Phase::Acquiring | Phase::Releasing | Phase::ShutDown) => {
                // The pending acquire or release looks at `competing()` when it comes back.
                self.phase = other;
            }
            Phase::Idle => self.after_stop(then, ctx),
        }
    }

    fn after_stop(&mut self, then: AfterStop, ctx: &mut Context<Self>) {
        self.phase = Phase::Idle;
        match then {
            AfterStop::Reacquire if self.competing() => self.try_acquire(ctx),
            AfterStop::Reacquire => {
                let then = if self.shutting_down {
                    AfterStop::Shutdown
                } else {
                    AfterStop::Release { then_pause: None }
                };
                self.release(then, ctx)
            }
            then => self.release(then, ctx),
        }
    }

    fn release(&mut self, then: AfterStop, ctx: &mut Context<Self>) {
        self.phase = Phase::Releasing;
        let lease = Arc::clone(&self.lease);
        ctx.spawn(async move { lease.release().await }.into_actor(self).map(
            move |result, act, ctx| {
                if let Err(error) = &result {
                    tracing::warn!(%error, lease = %act.lease.name(), owner = %act.lease.owner(), "singleton lease release failed; it expires after its TTL");
                }
                act.phase = Phase::Idle;
                match then {
                    AfterStop::Shutdown => {
                        act.release_result = Some(clone_result(&result));
                        act.finish_shutdown(result, ctx);
                    }
                    AfterStop::Release { then_pause } if act.competing() => {
                        act.schedule_acquire(then_pause.unwrap_or(Duration::ZERO), ctx);
                    }
                    AfterStop::Release { .. } | AfterStop::Reacquire => {
                        if act.shutting_down {
                            act.finish_shutdown(result, ctx);
                        }
                    }
                }
            },
        ));
    }

    fn begin_shutdown(&mut self, ctx: &mut Context<Self>) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        self.cancel_acquire();
        tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), "singleton manager shutting down");
        self.stop_singleton(AfterStop::Shutdown, ctx);
    }

    fn finish_shutdown(&mut self, result: Result<bool, LeaseError>, ctx: &mut Context<Self>) {
        self.phase = Phase::ShutDown;
        let mut result = Some(result);
        for waiter in self.shutdown_waiters.drain(..) {
            let r = match result.take() {
                Some(r) => r,
                None => clone_result(self.release_result.as_ref().expect("set")),
            };
            let _ = waiter.send(r);
        }
        if self.settings.handle_signals {
            System::current().stop();
        }
        ctx.stop();
    }
}

fn clone_result(result: &Result<bool, LeaseError>) -> Result<bool, LeaseError> {
    match result {
        Ok(b) => Ok(*b),
        Err(e) => Err(e.clone()),
    }
}

/// Lets a plain future be spawned into any actor's context.
trait IntoActorAny: std::future::Future + Sized {
    fn into_actor_any<A: Actor>(self) -> actix::fut::future::FutureWrap<Self, A> {
        actix::fut::wrap_future(self)
    }
}

impl<F: std::future::Future> IntoActorAny for F {}

impl<A, L> Actor for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Weak: the lease's handler table must not keep the manager alive.
        let manager = ctx.address().downgrade();
        self._lost = Some(self.lease.on_lost(move |lost| {
            if let Some(manager) = manager.upgrade() {
                manager.do_send(lost.clone());
            }
        }));
        if self.settings.handle_signals {
            ctx.spawn(shutdown_signal().into_actor(self).map(|(), act, ctx| {
                tracing::info!("termination signal received");
                act.begin_shutdown(ctx);
            }));
        }
        if self.competing() {
            self.try_acquire(ctx);
        }
    }

    fn stopping(&mut self, ctx: &mut Self::Context) -> Running {
        if matches!(self.phase, Phase::ShutDown) {
            return Running::Stop;
        }
        // Stopped (`ctx.stop()`, or the last address dropped): shut down gracefully first.
        self.begin_shutdown(ctx);
        if matches!(self.phase, Phase::ShutDown) {
            Running::Stop
        } else {
            Running::Continue
        }
    }
}

impl<A, L> Drop for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    fn drop(&mut self) {
        // Dropped without a graceful shutdown (`System::stop`, a panic): end the acquire round.
        self.cancel_acquire();
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

impl<A, L> Handler<LeaseLost> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, lost: LeaseLost, ctx: &mut Self::Context) {
        match &self.phase {
            Phase::Running { token, .. } if Some(*token) == lost.fencing_token => {
                tracing::warn!(lease = %lost.name, owner = %lost.owner, reason = %lost.reason, "lease lost: stopping the singleton");
                let then = if self.competing() {
                    AfterStop::Reacquire
                } else if self.shutting_down {
                    AfterStop::Shutdown
                } else {
                    AfterStop::Release { then_pause: None }
                };
                self.stop_singleton(then, ctx);
            }
            _ => {}
        }
    }
}

impl<A, L> Handler<RoundDone> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, RoundDone { round, result }: RoundDone, ctx: &mut Self::Context) {
        // A round that was cancelled after it finished is stale; whatever it acquired is released
        // by the shutdown or eligibility change that cancelled it.
        if round != self.rounds || !matches!(self.phase, Phase::Acquiring) {
            return;
        }
        self.round = None;
        self.acquired(result, ctx);
    }
}

impl<A, L> Handler<SingletonStopped> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, SingletonStopped(stopped): SingletonStopped, ctx: &mut Self::Context) {
        match self.phase {
            Phase::Stopping { instance, then } if instance == stopped => {
                tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), instance, "singleton stopped");
                self.after_stop(then, ctx);
            }
            Phase::Running {
                instance, token, ..
            } if instance == stopped => {
                // Stopped or panicked on its own while the lease is held.
                let now = Instant::now();
                let window = self.settings.restart_window;
                while self
                    .restarts
                    .front()
                    .is_some_and(|t| now.duration_since(*t) > window)
                {
                    self.restarts.pop_front();
                }
                if self.lease.check_alive()
                    && self.restarts.len() < self.settings.max_restarts as usize
                {
                    self.restarts.push_back(now);
                    self.restart_count += 1;
                    tracing::warn!(lease = %self.lease.name(), owner = %self.lease.owner(), restart = self.restart_count, "singleton stopped on its own: restarting it");
                    self.phase = Phase::Idle;
                    self.start_singleton(token, ctx);
                } else {
                    tracing::error!(lease = %self.lease.name(), owner = %self.lease.owner(), "singleton keeps stopping: releasing the lease for another node");
                    self.phase = Phase::Idle;
                    self.release(
                        AfterStop::Release {
                            then_pause: Some(self.settings.give_up_pause),
                        },
                        ctx,
                    );
                }
            }
            _ => {}
        }
    }
}

impl<A, L> Handler<Shutdown> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ResponseFuture<Result<bool, LeaseError>>;

    fn handle(&mut self, _: Shutdown, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        if matches!(self.phase, Phase::ShutDown) {
            let _ = tx.send(clone_result(
                self.release_result.as_ref().unwrap_or(&Ok(true)),
            ));
        } else {
            self.shutdown_waiters.push(tx);
            self.begin_shutdown(ctx);
        }
        Box::pin(async move { rx.await.unwrap_or(Ok(true)) })
    }
}

impl<A, L> Handler<SetEligible> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, SetEligible(eligible): SetEligible, ctx: &mut Self::Context) {
        if self.eligible == eligible || self.shutting_down {
            self.eligible = eligible;
            return;
        }
        self.eligible = eligible;
        if eligible {
            if matches!(self.phase, Phase::Idle) {
                self.schedule_acquire(Duration::ZERO, ctx);
            }
        } else {
            self.cancel_acquire();
            tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), "not eligible any more: stopping the singleton and releasing");
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
                Phase::Running { token, .. } => Some(*token),
                _ => None,
            },
            started: self.instances,
        }
    }
}
