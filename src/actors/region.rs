//! [`ShardRegion`]: the region side of coordinator-based sharding, with a lease per hosted shard.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use actix::prelude::*;
use futures_util::future::join_all;

use super::coordinator::{HostShard, ShardId};
use super::sharded::{shard_manager, RunningShard, ShardInfo};
use super::singleton::{ClusterSingletonManager, Shutdown, SingletonSettings};
use crate::lease::{Lease, LeaseError};

/// Stop hosting a shard: its entities stop, then its lease is released. Answers the release's
/// result (`Ok(true)` also when the shard was not hosted here).
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "Result<bool, LeaseError>")]
pub struct HandOffShard(pub ShardId);

/// Ask a [`ShardRegion`] which of its shards run here now (hosted, and under a live tenure of
/// the shard's lease), with their tokens.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Vec<RunningShard>")]
pub struct GetHostedShards;

type EntityFactory<A> = Rc<dyn Fn(&ShardInfo, &mut Context<A>) -> A>;

struct Hosted<A: Actor<Context = Context<A>>, L: Lease> {
    lease: Arc<L>,
    manager: Addr<ClusterSingletonManager<A, L>>,
}

/// A region hosting shards under a lease per shard (Akka Cluster Sharding's `use-lease`).
///
/// A [`ShardCoordinator`](crate::ShardCoordinator) decides which region hosts a shard and tells
/// it with [`HostShard`]. A coordinator's tenure guards its *decisions*; it cannot stop two regions
/// from running one shard's entities at once when a region is partitioned away, paused, or slow
/// to hand a shard off. A `ShardRegion` closes that gap: it starts a shard's entities only under
/// the shard's own lease (`<prefix>-<shard>`), stops them when that lease's tenure ends (before any
/// other node can take it), and releases the lease when the shard is handed off
/// ([`HandOffShard`]) or the region stops. Each hosted shard is a
/// [`ClusterSingletonManager`] inside, with every rule it keeps (the entities get the guard and
/// fencing token, are stopped before the deadline and within `stop_timeout`, and the lease is
/// released only after they stopped); while the shard stays hosted here, a lost lease is competed
/// for again, and the entities start again under the new tenure.
///
/// Akka shipped a bug where a handed-off shard never released its lease, so the next region
/// waited a whole TTL (akka/akka#31715): here a handoff answers only once the lease is released
/// (`a_handed_off_shard_releases_its_lease_at_once` in `tests/shard_region.rs`).
///
/// # Example
///
/// ```
/// use actix::prelude::*;
/// use actix_coordination::prelude::*;
/// use actix_coordination::{GetHostedShards, HandOffShard, ShardRegion};
///
/// struct Entities;
/// impl Actor for Entities {
///     type Context = Context<Self>;
/// }
///
/// # #[actix::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let leases = store.clone();
/// let region = ShardRegion::new("entities", move |name: &str| {
///     leases.lease(LeaseSettings::new(name, "node-1").unwrap())
/// }, |_: &ShardInfo, _ctx| Entities)
/// .start();
/// let coordinator = ShardCoordinator::new(store.lease(LeaseSettings::new("coordinator", "node-1")?)).start();
/// coordinator.send(RegisterRegion(region.clone().recipient())).await??;
/// coordinator.send(AllocateShard("customer-42".into())).await??;
/// # tokio::time::sleep(std::time::Duration::from_millis(50)).await;
/// assert_eq!(store.holder("entities-customer-42").as_deref(), Some("node-1"));
/// region.send(HandOffShard("customer-42".into())).await??;   // entities stop, lease released
/// assert_eq!(store.holder("entities-customer-42"), None);
/// # Ok(()) }
/// ```
pub struct ShardRegion<A: Actor<Context = Context<A>>, L: Lease> {
    prefix: String,
    lease_for: Box<dyn Fn(&str) -> L>,
    factory: EntityFactory<A>,
    settings: SingletonSettings,
    hosted: BTreeMap<ShardId, Hosted<A, L>>,
}

