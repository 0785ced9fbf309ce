//! Scale: one process holding many leases. Reports the time to acquire them all, the memory and
//! CPU per held lease, and whether every renewal came on time (the smallest headroom any lease
//! had before its deadline, sampled every 50 ms).
//!
//! ```text
//! cargo bench --bench scale -- memory 100000
//! scripts/test-cluster.sh up target/bench-cluster && . target/bench-cluster/env
//! cargo bench --all-features --bench scale -- kubernetes 1000
//! cargo bench --all-features --bench scale -- etcd 10000
//! SCALE_TTL_SECS=30 SCALE_RENEWAL_SECS=10 cargo bench --all-features --bench scale -- kubernetes 1000
//! ```
//!
//! The TTL and renewal interval default to 6 s and 2 s (`SCALE_TTL_SECS`, `SCALE_RENEWAL_SECS`);
//! the leases are held for `SCALE_HOLD_RENEWALS` renewal intervals (default 3; 20 on etcd, whose
//! keep-alives per renewal interval are counted on etcd's own `/metrics`
//! (`grpc_server_msg_received_total{grpc_method="LeaseKeepAlive"}`) and checked: at most 1.2). The real backends
//! read the test cluster's environment (`ACTIX_COORD_TEST_*`) and share one client (Kubernetes)
//! or one session (etcd) between all leases, as one process would; the CPU of the API server and
//! of etcd while holding is reported too when their pids are in that environment.
//!
//! The results, with the targets checked (no lease lost, every lease alive at the end, none ever
//! past its deadline while held), are appended to the results file (see `benches/common/mod.rs`);
//! with `--check` the bench exits with status 1 when a target is missed.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_coordination::{InMemoryStore, Lease, LeaseSettings, SharedLease};
use common::{Check, Report};
use futures_util::stream::{self, StreamExt};
use tokio::time::Instant;

/// The system allocator, counting the bytes in use: the heap a held lease costs, beside the RSS.
struct Counting;

static HEAP: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is updated.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size() as isize, Ordering::Relaxed);
        std::alloc::System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        HEAP.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        std::alloc::System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        HEAP.fetch_add(new as isize - layout.size() as isize, Ordering::Relaxed);
        std::alloc::System.realloc(ptr, layout, new)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn heap_bytes() -> i64 {
    HEAP.load(Ordering::Relaxed) as i64
}

fn env_secs(name: &str, default: u64) -> Duration {
    let secs = match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number of seconds")),
        Err(_) => default,
    };
    Duration::from_secs(secs)
}

fn ttl() -> Duration {
    env_secs("SCALE_TTL_SECS", 6)
}

fn renewal() -> Duration {
    env_secs("SCALE_RENEWAL_SECS", 2)
}

fn hold_renewals(backend: &str) -> u32 {
    std::env::var("SCALE_HOLD_RENEWALS")
        .ok()
        .and_then(|v| v.parse().ok())
        // etcd: a window long enough to count one keep-alive per interval to within 5 %.
        .unwrap_or(if backend == "etcd" { 20 } else { 3 })
}

/// The most keep-alives per renewal interval etcd may receive for all leases of one session
/// (README, "etcd"; `tests/etcd_keepalive.rs` checks the same bound for 200 leases).
const MOST_KEEP_ALIVES_PER_INTERVAL: f64 = 1.2;

fn settings(i: usize) -> LeaseSettings {
    let renewal = renewal();
    LeaseSettings::builder(format!("scale-{i}"), "scale-bench")
        .ttl(ttl())
        .renewal_interval(renewal)
        .operation_timeout(Duration::from_millis(1500).min(renewal))
        .build()
        .expect("valid settings")
}

/// This process's resident memory, after handing the allocator's free pages back to the system
/// (glibc's `malloc_trim`), so that memory freed after a burst (the acquires) does not count as
/// held.
fn rss_bytes() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only releases free memory of glibc's allocator.
        unsafe {
            malloc_trim(0);
        }
    }
    proc_rss_bytes("self")
}

fn proc_rss_bytes(pid: &str) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    proc_cpu_time("self")
}

/// User + system CPU time of process `pid`.
fn proc_cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
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

