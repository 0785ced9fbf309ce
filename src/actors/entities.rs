//! Entities under a shard: [`EntityHost`], the shard worker that runs one actor per entity id of
//! its shard, started on its first message and stopped with the shard's tenure (or when idle),
//! and [`Entities`], the local handle that sends a message to an entity living on this node. The
//! lifecycle, the guarantee and its races: see [`EntityHost`].

use std::collections::HashMap;
use std::marker::PhantomData;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Duration;

use actix::dev::{Envelope, EnvelopeProxy};
use actix::fut::ActorFuture;
use actix::prelude::*;
use actix::WeakRecipient;
use futures_util::future::{ready, Future};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::sharded::{LocateError, ShardDirectory, ShardInfo, ShardLocation};
use super::singleton::{StopHandle, StopSignal};
use crate::entity::ShardFunction;
use crate::lease::FencingToken;
use crate::tenure::{TenureEnd, TenureGuard};

/// How many messages wait for an entity before a sender waits for room (actix's mailbox
/// capacity).
const INBOX_CAPACITY: usize = 16;

/// How many messages an entity handles in one poll of its context before it yields to the other
/// tasks of its arbiter.
const INBOX_BUDGET: usize = 64;

/// Why a message could not be delivered to an entity, or was not answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EntityError {
    /// The entity's shard runs on another node (as this node's group watch shows it): send the
    /// message there (its [`address`](Self::NotHere::address), when it advertises one).
    #[error("entity {entity:?} lives in shard {shard:?}, which runs on {holder:?}, not here")]
    NotHere {
        /// The entity id.
        entity: String,
        /// The shard id.
        shard: String,
        /// The node that holds the shard.
        holder: String,
        /// The fencing token of the holder's tenure, as the watch shows it.
        token: Option<FencingToken>,
        /// The address the holder advertises
        /// ([`ShardedWorkers::advertise`](crate::ShardedWorkers::advertise)), if any.
        address: Option<String>,
    },
    /// The entity's shard runs nowhere right now (it is moving, or its holder's lease expired),
    /// or its worker is starting or stopping on this node (it is moving to or from here). Try
    /// again shortly.
    #[error("shard {shard:?} of entity {entity:?} is moving")]
    Moving {
        /// The entity id.
        entity: String,
        /// The shard id.
        shard: String,
    },
    /// The tenure of the entity's shard on this node ended before the entity handled the
    /// message: it was not handled.
    #[error("the tenure of shard {shard:?} ended before entity {entity:?} handled the message")]
    TenureEnded {
        /// The entity id.
        entity: String,
        /// The shard id.
        shard: String,
    },
    /// The entity stopped before it answered, its tenure still alive: it stopped itself or
    /// panicked, or its shard's worker stopped it (the shard is moving away). The message may
    /// have been handled or not.
    #[error("entity {entity:?} of shard {shard:?} stopped before it answered")]
    Stopped {
        /// The entity id.
        entity: String,
        /// The shard id.
        shard: String,
    },
    /// The entity's shard could not be located: the shard function answered an index out of
    /// range, or the group watch has not listed the group yet.
    #[error("cannot locate the shard of entity {entity:?}")]
    Locate {
        /// The entity id.
        entity: String,
        /// Why.
        #[source]
        source: LocateError,
    },
}

/// Builds an entity actor: its id, its shard's [`ShardInfo`] (guard and fencing token), its
/// context.
type EntityFactory<E> = dyn Fn(&str, &ShardInfo, &mut Context<E>) -> E;

/// A host running on this node, as the registry knows it.
struct HostEntry<E: Actor<Context = Context<E>>> {
    addr: Addr<EntityHost<E>>,
    guard: TenureGuard,
    instance: u64,
}

impl<E: Actor<Context = Context<E>>> Clone for HostEntry<E> {
    fn clone(&self) -> Self {
        Self {
            addr: self.addr.clone(),
            guard: self.guard.clone(),
            instance: self.instance,
        }
    }
}

/// What every clone of an [`EntityHosts`] shares.
struct Registry<E: Actor<Context = Context<E>>> {
    /// The running hosts, by (group, shard id).
    hosts: Mutex<HashMap<(String, String), HostEntry<E>>>,
    /// Numbers the hosts, so that a host deregisters itself only.
    instances: AtomicU64,
}

