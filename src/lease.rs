//! The lease contract every backend implements.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::settings::LeaseSettings;
use crate::tenure::TenureWatch;
pub use crate::vocab::{
    BoxError, FencingToken, LeaseError, LeaseLost, LostReason, Operation, SharedError,
};

type Handler = Arc<dyn Fn(&LeaseLost) + Send + Sync + 'static>;

/// The `on_lost` handlers of one lease. Backends built on
/// [`ManagedLease`](crate::ManagedLease) get one for free; others can reuse it.
#[derive(Default)]
pub struct LostHandlers {
    inner: Arc<Mutex<HandlerTable>>,
}

#[derive(Default)]
struct HandlerTable {
    next_id: u64,
    handlers: Vec<(u64, Handler)>,
}

impl fmt::Debug for LostHandlers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostHandlers")
            .field("len", &self.len())
            .finish()
    }
}

impl LostHandlers {
    /// An empty set of handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler`; it stays registered until the returned subscription is dropped or
    /// [`LostSubscription::unsubscribe`]d.
    pub fn subscribe(
        &self,
        handler: impl Fn(&LeaseLost) + Send + Sync + 'static,
    ) -> LostSubscription {
        let mut table = lock(&self.inner);
        let id = table.next_id;
        table.next_id += 1;
        table.handlers.push((id, Arc::new(handler)));
        LostSubscription {
            table: Arc::downgrade(&self.inner),
            id,
        }
    }

    /// Calls every registered handler with `lost`; a panicking handler is logged and does not stop
    /// the others. Returns how many handlers ran.
    pub fn notify(&self, lost: &LeaseLost) -> usize {
        let handlers: Vec<Handler> = lock(&self.inner)
            .handlers
            .iter()
            .map(|(_, h)| Arc::clone(h))
            .collect();
        for handler in &handlers {
            let call = std::panic::AssertUnwindSafe(|| handler(lost));
            if std::panic::catch_unwind(call).is_err() {
                tracing::error!(lease = %lost.name, owner = %lost.owner, "an on_lost handler panicked");
            }
        }
        handlers.len()
    }

    /// The number of registered handlers.
    pub fn len(&self) -> usize {
        lock(&self.inner).handlers.len()
    }

    /// Whether no handler is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A handler never runs under this lock, so a poisoned lock only means a panic in our own
    // trivial bookkeeping; the table is still consistent.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps an `on_lost` handler registered; dropping it (or calling
/// [`unsubscribe`](LostSubscription::unsubscribe)) removes the handler.
#[must_use = "the handler is removed when the subscription is dropped; use `detach` to keep it"]
#[derive(Debug)]
pub struct LostSubscription {
    table: Weak<Mutex<HandlerTable>>,
    id: u64,
}

impl LostSubscription {
    /// Removes the handler now. It is not called for any loss notified after this returns.
    pub fn unsubscribe(self) {
        drop(self)
    }

