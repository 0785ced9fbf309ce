//! Rolling updates with real processes (`examples/singleton_node.rs` with `--revision`) on the real
//! etcd and the real kube-apiserver (issues 25 and 39): three replicas, maxSurge 1 /
//! maxUnavailable 0, as a Deployment rolls them, driven by readiness alone: start a replica of the
//! new revision, wait until its `/readyz` (`--health`, the crate's `AdminRoutes`) answers `200`
//! (it does once the replica's candidacy is published), then at once SIGTERM the most recently
//! created old replica (a ReplicaSet scales down the newest first), three times; no other wait.
//! Rollouts follow each other (r0 → r1 → r2 …), each starting with whatever replica the previous
//! one left leading; before every second one, SIGUSR1 moves leadership to another replica
//! (`TransferLeadership::to_best`), so that the leader is not always the oldest. In every odd
//! rollout the oldest old replica restarts (SIGTERM, then the same pod name again, as a container
//! restart) after the first step: it outlives the other old replicas, and the old revision must
//! not look newer than the new one once they have left.
//!
//! With the handover policy (`--handover newest-revision`), every rollout changes leadership
//! exactly once, and the rollout ends with the new revision leading. Without it (`--handover off`) the same
//! rollouts are run for comparison (their changes are printed, not asserted). Every run ends with
//! the chaos harness's checks of every node's events (`common::chaos_check::check_run`): no two
//! singletons at once, no two steps at once, rising fencing tokens.
//!
//! `ROLLOUTS` (default 2) sets the number of rollouts per backend and policy; `scripts/bench.sh
//! rollouts` runs 100 and BENCHMARKS.md reports them side by side. Each run appends its figures
//! (leadership changes per rollout, leaderless time per change) to
//! `target/rollout/results.jsonl`. Times are printed and recorded, never asserted.

mod common;

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::chaos_check::{self, EventKind, NodeEvent};
use common::clock::mono_ns as now_ns;
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(3);
const RENEWAL: Duration = Duration::from_secs(1);
/// How long any wait may take before the test gives up (a loaded machine).
const WITHIN: Duration = Duration::from_secs(30);

/// The runs go one at a time (each starts four processes at a time).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn rollouts() -> usize {
    std::env::var("ROLLOUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("rollout")
        .join(format!("{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn timing() -> String {
    format!(
        "ttl = \"{}ms\"\nrenewal-interval = \"{}ms\"\n",
        TTL.as_millis(),
        RENEWAL.as_millis()
    )
}

/// The configuration file of the test cluster's etcd (a key prefix of the run's own).
fn etcd_config(dir: &Path, test: &str) -> PathBuf {
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[leases.singleton]\nbackend = \"etcd\"\n{}\n[leases.singleton.etcd]\nendpoints = [\"{}\"]\nprefix = \"{}\"\n",
            timing(),
            common::etcd::endpoint(),
            common::etcd::unique_prefix(test)
        ),
    )
    .unwrap();
    config
}

/// The configuration file of the test cluster's kube-apiserver (the `lease-holder` token).
fn kubernetes_config(dir: &Path) -> PathBuf {
    let env = common::k8s::env();
    let token = dir.join("lease-holder.token");
    std::fs::write(&token, &env.token).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[leases.singleton]\nbackend = \"kubernetes\"\n{}\n[leases.singleton.kubernetes]\nnamespace = \"{}\"\napi-url = \"{}\"\ntoken-file = \"{}\"\nca-file = \"{}\"\n",
            timing(),
            env.namespace,
            env.url,
            token.display(),
            env.ca.display()
        ),
    )
    .unwrap();
    config
}

