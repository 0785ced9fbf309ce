//! Fast handoff, measured: graceful handoff latency, crash failover beyond the TTL, backend
//! requests per held lease and per waiting contender, and how long a frozen holder acts after it
//! is resumed. Every measurement appends its results, with the targets it checked, to the
//! results file (see `benches/common/mod.rs`); `scripts/bench-report.py` writes BENCHMARKS.md's
//! tables from it. With `--check` the bench exits with status 1 when a target is missed (a
//! documented known miss is reported, not failed).
//!
//! ```text
//! cargo bench --bench handoff -- memory                     # in-memory: handoff + failover
//! scripts/test-cluster.sh up target/bench-cluster && . target/bench-cluster/env
//! cargo bench --all-features --bench handoff -- kubernetes all
//! cargo bench --all-features --bench handoff -- etcd all
//! # or, starting and stopping the servers around one run:
//! scripts/test-cluster.sh run target/bench-cluster -- cargo bench --all-features --bench handoff -- kubernetes all
//! ```
//!
//! Arguments: `BACKEND [MEASUREMENT...]`, BACKEND one of `memory` (default), `kubernetes`, `etcd`;
//! MEASUREMENT any of
//!
//! * `handoff`: holder A holds, contender B waits in `acquire_within`, A releases; the latency is
//!   from the start of A's `release()` to B's `acquire_within` resolving `Ok(true)`.
//! * `transfer`: A holds, B and C wait, A calls `release_to` naming one of them (alternately);
//!   the latency is from the start of `release_to` to the named one's `acquire_within` resolving
//!   `Ok(true)`, and the other must still be waiting then. Target: p99 ≤ 50 ms.
//! * `failover`: A holds, B waits, A is dropped without releasing (its renewal stops as in a crash);
//!   reports how long after `A's last successful renewal start + ttl` B got the lease (the start
//!   is A's deadline minus `local_validity()`). Targets: p99 ≤ 100 ms; B never holds before A's
//!   own deadline.
//! * `kill`: the same with A a real `singleton_node` process killed with SIGKILL right after a
//!   renewal (real servers). The reference point is the same: the start of the node's last
//!   successful renewal, which the node logs as a `renewal` event (its new deadline minus
//!   `local_validity()`, converted to the wall clock); B's instant is read on the wall clock too.
//! * `requests`: backend requests per minute of a holder alone and of a waiting contender, from the
//!   server's own metrics (kube-apiserver `/metrics`, etcd `/metrics`; real servers). Targets:
//!   exactly `60 s / renewal interval` for the holder, 0 for the contender.
//! * `pause`: a `singleton_node` holder is frozen with SIGSTOP for 20 s while B takes over, then
//!   resumed; reports how long it went on acting after SIGCONT (real servers). Targets: no step
//!   and no timer tick under the old tenure after SIGCONT, and its singleton stopped.
//! * `all`: every measurement that applies to the backend.
//!
//! Without a measurement: `handoff failover`. Environment: `BENCH_HANDOFF_ROUNDS` (100),
//! `BENCH_FAILOVER_ROUNDS` (30), `BENCH_KILL_ROUNDS` (20), `BENCH_PAUSE_ROUNDS` (3),
//! `BENCH_PAUSE_SECS` (20), `BENCH_WINDOW_SECS` (60, the request-count window, a multiple of the
//! 10 s renewal interval; 20 for a quick run), `BENCH_RESULTS_FILE` (the results file).
//! The real backends read the test cluster's environment (`ACTIX_COORD_TEST_*`, written by
//! `scripts/test-cluster.sh up DIR` to `DIR/env`) and fail with a message saying so when it is
//! missing, or when the bench was built without the backend's feature.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_coordination::{InMemoryLease, InMemoryStore, Lease, LeaseSettings};
use common::{load_average, ms, summarize, Check, Report};
use serde_json::json;
use tokio::time::{sleep, timeout, Instant};

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")),
        Err(_) => default,
    }
}

/// The wall clock, for comparing with a Kubernetes object's `renewTime`.
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}

/// `CLOCK_MONOTONIC`, the clock of the `singleton_node` example's events.
#[path = "../tests/common/clock.rs"]
mod clock;
use clock::mono_ns;

/// A name no earlier run used (Kubernetes lease objects are never deleted).
fn run_id() -> &'static str {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RUN.get_or_init(|| {
        format!(
            "{:08x}",
            (now_ns() as u64 ^ u64::from(std::process::id())) & 0xffff_ffff
        )
    })
}

fn unique(base: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{base}-{}-{}",
        run_id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// `a - b` in milliseconds, negative when `a` is earlier.
fn signed_ms(a: Instant, b: Instant) -> f64 {
    if a >= b {
        ms(a - b)
    } else {
        -ms(b - a)
    }
}

// ---------------------------------------------------------------------------------------------
// Backends

/// Server-side request counters, by method (`GET`, `PUT`, ... or etcd's gRPC methods).
type Counters = BTreeMap<String, f64>;

/// What a measurement needs from a backend. Every lease made is a separate "process" (its own
/// client or session), as two nodes would be.
trait Maker {
    type L: Lease;

    fn backend(&self) -> &'static str;

    /// The server setup when a backend is measured on more than one (etcd: `3 members`).
    fn variant(&self) -> Option<&'static str> {
        None
    }

    /// A lease for `settings` with its own connection to the server.
    fn lease(&self, settings: LeaseSettings) -> Self::L;

    /// The lease's own request counters, where the backend keeps them.
    fn client_counters(&self, lease: &Self::L) -> Counters {
        let _ = lease;
        Counters::new()
    }

    /// The server's request counters for lease traffic; empty when the server has none.
    async fn server_counters(&self) -> Counters {
        Counters::new()
    }

    /// Gauges of the server worth printing with the counters (open watches).
    async fn server_gauges(&self) -> Counters {
        Counters::new()
    }

    /// The `CoordinationConfig` TOML of a `singleton_node` process (config key `singleton`), or
    /// `None` when the backend cannot be shared between processes.
    fn node_config(&self, ttl: Duration, renewal: Duration) -> Option<String> {
        let _ = (ttl, renewal);
        None
    }

    /// The wall-clock instant (ns since the epoch) the holder of lease `name` wrote as its last
    /// renewal, where the backend records one.
    async fn renew_time_ns(&self, name: &str) -> Option<u128> {
        let _ = name;
        None
    }
}

