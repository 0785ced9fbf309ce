//! What placement costs a node at the scale of issue 37: 10,000 shards over 100 members. Run with
//! `cargo bench --bench placement`.
//!
//! * `placement/10000x100/members-changed`: a join (the ideal assignment computed anew, every
//!   (shard, member) pair scored once, then the holders kept within their quotas), which is what
//!   every node pays once per change of the members;
//! * `placement/10000x100/holders-changed`: the same members with one shard moved (a handover, a
//!   claim): the ideal assignment is kept ([`Placer`]), only the holders are looked at;
//! * `placement/10000x100/sorted-pairs`: the rule as first written (every pair built and sorted:
//!   1 M pairs), for comparison.
//!
//! After criterion has run, each estimate is appended to the results file (see
//! `benches/common/mod.rs`), from which `scripts/bench-report.py` writes BENCHMARKS.md's table.
//! No targets.

mod common;

use std::collections::HashMap;
use std::time::SystemTime;

use actix_coordination::{place, placement_score, Placer};
use common::Report;
use criterion::{criterion_group, Criterion};

const SHARDS: usize = 10_000;
const MEMBERS: usize = 100;

/// The benchmarks, as criterion names them.
const IDS: [&str; 3] = [
    "placement/10000x100/members-changed",
    "placement/10000x100/holders-changed",
    "placement/10000x100/sorted-pairs",
];

fn shards() -> Vec<String> {
    (0..SHARDS).map(|i| i.to_string()).collect()
}

fn members(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i}")).collect()
}

/// Where every shard runs once `members` have settled (each on its target).
fn settled(shards: &[String], members: &[String]) -> HashMap<String, String> {
    let targets = place(shards, members, |_| None);
    shards
        .iter()
        .zip(targets)
        .map(|(s, t)| (s.clone(), members[t.unwrap()].clone()))
        .collect()
}

fn placement(c: &mut Criterion) {
    let shards = shards();
    let ids: Vec<&str> = shards.iter().map(String::as_str).collect();
    let before = members(MEMBERS - 1);
    let after = members(MEMBERS);
    let held = settled(&shards, &before);
    c.bench_function(IDS[0], |b| {
        b.iter(|| {
            // A fresh placer: the members differ from the last ones it saw.
            let mut placer = Placer::default();
            placer.place(&ids, &after, |s| held.get(s).map(String::as_str))
        })
    });
    let mut placer = Placer::default();
    let _ = placer.place(&ids, &after, |s| held.get(s).map(String::as_str));
    let mut moved = held.clone();
    c.bench_function(IDS[1], |b| {
        let mut i = 0usize;
        b.iter(|| {
            // One shard changes holder each time.
            i = (i + 1) % SHARDS;
            moved.insert(shards[i].clone(), after[i % MEMBERS].clone());
            placer.place(&ids, &after, |s| moved.get(s).map(String::as_str))
        })
    });
    c.bench_function(IDS[2], |b| {
        b.iter(|| {
            let mut pairs: Vec<(u64, usize, usize)> = Vec::with_capacity(SHARDS * MEMBERS);
            for (s, shard) in shards.iter().enumerate() {
                for (j, member) in after.iter().enumerate() {
                    pairs.push((placement_score(shard, member), s, j));
                }
            }
            pairs.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            pairs.len()
        })
    });
}

fn config() -> Criterion {
    Criterion::default().output_directory(&common::criterion_dir())
}

criterion_group! {
    name = benches;
    config = config();
    targets = placement
}

fn main() {
    let started = SystemTime::now();
    benches();
    Criterion::default().configure_from_args().final_summary();

    let mut report = Report::new("placement");
    for id in IDS {
        let Some(typical) = common::criterion_estimate(id, started) else {
            continue; // not run this time (filtered out, or `--test`)
        };
        let ns = typical["point_estimate"].as_f64().expect("point estimate");
        report.record(
            "placement",
            "memory",
            Some(id),
            serde_json::json!({
                "reference": "criterion's typical time per iteration (slope, else mean)",
                "values": {
                    "ns_per_iteration": ns,
                    "shards": SHARDS,
                    "members": MEMBERS,
                    "ci_low_ns": typical["confidence_interval"]["lower_bound"],
                    "ci_high_ns": typical["confidence_interval"]["upper_bound"],
                },
            }),
            &[],
        );
    }
    report.finish();
}
