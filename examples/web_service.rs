//! A web service that runs a scheduled job on exactly one of its replicas: an actix-web server
//! next to a [`ClusterSingletonManager`], with the routes an operator needs.
//!
//! ```text
//! # in memory (one process; the default):
//! cargo run --features metrics,web --example web_service -- --listen 127.0.0.1:8080
//! # on etcd or Kubernetes, several processes (or pods) on one lease:
//! cargo run --all-features --example web_service -- --config examples/etcd.toml --owner node-1 --listen 127.0.0.1:8081
//! cargo run --all-features --example web_service -- --config examples/etcd.toml --owner node-2 --listen 127.0.0.1:8082
//! ```
//!
//! Routes:
//!
//! * `GET /healthz`: liveness from a [`HealthCheck`]: `200 ok`, or `503` with the reason when
//!   this process acts as the holder of a tenure that nothing renews, or its job does not stop.
//! * `GET /readyz`: readiness, following the manager's eligibility: `503` while shutting down.
//! * `GET /metrics`: the Prometheus text exposition of every metric (feature `metrics`), the
//!   histograms with the crate's recommended buckets (`_bucket` series, which aggregate across
//!   replicas).
//! * `GET /leases`: JSON, one object per lease: `name`, `owner`, `holder` (as last seen), `held`,
//!   `fencing_token`, `deadline_in_ms`.
//! * `GET /singleton`: JSON: whether the job runs here, how many runs it made, the fencing token
//!   it last ran under.
//! * `GET /leader`: JSON: who leads (`holder`, `fencing_token`, `here`, `address`), on every
//!   replica (the crate's `AdminRoutes::with_leader`).
//! * `POST /leader-only/run-now`: a leader-only route behind the crate's [`LeaderOnly`]: the
//!   leader answers `202` with the token it acts under; another replica answers `307` to the same
//!   path on the leader's advertised address (`curl -L` follows it).
//!
//! Each replica publishes its candidacy (its revision and advertised address): `--advertise URL`
//! (default `$ACTIX_COORDINATION_ADDRESS`, else `http://` and the listen address, `0.0.0.0` read
//! as `127.0.0.1`), `--revision REV` (default `$ACTIX_COORDINATION_REVISION`, else
//! `$POD_TEMPLATE_HASH`). In a rolling update the leader hands over once, to the first replica of
//! the new revision (the crate's default `HandoverPolicy::NewestRevision`).
//!
//! Arguments: `--config FILE` (or `$ACTIX_COORD_CONFIG`; a `CoordinationConfig` TOML; without it
//! an in-memory lease), `--config-key KEY` (default `singleton`), `--lease NAME` (default
//! `web-service-jobs`), `--owner ID` (default `$POD_NAME`, then the host name and process id),
//! `--listen ADDR` (default `0.0.0.0:8080`). `$POD_NAMESPACE`, when set, replaces the `namespace`
//! of the configuration's `kubernetes` sections (the pod's own namespace from the downward API).
//! `--shutdown graceful` (the default) shuts down with [`GracefulShutdown`]; for comparison only
//! (the README's "In an actix-web service" tells what goes wrong; `tests/web_service.rs` shows
//! it), `--shutdown actix-web` leaves SIGTERM to actix-web alone (`handle_signals: false`), and
//! `--shutdown both` lets actix-web and the manager (`handle_signals: true`) both handle it.
//!
//! `/healthz`, `/readyz`, `/leases` and `/metrics` are the crate's [`AdminRoutes`] (feature `web`);
//! `/shards` shows the `--shards N` partitions of work (none by default) this replica runs and
//! the group as it sees it (a [`ShardedWorkers`] group `<lease>-shards`).
//! On SIGTERM or ctrl-c the crate's [`GracefulShutdown`] shuts down in this order: the manager
//! stops the job, waits for it, and releases the lease (another replica takes over within a round
//! trip); only then does the HTTP server stop, and the process exits. `/leases` and `/readyz` keep
//! answering meanwhile. With the in-memory store (the default) the process warns that the store is
//! its own: two processes never share it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    describe_metrics, AdminRoutes, CandidacyError, Candidate, ClusterSingletonManager,
    CoordinationConfig, GetGroupView, GetShards, GracefulShutdown, HealthCheck, LeaderOnly, Lease,
    LeaseProvider, ShardInfo, ShardedWorkers, SharedLease, SingletonInfo, SingletonSettings,
    IN_MEMORY_BACKEND, METRICS,
};
use actix_web::{web, App, HttpResponse, HttpServer};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// How often the job runs.
const JOB_EVERY: Duration = Duration::from_millis(200);

