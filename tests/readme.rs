//! The README's Rust code blocks, compiled (issue 28): each block stands verbatim between
//! `README block` markers below, inside a function that gives it what the text around it assumes
//! (a store, a provider, a pod name, an actor). The prelude is the only import of the crate the
//! scaffolding uses, so that every type a snippet names without importing it must be in the
//! prelude. `readme_blocks_are_compiled_here` fails when a block of the README is not found here
//! verbatim (edit both together), or when this file keeps a block the README lost.
//!
//! The functions are compiled, not run (they would need real servers and files).
#![allow(
    dead_code,
    unused_imports,
    unused_variables,
    unused_mut,
    unreachable_code,
    clippy::all
)]

use std::error::Error;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::prelude::*;

type Result<T = (), E = Box<dyn Error>> = std::result::Result<T, E>;

async fn write_batch(_: FencingToken) {}
fn run_due_jobs(_: FencingToken) {}

struct MyActor;
impl Actor for MyActor {
    type Context = Context<Self>;
}
impl Handler<LeaseLost> for MyActor {
    type Result = ();
    fn handle(&mut self, _: LeaseLost, _: &mut Context<Self>) {}
}

struct Partition {
    id: String,
    guard: TenureGuard,
}
impl Actor for Partition {
    type Context = Context<Self>;
}

#[rustfmt::skip]
async fn sharded(provider: LeaseProvider, pod_name: String) -> Result {
// README block
let workers = ShardedWorkers::from_provider(&provider, "ingest", "ingest", (0..64).map(|i| i.to_string()), &pod_name,
    |shard: &ShardInfo, _ctx| Partition { id: shard.shard.clone(), guard: shard.guard.clone() })?
    .start();
let here = workers.send(GetShards).await?;          // the shards running on this node, with tokens
let view = workers.send(GetGroupView).await?;       // members, holders and targets, from the watch
// end of README block
Ok(())
}

#[rustfmt::skip]
async fn shard_location(provider: LeaseProvider, pod_name: String) -> Result {
// README block
let leases = provider.clone();
let workers = ShardedWorkers::from_provider(&provider, "orders", "orders", (0..64).map(|i| i.to_string()), &pod_name,
    |shard: &ShardInfo, _ctx| Partition { id: shard.shard.clone(), guard: shard.guard.clone() })?
    .advertise("http://10.1.2.3:8080", move |s| leases.lease_with_settings("orders", s))?;
let directory: ShardDirectory = workers.directory();    // Clone + Send + Sync: for request handlers
let workers = workers.start();
let location = directory.locate_entity("customer-42")?; // shard_for("customer-42", 64), then where it runs
if location.here {
    // serve it here, under the shard worker's guard
} else if let Some(address) = &location.address {
    // send it to the holder: `address` is its scheme, host and port
}
// end of README block
Ok(())
}

struct Cart;
impl Cart {
    fn new(_: &str, _: ShardInfo) -> Self {
        Cart
    }
}
impl Actor for Cart {
    type Context = Context<Self>;
}
#[derive(Message)]
#[rtype(result = "usize")]
struct AddItem(String);
impl Handler<AddItem> for Cart {
    type Result = usize;
    fn handle(&mut self, _: AddItem, _: &mut Context<Self>) -> usize {
        1
    }
}

#[rustfmt::skip]
async fn entities(provider: LeaseProvider, pod_name: String) -> Result {
// README block
let hosts = EntityHosts::new().with_idle_timeout(Some(Duration::from_secs(600)));
let workers = ShardedWorkers::from_provider(&provider, "carts", "carts", (0..64).map(|i| i.to_string()), &pod_name,
    hosts.factory(|cart_id: &str, shard: &ShardInfo, _ctx| Cart::new(cart_id, shard.clone())))?;
let entities: Entities<Cart> = hosts.entities(workers.directory()); // Clone + Send + Sync: for request handlers
let workers = workers.start();
match entities.send("cart-42", AddItem("book".into())).await {
    Ok(items) => { /* handled here by cart-42's one actor, under its shard's tenure */ }
    Err(EntityError::NotHere { address, .. }) => { /* its shard runs elsewhere: forward it there */ }
    Err(error) => { /* moving, or its tenure here ended: try again shortly */ }
}
// end of README block
Ok(())
}

struct Region;
impl Actor for Region {
    type Context = Context<Self>;
}
impl Handler<HostShard> for Region {
    type Result = ();
    fn handle(&mut self, _: HostShard, _: &mut Context<Self>) {}
}

