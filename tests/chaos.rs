//! Chaos runs against the real servers: several `singleton_node` processes compete for one lease
//! while the harness kills, freezes, blackholes and gracefully stops them and restarts the server.
//! The harness checks that no two singletons were ever alive at once, no two processes ever acted
//! at once, tokens rose, and a frozen holder ran nothing after resuming (the verdicts of
//! `tests/common/chaos_check.rs`, themselves tested on hand-written logs in
//! `tests/chaos_checker.rs`), and draws the timeline (`target/chaos/<backend>-<pid>/timeline.svg`).
//! `unsafe_node_is_caught_etcd` shows that a node whose singleton ignores its guard is caught.
//! `chaos_sharded_etcd` and `chaos_sharded_kubernetes` run `sharded_node` processes (a group of 16
//! shards, each under its own lease) with the same faults and two more, late and lost answers (the
//! node's proxies delay or drop the servers' answers while its requests take effect), and check
//! every shard's events on their own with the same verdicts (issue 24: exactly once per shard;
//! `tests/common/shard_check.rs`, tested in `tests/chaos_checker.rs`); each shard gets its own
//! timeline (`target/chaos/<backend>-sharded-<pid>/shards/<shard>/timeline.svg`).
//!
//! The test suite runs a short run per backend: at least 40 s and until every kind of fault has
//! hit an acting holder once (the schedule opens with every kind in a seeded order).
//! `CHAOS_SECONDS=600 cargo test --all-features --test chaos -- --nocapture --test-threads=1` runs
//! long ones, `CHAOS_SEED` replays a run's choice of faults (see docs/chaos/RESULTS.md). Each run
//! leaves the nodes' event logs and logs, their configurations, the server's log (Kubernetes) and
//! `summary.txt` (every figure RESULTS.md reports) in its directory.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::chaos::{self, ChaosBackend, ChaosReport, Fault, NodeMode, Violation};
use common::shard_check::ShardedReport;

const TTL: Duration = Duration::from_secs(3);

/// `CHAOS_SECONDS` (default 40) and `CHAOS_FAULTS` (default 0): a run lasts at least both.
fn length() -> chaos::RunLength {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    chaos::RunLength {
        duration: Duration::from_secs(var("CHAOS_SECONDS", 40)),
        faults: var("CHAOS_FAULTS", 0) as usize,
    }
}

fn seed() -> u64 {
    std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id().into())
}

/// Prints the summary and checks that the run tested what it is for: the lease moved, and every
/// kind of fault hit an acting holder (so the pause and graceful-stop checks ran).
fn summarize(report: &ChaosReport) {
    let mut kinds = Fault::ALL.to_vec();
    kinds.push(Fault::Transfer);
    summarize_kinds(report, &kinds);
}

fn summarize_kinds(report: &ChaosReport, kinds: &[Fault]) {
    assert!(
        report.tenures.len() >= 2,
        "the lease never moved: {:#?}",
        report.tenures
    );
    let met = report.kinds_met();
    let missed: Vec<Fault> = kinds.iter().copied().filter(|k| !met.contains(k)).collect();
    assert!(
        missed.is_empty(),
        "these kinds of fault never hit an acting holder: {missed:?}"
    );
    assert!(
        !report.pause_stops.is_empty(),
        "no paused holder was resumed and stopped"
    );
    // The clock faults took effect: the skewed node's own events show its wall clock off by more
    // than the TTL.
    let skews: Vec<i128> = report.clock_skews.iter().flatten().copied().collect();
    assert!(
        skews
            .iter()
            .any(|s| s.unsigned_abs() > report.ttl.as_nanos()),
        "no clock fault showed in a node's events: {:?}",
        report.clock_skews
    );
}

struct EtcdChaos {
    etcd: common::etcd::EtcdProcess,
}

impl ChaosBackend for EtcdChaos {
    fn name(&self) -> &str {
        "etcd"
    }

    async fn prepare(&mut self, _run_dir: &Path) {}

    fn upstreams(&self) -> Vec<SocketAddr> {
        vec![common::etcd::socket_addr(&self.etcd.endpoint())]
    }

    fn config_toml(&self, proxies: &[SocketAddr], ttl: Duration) -> String {
        etcd_config(proxies, ttl)
    }

    async fn restart_server(&mut self) {
        self.etcd.restart().await;
    }
}

