//! The small trait a storage backend implements; [`ManagedLease`](crate::ManagedLease) turns it
//! into a full [`Lease`](crate::Lease).

use std::future::Future;

use tokio::time::Instant;

use crate::binding::{Binding, BindingAnchor};
use crate::group::{GroupError, GroupWatch};
use crate::settings::LeaseSettings;
pub use crate::vocab::BackendError;
use crate::vocab::{FencingToken, LostReason};

/// The outcome of one attempt to claim a lease.
#[derive(Debug)]
pub enum AcquireAttempt<T> {
    /// This owner holds the lease now.
    Acquired {
        /// The backend's state of this tenure (what renewals and release compare against).
        tenure: T,
        /// The fencing token of this tenure.
        token: FencingToken,
        /// When the claim's validity started, if earlier than the start of this call (a shared
        /// etcd session lease, for example); `None` means "the start of the call".
        valid_from: Option<Instant>,
    },
    /// Another owner holds the lease, as far as the backend can tell for sure.
    HeldByOther {
        /// The current holder, when known.
        holder: Option<String>,
        /// When the backend expects the lease could become free, measured on the local monotonic
        /// clock from when the claim was observed, if it knows.
        expires_at: Option<Instant>,
    },
}

/// The outcome of one renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewOutcome {
    /// The lease is still ours and renewed.
    Renewed {
        /// When the renewed validity started, if earlier than the start of this call; `None`
        /// means "the start of the call". The deadline counts from it, and `ManagedLease` plans
        /// the next renewal one renewal interval after it: a backend whose renewals share one
        /// periodic request (etcd's shared keep-alive) names that request's send time, and every
        /// lease then renews on that request's clock.
        valid_from: Option<Instant>,
    },
    /// The backend shows that the lease is not ours any more.
    Lost(LostReason),
}

/// The outcome of a release that reached the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lease is released (or was no longer claimed by anyone).
    Released,
    /// Another owner holds it.
    HeldByOther {
        /// The current holder, when known.
        holder: Option<String>,
    },
}