struct MemoryMaker {
    store: InMemoryStore,
}

impl Maker for MemoryMaker {
    type L = InMemoryLease;

    fn backend(&self) -> &'static str {
        "memory"
    }

    fn lease(&self, settings: LeaseSettings) -> InMemoryLease {
        self.store.lease(settings)
    }
}

/// The value of a variable of the test cluster's environment.
#[allow(dead_code)]
fn cluster_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: this benchmark needs the test cluster. Start it with \
             `scripts/test-cluster.sh up target/bench-cluster && . target/bench-cluster/env`, or run \
             `scripts/test-cluster.sh run target/bench-cluster -- cargo bench --all-features --bench handoff -- BACKEND all`"
        )
    })
}

/// Parses Prometheus text: the sum of `metric` over the series whose labels contain every one
/// of `must`, grouped by the value of label `by`.
#[allow(dead_code)]
fn prometheus(text: &str, metric: &str, must: &[&str], by: &str) -> Counters {
    let mut out = Counters::new();
    let prefix = format!("{metric}{{");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        if !must.iter().all(|m| labels.contains(m)) {
            continue;
        }
        let key = labels
            .split(',')
            .find_map(|l| l.strip_prefix(&format!("{by}=\"")))
            .map(|v| v.trim_end_matches('"').to_owned())
            .unwrap_or_default();
        let value: f64 = value.trim().parse().unwrap_or(0.0);
        *out.entry(key).or_insert(0.0) += value;
    }
    out
}

#[cfg(feature = "kubernetes")]
mod kubernetes {
    use super::*;
    use actix_coordination::{KubernetesLease, KubernetesSession, KubernetesSettings};
    use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
    use kube::api::Api;
    use kube::config::{
        AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
    };

    pub struct KubeMaker {
        url: String,
        ca: String,
        token: String,
        namespace: String,
        admin: kube::Client,
    }

    /// A kube client for the test cluster authenticated with `token`.
    fn client(url: &str, ca: &str, token: &str, namespace: &str) -> kube::Client {
        let kubeconfig = Kubeconfig {
            clusters: vec![NamedCluster {
                name: "bench".into(),
                cluster: Some(Cluster {
                    server: Some(url.to_owned()),
                    certificate_authority: Some(ca.to_owned()),
                    ..Cluster::default()
                }),
                ..NamedCluster::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: "bench".into(),
                auth_info: Some(AuthInfo {
                    token: Some(token.to_owned().into()),
                    ..AuthInfo::default()
                }),
                ..NamedAuthInfo::default()
            }],
            contexts: vec![NamedContext {
                name: "bench".into(),
                context: Some(Context {
                    cluster: "bench".into(),
                    user: Some("bench".into()),
                    namespace: Some(namespace.to_owned()),
                    ..Context::default()
                }),
                ..NamedContext::default()
            }],
            current_context: Some("bench".into()),
            ..Kubeconfig::default()
        };
        let mut config = kube::Config::try_from(kubeconfig).expect("kube config");
        config.default_retry = false;
        config.proxy_url = None;
        actix_coordination::kubernetes_client(&config).expect("kube client")
    }

    impl KubeMaker {
        pub fn from_env() -> Self {
            let url = cluster_var("ACTIX_COORD_TEST_K8S_URL");
            let ca = cluster_var("ACTIX_COORD_TEST_K8S_CA");
            let namespace = cluster_var("ACTIX_COORD_TEST_K8S_NAMESPACE");
            let admin = client(
                &url,
                &ca,
                &cluster_var("ACTIX_COORD_TEST_K8S_ADMIN_TOKEN"),
                &namespace,
            );
            Self {
                token: cluster_var("ACTIX_COORD_TEST_K8S_TOKEN"),
                url,
                ca,
                namespace,
                admin,
            }
        }

        async fn metrics(&self) -> String {
            let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
            self.admin
                .request_text(request)
                .await
                .expect("GET /metrics of the kube-apiserver")
        }
    }

    impl Maker for KubeMaker {
        type L = KubernetesLease;

        fn backend(&self) -> &'static str {
            "kubernetes"
        }

        fn lease(&self, settings: LeaseSettings) -> KubernetesLease {
            let k8s = KubernetesSettings::new(&self.namespace)
                .with_api_url(&self.url)
                .with_token(&self.token)
                .with_ca_file(&self.ca);
            // A session of its own, as the trait asks: the owners stand for separate processes
            // (leases built with `KubernetesLease::new` and equal settings would share one
            // session, whose watch hands a release to the contender inside the process).
            KubernetesSession::new(k8s)
                .expect("valid kubernetes settings")
                .lease(settings)
        }

        fn client_counters(&self, lease: &KubernetesLease) -> Counters {
            let s = lease.backend().stats();
            let w = lease.backend().watch_stats();
            Counters::from([
                ("GET".into(), s.gets as f64),
                ("CREATE".into(), s.creates as f64),
                ("PUT".into(), s.updates as f64),
                ("LIST".into(), w.list_requests as f64),
                ("WATCH opened".into(), w.watch_requests as f64),
            ])
        }

        async fn server_counters(&self) -> Counters {
            prometheus(
                &self.metrics().await,
                "apiserver_request_total",
                &["resource=\"leases\""],
                "verb",
            )
        }

        async fn server_gauges(&self) -> Counters {
            prometheus(
                &self.metrics().await,
                "apiserver_longrunning_gauge",
                &["resource=\"leases\""],
                "verb",
            )
            .into_iter()
            .map(|(verb, n)| (format!("open {verb}"), n))
            .collect()
        }

        fn node_config(&self, ttl: Duration, renewal: Duration) -> Option<String> {
            Some(format!(
                "[leases.singleton]\nbackend = \"kubernetes\"\nttl = \"{}ms\"\nrenewal-interval = \"{}ms\"\n\n\
                 [leases.singleton.kubernetes]\nnamespace = \"{}\"\napi-url = \"{}\"\ntoken = \"{}\"\nca-file = \"{}\"\n",
                ttl.as_millis(),
                renewal.as_millis(),
                self.namespace,
                self.url,
                self.token,
                self.ca
            ))
        }

