//! Distributed leases for the [actix](https://docs.rs/actix) actor framework.
//!
//! A *lease* is a distributed lock with a time to live: at most one owner holds it at a time, a
//! crashed owner loses it when the TTL runs out, and a holder that can no longer prove ownership is
//! told so before anyone else can take over. Use one to run a single instance of a singleton actor
//! across a fleet, or to keep two sharding coordinators from allocating at once during a network
//! partition.
//!
//! * [`Lease`] is the contract: `acquire`, `release`, `check_alive`, `on_lost`, plus a
//!   [`FencingToken`] per tenure. Its documentation explains the semantics and the races.
//! * [`TenureWatch`] is the tenure as one observable value: every start, renewal and end (loss,
//!   deadline, a release through any handle); a [`TenureGuard`] binds code to one tenure
//!   (`check_alive`, `token`, and `ended`, which resolves at the deadline).
//! * [`LeaseSettings`] are validated at construction.
//! * Backends: [`InMemoryLease`] (always), `KubernetesLease` (feature `kubernetes`), `EtcdLease`
//!   (feature `etcd`). They all implement [`LeaseBackend`], a small trait of single steps, and get
//!   the contract from [`ManagedLease`].
//! * [`LeaseProvider`] loads leases from configuration by (name, config key, owner).
//! * The actor layer: [`LeaseActor`] (a lease driven by messages), [`ClusterSingletonManager`]
//!   (one singleton actor across a fleet, stopped on every end of its tenure),
//!   [`ShardCoordinator`] / [`CoordinatorGate`] (a coordinator that serves only under a live
//!   tenure), [`ShardRegion`] (a lease per hosted shard) and [`ShardedWorkers`] (N workers
//!   spread over the live nodes, each exactly once, membership and placement through the lease
//!   store). They never act outside a tenure they have just checked.
//! * Operations: [`HealthCheck`] (liveness and readiness the way client-go's `HealthzAdaptor`
//!   does it, and [`LeaseReport`]s for status pages), metrics through the `metrics` facade with
//!   the feature `metrics` (every one listed in [`METRICS`]), and a `lease_operation` tracing span
//!   per acquire and release. The README's "Running in production" shows them in an actix-web
//!   service (`examples/web_service.rs`) and on Kubernetes (`deploy/`).
//!
//! ```
//! use std::time::Duration;
//! use actix_coordination::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = InMemoryStore::new();
//! let settings = LeaseSettings::builder("jobs", "node-1").ttl(Duration::from_secs(15)).build()?;
//! let lease = InMemoryLease::new(settings, &store);
//! let _sub = lease.on_lost(|lost| tracing::warn!(%lost, "stop leader-only work"));
//! if lease.acquire().await? {
//!     let token = lease.fencing_token().expect("held");
//!     assert!(lease.check_alive());
//!     // ... leader-only work, passing `token` along with every write ...
//!     # let _ = token;
//!     lease.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! Items behind a cargo feature say so on their page ("Available on crate feature … only", on
//! docs.rs). The crate root lists every item; here they are by who needs them.
//!
//! # For users
//!
//! [`prelude`] holds what most programs import (every README snippet compiles with it).
//!
//! * The contract: [`Lease`] ([`acquire`](Lease::acquire), [`release`](Lease::release),
//!   [`check_alive`](Lease::check_alive), [`on_lost`](Lease::on_lost)), [`FencingToken`],
//!   [`LeaseLost`] and [`LostReason`], [`LeaseError`]; the tenure: [`TenureWatch`], [`Tenure`],
//!   [`TenureGuard`], [`TenureEnd`]; [`SharedLease`] (one lease, many handles).
//! * Leases: [`InMemoryStore`] / [`InMemoryLease`], `KubernetesLease` / `KubernetesSession` /
//!   `KubernetesSettings` (feature `kubernetes`), `EtcdLease` / `EtcdSession` / `EtcdSettings`
//!   (feature `etcd`); [`LeaseSettings`] and [`LeaseSettingsBuilder`]; from configuration:
//!   [`LeaseProvider`], [`CoordinationConfig`], [`LeaseConfig`].
//! * Actors: [`LeaseActor`] and its messages ([`Acquire`], [`Release`], [`CheckAlive`],
//!   [`GetTenure`], [`SubscribeLeaseLost`], …); [`ClusterSingletonManager`] with
//!   [`SingletonInfo`], [`SingletonSettings`], [`Shutdown`], [`SetEligible`], [`GetStatus`],
//!   [`TransferLeadership`], [`GetLeader`];
//!   [`ShardCoordinator`] with [`RegisterRegion`], [`AllocateShard`], [`HostShard`], and
//!   [`ShardRegion`] (a lease per hosted shard: [`HandOffShard`], [`GetHostedShards`]);
//!   [`ShardedWorkers`] (N workers across the fleet, each exactly once: [`ShardInfo`],
//!   [`ShardedSettings`], [`GetShards`], [`GetGroupView`]) on [`place`] and [`GroupWatch`]
//!   ([`Lease::watch_group`]); where a shard runs, on every node: [`ShardDirectory`],
//!   [`ShardLocation`], [`LocateShard`]; which shard an entity belongs to: [`shard_for`],
//!   [`ShardFunction`]; requests routed to a shard's node: `ShardRouting` (feature `web`).
//! * Operations: [`HealthCheck`] and [`LeaseReport`]; [`METRICS`], `describe_metrics` and the
//!   histogram buckets (feature `metrics`); `AdminRoutes` and `GracefulShutdown` (feature `web`).
//!
//! # For backend implementers
//!
//! A new store implements [`LeaseBackend`] (single steps: [`AcquireAttempt`], [`RenewOutcome`],
//! [`ReleaseOutcome`], errors through [`BackendError`]) and gets the whole contract from
//! [`ManagedLease`] (renewal, local deadline, tenure, [`LeaseStats`]), and group watches through
//! [`LeaseBackend::watch_group`] ([`group_channel`], [`GroupSender`], [`GroupSnapshot`],
//! [`GroupRecord`], [`GroupError`]); a [`BackendFactory`]
//! registered with [`LeaseProvider::register_backend`] makes it loadable from configuration. A
//! lease that runs its own renewal publishes its tenure with [`TenurePublisher`] /
//! [`PublishedTenure`] instead. A coordinator of your own takes its lease gate from
//! [`CoordinatorGate`] ([`Submission`], [`Queued`], [`Responder`], [`GateState`]). The crate's
//! backends are examples: [`InMemoryBackend`], `KubernetesBackend`, `EtcdBackend` (each with its
//! tenure type) and their factories. The README's "Writing a backend" has the rules.
//!
//! # Testing and fault injection
//!
//! [`InMemoryStore`] injects faults per owner or for everyone ([`InMemoryFault`]:
//! [`partition`](InMemoryStore::partition), [`pause`](InMemoryStore::pause),
//! [`set_fault`](InMemoryStore::set_fault), [`force_take`](InMemoryStore::force_take),
//! [`delete`](InMemoryStore::delete)) and shows the store as it is ([`InMemoryRecord`],
//! [`InMemoryStats`]); [`LeaseStats`] and the Kubernetes stats (`KubernetesStats`,
//! `KubernetesSessionStats`, `KubernetesWatchStats`) count requests, for tests that wait on
//! events rather than time, and for cost checks.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod actors;
mod backend;
#[cfg(any(feature = "kubernetes", feature = "etcd"))]
mod backoff;
mod binding;
mod entity;
mod finish;
mod group;
mod health;
mod lease;
mod managed;
mod memory;
mod metrics;
mod placement;
pub mod protocol;
mod provider;
mod redact;
mod settings;
mod shared;
mod tenure;
mod vocab;
#[cfg(feature = "web")]
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
mod web;
#[cfg(feature = "web-forward")]
#[cfg_attr(docsrs, doc(cfg(feature = "web-forward")))]
pub use web::ForwardSettings;
#[cfg(feature = "web")]
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
pub use web::{
    AdminRoutes, EntityId, GracefulShutdown, LeaderOnly, LeaderOnlyService, RoutedShard,
    ShardRouting, ShardRoutingError, ShardRoutingService, DEFAULT_SHUTDOWN_TIMEOUT,
};

