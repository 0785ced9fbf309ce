//! Group watches on etcd: one range and one watch on the group's key prefix, per group and
//! session, shared by every [`GroupWatch`] of that group.
//!
//! Group `g` of a session whose key prefix is `p` ([`EtcdSettings::prefix`](super::EtcdSettings))
//! is every key starting with `p` + `g`. The first watch of a group starts its *feed*: a task on
//! the session's own runtime that lists the group with one range request and watches the prefix
//! from the revision after the range's (so nothing written between the two is missed) on the
//! session's shared watch stream ([`WatchHub`](super::watch::WatchHub)). Once etcd created the
//! watch it publishes the listed records as a synced snapshot, then folds every event into them
//! and publishes a snapshot per watch response. Further watches of the group subscribe to the
//! same feed; dropping the last one aborts the task, which cancels its etcd watch.
//!
//! When the watch breaks or etcd cancels it (its start revision was compacted, the stream broke,
//! etcd is unreachable), the feed publishes the records it has as not synced, then lists and
//! watches again, after a pause (100 ms doubling to 2 s) unless the history was only compacted.
//!
//! A record is what the backend writes: the key's value is the holder, its `mod_revision` the
//! fencing token. A released lease has no key, so it has no record. Keys are attached to the
//! holder's etcd lease and etcd deletes them when that lease expires, so records carry no expiry
//! of their own (`expires_at` is `None`): a holder that stops renewing drops out when etcd deletes
//! its key (the etcd lease's TTL after its last keep-alive, plus etcd's expiry check, every
//! 500 ms). A lease dropped without release in a live process keeps its key (and its record)
//! until the session deletes it one TTL later, as contenders see it too.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use etcd_client::{Client, Event, EventType, GetOptions, KeyValue};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::{sleep, timeout, Instant};

use super::watch::{HubEvent, WatchHandle};
use super::{observe, token_of, EtcdError};
use crate::backend::BackendError;
use crate::group::{
    group_channel, GroupError, GroupRecord, GroupSender, GroupSnapshot, GroupWatch,
};

/// First pause before listing and watching again after a failure; doubles up to
/// [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A round (list and watch) that lasted this long before failing starts the pauses over.
const HEALTHY_ROUND: Duration = Duration::from_secs(10);

/// What a feed needs of its session (the session implements it; a feed holds it weakly and ends
/// when it is gone).
pub(super) trait GroupSource: Send + Sync + 'static {
    /// The session's client, connecting first if needed.
    fn client(&self) -> impl Future<Output = Result<Client, EtcdError>> + Send;

    /// The bound on one request.
    fn io_timeout(&self) -> Duration;

    /// Watches every key starting with `prefix` from `start_revision` over the session's shared
    /// watch stream.
    fn watch_prefix(
        &self,
        prefix: Vec<u8>,
        start_revision: i64,
    ) -> impl Future<Output = Result<WatchHandle, EtcdError>> + Send;
}

/// A session's group feeds, by group prefix (without the session's key prefix), and what they
/// saw of the holders' etcd leases.
#[derive(Default)]
pub(super) struct GroupFeeds {
    feeds: Mutex<HashMap<String, Weak<Feed>>>,
    holders: Arc<HolderLeases>,
}

/// The etcd lease each holder was last seen claiming a key with, in any group this session
/// watches: where a handover puts the key it hands to that holder (see `EtcdBackend::hand_over`).
#[derive(Default)]
pub(super) struct HolderLeases(Mutex<HashMap<String, (i64, i64)>>);

impl HolderLeases {
    /// Remembers that `kv` (a put) names its holder on its etcd lease, unless a later revision
    /// of that holder was seen already.
    fn saw(&self, kv: &KeyValue) {
        let Some(holder) = super::value::KeyContent::holder(kv.value()) else {
            return;
        };
        if kv.lease() == 0 || holder.is_empty() {
            return;
        }
        let mut holders = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let entry = holders
            .entry(holder)
            .or_insert((kv.lease(), kv.mod_revision()));
        if kv.mod_revision() >= entry.1 {
            *entry = (kv.lease(), kv.mod_revision());
        }
    }

    /// The etcd lease `holder` was last seen holding a key with.
    pub(super) fn lease_of(&self, holder: &str) -> Option<i64> {
        let holders = self.0.lock().unwrap_or_else(|p| p.into_inner());
        holders.get(holder).map(|(lease, _)| *lease)
    }
}

impl GroupFeeds {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Weak<Feed>>> {
        self.feeds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the feeds saw of the holders' etcd leases.
    pub(super) fn holders(&self) -> &HolderLeases {
        &self.holders
    }