/// A node's configuration for etcd endpoints `proxies`.
fn etcd_config(proxies: &[SocketAddr], ttl: Duration) -> String {
    let endpoints: Vec<String> = proxies.iter().map(|p| format!("\"http://{p}\"")).collect();
    format!(
        "[leases.singleton]\nbackend = \"etcd\"\nttl = \"{}ms\"\n\n[leases.singleton.etcd]\nendpoints = [{}]\n",
        ttl.as_millis(),
        endpoints.join(", ")
    )
}

/// A private three-member etcd cluster; every node talks to all three members (through a proxy
/// per member). Faults: the node faults, plus a member or the leader killed and restarted, and a
/// member frozen past the TTL.
struct EtcdClusterChaos {
    members: Vec<common::etcd::EtcdProcess>,
}

impl ChaosBackend for EtcdClusterChaos {
    fn name(&self) -> &str {
        "etcd-cluster"
    }

    async fn prepare(&mut self, _run_dir: &Path) {}

    fn upstreams(&self) -> Vec<SocketAddr> {
        self.members
            .iter()
            .map(|m| common::etcd::socket_addr(&m.endpoint()))
            .collect()
    }

    fn config_toml(&self, proxies: &[SocketAddr], ttl: Duration) -> String {
        etcd_config(proxies, ttl)
    }

    fn fault_kinds(&self) -> Vec<Fault> {
        Fault::CLUSTER.to_vec()
    }

    async fn server_fault(&mut self, fault: Fault, rng: &mut fastrand::Rng, ttl: Duration) {
        match fault {
            Fault::MemberKill | Fault::LeaderKill => {
                let target = if fault == Fault::LeaderKill {
                    common::etcd::EtcdProcess::leader(&self.members).await
                } else {
                    None
                }
                .unwrap_or_else(|| rng.usize(0..self.members.len()));
                self.members[target].kill();
                // Down for a while (an election follows a leader's death), then back.
                tokio::time::sleep(Duration::from_millis(rng.u64(1000..3000))).await;
                self.members[target].start_again().await;
            }
            Fault::MemberPartition => {
                let target = rng.usize(0..self.members.len());
                self.members[target].freeze();
                tokio::time::sleep(ttl + Duration::from_millis(rng.u64(500..2000))).await;
                self.members[target].thaw();
            }
            other => panic!("{other:?} is not a fault of the cluster"),
        }
    }

    async fn restart_server(&mut self) {
        for member in &mut self.members {
            member.kill();
        }
        for member in &mut self.members {
            member.start_again().await;
        }
    }
}

/// The chaos run on a three-member etcd cluster: node faults and member faults (kill, leader
/// kill, freeze past the TTL); every kind meets an acting holder at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_etcd_cluster() {
    let mut backend = EtcdClusterChaos {
        members: common::etcd::EtcdProcess::cluster("chaos", 3).await,
    };
    let seed = seed();
    println!("chaos on a three-member etcd cluster, seed {seed}");
    let report = chaos::run(&mut backend, 3, TTL, length(), seed).await;
    let mut kinds = Fault::CLUSTER.to_vec();
    kinds.push(Fault::Transfer);
    summarize_kinds(&report, &kinds);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_etcd() {
    let mut backend = EtcdChaos {
        etcd: common::etcd::EtcdProcess::start("chaos").await,
    };
    let seed = seed();
    println!("chaos on etcd, seed {seed}");
    let report = chaos::run(&mut backend, 3, TTL, length(), seed).await;
    summarize(&report);
}

/// How long a restarted kube-apiserver may take to be ready.
const APISERVER_READY_WITHIN: Duration = Duration::from_secs(90);

/// The nodes reach a private kube-apiserver on the test cluster's etcd (restarting the cluster's
/// own would disturb other tests), as the `lease-holder` user of deploy/rbac.yaml.
struct KubernetesChaos {
    apiserver: Option<common::k8s::ApiserverProcess>,
    token_file: PathBuf,
}

impl KubernetesChaos {
    fn apiserver(&self) -> &common::k8s::ApiserverProcess {
        self.apiserver.as_ref().expect("prepared")
    }
}

impl ChaosBackend for KubernetesChaos {
    fn name(&self) -> &str {
        "kubernetes"
    }

    async fn prepare(&mut self, run_dir: &Path) {
        let env = common::k8s::env();
        self.token_file = run_dir.join("lease-holder.token");
        std::fs::write(&self.token_file, &env.token).unwrap();
        let [port] = common::free_loopback_ports();
        let mut apiserver =
            common::k8s::ApiserverProcess::start(port, run_dir.join("kube-apiserver.log"));
        apiserver
            .ready(tokio::time::Instant::now() + APISERVER_READY_WITHIN)
            .await;
        self.apiserver = Some(apiserver);
    }

