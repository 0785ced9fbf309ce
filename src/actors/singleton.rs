//! [`ClusterSingletonManager`]: run one instance of an actor across a fleet, guarded by a lease.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::fut::{wrap_future, ActorFuture, ActorFutureExt};
use actix::prelude::*;
use actix::WeakRecipient;
use futures_util::task::AtomicWaker;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::compete::{Competition, EndWatch, Next, RoundDone, TenureEnded};
use crate::group::GroupWatch;
use crate::health::{HealthCheck, SingletonHealth};
use crate::lease::{FencingToken, Lease, LeaseError};
use crate::metrics::{self, LeaseLabel};
use crate::settings::{LeaseSettings, SettingsError};
use crate::tenure::{TenureEnd, TenureGuard};

mod candidacy;
mod handlers;

pub(crate) use handlers::{HandOverTo, HandoverTarget, KeepLeaseOnShutdown, RetireHanding};

pub use super::singleton_messages::{
    GetLeader, GetSingleton, GetStatus, LeaderInfo, SetEligible, Shutdown, SingletonState,
    SingletonStatus, TransferLeadership,
};

/// What a singleton learns when it is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SingletonInfo {
    /// The lease name.
    pub lease_name: String,
    /// This node's owner identity.
    pub owner: String,
    /// The fencing token of the tenure this instance runs under: pass it with every write
    /// (the same as `guard.token()`).
    pub fencing_token: FencingToken,
    /// The guard of the tenure this instance runs under: check
    /// [`check_alive`](TenureGuard::check_alive) before every step (a timer tick, a handler, a
    /// write), and await [`ended`](TenureGuard::ended) in long-running work. It turns `false`
    /// before any other node can acquire the lease.
    pub guard: TenureGuard,
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
/// little while it waits. A round that ends with the lease still held elsewhere is followed by the
/// next one after `retry_delay` ±20 % of jitter, so that nodes do not retry in lockstep.
///
/// After an error the manager logs it (`warn`) and backs off exponentially: single attempts,
/// `max(retry_delay, 100 ms)` apart, doubling after every further error, capped at
/// `max_error_backoff` (each pause is 80–100 % of its nominal value, never more than the cap). The
/// first answer from the backend (held elsewhere, or acquired) ends the backoff.
///
/// # Validation
///
/// [`validate`](Self::validate) rejects a duration longer than [`LeaseSettings::MAX_DURATION`]
/// (one day: such a value is almost certainly a unit mistake) with
/// [`SettingsError::DurationTooLong`] naming the field;
/// [`ClusterSingletonManager::try_settings`] validates before it takes them. Settings given
/// unvalidated to [`ClusterSingletonManager::settings`] never make the manager or a
/// [`HealthCheck`] panic, however long: every computation with them saturates (a pause that long
/// means "never"; test `plain_data_never_panics_the_manager_and_try_settings_rejects_it`).
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
    /// (default 5 s), its candidacy withdrawn if it has one.
    pub give_up_pause: Duration,
    /// How long the manager waits for the singleton to stop (default 10 s). A singleton still
    /// running after it (its `stopping` hook returned `Running::Continue`, or it blocks its
    /// thread) is terminated (`ctx.terminate()`, which skips `stopping`; a blocked thread cannot
    /// be interrupted) and the manager carries on without it: after a lost lease it competes
    /// again, on shutdown or ineligibility it releases the lease anyway. Either way it logs an
    /// error and counts it in [`SingletonStatus::unstopped`].
    pub stop_timeout: Duration,
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
            stop_timeout: Duration::from_secs(10),
            handle_signals: false,
        }
    }
}

impl SingletonSettings {
    /// Checks every duration against [`LeaseSettings::MAX_DURATION`] (one day).
    ///
    /// # Errors
    ///
    /// [`SettingsError::DurationTooLong`] for the first duration that is longer, naming it as in
    /// configuration (`retry-delay`, `max-error-backoff`, `restart-window`, `give-up-pause`,
    /// `stop-timeout`).
    pub fn validate(&self) -> Result<(), SettingsError> {
        let durations = [
            ("retry-delay", self.retry_delay),
            ("max-error-backoff", Some(self.max_error_backoff)),
            ("restart-window", Some(self.restart_window)),
            ("give-up-pause", Some(self.give_up_pause)),
            ("stop-timeout", Some(self.stop_timeout)),
        ];
        for (field, value) in durations {
            if let Some(value) = value.filter(|v| *v > LeaseSettings::MAX_DURATION) {
                return Err(SettingsError::DurationTooLong {
                    field,
                    value,
                    max: LeaseSettings::MAX_DURATION,
                });
            }
        }
        Ok(())
    }
}

/// Internal: wakes the manager's context (see `stopping`).
#[derive(Message)]
#[rtype(result = "()")]
struct Wake;

