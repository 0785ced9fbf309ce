//! Scale: one process holding many leases. Reports the time to acquire them all, the memory and
//! CPU per held lease, and whether every renewal came on time (the smallest headroom any lease
//! had before its deadline, sampled every 50 ms).
//!
//! ```text
//! cargo bench --bench scale -- memory 100000
//! cargo bench --all-features --bench scale -- kubernetes 1000   # needs scripts/test-cluster.sh up
//! cargo bench --all-features --bench scale -- etcd 10000        # and `source target/test-cluster/env`
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_coordination::{InMemoryStore, Lease, LeaseSettings, SharedLease};
use futures_util::stream::{self, StreamExt};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(6);
const RENEW: Duration = Duration::from_secs(2);

fn settings(i: usize) -> LeaseSettings {
    LeaseSettings::builder(format!("scale-{i}"), "scale-bench")
        .ttl(TTL)
        .renewal_interval(RENEW)
        .operation_timeout(Duration::from_millis(1500))
        .build()
        .expect("valid settings")
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

#[allow(unused_variables)]
fn make_lease(backend: &str, i: usize, store: &InMemoryStore) -> SharedLease {
    match backend {
        "memory" => SharedLease::new(store.lease(settings(i))),
        other => panic!("unknown backend {other:?} (memory, kubernetes, etcd)"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let backend = args
        .first()
        .map(String::as_str)
        .unwrap_or("memory")
        .to_owned();
    let count: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(backend, count));
}

async fn run(backend: String, count: usize) {
    let store = InMemoryStore::new();
    let rss_before = rss_bytes();
    let leases: Vec<SharedLease> = (0..count)
        .map(|i| make_lease(&backend, i, &store))
        .collect();
    let lost = Arc::new(AtomicUsize::new(0));
    let subscriptions: Vec<_> = leases
        .iter()
        .map(|l| {
            let lost = Arc::clone(&lost);
            l.on_lost(move |_| {
                lost.fetch_add(1, Ordering::Relaxed);
            })
        })
        .collect();
    let start = Instant::now();
    let acquired = stream::iter(leases.iter())
        .map(|l| async move { l.acquire().await })
        .buffer_unordered(64)
        .filter(|r| std::future::ready(matches!(r, Ok(true))))
        .count()
        .await;
    let acquire_time = start.elapsed();
    assert_eq!(acquired, count, "every lease acquired");
    let rss_held = rss_bytes();

    // Hold for three renewal intervals, sampling the headroom before the deadlines.
    let cpu_start = cpu_time();
    let hold_start = Instant::now();
    let hold = RENEW * 3;
    let mut min_headroom = TTL;
    while hold_start.elapsed() < hold {
        let now = Instant::now();
        for l in &leases {
            match l.deadline() {
                Some(d) => min_headroom = min_headroom.min(d.saturating_duration_since(now)),
                None => min_headroom = Duration::ZERO,
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cpu = cpu_time() - cpu_start;
    let alive = leases.iter().filter(|l| l.check_alive()).count();
    // A renewal that is exactly on time leaves `ttl - margin - renewal interval` of headroom.
    let on_time_headroom = leases[0].settings().local_validity() - RENEW;
    let worst_lateness = on_time_headroom.saturating_sub(min_headroom);

    let release_start = Instant::now();
    let released = stream::iter(leases.iter())
        .map(|l| async move { l.release().await })
        .buffer_unordered(64)
        .filter(|r| std::future::ready(matches!(r, Ok(true))))
        .count()
        .await;
    let release_time = release_start.elapsed();
    drop(subscriptions);

    println!("backend:                 {backend}");
    println!("leases held:             {count} (ttl {TTL:?}, renewal every {RENEW:?})");
    println!(
        "acquire all:             {acquire_time:.2?} ({:.0} acquires/s, 64 in flight)",
        count as f64 / acquire_time.as_secs_f64()
    );
    println!("release all:             {release_time:.2?} ({released} released)");
    println!(
        "memory per held lease:   {:.0} bytes (RSS {} MiB -> {} MiB)",
        (rss_held.saturating_sub(rss_before)) as f64 / count as f64,
        rss_before >> 20,
        rss_held >> 20
    );
    println!(
        "CPU while holding:       {:.1} % of one core ({:.2} µs per lease per renewal)",
        100.0 * cpu.as_secs_f64() / hold.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / (count as f64 * 3.0)
    );
    println!(
        "alive after holding:     {alive}/{count}, lost: {}",
        lost.load(Ordering::Relaxed)
    );
    println!("worst renewal lateness:  {worst_lateness:.2?} (min headroom {min_headroom:.2?}, on-time headroom {on_time_headroom:.2?})");
    if backend == "memory" {
        let stats = store.stats();
        println!(
            "store calls:             {} acquires, {} renewals, {} releases",
            stats.acquires, stats.renewals, stats.releases
        );
    }
    assert_eq!(alive, count, "every lease stayed alive");
}