pub use actors::{
    member_lease_name, shard_lease_name, GetGroupView, GetHostedShards, GetShardDirectory,
    GetShards, GroupView, HandOffShard, LocateError, LocateShard, RunningShard, ShardDirectory,
    ShardInfo, ShardLocation, ShardRegion, ShardedError, ShardedSettings, ShardedWorkers,
    DEFAULT_LEAVE_GRACE, DEFAULT_MAX_CLAIMS_IN_FLIGHT, DEFAULT_MAX_HANDOVERS,
    DEFAULT_SHUTDOWN_HANDOVERS,
};
pub use actors::{
    Acquire, AllocateShard, CheckAlive, ClusterSingletonManager, CoordinatorGate, GateError,
    GateState, GetFencingToken, GetGateState, GetLeader, GetSingleton, GetStatus, GetTenure,
    HostShard, LeaderInfo, LeaseActor, Queued, RegisterRegion, Release, Responder, SetEligible,
    ShardAllocation, ShardCoordinator, ShardId, Shutdown, SingletonInfo, SingletonSettings,
    SingletonState, SingletonStatus, Submission, SubscribeLeaseLost, SubscriptionId,
    TransferLeadership, UnsubscribeLeaseLost, DEFAULT_ACK_TIMEOUT, DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_QUEUE_WAIT,
};
pub use actors::{
    AddressError, CandidacyError, CandidacyStatus, Candidate, HandoverPolicy, RankCandidates,
    ADDRESS_ENV as CANDIDATE_ADDRESS_ENV, POD_TEMPLATE_HASH_ENV as CANDIDATE_POD_TEMPLATE_HASH_ENV,
    REVISION_ENV as CANDIDATE_REVISION_ENV,
};
pub use actors::{Entities, EntityError, EntityHost, EntityHosts};
pub use backend::{AcquireAttempt, BackendError, LeaseBackend, ReleaseOutcome, RenewOutcome};
pub use binding::{Binding, BindingAnchor, HandedShard};
pub use entity::{entity_hash, shard_for, ShardFunction, StableShardFunction};
pub use group::{
    group_channel, GroupError, GroupRecord, GroupSender, GroupSnapshot, GroupWatch, SnapshotVersion,
};
pub use health::{HealthCheck, LeaseReport, NotReady, Unhealthy, DEFAULT_HEALTH_TOLERANCE};
pub use lease::{
    BoxError, FencingToken, Lease, LeaseError, LeaseLost, LostHandlers, LostReason,
    LostSubscription, Operation, SharedError,
};
pub use managed::{LeaseStats, ManagedLease};
pub use memory::{
    InMemoryBackend, InMemoryError, InMemoryFault, InMemoryLease, InMemoryRecord, InMemoryStats,
    InMemoryStore, InMemoryTenure,
};
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use metrics::describe_metrics;
pub use metrics::{
    MetricDescription, MetricKind, METRICS, RENEWAL_DURATION_BUCKETS, RENEWAL_MARGIN_BUCKETS,
    SHARD_HANDOVER_BUCKETS,
};
pub use placement::{place, placement_score, Placer};
pub use provider::{
    BackendFactory, CoordinationConfig, LeaseConfig, LeaseProvider, ProviderError,
    IN_MEMORY_BACKEND,
};
pub use settings::{
    LeaseSettings, LeaseSettingsBuilder, SettingsError, TimingConfig, DEFAULT_ACQUIRE_RETRIES,
    DEFAULT_ACQUIRE_RETRY_DELAY, DEFAULT_OPERATION_TIMEOUT, DEFAULT_TTL, MAX_METADATA_LEN,
    MAX_NAME_LEN, MAX_OWNER_LEN, MIN_ACQUIRE_RETRY_DELAY, MIN_CLOCK_DRIFT_MARGIN,
    MIN_DEFAULT_MARGIN,
};
pub use shared::SharedLease;
pub use tenure::{PublishedTenure, Tenure, TenureEnd, TenureGuard, TenurePublisher, TenureWatch};
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
mod etcd;
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use etcd::{
    provider_factory as etcd_provider_factory, EtcdBackend, EtcdConfig, EtcdError, EtcdLease,
    EtcdSession, EtcdSettings, EtcdSettingsBuilder, EtcdTenure,
    DEFAULT_CONNECT_TIMEOUT as ETCD_DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX as ETCD_DEFAULT_PREFIX,
    ETCD_BACKEND,
};
#[cfg(feature = "kubernetes")]
#[cfg_attr(docsrs, doc(cfg(feature = "kubernetes")))]
mod kubernetes;
#[cfg(feature = "kubernetes")]
#[cfg_attr(docsrs, doc(cfg(feature = "kubernetes")))]
pub use kubernetes::{
    is_valid_object_name as is_valid_kubernetes_object_name, kubernetes_client,
    object_name as kubernetes_object_name, provider_factory as kubernetes_provider_factory,
    KubernetesBackend, KubernetesError, KubernetesLease, KubernetesSession, KubernetesSessionStats,
    KubernetesSettings, KubernetesStats, KubernetesTenure, KubernetesWatchStats,
    BOUND_DURATION_SECS as KUBERNETES_BOUND_DURATION_SECS,
    BOUND_INCARNATION_ANNOTATION as KUBERNETES_BOUND_INCARNATION_ANNOTATION,
    BOUND_TO_ANNOTATION as KUBERNETES_BOUND_TO_ANNOTATION,
    HANDED_OVER_AFTER_ANNOTATION as KUBERNETES_HANDED_OVER_AFTER_ANNOTATION,
    HANDED_OVER_BY_ANNOTATION as KUBERNETES_HANDED_OVER_BY_ANNOTATION,
    HANDED_SHARDS_ANNOTATION as KUBERNETES_HANDED_SHARDS_ANNOTATION,
    HOLDER_METADATA_ANNOTATION as KUBERNETES_HOLDER_METADATA_ANNOTATION,
    HOLDER_METADATA_OWNER_ANNOTATION as KUBERNETES_HOLDER_METADATA_OWNER_ANNOTATION,
    KUBERNETES_BACKEND, LEASE_NAME_ANNOTATION as KUBERNETES_LEASE_NAME_ANNOTATION,
    LEAVING_ANNOTATION as KUBERNETES_LEAVING_ANNOTATION,
    PREFERRED_AT_ANNOTATION as KUBERNETES_PREFERRED_AT_ANNOTATION,
    PREFERRED_HOLDER_ANNOTATION as KUBERNETES_PREFERRED_HOLDER_ANNOTATION,
    WATCH_FLOOR as KUBERNETES_WATCH_FLOOR,
};

