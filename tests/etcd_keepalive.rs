//! The keep-alives of a session's shared etcd lease, and the requests of a group watch, counted
//! by etcd itself.
//!
//! The README promises one keep-alive per renewal interval per process and TTL, whatever the number
//! of leases and however late the runtime that drives the leases is. Each test starts a private
//! etcd (`ACTIX_COORD_TEST_ETCD_BIN`, as `scripts/test-cluster.sh` provides it), so that nothing
//! else is counted, and reads `grpc_server_msg_received_total{grpc_method="LeaseKeepAlive"}` from
//! its `/metrics` over a window of at least 20 renewal intervals. A group watch is one range and
//! one watch (`grpc_server_started_total{grpc_method="Range"|"Watch"}`, and the watch requests
//! in `grpc_server_msg_received_total{grpc_method="Watch"}`), and nothing per interval after.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_coordination::{EtcdLease, EtcdSession, GroupSnapshot, GroupWatch, Lease, LeaseSettings};
use common::etcd::{etcd_settings, keep_alives_received, unique_prefix, EtcdProcess};
use common::eventually;
use futures_util::future::join_all;
use tokio::time::{sleep, timeout, Instant};

const LEASES: usize = 200;
/// A 1 s renewal interval (a third of the TTL).
const TTL: Duration = Duration::from_secs(3);
/// Renewals of every lease in the counted window: at least as many renewal intervals.
const WINDOW_RENEWALS: u64 = 20;
/// The most keep-alives per renewal interval etcd may receive (README, "etcd").
const MOST_PER_INTERVAL: f64 = 1.2;

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
    // Each within 30 s: on a loaded machine a claim can outlast the 1 s operation timeout (it
    // failed so once at load 12); a timed-out claim is retried, and the session's one etcd
    // lease serves them all whatever happened.
    for chunk in leases.chunks(10) {
        let results = join_all(
            chunk
                .iter()
                .map(|l| l.acquire_within(Duration::from_secs(30))),
        )
        .await;
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

/// A metric of etcd at `endpoint`, from its `/metrics` (plain HTTP/1.0, as
/// `keep_alives_received` reads it): `name` summed over every label set that contains `label`
/// (`""`: every one).
async fn etcd_metric(endpoint: &str, name: &str, label: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(authority).await?;
        stream
            .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes())
            .await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        Ok::<_, std::io::Error>(body)
    };
    let body = timeout(Duration::from_secs(10), fetch)
        .await
        .unwrap_or_else(|_| panic!("GET {endpoint}/metrics timed out"))
        .unwrap_or_else(|e| panic!("GET {endpoint}/metrics: {e}"));
    let values: Vec<f64> = body
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .collect();
    assert!(
        !values.is_empty(),
        "etcd's /metrics has no {name} with {label:?}: {}",
        &body[..body.len().min(500)]
    );
    values.iter().sum::<f64>() as u64
}

/// The watchers etcd has now, over every stream of every client.
async fn etcd_watchers(endpoint: &str) -> u64 {
    etcd_metric(endpoint, "etcd_debugging_mvcc_watcher_total", "").await
}

const STARTED: &str = "grpc_server_started_total";
const RECEIVED: &str = "grpc_server_msg_received_total";

/// What etcd received of the requests a group watch makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GroupRequests {
    /// Range calls.
    ranges: u64,
    /// Watch streams opened.
    watch_streams: u64,
    /// Watch requests (creates and cancels) on every watch stream.
    watch_requests: u64,
}

impl GroupRequests {
    async fn read(endpoint: &str) -> Self {
        Self {
            ranges: etcd_metric(endpoint, STARTED, "grpc_method=\"Range\"").await,
            watch_streams: etcd_metric(endpoint, STARTED, "grpc_method=\"Watch\"").await,
            watch_requests: etcd_metric(endpoint, RECEIVED, "grpc_method=\"Watch\"").await,
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            ranges: self.ranges - before.ranges,
            watch_streams: self.watch_streams - before.watch_streams,
            watch_requests: self.watch_requests - before.watch_requests,
        }
    }
}

/// Waits until the latest snapshot of `watch` passes `check`; panics with `what` after `within`.
async fn snapshot_until(
    watch: &mut GroupWatch,
    within: Duration,
    what: &str,
    check: impl Fn(&GroupSnapshot) -> bool,
) -> Arc<GroupSnapshot> {
    let deadline = Instant::now() + within;
    loop {
        let snapshot = watch.snapshot_and_mark();
        if check(&snapshot) {
            return snapshot;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            timeout(left, watch.changed()).await.is_ok(),
            "{what}: not within {within:?}: {snapshot:?}"
        );
    }
}

const GROUP_SIZE: usize = 50;