impl<A, L> Handler<Wake> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, _: Wake, _: &mut Self::Context) {}
}

/// Internal: the singleton instance `0` has stopped.
#[derive(Message)]
#[rtype(result = "()")]
struct SingletonStopped(u64);

/// What to do once the singleton has stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AfterStop {
    /// The tenure ended: compete again.
    Reacquire,
    /// Release the lease, then stay idle (ineligible) or pause (gave up).
    Release { then_pause: Option<Duration> },
    /// Release the lease to the preferred owner `to`, then compete again (if eligible).
    Transfer { to: String },
    /// Release the lease, then stop the manager.
    Shutdown,
}

impl AfterStop {
    /// A shutdown wins over everything; a transfer over a release; a release over a reacquire.
    fn merge(self, other: AfterStop) -> AfterStop {
        match (self, other) {
            (AfterStop::Shutdown, _) | (_, AfterStop::Shutdown) => AfterStop::Shutdown,
            (transfer @ AfterStop::Transfer { .. }, _)
            | (_, transfer @ AfterStop::Transfer { .. }) => transfer,
            (AfterStop::Release { then_pause }, AfterStop::Reacquire) => {
                AfterStop::Release { then_pause }
            }
            (_, other) => other,
        }
    }
}

enum Phase<A: Actor> {
    Idle,
    Acquiring,
    Running {
        instance: u64,
        addr: Addr<A>,
        stop: StopHandle,
        guard: TenureGuard,
        _end_watch: EndWatch,
    },
    Stopping {
        instance: u64,
        then: AfterStop,
        stop: StopHandle,
    },
    Releasing,
    ShutDown,
}

/// How the manager builds singletons: on its own arbiter (factories need not be `Send`), or on
/// another arbiter.
enum Factory<A: Actor<Context = Context<A>>> {
    Local(Rc<LocalFactory<A>>),
    Arbiter(actix_rt::ArbiterHandle, Arc<SendFactory<A>>),
}

type LocalFactory<A> = dyn Fn(&SingletonInfo, &mut Context<A>) -> A;
type SendFactory<A> = dyn Fn(&SingletonInfo, &mut Context<A>) -> A + Send + Sync;

/// The capacity of a singleton's mailbox (actix's default).
const MAILBOX_CAPACITY: usize = 16;

/// Starts a singleton on the current arbiter, if its tenure is still alive: the guard is checked
/// immediately before the factory runs. When it is not, neither the factory nor `started` runs;
/// dropping the watcher tells the manager that the instance is gone, and the manager, seeing the
/// tenure ended, competes again (or releases) as after any end of a tenure.
fn start_guarded<A: Actor<Context = Context<A>>>(
    rx: actix::dev::channel::AddressReceiver<A>,
    watcher: Watcher,
    info: SingletonInfo,
    factory: &dyn Fn(&SingletonInfo, &mut Context<A>) -> A,
) {
    if !info.guard.check_alive() {
        tracing::warn!(lease = %info.lease_name, owner = %info.owner, fencing_token = %info.fencing_token, "the tenure ended before the singleton's arbiter could start it; not starting it");
        return;
    }
    let mut ctx = Context::with_receiver(rx);
    // First item of the singleton's context: polled before its own timers.
    ctx.spawn(watcher);
    let singleton = factory(&info, &mut ctx);
    actix_rt::spawn(ctx.into_future(singleton));
}

