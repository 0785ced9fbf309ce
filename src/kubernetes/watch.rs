//! One watch per (client, namespace): every lease of a process that holds or waits for a Lease
//! object in a namespace learns about that object from one shared watch on all `Lease` objects of
//! the namespace, built on [`kube::runtime::watcher()`] (with a backoff of our own, at most a second between tries, and its relist after
//! `410 Gone`), and dispatched by object name.
//!
//! # What a lease gets from it
//!
//! Each [`KubernetesBackend`](super::KubernetesBackend) subscribes to the name of its object when
//! it first waits for the object (a contender between attempts) or holds it, not at its first
//! attempt: the watch's first listing (every `Lease` of the namespace) would compete with the
//! attempt's own requests, which its operation timeout bounds. It then receives [`Snapshot`]s:
//! the object as the watch last saw it (or that it is absent), and *when this process received
//! it*. The backend folds them into what it observed (the observed-time expiry is judged from the
//! instant a version was first received, exactly as with a read), so:
//!
//! * a contender that waits needs no request of its own: the holder's renewals restart its expiry
//!   clock, a release or a deletion wakes it, and its next attempt decides from what it observed;
//! * a holder hears of a takeover or a deletion without a request.
//!
//! # Which view is current
//!
//! The watch counts *epochs*: an epoch starts with each complete listing of the namespace (at
//! start and after `410 Gone`), after which every change is delivered in order. What a backend
//! learned (from a snapshot or from its own read or write) during the epoch that is still running
//! is current, as long as the watch is *synced* (listed, and not failing). Only a current view lets
//! an attempt skip its read; otherwise it reads the object first.
//!
//! A subscription gets only what the watch receives after it was made, so a lease that read the
//! object before it subscribed (an attempt's read, before the lease first waits) compares the
//! version it read with the version the watch received last (its index keeps one per object): the
//! same version makes the read current; a newer one is a change the lease missed (a release just
//! before the wait), and its wait ends at once, so that its next attempt reads (issue 24: such a
//! wait slept until the retry delay). A stale view can never grant a
//! claim: every claim is a compare-and-swap on the `resourceVersion` it judged, and the expiry of a
//! version counts from when this process first saw it, after it was written.
//!
//! A view is current only while the watch's task runs. The task runs on the runtime of its hub (a
//! session's own threads) or, for a ready client, of the lease that first needed the watch; when
//! that runtime shuts down, the task is dropped, and with it a guard that marks the watch *ended*
//! (not synced, for good): nothing it delivered is current any more, its subscribers' waits end,
//! and the next use of a lease subscribes again, starting a new watch on the runtime it runs on.
//! Epochs are numbered across all watches of the process, so a view of an ended watch never
//! passes for one of its successor.
//!
//! # Cost and bounds
//!
//! The watch asks for `Lease` objects of the whole namespace (a client-go holder's object has no
//! label of ours to select on). Of every object it keeps a compact entry for group watches (see
//! the `group` module: lease name, version, holder, token and when it was received, not the
//! object); the object itself is kept and buffered during a listing only for names a lease here
//! subscribed to. A watch stream that ends
//! sooner than requested (a proxy or load balancer cutting long responses) is re-opened only
//! [`WATCH_FLOOR`] after the previous one was opened, so such a proxy cannot turn the watch into a
//! tight request loop; failures back off as kube's watcher does (0.8 s doubling to 30 s, like
//! client-go's reflector). A stream silent for longer than the server's timeout plus 5 s is taken
//! for a dead connection and re-opened.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::Instant;

use super::group::Index;
use super::handover::WriteLog;
use super::record::older;
use super::KubernetesError;
use crate::backoff::Doubling;
use crate::group::{GroupRecord, GroupWatch};

/// The shortest time between the starts of two watch requests of one namespace watch.
pub const WATCH_FLOOR: Duration = Duration::from_secs(1);

/// How long the API server keeps one watch request open (it ends it after this, and the watch
/// goes on from where it was).
pub(super) const WATCH_TIMEOUT_SECS: u32 = 290;

/// The last epoch started by any namespace watch of the process (epochs are never reused, so a
/// view learned from one watch never passes for a view of another).
static EPOCHS: AtomicU64 = AtomicU64::new(0);

