//! What routing a request to its shard's node costs, and how long a shard that moves answers
//! `503` (issue 38). In memory, no sockets: the requests go through actix-web's
//! `test::init_service` (the whole service stack, routing, extractors and middleware, without the
//! HTTP codec and the loopback, which would add tens of microseconds of noise to a difference of
//! a few). Run with `cargo bench --features web --bench routing`.
//!
//! **Per request** (criterion; two nodes `a` and `b` of a 32-shard group, 16 shards each, the
//! app on node `a`):
//!
//! * `routing/plain`: `GET /plain/{id}` to a handler without the middleware (the baseline);
//! * `routing/routed/here`: `GET /orders/{id}` through [`ShardRouting`] for an entity whose shard
//!   runs on `a`: served, the handler takes the [`RoutedShard`] (its overhead is this minus the
//!   baseline);
//! * `routing/routed/redirect`: the same for an entity whose shard runs on `b`: `307` to `b`'s
//!   advertised address, no handler;
//! * `routing/locate_entity/10000/here` and `.../elsewhere`: [`ShardDirectory::locate_entity`]
//!   alone in a group of 10,000 shards over two nodes, for entities whose shard runs on the asking
//!   node and on the other one (a different entity each call, from 256 of each).
//!
//! Each request is built, called and its body read inside the timed loop (the same work in all
//! three). Criterion's median per iteration is recorded, with its typical estimate.
//!
//! **The `503` window per move** (custom timing, real clock, `BENCH_ROUTING_ROUNDS` rounds, 5
//! unless set, `0` skips it): node `a` runs all 32 shards; `b` joins and `a` hands it 16 (four at
//! a time, the default `max_handovers`); then `b` shuts down (`Shutdown`: its shard leases are
//! bound to its member lease, the default, so its workers stop and the retirement of its member
//! lease frees its 16 shards in one write, which `a` then claims). A client on a thread of its
//! own (as an `HttpServer` worker is) polls one entity of every shard through both nodes' apps,
//! round after round with a 100 µs sleep between rounds; it starts before `b` does. For each
//! shard that changed node it records: the *window*, from the first `503` either node answered
//! for the shard to the first `200` at its new owner (0 when no poll saw a `503`); the *gap*,
//! from the last `200` at the old owner to the first `200` at the new one (no node served it in
//! between, as far as the polls saw); how long the old owner answered `503` before it
//! redirected to the new one; and whether a client sent on by the old owner could be sent back
//! (the new owner redirected to the old one after the old one's first redirect to it). Each figure is accurate to one polling
//! round (recorded too).
//! `b` is polled once its group watch has listed the group (before, every request to it is a
//! `503`, whichever shard) and until its `Shutdown` answered.
//!
//! The results are appended to the results file (see `benches/common/mod.rs`), from which
//! `scripts/bench-report.py` writes BENCHMARKS.md's tables. No targets.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use actix_coordination::{
    shard_for, EntityId, GetShards, InMemoryLease, InMemoryStore, LeaseSettings, LocateError,
    RoutedShard, ShardDirectory, ShardInfo, ShardRouting, ShardedSettings, ShardedWorkers,
    Shutdown,
};
use actix_web::http::StatusCode;
use actix_web::test::{call_service, init_service, read_body, TestRequest};
use actix_web::{web, App, HttpResponse};
use common::{ms, summarize, Report};
use criterion::{criterion_group, Criterion};

const GROUP: &str = "orders";
/// The shards of the group the requests are routed in.
const SHARDS: usize = 32;
/// The shards of the group `locate_entity` is measured in.
const LOCATE_SHARDS: usize = 10_000;

/// The benchmarks, as criterion names them, and what each measures.
const IDS: [&str; 5] = [
    "routing/plain",
    "routing/routed/here",
    "routing/routed/redirect",
    "routing/locate_entity/10000/here",
    "routing/locate_entity/10000/elsewhere",
];

struct Worker;

impl Actor for Worker {
    type Context = Context<Self>;
}

type Node = Addr<ShardedWorkers<Worker, InMemoryLease>>;

fn address(node: &str) -> String {
    format!("http://{node}.example:8080")
}