    /// Keeps the handler registered for as long as the lease lives.
    pub fn detach(mut self) {
        self.table = Weak::new();
    }
}

impl Drop for LostSubscription {
    fn drop(&mut self) {
        if let Some(table) = self.table.upgrade() {
            lock(&table).handlers.retain(|(id, _)| *id != self.id);
        }
    }
}

/// The lease contract.
///
/// A lease is a distributed lock with a time to live (TTL). At most one *owner* holds a lease
/// *name* at a time; a holder renews it in the background; a holder that stops renewing (crash,
/// pause, partition) loses it when the TTL runs out, and another owner can then take it.
///
/// # The operations
///
/// * [`Lease::acquire`] resolves `Ok(true)` when this owner now holds the lease, `Ok(false)` when
///   another owner definitely holds it (after `acquire_retries` more attempts), and `Err` when the
///   outcome is unknown (backend unreachable, timeout; a timeout is not retried). It is
///   reentrant: acquiring a lease this owner already holds resolves `Ok(true)` and keeps the one
///   renewal loop.
/// * [`Lease::acquire_within`] keeps trying (also through errors) until held or a deadline.
/// * [`Lease::release`] resolves `Ok(true)` when the lease is definitely released, `Ok(false)` when
///   it definitely is not (another owner holds it), and `Err` when unknown. Releasing a lease that
///   is not held is a no-op. Renewal stops *before* the backend is told.
/// * [`Lease::tenure`] is the tenure as one observable value ([`TenureWatch`]): its start, every
///   renewal and every end (loss, deadline, release through any handle, drop). [`Lease::check_alive`],
///   [`Lease::fencing_token`] and [`Lease::deadline`] read it; a [`TenureGuard`](crate::TenureGuard)
///   from it binds code to one tenure.
/// * [`Lease::on_lost`] registers a handler called once per involuntary loss.
///
/// # Why `check_alive` can be trusted
///
/// The holder computes a deadline from its own monotonic clock: the instant its last successful
/// renewal *started*, plus the TTL, minus a clock drift margin. A contender can only see that renewal
/// after it happened and counts the TTL from when *it* saw it, so the holder's deadline passes first,
/// even when the renewal task is stuck or the whole process was paused: `check_alive` reads the clock,
/// not a flag the renewal task might fail to clear. There is no window in which `check_alive` says
/// `true` while another owner could already hold the lease (within the clock-rate bound of the margin).
///
/// # The races to keep in mind
///
/// * `check_alive() == true` says the lease was held *at the moment of the call*. Work that takes
///   time must check again, or better, pass the [`FencingToken`] to the system it writes to so that
///   writes from a stale holder are rejected there.
/// * `on_lost` handlers run on the renewal task (or in the `acquire` that finds the previous
///   tenure dead); they must not block. A panicking handler is caught and does not stop the others.
/// * A loss is signalled at most once per tenure (from one successful `acquire` to the next loss or
///   release); a voluntary [`Lease::release`] is not a loss, but it ends the tenure for every reader
///   of [`Lease::tenure`].
///
/// Implementations are cheap to share (`Send + Sync + 'static`) and return `Send` futures, so they
/// can be used from any actor or task. Backends implement [`LeaseBackend`](crate::LeaseBackend)
/// and get this trait from [`ManagedLease`](crate::ManagedLease). A type can also implement it
/// directly: it publishes its tenures through a [`TenurePublisher`](crate::TenurePublisher) (the
/// rules it must keep are there) and its `on_lost` handlers through a [`LostHandlers`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use actix_coordination::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let settings = |owner: &str| LeaseSettings::builder("orders", owner)
///     .ttl(Duration::from_secs(10))
///     .build();
/// let a = InMemoryLease::new(settings("node-a")?, &store);
/// let b = InMemoryLease::new(settings("node-b")?, &store);
///
/// assert!(a.acquire().await?);                       // a holds it
/// assert!(!b.acquire().await?);                      // b does not: Ok(false), not an error
/// let token = a.fencing_token().expect("held");      // pass it with every write
/// assert!(a.check_alive());
///
/// a.release().await?;                                // hand over at once
/// assert!(b.acquire().await?);
/// assert!(b.fencing_token().unwrap() > token);       // a new tenure: a higher token
/// # Ok(())
/// # }
/// ```
pub trait Lease: Send + Sync + 'static {
    /// The validated settings of this lease.
    fn settings(&self) -> &LeaseSettings;

    /// The lease name.
    fn name(&self) -> &str {
        self.settings().name()
    }

    /// This holder's owner identity.
    fn owner(&self) -> &str {
        self.settings().owner()
    }

