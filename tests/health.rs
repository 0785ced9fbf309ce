//! [`HealthCheck`]: liveness fails exactly when this process acts as a holder that nothing looks
//! after (a blocked runtime past the deadline, a renewal task that died, a singleton that does not
//! stop), and readiness follows the singleton manager's eligibility.
//!
//! The blocked-runtime and lingering-singleton cases are about threads that do not run, which a
//! paused clock cannot show: they use the real clock, short TTLs and deadlines.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    AcquireAttempt, ClusterSingletonManager, GetStatus, HealthCheck, InMemoryBackend,
    InMemoryError, InMemoryStore, InMemoryTenure, Lease, LeaseBackend, LeaseSettings, LostReason,
    ManagedLease, NotReady, ReleaseOutcome, RenewOutcome, SetEligible, SingletonInfo,
    SingletonSettings, SingletonState, TransferLeadership, Unhealthy,
};
use tokio::time::{sleep, Instant};

use common::actors::wait_for_state;

/// Polls `check` every 5 ms until `condition` holds on it, for at most `within`.
async fn wait_for<T: std::fmt::Debug>(
    within: Duration,
    mut probe: impl FnMut() -> T,
    condition: impl Fn(&T) -> bool,
) -> T {
    let give_up = Instant::now() + within;
    loop {
        let value = probe();
        if condition(&value) {
            return value;
        }
        assert!(Instant::now() < give_up, "still {value:?} after {within:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn liveness_fails_while_a_blocked_runtime_holds_a_tenure_past_its_deadline() {
    let store = InMemoryStore::new();
    let settings = LeaseSettings::builder("blocked", "a")
        .ttl(Duration::from_millis(600))
        .renewal_interval(Duration::from_millis(200))
        .build()
        .unwrap();
    let lease = Arc::new(store.lease(settings));
    let check = HealthCheck::with_tolerance(Duration::from_millis(200));
    check.add_lease(&lease);

    // The lease lives on a runtime of its own thread, which then blocks (a handler that calls
    // blocking code on the arbiter, say) for well past the deadline.
    let (acquired_tx, acquired_rx) = std::sync::mpsc::channel();
    let release_block = Arc::new(AtomicBool::new(false));
    let thread = std::thread::spawn({
        let lease = Arc::clone(&lease);
        let release_block = Arc::clone(&release_block);
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                assert!(lease.acquire().await.unwrap());
                acquired_tx.send(()).unwrap();
                while !release_block.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                // Unblocked: the renewal task runs, sees the deadline passed, ends the tenure.
                sleep(Duration::from_millis(50)).await;
            });
        }
    });
    acquired_rx.recv().unwrap();
    assert_eq!(check.liveness(), Ok(()));
    let error = wait_for(Duration::from_secs(5), || check.liveness(), Result::is_err)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Unhealthy::RenewalOverdue { lease, overdue } if lease == "blocked" && *overdue > Duration::from_millis(200)),
        "{error}"
    );
    // The holder itself already knows: check_alive is false past the deadline.
    assert!(!lease.check_alive());
    release_block.store(true, Ordering::SeqCst);
    thread.join().unwrap();
    assert_eq!(check.liveness(), Ok(()), "the tenure has ended (lost)");
    assert!(!check.leases()[0].held);
}

/// The in-memory backend, except that a renewal panics.
struct PanickingRenewal(InMemoryBackend);

impl LeaseBackend for PanickingRenewal {
    type Tenure = InMemoryTenure;
    type Error = InMemoryError;

    async fn try_acquire(
        &self,
        settings: &LeaseSettings,
    ) -> Result<AcquireAttempt<InMemoryTenure>, InMemoryError> {
        self.0.try_acquire(settings).await
    }

    async fn renew(
        &self,
        _: &LeaseSettings,
        _: &mut InMemoryTenure,
    ) -> Result<RenewOutcome, InMemoryError> {
        panic!("a bug in the backend's renewal");
    }

