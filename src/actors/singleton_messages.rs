//! The messages of [`ClusterSingletonManager`] and what they
//! answer.

use std::fmt;
use std::marker::PhantomData;

use actix::prelude::*;

#[cfg(doc)]
use super::{ClusterSingletonManager, SingletonSettings};
#[cfg(doc)]
use crate::lease::Lease;
use crate::lease::{FencingToken, LeaseError};

/// Stop the singleton, wait until it stopped (at most
/// [`stop_timeout`](SingletonSettings::stop_timeout)), release the lease, then stop the manager.
/// Answers the release's result: `Ok(true)` when the lease is definitely released or was not
/// held, including a claim of an acquire round that was in flight (it is finished and released
/// first).
///
/// This is the way to shut a node down gracefully: await it before `System::stop` (which drops
/// actors without running their `stopping` hooks, so the lease would only expire after its TTL).
/// Every `Shutdown` sent before the manager has stopped gets the same answer; once it has shut
/// down the manager is stopped, and a send to it fails with `MailboxError::Closed`.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<bool, LeaseError>")]
pub struct Shutdown;

/// Whether this node may run the singleton (default `true` on every node).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct SetEligible(pub bool);

/// The address of the singleton if it runs on this node.
#[derive(Message)]
#[rtype(result = "Option<Addr<A>>")]
pub struct GetSingleton<A: Actor>(PhantomData<fn() -> A>);

impl<A: Actor> GetSingleton<A> {
    /// The query.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<A: Actor> Default for GetSingleton<A> {
    fn default() -> Self {
        Self::new()
    }
}

impl<A: Actor> fmt::Debug for GetSingleton<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GetSingleton")
    }
}

/// What the manager is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SingletonState {
    /// Not competing (ineligible).
    Idle,
    /// Competing for the lease: a round is in flight, or the next attempt is scheduled (after an
    /// error, or after giving up on a failing singleton).
    Acquiring,
    /// The singleton runs on this node.
    Running,
    /// The singleton is being stopped.
    Stopping,
    /// The lease is being released (after the acquire round in flight, if any, has ended).
    Releasing,
    /// Shut down.
    ShutDown,
}

/// A snapshot of a manager, for monitoring and tests.
#[derive(Debug, Clone, PartialEq, Eq, MessageResponse)]
pub struct SingletonStatus {
    /// What the manager is doing.
    pub state: SingletonState,
    /// The fencing token the singleton runs under, when it runs here.
    pub fencing_token: Option<FencingToken>,
    /// How many singleton instances this manager has started.
    pub started: u64,
    /// How many singleton instances did not stop within the stop timeout.
    pub unstopped: u64,
}

/// Hand leadership to the node whose lease owner is `to` ([`to`](Self::to)), or to the best other
/// live candidate ([`to_best`](Self::to_best)), on purpose (a drain, an operator moving the
/// leader): the manager stops the singleton, then releases the lease *to* `to`
/// ([`Lease::release_to`]): `to` may take it at once, every other node leaves it to `to` for one
/// TTL (then anyone may), and this node competes again like the others.
///
/// Answers like [`Lease::release_to`]: `Ok(true)` once the lease is released with `to` preferred,
/// `Ok(false)` when this node was not running the singleton (nothing was handed over), or an
/// error: an invalid target or a backend that cannot record a preference
/// ([`LeaseError::InvalidTransferTarget`], [`LeaseError::Unsupported`]) are refused before the
/// singleton is touched; a release that failed leaves the lease to expire by its TTL, as after a
/// crash.
///
/// With a [candidacy](crate::ClusterSingletonManager::candidacy), a target that is no live
/// candidate (it left, crashed, withdrew, or never published one), or, under a policy other than
/// [`HandoverPolicy::Off`](crate::HandoverPolicy::Off), that a live candidate (this node included)
/// ranks above, is refused the same way ([`LeaseError::InvalidTransferTarget`]) and nothing
/// changes: it would defer to the better candidate, or hand the lease on to it, and nobody would
/// lead meanwhile.
///
/// A [`Shutdown`] that comes while a transfer is under way (it overtakes it) hands the lease to
/// the transfer's target if that target still counts, and the transfer answers the release's
/// result; when the shutdown released the lease otherwise (the target left meanwhile), the
/// transfer answers [`LeaseError::Superseded`]. `Ok(true)` always means the lease was released to
/// `to`.
///
/// [`to_best`](Self::to_best) picks, among the live candidates other than this node (see
/// [`ClusterSingletonManager::candidacy`](crate::ClusterSingletonManager::candidacy)), the best
/// under the manager's [`HandoverPolicy`](crate::HandoverPolicy) (with
/// [`HandoverPolicy::Off`](crate::HandoverPolicy::Off): the earliest started); it answers
/// `Ok(false)` and changes nothing when the manager has no candidacy or sees no other live
/// candidate.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "Result<bool, LeaseError>")]
pub struct TransferLeadership {
    /// The owner identity of the node to hand the lease to; `None`: the best other candidate.
    pub to: Option<String>,
}

