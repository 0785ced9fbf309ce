//! One node of a cluster singleton, as a separate process: start it in several terminals (or
//! machines, or pods), kill the one that runs the singleton, and watch the singleton move.
//!
//! ```text
//! cargo run --features kubernetes --example singleton_node -- --config examples/kubernetes.toml --owner node-1
//! cargo run --features etcd --example singleton_node -- --config examples/etcd.toml --owner node-2
//! ```
//!
//! The configuration file is a `CoordinationConfig` (see the README); `--config-key` picks the lease
//! configuration (default `singleton`), `--lease` the lease name (default `example-singleton`).
//! `--owner` defaults to `$POD_NAME`, then to the host name and process id.
//!
//! The singleton "works" every 50 ms (a `run_interval` timer): on each tick it takes a timestamp
//! (`CLOCK_MONOTONIC`, comparable across the processes of one machine), then checks its tenure's guard (`info.guard.check_alive()`), and only then acts, with the
//! fencing token. With `--events FILE` every tick, step, start and stop is appended to FILE as a
//! JSON line (the chaos harness reads them to prove that no two nodes ever acted at once, and that
//! a resumed node runs no timer at all once its tenure ended).
//! SIGTERM or ctrl-c stops the singleton, releases the lease and exits.
//!
//! `--revision REV` (and `--address ADDR`) publish the node's candidacy with that revision (and
//! advertised address; either may also come from the environment, see `Candidate::from_env`),
//! under the handover policy `--handover newest-revision` (the default) or `off`: a rolling update
//! then moves the singleton once, to the new revision. With `--events FILE`, a `candidate` line
//! says when the candidacy is published (the node is a ready candidate). SIGUSR1 asks the manager
//! to hand leadership to the best other candidate (`TransferLeadership::to_best`; the chaos
//! harness's `Transfer` fault).
//!
//! `--health ADDR` (feature `web`) serves the crate's `AdminRoutes` on ADDR: `/readyz` answers
//! `200` once the node's candidacy is published (the manager reports to a `HealthCheck`), which
//! is what `tests/rollout.rs` waits on before it stops the next old replica, as a Deployment
//! does; `/healthz` and `/leases` too.
//!
//! `--unsafe-ignore-guard` makes the node deliberately unsafe, to show that the chaos harness
//! catches an unsafe singleton: its work runs on a detached task (not the actor's timer) that never
//! checks the guard, so neither the guard nor the manager, which stops the singleton actor when
//! the tenure ends, stops it: it goes on stepping (and logging `act`) under its old fencing token
//! after its tenure ended. Never use it for anything else.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use actix_coordination::{
    CandidacyStatus, Candidate, ClusterSingletonManager, CoordinationConfig, HandoverPolicy, Lease,
    LeaseProvider, SingletonInfo, SingletonSettings, TransferLeadership,
};

#[derive(Clone)]
struct Events(Option<Arc<Mutex<std::fs::File>>>);

impl Events {
    /// One line: `t_ns` from the machine's monotonic clock, `wall_ns` from this process's wall
    /// clock (which a chaos run may skew).
    fn log(&self, owner: &str, event: &str, token: u64, t_ns: u128) {
        let line = format!(
            "{{\"owner\":\"{owner}\",\"event\":\"{event}\",\"token\":{token},\"t_ns\":{t_ns},\"wall_ns\":{},\"pid\":{}}}\n",
            wall_ns(),
            std::process::id()
        );
        if let Some(file) = &self.0 {
            let mut file = file.lock().unwrap();
            let _ = file.write_all(line.as_bytes());
            let _ = file.flush();
        }
    }
}

/// Event times: `CLOCK_MONOTONIC` in nanoseconds. On Linux it is one clock for every process of
/// the machine (whatever network namespace they run in), it never steps, and libfaketime leaves
/// it alone with `FAKETIME_DONT_FAKE_MONOTONIC=1`: the chaos harness compares the events of several
/// processes, some of them with a skewed wall clock, on it.
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

/// This process's wall clock (skewed by libfaketime in a chaos run's clock fault).
fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}

