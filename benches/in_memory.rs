//! In-memory acquire + release throughput, through the `Lease` trait and through the `LeaseActor`
//! mailbox. Run with `cargo bench --bench in_memory`.
//!
//! After criterion has run, each estimate it wrote in this run (its typical time per iteration:
//! the slope, or the mean) is appended to the results file (see `benches/common/mod.rs`), from
//! which `scripts/bench-report.py` writes BENCHMARKS.md's table. No targets.

mod common;

use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use actix_coordination::{Acquire, InMemoryStore, Lease, LeaseActor, LeaseSettings, Release};
use common::Report;
use criterion::{criterion_group, Criterion};

/// The benchmarks, as criterion names them.
const IDS: [&str; 3] = [
    "in_memory/acquire+release/trait",
    "in_memory/acquire+release/actor",
    "in_memory/check_alive",
];

fn settings(owner: &str) -> LeaseSettings {
    LeaseSettings::builder("bench", owner)
        .ttl(Duration::from_secs(30))
        .build()
        .expect("valid settings")
}

fn through_the_trait(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = InMemoryStore::new();
    let lease = store.lease(settings("trait"));
    c.bench_function("in_memory/acquire+release/trait", |b| {
        b.to_async(&runtime).iter(|| async {
            assert!(lease.acquire().await.unwrap());
            assert!(lease.release().await.unwrap());
        })
    });
    c.bench_function("in_memory/check_alive", |b| {
        runtime.block_on(async { assert!(lease.acquire().await.unwrap()) });
        b.iter(|| assert!(std::hint::black_box(&lease).check_alive()));
        runtime.block_on(async { assert!(lease.release().await.unwrap()) });
    });
}

fn through_the_mailbox(c: &mut Criterion) {
    let system = actix_rt::System::new();
    let store = InMemoryStore::new();
    let actor = system.block_on(async { LeaseActor::new(store.lease(settings("actor"))).start() });
    c.bench_function("in_memory/acquire+release/actor", |b| {
        b.iter_custom(|iterations| {
            system.block_on(async {
                let start = Instant::now();
                for _ in 0..iterations {
                    assert!(actor.send(Acquire).await.unwrap().unwrap());
                    assert!(actor.send(Release).await.unwrap().unwrap());
                }
                start.elapsed()
            })
        })
    });
}

fn config() -> Criterion {
    Criterion::default().output_directory(&common::criterion_dir())
}

criterion_group! {
    name = benches;
    config = config();
    targets = through_the_trait, through_the_mailbox
}

fn main() {
    let started = SystemTime::now();
    benches();
    Criterion::default().configure_from_args().final_summary();

    let mut report = Report::new("in_memory");
    for id in IDS {
        let Some(typical) = common::criterion_estimate(id, started) else {
            continue; // not run this time (filtered out, or `--test`)
        };
        let ns = typical["point_estimate"].as_f64().expect("point estimate");
        report.record(
            "throughput",
            "memory",
            Some(id),
            serde_json::json!({
                "reference": "criterion's typical time per iteration (slope, else mean)",
                "values": {
                    "ns_per_iteration": ns,
                    "per_second": 1e9 / ns,
                    "ci_low_ns": typical["confidence_interval"]["lower_bound"],
                    "ci_high_ns": typical["confidence_interval"]["upper_bound"],
                },
            }),
            &[],
        );
    }
    report.finish();
}
