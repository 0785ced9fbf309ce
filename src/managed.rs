//! [`ManagedLease`]: the one implementation of the lease contract on top of any
//! [`LeaseBackend`].

use std::error::Error as StdError;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, OwnedMutexGuard};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::{sleep_until, timeout, timeout_at, Instant};
use tracing::Instrument;

use crate::backend::{AcquireAttempt, BackendError, LeaseBackend, ReleaseOutcome};
use crate::binding::{Anchor, BindingAnchor};
use crate::finish::{BoxCall, FinishOnDrop};
use crate::lease::{
    FencingToken, Lease, LeaseError, LeaseLost, LostHandlers, LostReason, LostSubscription,
    Operation,
};
use crate::metrics::{self, LeaseLabel};
use crate::protocol;
use crate::settings::LeaseSettings;
use crate::tenure::{Tenure, TenureCell, TenureEnd, TenureWatch};

mod registry;
mod renewal;

use registry::InstanceKey;
use renewal::{
    bound_loop, renewal_loop, spawn_release_abandoned, spawn_release_retry, BoundLink, EndWithTask,
};

/// First delay before retrying a renewal that failed with an error; doubles up to a quarter of
/// the renewal interval. A renewal that timed out is retried at once.
const RENEW_BACKOFF_START: Duration = Duration::from_millis(50);
/// First delay before re-establishing a broken loss watch; doubles up to the renewal interval.
const WATCH_BACKOFF_START: Duration = Duration::from_millis(100);

/// A [`Lease`] backed by any [`LeaseBackend`]: the one implementation of the lease contract.
///
/// It owns what every backend shares: the acquire retry loop, the operation timeout on every call,
/// the renewal task with its backoff, the local monotonic deadline behind `check_alive`, the
/// published [`TenureWatch`], reentrancy, serialisation of `acquire` and `release`, and
/// exactly-once `on_lost`.
///
/// # One tenure, one renewal task
///
/// A successful `acquire` starts a *tenure*: it publishes the fencing token and the deadline
/// `start of the claim + ttl - clock_drift_margin`, and spawns one renewal task. The task renews
/// `renewal_interval` after the instant the deadline counts from; each success moves the deadline to
/// `start of that renewal + ttl - margin`. A backend may name an earlier instant the claim or
/// renewal is valid from (`valid_from`: etcd's shared keep-alive, sent before the renewal started);
/// the deadline then counts from it, and so does the next renewal, which thereby follows the
/// backend's clock (all etcd leases of a session renew on its one keep-alive per interval).
/// A renewal that times out is retried at once; one that fails with an error after a backoff (50 ms
/// doubling, at most a quarter of the renewal interval); both until the deadline (the settings
/// guarantee that one retry of a full operation timeout fits before it). The tenure ends in exactly
/// one of these ways, each published to every reader of [`Lease::tenure`] at once:
///
/// * `release`, through any handle: the tenure ends, renewal stops, then the backend is told; no
///   `on_lost`;
/// * the deadline passes (partition, pause, backend down): readers see it by the clock at the
///   deadline; the renewal task (or the next `acquire`, a `release` or the drop of the lease,
///   whichever runs first) fires `on_lost` with [`LostReason::Expired`];
/// * the backend reports the loss (a renewal's compare-and-swap fails, or its watch sees another
///   holder or a deletion): `on_lost` with that reason;
/// * the lease is dropped while the tenure is alive: [`TenureEnd::Dropped`], no `on_lost`.
///
/// The renewal task wakes for the deadline the way [`TenureGuard::ended`](crate::TenureGuard::ended)
/// does: a little early on the timer, then yielding until the deadline has passed, so that
/// `on_lost` is not up to a timer tick late (tokio's timer rounds deadlines up to the next
/// millisecond). A contender can hold the lease `clock_drift_margin` after the deadline at the
/// earliest; the contract suite checks on every backend, at the default margin, that `on_lost`
/// comes first (`partitioned_holder_is_told_before_the_contender_wins`).
///
/// # A release that fails
///
/// A `release` whose backend call fails (outcome unknown) leaves the record possibly held until
/// its TTL: every `release` after it answers the same error until then (see [`Lease::release`]),
/// so that `Ok(true)` always means "not held by us in the store". Meanwhile a task asks the
/// backend to remove the claim ([`LeaseBackend::release_unanswered`]), from 100 ms after the
/// failure, doubling up to the renewal interval, until it did (the next `release` then answers
/// `Ok(true)`), a new tenure started, or the claim has surely expired; for a bound lease, whose
/// record never expires while its member lives, for as long as the member lives.
///
/// # Counters
///
/// [`ManagedLease::stats`] counts attempts, renewals, renewal failures and watch (re)starts, so
/// that monitoring and tests can follow what the lease does without timing it.
///
/// # Never cut a call short and report success
///
/// Backend calls of `acquire` and `release` are polled by the caller's future, but never cut
/// short: if that future is dropped (a timeout around it, an aborted actor round) while a call is
/// in flight, the call is moved to a task of its own and finished there. An attempt whose caller
/// is gone is finished, and a claim it made is released at once; the next `acquire` or `release`
/// of this instance waits for that. A claim whose answer arrives after its own validity is released
/// too, and `acquire` reports a timeout.
///
/// # One instance per (store, name, owner)
///
/// A store cannot tell two instances with the same owner apart (a reused claim looks like the
/// same holder), so an `acquire` is refused with [`LeaseError::DuplicateInstance`] while another
/// live instance in this process with the same store (as the backend reports it,
/// [`LeaseBackend::store_id`]), name and owner holds the lease or has an `acquire` or `release` in
/// flight. Share one instance instead.
///
/// Backends expose it under their own name ([`InMemoryLease`](crate::InMemoryLease) is
/// `ManagedLease<InMemoryBackend>`). Share it behind an `Arc`; dropping the last handle stops
/// renewal *without* releasing (like a crash: the lease expires after its TTL), so call
/// [`Lease::release`] on a graceful shutdown.
pub struct ManagedLease<B: LeaseBackend> {
    shared: Arc<Shared<B>>,
    instance: Option<InstanceKey>,
}