/// The last id given to a namespace watch of the process.
static WATCH_IDS: AtomicU64 = AtomicU64::new(0);

/// What the watch last saw of one object.
#[derive(Debug, Clone)]
pub(super) enum View {
    /// The object, as of its `resourceVersion`.
    Present(Arc<LeaseObject>),
    /// No such object: deleted (with the `resourceVersion` of the deletion, when the watch event
    /// carried one).
    Absent { version: Option<String> },
}

impl View {
    /// The `resourceVersion` this view is as of, when known.
    pub(super) fn version(&self) -> Option<&str> {
        match self {
            View::Present(lease) => lease.metadata.resource_version.as_deref(),
            View::Absent { version } => version.as_deref(),
        }
    }
}

/// One delivery of the watch to the subscribers of an object name.
#[derive(Debug, Clone)]
pub(super) struct Snapshot {
    /// The id of the namespace watch that delivered it, unique in the process: a lease that
    /// subscribed again tells the new watch's deliveries from the old one's by it.
    pub(super) watch: u64,
    /// Grows with every delivery of this namespace watch; 0 before the first.
    pub(super) seq: u64,
    /// The epoch of the watch the view belongs to.
    pub(super) epoch: u64,
    /// `None` until the watch has seen anything of the object.
    pub(super) view: Option<View>,
    /// When this process received the view.
    pub(super) at: Instant,
}

/// The health of a namespace watch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Status {
    /// The epoch of the watch's latest complete listing (0: not listed yet); unique in the
    /// process.
    pub(super) epoch: u64,
    /// Listed, and the last watch request was answered (no failure since); never again once the
    /// watch ended.
    pub(super) synced: bool,
    /// The watch's task is gone (its runtime shut down, or it was aborted): nothing it delivered
    /// is current, and it delivers nothing more.
    pub(super) ended: bool,
}

/// Requests of the namespace watches of one client.
#[derive(Debug, Default)]
pub(super) struct WatchCounters {
    pub(super) watch_requests: AtomicU64,
    pub(super) list_requests: AtomicU64,
    pub(super) listings: AtomicU64,
    pub(super) floored: AtomicU64,
}

/// What the namespace watches of one client (a [`KubernetesSession`](super::KubernetesSession), or
/// a backend built from a ready client) asked of the API server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KubernetesWatchStats {
    /// Watch requests sent (the first, and each re-open).
    pub watch_requests: u64,
    /// List requests sent (one per page of 500 objects of a listing).
    pub list_requests: u64,
    /// Complete listings of the namespace started: one at start, one after each `410 Gone`
    /// (the watch fell too far behind) or failure that needed one.
    pub listings: u64,
    /// Watch requests held back by the floor delay, because the previous one started less than
    /// [`WATCH_FLOOR`] before (a stream that ended early).
    pub floored: u64,
}

impl WatchCounters {
    pub(super) fn stats(&self) -> KubernetesWatchStats {
        KubernetesWatchStats {
            watch_requests: self.watch_requests.load(Ordering::Relaxed),
            list_requests: self.list_requests.load(Ordering::Relaxed),
            listings: self.listings.load(Ordering::Relaxed),
            floored: self.floored.load(Ordering::Relaxed),
        }
    }
}

/// The namespace watches of one client (a session, or a backend built from a ready client).
pub(super) struct WatchHub {
    client: Client,
    /// Where the watches run; `None`: on the runtime of the first subscriber.
    runtime: Option<Handle>,
    watches: Mutex<HashMap<String, Weak<NamespaceWatch>>>,
    pub(super) counters: Arc<WatchCounters>,
    /// When the leases of this hub sent their latest writes (see the `handover` module).
    writes: Mutex<WriteLog>,
    /// The member incarnations its leases found over (see the `bound` module).
    pub(super) ended: super::bound::EndedMembers,
}

impl WatchHub {
    pub(super) fn new(client: Client, runtime: Option<Handle>) -> Self {
        Self {
            client,
            runtime,
            watches: Mutex::default(),
            counters: Arc::default(),
            writes: Mutex::default(),
            ended: Default::default(),
        }
    }