/// A replica; killed (and reaped) when dropped.
struct Node {
    owner: String,
    revision: String,
    /// The port of its `/readyz`.
    port: u16,
    child: Child,
    events: PathBuf,
    log: PathBuf,
    read: u64,
    partial: String,
    exited: bool,
    /// When it was started, told to stop (SIGTERM) and seen gone (CLOCK_MONOTONIC ns).
    spawned_ns: u128,
    terminated_ns: Option<u128>,
    gone_ns: Option<u128>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A line of a replica's event log.
#[derive(Debug, Clone)]
struct Event {
    owner: String,
    event: String,
    token: u64,
    t_ns: u128,
}

fn parse_line(line: &str) -> Option<Event> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    Some(Event {
        owner: v["owner"].as_str()?.to_owned(),
        event: v["event"].as_str()?.to_owned(),
        token: v["token"].as_u64()?,
        t_ns: v["t_ns"].as_u64()?.into(),
    })
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// A Deployment of three replicas of `singleton_node` under one handover policy.
struct Deployment {
    name: &'static str,
    handover: &'static str,
    config: PathBuf,
    lease: String,
    dir: PathBuf,
    /// Every replica ever started, in start order (the gone ones too, for their logs).
    nodes: Vec<Node>,
    /// Start, stop and candidate events read so far (ticks and steps are left to the final check).
    events: Vec<Event>,
    /// Who runs the singleton now (owner, token), from the start and stop events.
    running: Option<(String, u64)>,
    next: usize,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The status code of `GET path` on `127.0.0.1:port`, if it answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

impl Deployment {
    fn spawn(&mut self, revision: &str) -> String {
        self.next += 1;
        let owner = format!("{revision}-{}", self.next);
        let node = self.start_process(&owner, revision, "");
        self.nodes.push(node);
        owner
    }

    /// Starts `owner` of `revision` (its files' names end with `suffix`).
    fn start_process(&self, owner: &str, revision: &str, suffix: &str) -> Node {
        let events = self.dir.join(format!("{owner}{suffix}.jsonl"));
        let log = self.dir.join(format!("{owner}{suffix}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let port = free_port();
        let child = Command::new(common::example_binary("singleton_node"))
            .args(["--config", self.config.to_str().unwrap()])
            .args(["--lease", &self.lease])
            .args(["--owner", owner])
            .args(["--revision", revision])
            .args(["--address", &format!("http://{owner}.example:8080")])
            .args(["--handover", self.handover])
            .args(["--events", events.to_str().unwrap()])
            .args(["--health", &format!("127.0.0.1:{port}")])
            .env("RUST_LOG", "actix_coordination=info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start singleton_node");
        Node {
            owner: owner.to_owned(),
            revision: revision.to_owned(),
            port,
            child,
            events,
            log,
            read: 0,
            partial: String::new(),
            exited: false,
            spawned_ns: now_ns(),
            terminated_ns: None,
            gone_ns: None,
        }
    }

    /// Reads what the logs gained; panics if a replica exited that was not told to.
    fn poll(&mut self) {
        let mut new = Vec::new();
        for node in &mut self.nodes {
            if !node.exited {
                if let Ok(Some(status)) = node.child.try_wait() {
                    panic!(
                        "{} exited on its own with {status}: {}",
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
            let Some(end) = node.partial.rfind('\n') else {
                continue;
            };
            let rest = node.partial.split_off(end + 1);
            let complete = std::mem::replace(&mut node.partial, rest);
            new.extend(
                complete
                    .lines()
                    .filter_map(parse_line)
                    .filter(|e| matches!(e.event.as_str(), "start" | "stop" | "candidate")),
            );
        }
        new.sort_by_key(|e| e.t_ns);
        for e in new {
            match e.event.as_str() {
                "start" => self.running = Some((e.owner.clone(), e.token)),
                "stop" if self.running == Some((e.owner.clone(), e.token)) => self.running = None,
                _ => {}
            }
            self.events.push(e);
        }
    }

    async fn wait_until(&mut self, what: &str, check: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + WITHIN;
        loop {
            self.poll();
            if check(self) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} ({}): {what}: not within {WITHIN:?}; running: {:?}",
                self.name,
                self.handover,
                self.running
            );
            sleep(Duration::from_millis(10)).await;
        }
    }

    /// Starts a replica of `revision` and waits until it is ready (its `/readyz` answers 200).
    async fn start_replica(&mut self, revision: &str) -> String {
        let owner = self.spawn(revision);
        self.wait_ready(&owner).await;
        owner
    }

    /// Waits until the live replica `owner` answers `200` on `/readyz`, as a kubelet's readiness
    /// probe would see it.
    async fn wait_ready(&mut self, owner: &str) {
        let port = self
            .nodes
            .iter()
            .find(|n| n.owner == owner && !n.exited)
            .unwrap()
            .port;
        let deadline = Instant::now() + WITHIN;
        loop {
            self.poll();
            let status = tokio::task::spawn_blocking(move || http_status(port, "/readyz"))
                .await
                .unwrap();
            if status == Some(200) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{owner} not ready within {WITHIN:?}: {status:?}"
            );
            sleep(Duration::from_millis(10)).await;
        }
    }

    /// Restarts the replica `owner` (SIGTERM, then the same pod name again: a container restart
    /// keeps the pod and its place in the ReplicaSet's order), and waits until it is ready.
    async fn restart_replica(&mut self, owner: &str) {
        self.stop_replica(owner).await;
        let at = self.nodes.iter().position(|n| n.owner == owner).unwrap();
        let revision = self.nodes[at].revision.clone();
        let restarts = self.nodes.iter().filter(|n| n.owner == owner).count();
        let node = self.start_process(owner, &revision, &format!(".restart-{restarts}"));
        self.nodes.insert(at + 1, node);
        self.wait_ready(owner).await;
    }

    /// SIGTERMs `owner` and waits until it has exited.
    async fn stop_replica(&mut self, owner: &str) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.owner == owner && !n.exited)
            .unwrap();
        node.exited = true;
        node.terminated_ns = Some(now_ns());
        let pid = node.child.id();
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        let deadline = Instant::now() + WITHIN;
        let pid_of = pid;
        loop {
            let node = self
                .nodes
                .iter_mut()
                .find(|n| n.child.id() == pid_of)
                .unwrap();
            if let Some(status) = node.child.try_wait().unwrap() {
                node.gone_ns = Some(now_ns());
                assert!(status.success(), "{owner}: {status}: {}", tail(&node.log));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{owner} did not exit after SIGTERM"
            );
            sleep(Duration::from_millis(10)).await;
        }
        self.poll();
    }