struct Shared<B: LeaseBackend> {
    backend: B,
    settings: LeaseSettings,
    handlers: LostHandlers,
    tenure: TenureCell,
    /// The renewal task of the current tenure, aborted when the lease is dropped.
    abort: Mutex<Option<AbortHandle>>,
    /// Serialises `acquire` and `release`; a task that finishes an abandoned call holds it.
    ops: Arc<tokio::sync::Mutex<Ops<B::Tenure>>>,
    counters: Counters,
    /// The `lease` label of this lease's metrics.
    label: LeaseLabel,
    /// The holder as last seen: this owner while it holds the lease, else the holder the last
    /// answer named (see [`Lease::observed_holder`]).
    holder: Mutex<Option<String>>,
    /// The member lease this lease's tenures are bound to ([`Lease::bind_to`]).
    bound: std::sync::OnceLock<BindingAnchor>,
    /// Wakes the renewal task for a renewal now ([`Lease::mark_leaving`]).
    renew_now: tokio::sync::Notify,
}

/// What only `acquire` and `release` touch, under the `ops` lock.
struct Ops<T> {
    renewal: Option<Renewal<T>>,
    /// A claim of ours whose release failed (outcome unknown): until it has surely expired, a
    /// `release` that finds nothing held reports that error instead of `Ok(true)`.
    unreleased: Option<Unreleased>,
}

/// A release whose outcome is unknown: the record may still be held by this owner until `until`.
struct Unreleased {
    error: LeaseError,
    until: Instant,
}

impl Unreleased {
    /// The failure of releasing a claim just now: the record expires by its TTL at the latest,
    /// measured from now (no write of ours can land later), plus the clock drift margin for a
    /// store whose clock runs faster than ours.
    fn now(error: LeaseError, settings: &LeaseSettings) -> Self {
        Self {
            error,
            until: Instant::now() + settings.ttl() + settings.clock_drift_margin(),
        }
    }

    /// The error while the record may still be held, `None` once it has surely expired.
    fn pending(&self) -> Option<LeaseError> {
        (Instant::now() < self.until).then(|| self.error.clone())
    }
}

/// Counters of what a [`ManagedLease`] asked of its backend, for monitoring and for tests that
/// wait on events instead of time (see [`ManagedLease::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// [`LeaseBackend::try_acquire`] calls started (each attempt of `acquire` and
    /// `acquire_within`).
    pub acquire_attempts: u64,
    /// Renewals that succeeded (each moved the deadline).
    pub renewals: u64,
    /// Renewals that failed with an error (retried after a backoff).
    pub renewal_errors: u64,
    /// Renewals that timed out (retried at once).
    pub renewal_timeouts: u64,
    /// [`LeaseBackend::watch_lost`] calls started: one per tenure, and one per re-establishment
    /// of a broken watch.
    pub watch_starts: u64,
    /// [`LeaseBackend::watch_lost`] calls that ended with an error (a broken watch).
    pub watch_breaks: u64,
}

#[derive(Default)]
struct Counters {
    acquire_attempts: AtomicU64,
    renewals: AtomicU64,
    renewal_errors: AtomicU64,
    renewal_timeouts: AtomicU64,
    watch_starts: AtomicU64,
    watch_breaks: AtomicU64,
}

/// Counts an event after it took effect: a reader that sees the count (`Acquire`) also sees the
/// effect (a renewal's new deadline, for example).
fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Release);
}

struct Renewal<T> {
    generation: u64,
    stop: oneshot::Sender<()>,
    join: JoinHandle<Option<T>>,
}

type OpsGuard<T> = OwnedMutexGuard<Ops<T>>;

impl<B: LeaseBackend> fmt::Debug for ManagedLease<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedLease")
            .field("name", &self.shared.settings.name())
            .field("owner", &self.shared.settings.owner())
            .field("alive", &self.check_alive())
            .field("fencing_token", &self.fencing_token())
            .finish()
    }
}

impl<B: LeaseBackend> ManagedLease<B> {
    /// A lease with `settings` on `backend`. Nothing is sent to the backend until `acquire`.
    pub fn from_backend(settings: LeaseSettings, backend: B) -> Self {
        let instance = backend.store_id().map(|store| {
            (
                store,
                settings.name().to_owned(),
                settings.owner().to_owned(),
            )
        });
        let label = LeaseLabel::new(settings.name());
        metrics::lease_registered(&label);
        let anchor = backend.binds().then(|| {
            Arc::new(Anchor::new(
                settings.name().to_owned(),
                backend.store_id(),
                settings.operation_timeout(),
            ))
        });
        let shared = Arc::new(Shared {
            backend,
            handlers: LostHandlers::new(),
            tenure: TenureCell::new(label.clone()),
            abort: Mutex::new(None),
            ops: Arc::new(tokio::sync::Mutex::new(Ops {
                renewal: None,
                unreleased: None,
            })),
            counters: Counters::default(),
            label,
            holder: Mutex::new(None),
            bound: std::sync::OnceLock::new(),
            renew_now: tokio::sync::Notify::new(),
            settings,
        });
        if let Some(anchor) = anchor {
            shared.tenure.set_anchor(anchor);
        }
        let instance = instance.map(|key| InstanceKey::register(key, &shared));
        Self { shared, instance }
    }

