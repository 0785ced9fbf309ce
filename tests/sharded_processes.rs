//! Sharded workers as real processes (`examples/sharded_node.rs`) on the real etcd and the real
//! kube-apiserver (issue 24): three nodes × 64 shards settle at 21–22 each; a fourth node takes
//! exactly its quota of 16; a SIGTERMed node's shards, and only those, move, each much faster than
//! the TTL; a SIGKILLed node's shards run elsewhere within the TTL and a slack (twice the TTL on Kubernetes
//! for now: see `kubernetes`); a node frozen past
//! its TTL (SIGSTOP) acts no more after its deadline and runs nothing once resumed (SIGCONT).
//!
//! Every node logs its workers' `start`, `stop` and steps (`act`, with the deadline the step was
//! judged against; `tick` when the guard refused) per shard, on `CLOCK_MONOTONIC`. Who runs what is
//! read from these logs (a worker runs from its `start` to its `stop`, or to its process's death);
//! every test ends by checking each shard's log as the chaos harness checks a singleton's
//! (`common::chaos_check::check_run`): acting tenures never overlap, fencing tokens rise, no
//! worker ticks after a newer tenure acted, and a frozen node runs nothing once resumed.
//!
//! The tests run one at a time (each starts three or four processes holding 64 leases); each one
//! waits on the logs with deadlines, never on a bare sleep. The measured times are printed (per
//! shard) and are not asserted beyond "much faster than the TTL" and "within TTL + slack": the
//! figures belong in benchmarks. `SHARDED_PROCESSES_NODE_LOG` sets the nodes' `RUST_LOG`
//! (default `actix_coordination=info`); each run's logs stay in `target/sharded-processes/`.

#[path = "sharded_processes/churn.rs"]
mod churn;
mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::chaos_check::{self, EventKind, NodeEvent, Pause};
use tokio::time::{sleep, Instant};

const SHARDS: usize = 64;
/// The TTL of the join, kill and freeze tests: short, so that a crash costs little time.
const TTL: Duration = Duration::from_secs(3);
const RENEWAL: Duration = Duration::from_secs(1);
/// The TTL of the SIGTERM test: long, so that a takeover by release (a round trip) and one by
/// expiry (at least TTL − renewal interval after the stop) cannot be mistaken for each other.
const LONG_TTL: Duration = Duration::from_secs(10);
/// How long after the TTL a SIGKILLed node's shards may take to run elsewhere (a loaded machine).
const KILL_SLACK: Duration = Duration::from_secs(3);
/// How long any settling may take before a test gives up (a loaded machine, 64 claims per node).
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// The tests run one at a time: together they would load the machine with a dozen processes.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// CLOCK_MONOTONIC in nanoseconds, the clock of the nodes' events.
fn now_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

fn ms(ns: u128) -> f64 {
    ns as f64 / 1e6
}

/// The backend the nodes use: the lease configuration they share (under config key `sharded`)
/// and the group name.
struct Backend {
    name: &'static str,
    group: String,
    config: PathBuf,
    /// How soon after a SIGKILL its shards must run elsewhere (see `kubernetes`).
    kill_bound: Duration,
    /// The etcd key prefix of the group's leases (etcd only: the tests read the store's history).
    etcd_prefix: Option<String>,
}

fn scratch(test: &str) -> PathBuf {
    // Numbered: the etcd and the Kubernetes run of a scenario must not clear each other's logs.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("sharded-processes")
        .join(format!("{test}-{}-{run}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn timing(ttl: Duration) -> String {
    format!(
        "ttl = \"{}ms\"\nrenewal-interval = \"{}ms\"\n",
        ttl.as_millis(),
        RENEWAL.as_millis()
    )
}

/// The test cluster's etcd, under a key prefix of the test's own.
fn etcd(dir: &Path, test: &str, ttl: Duration) -> Backend {
    let config = dir.join("config.toml");
    let prefix = common::etcd::unique_prefix(test);
    std::fs::write(
        &config,
        format!(
            "[leases.sharded]\nbackend = \"etcd\"\n{}\n[leases.sharded.etcd]\nendpoints = [\"{}\"]\nprefix = \"{}\"\n",
            timing(ttl),
            common::etcd::endpoint(),
            prefix
        ),
    )
    .unwrap();
    Backend {
        name: "etcd",
        group: "shards".into(),
        config,
        // etcd deletes the dead node's keys one TTL after its last keep-alive, and the prefix
        // watch wakes the new owners at once.
        kill_bound: ttl + KILL_SLACK,
        etcd_prefix: Some(prefix),
    }
}

/// The test cluster's kube-apiserver (the `lease-holder` token, bound to deploy/rbac.yaml's
/// Role), with a group name of the test's own.
fn kubernetes(dir: &Path, test: &str, ttl: Duration) -> Backend {
    let env = common::k8s::env();
    let token = dir.join("lease-holder.token");
    std::fs::write(&token, &env.token).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[leases.sharded]\nbackend = \"kubernetes\"\n{}\n[leases.sharded.kubernetes]\nnamespace = \"{}\"\napi-url = \"{}\"\ntoken-file = \"{}\"\nca-file = \"{}\"\n",
            timing(ttl),
            env.namespace,
            env.url,
            token.display(),
            env.ca.display()
        ),
    )
    .unwrap();
    Backend {
        name: "kubernetes",
        group: common::k8s::unique(&test.replace('_', "-")),
        config,
        // The survivors learn that the node died when its member lease expires (one TTL, from
        // the group watch) and then compete for its shards; a shard lease a survivor never
        // waited for judges the holder's expiry from when the session's namespace watch first
        // received its last renewal (not from its own first read: that took a second TTL, 6.0 s
        // at TTL 3 s, before src/kubernetes/observed.rs took the watch's first sight).
        kill_bound: ttl + KILL_SLACK,
        etcd_prefix: None,
    }
}