/// A group watch over 50 leases held by another session costs etcd one range and one watch (on
/// one watch stream), however many watches of the group the session makes, and nothing per
/// renewal interval afterwards; it shows the holders, a record another session writes and its
/// release, with the records' tokens, and no key outside the group. It needs no runtime of the
/// caller's (it is made from a plain thread). When the session's watches fail it says it is no
/// longer synced and lists again once they work. Dropping the last watch cancels the etcd watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_watch_costs_one_range_and_one_watch() {
    let etcd = EtcdProcess::start("group-watch").await;
    let endpoint = etcd.endpoint();
    let prefix = unique_prefix("group-watch");
    let holders = EtcdSession::connect(etcd_settings(&endpoint, &prefix))
        .await
        .unwrap();
    let lease = |session: &EtcdSession, name: String, owner: &str| {
        session.lease(
            LeaseSettings::builder(name, owner)
                .ttl(TTL)
                .acquire_retries(5)
                .build()
                .unwrap(),
        )
    };
    let members: Vec<EtcdLease> = (0..GROUP_SIZE)
        .map(|i| lease(&holders, format!("fleet-{i}"), "node-1"))
        .collect();
    // Same start, not in the group: `fleetx-0` does not start with `fleet-`.
    let outsider = lease(&holders, "fleetx-0".into(), "node-1");
    for chunk in members.chunks(10) {
        let within = Duration::from_secs(30); // a claim may outlast 1 s on a loaded machine
        let results = join_all(chunk.iter().map(|l| l.acquire_within(within))).await;
        assert!(results.iter().all(|r| matches!(r, Ok(true))), "{results:?}");
    }
    assert!(outsider.acquire().await.unwrap());
    let interval = members[0].settings().renewal_interval();
    eventually(interval * 10, "every lease renews", || {
        members.iter().all(|l| l.stats().renewals >= 1)
    })
    .await;

    // The observing session holds nothing and has not connected yet.
    let observer = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let observer_lease = lease(&observer, "observer".into(), "node-2");
    let before = GroupRequests::read(&endpoint).await;
    let (mut watch, mut second) = std::thread::scope(|s| {
        s.spawn(|| {
            assert!(tokio::runtime::Handle::try_current().is_err());
            let first = observer_lease.watch_group("fleet-").unwrap();
            (first, observer_lease.watch_group("fleet-").unwrap())
        })
        .join()
        .unwrap()
    });
    let within = Duration::from_secs(30);
    let seen = snapshot_until(&mut watch, within, "every member", |s| {
        s.is_synced() && s.records().len() == GROUP_SIZE
    })
    .await;
    for member in &members {
        let record = seen.get(member.name()).expect("a record per member");
        assert_eq!(record.holder.as_deref(), Some("node-1"));
        assert_eq!(record.token, member.fencing_token());
        assert_eq!(record.expires_at, None, "etcd deletes the key itself");
    }
    assert!(
        seen.records().keys().all(|name| name.starts_with("fleet-")),
        "only the group: {seen:?}"
    );
    assert_eq!(second.snapshot(), seen, "both watches read the one feed");

    // Nothing more over several renewal intervals of the 50 leases.
    let renewals: Vec<u64> = members.iter().map(|l| l.stats().renewals).collect();
    eventually(interval * 30, "every lease renews 5 more times", || {
        members
            .iter()
            .zip(&renewals)
            .all(|(l, before)| l.stats().renewals >= before + 5)
    })
    .await;
    let cost = GroupRequests::read(&endpoint).await.since(before);
    println!("a group watch over {GROUP_SIZE} held leases, then 5 renewal intervals: {cost:?}");
    assert_eq!(
        cost,
        GroupRequests {
            ranges: 1,
            watch_streams: 1,
            watch_requests: 1
        },
        "one range and one watch for two watches of the group, nothing per interval"
    );

    // Another session's write and release (and the holders' own release) show in both watches.
    let newcomer_session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let newcomer = lease(&newcomer_session, "fleet-new".into(), "node-3");
    assert!(newcomer.acquire().await.unwrap());
    let token = newcomer.fencing_token();
    let seen = snapshot_until(&mut watch, within, "the newcomer", |s| {
        s.get("fleet-new").is_some()
    })
    .await;
    let record = seen.get("fleet-new").unwrap();
    assert_eq!(
        (record.holder.as_deref(), record.token),
        (Some("node-3"), token)
    );
    assert!(newcomer.release().await.unwrap());
    assert!(members[7].release().await.unwrap());
    for w in [&mut watch, &mut second] {
        snapshot_until(w, within, "the releases", |s| {
            s.get("fleet-new").is_none() && s.get("fleet-7").is_none()
        })
        .await;
    }

    // The session's watches fail: the snapshot says it may lag, and lists again once they work.
    observer.suspend_watches_for_tests(true);
    snapshot_until(&mut watch, within, "unsynced", |s| !s.is_synced()).await;
    assert!(members[3].release().await.unwrap());
    // Listing still works, watching does not: no snapshot claims to follow the group (checked
    // over a bounded second, several rounds of list and watch attempts).
    let quiet_until = Instant::now() + Duration::from_secs(1);
    while let Ok(changed) = timeout(quiet_until - Instant::now(), watch.changed()).await {
        changed.expect("the group watch runs");
        let snapshot = watch.snapshot_and_mark();
        assert!(
            !snapshot.is_synced(),
            "synced without a watch: {snapshot:?}"
        );
    }
    observer.suspend_watches_for_tests(false);
    snapshot_until(&mut watch, within, "synced again, without fleet-3", |s| {
        s.is_synced() && s.get("fleet-3").is_none() && s.records().len() == GROUP_SIZE - 2
    })
    .await;

    // Dropping the last watch cancels the etcd watch: etcd then has one watcher per lease the
    // holders keep (each tenure watches its key), and none of the observer's.
    let held = || {
        members
            .iter()
            .chain([&outsider])
            .filter(|l| l.check_alive())
            .count() as u64
    };
    let watchers_until = async |expected: u64, what: &str| {
        let give_up = Instant::now() + within;
        loop {
            let watchers = etcd_watchers(&endpoint).await;
            if watchers == expected {
                return;
            }
            assert!(
                Instant::now() < give_up,
                "{what}: {watchers} watchers, not {expected}"
            );
            sleep(Duration::from_millis(50)).await;
        }
    };
    watchers_until(held() + 1, "the group's watcher and the tenures'").await;
    drop(watch);
    watchers_until(held() + 1, "a watch of the group is left").await;
    drop(second);
    watchers_until(held(), "the group's watcher is cancelled").await;
    for lease in members.iter().chain([&outsider]) {
        if lease.check_alive() {
            assert!(lease.release().await.unwrap());
        }
    }
}
