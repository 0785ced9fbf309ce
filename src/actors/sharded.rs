//! [`ShardedWorkers`]: N numbered workers across a fleet, each exactly once, spread evenly over the live nodes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use tokio::time::Instant;

use super::member::Member;
use super::singleton::{
    ClusterSingletonManager, HandOverTo, HandoverTarget, SetEligible, Shutdown, SingletonInfo,
    SingletonSettings,
};
use crate::group::{GroupRecord, GroupSnapshot, GroupWatch};
use crate::lease::{FencingToken, Lease, LeaseError};
use crate::metrics::{self, LeaseLabel};
use crate::placement::Placer;
use crate::tenure::{Tenure, TenureGuard};

mod handed;
mod leaving;
mod locate;
mod on_time;
mod settings;
mod view;

pub use locate::{GetShardDirectory, LocateError, LocateShard, ShardDirectory, ShardLocation};
pub use settings::{
    ShardedError, ShardedSettings, DEFAULT_LEAVE_GRACE, DEFAULT_MAX_CLAIMS_IN_FLIGHT,
    DEFAULT_MAX_HANDOVERS, DEFAULT_SHUTDOWN_HANDOVERS,
};

/// What separates a group's name from the rest of its leases' names: a group name never contains
/// it, so that two groups' lease names never collide.
const GROUP_SEPARATOR: char = '.';

/// What follows the separator in a member lease's name (a shard id never starts with it).
const MEMBER_INFIX: &str = "member.";

/// The lease name of shard `shard` of group `group`: `<group>.<shard>`.
///
/// A group's lease names (its shards' and its members') all start with `<group>.`, and a group
/// name never contains a `.`, so the leases of two groups never share a name: a group's name is
/// everything before the first `.` of each of its lease names.
pub fn shard_lease_name(group: &str, shard: &str) -> String {
    format!("{group}{GROUP_SEPARATOR}{shard}")
}

/// The lease name of the member lease of node `owner` in group `group`:
/// `<group>.member.<owner>` (a shard id never starts with `member.`). See [`shard_lease_name`].
pub fn member_lease_name(group: &str, owner: &str) -> String {
    format!("{group}{GROUP_SEPARATOR}{MEMBER_INFIX}{owner}")
}

/// The live member a record of the member prefix `prefix` shows at `now` (and `wall`, see
/// [`GroupRecord::live_member`]): a member lease is named after its holder (`<prefix><owner>`,
/// held by `<owner>`), so a record whose live holder is not the name's suffix (a lease someone
/// else named so, held by a node of its own) is no member.
fn live_member<'a>(
    prefix: &str,
    name: &'a str,
    record: &'a GroupRecord,
    now: Instant,
    wall: SystemTime,
) -> Option<&'a str> {
    let owner = name.strip_prefix(prefix)?;
    (record.live_member(now, wall)? == owner).then_some(owner)
}

/// What a shard's worker learns when it is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// The group.
    pub group: String,
    /// The shard id.
    pub shard: String,
    /// The shard's lease name (`<group>.<shard>`, [`shard_lease_name`]).
    pub lease_name: String,
    /// This node's owner identity.
    pub owner: String,
    /// The fencing token of the tenure the worker runs under: pass it with every write.
    pub fencing_token: FencingToken,
    /// The guard of that tenure: check it before every step; it turns `false` before any other
    /// node can take the shard.
    pub guard: TenureGuard,
    /// How many times the worker was restarted within this tenure.
    pub restart: u32,
}

/// Ask [`ShardedWorkers`] which shards run on this node.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Vec<RunningShard>")]
pub struct GetShards;

/// A shard whose tenure this node holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningShard {
    /// The shard id.
    pub shard: String,
    /// The fencing token of the tenure its worker runs under.
    pub fencing_token: FencingToken,
}

/// Ask [`ShardedWorkers`] for its [`GroupView`]: who runs what, as this node sees it.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "GroupView")]
pub struct GetGroupView;

/// Who runs what in a group, as one node sees it (from its group watch, no request).
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
pub struct GroupView {
    /// Whether the group watch has listed the group yet (before that, the view is empty).
    pub synced: bool,
    /// The live members, by owner identity (a member marked leaving, [`GroupRecord::leaving`], is
    /// none: nothing is placed on it).
    pub members: Vec<String>,
    /// Per shard id, its live holder.
    pub holders: BTreeMap<String, Option<String>>,
    /// Per shard id, its target member under the current view.
    pub targets: BTreeMap<String, Option<String>>,
    /// Shards this node is handing over (released or releasing, not yet seen claimed).
    pub handing_over: Vec<String>,
    /// Shards this node keeps a lease and a manager for: the ones it targets, holds or is
    /// handing over. The group's other shards cost it nothing but their record in the group
    /// watch.
    pub managed: Vec<String>,
}

/// Internal: the group watch delivered a change, or a record may have expired.
#[derive(Message)]
#[rtype(result = "()")]
struct Reconcile;

pub(super) type WorkerFactory<A> = Rc<dyn Fn(&ShardInfo, &mut Context<A>) -> A>;

/// Builds this node's lease of a name (the member lease, or a shard's when the node needs it).
type LeaseFor<L> = Box<dyn Fn(&str) -> Result<L, ShardedError>>;

