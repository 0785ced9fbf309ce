//! actix-web out of the box (feature `web`): [`AdminRoutes`], the admin routes an operator
//! needs, [`GracefulShutdown`], which releases every lease before the process exits, and the
//! routing middlewares: [`LeaderOnly`] to the singleton's leader, [`ShardRouting`] to the node
//! that runs a request's shard (one validation of the addresses both redirect to).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use actix::Recipient;
use actix_web::{web, HttpResponse, Scope};

#[cfg(feature = "web-forward")]
mod forward;
mod leader;
mod redirect;
mod shard;

#[cfg(feature = "web-forward")]
pub use forward::ForwardSettings;

pub use leader::{LeaderOnly, LeaderOnlyService};
pub use shard::{EntityId, RoutedShard, ShardRouting, ShardRoutingError, ShardRoutingService};

use crate::actors::{GetLeader, Shutdown};
use crate::health::HealthCheck;
use crate::lease::Lease;
use crate::vocab::LeaseError;

/// The default bound of [`GracefulShutdown`]'s releases: the time a manager or a lease gets to
/// stop and release before the shutdown goes on without it (logged).
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The admin routes of a service: a ready [`Scope`](actix_web::Scope) with `GET /healthz`
/// (liveness), `GET /readyz` (readiness), `GET /leases` (the [`LeaseReport`](crate::LeaseReport)s
/// as JSON) from a [`HealthCheck`], and `GET /metrics` when given a renderer (for example a
/// Prometheus exporter's `render`, installed with the buckets of
/// [`MetricDescription::buckets`](crate::MetricDescription::buckets)), and `GET /leader` when
/// given a manager ([`with_leader`](AdminRoutes::with_leader)). Failing checks answer `503` with
/// the reason.
///
/// Cheap to clone: build it once and call [`register`](AdminRoutes::register) (or
/// [`scope`](AdminRoutes::scope)) in the `HttpServer` factory (once per worker).
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
#[derive(Clone)]
pub struct AdminRoutes {
    health: HealthCheck,
    metrics: Option<Render>,
    leader: Option<Recipient<GetLeader>>,
}

impl std::fmt::Debug for AdminRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminRoutes")
            .field("health", &self.health)
            .field("metrics", &self.metrics.is_some())
            .field("leader", &self.leader.is_some())
            .finish()
    }
}

impl AdminRoutes {
    /// Routes over `health` (a clone of it: checks registered later are seen).
    pub fn new(health: HealthCheck) -> Self {
        Self {
            health,
            metrics: None,
            leader: None,
        }
    }

    /// Adds `GET /leader`: `200` with who leads the singleton of `manager` as JSON (`holder`,
    /// `fencing_token`, `here`, `address`, from [`GetLeader`]), `503` when nobody leads as this
    /// node sees it. For routes only the leader serves, see [`LeaderOnly`].
    pub fn with_leader(mut self, manager: impl Into<Recipient<GetLeader>>) -> Self {
        self.leader = Some(manager.into());
        self
    }

    /// Adds `GET /metrics`, answering what `render` returns as Prometheus text (for example
    /// `move || handle.render()` with a `metrics_exporter_prometheus::PrometheusHandle`).
    pub fn with_metrics(mut self, render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.metrics = Some(Arc::new(render));
        self
    }

    /// Registers the routes at the root of an app or scope, beside the app's own:
    /// `App::new().configure(|cfg| admin.register(cfg))`.
    pub fn register(&self, cfg: &mut web::ServiceConfig) {
        cfg.app_data(web::Data::new(self.health.clone()))
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
            .route("/leases", web::get().to(leases));
        if let Some(manager) = &self.leader {
            cfg.app_data(web::Data::new(manager.clone()))
                .route("/leader", web::get().to(leader::leader));
        }
        if let Some(render) = &self.metrics {
            let render = Arc::clone(render);
            cfg.route(
                "/metrics",
                web::get().to(move || {
                    let body = render();
                    async move {
                        HttpResponse::Ok()
                            .content_type("text/plain; version=0.0.4")
                            .body(body)
                    }
                }),
            );
        }
    }

    /// The routes under the prefix `path` (for example `"/admin"`). A scope takes every request
    /// under its prefix: for the routes at the root beside the app's own, use
    /// [`register`](AdminRoutes::register).
    pub fn scope(&self, path: &str) -> Scope {
        web::scope(path).configure(|cfg| self.register(cfg))
    }
}

