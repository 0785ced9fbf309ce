//! Every end of a tenure reaches every actor, at the deadline: the situations that broke this
//! before, on the in-memory backend (under a paused clock, except where a thread must really be
//! held). The same checks against the real servers are the actor suite in `common/actors.rs`.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    ClusterSingletonManager, FencingToken, GetStatus, InMemoryFault, InMemoryLease, InMemoryStore,
    Lease, LeaseError, LeaseLost, LeaseSettings, LostReason, LostSubscription, Operation,
    SetEligible, Shutdown, SingletonInfo, SingletonSettings, SingletonState, TenureEnd,
    TenureWatch,
};
use common::actors::{assert_one_at_a_time, recorded_manager, wait_for_state, Life};
use common::run_paused;
use futures_util::FutureExt;
use tokio::time::{sleep, sleep_until, Instant};

const TTL: Duration = Duration::from_secs(9);
const LEASE: &str = "tenure";

fn settings(owner: &str) -> LeaseSettings {
    LeaseSettings::builder(LEASE, owner)
        .ttl(TTL)
        .build()
        .unwrap()
}

/// Moves the paused clock forward *without letting any other task run*: what a thread held by a
/// blocking call (or a paused process) looks like to the tasks of its runtime.
fn hold_the_thread(for_: Duration) {
    tokio::time::advance(for_)
        .now_or_never()
        .unwrap_or_default();
}

/// Counts `on_lost` notifications.
fn count_losses(lease: &impl Lease) -> (Arc<AtomicUsize>, LostSubscription) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    let sub = lease.on_lost(move |_| {
        c.fetch_add(1, Ordering::SeqCst);
    });
    (count, sub)
}

/// Situation 2. A lease whose `acquire_within` answers `Ok(true)`, but the thread is held past
/// the deadline before the caller sees the answer (a pause, a blocking actor on the arbiter).
struct HeldPastTheDeadline {
    inner: InMemoryLease,
    armed: AtomicBool,
    late_token: Mutex<Option<FencingToken>>,
}

impl Lease for HeldPastTheDeadline {
    fn settings(&self) -> &LeaseSettings {
        self.inner.settings()
    }
    fn acquire(&self) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        self.inner.acquire()
    }
    async fn acquire_within(&self, timeout: Duration) -> Result<bool, LeaseError> {
        let result = self.inner.acquire_within(timeout).await;
        if matches!(result, Ok(true)) && self.armed.swap(false, Ordering::SeqCst) {
            *self.late_token.lock().unwrap() = self.inner.fencing_token();
            hold_the_thread(TTL);
            assert!(!self.inner.check_alive());
        }
        result
    }
    fn release(&self) -> impl std::future::Future<Output = Result<bool, LeaseError>> + Send {
        self.inner.release()
    }
    fn tenure(&self) -> &TenureWatch {
        self.inner.tenure()
    }
    fn on_lost(&self, handler: impl Fn(&LeaseLost) + Send + Sync + 'static) -> LostSubscription {
        self.inner.on_lost(handler)
    }
}

#[test]
fn a_singleton_never_starts_on_a_tenure_that_ended_before_the_manager_saw_it() {
    run_paused(async {
        let store = InMemoryStore::new();
        let lease = Arc::new(HeldPastTheDeadline {
            inner: store.lease(settings("a")),
            armed: AtomicBool::new(true),
            late_token: Mutex::new(None),
        });
        let life = Life::default();
        // The factory asserts that the guard it gets is alive.
        let manager = recorded_manager(Arc::clone(&lease), 0, &life);
        wait_for_state(&manager, SingletonState::Running, TTL * 3).await;
        let late = lease
            .late_token
            .lock()
            .unwrap()
            .expect("the first answer came late");
        assert_eq!(assert_one_at_a_time(&life), 1, "{:?}", life.borrow());
        let started = life.borrow()[0].3;
        assert!(
            started > late,
            "the singleton runs under a later tenure ({started}), never the one that ended ({late})"
        );
        let status = manager.send(GetStatus).await.unwrap();
        assert_eq!(status.fencing_token, Some(started));
    });
}