/// What the job did, shared with the HTTP handlers.
#[derive(Default)]
struct JobState {
    running: AtomicBool,
    runs: AtomicU64,
    token: AtomicU64,
}

/// The scheduled job: runs every [`JOB_EVERY`] while its tenure is alive.
struct Job {
    info: SingletonInfo,
    state: Arc<JobState>,
}

impl Actor for Job {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.state.running.store(true, Ordering::SeqCst);
        tracing::info!(fencing_token = %self.info.fencing_token, "job started");
        ctx.run_interval(JOB_EVERY, |job, ctx| {
            // Check the tenure before every step; pass the token with every write.
            if !job.info.guard.check_alive() {
                ctx.stop();
                return;
            }
            job.state
                .token
                .store(job.info.fencing_token.value(), Ordering::SeqCst);
            job.state.runs.fetch_add(1, Ordering::SeqCst);
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.state.running.store(false, Ordering::SeqCst);
        tracing::info!(fencing_token = %self.info.fencing_token, "job stopped");
    }
}

/// Who handles SIGTERM (`--shutdown`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum ShutdownBy {
    /// [`GracefulShutdown`]: the way to do it.
    Graceful,
    /// For comparison: actix-web's own signal handling; nothing releases the lease.
    ActixWeb,
    /// For comparison: actix-web's and the manager's (`handle_signals: true`), racing.
    Both,
}

struct Args {
    config: Option<PathBuf>,
    config_key: String,
    lease: String,
    owner: String,
    listen: String,
    advertise: Option<String>,
    revision: Option<String>,
    shutdown: ShutdownBy,
    shards: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut config = std::env::var_os("ACTIX_COORD_CONFIG").map(PathBuf::from);
    let mut config_key = "singleton".to_owned();
    let mut lease = "web-service-jobs".to_owned();
    let mut owner = std::env::var("POD_NAME").ok();
    let mut listen = "0.0.0.0:8080".to_owned();
    let mut shutdown = ShutdownBy::Graceful;
    let mut shards = 0;
    let (mut advertise, mut revision) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--config" => config = Some(value()?.into()),
            "--config-key" => config_key = value()?,
            "--lease" => lease = value()?,
            "--owner" => owner = Some(value()?),
            "--listen" => listen = value()?,
            "--advertise" => advertise = Some(value()?),
            "--revision" => revision = Some(value()?),
            "--shards" => shards = value()?.parse().map_err(|e| format!("--shards: {e}"))?,
            "--shutdown" => {
                shutdown = match value()?.as_str() {
                    "graceful" => ShutdownBy::Graceful,
                    "actix-web" => ShutdownBy::ActixWeb,
                    "both" => ShutdownBy::Both,
                    other => return Err(format!("unknown --shutdown {other}")),
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
        config,
        config_key,
        lease,
        owner,
        listen,
        advertise,
        revision,
        shutdown,
        shards,
    })
}

/// The configuration file, or an in-memory lease under `config_key`; `$POD_NAMESPACE` replaces
/// the namespace of every `kubernetes` section.
fn load_config(args: &Args) -> Result<CoordinationConfig, Box<dyn std::error::Error>> {
    let mut config: CoordinationConfig = match &args.config {
        Some(path) => toml::from_str(&std::fs::read_to_string(path)?)?,
        None => toml::from_str(&format!(
            "[leases.{}]\nbackend = \"{IN_MEMORY_BACKEND}\"\n",
            args.config_key
        ))?,
    };
    if let Ok(namespace) = std::env::var("POD_NAMESPACE") {
        for lease in config.leases.values_mut() {
            if let Some(serde_json::Value::Object(section)) = lease.rest.get_mut("kubernetes") {
                section.insert("namespace".into(), namespace.clone().into());
            }
        }
    }
    Ok(config)
}

