//! [`ShardedSettings`] and [`ShardedError`]: what a [`ShardedWorkers`](super::ShardedWorkers)
//! group is built with, and what can be wrong with it.

use std::time::Duration;

use super::super::singleton::SingletonSettings;
use crate::group::GroupError;
use crate::settings::SettingsError;

/// The default of [`ShardedSettings::max_handovers`].
pub const DEFAULT_MAX_HANDOVERS: usize = 4;

/// The default of [`ShardedSettings::shutdown_handovers`].
pub const DEFAULT_SHUTDOWN_HANDOVERS: usize = 128;

/// The default of [`ShardedSettings::max_claims_in_flight`].
pub const DEFAULT_MAX_CLAIMS_IN_FLIGHT: usize = 16;

/// The default of [`ShardedSettings::leave_grace`].
pub const DEFAULT_LEAVE_GRACE: Duration = Duration::from_millis(500);

/// Settings of [`ShardedWorkers`](crate::ShardedWorkers); plain data with documented defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedSettings {
    /// How many shards a running node hands over at once (to a node that joined, or back to one
    /// that restarted): released and not yet seen claimed by their target (default
    /// [`DEFAULT_MAX_HANDOVERS`], at least 1), so that a join never empties a node at once. A
    /// handover whose target has not claimed the shard within the lease's TTL stops counting.
    pub max_handovers: usize,
    /// How many shards [`Shutdown`](crate::Shutdown) hands over at once, where shard leases are not bound
    /// (default [`DEFAULT_SHUTDOWN_HANDOVERS`]: 128, at least 1). Each shard's worker stops,
    /// then its lease is handed over; a slow worker delays only its own shard. Handovers sent
    /// together are written together where the backend can: on etcd up to 128 keys per
    /// transaction (`EtcdSession::write_batches_sent`), so a node leaving with 256 shards
    /// sends about three. Where each handover is a write of its own (Kubernetes with
    /// [`bind_shards`](Self::bind_shards) off) they share the backend and each takes longer:
    /// on a busy API server one at a time moved each shard in a third of the time that four at
    /// a time did (BENCHMARKS.md), at `n` write round trips for `n` shards: set 1 there when a
    /// shard's own gap matters more than the whole leave's.
    pub shutdown_handovers: usize,
    /// The settings of each shard's manager: stop timeout, restarts, retry delay, backoff
    /// (`handle_signals` is ignored: shut the group down with [`Shutdown`](crate::Shutdown)).
    pub shard: SingletonSettings,
    /// Whether each shard lease is *bound* to the node's member lease where the backend binds
    /// (in memory and on Kubernetes; see [`Binding`](crate::Binding)), the default: a shard's
    /// record is written when its ownership changes and never renewed, and one member renewal
    /// per interval keeps every shard of the node (the store's writes per interval grow with the
    /// nodes, not the shards). `false` renews every shard lease on its own. On etcd shard keys
    /// live on the session's one keep-alive either way.
    pub bind_shards: bool,
    /// With bound shard leases: how long [`Shutdown`](crate::Shutdown) waits for every worker to stop before it
    /// hands on the shards whose workers did (default [`DEFAULT_LEAVE_GRACE`], 500 ms). Workers
    /// that all stop within it cost the leave one write (the member lease's retirement hands
    /// every shard on); past it, each shard whose worker stopped is handed over on its own
    /// write, and each later one as its worker stops, so that a slow worker keeps only its own
    /// shard (and the leave costs a write per shard). Zero hands each shard on as its worker
    /// stops.
    pub leave_grace: Duration,
    /// How many shard claims a node has in flight at most (default
    /// [`DEFAULT_MAX_CLAIMS_IN_FLIGHT`]: 16, at least 1): each shard manager's first attempt of
    /// a round waits for one of them, and holds it until the store answered. A node that comes
    /// to target many shards at once (a fleet started together, in which each node targets
    /// every shard until it sees the others; the shards of a crashed node) claims them at the
    /// pace its store answers, and its member lease's renewals, which never wait for one, do not
    /// queue behind a thousand claims: the member tenure, and every shard bound to it, survives
    /// its own start. The attempts a waiting manager makes on a change of its lease are not
    /// counted. On etcd claims sent together are written together (up to 128 keys in one
    /// transaction), so this is also the largest batch of one node's claims.
    pub max_claims_in_flight: usize,
}