/// The entity hosts of one node: builds the [`EntityHost`] workers of a
/// [`ShardedWorkers`](crate::ShardedWorkers) group ([`factory`](Self::factory)), and keeps the
/// registry of those running here that [`Entities`] routes through ([`entities`](Self::entities)).
///
/// Cheap to clone (clones share the registry), `Send + Sync`. Use one per group and node.
pub struct EntityHosts<E: Actor<Context = Context<E>>> {
    registry: Arc<Registry<E>>,
    idle_timeout: Option<Duration>,
}

impl<E: Actor<Context = Context<E>>> Clone for EntityHosts<E> {
    fn clone(&self) -> Self {
        Self {
            registry: Arc::clone(&self.registry),
            idle_timeout: self.idle_timeout,
        }
    }
}

impl<E: Actor<Context = Context<E>>> std::fmt::Debug for EntityHosts<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntityHosts")
            .field("running", &self.lock().len())
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

impl<E: Actor<Context = Context<E>>> Default for EntityHosts<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: Actor<Context = Context<E>>> EntityHosts<E> {
    /// No host yet, entities never stopped for being idle.
    pub fn new() -> Self {
        Self {
            registry: Arc::new(Registry {
                hosts: Mutex::new(HashMap::new()),
                instances: AtomicU64::new(0),
            }),
            idle_timeout: None,
        }
    }

    /// Stops an entity once no message was delivered to it or answered by it for `timeout`, and
    /// none awaits its answer (`None`, the default: entities run until their shard's tenure
    /// ends). Applies to the hosts of the [`factory`](Self::factory) built after it.
    pub fn with_idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), HostEntry<E>>> {
        // Nothing panics while holding it; a poisoned map is still a consistent map.
        (self.registry.hosts.lock()).unwrap_or_else(PoisonError::into_inner)
    }

    /// The worker factory of a [`ShardedWorkers`](crate::ShardedWorkers) group whose workers
    /// are entity hosts: each host builds its entities with `factory(entity_id, shard, ctx)`, on
    /// its own arbiter (the factory need not be `Send`), under the shard's tenure.
    pub fn factory(
        &self,
        factory: impl Fn(&str, &ShardInfo, &mut Context<E>) -> E + 'static,
    ) -> impl Fn(&ShardInfo, &mut Context<EntityHost<E>>) -> EntityHost<E> + 'static {
        let hosts = self.clone();
        let factory: Rc<EntityFactory<E>> = Rc::new(factory);
        move |shard: &ShardInfo, _: &mut Context<EntityHost<E>>| EntityHost {
            shard: shard.clone(),
            factory: Rc::clone(&factory),
            hosts: hosts.clone(),
            idle_timeout: hosts.idle_timeout,
            entities: HashMap::new(),
            instances: 0,
            closing: false,
            registration: None,
        }
    }

    /// The handle that sends messages to the entities of this node, mapping entity ids to shards
    /// with `directory`, the group's
    /// ([`ShardedWorkers::directory`](crate::ShardedWorkers::directory)).
    pub fn entities(&self, directory: ShardDirectory) -> Entities<E> {
        Entities {
            hosts: self.clone(),
            directory,
        }
    }

    /// The running host of shard `shard` of `group`, if its tenure is alive.
    fn host(&self, group: &str, shard: &str) -> Option<HostEntry<E>> {
        let key = (group.to_owned(), shard.to_owned());
        self.lock()
            .get(&key)
            .filter(|entry| entry.guard.check_alive())
            .cloned()
    }
}

/// Removes a host from the registry when dropped (the host stops, or is terminated).
struct Registration<E: Actor<Context = Context<E>>> {
    hosts: EntityHosts<E>,
    key: (String, String),
    instance: u64,
}

impl<E: Actor<Context = Context<E>>> Drop for Registration<E> {
    fn drop(&mut self) {
        let mut hosts = self.hosts.lock();
        if hosts.get(&self.key).map(|entry| entry.instance) == Some(self.instance) {
            hosts.remove(&self.key);
        }
    }
}

/// A message on its way to an entity: handled by the entity's context unless the tenure ended.
type Inbox<E> = mpsc::Sender<Envelope<E>>;

/// One entity id of a host.
struct Slot<E: Actor<Context = Context<E>>> {
    instance: u64,
    stop: StopHandle,
    state: SlotState<E>,
}

enum SlotState<E: Actor<Context = Context<E>>> {
    Running {
        inbox: Inbox<E>,
        activity: Arc<Activity>,
    },
    /// Told to stop; the next actor of the id starts once it is gone, for these waiters.
    Stopping {
        waiters: Vec<oneshot::Sender<Result<Delivery<E>, EntityError>>>,
    },
}