    /// A write of `object` by a lease of this hub, sent at `sent`, produced `version`.
    pub(super) fn wrote(&self, object: &str, version: &str, sent: Instant) {
        lock(&self.writes).wrote(object, version, sent);
    }

    /// When a lease of this hub sent the write that produced `version` of `object`, if one did
    /// (and it is among the writes kept).
    pub(super) fn sent(&self, object: &str, version: &str) -> Option<Instant> {
        lock(&self.writes).sent(object, version)
    }

    /// The newest version of an object of `namespace` held by `holder` that the running watch of
    /// `namespace` (none is started) received, while it is synced.
    pub(super) fn latest_held_by(&self, namespace: &str, holder: &str) -> Option<(String, String)> {
        let watch = lock(&self.watches).get(namespace).and_then(Weak::upgrade)?;
        if watch.ended() {
            return None;
        }
        let latest = lock(&watch.state.index).latest_held_by(holder, Instant::now());
        latest
    }

    /// The record of object `object` of `namespace` and its `resourceVersion`, as the running
    /// watch of `namespace` (none is started) has it while it is synced: `Some(None)` when the
    /// namespace has no such object, `None` when no synced watch knows.
    pub(super) fn record_of(
        &self,
        namespace: &str,
        object: &str,
    ) -> Option<Option<(GroupRecord, Option<String>)>> {
        let watch = lock(&self.watches).get(namespace).and_then(Weak::upgrade)?;
        if watch.ended() {
            return None;
        }
        let record = lock(&watch.state.index).record_of(object);
        record
    }

    /// What the running watch of `namespace` (none is started) knows of object `object` for a
    /// claim of lease `name` without a read (see [`Index::claimable`]).
    pub(super) fn claimable(
        &self,
        namespace: &str,
        object: &str,
        name: &str,
    ) -> Option<Option<(GroupRecord, String)>> {
        let watch = lock(&self.watches).get(namespace).and_then(Weak::upgrade)?;
        if watch.ended() {
            return None;
        }
        let known = lock(&watch.state.index).claimable(object, name);
        known
    }

    /// Since which `resourceVersion` the running watch of `namespace` (none is started) has
    /// received every change as it happened, while it is synced (see
    /// [`Index::watching_since`](super::group::Index::watching_since)).
    /// `None` when no watch of `namespace` runs, `Some(None)` while it is not synced.
    pub(super) fn watching_since(&self, namespace: &str) -> Option<Option<u64>> {
        let watch = lock(&self.watches).get(namespace).and_then(Weak::upgrade)?;
        if watch.ended() {
            return None;
        }
        let since = lock(&watch.state.index).watching_since();
        Some(since)
    }

    /// Whether the running watch of `namespace` (none is started) received the deletion of the
    /// object with `uid` (see [`Index::was_deleted`](super::group::Index::was_deleted)).
    pub(super) fn was_deleted(&self, namespace: &str, uid: &str) -> bool {
        let Some(watch) = lock(&self.watches).get(namespace).and_then(Weak::upgrade) else {
            return false;
        };
        let deleted = lock(&watch.state.index).was_deleted(uid);
        deleted
    }

    /// Subscribes to object `object` of `namespace`, starting that namespace's watch if no lease
    /// of this hub watches it yet.
    ///
    /// # Errors
    ///
    /// [`KubernetesError::Runtime`] when the hub has no runtime of its own and this is not called
    /// within a Tokio runtime.
    pub(super) fn subscribe(
        &self,
        namespace: &str,
        object: &str,
    ) -> Result<Subscription, KubernetesError> {
        let watch = self.namespace_watch(namespace)?;
        let snapshots = {
            let mut registry = lock(&watch.state.registry);
            let entry = registry
                .objects
                .entry(object.to_owned())
                .or_insert_with(|| Entry {
                    sender: watch::channel(Snapshot {
                        watch: watch.state.id,
                        seq: 0,
                        epoch: 0,
                        view: None,
                        at: Instant::now(),
                    })
                    .0,
                });
            entry.sender.subscribe()
        };
        let status = watch.state.status.subscribe();
        Ok(Subscription {
            watch,
            object: object.to_owned(),
            snapshots,
            status,
        })
    }