    /// Tries to take the lease for this owner.
    ///
    /// Resolves `Ok(true)` when this owner now holds the lease (also when it already held it),
    /// `Ok(false)` when another owner holds it after `acquire_retries` more attempts. A retry
    /// follows an answer that another owner holds the lease (after waiting up to
    /// `acquire_retry_delay` for the backend to report a change) or a transient error the backend
    /// answered (after `acquire_retry_delay`); a call that *timed out* is not retried. So it
    /// resolves within `(acquire_retries + 1) × operation_timeout + acquire_retries ×
    /// acquire_retry_delay`, plus the time another `acquire` or `release` of the same instance in
    /// flight takes, and after one operation timeout on a backend that does not answer.
    ///
    /// # Errors
    ///
    /// [`LeaseError`] when the outcome is unknown or refused: a call timed out
    /// ([`LeaseError::Timeout`], after that one call), the last attempt failed with a transient
    /// error, the backend refused (for example for lack of permission; not retried), or another
    /// instance of the same lease in this process holds it ([`LeaseError::DuplicateInstance`]).
    /// Called outside a Tokio runtime: [`LeaseError::NoRuntime`], and nothing is attempted.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is safe: an attempt in flight is finished in the background (within
    /// the operation timeout) and a claim it made is released at once; a later `acquire` or
    /// `release` of the same instance waits for that, and a `release` reports its error if it
    /// failed.
    fn acquire(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send;

    /// Keeps trying until this owner holds the lease or `timeout` has passed: the way to wait for a
    /// lease. Resolves `Ok(true)` once held, `Ok(false)` when another owner still holds it at the
    /// deadline.
    ///
    /// Leases built on [`ManagedLease`](crate::ManagedLease) make single attempts, start none
    /// after the deadline, and so never resolve later than `timeout` plus one operation timeout;
    /// between attempts they wait on the backend's own change notification (a watch), so a
    /// release is noticed within a round trip and an expiry at its instant, without polling, and
    /// after a transient error they wait `acquire_retry_delay`. This default implementation calls
    /// [`acquire`](Lease::acquire) (with its retries) every `acquire_retry_delay` instead, and can
    /// resolve up to one whole `acquire` after the deadline.
    ///
    /// # Errors
    ///
    /// The last attempt's [`LeaseError`] when the deadline passes after a failed attempt, or at
    /// once for errors that retrying cannot fix (permission denied). Called outside a Tokio
    /// runtime: [`LeaseError::NoRuntime`] at once, and nothing is attempted.
    ///
    /// # Cancel safety
    ///
    /// As for [`acquire`](Lease::acquire).
    fn acquire_within(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        async move {
            let deadline = deadline_after(timeout);
            loop {
                let result = self.acquire().await;
                match &result {
                    Ok(true) => return result,
                    Err(error) if !error.is_transient() => return result,
                    _ if Instant::now() >= deadline => return result,
                    _ => {}
                }
                let pause = self.settings().acquire_retry_delay();
                tokio::time::sleep_until(deadline.min(Instant::now() + pause)).await;
            }
        }
    }

    /// Gives the lease up.
    ///
    /// Resolves `Ok(true)` when it is definitely released (or was not held), `Ok(false)` when
    /// another owner definitely holds it. The tenure ends for every reader of
    /// [`tenure`](Lease::tenure) (`check_alive` is `false`) the moment this is called, then renewal
    /// stops, then the backend is told.
    ///
    /// # Errors
    ///
    /// [`LeaseError`] when it is unknown whether the backend released the lease; it then expires
    /// after its TTL at the latest. Until then every further `release` answers that same error
    /// (never `Ok(true)` while the record may still be held), unless an `acquire` reached the
    /// store meanwhile, or the lease released the claim itself (leases built on
    /// [`ManagedLease`](crate::ManagedLease) ask the store again with a backoff, through
    /// [`LeaseBackend::release_unanswered`](crate::LeaseBackend::release_unanswered), so that the
    /// next owner waits no TTL once the store answers); once the TTL (plus the clock drift
    /// margin) has passed since the failure, `release` answers `Ok(true)` (a bound lease's record
    /// does not expire: it is removed from the store first). The same holds for a claim that a dropped `acquire` made and
    /// whose release in the background failed. Called outside a Tokio runtime:
    /// [`LeaseError::NoRuntime`], and nothing changes (a tenure stays held and renewed).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is safe: the tenure has ended locally, and the release is finished in
    /// the background (within the operation timeout).
    fn release(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send;

    /// Gives the lease up *to `target`*: a [`release`](Lease::release) that also records `target`
    /// as the preferred next holder, for a planned move of leadership (a rolling update, a drain).
    ///
    /// The tenure ends exactly as with `release`. In the store, the record is free, and names
    /// `target` as preferred: `target` may claim it at once, while every other contender of this
    /// crate treats it as held for one TTL after it observed the released record (on its own
    /// monotonic clock, like an expiry), and wakes when that window ends. A `target` that is dead,
    /// partitioned or not contending therefore delays the next holder by one TTL at most. A
    /// client that knows nothing of preferences (client-go's `LeaseLock`) sees an ordinary
    /// released lease and may take it at once. The preference is cleared by the next claim.
    ///
    /// Resolves `Ok(true)` once the lease is released with the preference recorded; `Ok(false)`
    /// when there was nothing to hand over: this owner did not hold the lease, or another owner
    /// definitely holds it.
    ///
    /// # Errors
    ///
    /// [`LeaseError::InvalidTransferTarget`] when `target` is empty, longer than an owner may be,
    /// has a control character or is this owner, and [`LeaseError::Unsupported`] when the lease's
    /// backend cannot record a preference (this default implementation): in both cases nothing
    /// changed. Otherwise as [`release`](Lease::release).
    ///
    /// # Cancel safety
    ///
    /// As for [`release`](Lease::release).
    /// Whether [`release_to`](Lease::release_to) can record a preferred next holder on this
    /// lease's backend (the in-memory, Kubernetes and etcd backends can). The default is `false`.
    fn records_preference(&self) -> bool {
        false
    }

    fn release_to(&self, target: &str) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        let _ = target;
        std::future::ready(Err(LeaseError::Unsupported {
            operation: crate::vocab::Operation::Release,
            what: "record a preferred next holder",
        }))
    }

    /// Gives the lease up *to `target`*, the owner that should hold it next, for a planned move
    /// to a contender known to be waiting (a shard moving to the node placement chose for it).
    ///
    /// The tenure ends exactly as with [`release`](Lease::release). Where the backend can make
    /// `target` the holder safely in the same single write, it does, and `target` takes it up
    /// without a write of its own: a move costs one write instead of two.
    ///
    /// * etcd: the key moves, by compare-and-swap, to the etcd lease of `target`.
    /// * Kubernetes: the object names `target` as its holder, by compare-and-swap, and the newest
    ///   version of an object held by `target` that this session had seen; `target` takes it up
    ///   when its own session wrote that version (it then knows from its own clock a moment
    ///   before the handover), and claims it with a compare-and-swap otherwise.
    /// * In memory: the record goes to `target`.
    ///
    /// Everywhere else, and when that write cannot be made (a `target` this process has not seen
    /// holding anything, or whose etcd lease is gone), it is a plain `release`. Unlike
    /// [`release_to`](Lease::release_to) it records no preference: nobody waits for `target`.
    ///
    /// A `target` that never takes the lease up does not keep it: on etcd the record lives only
    /// as long as `target`'s own etcd lease, which `target` renews only while it runs; on
    /// Kubernetes it expires like any record `target` stops renewing (one TTL after a contender
    /// sees it); and a contender of this crate takes up a record handed to it whenever it next
    /// competes.
    ///
    /// Resolves like [`release`](Lease::release). The default is `release`.
    ///
    /// # Errors
    ///
    /// [`LeaseError::InvalidTransferTarget`] when `target` is empty, longer than an owner may be,
    /// has a control character or is this owner (nothing changed). Otherwise as
    /// [`release`](Lease::release).
    ///
    /// # Cancel safety
    ///
    /// As for [`release`](Lease::release).
    fn hand_over(&self, target: &str) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        let checked = check_target(self, target);
        async move {
            checked?;
            self.release().await
        }
    }