    fn upstreams(&self) -> Vec<SocketAddr> {
        vec![self.apiserver().addr()]
    }

    fn config_toml(&self, proxies: &[SocketAddr], ttl: Duration) -> String {
        // The node reaches its proxy by a name the API server's certificate carries (its
        // namespace's hosts file maps it to the proxy's address), so TLS through the proxy verifies.
        let port = proxies[0].port();
        let env = common::k8s::env();
        format!(
            "[leases.singleton]\nbackend = \"kubernetes\"\nttl = \"{}ms\"\n\n\
             [leases.singleton.kubernetes]\nnamespace = \"{}\"\napi-url = \"https://kubernetes.default.svc:{port}\"\n\
             token-file = \"{}\"\nca-file = \"{}\"\n",
            ttl.as_millis(),
            env.namespace,
            self.token_file.display(),
            env.ca.display()
        )
    }

    async fn restart_server(&mut self) {
        self.apiserver
            .as_mut()
            .expect("prepared")
            .restart(APISERVER_READY_WITHIN)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_kubernetes() {
    let mut backend = KubernetesChaos {
        apiserver: None,
        token_file: PathBuf::new(),
    };
    let seed = seed();
    println!("chaos on kubernetes, seed {seed}");
    let report = chaos::run(&mut backend, 3, TTL, length(), seed).await;
    summarize(&report);
}

/// The shards of a sharded run's group.
const SHARDS: usize = 16;

/// A sharded run's summary checks, as [`summarize`]'s: every shard ran and moved, every kind of
/// fault (late and lost answers included) hit a node acting on a shard, a paused holder's workers stopped, a clock fault showed.
fn summarize_sharded(report: &ShardedReport) {
    assert_eq!(report.shards.len(), SHARDS, "not every shard ran");
    let moved = report
        .shards
        .values()
        .filter(|r| r.tenures.len() >= 2)
        .count();
    assert!(moved > 0, "no shard ever moved");
    let met = report.kinds_met();
    // The backend's kinds (both sharded runs' backends inject `Fault::ALL`), and late and lost
    // answers.
    let missed: Vec<Fault> = Fault::sharded_kinds(&Fault::ALL)
        .into_iter()
        .filter(|k| !met.contains(k))
        .collect();
    assert!(
        missed.is_empty(),
        "these kinds of fault never hit a node acting on a shard: {missed:?}"
    );
    assert!(
        report.shards.values().any(|r| !r.pause_stops.is_empty()),
        "no paused holder's worker was resumed and stopped"
    );
    let skews: Vec<i128> = report.clock_skews.iter().flatten().copied().collect();
    assert!(
        skews
            .iter()
            .any(|s| s.unsigned_abs() > report.ttl.as_nanos()),
        "no clock fault showed in a node's events: {:?}",
        report.clock_skews
    );
}

/// Three `sharded_node` processes run a group of 16 shards on etcd under every kind of fault
/// (late and lost answers included);
/// every shard's events are checked on their own (issue 24: exactly once per shard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_sharded_etcd() {
    let mut backend = EtcdChaos {
        etcd: common::etcd::EtcdProcess::start("sharded").await,
    };
    let seed = seed();
    println!("sharded chaos on etcd, {SHARDS} shards, seed {seed}");
    let report = chaos::run_sharded(&mut backend, 3, SHARDS, TTL, length(), seed).await;
    summarize_sharded(&report);
}

/// The same on Kubernetes (a private kube-apiserver on the test cluster's etcd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_sharded_kubernetes() {
    let mut backend = KubernetesChaos {
        apiserver: None,
        token_file: PathBuf::new(),
    };
    let seed = seed();
    println!("sharded chaos on kubernetes, {SHARDS} shards, seed {seed}");
    let report = chaos::run_sharded(&mut backend, 3, SHARDS, TTL, length(), seed).await;
    summarize_sharded(&report);
}

/// A frozen holder (SIGSTOP past its TTL) whose singleton runs on a `run_interval` timer: once
/// resumed it runs nothing under its old tenure (no step, no tick), although the other node took
/// over meanwhile; no violation of any kind is found. (`unsafe_node_is_caught_etcd` runs the same
/// scenario with an unsafe holder.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_holder_runs_nothing_etcd() {
    let mut backend = EtcdChaos {
        etcd: common::etcd::EtcdProcess::start("pause").await,
    };
    let report = chaos::pause_run(&mut backend, TTL, NodeMode::Safe).await;
    println!("{report:?}");
    assert_safe_pause(&report);
}

