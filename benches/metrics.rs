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

fn config() -> Criterion {
    Criterion::default().output_directory(&common::criterion_dir())
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
        let Some(typical) = common::criterion_estimate(&id, started) else {
            continue; // not run this time (filtered out, or `--test`)
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