    /// Gives the lease up for good: a [`release`](Lease::release) that also removes the lease's
    /// record where the backend keeps one after a release, for a lease whose name will not be
    /// claimed again, such as a node's membership or candidacy under an identity that the next
    /// rollout replaces (a Deployment's pod name).
    ///
    /// * Kubernetes: the object is deleted, with a precondition on the tenure's
    ///   `resourceVersion` (a compare-and-swap, one request instead of the release's `PUT`).
    ///   Where it cannot be (the account may not `delete` leases, a write raced it), the lease is
    ///   released as by `release` and the object stays; a missing permission is logged once per
    ///   lease, naming the RBAC rule.
    /// * etcd: a release already deletes the key, so this is `release`.
    /// * In memory, and the default: `release`.
    ///
    /// A new claim of the name starts a new record, with fencing tokens counted afresh: retire
    /// only leases whose tokens fence nothing outside the process (the crate's member and
    /// candidacy leases).
    ///
    /// Resolves like [`release`](Lease::release).
    ///
    /// # Errors
    ///
    /// As [`release`](Lease::release): a record that could not be removed is not an error.
    ///
    /// # Cancel safety
    ///
    /// As for [`release`](Lease::release).
    fn retire(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        self.release()
    }

    /// [`retire`](Lease::retire) for a member lease that anchors bound shard leases (see
    /// [`Binding`](crate::Binding)): in the same single write that ends its tenure, hands each of
    /// `handed` on to its target: while the target's member tenure that the entry names lives,
    /// the record is the target's alone to claim, which it does with one compare-and-swap of its
    /// own (bound to that tenure) as soon as its watch shows the list; nobody else may claim it.
    ///
    /// The bound tenures of this lease end first (as for any end of the member tenure). Every
    /// listed shard record must be bound to this lease's current tenure; the others are freed as
    /// by `retire`.
    ///
    /// * Kubernetes: the member object is released with the list in its annotation
    ///   [`KUBERNETES_HANDED_SHARDS_ANNOTATION`](crate::KUBERNETES_HANDED_SHARDS_ANNOTATION) (a
    ///   compare-and-swap on the tenure's `resourceVersion`). Each target claims its shards
    ///   with a compare-and-swap each; the object is deleted once every listed shard
    ///   record moved on (or, if that takes longer than half the operation timeout, left
    ///   released with the entries that are still needed).
    /// * Everywhere else, and the default: `retire` (the shards are freed and claimed).
    ///
    /// Resolves like [`release`](Lease::release).
    ///
    /// # Errors
    ///
    /// As [`retire`](Lease::retire).
    ///
    /// # Cancel safety
    ///
    /// As for [`release`](Lease::release).
    fn retire_handing(
        &self,
        handed: Vec<crate::HandedShard>,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        let _ = handed;
        self.retire()
    }

