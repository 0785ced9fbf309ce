//! The actor layer: a lease-holding actor, the cluster singleton manager, the coordinator gate and
//! the reference shard coordinator, and the one competition helper the managers share.

pub(crate) mod candidacy;
mod compete;
mod coordinator;
mod entities;
mod gate;
mod lease_actor;
mod member;
mod region;
mod sharded;
mod singleton;
mod singleton_messages;

pub use candidacy::{
    AddressError, CandidacyError, CandidacyStatus, Candidate, HandoverPolicy, RankCandidates,
    ADDRESS_ENV, POD_TEMPLATE_HASH_ENV, REVISION_ENV,
};
pub use coordinator::{
    AllocateShard, GetGateState, HostShard, RegisterRegion, ShardAllocation, ShardCoordinator,
    ShardId,
};
pub use entities::{Entities, EntityError, EntityHost, EntityHosts};
pub use gate::{
    CoordinatorGate, GateError, GateState, Queued, Responder, Submission, DEFAULT_ACK_TIMEOUT,
    DEFAULT_MAX_QUEUED, DEFAULT_MAX_QUEUE_WAIT,
};
pub use lease_actor::{
    Acquire, CheckAlive, GetFencingToken, GetTenure, LeaseActor, Release, SubscribeLeaseLost,
    SubscriptionId, UnsubscribeLeaseLost,
};
pub use region::{GetHostedShards, HandOffShard, ShardRegion};
pub use sharded::{
    member_lease_name, shard_lease_name, GetGroupView, GetShardDirectory, GetShards, GroupView,
    LocateError, LocateShard, RunningShard, ShardDirectory, ShardInfo, ShardLocation, ShardedError,
    ShardedSettings, ShardedWorkers, DEFAULT_LEAVE_GRACE, DEFAULT_MAX_CLAIMS_IN_FLIGHT,
    DEFAULT_MAX_HANDOVERS, DEFAULT_SHUTDOWN_HANDOVERS,
};
pub use singleton::{
    ClusterSingletonManager, GetLeader, GetSingleton, GetStatus, LeaderInfo, SetEligible, Shutdown,
    SingletonInfo, SingletonSettings, SingletonState, SingletonStatus, TransferLeadership,
};