    async fn release(
        &self,
        settings: &LeaseSettings,
        tenure: InMemoryTenure,
    ) -> Result<ReleaseOutcome, InMemoryError> {
        self.0.release(settings, tenure).await
    }
}

/// A renewal task that dies (here: the backend panics in it) ends its tenure as it goes: the
/// loss is reported at once, 29 s before the deadline, and nothing is left published that nobody
/// looks after, so liveness stays healthy and the lease can be acquired again.
#[tokio::test(start_paused = true)]
async fn a_renewal_task_that_dies_ends_its_tenure_as_lost_at_once() {
    let store = InMemoryStore::new();
    let settings = LeaseSettings::builder("panics", "a")
        .ttl(Duration::from_secs(30))
        .renewal_interval(Duration::from_secs(1))
        .build()
        .unwrap();
    let lease = Arc::new(ManagedLease::from_backend(
        settings,
        PanickingRenewal(InMemoryBackend::new(&store)),
    ));
    let check = HealthCheck::new();
    check.add_lease(&lease);
    let losses = Arc::new(std::sync::Mutex::new(Vec::new()));
    let _subscription = lease.on_lost({
        let losses = Arc::clone(&losses);
        move |lost| losses.lock().unwrap().push(lost.reason.clone())
    });
    assert!(lease.acquire().await.unwrap());
    assert_eq!(check.liveness(), Ok(()));
    // The first renewal panics, 29 s before the deadline.
    sleep(Duration::from_millis(1001)).await;
    assert!(
        !lease.check_alive(),
        "the tenure ended with its renewal task"
    );
    assert_eq!(*losses.lock().unwrap(), vec![LostReason::RenewalStopped]);
    assert_eq!(
        check.liveness(),
        Ok(()),
        "nothing published is left unattended"
    );
    assert!(lease.acquire().await.unwrap(), "usable again");
}

/// A singleton whose `stopping` blocks its thread for `block` (on its own arbiter).
struct Stuck {
    block: Duration,
    gone: Arc<AtomicBool>,
}

impl Actor for Stuck {
    type Context = Context<Self>;

    fn stopping(&mut self, _: &mut Self::Context) -> Running {
        std::thread::sleep(self.block);
        Running::Stop
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.gone.store(true, Ordering::SeqCst);
    }
}