/// A line of a node's event log.
#[derive(Debug, Clone)]
struct Event {
    owner: String,
    kind: EventKind,
    shard: usize,
    token: u64,
    t_ns: u128,
    /// On `act`: the deadline the step was judged against.
    deadline_ns: Option<u128>,
}

fn parse_line(line: &str) -> Option<Event> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    Some(Event {
        owner: v["owner"].as_str()?.to_owned(),
        kind: match v["event"].as_str()? {
            "start" => EventKind::Start,
            "stop" => EventKind::Stop,
            "act" => EventKind::Act,
            "tick" => EventKind::Tick,
            _ => return None,
        },
        shard: v["shard"].as_str()?.parse().ok()?,
        token: v["token"].as_u64()?,
        t_ns: v["t_ns"].as_u64()?.into(),
        deadline_ns: v["deadline_ns"].as_u64().map(u128::from),
    })
}

/// A running node; killed (and reaped) when dropped.
struct Node {
    owner: String,
    child: Child,
    events: PathBuf,
    log: PathBuf,
    /// How far its event log has been read, and the bytes of a line not complete yet.
    read: u64,
    partial: String,
    /// Whether it was killed (its workers are gone without a `stop`).
    dead: bool,
    /// When it was killed, or first seen exited (`CLOCK_MONOTONIC` ns).
    ended_ns: Option<u128>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// A group of node processes and what their logs say so far.
struct Fleet {
    backend: Backend,
    dir: PathBuf,
    nodes: Vec<Node>,
    /// Every event read, in the order read.
    events: Vec<Event>,
    /// Per shard: the owner and token of the newest tenure whose worker started and has not
    /// stopped (nor died with its process).
    running: BTreeMap<usize, (String, u64)>,
    /// Per shard: the highest token seen started.
    newest: HashMap<usize, u64>,
    /// The tenures (shard, owner, token) that acted at least once.
    acted: BTreeSet<(usize, String, u64)>,
    /// More arguments for every `sharded_node` [`spawn`](Self::spawn)ed.
    extra: Vec<String>,
}

impl Fleet {
    fn new(backend: Backend, dir: PathBuf) -> Self {
        Self {
            backend,
            dir,
            nodes: Vec::new(),
            events: Vec::new(),
            running: BTreeMap::new(),
            newest: HashMap::new(),
            acted: BTreeSet::new(),
            extra: Vec::new(),
        }
    }

    fn spawn(&mut self, owner: &str) {
        let extra = self.extra.clone();
        self.spawn_with(owner, &extra.iter().map(String::as_str).collect::<Vec<_>>());
    }