/// The singleton: works while its tenure is alive, stamping its work with the fencing token.
struct Worker {
    info: SingletonInfo,
    events: Events,
    steps: u64,
    /// `--unsafe-ignore-guard`: work on a detached task that never checks the guard.
    unsafe_ignore_guard: bool,
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let token = self.info.fencing_token.value();
        println!(
            "[{}] singleton STARTED with fencing token {token}",
            self.info.owner
        );
        self.events.log(&self.info.owner, "start", token, now_ns());
        if self.unsafe_ignore_guard {
            // Deliberately wrong: a task that outlives the actor and ignores the guard.
            let (owner, events) = (self.info.owner.clone(), self.events.clone());
            actix_rt::spawn(async move {
                let mut timer = tokio::time::interval(Duration::from_millis(50));
                loop {
                    timer.tick().await;
                    let t = now_ns();
                    events.log(&owner, "tick", token, t);
                    events.log(&owner, "act", token, t);
                }
            });
            return;
        }
        ctx.run_interval(Duration::from_millis(50), |act, _| act.step());
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        let token = self.info.fencing_token.value();
        println!(
            "[{}] singleton STOPPED after {} steps (token {token})",
            self.info.owner, self.steps
        );
        self.events.log(&self.info.owner, "stop", token, now_ns());
    }
}

impl Worker {
    fn step(&mut self) {
        // Timestamp first, then the check: a step logged at t was taken while the tenure was
        // alive. Every tick is logged, so that the harness sees timers that ran at all.
        let t = now_ns();
        let token = self.info.fencing_token.value();
        self.events.log(&self.info.owner, "tick", token, t);
        if !self.info.guard.check_alive() {
            return;
        }
        self.steps += 1;
        self.events.log(&self.info.owner, "act", token, t);
        if self.steps.is_multiple_of(20) {
            println!(
                "[{}] working with fencing token {token} (step {})",
                self.info.owner, self.steps
            );
        }
    }
}

struct Args {
    config: String,
    config_key: String,
    lease: String,
    owner: String,
    events: Option<String>,
    unsafe_ignore_guard: bool,
    revision: Option<String>,
    address: Option<String>,
    handover: HandoverPolicy,
    health: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut config = None;
    let mut config_key = "singleton".to_owned();
    let mut lease = "example-singleton".to_owned();
    let mut owner = std::env::var("POD_NAME").ok();
    let mut events = None;
    let mut unsafe_ignore_guard = false;
    let mut revision = None;
    let mut address = None;
    let mut handover = HandoverPolicy::NewestRevision;
    let mut health = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--config" => config = Some(value()?),
            "--config-key" => config_key = value()?,
            "--lease" => lease = value()?,
            "--owner" => owner = Some(value()?),
            "--events" => events = Some(value()?),
            "--unsafe-ignore-guard" => unsafe_ignore_guard = true,
            "--revision" => revision = Some(value()?),
            "--address" => address = Some(value()?),
            "--health" => health = Some(value()?),
            "--handover" => {
                handover = match value()?.as_str() {
                    "newest-revision" => HandoverPolicy::NewestRevision,
                    "off" => HandoverPolicy::Off,
                    other => return Err(format!("unknown --handover {other}")),
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let owner = owner.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "host".into());
        format!("{}-{}", host.trim(), std::process::id())
    });
    Ok(Args {
        config: config.ok_or("--config FILE is required")?,
        config_key,
        lease,
        owner,
        events,
        unsafe_ignore_guard,
        revision,
        address,
        handover,
        health,
    })
}

fn main() {
    let system = System::new();
    let run = system.block_on(start()).and_then(|owner| {
        // Runs until the manager stops the system after a graceful shutdown (SIGTERM / ctrl-c).
        system.run()?;
        println!("[{owner}] shut down");
        Ok(())
    });
    if let Err(error) = run {
        eprintln!("error: {}", chain(error.as_ref()));
        std::process::exit(1);
    }
}