/// The items most programs need: the contract and its words, the in-memory backend, the
/// provider and its configuration, and the actor layer with its messages (everything the
/// README's examples use; `tests/readme.rs` compiles them with this prelude alone).
pub mod prelude {
    pub use crate::{
        Acquire, AllocateShard, Candidate, CheckAlive, ClusterSingletonManager, CoordinationConfig,
        Entities, EntityError, EntityHosts, FencingToken, GateError, GetFencingToken, GetGroupView,
        GetLeader, GetShards, GetSingleton, GetStatus, GetTenure, HandoverPolicy, HealthCheck,
        HostShard, InMemoryLease, InMemoryStore, LeaderInfo, Lease, LeaseActor, LeaseError,
        LeaseLost, LeaseProvider, LeaseSettings, LocateShard, LostReason, RegisterRegion, Release,
        SetEligible, ShardAllocation, ShardCoordinator, ShardDirectory, ShardInfo, ShardLocation,
        ShardedWorkers, SharedLease, Shutdown, SingletonInfo, SingletonSettings, SingletonState,
        SingletonStatus, SubscribeLeaseLost, Tenure, TenureEnd, TenureGuard, TenureWatch,
        TransferLeadership, UnsubscribeLeaseLost,
    };
    #[cfg(feature = "web")]
    #[cfg_attr(docsrs, doc(cfg(feature = "web")))]
    pub use crate::{
        AdminRoutes, EntityId, GracefulShutdown, LeaderOnly, RoutedShard, ShardRouting,
    };
}