    /// Plans where the shards bound to member tenure `ended` (another owner's, which this
    /// process sees expired) go: should a claim by this process find that tenure expired and
    /// end its member record, the same compare-and-swap lists them as
    /// [`retire_handing`](Lease::retire_handing) would have, each with its target (an owner and
    /// that owner's member tenure). The targets then claim them, each with a compare-and-swap,
    /// as from a member that left. Call it on a member lease; the latest plan for a member tenure counts.
    ///
    /// Nothing is written here: the plan is used only by the write that ends the expired member
    /// record, after the same confirmation as any claim by expiry, and only for the records this
    /// process's watch shows bound to that tenure. A record not listed is freed as before.
    ///
    /// * Kubernetes: kept by the session of this lease (its leases share it).
    /// * Everywhere else, and the default: nothing (the shards are freed and claimed).
    fn plan_hand_on(&self, ended: &crate::Binding, handed: Vec<crate::HandedShard>) {
        let _ = (ended, handed);
    }

    /// Marks this (member) lease's current tenure as leaving: its record says so from the next
    /// write of the tenure on, which comes at once (a renewal sent now, not at its interval),
    /// so that the other members place nothing on its holder any more (see
    /// [`GroupRecord::leaving`](crate::GroupRecord::leaving)). A sharded node leaving with a
    /// worker slower than its leave grace calls it. Nothing is written when no tenure is held;
    /// a later tenure is not marked.
    ///
    /// * Kubernetes and in memory: the renewal writes the mark.
    /// * Everywhere else, and the default: nothing (the members see the holder go when it
    ///   retires).
    fn mark_leaving(&self) {}