impl<E: Actor<Context = Context<E>>> Drop for Slot<E> {
    /// A host dropped with entities still running was terminated (they did not stop within the
    /// stop timeout): they are terminated too.
    fn drop(&mut self) {
        self.stop.raise(StopSignal::TERMINATE);
    }
}

/// What an entity was last busy with: deliveries not answered yet (an entity is idle only
/// without any), and when a message was last delivered or answered.
struct Activity {
    pending: AtomicUsize,
    /// Nanoseconds from `since`.
    last: AtomicU64,
    since: Instant,
}

impl Activity {
    fn new() -> Self {
        Self {
            pending: AtomicUsize::new(0),
            last: AtomicU64::new(0),
            since: Instant::now(),
        }
    }

    fn touch(&self) {
        let nanos = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.fetch_max(nanos, Ordering::AcqRel);
    }

    /// When it was last busy, and whether it is now.
    fn last(&self) -> (Instant, bool) {
        let last = self.since + Duration::from_nanos(self.last.load(Ordering::Acquire));
        (last, self.pending.load(Ordering::Acquire) > 0)
    }
}

/// Counts a delivery as pending until its answer came (or it was given up).
struct Pending(Arc<Activity>);

impl Pending {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.pending.fetch_add(1, Ordering::AcqRel);
        activity.touch();
        Self(Arc::clone(activity))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.touch();
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the host hands a sender: the entity's inbox, under the shard's guard.
struct Delivery<E: Actor<Context = Context<E>>> {
    inbox: Inbox<E>,
    guard: TenureGuard,
    _pending: Pending,
}

/// Internal: find or start the entity `entity`, and answer its inbox.
struct Route<E> {
    entity: String,
    _entity: PhantomData<fn() -> E>,
}

impl<E: Actor<Context = Context<E>>> Message for Route<E> {
    type Result = Result<Delivery<E>, EntityError>;
}

/// Internal: an entity's context is gone.
#[derive(Message)]
#[rtype(result = "()")]
struct EntityGone {
    entity: String,
    instance: u64,
}

/// The shard worker that runs the entities of its shard on this node: build a group of them with
/// [`EntityHosts::factory`], and send to the entities with [`Entities`].
///
/// # The lifecycle
///
/// A node of a [`ShardedWorkers`](crate::ShardedWorkers) group whose workers are
/// [`EntityHost`]s runs, for each shard it holds, one host under the shard's tenure (a shard
/// worker, with every rule of one: started under a live tenure, stopped before its end, the lease
/// released only after it stopped). The host keeps one entity actor per entity id:
///
/// 1. **Start.** The first message for an entity id starts its actor, built by the factory with
///    the id and the shard's [`ShardInfo`] (its guard and fencing token: fence every write with
///    it), on the host's arbiter, only while the tenure is alive.
/// 2. **Messages.** Every message is handled by the entity actor, one at a time, in order; it
///    keeps its state across messages for as long as it runs.
/// 3. **Stop.** An entity stops when the shard's tenure ends (at the deadline, on a loss, or on a
///    release: each entity watches the guard itself), when the host stops (a handover: the host
///    waits until every entity has stopped before it stops, and the lease is released only after
///    that), after being idle for [`EntityHosts::with_idle_timeout`] (no message delivered or
///    answered, none awaiting an answer), or on its own. The next message for its id starts a
///    new actor, once the old one has stopped: two actors of one id never run at once on a node.
///
/// # The guarantee, and its races
///
/// An entity never runs outside its shard's tenure, in the same sense as a shard worker (see
/// [`ClusterSingletonManager`](crate::ClusterSingletonManager)): its factory runs only under a
/// live tenure, and the first item of its context (polled before its timers and spawned
/// futures) stops it when the guard ends. Messages sent through [`Entities`] do not go through
/// the actix mailbox: they reach the entity through that same first item, which checks the guard
/// by the clock *immediately before each message is handled*, in the same poll: a message queued
/// while the tenure was alive and reached after its end (the entity was waiting on `ctx.wait`,
/// or its thread was paused) is dropped, never handled, and its sender gets
/// [`EntityError::TenureEnded`]. What remains is the race of every guard: a handler that runs
/// long, or awaits, may outlive the tenure it checked at its start; fence its writes with
/// `shard.fencing_token`. Messages the entity sends to itself through its own [`Addr`] are
/// actix's and are not checked: gate them with `shard.guard`.
///
/// An entity holding its context with `ctx.wait` is polled only once the wait is over (actix's
/// rule): it is stopped then, and handles no message after its tenure meanwhile, but the waited
/// future itself runs on; keep such waits shorter than the stop timeout. A host whose entities
/// do not stop within the shard settings' `stop_timeout` (an entity whose `stopping` returns
/// `Running::Continue`, or that waits) is terminated by its manager, and its entities with it
/// (`ctx.terminate()`, which skips `stopping`), before the lease is released; the release ends
/// the guard, so that an entity not terminated yet handles no message after it.
///
/// # Threads
///
/// [`Entities`] is `Clone + Send + Sync`: an actix-web handler on any worker thread (each with its
/// own arbiter) can use it. The hosts, the entities and the entity factory live on the arbiter of
/// the [`ShardedWorkers`](crate::ShardedWorkers) actor (the factory need not be `Send`); the
/// handle reaches them through a registry of the hosts running on this node (behind a mutex,
/// held only to look a host up) and their addresses, and messages cross threads as actix's do
/// (`M: Send`, `M::Result: Send`).
///
/// # Example
///
/// ```
/// use actix::prelude::*;
/// use actix_coordination::prelude::*;
/// use actix_coordination::{Entities, EntityHosts, ShardInfo, ShardedWorkers};
///
/// /// One counter per entity id, under its shard's tenure.
/// struct Counter {
///     count: u64,
///     shard: ShardInfo,
/// }
/// impl Actor for Counter {
///     type Context = Context<Self>;
/// }
///
/// #[derive(Message)]
/// #[rtype(result = "u64")]
/// struct Increment;
///
/// impl Handler<Increment> for Counter {
///     type Result = u64;
///     fn handle(&mut self, _: Increment, _: &mut Context<Self>) -> u64 {
///         // A write elsewhere would carry `self.shard.fencing_token`.
///         assert!(self.shard.guard.check_alive());
///         self.count += 1;
///         self.count
///     }
/// }
///
/// # #[actix::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let hosts = EntityHosts::new();
/// let workers = ShardedWorkers::with_count(
///     "counters",
///     8,
///     move |name: &str| store.lease(LeaseSettings::new(name, "node-1").unwrap()),
///     hosts.factory(|_id: &str, shard: &ShardInfo, _ctx| Counter {
///         count: 0,
///         shard: shard.clone(),
///     }),
/// )?;
/// let entities: Entities<Counter> = hosts.entities(workers.directory());
/// let workers = workers.start();
/// # tokio::time::sleep(std::time::Duration::from_millis(100)).await;
/// assert_eq!(entities.send("customer-42", Increment).await?, 1); // started on its first message
/// assert_eq!(entities.send("customer-42", Increment).await?, 2); // the same actor
/// assert_eq!(entities.send("customer-7", Increment).await?, 1);
/// workers.send(Shutdown).await??;                                // every entity stops first
/// # Ok(()) }
/// ```
pub struct EntityHost<E: Actor<Context = Context<E>>> {
    shard: ShardInfo,
    factory: Rc<EntityFactory<E>>,
    hosts: EntityHosts<E>,
    idle_timeout: Option<Duration>,
    entities: HashMap<String, Slot<E>>,
    instances: u64,
    /// Stopping: no entity starts any more; the host stops once every entity has.
    closing: bool,
    registration: Option<Registration<E>>,
}

impl<E: Actor<Context = Context<E>>> EntityHost<E> {
    fn error(&self, entity: &str, kind: fn(String, String) -> EntityError) -> EntityError {
        kind(entity.to_owned(), self.shard.shard.clone())
    }

