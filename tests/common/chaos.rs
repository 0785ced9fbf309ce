//! The chaos harness: several real processes (`examples/singleton_node.rs`) compete for one lease
//! on a real server while the harness SIGKILLs holders, freezes them with SIGSTOP for longer than the
//! TTL, blackholes their traffic, and restarts the server. Every process logs each step its singleton
//! takes (timestamp taken *before* `check_alive()`), so the harness can prove afterwards that no two
//! processes ever acted at once and that a frozen holder never acted after it was resumed. It draws
//! the timeline as an SVG.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::{sleep, Instant};

use super::proxy::{FaultProxy, ProxyMode};

/// What the harness needs from a backend.
pub trait ChaosBackend {
    /// The backend's name (used for file names).
    fn name(&self) -> &str;
    /// Called once before the nodes start, with the run's directory (for the server's log, files
    /// the nodes' configurations name, ...).
    fn prepare(&mut self, run_dir: &Path) -> impl std::future::Future<Output = ()>;
    /// Where the nodes' proxies forward to.
    fn upstream(&self) -> SocketAddr;
    /// The `CoordinationConfig` TOML of a node whose traffic goes through `proxy`.
    fn config_toml(&self, proxy: SocketAddr, lease_ttl: Duration) -> String;
    /// Stops the server and starts it again.
    fn restart_server(&mut self) -> impl std::future::Future<Output = ()>;
}

/// The kinds of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Kill,
    Pause,
    Blackhole,
    ServerRestart,
    /// SIGTERM: the node stops its singleton, releases the lease and exits; a new process
    /// replaces it. The next tenure must start well before the TTL.
    GracefulStop,
}

/// A fault as it happened.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub fault: Fault,
    pub owner: Option<String>,
    pub start_ns: u128,
    pub end_ns: u128,
}

/// One step a node's singleton took, or a start / stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    pub owner: String,
    pub event: String,
    pub token: u64,
    pub t_ns: u128,
}

/// The interval in which one owner acted under one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenure {
    pub owner: String,
    pub token: u64,
    pub first_ns: u128,
    pub last_ns: u128,
    pub steps: usize,
}

/// What a run found.
#[derive(Debug)]
pub struct ChaosReport {
    pub backend: String,
    pub seed: u64,
    pub ttl: Duration,
    pub tenures: Vec<Tenure>,
    pub faults: Vec<FaultRecord>,
    /// Per fault that hit the acting holder (for a server restart: whoever was acting): how long
    /// from the start of the fault until a new tenure acted.
    pub takeovers: Vec<(Fault, Duration)>,
    /// The faults whose holder went on acting under the same tenure after the fault (a server
    /// restart shorter than the TTL).
    pub kept: Vec<Fault>,
    /// Per pause of the acting holder: how long after the resume (the instant before `SIGCONT`)
    /// its singleton stopped. (That it ran nothing in between is asserted.)
    pub pause_stops: Vec<Duration>,
    pub svg: PathBuf,
    pub duration: Duration,
}

struct Node {
    owner: String,
    child: Child,
    proxy: FaultProxy,
    events: PathBuf,
}

impl Drop for Node {
    /// A node left running by a panicking harness would compete for the lease forever.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            signal(self.child.id(), "CONT");
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The `singleton_node` example, built with every feature (cheap when up to date).
pub fn node_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = env!("CARGO_MANIFEST_DIR");
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--all-features",
            "--example",
            "singleton_node",
        ])
        .current_dir(manifest)
        .status()
        .expect("run cargo build");
    assert!(
        status.success(),
        "building the singleton_node example failed"
    );
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(manifest).join("target"));
    let bin = target.join("debug").join("examples").join("singleton_node");
    assert!(bin.exists(), "{} missing", bin.display());
    bin
}

fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

