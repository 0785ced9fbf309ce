//! The chaos harness: several real processes (`examples/singleton_node.rs`) compete for one lease
//! on a real server while the harness SIGKILLs holders, freezes them with SIGSTOP for longer than the
//! TTL, blackholes their traffic, partitions them from the servers with the kernel (both ways or one
//! way), makes their wall clock jump by more than the TTL, stops them gracefully and restarts the
//! server, and (sharded runs) delays or drops the answers to a node's requests. Each node runs in
//! a network namespace of its own (`netns.rs`) and under libfaketime
//! (its wall clock follows a file the harness writes; its monotonic clock is untouched); its
//! events are stamped with `CLOCK_MONOTONIC`, one clock for every process of the machine. Every process logs
//! its singleton's start and stop, every timer tick (timestamp taken *before* `check_alive()`) and
//! every step the guard allowed, so the harness can prove afterwards (with the verdicts of
//! `chaos_check.rs`) that no two singletons ever ran at once, no two processes ever acted at once,
//! and a frozen holder ran nothing after it was resumed. It draws the timeline as an SVG and writes
//! every figure of docs/chaos/RESULTS.md to `summary.txt`. [`run_sharded`] does the same with
//! `examples/sharded_node.rs` processes (a group of shards, each under its own lease) and checks
//! every shard's events on their own (`shard_check.rs`).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::{sleep, Instant};

pub use super::chaos_check::*;
use super::netns::{Direction, NodeNet};
use super::proxy::{FaultProxy, ProxyMode};

/// What the harness needs from a backend.
pub trait ChaosBackend {
    /// The backend's name (used for file names).
    fn name(&self) -> &str;
    /// Called once before the nodes start, with the run's directory (for the server's log, files
    /// the nodes' configurations name, ...).
    fn prepare(&mut self, run_dir: &Path) -> impl std::future::Future<Output = ()>;
    /// Where the nodes' proxies forward to: one proxy per server (cluster member) per node.
    fn upstreams(&self) -> Vec<SocketAddr>;
    /// The `CoordinationConfig` TOML of a node whose traffic goes through `proxies` (one per
    /// upstream, in the same order).
    fn config_toml(&self, proxies: &[SocketAddr], lease_ttl: Duration) -> String;
    /// The kinds of fault a run injects ([`Fault::ALL`] unless the backend has more).
    fn fault_kinds(&self) -> Vec<Fault> {
        Fault::ALL.to_vec()
    }
    /// Injects a server-side fault ([`Fault::is_server`]) and returns when it is over; the
    /// default handles [`Fault::ServerRestart`] with [`restart_server`](Self::restart_server).
    fn server_fault(
        &mut self,
        fault: Fault,
        rng: &mut fastrand::Rng,
        ttl: Duration,
    ) -> impl std::future::Future<Output = ()> {
        let _ = (rng, ttl);
        async move {
            assert_eq!(fault, Fault::ServerRestart, "not a fault of this backend");
            self.restart_server().await;
        }
    }
    /// Stops the server and starts it again.
    fn restart_server(&mut self) -> impl std::future::Future<Output = ()>;
}

struct Node {
    owner: String,
    child: Child,
    proxies: Vec<FaultProxy>,
    events: PathBuf,
    /// libfaketime's `FAKETIME_TIMESTAMP_FILE` of the node: `+0`, or the skew of a clock fault.
    clock: PathBuf,
    /// Dropped after the process is killed (field order), which removes the namespace.
    net: NodeNet,
}

impl Node {
    /// Sets every proxy of the node (all its traffic) to `mode`.
    fn set_mode(&self, mode: ProxyMode) {
        for proxy in &self.proxies {
            proxy.set_mode(mode);
        }
    }