    /// Watches the group of leases of `namespace` whose names start with `prefix`: a filter over
    /// the namespace watch (started if no lease of this hub watches the namespace yet), with no
    /// request of its own. The watch lives as long as the returned handle (and its clones) or a
    /// lease's subscription does.
    ///
    /// # Errors
    ///
    /// [`KubernetesError::Runtime`] when the hub has no runtime of its own and this is not called
    /// within a Tokio runtime.
    pub(super) fn watch_group(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<GroupWatch, KubernetesError> {
        let watch = self.namespace_watch(namespace)?;
        let (id, receiver) = lock(&watch.state.index).subscribe(prefix);
        tracing::debug!(%namespace, prefix, "watching a group of leases");
        Ok(GroupWatch::new(receiver, GroupSubscription { watch, id }))
    }

    /// When the running watch of `namespace` (if any; none is started) first received version
    /// `version` of object `object`: a lease that never watched its object may have been
    /// observing it all along through the namespace watch of its hub.
    pub(super) fn first_seen(
        &self,
        namespace: &str,
        object: &str,
        version: &str,
    ) -> Option<Instant> {
        let watch = lock(&self.watches).get(namespace).and_then(Weak::upgrade)?;
        if watch.ended() {
            return None;
        }
        let seen = lock(&watch.state.index).first_seen(object, version);
        seen
    }

    /// The running watch of `namespace`, started if there is none (or the last one ended).
    fn namespace_watch(&self, namespace: &str) -> Result<Arc<NamespaceWatch>, KubernetesError> {
        let mut watches = lock(&self.watches);
        watches.retain(|_, w| w.strong_count() > 0);
        Ok(match watches.get(namespace).and_then(Weak::upgrade) {
            Some(watch) if !watch.ended() => watch,
            _ => {
                let watch = Arc::new(self.start(namespace)?);
                watches.insert(namespace.to_owned(), Arc::downgrade(&watch));
                watch
            }
        })
    }

    fn start(&self, namespace: &str) -> Result<NamespaceWatch, KubernetesError> {
        let runtime = match &self.runtime {
            Some(runtime) => runtime.clone(),
            None => Handle::try_current().map_err(|_| KubernetesError::Runtime {
                reason: "the lease's namespace watch needs a Tokio runtime".into(),
            })?,
        };
        let id = WATCH_IDS.fetch_add(1, Ordering::Relaxed) + 1;
        let state = Arc::new(WatchState {
            id,
            registry: Mutex::default(),
            index: Mutex::default(),
            status: watch::channel(Status::default()).0,
        });
        let floor = Floor {
            client: self.client.clone(),
            shared: Arc::new(FloorShared {
                last_start: Mutex::new(None),
                counters: Arc::clone(&self.counters),
                state: Arc::downgrade(&state),
            }),
        };
        let namespace = namespace.to_owned();
        let guard = EndWithTask(Arc::clone(&state));
        let task = runtime.spawn(run(guard, floor, namespace.clone()));
        Ok(NamespaceWatch {
            namespace,
            state,
            task: task.abort_handle(),
        })
    }
}

/// One running namespace watch; its task ends when the last subscription is dropped.
pub(super) struct NamespaceWatch {
    namespace: String,
    state: Arc<WatchState>,
    task: tokio::task::AbortHandle,
}

impl NamespaceWatch {
    /// Whether the watch's task is gone (see [`Status::ended`]).
    fn ended(&self) -> bool {
        self.state.status.borrow().ended || self.task.is_finished()
    }
}

impl Drop for NamespaceWatch {
    fn drop(&mut self) {
        tracing::debug!(namespace = %self.namespace, "no lease watches the namespace any more; ending its watch");
        self.task.abort();
    }
}

struct WatchState {
    /// Unique in the process (see [`Snapshot::watch`]).
    id: u64,
    registry: Mutex<Registry>,
    /// Every object of the namespace, for the group watches (see the `group` module).
    index: Mutex<Index>,
    status: watch::Sender<Status>,
}

/// Owned by the task of a namespace watch: when the task goes, however (its runtime shut down
/// and dropped it, it was aborted, it ended), the watch is marked ended, so that no subscriber
/// takes what it delivered for current any more and every wait on it ends.
struct EndWithTask(Arc<WatchState>);

impl Drop for EndWithTask {
    fn drop(&mut self) {
        self.0.status.send_modify(|status| {
            status.synced = false;
            status.ended = true;
        });
        lock(&self.0.index).end();
    }
}

/// What a [`GroupWatch`] keeps: the namespace watch running, and its group registered in the
/// watch's index until the last clone of the group watch is dropped.
struct GroupSubscription {
    watch: Arc<NamespaceWatch>,
    id: u64,
}

impl Drop for GroupSubscription {
    fn drop(&mut self) {
        lock(&self.watch.state.index).unsubscribe(self.id);
    }
}

#[derive(Default)]
struct Registry {
    objects: HashMap<String, Entry>,
    /// Deliveries so far.
    seq: u64,
}

struct Entry {
    sender: watch::Sender<Snapshot>,
}

impl WatchState {
    /// Delivers `view` to the subscribers of `name`, unless what they have is newer (a write of
    /// this process, published before the watch caught up with it).
    fn deliver(&self, registry: &mut Registry, name: &str, epoch: u64, view: View, at: Instant) {
        if let Some(entry) = registry.objects.get(name) {
            let behind = {
                let current = entry.sender.borrow();
                current
                    .view
                    .as_ref()
                    .and_then(View::version)
                    .zip(view.version())
                    .is_some_and(|(known, new)| older(new, known))
            };
            if behind {
                return;
            }
            registry.seq += 1;
            entry.sender.send_replace(Snapshot {
                watch: self.id,
                seq: registry.seq,
                epoch,
                view: Some(view),
                at,
            });
        }
    }