        async fn renew_time_ns(&self, name: &str) -> Option<u128> {
            let api: Api<LeaseObject> = Api::namespaced(self.admin.clone(), &self.namespace);
            let lease = api
                .get(&actix_coordination::kubernetes_object_name(name))
                .await
                .ok()?;
            let renew = lease.spec?.renew_time?;
            u128::try_from(renew.0.as_nanosecond()).ok()
        }
    }
}

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;
    use actix_coordination::{EtcdLease, EtcdSession, EtcdSettings};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    pub struct EtcdMaker {
        endpoints: Vec<String>,
        prefix: String,
        variant: Option<&'static str>,
    }

    impl EtcdMaker {
        /// The single-member etcd of the test cluster.
        pub fn from_env() -> Self {
            Self {
                endpoints: vec![cluster_var("ACTIX_COORD_TEST_ETCD_ENDPOINT")],
                prefix: format!("/actix-coordination-bench/{}/", run_id()),
                variant: None,
            }
        }

        /// The three-member etcd cluster of the test cluster; every lease is given all three
        /// endpoints.
        pub fn cluster_from_env() -> Self {
            Self {
                endpoints: cluster_var("ACTIX_COORD_TEST_ETCD_CLUSTER_ENDPOINTS")
                    .split(',')
                    .map(str::to_owned)
                    .collect(),
                prefix: format!("/actix-coordination-bench/{}/", run_id()),
                variant: Some("3 members"),
            }
        }

        /// `GET /metrics` of every member, concatenated (counters are summed by the caller).
        async fn metrics(&self) -> String {
            let mut all = String::new();
            for endpoint in &self.endpoints {
                all.push_str(&Self::member_metrics(endpoint).await);
                all.push('\n');
            }
            all
        }

        /// `GET /metrics` on etcd's client URL (plain HTTP/1.0, no client library needed).
        async fn member_metrics(endpoint: &str) -> String {
            let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
            let mut stream = tokio::net::TcpStream::connect(authority)
                .await
                .expect("connect to etcd for /metrics");
            stream
                .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes())
                .await
                .expect("request /metrics");
            let mut body = String::new();
            stream
                .read_to_string(&mut body)
                .await
                .expect("read /metrics");
            body
        }
    }

    impl Maker for EtcdMaker {
        type L = EtcdLease;

        fn backend(&self) -> &'static str {
            "etcd"
        }

        fn variant(&self) -> Option<&'static str> {
            self.variant
        }

        fn lease(&self, settings: LeaseSettings) -> EtcdLease {
            // One session per lease: every owner is its own process with its own connection.
            // The lease keeps the session; dropping the lease drops it.
            let session = EtcdSession::new(
                EtcdSettings::builder(self.endpoints.iter().map(String::as_str))
                    .prefix(&self.prefix)
                    .build()
                    .expect("valid etcd settings"),
            );
            EtcdLease::new(settings, &session)
        }

        async fn server_counters(&self) -> Counters {
            let text = self.metrics().await;
            // Every request message: unary calls and each message on a stream (a keep-alive, a
            // watch create or cancel).
            let mut out: Counters =
                prometheus(&text, "grpc_server_msg_received_total", &[], "grpc_method");
            // Streams opened (a keep-alive stream, a watch stream) are counted apart.
            for (method, n) in prometheus(
                &text,
                "grpc_server_started_total",
                &["grpc_type=\"bidi_stream\""],
                "grpc_method",
            ) {
                out.insert(format!("{method} streams opened"), n);
            }
            out
        }

        fn node_config(&self, ttl: Duration, renewal: Duration) -> Option<String> {
            Some(format!(
                "[leases.singleton]\nbackend = \"etcd\"\nttl = \"{}ms\"\nrenewal-interval = \"{}ms\"\n\n\
                 [leases.singleton.etcd]\nendpoints = [{}]\nprefix = \"{}\"\n",
                ttl.as_millis(),
                renewal.as_millis(),
                self.endpoints
                    .iter()
                    .map(|e| format!("\"{e}\""))
                    .collect::<Vec<_>>()
                    .join(", "),
                self.prefix
            ))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Graceful handoff

fn handoff_settings(name: &str, owner: &str) -> LeaseSettings {
    // A long TTL: the handoff must not depend on it.
    LeaseSettings::builder(name, owner)
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid settings")
}

async fn handoff<M: Maker>(maker: &M, report: &mut Report) {
    let rounds = env_number("BENCH_HANDOFF_ROUNDS", 100) as usize;
    let name = unique("handoff");
    let a = Arc::new(maker.lease(handoff_settings(&name, "a")));
    let b = Arc::new(maker.lease(handoff_settings(&name, "b")));
    let mut latency = Vec::new();
    let mut release = Vec::new();
    // Round 0 warms up both connections and is not counted.
    for round in 0..=rounds {
        let (holder, contender) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        assert!(
            holder.acquire().await.expect("acquire"),
            "the holder acquires"
        );
        let waiter = {
            let contender = Arc::clone(contender);
            tokio::spawn(async move {
                // Through the lease type itself (not the `Arc`), so its own `acquire_within` runs.
                let got = Lease::acquire_within(&*contender, Duration::from_secs(60)).await;
                (got, Instant::now())
            })
        };
        // Let the contender make its first attempt and settle in its wait; a random delay
        // samples every phase of a contender that retries periodically.
        sleep(Duration::from_millis(fastrand::u64(300..1300))).await;
        assert!(
            !waiter.is_finished(),
            "the contender got the lease while it was held"
        );
        let start = Instant::now();
        assert!(holder.release().await.expect("release"), "released");
        let released = Instant::now();
        let (got, at) = timeout(Duration::from_secs(30), waiter)
            .await
            .expect("the contender gets the lease within 30 s")
            .expect("waiter task");
        assert!(got.expect("acquire_within"), "the contender got the lease");
        if round > 0 {
            latency.push(ms(at - start));
            release.push(ms(released - start));
        }
        assert!(contender.release().await.expect("release"));
    }
    let summary = summarize(&latency);
    let release = summarize(&release);
    println!(
        "handoff/{}: release() start -> contender holds: {summary}",
        maker.backend()
    );
    println!(
        "handoff/{}: release() call itself:               {release}",
        maker.backend(),
    );
    report.record(
        "handoff",
        maker.backend(),
        maker.variant(),
        json!({
            "reference": "start of the holder's release()",
            "stats": { "latency": summary.json(), "release": release.json() },
            "values": { "ttl_ms": 10_000 },
        }),
        &[
            Check::at_most("handoff-median", summary.median, 10.0, "ms"),
            Check::at_most("handoff-p99", summary.p99, 50.0, "ms"),
        ],
    );
}

/// A planned transfer: A holds, B and C wait in `acquire_within`, A calls `release_to(target)`
/// with the target alternating between B and C. The latency is from the start of `release_to` to
/// the target's `acquire_within` resolving `Ok(true)`; the other contender must still be waiting
/// then (it never gets a lease left to the target). Target (issue 25): p99 ≤ 50 ms.
async fn transfer<M: Maker>(maker: &M, report: &mut Report) {
    let rounds = env_number("BENCH_TRANSFER_ROUNDS", 100) as usize;
    let name = unique("transfer");
    let leases: Vec<Arc<M::L>> = ["a", "b", "c"]
        .iter()
        .map(|owner| Arc::new(maker.lease(handoff_settings(&name, owner))))
        .collect();
    let mut latency = Vec::new();
    let mut holder = 0;
    // Round 0 warms up the connections and is not counted.
    for round in 0..=rounds {
        let target = (holder + 1 + round % 2) % 3;
        let other = 3 - holder - target;
        assert!(
            leases[holder]
                .acquire_within(Duration::from_secs(60))
                .await
                .expect("acquire"),
            "the holder acquires"
        );
        let wait = |i: usize| {
            let lease = Arc::clone(&leases[i]);
            tokio::spawn(async move {
                let got = Lease::acquire_within(&*lease, Duration::from_secs(60)).await;
                (got, Instant::now())
            })
        };
        let (to_target, to_other) = (wait(target), wait(other));
        sleep(Duration::from_millis(fastrand::u64(300..800))).await;
        assert!(
            !to_target.is_finished() && !to_other.is_finished(),
            "a contender got a held lease"
        );
        let start = Instant::now();
        let target_name = leases[target].owner().to_owned();
        assert!(
            leases[holder]
                .release_to(&target_name)
                .await
                .expect("release_to"),
            "released to the target"
        );
        let (got, at) = timeout(Duration::from_secs(30), to_target)
            .await
            .expect("the target gets the lease within 30 s")
            .expect("waiter task");
        assert!(got.expect("acquire_within"), "the target got the lease");
        assert!(
            !to_other.is_finished(),
            "the other contender got a lease left to the target"
        );
        to_other.abort();
        if round > 0 {
            latency.push(ms(at - start));
        }
        holder = target;
    }
    assert!(leases[holder].release().await.expect("release"));
    let summary = summarize(&latency);
    println!(
        "transfer/{}: release_to() start -> the named target holds: {summary}",
        maker.backend()
    );
    report.record(
        "transfer",
        maker.backend(),
        maker.variant(),
        json!({
            "reference": "start of the holder's release_to(target)",
            "stats": { "latency": summary.json() },
            "values": { "ttl_ms": 10_000, "contenders": 2 },
        }),
        &[Check::at_most("transfer-p99", summary.p99, 50.0, "ms")],
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Crash failover

const FAILOVER_TTL: Duration = Duration::from_secs(2);

fn failover_settings(name: &str, owner: &str) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(FAILOVER_TTL)
        .build()
        .expect("valid settings")
}

/// Waits until `lease`'s deadline moves (a renewal succeeded); returns the new deadline.
async fn next_renewal(lease: &impl Lease) -> Instant {
    let before = lease.deadline().expect("held");
    let give_up = Instant::now() + lease.settings().ttl();
    loop {
        let now = lease.deadline().expect("still held");
        if now != before {
            return now;
        }
        assert!(Instant::now() < give_up, "no renewal within the ttl");
        sleep(Duration::from_millis(2)).await;
    }
}

/// The failover targets: p99 beyond the TTL ≤ 100 ms (on etcd a documented known miss, checked
/// instead against the bound its explanation gives), and no contender ever holding before the
/// crashed holder's own deadline.
fn failover_checks(backend: &str, beyond: &common::Summary, early: usize) -> Vec<Check> {
    let mut checks = vec![Check::exactly(
        "failover-never-early",
        early as f64,
        0.0,
        "takeovers before the holder's deadline",
    )];
    if backend == "etcd" {
        checks.push(
            Check::at_most("failover-p99", beyond.p99, 100.0, "ms").known_miss(ETCD_EXPIRY_MISS),
        );
        // The known miss is bounded: etcd's expiry tick (500 ms) plus the 100 ms target.
        checks.push(Check::at_most(
            "failover-p99-etcd-bound",
            beyond.p99,
            600.0,
            "ms",
        ));
    } else {
        checks.push(Check::at_most("failover-p99", beyond.p99, 100.0, "ms"));
    }
    checks
}

/// Why etcd misses the failover target (BENCHMARKS.md, "Crash failover").
const ETCD_EXPIRY_MISS: &str = "etcd deletes a key of an expired lease on its own 500 ms tick \
     (lessor.runLoop), counted from when it received the last keep-alive";

async fn failover<M: Maker>(maker: &M, report: &mut Report) {
    let rounds = env_number("BENCH_FAILOVER_ROUNDS", 30) as usize;
    let mut beyond = Vec::new();
    let mut holder_margin = Vec::new();
    for _ in 0..rounds {
        let name = unique("failover");
        let a = maker.lease(failover_settings(&name, "a"));
        let b = Arc::new(maker.lease(failover_settings(&name, "b")));
        assert!(a.acquire().await.expect("acquire"));
        let waiter = {
            let b = Arc::clone(&b);
            tokio::spawn(async move {
                let got = Lease::acquire_within(&*b, FAILOVER_TTL * 10).await;
                (got, Instant::now())
            })
        };
        // Let A renew twice (the contender sees renewals, not only the claim), then crash it at a
        // random point of its renewal cycle while no renewal is in flight.
        next_renewal(&a).await;
        next_renewal(&a).await;
        let interval = a.settings().renewal_interval();
        sleep(Duration::from_millis(fastrand::u64(
            0..(interval.as_millis() as u64 / 2),
        )))
        .await;
        let deadline = a.deadline().expect("held");
        let last_renewal_start = deadline - a.settings().local_validity();
        drop(a);
        let (got, at) = timeout(FAILOVER_TTL * 10, waiter)
            .await
            .expect("the contender gets the lease")
            .expect("waiter task");
        assert!(got.expect("acquire_within"), "the contender got the lease");
        beyond.push(signed_ms(at, last_renewal_start + FAILOVER_TTL));
        holder_margin.push(signed_ms(at, deadline));
        assert!(b.release().await.expect("release"));
    }
    let summary = summarize(&beyond);
    let margin = summarize(&holder_margin);
    let early = holder_margin.iter().filter(|m| **m <= 0.0).count();
    println!(
        "failover/{}: contender holds, after last renewal start + ttl ({FAILOVER_TTL:?}): {summary}",
        maker.backend()
    );
    println!(
        "failover/{}: contender holds, after the dead holder's own deadline:  {margin}",
        maker.backend(),
    );
    report.record(
        "failover",
        maker.backend(),
        maker.variant(),
        json!({
            "reference": "start of the holder's last successful renewal (its deadline minus local_validity())",
            "stats": { "beyond_ttl": summary.json(), "after_holder_deadline": margin.json() },
            "values": { "ttl_ms": ms(FAILOVER_TTL) },
        }),
        &failover_checks(maker.backend(), &summary, early),
    );
    assert_eq!(
        early, 0,
        "SAFETY: the contender held the lease before the crashed holder's deadline"
    );
}

// ---------------------------------------------------------------------------------------------
// Real processes: `examples/singleton_node.rs`

/// The `singleton_node` example, built in release with every feature (cheap when up to date).
fn node_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = env!("CARGO_MANIFEST_DIR");
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--release",
            "--all-features",
            "--example",
            "singleton_node",
        ])
        .current_dir(manifest)
        .status()
        .expect("run cargo build");
    assert!(
        status.success(),
        "building the singleton_node example failed"
    );
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(manifest).join("target"));
    let bin = target
        .join("release")
        .join("examples")
        .join("singleton_node");
    assert!(bin.exists(), "{} missing", bin.display());
    bin
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// One event line of a node (see examples/singleton_node.rs).
struct NodeEvent {
    event: String,
    token: u64,
    t_ns: u128,
}

