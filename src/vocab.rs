//! The words of the lease contract: fencing tokens, why a tenure was lost, what a bound claim
//! names, which operation failed and how, and what a backend's error must say.
//!
//! These types sit below everything else in the crate: the contract ([`Lease`](crate::Lease)),
//! the backend trait ([`LeaseBackend`](crate::LeaseBackend)), tenures and metrics all use them,
//! and this module uses none of those, so the crate's modules depend on each other one way only.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Boxed error of a backend (what a [`BackendFactory`](crate::BackendFactory) returns).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A backend's error kept as the source of a [`LeaseError`]; shared, so that a `LeaseError` can be
/// cloned for several waiters without losing its variant or its source.
pub type SharedError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A token that strictly increases with every ownership transition of a lease name, across all
/// owners.
///
/// Pass it along with every write that needs the lease; the receiving system remembers the highest
/// token it has seen per resource and rejects writes that carry a lower one. This turns "at most one
/// holder *believes* it owns the lease" into "at most one holder's writes are *accepted*", even when
/// a paused holder wakes up and acts before it notices it lost the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// A token with the given value.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The token's value.
    pub const fn value(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Why a lease was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The backend reported that another owner holds the lease now.
    TakenOver {
        /// The new holder, when the backend said who it is.
        holder: Option<String>,
    },
    /// The local deadline passed without a successful renewal (partition, pause, backend down).
    Expired {
        /// The error of the last failed renewal attempt, if one failed.
        last_error: Option<String>,
    },
    /// The lease record disappeared from the backend (deleted by an operator or another client).
    Deleted,
    /// The backend answered something that contradicts this owner holding the lease.
    Inconsistent(String),
    /// The task that renewed the lease stopped before the tenure ended: the runtime it ran on
    /// shut down (the arbiter or the actix-web worker that called `acquire` stopped), or the
    /// backend panicked in a renewal. Nothing renews the lease any more, so the tenure ends at
    /// once, before its deadline; the record stays in the store until its TTL passes, as after a
    /// crash.
    RenewalStopped,
    /// The tenure was bound to a tenure of member lease `member` (see
    /// [`Binding`](crate::Binding)), and that member tenure ended (lost, expired, released,
    /// dropped, or replaced by a new one): a bound tenure lives exactly as long.
    Unbound {
        /// The member lease.
        member: String,
    },
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::TakenOver { holder: Some(h) } => write!(f, "taken over by {h}"),
            LostReason::TakenOver { holder: None } => f.write_str("taken over by another owner"),
            LostReason::Expired { last_error: None } => {
                f.write_str("ttl passed without a successful renewal")
            }
            LostReason::Expired {
                last_error: Some(e),
            } => write!(
                f,
                "ttl passed without a successful renewal (last error: {e})"
            ),
            LostReason::Deleted => f.write_str("lease record deleted from the backend"),
            LostReason::Inconsistent(why) => write!(f, "backend inconsistency: {why}"),
            LostReason::RenewalStopped => f.write_str(
                "the renewal task stopped (its runtime shut down, or the backend panicked in it)",
            ),
            LostReason::Unbound { member } => {
                write!(
                    f,
                    "the tenure of member lease {member:?} it was bound to ended"
                )
            }
        }
    }
}

/// The notification that a lease was lost: delivered to
/// [`Lease::on_lost`](crate::Lease::on_lost) handlers and, as an actix message, to subscribed
/// actors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLost {
    /// The lease name.
    pub name: String,
    /// The owner that lost it.
    pub owner: String,
    /// Why it was lost.
    pub reason: LostReason,
    /// The fencing token of the tenure that ended.
    pub fencing_token: Option<FencingToken>,
}

impl fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lease {:?} lost by {:?}: {}",
            self.name, self.owner, self.reason
        )
    }
}

/// Which lease operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `acquire`.
    Acquire,
    /// A renewal.
    Renew,
    /// `release`.
    Release,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Acquire => "acquire",
            Operation::Renew => "renew",
            Operation::Release => "release",
        })
    }
}