/// The same on Kubernetes (a private kube-apiserver on the test cluster's etcd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_holder_runs_nothing_kubernetes() {
    let mut backend = KubernetesChaos {
        apiserver: None,
        token_file: PathBuf::new(),
    };
    let report = chaos::pause_run(&mut backend, TTL, NodeMode::Safe).await;
    println!("{report:?}");
    assert_safe_pause(&report);
}

fn assert_safe_pause(report: &chaos::PauseReport) {
    assert!(
        report.violations.is_empty(),
        "{}",
        chaos::describe(&report.violations)
    );
    assert!(report.took_over.1 > report.paused.1);
}

/// The checker catches an unsafe singleton on a real server: the same scenario as
/// `resumed_holder_runs_nothing_etcd`, but the frozen holder runs `--unsafe-ignore-guard` (its
/// work goes on, on a task that ignores the guard and outlives the tenure). After the resume it
/// steps under its old token while the other node holds the lease: the checker must report the
/// overlap of steps and of lifetimes, the ticks after the takeover and the run after the resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_node_is_caught_etcd() {
    let mut backend = EtcdChaos {
        etcd: common::etcd::EtcdProcess::start("unsafe").await,
    };
    let report = chaos::pause_run(&mut backend, TTL, NodeMode::IgnoreGuard).await;
    println!("{report:?}");
    let (paused, took_over) = (&report.paused, &report.took_over);
    assert!(
        report.violations.iter().any(|v| matches!(v,
            Violation::StepsOverlap { earlier, later }
                if (earlier.owner == paused.0 && later.owner == took_over.0)
                    || (earlier.owner == took_over.0 && later.owner == paused.0))),
        "the overlap of the unsafe node's steps with the other node's was not reported: {:#?}",
        report.violations
    );
    for (what, found) in [
        (
            "lifetimes",
            report
                .violations
                .iter()
                .any(|v| matches!(v, Violation::LifetimesOverlap { .. })),
        ),
        (
            "tick after takeover",
            report.violations.iter().any(
                |v| matches!(v, Violation::TickAfterTakeover { owner, .. } if *owner == paused.0),
            ),
        ),
        (
            "run after resume",
            report.violations.iter().any(|v| {
                matches!(v, Violation::RanAfterResume { owner, token, .. }
                    if *owner == paused.0 && *token == paused.1)
            }),
        ),
    ] {
        assert!(found, "{what} not reported: {:#?}", report.violations);
    }
}

/// The harness removes every namespace, veth pair, nftables rule, hosts file and subnet claim it
/// made: when a run fails (they are dropped while the panic unwinds), and, for a test process
/// that was killed, at the next run's start.
#[test]
fn network_namespaces_are_removed_after_a_failed_run_and_a_killed_one() {
    use common::netns::{self, Direction, NodeNet};
    use std::sync::Mutex;

    // A failed run: a panic while two namespaces exist, one of them partitioned one way.
    let made: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let a = NodeNet::create();
        let b = NodeNet::create();
        for net in [&a, &b] {
            made.lock()
                .unwrap()
                .push((net.name().to_owned(), net.host_if().to_owned()));
        }
        b.partition(Direction::ToNode);
        assert!(b.rules().contains("drop"), "{}", b.rules());
        assert!(netns::namespaces().contains(&a.name().to_owned()));
        assert!(netns::link_exists(a.host_if()));
        panic!("a failed run");
    }));
    assert!(failed.is_err());
    let made = made.into_inner().unwrap();
    assert_eq!(made.len(), 2);
    let left = netns::namespaces();
    for (name, host_if) in &made {
        assert!(!left.contains(name), "{name} is still there");
        assert!(!netns::link_exists(host_if), "{host_if} is still there");
        assert!(!Path::new("/etc/netns").join(name).exists());
    }
    let claims: Vec<String> = std::fs::read_dir(netns::claims_dir())
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    for (name, _) in &made {
        assert!(
            !claims.iter().any(|c| c.contains(name.as_str())),
            "the claim of {name} is still there"
        );
    }

    // A killed test process: it made a namespace with a veth pair and a claim, then got SIGKILL.
    let mut child = std::process::Command::new("sh")
        .args([
            "-c",
            "ip netns add actix-chaos-$$-0 && \
             ip link add acxT$$h type veth peer name acxT$$n netns actix-chaos-$$-0 && \
             echo made && exec sleep 600",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "made");
    let name = format!("actix-chaos-{pid}-0");
    let claim = (0..16_384)
        .rev()
        .map(|k| netns::claims_dir().join(format!("net-{k}")))
        .find(|p| !p.exists())
        .unwrap();
    std::fs::write(&claim, format!("{pid} {name}\n")).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(netns::namespaces().contains(&name));
    assert!(netns::link_exists(&format!("acxT{pid}h")));
    let removed = netns::sweep_stale();
    assert!(removed.contains(&name), "{removed:?}");
    assert!(!netns::namespaces().contains(&name));
    assert!(!netns::link_exists(&format!("acxT{pid}h")));
    assert!(!claim.exists());
}

