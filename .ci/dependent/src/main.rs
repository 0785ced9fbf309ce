//! Uses the public API of every backend its features turn on, as a user's program would: built by
//! `.ci/features` with `cargo check` for combinations of the features `kubernetes`, `etcd`,
//! `metrics`, `web` and `web-forward` (never run).

use std::time::Duration;

use actix::prelude::*;
use actix_coordination::prelude::*;

fn settings(owner: &str) -> Result<LeaseSettings, Box<dyn std::error::Error>> {
    Ok(LeaseSettings::builder("dependent", owner)
        .ttl(Duration::from_secs(15))
        .build()?)
}

/// A singleton that does nothing.
struct Job;

impl Actor for Job {
    type Context = Context<Self>;
}

#[actix_rt::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "metrics")]
    actix_coordination::describe_metrics();

    let store = InMemoryStore::new();
    let lease = InMemoryLease::new(settings("in-memory")?, &store);
    if lease.acquire().await? {
        lease.release().await?;
    }
    let manager = ClusterSingletonManager::new(
        store.lease(settings("singleton")?),
        |_: &SingletonInfo, _| Job,
    )
    .start();

    #[cfg(feature = "web")]
    {
        use actix_coordination::{AdminRoutes, GracefulShutdown};
        let admin = AdminRoutes::new(HealthCheck::new()).with_metrics(String::new);
        let server = actix_web::HttpServer::new(move || {
            actix_web::App::new().service(admin.scope("/admin"))
        })
        .disable_signals()
        .bind("127.0.0.1:0")?
        .run();
        let _shutdown = GracefulShutdown::new().manager("singleton", manager.clone());
        drop(server);

        // Requests routed to the node that runs their entity's shard, from every worker thread.
        use actix_coordination::{EntityId, RoutedShard, ShardRouting};
        let leases = store.clone();
        let workers = ShardedWorkers::with_count(
            "orders",
            4,
            move |name: &str| leases.lease(LeaseSettings::new(name, "node-1").unwrap()),
            |_: &ShardInfo, _| Job,
        )?;
        let routing = ShardRouting::new(workers.directory(), EntityId::header("x-entity-id")?)
            .retry_after(Duration::from_secs(2));
        // Forwarded to the shard's node rather than redirected (feature `web-forward`).
        #[cfg(feature = "web-forward")]
        let routing = routing.forward_with(
            actix_coordination::ForwardSettings::new().timeout(Duration::from_secs(5)),
        );
        let routed = actix_web::HttpServer::new(move || {
            actix_web::App::new().service(
                actix_web::web::resource("/orders/{id}")
                    .wrap(routing.clone())
                    .route(actix_web::web::get().to(|shard: RoutedShard| async move {
                        shard.fencing_token.value().to_string()
                    })),
            )
        });
        drop(routed);
    }

    manager.send(actix_coordination::Shutdown).await??;

    #[cfg(feature = "kubernetes")]
    {
        use actix_coordination::{KubernetesLease, KubernetesSession, KubernetesSettings};
        let k8s = KubernetesSettings::new("default");
        let session = KubernetesSession::new(k8s.clone())?;
        let _lease: KubernetesLease = session.lease(settings("kubernetes")?);
        let _alone = KubernetesLease::new(settings("kubernetes")?, k8s)?;
    }

    #[cfg(feature = "etcd")]
    {
        use actix_coordination::{EtcdLease, EtcdSession, EtcdSettings};
        let etcd = EtcdSettings::builder(["http://127.0.0.1:2379"]).build()?;
        let session = EtcdSession::new(etcd);
        let _lease = EtcdLease::new(settings("etcd")?, &session);
    }
    Ok(())
}
