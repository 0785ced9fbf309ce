//! One node of a group of sharded workers, as a separate process: start it in several terminals
//! (or machines, or pods) and watch the shards spread over the nodes, move to a node that joins,
//! and move away from one that stops or dies.
//!
//! ```text
//! cargo run --features kubernetes --example sharded_node -- --config examples/kubernetes.toml --config-key sharded --owner node-1
//! cargo run --features etcd --example sharded_node -- --config examples/etcd.toml --config-key sharded --owner node-2
//! ```
//!
//! The configuration file is a `CoordinationConfig` (see the README); `--config-key` picks the
//! lease configuration of every lease of the group (default `sharded`), `--group` the group name
//! (default `example-shards`: leases `example-shards.0` … and `example-shards.member.<owner>`),
//! `--shards` how many shards (default 64). `--owner` defaults to `$POD_NAME`, then to the host
//! name and process id.
//!
//! Each shard's worker "works" every 50 ms (a `run_interval` timer; `--step-ms` sets another
//! period: `benches/fleet.rs` runs 1,024 shards with a step a second): on each tick it takes a
//! timestamp (`CLOCK_MONOTONIC`, comparable across the processes of one machine), then checks its
//! tenure's guard, and only then acts, with the shard's fencing token. With `--events FILE` the
//! worker's `start` and `stop`, every `act`, and every tick the guard refused (`tick`) are appended
//! to FILE as JSON lines with the shard, the token and `t_ns` (an `act` line is its tick too); an
//! `act` line also carries `deadline_ns`, the tenure's deadline the guard judged the step against,
//! on the same clock. `tests/sharded_processes.rs` reads them to check that no shard ever runs on
//! two nodes at once and that a frozen node acts no more once its deadline has passed.
//! With `--slow-stop-ms MS`, the worker of the lowest-numbered shard the node runs when it is
//! told to shut down takes MS to stop (it keeps working meanwhile): a slow worker, which keeps
//! only its own shard while the others are handed on (`tests/sharded_processes.rs`).
//! Shard leases are bound to the node's member lease where the backend binds (Kubernetes, in
//! memory: one write per node per renewal interval); `--renew-shards` renews each on its own.
//! `--max-claims-in-flight N` sets `ShardedSettings::max_claims_in_flight` (default 16).
//! SIGTERM or ctrl-c shuts the node down gracefully and exits: with bound shard leases every
//! worker stops, then the member lease is given up, which hands every shard on at once (a
//! worker still stopping after the leave grace keeps only its own shard: the others are handed
//! over each on its own); with
//! renewed ones the member lease goes first, then each worker stops and its lease is handed to
//! the node that targets it.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use actix_coordination::{
    CoordinationConfig, GetShards, Lease, LeaseProvider, ShardInfo, ShardedSettings,
    ShardedWorkers, Shutdown, SingletonSettings, DEFAULT_MAX_CLAIMS_IN_FLIGHT,
};

/// Where the events go (`--events FILE`), and the pair of clocks to convert tokio's instants to
/// `CLOCK_MONOTONIC` nanoseconds.
#[derive(Clone)]
struct Events {
    file: Option<Arc<Mutex<std::fs::File>>>,
    owner: Arc<str>,
    base: (tokio::time::Instant, u128),
}

impl Events {
    /// One line: `t_ns` from the machine's monotonic clock, `wall_ns` from this process's wall
    /// clock; `extra` is appended as more JSON fields.
    fn log(&self, event: &str, shard: &str, token: u64, t_ns: u128, extra: &str) {
        let Some(file) = &self.file else {
            return;
        };
        let line = format!(
            "{{\"owner\":\"{}\",\"event\":\"{event}\",\"shard\":\"{shard}\",\"token\":{token},\"t_ns\":{t_ns},\"wall_ns\":{},\"pid\":{}{extra}}}\n",
            self.owner,
            wall_ns(),
            std::process::id()
        );
        let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
        let _ = file.write_all(line.as_bytes());
    }

