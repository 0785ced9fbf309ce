//! Issue 37's simulation: a fleet of `SIM_NODES` (100) `ShardedWorkers` nodes × `SIM_SHARDS`
//! (10,000) shards of one group, on one `InMemoryStore`, in one process. Run with
//! `cargo bench --bench simulation` (no feature).
//!
//! The fleet runs under Tokio's **paused clock** (auto-advancing): waiting out a TTL or a renewal
//! interval costs no real time, so the run takes what the nodes compute, not what they wait. The
//! computing is real and measured on the real clock (`std::time::Instant`, and the process's CPU
//! time): every node runs on the one thread of the one actix `System`, so the process's CPU time
//! over a phase is the fleet's, and a node's share is a hundredth of it; each node's
//! `reconcile` (what it does on every change of the group: its view, its targets, its
//! competing) is timed alone, in the thread's CPU time (what it costs a core, however loaded the
//! machine), through its `trace` span `reconcile` (field `node`), by a `tracing` layer of this
//! bench that enables that span and nothing else. Each phase reports the reconciles per node
//! (median and busiest node) and one reconcile's CPU time, median and p90 over every node's
//! reconciles of the phase: in the steady window every reconcile is one that has nothing to do
//! (member renewals only), so its median and p90 are the cost of a no-op reconcile at S shards.
//!
//! Phases (each "settled": every shard held in the store by a live node and its worker running
//! there and nowhere else, every node holding ⌊S/N⌋ or ⌈S/N⌉):
//!
//! 1. **start**: the N nodes start at one instant of the fleet's clock (or one every
//!    `SIM_START_SPREAD_MS` / N); until settled.
//!
//!    Started at one instant of the paused clock, the nodes renew their member leases at one
//!    instant too, and each node sees the N renewals of an interval as one or two changes of its
//!    group watch, where a real fleet's renewals are spread over the interval and each is a
//!    change (a reconcile) on every node. The steady phase therefore reports what one reconcile
//!    that changes nothing costs a node, and N times it per interval as the cost in a real fleet.
//!    A spread start (`SIM_START_SPREAD_MS=10000`) measures it directly, at a price: each node's
//!    arrival finds a settled fleet, the first node takes every shard, and about S × (1 + 1/2 +
//!    … + 1/N) shards move during the start (20 × 2,000: 29 s of CPU for the start, 1.3 s when
//!    the nodes start at one instant).
//! 2. **steady**: a TTL later, a window of `SIM_INTERVALS` (5) renewal intervals, half an
//!    interval off the first node's renewals: the store's writes (acquires + renewals +
//!    releases, `InMemoryStore::stats`) per interval, target = N (the member renewals; bound
//!    shard leases are never renewed); nothing moves.
//! 3. **join**: node N+1 starts; shards moved (target: exactly the joiner's quota, ⌊S/(N+1)⌋ or
//!    ⌈S/(N+1)⌉, all to the joiner).
//! 4. **leave**: node `node-003` is shut down (`Shutdown`); shards moved (target: exactly its
//!    shards).
//! 5. **crash**: the store never answers node `node-007` again (`InMemoryStore::pause`: a frozen
//!    or dead process, no release); shards moved (target: exactly its shards) and when (after its
//!    member lease's TTL).
//!
//! Memory: the process's resident memory (`/proc/self/statm`) before the fleet starts and once
//! it has settled, per node and per shard (the store and every node's group view, leases,
//! managers and workers: what 100 processes would hold, minus 100 runtimes); and what one
//! node's group view alone takes (ten more watches of the group, each a copy of its records,
//! as every node keeps one).
//!
//! Environment: `SIM_NODES` (100), `SIM_SHARDS` (10,000), `SIM_TTL_SECS` (30),
//! `SIM_RENEWAL_SECS` (10), `SIM_INTERVALS` (5), `SIM_START_SPREAD_MS` (0),
//! `BENCH_RESULTS_FILE`. With `--check` the bench
//! exits with status 1 when a target was missed.

mod common;
#[path = "../tests/common/fleet_sim.rs"]
mod fleet_sim;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_coordination::{member_lease_name, Lease, LeaseSettings};
use common::{Check, Report};
use fleet_sim::{held_by, moved, node_name, Fleet, GROUP};
use tokio::time::{sleep, sleep_until};
use tracing::span::{Attributes, Id};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// Reconcile time per node, from the `reconcile` span of `ShardedWorkers`.