/// Runs a singleton actor on whichever node holds the lease.
///
/// Start one manager on every node, each with a lease of the same name and its own owner identity.
/// The manager that acquires the lease starts the singleton; the others keep trying.
///
/// # The guarantee, exactly
///
/// The singleton is started only under a tenure that is alive at that instant, and it receives
/// that tenure's [`TenureGuard`] in its [`SingletonInfo`]. The guard is checked where the
/// singleton runs, right before its factory: a singleton started
/// [`on_arbiter`](ClusterSingletonManager::on_arbiter) whose arbiter was busy until after the
/// tenure ended is not built at all (neither the factory nor `started` runs), and the manager
/// competes again as after any end of a tenure (test
/// `a_busy_arbiter_does_not_start_the_singleton_after_its_tenure_ended`). The guard's `check_alive()` turns
/// `false` before any other node can acquire the lease (see [`Lease::check_alive`]); at that
/// instant the singleton is *told*, but it is not frozen: a step it began after its last check
/// can still run. So a singleton must gate every step with `info.guard.check_alive()` and fence
/// every write with `info.fencing_token`. On top of that the manager stops it:
///
/// * The first item spawned into the singleton's context (before its own `started` runs) is a
///   watcher that checks the guard each time the context is polled, before the singleton's timers
///   and spawned futures: a singleton whose timers fell due after its deadline (the process or
///   its thread was paused) is stopped before they run, provided its `stopping` hook returns
///   `Running::Stop`. Messages already in its mailbox are handled before that check: gate
///   handlers with the guard.
/// * The watcher and the manager both wait on [`TenureGuard::ended`], which resolves at the
///   deadline, on a loss, and on a release through *any* handle of the lease (another actor or
///   component sharing it), so every end of the tenure stops the singleton.
///
/// # The lifecycle on one node
///
/// 1. **Acquire.** The manager competes in rounds of [`Lease::acquire_within`], one every
///    [`SingletonSettings::retry_delay`] (±20 % jitter) while another node holds the lease; within a
///    round it waits on the backend's watch, so a release elsewhere is noticed within a round trip.
///    `Ok(true)` starts the singleton with the guard of the tenure alive *now*; if the tenure
///    already ended (the thread was held past the deadline), it competes again instead. An error
///    is logged (`warn`) and retried with an exponential backoff capped at
///    [`SingletonSettings::max_error_backoff`].
/// 2. **The tenure ends** (deadline, loss, release through another handle). The singleton is
///    stopped; only when it *has* stopped (or [`SingletonSettings::stop_timeout`] passed) does the
///    manager compete again.
/// 3. **The singleton stops or panics on its own** while the tenure is alive: it is restarted with
///    the same guard, at most [`SingletonSettings::max_restarts`] times within
///    [`SingletonSettings::restart_window`]; past that the manager releases the lease, lets
///    another node try, and competes again after [`SingletonSettings::give_up_pause`]. With a
///    [candidacy](Self::candidacy) it also withdraws its candidacy for that pause, so that the
///    nodes deferring to it under the handover policy run the singleton meanwhile.
/// 4. **Graceful shutdown**: the singleton is stopped, the manager waits until it has stopped (at
///    most `stop_timeout`), then releases the lease, so another node takes over at once instead of
///    after the TTL. An acquire round in flight is never cut short: its attempt is finished and
///    what it got is released, so [`Shutdown`] answers only what really happened. It happens on
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
/// A singleton that blocks its thread delays everything on that arbiter, the manager included:
/// run it on its own arbiter with [`ClusterSingletonManager::on_arbiter`].
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
    factory: Factory<A>,
    settings: SingletonSettings,
    phase: Phase<A>,
    eligible: bool,
    shutting_down: bool,
    shutdown_waiters: Vec<oneshot::Sender<Result<bool, LeaseError>>>,
    /// The [`TransferLeadership`] requests waiting for the release that hands the lease over,
    /// with their targets.
    transfer_waiters: Vec<(String, oneshot::Sender<Result<bool, LeaseError>>)>,
    /// Whom the last release of the lease named ([`Lease::release_to`]), if anyone.
    released_to: Option<String>,
    /// The candidacy is being withdrawn: a shutdown finishes only once it is.
    withdrawing: bool,
    /// The result of a shutdown's release that came before the withdrawal finished.
    finish_after_withdrawal: Option<Result<bool, LeaseError>>,
    /// The watch of the lease's record that [`GetLeader`] reads, made by the first one.
    leader_watch: Option<GroupWatch>,
    /// This node's candidacy, if it publishes one.
    candidacy: Option<candidacy::Candidacy<L>>,
    /// How candidates are ranked (with a candidacy).
    policy: crate::actors::candidacy::HandoverPolicy,
    /// A better candidate is live: this node does not compete.
    deferring: bool,
    /// Who the next plain release hands the lease over to ([`Lease::hand_over`]), if anyone:
    /// set by the sharded workers, whose placement knows the next holder.
    hand_to: Option<handlers::HandoverTarget>,
    /// Whether the release at shutdown gives the lease up for good ([`Lease::retire`]): a
    /// member or candidacy lease, whose name this node's identity will not claim again.
    retire_on_shutdown: bool,
    /// Whether a shutdown leaves the lease held after the singleton stopped (a bound shard lease
    /// of a node that leaves: its member lease's retirement frees every one in one write).
    pub(crate) keep_on_shutdown: bool,
    /// The bound shards the retirement at shutdown hands on (a member lease: see
    /// [`Lease::retire_handing`]).
    pub(crate) retire_handing: Option<Vec<crate::HandedShard>>,
    release_result: Option<Result<bool, LeaseError>>,
    /// Created when the manager starts (it needs the final settings).
    competition: Option<Competition<L>>,
    /// Shared with the other shard managers of a node: bounds their first attempts in flight.
    claim_gate: Option<Arc<tokio::sync::Semaphore>>,
    instances: u64,
    unstopped: u64,
    restarts: VecDeque<Instant>,
    restart_count: u32,
    /// The health checks to register with when the manager starts.
    health_checks: Vec<HealthCheck>,
    /// What those checks read; created when the manager starts (it needs the final settings).
    health: Option<Arc<SingletonHealth>>,
    label: LeaseLabel,
}