    /// The tenure of this lease as one observable value: see [`TenureWatch`]. Every reader of
    /// the lease's state (`check_alive`, `fencing_token`, `deadline`, the actors) reads it.
    fn tenure(&self) -> &TenureWatch;

    /// Whether this owner holds the lease right now, by its local monotonic deadline. Never blocks,
    /// never does I/O.
    fn check_alive(&self) -> bool {
        self.tenure().check_alive()
    }

    /// Registers a handler called once each time a held lease is lost (not on a release). See
    /// [`LostHandlers`].
    ///
    /// Leases built on [`ManagedLease`](crate::ManagedLease) call it from their renewal task,
    /// which runs on the runtime of the `acquire` that started the tenure: at the deadline when
    /// that runtime runs (later when it is blocked: `check_alive` and the tenure's readers are
    /// never late), and at once, with [`LostReason::RenewalStopped`], when that runtime shuts
    /// down or the backend panics in a renewal.
    fn on_lost(&self, handler: impl Fn(&LeaseLost) + Send + Sync + 'static) -> LostSubscription;

    /// The holder of the lease as this process last saw it: this owner while its tenure is
    /// alive, otherwise the holder the backend named in its last answer to this lease (an
    /// attempt that found it held, a loss to a new holder), `None` when unknown or free. It is
    /// informational (for status pages such as the example web service's `/leases`): it can be
    /// stale, and must never be used to decide anything.
    ///
    /// The default implementation knows only this owner's own tenure.
    fn observed_holder(&self) -> Option<String> {
        self.check_alive().then(|| self.owner().to_owned())
    }

    /// Watches the group of leases in this lease's store whose names start with `prefix`
    /// (membership, who holds what); see [`GroupWatch`](crate::GroupWatch). Leases built on
    /// [`ManagedLease`](crate::ManagedLease) ask their backend
    /// ([`LeaseBackend::watch_group`](crate::LeaseBackend::watch_group)); the default answers
    /// [`GroupError::Unsupported`](crate::GroupError::Unsupported).
    ///
    /// # Errors
    ///
    /// As [`LeaseBackend::watch_group`](crate::LeaseBackend::watch_group).
    fn watch_group(&self, prefix: &str) -> Result<crate::GroupWatch, crate::GroupError> {
        let _ = prefix;
        Err(crate::GroupError::Unsupported { backend: "custom" })
    }

    /// The anchor that binds other leases' tenures to this lease's tenures (see
    /// [`Binding`](crate::Binding)): `None` when the lease's backend cannot bind. Leases built on
    /// [`ManagedLease`](crate::ManagedLease) answer when their backend
    /// [binds](crate::LeaseBackend::binds) (in memory and on Kubernetes).
    fn binding_anchor(&self) -> Option<crate::BindingAnchor> {
        None
    }

    /// Binds every future tenure of this lease to the tenure of `anchor`'s lease (see
    /// [`Binding`](crate::Binding)): claims name that member tenure and are never renewed; the
    /// tenure lives exactly as long as the member tenure it was claimed under, and `acquire`
    /// fails with [`LeaseError::Unbound`] while the member lease is not held. Call it before the
    /// first `acquire`; a lease is bound once (binding it again to the same anchor changes
    /// nothing).
    ///
    /// # Errors
    ///
    /// [`LeaseError::Unsupported`] when this lease cannot be bound (its backend does not bind,
    /// `anchor` belongs to another store or to this very lease, or it is bound already).
    fn bind_to(&self, anchor: &crate::BindingAnchor) -> Result<(), LeaseError> {
        let _ = anchor;
        Err(LeaseError::Unsupported {
            operation: crate::Operation::Acquire,
            what: "bind a lease to another lease's tenure",
        })
    }

    /// The member lease this lease is bound to ([`bind_to`](Self::bind_to)), if any.
    fn bound_to(&self) -> Option<String> {
        None
    }

    /// The fencing token of the tenure alive right now (`None` when not held or past the
    /// deadline).
    fn fencing_token(&self) -> Option<FencingToken> {
        self.tenure().current().map(|t| t.token())
    }

    /// The instant at which `check_alive` turns `false` unless a renewal succeeds first, while the
    /// lease is held and before that instant.
    fn deadline(&self) -> Option<Instant> {
        self.tenure().current().map(|t| t.deadline())
    }
}

/// Refuses a transfer of `lease` to `target` that could not work: a backend that cannot record a
/// preference, or a target that cannot hold the lease.
pub(crate) fn check_transfer_target(lease: &impl Lease, target: &str) -> Result<(), LeaseError> {
    if !lease.records_preference() {
        return Err(LeaseError::Unsupported {
            operation: crate::vocab::Operation::Release,
            what: "record a preferred next holder",
        });
    }
    check_target(lease, target)
}

/// Whether `target` may be named as the next holder of `lease`: a valid owner, not this one.
pub(crate) fn check_target(lease: &(impl Lease + ?Sized), target: &str) -> Result<(), LeaseError> {
    let reason = if target == lease.owner() {
        Some("it is this owner")
    } else {
        crate::settings::identifier_problem(target, crate::settings::MAX_OWNER_LEN)
    };
    match reason {
        Some(reason) => Err(LeaseError::InvalidTransferTarget {
            name: lease.name().to_owned(),
            target: target.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// `now + timeout`, or about 30 years from now when that would overflow (`Duration::MAX` means
/// "no deadline").
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn lost() -> LeaseLost {
        LeaseLost {
            name: "n".into(),
            owner: "o".into(),
            reason: LostReason::Deleted,
            fencing_token: Some(FencingToken::new(3)),
        }
    }

    #[test]
    fn panicking_handler_does_not_stop_the_others() {
        let handlers = LostHandlers::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let c1 = calls.clone();
        let _a = handlers.subscribe(move |_| {
            c1.fetch_add(1, Ordering::SeqCst);
        });
        let _b = handlers.subscribe(|_| panic!("handler bug"));
        let c2 = calls.clone();
        let _c = handlers.subscribe(move |l| {
            assert_eq!(l.fencing_token, Some(FencingToken::new(3)));
            c2.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(handlers.notify(&lost()), 3);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn unsubscribe_explicitly_and_on_drop_and_detach() {
        let handlers = LostHandlers::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let sub = |c: &Arc<AtomicUsize>| {
            let c = c.clone();
            handlers.subscribe(move |_| {
                c.fetch_add(1, Ordering::SeqCst);
            })
        };
        let a = sub(&calls);
        let b = sub(&calls);
        sub(&calls).detach();
        a.unsubscribe();
        drop(b);
        assert_eq!(handlers.len(), 1);
        handlers.notify(&lost());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("connection refused by 10.0.0.1")]
    struct Refused;

    impl crate::vocab::BackendError for Refused {
        fn is_transient(&self) -> bool {
            true
        }
    }

    /// `Display` says what failed, the cause is only the `source` (error-chain reporters would
    /// print it twice otherwise); a clone keeps the variant and the source.
    #[test]
    fn backend_errors_name_the_operation_and_keep_the_cause_as_source() {
        let error = LeaseError::backend(Operation::Acquire, Refused);
        assert_eq!(error.to_string(), "acquire failed");
        let source = std::error::Error::source(&error).expect("a source");
        assert_eq!(source.to_string(), "connection refused by 10.0.0.1");
        let clone = error.clone();
        assert!(matches!(
            &clone,
            LeaseError::Backend {
                operation: Operation::Acquire,
                transient: true,
                ..
            }
        ));
        assert!(
            clone.backend_error::<Refused>().is_some(),
            "same source type"
        );
        assert!(clone.is_transient());
        let timeout = LeaseError::Timeout {
            operation: Operation::Release,
            timeout: Duration::from_secs(5),
        };
        assert!(matches!(timeout.clone(), LeaseError::Timeout { .. }));
        assert_eq!(timeout.to_string(), "release timed out after 5s");
    }

    #[test]
    fn reasons_read_well() {
        assert_eq!(
            LostReason::TakenOver {
                holder: Some("b".into())
            }
            .to_string(),
            "taken over by b"
        );
        assert!(lost().to_string().contains("deleted"));
    }
}