/// Per node: reconciles and the CPU time spent in them.
#[derive(Default, Clone, Copy)]
struct Spent {
    count: u64,
    total: Duration,
    max: Duration,
}

/// Per node what it spent, and every reconcile's CPU time (for the per-call median and p90).
#[derive(Default)]
struct Spending {
    per_node: HashMap<String, Spent>,
    calls: Vec<Duration>,
}

type Ledger = Arc<Mutex<Spending>>;

struct ReconcileTimer(Ledger);

struct SpanNode(String);
/// The thread's CPU time when the span was entered.
struct Entered(Duration);

fn is_reconcile(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.name() == "reconcile" && meta.target().starts_with("actix_coordination")
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for ReconcileTimer {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if is_reconcile(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        is_reconcile(meta)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        struct Visit(Option<String>);
        impl tracing::field::Visit for Visit {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "node" {
                    self.0 = Some(format!("{value:?}"));
                }
            }
        }
        let mut visit = Visit(None);
        attrs.record(&mut visit);
        if let (Some(span), Some(node)) = (ctx.span(id), visit.0) {
            span.extensions_mut().insert(SpanNode(node));
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Entered(thread_cpu_time()));
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let ext = span.extensions();
        let (Some(node), Some(entered)) = (ext.get::<SpanNode>(), ext.get::<Entered>()) else {
            return;
        };
        let took = thread_cpu_time().saturating_sub(entered.0);
        let mut ledger = self.0.lock().unwrap();
        ledger.calls.push(took);
        let spent = ledger.per_node.entry(node.0.clone()).or_default();
        spent.count += 1;
        spent.total += took;
        spent.max = spent.max.max(took);
    }
}

// ---------------------------------------------------------------------------------------------
// Process figures

