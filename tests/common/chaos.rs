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
    pub tenures: Vec<Tenure>,
    pub faults: Vec<FaultRecord>,
    /// Per fault that hit the acting holder: how long until another owner acted.
    pub takeovers: Vec<(Fault, Duration)>,
    pub svg: PathBuf,
    pub duration: Duration,
}

struct Node {
    owner: String,
    child: Child,
    proxy: FaultProxy,
    events: PathBuf,
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
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("chaos")
        .join(format!("{}-{}", backend.name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let lease = format!("chaos-{}-{}", backend.name(), std::process::id());
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
        let fault = match rng.u8(0..8) {
            0..=1 => Fault::Kill,
            2..=3 => Fault::Pause,
            4..=5 => Fault::Blackhole,
            _ => Fault::ServerRestart,
        };
        let owner = running[target].owner.clone();
        let t0 = now_ns();
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
                signal(pid, "CONT");
            }
            Fault::Blackhole => {
                running[target].proxy.set_mode(ProxyMode::Blackhole);
                sleep(ttl + Duration::from_millis(rng.u64(500..2000))).await;
                running[target].proxy.set_mode(ProxyMode::Pass);
            }
            Fault::ServerRestart => backend.restart_server().await,
        }
        faults.push(FaultRecord {
            fault,
            owner: (fault != Fault::ServerRestart).then_some(owner),
            start_ns: t0,
            end_ns: now_ns(),
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
    let svg = dir.join("timeline.svg");
    std::fs::write(
        &svg,
        draw_svg(backend.name(), &tenures, &faults, start_ns, end_ns, ttl),
    )
    .unwrap();
    assert_no_overlap(&tenures);
    // A paused holder never acts after it was resumed with the token it had.
    for f in faults.iter().filter(|f| f.fault == Fault::Pause) {
        let owner = f.owner.as_deref().unwrap();
        let before = events
            .iter()
            .filter(|e| e.owner == owner && e.event == "act" && e.t_ns < f.start_ns)
            .map(|e| e.token)
            .max();
        if let Some(token) = before {
            let late = events.iter().find(|e| {
                e.owner == owner && e.event == "act" && e.t_ns >= f.end_ns && e.token == token
            });
            assert!(
                late.is_none(),
                "{owner} acted after SIGCONT with its old token: {late:?}"
            );
        }
    }
    let takeovers = faults
        .iter()
        .filter_map(|f| {
            let owner = f.owner.as_deref()?;
            let acting = events.iter().any(|e| {
                e.owner == owner
                    && e.event == "act"
                    && e.t_ns < f.start_ns
                    && e.t_ns + 300_000_000 > f.start_ns
            });
            if !acting {
                return None;
            }
            let next = events
                .iter()
                .find(|e| e.event == "act" && e.owner != owner && e.t_ns > f.start_ns)?;
            Some((
                f.fault,
                Duration::from_nanos((next.t_ns - f.start_ns) as u64),
            ))
        })
        .collect();
    ChaosReport {
        tenures,
        faults,
        takeovers,
        svg,
        duration: started.elapsed(),
    }
}

/// The timeline: one row per owner, a bar per tenure (labelled with its token), faults below.
pub fn draw_svg(
    backend: &str,
    tenures: &[Tenure],
    faults: &[FaultRecord],
    start_ns: u128,
    end_ns: u128,
    ttl: Duration,
) -> String {
    let mut owners: Vec<&str> = Vec::new();
    for t in tenures {
        if !owners.contains(&t.owner.as_str()) {
            owners.push(&t.owner);
        }
    }
    for f in faults {
        if let Some(o) = f.owner.as_deref() {
            if !owners.contains(&o) {
                owners.push(o);
            }
        }
    }
    let (left, width, row) = (110.0, 1100.0, 26.0);
    let span = (end_ns - start_ns).max(1) as f64;
    let x = |t: u128| left + width * (t.saturating_sub(start_ns)) as f64 / span;
    let height = 70.0 + row * owners.len() as f64 + 40.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<text x="10" y="18" font-size="14">{backend}: who acted under the lease (ttl {ttl:?}); red = fault on that node</text>
"##,
        left + width + 20.0
    );
    let seconds = (span / 1e9) as u64;
    let step = if seconds > 120 { 30 } else { 5 };
    for s in (0..=seconds).step_by(step as usize) {
        let xs = x(start_ns + u128::from(s) * 1_000_000_000);
        let _ = writeln!(
            svg,
            r##"<line x1="{xs:.1}" y1="30" x2="{xs:.1}" y2="{:.1}" stroke="#eee"/><text x="{xs:.1}" y="{:.1}" fill="#888">{s}s</text>"##,
            height - 30.0,
            height - 15.0
        );
    }
    for (i, owner) in owners.iter().enumerate() {
        let y = 40.0 + row * i as f64;
        let _ = writeln!(svg, r##"<text x="10" y="{:.1}">{owner}</text>"##, y + 15.0);
        for f in faults.iter().filter(|f| f.owner.as_deref() == Some(owner)) {
            let (x0, x1) = (x(f.start_ns), x(f.end_ns).max(x(f.start_ns) + 2.0));
            let _ = writeln!(
                svg,
                r##"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="4" fill="#d33"><title>{:?}</title></rect><text x="{x0:.1}" y="{:.1}" fill="#d33" font-size="9">{:?}</text>"##,
                y + 19.0,
                x1 - x0,
                f.fault,
                y + 28.0,
                f.fault
            );
        }
        for t in tenures.iter().filter(|t| t.owner == *owner) {
            let (x0, x1) = (x(t.first_ns), x(t.last_ns).max(x(t.first_ns) + 1.0));
            let hue = (t.token * 67) % 360;
            let _ = writeln!(
                svg,
                r##"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="18" fill="hsl({hue},60%,60%)"><title>{owner} token {} ({} steps)</title></rect><text x="{:.1}" y="{:.1}" font-size="9">{}</text>"##,
                x1 - x0,
                t.token,
                t.steps,
                x0 + 2.0,
                y + 13.0,
                t.token
            );
        }
    }
    for f in faults.iter().filter(|f| f.owner.is_none()) {
        let x0 = x(f.start_ns);
        let _ = writeln!(
            svg,
            r##"<line x1="{x0:.1}" y1="30" x2="{x0:.1}" y2="{:.1}" stroke="#d33" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" fill="#d33" font-size="9">server restart</text>"##,
            height - 30.0,
            x0 + 2.0,
            height - 32.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}