    /// Why a message cannot reach an entity of this host now: the tenure ended, or the host is
    /// stopping (the shard is moving away).
    fn unavailable(&self, entity: &str) -> EntityError {
        if self.shard.guard.check_alive() {
            self.error(entity, |entity, shard| EntityError::Moving {
                entity,
                shard,
            })
        } else {
            self.error(entity, |entity, shard| EntityError::TenureEnded {
                entity,
                shard,
            })
        }
    }

    /// Starts the entity `entity` under the shard's tenure, and answers its inbox.
    fn start_entity(
        &mut self,
        entity: String,
        ctx: &mut Context<Self>,
    ) -> Result<Delivery<E>, EntityError> {
        let guard = &self.shard.guard;
        if self.closing || !guard.check_alive() {
            return Err(self.unavailable(&entity));
        }
        self.instances += 1;
        let instance = self.instances;
        let signal = Arc::new(StopSignal::default());
        let (inbox, rx) = mpsc::channel(INBOX_CAPACITY);
        let mut entity_ctx = Context::<E>::new();
        // The first item of the entity's context: polled before its own timers and futures.
        entity_ctx.spawn(Driver {
            guard: guard.clone(),
            ended: Box::pin(guard.ended()),
            signal: Arc::clone(&signal),
            inbox: Some(rx),
            stop_requested: false,
            _gone: Gone {
                host: ctx.address().downgrade().recipient(),
                entity: entity.clone(),
                instance,
            },
        });
        let actor = (self.factory)(&entity, &self.shard, &mut entity_ctx);
        actix_rt::spawn(entity_ctx.into_future(actor));
        tracing::debug!(group = %self.shard.group, shard = %self.shard.shard, entity = %entity, fencing_token = %guard.token(), instance, "entity started");
        let activity = Arc::new(Activity::new());
        let delivery = Delivery {
            inbox: inbox.clone(),
            guard: guard.clone(),
            _pending: Pending::new(&activity),
        };
        if let Some(idle) = self.idle_timeout {
            let id = entity.clone();
            ctx.run_later(idle, move |act, ctx| act.check_idle(id, instance, ctx));
        }
        let slot = Slot {
            instance,
            stop: StopHandle(signal),
            state: SlotState::Running { inbox, activity },
        };
        self.entities.insert(entity, slot);
        Ok(delivery)
    }

