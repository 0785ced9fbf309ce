//! Churn with real processes (issue 37, item 4): a seeded mix of joins, SIGTERMs, SIGKILLs and
//! SIGSTOPs, and faults that come together (a crash during a join, a crash while another node is
//! frozen or just resumed, a freeze across a join, a graceful stop during a crash's recovery);
//! the same sequence on both backends. The promise checked: no shard goes without a running
//! worker for longer than TTL + 1 s, and no shard ever runs twice at once.
//!
//! The fault model: a node fails (SIGTERM, SIGKILL, SIGSTOP) only while at least two other
//! *established* nodes (running for 2 s: listed and joined), not frozen, remain; and crashes
//! (SIGKILL, SIGSTOP) come one recovery apart (TTL + 1 s), while joins, graceful stops and
//! resumes come at any time. Two crashes within one TTL may cost a shard two TTLs on any backend
//! (the node its first holder's shards were placed on may die before it claims them: seen on
//! etcd and Kubernetes alike); the placement avoids members not heard from lately, which
//! shortens that, but no lease can be claimed before its holder's expiry.
//!
//! A shard "runs" while a worker of it has started and not stopped, on a process that is neither
//! dead nor frozen: a killed node's workers end at the kill, a frozen node's are not running from
//! the SIGSTOP to the SIGCONT. The gaps are computed from the nodes' event logs (one
//! `CLOCK_MONOTONIC` for every process of the machine) from the moment the first nodes settled
//! until the fleet settled again after the churn.
//!
//! Every node's worker of its lowest-numbered shard takes `CHURN_SLOW_STOP_MS` (default 1,500;
//! 0: none) to stop when the node shuts down (`sharded_node --slow-stop-ms`), so that every
//! SIGTERM is a leave past its grace (issue 47, item 5: the other shards handed on at once, the
//! slow one when its worker stopped), and kills and freezes come during such leaves too.
//!
//! The length and the seed: `CHURN_SECS` (default 40, the CI version; `scripts/bench.sh` runs
//! several minutes) and `CHURN_SEED` (default 37). The sequence of faults depends on the seed and
//! on the fleet's state only (how many nodes live), never on timings, so that both backends get the
//! same sequence.
//!
//! And 4 nodes started at once on a loaded machine (busy processes keep both cores busy, load
//! 6–8): every shard runs within TTL + 1 s of the first start.

use super::*;

/// The longest a shard may go without a worker: the TTL and one second.
const GAP_BOUND: Duration = Duration::from_secs(4);
/// How long after its start a node counts as established (it has listed the group and joined):
/// the churn makes a node fail only while two established, unfrozen others remain.
const ESTABLISHED: Duration = Duration::from_secs(2);

/// SplitMix64: a seeded sequence, the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.next() % (high - low + 1))
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().map_or(default, |v| {
        v.parse().unwrap_or_else(|_| panic!("{name}: {v}"))
    })
}

/// A fault the churn applies.
#[derive(Debug, Clone)]
enum Fault {
    Join,
    Term,
    Kill,
    /// SIGSTOP for this long, then SIGCONT.
    Freeze(Duration),
    /// A new node starts, and this long after its start another node is SIGKILLed.
    JoinThenKill(Duration),
}

/// What happened when, for the report of a long gap.
struct Timeline(Vec<(u128, String)>);

impl Timeline {
    fn note(&mut self, what: String) {
        let at = now_ns();
        println!("  {:>9.0} ms  {what}", ms(at));
        self.0.push((at, what));
    }