#[rustfmt::skip]
async fn quick_start() -> Result {
// README block
use std::time::Duration;
use actix_coordination::prelude::*;

let store = InMemoryStore::new();                        // or a Kubernetes / etcd backend
let settings = LeaseSettings::builder("billing-singleton", "node-1")
    .ttl(Duration::from_secs(15))
    .build()?;                                           // invalid settings fail here, typed
let lease = InMemoryLease::new(settings, &store);

let _sub = lease.on_lost(|lost| tracing::warn!(%lost, "stop leader-only work now"));
if lease.acquire().await? {                              // Ok(false): someone else holds it
    let token = lease.fencing_token().unwrap();          // pass it with every write
    while lease.check_alive() { /* leader-only work, fenced with `token` */ }
    lease.release().await?;                              // hand over at once
}
// end of README block
Ok(())
}

#[rustfmt::skip]
async fn guards(lease: InMemoryLease) -> Result {
// README block
let guard = lease.tenure().guard().expect("held");
tokio::select! {
    _ = guard.ended() => tracing::warn!("tenure ended: stop now"),
    _ = async {
        while guard.check_alive() {                    // gate every step ...
            write_batch(guard.token()).await;          // ... and fence every write
        }
    } => {}
}
// end of README block
Ok(())
}

#[rustfmt::skip]
fn provider(pod_name: String) -> Result {
// README block
let config: CoordinationConfig = toml::from_str(&std::fs::read_to_string("coordination.toml")?)?;
let provider = LeaseProvider::new(config);
let lease = provider.get_lease("job-scheduler", "singleton", &pod_name)?;
// end of README block
Ok(())
}

#[cfg(feature = "kubernetes")]
#[rustfmt::skip]
async fn kubernetes() -> Result {
// README block
use actix_coordination::{KubernetesLease, KubernetesSettings, Lease, LeaseSettings};

let owner = KubernetesSettings::owner_from_env()?;                       // POD_NAME (or HOSTNAME)
let settings = LeaseSettings::new("job-scheduler", owner)?;
let lease = KubernetesLease::new(settings, KubernetesSettings::from_env()?)?; // POD_NAMESPACE
// Leases built with equal settings share one session: one connection, one watch (see below).
// Outside a cluster, from a kubeconfig:
//   let config = kube::Config::infer().await?;
//   let client = actix_coordination::kubernetes_client(&config)?;   // TCP_NODELAY, see below
//   KubernetesLease::with_client(settings, client, "my-namespace")?
//   // or, for many leases on that client: one watch for all of them
//   let session = KubernetesSession::from_client(client, "my-namespace")?;
//   let lease = session.lease(settings);
// end of README block
Ok(())
}

#[cfg(feature = "etcd")]
#[rustfmt::skip]
async fn etcd(pod_name: String) -> Result {
// README block
use actix_coordination::{EtcdLease, EtcdSession, EtcdSettings, Lease, LeaseSettings};

let etcd = EtcdSettings::builder(["http://10.0.0.1:2379", "http://10.0.0.2:2379"])
    .prefix("/my-app/leases/")
    .build()?;                                   // invalid settings: EtcdError::InvalidSettings
let session = EtcdSession::connect(etcd).await?; // or EtcdSession::new(etcd): connects on first use
let lease = EtcdLease::new(LeaseSettings::new("job-scheduler", &pod_name)?, &session);
// end of README block
Ok(())
}

#[rustfmt::skip]
async fn lease_actor(store: InMemoryStore, settings: LeaseSettings, my_actor: Addr<MyActor>) -> Result {
// README block
let lease = LeaseActor::new(store.lease(settings)).start();
lease.send(SubscribeLeaseLost(my_actor.recipient())).await?;
if lease.send(Acquire).await?? { /* ... */ }
// end of README block
Ok(())
}

#[rustfmt::skip]
async fn singleton(provider: LeaseProvider, pod_name: String) -> Result {
// README block
struct JobScheduler { info: SingletonInfo }
impl Actor for JobScheduler {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(Duration::from_secs(1), |act, _| {
            if !act.info.guard.check_alive() { return; }    // never a step outside the tenure
            run_due_jobs(act.info.fencing_token);            // fence every write with the token
        });
    }
}

let lease = provider.get_lease("job-scheduler", "singleton", &pod_name)?;
let manager = ClusterSingletonManager::new(lease, |info: &SingletonInfo, _ctx| {
    JobScheduler { info: info.clone() }
})
.settings(SingletonSettings { handle_signals: true, ..Default::default() })
.start();
let here: Option<Addr<JobScheduler>> = manager.send(GetSingleton::new()).await?;
// end of README block
Ok(())
}

#[rustfmt::skip]
async fn transfer(leader: Addr<ClusterSingletonManager<MyActor, SharedLease>>) -> Result {
// README block
let moved: bool = leader.send(TransferLeadership::to("node-b")).await??;  // false: not the leader
// end of README block
Ok(())
}