/// A partition of the sharded work: it would consume its shard under the shard's token.
struct Partition;

impl Actor for Partition {
    type Context = Context<Self>;
}

type Shards = Addr<ShardedWorkers<Partition, SharedLease>>;

/// `/shards`: the shards running here with their tokens, and the group as this node sees it.
async fn shards(workers: web::Data<Option<Shards>>) -> HttpResponse {
    let Some(workers) = workers.as_ref() else {
        return HttpResponse::NotFound().body("no sharded workers (--shards 0)");
    };
    let (Ok(here), Ok(view)) = (
        workers.send(GetShards).await,
        workers.send(GetGroupView).await,
    ) else {
        return HttpResponse::ServiceUnavailable().body("the sharded workers stopped");
    };
    let here: Vec<_> = here
        .iter()
        .map(|s| serde_json::json!({"shard": s.shard, "fencing_token": s.fencing_token.value()}))
        .collect();
    HttpResponse::Ok().json(serde_json::json!({
        "here": here,
        "synced": view.synced,
        "members": view.members,
        "holders": view.holders,
        "targets": view.targets,
    }))
}

/// This replica's candidacy: its revision and the address other replicas redirect to (an invalid
/// `$ACTIX_COORDINATION_ADDRESS` or `--advertise` is refused at startup).
fn candidate(args: &Args) -> Result<Candidate, CandidacyError> {
    let mut candidate = Candidate::from_env()?;
    if let Some(revision) = &args.revision {
        candidate.revision = Some(revision.clone());
    }
    let default = || format!("http://{}", args.listen.replace("0.0.0.0", "127.0.0.1"));
    candidate.address = args
        .advertise
        .clone()
        .or(candidate.address)
        .or_else(|| Some(default()));
    candidate.validate()?;
    Ok(candidate)
}

/// `POST /leader-only/run-now` (behind [`LeaderOnly`]: only the leader gets here): the job's
/// state, if the job still runs here (the tenure can end between the check and this handler).
async fn run_now(job: web::Data<Arc<JobState>>) -> HttpResponse {
    if !job.running.load(Ordering::SeqCst) {
        return HttpResponse::Conflict().body("not leading any more");
    }
    HttpResponse::Accepted().json(serde_json::json!({
        "runs": job.runs.load(Ordering::SeqCst),
        "fencing_token": job.token.load(Ordering::SeqCst),
    }))
}

async fn singleton(job: web::Data<Arc<JobState>>) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({
        "running": job.running.load(Ordering::SeqCst),
        "runs": job.runs.load(Ordering::SeqCst),
        "fencing_token": job.token.load(Ordering::SeqCst),
    }))
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(false)
        .init();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // The error and every cause, in words (not `Debug`).
            let mut message = format!("error: {error}");
            let mut source = error.source();
            while let Some(cause) = source {
                message.push_str(&format!("\n  caused by: {cause}"));
                source = cause.source();
            }
            eprintln!("{message}");
            std::process::ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "usage: web_service [--config FILE] [--config-key KEY] [--lease NAME] [--owner ID] [--listen ADDR] [--advertise URL] [--revision REV] [--shards N] [--shutdown graceful|actix-web|both]";

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().inspect_err(|_| eprintln!("{USAGE}"))?;
    // The recorder first: leases emit to whatever recorder is installed when they act. Every
    // histogram gets its recommended buckets (`MetricDescription::buckets`): without buckets the
    // exporter renders summaries, whose quantiles cannot be aggregated across replicas.
    let mut exporter = PrometheusBuilder::new();
    for metric in METRICS {
        if let Some(buckets) = metric.buckets() {
            exporter =
                exporter.set_buckets_for_metric(Matcher::Full(metric.name.into()), buckets)?;
        }
    }
    let prometheus = exporter.install_recorder()?;
    describe_metrics();
    let config = load_config(&args)?;
    if config
        .leases
        .get(&args.config_key)
        .is_some_and(|lease| lease.backend == IN_MEMORY_BACKEND)
    {
        tracing::warn!("the lease store is in memory: it lives in this process only, and two processes never share it (each leads alone); give --config with an etcd or kubernetes section to run several instances");
    }
    let provider = LeaseProvider::new(config);
    System::new().block_on(serve(args, provider, prometheus))
}