/// A lease operation whose outcome is unknown, or that the backend refused.
///
/// `Clone`: a clone keeps the variant and shares the source. `Display` says what failed; the
/// backend's error is the [`source`](std::error::Error::source) (log the whole chain).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A backend call did not answer within the operation timeout; it may or may not have been
    /// applied.
    #[error("{operation} timed out after {timeout:?}")]
    Timeout {
        /// The operation.
        operation: Operation,
        /// The operation timeout in force.
        timeout: Duration,
    },
    /// The backend failed; `transient` errors (unreachable, 5xx) may succeed when tried again,
    /// others (forbidden, invalid) will not.
    #[error("{operation} failed")]
    Backend {
        /// The operation.
        operation: Operation,
        /// Whether trying again may help.
        transient: bool,
        /// The backend's error.
        #[source]
        source: SharedError,
    },
    /// The lease was used outside a Tokio runtime, or after its runtime shut down.
    #[error("{operation} needs a running tokio runtime (actix-rt provides one)")]
    NoRuntime {
        /// The operation.
        operation: Operation,
    },
    /// [`Lease::acquire_within`](crate::Lease::acquire_within)'s deadline passed while it waited
    /// for another `acquire` or `release` of the same lease instance to finish; no attempt was
    /// made. Transient.
    #[error("{operation} could not start before its deadline: another acquire or release of this lease was in flight")]
    Busy {
        /// The operation.
        operation: Operation,
    },
    /// Another instance of the same lease (same store, name and owner) in this process holds
    /// it. The store cannot tell two instances with one owner apart, so both would believe they
    /// hold the lease: share one instance instead (an `Arc`, a
    /// [`SharedLease`](crate::SharedLease), or the [`LeaseProvider`](crate::LeaseProvider)).
    #[error("another instance of lease {name:?} with owner {owner:?} holds it in this process")]
    DuplicateInstance {
        /// The lease name.
        name: String,
        /// The owner.
        owner: String,
    },
    /// A [`LeaseActor`](crate::LeaseActor)'s [`Acquire`](crate::Acquire) that a
    /// [`Release`](crate::Release) received after it, or the actor's stop, superseded before it
    /// answered: it stopped trying, and a claim its attempt in flight obtained was released. Not
    /// transient: trying again would undo the release that superseded it.
    #[error("{operation} was superseded by a later release or the stop of its actor")]
    Superseded {
        /// The operation.
        operation: Operation,
    },
    /// The lease's backend cannot do what was asked: a [`release_to`](crate::Lease::release_to)
    /// on a backend that cannot record a preferred next holder. Nothing changed (a tenure is
    /// still held and renewed). Not transient.
    #[error("the lease's backend cannot {what}")]
    Unsupported {
        /// The operation.
        operation: Operation,
        /// What the backend cannot do.
        what: &'static str,
    },
    /// The lease is bound to member lease `member` ([`Lease::bind_to`](crate::Lease::bind_to)),
    /// and no tenure of that member is alive to bind a claim to: acquire the member lease first.
    /// Nothing was sent. Transient (the member may be acquired again).
    #[error("lease is bound to member lease {member:?}, which is not held")]
    Unbound {
        /// The member lease.
        member: String,
    },
    /// The lease is bound to member lease `member`, whose tenure ends within `left` by this
    /// process's clock: sooner than a claim's answer may take (`timeout`: the lease's operation
    /// timeout, or the member lease's if that is shorter).
    /// A claim answered after its member tenure ended starts nothing (see
    /// [`protocol::keep_bound_claim`](crate::protocol::keep_bound_claim)), so none is sent while
    /// the member's renewals are late: during a fleet's start such claims only added to the load
    /// that made the renewals late. Nothing was sent. Transient (a member renewal moves the
    /// deadline).
    #[error("lease is bound to member lease {member:?}, whose tenure ends in {left:?}, sooner than a claim may take to be answered ({timeout:?}): nothing was sent")]
    MemberEnding {
        /// The member lease.
        member: String,
        /// How long its tenure lives on, by this process's clock.
        left: Duration,
        /// The operation timeout: how long a claim's answer may take.
        timeout: Duration,
    },
    /// [`release_to`](crate::Lease::release_to) was given a target that cannot hold the lease:
    /// empty, too long, with a control character, or this owner itself. Nothing changed. Not
    /// transient.
    #[error("cannot transfer lease {name:?} to {target:?}: {reason}")]
    InvalidTransferTarget {
        /// The lease name.
        name: String,
        /// The target as given.
        target: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl LeaseError {
    /// Whether trying again may succeed (timeouts, transient backend errors, a busy lease).
    pub fn is_transient(&self) -> bool {
        match self {
            LeaseError::Timeout { .. }
            | LeaseError::Busy { .. }
            | LeaseError::Unbound { .. }
            | LeaseError::MemberEnding { .. } => true,
            LeaseError::Backend { transient, .. } => *transient,
            LeaseError::NoRuntime { .. }
            | LeaseError::DuplicateInstance { .. }
            | LeaseError::Superseded { .. }
            | LeaseError::Unsupported { .. }
            | LeaseError::InvalidTransferTarget { .. } => false,
        }
    }

    /// The error of a backend call of `operation`.
    pub(crate) fn backend<E: BackendError>(operation: Operation, error: E) -> Self {
        LeaseError::Backend {
            operation,
            transient: error.is_transient(),
            source: Arc::new(error),
        }
    }

    /// The backend's own error, if it is of type `E` (for example the Kubernetes backend's error
    /// that names the RBAC rule that is missing).
    pub fn backend_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            LeaseError::Backend { source, .. } => source.downcast_ref::<E>(),
            _ => None,
        }
    }
}

/// Errors of a backend, with the one property `ManagedLease` needs: may a retry help?
pub trait BackendError: std::error::Error + Send + Sync + 'static {
    /// Whether trying the same call again may succeed (unreachable backend, 5xx, conflict races).
    fn is_transient(&self) -> bool;
}

/// What a bound claim names: the lease whose tenure it lives by, and which incarnation of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Binding {
    member: String,
    incarnation: String,
}

impl Binding {
    /// A binding to incarnation `incarnation` of lease `member` (as the member's backend names
    /// it: [`LeaseBackend::incarnation`](crate::LeaseBackend::incarnation)).
    pub fn new(member: impl Into<String>, incarnation: impl Into<String>) -> Self {
        Self {
            member: member.into(),
            incarnation: incarnation.into(),
        }
    }

    /// The name of the lease the bound claim lives by.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// The incarnation (the member tenure) the bound claim lives by, as its backend names it.
    pub fn incarnation(&self) -> &str {
        &self.incarnation
    }
}