/// The value of a variable of the test cluster's environment.
#[allow(dead_code)]
/// Established TCP connections of this process to `port` (`/proc/self/net/tcp*`, the sockets
/// among this process's file descriptors: the API server's own loopback connections to itself
/// do not count).
fn established_to(port: u16) -> usize {
    let ours: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let port = format!(":{port:04X}");
    ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .map(|t| {
            t.lines()
                .skip(1)
                .filter(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 9 && f[2].ends_with(&port) && f[3] == "01" && ours.contains(f[9])
                })
                .count()
        })
        .sum()
}

/// `n` with a comma between thousands (`5,000`).
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

#[cfg(any(feature = "kubernetes", feature = "etcd"))]
fn cluster_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: this backend needs the test cluster. Start it with \
             `scripts/test-cluster.sh up target/bench-cluster && . target/bench-cluster/env`, or run \
             `scripts/test-cluster.sh run target/bench-cluster -- cargo bench --all-features --bench scale -- BACKEND COUNT`"
        )
    })
}

/// What the leases of one backend share, as in one process.
enum Backend {
    Memory(InMemoryStore),
    #[cfg(feature = "kubernetes")]
    Kubernetes(actix_coordination::KubernetesSession),
    #[cfg(feature = "etcd")]
    Etcd(actix_coordination::EtcdSession),
}

impl Backend {
    fn new(name: &str) -> Self {
        match name {
            "memory" => Backend::Memory(InMemoryStore::new()),
            #[cfg(feature = "kubernetes")]
            "kubernetes" => {
                use actix_coordination::{KubernetesSession, KubernetesSettings};
                let k8s = KubernetesSettings::new(cluster_var("ACTIX_COORD_TEST_K8S_NAMESPACE"))
                    .with_api_url(cluster_var("ACTIX_COORD_TEST_K8S_URL"))
                    .with_ca_file(cluster_var("ACTIX_COORD_TEST_K8S_CA"))
                    .with_token(cluster_var("ACTIX_COORD_TEST_K8S_TOKEN"));
                Backend::Kubernetes(KubernetesSession::new(k8s).expect("valid kubernetes settings"))
            }
            #[cfg(not(feature = "kubernetes"))]
            "kubernetes" => panic!(
                "the kubernetes backend needs the `kubernetes` feature: \
                 cargo bench --all-features --bench scale -- kubernetes 1000"
            ),
            #[cfg(feature = "etcd")]
            "etcd" => {
                use actix_coordination::{EtcdSession, EtcdSettings};
                Backend::Etcd(EtcdSession::new(
                    EtcdSettings::builder([cluster_var("ACTIX_COORD_TEST_ETCD_ENDPOINT")])
                        .prefix("/actix-coordination-bench/scale/")
                        .build()
                        .expect("valid etcd settings"),
                ))
            }
            #[cfg(not(feature = "etcd"))]
            "etcd" => panic!(
                "the etcd backend needs the `etcd` feature: \
                 cargo bench --all-features --bench scale -- etcd 10000"
            ),
            other => panic!("unknown backend {other:?} (memory, kubernetes, etcd)"),
        }
    }