struct Shard<A: Actor<Context = Context<A>>, L: Lease> {
    id: String,
    /// The lease name, `<group>.<id>`.
    name: String,
    /// The shard's lease and manager exist only while this node needs them: from when it first
    /// targets the shard until it neither targets nor holds it (they are then shut down and
    /// dropped), so that a node's memory grows with the shards it runs, not with the group.
    lease: Option<Arc<L>>,
    manager: Option<Addr<ClusterSingletonManager<A, L>>>,
    /// The manager was told to shut down; lease and manager are dropped once it answered.
    retiring: bool,
    /// Whether this node competes for the shard (what its manager was told, or is told when it
    /// starts).
    eligible: bool,
    /// Whether the tenure was alive at the last reconcile (to count moves).
    was_held: bool,
    /// Whether the tenure was alive when the running reconcile read it ([`Shard::look`]): a
    /// reconcile reads each tenure once, not at each of its steps (a read is a lock and a clock
    /// read; at 100 held shards the repeated reads cost a fifth of a reconcile with nothing to
    /// do: `benches/simulation.rs`).
    held_at_look: bool,
    /// The fencing token of the latest tenure this node had of the shard: a record naming this
    /// node with a newer token was handed to it ([`Lease::hand_over`]).
    last_token: Option<FencingToken>,
}

impl<A: Actor<Context = Context<A>>, L: Lease> Shard<A, L> {
    fn held(&self) -> bool {
        self.lease.as_ref().is_some_and(|lease| lease.check_alive())
    }

    /// Reads the tenure for the running reconcile, at its instant `now`: whether it is alive
    /// ([`held_seen`](Self::held_seen)), and its token, the latest this node had. Returns the
    /// deadline of the tenure alive.
    fn look(&mut self, now: Instant) -> Option<Instant> {
        let tenure = (self.lease.as_ref()).and_then(|lease| lease.tenure().current_at(now));
        self.held_at_look = tenure.is_some();
        self.last_token = self.last_token.max(tenure.map(|t| t.token()));
        tenure.map(|t| t.deadline())
    }

    /// Whether the tenure was alive when the running reconcile read it ([`look`](Self::look)).
    /// A reconcile is one step of the actor: no tenure of this node starts within it, and one
    /// that ends within it is seen ended by its manager and its worker's guard, which act on it.
    fn held_seen(&self) -> bool {
        self.lease.is_some() && self.held_at_look
    }
}