async fn healthz(health: web::Data<HealthCheck>) -> HttpResponse {
    match health.liveness() {
        Ok(()) => HttpResponse::Ok().body("ok"),
        Err(unhealthy) => HttpResponse::ServiceUnavailable().body(unhealthy.to_string()),
    }
}

async fn readyz(health: web::Data<HealthCheck>) -> HttpResponse {
    match health.readiness() {
        Ok(()) => HttpResponse::Ok().body("ok"),
        Err(not_ready) => HttpResponse::ServiceUnavailable().body(not_ready.to_string()),
    }
}

async fn leases(health: web::Data<HealthCheck>) -> HttpResponse {
    HttpResponse::Ok().json(health.leases())
}

type Release = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = Result<bool, LeaseError>>>>>;

/// What to stop, in order, when the service is told to terminate.
///
/// A deploy stops a replica with SIGTERM. If the lease it holds is not released before the process
/// exits, the record names it until the TTL passes, and the successor waits that long. actix-web
/// handles SIGTERM itself by stopping the HTTP server, after which `main` returns and whatever was
/// still releasing is dropped. [`GracefulShutdown`] owns the signals instead: on SIGTERM or SIGINT
/// it shuts the managers down (each stops its singleton, then releases its lease), releases the
/// other leases it was given, and only then stops the HTTP server. Awaiting
/// [`GracefulShutdown::run`] from `main` therefore returns after every release has ended (or
/// failed, logged with the lease it concerns), whatever order the runtime tears things down in
/// afterwards. If the server stops on its own first (its own signal handling was left on, or
/// something else stopped it), the same releases run before `run` returns.
///
/// ```no_run
/// use actix::prelude::*;
/// use actix_coordination::prelude::*;
/// use actix_coordination::{AdminRoutes, GracefulShutdown};
/// use actix_web::{App, HttpServer};
///
/// struct Job;
/// impl Actor for Job { type Context = Context<Self>; }
///
/// #[actix_web::main]
/// async fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let store = InMemoryStore::new();
///     let health = HealthCheck::new();
///     let settings = LeaseSettings::new("jobs", "node-1")?;
///     let manager = ClusterSingletonManager::new(InMemoryLease::new(settings, &store), |_, _| Job)
///         .health(&health)
///         .start();
///     let admin = AdminRoutes::new(health);
///     let server = HttpServer::new(move || App::new().configure(|cfg| admin.register(cfg)))
///         .disable_signals() // GracefulShutdown owns SIGTERM and SIGINT
///         .bind("0.0.0.0:8080")?
///         .run();
///     GracefulShutdown::new().manager("jobs", manager).run(server).await?;
///     Ok(())
/// }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
pub struct GracefulShutdown {
    steps: Vec<(String, Release)>,
    timeout: Duration,
}