fn read_events(path: &Path) -> Vec<NodeEvent> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|v| NodeEvent {
            event: v["event"].as_str().unwrap_or_default().to_owned(),
            token: v["token"].as_u64().unwrap_or_default(),
            t_ns: v["t_ns"].as_u64().map(u128::from).unwrap_or_default(),
        })
        .collect()
}

/// A `singleton_node` process; killed when dropped.
struct Node {
    child: Child,
    events: PathBuf,
}

impl Node {
    fn spawn(bin: &Path, dir: &Path, config: &str, lease: &str, owner: &str) -> Node {
        let config_path = dir.join(format!("{owner}.toml"));
        std::fs::write(&config_path, config).expect("write node config");
        let events = dir.join(format!("{owner}.jsonl"));
        let _ = std::fs::remove_file(&events);
        let log = std::fs::File::create(dir.join(format!("{owner}.log"))).expect("node log");
        let child = Command::new(bin)
            .args(["--config", config_path.to_str().unwrap()])
            .args(["--lease", lease, "--owner", owner])
            .args(["--events", events.to_str().unwrap()])
            .env("RUST_LOG", "actix_coordination=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start singleton_node");
        Node { child, events }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The node's `renewal` events so far: when each successful claim or renewal *started* (wall
    /// clock, ns since the epoch).
    fn renewals(&self) -> Vec<u128> {
        read_events(&self.events)
            .into_iter()
            .filter(|e| e.event == "renewal")
            .map(|e| e.t_ns)
            .collect()
    }

    /// Waits until the node's singleton acts; returns its fencing token.
    async fn wait_acting(&self, within: Duration) -> u64 {
        let give_up = Instant::now() + within;
        loop {
            if let Some(e) = read_events(&self.events).iter().find(|e| e.event == "act") {
                return e.token;
            }
            assert!(
                Instant::now() < give_up,
                "the node did not start acting within {within:?}"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the node logs more than `seen` renewal events; returns the start of the last
    /// one (wall clock, ns since the epoch).
    async fn wait_renewal(&self, seen: usize, within: Duration) -> u128 {
        let give_up = Instant::now() + within;
        loop {
            let renewals = self.renewals();
            if renewals.len() > seen {
                return *renewals.last().unwrap();
            }
            assert!(
                Instant::now() < give_up,
                "the node did not renew within {within:?}"
            );
            // 1 ms: the kill follows the renewal closely.
            sleep(Duration::from_millis(1)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn node_dir(backend: &str) -> PathBuf {
    let base = std::env::var("ACTIX_COORD_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = base.join(format!("bench-nodes-{backend}-{}", run_id()));
    std::fs::create_dir_all(&dir).expect("create the nodes' directory");
    dir
}

/// 2b. Crash failover with the holder a real process killed with SIGKILL.
async fn kill<M: Maker>(maker: &M, report: &mut Report) {
    let rounds = env_number("BENCH_KILL_ROUNDS", 20) as usize;
    let Some(config) = maker.node_config(FAILOVER_TTL, FAILOVER_TTL / 3) else {
        panic!("`kill` needs a backend shared between processes (kubernetes, etcd)");
    };
    // The node's settings are the defaults for this TTL, as the contender's.
    let validity = failover_settings("validity", "node").local_validity();
    let bin = node_binary();
    let dir = node_dir(maker.backend());
    let mut beyond = Vec::new();
    let mut beyond_renew_time = Vec::new();
    let mut holder_margin = Vec::new();
    let mut killed_after = Vec::new();
    for round in 0..rounds {
        let name = unique("kill");
        let mut node = Node::spawn(&bin, &dir, &config, &name, &format!("node-{round}"));
        node.wait_acting(Duration::from_secs(30)).await;
        let b = Arc::new(maker.lease(failover_settings(&name, "b")));
        let waiter = {
            let b = Arc::clone(&b);
            tokio::spawn(async move {
                let got = Lease::acquire_within(&*b, FAILOVER_TTL * 10).await;
                (got, mono_ns(), now_ns())
            })
        };
        // One renewal with the contender waiting, then SIGKILL right after the next one: no
        // renewal is in flight, and the one logged is the last that succeeded.
        let seen = node.renewals().len();
        node.wait_renewal(seen, FAILOVER_TTL).await;
        let seen = node.renewals().len();
        let renewal_ns = node.wait_renewal(seen, FAILOVER_TTL).await;
        node.child.kill().expect("SIGKILL");
        let killed_ns = mono_ns();
        let _ = node.child.wait();
        let renew_time = maker.renew_time_ns(&name).await;
        let (got, at_ns, at_wall_ns) = timeout(FAILOVER_TTL * 10, waiter)
            .await
            .expect("the contender gets the lease")
            .expect("waiter task");
        assert!(got.expect("acquire_within"), "the contender got the lease");
        let after_start = (at_ns as f64 - renewal_ns as f64) / 1e6;
        beyond.push(after_start - ms(FAILOVER_TTL));
        holder_margin.push(after_start - ms(validity));
        killed_after.push((killed_ns as f64 - renewal_ns as f64) / 1e6);
        if let Some(renew_ns) = renew_time {
            beyond_renew_time.push((at_wall_ns as f64 - renew_ns as f64) / 1e6 - ms(FAILOVER_TTL));
        }
        println!(
            "kill/{} round {round}: killed {:.1} ms after its last renewal started; contender holds {:.1} ms after that start + ttl",
            maker.backend(),
            killed_after.last().unwrap(),
            beyond.last().unwrap(),
        );
        assert!(b.release().await.expect("release"));
    }
    let summary = summarize(&beyond);
    let margin = summarize(&holder_margin);
    let early = holder_margin.iter().filter(|m| **m <= 0.0).count();
    println!(
        "kill/{}: contender holds, after the node's last renewal start + ttl ({FAILOVER_TTL:?}): {summary}",
        maker.backend()
    );
    println!(
        "kill/{}: contender holds, after the node's own deadline:              {margin}",
        maker.backend()
    );
    let mut stats = json!({
        "beyond_ttl": summary.json(),
        "after_holder_deadline": margin.json(),
        "killed_after_renewal_start": summarize(&killed_after).json(),
    });
    if !beyond_renew_time.is_empty() {
        let renew_time = summarize(&beyond_renew_time);
        println!(
            "kill/{}: contender holds, after the object's renewTime + ttl (wall clock):  {renew_time}",
            maker.backend(),
        );
        stats["beyond_renew_time"] = renew_time.json();
    }
    report.record(
        "kill",
        maker.backend(),
        maker.variant(),
        json!({
            "reference": "start of the node's last successful renewal (its `renewal` event: deadline minus local_validity(), on the wall clock)",
            "stats": stats,
            "values": { "ttl_ms": ms(FAILOVER_TTL) },
        }),
        &failover_checks(maker.backend(), &summary, early),
    );
    assert_eq!(
        early, 0,
        "SAFETY: the contender held the lease before the killed node's deadline"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. A frozen holder after SIGCONT

async fn pause<M: Maker>(maker: &M, report: &mut Report) {
    let rounds = env_number("BENCH_PAUSE_ROUNDS", 3) as usize;
    let frozen = Duration::from_secs(env_number("BENCH_PAUSE_SECS", 20));
    let (ttl, renewal) = (Duration::from_secs(6), Duration::from_secs(2));
    let Some(config) = maker.node_config(ttl, renewal) else {
        panic!("`pause` needs a backend shared between processes (kubernetes, etcd)");
    };
    let bin = node_binary();
    let dir = node_dir(maker.backend());
    let mut per_round = Vec::new();
    let (mut acts, mut ticks, mut not_stopped) = (0, 0, 0);
    let mut stopped_after = Vec::new();
    for round in 0..rounds {
        let name = unique("pause");
        let node = Node::spawn(&bin, &dir, &config, &name, &format!("frozen-{round}"));
        let token = node.wait_acting(Duration::from_secs(30)).await;
        let b = Arc::new(
            maker.lease(
                LeaseSettings::builder(&name, "b")
                    .ttl(ttl)
                    .renewal_interval(renewal)
                    .build()
                    .expect("valid settings"),
            ),
        );
        let waiter = {
            let b = Arc::clone(&b);
            tokio::spawn(async move {
                let got = Lease::acquire_within(&*b, Duration::from_secs(120)).await;
                (got, Instant::now())
            })
        };
        sleep(Duration::from_millis(500)).await;
        signal(node.pid(), "STOP");
        let stopped = Instant::now();
        let stopped_ns = mono_ns();
        let (got, at) = timeout(frozen, waiter)
            .await
            .expect("the contender takes over while the holder is frozen")
            .expect("waiter task");
        assert!(got.expect("acquire_within"), "the contender got the lease");
        let new_token = b.fencing_token().expect("held");
        sleep_until_instant(stopped + frozen).await;
        let resumed_ns = mono_ns();
        signal(node.pid(), "CONT");
        // Wait (at most 5 s) for the resumed node's singleton to stop.
        let give_up = Instant::now() + Duration::from_secs(5);
        let stop_ns = loop {
            let events = read_events(&node.events);
            if let Some(stop) = events
                .iter()
                .find(|e| e.event == "stop" && e.t_ns >= resumed_ns)
            {
                break Some(stop.t_ns);
            }
            if Instant::now() >= give_up {
                break None;
            }
            sleep(Duration::from_millis(10)).await;
        };
        // A bounded absence check: whatever the resumed node would still run under its old
        // tenure, it runs within this second.
        sleep(Duration::from_secs(1)).await;
        let events = read_events(&node.events);
        let after = |kind: &str| {
            events
                .iter()
                .filter(|e| e.event == kind && e.token == token && e.t_ns >= resumed_ns)
                .count()
        };
        let (acts_after, ticks_after) = (after("act"), after("tick"));
        let last_act_before = events
            .iter()
            .filter(|e| e.event == "act" && e.t_ns < resumed_ns)
            .map(|e| e.t_ns)
            .max()
            .unwrap_or(0);
        let stopped_ms = stop_ns.map(|s| (s as f64 - resumed_ns as f64) / 1e6);
        println!(
            "pause/{} round {round}: frozen {frozen:?}; contender held the lease {:.0} ms after SIGSTOP (token {token} -> {new_token}); \
             after SIGCONT the old holder acted {acts_after} times and ran {ticks_after} timer ticks; its singleton stopped {} after SIGCONT; \
             its last step before was {:.0} ms after SIGSTOP",
            maker.backend(),
            ms(at - stopped),
            stopped_ms.map_or("never (within 5 s)".to_owned(), |s| format!("{s:.1} ms")),
            (last_act_before as f64 - stopped_ns as f64) / 1e6
        );
        acts += acts_after;
        ticks += ticks_after;
        match stopped_ms {
            Some(s) => stopped_after.push(s),
            None => not_stopped += 1,
        }
        per_round.push(json!({
            "takeover_after_sigstop_ms": ms(at - stopped),
            "acts_after_sigcont": acts_after,
            "ticks_after_sigcont": ticks_after,
            "stopped_after_sigcont_ms": stopped_ms,
        }));
        drop(node);
        assert!(b.release().await.expect("release"));
    }
    let mut stats = json!({});
    if !stopped_after.is_empty() {
        stats["stopped_after_sigcont"] = summarize(&stopped_after).json();
    }
    report.record(
        "pause",
        maker.backend(),
        maker.variant(),
        json!({
            "reference": "the instant before SIGCONT was sent",
            "stats": stats,
            "values": {
                "rounds": per_round,
                "frozen_s": frozen.as_secs(),
                "ttl_s": ttl.as_secs(),
                "renewal_s": renewal.as_secs(),
            },
        }),
        &[
            Check::exactly("frozen-acts", acts as f64, 0.0, "steps after SIGCONT"),
            Check::exactly(
                "frozen-ticks",
                ticks as f64,
                0.0,
                "timer ticks after SIGCONT",
            ),
            Check::exactly(
                "frozen-stopped",
                not_stopped as f64,
                0.0,
                "singletons not stopped within 5 s of SIGCONT",
            ),
        ],
    );
}

async fn sleep_until_instant(at: Instant) {
    tokio::time::sleep_until(at).await
}

// ---------------------------------------------------------------------------------------------
// 3. Requests per minute

fn delta(after: &Counters, before: &Counters) -> Counters {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v != 0.0)
        .collect()
}

fn per_minute(counters: &Counters, elapsed: Duration) -> String {
    if counters.is_empty() {
        return "none".into();
    }
    counters
        .iter()
        .map(|(k, v)| format!("{k} {:.2}", v * 60.0 / elapsed.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn minus(a: &Counters, b: &Counters) -> Counters {
    let mut out = a.clone();
    for (k, v) in b {
        *out.entry(k.clone()).or_insert(0.0) -= v;
    }
    out.retain(|_, v| v.abs() > 1e-9);
    out
}

fn total(counters: &Counters) -> f64 {
    counters.values().sum()
}

fn counters_json(counters: &Counters) -> serde_json::Value {
    json!(counters)
}

async fn requests<M: Maker>(maker: &M, report: &mut Report) {
    let window = Duration::from_secs(env_number("BENCH_WINDOW_SECS", 60));
    assert!(
        window.as_secs() > 0 && window.as_secs().is_multiple_of(10),
        "BENCH_WINDOW_SECS must be a multiple of the 10 s renewal interval: a window then holds a whole number of renewals"
    );
    for (ttl, renewal) in [
        (Duration::from_secs(20), Duration::from_secs(10)),
        (Duration::from_secs(30), Duration::from_secs(10)),
    ] {
        // Let what ran before (an unused etcd lease lingers one renewal interval before it is
        // revoked; a dropped tenure's key is deleted a TTL later) finish before counting.
        sleep(renewal + Duration::from_secs(3)).await;
        println!(
            "requests/{}: ttl {ttl:?}, renewal {renewal:?}, {window:?} windows (load {})",
            maker.backend(),
            load_average()
        );
        let settings = |name: &str, owner: &str| {
            LeaseSettings::builder(name, owner)
                .ttl(ttl)
                .renewal_interval(renewal)
                .build()
                .expect("valid settings")
        };
        let name = unique("requests");

        // Phase 0: nothing held (what the server counts on its own).
        let (s0, t0) = (maker.server_counters().await, Instant::now());
        sleep(window).await;
        let (s1, t1) = (maker.server_counters().await, Instant::now());
        let idle = delta(&s1, &s0);

        // Phase 1: one holder alone; the window starts just after a renewal.
        let a = maker.lease(settings(&name, "a"));
        assert!(a.acquire().await.expect("acquire"));
        let claim = maker.client_counters(&a);
        next_renewal(&a).await;
        sleep(renewal / 4).await;
        let (s1, c1, t1h) = (
            maker.server_counters().await,
            maker.client_counters(&a),
            Instant::now(),
        );
        sleep(window).await;
        let (s2, c2, t2) = (
            maker.server_counters().await,
            maker.client_counters(&a),
            Instant::now(),
        );
        let gauges_holder = maker.server_gauges().await;
        let holder = minus(&delta(&s2, &s1), &idle);

        // Phase 2: the holder and one contender waiting in `acquire_within`.
        let b = Arc::new(maker.lease(settings(&name, "b")));
        let waiter = {
            let b = Arc::clone(&b);
            tokio::spawn(async move { Lease::acquire_within(&*b, window * 10).await })
        };
        // Two renewal intervals of settling: the contender's first attempt and its one-time
        // leftovers (an etcd lease granted for the attempt lingers one renewal interval before
        // it is revoked) fall before the window.
        next_renewal(&a).await;
        next_renewal(&a).await;
        sleep(renewal / 4).await;
        let b_setup = maker.client_counters(&b);
        let (s3, c3, b3, t3) = (
            maker.server_counters().await,
            maker.client_counters(&a),
            maker.client_counters(&b),
            Instant::now(),
        );
        sleep(window).await;
        let (s4, c4, b4, t4) = (
            maker.server_counters().await,
            maker.client_counters(&a),
            maker.client_counters(&b),
            Instant::now(),
        );
        let gauges_both = maker.server_gauges().await;
        assert!(!waiter.is_finished(), "the contender is still waiting");
        waiter.abort();
        let both = minus(&delta(&s4, &s3), &idle);
        let holder_rate = |c: &Counters, e: Duration| {
            c.iter()
                .map(|(k, v)| (k.clone(), v * 60.0 / e.as_secs_f64()))
                .collect::<Counters>()
        };
        let contender = minus(
            &holder_rate(&both, t4 - t3),
            &holder_rate(&holder, t2 - t1h),
        );
        println!(
            "  server, nothing held:           {} per minute",
            per_minute(&idle, t1 - t0)
        );
        println!(
            "  server, holder alone:           {} per minute (idle subtracted)",
            per_minute(&holder, t2 - t1h)
        );
        println!(
            "  server, holder + contender:     {} per minute (idle subtracted)",
            per_minute(&both, t4 - t3)
        );
        println!(
            "  server, contender = difference: {} per minute",
            if contender.is_empty() {
                "none".to_owned()
            } else {
                contender
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        if !claim.is_empty() {
            println!("  client, holder's claim:         {claim:?}");
            println!(
                "  client, holder alone:           {} per minute",
                per_minute(&delta(&c2, &c1), t2 - t1h)
            );
            println!(
                "  client, holder (phase 2):       {} per minute",
                per_minute(&delta(&c4, &c3), t4 - t3)
            );
            println!("  client, contender's setup:      {b_setup:?}");
            println!(
                "  client, contender waiting:      {} per minute",
                per_minute(&delta(&b4, &b3), t4 - t3)
            );
        }
        if !gauges_holder.is_empty() || !gauges_both.is_empty() {
            println!("  server gauges: holder alone {gauges_holder:?}; holder + contender {gauges_both:?}");
        }
        // The targets, on the server's counts over windows of the same nominal length: the
        // holder sends one request per renewal, the waiting contender none.
        let per_minute = 60.0 / window.as_secs_f64();
        let holder_rate = total(&holder) * per_minute;
        let contender_rate = (total(&both) - total(&holder)) * per_minute;
        let expected = 60.0 / renewal.as_secs_f64();
        let mut values = json!({
            "ttl_s": ttl.as_secs(),
            "renewal_s": renewal.as_secs(),
            "window_s": window.as_secs(),
            "idle": counters_json(&idle),
            "holder": counters_json(&holder),
            "holder_and_contender": counters_json(&both),
            "holder_per_minute": holder_rate,
            "contender_per_minute": contender_rate,
            "gauges_holder": counters_json(&gauges_holder),
            "gauges_both": counters_json(&gauges_both),
        });
        if !claim.is_empty() {
            values["client"] = json!({
                "holder_claim": counters_json(&claim),
                "holder_window": counters_json(&delta(&c2, &c1)),
                "contender_setup": counters_json(&b_setup),
                "contender_window": counters_json(&delta(&b4, &b3)),
            });
        }
        report.record(
            "requests",
            maker.backend(),
            Some(&match maker.variant() {
                Some(variant) => format!("ttl {}s, {variant}", ttl.as_secs()),
                None => format!("ttl {}s", ttl.as_secs()),
            }),
            json!({
                "reference": "the server's own request counters, idle traffic subtracted",
                "values": values,
            }),
            &[
                Check::exactly("holder-requests", holder_rate, expected, "requests / min"),
                Check::exactly("contender-requests", contender_rate, 0.0, "requests / min"),
            ],
        );
        drop(b);
        assert!(a.release().await.expect("release"));
    }
}

// ---------------------------------------------------------------------------------------------

async fn run<M: Maker>(maker: M, measurements: &[String], report: &mut Report) {
    println!(
        "backend {} on {} cores, load average {}",
        maker.backend(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    for m in measurements {
        let started = std::time::Instant::now();
        match m.as_str() {
            "handoff" => handoff(&maker, report).await,
            "transfer" => transfer(&maker, report).await,
            "failover" => failover(&maker, report).await,
            "kill" => kill(&maker, report).await,
            "requests" => requests(&maker, report).await,
            "pause" => pause(&maker, report).await,
            other => panic!(
                "unknown measurement {other:?} (handoff, transfer, failover, kill, requests, pause, all)"
            ),
        }
        println!(
            "({m} took {:.0?}, load average now {})\n",
            started.elapsed(),
            load_average()
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let backend = args.first().cloned().unwrap_or_else(|| "memory".into());
    let mut measurements: Vec<String> = args.iter().skip(1).cloned().collect();
    if measurements.is_empty() {
        measurements = vec!["handoff".into(), "failover".into()];
    }
    if measurements.iter().any(|m| m == "all") {
        measurements = if backend == "memory" {
            vec!["handoff".into(), "transfer".into(), "failover".into()]
        } else {
            [
                "handoff", "transfer", "failover", "kill", "requests", "pause",
            ]
            .map(String::from)
            .to_vec()
        };
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut report = Report::new("handoff");
    runtime.block_on(async {
        let report = &mut report;
        match backend.as_str() {
            "memory" => {
                run(
                    MemoryMaker {
                        store: InMemoryStore::new(),
                    },
                    &measurements,
                    report,
                )
                .await
            }
            "kubernetes" => {
                #[cfg(feature = "kubernetes")]
                run(kubernetes::KubeMaker::from_env(), &measurements, report).await;
                #[cfg(not(feature = "kubernetes"))]
                panic!(
                    "the kubernetes backend needs the `kubernetes` feature: \
                     cargo bench --all-features --bench handoff -- kubernetes"
                );
            }
            "etcd" => {
                #[cfg(feature = "etcd")]
                run(etcd::EtcdMaker::from_env(), &measurements, report).await;
                #[cfg(not(feature = "etcd"))]
                panic!(
                    "the etcd backend needs the `etcd` feature: \
                     cargo bench --all-features --bench handoff -- etcd"
                );
            }
            "etcd-cluster" => {
                #[cfg(feature = "etcd")]
                run(etcd::EtcdMaker::cluster_from_env(), &measurements, report).await;
                #[cfg(not(feature = "etcd"))]
                panic!(
                    "the etcd backend needs the `etcd` feature: \
                     cargo bench --all-features --bench handoff -- etcd-cluster"
                );
            }
            other => panic!("unknown backend {other:?} (memory, kubernetes, etcd, etcd-cluster)"),
        }
    });
    drop(runtime);
    report.finish();
}