/// Node `node` of a group of `shards` shards, started, advertising its address; its directory.
fn start(
    store: &InMemoryStore,
    node: &str,
    shards: usize,
    settings: ShardedSettings,
) -> (Node, ShardDirectory) {
    let workers = build(store, node, shards, settings);
    let directory = workers.directory();
    (workers.start(), directory)
}

/// Node `node`, not started yet (its group watch is).
fn build(
    store: &InMemoryStore,
    node: &str,
    shards: usize,
    settings: ShardedSettings,
) -> ShardedWorkers<Worker, InMemoryLease> {
    let (leases, owner, member) = (store.clone(), node.to_owned(), store.clone());
    ShardedWorkers::with_count(
        GROUP,
        shards,
        move |name: &str| {
            let settings = LeaseSettings::builder(name, &owner)
                .ttl(Duration::from_secs(6))
                .renewal_interval(Duration::from_secs(2))
                .build()
                .expect("valid settings");
            leases.lease(settings)
        },
        |_: &ShardInfo, _: &mut Context<Worker>| Worker,
    )
    .expect("a valid group")
    .settings(settings)
    .expect("valid settings")
    .advertise(address(node), move |s| Ok::<_, Infallible>(member.lease(s)))
    .expect("a valid address")
}

/// Waits until each node runs its number of shards.
async fn settle(nodes: &[(&Node, usize)]) {
    // On the runtime's clock: the 10,000 shards settle under a paused one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    loop {
        let mut all = true;
        for (node, each) in nodes {
            all &= node.send(GetShards).await.expect("node alive").len() == *each;
        }
        if all {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the nodes did not settle"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn shutdown(node: &Node) {
    node.send(Shutdown)
        .await
        .expect("node alive")
        .expect("shut down");
}

/// Entities of the group's shards, one per shard (`customer-<n>`, the first whose shard it is).
fn one_entity_per_shard(shards: usize) -> Vec<String> {
    let mut found: Vec<Option<String>> = vec![None; shards];
    let mut left = shards;
    for n in 0.. {
        let entity = format!("customer-{n}");
        let slot = &mut found[shard_for(&entity, shards)];
        if slot.is_none() {
            *slot = Some(entity);
            left -= 1;
            if left == 0 {
                break;
            }
        }
    }
    found.into_iter().map(Option::unwrap).collect()
}

async fn plain(id: web::Path<String>) -> HttpResponse {
    HttpResponse::Ok().body(id.into_inner())
}

async fn routed(id: web::Path<String>, shard: RoutedShard) -> HttpResponse {
    std::hint::black_box(shard.fencing_token);
    HttpResponse::Ok().body(id.into_inner())
}

/// The app of a node with directory `directory`: `/plain/{id}` without the middleware,
/// `/orders/{id}` routed (a macro: the service's type is actix-http's, not named here).
macro_rules! app {
    ($directory:expr) => {
        init_service(
            App::new()
                .route("/plain/{id}", web::get().to(plain))
                .service(
                    web::resource("/orders/{id}")
                        .wrap(ShardRouting::new($directory, EntityId::path("id")))
                        .route(web::get().to(routed)),
                ),
        )
        .await
    };
}

fn requests(c: &mut Criterion) {
    let system = actix_rt::System::new();
    let store = InMemoryStore::new();
    let (a, da, b) = system.block_on(async {
        let (a, da) = start(&store, "a", SHARDS, ShardedSettings::default());
        let (b, _) = start(&store, "b", SHARDS, ShardedSettings::default());
        settle(&[(&a, SHARDS / 2), (&b, SHARDS / 2)]).await;
        (a, da, b)
    });
    let app = system.block_on(async { app!(da.clone()) });
    let entities = one_entity_per_shard(SHARDS);
    let on = |here: bool| {
        entities
            .iter()
            .find(|e| da.locate_entity(e).unwrap().here == here)
            .unwrap()
    };
    let cases = [
        (IDS[0], format!("/plain/{}", on(true)), StatusCode::OK),
        (IDS[1], format!("/orders/{}", on(true)), StatusCode::OK),
        (
            IDS[2],
            format!("/orders/{}", on(false)),
            StatusCode::TEMPORARY_REDIRECT,
        ),
    ];
    for (id, path, status) in cases {
        let response = system.block_on(async {
            call_service(&app, TestRequest::get().uri(&path).to_request()).await
        });
        assert_eq!(response.status(), status, "{path}");
        c.bench_function(id, |bencher| {
            bencher.iter_custom(|iterations| {
                system.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iterations {
                        let request = TestRequest::get().uri(&path).to_request();
                        let response = call_service(&app, request).await;
                        std::hint::black_box(read_body(response).await);
                    }
                    let elapsed = start.elapsed();
                    // The loop never yields (every call is ready at once): let the nodes run
                    // (their member renewals) between samples, outside the timing.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    elapsed
                })
            })
        });
    }
    system.block_on(async {
        shutdown(&b).await;
        shutdown(&a).await;
    });
}