#[cfg(test)]
mod send_sync {
    //! Compile-time checks that the public types can cross threads.
    use super::*;

    fn assert_send_sync<T: Send + Sync + 'static>() {}
    fn assert_send<T: Send>(_: &T) {}

    /// An entity actor that is neither `Send` nor `Sync`: the handles are, whatever it is.
    struct Dummy(std::marker::PhantomData<std::rc::Rc<()>>);
    impl actix::Actor for Dummy {
        type Context = actix::Context<Self>;
    }

    #[test]
    fn public_types_are_send_and_sync() {
        // Leases, stores, settings and configuration.
        assert_send_sync::<LeaseSettings>();
        assert_send_sync::<Candidate>();
        assert_send_sync::<ShardDirectory>();
        assert_send_sync::<EntityHosts<Dummy>>();
        assert_send_sync::<Entities<Dummy>>();
        assert_send_sync::<EntityError>();
        assert_send_sync::<ShardLocation>();
        assert_send_sync::<LocateError>();
        assert_send_sync::<ShardedError>();
        assert_send_sync::<HandoverPolicy>();
        assert_send_sync::<CandidacyError>();
        assert_send_sync::<LeaderInfo>();
        assert_send_sync::<LeaseSettingsBuilder>();
        assert_send_sync::<TimingConfig>();
        assert_send_sync::<InMemoryLease>();
        assert_send_sync::<InMemoryBackend>();
        assert_send_sync::<InMemoryStore>();
        assert_send_sync::<InMemoryRecord>();
        assert_send_sync::<InMemoryStats>();
        assert_send_sync::<InMemoryTenure>();
        assert_send_sync::<InMemoryFault>();
        assert_send_sync::<SharedLease>();
        assert_send_sync::<LeaseProvider>();
        assert_send_sync::<CoordinationConfig>();
        assert_send_sync::<LeaseConfig>();
        assert_send_sync::<FencingToken>();
        assert_send_sync::<LostReason>();
        assert_send_sync::<LeaseLost>();
        assert_send_sync::<LostHandlers>();
        assert_send_sync::<LostSubscription>();
        assert_send_sync::<Operation>();
        assert_send_sync::<AcquireAttempt<InMemoryTenure>>();
        assert_send_sync::<RenewOutcome>();
        assert_send_sync::<Binding>();
        assert_send_sync::<BindingAnchor>();
        assert_send_sync::<ReleaseOutcome>();
        // The tenure.
        assert_send_sync::<Tenure>();
        assert_send_sync::<TenureEnd>();
        assert_send_sync::<TenureWatch>();
        assert_send_sync::<TenureGuard>();
        assert_send_sync::<TenurePublisher>();
        assert_send_sync::<PublishedTenure>();
        // Errors.
        assert_send_sync::<LeaseError>();
        assert_send_sync::<ProviderError>();
        assert_send_sync::<SettingsError>();
        assert_send_sync::<InMemoryError>();
        assert_send_sync::<GateError>();
        #[cfg(feature = "kubernetes")]
        {
            assert_send_sync::<KubernetesError>();
            assert_send_sync::<KubernetesLease>();
            assert_send_sync::<KubernetesSettings>();
            assert_send_sync::<KubernetesSession>();
        }
        #[cfg(feature = "etcd")]
        {
            assert_send_sync::<EtcdError>();
            assert_send_sync::<EtcdLease>();
            assert_send_sync::<EtcdSettings>();
        }
        // The lease-holding actor and its messages.
        assert_send_sync::<LeaseActor<InMemoryLease>>();
        assert_send_sync::<Acquire>();
        assert_send_sync::<Release>();
        assert_send_sync::<CheckAlive>();
        assert_send_sync::<GetFencingToken>();
        assert_send_sync::<GetTenure>();
        assert_send_sync::<SubscribeLeaseLost>();
        assert_send_sync::<UnsubscribeLeaseLost>();
        assert_send_sync::<SubscriptionId>();
        // The singleton manager's messages and data. The manager itself is not `Send`: it keeps
        // the singleton's factory in an `Rc` (so that factories need not be `Send`) and runs on one
        // arbiter like every actix `Context` actor.
        assert_send_sync::<SingletonInfo>();
        assert_send_sync::<SingletonSettings>();
        assert_send_sync::<SingletonState>();
        assert_send_sync::<SingletonStatus>();
        assert_send_sync::<Shutdown>();
        assert_send_sync::<SetEligible>();
        assert_send_sync::<TransferLeadership>();
        assert_send_sync::<GetLeader>();
        assert_send_sync::<LeaderInfo>();
        assert_send_sync::<GetStatus>();
        assert_send_sync::<GetSingleton<LeaseActor<InMemoryLease>>>();
        // The sharding gate, the coordinator and its messages.
        assert_send_sync::<CoordinatorGate<InMemoryLease, String, u32>>();
        assert_send_sync::<ShardCoordinator<InMemoryLease>>();
        assert_send_sync::<GateState>();
        assert_send_sync::<Submission<String, u32>>();
        assert_send_sync::<Responder<u32>>();
        assert_send_sync::<AllocateShard>();
        assert_send_sync::<RegisterRegion>();
        assert_send_sync::<HostShard>();
        assert_send_sync::<ShardAllocation>();
        assert_send_sync::<GetGateState>();
        // actix-web routing: built once, cloned into every worker's thread.
        #[cfg(feature = "web")]
        {
            assert_send_sync::<ShardRouting>();
            assert_send_sync::<EntityId>();
            assert_send_sync::<RoutedShard>();
            assert_send_sync::<ShardRoutingError>();
        }
    }

    #[test]
    fn lease_futures_are_send() {
        let store = InMemoryStore::new();
        let lease = store.lease(LeaseSettings::new("n", "o").unwrap());
        assert_send(&lease.acquire());
        assert_send(&lease.acquire_within(std::time::Duration::ZERO));
        assert_send(&lease.release());
        let mut watch = lease.tenure().clone();
        assert_send(&watch.changed());
        assert_send(&lease.tenure().stream());
        let shared = SharedLease::new(store.lease(LeaseSettings::new("n", "p").unwrap()));
        assert_send(&shared.acquire());
    }
}
