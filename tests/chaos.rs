//! Chaos runs against the real servers: several `singleton_node` processes compete for one lease
//! while the harness kills, freezes and blackholes them and restarts the server. The harness checks
//! that no two processes ever acted at once and that a frozen holder never acted after resuming,
//! and draws the timeline (`target/chaos/<backend>-<pid>/timeline.svg`).
//!
//! The test suite runs a short run; `CHAOS_SECONDS=600 cargo test --all-features --test chaos --
//! --nocapture` runs a long one (see BENCHMARKS.md).

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::net::SocketAddr;
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
    println!(
        "{} tenures, {} faults in {:.0?}; timeline: {}",
        report.tenures.len(),
        report.faults.len(),
        report.duration,
        report.svg.display()
    );
    for (fault, after) in &report.takeovers {
        println!("  {fault:?} of the holder -> another node acted {after:.2?} later");
    }
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