impl Default for ShardedSettings {
    fn default() -> Self {
        Self {
            max_handovers: DEFAULT_MAX_HANDOVERS,
            shutdown_handovers: DEFAULT_SHUTDOWN_HANDOVERS,
            shard: SingletonSettings::default(),
            bind_shards: true,
            leave_grace: DEFAULT_LEAVE_GRACE,
            max_claims_in_flight: DEFAULT_MAX_CLAIMS_IN_FLIGHT,
        }
    }
}

/// Errors building [`ShardedWorkers`](crate::ShardedWorkers).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardedError {
    /// The group name is empty.
    #[error("the group name must not be empty")]
    EmptyGroup,
    /// The group name contains a `.`, which separates a group's name from the rest of its lease
    /// names (so that two groups' leases never share a name).
    #[error("invalid group name {group:?}: it must not contain a `.`")]
    InvalidGroup {
        /// The group.
        group: String,
    },
    /// There are no shards.
    #[error("group {group:?} has no shards")]
    NoShards {
        /// The group.
        group: String,
    },
    /// A shard id is empty, repeated, or starts with `member.` (the member leases' names).
    #[error("invalid shard id {shard:?} in group {group:?}: {reason}")]
    InvalidShard {
        /// The group.
        group: String,
        /// The shard id.
        shard: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A shard's lease name (`<group>.<shard>`) is no valid lease name (too long, a control
    /// character).
    #[error("invalid lease name {name:?}")]
    InvalidLeaseName {
        /// The lease name.
        name: String,
        /// Why.
        #[source]
        source: SettingsError,
    },
    /// The lease factory built a lease with another name than asked, or for another owner than
    /// the group's first lease (every lease of a node must have the node's owner identity).
    #[error("the lease factory built lease {built:?} of owner {owner:?} when asked for {asked:?} of owner {expected_owner:?}")]
    WrongLease {
        /// The name asked for.
        asked: String,
        /// The name built.
        built: String,
        /// The owner built.
        owner: String,
        /// The node's owner identity (the member lease's).
        expected_owner: String,
    },
    /// `max_handovers` is zero.
    #[error("invalid `max-handovers`: must be at least 1")]
    NoHandovers,
    /// `shutdown_handovers` is zero.
    #[error("invalid `shutdown-handovers`: must be at least 1")]
    NoShutdownHandovers,
    /// `max_claims_in_flight` is zero.
    #[error("invalid `max-claims-in-flight`: must be at least 1")]
    NoClaimsInFlight,
    /// The shard settings are invalid.
    #[error("invalid shard settings")]
    Settings(#[source] SettingsError),
    /// The provider could not build a lease of the group.
    #[error("cannot build lease {lease:?} of the group from configuration")]
    Provider {
        /// The lease name.
        lease: String,
        /// Why.
        #[source]
        source: crate::provider::ProviderError,
    },
    /// The address given to [`ShardedWorkers::advertise`](crate::ShardedWorkers::advertise) is not an absolute `http` or `https`
    /// URL with a host and an optional port, and nothing else (no path, query, fragment or user
    /// information; see [`Candidate::address`](crate::Candidate::address)).
    #[error("invalid advertised address {address:?}")]
    InvalidAddress {
        /// The address, as given.
        address: String,
        /// What is wrong with it.
        #[source]
        source: crate::actors::candidacy::AddressError,
    },
    /// The member lease could not be built again with the advertised address
    /// ([`ShardedWorkers::advertise`](crate::ShardedWorkers::advertise)): its settings cannot carry the metadata, or the function
    /// given failed.
    #[error("cannot build member lease {name:?} with the advertised address")]
    MemberLease {
        /// The member lease's name.
        name: String,
        /// Why.
        #[source]
        source: crate::vocab::BoxError,
    },
    /// The backend cannot watch the group (membership needs it).
    #[error("cannot watch group {group:?}")]
    Watch {
        /// The group.
        group: String,
        /// Why.
        #[source]
        source: GroupError,
    },
}