/// Situation 3: an `acquire` dropped at its first await (a caller's timeout) while the previous
/// tenure is past its deadline must still report that loss, exactly once.
#[tokio::test(start_paused = true)]
async fn a_cancelled_acquire_still_reports_the_loss_of_the_previous_tenure() {
    let store = InMemoryStore::new();
    let a = store.lease(settings("a"));
    let (losses, _sub) = count_losses(&a);
    assert!(a.acquire().await.unwrap());
    let token = a.fencing_token().unwrap();
    let guard = a.tenure().guard().unwrap();
    store.pause("a");
    // The thread is held past the deadline: the renewal task has not run since.
    hold_the_thread(a.deadline().unwrap() - Instant::now());
    assert!(!a.check_alive());
    assert_eq!(losses.load(Ordering::SeqCst), 0, "not reported yet");
    // Polled once, then dropped (as a caller's timeout or an aborted round does).
    let cancelled = a.acquire().now_or_never();
    assert!(cancelled.is_none(), "dropped at its first await");
    assert_eq!(losses.load(Ordering::SeqCst), 1, "the loss was reported");
    assert_eq!(a.fencing_token(), None);
    assert_eq!(a.tenure().current(), None);
    assert_eq!(
        guard.end(),
        Some(TenureEnd::Lost(LostReason::Expired { last_error: None }))
    );
    store.heal("a");
    sleep(TTL * 2).await;
    assert_eq!(losses.load(Ordering::SeqCst), 1, "exactly once");
    assert!(a.acquire().await.unwrap(), "usable again");
    assert!(a.fencing_token().unwrap() > token);
}

/// A singleton that ticks on a timer and acts on every tick *without* checking its guard.
struct Ticker {
    node: usize,
    token: FencingToken,
    steps: Arc<Mutex<Vec<(std::time::Instant, usize, FencingToken)>>>,
}

impl Actor for Ticker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(Duration::from_millis(5), |act, _| {
            act.steps
                .lock()
                .unwrap()
                .push((std::time::Instant::now(), act.node, act.token));
        });
    }
}

/// Situation 4, in one process: the holder's thread is held (a blocking call) past its TTL, the
/// other node takes over and acts; when the thread runs again, the old singleton's timers that fell
/// due meanwhile must not run. The manager spawns the guard's watcher as the first item of the
/// singleton's context, so the singleton is stopped before its timers run. Real time: a thread
/// must really be held.
#[test]
fn a_resumed_holders_timers_never_run_after_the_next_holder_acted() {
    actix_rt::System::new().block_on(async {
        let ttl = Duration::from_millis(600);
        let store = InMemoryStore::new();
        let steps = Arc::new(Mutex::new(Vec::new()));
        let arbiters = [actix_rt::Arbiter::new(), actix_rt::Arbiter::new()];
        let start_node = |node: usize| {
            let lease = Arc::new(
                store.lease(
                    LeaseSettings::builder(LEASE, format!("node-{node}"))
                        .ttl(ttl)
                        .build()
                        .unwrap(),
                ),
            );
            let steps = Arc::clone(&steps);
            ClusterSingletonManager::start_in_arbiter(&arbiters[node].handle(), move |_| {
                ClusterSingletonManager::from_arc(lease, move |info: &SingletonInfo, _| Ticker {
                    node,
                    token: info.fencing_token,
                    steps: Arc::clone(&steps),
                })
            })
        };
        let steps_of = |node: usize| -> Vec<std::time::Instant> {
            let steps = steps.lock().unwrap();
            steps.iter().filter(|s| s.1 == node).map(|s| s.0).collect()
        };
        let a = start_node(0);
        common::actors::wait_until(ttl * 5, || !steps_of(0).is_empty()).await;
        let b = start_node(1);
        wait_for_state(&b, SingletonState::Acquiring, ttl).await;
        // Hold node 0's thread for three TTLs.
        let (resumed_tx, resumed_rx) = tokio::sync::oneshot::channel();
        arbiters[0].spawn_fn(move || {
            std::thread::sleep(ttl * 3);
            let _ = resumed_tx.send(());
        });
        common::actors::wait_until(ttl * 5, || !steps_of(1).is_empty()).await;
        resumed_rx.await.unwrap();
        // Node 0's runtime runs again: its manager notices the end of the tenure.
        wait_for_state(&a, SingletonState::Acquiring, ttl).await;
        // An absence check, bounded: node 0 must take no step from now on either.
        sleep(Duration::from_millis(100)).await;
        let first_of_b = steps_of(1)[0];
        let late: Vec<_> = steps_of(0)
            .into_iter()
            .filter(|t| *t >= first_of_b)
            .collect();
        assert!(
            late.is_empty(),
            "node 0 stepped {} times after node 1's first step",
            late.len()
        );
        let status = a.send(GetStatus).await.unwrap();
        assert_eq!(status.started, 1);
        for arbiter in arbiters {
            arbiter.stop();
        }
    });
}