impl std::fmt::Debug for GracefulShutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GracefulShutdown")
            .field(
                "steps",
                &self.steps.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Default for GracefulShutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl GracefulShutdown {
    /// Nothing to stop yet; each step gets [`DEFAULT_SHUTDOWN_TIMEOUT`].
    pub fn new() -> Self {
        Self {
            steps: Vec::new(),
            timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }

    /// How long each step (a manager's shutdown, a release) may take before the shutdown goes
    /// on without it; keep the sum below the orchestrator's grace period (Kubernetes:
    /// `terminationGracePeriodSeconds`, 30 s by default).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Shuts a singleton manager (any actor that handles [`Shutdown`]) down: it stops its
    /// singleton, then releases its lease. `name` names it in the log.
    pub fn manager(
        mut self,
        name: impl Into<String>,
        manager: impl Into<Recipient<Shutdown>>,
    ) -> Self {
        let manager = manager.into();
        self.steps.push((
            name.into(),
            Box::new(move || {
                Box::pin(async move {
                    match manager.send(Shutdown).await {
                        Ok(result) => result,
                        // Already stopped: it released (or gave up) when it stopped.
                        Err(_) => Ok(true),
                    }
                })
            }),
        ));
        self
    }

    /// Releases `lease` (an `Arc` of a lease, a [`SharedLease`](crate::SharedLease)).
    pub fn lease<L: Lease>(mut self, lease: L) -> Self {
        let name = lease.name().to_owned();
        self.steps.push((
            name,
            Box::new(move || Box::pin(async move { lease.release().await })),
        ));
        self
    }

    /// Runs `server` until SIGTERM or SIGINT (or until it stops by itself), then shuts down every
    /// manager and releases every lease given, in the order given, each bounded by the
    /// [`timeout`](GracefulShutdown::timeout), and only then stops the server (gracefully) and
    /// returns.
    ///
    /// # Errors
    ///
    /// The server's own error, if it failed. A failed release is logged (`warn`, naming the
    /// lease: its successor waits for the TTL), not returned: the shutdown goes on.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: await it to the end (from `main`), or the releases may not happen.
    pub async fn run(self, server: actix_web::dev::Server) -> std::io::Result<()> {
        let handle = server.handle();
        let mut running = actix_rt::spawn(server);
        let ended_by_itself = tokio::select! {
            () = termination() => {
                tracing::info!("termination requested: stopping the singletons and releasing the leases");
                None
            }
            result = &mut running => {
                tracing::info!("the http server stopped: stopping the singletons and releasing the leases");
                Some(result)
            }
        };
        for (name, release) in self.steps {
            match tokio::time::timeout(self.timeout, release()).await {
                Ok(Ok(released)) => {
                    tracing::info!(lease = %name, released, "shutdown: lease released")
                }
                Ok(Err(error)) => {
                    tracing::warn!(lease = %name, error = &error as &dyn std::error::Error, "shutdown: release failed; the lease stays held until its TTL passes")
                }
                Err(_) => {
                    tracing::warn!(lease = %name, timeout = ?self.timeout, "shutdown: release did not finish in time; the lease may stay held until its TTL passes")
                }
            }
        }
        let result = match ended_by_itself {
            Some(result) => result,
            None => {
                handle.stop(true).await;
                running.await
            }
        };
        tracing::info!("http server stopped");
        match result {
            Ok(result) => result,
            Err(join) => Err(std::io::Error::other(join)),
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InMemoryLease, InMemoryStore, LeaseSettings};
    use actix_web::{test, App};

    #[actix_rt::test]
    async fn the_admin_routes_answer_from_the_health_check() {
        let store = InMemoryStore::new();
        let lease = Arc::new(InMemoryLease::new(
            LeaseSettings::new("admin", "a").unwrap(),
            &store,
        ));
        let health = HealthCheck::new();
        health.add_lease(&lease);
        let admin = AdminRoutes::new(health).with_metrics(|| "# metrics\n".to_owned());
        let app = test::init_service(App::new().service(admin.scope("/admin"))).await;
        for (path, body) in [
            ("/admin/healthz", "ok"),
            ("/admin/readyz", "ok"),
            ("/admin/metrics", "# metrics\n"),
        ] {
            let response =
                test::call_service(&app, test::TestRequest::get().uri(path).to_request()).await;
            assert!(response.status().is_success(), "{path}");
            assert_eq!(test::read_body(response).await, body, "{path}");
        }
        assert!(lease.acquire().await.unwrap());
        let reports: serde_json::Value = test::call_and_read_body_json(
            &app,
            test::TestRequest::get().uri("/admin/leases").to_request(),
        )
        .await;
        assert_eq!(reports[0]["name"], "admin");
        assert_eq!(reports[0]["held"], true);
        let admin = AdminRoutes::new(HealthCheck::new());
        let without_metrics = test::init_service(
            App::new()
                .configure(|cfg| admin.register(cfg))
                .route("/own", actix_web::web::get().to(|| async { "own" })),
        )
        .await;
        let response = test::call_service(
            &without_metrics,
            test::TestRequest::get().uri("/own").to_request(),
        )
        .await;
        assert!(
            response.status().is_success(),
            "the app's own routes beside"
        );
        let response = test::call_service(
            &without_metrics,
            test::TestRequest::get().uri("/metrics").to_request(),
        )
        .await;
        assert_eq!(response.status(), 404);
    }

    /// The server stopping by itself (its own signal handling) still runs every release before
    /// `run` returns.
    #[actix_rt::test]
    async fn a_server_that_stops_by_itself_still_releases_first() {
        let store = InMemoryStore::new();
        let lease = Arc::new(InMemoryLease::new(
            LeaseSettings::new("graceful", "a").unwrap(),
            &store,
        ));
        assert!(lease.acquire().await.unwrap());
        let server = actix_web::HttpServer::new(App::new)
            .workers(1)
            .disable_signals()
            .bind("127.0.0.1:0")
            .unwrap()
            .run();
        let handle = server.handle();
        let shutdown = GracefulShutdown::new().lease(Arc::clone(&lease));
        let stopper = actix_rt::spawn(async move { handle.stop(true).await });
        shutdown.run(server).await.unwrap();
        stopper.await.unwrap();
        assert!(!lease.check_alive());
        assert_eq!(store.record("graceful").unwrap().holder, None, "released");
    }
}