    /// The backend of this lease.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }

    /// What this lease asked of its backend so far: attempts, renewals and their failures, watch
    /// (re)starts. The counters only grow; compare two snapshots. Tests use them to wait for an
    /// event (a renewal, a broken watch) instead of for a span of time.
    pub fn stats(&self) -> LeaseStats {
        let c = &self.shared.counters;
        let read = |counter: &AtomicU64| counter.load(Ordering::Acquire);
        LeaseStats {
            acquire_attempts: read(&c.acquire_attempts),
            renewals: read(&c.renewals),
            renewal_errors: read(&c.renewal_errors),
            renewal_timeouts: read(&c.renewal_timeouts),
            watch_starts: read(&c.watch_starts),
            watch_breaks: read(&c.watch_breaks),
        }
    }

    /// The span of one operation: the lease, the owner, and (recorded when known) the fencing
    /// token of a claim and the outcome.
    fn span(&self, operation: &'static str) -> tracing::Span {
        let settings = &self.shared.settings;
        let span = tracing::info_span!(
            "lease_operation",
            operation,
            lease = %settings.name(),
            owner = %settings.owner(),
            fencing_token = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if let Some(token) = self.fencing_token() {
            span.record("fencing_token", token.value());
        }
        span
    }

    /// `acquire`: up to `acquire_retries` more attempts while another owner holds the lease or
    /// the backend answers a transient error; a timeout or a permanent error ends it at once.
    async fn acquire_inner(&self) -> Result<bool, LeaseError> {
        current_runtime(Operation::Acquire)?;
        let settings = &self.shared.settings;
        let attempts = settings.acquire_retries().saturating_add(1);
        let mut last = Ok(false);
        for attempt in 1..=attempts {
            last = self.attempt(None).await;
            match &last {
                Ok(true) => return last,
                Ok(false) => {
                    tracing::debug!(lease = %settings.name(), owner = %settings.owner(), attempt, "lease held by another owner");
                }
                // A timeout already took a whole operation timeout and its outcome is unknown:
                // the caller decides. A refusal will not change.
                Err(LeaseError::Timeout { .. }) => return last,
                Err(error) if !error.is_transient() => return last,
                Err(error) => {
                    tracing::debug!(lease = %settings.name(), owner = %settings.owner(), attempt, error = error as &dyn StdError, "acquire attempt failed");
                }
            }
            if attempt < attempts {
                let not_after = Instant::now() + settings.acquire_retry_delay();
                match last {
                    // Held by another owner: wake early when the backend sees a change.
                    Ok(false) => {
                        self.shared
                            .backend
                            .wait_for_change(settings, not_after)
                            .await
                    }
                    // An error: back off for the whole delay (the store may look free while
                    // this owner cannot reach it).
                    _ => sleep_until(not_after).await,
                }
            }
        }
        last
    }

    async fn acquire_within_inner(&self, timeout: Duration) -> Result<bool, LeaseError> {
        // Before anything that needs the runtime's timer (the wait for the lock is bounded).
        current_runtime(Operation::Acquire)?;
        let settings = &self.shared.settings;
        let deadline = crate::lease::deadline_after(timeout);
        let mut failing = false;
        loop {
            let result = self.attempt(Some(deadline)).await;
            match &result {
                Ok(true) => return result,
                Err(error) if !error.is_transient() => return result,
                _ if Instant::now() >= deadline => return result,
                Err(error) => {
                    // Once per streak of errors: the waiter keeps retrying every retry delay.
                    if !failing {
                        tracing::warn!(lease = %settings.name(), owner = %settings.owner(), error = error as &dyn StdError, retry_in = ?settings.acquire_retry_delay(), "acquire attempt failed while waiting for the lease; retrying");
                    }
                    failing = true;
                }
                Ok(false) => failing = false,
            }
            // Held by another owner: wake on the backend's change notification, at the latest at
            // the deadline (or after the retry delay if the backend has no notification). An
            // error: back off for the retry delay (the store may look free while this owner
            // cannot reach it, and waiting for a change would then spin).
            match result {
                Ok(false) => {
                    let not_after = if self.shared.backend.notifies_changes() {
                        deadline
                    } else {
                        deadline.min(Instant::now() + settings.acquire_retry_delay())
                    };
                    self.shared
                        .backend
                        .wait_for_change(settings, not_after)
                        .await;
                }
                _ => {
                    sleep_until(deadline.min(Instant::now() + settings.acquire_retry_delay())).await
                }
            }
        }
    }

    /// One attempt under the `ops` lock: `Ok(true)` held (now or already), `Ok(false)` held by
    /// another owner. Waits for the lock until `lock_by` at the latest.
    async fn attempt(&self, lock_by: Option<Instant>) -> Result<bool, LeaseError> {
        let shared = &self.shared;
        let settings = &shared.settings;
        let lock = Arc::clone(&shared.ops).lock_owned();
        let mut ops = match lock_by {
            Some(deadline) => timeout_at(deadline, lock)
                .await
                .map_err(|_| LeaseError::Busy {
                    operation: Operation::Acquire,
                })?,
            None => lock.await,
        };
        if let Some(renewal) = &ops.renewal {
            if shared
                .tenure
                .published(renewal.generation)
                .is_some_and(|t| t.is_alive())
            {
                return Ok(true);
            }
        }
        if let Some(renewal) = ops.renewal.take() {
            // The previous tenure ended (lost, or its deadline passed a moment ago and the task
            // has not noticed yet): report the loss first, so that it is reported exactly once
            // and before a new tenure starts, even if this future is dropped below.
            shared.lose(renewal.generation, LostReason::Expired { last_error: None });
            stop_renewal(renewal).await;
        }
        if let Some(instance) = &self.instance {
            if instance.other_busy() {
                return Err(LeaseError::DuplicateInstance {
                    name: settings.name().to_owned(),
                    owner: settings.owner().to_owned(),
                });
            }
        }
        let runtime = current_runtime(Operation::Acquire)?;
        // A bound lease claims under the member tenure alive now, or not at all.
        let member = match shared.bound.get() {
            Some(anchor) => Some(anchor.claim_under(settings.operation_timeout())?),
            None => None,
        };
        let start = Instant::now();
        bump(&shared.counters.acquire_attempts);
        let call: BoxCall<AttemptOutcome<B>> = Box::pin({
            let shared = Arc::clone(shared);
            let binding = member.as_ref().map(|(binding, ..)| binding.clone());
            async move {
                let settings = &shared.settings;
                match &binding {
                    Some(binding) => {
                        timeout(
                            settings.operation_timeout(),
                            shared.backend.try_acquire_bound(settings, binding),
                        )
                        .await
                    }
                    None => {
                        timeout(
                            settings.operation_timeout(),
                            shared.backend.try_acquire(settings),
                        )
                        .await
                    }
                }
            }
        });
        // Polled right here; if this future is dropped while the call is in flight, the guard
        // moves the call to a task of its own and finishes it there.
        let mut in_flight = InFlight {
            call: Some(call),
            ops: Some(ops),
            shared: Arc::clone(shared),
            runtime: runtime.clone(),
        };
        let outcome = in_flight.call.as_mut().expect("set").await;
        let (_, mut ops) = in_flight.disarm();
        let attempt = flatten(outcome, Operation::Acquire, settings).inspect_err(|error| {
            let outcome = if matches!(error, LeaseError::Timeout { .. }) {
                "timeout"
            } else {
                "error"
            };
            metrics::acquire_attempt(&shared.label, outcome);
        })?;
        // The store answered: what it holds now supersedes a claim whose release failed (it is
        // ours again, reused as this tenure, or someone else's).
        ops.unreleased = None;
        match attempt {
            AcquireAttempt::Acquired {
                tenure,
                token,
                valid_from,
            } => {
                // A bound tenure lives by its member tenure's deadline (moved by every member
                // renewal), as it is now that the claim is answered, not as it was when the
                // claim was sent; any other from the start of the claim.
                let deadline = match (&member, shared.bound.get()) {
                    (Some((claimed_under, generation, _)), Some(anchor)) => {
                        // One read of the member tenure that lives now: the claim is kept under
                        // it, and the same tenure (generation) gives the deadline.
                        let live = anchor.current();
                        let kept = protocol::keep_bound_claim(
                            claimed_under,
                            live.as_ref().map(|(binding, ..)| binding),
                        );
                        let Some(member_deadline) = live
                            .filter(|(_, live_generation, _)| kept && live_generation == generation)
                            .map(|(.., deadline)| deadline)
                        else {
                            // Its member tenure ended while the claim was in flight: the record
                            // names an incarnation that is over, free for the next claimant, and
                            // is not written again (see `protocol`).
                            tracing::warn!(lease = %settings.name(), owner = %settings.owner(), fencing_token = %token, "a bound claim was answered after its member tenure ended; it is free by the binding rule, and not written");
                            metrics::acquire_attempt(&shared.label, "error");
                            let member = anchor.member().to_owned();
                            return Err(LeaseError::Unbound { member });
                        };
                        member_deadline
                    }
                    _ => valid_from.map_or(start, |v| v.min(start)) + settings.local_validity(),
                };
                if Instant::now() >= deadline {
                    // The claim took longer than its own validity: it cannot be trusted; give
                    // it back so that it does not block others until its TTL.
                    tracing::warn!(lease = %settings.name(), owner = %settings.owner(), fencing_token = %token, "acquire answered after the claim's local deadline; releasing the claim");
                    metrics::acquire_attempt(&shared.label, "timeout");
                    spawn_release_abandoned(&runtime, Arc::clone(shared), ops, tenure);
                    return Err(LeaseError::Timeout {
                        operation: Operation::Acquire,
                        timeout: settings.operation_timeout(),
                    });
                }
                let incarnation = shared
                    .tenure
                    .anchor()
                    .and_then(|_| shared.backend.incarnation(&tenure));
                let renewal =
                    self.start_tenure(&runtime, tenure, token, start, deadline, member.is_some());
                if let (Some(anchor), Some(incarnation)) = (shared.tenure.anchor(), incarnation) {
                    anchor.set_incarnation(renewal.generation, incarnation);
                }
                if let (Some(anchor), Some((_, member_generation, _))) =
                    (shared.bound.get(), &member)
                {
                    let link = Box::new(BoundLink {
                        shared: Arc::downgrade(shared),
                        generation: renewal.generation,
                    });
                    match anchor.attach(*member_generation, link) {
                        Some(member_deadline) => {
                            shared.tenure.extend(renewal.generation, member_deadline);
                        }
                        None => {
                            // The member tenure ended between the answer and the attach: the
                            // claim (bound to an incarnation that no longer lives) is free for
                            // others already, and nobody saw this tenure; its release writes
                            // nothing (the backend judges it, see `protocol`).
                            let member = anchor.member().to_owned();
                            shared.tenure.end(
                                renewal.generation,
                                TenureEnd::Lost(LostReason::Unbound {
                                    member: member.clone(),
                                }),
                            );
                            metrics::acquire_attempt(&shared.label, "error");
                            if let Some(tenure) = stop_renewal(renewal).await {
                                spawn_release_abandoned(&runtime, Arc::clone(shared), ops, tenure);
                            }
                            return Err(LeaseError::Unbound { member });
                        }
                    }
                }
                ops.renewal = Some(renewal);
                *self::lock(&shared.holder) = Some(settings.owner().to_owned());
                metrics::acquire_attempt(&shared.label, "acquired");
                let span = tracing::Span::current();
                span.record("outcome", "acquired");
                span.record("fencing_token", token.value());
                tracing::info!(lease = %settings.name(), owner = %settings.owner(), fencing_token = %token, "lease acquired");
                Ok(true)
            }
            AcquireAttempt::HeldByOther { holder, .. } => {
                tracing::trace!(lease = %settings.name(), owner = %settings.owner(), holder = ?holder, "attempt: held by another owner");
                metrics::acquire_attempt(&shared.label, "held_by_other");
                *self::lock(&shared.holder) = holder;
                Ok(false)
            }
        }
    }

    fn start_tenure(
        &self,
        runtime: &tokio::runtime::Handle,
        tenure: B::Tenure,
        token: FencingToken,
        start: Instant,
        deadline: Instant,
        bound: bool,
    ) -> Renewal<B::Tenure> {
        let shared = &self.shared;
        let (generation, task) = shared.tenure.start(token, deadline);
        let (stop, stopped) = oneshot::channel();
        // A root span that follows from the acquire: the acquire's span ends with the acquire,
        // not with the tenure.
        let span = tracing::info_span!(parent: None, "lease_renewal", lease = %shared.settings.name(), owner = %shared.settings.owner(), fencing_token = %token);
        span.follows_from(tracing::Span::current());
        let end = EndWithTask {
            shared: Arc::clone(shared),
            generation,
            _task: task,
        };
        let join = if bound {
            runtime.spawn(
                bound_loop(Arc::clone(shared), tenure, generation, token, stopped, end)
                    .instrument(span),
            )
        } else {
            runtime.spawn(
                renewal_loop(
                    Arc::clone(shared),
                    tenure,
                    generation,
                    token,
                    start,
                    stopped,
                    end,
                )
                .instrument(span),
            )
        };
        *lock(&shared.abort) = Some(join.abort_handle());
        Renewal {
            generation,
            stop,
            join,
        }
    }

    /// `release`, `release_to` or `hand_over`, as `giving` says (its target checked by the
    /// caller).
    async fn release_inner(&self, giving: Giving) -> Result<bool, LeaseError> {
        // Before anything changes: outside a runtime the tenure (if any) stays as it is.
        let runtime = current_runtime(Operation::Release)?;
        let shared = &self.shared;
        let mut ops = Arc::clone(&shared.ops).lock_owned().await;
        let Some(renewal) = ops.renewal.take() else {
            if matches!(giving, Giving::Prefer(_)) {
                // Nothing held: nothing to hand over, and nothing of a plain release's clean-up
                // is asked for.
                return Ok(false);
            }
            // Nothing held; unless a release of ours failed and the record may still be held:
            // then the same error, until the record has surely expired.
            if let Some(error) = ops.unreleased.as_ref().and_then(Unreleased::pending) {
                return Err(error);
            }
            // A failed release's claim that has surely expired by now is nobody's (a bound one
            // does not expire: the backend is asked to remove it below).
            if ops.unreleased.take().is_some() && shared.bound.get().is_none() {
                return Ok(true);
            }
            // A claim whose answer never arrived may still block others: the backend removes it.
            let settings = &shared.settings;
            let outcome = timeout(
                settings.operation_timeout(),
                shared.backend.release_unanswered(settings),
            )
            .await;
            return flatten(outcome, Operation::Release, settings).map(|()| true);
        };
        // End the tenure for every reader first: a tenure already past its deadline is lost
        // (and reported once), a live one released.
        let live = shared
            .end_by_choice(renewal.generation, TenureEnd::Released)
            .is_some();
        // A bound tenure past its deadline: its member tenure has ended, and may have listed the
        // record to a target that has not claimed it yet (the record still looks ours): nothing
        // of it is written (the backend judges every write too: `protocol::may_write_own`).
        let write = live || shared.bound.get().is_none();
        // Stopping the renewal and telling the backend are polled right here, but never cut
        // short: if this future is dropped first, they are finished on a task of their own.
        let call = FinishOnDrop::new(&runtime, {
            let shared = Arc::clone(shared);
            let span = tracing::Span::current();
            async move {
                let mut ops = ops;
                let Some(tenure) = stop_renewal(renewal).await.filter(|_| write) else {
                    // The tenure was lost before the release; there is nothing of ours to
                    // release (nor to hand over).
                    return Ok(!matches!(giving, Giving::Prefer(_)));
                };
                let released = shared.release_tenure(tenure, &giving).await;
                if let Err(error) = &released {
                    tracing::warn!(lease = %shared.settings.name(), owner = %shared.settings.owner(), error = error as &dyn StdError, "release failed; the claim is released once the store answers again (or ends by itself)");
                    ops.unreleased = Some(Unreleased::now(error.clone(), &shared.settings));
                    if let Ok(runtime) = current_runtime(Operation::Release) {
                        spawn_release_retry(&runtime, Arc::clone(&shared));
                    }
                }
                released
            }
            .instrument(span)
        });
        call.await
    }
}

/// How a release gives the lease up.
#[derive(Debug, Clone)]
enum Giving {
    /// A plain release.
    Release,
    /// A release recording this preferred next holder (`release_to`).
    Prefer(String),
    /// A release that makes this owner the holder where the backend can (`hand_over`).
    HandOver(String),
    /// A release that removes the record where the backend can (`retire`).
    Retire,
    /// `retire`, handing these bound shards on in the same write (`retire_handing`).
    RetireHanding(Vec<crate::HandedShard>),
}

/// An `acquire` call in flight: if the caller's future is dropped before the answer, the call is
/// finished on its own task, and a claim it made is released (holding the `ops` lock meanwhile).
struct InFlight<B: LeaseBackend> {
    call: Option<BoxCall<AttemptOutcome<B>>>,
    ops: Option<OpsGuard<B::Tenure>>,
    shared: Arc<Shared<B>>,
    runtime: tokio::runtime::Handle,
}

type AttemptOutcome<B> = Result<
    Result<AcquireAttempt<<B as LeaseBackend>::Tenure>, <B as LeaseBackend>::Error>,
    tokio::time::error::Elapsed,
>;

impl<B: LeaseBackend> InFlight<B> {
    fn disarm(&mut self) -> (Option<BoxCall<AttemptOutcome<B>>>, OpsGuard<B::Tenure>) {
        (self.call.take(), self.ops.take().expect("set"))
    }
}

impl<B: LeaseBackend> Drop for InFlight<B> {
    fn drop(&mut self) {
        let (Some(call), Some(ops)) = (self.call.take(), self.ops.take()) else {
            return;
        };
        let shared = Arc::clone(&self.shared);
        let runtime = self.runtime.clone();
        self.runtime.spawn(async move {
            let settings = &shared.settings;
            match call.await {
                Ok(Ok(AcquireAttempt::Acquired { tenure, token, .. })) => {
                    tracing::debug!(lease = %settings.name(), owner = %settings.owner(), fencing_token = %token, "an abandoned acquire got the lease; releasing it");
                    spawn_release_abandoned(&runtime, Arc::clone(&shared), ops, tenure);
                }
                _ => drop(ops),
            }
        });
    }
}

/// The runtime this operation runs on, or [`LeaseError::NoRuntime`] outside one (every
/// operation needs its timer, and a tenure needs it for its renewal task).
fn current_runtime(operation: Operation) -> Result<tokio::runtime::Handle, LeaseError> {
    tokio::runtime::Handle::try_current().map_err(|_| LeaseError::NoRuntime { operation })
}

/// The outcome of a backend call bounded by the operation timeout, as a `LeaseError` on failure.
fn flatten<T, E: BackendError>(
    outcome: Result<Result<T, E>, tokio::time::error::Elapsed>,
    operation: Operation,
    settings: &LeaseSettings,
) -> Result<T, LeaseError> {
    match outcome {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => {
            tracing::debug!(lease = %settings.name(), owner = %settings.owner(), error = &error as &dyn StdError, transient = error.is_transient(), "{operation} failed");
            Err(LeaseError::backend(operation, error))
        }
        Err(_) => {
            tracing::debug!(lease = %settings.name(), owner = %settings.owner(), "{operation} timed out");
            Err(LeaseError::Timeout {
                operation,
                timeout: settings.operation_timeout(),
            })
        }
    }
}

/// Runs an acquire and records its final outcome on `span` once: `acquired` is recorded by the
/// attempt that got the lease (before its `lease acquired` line), every other outcome
/// (`held_by_other`, `timeout`, `error`) here when the operation ends, so that an acquire that
/// waited behind another owner through several attempts shows one outcome, its last.
async fn record_acquire_outcome(
    acquire: impl std::future::Future<Output = Result<bool, LeaseError>>,
    span: tracing::Span,
) -> Result<bool, LeaseError> {
    let result = acquire.await;
    match &result {
        Ok(true) => {}
        Ok(false) => {
            span.record("outcome", "held_by_other");
        }
        Err(LeaseError::Timeout { .. }) => {
            span.record("outcome", "timeout");
        }
        Err(_) => {
            span.record("outcome", "error");
        }
    }
    result
}

/// Stops a renewal task and returns its tenure, or `None` if the tenure was lost.
async fn stop_renewal<T>(renewal: Renewal<T>) -> Option<T> {
    let _ = renewal.stop.send(());
    renewal.join.await.ok().flatten()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<B: LeaseBackend> Shared<B> {
    /// Ends tenure `generation` as lost and notifies the handlers, once. Returns `false` when the
    /// tenure had already ended (released, or lost before).
    fn lose(&self, generation: u64, reason: LostReason) -> bool {
        let Some(tenure) = self.tenure.end(generation, TenureEnd::Lost(reason.clone())) else {
            return false;
        };
        self.report_loss(tenure, reason);
        true
    }

    /// Tells everyone of the loss of `tenure` (ended already): metrics, the log, the handlers.
    fn report_loss(&self, tenure: Tenure, reason: LostReason) {
        metrics::lost(&self.label, &reason);
        *lock(&self.holder) = match &reason {
            LostReason::TakenOver { holder } => holder.clone(),
            _ => None,
        };
        let with_member = match &reason {
            LostReason::Unbound { .. } => true,
            LostReason::Expired { .. } => self.bound.get().is_some(),
            _ => false,
        };
        if let (true, Some(member)) = (with_member, self.bound.get()) {
            // The end of the member tenure it lived by (its deadline is the member's), which the
            // member lease reports itself: a warning when it was lost, none when it was released
            // or retired, as a leaving node does with hundreds of shards bound to it. One warning
            // per loss, not one per bound shard.
            tracing::debug!(lease = %self.settings.name(), owner = %self.settings.owner(), fencing_token = %tenure.token(), member = %member.member(), %reason, "bound tenure ended with its member tenure");
        } else {
            tracing::warn!(lease = %self.settings.name(), owner = %self.settings.owner(), fencing_token = %tenure.token(), %reason, "lease lost");
        }
        self.handlers.notify(&LeaseLost {
            name: self.settings.name().to_owned(),
            owner: self.settings.owner().to_owned(),
            reason,
            fencing_token: Some(tenure.token()),
        });
    }

    /// Ends tenure `generation` by this owner's own act (`end`: released, dropped). A tenure
    /// whose deadline already passed, before its renewal task noticed, ended at the deadline
    /// instead: a loss, reported once (`on_lost` with [`LostReason::Expired`]). Liveness is
    /// decided inside the update that ends the tenure, so no deadline can pass in between.
    /// Returns the tenure if it ended by choice (`None`: lost, or ended before).
    fn end_by_choice(&self, generation: u64, end: TenureEnd) -> Option<Tenure> {
        let expired = LostReason::Expired { last_error: None };
        match self.tenure.end_by_choice(generation, end, expired.clone()) {
            Some((tenure, true)) => {
                self.report_loss(tenure, expired);
                None
            }
            Some((tenure, false)) => Some(tenure),
            None => None,
        }
    }

    /// The end of a renewal task: `None` if tenure `generation` is lost now (and `on_lost` fired),
    /// or the tenure back if it had already ended by a `release`, which then tells the backend.
    fn lost_or_released<T>(&self, generation: u64, reason: LostReason, tenure: T) -> Option<T> {
        if self.lose(generation, reason) {
            None
        } else {
            Some(tenure)
        }
    }

    /// Gives `tenure` back to the backend, within the operation timeout, as `giving` says.
    async fn release_tenure(&self, tenure: B::Tenure, giving: &Giving) -> Result<bool, LeaseError> {
        let settings = &self.settings;
        let outcome = timeout(settings.operation_timeout(), async {
            match giving {
                Giving::Release => self.backend.release(settings, tenure).await,
                Giving::Prefer(preferred) => {
                    self.backend.release_to(settings, tenure, preferred).await
                }
                Giving::HandOver(target) => self.backend.hand_over(settings, tenure, target).await,
                Giving::Retire => self.backend.retire(settings, tenure).await,
                Giving::RetireHanding(handed) => {
                    self.backend.retire_handing(settings, tenure, handed).await
                }
            }
        })
        .await;
        let outcome = flatten(outcome, Operation::Release, settings).inspect_err(|_| {
            metrics::release(&self.label, "error");
            tracing::Span::current().record("outcome", "error");
        })?;
        let mut holder = lock(&self.holder);
        match outcome {
            ReleaseOutcome::Released => {
                *holder = None;
                metrics::release(&self.label, "released");
                tracing::Span::current().record("outcome", "released");
                match giving {
                    Giving::Release => {
                        tracing::info!(lease = %settings.name(), owner = %settings.owner(), "lease released")
                    }
                    Giving::Prefer(preferred) => {
                        tracing::info!(lease = %settings.name(), owner = %settings.owner(), %preferred, "lease released to a preferred holder")
                    }
                    Giving::HandOver(target) => {
                        tracing::info!(lease = %settings.name(), owner = %settings.owner(), %target, "lease released, handed over")
                    }
                    Giving::Retire => {
                        tracing::info!(lease = %settings.name(), owner = %settings.owner(), "lease released for good")
                    }
                    Giving::RetireHanding(handed) => {
                        tracing::info!(lease = %settings.name(), owner = %settings.owner(), handed = handed.len(), "lease released for good, its bound shards handed on")
                    }
                }
                Ok(true)
            }
            ReleaseOutcome::HeldByOther { holder: other } => {
                metrics::release(&self.label, "held_by_other");
                tracing::Span::current().record("outcome", "held_by_other");
                tracing::warn!(lease = %settings.name(), owner = %settings.owner(), holder = ?other, "release found the lease held by another owner");
                *holder = other;
                Ok(false)
            }
        }
    }
}

impl<B: LeaseBackend> Drop for ManagedLease<B> {
    fn drop(&mut self) {
        // Like a crash: renewal stops, nothing is released, the lease expires after its TTL.
        // The tenure ends first, so that it is never published without its renewal task (as a
        // loss if its deadline already passed, like a `release` at this moment).
        if let Some(generation) = self.shared.tenure.published_generation() {
            if let Some(tenure) = self.shared.end_by_choice(generation, TenureEnd::Dropped) {
                let settings = &self.shared.settings;
                match self.shared.bound.get() {
                    Some(anchor) => {
                        tracing::warn!(lease = %settings.name(), owner = %settings.owner(), fencing_token = %tenure.token(), member = %anchor.member(), "bound lease dropped while held, without a release: its record stays held as long as the member lease's tenure it is bound to");
                    }
                    None => {
                        tracing::warn!(lease = %settings.name(), owner = %settings.owner(), fencing_token = %tenure.token(), ttl = ?settings.ttl(), "lease dropped while held, without a release: its record stays until the TTL passes, and the next holder waits that long");
                    }
                }
            }
        }
        if let Some(abort) = lock(&self.shared.abort).take() {
            abort.abort();
        }
    }
}

impl<B: LeaseBackend> Lease for ManagedLease<B> {
    fn settings(&self) -> &LeaseSettings {
        &self.shared.settings
    }

    fn acquire(&self) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        let span = self.span("lease_acquire");
        record_acquire_outcome(self.acquire_inner(), span.clone()).instrument(span)
    }

    fn release(&self) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        self.release_inner(Giving::Release)
            .instrument(self.span("lease_release"))
    }