    /// The in-memory store, for the memory backend.
    fn memory_store(&self) -> Option<&InMemoryStore> {
        match self {
            Backend::Memory(store) => Some(store),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Keep-alives the backend's session sent so far (etcd only).
    fn keep_alives_sent(&self) -> Option<u64> {
        match self {
            #[cfg(feature = "etcd")]
            Backend::Etcd(session) => Some(session.keep_alives_sent()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The keep-alive messages etcd received so far from every client, counted by etcd itself
    /// (`grpc_server_msg_received_total{grpc_method="LeaseKeepAlive"}` on its `/metrics`, served
    /// on the client URL); etcd only.
    async fn keep_alives_received_by_etcd(&self) -> Option<u64> {
        match self {
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let endpoint = cluster_var("ACTIX_COORD_TEST_ETCD_ENDPOINT");
                let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
                let mut stream = tokio::net::TcpStream::connect(authority)
                    .await
                    .expect("connect to etcd for /metrics");
                stream
                    .write_all(
                        format!("GET /metrics HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes(),
                    )
                    .await
                    .expect("request /metrics");
                let mut body = String::new();
                stream
                    .read_to_string(&mut body)
                    .await
                    .expect("read /metrics");
                let total: f64 = body
                    .lines()
                    .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
                    .filter(|l| l.contains("grpc_method=\"LeaseKeepAlive\""))
                    .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
                    .sum();
                Some(total as u64)
            }
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The API server's port (Kubernetes only).
    fn api_port(&self) -> Option<u16> {
        match self {
            #[cfg(feature = "kubernetes")]
            Backend::Kubernetes(_) => cluster_var("ACTIX_COORD_TEST_K8S_URL")
                .rsplit(':')
                .next()
                .and_then(|p| p.trim_end_matches('/').parse().ok()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// TCP connections the Kubernetes session opened so far, and the requests of its namespace
    /// watch.
    fn kubernetes_stats(&self) -> Option<serde_json::Value> {
        match self {
            #[cfg(feature = "kubernetes")]
            Backend::Kubernetes(session) => {
                let stats = session.stats();
                Some(serde_json::json!({
                    "connections_opened": stats.connections,
                    "http2_responses": stats.http2_responses,
                    "http1_responses": stats.http1_responses,
                    "watch_requests": stats.watch.watch_requests,
                    "list_requests": stats.watch.list_requests,
                    "listings": stats.watch.listings,
                }))
            }
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The pids of the servers this backend talks to, with a label, from the cluster environment.
    fn server_pids(&self) -> Vec<(&'static str, String)> {
        #[allow(unused_variables)]
        let var = |name: &str| std::env::var(name).ok();
        match self {
            Backend::Memory(_) => Vec::new(),
            #[cfg(feature = "kubernetes")]
            Backend::Kubernetes(_) => [
                ("kube-apiserver", var("ACTIX_COORD_TEST_KUBE_APISERVER_PID")),
                ("its etcd", var("ACTIX_COORD_TEST_KUBE_ETCD_PID")),
            ]
            .into_iter()
            .filter_map(|(l, p)| Some((l, p?)))
            .collect(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => var("ACTIX_COORD_TEST_ETCD_PID")
                .map(|p| vec![("etcd", p)])
                .unwrap_or_default(),
        }
    }
}

fn make_lease(backend: &Backend, i: usize) -> SharedLease {
    match backend {
        Backend::Memory(store) => SharedLease::new(store.lease(settings(i))),
        #[cfg(feature = "kubernetes")]
        Backend::Kubernetes(session) => SharedLease::new(session.lease(settings(i))),
        #[cfg(feature = "etcd")]
        Backend::Etcd(session) => SharedLease::new(session.lease(settings(i))),
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
    let mut report = Report::new("scale");
    runtime.block_on(run(backend, count, &mut report));
    drop(runtime);
    report.finish();
}

async fn run(backend_name: String, count: usize, report: &mut Report) {
    let backend = Backend::new(&backend_name);
    let (ttl, renew) = (ttl(), renewal());
    let rss_before = rss_bytes();
    let heap_before = heap_bytes();
    let leases: Vec<SharedLease> = (0..count).map(|i| make_lease(&backend, i)).collect();
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
        // `acquire_within`: keeps trying through a timed-out call (a loaded API server), which
        // `acquire` reports at once.
        .map(|l| async move { l.acquire_within(Duration::from_secs(30)).await })
        .buffer_unordered(64)
        .filter(|r| std::future::ready(matches!(r, Ok(true))))
        .count()
        .await;
    let acquire_time = start.elapsed();
    assert_eq!(
        acquired, count,
        "only {acquired} of {count} leases acquired in {acquire_time:.2?}"
    );
    let rss_held = rss_bytes();
    let heap_held = heap_bytes();

    // Hold for a few renewal intervals, sampling the headroom before the deadlines.
    let servers = backend.server_pids();
    let server_cpu_start: Vec<Duration> = servers.iter().map(|(_, p)| proc_cpu_time(p)).collect();
    let cpu_start = cpu_time();
    let keep_alives_start = backend.keep_alives_sent();
    let received_start = backend.keep_alives_received_by_etcd().await;
    let hold_start = Instant::now();
    let hold = renew * hold_renewals(&backend_name);
    let mut min_headroom = ttl;
    // Leases seen without a live deadline, summed over the samples.
    let mut expired = 0usize;
    let api_port = backend.api_port();
    let mut most_connections = 0;
    let mut samples = 0u64;
    while hold_start.elapsed() < hold {
        if let (Some(port), true) = (api_port, samples.is_multiple_of(20)) {
            most_connections = most_connections.max(established_to(port));
        }
        samples += 1;
        let now = Instant::now();
        for l in &leases {
            match l.deadline().filter(|d| *d > now) {
                Some(d) => min_headroom = min_headroom.min(d - now),
                None => {
                    min_headroom = Duration::ZERO;
                    expired += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cpu = cpu_time() - cpu_start;
    let received_end = backend.keep_alives_received_by_etcd().await;
    let hold_elapsed = hold_start.elapsed();
    let hold_intervals = hold_elapsed.as_secs_f64() / renew.as_secs_f64();
    // etcd: the keep-alives etcd itself received per renewal interval, for all leases together.
    let keep_alives_received = received_start
        .zip(received_end)
        .map(|(start, end)| end.saturating_sub(start));
    let keep_alives_per_interval = keep_alives_received.map(|n| n as f64 / hold_intervals);
    // etcd: the session's keep-alives (one shared etcd lease for all leases of a TTL).
    let keep_alives_per_min = keep_alives_start.map(|start| {
        let sent = backend.keep_alives_sent().unwrap_or(start) - start;
        sent as f64 * 60.0 / hold_elapsed.as_secs_f64()
    });
    let server_cpu: Vec<Duration> = servers
        .iter()
        .zip(&server_cpu_start)
        .map(|((_, p), start)| proc_cpu_time(p).saturating_sub(*start))
        .collect();
    let alive = leases.iter().filter(|l| l.check_alive()).count();
    // A renewal that is exactly on time leaves `ttl - margin - renewal interval` of headroom.
    let on_time_headroom = leases[0].settings().local_validity() - renew;
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

    println!("backend:                 {backend_name}");
    println!("leases held:             {count} (ttl {ttl:?}, renewal every {renew:?})");
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
    let renewals = count as f64 * hold_elapsed.as_secs_f64() / renew.as_secs_f64();
    println!(
        "CPU while holding:       {:.1} % of one core ({:.2} µs per lease per renewal, {:.0} renewals/s)",
        100.0 * cpu.as_secs_f64() / hold_elapsed.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / renewals,
        count as f64 / renew.as_secs_f64()
    );
    for ((label, pid), cpu) in servers.iter().zip(&server_cpu) {
        println!(
            "server CPU while holding: {label} (pid {pid}): {:.1} % of one core, RSS {} MiB",
            100.0 * cpu.as_secs_f64() / hold_elapsed.as_secs_f64(),
            proc_rss_bytes(pid) >> 20
        );
    }
    println!(
        "load average:            {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "alive after holding:     {alive}/{count}, lost: {}",
        lost.load(Ordering::Relaxed)
    );
    if let Some(per_min) = keep_alives_per_min {
        println!("keep-alives while holding: {per_min:.2} / min for all {count} leases (sent by the session)");
    }
    if let (Some(received), Some(per_interval)) = (keep_alives_received, keep_alives_per_interval) {
        println!(
            "keep-alives etcd received: {received} in {hold_intervals:.1} renewal intervals, \
             {per_interval:.2} per interval for all {count} leases"
        );
    }
    println!("worst renewal lateness:  {worst_lateness:.2?} (min headroom {min_headroom:.2?}, on-time headroom {on_time_headroom:.2?})");
    let heap_per_lease = (heap_held - heap_before) as f64 / count as f64;
    println!(
        "heap per held lease:     {heap_per_lease:.0} bytes (in use, counted by the allocator)"
    );
    let kubernetes = backend.kubernetes_stats();
    if let Some(stats) = &kubernetes {
        println!("connections to the API server: at most {most_connections} established while holding; session: {stats}");
    }
    let mut values = serde_json::json!({
        "leases": count,
        "ttl_s": ttl.as_secs_f64(),
        "renewal_s": renew.as_secs_f64(),
        "acquire_s": acquire_time.as_secs_f64(),
        "release_s": release_time.as_secs_f64(),
        "released": released,
        "memory_per_lease_bytes": (rss_held.saturating_sub(rss_before)) as f64 / count as f64,
        "heap_per_lease_bytes": (heap_held - heap_before) as f64 / count as f64,
        "cpu_percent": 100.0 * cpu.as_secs_f64() / hold_elapsed.as_secs_f64(),
        "cpu_us_per_lease_renewal": cpu.as_secs_f64() * 1e6 / renewals,
        "renewals_per_second": count as f64 / renew.as_secs_f64(),
        "alive": alive,
        "expired_in_samples": expired,
        "lost": lost.load(Ordering::Relaxed),
        "worst_renewal_lateness_ms": worst_lateness.as_secs_f64() * 1e3,
        "keep_alives_per_min": keep_alives_per_min,
        "keep_alives_received_by_etcd": keep_alives_received,
        "keep_alives_per_interval": keep_alives_per_interval,
        "hold_intervals": hold_intervals,
        "min_headroom_ms": min_headroom.as_secs_f64() * 1e3,
        "on_time_headroom_ms": on_time_headroom.as_secs_f64() * 1e3,
        "server_cpu_percent": servers
            .iter()
            .zip(&server_cpu)
            .map(|((label, _), cpu)| {
                (
                    label.to_string(),
                    100.0 * cpu.as_secs_f64() / hold_elapsed.as_secs_f64(),
                )
            })
            .collect::<std::collections::BTreeMap<_, _>>(),
    });
    if let Some(stats) = &kubernetes {
        values["connections_established_max"] = serde_json::json!(most_connections);
        values["session"] = stats.clone();
    }
    if let Some(store) = backend.memory_store() {
        let stats = store.stats();
        println!(
            "store calls:             {} acquires, {} renewals, {} releases",
            stats.acquires, stats.renewals, stats.releases
        );
        values["store_calls"] = serde_json::json!({
            "acquires": stats.acquires,
            "renewals": stats.renewals,
            "releases": stats.releases,
        });
    }
    report.record(
        "scale",
        &backend_name,
        Some(&format!(
            "{}s/{}s{}",
            ttl.as_secs(),
            renew.as_secs(),
            // The 1,000-lease etcd run is a measurement of its own, beside the 10,000 one; so are
            // Kubernetes runs of other sizes than 1,000.
            match (backend_name.as_str(), count) {
                ("etcd", 1000) => ", 1,000 leases".to_owned(),
                ("kubernetes", n) if n != 1000 => format!(", {} leases", thousands(n)),
                _ => String::new(),
            }
        )),
        serde_json::json!({
            "reference": "every lease's deadline, sampled every 50 ms while held",
            "values": values,
        }),
        &[
            kubernetes.is_some().then(|| {
                Check::at_most(
                    "scale-connections",
                    most_connections as f64,
                    2.0,
                    "TCP connections to the API server",
                )
            }),
            kubernetes.is_some().then(|| {
                Check::at_most(
                    "scale-memory",
                    heap_per_lease,
                    8192.0,
                    "bytes of client heap in use per held lease",
                )
            }),
            keep_alives_per_interval.map(|per_interval| {
                Check::at_most(
                    "scale-keep-alives",
                    per_interval,
                    MOST_KEEP_ALIVES_PER_INTERVAL,
                    "keep-alives per renewal interval received by etcd (all leases)",
                )
            }),
            // The target interval of the Kubernetes scale run: no renewal late beyond 10 % of it.
            (kubernetes.is_some() && renew >= Duration::from_secs(10)).then(|| {
                Check::at_most(
                    "scale-late",
                    worst_lateness.as_secs_f64() * 1e3,
                    renew.as_secs_f64() * 1e3 / 10.0,
                    "ms the latest renewal came late",
                )
            }),
        ]
        .into_iter()
        .flatten()
        .chain([
            Check::exactly(
                "scale-lost",
                lost.load(Ordering::Relaxed) as f64,
                0.0,
                "leases lost",
            ),
            Check::exactly(
                "scale-alive",
                (count - alive) as f64,
                0.0,
                "leases not alive after holding",
            ),
            Check::exactly(
                "scale-expired",
                expired as f64,
                0.0,
                "leases seen past their deadline (summed over the samples)",
            ),
        ])
        .collect::<Vec<_>>(),
    );
}