/// A singleton that refuses to stop (`stopping` answers `Running::Continue`).
struct Stubborn {
    stops_refused: Arc<AtomicUsize>,
    stopped: Arc<AtomicBool>,
}

impl Actor for Stubborn {
    type Context = Context<Self>;

    fn stopping(&mut self, _: &mut Self::Context) -> Running {
        self.stops_refused.fetch_add(1, Ordering::SeqCst);
        Running::Continue
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

type StubbornManager = Addr<ClusterSingletonManager<Stubborn, InMemoryLease>>;

fn stubborn_manager(
    lease: InMemoryLease,
    stop_timeout: Duration,
) -> (StubbornManager, Arc<AtomicUsize>, Arc<AtomicBool>) {
    let refused = Arc::new(AtomicUsize::new(0));
    let stopped = Arc::new(AtomicBool::new(false));
    let (r, s) = (Arc::clone(&refused), Arc::clone(&stopped));
    let manager = ClusterSingletonManager::new(lease, move |_, _| Stubborn {
        stops_refused: Arc::clone(&r),
        stopped: Arc::clone(&s),
    })
    .settings(SingletonSettings {
        stop_timeout,
        ..Default::default()
    })
    .start();
    (manager, refused, stopped)
}

/// Situation 5: a singleton that does not stop does not wedge its manager. On `Shutdown` the
/// manager waits `stop_timeout`, terminates it, releases anyway and answers; on a lost tenure it
/// competes again after `stop_timeout`.
#[test]
fn a_singleton_that_does_not_stop_cannot_wedge_its_manager() {
    run_paused(async {
        let store = InMemoryStore::new();
        let stop_timeout = Duration::from_secs(2);
        let (manager, refused, stopped) =
            stubborn_manager(store.lease(settings("a")), stop_timeout);
        wait_for_state(&manager, SingletonState::Running, TTL).await;
        let asked = Instant::now();
        let answer = tokio::time::timeout(TTL, manager.send(Shutdown))
            .await
            .expect("Shutdown answers")
            .unwrap();
        assert!(answer.unwrap(), "released");
        assert_eq!(asked.elapsed(), stop_timeout, "after the stop timeout");
        assert!(refused.load(Ordering::SeqCst) >= 1, "it refused to stop");
        assert!(stopped.load(Ordering::SeqCst), "then it was terminated");
        assert_eq!(store.holder(LEASE), None, "released anyway");

        // A lost tenure: the manager competes again once the stop timeout passed.
        let (manager, refused, _) = stubborn_manager(store.lease(settings("b")), stop_timeout);
        wait_for_state(&manager, SingletonState::Running, TTL).await;
        store.partition("b");
        wait_for_state(&manager, SingletonState::Stopping, TTL).await;
        let stopping_since = Instant::now();
        wait_for_state(&manager, SingletonState::Acquiring, TTL).await;
        assert!(stopping_since.elapsed() >= stop_timeout - Duration::from_millis(10));
        assert!(refused.load(Ordering::SeqCst) >= 1);
        let status = manager.send(GetStatus).await.unwrap();
        assert_eq!(status.unstopped, 1, "{status:?}");
        store.heal("b");
        wait_for_state(&manager, SingletonState::Running, TTL * 3).await;
        assert_eq!(manager.send(GetStatus).await.unwrap().started, 2);
    });
}

/// Situation 6: two `Shutdown`s while a release started by `SetEligible(false)` is in flight
/// both get the release's answer (this used to panic), and so does a later one.
#[test]
fn shutdowns_during_an_eligibility_release_all_get_the_answer() {
    run_paused(async {
        let store = InMemoryStore::new();
        let life = Life::default();
        let manager = recorded_manager(Arc::new(store.lease(settings("a"))), 0, &life);
        wait_for_state(&manager, SingletonState::Running, TTL).await;
        store.set_owner_fault("a", Some(InMemoryFault::Delay(Duration::from_secs(1))));
        manager.do_send(SetEligible(false));
        wait_for_state(&manager, SingletonState::Releasing, TTL).await;
        let first = manager.send(Shutdown);
        let second = manager.send(Shutdown);
        assert!(first.await.unwrap().unwrap());
        assert!(second.await.unwrap().unwrap());
        assert_eq!(store.holder(LEASE), None);
        assert_eq!(assert_one_at_a_time(&life), 1);
    });
}

/// Situation 7, first attempt of a round: `Shutdown` arrives while the claim is in flight (the
/// store applied it, the answer is slow). The round is not cut short: the attempt finishes, what
/// it got is released, and only then does `Shutdown` answer; the next node gets the lease at once.
#[test]
fn shutdown_during_an_attempt_in_flight_releases_what_it_got() {
    run_paused(async {
        let store = InMemoryStore::new();
        store.set_owner_fault("a", Some(InMemoryFault::SlowAnswer(Duration::from_secs(1))));
        let life = Life::default();
        let manager = recorded_manager(Arc::new(store.lease(settings("a"))), 0, &life);
        sleep(Duration::from_millis(100)).await;
        shutdown_with_the_claim_in_flight(&store, &manager).await;
        assert!(life.borrow().is_empty(), "no singleton ran");
    });
}

/// `a`'s claim landed and its answer is on the way: `Shutdown` must answer `Ok(true)` only once
/// the claim is really released, and the lease is then free for the next node at once.
async fn shutdown_with_the_claim_in_flight(
    store: &InMemoryStore,
    manager: &Addr<ClusterSingletonManager<common::actors::Recorder, InMemoryLease>>,
) {
    assert_eq!(
        store.holder(LEASE).as_deref(),
        Some("a"),
        "the claim landed"
    );
    let released = manager.send(Shutdown).await.unwrap();
    assert!(released.unwrap(), "released");
    assert_eq!(store.holder(LEASE), None, "Shutdown answered the truth");
    let b = store.lease(settings("b"));
    assert!(
        b.acquire_within(Duration::ZERO).await.unwrap(),
        "free at once"
    );
}

/// Situation 7, an attempt inside a round's wait (the lease was released elsewhere and the waiting
/// node's claim is in flight): same truth.
#[test]
fn shutdown_during_a_waiting_rounds_attempt_releases_what_it_got() {
    run_paused(async {
        let store = InMemoryStore::new();
        let holder = store.lease(settings("holder"));
        assert!(holder.acquire().await.unwrap());
        let life = Life::default();
        let manager = recorded_manager(Arc::new(store.lease(settings("a"))), 0, &life);
        wait_for_state(&manager, SingletonState::Acquiring, TTL).await;
        sleep(Duration::from_millis(100)).await;
        store.set_owner_fault("a", Some(InMemoryFault::SlowAnswer(Duration::from_secs(1))));
        assert!(holder.release().await.unwrap());
        sleep(Duration::from_millis(100)).await;
        shutdown_with_the_claim_in_flight(&store, &manager).await;
    });
}

/// Situation 9: on a backend that does not answer, `acquire` gives up after one operation
/// timeout with an error that says so, and `acquire_within(T)` returns by `T` + one operation
/// timeout.
#[tokio::test(start_paused = true)]
async fn a_hung_backend_costs_one_operation_timeout() {
    let store = InMemoryStore::new();
    let a = store.lease(settings("a"));
    let timeout = a.settings().operation_timeout();
    store.pause("a");
    let calls = store.stats().calls;
    let start = Instant::now();
    let error = a.acquire().await.unwrap_err();
    assert_eq!(start.elapsed(), timeout, "one operation timeout");
    assert_eq!(store.stats().calls - calls, 1, "one call, not retried");
    assert!(matches!(
        error,
        LeaseError::Timeout {
            operation: Operation::Acquire,
            timeout: t
        } if t == timeout
    ));
    assert_eq!(
        error.to_string(),
        format!("acquire timed out after {timeout:?}")
    );

    let within = Duration::from_secs(5);
    let start = Instant::now();
    let error = a.acquire_within(within).await.unwrap_err();
    assert!(matches!(error, LeaseError::Timeout { .. }), "{error}");
    assert!(start.elapsed() >= within);
    assert!(
        start.elapsed() <= within + timeout,
        "{:?} > {within:?} + {timeout:?}",
        start.elapsed()
    );
    // A backend that answers with an error is retried within `acquire`, like another holder.
    store.partition("a");
    let calls = store.stats().calls;
    assert!(a.acquire().await.is_err());
    assert_eq!(
        store.stats().calls - calls,
        u64::from(a.settings().acquire_retries()) + 1
    );
}

/// Two instances with one store, name and owner would both believe they hold the lease (the store
/// cannot tell them apart): the second is refused while the first holds it.
#[tokio::test(start_paused = true)]
async fn a_second_instance_of_the_same_lease_is_refused() {
    let store = InMemoryStore::new();
    let first = store.lease(settings("a"));
    let second = store.lease(settings("a"));
    assert!(first.acquire().await.unwrap());
    let error = second.acquire().await.unwrap_err();
    assert!(
        matches!(&error, LeaseError::DuplicateInstance { name, owner } if name == LEASE && owner == "a"),
        "{error}"
    );
    assert!(!error.is_transient());
    assert!(!second.check_alive());
    assert!(first.check_alive(), "the first keeps its tenure");
    assert!(first.release().await.unwrap());
    assert!(second.acquire().await.unwrap(), "free for it once released");
    assert!(matches!(
        first.acquire().await,
        Err(LeaseError::DuplicateInstance { .. })
    ));
    // Another store, or another owner, is another lease.
    let other_store = InMemoryStore::new();
    assert!(other_store.lease(settings("a")).acquire().await.unwrap());
    drop(second);
    assert!(first.acquire().await.unwrap(), "the holder was dropped");
}

/// An `acquire` whose caller gave up while the claim was in flight does not leave the claim
/// behind: it is finished and released in the background; a failure to release it is reported by
/// every `release` until the claim has surely expired.
#[tokio::test(start_paused = true)]
async fn an_abandoned_acquire_releases_its_claim() {
    let store = InMemoryStore::new();
    let a = store.lease(settings("a"));
    store.set_owner_fault("a", Some(InMemoryFault::SlowAnswer(Duration::from_secs(1))));
    let gave_up = tokio::time::timeout(Duration::from_millis(100), a.acquire()).await;
    assert!(gave_up.is_err());
    assert_eq!(
        store.holder(LEASE).as_deref(),
        Some("a"),
        "the claim landed"
    );
    assert!(!a.check_alive(), "nobody acts on it");
    // The background release (slow too) serialises with the next call.
    assert!(a.release().await.unwrap());
    assert_eq!(store.holder(LEASE), None, "released");

    // This time releasing the abandoned claim fails: the next releases say so, as long as the
    // claim may be held.
    let gave_up = tokio::time::timeout(Duration::from_millis(100), a.acquire()).await;
    assert!(gave_up.is_err());
    store.set_owner_fault("a", Some(InMemoryFault::Unavailable));
    sleep(Duration::from_secs(2)).await;
    let failed_at = Instant::now();
    for _ in 0..2 {
        let error = a.release().await.unwrap_err();
        assert!(
            matches!(
                error,
                LeaseError::Backend {
                    operation: Operation::Release,
                    ..
                }
            ),
            "{error}"
        );
    }
    assert_eq!(store.holder(LEASE).as_deref(), Some("a"), "still held");
    let settings = settings("a");
    sleep_until(failed_at + settings.ttl() + settings.clock_drift_margin()).await;
    assert_eq!(store.holder(LEASE), None, "expired");
    assert!(
        a.release().await.unwrap(),
        "nothing of a's is held any more"
    );
}

/// A `release` that fails (outcome unknown) must not let the next `release` claim success while
/// the record is still held: while the store stays unreachable it answers the same error until
/// the record has surely expired (TTL plus the drift margin after the failure), then `Ok(true)`.
/// Once the store answers again, the lease releases the claim itself (no TTL wait) and the next
/// `release` says so. An `acquire` that reaches the store meanwhile supersedes it.
#[tokio::test(start_paused = true)]
async fn a_failed_release_is_not_followed_by_a_false_success() {
    let store = InMemoryStore::new();
    let a = store.lease(settings("a"));
    let b = store.lease(
        settings("b")
            .to_builder()
            .acquire_retries(0)
            .build()
            .unwrap(),
    );
    assert!(a.acquire().await.unwrap());
    store.set_owner_fault("a", Some(InMemoryFault::Unavailable));
    let error = a.release().await.unwrap_err();
    let failed_at = Instant::now();
    assert!(
        matches!(
            error,
            LeaseError::Backend {
                operation: Operation::Release,
                ..
            }
        ),
        "{error}"
    );
    assert!(!a.check_alive(), "the tenure ended at the call");
    assert_eq!(
        store.holder(LEASE).as_deref(),
        Some("a"),
        "the record stays"
    );
    // The store stays unreachable for `a`: until the record expires, every release reports the
    // failure, and the record keeps others out.
    sleep_until(failed_at + TTL - Duration::from_millis(1)).await;
    let again = a.release().await.unwrap_err();
    assert_eq!(format!("{again:?}"), format!("{error:?}"), "the same error");
    assert!(!b.acquire().await.unwrap(), "held indeed, b is kept out");
    // The store's TTL ran out, but a store whose clock runs faster may still hold it: the drift
    // margin is waited out too.
    let until = failed_at + TTL + settings("a").clock_drift_margin();
    sleep_until(until - Duration::from_millis(1)).await;
    assert_eq!(store.holder(LEASE), None, "expired by its TTL");
    assert!(a.release().await.is_err(), "within the drift margin");
    sleep_until(until).await;
    assert!(a.release().await.unwrap());
    assert!(b.acquire().await.unwrap());
    assert!(b.release().await.unwrap());
    store.set_owner_fault("a", None);

    // This time the store answers again soon: the lease releases the claim itself, long before
    // its TTL, and the next release says so; the next owner gets it at once.
    assert!(a.acquire().await.unwrap());
    store.set_owner_fault("a", Some(InMemoryFault::Unavailable));
    assert!(a.release().await.is_err());
    let failed_at = Instant::now();
    sleep(Duration::from_millis(500)).await;
    store.set_owner_fault("a", None);
    let healed = Instant::now();
    while store.holder(LEASE).is_some() {
        assert!(
            Instant::now() < healed + settings("a").renewal_interval(),
            "not released within a renewal interval of the store answering again"
        );
        sleep(Duration::from_millis(10)).await;
    }
    assert!(Instant::now() < failed_at + TTL, "before its TTL");
    assert!(a.release().await.unwrap(), "released, and it says so");
    assert!(b.acquire().await.unwrap(), "at once");
    assert!(b.release().await.unwrap());

    // An acquire that reached the store answers for the record: the failure is forgotten.
    assert!(a.acquire().await.unwrap());
    store.set_owner_fault("a", Some(InMemoryFault::Unavailable));
    assert!(a.release().await.is_err());
    store.set_owner_fault("a", None);
    assert!(a.acquire().await.unwrap(), "its own record, reused");
    assert!(a.release().await.unwrap());
    assert_eq!(store.holder(LEASE), None);
    assert!(a.release().await.unwrap());
}

/// A `release` whose caller gives up while the backend call is in flight still releases: the
/// tenure ended at the call, and the backend is told in the background.
#[tokio::test(start_paused = true)]
async fn an_abandoned_release_still_releases() {
    let store = InMemoryStore::new();
    let a = store.lease(settings("a"));
    let guard = {
        assert!(a.acquire().await.unwrap());
        a.tenure().guard().unwrap()
    };
    // The release reaches the store only after a second (a cut-off call would never land).
    store.set_owner_fault("a", Some(InMemoryFault::Delay(Duration::from_secs(1))));
    let gave_up = tokio::time::timeout(Duration::from_millis(100), a.release()).await;
    assert!(gave_up.is_err());
    assert!(!a.check_alive(), "ended at the call");
    assert_eq!(guard.end(), Some(TenureEnd::Released));
    assert_eq!(store.holder(LEASE).as_deref(), Some("a"), "not applied yet");
    sleep(Duration::from_secs(2)).await;
    assert_eq!(store.holder(LEASE), None, "the backend was told");
}

/// A singleton that blocks its thread, started on an arbiter of its own with
/// `ClusterSingletonManager::on_arbiter`, does not delay its manager or the lease's renewals.
#[test]
fn a_blocking_singleton_on_its_own_arbiter_does_not_delay_its_manager() {
    struct Blocker {
        thread: Arc<Mutex<Option<std::thread::ThreadId>>>,
        block: Duration,
    }
    impl Actor for Blocker {
        type Context = Context<Self>;
        fn started(&mut self, ctx: &mut Self::Context) {
            *self.thread.lock().unwrap() = Some(std::thread::current().id());
            let block = self.block;
            ctx.run_later(Duration::ZERO, move |_, _| std::thread::sleep(block));
        }
    }
    actix_rt::System::new().block_on(async {
        let ttl = Duration::from_millis(600);
        let store = InMemoryStore::new();
        let lease =
            Arc::new(store.lease(LeaseSettings::builder(LEASE, "a").ttl(ttl).build().unwrap()));
        let arbiter = actix_rt::Arbiter::new();
        let thread = Arc::new(Mutex::new(None));
        let manager = {
            let thread = Arc::clone(&thread);
            ClusterSingletonManager::on_arbiter(
                Arc::clone(&lease),
                arbiter.handle(),
                move |_, _| Blocker {
                    thread: Arc::clone(&thread),
                    block: ttl * 4,
                },
            )
            .start()
        };
        wait_for_state(&manager, SingletonState::Running, ttl * 3).await;
        common::actors::wait_until(ttl, || thread.lock().unwrap().is_some()).await;
        assert_ne!(
            *thread.lock().unwrap(),
            Some(std::thread::current().id()),
            "the singleton runs on its own thread"
        );
        let token = lease.fencing_token().unwrap();
        // The singleton's thread is blocked for four TTLs: the manager answers and the lease is
        // renewed meanwhile.
        let blocked_until = Instant::now() + ttl * 3;
        while Instant::now() < blocked_until {
            assert_eq!(
                manager.send(GetStatus).await.unwrap().state,
                SingletonState::Running
            );
            assert!(lease.check_alive(), "renewed while the singleton blocks");
            sleep(ttl / 4).await;
        }
        assert_eq!(lease.fencing_token(), Some(token), "one tenure throughout");
        assert!(manager.send(Shutdown).await.unwrap().unwrap());
        arbiter.stop();
    });
}

/// A lease dropped after its deadline passed, before its renewal task noticed (the thread was
/// held), reports the loss: its tenure ended at the deadline, an involuntary end, so `on_lost`
/// fires once, with `Expired` and the tenure's token, as a `release` at that moment would. A
/// lease dropped while its tenure is alive reports nothing. (The property check of
/// `tests/model.rs` found the first case: a drop at the very millisecond of the deadline.)
#[test]
fn a_lease_dropped_after_its_deadline_reports_the_loss() {
    run_paused(async {
        for past_deadline in [true, false] {
            let store = InMemoryStore::new();
            let lease = store.lease(settings("a"));
            let lost = Arc::new(Mutex::new(Vec::<LeaseLost>::new()));
            let _subscription = lease.on_lost({
                let lost = Arc::clone(&lost);
                move |l: &LeaseLost| lost.lock().unwrap().push(l.clone())
            });
            assert!(lease.acquire().await.unwrap());
            let token = lease.fencing_token();
            hold_the_thread(if past_deadline { TTL } else { TTL / 2 });
            assert_eq!(lease.check_alive(), !past_deadline);
            drop(lease);
            // Whatever is left of the renewal task runs now (it was aborted by the drop).
            sleep(Duration::from_millis(10)).await;
            let lost = lost.lock().unwrap().clone();
            if past_deadline {
                assert_eq!(lost.len(), 1, "{lost:?}");
                assert!(
                    matches!(lost[0].reason, LostReason::Expired { .. }),
                    "{lost:?}"
                );
                assert_eq!(lost[0].fencing_token, token);
            } else {
                assert!(lost.is_empty(), "a drop is not a loss: {lost:?}");
            }
        }
    });
}

/// Issue 27 item 7: `TenureWatch::stream` ends once its lease is dropped: after the end of the
/// tenure alive then (`None`), or at once when nothing was held.
#[tokio::test(start_paused = true)]
async fn a_tenure_stream_ends_once_its_lease_is_dropped() {
    use futures_util::StreamExt;

    let store = InMemoryStore::new();
    let idle = store.lease(settings("idle"));
    let mut stream = idle.tenure().stream();
    assert_eq!(stream.next().await, Some(None), "nothing held");
    drop(idle);
    assert_eq!(
        tokio::time::timeout(TTL, stream.next()).await,
        Ok(None),
        "ended with its lease"
    );

    let a = store.lease(settings("a"));
    assert!(a.acquire().await.unwrap());
    let mut stream = a.tenure().stream();
    let held = stream.next().await.unwrap().expect("alive");
    assert_eq!(Some(held.token()), a.fencing_token());
    drop(a);
    assert_eq!(
        tokio::time::timeout(TTL, stream.next()).await,
        Ok(Some(None)),
        "the end of the tenure"
    );
    assert_eq!(
        tokio::time::timeout(TTL, stream.next()).await,
        Ok(None),
        "then the end of the stream"
    );
}

/// Follows a tenure with `ctx.add_stream`, recording what it sees and telling when the stream
/// finished.
struct TenureFollower {
    seen: Arc<Mutex<Vec<Option<FencingToken>>>>,
    finished: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Actor for TenureFollower {
    type Context = Context<Self>;
}

impl StreamHandler<Option<actix_coordination::Tenure>> for TenureFollower {
    fn handle(&mut self, tenure: Option<actix_coordination::Tenure>, _: &mut Self::Context) {
        self.seen.lock().unwrap().push(tenure.map(|t| t.token()));
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        if let Some(finished) = self.finished.take() {
            let _ = finished.send(());
        }
        ctx.stop();
    }
}

/// Issue 27 item 7, as an actor sees it: an actor that added the tenure stream with
/// `ctx.add_stream` gets `finished()` once the lease is dropped, after the end of the tenure.
#[test]
fn an_actor_following_a_tenure_stream_is_told_it_finished_when_the_lease_is_dropped() {
    run_paused(async {
        let store = InMemoryStore::new();
        let a = store.lease(settings("a"));
        assert!(a.acquire().await.unwrap());
        let token = a.fencing_token().expect("held");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (finished_tx, finished) = tokio::sync::oneshot::channel();
        let stream = a.tenure().stream();
        let follower = TenureFollower::create({
            let seen = Arc::clone(&seen);
            move |ctx| {
                ctx.add_stream(stream);
                TenureFollower {
                    seen,
                    finished: Some(finished_tx),
                }
            }
        });
        sleep(Duration::from_millis(10)).await;
        assert_eq!(*seen.lock().unwrap(), vec![Some(token)]);
        drop(a);
        tokio::time::timeout(TTL, finished)
            .await
            .expect("finished() within a TTL")
            .expect("told");
        assert_eq!(*seen.lock().unwrap(), vec![Some(token), None]);
        drop(follower);
    });
}
