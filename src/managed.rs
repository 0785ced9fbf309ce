//! [`ManagedLease`]: the one implementation of the lease contract on top of any
//! [`LeaseBackend`].

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::{sleep_until, timeout, Instant};
use tracing::Instrument;

use crate::backend::{AcquireAttempt, BackendError, LeaseBackend, ReleaseOutcome, RenewOutcome};
use crate::lease::{
    FencingToken, Lease, LeaseError, LeaseLost, LostHandlers, LostReason, LostSubscription,
    Operation,
};
use crate::settings::LeaseSettings;

/// First delay before retrying a failed renewal; doubles up to a quarter of the renewal interval.
const RENEW_BACKOFF_START: Duration = Duration::from_millis(50);
/// First delay before re-establishing a broken loss watch; doubles up to the renewal interval.
const WATCH_BACKOFF_START: Duration = Duration::from_millis(100);

/// A [`Lease`] backed by any [`LeaseBackend`]: the one implementation of the lease contract.
///
/// It owns what every backend shares: the acquire retry loop, the operation timeout on every call,
/// the renewal task with its backoff, the local monotonic deadline behind `check_alive`, reentrancy,
/// serialisation of `acquire` and `release`, and exactly-once `on_lost`.
///
/// # One tenure, one renewal task
///
/// A successful `acquire` starts a *tenure*: it records the fencing token and the deadline
/// `start of the claim + ttl - clock_drift_margin`, and spawns one renewal task. The task renews every
/// `renewal_interval`; each success moves the deadline to `start of that renewal + ttl - margin`.
/// A failed renewal is retried with a backoff (50 ms doubling, at most a quarter of the renewal
/// interval) until the deadline. The tenure ends in exactly one of three ways:
///
/// * `release`: renewal stops first, then the backend is told; no `on_lost`.
/// * the deadline passes (partition, pause, backend down): `on_lost` with
///   [`LostReason::Expired`]; `check_alive` was already `false` at the deadline because it reads
///   the clock itself;
/// * the backend reports the loss (a renewal's compare-and-swap fails, or its watch sees another
///   holder or a deletion): `on_lost` with that reason.
///
/// Backends expose it under their own name ([`InMemoryLease`](crate::InMemoryLease) is
/// `ManagedLease<InMemoryBackend>`). Share it behind an `Arc`; dropping the last handle stops
/// renewal *without* releasing (like a crash: the lease expires after its TTL), so call
/// [`Lease::release`] on a graceful shutdown.
pub struct ManagedLease<B: LeaseBackend> {
    shared: Arc<Shared<B>>,
}

struct Shared<B: LeaseBackend> {
    backend: B,
    settings: LeaseSettings,
    handlers: LostHandlers,
    local: Mutex<Local>,
    ops: tokio::sync::Mutex<Option<Renewal<B::Tenure>>>,
}

/// What `check_alive` and friends read without awaiting.
#[derive(Default)]
struct Local {
    held: bool,
    generation: u64,
    token: Option<FencingToken>,
    deadline: Option<Instant>,
    abort: Option<AbortHandle>,
}