/// An error's message followed by its causes' messages.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Starts the node; answers its owner identity.
async fn start() -> Result<String, Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "actix_coordination=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = parse_args().map_err(|e| format!("{e}\nusage: singleton_node --config FILE [--config-key KEY] [--lease NAME] [--owner ID] [--events FILE] [--revision REV] [--address ADDR] [--handover newest-revision|off] [--health ADDR] [--unsafe-ignore-guard]"))?;
    let config: CoordinationConfig = toml::from_str(&std::fs::read_to_string(&args.config)?)?;
    let provider = LeaseProvider::new(config);
    let lease = provider.get_lease(&args.lease, &args.config_key, &args.owner)?;
    let events = Events(match &args.events {
        Some(path) => Some(Arc::new(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        ))),
        None => None,
    });
    log_renewals(&lease, &events, &args.owner);
    println!(
        "[{}] competing for lease {:?} (ttl {:?})",
        args.owner,
        lease.name(),
        lease.settings().ttl()
    );
    // Back off at most one TTL after errors (a server restart): a node waiting behind a long
    // backoff would miss a graceful handover.
    let max_error_backoff = lease.settings().ttl();
    let unsafe_ignore_guard = args.unsafe_ignore_guard;
    if unsafe_ignore_guard {
        println!("[{}] UNSAFE: the singleton ignores its guard", args.owner);
    }
    let worker_events = events.clone();
    let mut manager = ClusterSingletonManager::new(lease, move |info: &SingletonInfo, _| Worker {
        info: info.clone(),
        events: worker_events.clone(),
        steps: 0,
        unsafe_ignore_guard,
    })
    .settings(SingletonSettings {
        handle_signals: true,
        max_error_backoff,
        ..Default::default()
    });
    let health = actix_coordination::HealthCheck::new();
    manager = manager.health(&health);
    if let Some(listen) = &args.health {
        serve_health(health, listen)?;
    }
    let env = Candidate::from_env()?;
    let revision = args.revision.clone().or(env.revision);
    let address = args.address.clone().or(env.address);
    if revision.is_some() || address.is_some() {
        let mut candidate = Candidate::new();
        candidate.revision = revision;
        candidate.address = address;
        println!("[{}] candidate: {candidate:?}", args.owner);
        let (provider, config_key) = (provider.clone(), args.config_key.clone());
        manager = manager
            .candidacy(candidate, move |settings| {
                provider.lease_with_settings(&config_key, settings)
            })?
            .handover(args.handover.clone());
        if let Some(status) = manager.candidacy_status() {
            log_candidacy(status, &events, &args.owner);
        }
    }
    let manager = manager.start();
    let owner = args.owner.clone();
    actix_rt::spawn(async move {
        let Ok(mut usr1) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        else {
            return;
        };
        while usr1.recv().await.is_some() {
            let answer = manager.send(TransferLeadership::to_best()).await;
            println!("[{owner}] SIGUSR1: transfer to the best other candidate: {answer:?}");
        }
    });
    Ok(args.owner)
}

/// `--health ADDR`: the admin routes (`/readyz`, `/healthz`, `/leases`) on ADDR.
#[cfg(feature = "web")]
fn serve_health(
    health: actix_coordination::HealthCheck,
    listen: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let admin = actix_coordination::AdminRoutes::new(health);
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new().configure(|cfg| admin.register(cfg))
    })
    .workers(1)
    .disable_signals()
    .bind(listen)?
    .run();
    actix_rt::spawn(server);
    Ok(())
}

#[cfg(not(feature = "web"))]
fn serve_health(
    _: actix_coordination::HealthCheck,
    _: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    Err("--health needs the web feature".into())
}

/// With `--events FILE`: a `candidate` line each time the candidacy is published (the node is
/// then a ready candidate others can see: `ClusterSingletonManager::candidacy_status`).
fn log_candidacy(mut status: CandidacyStatus, events: &Events, owner: &str) {
    if events.0.is_none() {
        return;
    }
    let (events, owner) = (events.clone(), owner.to_owned());
    actix_rt::spawn(async move {
        let mut count = 0;
        while status.published().await {
            count += 1;
            events.log(&owner, "candidate", count, now_ns());
            while status.changed().await == Some(true) {}
        }
    });
}

/// With `--events FILE`: one `renewal` line per successful claim or renewal of the lease, stamped
/// with the instant that claim or renewal *started* (the first line of a tenure is its claim):
/// the new local deadline minus `local_validity()`, converted once from tokio's clock to the
/// `CLOCK_MONOTONIC` nanoseconds of the other events. `benches/handoff.rs` (`kill`) measures a crash failover from it. The deadline is polled
/// every 5 ms, so a line is written up to 5 ms after its renewal; its time is exact.
fn log_renewals(lease: &actix_coordination::SharedLease, events: &Events, owner: &str) {
    if events.0.is_none() {
        return;
    }
    let (tenure, events, owner) = (lease.tenure().clone(), events.clone(), owner.to_owned());
    let validity = lease.settings().local_validity();
    let (mono, mono_ns) = (tokio::time::Instant::now(), now_ns());
    actix_rt::spawn(async move {
        let mut poll = tokio::time::interval(Duration::from_millis(5));
        let mut last = None;
        loop {
            poll.tick().await;
            let Some(current) = tenure.current() else {
                continue;
            };
            if last == Some(current.deadline()) {
                continue;
            }
            last = Some(current.deadline());
            let start = current.deadline() - validity;
            let t_ns = if start >= mono {
                mono_ns + (start - mono).as_nanos()
            } else {
                mono_ns - (mono - start).as_nanos()
            };
            events.log(&owner, "renewal", current.token().value(), t_ns);
        }
    });
}