    fn revision_of(&self, owner: &str) -> &str {
        &self
            .nodes
            .iter()
            .find(|n| n.owner == owner)
            .unwrap()
            .revision
    }

    /// The live replicas of `revision`, in start order.
    fn live_of(&self, revision: &str) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| !n.exited && n.revision == revision)
            .map(|n| n.owner.clone())
            .collect()
    }

    /// Moves leadership from the leader to another replica before a rollout (SIGUSR1:
    /// `TransferLeadership::to_best`, among replicas of one revision the earliest started other),
    /// so that rollouts start with the oldest and with the second oldest replica leading.
    async fn move_leader(&mut self) {
        let (leader, _) = self.running.clone().expect("a leader");
        let pid = self
            .nodes
            .iter()
            .find(|n| n.owner == leader && !n.exited)
            .unwrap()
            .child
            .id();
        let status = Command::new("kill")
            .args(["-USR1", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        self.wait_until("another replica leads", |d| {
            d.running.as_ref().is_some_and(|(o, _)| *o != leader)
        })
        .await;
    }

    /// One rollout from revision `from` to `to`: what it changed. With `restart_old`, the oldest
    /// old replica restarts after the first step.
    async fn rollout(&mut self, from: &str, to: &str, restart_old: bool) -> Rollout {
        let start_ns = now_ns();
        let first_leader = self.running.clone().map(|(o, _)| o);
        for step in 0..3 {
            // The Deployment's step: a new replica, and once it is ready, the newest old one
            // goes; nothing else is waited for.
            self.start_replica(to).await;
            let victim = self.live_of(from).pop().expect("an old replica");
            self.stop_replica(&victim).await;
            if step == 0 && restart_old {
                let oldest = self.live_of(from)[0].clone();
                self.restart_replica(&oldest).await;
            }
        }
        if self.handover == "off" {
            self.wait_until("a leader", |d| d.running.is_some()).await;
        } else {
            let to = to.to_owned();
            self.wait_until("the new revision leads", |d| {
                d.running
                    .as_ref()
                    .is_some_and(|(o, _)| d.revision_of(o) == to)
            })
            .await;
        }
        assert!(self.live_of(from).is_empty());
        // The starts during the rollout, and the leaderless time before each.
        let mut last_stop: Option<u128> = None;
        let mut changes = Vec::new();
        for e in &self.events {
            match e.event.as_str() {
                "stop" => last_stop = Some(e.t_ns),
                "start" if e.t_ns > start_ns => {
                    let gap = last_stop.map(|s| e.t_ns.saturating_sub(s)).unwrap_or(0);
                    changes.push((e.owner.clone(), gap));
                }
                _ => {}
            }
        }
        let leader = self.running.clone().map(|(o, _)| o).expect("a leader");
        Rollout {
            to: to.to_owned(),
            first_leader,
            final_leader_revision: self.revision_of(&leader).to_owned(),
            changes,
        }
    }

    /// A text picture of the replicas between `from_ns` and `to_ns`, one row per replica, one
    /// column per `step_ms`: `.` starting, `-` a ready candidate, `#` running the singleton, `~`
    /// stopping after SIGTERM, `x` gone.
    fn timeline(&self, from_ns: u128, to_ns: u128, step_ms: u128) -> String {
        let step = step_ms * 1_000_000;
        let columns = ((to_ns - from_ns) / step + 1) as usize;
        let mut text = String::new();
        let mut axis = format!("{:>8} ", "");
        for c in (0..columns).step_by(10) {
            let label = format!("{} ms", c as u128 * step_ms);
            axis.push_str(&format!("{label:<10}"));
        }
        text.push_str(axis.trim_end());
        text.push('\n');
        for node in &self.nodes {
            let gone = node.gone_ns.unwrap_or(u128::MAX);
            if gone < from_ns {
                continue;
            }
            let ready = self
                .events
                .iter()
                .find(|e| e.owner == node.owner && e.event == "candidate")
                .map_or(u128::MAX, |e| e.t_ns);
            // The singleton's lifetimes on this replica.
            let mut leading = Vec::new();
            let mut since = None;
            for e in self.events.iter().filter(|e| e.owner == node.owner) {
                match e.event.as_str() {
                    "start" => since = Some(e.t_ns),
                    "stop" => {
                        if let Some(s) = since.take() {
                            leading.push((s, e.t_ns));
                        }
                    }
                    _ => {}
                }
            }
            if let Some(s) = since {
                leading.push((s, u128::MAX));
            }
            let mut row = format!("{:>8} ", node.owner);
            for c in 0..columns {
                let (t0, t1) = (from_ns + c as u128 * step, from_ns + (c as u128 + 1) * step);
                let mark = if t1 <= node.spawned_ns {
                    ' '
                } else if leading.iter().any(|(s, e)| *s < t1 && *e > t0) {
                    '#'
                } else if t0 >= gone {
                    'x'
                } else if node.terminated_ns.is_some_and(|t| t0 >= t) {
                    '~'
                } else if t0 >= ready {
                    '-'
                } else {
                    '.'
                };
                row.push(mark);
            }
            text.push_str(row.trim_end());
            text.push('\n');
        }
        text
    }

    /// Every replica's events, checked as the chaos harness checks a run.
    fn check_safety(&self) {
        let events: Vec<NodeEvent> = chaos_check::read_events(
            &self
                .nodes
                .iter()
                .map(|n| n.events.clone())
                .collect::<Vec<_>>(),
        );
        assert!(
            events.iter().any(|e| e.kind == EventKind::Act),
            "the singleton worked"
        );
        if let Err(violations) = chaos_check::check_run(&events, &[]) {
            panic!(
                "{} ({}): {}\n(run directory: {})",
                self.name,
                self.handover,
                chaos_check::describe(&violations),
                self.dir.display()
            );
        }
    }
}

#[derive(Debug)]
struct Rollout {
    /// The revision rolled out.
    to: String,
    first_leader: Option<String>,
    final_leader_revision: String,
    /// Each singleton start during the rollout: who, and the leaderless time before it (ns).
    changes: Vec<(String, u128)>,
}

/// Runs `rollouts()` rollouts of a 3-replica deployment under `handover`; asserts the policy's
/// promises when it is on; records and prints the figures.
async fn run(name: &'static str, handover: &'static str, config_for: impl Fn(&Path) -> PathBuf) {
    let _serial = SERIAL.lock().await;
    let test = format!("{name}-{handover}");
    let dir = scratch(&test);
    let config = config_for(&dir);
    let mut d = Deployment {
        name,
        handover,
        config,
        lease: common::k8s::unique(&format!("rollout-{handover}")),
        dir,
        nodes: Vec::new(),
        events: Vec::new(),
        running: None,
        next: 0,
    };
    for _ in 0..3 {
        d.start_replica("r0").await;
    }
    d.wait_until("a leader", |d| d.running.is_some()).await;
    let mut results: Vec<Rollout> = Vec::new();
    for r in 1..=rollouts() {
        let (from, to) = (format!("r{}", r - 1), format!("r{r}"));
        if r % 2 == 0 {
            d.move_leader().await; // not counted: the rollout starts after it
        }
        let from_ns = now_ns();
        let rollout = d.rollout(&from, &to, r % 2 == 1).await;
        // A picture of the first rollout, and of the first that changed leadership more than once.
        let first_of_several =
            rollout.changes.len() > 1 && results.iter().all(|r| r.changes.len() <= 1);
        if r == 1 || first_of_several {
            let picture = d.timeline(from_ns, now_ns(), 10);
            println!("{name} ({handover}) rollout {r}:\n{picture}");
            std::fs::write(d.dir.join(format!("timeline-rollout-{r}.txt")), picture).unwrap();
        }
        println!(
            "{name} ({handover}) rollout {r}: leader before {:?}, changes {:?}, leader after: {}",
            rollout.first_leader, rollout.changes, rollout.final_leader_revision
        );
        if handover != "off" {
            assert_eq!(
                rollout.changes.len(),
                1,
                "rollout {r}: one leadership change: {rollout:?}"
            );
            assert_eq!(rollout.final_leader_revision, to, "{rollout:?}");
        }
        results.push(rollout);
    }
    d.check_safety();
    record(name, handover, &results);
}

/// Prints the figures and appends them to `target/rollout/results.jsonl`.
fn record(name: &str, handover: &str, results: &[Rollout]) {
    let changes: Vec<usize> = results.iter().map(|r| r.changes.len()).collect();
    let mut gaps_ms: Vec<f64> = results
        .iter()
        .flat_map(|r| r.changes.iter().map(|(_, gap)| *gap as f64 / 1e6))
        .collect();
    gaps_ms.sort_by(f64::total_cmp);
    let total: usize = changes.iter().sum();
    let pct = |p: f64| {
        gaps_ms
            .get(((gaps_ms.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0.0)
    };
    let new_leads = results
        .iter()
        .filter(|r| r.final_leader_revision == r.to)
        .count();
    println!(
        "{name} ({handover}): {} rollouts, {total} leadership changes ({:.2} per rollout, max {}), leaderless per change: median {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        results.len(),
        total as f64 / results.len().max(1) as f64,
        changes.iter().max().unwrap_or(&0),
        pct(0.5),
        pct(0.99),
        gaps_ms.last().copied().unwrap_or(0.0)
    );
    let line = serde_json::json!({
        "backend": name,
        "handover": handover,
        "rollouts": results.len(),
        "changes": changes,
        "leaderless_ms": gaps_ms,
        "ended_on_new_revision": new_leads,
    });
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("rollout")
        .join("results.jsonl");
    let mut text = std::fs::read_to_string(&path).unwrap_or_default();
    text.push_str(&format!("{line}\n"));
    std::fs::write(&path, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rollouts_change_leadership_once_with_the_policy() {
    run("etcd", "newest-revision", |dir| {
        etcd_config(dir, "rollout-policy")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rollouts_without_the_policy() {
    run("etcd", "off", |dir| etcd_config(dir, "rollout-off")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_rollouts_change_leadership_once_with_the_policy() {
    run("kubernetes", "newest-revision", kubernetes_config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_rollouts_without_the_policy() {
    run("kubernetes", "off", kubernetes_config).await;
}
