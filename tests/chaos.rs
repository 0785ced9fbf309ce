//! Chaos runs against the real servers: several `singleton_node` processes compete for one lease
//! while the harness kills, freezes and blackholes them and restarts the server. The harness checks
//! that no two processes ever acted at once and that a frozen holder never acted after resuming,
//! and draws the timeline (`target/chaos/<backend>-<pid>/timeline.svg`).
//!
//! The test suite runs a short run; `CHAOS_SECONDS=600 cargo test --all-features --test chaos --
//! --nocapture --test-threads=1` runs long ones, `CHAOS_SEED` replays a run's choice of faults
//! (see docs/chaos/RESULTS.md). Each run leaves the nodes' event logs and logs, their
//! configurations, the server's log (Kubernetes) and `summary.txt` in its directory.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::chaos::{self, ChaosBackend, ChaosReport};

const TTL: Duration = Duration::from_secs(3);

fn duration() -> Duration {
    let seconds = std::env::var("CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    Duration::from_secs(seconds)
}

fn seed() -> u64 {
    std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id().into())
}

fn summarize(report: &ChaosReport) {
    print!("{}", report.summary());
    assert!(
        report.tenures.len() >= 2,
        "the lease never moved: {:#?}",
        report.tenures
    );
    assert!(!report.takeovers.is_empty(), "no fault hit a holder");
}

struct EtcdChaos {
    etcd: common::etcd::EtcdProcess,
}

impl ChaosBackend for EtcdChaos {
    fn name(&self) -> &str {
        "etcd"
    }

    async fn prepare(&mut self, _run_dir: &Path) {}

    fn upstream(&self) -> SocketAddr {
        common::etcd::socket_addr(&self.etcd.endpoint())
    }

    fn config_toml(&self, proxy: SocketAddr, ttl: Duration) -> String {
        format!(
            "[leases.singleton]\nbackend = \"etcd\"\nttl = \"{}ms\"\n\n[leases.singleton.etcd]\nendpoints = [\"http://{proxy}\"]\n",
            ttl.as_millis()
        )
    }

    async fn restart_server(&mut self) {
        self.etcd.restart().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_etcd() {
    let mut backend = EtcdChaos {
        etcd: common::etcd::EtcdProcess::start("chaos").await,
    };
    let seed = seed();
    println!("chaos on etcd, seed {seed}");
    let report = chaos::run(&mut backend, 3, TTL, duration(), seed).await;
    summarize(&report);
}

/// How long a restarted kube-apiserver may take to be ready.
const APISERVER_READY_WITHIN: Duration = Duration::from_secs(90);

/// The nodes reach a private kube-apiserver on the test cluster's etcd (restarting the cluster's
/// own would disturb other tests), as the `lease-holder` user of deploy/rbac.yaml.
struct KubernetesChaos {
    apiserver: Option<common::k8s::ApiserverProcess>,
    token_file: PathBuf,
}

impl KubernetesChaos {
    fn apiserver(&self) -> &common::k8s::ApiserverProcess {
        self.apiserver.as_ref().expect("prepared")
    }
}

impl ChaosBackend for KubernetesChaos {
    fn name(&self) -> &str {
        "kubernetes"
    }

    async fn prepare(&mut self, run_dir: &Path) {
        let env = common::k8s::env();
        self.token_file = run_dir.join("lease-holder.token");
        std::fs::write(&self.token_file, &env.token).unwrap();
        let [port] = common::free_loopback_ports();
        let mut apiserver =
            common::k8s::ApiserverProcess::start(port, run_dir.join("kube-apiserver.log"));
        apiserver
            .ready(tokio::time::Instant::now() + APISERVER_READY_WITHIN)
            .await;
        self.apiserver = Some(apiserver);
    }

    fn upstream(&self) -> SocketAddr {
        self.apiserver().addr()
    }

    fn config_toml(&self, proxy: SocketAddr, ttl: Duration) -> String {
        // The API server's certificate is for 127.0.0.1, so TLS through the proxy verifies.
        let env = common::k8s::env();
        format!(
            "[leases.singleton]\nbackend = \"kubernetes\"\nttl = \"{}ms\"\n\n\
             [leases.singleton.kubernetes]\nnamespace = \"{}\"\napi-url = \"https://{proxy}\"\n\
             token-file = \"{}\"\nca-file = \"{}\"\n",
            ttl.as_millis(),
            env.namespace,
            self.token_file.display(),
            env.ca.display()
        )
    }

    async fn restart_server(&mut self) {
        self.apiserver
            .as_mut()
            .expect("prepared")
            .restart(APISERVER_READY_WITHIN)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_kubernetes() {
    let mut backend = KubernetesChaos {
        apiserver: None,
        token_file: PathBuf::new(),
    };
    let seed = seed();
    println!("chaos on kubernetes, seed {seed}");
    let report = chaos::run(&mut backend, 3, TTL, duration(), seed).await;
    summarize(&report);
}

/// A frozen holder (SIGSTOP past its TTL) whose singleton runs on a `run_interval` timer: once
/// resumed it runs nothing under its old tenure (no step, no tick), although the other node took
/// over meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_holder_runs_nothing_etcd() {
    let mut backend = EtcdChaos {
        etcd: common::etcd::EtcdProcess::start("pause").await,
    };
    let report = chaos::pause_run(&mut backend, TTL).await;
    println!("{report:?}");
}

/// The same on Kubernetes (a private kube-apiserver on the test cluster's etcd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_holder_runs_nothing_kubernetes() {
    let mut backend = KubernetesChaos {
        apiserver: None,
        token_file: PathBuf::new(),
    };
    let report = chaos::pause_run(&mut backend, TTL).await;
    println!("{report:?}");
}
