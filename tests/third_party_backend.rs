//! A third-party backend: one that implements only the required methods of [`LeaseBackend`] (no
//! loss watch, no change notification, no store id), as the README invites. It runs the whole
//! lease contract suite and the actor suite through [`ManagedLease`], under Tokio's paused clock,
//! so every default method of the trait is exercised: losses are found by renewals only, and
//! waiting contenders try again every `acquire_retry_delay`.
//!
//! Having no watch, every call it makes to the store is a renewal, an attempt or a release, which
//! also makes it the place to check the renewal retry cadence exactly.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use actix_coordination::{
    AcquireAttempt, InMemoryBackend, InMemoryError, InMemoryFault, InMemoryStore, InMemoryTenure,
    Lease, LeaseBackend, LeaseSettings, ManagedLease, ReleaseOutcome, RenewOutcome,
};
use common::contract::{Fixture, LostProbe};
use tokio::time::Instant;

/// Forwards the three required methods to the in-memory backend, and nothing else; records when
/// each renewal was called.
struct MinimalBackend {
    inner: InMemoryBackend,
    renewals: Mutex<Vec<Instant>>,
}

impl MinimalBackend {
    fn new(store: &InMemoryStore) -> Self {
        Self {
            inner: InMemoryBackend::new(store),
            renewals: Mutex::default(),
        }
    }

    /// When each renewal was called, in order.
    fn renewals(&self) -> Vec<Instant> {
        self.renewals.lock().unwrap().clone()
    }
}

impl LeaseBackend for MinimalBackend {
    type Tenure = InMemoryTenure;
    type Error = InMemoryError;

    async fn try_acquire(
        &self,
        settings: &LeaseSettings,
    ) -> Result<AcquireAttempt<InMemoryTenure>, InMemoryError> {
        self.inner.try_acquire(settings).await
    }

    async fn renew(
        &self,
        settings: &LeaseSettings,
        tenure: &mut InMemoryTenure,
    ) -> Result<RenewOutcome, InMemoryError> {
        self.renewals.lock().unwrap().push(Instant::now());
        self.inner.renew(settings, tenure).await
    }

    async fn release(
        &self,
        settings: &LeaseSettings,
        tenure: InMemoryTenure,
    ) -> Result<ReleaseOutcome, InMemoryError> {
        self.inner.release(settings, tenure).await
    }
}

type MinimalLease = ManagedLease<MinimalBackend>;

/// One in-memory store per test, reached through the minimal backend; faults by owner.
#[derive(Default)]
struct MinimalFixture {
    store: InMemoryStore,
}

impl Fixture for MinimalFixture {
    type Lease = MinimalLease;

    /// The minimal backend keeps the trait's default: no group watches.
    fn watches_groups(&self) -> bool {
        false
    }

    fn settings(&self, name: &str, owner: &str) -> LeaseSettings {
        LeaseSettings::builder(name, owner)
            .ttl(Duration::from_secs(9))
            .build()
            .unwrap()
    }

    async fn lease(&self, settings: LeaseSettings) -> MinimalLease {
        ManagedLease::from_backend(settings, MinimalBackend::new(&self.store))
    }

    async fn partition(&self, owner: &str) {
        self.store.partition(owner);
    }

    async fn pause(&self, owner: &str) {
        self.store.pause(owner);
    }

    async fn heal(&self, owner: &str) {
        self.store.heal(owner);
    }

    async fn slow_answers(&self, owner: &str, delay: Duration) {
        self.store
            .set_owner_fault(owner, Some(InMemoryFault::SlowAnswer(delay)));
    }

    async fn sent_by(&self, _: &str) -> u64 {
        self.store.stats().calls
    }

    fn paused_clock(&self) -> bool {
        true
    }

    fn slack(&self) -> Duration {
        Duration::ZERO
    }