impl<A, L> ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    /// A manager for `lease` that builds the singleton with `factory` whenever it starts one, on
    /// the manager's own arbiter.
    pub fn new(lease: L, factory: impl Fn(&SingletonInfo, &mut Context<A>) -> A + 'static) -> Self {
        Self::from_arc(Arc::new(lease), factory)
    }

    /// Like [`new`](Self::new), sharing the lease. Every end of the tenure through another handle
    /// (a release by another component sharing it) stops the singleton too.
    pub fn from_arc(
        lease: Arc<L>,
        factory: impl Fn(&SingletonInfo, &mut Context<A>) -> A + 'static,
    ) -> Self {
        Self::with_factory(lease, Factory::Local(Rc::new(factory)))
    }

    /// A manager that starts the singleton on `arbiter` (for example a dedicated
    /// `actix_rt::Arbiter::new().handle()`), so that a singleton that blocks its thread cannot
    /// delay its manager, the lease's renewals or other actors. The factory runs on `arbiter`,
    /// only if the tenure is still alive when the arbiter gets to it.
    pub fn on_arbiter(
        lease: Arc<L>,
        arbiter: actix_rt::ArbiterHandle,
        factory: impl Fn(&SingletonInfo, &mut Context<A>) -> A + Send + Sync + 'static,
    ) -> Self {
        Self::with_factory(lease, Factory::Arbiter(arbiter, Arc::new(factory)))
    }

    fn with_factory(lease: Arc<L>, factory: Factory<A>) -> Self {
        let label = LeaseLabel::new(lease.name());
        metrics::singleton_registered(&label);
        Self {
            health_checks: Vec::new(),
            health: None,
            label,
            lease,
            factory,
            settings: SingletonSettings::default(),
            phase: Phase::Idle,
            eligible: true,
            shutting_down: false,
            shutdown_waiters: Vec::new(),
            transfer_waiters: Vec::new(),
            released_to: None,
            withdrawing: false,
            finish_after_withdrawal: None,
            leader_watch: None,
            candidacy: None,
            policy: Default::default(),
            deferring: false,
            hand_to: None,
            retire_on_shutdown: false,
            retire_handing: None,
            keep_on_shutdown: false,
            release_result: None,
            competition: None,
            claim_gate: None,
            instances: 0,
            unstopped: 0,
            restarts: VecDeque::new(),
            restart_count: 0,
        }
    }

    /// Gives the lease up for good at shutdown ([`Lease::retire`]) instead of releasing it: for
    /// the member and candidacy leases, which nothing else claims.
    pub(crate) fn retire_on_shutdown(mut self) -> Self {
        self.retire_on_shutdown = true;
        self
    }

    /// Each acquire round's first attempt waits for a permit of `gate` (shared by a node's shard
    /// managers: see `ShardedSettings::max_claims_in_flight`).
    pub(crate) fn claim_gate(mut self, gate: Arc<tokio::sync::Semaphore>) -> Self {
        self.claim_gate = Some(gate);
        self
    }

    /// Replaces the settings, as they are: prefer [`try_settings`](Self::try_settings), which
    /// validates them. Out-of-range values taken here are honoured with saturating arithmetic
    /// (never a panic; see [`SingletonSettings`]), and the manager logs a warning when it starts.
    pub fn settings(mut self, settings: SingletonSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Replaces the settings once they are [validated](SingletonSettings::validate).
    ///
    /// # Errors
    ///
    /// The [`SettingsError`] of [`SingletonSettings::validate`]; the manager is dropped.
    pub fn try_settings(self, settings: SingletonSettings) -> Result<Self, SettingsError> {
        settings.validate()?;
        Ok(self.settings(settings))
    }

    /// Reports to `check`: its liveness fails while a singleton this manager told to stop has not
    /// stopped within the stop timeout (plus the check's tolerance), its readiness follows the
    /// manager's eligibility, and the manager's lease is watched and listed like one added with
    /// [`HealthCheck::add_lease`]. The registration lasts as long as the manager: once it has
    /// shut down and is gone it leaves the check (a replacement registered with the same check
    /// decides alone). See [`HealthCheck`].
    pub fn health(mut self, check: &HealthCheck) -> Self {
        self.health_checks.push(check.clone());
        self
    }

    /// Updates what the health checks read, if any.
    fn with_health(&self, update: impl FnOnce(&mut crate::health::SingletonHealthState)) {
        if let Some(health) = &self.health {
            update(&mut health.state());
        }
    }

    /// Starts not eligible: the node competes only after [`SetEligible(true)`](SetEligible).
    pub fn not_eligible(mut self) -> Self {
        self.eligible = false;
        self
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
        self.eligible && !self.shutting_down && !self.deferring
    }

    fn competition(&mut self) -> &mut Competition<L> {
        self.competition.get_or_insert_with(|| {
            let retry_delay = self
                .settings
                .retry_delay
                .unwrap_or_else(|| self.lease.settings().acquire_retry_delay());
            Competition::new(
                Arc::clone(&self.lease),
                retry_delay,
                self.settings.max_error_backoff,
            )
            .gated(self.claim_gate.clone())
        })
    }

    /// Competes: an acquire round after `delay` (see [`SingletonSettings`]).
    fn compete(&mut self, delay: Duration, ctx: &mut Context<Self>) {
        if self.deferring {
            // A better candidate is live: wait for `reconsider` to say otherwise.
            self.phase = Phase::Idle;
            return;
        }
        self.phase = Phase::Acquiring;
        let me = ctx.address().downgrade().recipient();
        self.competition().start(delay, me);
    }

    fn start_singleton(&mut self, guard: TenureGuard, ctx: &mut Context<Self>) {
        self.instances += 1;
        let instance = self.instances;
        let signal = Arc::new(StopSignal::default());
        let info = SingletonInfo {
            lease_name: self.lease.name().to_owned(),
            owner: self.lease.owner().to_owned(),
            fencing_token: guard.token(),
            guard: guard.clone(),
            restart: self.restart_count,
        };
        let watcher = Watcher {
            ended: Box::pin(guard.ended()),
            guard: guard.clone(),
            signal: Arc::clone(&signal),
            stop_requested: false,
            _gone: GoneGuard {
                manager: ctx.address().downgrade().recipient(),
                instance,
                health: self.health.clone(),
            },
        };
        // The singleton's context is built where it runs; the guard is checked there, right
        // before the factory: an arbiter busy past the end of the tenure must not start it.
        let (tx, rx) = actix::dev::channel::channel(MAILBOX_CAPACITY);
        match &self.factory {
            Factory::Local(factory) => {
                start_guarded(rx, watcher, info, &**factory);
            }
            Factory::Arbiter(arbiter, factory) => {
                let factory = Arc::clone(factory);
                arbiter.spawn_fn(move || start_guarded(rx, watcher, info, &*factory));
            }
        }
        let addr = Addr::new(tx);
        // The manager follows the tenure too: any end of it stops the singleton.
        let end_watch = EndWatch::start(&guard, ctx.address().downgrade().recipient());
        tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), fencing_token = %guard.token(), instance, "singleton started");
        metrics::singleton_started(&self.label);
        self.phase = Phase::Running {
            instance,
            addr,
            stop: StopHandle(signal),
            guard,
            _end_watch: end_watch,
        };
    }

    fn tenure_ended(&mut self, token: FencingToken, end: TenureEnd, ctx: &mut Context<Self>) {
        if !matches!(&self.phase, Phase::Running { guard, .. } if guard.token() == token) {
            return;
        }
        tracing::warn!(lease = %self.lease.name(), owner = %self.lease.owner(), %end, "tenure ended: stopping the singleton");
        let then = if self.competing() {
            AfterStop::Reacquire
        } else if self.shutting_down {
            AfterStop::Shutdown
        } else {
            AfterStop::Release { then_pause: None }
        };
        self.stop_singleton(then, ctx);
    }

    /// Stops the running singleton (if any), or ends the acquire round in flight, and does `then`
    /// once it has stopped (or the round has ended).
    fn stop_singleton(&mut self, then: AfterStop, ctx: &mut Context<Self>) {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Running { instance, stop, .. } => {
                stop.raise(StopSignal::STOP);
                self.with_health(|h| h.stopping_since = Some(Instant::now()));
                self.phase = Phase::Stopping {
                    instance,
                    then,
                    stop,
                };
                ctx.run_later(self.settings.stop_timeout, move |act, ctx| {
                    act.stop_timed_out(instance, ctx)
                });
            }
            Phase::Stopping {
                instance,
                then: old,
                stop,
            } => {
                self.phase = Phase::Stopping {
                    instance,
                    then: old.merge(then),
                    stop,
                };
            }
            Phase::Acquiring => {
                // Never cut an attempt short: end the round, then release what it got.
                let round_over = self.competition().cancel();
                self.phase = Phase::Releasing;
                let then = match then {
                    AfterStop::Reacquire => AfterStop::Release { then_pause: None },
                    other => other,
                };
                ctx.spawn(
                    wrap_future::<_, Self>(round_over)
                        .map(move |(), act, ctx| act.release(then, ctx)),
                );
            }
            other @ (Phase::Releasing | Phase::ShutDown) => {
                // The release in flight looks at `competing()` when it comes back.
                self.phase = other;
            }
            Phase::Idle => self.after_stop(then, ctx),
        }
    }

    fn stop_timed_out(&mut self, timed_out: u64, ctx: &mut Context<Self>) {
        let Phase::Stopping { instance, then, .. } = &self.phase else {
            return;
        };
        if *instance != timed_out {
            return;
        }
        let then = then.clone();
        if let Phase::Stopping { stop, .. } = &self.phase {
            stop.raise(StopSignal::TERMINATE);
        }
        self.unstopped += 1;
        metrics::singleton_stopped(&self.label, "stop_timeout");
        self.with_health(|h| {
            let since = h.stopping_since.take().unwrap_or_else(Instant::now);
            h.unstopped.push((timed_out, since));
        });
        tracing::error!(lease = %self.lease.name(), owner = %self.lease.owner(), instance, stop_timeout = ?self.settings.stop_timeout, "the singleton did not stop within the stop timeout; terminating it and carrying on without it");
        self.after_stop(then, ctx);
    }

    fn after_stop(&mut self, then: AfterStop, ctx: &mut Context<Self>) {
        self.phase = Phase::Idle;
        match then {
            AfterStop::Reacquire if self.competing() => self.compete(Duration::ZERO, ctx),
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
        if self.keep_on_shutdown && matches!(then, AfterStop::Shutdown) {
            // The singleton has stopped; the lease stays held until what it is bound to ends.
            tracing::debug!(lease = %self.lease.name(), owner = %self.lease.owner(), "shutting down: the singleton stopped; the lease is left to end with its member lease");
            self.phase = Phase::Idle;
            self.finish_shutdown(Ok(true), ctx);
            return;
        }
        self.phase = Phase::Releasing;
        let lease = Arc::clone(&self.lease);
        let to = match &then {
            AfterStop::Transfer { to } => Some(to.clone()),
            // A leader on its way out hands over to the target of a transfer it was asked for
            // (the shutdown overtook it) if the transfer can still happen, else to a better
            // candidate, if one is live.
            AfterStop::Shutdown if self.lease.check_alive() => {
                self.overtaken_transfer().or_else(|| self.shutdown_target())
            }
            _ => None,
        };
        if let (AfterStop::Shutdown, Some(to)) = (&then, &to) {
            tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), %to, "shutting down: handing the lease over");
        }
        // A plain release goes to the next holder the sharded placement named, if any.
        let hand_to = match (&then, &to) {
            (AfterStop::Transfer { .. }, _) | (_, Some(_)) => None,
            _ => self.hand_to.as_ref().and_then(|target| {
                let counts = target.counts();
                if !counts {
                    tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), target = %target.owner(), "the handover target left: releasing plainly");
                }
                counts.then(|| target.owner().to_owned())
            }),
        };
        let retire = self.retire_on_shutdown && matches!(then, AfterStop::Shutdown);
        let handing = self.retire_handing.take().filter(|_| retire);
        self.released_to = to.clone().or_else(|| hand_to.clone());
        ctx.spawn(
            wrap_future::<_, Self>(async move {
                match (to, hand_to) {
                    (Some(to), _) => lease.release_to(&to).await,
                    (None, Some(target)) => lease.hand_over(&target).await,
                    (None, None) if retire => match handing {
                        Some(handed) => lease.retire_handing(handed).await,
                        None => lease.retire().await,
                    },
                    (None, None) => lease.release().await,
                }
            })
            .map(
                move |result, act, ctx| {
                    if let Err(error) = &result {
                        tracing::warn!(error = error as &dyn std::error::Error, lease = %act.lease.name(), owner = %act.lease.owner(), "singleton lease release failed; it expires after its TTL");
                    }
                    act.phase = Phase::Idle;
                    if !matches!(then, AfterStop::Shutdown) {
                        act.answer_transfers(&result);
                    }
                    match then {
                        AfterStop::Shutdown => act.finish_shutdown(result, ctx),
                        AfterStop::Transfer { .. } => {
                            if act.shutting_down {
                                act.finish_shutdown(result, ctx);
                            } else if act.competing() {
                                act.compete(Duration::ZERO, ctx);
                            }
                        }
                        AfterStop::Release { then_pause } if act.competing() => {
                            act.compete(then_pause.unwrap_or(Duration::ZERO), ctx);
                        }
                        AfterStop::Release { .. } | AfterStop::Reacquire => {
                            if act.shutting_down {
                                act.finish_shutdown(result, ctx);
                            } else if act.competing() {
                                act.compete(Duration::ZERO, ctx);
                            }
                        }
                    }
                },
            ),
        );
    }

    fn begin_shutdown(&mut self, ctx: &mut Context<Self>) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        self.with_health(|h| h.shutting_down = true);
        tracing::debug!(lease = %self.lease.name(), owner = %self.lease.owner(), "singleton manager shutting down");
        if matches!(self.phase, Phase::Running { .. } | Phase::Stopping { .. }) {
            // The leader stops the singleton and releases (to the best candidate) while it
            // withdraws its candidacy: only it can hand the lease over, so it never receives it
            // on its way out, and its successor does not wait for the withdrawal's round trip.
            // The shutdown finishes once both are done.
            self.withdraw_then(ctx, |_, _| {});
            self.stop_singleton(AfterStop::Shutdown, ctx);
        } else {
            // Any other candidate withdraws first, so that nobody hands it the lease on its way
            // out.
            self.withdraw_then(ctx, |act, ctx| act.stop_singleton(AfterStop::Shutdown, ctx));
        }
    }

    /// The target of the last pending [`TransferLeadership`], if the transfer can still happen
    /// (see [`transfer_refusal`](Self::transfer_refusal)).
    fn overtaken_transfer(&self) -> Option<String> {
        let (to, _) = self.transfer_waiters.last()?;
        match self.transfer_refusal(to) {
            None => Some(to.clone()),
            Some(reason) => {
                tracing::debug!(lease = %self.lease.name(), owner = %self.lease.owner(), %to, reason, "shutting down: the transfer overtaken by the shutdown cannot happen any more");
                None
            }
        }
    }

    /// Answers every pending [`TransferLeadership`] after the release that ended the tenure (a
    /// transfer, or whatever superseded it) answered `result`: see `transfer_answer`.
    fn answer_transfers(&mut self, result: &Result<bool, LeaseError>) {
        for (to, waiter) in self.transfer_waiters.drain(..) {
            let answer = handlers::transfer_answer(result, self.released_to.as_deref(), &to);
            let _ = waiter.send(answer);
        }
    }

    fn finish_shutdown(&mut self, result: Result<bool, LeaseError>, ctx: &mut Context<Self>) {
        if self.withdrawing {
            // The candidacy's withdrawal is still under way: finish when it is done.
            self.phase = Phase::Releasing;
            self.finish_after_withdrawal = Some(result);
            return;
        }
        self.answer_transfers(&result);
        self.phase = Phase::ShutDown;
        for waiter in self.shutdown_waiters.drain(..) {
            let _ = waiter.send(result.clone());
        }
        self.release_result = Some(result);
        if self.settings.handle_signals {
            System::current().stop();
        }
        ctx.stop();
    }
}

