//! [`LeaseActor`]: a lease driven by actix mailbox messages.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use tokio::sync::{oneshot, watch};

use crate::lease::{FencingToken, Lease, LeaseError, LeaseLost, LostSubscription, Operation};
use crate::tenure::TenureWatch;

impl Message for LeaseLost {
    type Result = ();
}

/// Take the lease; answers like [`Lease::acquire`], or [`LeaseError::Superseded`] when a
/// [`Release`] received after it (or the actor's stop) came before it answered.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<bool, LeaseError>")]
pub struct Acquire;

/// Give the lease up; answers like [`Lease::release`].
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<bool, LeaseError>")]
pub struct Release;

/// Whether the lease is held right now; answers like [`Lease::check_alive`].
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "bool")]
pub struct CheckAlive;

/// The fencing token of the current tenure, if held.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Option<FencingToken>")]
pub struct GetFencingToken;

/// A receiver of the lease's tenure ([`TenureWatch`]): every start and end of a tenure, loss,
/// deadline and release through any handle included. Subscribe an actor with
/// `ctx.add_stream(watch.stream())`, or take a [`TenureGuard`](crate::TenureGuard) from it.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "TenureWatch")]
pub struct GetTenure;

/// Identifies a [`LeaseLost`] subscription, for [`UnsubscribeLeaseLost`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, MessageResponse)]
pub struct SubscriptionId(u64);

/// Deliver [`LeaseLost`] to `0` once per loss until unsubscribed or stopped.
#[derive(Debug, Clone, Message)]
#[rtype(result = "SubscriptionId")]
pub struct SubscribeLeaseLost(pub Recipient<LeaseLost>);

/// Remove a subscription; answers whether it existed (`false` also once its subscriber stopped and
/// the subscription was dropped at a loss).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "bool")]
pub struct UnsubscribeLeaseLost(pub SubscriptionId);

#[derive(Default)]
struct Subscribers {
    next: u64,
    by_id: BTreeMap<u64, Recipient<LeaseLost>>,
}

impl Subscribers {
    fn deliver(&mut self, lost: &LeaseLost) {
        self.by_id.retain(|_, recipient| {
            if !recipient.connected() {
                return false;
            }
            match recipient.try_send(lost.clone()) {
                Ok(()) => true,
                Err(SendError::Full(msg)) => {
                    // A full mailbox must not lose the notification.
                    recipient.do_send(msg);
                    true
                }
                Err(SendError::Closed(_)) => false,
            }
        });
    }
}

/// An actor that owns one lease.
///
/// Send it [`Acquire`], [`Release`], [`CheckAlive`] and [`GetFencingToken`]; subscribe other actors
/// to [`LeaseLost`] with [`SubscribeLeaseLost`]. Every live subscriber receives one `LeaseLost` per
/// involuntary loss, straight from the lease's renewal task (it does not wait behind other messages
/// in this actor's mailbox); subscribers that stopped are dropped at the loss. A release (through
/// this actor or any other handle of a shared lease) is not a loss: actors that act under the
/// tenure follow [`GetTenure`]'s [`TenureWatch`], which sees every end.
///
/// # Order of operations
///
/// `Acquire` and `Release` run as futures, one at a time, in the order the actor received them;
/// the actor keeps answering `CheckAlive`, `GetFencingToken` and `GetTenure` at once while one is
/// in flight. A `Release` *supersedes* every `Acquire` received before it that has not answered
/// yet (one waiting for its turn, or retrying while another owner holds the lease): that acquire
/// stops trying and answers [`LeaseError::Superseded`], and a claim its attempt in flight obtains
/// is released (the lease finishes such an attempt, see [`Lease::acquire`]'s cancel safety) before
/// the `Release` runs. So when the last of a series of `Acquire`s and `Release`s was a `Release`,
/// this actor does not hold the lease once that `Release` answered `Ok(true)`, whatever the
/// backend answered in between; when it was an `Acquire`, that acquire ran after every earlier
/// release (tests `release_supersedes_a_retrying_acquire`,
/// `concurrent_messages_are_serialised`, and the property check of `tests/model.rs`).
///
/// # Stopping
///
/// With [`release_on_stop`](LeaseActor::release_on_stop) (the default), a stopping actor
/// supersedes its acquires still in flight the same way, then, on a task of its own (the actor
/// is gone by then), waits for the operations it received to end (at most the lease's operation
/// timeout) and releases the lease if it is held: an acquire in flight at the stop leaves nothing
/// held, also on a lease shared with other handles (a failed release is logged at `warn`; the
/// record then expires after its TTL). Test `stopping_with_an_acquire_in_flight_leaves_nothing_held`.
///
/// ```
/// use actix::prelude::*;
/// use actix_coordination::{Acquire, CheckAlive, InMemoryStore, LeaseActor, LeaseSettings, Release};
///
/// # #[actix_rt::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let lease = store.lease(LeaseSettings::new("jobs", "node-1")?);
/// let actor = LeaseActor::new(lease).start();
/// assert!(actor.send(Acquire).await??);
/// assert!(actor.send(CheckAlive).await?);
/// assert!(actor.send(Release).await??);
/// # Ok(()) }
/// ```
pub struct LeaseActor<L: Lease> {
    lease: Arc<L>,
    subscribers: Arc<Mutex<Subscribers>>,
    _lost: LostSubscription,
    release_on_stop: bool,
    /// Set to `true` (and replaced) by a release or the stop: supersedes the acquires received
    /// before it.
    supersede: watch::Sender<bool>,
    /// Ends (its sender is dropped) when the last operation received has ended.
    last_op: Option<oneshot::Receiver<Infallible>>,
}