    /// Stops the entity `entity` (instance `instance`) if it was idle for the idle timeout, else
    /// looks again when it may be.
    fn check_idle(&mut self, entity: String, instance: u64, ctx: &mut Context<Self>) {
        let Some(idle) = self.idle_timeout else {
            return;
        };
        let Some(slot) = self.entities.get_mut(&entity) else {
            return;
        };
        let SlotState::Running { activity, .. } = &slot.state else {
            return;
        };
        if slot.instance != instance {
            return;
        }
        let now = Instant::now();
        let (last, busy) = activity.last();
        let quiet_until = last + idle;
        if busy || now < quiet_until {
            let after = if busy { idle } else { quiet_until - now };
            ctx.run_later(after, move |act, ctx| act.check_idle(entity, instance, ctx));
            return;
        }
        tracing::debug!(group = %self.shard.group, shard = %self.shard.shard, entity = %entity, instance, idle = ?idle, "entity idle: stopping it");
        slot.stop.raise(StopSignal::STOP);
        slot.state = SlotState::Stopping {
            waiters: Vec::new(),
        };
    }
}

impl<E: Actor<Context = Context<E>>> Actor for EntityHost<E> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let key = (self.shard.group.clone(), self.shard.shard.clone());
        let instance = (self.hosts.registry.instances).fetch_add(1, Ordering::Relaxed);
        let entry = HostEntry {
            addr: ctx.address(),
            guard: self.shard.guard.clone(),
            instance,
        };
        self.hosts.lock().insert(key.clone(), entry);
        self.registration = Some(Registration {
            hosts: self.hosts.clone(),
            key,
            instance,
        });
        tracing::debug!(group = %self.shard.group, shard = %self.shard.shard, fencing_token = %self.shard.fencing_token, "entity host started");
    }

    /// Leaves the registry, stops every entity, and stops once every one has (the shard's lease
    /// is released only after that).
    fn stopping(&mut self, _: &mut Context<Self>) -> Running {
        if !self.closing {
            self.closing = true;
            self.registration = None;
            for slot in self.entities.values_mut() {
                slot.stop.raise(StopSignal::STOP);
                if let SlotState::Running { .. } = slot.state {
                    slot.state = SlotState::Stopping {
                        waiters: Vec::new(),
                    };
                }
            }
            tracing::debug!(group = %self.shard.group, shard = %self.shard.shard, entities = self.entities.len(), "entity host stopping: stopping its entities");
        }
        if self.entities.is_empty() {
            Running::Stop
        } else {
            Running::Continue
        }
    }
}

impl<E: Actor<Context = Context<E>>> Handler<Route<E>> for EntityHost<E> {
    type Result = ResponseFuture<Result<Delivery<E>, EntityError>>;