#[actix_rt::test]
async fn liveness_fails_while_a_singleton_does_not_stop_and_readiness_follows_eligibility() {
    let store = InMemoryStore::new();
    let lease = Arc::new(store.lease(LeaseSettings::new("stuck", "a").unwrap()));
    let check = HealthCheck::with_tolerance(Duration::from_millis(100));
    let gone = Arc::new(AtomicBool::new(false));
    let arbiter = actix_rt::Arbiter::new();
    let manager = ClusterSingletonManager::on_arbiter(Arc::clone(&lease), arbiter.handle(), {
        let gone = Arc::clone(&gone);
        move |_: &SingletonInfo, _| Stuck {
            block: Duration::from_secs(2),
            gone: Arc::clone(&gone),
        }
    })
    .settings(SingletonSettings {
        stop_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .health(&check)
    .start();
    wait_for_state(&manager, SingletonState::Running, Duration::from_secs(5)).await;
    assert_eq!(check.liveness(), Ok(()));
    assert_eq!(check.readiness(), Ok(()));
    let reports = check.leases();
    assert_eq!(reports.len(), 1, "the manager's lease is listed");
    assert!(reports[0].held);

    // Ineligible: not ready at once; the singleton is told to stop and blocks its thread.
    let told = Instant::now();
    manager.send(SetEligible(false)).await.unwrap();
    assert_eq!(
        check.readiness(),
        Err(NotReady::NotEligible {
            lease: "stuck".into()
        })
    );
    let error = wait_for(Duration::from_secs(5), || check.liveness(), Result::is_err)
        .await
        .unwrap_err();
    assert!(
        told.elapsed() >= Duration::from_millis(300),
        "not before the stop timeout"
    );
    assert!(
        matches!(&error, Unhealthy::SingletonNotStopped { lease, .. } if lease == "stuck"),
        "{error}"
    );
    assert!(!gone.load(Ordering::SeqCst));
    // Once its thread is free it is gone, and the process is live again.
    let _ = wait_for(Duration::from_secs(5), || check.liveness(), Result::is_ok).await;
    assert!(gone.load(Ordering::SeqCst));
    assert!(told.elapsed() >= Duration::from_secs(2));
    // Eligible again: ready, and it leads again.
    manager.send(SetEligible(true)).await.unwrap();
    assert_eq!(check.readiness(), Ok(()));
    wait_for_state(&manager, SingletonState::Running, Duration::from_secs(5)).await;
    // Shutting down: not ready at once (the singleton blocks its thread in `stopping`, so the
    // manager is still waiting for it when it answers the status).
    manager.do_send(actix_coordination::Shutdown);
    let status = manager.send(actix_coordination::GetStatus).await.unwrap();
    assert_eq!(status.state, SingletonState::Stopping);
    assert_eq!(
        check.readiness(),
        Err(NotReady::ShuttingDown {
            lease: "stuck".into()
        })
    );
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        manager.send(actix_coordination::Shutdown),
    )
    .await
    .unwrap();
    assert!(answer.unwrap().unwrap());
    // Shut down and gone: it leaves the check (nothing registered is left).
    common::actors::wait_until(Duration::from_secs(5), || {
        check.readiness().is_ok() && check.leases().is_empty()
    })
    .await;
    arbiter.stop();
}

/// A singleton that refuses to stop when asked (its `stopping` says `Continue`).
struct Stubborn;

impl Actor for Stubborn {
    type Context = Context<Self>;

    fn stopping(&mut self, _: &mut Self::Context) -> Running {
        Running::Continue
    }
}

/// Issue 27 item 8: a manager replaced on a configuration reload (the old one shut down, a new
/// one registered with the same check) leaves readiness to its replacement: a manager that is
/// gone leaves the check.
#[test]
fn readiness_follows_the_replacement_of_a_manager() {
    common::run_paused(async {
        let store = InMemoryStore::new();
        let check = HealthCheck::new();
        let manager = |store: &InMemoryStore| {
            ClusterSingletonManager::new(
                store.lease(LeaseSettings::new("reload", "a").unwrap()),
                |_: &SingletonInfo, _| Idle,
            )
            .health(&check)
            .start()
        };
        let old = manager(&store);
        wait_for_state(&old, SingletonState::Running, Duration::from_secs(5)).await;
        assert_eq!(check.readiness(), Ok(()));
        assert!(old
            .send(actix_coordination::Shutdown)
            .await
            .unwrap()
            .unwrap());

        let new = manager(&store);
        wait_for_state(&new, SingletonState::Running, Duration::from_secs(30)).await;
        common::actors::wait_until(Duration::from_secs(30), || check.readiness().is_ok()).await;
        assert_eq!(check.liveness(), Ok(()));
        let reports = check.leases();
        assert_eq!(
            reports.len(),
            1,
            "only the replacement's lease: {reports:?}"
        );
        assert!(reports[0].held);
        // The replacement counts: ineligible, not ready.
        new.send(SetEligible(false)).await.unwrap();
        assert_eq!(
            check.readiness(),
            Err(NotReady::NotEligible {
                lease: "reload".into()
            })
        );
        drop(old);
    });
}

/// Issue 27 item 5: a stop timeout of any length (plain data) never makes liveness panic: with
/// `Duration::MAX`, a singleton that does not stop stays within its stop timeout.
#[test]
fn liveness_never_panics_on_a_very_long_stop_timeout() {
    common::run_paused(async {
        let store = InMemoryStore::new();
        let check = HealthCheck::new();
        let manager = ClusterSingletonManager::new(
            store.lease(LeaseSettings::new("patient", "a").unwrap()),
            |_: &SingletonInfo, _| Stubborn,
        )
        .settings(SingletonSettings {
            stop_timeout: Duration::MAX,
            ..Default::default()
        })
        .health(&check)
        .start();
        wait_for_state(&manager, SingletonState::Running, Duration::from_secs(5)).await;
        manager.send(SetEligible(false)).await.unwrap();
        sleep(Duration::from_secs(3600)).await;
        assert_eq!(
            manager.send(GetStatus).await.unwrap().state,
            SingletonState::Stopping,
            "the singleton does not stop"
        );
        assert_eq!(
            check.liveness(),
            Ok(()),
            "within its (endless) stop timeout"
        );
        assert!(format!("{check:?}").contains("liveness: Ok"));
    });
}

/// A singleton whose `stopping` blocks its thread until `release` is set (at most 60 s).
struct Blocked {
    release: Arc<AtomicBool>,
}

impl Actor for Blocked {
    type Context = Context<Self>;

    fn stopping(&mut self, _: &mut Self::Context) -> Running {
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        while !self.release.load(Ordering::SeqCst) && std::time::Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(5));
        }
        Running::Stop
    }
}