/// Runs a group of numbered workers across the fleet, each exactly once, spread evenly over the
/// live nodes (Akka's Sharded Daemon Process, on leases).
///
/// # The model
///
/// * **A lease per shard.** Shard `s` of group `g` is guarded by its own lease `g.s`
///   ([`shard_lease_name`]). A node runs
///   the worker of a shard only under that lease's tenure, with every rule of
///   [`ClusterSingletonManager`] (each shard *is* one, inside): the worker gets the tenure's guard
///   and fencing token, is stopped before the deadline, bounded by `stop_timeout`, restarted
///   within a budget, and the lease is released only after the worker has stopped. Exclusivity is
///   the lease's, whatever the nodes believe about each other.
/// * **Membership through the store.** Each node holds a member lease `g.member.<node>`
///   ([`member_lease_name`]) for as long as it runs, taken once its group watch has listed the
///   group (so that it can compute its targets and compete as soon as the others count it); the
///   live members are the holders of the member leases whose claims have not expired, each
///   holding the one named after it, seen from one [`GroupWatch`] of the whole group (one list
///   and one watch, no request per member per interval); a member record whose own writer's end
///   of claim has passed on this node's wall clock is no member for placement either
///   ([`GroupRecord::live_member`](crate::GroupRecord::live_member): a node that just started or
///   resumed receives a long-dead member's record as if it were new). A node that crashes drops out when its member lease expires; a node
///   shutting down gives its member lease up first, for good ([`Lease::retire`]: on Kubernetes
///   its object is deleted, so that identities that change on every rollout leave no objects
///   behind).
/// * **Placement without a coordinator.** Every node computes the same targets from the same
///   view with [`place`](crate::place) (rendezvous hashing with ±1 quotas that keeps what members
///   hold). A node competes for its target shards (it takes one as soon as it is free: the lease's
///   watch wakes it, no polling) and hands over a shard whose target is another live node: it
///   stops the worker and releases the lease, and the target, already waiting, claims it within a
///   round trip. At most [`ShardedSettings::max_handovers`] handovers of a node are in flight at
///   once (released and not yet seen claimed by their target), so a join never empties a node at
///   once. A dead member's shards go only to members that can claim them on time: whose watch
///   received the record deciding their expiry as it was written, preferring members heard from
///   lately (Kubernetes; see [`Placer::place_where`](crate::Placer::place_where) and the
///   `watching-since` annotation: a node that joined a moment before would wait a TTL from its
///   own first sight of that record).
/// * **A node pays for the shards it runs, not for the group.** A shard's lease and manager are
///   built when the node first targets the shard, and shut down and dropped once it neither
///   targets nor holds it (after a handover, once the target holds it): the group's other shards
///   cost a node only their record in the group watch ([`GroupView::managed`] lists the others).
/// * **Disagreement costs balance, never exclusivity.** While a membership change propagates, two
///   nodes may both target a shard for a moment (the lease lets one in) or neither (the shard
///   waits until the views agree).
///
/// # Names
///
/// A group's leases are `<group>.<shard>` and `<group>.member.<owner>`. A group name never
/// contains a `.` and a shard id never starts with `member.` (both refused at construction), so
/// no two leases of one group, nor of two groups, share a name: one group's
/// [`retire`](Lease::retire) of a member lease can never delete an object another group uses.
/// Keep other leases out of a group's names (`<group>.*`).
///
/// # Shutdown
///
/// [`Shutdown`] retires the member lease first (the others re-target this node's shards and
/// start waiting for them), then shuts the shards down [`ShardedSettings::shutdown_handovers`]
/// (128) at a time: each one's worker stops, then its lease is handed to the node that targets
/// it, which takes it up at once; a worker that is slow to stop delays its own shard only. On
/// etcd the handovers sent together go in a few transactions (up to 128 keys each), not one
/// per shard.
///
/// With bound shard leases ([`ShardedSettings::bind_shards`], the default) [`Shutdown`] stops
/// every worker first, all at once, each under its tenure, then retires the member lease
/// handing every shard on to the node its placement targets ([`Lease::retire_handing`]): on
/// Kubernetes the one write that releases the member object lists each shard with its target,
/// which claims it at once without waiting for any expiry (one write names every target of a
/// node holding 256 shards; each target's claim is a compare-and-swap of its own,
/// BENCHMARKS.md); elsewhere that write frees the shards and their targets claim them. That
/// write waits for the workers at most [`ShardedSettings::leave_grace`]: past it, the node marks
/// its member record leaving ([`Lease::mark_leaving`]: the others place nothing on it any
/// more), hands each shard whose worker stopped over on its own write, passes on the shards
/// handed to it meanwhile, and hands each slower worker's shard over as soon as that worker
/// stopped (at most [`SingletonSettings::stop_timeout`]), then retires the member lease: a slow
/// worker keeps only its own shard.
///
/// # Example
///
/// ```
/// use actix::prelude::*;
/// use actix_coordination::prelude::*;
/// use actix_coordination::{GetShards, ShardInfo, ShardedWorkers};
///
/// struct Partition;
/// impl Actor for Partition {
///     type Context = Context<Self>;
/// }
///
/// # #[actix::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let node = "node-1";
/// let workers = ShardedWorkers::with_count(
///     "ingest",
///     8,
///     move |name: &str| store.lease(LeaseSettings::new(name, node).unwrap()),
///     |shard: &ShardInfo, _ctx| Partition,
/// )?
/// .start();
/// # tokio::time::sleep(std::time::Duration::from_millis(100)).await;
/// let running = workers.send(GetShards).await?;
/// assert_eq!(running.len(), 8);                  // alone in the group: every shard runs here
/// workers.send(Shutdown).await??;
/// # Ok(()) }
/// ```
pub struct ShardedWorkers<A: Actor<Context = Context<A>>, L: Lease> {
    group: String,
    node: String,
    member_prefix: String,
    member_lease: Arc<L>,
    member: Option<Addr<ClusterSingletonManager<Member, L>>>,
    shards: Vec<Shard<A, L>>,
    lease_for: LeaseFor<L>,
    /// The member lease's TTL: how long a handover counts at most.
    ttl: Duration,
    /// The member lease's renewal interval (when a member counts as quiet: see `on_time`).
    renewal: Duration,
    factory: WorkerFactory<A>,
    settings: ShardedSettings,
    watch: GroupWatch,
    handing_over: HashMap<usize, Instant>,
    wake: Option<SpawnHandle>,
    /// Shards handed here being taken up: the fold of the change waits for them (`handed.rs`).
    taking_up: handed::TakingUp,
    /// The expired member tenures this node planned a hand-on for (`handed.rs`).
    hand_on_planned: HashMap<String, String>,
    /// A reconcile planned after a shard's lease could not be built, and the pause before the
    /// next such one.
    retry: Option<SpawnHandle>,
    retry_backoff: Option<Duration>,
    shutting_down: bool,
    /// The shutdown's progress (see [`Shutdown`]'s handler).
    leaving: leaving::Leaving,
    /// Bounds the shard claims in flight ([`ShardedSettings::max_claims_in_flight`]).
    claim_gate: Arc<tokio::sync::Semaphore>,
    /// What health checks read of this node ([`health`](Self::health)).
    health: Arc<crate::health::ShardedHealth>,
    label: LeaseLabel,
    /// What the `shards_held` gauge was last moved to by this node.
    held_reported: usize,
    /// The group as this node sees it, folded change by change, and what the next reconcile
    /// looks at.
    view: view::View,
    /// The placement's memory (the ideal assignment of the last members).
    placer: Placer,
    /// Where each shard runs, for request handlers: shares the watch, and the tenures of the
    /// shards this node has a lease of (kept here as leases are built and dropped).
    directory: locate::ShardDirectory,
}