struct Renewal<T> {
    generation: u64,
    stop: oneshot::Sender<()>,
    join: JoinHandle<Option<T>>,
}

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
        Self {
            shared: Arc::new(Shared {
                backend,
                settings,
                handlers: LostHandlers::new(),
                local: Mutex::new(Local::default()),
                ops: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// The backend of this lease.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }

    /// Up to `attempts` attempts, `acquire_retry_delay` apart (or sooner on a change).
    async fn acquire_inner(&self, attempts: u32) -> Result<bool, LeaseError> {
        let shared = &self.shared;
        let settings = &shared.settings;
        let mut ops = shared.ops.lock().await;
        if ops.is_some() && self.check_alive() {
            return Ok(true);
        }
        if let Some(renewal) = ops.take() {
            // The previous tenure ended (lost, or its deadline passed a moment ago and the task
            // has not noticed yet): end it properly, so that its loss is notified exactly once
            // and before a new tenure starts.
            let generation = renewal.generation;
            stop_renewal(renewal).await;
            shared.lose(generation, LostReason::Expired { last_error: None });
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| LeaseError::NoRuntime {
            operation: Operation::Acquire,
        })?;
        let mut last: Result<bool, LeaseError> = Ok(false);
        for attempt in 1..=attempts {
            let start = Instant::now();
            match timeout(
                settings.operation_timeout(),
                shared.backend.try_acquire(settings),
            )
            .await
            {
                Ok(Ok(AcquireAttempt::Acquired {
                    tenure,
                    token,
                    valid_from,
                })) => {
                    let deadline =
                        valid_from.map_or(start, |v| v.min(start)) + settings.local_validity();
                    if Instant::now() >= deadline {
                        // The claim took longer than its own validity: it cannot be trusted.
                        tracing::warn!(lease = %settings.name(), owner = %settings.owner(), "acquire answered after the claim's local deadline");
                        last = Err(LeaseError::Timeout {
                            operation: Operation::Acquire,
                            timeout: settings.operation_timeout(),
                        });
                    } else {
                        *ops = Some(self.start_tenure(&runtime, tenure, token, deadline));
                        tracing::info!(lease = %settings.name(), owner = %settings.owner(), fencing_token = %token, "lease acquired");
                        return Ok(true);
                    }
                }
                Ok(Ok(AcquireAttempt::HeldByOther { holder, .. })) => {
                    tracing::debug!(lease = %settings.name(), owner = %settings.owner(), holder = ?holder, attempt, "lease held by another owner");
                    last = Ok(false);
                }
                Ok(Err(error)) => {
                    let transient = error.is_transient();
                    tracing::debug!(lease = %settings.name(), owner = %settings.owner(), %error, attempt, transient, "acquire attempt failed");
                    let error = LeaseError::Backend {
                        operation: Operation::Acquire,
                        transient,
                        source: Box::new(error),
                    };
                    if !transient {
                        return Err(error);
                    }
                    last = Err(error);
                }
                Err(_) => {
                    tracing::debug!(lease = %settings.name(), owner = %settings.owner(), attempt, "acquire attempt timed out");
                    last = Err(LeaseError::Timeout {
                        operation: Operation::Acquire,
                        timeout: settings.operation_timeout(),
                    });
                }
            }
            if attempt < attempts {
                let not_after = Instant::now() + settings.acquire_retry_delay();
                match last {
                    // Held by another owner: wake early when the backend sees a change.
                    Ok(false) => shared.backend.wait_for_change(settings, not_after).await,
                    // An error: back off for the whole delay (the store may look free while
                    // this owner cannot reach it).
                    _ => tokio::time::sleep_until(not_after).await,
                }
            }
        }
        last
    }

    async fn acquire_within_inner(&self, timeout: Duration) -> Result<bool, LeaseError> {
        let settings = &self.shared.settings;
        let deadline = deadline_after(timeout);
        let mut failing = false;
        loop {
            let result = self.acquire_inner(1).await;
            match &result {
                Ok(true) => return result,
                Err(error) if !error.is_transient() => return result,
                _ if Instant::now() >= deadline => return result,
                Err(error) => {
                    // Once per streak of errors: the waiter keeps retrying every retry delay.
                    if !failing {
                        tracing::warn!(lease = %settings.name(), owner = %settings.owner(), %error, retry_in = ?settings.acquire_retry_delay(), "acquire attempt failed while waiting for the lease; retrying");
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
                    tokio::time::sleep_until(
                        deadline.min(Instant::now() + settings.acquire_retry_delay()),
                    )
                    .await
                }
            }
        }
    }

    fn start_tenure(
        &self,
        runtime: &tokio::runtime::Handle,
        tenure: B::Tenure,
        token: FencingToken,
        deadline: Instant,
    ) -> Renewal<B::Tenure> {
        let shared = &self.shared;
        let mut local = shared.lock_local();
        local.generation += 1;
        local.held = true;
        local.token = Some(token);
        local.deadline = Some(deadline);
        let generation = local.generation;
        let (stop, stopped) = oneshot::channel();
        let span = tracing::info_span!("lease_renewal", lease = %shared.settings.name(), owner = %shared.settings.owner(), fencing_token = %token);
        let join = runtime.spawn(
            renewal_loop(Arc::clone(shared), tenure, generation, token, stopped).instrument(span),
        );
        local.abort = Some(join.abort_handle());
        Renewal {
            generation,
            stop,
            join,
        }
    }

    async fn release_inner(&self) -> Result<bool, LeaseError> {
        let shared = &self.shared;
        let settings = &shared.settings;
        let mut ops = shared.ops.lock().await;
        let Some(renewal) = ops.take() else {
            return Ok(true);
        };
        let generation = renewal.generation;
        {
            let mut local = shared.lock_local();
            if local.held && local.generation == generation {
                if local.deadline.is_some_and(|d| Instant::now() >= d) {
                    drop(local);
                    shared.lose(generation, LostReason::Expired { last_error: None });
                } else {
                    local.held = false;
                    local.deadline = None;
                    local.token = None;
                }
            }
        }
        let Some(tenure) = stop_renewal(renewal).await else {
            // The tenure was lost before the release; there is nothing of ours to release.
            return Ok(true);
        };
        match timeout(
            settings.operation_timeout(),
            shared.backend.release(settings, tenure),
        )
        .await
        {
            Ok(Ok(ReleaseOutcome::Released)) => {
                tracing::info!(lease = %settings.name(), owner = %settings.owner(), "lease released");
                Ok(true)
            }
            Ok(Ok(ReleaseOutcome::HeldByOther { holder })) => {
                tracing::warn!(lease = %settings.name(), owner = %settings.owner(), holder = ?holder, "release found the lease held by another owner");
                Ok(false)
            }
            Ok(Err(error)) => Err(LeaseError::Backend {
                operation: Operation::Release,
                transient: error.is_transient(),
                source: Box::new(error),
            }),
            Err(_) => Err(LeaseError::Timeout {
                operation: Operation::Release,
                timeout: settings.operation_timeout(),
            }),
        }
    }
}

/// `now + timeout`, or about 30 years from now when that would overflow (`Duration::MAX` means
/// "no deadline").
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400))
}