    /// Sets the node's wall clock `seconds` ahead (behind if negative) of the real one. The node
    /// reads the file again within a second (`FAKETIME_CACHE_DURATION=1`).
    fn set_clock(&self, seconds: i64) {
        let tmp = self.clock.with_extension("faketime.tmp");
        std::fs::write(&tmp, format!("{seconds:+}\n")).unwrap();
        std::fs::rename(&tmp, &self.clock).unwrap();
    }
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

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of the nodes' events.
pub use super::clock::mono_ns as now_ns;

/// This process's wall clock minus [`now_ns`], in nanoseconds.
pub fn wall_offset_ns() -> i128 {
    let mono = now_ns();
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    wall as i128 - mono as i128
}

/// libfaketime: `$ACTIX_COORD_TEST_LIBFAKETIME`, or Debian's `libfaketime` package.
pub fn libfaketime() -> PathBuf {
    if let Ok(path) = std::env::var("ACTIX_COORD_TEST_LIBFAKETIME") {
        return PathBuf::from(path);
    }
    let arch = std::env::consts::ARCH;
    [
        format!("/usr/lib/{arch}-linux-gnu/faketime/libfaketime.so.1"),
        "/usr/lib/faketime/libfaketime.so.1".to_owned(),
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .unwrap_or_else(|| {
        panic!(
            "libfaketime not found (the chaos nodes' clock faults need it): install the Debian \
             package `libfaketime` (`scripts/test-cluster.sh install` does) or set \
             ACTIX_COORD_TEST_LIBFAKETIME"
        )
    })
}

/// The `singleton_node` example, built with every feature.
pub fn node_binary() -> PathBuf {
    super::example_binary("singleton_node")
}

fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The state letter of process `pid` (`/proc/<pid>/stat`: `T` while stopped), if it exists.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`: the name may hold spaces and parentheses, the state follows the
    // last `)`.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Waits `length` while node `owner` (process `pid`, just sent SIGSTOP) stays frozen, looking
/// at its state every 20 ms: a pause that did not hold (the stop never took, or something other
/// than this harness continued the node) would make the run's checks judge a node as frozen
/// that was running, so it fails the run, saying when.
async fn frozen_for(pid: u32, owner: &str, length: Duration) {
    let start = Instant::now();
    let until = start + length;
    let mut stopped = false;
    while Instant::now() < until {
        match process_state(pid) {
            Some('T') => stopped = true,
            Some(state) if stopped => panic!(
                "{owner} (pid {pid}) was continued {:?} into its pause by something other than the \
                 harness (state {state:?})",
                start.elapsed()
            ),
            Some(_) if start.elapsed() > Duration::from_secs(1) => {
                panic!("{owner} (pid {pid}) did not stop within 1 s of its SIGSTOP")
            }
            // Not stopped yet, or gone (a node that exits shows in its events).
            _ => {}
        }
        sleep(Duration::from_millis(20).min(until.saturating_duration_since(Instant::now()))).await;
    }
}

/// How a node is started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NodeMode {
    /// As shipped: the singleton steps only while its guard allows.
    #[default]
    Safe,
    /// `--unsafe-ignore-guard`: the singleton's work runs on a detached task that never checks
    /// the guard and outlives the tenure (for showing that the checker catches it).
    IgnoreGuard,
}

/// What the nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// `singleton_node`: one singleton under the run's lease.
    Singleton(NodeMode),
    /// `sharded_node`: a group of `shards` workers named after the run's lease, each shard under
    /// its own lease, spread over the nodes (`--config-key singleton`: the backend's configuration
    /// is the same). Its event lines name their shard ([`super::shard_check`]).
    Sharded { shards: usize },
}

impl Program {
    fn binary(self) -> PathBuf {
        match self {
            Program::Singleton(_) => node_binary(),
            Program::Sharded { .. } => super::example_binary("sharded_node"),
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn spawn_node<B: ChaosBackend>(
    backend: &B,
    program: Program,
    dir: &Path,
    lease: &str,
    ttl: Duration,
    index: usize,
    generation: usize,
) -> Node {
    let bin = program.binary();
    let owner = format!("node-{index}.{generation}");
    let events = dir.join(format!("{owner}.jsonl"));
    let net = NodeNet::create();
    let mut proxies = Vec::new();
    for upstream in backend.upstreams() {
        proxies.push(FaultProxy::start_on(net.host_ip(), upstream).await);
    }
    let clock = dir.join(format!("{owner}.faketime"));
    std::fs::write(&clock, "+0\n").unwrap();
    let addrs: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    let config = dir.join(format!("{owner}.toml"));
    std::fs::write(&config, backend.config_toml(&addrs, ttl)).unwrap();
    let log = std::fs::File::create(dir.join(format!("{owner}.log"))).unwrap();
    // `ip netns exec` runs the node as the same process (signals reach it) in its namespace.
    let mut command = net.command(&bin);
    command.args(["--config", config.to_str().unwrap()]);
    match program {
        Program::Singleton(mode) => {
            // A candidacy (one revision for all): SIGUSR1 transfers to the best other candidate.
            command.args(["--lease", lease, "--revision", "r0"]);
            if mode == NodeMode::IgnoreGuard {
                command.arg("--unsafe-ignore-guard");
            }
        }
        Program::Sharded { shards } => {
            command
                .args(["--config-key", "singleton", "--group", lease])
                .args(["--shards", &shards.to_string()]);
        }
    }
    command
        .args(["--owner", &owner])
        .args(["--events", events.to_str().unwrap()]);
    let child = command
        .env("RUST_LOG", "actix_coordination=debug")
        .env("NO_COLOR", "1")
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", &clock)
        .env("FAKETIME_CACHE_DURATION", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    Node {
        owner,
        child,
        proxies,
        events,
        clock,
        net,
    }
}

/// A fresh run directory `target/chaos/<backend>[-<kind>]-<pid>` (the backend prepared in it) and
/// a lease name of its own.
async fn prepare_run<B: ChaosBackend>(backend: &mut B, kind: &str) -> (PathBuf, String) {
    let suffix = if kind == "chaos" {
        String::new()
    } else {
        format!("-{kind}")
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("chaos")
        .join(format!("{}{suffix}-{}", backend.name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // What an earlier, killed run left behind.
    for name in super::netns::sweep_stale() {
        println!("removed the network namespace {name} of a run that no longer runs");
    }
    backend.prepare(&dir).await;
    (
        dir,
        format!("{kind}-{}-{}", backend.name(), std::process::id()),
    )
}

/// SIGTERM to `node`, then waits (up to 20 s) for it to exit.
async fn stop_gracefully(node: &mut Node) {
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
}

/// How long a run lasts, at least: `duration`, and `faults` faults. In any case it goes on until
/// every kind of fault has met an acting holder once (the [`FaultSchedule`] opens with every kind;
/// a run gives up on that after `2 × duration + 60 s`).
#[derive(Debug, Clone, Copy)]
pub struct RunLength {
    pub duration: Duration,
    pub faults: usize,
}

/// A page of a long run's timeline: ten minutes.
const PAGE: u128 = 600_000_000_000;

/// The events of the last seconds of every log written to in the last two seconds (at most the
/// last 256 KiB of each), sorted by time: enough for [`holder_at`], which looks back 500 ms, and
/// cheap however long the run (a sharded node logs a line per shard every 50 ms).
fn recent_events(paths: &[PathBuf]) -> Vec<NodeEvent> {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL: u64 = 256 * 1024;
    let mut events = Vec::new();
    for path in paths {
        let Ok(mut file) = std::fs::File::open(path) else {
            continue;
        };
        let Ok(meta) = file.metadata() else { continue };
        let fresh = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_none_or(|age| age < Duration::from_secs(2));
        if !fresh {
            continue;
        }
        let from = meta.len().saturating_sub(TAIL);
        let mut bytes = Vec::new();
        if file.seek(SeekFrom::Start(from)).is_err() || file.read_to_end(&mut bytes).is_err() {
            continue;
        }
        let text = String::from_utf8_lossy(&bytes);
        // A tail that starts inside a line: its first line is cut.
        let text = match (from, text.find('\n')) {
            (0, _) => &text[..],
            (_, Some(end)) => &text[end + 1..],
            (_, None) => "",
        };
        events.extend(parse_events(text));
    }
    events.sort_by_key(|e| e.t_ns);
    events
}

/// Waits (at most `within`) until some node acts, so that the next fault meets a holder.
async fn settle(all_events: &[PathBuf], within: Duration) {
    let give_up = Instant::now() + within;
    while Instant::now() < give_up {
        if holder_at(&recent_events(all_events), now_ns(), None).is_some() {
            return;
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the harness with `nodes` processes for at least `length`, and in any case until every
/// kind of fault has met an acting holder once. Writes `summary.txt`, `faults.jsonl` and the
/// timeline (`timeline.svg`, or pages `timeline-01.svg`, ... of ten minutes each for a long run)
/// into the run's directory, then panics on any safety violation; returns what it saw otherwise.
pub async fn run<B: ChaosBackend>(
    backend: &mut B,
    nodes: usize,
    ttl: Duration,
    length: RunLength,
    seed: u64,
) -> ChaosReport {
    let program = Program::Singleton(NodeMode::Safe);
    let (dir, info) = drive(backend, nodes, ttl, length, seed, program).await;
    let (start_ns, end_ns) = info.span_ns.expect("a run's span");
    // Every verdict: steps and lifetimes never overlap, tokens rise, no tick after a newer
    // tenure acted, and a paused holder runs nothing at all under its old token once resumed.
    let mut report = analyze(&dir, &info);
    let pages = page_count(start_ns, end_ns);
    if pages > 1 {
        report.svg = dir.join(format!("timeline-01.svg .. timeline-{pages:02}.svg"));
    }
    // The figures first: a run's summary survives whatever happens to its pictures.
    std::fs::write(dir.join("summary.txt"), report.summary()).unwrap();
    print!("{}", report.summary());
    draw_timeline(&dir, &info, &report, start_ns, end_ns);
    assert!(
        report.violations.is_empty(),
        "{}\n(run directory: {})",
        describe(&report.violations),
        dir.display()
    );
    assert_graceful_handovers(&report.outcomes, ttl);
    assert_no_node_panicked(&dir);
    report
}

/// No node process panicked during the run (a debug build's internal checks included): a node
/// that dies on its own is no fault the harness made, and the fleet runs short of a node from
/// then on, which the verdicts above would not notice (a run with clock faults lost two of its
/// three nodes to a debug assertion of the sharded view and still found no violation).
fn assert_no_node_panicked(dir: &std::path::Path) {
    let panics: Vec<String> = super::chaos_check::node_logs(dir)
        .into_iter()
        .flat_map(|(node, text)| {
            text.lines()
                .filter(|line| line.contains("panicked at"))
                .map(|line| format!("{node}: {line}"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        panics.is_empty(),
        "node processes panicked:\n{}\n(run directory: {})",
        panics.join("\n"),
        dir.display()
    );
}

/// [`run`] with `nodes` processes of `examples/sharded_node.rs`, a group of `shards` workers
/// ([`Program::Sharded`]): the same faults and late and lost answers ([`Fault::sharded_kinds`]),
/// aimed at a node whose workers act; then every shard's
/// events are checked on their own with every verdict ([`super::shard_check`]). Writes
/// `summary.txt` and a timeline per shard (`shards/<shard>/timeline.svg`, pages for a long run),
/// then panics on any violation (naming its shard) or a graceful stop whose shards were not
/// handed over well before the TTL; returns what it saw otherwise.
pub async fn run_sharded<B: ChaosBackend>(
    backend: &mut B,
    nodes: usize,
    shards: usize,
    ttl: Duration,
    length: RunLength,
    seed: u64,
) -> super::shard_check::ShardedReport {
    use super::shard_check::{
        analyze_sharded, assert_sharded_graceful_handovers, describe_shards, shard_order,
    };
    let (dir, info) = drive(
        backend,
        nodes,
        ttl,
        length,
        seed,
        Program::Sharded { shards },
    )
    .await;
    let (start_ns, end_ns) = info.span_ns.expect("a run's span");
    let mut report = analyze_sharded(&dir, &info);
    let page = if page_count(start_ns, end_ns) > 1 {
        "timeline-01.svg"
    } else {
        "timeline.svg"
    };
    if let Some(first) = shard_order(report.shards.keys()).first() {
        report.svg = dir.join("shards").join(first.as_str()).join(page);
    }
    std::fs::write(dir.join("summary.txt"), report.summary()).unwrap();
    print!("{}", report.summary());
    for (shard, shard_report) in &report.shards {
        let shard_dir = dir.join("shards").join(shard);
        std::fs::create_dir_all(&shard_dir).unwrap();
        let info = RunInfo {
            backend: format!("{}, shard {shard}", info.backend),
            ..info.clone()
        };
        draw_timeline(&shard_dir, &info, shard_report, start_ns, end_ns);
    }
    assert!(
        report.violations.is_empty(),
        "{}\n(run directory: {})",
        describe_shards(&report.violations),
        dir.display()
    );
    assert_sharded_graceful_handovers(&dir, ttl);
    assert_no_node_panicked(&dir);
    report
}

/// A graceful stop hands over at once (the release wakes a waiting node's watch), not after the
/// TTL like a crash; a planned transfer within one TTL and a second (at once to a live target; a
/// target that died a moment ago and still looked live is left the lease for one TTL). No other
/// kind has a bound: a node cut off, frozen, or whose answers come late or not at all
/// (`SlowAnswers`, `LostAnswers`, like `PartitionToNode`) may keep its tenure or lose it, and
/// only the safety verdicts judge what follows.
pub fn assert_graceful_handovers(outcomes: &[FaultOutcome], ttl: Duration) {
    for o in outcomes {
        match (o.fault, o.takeover) {
            (Fault::GracefulStop, Some(t)) => assert!(
                t.after < ttl / 2,
                "a graceful stop took {:?} to hand over (ttl {ttl:?})",
                t.after
            ),
            (Fault::Transfer, Some(t)) => assert!(
                t.after < ttl + Duration::from_secs(1),
                "a transfer took {:?} to hand over (ttl {ttl:?})",
                t.after
            ),
            _ => {}
        }
    }
}

/// The run itself: starts the nodes, injects the faults, stops the nodes gracefully; writes
/// `faults.jsonl` and `run.json`. Returns the run's directory and what `run.json` says.
async fn drive<B: ChaosBackend>(
    backend: &mut B,
    nodes: usize,
    ttl: Duration,
    length: RunLength,
    seed: u64,
    program: Program,
) -> (PathBuf, RunInfo) {
    let kind = match program {
        Program::Singleton(_) => "chaos",
        Program::Sharded { .. } => "sharded",
    };
    let (dir, lease) = prepare_run(backend, kind).await;
    // The kinds of fault come from their own generator, so that a seed replays them whatever
    // the other draws (waits, targets when nobody acts).
    let mut kinds = backend.fault_kinds();
    match program {
        // Planned transfers mixed with the faults.
        Program::Singleton(_) => kinds.push(Fault::Transfer),
        // Late and lost answers mixed with the faults.
        Program::Sharded { .. } => kinds = Fault::sharded_kinds(&kinds),
    }
    let mut schedule = FaultSchedule::with_kinds(seed, &kinds);
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut generation = 0usize;
    let mut running: Vec<Node> = Vec::new();
    let mut all_events: Vec<PathBuf> = Vec::new();
    // Before the first node starts: it may act before the last one is up.
    let start_ns = now_ns();
    for i in 0..nodes {
        let node = spawn_node(backend, program, &dir, &lease, ttl, i, generation).await;
        all_events.push(node.events.clone());
        running.push(node);
    }
    let started = Instant::now();
    let duration = length.duration;
    let give_up_coverage = duration * 2 + Duration::from_secs(60);
    let wall_offset = wall_offset_ns();
    let mut faults = Vec::new();
    // Let a first holder settle.
    settle(&all_events, ttl * 10).await;
    while started.elapsed() < duration
        || faults.len() < length.faults
        || (!schedule.covered() && started.elapsed() < give_up_coverage)
    {
        sleep(Duration::from_millis(rng.u64(500..2000))).await;
        // The tenure acting right now, if any.
        let holder = holder_at(&recent_events(&all_events), now_ns(), None);
        let at_holder = holder
            .as_ref()
            .and_then(|(h, _)| running.iter().position(|n| &n.owner == h));
        let target = at_holder.unwrap_or_else(|| rng.usize(0..running.len()));
        let fault = schedule.next_fault();
        let owner = running[target].owner.clone();
        let t0 = now_ns();
        let mut resumed_ns = None;
        // Kill and graceful stop end the node's process: a new one takes its slot.
        let mut replace = false;
        // A partition lasts less than the TTL (the holder may keep its tenure) or longer.
        let partition_length = |rng: &mut fastrand::Rng| {
            if rng.bool() {
                ttl.mul_f64(0.3 + 0.6 * rng.f64())
            } else {
                ttl + Duration::from_millis(rng.u64(500..2000))
            }
        };
        match fault {
            Fault::Kill => {
                let mut node = running.remove(target);
                let _ = node.child.kill();
                let _ = node.child.wait();
                sleep(Duration::from_millis(500)).await;
                replace = true;
            }
            Fault::Pause => {
                let pid = running[target].child.id();
                signal(pid, "STOP");
                frozen_for(pid, &owner, ttl + Duration::from_millis(rng.u64(500..2000))).await;
                // The fault ends the instant before SIGCONT is sent: the node can run nothing
                // earlier, and everything it runs from then on is checked.
                resumed_ns = Some(now_ns());
                signal(pid, "CONT");
            }
            Fault::Blackhole => {
                running[target].set_mode(ProxyMode::Blackhole);
                sleep(ttl + Duration::from_millis(rng.u64(500..2000))).await;
                running[target].set_mode(ProxyMode::Pass);
            }
            Fault::Partition | Fault::PartitionFromNode | Fault::PartitionToNode => {
                let direction = match fault {
                    Fault::Partition => Direction::Both,
                    Fault::PartitionFromNode => Direction::FromNode,
                    _ => Direction::ToNode,
                };
                let length = partition_length(&mut rng);
                running[target].net.partition(direction);
                sleep(length).await;
                running[target].net.heal();
            }
            Fault::SlowAnswers => {
                // Every answer 0.3 to 1.5 TTLs late, for one to two and a half TTLs: a claim or a
                // renewal takes effect at once and is answered late. Then the proxies pass again;
                // the answers they delayed meanwhile still come late, the last one up to `delay`
                // after the switch (a later answer of the same connection waits behind them), and
                // the fault lasts until then.
                let delay = ttl.mul_f64(0.3 + 1.2 * rng.f64());
                let length = ttl.mul_f64(1.0 + 1.5 * rng.f64());
                running[target].set_mode(ProxyMode::SlowAnswers(delay));
                sleep(length).await;
                running[target].set_mode(ProxyMode::Pass);
                sleep(delay).await;
            }
            Fault::LostAnswers => {
                // Every answer dropped (requests still take effect) for 0.3 to 1.5 TTLs; the
                // proxies reset the connections that lost answers when they pass again.
                let length = ttl.mul_f64(0.3 + 1.2 * rng.f64());
                running[target].set_mode(ProxyMode::DropAnswers);
                sleep(length).await;
                running[target].set_mode(ProxyMode::Pass);
            }
            Fault::ClockSkew => {
                // More than the TTL, ahead or behind, for two to three TTLs; then back.
                let by = ttl.as_secs() as i64 + rng.i64(1..=4);
                let by = if rng.bool() { by } else { -by };
                running[target].set_clock(by);
                sleep(ttl * 2 + Duration::from_millis(rng.u64(0..ttl.as_millis() as u64))).await;
                running[target].set_clock(0);
            }
            Fault::ServerRestart
            | Fault::MemberKill
            | Fault::LeaderKill
            | Fault::MemberPartition => backend.server_fault(fault, &mut rng, ttl).await,
            Fault::GracefulStop => {
                let mut node = running.remove(target);
                stop_gracefully(&mut node).await;
                replace = true;
            }
            Fault::Transfer => {
                signal(running[target].child.id(), "USR1");
                sleep(Duration::from_millis(200)).await;
            }
        }
        if replace {
            generation += 1;
            let replacement =
                spawn_node(backend, program, &dir, &lease, ttl, target, generation).await;
            all_events.push(replacement.events.clone());
            running.insert(target, replacement);
        }
        // A node fault aimed at a node that was not acting tests nothing a holder is for.
        let met_holder = holder.is_some() && (fault.is_server() || at_holder.is_some());
        schedule.done(fault, met_holder);
        faults.push(FaultRecord {
            fault,
            owner: (!fault.is_server()).then_some(owner),
            holder: if met_holder { holder } else { None },
            start_ns: t0,
            end_ns: resumed_ns.unwrap_or_else(now_ns),
        });
        if faults.len() % 50 == 0 {
            println!(
                "{}: {} faults in {:.0?}",
                backend.name(),
                faults.len(),
                started.elapsed()
            );
            std::fs::write(
                dir.join("faults.jsonl"),
                faults.iter().map(fault_line).collect::<String>(),
            )
            .unwrap();
        }
        // Give the cluster time to settle so that the next fault meets a holder.
        settle(&all_events, ttl * 3).await;
    }
    // Time for the last fault's outcome to show (the holder acting on, or a takeover).
    sleep(ttl * 2).await;
    // Graceful stop of every node: SIGTERM, then wait for the releases.
    for node in &running {
        signal(node.child.id(), "TERM");
    }
    for node in &mut running {
        stop_gracefully(node).await;
    }
    let end_ns = now_ns();
    let fault_log: String = faults.iter().map(fault_line).collect();
    std::fs::write(dir.join("faults.jsonl"), fault_log).unwrap();
    let info = RunInfo {
        backend: match program {
            Program::Singleton(_) => backend.name().to_owned(),
            Program::Sharded { .. } => format!("{}-sharded", backend.name()),
        },
        seed,
        ttl,
        nodes,
        duration: started.elapsed(),
        wall_offset_ns: Some(wall_offset),
        span_ns: Some((start_ns, end_ns)),
    };
    std::fs::write(dir.join("run.json"), info.to_json()).unwrap();
    (dir, info)
}

/// How many pages of [`PAGE`] a run's timeline takes.
pub fn page_count(start_ns: u128, end_ns: u128) -> u128 {
    end_ns.saturating_sub(start_ns).div_ceil(PAGE).max(1)
}

/// Writes a run's timeline into `dir`: `timeline.svg`, or for a run longer than [`PAGE`] the
/// pages `timeline-01.svg`, `timeline-02.svg`, ... of ten minutes each, every page's axis in
/// seconds since `start_ns` (the run's first instant). Returns the paths written.
pub fn draw_timeline(
    dir: &Path,
    info: &RunInfo,
    report: &ChaosReport,
    start_ns: u128,
    end_ns: u128,
) -> Vec<PathBuf> {
    let pages = page_count(start_ns, end_ns);
    let mut written = Vec::new();
    for page in 0..pages {
        let (from, to) = if pages == 1 {
            (start_ns, end_ns)
        } else {
            let from = start_ns + page * PAGE;
            (from, (from + PAGE).min(end_ns))
        };
        let path = if pages == 1 {
            dir.join("timeline.svg")
        } else {
            dir.join(format!("timeline-{:02}.svg", page + 1))
        };
        let page_title = if pages == 1 {
            String::new()
        } else {
            format!(
                ", page {} of {pages}: {}..{} s",
                page + 1,
                (from - start_ns) / 1_000_000_000,
                (to - start_ns) / 1_000_000_000
            )
        };
        std::fs::write(
            &path,
            draw_svg(
                &format!(
                    "{}: who acted under the lease (ttl {:?}, {} nodes, seed {}, {} tenures, {} faults{page_title})",
                    info.backend,
                    info.ttl,
                    info.nodes,
                    info.seed,
                    report.tenures.len(),
                    report.faults.len()
                ),
                info.nodes,
                &report.tenures,
                &report.lifetimes,
                &report.faults,
                Window {
                    origin_ns: start_ns,
                    from_ns: from,
                    to_ns: to,
                },
            ),
        )
        .unwrap();
        written.push(path);
    }
    written
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
    /// Every violation the checker found in the run's event logs.
    pub violations: Vec<Violation>,
}

/// Two nodes: `node-0` (started as `holder_mode` says) and, once `node-0` acts, `node-1`. The
/// holder `node-0` is frozen (SIGSTOP) until `node-1` has taken over and acted for a TTL, then
/// resumed (SIGCONT); the run ends a bounded while after `node-0`'s singleton stopped. Returns the
/// checker's verdict over the event logs, with the pause ([`check_run`]); panics only if the
/// scenario does not unfold (no step, no takeover, no stop in time).
pub async fn pause_run<B: ChaosBackend>(
    backend: &mut B,
    ttl: Duration,
    holder_mode: NodeMode,
) -> PauseReport {
    let kind = match holder_mode {
        NodeMode::Safe => "pause",
        NodeMode::IgnoreGuard => "unsafe",
    };
    let (dir, lease) = prepare_run(backend, kind).await;
    let start_ns = now_ns();
    let first = Program::Singleton(holder_mode);
    let mut nodes = vec![spawn_node(backend, first, &dir, &lease, ttl, 0, 0).await];
    let mut paths = vec![nodes[0].events.clone()];
    let first_act = |paths: &[PathBuf], owner: &str, after: u128| {
        read_events(paths)
            .into_iter()
            .find(|e| e.kind == EventKind::Act && e.t_ns > after && e.owner == owner)
    };
    let wait_for = |what: &'static str, within: Duration| {
        let give_up = Instant::now() + within;
        move || assert!(Instant::now() < give_up, "no {what} within {within:?}")
    };
    // node-0 acts; then node-1 joins.
    let check = wait_for("first step", ttl * 10);
    let holder = loop {
        if let Some(e) = first_act(&paths, "node-0.0", 0) {
            break e;
        }
        check();
        sleep(Duration::from_millis(20)).await;
    };
    let other = Program::Singleton(NodeMode::Safe);
    nodes.push(spawn_node(backend, other, &dir, &lease, ttl, 1, 0).await);
    paths.push(nodes[1].events.clone());
    let stopped_ns = now_ns();
    signal(nodes[0].child.id(), "STOP");
    // The other node takes over (after the TTL) and acts for a while.
    let check = wait_for("takeover", ttl * 10);
    let takeover = loop {
        if let Some(e) = first_act(&paths, "node-1.0", stopped_ns) {
            break e;
        }
        check();
        sleep(Duration::from_millis(20)).await;
    };
    // Let the frozen node's timers fall due many times over (an absence of the frozen node is
    // the point: it cannot do anything while stopped).
    sleep(ttl).await;
    let resumed_ns = now_ns();
    signal(nodes[0].child.id(), "CONT");
    // Its singleton stops.
    let check = wait_for("stop of the resumed singleton", ttl * 5);
    let stop = loop {
        let events = read_events(&paths);
        if let Some(e) = events.iter().find(|e| {
            e.owner == holder.owner && e.kind == EventKind::Stop && e.token == holder.token
        }) {
            break e.clone();
        }
        check();
        sleep(Duration::from_millis(20)).await;
    };
    // A bounded absence check: whatever the resumed node would still run, it runs within this.
    sleep(Duration::from_millis(500)).await;
    let events = read_events(&paths);
    let pause = Pause {
        owner: holder.owner.clone(),
        stopped_ns,
        resumed_ns,
    };
    let violations = check_run(&events, std::slice::from_ref(&pause))
        .err()
        .unwrap_or_default();
    for node in &mut nodes {
        signal(node.child.id(), "CONT");
        stop_gracefully(node).await;
    }
    let pause_fault = FaultRecord {
        fault: Fault::Pause,
        owner: Some(pause.owner.clone()),
        holder: Some((holder.owner.clone(), holder.token)),
        start_ns: stopped_ns,
        end_ns: resumed_ns,
    };
    std::fs::write(
        dir.join("timeline.svg"),
        draw_svg(
            &format!(
                "{}: {} holder frozen past its TTL, then resumed (ttl {ttl:?}, {})",
                backend.name(),
                if holder_mode == NodeMode::Safe {
                    "a safe"
                } else {
                    "an UNSAFE (--unsafe-ignore-guard)"
                },
                if violations.is_empty() {
                    "no violation".to_owned()
                } else {
                    format!("{} violations", violations.len())
                }
            ),
            2,
            &tenures(&events),
            &lifetimes(&events),
            &[pause_fault],
            Window::whole(start_ns, now_ns()),
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("summary.txt"),
        if violations.is_empty() {
            "no violation\n".to_owned()
        } else {
            describe(&violations)
        },
    )
    .unwrap();
    PauseReport {
        paused: (holder.owner.clone(), holder.token),
        took_over: (takeover.owner.clone(), takeover.token),
        other_acted_before_resume: Duration::from_nanos((resumed_ns - takeover.t_ns) as u64),
        stopped_after_resume: Duration::from_nanos(stop.t_ns.saturating_sub(resumed_ns) as u64),
        violations,
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
        Fault::Transfer => (
            "#1971c2",
            "SIGUSR1 (planned transfer to the best other candidate)",
        ),
        Fault::MemberKill => ("#5c5c5c", "etcd member kill -9..restarted"),
        Fault::LeaderKill => ("#222222", "etcd leader kill -9..restarted"),
        Fault::MemberPartition => ("#a0a0a0", "etcd member SIGSTOP..SIGCONT"),
        Fault::Partition => ("#1864ab", "kernel drops both ways"),
        Fault::PartitionFromNode => ("#4dabf7", "kernel drops the node's packets"),
        Fault::PartitionToNode => ("#0b7285", "kernel drops packets to the node"),
        Fault::ClockSkew => ("#e64980", "wall clock off by more than the TTL"),
        Fault::SlowAnswers => (
            "#c29d00",
            "answers 0.3..1.5 TTL late (requests take effect)",
        ),
        Fault::LostAnswers => ("#6b4f1d", "answers dropped (requests take effect)"),
    }
}

/// What part of a run a timeline picture shows, on the monotonic clock of the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The run's first instant: the axis and the tooltips count seconds from it.
    pub origin_ns: u128,
    /// The picture's left edge.
    pub from_ns: u128,
    /// The picture's right edge.
    pub to_ns: u128,
}

impl Window {
    /// The whole run in one picture.
    pub fn whole(start_ns: u128, end_ns: u128) -> Self {
        Self {
            origin_ns: start_ns,
            from_ns: start_ns,
            to_ns: end_ns,
        }
    }
}

/// The timeline as an SVG: one row per node slot (a killed node's replacement takes its row), a
/// bar per tenure labelled with its fencing token, a thin line under it for the singleton's
/// lifetime (start to last tick), each fault as a band under the node it hit (server restarts
/// across every row), and any overlap of tenures or lifetimes in red. Long runs wrap into panels
/// of two minutes.
pub fn draw_svg(
    title: &str,
    nodes: usize,
    tenures: &[Tenure],
    lifetimes: &[Lifetime],
    faults: &[FaultRecord],
    window: Window,
) -> String {
    const SECOND: u128 = 1_000_000_000;
    let Window {
        origin_ns,
        from_ns: start_ns,
        to_ns: end_ns,
    } = window;
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
    let px_per_ns = width / (panel_s * SECOND) as f64;
    let overlaps: Vec<(u128, u128)> = tenures
        .windows(2)
        .filter(|p| p[1].first_ns <= p[0].last_ns)
        .map(|p| (p[1].first_ns, p[0].last_ns.min(p[1].last_ns)))
        .chain(
            lifetimes
                .windows(2)
                .filter(|p| p[1].start_ns <= p[0].end_ns)
                .map(|p| (p[1].start_ns, p[0].end_ns.min(p[1].end_ns))),
        )
        .collect();

    // Legend: as many lines as it takes; the panels start below it.
    let mut legend: Vec<(String, String)> = vec![(
        "hsl(200,60%,62%)".into(),
        "tenure, labelled with its fencing token".into(),
    )];
    for kind in Fault::EVERY {
        if !Fault::ALL.contains(&kind) && !faults.iter().any(|f| f.fault == kind) {
            continue;
        }
        let (colour, what) = fault_style(kind);
        legend.push((colour.into(), format!("{kind:?}: {what}")));
    }
    legend.push((
        "#555".into(),
        "thin line: the singleton's lifetime (start to last tick)".into(),
    ));
    legend.push(("red".into(), "overlap (a violation)".into()));
    let mut legend_svg = String::new();
    let (mut lx, mut ly) = (8.0, 31.0);
    for (colour, text) in legend {
        let item = 34.0 + 5.3 * text.len() as f64;
        if lx + item > left + width && lx > 8.0 {
            (lx, ly) = (8.0, ly + 15.0);
        }
        let _ = writeln!(
            legend_svg,
            r##"<rect x="{lx:.0}" y="{ly:.0}" width="18" height="10" fill="{colour}"/><text x="{:.0}" y="{:.0}" font-size="10">{text}</text>"##,
            lx + 22.0,
            ly + 9.0
        );
        lx += item;
    }
    let top = ly + 11.0;
    let height = top + panel_h * panels as f64 + 4.0;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11">"##,
        left + width + 16.0
    );
    let _ = writeln!(svg, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let _ = writeln!(svg, r##"<text x="8" y="18" font-size="14">{title}</text>"##);
    svg.push_str(&legend_svg);

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
                t.saturating_sub(origin_ns) / SECOND
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
                t.first_ns.saturating_sub(origin_ns) as f64 / 1e9,
                t.last_ns.saturating_sub(origin_ns) as f64 / 1e9,
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
        // Lifetimes: a thin line under the tenure's bar.
        for l in lifetimes.iter().filter(|l| visible(l.start_ns, l.end_ns)) {
            let y = y0 + 14.0 + row * slot(&l.owner) as f64 + bar - 1.0;
            let (x0, x1) = (x(l.start_ns), x(l.end_ns).max(x(l.start_ns) + 1.0));
            let _ = writeln!(
                svg,
                r##"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="1.5" fill="#555"><title>{} token {}: alive {:.2}s..{:.2}s, {} ticks</title></rect>"##,
                x1 - x0,
                l.owner,
                l.token,
                l.start_ns.saturating_sub(origin_ns) as f64 / 1e9,
                l.end_ns.saturating_sub(origin_ns) as f64 / 1e9,
                l.ticks
            );
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