    fn handle(&mut self, route: Route<E>, ctx: &mut Context<Self>) -> Self::Result {
        let entity = route.entity;
        if self.closing || !self.shard.guard.check_alive() {
            return Box::pin(ready(Err(self.unavailable(&entity))));
        }
        let guard = self.shard.guard.clone();
        match self.entities.get_mut(&entity).map(|slot| &mut slot.state) {
            Some(SlotState::Running { inbox, activity }) => {
                let delivery = Delivery {
                    inbox: inbox.clone(),
                    guard,
                    _pending: Pending::new(activity),
                };
                Box::pin(ready(Ok(delivery)))
            }
            Some(SlotState::Stopping { waiters }) => {
                // The previous actor of this id is stopping: the next one starts once it is gone.
                let (tx, rx) = oneshot::channel();
                waiters.push(tx);
                // Without an answer, the host is gone (terminated): the shard is moving away, or
                // its tenure ended, as the guard says then.
                let (shard, guard) = (self.shard.shard.clone(), self.shard.guard.clone());
                Box::pin(async move {
                    rx.await.unwrap_or_else(|_| {
                        Err(if guard.check_alive() {
                            EntityError::Moving { entity, shard }
                        } else {
                            EntityError::TenureEnded { entity, shard }
                        })
                    })
                })
            }
            None => Box::pin(ready(self.start_entity(entity, ctx))),
        }
    }
}

impl<E: Actor<Context = Context<E>>> Handler<EntityGone> for EntityHost<E> {
    type Result = ();

    fn handle(&mut self, gone: EntityGone, ctx: &mut Context<Self>) {
        if self.entities.get(&gone.entity).map(|slot| slot.instance) != Some(gone.instance) {
            return;
        }
        let Some(mut slot) = self.entities.remove(&gone.entity) else {
            return;
        };
        tracing::debug!(group = %self.shard.group, shard = %self.shard.shard, entity = %gone.entity, instance = gone.instance, "entity stopped");
        let waiters = match &mut slot.state {
            SlotState::Stopping { waiters } => std::mem::take(waiters),
            SlotState::Running { .. } => Vec::new(),
        };
        if !waiters.is_empty() {
            // Messages that came while it stopped start the next actor of the id (if they can).
            let started = self.start_entity(gone.entity.clone(), ctx);
            let activity = match self.entities.get(&gone.entity).map(|slot| &slot.state) {
                Some(SlotState::Running { activity, .. }) => Some(Arc::clone(activity)),
                _ => None,
            };
            for waiter in waiters {
                let answer = match (&started, &activity) {
                    (Ok(delivery), Some(activity)) => Ok(Delivery {
                        inbox: delivery.inbox.clone(),
                        guard: delivery.guard.clone(),
                        _pending: Pending::new(activity),
                    }),
                    (Err(error), _) => Err(error.clone()),
                    (Ok(_), None) => Err(self.unavailable(&gone.entity)),
                };
                let _ = waiter.send(answer);
            }
        }
        if self.closing && self.entities.is_empty() {
            ctx.stop();
        }
    }
}

/// The first item of an entity's context: stops it when its tenure ends (checked by the clock
/// each time the context is polled, and woken at the deadline or the end) or when its host says
/// so, terminates it when its host is gone, and hands it its messages, each one only if the
/// tenure is alive right before it is handled. Tells the host when the context is gone.
struct Driver<E: Actor<Context = Context<E>>> {
    guard: TenureGuard,
    ended: Pin<Box<dyn Future<Output = TenureEnd> + Send>>,
    signal: Arc<StopSignal>,
    inbox: Option<mpsc::Receiver<Envelope<E>>>,
    stop_requested: bool,
    _gone: Gone,
}

impl<E: Actor<Context = Context<E>>> Driver<E> {
    /// Stops the entity once; the messages waiting for it are dropped (their senders learn it).
    fn stop(&mut self, ctx: &mut Context<E>) {
        self.inbox = None;
        if !self.stop_requested {
            self.stop_requested = true;
            ctx.stop();
        }
    }
}

impl<E: Actor<Context = Context<E>>> ActorFuture<E> for Driver<E> {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        act: &mut E,
        ctx: &mut Context<E>,
        task: &mut std::task::Context<'_>,
    ) -> Poll<()> {
        let this = self.get_mut();
        let level = this.signal.level(task);
        if level >= StopSignal::TERMINATE {
            this.inbox = None;
            ctx.terminate();
            return Poll::Pending;
        }
        let ended = !this.guard.check_alive() || this.ended.as_mut().poll(task).is_ready();
        if ended || level >= StopSignal::STOP {
            this.stop(ctx);
            return Poll::Pending;
        }
        let mut budget = INBOX_BUDGET;
        while let Some(inbox) = this.inbox.as_mut() {
            if ctx.waiting() {
                break; // the entity waits on a future (`ctx.wait`), or stops
            }
            if budget == 0 {
                task.waker().wake_by_ref();
                break;
            }
            match inbox.poll_recv(task) {
                Poll::Ready(Some(mut envelope)) => {
                    if !this.guard.check_alive() {
                        drop(envelope);
                        this.stop(ctx);
                        break;
                    }
                    budget -= 1;
                    envelope.handle(act, ctx);
                }
                // Every sender is gone: the host is.
                Poll::Ready(None) => this.stop(ctx),
                Poll::Pending => break,
            }
        }
        Poll::Pending
    }
}