/// Issue 27 item 8, the other side of holding managers weakly: a singleton the manager gave up
/// on (terminated after its stop timeout, its thread still blocked) keeps failing liveness after
/// its manager has shut down and is gone, and leaves the check once it is gone too.
#[actix_rt::test]
async fn a_singleton_left_behind_by_a_manager_that_is_gone_fails_liveness_until_it_is_gone() {
    let store = InMemoryStore::new();
    let check = HealthCheck::with_tolerance(Duration::from_millis(100));
    let release = Arc::new(AtomicBool::new(false));
    let arbiter = actix_rt::Arbiter::new();
    let manager = ClusterSingletonManager::on_arbiter(
        Arc::new(store.lease(LeaseSettings::new("left-behind", "a").unwrap())),
        arbiter.handle(),
        {
            let release = Arc::clone(&release);
            move |_: &SingletonInfo, _| Blocked {
                release: Arc::clone(&release),
            }
        },
    )
    .settings(SingletonSettings {
        stop_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .health(&check)
    .start();
    wait_for_state(&manager, SingletonState::Running, Duration::from_secs(5)).await;
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        manager.send(actix_coordination::Shutdown),
    )
    .await
    .unwrap();
    assert!(answer.unwrap().unwrap(), "released after the stop timeout");
    common::actors::wait_until(Duration::from_secs(5), || !manager.connected()).await;
    // The manager is gone; its singleton still blocks its thread (it may still act).
    assert!(
        matches!(
            check.liveness(),
            Err(Unhealthy::SingletonNotStopped { ref lease, .. }) if lease == "left-behind"
        ),
        "{:?}",
        check.liveness()
    );
    release.store(true, Ordering::SeqCst);
    common::actors::wait_until(Duration::from_secs(10), || {
        check.liveness().is_ok() && check.readiness().is_ok() && check.leases().is_empty()
    })
    .await;
    arbiter.stop();
}

/// A singleton that does nothing.
struct Idle;

impl Actor for Idle {
    type Context = Context<Self>;
}

/// Readiness is independent of leadership (issue 25): a follower is ready, so a rolling update
/// never waits on which replica leads; and it stays ready on both nodes while leadership moves
/// back and forth between them (by transfers), at every step.
#[actix_rt::test]
async fn followers_are_ready_and_readiness_never_follows_leadership() {
    let store = InMemoryStore::new();
    let node = |owner: &str| {
        let check = HealthCheck::new();
        let lease = store.lease(LeaseSettings::new("leader", owner).unwrap());
        let manager = ClusterSingletonManager::new(lease, |_: &SingletonInfo, _| Idle)
            .health(&check)
            .start();
        (manager, check)
    };
    let (a, check_a) = node("a");
    wait_for_state(&a, SingletonState::Running, Duration::from_secs(5)).await;
    let (b, check_b) = node("b");
    wait_for_state(&b, SingletonState::Acquiring, Duration::from_secs(5)).await;
    assert_eq!(check_b.readiness(), Ok(()), "a follower is ready");
    assert_eq!(check_a.readiness(), Ok(()), "the leader is ready");
    let nodes = [(&a, &check_a, "a"), (&b, &check_b, "b")];
    for round in 0..4 {
        let (leader, _, _) = nodes[round % 2];
        let (next, _, next_name) = nodes[(round + 1) % 2];
        assert!(leader
            .send(TransferLeadership::to(next_name))
            .await
            .unwrap()
            .unwrap());
        for (_, check, name) in nodes {
            assert_eq!(
                check.readiness(),
                Ok(()),
                "round {round}: {name} mid-transfer"
            );
        }
        wait_for_state(next, SingletonState::Running, Duration::from_secs(5)).await;
        for (_, check, name) in nodes {
            assert_eq!(
                check.readiness(),
                Ok(()),
                "round {round}: {name} after the transfer"
            );
            assert_eq!(check.liveness(), Ok(()), "round {round}: {name}");
        }
    }
}

/// Issue 49: sharded workers registered with a check are ready only once they joined their group
/// (listed it, held their member lease: the others then place shards on them), so that a
/// rollout driven by readiness stops the next old replica only when the new one can take its
/// shards; they are not ready from the start of their leave, while their workers stop; their
/// member lease counts for liveness; and once gone they leave the check.
#[actix_rt::test]
async fn sharded_workers_are_ready_once_they_joined_and_not_while_they_leave() {
    use actix_coordination::{GetShards, InMemoryLease, ShardInfo, ShardedWorkers, Shutdown};

    /// A worker that takes 300 ms to stop: the leave lasts that long at least.
    struct SlowStop(bool);
    impl Actor for SlowStop {
        type Context = Context<Self>;
        fn stopping(&mut self, ctx: &mut Context<Self>) -> Running {
            if std::mem::replace(&mut self.0, true) {
                return Running::Stop;
            }
            ctx.run_later(Duration::from_millis(300), |_, ctx| ctx.stop());
            Running::Continue
        }
    }

    let store = InMemoryStore::new();
    let check = HealthCheck::new();
    let leases = store.clone();
    let workers = ShardedWorkers::with_count(
        "ready",
        4,
        move |name: &str| {
            leases.lease(
                LeaseSettings::builder(name, "a")
                    .ttl(Duration::from_secs(3))
                    .renewal_interval(Duration::from_secs(1))
                    .build()
                    .unwrap(),
            )
        },
        |_: &ShardInfo, _: &mut Context<SlowStop>| SlowStop(false),
    )
    .unwrap()
    .health(&check);
    let _: &ShardedWorkers<SlowStop, InMemoryLease> = &workers;
    let addr = workers.start();
    async fn wait_for_shards(addr: &Addr<ShardedWorkers<SlowStop, InMemoryLease>>, n: usize) {
        let give_up = Instant::now() + Duration::from_secs(10);
        while addr.send(GetShards).await.unwrap().len() != n {
            assert!(Instant::now() < give_up, "not {n} shards running");
            sleep(Duration::from_millis(5)).await;
        }
    }
    assert_eq!(
        check.readiness(),
        Err(NotReady::GroupNotListed {
            group: "ready".into()
        }),
        "not ready before it joined"
    );
    assert!(
        check.leases().iter().any(|l| l.name == "ready.member.a"),
        "the member lease is watched: {:?}",
        check.leases()
    );
    let _ = wait_for(Duration::from_secs(10), || check.readiness(), Result::is_ok).await;
    assert!(check
        .leases()
        .iter()
        .any(|l| l.name == "ready.member.a" && l.held));
    wait_for_shards(&addr, 4).await;
    addr.do_send(Shutdown);
    let _ = wait_for(
        Duration::from_secs(5),
        || check.readiness(),
        |r| {
            *r == Err(NotReady::Leaving {
                group: "ready".into(),
            })
        },
    )
    .await;
    // Gone (its leave ended): it leaves the check.
    let _ = wait_for(Duration::from_secs(10), || check.readiness(), Result::is_ok).await;
    assert!(!addr.connected());
}