impl<A: Actor<Context = Context<A>>, L: Lease> ShardedWorkers<A, L> {
    /// Shards `"0"` to `count - 1` of `group`; see [`new`](Self::new).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_count(
        group: impl Into<String>,
        count: usize,
        lease_for: impl Fn(&str) -> L + 'static,
        factory: impl Fn(&ShardInfo, &mut Context<A>) -> A + 'static,
    ) -> Result<Self, ShardedError> {
        Self::new(group, (0..count).map(|i| i.to_string()), lease_for, factory)
    }

    /// The workers of `group` with these shard ids on this node. `lease_for(name)` builds this
    /// node's lease named `name` (every lease with the same owner identity: the node's), for the
    /// member lease `<group>.member.<owner>` and each shard's `<group>.<shard>`; `factory` builds
    /// the worker of a shard whenever this node starts one.
    ///
    /// The member lease and the first shard's lease are built here, to check their names and
    /// owner (the first shard's is dropped at once), and every shard's lease name is checked: a
    /// shard's lease is built when the node targets the shard, and dropped when it neither
    /// targets nor holds it any more (see the type's docs). Build them on one shared
    /// session or provider (the default), so that building one is cheap.
    ///
    /// Call it inside the runtime that will run the actors (the group watch starts here).
    ///
    /// # Errors
    ///
    /// [`ShardedError`] for an empty group, no shards, an invalid or repeated shard id, a
    /// factory that builds the wrong lease, or a backend that cannot watch the group.
    pub fn new(
        group: impl Into<String>,
        shards: impl IntoIterator<Item = impl Into<String>>,
        lease_for: impl Fn(&str) -> L + 'static,
        factory: impl Fn(&ShardInfo, &mut Context<A>) -> A + 'static,
    ) -> Result<Self, ShardedError> {
        Self::build(
            group.into(),
            shards.into_iter().map(Into::into).collect(),
            Box::new(move |name: &str| Ok(lease_for(name))),
            Rc::new(factory),
        )
    }

    fn build(
        group: String,
        ids: Vec<String>,
        lease_for: LeaseFor<L>,
        factory: WorkerFactory<A>,
    ) -> Result<Self, ShardedError> {
        if group.is_empty() {
            return Err(ShardedError::EmptyGroup);
        }
        if group.contains(GROUP_SEPARATOR) {
            return Err(ShardedError::InvalidGroup { group });
        }
        if ids.is_empty() {
            return Err(ShardedError::NoShards { group });
        }
        let mut seen = BTreeSet::new();
        for id in &ids {
            let reason = if id.is_empty() {
                Some("empty")
            } else if id.starts_with(MEMBER_INFIX) {
                Some("`member.` starts the names of the member leases")
            } else if !seen.insert(id.as_str()) {
                Some("repeated")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(ShardedError::InvalidShard {
                    group,
                    shard: id.clone(),
                    reason,
                });
            }
        }
        // The first shard's lease names the node: its owner is the owner every lease must have.
        // The others' names are checked as lease names, without building their leases (a node
        // of a 10,000-shard group built 10,000 leases to drop them at once): a factory that
        // builds a wrong lease for one of them is found when the node first needs it (logged,
        // and tried again on a backoff).
        let first = lease_for(&shard_lease_name(&group, &ids[0]))?;
        let node = first.owner().to_owned();
        check_lease(&shard_lease_name(&group, &ids[0]), &first, &node)?;
        drop(first);
        let mut shards = Vec::with_capacity(ids.len());
        for id in ids {
            let name = shard_lease_name(&group, &id);
            if let Err(source) = crate::settings::LeaseSettings::new(name.as_str(), node.as_str()) {
                return Err(ShardedError::InvalidLeaseName { name, source });
            }
            shards.push(Shard {
                id,
                name,
                lease: None,
                manager: None,
                retiring: false,
                eligible: false,
                was_held: false,
                held_at_look: false,
                last_token: None,
            });
        }
        let member_prefix = member_lease_name(&group, "");
        let member_name = member_lease_name(&group, &node);
        let member_lease = lease_for(&member_name)?;
        check_lease(&member_name, &member_lease, &node)?;
        let member_lease = Arc::new(member_lease);
        let watch = member_lease
            .watch_group(&format!("{group}{GROUP_SEPARATOR}"))
            .map_err(|source| ShardedError::Watch {
                group: group.clone(),
                source,
            })?;
        let label = LeaseLabel::new(&group);
        metrics::sharded_registered(&label);
        let view = view::View::new(shards.iter().map(|shard| shard.name.as_str()));
        let ids = shards.iter().map(|shard| shard.id.clone()).collect();
        let directory = locate::ShardDirectory::new(&group, &node, ids, watch.clone());
        let health = Arc::new(crate::health::ShardedHealth::new(&group, &member_name));
        Ok(Self {
            ttl: member_lease.settings().ttl(),
            renewal: member_lease.settings().renewal_interval(),
            group,
            node,
            member_prefix,
            member_lease,
            member: None,
            shards,
            lease_for,
            factory,
            settings: ShardedSettings::default(),
            watch,
            handing_over: HashMap::new(),
            wake: None,
            taking_up: handed::TakingUp::default(),
            hand_on_planned: HashMap::new(),
            retry: None,
            retry_backoff: None,
            shutting_down: false,
            leaving: leaving::Leaving::default(),
            claim_gate: Arc::new(tokio::sync::Semaphore::new(DEFAULT_MAX_CLAIMS_IN_FLIGHT)),
            health,
            label,
            held_reported: 0,
            view,
            placer: Placer::default(),
            directory,
        })
    }

    /// Starts the manager of shard `index` (building its lease), eligible: the node targets it.
    /// A lease that cannot be built (a provider's backend failing) is logged, and the shard tried
    /// again after a backoff (from the shard settings' `retry_delay`, 1 s by default, doubling up
    /// to their `max_error_backoff`), not only at the group's next change: a quiet group (etcd
    /// sends nothing while nobody writes) would leave it unrun for good.
    fn start_manager(&mut self, index: usize, ctx: &mut Context<Self>) {
        let shard = &self.shards[index];
        let lease = match &shard.lease {
            Some(lease) => Arc::clone(lease),
            None => match self.build_lease(index) {
                Ok(lease) => {
                    self.retry_backoff = None;
                    Arc::new(lease)
                }
                Err(error) => {
                    let pause = self.retry_backoff.unwrap_or_else(|| {
                        self.settings
                            .shard
                            .retry_delay
                            .unwrap_or(Duration::from_secs(1))
                            .max(Duration::from_millis(100))
                    });
                    tracing::warn!(group = %self.group, shard = %shard.id, error = &error as &dyn std::error::Error, retry_in = ?pause, "cannot build the shard's lease: not competing for it yet");
                    self.shards[index].eligible = false;
                    self.view.unstarted.insert(index);
                    self.retry_backoff =
                        Some((pause * 2).min(self.settings.shard.max_error_backoff.max(pause)));
                    if self.retry.is_none() {
                        self.retry = Some(ctx.run_later(pause, |act, ctx| {
                            act.retry = None;
                            act.reconcile(ctx);
                        }));
                    }
                    return;
                }
            },
        };
        let manager = shard_manager(
            Arc::clone(&lease),
            self.group.clone(),
            shard.id.clone(),
            Rc::clone(&self.factory),
        )
        .settings(self.shard_settings())
        .claim_gate(Arc::clone(&self.claim_gate))
        .start();
        // Every start and end of the tenure reaches `reconcile`, as the group watch's changes do:
        // the watch may show a claim before the tenure is recorded here, and on etcd a quiet
        // group sends nothing after it. The stream ends when the lease is dropped.
        // Each item names the shard: the next look reads this tenure again (`Shard::look`).
        ctx.add_stream(futures_util::StreamExt::map(
            lease.tenure().stream(),
            move |_| ShardTenureChanged(index),
        ));
        self.directory.hold(index, lease.tenure().clone());
        let shard = &mut self.shards[index];
        shard.held_at_look = false;
        self.view.tenure_changed(index);
        shard.lease = Some(lease);
        shard.manager = Some(manager);
        self.view.watched.insert(index);
    }

    /// Builds the lease of shard `index`, bound to the member lease where the backend binds (one
    /// write per node per interval); a backend that cannot bind renews the shard lease itself.
    fn build_lease(&self, index: usize) -> Result<L, ShardedError> {
        let shard = &self.shards[index];
        let lease = (self.lease_for)(&shard.name)
            .and_then(|lease| check_lease(&shard.name, &lease, &self.node).map(|()| lease))?;
        if let Some(anchor) = self
            .member_lease
            .binding_anchor()
            .filter(|_| self.settings.bind_shards)
        {
            if let Err(error) = lease.bind_to(&anchor) {
                tracing::warn!(group = %self.group, shard = %shard.name, error = &error as &dyn std::error::Error, "cannot bind the shard's lease to the member lease; it renews on its own");
            }
        }
        Ok(lease)
    }

    /// Shuts down the manager of a shard this node neither targets nor holds, then drops it and
    /// the lease (starting them again if the node targets the shard by then).
    fn retire(&mut self, index: usize, ctx: &mut Context<Self>) {
        let shard = &mut self.shards[index];
        let Some(manager) = shard.manager.clone() else {
            return;
        };
        shard.retiring = true;
        tracing::debug!(group = %self.group, shard = %shard.id, "neither targeted nor held here: dropping the shard's lease and manager");
        ctx.spawn(actix::fut::wrap_future(manager.send(Shutdown)).map(
            move |answer, act: &mut Self, ctx: &mut Context<Self>| {
                if let Ok(Err(error)) = &answer {
                    tracing::warn!(group = %act.group, shard = %act.shards[index].id, error = error as &dyn std::error::Error, "the retired shard's manager reported an error");
                }
                let shard = &mut act.shards[index];
                shard.retiring = false;
                shard.manager = None;
                shard.lease = None;
                act.directory.drop_lease(Some(index));
                if shard.eligible && !act.shutting_down {
                    act.start_manager(index, ctx);
                }
                act.reconcile(ctx);
            },
        ));
    }

    /// Replaces the settings once they are valid.
    ///
    /// # Errors
    ///
    /// [`ShardedError::NoHandovers`] when `max_handovers` is 0,
    /// [`ShardedError::NoShutdownHandovers`] when `shutdown_handovers` is 0,
    /// [`ShardedError::NoClaimsInFlight`] when `max_claims_in_flight` is 0,
    /// [`ShardedError::Settings`] when the shard settings are invalid
    /// ([`SingletonSettings::validate`]).
    pub fn settings(mut self, settings: ShardedSettings) -> Result<Self, ShardedError> {
        if settings.max_handovers == 0 {
            return Err(ShardedError::NoHandovers);
        }
        if settings.shutdown_handovers == 0 {
            return Err(ShardedError::NoShutdownHandovers);
        }
        if settings.max_claims_in_flight == 0 {
            return Err(ShardedError::NoClaimsInFlight);
        }
        self.claim_gate = Arc::new(tokio::sync::Semaphore::new(settings.max_claims_in_flight));
        settings.shard.validate().map_err(ShardedError::Settings)?;
        self.settings = settings;
        Ok(self)
    }

    /// Reports to `check`: its readiness fails until this node has listed its group and held its
    /// member lease once (the others then count it as a member and place shards on it), and
    /// once it begins to leave (a [`Shutdown`]); its liveness watches the member lease like one
    /// added with [`HealthCheck::add_lease`](crate::HealthCheck::add_lease). The registration
    /// lasts as long as this actor. See [`HealthCheck`](crate::HealthCheck): "Sharded workers".
    pub fn health(self, check: &crate::HealthCheck) -> Self {
        check.add_lease(&self.member_lease);
        check.add_sharded(&self.health);
        self
    }

    fn shard_settings(&self) -> SingletonSettings {
        SingletonSettings {
            handle_signals: false,
            ..self.settings.shard.clone()
        }
    }

    /// Who holds each shard: this node for the shards it holds, else the live holder in the
    /// view (a record naming this node whose tenure is not alive here is over, or ending).
    fn holders(&self, snapshot: &GroupSnapshot, now: Instant) -> Vec<Option<String>> {
        self.shards
            .iter()
            .map(|shard| {
                if shard.held() {
                    return Some(self.node.clone());
                }
                snapshot
                    .live_holder(&shard.name, now)
                    .filter(|holder| *holder != self.node)
                    .map(str::to_owned)
            })
            .collect()
    }

    /// The live members other than this node in `snapshot` at `now`, sorted (see
    /// [`live_member`]), but those marked leaving ([`GroupRecord::leaving`]: no placement
    /// targets a node that shuts down).
    fn other_members(
        &self,
        snapshot: &GroupSnapshot,
        now: Instant,
        wall: SystemTime,
    ) -> Vec<String> {
        snapshot
            .with_prefix(&self.member_prefix)
            .filter(|(_, record)| !record.leaving)
            .filter_map(|(name, record)| live_member(&self.member_prefix, name, record, now, wall))
            .filter(|member| *member != self.node)
            .map(str::to_owned)
            .collect()
    }

    /// The target of every shard (an index into `members`) for these members and holders, an
    /// orphan only on a member that can claim it on time (see the `on_time` module).
    fn place(
        &mut self,
        members: &[String],
        holders: &[Option<String>],
        on_time: &on_time::OnTime,
    ) -> Vec<Option<usize>> {
        let by_id: HashMap<&str, &str> = self
            .shards
            .iter()
            .zip(holders)
            .filter_map(|(shard, holder)| Some((shard.id.as_str(), holder.as_deref()?)))
            .collect();
        let ids: Vec<&str> = self.shards.iter().map(|s| s.id.as_str()).collect();
        self.placer.place_where(
            &ids,
            members,
            |id| by_id.get(id).copied(),
            |shard, member| on_time.may_take(shard, member),
        )
    }

    /// `owner` as a handover target: it counts while its member record is live in its name.
    fn handover_target(&self, owner: &str) -> HandoverTarget {
        HandoverTarget::member(
            owner,
            self.watch.clone(),
            format!("{}{owner}", self.member_prefix),
        )
    }

    /// Moves the `shards_held` gauge to `held` for this node.
    fn report_held(&mut self, held: usize) {
        let delta = held as f64 - self.held_reported as f64;
        if delta != 0.0 {
            metrics::shards_held(&self.label, delta);
        }
        self.held_reported = held;
    }

    fn set_eligible(&mut self, index: usize, eligible: bool, ctx: &mut Context<Self>) {
        let shard = &mut self.shards[index];
        if shard.eligible == eligible {
            return;
        }
        shard.eligible = eligible;
        tracing::debug!(group = %self.group, shard = %shard.id, eligible, "shard eligibility changed");
        if shard.retiring {
            return; // started again once retired, if still eligible then
        }
        match &shard.manager {
            Some(manager) => {
                if eligible {
                    // Targeted here again: a release after this one is a plain one.
                    manager.do_send(HandOverTo(None));
                }
                manager.do_send(SetEligible(eligible))
            }
            None if eligible => self.start_manager(index, ctx),
            None => {}
        }
    }

    /// Brings what this node competes for in line with the targets; see the module docs.
    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        if self.shutting_down {
            self.pass_on_while_leaving(ctx);
            return;
        }
        // A `trace` span, free unless a subscriber enables it: `benches/simulation.rs` times each
        // node's reconciles with it (100 nodes × 10,000 shards, BENCHMARKS.md).
        let _span =
            tracing::trace_span!("reconcile", group = %self.group, node = %self.node).entered();
        if let Some(handle) = self.wake.take() {
            ctx.cancel_future(handle);
        }
        let snapshot = self.watch.snapshot();
        if !snapshot.is_synced() {
            return; // the watch's listing will send a change
        }
        if self.member.is_none() {
            // Join only now: the others target a member as soon as its member lease shows, so a
            // node must be able to compute its targets and compete by then (a new process that
            // joined before its watch had listed the group left the shards targeted to it idle
            // for seconds after a graceful stop of another node: the sharded chaos runs).
            tracing::info!(group = %self.group, node = %self.node, "the group is listed: joining");
            (self.health.listed).store(true, std::sync::atomic::Ordering::Release);
            self.member = Some(
                ClusterSingletonManager::from_arc(Arc::clone(&self.member_lease), |_, _| Member)
                    .settings(self.shard_settings())
                    .retire_on_shutdown()
                    .start(),
            );
        }
        // Shards handed to this node by a member that just left start competing first, and the
        // fold of the whole change (a look of every shard: at 4,096 shards several ms of CPU, as
        // on every other node at the same moment) waits until they are taken up, within a bound.
        let handing = self.members_handing_on(&snapshot);
        self.start_handed(&snapshot, &handing, ctx);
        if self.fold_waits_for_handed(ctx) {
            return;
        }
        let now = Instant::now();
        // The view, folded from the records that changed since the last look (or from every
        // record when it cannot tell what changed: `view.rs`), with this node's tenures read
        // once (`Shard::look`: the rest of this reconcile reads `held_seen`); the shards to look at are those
        // for which the walk of every shard could do anything (`View::take_visits`).
        self.refresh_view(&snapshot, now);
        // Before this fold starts claims: a claim that ends an expired member's record hands its
        // shards on in the same write.
        self.plan_hand_on_expired(&snapshot, now);
        let visits = self.view.take_visits(self.shards.len());
        #[cfg(debug_assertions)]
        self.check_view(&snapshot, now, &visits);
        let mut candidates = Vec::new();
        for index in visits {
            let target = self.view.targets[index];
            let held = self.shards[index].held_seen();
            // A record handed to this node (newer than any tenure it had) that it does not
            // hold: take it up, so that it neither stays held in this node's name nor goes
            // unrun (the node that handed it over may have placed it differently), even while
            // this node sees no member at all (its own member lease not yet, or no longer,
            // held); if it is targeted elsewhere, it is then handed over again like any other.
            let handed_here = !held && self.handed_here_among(index, &snapshot, now, &handing);
            let Some(target) = target else {
                if handed_here {
                    self.set_eligible(index, true, ctx);
                }
                continue; // no member at all: leave everything else as it is
            };
            if Some(target) == self.view.me || handed_here {
                self.handing_over.remove(&index);
                self.set_eligible(index, true, ctx);
            } else if held && self.shards[index].eligible {
                candidates.push(index);
            } else if !held {
                self.set_eligible(index, false, ctx);
            }
        }
        // Handovers in flight end when the shard is seen held by another node, or after a TTL.
        let node = &self.node;
        let label = &self.label;
        let ttl = self.ttl;
        let holders = &self.view.holders;
        self.handing_over.retain(|&index, since| {
            let taken = holders[index].as_ref().is_some_and(|h| h != node);
            if taken {
                metrics::shard_handover(label, now.saturating_duration_since(*since));
            }
            !taken && now < *since + ttl
        });
        // Count the shards this node stopped holding since the last look, and what it holds
        // (only a watched shard has a lease, or was held at the last count).
        let mut held_now = 0;
        for &index in &self.view.watched {
            let shard = &mut self.shards[index];
            let held = shard.held_seen();
            held_now += usize::from(held);
            if shard.was_held && !held {
                let reason = if self.handing_over.contains_key(&index) || !shard.eligible {
                    "rebalance"
                } else {
                    "lost"
                };
                metrics::shard_moved(&self.label, reason, 1);
            }
            shard.was_held = held;
        }
        let shards = &self.shards;
        self.view.watched.retain(|&index| {
            let shard = &shards[index];
            shard.lease.is_some() || shard.manager.is_some() || shard.was_held
        });
        self.report_held(held_now);
        // Drop what this node no longer needs: shards it neither targets nor holds (nor is
        // handing over).
        let idle: Vec<usize> = (self.view.watched.iter().copied())
            .filter(|&index| {
                let shard = &self.shards[index];
                shard.manager.is_some()
                    && !shard.retiring
                    && !shard.eligible
                    && !shard.held()
                    && !self.handing_over.contains_key(&index)
            })
            .collect();
        for index in idle {
            self.retire(index, ctx);
        }
        for index in candidates {
            if self.handing_over.len() >= self.settings.max_handovers {
                break;
            }
            let target = self.view.targets[index].map(|t| self.view.members[t].clone());
            tracing::info!(group = %self.group, shard = %self.shards[index].id, ?target, "handing the shard over");
            if let Some(manager) = &self.shards[index].manager {
                manager.do_send(HandOverTo(
                    target.as_deref().map(|t| self.handover_target(t)),
                ));
            }
            self.set_eligible(index, false, ctx);
            self.handing_over.insert(index, now);
        }
        // Wake at the next expiry in the view, when a member's own end of claim passes (see
        // `GroupRecord::live_member`), and at the end of the oldest handover.
        let wall = SystemTime::now();
        let stale = snapshot
            .with_prefix(&self.member_prefix)
            .filter_map(|(_, record)| record.stale_after?.duration_since(wall).ok())
            .map(|left| now + left)
            .min();
        let quiet = on_time::OnTime::next_quiet(
            snapshot.with_prefix(&self.member_prefix).map(|(_, r)| r),
            (now, self.ttl, self.renewal),
        );
        let next = snapshot
            .next_expiry(now)
            .into_iter()
            .chain(stale)
            .chain(quiet)
            .chain(self.handing_over.values().map(|since| *since + self.ttl))
            .min();
        if let Some(at) = next {
            let after = at.saturating_duration_since(now) + Duration::from_millis(1);
            self.wake = Some(ctx.run_later(after, |act, ctx| act.reconcile(ctx)));
        }
    }
}