    /// `at` (tokio's clock, which is `CLOCK_MONOTONIC` on Linux) in `CLOCK_MONOTONIC` nanoseconds.
    fn mono_ns(&self, at: tokio::time::Instant) -> u128 {
        let (base, base_ns) = self.base;
        if at >= base {
            base_ns + (at - base).as_nanos()
        } else {
            base_ns - (base - at).as_nanos()
        }
    }
}

/// Event times: `CLOCK_MONOTONIC` in nanoseconds, one clock for every process of the machine.
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

fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}

/// A shard's worker: works while its tenure is alive, stamping its work with the fencing token.
struct Worker {
    info: ShardInfo,
    events: Events,
    steps: u64,
    step: Duration,
    /// The shard whose worker stops slowly (`--slow-stop-ms`), chosen at shutdown, and how slowly.
    slow: SlowStop,
    stopping: bool,
}

/// `--slow-stop-ms`: the shard chosen at shutdown, and how long its worker takes to stop.
#[derive(Clone, Default)]
struct SlowStop {
    shard: Arc<Mutex<Option<String>>>,
    after: Duration,
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn stopping(&mut self, ctx: &mut Self::Context) -> Running {
        let slow = self
            .slow
            .shard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_deref()
            == Some(self.info.shard.as_str());
        if !slow || self.stopping || self.slow.after.is_zero() {
            return Running::Stop;
        }
        self.stopping = true;
        ctx.run_later(self.slow.after, |_, ctx| ctx.stop());
        Running::Continue
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        let token = self.info.fencing_token.value();
        self.events
            .log("start", &self.info.shard, token, now_ns(), "");
        ctx.run_interval(self.step, |act, _| act.step());
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        let token = self.info.fencing_token.value();
        self.events
            .log("stop", &self.info.shard, token, now_ns(), "");
    }
}

impl Worker {
    fn step(&mut self) {
        // Timestamp first, then the check: a step logged at t was taken while the tenure was
        // alive, against the deadline logged with it.
        let t = now_ns();
        let token = self.info.fencing_token.value();
        let deadline = self.info.guard.deadline();
        if !self.info.guard.check_alive() {
            self.events.log("tick", &self.info.shard, token, t, "");
            return;
        }
        self.steps += 1;
        let deadline_ns = deadline.map_or(0, |d| self.events.mono_ns(d));
        let extra = format!(",\"deadline_ns\":{deadline_ns}");
        self.events.log("act", &self.info.shard, token, t, &extra);
    }
}

struct Args {
    config: String,
    config_key: String,
    group: String,
    shards: usize,
    owner: String,
    events: Option<String>,
    step: Duration,
    renew_shards: bool,
    /// `--max-claims-in-flight` (`ShardedSettings::max_claims_in_flight`), when given.
    max_claims_in_flight: Option<usize>,
    slow_stop: Duration,
}

const USAGE: &str = "usage: sharded_node --config FILE [--config-key KEY] [--group NAME] [--shards N] [--owner ID] [--events FILE] [--step-ms MS] [--renew-shards] [--max-claims-in-flight N] [--slow-stop-ms MS]";

fn parse_args() -> Result<Args, String> {
    let mut config = None;
    let mut config_key = "sharded".to_owned();
    let mut group = "example-shards".to_owned();
    let mut shards = 64;
    let mut owner = std::env::var("POD_NAME").ok();
    let mut events = None;
    let mut step = Duration::from_millis(50);
    let mut renew_shards = false;
    let mut max_claims_in_flight = None;
    let mut slow_stop = Duration::ZERO;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--config" => config = Some(value()?),
            "--config-key" => config_key = value()?,
            "--group" => group = value()?,
            "--shards" => {
                shards = value()?
                    .parse()
                    .map_err(|e| format!("--shards needs a number: {e}"))?
            }
            "--owner" => owner = Some(value()?),
            "--events" => events = Some(value()?),
            "--step-ms" => {
                let ms: u64 = value()?
                    .parse()
                    .map_err(|e| format!("--step-ms needs a number: {e}"))?;
                if ms == 0 {
                    return Err("--step-ms must be at least 1".into());
                }
                step = Duration::from_millis(ms);
            }
            "--renew-shards" => renew_shards = true,
            "--max-claims-in-flight" => {
                let n: usize = value()?
                    .parse()
                    .map_err(|e| format!("--max-claims-in-flight needs a number: {e}"))?;
                max_claims_in_flight = Some(n);
            }
            "--slow-stop-ms" => {
                let ms: u64 = value()?
                    .parse()
                    .map_err(|e| format!("--slow-stop-ms needs a number: {e}"))?;
                slow_stop = Duration::from_millis(ms);
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
        group,
        shards,
        owner,
        events,
        step,
        renew_shards,
        max_claims_in_flight,
        slow_stop,
    })
}