/// Stops a renewal task and returns its tenure, or `None` if the tenure was lost.
async fn stop_renewal<T>(renewal: Renewal<T>) -> Option<T> {
    let _ = renewal.stop.send(());
    renewal.join.await.ok().flatten()
}

impl<B: LeaseBackend> Shared<B> {
    fn lock_local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends tenure `generation` as lost and notifies the handlers, once. Returns `false` when the
    /// tenure had already ended (released, or lost before).
    fn lose(&self, generation: u64, reason: LostReason) -> bool {
        let token = {
            let mut local = self.lock_local();
            if !(local.held && local.generation == generation) {
                return false;
            }
            local.held = false;
            local.deadline = None;
            local.token.take()
        };
        tracing::warn!(lease = %self.settings.name(), owner = %self.settings.owner(), %reason, "lease lost");
        self.handlers.notify(&LeaseLost {
            name: self.settings.name().to_owned(),
            owner: self.settings.owner().to_owned(),
            reason,
            fencing_token: token,
        });
        true
    }

    /// Moves the deadline of tenure `generation` to `deadline`, if it is still the current tenure
    /// and its deadline has not passed. Returns whether the tenure is still alive.
    fn extend(&self, generation: u64, deadline: Instant) -> bool {
        let mut local = self.lock_local();
        if !(local.held && local.generation == generation) {
            return false;
        }
        let now = Instant::now();
        match local.deadline {
            Some(current) if now < current => {
                local.deadline = Some(current.max(deadline));
                true
            }
            _ => false,
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

    fn deadline_of(&self, generation: u64) -> Option<Instant> {
        let local = self.lock_local();
        (local.held && local.generation == generation)
            .then_some(local.deadline)
            .flatten()
    }
}

async fn renewal_loop<B: LeaseBackend>(
    shared: Arc<Shared<B>>,
    mut tenure: B::Tenure,
    generation: u64,
    token: FencingToken,
    mut stop: oneshot::Receiver<()>,
) -> Option<B::Tenure> {
    let settings = &shared.settings;
    let interval = settings.renewal_interval();
    let max_backoff = (interval / 4).max(RENEW_BACKOFF_START);
    let mut backoff = RENEW_BACKOFF_START;
    let mut last_error: Option<String> = None;
    let watch = watch_loss(&shared, token);
    tokio::pin!(watch);
    let mut next = match shared.deadline_of(generation) {
        Some(deadline) => deadline + settings.clock_drift_margin() - settings.ttl() + interval,
        None => return Some(tenure),
    };
    loop {
        let Some(deadline) = shared.deadline_of(generation) else {
            return Some(tenure);
        };
        tokio::select! {
            biased;
            _ = &mut stop => return Some(tenure),
            _ = sleep_until(deadline) => {
                return shared.lost_or_released(generation, LostReason::Expired { last_error }, tenure);
            }
            reason = &mut watch => {
                return shared.lost_or_released(generation, reason, tenure);
            }
            _ = sleep_until(next) => {}
        }
        let start = Instant::now();
        let outcome = tokio::select! {
            biased;
            _ = sleep_until(deadline) => {
                return shared.lost_or_released(generation, LostReason::Expired { last_error }, tenure);
            }
            reason = &mut watch => {
                return shared.lost_or_released(generation, reason, tenure);
            }
            outcome = timeout(settings.operation_timeout(), shared.backend.renew(settings, &mut tenure)) => outcome,
        };
        match outcome {
            Ok(Ok(RenewOutcome::Renewed { valid_from })) => {
                let from = valid_from.map_or(start, |v| v.min(start));
                if !shared.extend(generation, from + settings.local_validity()) {
                    // Either the deadline passed while the renewal was in flight (lost), or a
                    // `release` began meanwhile: then hand the tenure back, so that the release
                    // still tells the backend (the record was just renewed).
                    return shared.lost_or_released(
                        generation,
                        LostReason::Expired { last_error },
                        tenure,
                    );
                }
                tracing::trace!("lease renewed");
                last_error = None;
                backoff = RENEW_BACKOFF_START;
                next = start + interval;
            }
            Ok(Ok(RenewOutcome::Lost(reason))) => {
                return shared.lost_or_released(generation, reason, tenure);
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, transient = error.is_transient(), "lease renewal failed, retrying until the deadline");
                last_error = Some(error.to_string());
                next = Instant::now() + backoff;
                backoff = (backoff * 2).min(max_backoff);
            }
            Err(_) => {
                tracing::warn!(timeout = ?settings.operation_timeout(), "lease renewal timed out, retrying until the deadline");
                last_error = Some(format!(
                    "renewal timed out after {:?}",
                    settings.operation_timeout()
                ));
                next = Instant::now() + backoff;
                backoff = (backoff * 2).min(max_backoff);
            }
        }
    }
}

/// Resolves with the reason when the backend's watch reports a loss; re-establishes a broken watch
/// with a backoff.
async fn watch_loss<B: LeaseBackend>(shared: &Shared<B>, token: FencingToken) -> LostReason {
    let settings = &shared.settings;
    let max_backoff = settings.renewal_interval();
    let mut backoff = WATCH_BACKOFF_START;
    loop {
        let started = Instant::now();
        match shared.backend.watch_lost(settings, token).await {
            Ok(reason) => return reason,
            Err(error) => {
                // A watch that worked for a while before breaking starts the backoff over.
                if started.elapsed() >= max_backoff {
                    backoff = WATCH_BACKOFF_START;
                }
                tracing::debug!(%error, retry_in = ?backoff, "lease watch broke, re-establishing");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(max_backoff);
            }
        }
    }
}

impl<B: LeaseBackend> Drop for ManagedLease<B> {
    fn drop(&mut self) {
        // Like a crash: renewal stops, nothing is released, the lease expires after its TTL.
        if let Some(abort) = self.shared.lock_local().abort.take() {
            abort.abort();
        }
    }
}

impl<B: LeaseBackend> Lease for ManagedLease<B> {
    fn settings(&self) -> &LeaseSettings {
        &self.shared.settings
    }

    fn acquire(&self) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        self.acquire_inner(self.shared.settings.acquire_retries().saturating_add(1))
    }

    fn release(&self) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        self.release_inner()
    }

    fn acquire_within(
        &self,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        self.acquire_within_inner(timeout)
    }

    fn check_alive(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() < d)
    }

    fn on_lost(&self, handler: impl Fn(&LeaseLost) + Send + Sync + 'static) -> LostSubscription {
        self.shared.handlers.subscribe(handler)
    }

    fn fencing_token(&self) -> Option<FencingToken> {
        let local = self.shared.lock_local();
        local.held.then_some(local.token).flatten()
    }

    fn deadline(&self) -> Option<Instant> {
        let local = self.shared.lock_local();
        local.held.then_some(local.deadline).flatten()
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