impl<A: Actor<Context = Context<A>>> ShardedWorkers<A, crate::shared::SharedLease> {
    /// Builds the group's leases with `provider` from its configuration under `config_key` (the
    /// backend, TTL and timings of every lease of the group), for `owner` (this node's identity,
    /// for example the pod name); see [`new`](Self::new).
    ///
    /// # Errors
    ///
    /// [`ShardedError::Provider`] when the provider cannot build a lease (unknown key or backend,
    /// invalid settings), and the errors of [`new`](Self::new).
    pub fn from_provider(
        provider: &crate::provider::LeaseProvider,
        config_key: &str,
        group: impl Into<String>,
        shards: impl IntoIterator<Item = impl Into<String>>,
        owner: &str,
        factory: impl Fn(&ShardInfo, &mut Context<A>) -> A + 'static,
    ) -> Result<Self, ShardedError> {
        let group = group.into();
        let maker = provider
            .maker(config_key, owner)
            .map_err(|source| ShardedError::Provider {
                lease: member_lease_name(&group, owner),
                source,
            })?;
        Self::build(
            group,
            shards.into_iter().map(Into::into).collect(),
            Box::new(move |name: &str| {
                maker.get(name).map_err(|source| ShardedError::Provider {
                    lease: name.to_owned(),
                    source,
                })
            }),
            Rc::new(factory),
        )
    }
}

