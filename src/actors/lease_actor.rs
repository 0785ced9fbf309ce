//! [`LeaseActor`]: a lease driven by actix mailbox messages.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use actix::prelude::*;

use crate::lease::{FencingToken, Lease, LeaseError, LeaseLost, LostSubscription};
use crate::tenure::TenureWatch;

impl Message for LeaseLost {
    type Result = ();
}

/// Take the lease; answers like [`Lease::acquire`].
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
/// `Acquire` and `Release` run as futures: the actor keeps answering `CheckAlive` while one is in
/// flight, and the lease itself serialises concurrent acquires and releases, so a `Release` sent
/// after an `Acquire` takes effect after it.
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
        }
    }

    /// Whether the actor releases the lease when it stops (default `true`); `false` leaves it to
    /// expire, like a crash.
    pub fn release_on_stop(mut self, release: bool) -> Self {
        self.release_on_stop = release;
        self
    }

    /// The lease.
    pub fn lease(&self) -> &Arc<L> {
        &self.lease
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<L: Lease> Actor for LeaseActor<L> {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        if self.release_on_stop && self.lease.check_alive() {
            let lease = Arc::clone(&self.lease);
            // The arbiter keeps running after this actor: release in the background. Every
            // other handle of a shared lease sees the tenure end.
            actix_rt::spawn(async move {
                if let Err(error) = lease.release().await {
                    tracing::warn!(error = &error as &dyn std::error::Error, lease = %lease.name(), "release on stop failed");
                }
            });
        }
    }
}

impl<L: Lease> Handler<Acquire> for LeaseActor<L> {
    type Result = ResponseFuture<Result<bool, LeaseError>>;

    fn handle(&mut self, _: Acquire, _: &mut Self::Context) -> Self::Result {
        let lease = Arc::clone(&self.lease);
        Box::pin(async move { lease.acquire().await })
    }
}

impl<L: Lease> Handler<Release> for LeaseActor<L> {
    type Result = ResponseFuture<Result<bool, LeaseError>>;

    fn handle(&mut self, _: Release, _: &mut Self::Context) -> Self::Result {
        let lease = Arc::clone(&self.lease);
        Box::pin(async move { lease.release().await })
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
