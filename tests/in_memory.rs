//! The lease contract suite on the in-memory backend, under Tokio's paused clock, plus the
//! in-memory specifics.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix_coordination::{InMemoryLease, InMemoryStore, Lease, LeaseSettings};
use common::contract::Fixture;
use tokio::time::Instant;

/// The in-memory fixture: one store per test, faults by owner.
#[derive(Default)]
pub struct InMemoryFixture {
    store: InMemoryStore,
}

impl Fixture for InMemoryFixture {
    type Lease = InMemoryLease;

    fn settings(&self, name: &str, owner: &str) -> LeaseSettings {
        LeaseSettings::builder(name, owner)
            .ttl(Duration::from_secs(9))
            .build()
            .unwrap()
    }

    async fn lease(&self, settings: LeaseSettings) -> InMemoryLease {
        self.store.lease(settings)
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

contract_suite!(fixture = InMemoryFixture::default(), test = #[tokio::test(start_paused = true)]);

/// The exact edges of the TTL, which only a paused clock can show: a crashed holder's lease is
/// free exactly `ttl` after the store applied its last renewal.
#[tokio::test(start_paused = true)]
async fn takeover_happens_exactly_at_ttl() {
    let f = InMemoryFixture::default();
    let settings = f.settings("edge", "a");
    let a = f.lease(settings.clone()).await;
    let b = f
        .lease(
            settings
                .with_owner("b")
                .unwrap()
                .to_builder()
                .acquire_retries(0)
                .build()
                .unwrap(),
        )
        .await;
    assert!(a.acquire().await.unwrap());
    let renewed_at = a.deadline().unwrap() - settings.local_validity();
    drop(a);
    tokio::time::sleep_until(renewed_at + settings.ttl() - Duration::from_millis(1)).await;
    assert!(!b.acquire().await.unwrap(), "1 ms before the TTL runs out");
    tokio::time::sleep_until(renewed_at + settings.ttl()).await;
    assert!(b.acquire().await.unwrap(), "exactly at the TTL");
}

/// A waiting contender with retries is woken by the release instead of sleeping out its delay.
#[tokio::test(start_paused = true)]
async fn waiting_contender_is_woken_by_release() {
    let f = InMemoryFixture::default();
    let a = f.lease(f.settings("wake", "a")).await;
    let b = f
        .lease(
            f.settings("wake", "b")
                .to_builder()
                .acquire_retries(10)
                .acquire_retry_delay(Duration::from_secs(2))
                .build()
                .unwrap(),
        )
        .await;
    assert!(a.acquire().await.unwrap());
    let start = Instant::now();
    let (got, released) = tokio::join!(b.acquire(), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        a.release().await
    });
    assert!(released.unwrap());
    assert!(got.unwrap());
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(300),
        "handed over at the release"
    );
}

/// One renewal per interval while held: the backend cost is predictable.
#[tokio::test(start_paused = true)]
async fn holder_renews_once_per_interval() {
    let f = InMemoryFixture::default();
    let a = f.lease(f.settings("cost", "a")).await;
    assert!(a.acquire().await.unwrap());
    tokio::time::sleep(Duration::from_secs(30) + Duration::from_millis(1)).await;
    assert!(a.check_alive());
    // ttl 9 s → renewal every 3 s → 10 renewals in 30 s.
    assert_eq!(f.store.stats().renewals, 10);
    assert_eq!(f.store.stats().acquires, 1);
}

/// A takeover reported by the store (an operator overwrote the record) is a loss with that reason.
#[tokio::test(start_paused = true)]
async fn deleted_record_is_a_loss() {
    let f = InMemoryFixture::default();
    let a = f.lease(f.settings("deleted", "a")).await;
    let mut probe = common::contract::LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    f.store.delete("deleted");
    let (_, lost) = probe.next(Duration::from_millis(1)).await;
    assert_eq!(lost.reason, actix_coordination::LostReason::Deleted);
    assert!(!a.check_alive());
}

/// `acquire_within` waits on the store's change notification: a waiting contender gets the lease at
/// the release instant, or at the expiry instant of a crashed holder, with no attempts in between.
#[tokio::test(start_paused = true)]
async fn acquire_within_wakes_on_release_and_at_expiry_without_polling() {
    let f = InMemoryFixture::default();
    let a = f.lease(f.settings("wait", "a")).await;
    let b = f.lease(f.settings("wait", "b")).await;
    assert!(a.acquire().await.unwrap());
    let before = f.store.stats().acquires;
    let start = Instant::now();
    let (got, released) = tokio::join!(b.acquire_within(Duration::from_secs(60)), async {
        tokio::time::sleep(Duration::from_secs(20)).await;
        a.release().await
    });
    assert!(released.unwrap());
    assert!(got.unwrap());
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(20),
        "acquired at the release instant"
    );
    // The first attempt, one at each expiry point it had observed (renewals moved it: 9 s, 15 s),
    // and the winning one at the release; no polling at the retry delay.
    let attempts = f.store.stats().acquires - before;
    assert_eq!(attempts, 4, "attempts while waiting 20 s");

    // A crashed holder: the waiter gets the lease at the store's expiry instant.
    let renewed_at = b.deadline().unwrap() - b.settings().local_validity();
    drop(b);
    let c = f.lease(f.settings("wait", "c")).await;
    assert!(c.acquire_within(Duration::from_secs(60)).await.unwrap());
    assert_eq!(
        Instant::now(),
        renewed_at + c.settings().ttl(),
        "at the expiry instant"
    );

    // Nobody releases: Ok(false) at the deadline.
    let d = f.lease(f.settings("wait", "d")).await;
    let start = Instant::now();
    assert!(!d.acquire_within(Duration::from_secs(5)).await.unwrap());
    assert!(start.elapsed() >= Duration::from_secs(5));
}

/// An owner that cannot reach the store backs off for the retry delay between attempts, even
/// while the store shows the lease free (waiting for a change would return at once and spin).
#[tokio::test(start_paused = true)]
async fn unreachable_owner_backs_off_instead_of_spinning() {
    let f = InMemoryFixture::default();
    let a = f.lease(f.settings("spin", "a")).await;
    f.store.partition("a");
    let start = Instant::now();
    let result = a.acquire_within(Duration::from_secs(5)).await;
    assert!(result.is_err(), "{result:?}");
    assert!(start.elapsed() >= Duration::from_secs(5));
    // 500 ms apart: about 11 attempts in 5 s, not thousands.
    let refused = f.store.stats().refused;
    assert!((9..=13).contains(&refused), "{refused} attempts in 5 s");
    let before = f.store.stats().refused;
    assert!(a.acquire().await.is_err());
    assert_eq!(
        f.store.stats().refused - before,
        4,
        "acquire: 1 + 3 retries"
    );
    assert!(
        start.elapsed() >= Duration::from_secs(5) + Duration::from_millis(1500),
        "3 delays"
    );
}