    /// A watch of group `group` (keys starting with `key`; lease names are keys without their
    /// first `strip` bytes): a new subscriber of its running feed, or a new feed on `runtime`
    /// reading from `source`.
    pub(super) fn watch<S: GroupSource>(
        &self,
        runtime: &Handle,
        source: Weak<S>,
        group: &str,
        key: Vec<u8>,
        strip: usize,
    ) -> Result<GroupWatch, GroupError> {
        let mut feeds = self.lock();
        feeds.retain(|_, feed| feed.strong_count() > 0);
        if let Some(feed) = feeds.get(group).and_then(Weak::upgrade) {
            let mut receiver = feed.receiver.clone();
            // `changed` resolves for snapshots newer than this watch.
            receiver.borrow_and_update();
            return Ok(GroupWatch::new(receiver, feed));
        }
        let (sender, receiver) = group_channel();
        let through = Arc::new(AtomicI64::new(0));
        let fold = Fold {
            key: key.clone(),
            strip,
            listed: None,
            sender,
            holders: Arc::clone(&self.holders),
            through: Arc::clone(&through),
        };
        let span = tracing::debug_span!("etcd_group_watch", group = %group);
        let task = runtime.spawn(tracing::Instrument::instrument(feed(source, fold), span));
        let feed = Arc::new(Feed {
            receiver: receiver.clone(),
            task: task.abort_handle(),
            key,
            strip,
            through,
        });
        feeds.insert(group.to_owned(), Arc::downgrade(&feed));
        Ok(GroupWatch::new(receiver, feed))
    }

    /// A wait until key `key` is no longer at the version written at `key_revision` (its
    /// `mod_revision` when last seen held by another owner), on the records of a running feed
    /// of a group that holds the key, instead of a watch of the key's own and a read (a node
    /// taking up the 256 shards of one that left sent 701 watch requests and 77 reads for
    /// them): `None` when no feed holds the key. The future answers what the feed shows once
    /// it has followed the store up to that version at least (a lagging feed decides nothing):
    /// the key deleted, or at another version; `None` when the feed ended (the last watch of
    /// its group was dropped). It holds no feed alive.
    pub(super) fn wait_for_key(
        &self,
        key: &[u8],
        key_revision: i64,
    ) -> Option<impl Future<Output = Option<KeyChange>> + Send + 'static> {
        let (receiver, through, name) = {
            let feeds = self.lock();
            let feed = feeds
                .values()
                .filter_map(Weak::upgrade)
                .find(|feed| key.starts_with(&feed.key))?;
            let name = feed.name(key);
            (feed.receiver.clone(), Arc::clone(&feed.through), name)
        };
        Some(key_change(receiver, through, name, key_revision))
    }
}

/// Waits on `receiver`'s records, which follow the store up to revision `through`, until
/// record `name` is no longer at the version written at `key_revision` (see
/// [`GroupFeeds::wait_for_key`]).
async fn key_change(
    mut receiver: watch::Receiver<Arc<GroupSnapshot>>,
    through: Arc<AtomicI64>,
    name: String,
    key_revision: i64,
) -> Option<KeyChange> {
    loop {
        {
            let snapshot = receiver.borrow_and_update();
            let followed = through.load(Ordering::Acquire) >= key_revision;
            if snapshot.is_synced() && followed {
                match snapshot.get(&name) {
                    None => return Some(KeyChange::Deleted),
                    Some(record) if record.token != Some(token_of(key_revision)) => {
                        return Some(KeyChange::Changed)
                    }
                    Some(_) => {}
                }
            }
        }
        receiver.changed().await.ok()?;
    }
}

/// What a wait on a group feed saw of a key ([`GroupFeeds::wait_for_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyChange {
    /// The key is gone (released, expired with its etcd lease).
    Deleted,
    /// The key is at another version (handed over, released to a preferred holder, claimed).
    Changed,
}

/// A running feed: what every [`GroupWatch`] of its group holds. Dropped with the last of them,
/// it stops the task.
struct Feed {
    receiver: watch::Receiver<Arc<GroupSnapshot>>,
    task: AbortHandle,
    /// The group's key prefix, and the length of the session's (see [`Fold`]).
    key: Vec<u8>,
    strip: usize,
    /// The store revision up to which the published records follow the store (see [`Fold`]).
    through: Arc<AtomicI64>,
}

impl Feed {
    fn name(&self, key: &[u8]) -> String {
        name_of(key, self.strip)
    }
}