/// An operation's place in the actor's queue: it starts after `previous` ended, and `done` is
/// dropped when it ends (after `previous`, so that the end of one means the end of all before it).
struct Turn {
    previous: Option<oneshot::Receiver<Infallible>>,
    done: oneshot::Sender<Infallible>,
}

impl Turn {
    async fn run<T>(self, op: impl Future<Output = T>) -> T {
        if let Some(previous) = self.previous {
            // An error only: the sender never sends, it is dropped when the operation ends.
            let _ = previous.await;
        }
        let output = op.await;
        drop(self.done);
        output
    }
}

/// Resolves once `superseded` turns `true`; never if its actor is dropped without stopping (the
/// task running this goes with the arbiter).
async fn superseded(mut superseded: watch::Receiver<bool>) {
    if superseded.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl<L: Lease> LeaseActor<L> {
    /// An actor owning `lease`.
    pub fn new(lease: L) -> Self {
        Self::from_arc(Arc::new(lease))
    }

    /// An actor sharing `lease` with other users.
    pub fn from_arc(lease: Arc<L>) -> Self {
        let subscribers = Arc::new(Mutex::new(Subscribers::default()));
        let for_handler = Arc::clone(&subscribers);
        let lost = lease.on_lost(move |lost| {
            lock(&for_handler).deliver(lost);
        });
        Self {
            lease,
            subscribers,
            _lost: lost,
            release_on_stop: true,
            supersede: watch::channel(false).0,
            last_op: None,
        }
    }

    /// Whether the actor releases the lease when it stops (default `true`), also a claim that an
    /// `Acquire` in flight at the stop obtains (see [Stopping](LeaseActor#stopping)); `false`
    /// leaves the lease, and the operations in flight, alone, like a crash.
    pub fn release_on_stop(mut self, release: bool) -> Self {
        self.release_on_stop = release;
        self
    }

    /// The lease.
    pub fn lease(&self) -> &Arc<L> {
        &self.lease
    }

    /// The next operation's place in the queue.
    fn next_turn(&mut self) -> Turn {
        let (done, next) = oneshot::channel();
        Turn {
            previous: self.last_op.replace(next),
            done,
        }
    }

    /// Supersedes every acquire received so far.
    fn supersede_acquires(&mut self) {
        std::mem::replace(&mut self.supersede, watch::channel(false).0).send_replace(true);
    }

    /// The operations received and not yet ended, if any.
    fn pending_ops(&mut self) -> Option<oneshot::Receiver<Infallible>> {
        let mut last = self.last_op.take()?;
        match last.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => Some(last),
            _ => None,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<L: Lease> Actor for LeaseActor<L> {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        if !self.release_on_stop {
            return;
        }
        // An acquire in flight stops trying; a claim its attempt obtains is released by the
        // lease (which holds back every later operation of this instance meanwhile).
        self.supersede_acquires();
        let pending = self.pending_ops();
        if pending.is_none() && !self.lease.check_alive() {
            return;
        }
        let lease = Arc::clone(&self.lease);
        // The arbiter keeps running after this actor: release in the background, after the
        // operations this actor received. Every other handle of a shared lease sees the tenure
        // end.
        actix_rt::spawn(async move {
            if let Some(pending) = pending {
                let bound = lease.settings().operation_timeout();
                if tokio::time::timeout(bound, pending).await.is_err() {
                    tracing::debug!(lease = %lease.name(), owner = %lease.owner(), "operations of a stopped lease actor still in flight after the operation timeout; releasing anyway");
                }
            }
            if !lease.check_alive() {
                return;
            }
            match lease.release().await {
                Ok(true) => {
                    tracing::debug!(lease = %lease.name(), owner = %lease.owner(), "released on stop")
                }
                Ok(false) => {
                    tracing::warn!(lease = %lease.name(), owner = %lease.owner(), "release on stop: another owner holds the lease")
                }
                Err(error) => {
                    tracing::warn!(error = &error as &dyn std::error::Error, lease = %lease.name(), owner = %lease.owner(), "release on stop failed; the record expires after its TTL")
                }
            }
        });
    }
}

impl<L: Lease> Handler<Acquire> for LeaseActor<L> {
    type Result = ResponseFuture<Result<bool, LeaseError>>;

    fn handle(&mut self, _: Acquire, _: &mut Self::Context) -> Self::Result {
        let lease = Arc::clone(&self.lease);
        let superseded_by = self.supersede.subscribe();
        let turn = self.next_turn();
        Box::pin(turn.run(async move {
            // Checked first, and at every wake-up: once superseded, the acquire is dropped (not
            // started if it was still waiting for its turn), and the lease finishes and releases
            // an attempt in flight.
            tokio::select! {
                biased;
                () = superseded(superseded_by) => Err(LeaseError::Superseded {
                    operation: Operation::Acquire,
                }),
                acquired = lease.acquire() => acquired,
            }
        }))
    }
}

impl<L: Lease> Handler<Release> for LeaseActor<L> {
    type Result = ResponseFuture<Result<bool, LeaseError>>;

    fn handle(&mut self, _: Release, _: &mut Self::Context) -> Self::Result {
        self.supersede_acquires();
        let lease = Arc::clone(&self.lease);
        let turn = self.next_turn();
        Box::pin(turn.run(async move { lease.release().await }))
    }
}

impl<L: Lease> Handler<CheckAlive> for LeaseActor<L> {
    type Result = bool;

    fn handle(&mut self, _: CheckAlive, _: &mut Self::Context) -> bool {
        self.lease.check_alive()
    }
}

impl<L: Lease> Handler<GetFencingToken> for LeaseActor<L> {
    type Result = Option<FencingToken>;

    fn handle(&mut self, _: GetFencingToken, _: &mut Self::Context) -> Self::Result {
        self.lease.fencing_token()
    }
}

impl<L: Lease> Handler<GetTenure> for LeaseActor<L> {
    type Result = MessageResult<GetTenure>;

    fn handle(&mut self, _: GetTenure, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.lease.tenure().clone())
    }
}

impl<L: Lease> Handler<SubscribeLeaseLost> for LeaseActor<L> {
    type Result = SubscriptionId;

    fn handle(&mut self, msg: SubscribeLeaseLost, _: &mut Self::Context) -> SubscriptionId {
        let mut subscribers = lock(&self.subscribers);
        let id = subscribers.next;
        subscribers.next += 1;
        subscribers.by_id.insert(id, msg.0);
        SubscriptionId(id)
    }
}

impl<L: Lease> Handler<UnsubscribeLeaseLost> for LeaseActor<L> {
    type Result = bool;

    fn handle(&mut self, msg: UnsubscribeLeaseLost, _: &mut Self::Context) -> bool {
        lock(&self.subscribers).by_id.remove(&msg.0 .0).is_some()
    }
}