fn clock(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clocks used here always exist on Linux.
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime({id})");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The process's CPU time (user + system, every thread).
fn cpu_time() -> Duration {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// The calling thread's CPU time: what a reconcile costs, whatever else the machine runs (on a
/// loaded machine the real time of a reconcile includes the time the thread waited for a core).
fn thread_cpu_time() -> Duration {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Resident memory in bytes (`/proc/self/statm`).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page as u64
}

/// What one phase cost: on the fleet's (paused) clock, on the real clock, in CPU, and per node in
/// reconciles.
struct Cost {
    virtual_time: Duration,
    wall: Duration,
    cpu: Duration,
    /// The part of `wall` the bench spent checking whether the fleet had settled.
    checking: Duration,
    /// Per node (sorted by total): reconciles and their CPU time.
    per_node: Vec<Spent>,
    /// Every reconcile's CPU time, sorted.
    calls: Vec<Duration>,
}

struct Meter {
    ledger: Ledger,
    wall: std::time::Instant,
    cpu: Duration,
    at: tokio::time::Instant,
    checking: Duration,
}

impl Meter {
    fn start(ledger: &Ledger, fleet: &Fleet) -> Self {
        *ledger.lock().unwrap() = Spending::default();
        Self {
            ledger: Arc::clone(ledger),
            wall: std::time::Instant::now(),
            cpu: cpu_time(),
            at: tokio::time::Instant::now(),
            checking: fleet.checking.get(),
        }
    }

    fn stop(self, fleet: &Fleet) -> Cost {
        let mut spending = std::mem::take(&mut *self.ledger.lock().unwrap());
        let mut per_node: Vec<Spent> = spending.per_node.values().copied().collect();
        per_node.sort_by_key(|s| s.total);
        spending.calls.sort();
        Cost {
            virtual_time: self.at.elapsed(),
            wall: self.wall.elapsed(),
            cpu: cpu_time() - self.cpu,
            checking: fleet.checking.get() - self.checking,
            per_node,
            calls: spending.calls,
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Cost {
    fn median_node(&self) -> Spent {
        self.per_node
            .get(self.per_node.len() / 2)
            .copied()
            .unwrap_or_default()
    }

    /// The `p`-th percentile (0–100) of one reconcile's CPU time, over every node's.
    fn call(&self, p: usize) -> Duration {
        if self.calls.is_empty() {
            return Duration::ZERO;
        }
        self.calls[((self.calls.len() - 1) * p).div_ceil(100)]
    }

    fn max_node(&self) -> Spent {
        self.per_node.last().copied().unwrap_or_default()
    }

    fn describe(&self) -> String {
        let (med, max) = (self.median_node(), self.max_node());
        let all: u64 = self.per_node.iter().map(|s| s.count).sum();
        let longest = self
            .per_node
            .iter()
            .map(|s| s.max)
            .max()
            .unwrap_or_default();
        format!(
            "{:.1} s on the fleet's clock, {:.2} s real ({:.2} s of it the bench's checks), \
             CPU {:.2} s; reconciles per node: median {} taking {:.1} ms of CPU, most {} taking \
             {:.1} ms (all nodes: {all}, one reconcile: median {:.3} ms, p90 {:.3} ms, longest \
             {:.2} ms)",
            self.virtual_time.as_secs_f64(),
            self.wall.as_secs_f64(),
            self.checking.as_secs_f64(),
            self.cpu.as_secs_f64(),
            med.count,
            ms(med.total),
            max.count,
            ms(max.total),
            ms(self.call(50)),
            ms(self.call(90)),
            ms(longest),
        )
    }

    fn json(&self) -> serde_json::Value {
        let (med, max) = (self.median_node(), self.max_node());
        serde_json::json!({
            "virtual_s": self.virtual_time.as_secs_f64(),
            "wall_s": self.wall.as_secs_f64(),
            "cpu_s": self.cpu.as_secs_f64(),
            "checking_s": self.checking.as_secs_f64(),
            "reconciles_all_nodes": self.per_node.iter().map(|s| s.count).sum::<u64>(),
            "reconcile_per_node_median": { "count": med.count, "ms": ms(med.total) },
            "reconcile_per_node_max": { "count": max.count, "ms": ms(max.total) },
            "reconcile_longest_ms": ms(self.per_node.iter().map(|s| s.max).max().unwrap_or_default()),
            "reconcile_call_median_ms": ms(self.call(50)),
            "reconcile_call_p90_ms": ms(self.call(90)),
        })
    }
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let nodes = env("SIM_NODES", 100) as usize;
    let shards = env("SIM_SHARDS", 10_000) as usize;
    let ttl = Duration::from_secs(env("SIM_TTL_SECS", 30));
    let renewal = Duration::from_secs(env("SIM_RENEWAL_SECS", 10));
    let intervals = env("SIM_INTERVALS", 5).max(1);
    // The nodes start one every `spread / N` (by default all at once).
    let spread = Duration::from_millis(env("SIM_START_SPREAD_MS", 0));

    let ledger = Ledger::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(ReconcileTimer(Arc::clone(&ledger))),
    )
    .expect("the bench's subscriber");

    let mut report = Report::new("simulation");
    let load_before = common::load_average();
    println!(
        "simulation: {nodes} nodes × {shards} shards, TTL {ttl:?} / renewal {renewal:?}, \
         one process, one in-memory store, paused clock; load {load_before}"
    );

    let poll = Duration::from_millis(10);
    let within = ttl * 20;
    let results = actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("tokio runtime")
    })
    .block_on(async move {
        let mut fleet = Fleet::new(shards, ttl, renewal);
        let rss_empty = rss();

        // 1. start
        let meter = Meter::start(&ledger, &fleet);
        fleet.start_all(nodes, spread).await;
        let (settled, _) = fleet.settle(within, poll).await;
        let start = meter.stop(&fleet);
        let rss_settled = rss();
        // What a node's group view alone costs: ten more watches of the group (each a copy of
        // its N + S records, as every node keeps), dropped at once.
        let probe = fleet
            .store
            .lease(LeaseSettings::new("probe.view", "probe").expect("settings"));
        let views: Vec<_> = (0..10)
            .map(|_| {
                probe
                    .watch_group(&format!("{GROUP}."))
                    .expect("a group watch")
            })
            .collect();
        let rss_views = rss();
        drop(views);
        let view_bytes = rss_views.saturating_sub(rss_settled) as f64 / 10.0;
        let counts = fleet.counts(&settled);
        let (low, high) = (
            counts.values().min().copied().unwrap_or(0),
            counts.values().max().copied().unwrap_or(0),
        );
        println!(
            "start: settled, {low}..={high} shards per node; {}",
            start.describe()
        );
        let grown = rss_settled.saturating_sub(rss_empty);
        println!(
            "memory: RSS {:.1} MB before the fleet, {:.1} MB settled: {:.2} MB per node, \
             {:.2} KB per shard",
            rss_empty as f64 / 1e6,
            rss_settled as f64 / 1e6,
            grown as f64 / 1e6 / nodes as f64,
            grown as f64 / 1e3 / shards as f64,
        );
        println!(
            "memory: of which each node's group view ({} records): {:.2} MB",
            nodes + shards,
            view_bytes / 1e6
        );

        // 2. steady
        sleep(ttl).await;
        let member = member_lease_name(GROUP, &node_name(0));
        let renewed = fleet.store.record(&member).unwrap().expires_at.unwrap() - ttl;
        // Between two nodes' renewals (node i renews at node-000's instants + i × spread / N).
        let step = if spread.is_zero() {
            renewal / 2
        } else {
            spread / (2 * nodes as u32)
        };
        sleep_until(renewed + renewal + step).await;
        let before = fleet.store.stats();
        let meter = Meter::start(&ledger, &fleet);
        sleep(renewal * intervals as u32).await;
        let steady = meter.stop(&fleet);
        let after = fleet.store.stats();
        let writes = (after.acquires - before.acquires)
            + (after.renewals - before.renewals)
            + (after.releases - before.releases);
        let per_interval = writes as f64 / intervals as f64;
        let still = fleet.settled().map(|h| moved(&settled, &h).len());
        let med = steady.median_node();
        let one = med
            .total
            .checked_div(med.count.max(1) as u32)
            .unwrap_or_default();
        println!(
            "steady, per node and renewal interval: {:.1} reconciles taking {:.1} ms ({:.2} % \
             of a core); one reconcile that changes nothing: {:.2} ms, so with the {nodes} \
             renewals of an interval spread over it, {:.0} ms per node and interval ({:.2} % of \
             a core)",
            med.count as f64 / intervals as f64,
            ms(med.total) / intervals as f64,
            med.total.as_secs_f64() / (renewal.as_secs_f64() * intervals as f64) * 100.0,
            ms(one),
            ms(one) * nodes as f64,
            one.as_secs_f64() * nodes as f64 / renewal.as_secs_f64() * 100.0,
        );
        println!(
            "steady: {writes} writes in {intervals} renewal intervals = {per_interval:.2} per \
             interval ({} acquires, {} renewals, {} releases); moved {still:?}; {}",
            after.acquires - before.acquires,
            after.renewals - before.renewals,
            after.releases - before.releases,
            steady.describe()
        );

        // 3. join
        let joiner = node_name(nodes);
        let meter = Meter::start(&ledger, &fleet);
        fleet.start(&joiner);
        let (joined, _) = fleet.settle(within, poll).await;
        let join = meter.stop(&fleet);
        let quota = held_by(&joined, &joiner);
        let join_moved = moved(&settled, &joined);
        println!(
            "join: {} moved, the joiner holds {} (quota {}..={}), {} of the moved to it; {}",
            join_moved.len(),
            quota.len(),
            shards / (nodes + 1),
            shards.div_ceil(nodes + 1),
            join_moved.iter().filter(|i| quota.contains(i)).count(),
            join.describe()
        );

        // 4. leave
        let leaver = node_name(3);
        let theirs = held_by(&joined, &leaver);
        let meter = Meter::start(&ledger, &fleet);
        fleet.leave(&leaver).await;
        let (left, _) = fleet.settle(within, poll).await;
        let leave = meter.stop(&fleet);
        let leave_moved = moved(&joined, &left);
        println!(
            "leave: {} moved, the leaver held {}; {}",
            leave_moved.len(),
            theirs.len(),
            leave.describe()
        );

        // 5. crash
        let crashed = node_name(7);
        let its = held_by(&left, &crashed);
        let crashed_member = member_lease_name(GROUP, &crashed);
        let meter = Meter::start(&ledger, &fleet);
        fleet.crash(&crashed);
        // Its member lease expires in the store a TTL after its last renewal: nothing can move
        // before (the bench checks from just before, not all along).
        let expiry = fleet
            .store
            .record(&crashed_member)
            .unwrap()
            .expires_at
            .unwrap();
        sleep_until(expiry - Duration::from_millis(100)).await;
        let (after_crash, _) = fleet.settle(within, Duration::from_millis(1)).await;
        let beyond_ttl = tokio::time::Instant::now().saturating_duration_since(expiry);
        let crash = meter.stop(&fleet);
        let crash_moved = moved(&left, &after_crash);
        println!(
            "crash: {} moved, the crashed node held {}, all running elsewhere {:.0} ms after its \
             member lease expired; {}",
            crash_moved.len(),
            its.len(),
            ms(beyond_ttl),
            crash.describe()
        );
        let overlaps = fleet.log.borrow().overlaps;
        println!("overlaps (a worker started while another node's ran): {overlaps}");

        serde_json::json!({
            "low": low, "high": high,
            "rss_empty": rss_empty, "rss_settled": rss_settled, "view_bytes": view_bytes,
            "writes": writes, "per_interval": per_interval,
            "steady_moved": still.unwrap_or(usize::MAX),
            "steady_one_reconcile_ms": ms(one),
            "join_moved": join_moved.len(), "join_quota": quota.len(),
            "join_all_to_joiner": join_moved == quota,
            "leave_moved": leave_moved.len(), "leaver_held": theirs.len(),
            "leave_exact": leave_moved == theirs,
            "crash_moved": crash_moved.len(), "crashed_held": its.len(),
            "crash_exact": crash_moved == its,
            "crash_beyond_ttl_ms": ms(beyond_ttl),
            "overlaps": overlaps,
            "start": start.json(), "steady": steady.json(), "join": join.json(),
            "leave": leave.json(), "crash": crash.json(),
        })
    });

    let r = &results;
    let n = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    let (low, high) = (n("low"), n("high"));
    let checks = [
        Check::at_most("sim-spread", high - low, 1.0, "shards between nodes"),
        Check::exactly(
            "sim-writes-per-interval",
            n("per_interval"),
            nodes as f64,
            "writes",
        ),
        Check::exactly("sim-steady-moved", n("steady_moved"), 0.0, "shards"),
        Check::exactly("sim-join-moved", n("join_moved"), n("join_quota"), "shards"),
        Check::exactly(
            "sim-join-quota",
            f64::from(
                r["join_quota"].as_u64() == Some((shards / (nodes + 1)) as u64)
                    || r["join_quota"].as_u64() == Some(shards.div_ceil(nodes + 1) as u64),
            ),
            1.0,
            "(1: the joiner's quota)",
        ),
        Check::exactly(
            "sim-join-to-joiner",
            f64::from(r["join_all_to_joiner"] == true),
            1.0,
            "(1: every moved shard to the joiner)",
        ),
        Check::exactly(
            "sim-leave-moved",
            n("leave_moved"),
            n("leaver_held"),
            "shards",
        ),
        Check::exactly(
            "sim-leave-exact",
            f64::from(r["leave_exact"] == true),
            1.0,
            "(1: exactly the leaver's shards)",
        ),
        Check::exactly(
            "sim-crash-moved",
            n("crash_moved"),
            n("crashed_held"),
            "shards",
        ),
        Check::exactly(
            "sim-crash-exact",
            f64::from(r["crash_exact"] == true),
            1.0,
            "(1: exactly the crashed node's shards)",
        ),
        Check::exactly("sim-overlaps", n("overlaps"), 0.0, "overlaps"),
    ];
    let grown = n("rss_settled") - n("rss_empty");
    report.record(
        "simulation",
        "memory",
        Some(&format!("{nodes}x{shards}")),
        serde_json::json!({
            "reference": "one process, one in-memory store, paused clock; times on the real clock",
            "values": {
                "nodes": nodes,
                "shards": shards,
                "ttl_s": ttl.as_secs_f64(),
                "renewal_s": renewal.as_secs_f64(),
                "intervals": intervals,
                "start_spread_ms": spread.as_millis() as u64,
                "rss_per_node_bytes": grown / nodes as f64,
                "rss_per_shard_bytes": grown / shards as f64,
                "load_before": load_before,
                "result": results,
            },
        }),
        &checks,
    );
    report.finish();
}