/// The lease name of `key`: the key without its first `strip` bytes (the session's prefix); a
/// key shorter than that is its own name (never a panic).
fn name_of(key: &[u8], strip: usize) -> String {
    String::from_utf8_lossy(key.get(strip..).unwrap_or(key)).into_owned()
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The records of a group, folded from a range and the watch events after it. They live in the
/// snapshot the sender holds, changed in place (copied only while a reader still holds the
/// previous snapshot), as the Kubernetes index keeps its groups: one copy of the group, and a
/// change costs O(log n), not a copy of the group (`benches/group_watch.rs`).
struct Fold {
    /// The group's key prefix (the session's prefix and the group's).
    key: Vec<u8>,
    /// The length of the session's key prefix, taken off keys to get lease names.
    strip: usize,
    /// The records of the range in progress and its revision, published (as synced) once its
    /// watch is created.
    listed: Option<(BTreeMap<String, GroupRecord>, i64)>,
    sender: GroupSender,
    holders: Arc<HolderLeases>,
    /// The store revision up to which the published records follow the store: the listing's,
    /// then the latest event's (the events come in revision order); set with the records, under
    /// the snapshot's lock, so that no reader sees one without the other.
    through: Arc<AtomicI64>,
}

impl Fold {
    fn name(&self, key: &[u8]) -> String {
        name_of(key, self.strip)
    }

    /// The group as listed; published (as synced) once its watch is created.
    fn listed(&mut self, kvs: &[KeyValue], revision: i64) {
        kvs.iter().for_each(|kv| self.holders.saw(kv));
        self.listed = Some((
            kvs.iter()
                .map(|kv| (self.name(kv.key()), record(kv)))
                .collect(),
            revision,
        ));
    }

    /// The watch of the range is created: the listed records are the group, synced.
    fn created(&mut self) {
        match self.listed.take() {
            Some((records, revision)) => {
                let through = &self.through;
                self.sender.send_modify(|snapshot| {
                    *snapshot = Arc::new(GroupSnapshot::new(records, true));
                    through.fetch_max(revision, Ordering::AcqRel);
                });
            }
            None => self
                .sender
                .send_modify(|snapshot| Arc::make_mut(snapshot).set_synced(true)),
        }
    }

    fn apply(&mut self, events: &[Event]) {
        let latest = events
            .iter()
            .filter_map(|event| event.kv())
            .map(KeyValue::mod_revision)
            .max()
            .unwrap_or(0);
        let changes: Vec<(String, Option<GroupRecord>)> = events
            .iter()
            .filter_map(|event| {
                let kv = event.kv()?;
                let name = self.name(kv.key());
                Some(match event.event_type() {
                    EventType::Put => {
                        self.holders.saw(kv);
                        (name, Some(record(kv)))
                    }
                    // Released, expired with its etcd lease, or deleted by hand.
                    EventType::Delete => (name, None),
                })
            })
            .collect();
        self.change(changes, latest);
    }

    /// Applies `changes` (a record, or `None`: the key is gone), which follow the store up to
    /// revision `through`, to the published records, in place, and publishes them as synced.
    fn change(&self, changes: Vec<(String, Option<GroupRecord>)>, through: i64) {
        let followed = &self.through;
        self.sender.send_modify(|snapshot| {
            followed.fetch_max(through, Ordering::AcqRel);
            let snapshot = Arc::make_mut(snapshot);
            for (name, record) in changes {
                match record {
                    Some(record) => {
                        snapshot.insert(name, record);
                    }
                    None => {
                        snapshot.remove(&name);
                    }
                }
            }
            snapshot.set_synced(true);
        });
    }

    /// The records may lag the store from now on, until the next list.
    fn unsynced(&mut self) {
        self.listed = None;
        self.sender.send_if_modified(|snapshot| {
            let synced = snapshot.is_synced();
            if synced {
                Arc::make_mut(snapshot).set_synced(false);
            }
            synced
        });
    }
}

/// The record of a key as the backend writes it: value = holder, `mod_revision` = token. The key
/// goes with the holder's etcd lease, so the record states no expiry.
fn record(kv: &KeyValue) -> GroupRecord {
    // A preference (see `value.rs`) is a free record.
    let holder = (!kv.value().is_empty())
        .then(|| super::value::KeyContent::holder(kv.value()))
        .flatten();
    let metadata = holder
        .as_ref()
        .and_then(|_| super::value::KeyContent::metadata(kv.value()));
    GroupRecord::new(holder, Some(token_of(kv.mod_revision())), None).with_metadata(metadata)
}

/// How a round of list and watch ended.
enum Ended {
    /// The session is gone: the feed ends (its watches then end too).
    SessionGone,
    /// The watch's start revision was compacted: list again at once.
    Compacted,
    /// Listing or watching failed: list again after a pause.
    Failed { error: String, transient: bool },
}

/// The feed's task: rounds of list and watch until the session is gone (or the task aborted).
async fn feed<S: GroupSource>(session: Weak<S>, mut fold: Fold) {
    let mut backoff = BACKOFF_START;
    loop {
        let started = Instant::now();
        match round(&session, &mut fold).await {
            Ended::SessionGone => return,
            Ended::Compacted => {
                tracing::debug!("the group watch's history was compacted; listing again");
                fold.unsynced();
            }
            Ended::Failed { error, transient } => {
                if started.elapsed() >= HEALTHY_ROUND {
                    backoff = BACKOFF_START;
                }
                if transient {
                    tracing::debug!(%error, retry_in = ?backoff, "the group watch failed; listing again");
                } else {
                    tracing::warn!(%error, retry_in = ?backoff, "the group watch failed; listing again");
                }
                fold.unsynced();
                sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// One range of the group, then its watch from the range's revision on, until it ends.
async fn round<S: GroupSource>(session: &Weak<S>, fold: &mut Fold) -> Ended {
    let mut watch = {
        let Some(inner) = session.upgrade() else {
            return Ended::SessionGone;
        };
        let revision = match list(&*inner, fold).await {
            Ok(revision) => revision,
            Err(error) => {
                return Ended::Failed {
                    transient: error.is_transient(),
                    error: error.to_string(),
                }
            }
        };
        match inner
            .watch_prefix(fold.key.clone(), revision.saturating_add(1))
            .await
        {
            Ok(watch) => watch,
            Err(error) => {
                return Ended::Failed {
                    transient: error.is_transient(),
                    error: error.to_string(),
                }
            }
        }
    };
    loop {
        let failed = |error: String| Ended::Failed {
            error,
            transient: true,
        };
        match watch.next().await {
            // Listed, and followed from the list's revision on.
            Some(HubEvent::Created { .. }) => fold.created(),
            Some(HubEvent::Events(events)) => fold.apply(&events),
            Some(HubEvent::Canceled {
                compact_revision, ..
            }) if compact_revision > 0 => return Ended::Compacted,
            Some(HubEvent::Canceled { reason, .. }) => {
                return failed(format!("etcd cancelled the watch: {reason}"))
            }
            Some(HubEvent::Broken(message)) => return failed(message),
            None if session.strong_count() == 0 => return Ended::SessionGone,
            None => return failed("the session's watch stream stopped".into()),
        }
    }
}

/// Lists the group with one range request; returns the range's revision.
async fn list<S: GroupSource>(session: &S, fold: &mut Fold) -> Result<i64, EtcdError> {
    let mut kv = session.client().await?.kv_client();
    let io_timeout = session.io_timeout();
    let options = GetOptions::new().with_prefix();
    let response = match timeout(io_timeout, kv.get(fold.key.clone(), Some(options))).await {
        Ok(response) => observe("range", response)
            .map_err(|e| EtcdError::from_client("list a group of leases", 0, e))?,
        Err(_) => {
            return Err(EtcdError::Timeout {
                operation: "list a group of leases",
                timeout: io_timeout,
            })
        }
    };
    let revision = response
        .header()
        .map(|h| h.revision())
        .filter(|r| *r > 0)
        .ok_or(EtcdError::UnexpectedResponse {
            operation: "list a group of leases",
            detail: "no revision in the response header".into(),
        })?;
    fold.listed(response.kvs(), revision);
    Ok(revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold() -> (Fold, watch::Receiver<Arc<GroupSnapshot>>) {
        let (sender, receiver) = group_channel();
        let fold = Fold {
            key: b"/p/g-".to_vec(),
            strip: 3,
            listed: None,
            sender,
            holders: Arc::default(),
            through: Arc::default(),
        };
        (fold, receiver)
    }

    fn held(holder: &str, revision: i64) -> Option<GroupRecord> {
        Some(GroupRecord::new(
            Some(holder.into()),
            Some(token_of(revision)),
            None,
        ))
    }

    #[test]
    fn names_are_keys_without_the_session_prefix() {
        let (fold, _) = fold();
        assert_eq!(fold.name(b"/p/g-0"), "g-0");
        assert_eq!(fold.name(b"/p"), "/p", "never panics on a short key");
    }

    #[test]
    fn losing_sync_keeps_the_records_and_says_so_once() {
        let (mut fold, mut receiver) = fold();
        fold.change(vec![("g-0".into(), held("a", 5))], 0);
        receiver.borrow_and_update();
        fold.unsynced();
        assert!(receiver.has_changed().unwrap());
        let snapshot = receiver.borrow_and_update().clone();
        assert!(!snapshot.is_synced());
        assert_eq!(snapshot.records().len(), 1, "{snapshot:?}");
        fold.unsynced();
        assert!(!receiver.has_changed().unwrap(), "no second snapshot");
    }

    /// A change is made to the published snapshot in place: the group is not copied per change
    /// (at 10,000 records every watch response copied the whole map, and the fold kept a second
    /// copy of it), except while a reader still holds the previous snapshot, which keeps what it
    /// read.
    #[test]
    fn changes_are_made_in_place_unless_a_reader_holds_the_snapshot() {
        let (fold, mut receiver) = fold();
        fold.change(
            (0..3).map(|i| (format!("g-{i}"), held("a", i))).collect(),
            0,
        );
        let first = Arc::as_ptr(&receiver.borrow_and_update());
        fold.change(vec![("g-1".into(), held("b", 7)), ("g-2".into(), None)], 0);
        assert!(receiver.has_changed().unwrap());
        let snapshot = receiver.borrow_and_update().clone();
        assert_eq!(Arc::as_ptr(&snapshot), first, "changed in place");
        assert!(snapshot.is_synced());
        assert_eq!(snapshot.get("g-1"), held("b", 7).as_ref());
        assert_eq!(snapshot.records().len(), 2);

        // A reader holds this snapshot: the next change goes to a copy, and the reader's
        // snapshot stays as it was.
        fold.change(vec![("g-0".into(), held("c", 8))], 0);
        let next = receiver.borrow_and_update().clone();
        assert_ne!(Arc::as_ptr(&next), Arc::as_ptr(&snapshot));
        assert_eq!(snapshot.get("g-0"), held("a", 0).as_ref());
        assert_eq!(next.get("g-0"), held("c", 8).as_ref());
    }

    /// A range replaces the records only when its watch is created, and a failure before that
    /// forgets it.
    #[test]
    fn a_listing_is_published_when_its_watch_is_created() {
        let (mut fold, mut receiver) = fold();
        fold.change(vec![("g-0".into(), held("a", 1))], 0);
        receiver.borrow_and_update();
        fold.listed = Some((
            BTreeMap::from([("g-1".to_owned(), held("b", 2).unwrap())]),
            2,
        ));
        fold.unsynced();
        assert_eq!(fold.listed, None);
        fold.listed = Some((
            BTreeMap::from([("g-1".to_owned(), held("b", 2).unwrap())]),
            2,
        ));
        receiver.borrow_and_update();
        fold.created();
        let snapshot = receiver.borrow_and_update().clone();
        assert!(snapshot.is_synced());
        assert_eq!(snapshot.records().keys().collect::<Vec<_>>(), ["g-1"]);
    }

    /// A wait for a key to change decides only once the records follow the store up to the
    /// version it saw (a lagging feed shows the key absent or older), then wakes on the first
    /// other version or on its deletion; it ends with the feed.
    #[tokio::test]
    async fn a_wait_for_a_key_wakes_on_its_next_version_only() {
        use futures_util::FutureExt;
        let (mut fold, receiver) = fold();
        let through = Arc::clone(&fold.through);
        let wait = |revision| {
            key_change(
                receiver.clone(),
                Arc::clone(&through),
                "g-0".into(),
                revision,
            )
            .boxed()
        };
        // Seen held at revision 7; the feed has followed the store only up to 5.
        fold.change(vec![("g-1".into(), held("a", 5))], 5);
        let mut lagging = wait(7);
        assert_eq!((&mut lagging).now_or_never(), None, "absent, but lagging");
        fold.change(vec![("g-0".into(), held("b", 7))], 7);
        assert_eq!((&mut lagging).now_or_never(), None, "the version seen");
        fold.change(vec![("g-1".into(), held("a", 8))], 8);
        assert_eq!((&mut lagging).now_or_never(), None, "another key");
        fold.change(vec![("g-0".into(), held("c", 9))], 9);
        assert_eq!(lagging.await, Some(KeyChange::Changed), "handed over");

        let mut deleted = wait(9);
        assert_eq!((&mut deleted).now_or_never(), None);
        fold.change(vec![("g-0".into(), None)], 10);
        assert_eq!(deleted.await, Some(KeyChange::Deleted));

        // Unsynced records decide nothing.
        fold.change(vec![("g-0".into(), held("d", 11))], 11);
        let mut unsynced = wait(11);
        fold.unsynced();
        through.store(12, Ordering::Release);
        assert_eq!((&mut unsynced).now_or_never(), None);

        let ended = wait(11);
        drop(fold);
        assert_eq!(ended.await, None, "the feed ended");
        assert_eq!(unsynced.await, None);
    }
}