    fn unique_name(&self, base: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        format!("{base}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

contract_suite!(fixture = MinimalFixture::default(), test = #[tokio::test(start_paused = true)]);

actor_suite!(
    fixture = MinimalFixture::default(),
    run = common::run_paused
);

/// The trait's defaults are what this backend runs on.
#[test]
fn the_backend_uses_the_default_methods() {
    let backend = MinimalBackend::new(&InMemoryStore::new());
    assert_eq!(backend.store_id(), None);
    assert!(!backend.notifies_changes());
}

/// Without a watch, a takeover in the store is found by the next renewal, and a waiting contender
/// tries again after its retry delay (no change notification wakes it earlier).
#[tokio::test(start_paused = true)]
async fn without_a_watch_renewals_find_losses_and_contenders_poll() {
    let f = MinimalFixture::default();
    let a = f.lease(f.settings("poll", "a")).await;
    let mut probe = LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    let acquired = Instant::now();
    f.store.force_take("poll", "x", Duration::from_secs(5));
    let (lost_at, lost) = probe.next(Duration::from_secs(10)).await;
    assert_eq!(
        lost_at - acquired,
        a.settings().renewal_interval(),
        "found by the first renewal"
    );
    assert_eq!(
        lost.reason,
        actix_coordination::LostReason::TakenOver {
            holder: Some("x".into())
        }
    );
    let stats = a.stats();
    assert_eq!(
        (stats.watch_starts, stats.watch_breaks),
        (1, 0),
        "the default watch: started once, never resolves"
    );

    // x's claim expires 5 s after the takeover; b tries every retry delay (1 s here) meanwhile.
    let b = f
        .lease(
            f.settings("poll", "b")
                .to_builder()
                .acquire_retries(10)
                .acquire_retry_delay(Duration::from_secs(1))
                .build()
                .unwrap(),
        )
        .await;
    let start = Instant::now();
    assert!(b.acquire().await.unwrap());
    assert_eq!(b.stats().acquire_attempts, 3, "at 3 s, 4 s and 5 s");
    assert_eq!(start.elapsed(), Duration::from_secs(2));
}

/// Waits until `until`, then returns when each renewal since `since` was called and when
/// `on_lost` fired, relative to the start of `a`'s last successful renewal (or its acquire) as it
/// stood when this was called. Every instant is exact under the paused clock.
async fn renewal_calls(
    a: &MinimalLease,
    probe: &mut LostProbe,
    until: Instant,
) -> (Vec<Duration>, Option<Duration>) {
    let origin = a.deadline().expect("held") - a.settings().local_validity();
    let since = a.backend().renewals().len();
    tokio::time::sleep_until(until).await;
    let calls = a.backend().renewals()[since..]
        .iter()
        .map(|at| *at - origin)
        .collect();
    let lost = probe.try_next().map(|(at, _)| at - origin);
    (calls, lost)
}

fn ms(values: &[u64]) -> Vec<Duration> {
    values.iter().map(|v| Duration::from_millis(*v)).collect()
}

/// The renewal retry cadence, exactly: a renewal that fails with an error is retried after 50 ms,
/// then 100, 200, 400 ms, doubling up to a quarter of the renewal interval (750 ms for the 3 s
/// interval of a 9 s TTL), until the deadline (`ttl - margin` after the last good renewal), where
/// `on_lost` fires. A success starts the backoff over. A renewal that times out is retried at
/// once (a whole operation timeout has passed already).
#[tokio::test(start_paused = true)]
async fn renewal_retries_back_off_after_errors_and_retry_at_once_after_timeouts() {
    let f = MinimalFixture::default();
    let a = f.lease(f.settings("cadence", "a")).await;
    let mut probe = LostProbe::new(&a);
    let settings = a.settings().clone();
    assert_eq!(settings.renewal_interval(), Duration::from_secs(3));
    assert_eq!(settings.local_validity(), Duration::from_millis(8820));

    // Errors, then healed: 3 s is the first renewal, then 50, 100, 200 ms later; the one at
    // 3.35 s succeeds, and the next is one interval after its start.
    assert!(a.acquire().await.unwrap());
    let origin = Instant::now();
    f.store.partition("a");
    let ((calls, lost), ()) = tokio::join!(
        renewal_calls(&a, &mut probe, origin + Duration::from_millis(6400)),
        async {
            tokio::time::sleep_until(origin + Duration::from_millis(3300)).await;
            f.store.heal("a");
        }
    );
    assert_eq!(lost, None);
    assert_eq!(calls, ms(&[3000, 3050, 3150, 3350, 6350]));
    let stats = a.stats();
    assert_eq!((stats.renewal_errors, stats.renewals), (3, 2), "{stats:?}");

    // Errors until the deadline: 6.35 s (good), 9.35 s (the first failure), then 50, 100, 200,
    // 400 ms and 750 ms (the cap) apart; lost at the deadline, 6.35 + 8.82 = 15.17 s.
    f.store.partition("a");
    let (calls, lost) = renewal_calls(&a, &mut probe, origin + Duration::from_secs(16)).await;
    let renewed = Duration::from_millis(6350);
    let expected: Vec<Duration> = ms(&[
        9350, 9400, 9500, 9700, 10100, 10850, 11600, 12350, 13100, 13850, 14600,
    ])
    .into_iter()
    .map(|at| at - renewed)
    .collect();
    assert_eq!(calls, expected);
    assert_eq!(
        lost,
        Some(settings.local_validity()),
        "lost at the deadline"
    );
    f.store.heal("a");

    // Timeouts: every call hangs; each is retried as soon as it timed out (after the operation
    // timeout, 2.91 s), with no backoff, until the deadline.
    assert!(a.acquire().await.unwrap());
    f.store.set_owner_fault("a", Some(InMemoryFault::Hang));
    let timeout = settings.operation_timeout();
    assert_eq!(timeout, Duration::from_millis(2910));
    let start = Instant::now();
    let (calls, lost) = renewal_calls(&a, &mut probe, start + Duration::from_secs(10)).await;
    assert_eq!(
        calls,
        vec![Duration::from_secs(3), Duration::from_secs(3) + timeout]
    );
    assert_eq!(lost, Some(settings.local_validity()));
    assert_eq!(
        a.stats().renewal_timeouts,
        1,
        "the second one was cut by the deadline"
    );
}