    /// A watch request was answered: after a failure (no listing since), the watch goes on from
    /// where it was, with nothing missed.
    fn established(&self) {
        self.status.send_if_modified(|status| {
            let resumed = status.epoch > 0 && !status.synced && !status.ended;
            if resumed {
                status.synced = true;
            }
            resumed
        });
        lock(&self.index).resume();
    }
}

/// A lease's subscription to its object in a namespace watch; unsubscribes when dropped.
pub(super) struct Subscription {
    watch: Arc<NamespaceWatch>,
    object: String,
    snapshots: watch::Receiver<Snapshot>,
    status: watch::Receiver<Status>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("namespace", &self.watch.namespace)
            .field("object", &self.object)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// The latest delivery for the object.
    pub(super) fn latest(&self) -> Snapshot {
        self.snapshots.borrow().clone()
    }

    /// Hands what a request of this process returned of the object (`at`: when it arrived) to
    /// every lease of the process that watches it, before the watch delivers it: a lease that
    /// released makes the object free for the others at once, not after the watch's delay.
    pub(super) fn publish(&self, lease: Arc<LeaseObject>, at: Instant) {
        let state = &self.watch.state;
        let status = *state.status.borrow();
        let epoch = if status.synced { status.epoch } else { 0 };
        let mut registry = lock(&state.registry);
        state.deliver(&mut registry, &self.object, epoch, View::Present(lease), at);
    }

    /// The `resourceVersion` of the object the watch received last (`None`: it has none of the
    /// object), and the epoch it is synced in; `None` while the watch is not synced. The watch
    /// delivers to a subscription only what it receives after the subscription was made: this
    /// tells a lease whether the object changed before (see `KubernetesBackend::catch_up`).
    pub(super) fn seen_version(&self) -> Option<(u64, Option<String>)> {
        // Under the index's lock, which the watch holds while it updates the index, delivers and
        // starts an epoch: the version and the epoch belong together.
        let index = lock(&self.watch.state.index);
        let status = *self.watch.state.status.borrow();
        if !status.synced || status.ended {
            return None;
        }
        index
            .current_version(&self.object)
            .map(|version| (status.epoch, version.map(str::to_owned)))
    }

    /// The health of the watch now.
    pub(super) fn status(&self) -> Status {
        *self.status.borrow()
    }

    /// Whether the watch's task is gone (see [`Status::ended`]): a lease then subscribes again.
    pub(super) fn ended(&self) -> bool {
        self.watch.ended()
    }