/// Lives in an entity's context: tells the host, if it still exists, when the context is gone.
struct Gone {
    host: WeakRecipient<EntityGone>,
    entity: String,
    instance: u64,
}

impl Drop for Gone {
    fn drop(&mut self) {
        if let Some(host) = self.host.upgrade() {
            host.do_send(EntityGone {
                entity: std::mem::take(&mut self.entity),
                instance: self.instance,
            });
        }
    }
}

/// Sends messages to the entities living on this node: a cheap, cloneable, `Send + Sync` handle
/// for request handlers (see [`EntityHost`] for threads).
///
/// Get it from [`EntityHosts::entities`] with the group's [`ShardDirectory`]. An entity id maps
/// to its shard with the directory's [`ShardFunction`] (the same on every node and client); when
/// that shard runs here, the message goes to the entity (started on its first message), else the
/// answer says where the shard runs ([`EntityError::NotHere`]) or that it is moving.
///
/// See [`EntityHost`] for an example.
pub struct Entities<E: Actor<Context = Context<E>>> {
    hosts: EntityHosts<E>,
    directory: ShardDirectory,
}

impl<E: Actor<Context = Context<E>>> Clone for Entities<E> {
    fn clone(&self) -> Self {
        Self {
            hosts: self.hosts.clone(),
            directory: self.directory.clone(),
        }
    }
}

impl<E: Actor<Context = Context<E>>> std::fmt::Debug for Entities<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entities")
            .field("directory", &self.directory)
            .field("hosts", &self.hosts)
            .finish()
    }
}

impl<E: Actor<Context = Context<E>>> Entities<E> {
    /// The same handle mapping entity ids with `function` instead of the directory's
    /// ([`ShardDirectory::with_shard_function`]); every node and client of the group must use the
    /// same one.
    pub fn with_shard_function(mut self, function: impl ShardFunction) -> Self {
        self.directory = self.directory.with_shard_function(function);
        self
    }

    /// The group's directory this handle maps entities with.
    pub fn directory(&self) -> &ShardDirectory {
        &self.directory
    }

    /// Where the shard of entity `entity_id` runs now ([`ShardDirectory::locate_entity`]).
    ///
    /// # Errors
    ///
    /// As [`ShardDirectory::locate_entity`].
    pub fn locate(&self, entity_id: &str) -> Result<ShardLocation, LocateError> {
        self.directory.locate_entity(entity_id)
    }

    /// Sends `message` to entity `entity_id` if its shard runs on this node (starting the entity
    /// if it does not run yet), and answers its reply.
    ///
    /// The message is handled only while the shard's tenure is alive (see the
    /// [`EntityHost`]); it waits for room when the entity has 16 messages waiting already.
    /// Wrap the call in a timeout to bound how long a caller waits for the answer.
    ///
    /// # Errors
    ///
    /// [`EntityError::NotHere`] when the shard runs on another node, [`EntityError::Moving`]
    /// when it runs nowhere now or its worker is starting or stopping here,
    /// [`EntityError::TenureEnded`] when the tenure here ended before the entity handled the
    /// message, [`EntityError::Stopped`] when the entity stopped before it answered,
    /// [`EntityError::Locate`] when the shard cannot be located (a shard function out of range,
    /// a group not listed yet).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes may leave the message delivered and handled (the
    /// answer is then dropped); a message not yet handled when the future is dropped is skipped.
    pub async fn send<M>(&self, entity_id: &str, message: M) -> Result<M::Result, EntityError>
    where
        E: Handler<M>,
        M: Message + Send + 'static,
        M::Result: Send,
    {
        let index = self
            .directory
            .shard_of(entity_id)
            .map_err(|source| EntityError::Locate {
                entity: entity_id.to_owned(),
                source,
            })?;
        let shard = &self.directory.shards()[index];
        let Some(host) = self.hosts.host(self.directory.group(), shard) else {
            return Err(self.elsewhere(entity_id, index));
        };
        let route = Route {
            entity: entity_id.to_owned(),
            _entity: PhantomData,
        };
        let lost = |guard: &TenureGuard, stopped: bool| {
            let (entity, shard) = (entity_id.to_owned(), shard.clone());
            match (guard.check_alive(), stopped) {
                (false, _) => EntityError::TenureEnded { entity, shard },
                (true, true) => EntityError::Stopped { entity, shard },
                (true, false) => EntityError::Moving { entity, shard },
            }
        };
        let delivery = match host.addr.send(route).await {
            Ok(delivery) => delivery?,
            // The host stopped meanwhile.
            Err(_) => return Err(lost(&host.guard, false)),
        };
        let (tx, rx) = oneshot::channel();
        let envelope = Envelope::new(message, Some(tx));
        if delivery.inbox.send(envelope).await.is_err() {
            return Err(lost(&delivery.guard, true));
        }
        let answer = rx.await.map_err(|_| lost(&delivery.guard, true));
        drop(delivery);
        answer
    }