impl TransferLeadership {
    /// A transfer to the node whose owner identity is `to`.
    pub fn to(to: impl Into<String>) -> Self {
        Self {
            to: Some(to.into()),
        }
    }

    /// A transfer to the best other live candidate.
    pub fn to_best() -> Self {
        Self { to: None }
    }
}

/// Ask a manager who leads: the holder of the singleton's lease, its fencing token, whether the
/// singleton runs here (`here`) and whether the leader named is this node (`this_node`: also
/// while its singleton starts or stops), as this node sees them now, without a request to the
/// store (see [`LeaderInfo`]).
///
/// The leader answers from its own tenure. Another node answers from a watch of the lease's
/// record in the store (its group watch, [`Lease::watch_group`], started by the first
/// `GetLeader` and kept by the manager): the holder whose claim has not expired as this process
/// observed it, as the watch delivered it (up to the watch's delay: use it to route work to the
/// leader, never to decide who may act). `None` when nobody holds the lease, or before the watch
/// has listed the record. On a backend that cannot watch groups it falls back to
/// [`Lease::observed_holder`], without a token.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Option<LeaderInfo>")]
pub struct GetLeader;

/// The leader of a singleton, as [`GetLeader`] answers it.
///
/// `here` and `this_node` tell the three cases apart: the singleton runs on this node (`here`:
/// serve leader-only work here); the lease names this node but its singleton does not run
/// (`this_node` without `here`: it is starting, or stopping for a handover or a shutdown, and
/// there is nowhere else to send the work yet); the lease names another node (neither: route to
/// its `address`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The leader's owner identity.
    pub holder: String,
    /// The fencing token of its tenure, when known.
    pub fencing_token: Option<FencingToken>,
    /// Whether the singleton runs on this node, under a live tenure: leader-only work can be
    /// served here now. `false` on the node that holds the lease while its singleton starts or
    /// stops (see [`this_node`](Self::this_node)).
    pub here: bool,
    /// Whether the leader named is this node: the holder is this node's owner identity, or
    /// advertises this node's own address (a previous process at this address, under another
    /// identity, whose claim has not expired yet). `true` whenever `here` is. With `here`
    /// `false`, nothing serves leader-only work here and redirecting would come back here:
    /// [`LeaderOnly`](crate::LeaderOnly) answers `503` with `Retry-After`.
    pub this_node: bool,
    /// The leader's advertised address, from its candidacy
    /// ([`Candidate::address`](crate::Candidate::address)); `None` when this manager has no
    /// candidacy, or the leader published none. As the store holds it: a candidacy written by
    /// another version or another writer may hold anything (`LeaderOnly` checks it before it
    /// redirects).
    pub address: Option<String>,
    /// The singleton's lease name, when the answer comes from a manager (`None` from
    /// [`LeaderInfo::new`] unless [`with_lease`](Self::with_lease) sets it).
    pub lease: Option<String>,
}

impl LeaderInfo {
    /// A leader (for tests and custom answers), `this_node` when `here`, without a lease name.
    pub fn new(
        holder: impl Into<String>,
        fencing_token: Option<FencingToken>,
        here: bool,
        address: Option<String>,
    ) -> Self {
        Self {
            holder: holder.into(),
            fencing_token,
            here,
            this_node: here,
            address,
            lease: None,
        }
    }

    /// With `this_node` (see [`this_node`](Self::this_node); `here` implies it).
    pub fn with_this_node(mut self, this_node: bool) -> Self {
        self.this_node = this_node || self.here;
        self
    }

    /// With the singleton's lease name.
    pub fn with_lease(mut self, lease: impl Into<String>) -> Self {
        self.lease = Some(lease.into());
        self
    }
}

/// Ask a manager for its [`SingletonStatus`].
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "SingletonStatus")]
pub struct GetStatus;