    /// Receivers that resolve on the next delivery or change of health after this call.
    pub(super) fn changes(&self) -> Changes {
        let mut snapshots = self.snapshots.clone();
        let mut status = self.status.clone();
        snapshots.borrow_and_update();
        status.borrow_and_update();
        Changes { snapshots, status }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut registry = lock(&self.watch.state.registry);
        // Our own receiver is still counted here.
        if registry
            .objects
            .get(&self.object)
            .is_some_and(|e| e.sender.receiver_count() <= 1)
        {
            registry.objects.remove(&self.object);
        }
    }
}

/// See [`Subscription::changes`].
pub(super) struct Changes {
    snapshots: watch::Receiver<Snapshot>,
    status: watch::Receiver<Status>,
}

impl Changes {
    /// Resolves on the next delivery for the object or change of the watch's health; `false`
    /// (at once, if it had already) when the watch ended (its runtime shut down).
    pub(super) async fn next(&mut self) -> bool {
        if self.status.borrow().ended {
            return false;
        }
        let changed = tokio::select! {
            changed = self.snapshots.changed() => changed.is_ok(),
            changed = self.status.changed() => changed.is_ok(),
        };
        changed && !self.status.borrow().ended
    }
}

/// The first pause before a failed list or watch of the namespace is tried again.
const WATCH_RETRY_START: Duration = Duration::from_millis(100);
/// The longest pause between the tries of a failed namespace watch. kube-runtime's default
/// (client-go's reflector: 0.8 s doubling up to 30 s) left a session blind for 5–9 s after an API
/// server restart of a few seconds (its next try came that long after the server was back), and
/// with it every waiting lease's and sharded group's view: a sharded chaos run's graceful handovers
/// then waited that long. One try a second per session (a process's leases share it) is what a
/// recovering server pays for a view that is current again within about a second.
const WATCH_RETRY_MAX: Duration = Duration::from_secs(1);

/// The namespace watch's retry pauses: [`WATCH_RETRY_START`] doubling up to [`WATCH_RETRY_MAX`],
/// ±20 % so that a fleet's sessions do not come back at once; from the start again once the
/// watch delivers.
struct WatchBackoff(Doubling);

impl WatchBackoff {
    fn new() -> Self {
        Self(Doubling::new(WATCH_RETRY_START, WATCH_RETRY_MAX).with_jitter(0.2))
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.0.next()
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.0.reset();
    }
}

/// The namespace watch: `kube::runtime::watcher` with [`WatchBackoff`], its events dispatched by
/// object name. `guard` marks the watch ended when this future is dropped or ends.
async fn run(guard: EndWithTask, floor: Floor, namespace: String) {
    let state = &guard.0;
    let counters = Arc::clone(&floor.shared.counters);
    // Built here, on the runtime the watch runs on: the client's request buffer lives there.
    let client = Client::new(floor, namespace.clone());
    let api: Api<LeaseObject> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    let mut stream = std::pin::pin!(watcher::watcher(api, config).backoff(WatchBackoff::new()));
    // Objects of subscribed names seen by the listing in progress.
    let mut listed: Option<HashMap<String, View>> = None;
    let mut epoch = 0;
    let mut failing = false;
    while let Some(event) = stream.next().await {
        let at = Instant::now();
        let event = match event {
            Ok(event) => {
                if failing {
                    tracing::debug!(%namespace, "lease watch works again");
                    failing = false;
                    // An error the watcher's stream goes on after (an event it could not decode,
                    // an error event other than `410 Gone`) asks for no new watch request, so
                    // `established` would not come: the groups follow the stream again now.
                    lock(&state.index).resume();
                }
                event
            }
            Err(error) => {
                state
                    .status
                    .send_if_modified(|s| std::mem::replace(&mut s.synced, false));
                lock(&state.index).suspend();
                // Once per streak: the watcher retries with its backoff.
                if !failing {
                    tracing::warn!(%error, %namespace, "lease watch failed, retrying with backoff; meanwhile waiting leases read the object before each attempt and holders learn of a loss from their renewals (a 403 needs `list` and `watch` on leases, see deploy/rbac.yaml)");
                }
                failing = true;
                continue;
            }
        };
        let mut registry = lock(&state.registry);
        let mut index = lock(&state.index);
        match event {
            Event::Init => {
                counters.listings.fetch_add(1, Ordering::Relaxed);
                listed = Some(HashMap::new());
                state
                    .status
                    .send_if_modified(|s| std::mem::replace(&mut s.synced, false));
                index.begin_listing();
            }
            Event::InitApply(lease) => {
                if let Some(name) = lease.metadata.name.clone() {
                    index.listed(&name, &lease, at);
                    if let Some(listed) = listed.as_mut() {
                        if registry.objects.contains_key(&name) {
                            let view = View::Present(Arc::new(super::record::slim(lease)));
                            listed.insert(name, view);
                        }
                    }
                }
            }
            Event::InitDone => {
                index.end_listing();
                epoch = EPOCHS.fetch_add(1, Ordering::Relaxed) + 1;
                // A subscribed object missing from the listing may have been created after the
                // listing's snapshot: nothing is delivered for it, so what its leases knew is
                // not current any more, and their next attempt reads it.
                for (name, view) in listed.take().unwrap_or_default() {
                    state.deliver(&mut registry, &name, epoch, view, at);
                }
                state.status.send_replace(Status {
                    epoch,
                    synced: true,
                    ended: false,
                });
                tracing::debug!(%namespace, epoch, "lease watch listed the namespace");
            }
            Event::Apply(lease) => {
                if let Some(name) = lease.metadata.name.clone() {
                    tracing::trace!(%namespace, object = %name, version = ?lease.metadata.resource_version, "lease watch event");
                    index.apply(&name, &lease, at);
                    state.deliver(
                        &mut registry,
                        &name,
                        epoch,
                        View::Present(Arc::new(super::record::slim(lease))),
                        at,
                    );
                }
            }
            Event::Delete(lease) => {
                if let Some(name) = lease.metadata.name.clone() {
                    let version = lease.metadata.resource_version;
                    index.delete(&name, version.as_deref(), lease.metadata.uid.as_deref());
                    state.deliver(&mut registry, &name, epoch, View::Absent { version }, at);
                }
            }
        }
    }
}

/// The client of a namespace watch: counts its requests and starts a watch request no sooner than
/// [`WATCH_FLOOR`] after the previous one started.
#[derive(Clone)]
struct Floor {
    client: Client,
    shared: Arc<FloorShared>,
}

struct FloorShared {
    last_start: Mutex<Option<Instant>>,
    counters: Arc<WatchCounters>,
    state: Weak<WatchState>,
}

type Request = http::Request<kube::client::Body>;
type Response = http::Response<kube::client::Body>;

impl tower::Service<Request> for Floor {
    type Response = Response;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let client = self.client.clone();
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let is_watch = is_watch(request.uri());
            let counters = &shared.counters;
            if is_watch {
                let now = Instant::now();
                let start = {
                    let mut last = lock(&shared.last_start);
                    let start = last.map_or(now, |l| (l + WATCH_FLOOR).max(now));
                    *last = Some(start);
                    start
                };
                if start > now {
                    counters.floored.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(wait = ?(start - now), "lease watch ended early; re-opening it after the floor delay");
                    tokio::time::sleep_until(start).await;
                }
                counters.watch_requests.fetch_add(1, Ordering::Relaxed);
            } else {
                counters.list_requests.fetch_add(1, Ordering::Relaxed);
            }
            let response = client.send(request).await?;
            if is_watch && response.status().is_success() {
                if let Some(state) = shared.state.upgrade() {
                    state.established();
                }
            }
            Ok(response)
        })
    }
}

fn is_watch(uri: &http::Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_requests_are_recognised() {
        let uri: http::Uri =
            "/apis/coordination.k8s.io/v1/namespaces/n/leases?&watch=true&timeoutSeconds=290"
                .parse()
                .unwrap();
        assert!(is_watch(&uri));
        let uri: http::Uri = "/apis/coordination.k8s.io/v1/namespaces/n/leases?limit=500"
            .parse()
            .unwrap();
        assert!(!is_watch(&uri));
    }
}