    /// Why the shard at `index` has no host here: it runs elsewhere, or nowhere, or its worker is
    /// starting or stopping here.
    fn elsewhere(&self, entity: &str, index: usize) -> EntityError {
        let entity = entity.to_owned();
        match self.directory.locate_index(index) {
            Ok(ShardLocation {
                holder: Some(holder),
                here: false,
                shard,
                token,
                address,
                ..
            }) => EntityError::NotHere {
                entity,
                shard,
                holder,
                token,
                address,
            },
            Ok(location) => EntityError::Moving {
                entity,
                shard: location.shard,
            },
            Err(source) => EntityError::Locate { entity, source },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::tenure::TenurePublisher;

    /// Counts the messages it handled; holds its context on `ctx.wait` when asked.
    struct Probe {
        handled: Rc<Cell<u32>>,
        stopped: Rc<Cell<bool>>,
    }

    impl Actor for Probe {
        type Context = Context<Self>;

        fn stopped(&mut self, _: &mut Context<Self>) {
            self.stopped.set(true);
        }
    }

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Hold(Duration);

    impl Handler<Hold> for Probe {
        type Result = ();

        fn handle(&mut self, Hold(pause): Hold, ctx: &mut Context<Self>) {
            self.handled.set(self.handled.get() + 1);
            ctx.wait(actix::fut::wrap_future(tokio::time::sleep(pause)));
        }
    }

    /// Stands in for the host: never tells the entity to stop.
    struct NoHost;

    impl Actor for NoHost {
        type Context = Context<Self>;
    }

    impl Handler<EntityGone> for NoHost {
        type Result = ();

        fn handle(&mut self, _: EntityGone, _: &mut Context<Self>) {}
    }

    /// The entity's own first item stops it at the end of its tenure, and a message queued while
    /// the tenure was alive but reached after its end (the entity held on `ctx.wait`) is dropped
    /// unhandled, with no host to tell it: the guard is checked where the entity runs.
    #[test]
    fn a_message_reached_after_the_guard_ended_is_dropped_unhandled() {
        let rt = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap()
        };
        actix_rt::System::with_tokio_rt(rt).block_on(async {
            let publisher = TenurePublisher::new("entity-test");
            let deadline = Instant::now() + Duration::from_secs(5);
            let _tenure = publisher.start(FencingToken::new(1), deadline);
            let guard = publisher.watch().guard().unwrap();
            let (handled, stopped) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(false)));
            let (inbox, rx) = mpsc::channel(INBOX_CAPACITY);
            let host = NoHost.start();
            let signal = Arc::new(StopSignal::default());
            let _stop = StopHandle(Arc::clone(&signal));
            let mut ctx = Context::<Probe>::new();
            ctx.spawn(Driver {
                ended: Box::pin(guard.ended()),
                guard,
                signal,
                inbox: Some(rx),
                stop_requested: false,
                _gone: Gone {
                    host: host.downgrade().recipient(),
                    entity: "e".into(),
                    instance: 1,
                },
            });
            let probe = Probe {
                handled: Rc::clone(&handled),
                stopped: Rc::clone(&stopped),
            };
            actix_rt::spawn(ctx.into_future(probe));
            let (first, first_answer) = oneshot::channel();
            let hold = Envelope::new(Hold(Duration::from_secs(10)), Some(first));
            assert!(inbox.send(hold).await.is_ok());
            first_answer.await.unwrap();
            let (second, second_answer) = oneshot::channel();
            let queued = Envelope::new(Hold(Duration::ZERO), Some(second));
            assert!(inbox.send(queued).await.is_ok());
            tokio::time::sleep(Duration::from_secs(20)).await;
            assert!(
                second_answer.await.is_err(),
                "the queued message has no answer"
            );
            assert_eq!(handled.get(), 1, "the queued message was not handled");
            assert!(stopped.get(), "the entity stopped");
        });
    }
}