/// The ports of a private server stay reserved while it is down (between a kill and a restart):
/// no later pick of this process returns them, and another process cannot take their locks. An
/// etcd member of `chaos_etcd_cluster` restarted on a port that `chaos_etcd`'s etcd (or another
/// test process's server) had picked meanwhile exited at once ("address already in use").
#[test]
fn ports_of_a_server_that_is_down_are_not_handed_out_again() {
    let down: [u16; 2] = common::free_loopback_ports();
    for _ in 0..20 {
        let [port] = common::free_loopback_ports();
        assert!(!down.contains(&port), "{port} handed out twice");
    }
    for port in down {
        // Free to bind (nothing listens), and reserved all the same.
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .open(
                std::env::temp_dir()
                    .join("actix-coord-test-ports")
                    .join(port.to_string()),
            )
            .expect("a reservation file per port");
        assert!(lock.try_lock().is_err(), "{port} is not reserved");
    }
}

/// A page of a long run's timeline starts in the middle of the run: its axis counts seconds from
/// the run's first instant (not from the page's edge), and a tenure that began on an earlier page
/// (or before the run's first instant) is drawn from the page's left edge, with the times of its
/// tooltip those of the run (saturating at its first instant), not an overflow.
#[test]
fn a_timeline_page_draws_what_crosses_its_edges() {
    const S: u128 = 1_000_000_000;
    let tenure = |owner: &str, token, first_s: u128, last_s: u128| chaos::Tenure {
        owner: owner.to_owned(),
        token,
        first_ns: first_s * S,
        last_ns: last_s * S,
        steps: 10,
    };
    let tenures = [
        tenure("node-0.0", 3, 100, 700),
        tenure("node-1.0", 5, 700, 1300),
    ];
    let page_2 = chaos::Window {
        origin_ns: 0,
        from_ns: 600 * S,
        to_ns: 1200 * S,
    };
    let svg = chaos::draw_svg("page 2", 3, &tenures, &[], &[], page_2);
    assert!(svg.contains("node-0.0 token 3: 100.0s..700.0s"), "{svg}");
    assert!(svg.contains("node-1.0 token 5: 700.0s..1300.0s"), "{svg}");
    // The left bar starts at the page's edge, x = 64 (the width of the row labels).
    assert!(svg.contains(r#"<rect x="64.0" y="86.0""#), "{svg}");
    let axis = |svg: &str, label: &str| svg.contains(&format!(">{label}</text>"));
    assert!(axis(&svg, "600s") && axis(&svg, "1200s"), "{svg}");
    assert!(!axis(&svg, "0s") && !axis(&svg, "10s"), "{svg}");
    let early = [tenure("node-0.0", 1, 5, 20)];
    let svg = chaos::draw_svg(
        "early",
        3,
        &early,
        &[],
        &[],
        chaos::Window::whole(10 * S, 30 * S),
    );
    assert!(svg.contains("node-0.0 token 1: 0.0s..10.0s"), "{svg}");
    assert!(axis(&svg, "0s") && axis(&svg, "20s"), "{svg}");
    // The cluster's kinds of fault make the legend a line longer: the panels start below it.
    let member_faults: Vec<chaos::FaultRecord> =
        [Fault::MemberKill, Fault::LeaderKill, Fault::MemberPartition]
            .into_iter()
            .map(|fault| chaos::FaultRecord {
                fault,
                owner: None,
                holder: None,
                start_ns: 12 * S,
                end_ns: 13 * S,
            })
            .collect();
    let svg = chaos::draw_svg(
        "cluster",
        3,
        &early,
        &[],
        &member_faults,
        chaos::Window::whole(10 * S, 30 * S),
    );
    let y_of = |line: &str| -> f64 {
        let rest = &line[line.find(" y=\"").unwrap() + 4..];
        rest[..rest.find('"').unwrap()].parse().unwrap()
    };
    let legend_bottom = svg
        .lines()
        .filter(|l| l.contains(r#"width="18" height="10""#))
        .map(|l| y_of(l) + 10.0)
        .fold(0.0, f64::max);
    assert!(legend_bottom > 80.0, "four lines of legend: {svg}");
    let first_bar = svg
        .lines()
        .filter(|l| l.contains("token 1:"))
        .map(y_of)
        .fold(f64::MAX, f64::min);
    assert!(
        first_bar > legend_bottom,
        "{legend_bottom} {first_bar}: {svg}"
    );
}

/// Every kind of fault has a colour of its own in the timeline's legend; late and lost answers are
/// in the legend only when a run has them (the singleton runs do not inject them), and drawn as a
/// band under the node they hit.
#[test]
fn every_kind_of_fault_has_its_own_colour_and_late_and_lost_answers_are_drawn() {
    const S: u128 = 1_000_000_000;
    let record = |fault: Fault, at: u128| chaos::FaultRecord {
        fault,
        owner: (!fault.is_server()).then(|| format!("node-{}.0", at % 3)),
        holder: None,
        start_ns: (10 + at) * S,
        end_ns: (11 + at) * S,
    };
    let all: Vec<chaos::FaultRecord> = Fault::EVERY
        .into_iter()
        .zip(0..)
        .map(|(kind, at)| record(kind, at))
        .collect();
    let window = chaos::Window::whole(10 * S, 40 * S);
    let svg = chaos::draw_svg("every kind", 3, &[], &[], &all, window);
    let legend: Vec<(&str, &str)> = svg
        .lines()
        .filter(|l| l.contains(r#"width="18" height="10" fill=""#))
        .filter_map(|l| {
            let colour = l.split(r#"fill=""#).nth(1)?.split('"').next()?;
            let text = l.split(r#"font-size="10">"#).nth(1)?.split(':').next()?;
            Some((colour, text))
        })
        .collect();
    for kind in Fault::EVERY {
        assert!(
            legend.iter().any(|(_, text)| *text == format!("{kind:?}")),
            "{kind:?} is not in the legend: {legend:?}"
        );
    }
    let colours: std::collections::BTreeSet<&str> = legend.iter().map(|(c, _)| *c).collect();
    assert_eq!(
        colours.len(),
        legend.len(),
        "a colour used twice: {legend:?}"
    );
    for (kind, at) in [(Fault::SlowAnswers, 13), (Fault::LostAnswers, 14)] {
        let owner = format!("node-{}.0", at % 3);
        assert!(
            svg.contains(&format!("<title>{kind:?} of {owner}: ")),
            "{kind:?} is not drawn: {svg}"
        );
    }
    let singleton_kinds: Vec<chaos::FaultRecord> = Fault::ALL
        .into_iter()
        .zip(0..)
        .map(|(kind, at)| record(kind, at))
        .collect();
    let svg = chaos::draw_svg("singleton", 3, &[], &[], &singleton_kinds, window);
    assert!(
        !svg.contains("SlowAnswers") && !svg.contains("LostAnswers"),
        "{svg}"
    );
}

/// Redraws a finished run's timeline pages with today's drawing:
/// `CHAOS_RUN_DIR=target/chaos/etcd-1234 cargo test --all-features --test chaos redraw --
/// --ignored --nocapture`. A run older than `start_ns` in `run.json` takes its first tenure,
/// lifetime or fault as the first instant.
#[test]
#[ignore = "a tool: needs CHAOS_RUN_DIR"]
fn redraw() {
    let dir = std::path::PathBuf::from(std::env::var("CHAOS_RUN_DIR").expect("CHAOS_RUN_DIR"));
    let info = chaos::RunInfo::read(&dir).expect("run.json or summary.txt in CHAOS_RUN_DIR");
    let report = chaos::analyze(&dir, &info);
    let (start_ns, end_ns) = info.span_ns.unwrap_or_else(|| {
        let first = report
            .tenures
            .iter()
            .map(|t| t.first_ns)
            .chain(report.lifetimes.iter().map(|l| l.start_ns))
            .chain(report.faults.iter().map(|f| f.start_ns))
            .min()
            .expect("an event or a fault in the run");
        (first, first + info.duration.as_nanos())
    });
    for path in chaos::draw_timeline(&dir, &info, &report, start_ns, end_ns) {
        println!("{}", path.display());
    }
}