async fn serve(
    args: Args,
    provider: LeaseProvider,
    prometheus: PrometheusHandle,
) -> Result<(), Box<dyn std::error::Error>> {
    let lease = provider.get_lease(&args.lease, &args.config_key, &args.owner)?;
    tracing::info!(lease = %lease.name(), owner = %lease.owner(), ttl = ?lease.settings().ttl(), listen = %args.listen, "web service starting");
    let health = HealthCheck::new();
    let job = Arc::new(JobState::default());
    let manager = ClusterSingletonManager::new(lease.clone(), {
        let job = Arc::clone(&job);
        move |info: &SingletonInfo, _| Job {
            info: info.clone(),
            state: Arc::clone(&job),
        }
    })
    .settings(SingletonSettings {
        // Back off at most one TTL after errors, so that a waiting replica does not miss a
        // handover behind a long backoff.
        max_error_backoff: lease.settings().ttl(),
        handle_signals: args.shutdown == ShutdownBy::Both,
        ..Default::default()
    })
    .health(&health)
    .candidacy(candidate(&args)?, {
        let (provider, config_key) = (provider.clone(), args.config_key.clone());
        move |settings| provider.lease_with_settings(&config_key, settings)
    })?
    .start();

    // `--shards N` (default 0: none) partitions of work spread over the replicas, each run exactly once (group
    // `<lease>-shards`, leases configured like the singleton's). They do not report to the health
    // check: readiness does not depend on how many shards a replica holds.
    let workers: Option<Shards> = match args.shards {
        0 => None,
        n => Some(
            ShardedWorkers::from_provider(
                &provider,
                &args.config_key,
                format!("{}-shards", args.lease),
                (0..n).map(|i| i.to_string()),
                &args.owner,
                |_: &ShardInfo, _| Partition,
            )?
            .start(),
        ),
    };

    // The admin routes from the crate (feature `web`), and the job's own routes.
    let admin = AdminRoutes::new(health)
        .with_metrics(move || prometheus.render())
        .with_leader(manager.clone());
    let leader_only = LeaderOnly::new(manager.clone());
    let shards_data = web::Data::new(workers.clone());
    let mut server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(Arc::clone(&job)))
            .app_data(shards_data.clone())
            .configure(|cfg| admin.register(cfg))
            .route("/singleton", web::get().to(singleton))
            .route("/shards", web::get().to(shards))
            .service(
                web::scope("/leader-only")
                    .wrap(leader_only.clone())
                    .route("/run-now", web::post().to(run_now)),
            )
    })
    .workers(1)
    .shutdown_timeout(5);
    if args.shutdown == ShutdownBy::Graceful {
        // GracefulShutdown owns SIGTERM and SIGINT: the job stops and the lease is released
        // before the server stops.
        server = server.disable_signals();
    }
    let server = server.bind(&args.listen)?.run();
    tracing::info!(listen = %args.listen, "http server listening");
    if args.shutdown == ShutdownBy::Graceful {
        let mut shutdown = GracefulShutdown::new().manager(lease.name(), manager);
        if let Some(workers) = workers {
            shutdown = shutdown.manager(format!("{}-shards", args.lease), workers);
        }
        shutdown.run(server).await?;
    } else {
        // For comparison only: whatever the manager has not done when the server has stopped is
        // dropped when `main` returns.
        server.await?;
        tracing::info!("http server stopped");
        drop(manager);
        drop(workers);
    }
    Ok(())
}