impl<A, L> Actor for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Err(error) = self.settings.validate() {
            tracing::warn!(error = &error as &dyn std::error::Error, lease = %self.lease.name(), owner = %self.lease.owner(), "singleton settings out of range; honoured with saturating arithmetic");
        }
        if !self.health_checks.is_empty() {
            let health = Arc::new(SingletonHealth::new(
                &self.lease,
                self.settings.stop_timeout,
                self.eligible,
            ));
            // With a candidacy, readiness waits until it is published once.
            health.state().candidacy_pending = self.candidacy.is_some();
            for check in &self.health_checks {
                check.add_singleton(&health);
            }
            self.health = Some(health);
        }
        if self.settings.handle_signals {
            ctx.spawn(
                wrap_future::<_, Self>(shutdown_signal()).map(|(), act, ctx| {
                    tracing::debug!("termination signal received");
                    act.begin_shutdown(ctx);
                }),
            );
        }
        self.start_candidacy(ctx);
        if self.competing() {
            self.compete(Duration::ZERO, ctx);
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
            // What `begin_shutdown` spawned runs from the next poll of this context: make sure
            // there is one (with every address gone, nothing else may wake it).
            ctx.address().do_send(Wake);
            Running::Continue
        }
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

impl<A, L> Handler<RoundDone> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, done: RoundDone, ctx: &mut Self::Context) {
        // A round cancelled since is stale: whoever cancelled it releases after it ended.
        if !matches!(self.phase, Phase::Acquiring) || !self.competition().take_current(&done) {
            return;
        }
        self.phase = Phase::Idle;
        match self.competition().next(done.result) {
            Next::Acquired(_) if self.shutting_down => {
                // Withdrawing on the way out: the shutdown that follows releases it unstarted.
            }
            Next::Acquired(guard) => {
                self.restarts.clear();
                self.restart_count = 0;
                self.start_singleton(guard, ctx);
            }
            Next::Compete(delay) => self.compete(delay, ctx),
        }
    }
}