impl<A: Actor<Context = Context<A>>, L: Lease> ShardRegion<A, L> {
    /// A region whose shard `s` is guarded by the lease `lease_for("<prefix>-<s>")` (this node's
    /// lease of that name) and whose entities `factory` builds, under that lease's tenure.
    pub fn new(
        prefix: impl Into<String>,
        lease_for: impl Fn(&str) -> L + 'static,
        factory: impl Fn(&ShardInfo, &mut Context<A>) -> A + 'static,
    ) -> Self {
        Self {
            prefix: prefix.into(),
            lease_for: Box::new(lease_for),
            factory: Rc::new(factory),
            settings: SingletonSettings::default(),
            hosted: BTreeMap::new(),
        }
    }

    /// The settings of each shard's manager (stop timeout, restarts, retry delay, backoff;
    /// `handle_signals` is ignored).
    pub fn settings(mut self, settings: SingletonSettings) -> Self {
        self.settings = SingletonSettings {
            handle_signals: false,
            ..settings
        };
        self
    }

    fn host(&mut self, shard: ShardId) {
        if self.hosted.contains_key(&shard) {
            return;
        }
        let lease = Arc::new((self.lease_for)(&format!("{}-{shard}", self.prefix)));
        let manager = shard_manager(
            Arc::clone(&lease),
            self.prefix.clone(),
            shard.clone(),
            Rc::clone(&self.factory),
        )
        .settings(self.settings.clone())
        .start();
        tracing::info!(prefix = %self.prefix, %shard, "hosting the shard under its own lease");
        self.hosted.insert(shard, Hosted { lease, manager });
    }
}

impl<A: Actor<Context = Context<A>>, L: Lease> Actor for ShardRegion<A, L> {
    type Context = Context<Self>;

    /// Shuts every hosted shard down (entities stop, leases are released) before stopping.
    fn stopping(&mut self, ctx: &mut Context<Self>) -> Running {
        if self.hosted.is_empty() {
            return Running::Stop;
        }
        let managers: Vec<_> = std::mem::take(&mut self.hosted)
            .into_values()
            .map(|h| h.manager)
            .collect();
        let prefix = self.prefix.clone();
        ctx.wait(
            async move {
                for (i, answer) in join_all(managers.iter().map(|m| m.send(Shutdown)))
                    .await
                    .into_iter()
                    .enumerate()
                {
                    if !matches!(answer, Ok(Ok(true))) {
                        tracing::warn!(%prefix, shard = i, ?answer, "a hosted shard's lease was not released on stop");
                    }
                }
            }
            .into_actor(self)
            .map(|_, _, ctx: &mut Context<Self>| ctx.stop()),
        );
        Running::Continue
    }
}

impl<A: Actor<Context = Context<A>>, L: Lease> Handler<HostShard> for ShardRegion<A, L> {
    type Result = ();

    fn handle(&mut self, msg: HostShard, _: &mut Context<Self>) {
        self.host(msg.shard);
    }
}

impl<A: Actor<Context = Context<A>>, L: Lease> Handler<HandOffShard> for ShardRegion<A, L> {
    type Result = ResponseFuture<Result<bool, LeaseError>>;

    fn handle(&mut self, HandOffShard(shard): HandOffShard, _: &mut Context<Self>) -> Self::Result {
        let Some(hosted) = self.hosted.remove(&shard) else {
            return Box::pin(async { Ok(true) });
        };
        let prefix = self.prefix.clone();
        Box::pin(async move {
            let released = hosted.manager.send(Shutdown).await.unwrap_or(Ok(true));
            tracing::info!(%prefix, %shard, ?released, "shard handed off");
            released
        })
    }
}

impl<A: Actor<Context = Context<A>>, L: Lease> Handler<GetHostedShards> for ShardRegion<A, L> {
    type Result = Vec<RunningShard>;

    fn handle(&mut self, _: GetHostedShards, _: &mut Context<Self>) -> Vec<RunningShard> {
        self.hosted
            .iter()
            .filter_map(|(shard, hosted)| {
                Some(RunningShard {
                    shard: shard.clone(),
                    fencing_token: hosted.lease.fencing_token()?,
                })
            })
            .collect()
    }
}