    /// [`spawn`](Self::spawn) with more arguments for `sharded_node`.
    fn spawn_with(&mut self, owner: &str, extra: &[&str]) {
        let events = self.dir.join(format!("{owner}.jsonl"));
        let log = self.dir.join(format!("{owner}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(common::example_binary("sharded_node"))
            .args(extra)
            .args(["--config", self.backend.config.to_str().unwrap()])
            .args(["--group", &self.backend.group])
            .args(["--shards", &SHARDS.to_string()])
            .args(["--owner", owner])
            .args(["--events", events.to_str().unwrap()])
            .env(
                "RUST_LOG",
                std::env::var("SHARDED_PROCESSES_NODE_LOG")
                    .unwrap_or_else(|_| "actix_coordination=info".into()),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start sharded_node");
        self.nodes.push(Node {
            owner: owner.to_owned(),
            child,
            events,
            log,
            read: 0,
            partial: String::new(),
            dead: false,
            ended_ns: None,
        });
    }

    fn node(&mut self, owner: &str) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.owner == owner)
            .unwrap_or_else(|| panic!("no node {owner}"))
    }

    fn pid(&mut self, owner: &str) -> u32 {
        self.node(owner).child.id()
    }

    /// The owners of the nodes that run (not killed, not exited).
    fn live(&mut self) -> Vec<String> {
        self.nodes
            .iter_mut()
            .filter_map(|n| {
                let runs = !n.dead && n.child.try_wait().ok().flatten().is_none();
                runs.then(|| n.owner.clone())
            })
            .collect()
    }

    /// Reads what the logs gained since the last call, and panics if a node exited on its own.
    fn poll(&mut self) {
        let mut new = Vec::new();
        for node in &mut self.nodes {
            if !node.dead {
                if let Ok(Some(status)) = node.child.try_wait() {
                    node.ended_ns.get_or_insert_with(now_ns);
                    assert!(
                        status.success(),
                        "{} exited with {status}: {}",
                        node.owner,
                        tail(&node.log)
                    );
                }
            }
            let Ok(mut file) = std::fs::File::open(&node.events) else {
                continue;
            };
            file.seek(SeekFrom::Start(node.read)).unwrap();
            let mut text = String::new();
            node.read += file.read_to_string(&mut text).unwrap() as u64;
            node.partial.push_str(&text);
            let complete = match node.partial.rfind('\n') {
                Some(end) => {
                    let rest = node.partial.split_off(end + 1);
                    std::mem::replace(&mut node.partial, rest)
                }
                None => continue,
            };
            new.extend(complete.lines().filter_map(parse_line));
        }
        for e in &new {
            match e.kind {
                EventKind::Start => {
                    let newest = self.newest.entry(e.shard).or_default();
                    if e.token >= *newest {
                        *newest = e.token;
                        self.running.insert(e.shard, (e.owner.clone(), e.token));
                    }
                }
                EventKind::Stop => {
                    if self.running.get(&e.shard) == Some(&(e.owner.clone(), e.token)) {
                        self.running.remove(&e.shard);
                    }
                }
                EventKind::Act => {
                    self.acted.insert((e.shard, e.owner.clone(), e.token));
                }
                EventKind::Tick => {}
            }
        }
        self.events.extend(new);
    }

    /// How many shards each owner runs (every live node listed, with 0 if it runs none).
    fn counts(&mut self) -> BTreeMap<String, usize> {
        let mut counts: BTreeMap<String, usize> = self.live().into_iter().map(|o| (o, 0)).collect();
        for (owner, _) in self.running.values() {
            *counts.entry(owner.clone()).or_default() += 1;
        }
        counts
    }

    /// Who runs each shard now.
    fn holders(&self) -> BTreeMap<usize, String> {
        self.running
            .iter()
            .map(|(&shard, (owner, _))| (shard, owner.clone()))
            .collect()
    }

    /// Waits (up to `within`) until every shard runs on a live node and each live node runs
    /// between ⌊64 / nodes⌋ and ⌈64 / nodes⌉ shards; returns when that was first seen.
    async fn settle(&mut self, what: &str, within: Duration) -> u128 {
        let give_up = Instant::now() + within;
        loop {
            self.poll();
            let counts = self.counts();
            let live = counts.len();
            let (low, high) = (SHARDS / live.max(1), SHARDS.div_ceil(live.max(1)));
            let on_live: usize = counts.values().sum();
            let live_names: BTreeSet<&String> = counts.keys().collect();
            let all_on_live = self.running.values().all(|(o, _)| live_names.contains(o));
            if on_live == SHARDS && all_on_live && counts.values().all(|n| (low..=high).contains(n))
            {
                return now_ns();
            }
            assert!(
                Instant::now() < give_up,
                "{what}: not settled within {within:?}: runs {counts:?}, {} shards on {} live nodes\n{}",
                self.running.len(),
                live,
                self.logs()
            );
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts `owners` and waits until they share the shards evenly and every worker acted.
    async fn start(&mut self, owners: &[&str]) {
        for owner in owners {
            self.spawn(owner);
        }
        self.started().await;
    }

    /// Waits until the nodes spawned share the shards evenly and every worker acted.
    async fn started(&mut self) {
        self.settle("the first nodes", SETTLE_WITHIN).await;
        let give_up = Instant::now() + SETTLE_WITHIN;
        loop {
            self.poll();
            let idle: Vec<_> = self
                .running
                .iter()
                .map(|(&shard, (owner, token))| (shard, owner.clone(), *token))
                .filter(|tenure| !self.acted.contains(tenure))
                .collect();
            if idle.is_empty() {
                return;
            }
            assert!(
                Instant::now() < give_up,
                "workers that never acted: {idle:?}\n{}",
                self.logs()
            );
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL: the node and its workers are gone at once.
    fn kill(&mut self, owner: &str) -> u128 {
        let node = self.node(owner);
        let at = now_ns();
        node.child.kill().unwrap();
        node.child.wait().unwrap();
        node.dead = true;
        node.ended_ns = Some(at);
        self.poll();
        self.running.retain(|_, (o, _)| o != owner);
        at
    }

    /// SIGTERM, then waits (up to 30 s) for a successful exit.
    async fn terminate(&mut self, owner: &str) -> u128 {
        let pid = self.pid(owner);
        let at = now_ns();
        signal(pid, "TERM");
        let give_up = Instant::now() + Duration::from_secs(30);
        let node = self.node(owner);
        loop {
            if let Some(status) = node.child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "{owner} exited with {status}: {}",
                    tail(&node.log)
                );
                node.dead = true;
                node.ended_ns.get_or_insert_with(now_ns);
                break;
            }
            assert!(
                Instant::now() < give_up,
                "{owner} did not exit after SIGTERM: {}",
                tail(&node.log)
            );
            sleep(Duration::from_millis(20)).await;
        }
        self.poll();
        at
    }

    /// The tail of every node's log, for a failure message.
    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {} ---\n{}", n.owner, tail(&n.log)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every shard's events checked as the chaos harness checks a singleton's (see the module
    /// docs); panics with the violations, per shard.
    ///
    /// One exception, for a frozen node: SIGSTOP can land in the middle of a worker's poll,
    /// after the watcher that stops it at its deadline ran and before its timer's step; on
    /// SIGCONT that poll runs to its end first, and the step, whose guard now refuses, logs a
    /// `tick` (it does not act). One such refused tick per worker of the frozen node after the
    /// resume, followed by its stop, is not counted as the worker running on (seen once in CI:
    /// shard 18's worker had started 50 ms before the freeze; its refused tick came 4.7 ms
    /// after the SIGCONT, its stop 0.5 ms later). A second one, or any `act`, still is.
    fn assert_exclusive(&mut self, pauses: &[Pause]) {
        self.poll();
        let mut failures = String::new();
        let mut by_shard: BTreeMap<usize, Vec<NodeEvent>> = BTreeMap::new();
        let mut excused: BTreeSet<(usize, u64)> = BTreeSet::new();
        for e in &self.events {
            let finishing_its_poll = e.kind == EventKind::Tick
                && pauses
                    .iter()
                    .any(|p| p.owner == e.owner && e.t_ns > p.resumed_ns)
                && self.events.iter().any(|s| {
                    s.kind == EventKind::Stop
                        && s.owner == e.owner
                        && s.shard == e.shard
                        && s.token == e.token
                        && s.t_ns >= e.t_ns
                })
                && excused.insert((e.shard, e.token));
            if finishing_its_poll {
                println!("excused: {e:?} (the frozen node's worker finished the poll SIGSTOP interrupted)");
                continue;
            }
            let events = by_shard.entry(e.shard).or_default();
            if e.kind == EventKind::Act {
                // An `act` line is its tick too.
                events.push(NodeEvent::new(&e.owner, EventKind::Tick, e.token, e.t_ns));
            }
            events.push(NodeEvent::new(&e.owner, e.kind, e.token, e.t_ns));
        }
        for (shard, mut events) in by_shard {
            events.sort_by_key(|e| e.t_ns);
            if let Err(violations) = chaos_check::check_run(&events, pauses) {
                failures.push_str(&format!(
                    "shard {shard}: {}",
                    chaos_check::describe(&violations)
                ));
            }
        }
        assert!(failures.is_empty(), "{failures}");
        // Every step was judged against a deadline still ahead of it.
        for e in self.events.iter().filter(|e| e.kind == EventKind::Act) {
            let deadline = e.deadline_ns.expect("an act names its deadline");
            assert!(e.t_ns < deadline, "a step after its deadline: {e:?}");
        }
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The starts (shard, owner, token, t_ns) after `after`, per distinct tenure.
fn starts_after(events: &[Event], after: u128) -> Vec<(usize, String, u64, u128)> {
    let mut seen = BTreeSet::new();
    let mut starts: Vec<(usize, String, u64, u128)> = events
        .iter()
        .filter(|e| e.kind == EventKind::Start && e.t_ns > after)
        .filter(|e| seen.insert((e.shard, e.token)))
        .map(|e| (e.shard, e.owner.clone(), e.token, e.t_ns))
        .collect();
    starts.sort_by_key(|s| s.3);
    starts
}

fn percentiles(mut values: Vec<f64>) -> String {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return "none".into();
    }
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    format!(
        "min {:.1} ms, median {:.1} ms, p90 {:.1} ms, max {:.1} ms (n = {})",
        at(0.0),
        at(0.5),
        at(0.9),
        at(1.0),
        values.len()
    )
}

/// 3 nodes settle at 21–22 shards each; a 4th joins and every node ends at 16, with at most 17
/// shards moved (counted as worker starts, so a shard that moves twice counts twice).
async fn join(backend: fn(&Path, &str, Duration) -> Backend) {
    let _serial = SERIAL.lock().await;
    let dir = scratch("join");
    let mut fleet = Fleet::new(backend(&dir, "join", TTL), dir);
    let started = Instant::now();
    fleet.start(&["node-1", "node-2", "node-3"]).await;
    let counts = fleet.counts();
    println!(
        "{}: 3 nodes settled in {:?}: {counts:?}",
        fleet.backend.name,
        started.elapsed()
    );
    assert!(counts.values().all(|n| (21..=22).contains(n)), "{counts:?}");
    let before = fleet.holders();

    let joined = now_ns();
    fleet.spawn("node-4");
    let balanced = fleet.settle("after the join", SETTLE_WITHIN).await;
    let counts = fleet.counts();
    assert!(counts.values().all(|&n| n == 16), "{counts:?}");
    let after = fleet.holders();
    let moved: Vec<usize> = (0..SHARDS)
        .filter(|s| before.get(s) != after.get(s))
        .collect();
    let starts = starts_after(&fleet.events, joined);
    println!(
        "{}: node-4 joined; balanced {:.0} ms after its start, {} shard(s) moved ({} start(s)): {moved:?}",
        fleet.backend.name,
        ms(balanced - joined),
        moved.len(),
        starts.len()
    );
    assert!(
        starts.len() <= 17,
        "at most 17 moves for a join: {starts:?}"
    );
    let elsewhere: Vec<_> = starts.iter().filter(|s| s.1 != "node-4").collect();
    if !elsewhere.is_empty() {
        // Allowed while the join propagates (a node that has not seen node-4 yet may take a
        // shard another one handed over to it); it costs a move, which the bound above counts.
        println!("  moves to others than node-4: {elsewhere:?}");
    }
    fleet.assert_exclusive(&[]);
}

/// SIGTERM to one of 3 nodes: exactly its shards move, each taken over much faster than the TTL
/// (a release, not an expiry).
async fn sigterm(backend: fn(&Path, &str, Duration) -> Backend) {
    let _serial = SERIAL.lock().await;
    let dir = scratch("sigterm");
    let mut fleet = Fleet::new(backend(&dir, "sigterm", LONG_TTL), dir);
    fleet.start(&["node-1", "node-2", "node-3"]).await;
    let before = fleet.holders();
    let leaving: BTreeSet<usize> = (0..SHARDS).filter(|s| before[s] == "node-2").collect();

    // The store's revision before the signal: the lease etcd, or the API server's own etcd.
    let from_revision = match &fleet.backend.etcd_prefix {
        Some(_) => etcd_revision(&common::etcd::endpoint()).await,
        None => etcd_revision(&kube_etcd_endpoint()).await,
    };
    let tokens_before: BTreeMap<usize, u64> = fleet
        .running
        .iter()
        .map(|(&shard, (_, token))| (shard, *token))
        .collect();
    let txns_before = match &fleet.backend.etcd_prefix {
        Some(_) => common::etcd::messages_received(&common::etcd::endpoint(), "Txn").await,
        None => 0,
    };
    let term = fleet.terminate("node-2").await;
    let settled = fleet.settle("after the SIGTERM", SETTLE_WITHIN).await;
    let after = fleet.holders();
    let moved: BTreeSet<usize> = (0..SHARDS)
        .filter(|s| before.get(s) != after.get(s))
        .collect();
    assert_eq!(moved, leaving, "exactly the leaver's shards move");
    let starts = starts_after(&fleet.events, term);
    assert_eq!(
        starts.iter().map(|s| s.0).collect::<BTreeSet<_>>(),
        leaving,
        "no other shard restarts: {starts:?}"
    );
    // Per shard: from the leaver's worker stop to the new worker's start.
    let mut handovers = Vec::new();
    for &(shard, ref owner, _, start_ns) in &starts {
        let stop = fleet
            .events
            .iter()
            .filter(|e| e.shard == shard && e.owner == "node-2" && e.kind == EventKind::Stop)
            .map(|e| e.t_ns)
            .max()
            .unwrap_or_else(|| panic!("node-2 logged no stop of shard {shard}"));
        assert!(
            stop < start_ns,
            "shard {shard} started on {owner} before node-2 stopped it"
        );
        handovers.push((shard, start_ns - stop));
    }
    let times: Vec<f64> = handovers.iter().map(|&(_, ns)| ms(ns)).collect();
    println!(
        "{}: SIGTERM to node-2 (ttl {LONG_TTL:?}): {} shards moved; all running elsewhere {:.0} ms after the signal; per shard (stop → start): {}",
        fleet.backend.name,
        moved.len(),
        ms(settled - term),
        percentiles(times.clone())
    );
    println!("  per shard: {handovers:?}");
    // An expiry would take at least TTL − renewal interval after the stop.
    let released_by = (LONG_TTL - RENEWAL) / 3;
    for &(shard, ns) in &handovers {
        assert!(
            Duration::from_nanos(ns as u64) < released_by,
            "shard {shard} was taken over {:.0} ms after its stop: not by a release",
            ms(ns)
        );
    }
    // On etcd, a move is one write: the leaver puts each of its shard keys in the new holder's
    // name on the new holder's etcd lease, and the new holder writes nothing (no delete, no claim),
    // as the store's own history shows. The leaver writes them together: a few transactions
    // (each one revision of the store), not one per shard, as the history shows. etcd's own
    // count of the transactions it received is printed beside it: it also counts the member
    // lease's retirement and the claims of the nodes that target the shards once they saw
    // node-2's member lease gone (refused while node-2 still holds them; each node's sent
    // together, in one transaction), a number that varies with timing (6 and 7 for 21 shards
    // beside 6 busy processes; 23 to 46 before the claims were batched).
    if let Some(prefix) = &fleet.backend.etcd_prefix {
        let txns =
            common::etcd::messages_received(&common::etcd::endpoint(), "Txn").await - txns_before;
        let writes = etcd_writes(prefix, from_revision).await;
        let mut revisions = BTreeSet::new();
        for &shard in &leaving {
            let key = format!("{prefix}{}.{shard}", fleet.backend.group);
            let new_holder = &after[&shard];
            let expected = vec![(true, format!("{new_holder}\0\0handed-over-by\0node-2"))];
            let written = writes.get(&key).cloned().unwrap_or_default();
            assert_eq!(
                written
                    .iter()
                    .map(|(put, value, _)| (*put, value.clone()))
                    .collect::<Vec<_>>(),
                expected,
                "shard {shard}: one write, the handover to {new_holder}"
            );
            revisions.extend(written.iter().map(|w| w.2));
        }
        println!(
            "  etcd: {} shards handed over in {} transactions (revisions {revisions:?}); etcd received {txns} Txn requests from the SIGTERM to the settle",
            leaving.len(),
            revisions.len()
        );
        assert!(
            revisions.len() <= 3,
            "{} shards handed over in {} transactions: {revisions:?}",
            leaving.len(),
            revisions.len()
        );
    }
    // On Kubernetes, where shard leases are bound to the member lease (the default), as the API
    // server's own storage shows: node-2 writes nothing to its shards' objects (it stops its
    // workers, then retires its member lease, which frees them all), and the first write of each
    // moved shard's object after the signal is the new holder's own claim, bound to its member
    // lease, under the next token (node-2's + 1): one write per moved shard.
    if fleet.backend.etcd_prefix.is_none() {
        let namespace = &common::k8s::env().namespace;
        let keys: BTreeMap<String, usize> = leaving
            .iter()
            .map(|&shard| {
                let lease = format!("{}.{shard}", fleet.backend.group);
                let object = actix_coordination::kubernetes_object_name(&lease);
                (format!("/registry/leases/{namespace}/{object}"), shard)
            })
            .collect();
        let naming: BTreeMap<String, String> = keys
            .iter()
            .map(|(key, shard)| (key.clone(), after[shard].clone()))
            .collect();
        let first = first_writes(&kube_etcd_endpoint(), &naming, from_revision).await;
        for (key, &shard) in &keys {
            let new_holder = &after[&shard];
            let (value, earlier) = &first[key];
            assert_eq!(
                *earlier, 0,
                "shard {shard}: written {earlier} times after the SIGTERM before {new_holder}'s claim"
            );
            let member = format!("{}.member.{new_holder}", fleet.backend.group);
            assert!(
                value.contains("actix-coordination/bound-to")
                    && value.contains(member.as_str())
                    && !value.contains("handed-over-by"),
                "shard {shard}: the first write after the SIGTERM is not {new_holder}'s bound claim: {value:?}"
            );
            let started = starts
                .iter()
                .find(|s| s.0 == shard)
                .map(|s| s.2)
                .expect("the shard started elsewhere");
            assert_eq!(
                started,
                tokens_before[&shard] + 1,
                "shard {shard}: {new_holder} runs under its claim's token, node-2's + 1"
            );
        }
        // node-2 gave its member lease up for good: its object is gone (`Lease::retire`), while
        // the shards' objects stay (their tokens fence the workers).
        let env = common::k8s::env();
        let admin: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(common::k8s::client(&env.url, &env.admin_token), namespace);
        let member = actix_coordination::kubernetes_object_name(&format!(
            "{}.member.node-2",
            fleet.backend.group
        ));
        let found = admin.get_opt(&member).await.expect("admin get");
        assert!(
            found.is_none(),
            "node-2's member object {member} was deleted: {found:?}"
        );
        for &shard in &leaving {
            let object = actix_coordination::kubernetes_object_name(&format!(
                "{}.{shard}",
                fleet.backend.group
            ));
            assert!(admin.get_opt(&object).await.expect("admin get").is_some());
        }
    }
    fleet.assert_exclusive(&[]);
}

/// The etcd of the test cluster's API server.
fn kube_etcd_endpoint() -> String {
    std::env::var("ACTIX_COORD_TEST_KUBE_ETCD_ENDPOINT")
        .expect("ACTIX_COORD_TEST_KUBE_ETCD_ENDPOINT (scripts/test-cluster.sh up)")
}

/// The current revision of the etcd at `endpoint`.
async fn etcd_revision(endpoint: &str) -> i64 {
    let mut admin = common::etcd::admin_client(endpoint).await;
    let got = admin.get("/", None).await.unwrap();
    got.header().unwrap().revision()
}

/// The first value written to each of `keys` after revision `from` in the etcd at `endpoint`
/// that contains the key's string in `keys` (read as lossy UTF-8: the API server stores objects
/// as protobuf, whose strings are plain), with how many writes of the key came before it.
async fn first_writes(
    endpoint: &str,
    keys: &BTreeMap<String, String>,
    from: i64,
) -> BTreeMap<String, (String, usize)> {
    let prefix = keys
        .keys()
        .next()
        .expect("keys")
        .rsplit_once('/')
        .unwrap()
        .0;
    let mut first: BTreeMap<String, (String, usize)> = BTreeMap::new();
    let mut before: BTreeMap<String, usize> = BTreeMap::new();
    history(endpoint, &format!("{prefix}/"), from, |key, _, value, _| {
        let naming = keys
            .get(&key)
            .is_some_and(|name| value.contains(name.as_str()));
        if naming && !first.contains_key(&key) {
            let earlier = before.get(&key).copied().unwrap_or(0);
            first.insert(key, (value, earlier));
        } else if keys.contains_key(&key) && !first.contains_key(&key) {
            *before.entry(key).or_insert(0) += 1;
        }
        first.len() == keys.len()
    })
    .await;
    first
}

/// Every write to a key under `prefix` after revision `from`, up to now, by key: (a put?, value,
/// the write's revision: one per transaction). "Now" is a marker key this writes under the
/// prefix: the history is read until its event.
async fn etcd_writes(prefix: &str, from: i64) -> BTreeMap<String, Vec<(bool, String, i64)>> {
    let endpoint = common::etcd::endpoint();
    let marker = format!("{prefix}~history-read-up-to-here");
    let mut admin = common::etcd::admin_client(&endpoint).await;
    admin.put(marker.as_str(), "", None).await.unwrap();
    let mut writes: BTreeMap<String, Vec<(bool, String, i64)>> = BTreeMap::new();
    history(&endpoint, prefix, from, |key, put, value, revision| {
        if key == marker {
            return true;
        }
        writes.entry(key).or_default().push((put, value, revision));
        false
    })
    .await;
    writes
}

/// Hands every write to a key under `prefix` after revision `from`, in order, to `done` (key, a
/// put?, value as lossy UTF-8, its revision) until it returns `true`; each next event within
/// 10 s.
async fn history(
    endpoint: &str,
    prefix: &str,
    from: i64,
    mut done: impl FnMut(String, bool, String, i64) -> bool,
) {
    let mut admin = common::etcd::admin_client(endpoint).await;
    let mut stream = admin
        .watch(
            prefix,
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(from + 1),
            ),
        )
        .await
        .unwrap();
    loop {
        let response = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("etcd delivers the history within 10 s")
            .unwrap()
            .expect("the watch stays open");
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let put = event.event_type() == etcd_client::EventType::Put;
            let value = String::from_utf8_lossy(kv.value()).into_owned();
            if done(key, put, value, kv.mod_revision()) {
                return;
            }
        }
    }
}

/// SIGKILL to one of 3 nodes: exactly its shards run elsewhere, within TTL + slack on etcd (twice
/// the TTL + slack on Kubernetes, see `kubernetes`).
async fn sigkill(backend: fn(&Path, &str, Duration) -> Backend) {
    let _serial = SERIAL.lock().await;
    let dir = scratch("sigkill");
    let mut fleet = Fleet::new(backend(&dir, "sigkill", TTL), dir);
    fleet.start(&["node-1", "node-2", "node-3"]).await;
    let before = fleet.holders();
    let lost: BTreeSet<usize> = (0..SHARDS).filter(|s| before[s] == "node-2").collect();

    let killed = fleet.kill("node-2");
    let settled = fleet.settle("after the SIGKILL", SETTLE_WITHIN).await;
    let starts = starts_after(&fleet.events, killed);
    let took: Vec<(usize, f64)> = starts.iter().map(|s| (s.0, ms(s.3 - killed))).collect();
    println!(
        "{}: SIGKILL to node-2 (ttl {TTL:?}): its {} shards all run elsewhere {:.0} ms after the kill; per shard (kill → start): {}",
        fleet.backend.name,
        lost.len(),
        ms(settled - killed),
        percentiles(took.iter().map(|t| t.1).collect())
    );
    assert_eq!(
        starts.iter().map(|s| s.0).collect::<BTreeSet<_>>(),
        lost,
        "exactly the dead node's shards restart: {starts:?}"
    );
    for &(shard, after) in &took {
        assert!(
            after < fleet.backend.kill_bound.as_secs_f64() * 1e3,
            "shard {shard} ran elsewhere only {after:.0} ms after the kill (bound {:?})",
            fleet.backend.kill_bound
        );
    }
    fleet.assert_exclusive(&[]);
}

/// SIGSTOP one of 3 nodes past its TTL, then SIGCONT: its workers' last steps come before their
/// deadlines, and before the new holders' first; once resumed it runs nothing under its old
/// tenures; it rejoins and the fleet settles again; no shard ever runs twice at once.
async fn sigstop(backend: fn(&Path, &str, Duration) -> Backend) {
    let _serial = SERIAL.lock().await;
    let dir = scratch("sigstop");
    let mut fleet = Fleet::new(backend(&dir, "sigstop", TTL), dir);
    fleet.start(&["node-1", "node-2", "node-3"]).await;
    let frozen: BTreeMap<usize, u64> = fleet
        .running
        .iter()
        .filter(|(_, (owner, _))| owner == "node-2")
        .map(|(&shard, (_, token))| (shard, *token))
        .collect();
    let pid = fleet.pid("node-2");
    let stopped_ns = now_ns();
    signal(pid, "STOP");
    // Every frozen shard runs elsewhere (under a newer token).
    let give_up = Instant::now() + SETTLE_WITHIN;
    let taken = loop {
        fleet.poll();
        let taken: BTreeMap<usize, u128> = starts_after(&fleet.events, stopped_ns)
            .into_iter()
            .filter(|(shard, owner, _, _)| owner != "node-2" && frozen.contains_key(shard))
            .map(|(shard, _, _, t)| (shard, t))
            .collect();
        if taken.len() == frozen.len() {
            break taken;
        }
        assert!(
            Instant::now() < give_up,
            "the frozen node's shards did not move: {} of {}\n{}",
            taken.len(),
            frozen.len(),
            fleet.logs()
        );
        sleep(Duration::from_millis(20)).await;
    };
    let resumed_ns = now_ns();
    signal(pid, "CONT");
    // Its workers stop, and it rejoins: the fleet settles at 21–22 again.
    let give_up = Instant::now() + SETTLE_WITHIN;
    loop {
        fleet.poll();
        let stopped = frozen
            .iter()
            .filter(|(&shard, &token)| {
                fleet.events.iter().any(|e| {
                    e.kind == EventKind::Stop
                        && e.owner == "node-2"
                        && e.shard == shard
                        && e.token == token
                })
            })
            .count();
        if stopped == frozen.len() {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "the resumed node stopped {stopped} of its {} frozen workers\n{}",
            frozen.len(),
            fleet.logs()
        );
        sleep(Duration::from_millis(20)).await;
    }
    let resettled = fleet.settle("after the resume", SETTLE_WITHIN).await;
    // Per frozen shard: its last step (and the deadline it was judged against) comes before
    // the freeze plus the TTL, and before the next tenure's worker starts (not its first step:
    // the shard's new holder may hand it back to the resumed node 30 ms after taking it, before
    // its worker's first 50 ms tick, and the resumed node's worker may not have ticked yet when
    // the fleet has settled: a CI run on etcd had both).
    let mut margins = Vec::new();
    for (&shard, &token) in &frozen {
        let last = fleet
            .events
            .iter()
            .filter(|e| {
                e.kind == EventKind::Act
                    && e.owner == "node-2"
                    && e.shard == shard
                    && e.token == token
            })
            .max_by_key(|e| e.t_ns)
            .unwrap_or_else(|| panic!("node-2 never acted on shard {shard}"))
            .clone();
        let deadline = last.deadline_ns.expect("an act names its deadline");
        let next_first = fleet
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Start && e.shard == shard && e.token > token)
            .map(|e| e.t_ns)
            .min()
            .expect("the shard ran again under a newer tenure");
        assert!(
            last.t_ns < stopped_ns + TTL.as_nanos(),
            "shard {shard}: node-2 acted {:.0} ms after it was frozen",
            ms(last.t_ns - stopped_ns)
        );
        assert!(
            deadline < next_first,
            "shard {shard}: node-2's deadline {deadline} is not before the next tenure's worker started ({next_first})"
        );
        margins.push(ms(next_first - deadline));
    }
    println!(
        "{}: SIGSTOP node-2 ({} shards) for {:.0} ms (ttl {TTL:?}): taken over {} after the freeze; the next tenures' workers started after node-2's deadlines: {}; settled again {:.0} ms after the SIGCONT",
        fleet.backend.name,
        frozen.len(),
        ms(resumed_ns - stopped_ns),
        percentiles(taken.values().map(|&t| ms(t - stopped_ns)).collect()),
        percentiles(margins),
        ms(resettled - resumed_ns)
    );
    fleet.assert_exclusive(&[Pause {
        owner: "node-2".into(),
        stopped_ns,
        resumed_ns,
    }]);
}

/// How long the slow worker of [`slow_worker`] takes to stop: two TTLs.
const SLOW_STOP: Duration = Duration::from_secs(6);

/// Issue 47, item 5: a leaving node's slow worker keeps only its own shard. Three nodes run 64
/// bound shards (TTL 3 s); node-2's worker of its lowest-numbered shard takes 6 s to stop. On
/// node-2's SIGTERM every other shard of node-2 runs elsewhere within TTL + 1 s of the signal
/// (it waits the leave grace for its workers, then hands the stopped ones over and marks its
/// member record leaving), while the slow one still runs on node-2; it moves once its worker
/// stopped, and no shard ever ran on two nodes at once.
async fn slow_worker(backend: fn(&Path, &str, Duration) -> Backend) {
    let _serial = SERIAL.lock().await;
    let dir = scratch("slow_worker");
    let mut fleet = Fleet::new(backend(&dir, "slow_worker", TTL), dir);
    let slow_ms = SLOW_STOP.as_millis().to_string();
    fleet.spawn("node-1");
    fleet.spawn_with("node-2", &["--slow-stop-ms", &slow_ms]);
    fleet.spawn("node-3");
    fleet.started().await;
    let before = fleet.holders();
    let leaving: BTreeSet<usize> = (0..SHARDS).filter(|s| before[s] == "node-2").collect();
    let slow = *leaving.first().expect("node-2 runs shards");
    let pid = fleet.pid("node-2");
    let term = now_ns();
    signal(pid, "TERM");
    let bound = TTL + Duration::from_secs(1);
    let give_up = Instant::now() + SETTLE_WITHIN;
    let moved_at = loop {
        fleet.poll();
        let holders = fleet.holders();
        let elsewhere = leaving
            .iter()
            .filter(|&&s| s != slow)
            .all(|s| holders.get(s).is_some_and(|o| o != "node-2"));
        if elsewhere {
            break now_ns();
        }
        assert!(
            Instant::now() < give_up,
            "node-2's other shards never ran elsewhere: {holders:?}\n{}",
            fleet.logs()
        );
        sleep(Duration::from_millis(20)).await;
    };
    let slow_stopped = fleet
        .events
        .iter()
        .any(|e| e.shard == slow && e.owner == "node-2" && e.kind == EventKind::Stop);
    println!(
        "{}: SIGTERM to node-2 with a worker taking {SLOW_STOP:?} to stop: its other {} shards ran elsewhere {:.0} ms after the signal (bound {bound:?}); the slow one had stopped by then: {slow_stopped}",
        fleet.backend.name,
        leaving.len() - 1,
        ms(moved_at - term),
    );
    assert!(
        Duration::from_nanos((moved_at - term) as u64) < bound,
        "node-2's other shards ran elsewhere {:.0} ms after the SIGTERM, not within TTL + 1 s",
        ms(moved_at - term)
    );
    assert!(
        !slow_stopped,
        "the slow worker of shard {slow} had stopped already: the test shows nothing"
    );
    // node-2 exits once its slow worker stopped; every shard then runs on the two others.
    fleet.terminate("node-2").await;
    fleet
        .settle("after node-2's slow worker stopped", SETTLE_WITHIN)
        .await;
    assert!(
        fleet.holders().values().all(|o| o != "node-2"),
        "node-2 runs nothing"
    );
    fleet.assert_exclusive(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_nodes_slow_worker_keeps_only_its_own_shard_kubernetes() {
    slow_worker(kubernetes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_nodes_slow_worker_keeps_only_its_own_shard_etcd() {
    slow_worker(etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_settle_and_a_fourth_takes_its_quota_etcd() {
    join(etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_settle_and_a_fourth_takes_its_quota_kubernetes() {
    join(kubernetes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigtermed_node_hands_over_exactly_its_shards_etcd() {
    sigterm(etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigtermed_node_hands_over_exactly_its_shards_kubernetes() {
    sigterm(kubernetes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_nodes_shards_run_elsewhere_within_the_ttl_etcd() {
    sigkill(etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_nodes_shards_run_elsewhere_within_the_ttl_kubernetes() {
    sigkill(kubernetes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_acts_not_after_its_deadline_etcd() {
    sigstop(etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_acts_not_after_its_deadline_kubernetes() {
    sigstop(kubernetes).await;
}