impl<A, L> Handler<TenureEnded> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, TenureEnded { token, end }: TenureEnded, ctx: &mut Self::Context) {
        self.tenure_ended(token, end, ctx);
    }
}

impl<A, L> Handler<SingletonStopped> for ClusterSingletonManager<A, L>
where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    type Result = ();

    fn handle(&mut self, SingletonStopped(stopped): SingletonStopped, ctx: &mut Self::Context) {
        // An instance terminated after its stop timeout is gone now.
        self.with_health(|h| h.unstopped.retain(|(instance, _)| *instance != stopped));
        match &self.phase {
            Phase::Stopping { instance, then, .. } if *instance == stopped => {
                tracing::info!(lease = %self.lease.name(), owner = %self.lease.owner(), instance, "singleton stopped");
                metrics::singleton_stopped(&self.label, "stopped");
                self.with_health(|h| h.stopping_since = None);
                let then = then.clone();
                self.after_stop(then, ctx);
            }
            Phase::Running {
                instance, guard, ..
            } if *instance == stopped => {
                // Stopped or panicked on its own while the tenure is alive.
                metrics::singleton_stopped(&self.label, "stopped");
                let guard = guard.clone();
                let now = Instant::now();
                let window = self.settings.restart_window;
                while self
                    .restarts
                    .front()
                    .is_some_and(|t| now.duration_since(*t) > window)
                {
                    self.restarts.pop_front();
                }
                if guard.check_alive() && self.restarts.len() < self.settings.max_restarts as usize
                {
                    self.restarts.push_back(now);
                    self.restart_count += 1;
                    metrics::singleton_restarted(&self.label);
                    tracing::warn!(lease = %self.lease.name(), owner = %self.lease.owner(), restart = self.restart_count, "singleton stopped on its own: restarting it");
                    self.phase = Phase::Idle;
                    self.start_singleton(guard, ctx);
                } else if !guard.check_alive() {
                    // Its tenure ended at the same time: the manager's own watch handles it.
                    self.phase = Phase::Idle;
                    self.after_stop(
                        if self.competing() {
                            AfterStop::Reacquire
                        } else {
                            AfterStop::Release { then_pause: None }
                        },
                        ctx,
                    );
                } else {
                    tracing::error!(lease = %self.lease.name(), owner = %self.lease.owner(), "singleton keeps stopping: releasing the lease for another node");
                    // Nodes that rank below this one defer to it while its candidacy is live:
                    // withdraw it for the pause, so that one of them runs the singleton.
                    self.pause_candidacy(self.settings.give_up_pause, ctx);
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

/// What the manager asks of a running singleton: nothing, stop, or terminate.
#[derive(Default)]
pub(super) struct StopSignal {
    level: AtomicU8,
    waker: AtomicWaker,
}

impl StopSignal {
    pub(super) const STOP: u8 = 1;
    pub(super) const TERMINATE: u8 = 2;

    pub(super) fn level(&self, cx: &std::task::Context<'_>) -> u8 {
        self.waker.register(cx.waker());
        self.level.load(Ordering::Acquire)
    }
}

/// The manager's side of a [`StopSignal`]: dropping it (the manager is gone) stops the singleton.
pub(super) struct StopHandle(pub(super) Arc<StopSignal>);

impl StopHandle {
    pub(super) fn raise(&self, level: u8) {
        self.0.level.fetch_max(level, Ordering::AcqRel);
        self.0.waker.wake();
    }
}

impl Drop for StopHandle {
    fn drop(&mut self) {
        self.raise(StopSignal::STOP);
    }
}

/// The first item of a singleton's context: stops it when its tenure ends (checked by the clock
/// each time the context is polled, and woken at the deadline or the end) or when the manager
/// says so; terminates it when the manager gives up waiting. Tells the manager when the context
/// is gone (the singleton stopped or panicked).
struct Watcher {
    guard: TenureGuard,
    ended: Pin<Box<dyn Future<Output = TenureEnd> + Send>>,
    signal: Arc<StopSignal>,
    stop_requested: bool,
    _gone: GoneGuard,
}

impl<A: Actor<Context = Context<A>>> ActorFuture<A> for Watcher {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        _: &mut A,
        ctx: &mut Context<A>,
        task: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let this = self.get_mut();
        let level = this.signal.level(task);
        if level >= StopSignal::TERMINATE {
            ctx.terminate();
            return std::task::Poll::Pending;
        }
        if !this.stop_requested {
            let ended = !this.guard.check_alive() || this.ended.as_mut().poll(task).is_ready();
            if ended || level >= StopSignal::STOP {
                this.stop_requested = true;
                ctx.stop();
            }
        }
        std::task::Poll::Pending
    }
}

/// Lives in the singleton's context: when the context is dropped (the singleton stopped or
/// panicked), tells the manager, if it still exists. Holds the manager weakly, so that the
/// singleton does not keep its manager alive.
struct GoneGuard {
    manager: WeakRecipient<SingletonStopped>,
    instance: u64,
    /// What the health checks read: kept registered while the singleton lives (health checks
    /// hold it weakly), so that one the manager gave up on still fails liveness after the
    /// manager is gone, and cleared of this instance when it is gone.
    health: Option<Arc<SingletonHealth>>,
}

impl Drop for GoneGuard {
    fn drop(&mut self) {
        if let Some(health) = &self.health {
            health
                .state()
                .unstopped
                .retain(|(instance, _)| *instance != self.instance);
        }
        if let Some(manager) = self.manager.upgrade() {
            manager.do_send(SingletonStopped(self.instance));
        }
    }
}