struct JobScheduler {
    info: SingletonInfo,
}
impl Actor for JobScheduler {
    type Context = Context<Self>;
}

#[rustfmt::skip]
async fn candidacy(provider: LeaseProvider, pod_name: String) -> Result {
// README block
let lease = provider.get_lease("job-scheduler", "singleton", &pod_name)?;
let manager = ClusterSingletonManager::new(lease, |info: &SingletonInfo, _ctx| JobScheduler { info: info.clone() })
    .candidacy(Candidate::from_env()?, move |settings| provider.lease_with_settings("singleton", settings))?
    .handover(HandoverPolicy::NewestRevision)            // the default; or Off, or HandoverPolicy::ranked(..)
    .start();
// end of README block
Ok(())
}

#[cfg(feature = "web")]
async fn run_now() -> actix_web::HttpResponse {
    actix_web::HttpResponse::Accepted().finish()
}

#[cfg(feature = "web")]
#[rustfmt::skip]
fn leader_routes(health: HealthCheck, manager: Addr<ClusterSingletonManager<JobScheduler, SharedLease>>) {
    use actix_web::{web, App};
// README block
let admin = AdminRoutes::new(health).with_leader(manager.clone());      // GET /leader
let app = App::new()
    .configure(|cfg| admin.register(cfg))
    .service(web::scope("/jobs").wrap(LeaderOnly::new(manager.clone()))  // leader-only routes
        .route("/run", web::post().to(run_now)));
// end of README block
}

#[rustfmt::skip]
async fn coordinator(provider: LeaseProvider, pod_name: String, region: Addr<Region>) -> Result {
// README block
let coordinator = ShardCoordinator::new(provider.get_lease("shard-coordinator", "coordinator", &pod_name)?).start();
coordinator.send(RegisterRegion(region.recipient())).await??;
let home = coordinator.send(AllocateShard("customer-42".into())).await??;   // home.region, home.fencing_token
// end of README block
Ok(())
}

#[cfg(feature = "metrics")]
#[rustfmt::skip]
fn metrics() -> Result {
// README block
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

let mut exporter = PrometheusBuilder::new();
for metric in actix_coordination::METRICS {
    if let Some(buckets) = metric.buckets() {                // the recommended buckets below
        exporter = exporter.set_buckets_for_metric(Matcher::Full(metric.name.into()), buckets)?;
    }
}
let prometheus = exporter.install_recorder()?;
actix_coordination::describe_metrics();
// ... serve prometheus.render() on /metrics
// end of README block
Ok(())
}

#[cfg(feature = "web")]
#[rustfmt::skip]
async fn web(
    lease: SharedLease,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
) -> Result {
    use actix_web::{App, HttpServer};
    struct JobScheduler { info: SingletonInfo }
    impl Actor for JobScheduler { type Context = Context<Self>; }
// README block
let health = HealthCheck::new();
let manager = ClusterSingletonManager::new(lease, |info: &SingletonInfo, _ctx| JobScheduler { info: info.clone() })
    .health(&health)
    .start();
let admin = AdminRoutes::new(health).with_metrics(move || prometheus.render());
let server = HttpServer::new(move || App::new().configure(|cfg| admin.register(cfg)))
    .disable_signals()                      // GracefulShutdown owns SIGTERM and SIGINT
    .bind("0.0.0.0:8080")?
    .run();
GracefulShutdown::new().manager("job-scheduler", manager).run(server).await?;
// end of README block
Ok(())
}

/// The ```rust blocks of `text`, each as its lines joined with newlines.
fn rust_blocks(text: &str, open: &str, close: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines() {
        match &mut current {
            None if line.trim_end() == open => current = Some(Vec::new()),
            Some(lines) if line.trim_end() == close => {
                blocks.push(lines.join("\n"));
                current = None;
            }
            Some(lines) => lines.push(line),
            None => {}
        }
    }
    blocks
}

#[test]
fn readme_blocks_are_compiled_here() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let here = std::fs::read_to_string(root.join("tests/readme.rs")).unwrap();
    let in_readme = rust_blocks(&readme, "```rust", "```");
    let compiled = rust_blocks(&here, "// README block", "// end of README block");
    assert!(!in_readme.is_empty());
    for block in &in_readme {
        assert!(
            compiled.contains(block),
            "this README block is not compiled by tests/readme.rs (copy it there):\n{block}"
        );
    }
    for block in &compiled {
        assert!(
            in_readme.contains(block),
            "tests/readme.rs compiles a block the README no longer has:\n{block}"
        );
    }
}
