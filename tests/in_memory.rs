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

    async fn slow_answers(&self, owner: &str, delay: Duration) {
        self.store.set_owner_fault(
            owner,
            Some(actix_coordination::InMemoryFault::SlowAnswer(delay)),
        );
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

contract_suite!(fixture = InMemoryFixture::default(), test = #[tokio::test(start_paused = true)]);

/// The contract suite on leases bound to a member lease (see `actix_coordination::Binding`).
mod bound {
    use super::InMemoryFixture;
    use crate::common::contract::Bound;

    contract_suite!(fixture = Bound(InMemoryFixture::default()), test = #[tokio::test(start_paused = true)]);
}

actor_suite!(
    fixture = InMemoryFixture::default(),
    run = common::run_paused
);

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

/// Against a holder, `acquire` makes exactly `acquire_retries + 1` attempts and resolves `false`.
/// Nothing changes in between, so the attempts are exactly `acquire_retry_delay` apart; a change in
/// the store (another takeover) wakes the contender earlier, but never adds an attempt.
#[tokio::test(start_paused = true)]
async fn acquire_gives_up_after_retries_plus_one_attempts() {
    let f = InMemoryFixture::default();
    let a = f.lease(f.settings("retries", "a")).await;
    assert!(a.acquire().await.unwrap());
    let delay = Duration::from_millis(700);
    for retries in [0, 1, 3, 4] {
        let b = f
            .lease(
                f.settings("retries", "b")
                    .to_builder()
                    .acquire_retries(retries)
                    .acquire_retry_delay(delay)
                    .build()
                    .unwrap(),
            )
            .await;
        let before = f.store.stats().acquires;
        let start = Instant::now();
        assert!(!b.acquire().await.unwrap(), "{retries} retries");
        assert_eq!(
            f.store.stats().acquires - before,
            u64::from(retries) + 1,
            "attempts with {retries} retries"
        );
        assert_eq!(
            start.elapsed(),
            delay * retries,
            "{retries} full delays: nothing changed in the store"
        );
        assert!(!b.check_alive());
        assert_eq!(b.fencing_token(), None);
        assert!(a.check_alive(), "the holder is undisturbed");
    }
    assert_eq!(f.store.holder("retries").as_deref(), Some("a"));

    // A change in the store wakes the waiting contender early; the attempt count stays the same.
    let c = f
        .lease(
            f.settings("woken", "c")
                .to_builder()
                .acquire_retries(4)
                .acquire_retry_delay(Duration::from_secs(2))
                .build()
                .unwrap(),
        )
        .await;
    f.store.force_take("woken", "x", Duration::from_secs(60));
    let before = f.store.stats().acquires;
    let start = Instant::now();
    let (got, ()) = tokio::join!(c.acquire(), async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        f.store.force_take("woken", "y", Duration::from_secs(60));
    });
    assert!(!got.unwrap());
    assert_eq!(f.store.stats().acquires - before, 5, "1 + 4 retries");
    // Attempts at 0 s, 2 s, 3 s (woken by the takeover), 5 s and 7 s.
    assert_eq!(start.elapsed(), Duration::from_secs(7));
    assert!(start.elapsed() < Duration::from_secs(2) * 4);
}

/// `on_lost` reports the end of a tenure an `acquire` established: acquires that fail, time out,
/// are cancelled or lose their answer never fire it, before or after a real loss.
#[tokio::test(start_paused = true)]
async fn failed_acquires_never_fire_on_lost() {
    use actix_coordination::{InMemoryFault, LeaseError};
    use tokio::time::timeout;

    let f = InMemoryFixture::default();
    let a = f
        .lease(
            f.settings("no-tenure", "a")
                .to_builder()
                .acquire_retries(1)
                .build()
                .unwrap(),
        )
        .await;
    let ttl = a.settings().ttl();
    let mut probe = common::contract::LostProbe::new(&a);

    f.store.partition("a");
    let result = a.acquire().await;
    assert!(
        matches!(
            result,
            Err(LeaseError::Backend {
                transient: true,
                ..
            })
        ),
        "{result:?}"
    );
    f.store.pause("a");
    let result = a.acquire().await;
    assert!(
        matches!(result, Err(LeaseError::Timeout { .. })),
        "{result:?}"
    );
    assert!(
        timeout(Duration::from_millis(100), a.acquire())
            .await
            .is_err(),
        "cancelled while its call hangs"
    );
    // The store applies the claim but a never hears of it: a holds nothing it could lose.
    f.store
        .set_owner_fault("a", Some(InMemoryFault::ResponseLost));
    assert!(a.acquire().await.is_err());
    assert_eq!(f.store.holder("no-tenure").as_deref(), Some("a"));
    assert!(!a.check_alive());
    assert_eq!(a.fencing_token(), None);
    assert_eq!(a.deadline(), None);
    probe.none(ttl * 3).await;
    assert_eq!(
        f.store.holder("no-tenure"),
        None,
        "the unanswered claim expired"
    );

    // A real tenure and its loss: exactly one notification.
    f.store.heal("a");
    assert!(a.acquire().await.unwrap());
    let token = a.fencing_token().unwrap();
    f.store.partition("a");
    let (_, lost) = probe.next(ttl).await;
    assert_eq!(lost.fencing_token, Some(token));
    // Failing acquires after the loss end nothing more.
    assert!(a.acquire().await.is_err());
    f.store.pause("a");
    assert!(matches!(a.acquire().await, Err(LeaseError::Timeout { .. })));
    probe.none(ttl * 3).await;
}

/// `check_alive` reads the local deadline itself: while the holder's renewals hang, it turns
/// `false` exactly at `deadline()`, even though the store still shows the holder (the clock drift
/// margin), and the hung renewals never move the deadline.
#[tokio::test(start_paused = true)]
async fn check_alive_ends_at_the_local_deadline_while_renewals_hang() {
    use tokio::time::sleep_until;

    let f = InMemoryFixture::default();
    let a = f.lease(f.settings("stuck", "a")).await;
    let mut probe = common::contract::LostProbe::new(&a);
    let acquired_at = Instant::now();
    assert!(a.acquire().await.unwrap());
    f.store.pause("a");
    let deadline = a.deadline().unwrap();
    assert_eq!(deadline, acquired_at + a.settings().local_validity());
    let store_expiry = f.store.record("stuck").unwrap().expires_at.unwrap();
    assert!(deadline < store_expiry, "the local deadline comes first");

    sleep_until(deadline - Duration::from_millis(1)).await;
    assert!(a.check_alive(), "alive until the deadline");
    assert_eq!(a.deadline(), Some(deadline), "hung renewals do not move it");
    assert_eq!(f.store.stats().renewals, 0, "no renewal got through");

    sleep_until(deadline).await;
    assert_eq!(Instant::now(), deadline);
    assert!(!a.check_alive(), "not alive at the deadline");
    assert_eq!(
        f.store.holder("stuck").as_deref(),
        Some("a"),
        "the store still shows a: check_alive came from the local clock"
    );
    let (lost_at, lost) = probe.next(Duration::from_millis(1)).await;
    assert_eq!(lost_at, deadline, "on_lost at the deadline");
    assert!(
        matches!(lost.reason, actix_coordination::LostReason::Expired { .. }),
        "{lost}"
    );
}

/// Polls `future` to completion on this thread, outside any Tokio runtime (what a caller without
/// one does, e.g. `futures::executor::block_on` in a plain thread).
fn block_on_without_runtime<F: std::future::Future>(future: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    assert!(
        tokio::runtime::Handle::try_current().is_err(),
        "no runtime here"
    );
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

/// Issue 27 item 6: outside a Tokio runtime every operation answers `LeaseError::NoRuntime`
/// (as documented) instead of panicking, and a `release` there changes nothing: the tenure
/// acquired on a runtime stays held and renewed until a release on a runtime.
#[test]
fn outside_a_runtime_every_operation_answers_no_runtime_and_changes_nothing() {
    use actix_coordination::{LeaseError, Operation};

    let no_runtime = |result: Result<bool, LeaseError>, operation: Operation| match result {
        Err(LeaseError::NoRuntime { operation: op }) => assert_eq!(op, operation),
        other => panic!("expected NoRuntime for {operation}, got {other:?}"),
    };
    let f = InMemoryFixture::default();
    let settings = f.settings("no-runtime", "a");
    let a = f.store.lease(settings);
    no_runtime(block_on_without_runtime(a.acquire()), Operation::Acquire);
    no_runtime(
        block_on_without_runtime(a.acquire_within(Duration::from_secs(1))),
        Operation::Acquire,
    );
    no_runtime(block_on_without_runtime(a.release()), Operation::Release);
    assert_eq!(f.store.holder("no-runtime"), None, "nothing was attempted");

    // Held through a runtime (its renewal task runs there); a release without one changes
    // nothing.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    assert!(runtime.block_on(a.acquire()).unwrap());
    let token = a.fencing_token();
    no_runtime(block_on_without_runtime(a.release()), Operation::Release);
    no_runtime(
        block_on_without_runtime(a.acquire_within(Duration::from_secs(1))),
        Operation::Acquire,
    );
    assert!(a.check_alive(), "still held");
    assert_eq!(a.fencing_token(), token);
    assert_eq!(f.store.holder("no-runtime").as_deref(), Some("a"));
    assert!(runtime.block_on(a.release()).unwrap());
    assert!(!a.check_alive());
    assert_eq!(f.store.holder("no-runtime"), None);
}
