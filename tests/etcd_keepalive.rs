//! The keep-alives of a session's shared etcd lease, counted by etcd itself.
//!
//! The README promises one keep-alive per renewal interval per process and TTL, whatever the number
//! of leases and however late the runtime that drives the leases is. Each test starts a private
//! etcd (`ACTIX_COORD_TEST_ETCD_BIN`, as `scripts/test-cluster.sh` provides it), so that nothing
//! else is counted, and reads `grpc_server_msg_received_total{grpc_method="LeaseKeepAlive"}` from
//! its `/metrics` over a window of at least 20 renewal intervals.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_coordination::{EtcdLease, EtcdSession, Lease, LeaseSettings};
use common::etcd::{etcd_settings, keep_alives_received, unique_prefix, EtcdProcess};
use futures_util::future::join_all;
use tokio::time::{sleep, Instant};

const LEASES: usize = 200;
/// A 1 s renewal interval (a third of the TTL).
const TTL: Duration = Duration::from_secs(3);
/// Renewals of every lease in the counted window: at least as many renewal intervals.
const WINDOW_RENEWALS: u64 = 20;
/// The most keep-alives per renewal interval etcd may receive (README, "etcd").
const MOST_PER_INTERVAL: f64 = 1.2;

/// Polls `condition` every 20 ms until it holds; panics with `what` after `within`.
async fn eventually(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let give_up = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < give_up, "{what} (waited {within:?})");
        sleep(Duration::from_millis(20)).await;
    }
}

/// Keeps the current runtime's worker threads busy: `threads` tasks that each block their worker
/// for 30 ms at a time, yielding in between, until dropped. Reports the worst lateness of a 10 ms
/// timer on the same runtime.
struct BusyRuntime {
    stop: Arc<AtomicBool>,
    worst_lateness_ms: Arc<AtomicUsize>,
}

impl BusyRuntime {
    fn start(threads: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        for _ in 0..threads {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    // Blocks the worker thread, as a handler doing blocking work would.
                    std::thread::sleep(Duration::from_millis(30));
                    tokio::task::yield_now().await;
                }
            });
        }
        let worst_lateness_ms = Arc::new(AtomicUsize::new(0));
        tokio::spawn({
            let (stop, worst) = (Arc::clone(&stop), Arc::clone(&worst_lateness_ms));
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let due = Instant::now() + Duration::from_millis(10);
                    tokio::time::sleep_until(due).await;
                    let late = due.elapsed().as_millis() as usize;
                    worst.fetch_max(late, Ordering::Relaxed);
                }
            }
        });
        Self {
            stop,
            worst_lateness_ms,
        }
    }

    fn worst_lateness(&self) -> Duration {
        Duration::from_millis(self.worst_lateness_ms.load(Ordering::Relaxed) as u64)
    }
}

impl Drop for BusyRuntime {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Holds `LEASES` leases on one session against a private etcd for `WINDOW_RENEWALS` renewals of
/// every lease and returns the keep-alives etcd received per renewal interval meanwhile.
async fn keep_alives_per_interval(test: &str, busy: Option<&BusyRuntime>) -> f64 {
    let etcd = EtcdProcess::start(test).await;
    let endpoint = etcd.endpoint();
    let session = EtcdSession::connect(etcd_settings(&endpoint, &unique_prefix(test)))
        .await
        .unwrap();
    let leases: Vec<EtcdLease> = (0..LEASES)
        .map(|i| {
            session.lease(
                LeaseSettings::builder(format!("shard-{i}"), "node-1")
                    .ttl(TTL)
                    .acquire_retries(5)
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let interval = leases[0].settings().renewal_interval();
    assert_eq!(interval, Duration::from_secs(1));
    let lost = Arc::new(AtomicUsize::new(0));
    let _subscriptions: Vec<_> = leases
        .iter()
        .map(|l| {
            let lost = Arc::clone(&lost);
            l.on_lost(move |_| {
                lost.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    // Acquired at different moments (a few at a time): their renewals start out of phase, as
    // leases acquired over a process's life do.
    for chunk in leases.chunks(10) {
        let results = join_all(chunk.iter().map(|l| l.acquire())).await;
        assert!(results.iter().all(|r| matches!(r, Ok(true))), "{results:?}");
        sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        session.shared_lease_ids().await.len(),
        1,
        "one etcd lease for one TTL"
    );
    // Settled: every lease renewed once.
    eventually(interval * 10, "every lease renews", || {
        leases.iter().all(|l| l.stats().renewals >= 1)
    })
    .await;

    let renewals_before: Vec<u64> = leases.iter().map(|l| l.stats().renewals).collect();
    let sent_before = session.keep_alives_sent();
    let received_before = keep_alives_received(&endpoint).await;
    let window_start = Instant::now();
    eventually(
        interval * WINDOW_RENEWALS as u32 * 3,
        "every lease renews 20 more times",
        || {
            assert!(leases.iter().all(|l| l.check_alive()), "all held");
            leases
                .iter()
                .zip(&renewals_before)
                .all(|(l, before)| l.stats().renewals >= before + WINDOW_RENEWALS)
        },
    )
    .await;
    let received = keep_alives_received(&endpoint).await - received_before;
    let intervals = window_start.elapsed().as_secs_f64() / interval.as_secs_f64();
    let sent = session.keep_alives_sent() - sent_before;
    let renewals: u64 = leases
        .iter()
        .zip(&renewals_before)
        .map(|(l, before)| l.stats().renewals - before)
        .sum();
    let per_interval = received as f64 / intervals;
    println!(
        "{test}: etcd received {received} keep-alives ({sent} sent by the session) for {renewals} \
         renewals of {LEASES} leases in {intervals:.1} renewal intervals: {per_interval:.2} per \
         interval{}",
        busy.map(|b| format!(
            "; the runtime's timers were up to {:?} late",
            b.worst_lateness()
        ))
        .unwrap_or_default()
    );
    assert_eq!(lost.load(Ordering::SeqCst), 0, "no lease lost");
    assert!(received >= 1, "the renewals were backed by keep-alives");
    for lease in &leases {
        assert!(lease.release().await.unwrap());
    }
    per_interval
}

/// 200 leases of one TTL on one session: etcd receives one keep-alive per renewal interval for
/// all of them (at most 1.2 over 20 intervals), not one per lease nor one per renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_leases_cost_etcd_one_keep_alive_per_renewal_interval() {
    let per_interval = keep_alives_per_interval("keepalive-idle", None).await;
    assert!(
        per_interval <= MOST_PER_INTERVAL,
        "{per_interval:.2} keep-alives per renewal interval (at most {MOST_PER_INTERVAL})"
    );
}

/// The same while the runtime that drives the leases is kept busy (tasks that block its worker
/// threads for 30 ms at a time): renewals run late, and still share the one keep-alive per
/// interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_runtime_costs_no_extra_keep_alives() {
    let busy = BusyRuntime::start(2);
    let per_interval = keep_alives_per_interval("keepalive-busy", Some(&busy)).await;
    drop(busy);
    assert!(
        per_interval <= MOST_PER_INTERVAL,
        "{per_interval:.2} keep-alives per renewal interval (at most {MOST_PER_INTERVAL}) while \
         the runtime was kept busy"
    );
}
