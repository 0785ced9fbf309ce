//! How fast the end of a tenure reaches the code acting under it: from the local deadline of a
//! holder whose renewals hang, to its singleton's [`TenureGuard::ended`] resolving and to the
//! singleton stopped (its `stopped` hook), on an idle arbiter and on a busy one. The figures are
//! recorded in BENCHMARKS.md.
//!
//! ```text
//! cargo bench --bench guard                 # 100 rounds per arbiter load
//! cargo bench --bench guard -- --check      # also fail when a target is missed
//! ```
//!
//! The results are appended to the results file (see `benches/common/mod.rs`), from which
//! `scripts/bench-report.py` writes BENCHMARKS.md's tables.
//!
//! Each round: a `ClusterSingletonManager` acquires a fresh in-memory lease (ttl 1 s, deadline
//! 900 ms after the claim) and starts the singleton; right away (before the first renewal, so that
//! the deadline cannot move) the store stops answering the holder. The singleton awaits
//! `info.guard.ended()` on a task of its arbiter and records when it resolved; its `stopped` hook
//! records when it stopped. Both are measured against the deadline (`Lease::deadline`).
//!
//! *Busy* means another task on the same arbiter keeps the thread in slices of 50 µs without
//! pause (spin 50 µs, yield, spin again).
//!
//! Targets (issue "Actors never act outside a tenure"): the guard resolves within 1 ms of the
//! deadline (p99), the singleton is stopped within 5 ms (p99), when the singleton does not block;
//! checked on the idle and on the busy arbiter.
//! Environment: `BENCH_GUARD_ROUNDS` (100).

mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    ClusterSingletonManager, GetStatus, InMemoryStore, Lease, LeaseSettings, SingletonInfo,
    SingletonState,
};
use common::{ms, summarize, Check, Report};

type At = Rc<Cell<Option<std::time::Instant>>>;

/// The singleton: records when its guard resolved and when it stopped.
struct Probe {
    info: SingletonInfo,
    resolved: At,
    stopped: At,
}

impl Actor for Probe {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        // A task of its own on the singleton's arbiter (in the singleton's context it would be
        // dropped unpolled: the manager's watcher, polled first, stops the context at the same
        // instant).
        let resolved = Rc::clone(&self.resolved);
        let ended = self.info.guard.ended();
        actix_rt::spawn(async move {
            ended.await;
            resolved.set(Some(std::time::Instant::now()));
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.stopped.set(Some(std::time::Instant::now()));
    }
}

/// Keeps its arbiter busy: a task that spins for 50 µs, yields, and again, until dropped.
struct Spinner(tokio::task::JoinHandle<()>);

impl Spinner {
    fn start() -> Self {
        Self(actix_rt::spawn(async {
            loop {
                let until = std::time::Instant::now() + Duration::from_micros(50);
                while std::time::Instant::now() < until {
                    std::hint::spin_loop();
                }
                tokio::task::yield_now().await;
            }
        }))
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Sample {
    resolved: Vec<f64>,
    stopped: Vec<f64>,
}

async fn measure(rounds: usize) -> Sample {
    let mut sample = Sample {
        resolved: Vec::new(),
        stopped: Vec::new(),
    };
    for round in 0..rounds {
        let store = InMemoryStore::new();
        let owner = format!("node-{round}");
        let lease = Arc::new(
            store.lease(
                LeaseSettings::builder("guard-bench", owner.as_str())
                    .ttl(Duration::from_secs(1))
                    .build()
                    .unwrap(),
            ),
        );
        let (resolved, stopped) = (At::default(), At::default());
        let (r, s) = (Rc::clone(&resolved), Rc::clone(&stopped));
        let manager = ClusterSingletonManager::from_arc(Arc::clone(&lease), move |info, _| Probe {
            info: info.clone(),
            resolved: Rc::clone(&r),
            stopped: Rc::clone(&s),
        })
        .start();
        while manager.send(GetStatus).await.unwrap().state != SingletonState::Running {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        // Before the first renewal (a third of the ttl after the claim): the deadline is final.
        store.pause(&owner);
        let deadline = lease.deadline().expect("held").into_std();
        let give_up = deadline + Duration::from_secs(2);
        while stopped.get().is_none() || resolved.get().is_none() {
            assert!(std::time::Instant::now() < give_up, "round {round}: no end");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        sample.resolved.push(ms(resolved.get().unwrap() - deadline));
        sample.stopped.push(ms(stopped.get().unwrap() - deadline));
        drop(manager);
    }
    sample
}

fn main() {
    let rounds = std::env::var("BENCH_GUARD_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let mut report = Report::new("guard");
    actix_rt::System::new().block_on(async {
        for busy in [false, true] {
            let spinner = busy.then(Spinner::start);
            let sample = measure(rounds).await;
            drop(spinner);
            let load = if busy { "busy" } else { "idle" };
            let resolved = summarize(&sample.resolved);
            let stopped = summarize(&sample.stopped);
            println!("{load} arbiter: deadline -> guard resolved: {resolved}");
            println!("{load} arbiter: deadline -> singleton stopped: {stopped}");
            report.record(
                "guard",
                "memory",
                Some(load),
                serde_json::json!({
                    "reference": "the lease's local deadline (Lease::deadline)",
                    "stats": { "resolved": resolved.json(), "stopped": stopped.json() },
                    "values": { "ttl_ms": 1000 },
                }),
                &[
                    Check::at_most("guard-resolved-p99", resolved.p99, 1.0, "ms"),
                    Check::at_most("guard-stopped-p99", stopped.p99, 5.0, "ms"),
                ],
            );
        }
    });
    report.finish();
}