fn locate(c: &mut Criterion) {
    // A paused clock (auto-advancing): 10,000 shards claimed one node after the other take no
    // real time waiting, and the clock does not move while the calls are timed (inside
    // `block_on`, never idle), so that no lease expires under them.
    let system = actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime")
    });
    let store = InMemoryStore::new();
    // All 10,000 shards start on `x`, which hands 5,000 to `y` at once.
    let at_once = ShardedSettings {
        max_handovers: LOCATE_SHARDS,
        ..ShardedSettings::default()
    };
    let (x, dx, y) = system.block_on(async {
        let (x, dx) = start(&store, "x", LOCATE_SHARDS, at_once.clone());
        settle(&[(&x, LOCATE_SHARDS)]).await;
        let (y, _) = start(&store, "y", LOCATE_SHARDS, at_once);
        settle(&[(&x, LOCATE_SHARDS / 2), (&y, LOCATE_SHARDS / 2)]).await;
        (x, dx, y)
    });
    // Read on the runtime's (paused) clock, as the timed calls are.
    let (here, elsewhere) = system.block_on(async { entities_by_place(&dx) });
    for (id, entities) in [(IDS[3], &here), (IDS[4], &elsewhere)] {
        c.bench_function(id, |bencher| {
            bencher.iter_custom(|iterations| {
                system.block_on(async {
                    let start = Instant::now();
                    for i in 0..iterations as usize {
                        let entity = &entities[i % entities.len()];
                        std::hint::black_box(dx.locate_entity(std::hint::black_box(entity)))
                            .expect("located");
                    }
                    // No yield: the paused clock stays where it is, and no lease expires.
                    start.elapsed()
                })
            })
        });
    }
    system.block_on(async {
        shutdown(&y).await;
        shutdown(&x).await;
    });
}

/// 256 entities whose shard runs on the node of `directory`, and 256 whose shard runs elsewhere.
fn entities_by_place(directory: &ShardDirectory) -> (Vec<String>, Vec<String>) {
    let (mut here, mut elsewhere) = (Vec::new(), Vec::new());
    for n in 0.. {
        let entity = format!("customer-{n}");
        let location = directory.locate_entity(&entity).expect("listed");
        let list = if location.here {
            &mut here
        } else {
            assert!(location.address.is_some(), "{location:?}");
            &mut elsewhere
        };
        if list.len() < 256 {
            list.push(entity);
        }
        if here.len() == 256 && elsewhere.len() == 256 {
            break;
        }
    }
    (here, elsewhere)
}

fn config() -> Criterion {
    Criterion::default().output_directory(&common::criterion_dir())
}

criterion_group! {
    name = benches;
    config = config();
    targets = requests, locate
}

// ---------------------------------------------------------------------------------------------
// The 503 window per move

/// What a node answered a poll for a shard.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// `200`: served there.
    Served,
    /// `307` to this owner.
    Redirect(String),
    /// `503` before the node's group watch listed the group.
    NotListed,
    /// `503` for the shard itself (moving, tenure ended, ...).
    Unavailable,
    /// Anything else (a status).
    Other(u16),
}

/// Consecutive polls of one shard at one node with the same answer.
#[derive(Clone, Debug)]
struct Run {
    shard: usize,
    node: usize,
    answer: Answer,
    first: Instant,
    last: Instant,
}

/// What the client saw.
struct Polled {
    runs: Vec<Run>,
    /// How long each polling round took (both nodes, every shard, and the pause).
    rounds: Vec<Duration>,
}