/// A lease store: the small trait a storage backend implements; [`ManagedLease`](crate::ManagedLease)
/// turns it into a full [`Lease`](crate::Lease).
///
/// A backend only performs single, bounded steps against its store: one attempt to claim the
/// lease, one renewal, one release, and optionally a watch that reports a loss as soon as the store
/// shows one. Everything that is the same for every store lives in `ManagedLease`: retries,
/// operation timeouts, the renewal loop and its backoff, the local monotonic deadline behind
/// `check_alive`, reentrancy, serialisation of concurrent calls and exactly-once `on_lost`.
///
/// # What a backend must guarantee
///
/// * Every write that claims ownership is a compare-and-swap on the state the backend last
///   observed (a `resourceVersion`, an etcd revision): two owners racing produce one winner.
/// * A contender treats another owner's claim as expired only after the TTL has passed *on its own
///   monotonic clock* since it observed that claim; never by comparing a timestamp written by another
///   machine with its own clock.
/// * A claim or renewal is valid from the instant the call *started*: `ManagedLease` records that
///   instant before calling the backend and derives the local deadline from it.
/// * Each successful [`LeaseBackend::try_acquire`] that starts a tenure returns a fencing token
///   strictly greater than every token any owner got for the same lease name before.
///
/// Every method is called with the lease's validated settings; `ManagedLease` bounds each call by
/// the operation timeout, so a backend need not apply its own.
pub trait LeaseBackend: Send + Sync + 'static {
    /// What the backend remembers about the tenure it granted (for example the `resourceVersion`
    /// of its last write).
    type Tenure: Send + Sync + 'static;
    /// The backend's error type.
    type Error: BackendError;

    /// One attempt to claim the lease for `settings.owner()`.
    ///
    /// When this owner already holds the claim in the store (an earlier attempt whose answer was
    /// lost), the backend reuses it and reports `Acquired` with a fresh token.
    ///
    /// # Errors
    ///
    /// When the outcome is unknown (store unreachable, refused, an unexpected answer); the error's
    /// [`BackendError::is_transient`] decides whether `ManagedLease` tries again.
    ///
    /// # Cancel safety
    ///
    /// `ManagedLease` drops the future at the operation timeout. A claim the store applied but
    /// whose answer was dropped must be recognised by the next attempt (as described above).
    fn try_acquire(
        &self,
        settings: &LeaseSettings,
    ) -> impl Future<Output = Result<AcquireAttempt<Self::Tenure>, Self::Error>> + Send;

    /// One renewal of the tenure, as a compare-and-swap against it.
    ///
    /// # Errors
    ///
    /// When the outcome is unknown; `ManagedLease` retries with a backoff until the local
    /// deadline. A store that definitely shows another holder or no record answers
    /// `Ok(RenewOutcome::Lost(_))`, not an error.
    ///
    /// # Cancel safety
    ///
    /// The future may be dropped at the operation timeout or when the local deadline passes; the
    /// tenure must stay usable for the next renewal and for `release` (update it only from answers
    /// that arrived).
    fn renew(
        &self,
        settings: &LeaseSettings,
        tenure: &mut Self::Tenure,
    ) -> impl Future<Output = Result<RenewOutcome, Self::Error>> + Send;

    /// Gives the tenure up in the store, as a compare-and-swap against it.
    ///
    /// # Errors
    ///
    /// When the outcome is unknown: `release` then resolves `Err` and the claim expires after its
    /// TTL at the latest. Another holder in the store is `Ok(ReleaseOutcome::HeldByOther)`.
    ///
    /// # Cancel safety
    ///
    /// Dropped at the operation timeout; the claim then expires by its TTL.
    fn release(
        &self,
        settings: &LeaseSettings,
        tenure: Self::Tenure,
    ) -> impl Future<Output = Result<ReleaseOutcome, Self::Error>> + Send;

    /// Whether this backend writes *bound* claims ([`try_acquire_bound`](Self::try_acquire_bound))
    /// and names the incarnation of its tenures ([`incarnation`](Self::incarnation)), so that
    /// its leases can anchor bound leases and be bound (see [`Binding`]). The default is `false`:
    /// [`Lease::bind_to`](crate::Lease::bind_to) is then refused with
    /// [`LeaseError::Unsupported`](crate::LeaseError::Unsupported).
    fn binds(&self) -> bool {
        false
    }

    /// The incarnation of `tenure` as a bound claim names it: a string that no other tenure of
    /// this lease name in this store ever had (on Kubernetes the object's `uid` with its
    /// `leaseTransitions`). Called only when [`binds`](Self::binds) is `true`.
    fn incarnation(&self, tenure: &Self::Tenure) -> Option<String> {
        let _ = tenure;
        None
    }

    /// This lease's tenures are bound to the member tenures of `anchor` from now on
    /// ([`Lease::bind_to`](crate::Lease::bind_to) calls it once). A backend that writes bound
    /// records keeps it, and before each write of a record it held as its holder (a release, an
    /// abandoned claim's release, an unanswered claim's) asks it which member incarnation lives
    /// now by this process's clock ([`BindingAnchor::live`]): a record bound to another one is
    /// not written ([`protocol::may_write_own`](crate::protocol::may_write_own)). The default
    /// keeps nothing.
    fn bound_to(&self, anchor: &BindingAnchor) {
        let _ = anchor;
    }

    /// One attempt to claim the lease for `settings.owner()`, *bound* to `binding`: the record
    /// names the member lease and its incarnation, is never renewed, and counts as held exactly
    /// as long as that member tenure lives. Called only when [`binds`](Self::binds) is `true`.
    ///
    /// A backend that binds must keep these rules (see [`protocol`](crate::protocol)): every
    /// tenure starts with a compare-and-swap on the record itself, and its token rises, like
    /// every claim (no tenure is taken up without a write); every contender (a bound claim or a plain one, of this owner or
    /// another) counts a bound record held by another owner free only once it has itself observed
    /// the member record expired (its TTL passed on the contender's clock since it saw that
    /// version), released, removed or naming another incarnation or holder; and a record bound to
    /// an incarnation that is not this owner's current one is claimed anew, never reused.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Self::try_acquire).
    fn try_acquire_bound(
        &self,
        settings: &LeaseSettings,
        binding: &Binding,
    ) -> impl Future<Output = Result<AcquireAttempt<Self::Tenure>, Self::Error>> + Send {
        let _ = binding;
        self.try_acquire(settings)
    }

    /// Whether the backend records a preferred next holder: [`release_to`](Self::release_to)
    /// writes one, and [`try_acquire`](Self::try_acquire) and
    /// [`wait_for_change`](Self::wait_for_change) honour one. The default is `false`:
    /// [`Lease::release_to`](crate::Lease::release_to) is then refused with
    /// [`LeaseError::Unsupported`](crate::LeaseError::Unsupported) before anything changes.
    fn records_preference(&self) -> bool {
        false
    }

    /// Gives the tenure up like [`release`](Self::release), in the same single compare-and-swap,
    /// and records `preferred` as the preferred next holder of the released record. Called only
    /// when [`records_preference`](Self::records_preference) is `true`.
    ///
    /// A backend that records preferences must also honour them: while a released record names
    /// a preferred holder other than `settings.owner()`, `try_acquire` answers
    /// [`AcquireAttempt::HeldByOther`] (with `holder: None`) until one TTL after this process
    /// first observed that record, on its monotonic clock (the record's own duration, like an
    /// expiry), and `wait_for_change` wakes when that window ends or the record changes. The
    /// preferred holder claims it at once, and every claim clears the preference.
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release).
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release).
    fn release_to(
        &self,
        settings: &LeaseSettings,
        tenure: Self::Tenure,
        preferred: &str,
    ) -> impl Future<Output = Result<ReleaseOutcome, Self::Error>> + Send {
        let _ = preferred;
        self.release(settings, tenure)
    }

    /// Gives the tenure up like [`release`](Self::release) and, where the backend can do it
    /// safely, makes `target` the holder in the same single compare-and-swap, so that `target`
    /// takes over without a write of its own (a planned move costs one write instead of two).
    /// The default is a plain [`release`](Self::release).
    ///
    /// A backend that overrides it must keep every rule of a claim for `target`: the new record
    /// lasts only as long as `target` itself keeps it alive (so a `target` that is gone, or never
    /// takes it up, frees it within one TTL), its fencing token rises, and `target`'s
    /// `try_acquire` takes it up only when it can prove, from its own monotonic clock, how long
    /// the record is valid. When the handover cannot be written (an unknown or expired `target`)
    /// it releases plainly.
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release).
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release).
    fn hand_over(
        &self,
        settings: &LeaseSettings,
        tenure: Self::Tenure,
        target: &str,
    ) -> impl Future<Output = Result<ReleaseOutcome, Self::Error>> + Send {
        let _ = target;
        self.release(settings, tenure)
    }

    /// Gives `tenure` up for good ([`Lease::retire`](crate::Lease::retire)): releases it and
    /// removes the record where the store keeps one after a release. Where the record cannot be
    /// removed, a plain release. The default is [`release`](Self::release).
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release).
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release).
    fn retire(
        &self,
        settings: &LeaseSettings,
        tenure: Self::Tenure,
    ) -> impl Future<Output = Result<ReleaseOutcome, Self::Error>> + Send {
        self.release(settings, tenure)
    }

    /// [`retire`](Self::retire) of a member tenure whose bound tenures (all ended by now) are
    /// handed on to the targets `handed` names, in the same write
    /// ([`Lease::retire_handing`](crate::Lease::retire_handing)). A backend that does it must
    /// keep the binding rules for the listed records: each is its target's to claim while the
    /// target's member tenure lives (the target claims it at once, with a compare-and-swap that
    /// writes the record's fencing token plus one), and free once it does not; and the write
    /// must exclude any
    /// contender's claim made by the member's expiry (a claim by expiry first ends the member
    /// record with a compare-and-swap, so that a handover landing late is refused). The
    /// default is [`retire`](Self::retire).
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release).
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release).
    fn retire_handing(
        &self,
        settings: &LeaseSettings,
        tenure: Self::Tenure,
        handed: &[crate::HandedShard],
    ) -> impl Future<Output = Result<ReleaseOutcome, Self::Error>> + Send {
        let _ = handed;
        self.retire(settings, tenure)
    }

    /// Keeps a plan of where the shards bound to member tenure `ended` go, for the write that
    /// ends that member's record once a claim of this process finds it expired (see
    /// [`Lease::plan_hand_on`](crate::Lease::plan_hand_on)). A backend that uses it lists only
    /// records bound to `ended`, in the very compare-and-swap that ends the expired member
    /// record, with the binding rules of [`retire_handing`](Self::retire_handing). The default
    /// keeps nothing.
    fn plan_hand_on(&self, ended: &crate::Binding, handed: Vec<crate::HandedShard>) {
        let _ = (ended, handed);
    }

    /// Has every later renewal of this lease's current tenure mark its record as leaving
    /// ([`Lease::mark_leaving`](crate::Lease::mark_leaving), which renews at once after it), for
    /// [`GroupRecord::leaving`](crate::GroupRecord::leaving). The default marks nothing.
    fn mark_leaving(&self) {}

    /// Resolves when the store shows that the tenure with fencing `token` was lost (taken over,
    /// deleted), for a prompt `on_lost`; it runs for the whole tenure and is dropped when the
    /// tenure ends. The default never resolves: losses are then found by renewals only.
    ///
    /// # Errors
    ///
    /// When the watch broke: `ManagedLease` calls it again after a short backoff (renewals still
    /// detect losses meanwhile).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped whenever the tenure ends; it must only observe.
    fn watch_lost(
        &self,
        settings: &LeaseSettings,
        token: FencingToken,
    ) -> impl Future<Output = Result<LostReason, Self::Error>> + Send {
        let _ = (settings, token);
        std::future::pending()
    }

    /// Removes claims of this backend whose answer never arrived (a claim that timed out, failed
    /// with an unknown outcome, or whose future was dropped) and that the store may therefore
    /// hold; `release` calls it when no tenure is held, so that it does not answer `Ok(true)`
    /// over a claim that still blocks others. The default does nothing: such a claim then expires
    /// by its TTL (or is taken over by the next acquire of the same owner).
    ///
    /// # Errors
    ///
    /// When the store could not be asked: `release` then answers the error.
    ///
    /// # Cancel safety
    ///
    /// Dropped at the operation timeout; the claim is then removed later or expires.
    fn release_unanswered(
        &self,
        settings: &LeaseSettings,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = settings;
        std::future::ready(Ok(()))
    }

    /// Identifies the store this backend writes to (for example the API server and namespace),
    /// so that [`ManagedLease`](crate::ManagedLease) can refuse a second live instance with the
    /// same store, name and owner in one process (the store could not tell them apart). The
    /// default, `None`, skips that check.
    fn store_id(&self) -> Option<String> {
        None
    }

    /// Watches every record of the store whose lease name starts with `prefix` (a group): see
    /// the [`group`](crate::GroupWatch) documentation. One list and one watch for the whole group,
    /// never a request per record per interval. The default answers
    /// [`GroupError::Unsupported`].
    ///
    /// # Errors
    ///
    /// [`GroupError::Unsupported`] when the backend cannot; [`GroupError::NoRuntime`] outside a
    /// Tokio runtime when the watch needs one; [`GroupError::Backend`] when it cannot start.
    fn watch_group(&self, prefix: &str) -> Result<GroupWatch, GroupError> {
        let _ = prefix;
        Err(GroupError::Unsupported { backend: "custom" })
    }

    /// Whether [`wait_for_change`](Self::wait_for_change) really watches the store: it then resolves
    /// when the lease is released or deleted, and at the instant the current claim expires (by the
    /// observed-time model), so a waiting contender needs no periodic attempts. The default is
    /// `false`: waiting contenders try again every `acquire_retry_delay`.
    fn notifies_changes(&self) -> bool {
        false
    }

    /// Resolves when the lease may have become free for `settings.owner()` (released, expired,
    /// deleted), or at the latest at `not_after`. Contenders wait on it between attempts instead of
    /// sleeping a fixed delay; the default sleeps until `not_after`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes (a caller's `acquire_within` future may be dropped at any
    /// time).
    fn wait_for_change(
        &self,
        settings: &LeaseSettings,
        not_after: Instant,
    ) -> impl Future<Output = ()> + Send {
        let _ = settings;
        tokio::time::sleep_until(not_after)
    }
}