pub fn read_events(paths: &[PathBuf]) -> Vec<NodeEvent> {
    let mut events = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue; // a line cut by SIGKILL
            };
            events.push(NodeEvent {
                owner: v["owner"].as_str().unwrap_or_default().to_owned(),
                event: v["event"].as_str().unwrap_or_default().to_owned(),
                token: v["token"].as_u64().unwrap_or_default(),
                t_ns: v["t_ns"]
                    .as_u64()
                    .map(u128::from)
                    .or_else(|| v["t_ns"].as_str().and_then(|s| s.parse().ok()))
                    .unwrap_or_default(),
            });
        }
    }
    events.sort_by_key(|e| e.t_ns);
    events
}

/// Groups the steps into tenures and checks that tenures of different owners never overlap and
/// that tokens rise from one tenure to the next.
pub fn tenures(events: &[NodeEvent]) -> Vec<Tenure> {
    let mut by_key: BTreeMap<(String, u64), Tenure> = BTreeMap::new();
    for e in events.iter().filter(|e| e.event == "act") {
        by_key
            .entry((e.owner.clone(), e.token))
            .and_modify(|t| {
                t.first_ns = t.first_ns.min(e.t_ns);
                t.last_ns = t.last_ns.max(e.t_ns);
                t.steps += 1;
            })
            .or_insert(Tenure {
                owner: e.owner.clone(),
                token: e.token,
                first_ns: e.t_ns,
                last_ns: e.t_ns,
                steps: 1,
            });
    }
    let mut tenures: Vec<Tenure> = by_key.into_values().collect();
    tenures.sort_by_key(|t| t.first_ns);
    tenures
}

pub fn assert_no_overlap(tenures: &[Tenure]) {
    for pair in tenures.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            b.first_ns > a.last_ns,
            "overlap: {} (token {}) acted until {} but {} (token {}) acted from {}",
            a.owner,
            a.token,
            a.last_ns,
            b.owner,
            b.token,
            b.first_ns
        );
        assert!(b.token > a.token, "token went back from {a:?} to {b:?}");
    }
}

async fn spawn_node<B: ChaosBackend>(
    backend: &B,
    bin: &Path,
    dir: &Path,
    lease: &str,
    ttl: Duration,
    index: usize,
    generation: usize,
) -> Node {
    let owner = format!("node-{index}.{generation}");
    let events = dir.join(format!("{owner}.jsonl"));
    let proxy = FaultProxy::start(backend.upstream()).await;
    let config = dir.join(format!("{owner}.toml"));
    std::fs::write(&config, backend.config_toml(proxy.addr(), ttl)).unwrap();
    let log = std::fs::File::create(dir.join(format!("{owner}.log"))).unwrap();
    let child = Command::new(bin)
        .args([
            "--config",
            config.to_str().unwrap(),
            "--lease",
            lease,
            "--owner",
            &owner,
        ])
        .args(["--events", events.to_str().unwrap()])
        .env("RUST_LOG", "actix_coordination=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start singleton_node");
    Node {
        owner,
        child,
        proxy,
        events,
    }
}