fn main() {
    let system = System::new();
    let run = system.block_on(start()).and_then(|owner| {
        // Runs until the signal task stops the system after the graceful shutdown.
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
    let args = parse_args().map_err(|e| format!("{e}\n{USAGE}"))?;
    let config: CoordinationConfig = toml::from_str(&std::fs::read_to_string(&args.config)?)?;
    let provider = LeaseProvider::new(config);
    let events = Events {
        file: match &args.events {
            Some(path) => Some(Arc::new(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ))),
            None => None,
        },
        owner: args.owner.as_str().into(),
        base: (tokio::time::Instant::now(), now_ns()),
    };
    let worker_events = events.clone();
    let step = args.step;
    let slow = SlowStop {
        shard: Arc::default(),
        after: args.slow_stop,
    };
    let worker_slow = slow.clone();
    let workers = ShardedWorkers::from_provider(
        &provider,
        &args.config_key,
        args.group.as_str(),
        (0..args.shards).map(|i| i.to_string()),
        &args.owner,
        move |info: &ShardInfo, _: &mut Context<Worker>| Worker {
            info: info.clone(),
            events: worker_events.clone(),
            steps: 0,
            step,
            slow: worker_slow.clone(),
            stopping: false,
        },
    )?;
    // Back off at most one TTL after errors (a server restart): a node waiting behind a long
    // backoff would miss a graceful handover.
    let ttl = provider
        .get_lease(
            &actix_coordination::member_lease_name(&args.group, &args.owner),
            &args.config_key,
            &args.owner,
        )?
        .settings()
        .ttl();
    let workers = workers
        .settings(ShardedSettings {
            shard: SingletonSettings {
                max_error_backoff: ttl,
                ..Default::default()
            },
            bind_shards: !args.renew_shards,
            max_claims_in_flight: args
                .max_claims_in_flight
                .unwrap_or(DEFAULT_MAX_CLAIMS_IN_FLIGHT),
            ..Default::default()
        })?
        .start();
    println!(
        "[{}] running up to {} shards of group {:?} (ttl {ttl:?})",
        args.owner, args.shards, args.group
    );
    let owner = args.owner.clone();
    // Now and then: how many shards run here.
    let report = workers.clone();
    let (who, reporter_owner) = (owner.clone(), owner.clone());
    actix_rt::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        let mut last = None;
        loop {
            every.tick().await;
            let Ok(running) = report.send(GetShards).await else {
                break;
            };
            if last != Some(running.len()) {
                println!("[{reporter_owner}] runs {} shard(s)", running.len());
                last = Some(running.len());
            }
        }
    });
    // SIGTERM or ctrl-c: the graceful shutdown, then the system stops (and the process exits 0).
    actix_rt::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install the SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        if !slow.after.is_zero() {
            let running = workers.send(GetShards).await.unwrap_or_default();
            let first = running
                .iter()
                .filter_map(|s| s.shard.parse::<u64>().ok())
                .min();
            if let Some(first) = first {
                println!(
                    "[{who}] the worker of shard {first} takes {:?} to stop",
                    slow.after
                );
                *slow.shard.lock().unwrap_or_else(|p| p.into_inner()) = Some(first.to_string());
            }
        }
        println!("[{who}] shutting down: handing every shard over");
        match workers.send(Shutdown).await {
            Ok(Ok(true)) => println!("[{who}] released every lease"),
            Ok(Ok(false)) => println!("[{who}] a lease was held by another owner"),
            Ok(Err(e)) => eprintln!("[{who}] shutdown failed: {}", chain(&e)),
            Err(e) => eprintln!("[{who}] shutdown failed: {e}"),
        }
        System::current().stop();
    });
    drop(events);
    Ok(owner)
}