    fn retire(&self) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        self.release_inner(Giving::Retire)
            .instrument(self.span("lease_release"))
    }

    fn retire_handing(
        &self,
        handed: Vec<crate::HandedShard>,
    ) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        self.release_inner(Giving::RetireHanding(handed))
            .instrument(self.span("lease_release"))
    }

    fn plan_hand_on(&self, ended: &crate::Binding, handed: Vec<crate::HandedShard>) {
        self.shared.backend.plan_hand_on(ended, handed);
    }

    fn mark_leaving(&self) {
        self.shared.backend.mark_leaving();
        self.shared.renew_now.notify_one();
    }

    fn release_to(
        &self,
        target: &str,
    ) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        let span = self.span("lease_release");
        async move {
            crate::lease::check_transfer_target(self, target)?;
            self.release_inner(Giving::Prefer(target.to_owned())).await
        }
        .instrument(span)
    }

    fn hand_over(
        &self,
        target: &str,
    ) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        let span = self.span("lease_release");
        async move {
            crate::lease::check_target(self, target)?;
            self.release_inner(Giving::HandOver(target.to_owned()))
                .await
        }
        .instrument(span)
    }

    fn acquire_within(
        &self,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        let span = self.span("lease_acquire");
        record_acquire_outcome(self.acquire_within_inner(timeout), span.clone()).instrument(span)
    }

    fn records_preference(&self) -> bool {
        self.shared.backend.records_preference()
    }

    fn observed_holder(&self) -> Option<String> {
        if self.check_alive() {
            return Some(self.shared.settings.owner().to_owned());
        }
        lock(&self.shared.holder).clone()
    }

    fn watch_group(&self, prefix: &str) -> Result<crate::GroupWatch, crate::GroupError> {
        self.shared.backend.watch_group(prefix)
    }

    fn binding_anchor(&self) -> Option<BindingAnchor> {
        // A bound lease anchors nothing: a binding is one level deep (its member decides).
        if self.shared.bound.get().is_some() {
            return None;
        }
        self.shared.tenure.anchor().map(|inner| BindingAnchor {
            inner: Arc::clone(inner),
        })
    }

    fn bind_to(&self, anchor: &BindingAnchor) -> Result<(), LeaseError> {
        let shared = &self.shared;
        let refuse = |what| {
            Err(LeaseError::Unsupported {
                operation: Operation::Acquire,
                what,
            })
        };
        if !shared.backend.binds() {
            return refuse("bind a lease to another lease's tenure");
        }
        if anchor.store_id() != shared.backend.store_id().as_deref() {
            return refuse("bind a lease to a lease of another store");
        }
        if anchor.inner.is_bound() {
            return refuse("bind a lease to a lease that is bound itself");
        }
        if anchor.member() == shared.settings.name()
            || shared
                .tenure
                .anchor()
                .is_some_and(|own| Arc::ptr_eq(own, &anchor.inner))
        {
            return refuse("bind a lease to itself");
        }
        if let Err(anchor) = shared.bound.set(anchor.clone()) {
            // Bound to this very anchor already (a lease built again from a provider's cache):
            // nothing changes.
            let same = shared
                .bound
                .get()
                .is_some_and(|bound| Arc::ptr_eq(&bound.inner, &anchor.inner));
            if !same {
                return refuse("bind a lease that is bound to another lease already");
            }
        }
        shared.backend.bound_to(anchor);
        // Anchors handed out before are refused from now on (`is_bound`).
        if let Some(own) = shared.tenure.anchor() {
            own.set_bound();
        }
        Ok(())
    }

    fn bound_to(&self) -> Option<String> {
        self.shared.bound.get().map(|a| a.member().to_owned())
    }

    fn tenure(&self) -> &TenureWatch {
        self.shared.tenure.watch()
    }

    fn on_lost(&self, handler: impl Fn(&LeaseLost) + Send + Sync + 'static) -> LostSubscription {
        self.shared.handlers.subscribe(handler)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{sleep, Instant};

    use crate::{InMemoryFault, InMemoryStore, Lease, LeaseSettings};

    fn settings(owner: &str) -> LeaseSettings {
        LeaseSettings::builder("race", owner)
            .ttl(Duration::from_secs(9))
            .build()
            .unwrap()
    }

    /// A renewal in flight when `release` starts must not swallow the release: the renewal lands
    /// (the record is fresh again), so the backend must still be told, or the next owner waits a
    /// whole TTL.
    #[tokio::test(start_paused = true)]
    async fn release_during_an_in_flight_renewal_still_releases_on_the_backend() {
        let store = InMemoryStore::new();
        let a = store.lease(settings("a"));
        assert!(a.acquire().await.unwrap());
        let renewals = store.stats().renewals;
        // From now on every call of `a` is applied one second late: the renewal due at 3 s is
        // in flight until 4 s.
        store.set_owner_fault("a", Some(InMemoryFault::Delay(Duration::from_secs(1))));
        sleep(Duration::from_millis(3500)).await;
        let released = a.release().await.unwrap();
        assert_eq!(
            store.stats().renewals,
            renewals + 1,
            "the renewal was in flight during the release and landed"
        );
        assert!(released);
        assert!(!a.check_alive());
        assert_eq!(store.holder("race"), None, "the store was told");
        let b = store.lease(settings("b"));
        let start = Instant::now();
        assert!(b.acquire().await.unwrap());
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "the next owner got it at once"
        );
    }

    /// `acquire_within(Duration::MAX)` means "no deadline", not a panic.
    #[tokio::test(start_paused = true)]
    async fn acquire_within_an_unbounded_timeout_does_not_overflow() {
        let store = InMemoryStore::new();
        let a = store.lease(settings("a"));
        assert!(a.acquire_within(Duration::MAX).await.unwrap());
        let b = store.lease(settings("b"));
        let waiter = tokio::spawn(async move {
            let got = b.acquire_within(Duration::MAX).await;
            (got, b)
        });
        sleep(Duration::from_secs(1)).await;
        assert!(a.release().await.unwrap());
        let (got, b) = waiter.await.unwrap();
        assert!(got.unwrap());
        assert!(b.check_alive());
    }
}