/// A fresh run directory `target/chaos/<backend>[-pause]-<pid>` (the backend prepared in it) and
/// a lease name of its own.
async fn prepare_run<B: ChaosBackend>(backend: &mut B, kind: &str) -> (PathBuf, String) {
    let suffix = if kind == "chaos" { "" } else { "-pause" };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("chaos")
        .join(format!("{}{suffix}-{}", backend.name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    backend.prepare(&dir).await;
    (
        dir,
        format!("{kind}-{}-{}", backend.name(), std::process::id()),
    )
}

/// Runs the harness for `duration` with `nodes` processes and returns what it saw; panics on a
/// safety violation.
pub async fn run<B: ChaosBackend>(
    backend: &mut B,
    nodes: usize,
    ttl: Duration,
    duration: Duration,
    seed: u64,
) -> ChaosReport {
    let bin = node_binary();
    let (dir, lease) = prepare_run(backend, "chaos").await;
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut generation = 0usize;
    let mut running: Vec<Node> = Vec::new();
    let mut all_events: Vec<PathBuf> = Vec::new();
    for i in 0..nodes {
        let node = spawn_node(backend, &bin, &dir, &lease, ttl, i, generation).await;
        all_events.push(node.events.clone());
        running.push(node);
    }
    let started = Instant::now();
    let start_ns = now_ns();
    let mut faults = Vec::new();
    // Let a first holder settle.
    sleep(ttl).await;
    while started.elapsed() < duration {
        sleep(Duration::from_millis(rng.u64(1500..4000))).await;
        // The node acting right now, if any.
        let events = read_events(&all_events);
        let recent = now_ns().saturating_sub(500_000_000);
        let holder = events
            .iter()
            .rev()
            .find(|e| e.event == "act" && e.t_ns >= recent)
            .map(|e| e.owner.clone());
        let target = holder
            .as_ref()
            .and_then(|h| running.iter().position(|n| &n.owner == h))
            .unwrap_or_else(|| rng.usize(0..running.len()));
        let fault = match rng.u8(0..10) {
            0..=1 => Fault::Kill,
            2..=3 => Fault::Pause,
            4..=5 => Fault::Blackhole,
            6..=7 => Fault::GracefulStop,
            _ => Fault::ServerRestart,
        };
        let owner = running[target].owner.clone();
        let t0 = now_ns();
        let mut resumed_ns = None;
        match fault {
            Fault::Kill => {
                let mut node = running.remove(target);
                let _ = node.child.kill();
                let _ = node.child.wait();
                sleep(Duration::from_millis(500)).await;
                generation += 1;
                let replacement =
                    spawn_node(backend, &bin, &dir, &lease, ttl, target, generation).await;
                all_events.push(replacement.events.clone());
                running.insert(target, replacement);
            }
            Fault::Pause => {
                let pid = running[target].child.id();
                signal(pid, "STOP");
                sleep(ttl + Duration::from_millis(rng.u64(500..2000))).await;
                // The fault ends the instant before SIGCONT is sent: the node can run nothing
                // earlier, and everything it runs from then on is checked.
                resumed_ns = Some(now_ns());
                signal(pid, "CONT");
            }
            Fault::Blackhole => {
                running[target].proxy.set_mode(ProxyMode::Blackhole);
                sleep(ttl + Duration::from_millis(rng.u64(500..2000))).await;
                running[target].proxy.set_mode(ProxyMode::Pass);
            }
            Fault::ServerRestart => backend.restart_server().await,
            Fault::GracefulStop => {
                let mut node = running.remove(target);
                signal(node.child.id(), "TERM");
                let give_up = Instant::now() + Duration::from_secs(20);
                while node.child.try_wait().ok().flatten().is_none() {
                    if Instant::now() >= give_up {
                        let _ = node.child.kill();
                        let _ = node.child.wait();
                        panic!("{} did not exit after SIGTERM", node.owner);
                    }
                    sleep(Duration::from_millis(20)).await;
                }
                generation += 1;
                let replacement =
                    spawn_node(backend, &bin, &dir, &lease, ttl, target, generation).await;
                all_events.push(replacement.events.clone());
                running.insert(target, replacement);
            }
        }
        faults.push(FaultRecord {
            fault,
            owner: (fault != Fault::ServerRestart).then_some(owner),
            start_ns: t0,
            end_ns: resumed_ns.unwrap_or_else(now_ns),
        });
        // Give the cluster time to settle so that the next fault meets a holder.
        sleep(ttl).await;
    }
    // Graceful stop of every node: SIGTERM, then wait for the releases.
    for node in &running {
        signal(node.child.id(), "TERM");
    }
    let give_up = Instant::now() + Duration::from_secs(20);
    for node in &mut running {
        loop {
            if node.child.try_wait().ok().flatten().is_some() {
                break;
            }
            if Instant::now() >= give_up {
                let _ = node.child.kill();
                let _ = node.child.wait();
                panic!("{} did not exit after SIGTERM", node.owner);
            }
            sleep(Duration::from_millis(50)).await;
        }
    }
    let end_ns = now_ns();
    let events = read_events(&all_events);
    let tenures = tenures(&events);
    let fault_log: String = faults
        .iter()
        .map(|f| {
            format!(
                "{{\"fault\":\"{:?}\",\"owner\":{},\"start_ns\":{},\"end_ns\":{}}}\n",
                f.fault,
                f.owner
                    .as_ref()
                    .map_or("null".to_owned(), |o| format!("\"{o}\"")),
                f.start_ns,
                f.end_ns
            )
        })
        .collect();
    std::fs::write(dir.join("faults.jsonl"), fault_log).unwrap();
    let svg = dir.join("timeline.svg");
    std::fs::write(
        &svg,
        draw_svg(
            &format!(
                "{}: who acted under the lease (ttl {ttl:?}, {nodes} nodes, seed {seed}, {} tenures, {} faults)",
                backend.name(),
                tenures.len(),
                faults.len()
            ),
            nodes,
            &tenures,
            &faults,
            start_ns,
            end_ns,
        ),
    )
    .unwrap();
    assert_no_overlap(&tenures);
    // A paused holder (frozen past its TTL) runs nothing at all under its old token once resumed:
    // no step, and not even a timer tick (the guard's watcher stops the singleton before its
    // timers run).
    for f in faults.iter().filter(|f| f.fault == Fault::Pause) {
        assert_resumed_holder_ran_nothing(
            &events,
            f.owner.as_deref().unwrap(),
            f.start_ns,
            f.end_ns,
        );
    }
    let (takeovers, kept) = fault_outcomes(&faults, &events);
    let pause_stops = pause_stops(&faults, &events);
    // A graceful stop hands over at once (the release wakes a waiting node's watch), not after
    // the TTL like a crash.
    for (fault, takeover) in &takeovers {
        if *fault == Fault::GracefulStop {
            assert!(
                *takeover < ttl / 2,
                "a graceful stop took {takeover:?} to hand over (ttl {ttl:?})"
            );
        }
    }
    let report = ChaosReport {
        backend: backend.name().to_owned(),
        seed,
        ttl,
        tenures,
        faults,
        takeovers,
        kept,
        pause_stops,
        svg,
        duration: started.elapsed(),
    };
    std::fs::write(dir.join("summary.txt"), report.summary()).unwrap();
    report
}

/// Checks that `owner`, frozen from `stopped_ns` to `resumed_ns` (past its TTL), took no step and
/// ran no timer tick under the token it acted with before, after it was resumed.
pub fn assert_resumed_holder_ran_nothing(
    events: &[NodeEvent],
    owner: &str,
    stopped_ns: u128,
    resumed_ns: u128,
) {
    let before = events
        .iter()
        .filter(|e| e.owner == owner && e.event == "act" && e.t_ns < stopped_ns)
        .map(|e| e.token)
        .max();
    if let Some(token) = before {
        let late: Vec<&NodeEvent> = events
            .iter()
            .filter(|e| {
                e.owner == owner
                    && (e.event == "act" || e.event == "tick")
                    && e.t_ns >= resumed_ns
                    && e.token == token
            })
            .collect();
        assert!(
            late.is_empty(),
            "{owner} ran {} ticks or steps after SIGCONT with its old token {token}: {:?}",
            late.len(),
            late.first()
        );
    }
}

/// What [`pause_run`] saw.
#[derive(Debug)]
pub struct PauseReport {
    /// The frozen holder and the token it acted with.
    pub paused: (String, u64),
    /// The node that took over and its token.
    pub took_over: (String, u64),
    /// From the other node's first step to the frozen node's resume.
    pub other_acted_before_resume: Duration,
    /// From the resume to the frozen node's singleton stop event.
    pub stopped_after_resume: Duration,
}

/// Two nodes; the one acting is frozen (SIGSTOP) until the other has acted for a while, then
/// resumed (SIGCONT). Asserts that the resumed node takes no step and runs no timer tick under
/// its old token after it was resumed (so none after the other node's first step either), and
/// that its singleton stops.
pub async fn pause_run<B: ChaosBackend>(backend: &mut B, ttl: Duration) -> PauseReport {
    let bin = node_binary();
    let (dir, lease) = prepare_run(backend, "pause").await;
    let mut nodes = Vec::new();
    for i in 0..2 {
        nodes.push(spawn_node(backend, &bin, &dir, &lease, ttl, i, 0).await);
    }
    let paths: Vec<PathBuf> = nodes.iter().map(|n| n.events.clone()).collect();
    let first_act = |owner: Option<&str>, after: u128| {
        read_events(&paths)
            .into_iter()
            .find(|e| e.event == "act" && e.t_ns > after && owner.is_none_or(|o| e.owner == o))
    };
    let wait_for = |what: &'static str, within: Duration| {
        let give_up = Instant::now() + within;
        move || assert!(Instant::now() < give_up, "no {what} within {within:?}")
    };
    // A holder acts.
    let check = wait_for("first step", ttl * 10);
    let holder = loop {
        if let Some(e) = first_act(None, 0) {
            break e;
        }
        check();
        sleep(Duration::from_millis(20)).await;
    };
    let frozen = nodes.iter().position(|n| n.owner == holder.owner).unwrap();
    let other = nodes[1 - frozen].owner.clone();
    let stopped_ns = now_ns();
    signal(nodes[frozen].child.id(), "STOP");
    // The other node takes over (after the TTL) and acts for a while.
    let check = wait_for("takeover", ttl * 10);
    let takeover = loop {
        if let Some(e) = first_act(Some(&other), stopped_ns) {
            break e;
        }
        check();
        sleep(Duration::from_millis(20)).await;
    };
    // Let the frozen node's timers fall due many times over (an absence of the frozen node is
    // the point: it cannot do anything while stopped).
    sleep(ttl).await;
    let resumed_ns = now_ns();
    signal(nodes[frozen].child.id(), "CONT");
    // Its singleton stops.
    let check = wait_for("stop of the resumed singleton", ttl * 5);
    let stop = loop {
        let events = read_events(&paths);
        if let Some(e) = events
            .iter()
            .find(|e| e.owner == holder.owner && e.event == "stop" && e.token == holder.token)
        {
            break e.clone();
        }
        check();
        sleep(Duration::from_millis(20)).await;
    };
    // A bounded absence check: whatever the resumed node would still run, it runs within this.
    sleep(Duration::from_millis(500)).await;
    let events = read_events(&paths);
    assert_resumed_holder_ran_nothing(&events, &holder.owner, stopped_ns, resumed_ns);
    let late_steps = events
        .iter()
        .filter(|e| {
            e.owner == holder.owner
                && (e.event == "act" || e.event == "tick")
                && e.t_ns >= takeover.t_ns
        })
        .count();
    assert_eq!(
        late_steps, 0,
        "the resumed node ran after the other node's first step"
    );
    assert!(takeover.token > holder.token);
    for node in &nodes {
        signal(node.child.id(), "TERM");
    }
    PauseReport {
        paused: (holder.owner.clone(), holder.token),
        took_over: (takeover.owner.clone(), takeover.token),
        other_acted_before_resume: Duration::from_nanos((resumed_ns - takeover.t_ns) as u64),
        stopped_after_resume: Duration::from_nanos(stop.t_ns.saturating_sub(resumed_ns) as u64),
    }
}

/// For every pause of the node acting just before it (within 500 ms): how long after the resume
/// the singleton of the tenure it acted under stopped.
fn pause_stops(faults: &[FaultRecord], events: &[NodeEvent]) -> Vec<Duration> {
    let mut stops = Vec::new();
    for f in faults.iter().filter(|f| f.fault == Fault::Pause) {
        let owner = f.owner.as_deref().unwrap_or_default();
        let Some(token) = events
            .iter()
            .filter(|e| {
                e.owner == owner
                    && e.event == "act"
                    && e.t_ns < f.start_ns
                    && e.t_ns + 500_000_000 > f.start_ns
            })
            .map(|e| e.token)
            .max()
        else {
            continue;
        };
        if let Some(stop) = events.iter().find(|e| {
            e.owner == owner && e.event == "stop" && e.token == token && e.t_ns >= f.end_ns
        }) {
            stops.push(Duration::from_nanos((stop.t_ns - f.end_ns) as u64));
        }
    }
    stops.sort();
    stops
}

/// For every fault that hit the node acting just before it (for a server restart: whoever was
/// acting), either how long until a new tenure acted, or that the tenure went on after the fault.
fn fault_outcomes(
    faults: &[FaultRecord],
    events: &[NodeEvent],
) -> (Vec<(Fault, Duration)>, Vec<Fault>) {
    let acts: Vec<&NodeEvent> = events.iter().filter(|e| e.event == "act").collect();
    let (mut takeovers, mut kept) = (Vec::new(), Vec::new());
    for f in faults {
        let Some(holder) = acts.iter().rev().find(|e| {
            e.t_ns < f.start_ns
                && e.t_ns + 300_000_000 > f.start_ns
                && f.owner.as_ref().is_none_or(|o| *o == e.owner)
        }) else {
            continue;
        };
        let same = |e: &NodeEvent| e.owner == holder.owner && e.token == holder.token;
        let next = acts.iter().find(|e| e.t_ns > f.start_ns && !same(e));
        let survived = acts
            .iter()
            .any(|e| same(e) && e.t_ns >= f.end_ns && next.is_none_or(|n| e.t_ns < n.t_ns));
        if survived {
            kept.push(f.fault);
        } else if let Some(next) = next {
            takeovers.push((
                f.fault,
                Duration::from_nanos((next.t_ns - f.start_ns) as u64),
            ));
        }
    }
    (takeovers, kept)
}

impl ChaosReport {
    /// The run in figures: faults by kind, tenures, takeover times by fault kind.
    pub fn summary(&self) -> String {
        const KINDS: [Fault; 5] = [
            Fault::Kill,
            Fault::Pause,
            Fault::Blackhole,
            Fault::ServerRestart,
            Fault::GracefulStop,
        ];
        let mut out = format!(
            "{} chaos run: seed {}, ttl {:?}, {:.0?}, {} faults, {} tenures (tokens {}..={}); timeline: {}\n",
            self.backend,
            self.seed,
            self.ttl,
            self.duration,
            self.faults.len(),
            self.tenures.len(),
            self.tenures.iter().map(|t| t.token).min().unwrap_or_default(),
            self.tenures.iter().map(|t| t.token).max().unwrap_or_default(),
            self.svg.display()
        );
        // How close the run came to an overlap: the shortest time between one tenure's last step
        // and the next tenure's first.
        if let Some((a, b)) = self
            .tenures
            .windows(2)
            .map(|p| (&p[0], &p[1]))
            .min_by_key(|(a, b)| b.first_ns.saturating_sub(a.last_ns))
        {
            let _ = writeln!(
                out,
                "closest handover: {:.3}s from {}'s last step (token {}) to {}'s first (token {})",
                b.first_ns.saturating_sub(a.last_ns) as f64 / 1e9,
                a.owner,
                a.token,
                b.owner,
                b.token
            );
        }
        let _ = writeln!(
            out,
            "{:<14} {:>6} {:>9} {:>5} {:>9} {:>9} {:>9}",
            "fault", "faults", "takeovers", "kept", "min", "median", "max"
        );
        for kind in KINDS {
            let mut times: Vec<Duration> = self
                .takeovers
                .iter()
                .filter(|(f, _)| *f == kind)
                .map(|(_, d)| *d)
                .collect();
            times.sort();
            let show = |d: Option<Duration>| {
                d.map_or("-".to_owned(), |d| format!("{:.2}s", d.as_secs_f64()))
            };
            let n = times.len();
            let median = (n > 0).then(|| (times[(n - 1) / 2] + times[n / 2]) / 2);
            let _ = writeln!(
                out,
                "{:<14} {:>6} {:>9} {:>5} {:>9} {:>9} {:>9}",
                format!("{kind:?}"),
                self.faults.iter().filter(|f| f.fault == kind).count(),
                times.len(),
                self.kept.iter().filter(|f| **f == kind).count(),
                show(times.first().copied()),
                show(median),
                show(times.last().copied()),
            );
        }
        if !self.pause_stops.is_empty() {
            let n = self.pause_stops.len();
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let _ = writeln!(
                out,
                "paused holders: {n}, ticks or steps after the resume: 0, singleton stopped after the resume: {:.1} / {:.1} / {:.1} ms (min / median / max)",
                ms(self.pause_stops[0]),
                ms((self.pause_stops[(n - 1) / 2] + self.pause_stops[n / 2]) / 2),
                ms(self.pause_stops[n - 1]),
            );
        }
        out
    }
}

/// Which of the harness's nodes (`node-<slot>.<generation>`) an owner is.
fn slot(owner: &str) -> usize {
    owner
        .strip_prefix("node-")
        .and_then(|rest| rest.split('.').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Colour and legend of each kind of fault in the timeline.
fn fault_style(fault: Fault) -> (&'static str, &'static str) {
    match fault {
        Fault::Kill => ("#b00020", "kill -9 (new process)"),
        Fault::Pause => ("#f08c00", "SIGSTOP..SIGCONT"),
        Fault::Blackhole => ("#7b3fbf", "traffic blackholed"),
        Fault::ServerRestart => ("#888888", "server kill -9..ready"),
        Fault::GracefulStop => ("#2b8a3e", "SIGTERM (graceful stop, new process)"),
    }
}

/// The timeline as an SVG: one row per node slot (a killed node's replacement takes its row), a
/// bar per tenure labelled with its fencing token, each fault as a band under the node it hit
/// (server restarts across every row), and any overlap of tenures in red. Long runs wrap into
/// panels of two minutes.
pub fn draw_svg(
    title: &str,
    nodes: usize,
    tenures: &[Tenure],
    faults: &[FaultRecord],
    start_ns: u128,
    end_ns: u128,
) -> String {
    const SECOND: u128 = 1_000_000_000;
    let (left, width, row, bar) = (64.0, 1100.0, 24.0, 15.0);
    let rows = nodes
        .max(
            tenures
                .iter()
                .map(|t| slot(&t.owner) + 1)
                .max()
                .unwrap_or(0),
        )
        .max(1);
    let total_s = end_ns.saturating_sub(start_ns).div_ceil(SECOND).max(1);
    let panel_s: u128 = if total_s <= 150 {
        total_s.div_ceil(10) * 10
    } else {
        120
    };
    let panels = total_s.div_ceil(panel_s) as usize;
    let panel_h = 14.0 + row * rows as f64 + 22.0;
    let top = 58.0;
    let height = top + panel_h * panels as f64 + 4.0;
    let px_per_ns = width / (panel_s * SECOND) as f64;
    let overlaps: Vec<(u128, u128)> = tenures
        .windows(2)
        .filter(|p| p[1].first_ns <= p[0].last_ns)
        .map(|p| (p[1].first_ns, p[0].last_ns.min(p[1].last_ns)))
        .collect();

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11">"##,
        left + width + 16.0
    );
    let _ = writeln!(svg, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let _ = writeln!(svg, r##"<text x="8" y="18" font-size="14">{title}</text>"##);
    // Legend.
    let mut legend: Vec<(String, String)> = vec![(
        "hsl(200,60%,62%)".into(),
        "tenure, labelled with its fencing token".into(),
    )];
    for kind in [
        Fault::Kill,
        Fault::Pause,
        Fault::Blackhole,
        Fault::ServerRestart,
        Fault::GracefulStop,
    ] {
        let (colour, what) = fault_style(kind);
        legend.push((colour.into(), format!("{kind:?}: {what}")));
    }
    legend.push(("red".into(), "overlap (a violation)".into()));
    let mut lx = 8.0;
    for (colour, text) in legend {
        let _ = writeln!(
            svg,
            r##"<rect x="{lx:.0}" y="31" width="18" height="10" fill="{colour}"/><text x="{:.0}" y="40" font-size="10">{text}</text>"##,
            lx + 22.0
        );
        lx += 34.0 + 5.3 * text.len() as f64;
    }

    for p in 0..panels {
        let p0 = start_ns + p as u128 * panel_s * SECOND;
        let p1 = (p0 + panel_s * SECOND).min(end_ns.max(start_ns + 1));
        let y0 = top + panel_h * p as f64;
        let rows_bottom = y0 + 14.0 + row * rows as f64;
        let x = |t: u128| left + (t.clamp(p0, p1) - p0) as f64 * px_per_ns;
        let visible = |a: u128, b: u128| b >= p0 && a <= p1;
        // Grid and axis.
        let tick = if panel_s > 60 { 10 } else { 5 };
        let mut s = 0;
        while s <= panel_s {
            let t = p0 + s * SECOND;
            if t > p1 {
                break;
            }
            let xs = x(t);
            let _ = writeln!(
                svg,
                r##"<line x1="{xs:.1}" y1="{:.1}" x2="{xs:.1}" y2="{rows_bottom:.1}" stroke="#e4e4e4"/><text x="{xs:.1}" y="{:.1}" fill="#777" font-size="10" text-anchor="middle">{}s</text>"##,
                y0 + 10.0,
                rows_bottom + 12.0,
                (t - start_ns) / SECOND
            );
            s += tick;
        }
        for r in 0..rows {
            let y = y0 + 14.0 + row * r as f64;
            let _ = writeln!(svg, r##"<text x="8" y="{:.1}">node-{r}</text>"##, y + 12.0);
            let _ = writeln!(
                svg,
                r##"<line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#ccc"/>"##,
                y + row - 2.0,
                x(p1),
                y + row - 2.0
            );
        }
        // Server restarts: a band over every row.
        for f in faults
            .iter()
            .filter(|f| f.owner.is_none() && visible(f.start_ns, f.end_ns))
        {
            let (colour, what) = fault_style(f.fault);
            let (x0, x1) = (x(f.start_ns), x(f.end_ns).max(x(f.start_ns) + 1.5));
            let _ = writeln!(
                svg,
                r##"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{colour}" fill-opacity="0.25"><title>{:?}: {what}, {:.1}s</title></rect>"##,
                y0 + 12.0,
                x1 - x0,
                rows_bottom - y0 - 12.0,
                f.fault,
                (f.end_ns - f.start_ns) as f64 / 1e9
            );
        }
        // Tenures.
        for t in tenures.iter().filter(|t| visible(t.first_ns, t.last_ns)) {
            let y = y0 + 14.0 + row * slot(&t.owner) as f64;
            let (x0, x1) = (x(t.first_ns), x(t.last_ns).max(x(t.first_ns) + 1.0));
            let hue = (t.token * 67) % 360;
            let _ = write!(
                svg,
                r##"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{bar}" fill="hsl({hue},60%,62%)"><title>{} token {}: {:.1}s..{:.1}s, {} steps</title></rect>"##,
                x1 - x0,
                t.owner,
                t.token,
                (t.first_ns - start_ns) as f64 / 1e9,
                (t.last_ns - start_ns) as f64 / 1e9,
                t.steps
            );
            let label = t.token.to_string();
            if x1 - x0 >= 6.0 * label.len() as f64 + 3.0 {
                let _ = write!(
                    svg,
                    r##"<text x="{:.1}" y="{:.1}" font-size="10">{label}</text>"##,
                    x0 + 2.0,
                    y + 11.5
                );
            }
            svg.push('\n');
        }
        // Faults on one node: a band under its row.
        for f in faults.iter().filter(|f| visible(f.start_ns, f.end_ns)) {
            let Some(owner) = f.owner.as_deref() else {
                continue;
            };
            let (colour, what) = fault_style(f.fault);
            let y = y0 + 14.0 + row * slot(owner) as f64;
            let (x0, x1) = (x(f.start_ns), x(f.end_ns).max(x(f.start_ns) + 2.0));
            let _ = writeln!(
                svg,
                r##"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="5" fill="{colour}"><title>{:?} of {owner}: {what}, {:.1}s</title></rect>"##,
                y + bar + 1.0,
                x1 - x0,
                f.fault,
                (f.end_ns - f.start_ns) as f64 / 1e9
            );
        }
        for &(a, b) in overlaps.iter().filter(|(a, b)| visible(*a, *b)) {
            let (x0, x1) = (x(a), x(b).max(x(a) + 2.0));
            let _ = writeln!(
                svg,
                r##"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="red" fill-opacity="0.6"><title>overlap</title></rect>"##,
                y0 + 12.0,
                x1 - x0,
                rows_bottom - y0 - 12.0
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}