/// What the bench tells the client, and the client the bench.
#[derive(Clone, Default)]
struct Flags {
    /// Set by the client once it polled every shard.
    polling: Arc<AtomicBool>,
    /// Node `b` shut down: no longer polled.
    b_gone: Arc<AtomicBool>,
    /// The client stops.
    stop: Arc<AtomicBool>,
}

/// Polls one entity of every shard through the apps of both nodes (`b` once its watch has
/// listed the group, and no longer once `b_gone`) until `stop`.
fn poll(directories: [ShardDirectory; 2], flags: Flags) -> Polled {
    actix_rt::System::new().block_on(async move {
        let entities = one_entity_per_shard(SHARDS);
        let [da, db] = directories;
        let ready_b = db.clone();
        let apps = [app!(da), app!(db)];
        let mut open: HashMap<(usize, usize), Run> = HashMap::new();
        let mut runs = Vec::new();
        let mut rounds = Vec::new();
        let mut b_listed = false;
        while !flags.stop.load(Ordering::Acquire) {
            let round = Instant::now();
            b_listed =
                b_listed || !matches!(ready_b.locate_index(0), Err(LocateError::NotListed { .. }));
            let nodes = if b_listed && !flags.b_gone.load(Ordering::Acquire) {
                2
            } else {
                1
            };
            for (shard, entity) in entities.iter().enumerate() {
                for (node, app) in apps.iter().enumerate().take(nodes) {
                    let request = TestRequest::get()
                        .uri(&format!("/orders/{entity}"))
                        .to_request();
                    let response = call_service(app, request).await;
                    let at = Instant::now();
                    let answer = match response.status() {
                        StatusCode::OK => Answer::Served,
                        StatusCode::TEMPORARY_REDIRECT => Answer::Redirect(
                            response
                                .headers()
                                .get("x-shard-holder")
                                .unwrap()
                                .to_str()
                                .unwrap()
                                .to_owned(),
                        ),
                        StatusCode::SERVICE_UNAVAILABLE => {
                            let body = read_body(response).await;
                            if String::from_utf8_lossy(&body).contains("cannot locate") {
                                Answer::NotListed
                            } else {
                                Answer::Unavailable
                            }
                        }
                        status => Answer::Other(status.as_u16()),
                    };
                    match open.get_mut(&(shard, node)) {
                        Some(run) if run.answer == answer => run.last = at,
                        _ => {
                            let run = Run {
                                shard,
                                node,
                                answer,
                                first: at,
                                last: at,
                            };
                            runs.extend(open.insert((shard, node), run));
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_micros(100));
            rounds.push(round.elapsed());
            flags.polling.store(true, Ordering::Release);
        }
        runs.extend(open.into_values());
        Polled { runs, rounds }
    })
}

/// One shard changing node, as the client saw it.
struct Move {
    /// When the new owner first served it.
    at: Instant,
    /// First `503` (either node) → first `200` at the new owner; `None` when no poll saw a `503`.
    window: Option<Duration>,
    /// Last `200` at the old owner → first `200` at the new one.
    gap: Duration,
    /// First `503` at the old owner → its first redirect to the new one, when both were seen.
    old_owner_503: Option<Duration>,
    /// Whether the new owner redirected to the old one after the old one first redirected to
    /// it, before it served (a client following redirects could be sent back).
    back_and_forth: bool,
}

/// The moves in `runs`, with how many times a shard was served by both nodes at once (never
/// expected) and how many `503`s came before a node's watch listed the group.
fn moves(runs: &[Run], names: [&str; 2]) -> (Vec<Move>, usize, usize) {
    let mut by_shard: BTreeMap<usize, Vec<&Run>> = BTreeMap::new();
    for run in runs {
        by_shard.entry(run.shard).or_default().push(run);
    }
    let (mut found, mut both) = (Vec::new(), 0);
    for runs in by_shard.values_mut() {
        runs.sort_by_key(|r| r.first);
        let served: Vec<&&Run> = runs.iter().filter(|r| r.answer == Answer::Served).collect();
        for pair in served.windows(2) {
            let (old, new) = (pair[0], pair[1]);
            if old.node == new.node {
                continue;
            }
            if new.first <= old.last {
                both += 1;
            }
            let first_503 = runs
                .iter()
                .filter(|r| r.answer == Answer::Unavailable)
                .filter(|r| r.last > old.last && r.first < new.first)
                .map(|r| r.first.max(old.last))
                .min();
            let old_503 = runs
                .iter()
                .filter(|r| r.node == old.node && r.answer == Answer::Unavailable)
                .filter(|r| r.last > old.last)
                .map(|r| r.first.max(old.last))
                .min();
            let old_redirect = runs
                .iter()
                .filter(|r| r.node == old.node && r.first > old.last)
                .filter(|r| r.answer == Answer::Redirect(names[new.node].to_owned()))
                .map(|r| r.first)
                .min();
            // A client sent from the old owner to the new one, sent back: a poll of the new
            // owner redirecting to the old one after the old one's first redirect to it.
            let sent_on = old_redirect.filter(|&t| t < new.first);
            let back_and_forth = sent_on.is_some_and(|sent_on| {
                runs.iter().any(|r| {
                    r.node == new.node
                        && r.answer == Answer::Redirect(names[old.node].to_owned())
                        && r.last > sent_on
                        && r.first < new.first
                })
            });
            found.push(Move {
                at: new.first,
                back_and_forth,
                window: first_503.map(|t| new.first.saturating_duration_since(t)),
                gap: new.first.saturating_duration_since(old.last),
                old_owner_503: old_503
                    .zip(old_redirect)
                    .filter(|(u, r)| u < r)
                    .map(|(u, r)| r - u),
            });
        }
    }
    let not_listed = runs
        .iter()
        .filter(|r| r.answer == Answer::NotListed)
        .count();
    (found, both, not_listed)
}

/// The moves of one phase, summed over the rounds.
#[derive(Default)]
struct Phase {
    moves: Vec<Move>,
    expected: usize,
}

fn record_phase(
    report: &mut Report,
    variant: &str,
    phase: &Phase,
    rounds: usize,
    poll: &[f64],
    both: usize,
    not_listed: usize,
) {
    let windows: Vec<f64> = phase
        .moves
        .iter()
        .filter_map(|m| m.window)
        .map(ms)
        .collect();
    let without = phase.moves.len() - windows.len();
    let gaps: Vec<f64> = phase.moves.iter().map(|m| ms(m.gap)).collect();
    let old: Vec<f64> = phase
        .moves
        .iter()
        .filter_map(|m| m.old_owner_503)
        .map(ms)
        .collect();
    let back = phase.moves.iter().filter(|m| m.back_and_forth).count();
    let poll = summarize(poll);
    // Moves without a 503 count as a window of 0 (shorter than a polling round).
    let mut all = windows.clone();
    all.resize(phase.moves.len(), 0.0);
    let stat = |v: &[f64]| {
        if v.is_empty() {
            serde_json::Value::Null
        } else {
            summarize(v).json()
        }
    };
    println!(
        "{variant}: {} moves ({} expected), 503 window (0 without a 503): {}; {without} without a 503 seen; gap: {}; old owner 503 until it redirects: {}; redirected back and forth in {} moves; polling round {poll}",
        phase.moves.len(),
        phase.expected,
        if all.is_empty() { "-".into() } else { summarize(&all).to_string() },
        if gaps.is_empty() { "-".into() } else { summarize(&gaps).to_string() },
        if old.is_empty() { "-".into() } else { summarize(&old).to_string() },
        back,
    );
    report.record(
        "routing_move",
        "memory",
        Some(variant),
        serde_json::json!({
            "reference": "first 503 for the shard at either node -> first 200 at its new owner (0 when no poll saw a 503); polled every round",
            "stats": {
                "window": stat(&all),
                "window_seen": stat(&windows),
                "gap": stat(&gaps),
                "old_owner_503": stat(&old),
                "poll_round": poll.json(),
            },
            "values": {
                "moves": phase.moves.len(),
                "expected_moves": phase.expected,
                "without_503": without,
                "back_and_forth": back,
                "served_by_both": both,
                "not_listed_503": not_listed,
                "rounds": rounds,
                "shards": SHARDS,
                "max_handovers": ShardedSettings::default().max_handovers,
                "shutdown_handovers": ShardedSettings::default().shutdown_handovers,
            },
        }),
        &[],
    );
}

/// Measures the moves of `rounds` rounds; records them unless `testing` (one round, printed).
fn move_windows(report: &mut Report, rounds: usize, testing: bool) {
    let system = actix_rt::System::new();
    let (mut join, mut leave) = (Phase::default(), Phase::default());
    let (mut poll_rounds, mut both, mut not_listed) = (Vec::new(), 0, 0);
    system.block_on(async {
        let store = InMemoryStore::new();
        let (a, da) = start(&store, "a", SHARDS, ShardedSettings::default());
        settle(&[(&a, SHARDS)]).await;
        for round in 0..rounds {
            let flags = Flags::default();
            // `b`'s group watch starts when it is built; `b` starts once the client polls.
            let b = build(&store, "b", SHARDS, ShardedSettings::default());
            let client = {
                let directories = [da.clone(), b.directory()];
                let flags = flags.clone();
                std::thread::spawn(move || poll(directories, flags))
            };
            while !flags.polling.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let b = b.start();
            settle(&[(&a, SHARDS / 2), (&b, SHARDS / 2)]).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let leaving = Instant::now();
            shutdown(&b).await;
            flags.b_gone.store(true, Ordering::Release);
            settle(&[(&a, SHARDS)]).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            flags.stop.store(true, Ordering::Release);
            let polled = client.join().expect("the client");
            let (found, twice, early) = moves(&polled.runs, ["a", "b"]);
            println!(
                "round {round}: {} moves, {} polling rounds",
                found.len(),
                polled.rounds.len()
            );
            both += twice;
            not_listed += early;
            poll_rounds.extend(polled.rounds.iter().map(|d| ms(*d)));
            for m in found {
                if m.at < leaving {
                    join.moves.push(m);
                } else {
                    leave.moves.push(m);
                }
            }
            join.expected += SHARDS / 2;
            leave.expected += SHARDS / 2;
        }
        shutdown(&a).await;
    });
    if testing {
        println!(
            "testing: {} + {} moves, not recorded",
            join.moves.len(),
            leave.moves.len()
        );
        return;
    }
    record_phase(
        report,
        "join",
        &join,
        rounds,
        &poll_rounds,
        both,
        not_listed,
    );
    record_phase(
        report,
        "shutdown",
        &leave,
        rounds,
        &poll_rounds,
        both,
        not_listed,
    );
}

fn main() {
    let started = SystemTime::now();
    benches();
    Criterion::default().configure_from_args().final_summary();

    let mut report = Report::new("routing");
    for id in IDS {
        let Some(estimates) = common::criterion_estimates(id, started) else {
            continue; // not run this time (filtered out, or `--test`)
        };
        let typical = if estimates["slope"].is_object() {
            &estimates["slope"]
        } else {
            &estimates["mean"]
        };
        let median = &estimates["median"];
        report.record(
            "routing",
            "memory",
            Some(id),
            serde_json::json!({
                "reference": "criterion's median time per iteration (and its typical: slope, else mean)",
                "values": {
                    "median_ns": median["point_estimate"],
                    "median_ci_low_ns": median["confidence_interval"]["lower_bound"],
                    "median_ci_high_ns": median["confidence_interval"]["upper_bound"],
                    "ns_per_iteration": typical["point_estimate"],
                    "ci_low_ns": typical["confidence_interval"]["lower_bound"],
                    "ci_high_ns": typical["confidence_interval"]["upper_bound"],
                    "shards": if id.contains("10000") { LOCATE_SHARDS } else { SHARDS },
                },
            }),
            &[],
        );
    }
    let rounds = std::env::var("BENCH_ROUTING_ROUNDS")
        .ok()
        .map(|v| v.parse().expect("BENCH_ROUTING_ROUNDS: a number"))
        .unwrap_or(5);
    // Under `--test` (criterion's quick check that the benches run): one round, not recorded.
    let testing = std::env::args().any(|a| a == "--test");
    if rounds > 0 {
        move_windows(&mut report, if testing { 1 } else { rounds }, testing);
    }
    report.finish();
}
