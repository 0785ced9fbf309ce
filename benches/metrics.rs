//! The cost of the `metrics` feature on the two hot paths of a holder: one renewal, and
//! `check_alive`. Run it twice and compare:
//!
//! ```text
//! cargo bench --bench metrics                      # feature off: nothing is recorded
//! cargo bench --bench metrics --features metrics   # feature on, a Prometheus recorder installed
//! ```
//!
//! A renewal is measured whole, on an in-memory lease under a paused clock: the timer fires, the
//! renewal task renews (one store call), extends the deadline and, with the feature, records the
//! renewal counter, its duration, its deadline margin and the backend request. `check_alive`
//! records nothing by design (it reads the published tenure and the clock), so its two figures
//! should agree. The estimates are appended to the results file (see `benches/common/mod.rs`),
//! from which `scripts/bench-report.py` writes BENCHMARKS.md's table. No targets.

mod common;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use actix_coordination::{InMemoryStore, Lease, LeaseSettings};
use common::Report;
use criterion::{criterion_group, Criterion};

/// `on` or `off`: whether this build has the feature.
const FEATURE: &str = if cfg!(feature = "metrics") {
    "on"
} else {
    "off"
};

const RENEWAL_INTERVAL: Duration = Duration::from_secs(10);

fn ids() -> [String; 2] {
    [
        format!("metrics/renewal/feature-{FEATURE}"),
        format!("metrics/check_alive/feature-{FEATURE}"),
    ]
}

fn install_recorder() {
    #[cfg(feature = "metrics")]
    {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("install the Prometheus recorder");
        actix_coordination::describe_metrics();
    }
}

fn hot_paths(c: &mut Criterion) {
    install_recorder();
    let [renewal_id, check_alive_id] = ids();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    let store = InMemoryStore::new();
    let settings = LeaseSettings::builder("bench-metrics", "a")
        .ttl(Duration::from_secs(30))
        .renewal_interval(RENEWAL_INTERVAL)
        .build()
        .expect("valid settings");
    let lease = store.lease(settings);
    runtime.block_on(async { assert!(lease.acquire().await.unwrap()) });
    c.bench_function(&renewal_id, |b| {
        b.iter(|| {
            runtime.block_on(async {
                let before = lease.stats().renewals;
                // The paused clock jumps to the renewal's timer; then the renewal task runs.
                tokio::time::sleep(RENEWAL_INTERVAL).await;
                while lease.stats().renewals == before {
                    tokio::task::yield_now().await;
                }
            })
        })
    });
    let _runtime = runtime.enter();
    c.bench_function(&check_alive_id, |b| {
        b.iter(|| assert!(std::hint::black_box(&lease).check_alive()))
    });
}

/// Where criterion writes its estimates (as `benches/in_memory.rs` chooses it).
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("criterion")
}

fn config() -> Criterion {
    Criterion::default().output_directory(&criterion_dir())
}

criterion_group! {
    name = benches;
    config = config();
    targets = hot_paths
}

fn main() {
    let started = SystemTime::now();
    benches();
    Criterion::default().configure_from_args().final_summary();

    let mut report = Report::new("metrics");
    for id in ids() {
        let dir: String = id
            .chars()
            .map(|c| if "?\"/\\*<>:|^".contains(c) { '_' } else { c })
            .collect();
        let path = criterion_dir().join(dir).join("new").join("estimates.json");
        let fresh = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .is_ok_and(|m| m >= started);
        if !fresh {
            continue; // not run this time (filtered out, or `--test`)
        }
        let estimates: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read estimates"))
                .expect("criterion's estimates.json");
        let typical = if estimates["slope"].is_object() {
            &estimates["slope"]
        } else {
            &estimates["mean"]
        };
        report.record(
            "metrics_overhead",
            "memory",
            Some(&id),
            serde_json::json!({
                "reference": "criterion's typical time per iteration (slope, else mean)",
                "values": {
                    "ns_per_iteration": typical["point_estimate"],
                    "ci_low_ns": typical["confidence_interval"]["lower_bound"],
                    "ci_high_ns": typical["confidence_interval"]["upper_bound"],
                },
            }),
            &[],
        );
    }
    report.finish();
}