/// The manager of one shard's lease, whose singleton is the shard's worker built by `factory`
/// (with the tenure's guard and token in its [`ShardInfo`]).
pub(super) fn shard_manager<A: Actor<Context = Context<A>>, L: Lease>(
    lease: Arc<L>,
    group: String,
    id: String,
    factory: WorkerFactory<A>,
) -> ClusterSingletonManager<A, L> {
    ClusterSingletonManager::from_arc(lease, move |info: &SingletonInfo, ctx: &mut Context<A>| {
        let shard = ShardInfo {
            group: group.clone(),
            shard: id.clone(),
            lease_name: info.lease_name.clone(),
            owner: info.owner.clone(),
            fencing_token: info.fencing_token,
            guard: info.guard.clone(),
            restart: info.restart,
        };
        factory(&shard, ctx)
    })
}

/// Checks that a lease built for `asked` has that name and the node's owner identity.
fn check_lease<L: Lease>(asked: &str, lease: &L, owner: &str) -> Result<(), ShardedError> {
    if lease.name() != asked || lease.owner() != owner {
        return Err(ShardedError::WrongLease {
            asked: asked.to_owned(),
            built: lease.name().to_owned(),
            owner: lease.owner().to_owned(),
            expected_owner: owner.to_owned(),
        });
    }
    Ok(())
}