    fn around(&self, from: u128, to: u128) -> String {
        self.0
            .iter()
            .filter(|(t, _)| *t + 2 * GAP_BOUND.as_nanos() >= from && *t <= to)
            .map(|(t, what)| format!("{:.0} ms: {what}", ms(*t)))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl Fleet {
    /// The spans (shard, from, to) in `[from, to]` during which a shard had no running worker.
    fn unrun_spans(&self, pauses: &[Pause], from: u128, to: u128) -> Vec<(usize, u128, u128)> {
        let ended: HashMap<&str, u128> = self
            .nodes
            .iter()
            .filter_map(|n| Some((n.owner.as_str(), n.ended_ns?)))
            .collect();
        let mut runs: BTreeMap<usize, Vec<(u128, u128)>> = BTreeMap::new();
        for (i, start) in self.events.iter().enumerate() {
            if start.kind != EventKind::Start {
                continue;
            }
            let stop = self.events[i..]
                .iter()
                .filter(|e| {
                    e.kind == EventKind::Stop
                        && e.owner == start.owner
                        && e.shard == start.shard
                        && e.token == start.token
                        && e.t_ns >= start.t_ns
                })
                .map(|e| e.t_ns)
                .min();
            let end = [stop, ended.get(start.owner.as_str()).copied(), Some(to)]
                .into_iter()
                .flatten()
                .min()
                .unwrap();
            // A frozen node runs nothing from its SIGSTOP to its SIGCONT.
            let mut pieces = vec![(start.t_ns, end)];
            for pause in pauses.iter().filter(|p| p.owner == start.owner) {
                pieces = pieces
                    .into_iter()
                    .flat_map(|(a, b)| [(a, b.min(pause.stopped_ns)), (a.max(pause.resumed_ns), b)])
                    .filter(|(a, b)| a < b)
                    .collect();
            }
            runs.entry(start.shard).or_default().extend(pieces);
        }
        let mut gaps = Vec::new();
        for shard in 0..SHARDS {
            let mut covered = runs.remove(&shard).unwrap_or_default();
            covered.sort();
            let mut at = from;
            for (a, b) in covered {
                if a > at && at < to {
                    gaps.push((shard, at, a.min(to)));
                }
                at = at.max(b);
            }
            if at < to {
                gaps.push((shard, at, to));
            }
        }
        gaps
    }
}

impl Fleet {
    /// When the first node joined its group (`CLOCK_MONOTONIC` ns): the wall-clock time of its
    /// log's "the group is listed: joining", on the monotonic clock of its events (each event
    /// line has both).
    fn first_join(&self) -> Option<u128> {
        self.nodes
            .iter()
            .filter_map(|node| {
                let log = std::fs::read_to_string(&node.log).ok()?;
                let line = log
                    .lines()
                    .find(|l| l.contains("the group is listed: joining"))?;
                let stamp: k8s_openapi::jiff::Timestamp =
                    line.split_whitespace().next()?.parse().ok()?;
                let events = std::fs::read_to_string(&node.events).ok()?;
                let first: serde_json::Value = serde_json::from_str(events.lines().next()?).ok()?;
                let offset = first["wall_ns"].as_i64()? as i128 - first["t_ns"].as_i64()? as i128;
                Some((stamp.as_nanosecond() - offset) as u128)
            })
            .min()
    }
}

/// Processes that keep the cores busy while they live (a loaded machine); killed when dropped.
struct Burners(Vec<Child>);

impl Burners {
    fn start(count: usize) -> Self {
        Self(
            (0..count)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("start a busy process")
                })
                .collect(),
        )
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The seeded churn on `backend`: see the module docs.
async fn churn(backend: fn(&Path, &str, Duration) -> Backend) {
    let _serial = SERIAL.lock().await;
    let seed = env_u64("CHURN_SEED", 37);
    let length = Duration::from_secs(env_u64("CHURN_SECS", 40));
    let dir = scratch("churn");
    let slow_stop = env_u64("CHURN_SLOW_STOP_MS", 1500);
    let mut fleet = Fleet::new(backend(&dir, "churn", TTL), dir);
    fleet.extra = vec!["--slow-stop-ms".into(), slow_stop.to_string()];
    let name = fleet.backend.name;
    println!(
        "{name}: churn for {length:?}, seed {seed}, ttl {TTL:?}, slow stop {slow_stop} ms, load {}",
        load_average()
    );
    fleet.start(&["node-1", "node-2", "node-3"]).await;
    let from = now_ns();
    let mut rng = Rng(seed);
    let mut timeline = Timeline(Vec::new());
    let mut next_node = 4;
    let mut frozen: Option<(String, u128, Instant)> = None;
    let mut pauses: Vec<Pause> = Vec::new();
    let mut kill_at: Option<Instant> = None;
    let mut faults = 0;
    let mut started: HashMap<String, Instant> = HashMap::new();
    let mut last_crash: Option<Instant> = None;
    let end = Instant::now() + length;
    let mut next_fault = Instant::now() + rng.millis(500, 2000);
    loop {
        fleet.poll();
        let now = Instant::now();
        if let Some((owner, stopped_ns, until)) = frozen.clone() {
            if now >= until {
                let pid = fleet.pid(&owner);
                signal(pid, "CONT");
                let resumed_ns = now_ns();
                timeline.note(format!("SIGCONT {owner}"));
                pauses.push(Pause {
                    owner,
                    stopped_ns,
                    resumed_ns,
                });
                frozen = None;
            }
        }
        // Candidates from the fleet's state only (never from timings), oldest first.
        let frozen_owner = frozen.as_ref().map(|f| f.0.clone());
        let live = fleet.live();
        let unfrozen: Vec<String> = live
            .iter()
            .filter(|o| Some(*o) != frozen_owner.as_ref())
            .cloned()
            .collect();
        // Nodes that have run long enough to have listed the group and joined: a node may fail
        // only while two others like it remain (a node that has just started must, like any
        // contender, wait a TTL from its own first sight of a dead holder).
        let established: Vec<String> = unfrozen
            .iter()
            .filter(|o| started.get(*o).is_none_or(|at| now >= *at + ESTABLISHED))
            .cloned()
            .collect();
        if kill_at.is_some_and(|at| now >= at) {
            kill_at = None;
            // The node that joined last is the one just started: any established one may die.
            if established.len() > 2 {
                let victim = established[rng.below(established.len())].clone();
                fleet.kill(&victim);
                last_crash = Some(Instant::now());
                timeline.note(format!("SIGKILL {victim} (during the join)"));
            }
        }
        if now >= end && frozen.is_none() && kill_at.is_none() {
            break;
        }
        if now >= next_fault && now < end && kill_at.is_none() {
            let mut choices = Vec::new();
            if live.len() < 5 {
                choices.push(Fault::Join);
            }
            // Crashes (SIGKILL, SIGSTOP) one recovery apart (see the module docs).
            let may_crash = last_crash.is_none_or(|at| now >= at + GAP_BOUND);
            if live.len() < 5 && may_crash {
                choices.push(Fault::JoinThenKill(rng.millis(0, 1500)));
            }
            if established.len() > 2 {
                choices.push(Fault::Term);
            }
            if established.len() > 2 && may_crash {
                choices.push(Fault::Kill);
                if frozen.is_none() {
                    choices.push(Fault::Freeze(
                        rng.millis(1000, TTL.as_millis() as u64 + 4000),
                    ));
                }
            }
            let fault = choices[rng.below(choices.len())].clone();
            faults += 1;
            match fault {
                Fault::Join | Fault::JoinThenKill(_) => {
                    let owner = format!("node-{next_node}");
                    next_node += 1;
                    fleet.spawn(&owner);
                    started.insert(owner.clone(), Instant::now());
                    timeline.note(format!("start {owner}"));
                    if let Fault::JoinThenKill(after) = fault {
                        kill_at = Some(Instant::now() + after);
                    }
                }
                Fault::Term => {
                    let victim = established[rng.below(established.len())].clone();
                    let pid = fleet.pid(&victim);
                    signal(pid, "TERM");
                    timeline.note(format!("SIGTERM {victim}"));
                }
                Fault::Kill => {
                    let victim = established[rng.below(established.len())].clone();
                    fleet.kill(&victim);
                    last_crash = Some(Instant::now());
                    timeline.note(format!("SIGKILL {victim}"));
                }
                Fault::Freeze(length) => {
                    let victim = established[rng.below(established.len())].clone();
                    let pid = fleet.pid(&victim);
                    signal(pid, "STOP");
                    last_crash = Some(Instant::now());
                    let stopped_ns = now_ns();
                    timeline.note(format!("SIGSTOP {victim} for {length:?}"));
                    frozen = Some((victim, stopped_ns, Instant::now() + length));
                }
            }
            next_fault = Instant::now() + rng.millis(1000, 4000);
        }
        sleep(Duration::from_millis(10)).await;
    }
    let to = fleet.settle("after the churn", SETTLE_WITHIN).await;
    timeline.note("settled".into());
    let gaps = fleet.unrun_spans(&pauses, from, to);
    let long: Vec<_> = gaps
        .iter()
        .filter(|(_, a, b)| b - a > GAP_BOUND.as_nanos())
        .collect();
    let mut report = String::new();
    for (shard, a, b) in &long {
        report.push_str(&format!(
            "  shard {shard}: no worker for {:.0} ms from {:.0} ms ({})\n",
            ms(b - a),
            ms(*a),
            timeline.around(*a, *b)
        ));
    }
    println!(
        "{name}: churn of {faults} faults over {:.1} s (seed {seed}, load {}): {} spans without a worker, {}; longer than the TTL: {}; longer than {GAP_BOUND:?}: {}",
        ms(to - from) / 1e3,
        load_average(),
        gaps.len(),
        percentiles(gaps.iter().map(|(_, a, b)| ms(b - a)).collect()),
        gaps.iter().filter(|(_, a, b)| b - a > TTL.as_nanos()).count(),
        long.len()
    );
    print!("{report}");
    // A node frozen for less than its TTL may still hold its tenures when it resumes (and then
    // its workers rightly go on): the check that a resumed node runs nothing is for the freezes
    // past the TTL.
    let past_ttl: Vec<Pause> = pauses
        .iter()
        .filter(|p| p.resumed_ns - p.stopped_ns > TTL.as_nanos())
        .cloned()
        .collect();
    fleet.assert_exclusive(&past_ttl);
    assert!(
        long.is_empty(),
        "{name}: {} spans without a worker longer than {GAP_BOUND:?} (ttl {TTL:?} + 1 s):\n{report}",
        long.len()
    );
}

/// 4 nodes started at once with both cores kept busy: every shard runs within TTL + 1 s of the
/// first start, and the fleet settles at 16 each; no shard runs twice at once.
async fn four_at_once(backend: fn(&Path, &str, Duration) -> Backend) {
    let _serial = SERIAL.lock().await;
    let dir = scratch("four-at-once");
    let mut fleet = Fleet::new(backend(&dir, "four-at-once", TTL), dir);
    let name = fleet.backend.name;
    // Built (or found built) before the clock starts: a build is no part of a start.
    common::example_binary("sharded_node");
    let burners = Burners::start(6);
    // Let the load show in the load average before the start.
    let busy_from = Instant::now();
    while Instant::now() < busy_from + Duration::from_secs(5) {
        sleep(Duration::from_millis(100)).await;
    }
    let started = now_ns();
    for owner in ["node-1", "node-2", "node-3", "node-4"] {
        fleet.spawn(owner);
    }
    let give_up = Instant::now() + SETTLE_WITHIN;
    let all = loop {
        fleet.poll();
        if fleet.running.len() == SHARDS {
            break now_ns();
        }
        assert!(
            Instant::now() < give_up,
            "{name}: {} of {SHARDS} shards run\n{}",
            fleet.running.len(),
            fleet.logs()
        );
        sleep(Duration::from_millis(10)).await;
    };
    let load = load_average();
    let settled = fleet.settle("after the start", SETTLE_WITHIN).await;
    drop(burners);
    // A node joins once its watch has listed the namespace's leases, which takes as long as the
    // namespace is large (every test's objects): the promise is counted from the first join.
    let joined = fleet.first_join().expect("a node logged its join");
    // Per shard: from the start of the processes to its first worker's start.
    let firsts: BTreeMap<usize, u128> = starts_after(&fleet.events, started).into_iter().fold(
        BTreeMap::new(),
        |mut firsts, (shard, _, _, t)| {
            firsts.entry(shard).or_insert(t);
            firsts
        },
    );
    println!(
        "{name}: 4 nodes started at once (load {load}, six busy processes): the first joined {:.0} ms after the start (its listing of the namespace); every shard ran {:.0} ms after that join ({:.0} ms after the start), balanced at {:.0} ms; per shard (join → first worker): {}",
        ms(joined.saturating_sub(started)),
        ms(all.saturating_sub(joined)),
        ms(all - started),
        ms(settled.saturating_sub(joined)),
        percentiles(firsts.values().map(|t| ms(t.saturating_sub(joined))).collect())
    );
    fleet.assert_exclusive(&[]);
    assert!(
        all.saturating_sub(joined) <= GAP_BOUND.as_nanos(),
        "{name}: every shard ran only {:.0} ms after the first node joined (bound {GAP_BOUND:?})\n{}",
        ms(all.saturating_sub(joined)),
        fleet.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_leaves_no_shard_without_a_worker_past_the_ttl_etcd() {
    churn(etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_leaves_no_shard_without_a_worker_past_the_ttl_kubernetes() {
    churn(kubernetes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_nodes_started_at_once_run_every_shard_within_the_ttl_etcd() {
    four_at_once(etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_nodes_started_at_once_run_every_shard_within_the_ttl_kubernetes() {
    four_at_once(kubernetes).await;
}