impl<A: Actor<Context = Context<A>>, L: Lease> Actor for ShardedWorkers<A, L> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // The member lease is taken once the group watch has listed the group, and a shard's
        // manager is started once this node targets the shard (see `reconcile`). The start and
        // end of this node's membership count as much as the group's changes.
        ctx.add_stream(self.member_lease.tenure().stream());
        // Every change of the group reaches the actor; the task ends with it.
        let mut watch = self.watch.clone();
        let me = ctx.address().downgrade();
        actix_rt::spawn(async move {
            while watch.changed().await.is_ok() {
                match me.upgrade() {
                    Some(addr) => addr.do_send(Reconcile),
                    None => break,
                }
            }
        });
        tracing::info!(group = %self.group, node = %self.node, shards = self.shards.len(), "sharded workers started");
        self.reconcile(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.report_held(0);
        self.directory.drop_lease(None);
    }
}

/// A tenure of this node's member lease started or ended.
impl<A: Actor<Context = Context<A>>, L: Lease> StreamHandler<Option<Tenure>>
    for ShardedWorkers<A, L>
{
    fn handle(&mut self, tenure: Option<Tenure>, ctx: &mut Context<Self>) {
        if tenure.is_some() {
            (self.health.published).store(true, std::sync::atomic::Ordering::Release);
        }
        self.reconcile(ctx);
    }

    /// The lease was dropped: nothing more to follow, and nothing to stop.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

/// Internal: a tenure of shard `0`'s lease started or ended (its deadline passed included).
struct ShardTenureChanged(usize);

/// A tenure of a shard's lease started or ended: the next look reads it again.
impl<A: Actor<Context = Context<A>>, L: Lease> StreamHandler<ShardTenureChanged>
    for ShardedWorkers<A, L>
{
    fn handle(&mut self, ShardTenureChanged(index): ShardTenureChanged, ctx: &mut Context<Self>) {
        self.view.tenure_changed(index);
        self.reconcile(ctx);
    }

    /// The lease was dropped (a retired shard's): nothing more to follow, and nothing to stop.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl<A: Actor<Context = Context<A>>, L: Lease> Handler<Reconcile> for ShardedWorkers<A, L> {
    type Result = ();

    fn handle(&mut self, _: Reconcile, ctx: &mut Context<Self>) {
        self.reconcile(ctx);
    }
}

impl<A: Actor<Context = Context<A>>, L: Lease> Handler<GetShards> for ShardedWorkers<A, L> {
    type Result = Vec<RunningShard>;

    fn handle(&mut self, _: GetShards, _: &mut Context<Self>) -> Vec<RunningShard> {
        self.shards
            .iter()
            .filter_map(|shard| {
                Some(RunningShard {
                    shard: shard.id.clone(),
                    fencing_token: shard.lease.as_ref()?.fencing_token()?,
                })
            })
            .collect()
    }
}

impl<A: Actor<Context = Context<A>>, L: Lease> Handler<GetGroupView> for ShardedWorkers<A, L> {
    type Result = GroupView;

    fn handle(&mut self, _: GetGroupView, _: &mut Context<Self>) -> GroupView {
        let snapshot = self.watch.snapshot();
        if !snapshot.is_synced() {
            return GroupView::default();
        }
        self.refresh_view(&snapshot, Instant::now());
        let (members, holders, targets) =
            (&self.view.members, &self.view.holders, &self.view.targets);
        let ids = self.shards.iter().map(|s| s.id.clone());
        GroupView {
            synced: true,
            holders: ids.clone().zip(holders.iter().cloned()).collect(),
            targets: ids
                .zip(targets.iter().map(|t| t.map(|j| members[j].clone())))
                .collect(),
            handing_over: self
                .handing_over
                .keys()
                .map(|&i| self.shards[i].id.clone())
                .collect(),
            managed: self
                .shards
                .iter()
                .filter(|shard| shard.manager.is_some())
                .map(|shard| shard.id.clone())
                .collect(),
            members: members.clone(),
        }
    }
}
