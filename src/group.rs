//! Watching a group of lease records at once: who is alive and who holds what, from one watch.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::binding::Binding;
use crate::vocab::{BoxError, FencingToken};

/// Errors of [`LeaseBackend::watch_group`](crate::LeaseBackend::watch_group) and of a running
/// [`GroupWatch`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The backend cannot watch a group of records.
    #[error("backend {backend} cannot watch a group of leases")]
    Unsupported {
        /// The backend's name (as in configuration), or `"custom"` for one that does not say.
        backend: &'static str,
    },
    /// No Tokio runtime to run the watch on (called outside one).
    #[error("cannot watch a group of leases outside a Tokio runtime")]
    NoRuntime,
    /// The watch ended (its backend, session or runtime is gone); make a new one.
    #[error("the group watch ended")]
    Ended,
    /// The backend failed to start the watch.
    #[error("cannot watch the group of leases")]
    Backend(#[source] Arc<BoxError>),
}

/// One lease record of a group, as this process observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupRecord {
    /// The holder the record names; `None` when released.
    pub holder: Option<String>,
    /// The fencing token of the record's latest tenure, when the store shows one.
    pub token: Option<FencingToken>,
    /// When the holder's claim expires on this process's monotonic clock: when this process first
    /// observed the record's current version, plus the duration the record states. `None` when the
    /// store removes an expired record itself (etcd: the record is deleted with its etcd lease) or
    /// no one holds it.
    pub expires_at: Option<Instant>,
    /// What the holder wrote about itself with its claim ([`LeaseSettings::metadata`](crate::LeaseSettings::metadata));
    /// `None` when released, or when the holder wrote none (a peer that knows nothing of it,
    /// client-go for example).
    pub metadata: Option<String>,
    /// The incarnation of the record's current tenure, as its backend names it
    /// ([`LeaseBackend::incarnation`](crate::LeaseBackend::incarnation)), when the backend binds:
    /// what a record bound to it names.
    pub incarnation: Option<String>,
    /// The member tenure a *bound* record lives by (see [`Binding`]): it has no expiry of its
    /// own (`expires_at` is `None`) and is held exactly while the member record shows that
    /// incarnation held by the same holder; [`GroupSnapshot::live_holder`] judges it so.
    pub bound_to: Option<Binding>,
    /// When the record's own writer says its claim ends: the renewal time it wrote plus its
    /// duration, on the **writer's** wall clock (`None` where the backend keeps no such time, or
    /// for a bound record). Never used to decide exclusivity (that is `expires_at`, on the
    /// observer's own clock); only as a hint of liveness for placement
    /// ([`live_member`](Self::live_member)).
    pub stale_after: Option<std::time::SystemTime>,
    /// The record's version in the store, where it is a number (Kubernetes' `resourceVersion`).
    pub(crate) revision: Option<u64>,
    /// Since which version of the store the writer's watch has received every change as it
    /// happened; `None` when it does not say (see the sharded workers' placement of orphans).
    pub(crate) watching_since: Option<u64>,
}

impl GroupRecord {
    /// A record.
    pub fn new(
        holder: Option<String>,
        token: Option<FencingToken>,
        expires_at: Option<Instant>,
    ) -> Self {
        Self {
            holder,
            token,
            expires_at,
            metadata: None,
            incarnation: None,
            bound_to: None,
            stale_after: None,
            revision: None,
            watching_since: None,
        }
    }

    /// The record with its version in the store and its writer's `watching_since`.
    pub(crate) fn with_watch_facts(
        mut self,
        revision: Option<u64>,
        watching_since: Option<u64>,
    ) -> Self {
        self.revision = revision;
        self.watching_since = watching_since;
        self
    }

    /// The record with the end of its claim as its writer states it (see
    /// [`stale_after`](Self::stale_after)).
    pub fn with_stale_after(mut self, stale_after: Option<std::time::SystemTime>) -> Self {
        self.stale_after = stale_after;
        self
    }

    /// The holder, if it counts as a live member at `now` (this process's monotonic clock) and
    /// `wall` (its wall clock): its claim has not expired by [`live_holder`](Self::live_holder),
    /// **and** its writer's own end of the claim ([`stale_after`](Self::stale_after)) has not
    /// passed on this process's wall clock.
    ///
    /// The observed-time rule alone keeps a record alive for a full duration from when this
    /// process first received it, which is right for exclusivity (no clock but one's own is
    /// trusted) but wrong for choosing where work goes: a node that just started (or resumed
    /// from a freeze) receives the record of a member that died long ago as if it had just been
    /// written, and would count that member live for one more TTL — placing shards on it, or
    /// handing shards over to it, where nobody would run them until a TTL passed. The writer's
    /// renewal time tells such a record apart. A clock skew can only make a live member look
    /// dead to this process (if the skew exceeds the time left on its claim): that costs
    /// balance, never exclusivity, since every claim is still judged by the observed-time rule.
    pub fn live_member(&self, now: Instant, wall: std::time::SystemTime) -> Option<&str> {
        let holder = self.live_holder(now)?;
        self.stale_after
            .is_none_or(|stale| wall < stale)
            .then_some(holder)
    }

    /// The record with the incarnation of its current tenure.
    pub fn with_incarnation(mut self, incarnation: Option<String>) -> Self {
        self.incarnation = incarnation;
        self
    }

    /// The record bound to a member tenure.
    pub fn with_binding(mut self, binding: Option<Binding>) -> Self {
        self.bound_to = binding;
        self
    }

    /// The record with the holder's metadata.
    pub fn with_metadata(mut self, metadata: Option<String>) -> Self {
        self.metadata = metadata;
        self
    }

    /// The holder, if its claim has not expired at `now`. A bound record cannot be judged alone
    /// (its member record decides): this answers its holder; use
    /// [`GroupSnapshot::live_holder`], which judges it by its member record.
    pub fn live_holder(&self, now: Instant) -> Option<&str> {
        match (&self.holder, self.expires_at) {
            (Some(holder), None) => Some(holder),
            (Some(holder), Some(at)) if now < at => Some(holder),
            _ => None,
        }
    }
}

/// The records of a group at one moment, by lease name (the full name, prefix included).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupSnapshot {
    records: BTreeMap<String, GroupRecord>,
    synced: bool,
}

impl GroupSnapshot {
    /// A snapshot of `records`; `synced` tells whether the watch has listed the whole group yet.
    pub fn new(records: BTreeMap<String, GroupRecord>, synced: bool) -> Self {
        Self { records, synced }
    }

    /// For backend implementers: the records, to change in place. Sending a change of one record
    /// costs O(log n), not a copy of the group, with
    /// `sender.send_modify(|s| Arc::make_mut(s).records_mut().insert(..))`: the snapshot is copied
    /// only while a reader still holds the previous one.
    pub fn records_mut(&mut self) -> &mut BTreeMap<String, GroupRecord> {
        &mut self.records
    }

    /// For backend implementers: marks whether the watch has listed the whole group.
    pub fn set_synced(&mut self, synced: bool) {
        self.synced = synced;
    }

    /// Whether the watch has listed the whole group: before that, a missing record means nothing.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Every record, by lease name.
    pub fn records(&self) -> &BTreeMap<String, GroupRecord> {
        &self.records
    }

    /// The records whose lease names start with `prefix`, in name order (a range of the map, not
    /// a scan of the group).
    pub fn with_prefix<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a GroupRecord)> + 'a {
        self.records
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(move |(name, _)| name.starts_with(prefix))
    }

    /// The record of lease `name`.
    pub fn get(&self, name: &str) -> Option<&GroupRecord> {
        self.records.get(name)
    }

    /// The live holder of lease `name` at `now` (see [`GroupRecord::live_holder`]); a bound
    /// record's holder only while its member record, in this snapshot, shows the bound
    /// incarnation held by the same holder and not expired.
    pub fn live_holder(&self, name: &str, now: Instant) -> Option<&str> {
        let record = self.records.get(name)?;
        let holder = record.live_holder(now)?;
        match &record.bound_to {
            None => Some(holder),
            Some(binding) => {
                let member = self.records.get(binding.member())?;
                (member.bound_to.is_none()
                    && member.live_holder(now) == Some(holder)
                    && member.incarnation.as_deref() == Some(binding.incarnation()))
                .then_some(holder)
            }
        }
    }

    /// The earliest instant after `now` at which a live record expires: when the snapshot's
    /// meaning changes without a new snapshot.
    pub fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.records
            .values()
            .filter(|r| r.holder.is_some())
            .filter_map(|r| r.expires_at)
            .filter(|at| *at > now)
            .min()
    }
}

/// A running watch of a group of lease records.
///
/// A *group* is every lease whose name starts with a prefix (for example `ingest-`: the shard
/// leases `ingest.0` … `ingest.63` and the member leases `ingest.member.<node>`). actix has no
/// remoting and no cluster membership, so the lease store is the one thing the nodes of a fleet
/// share; a [`GroupWatch`] turns it into membership ("which nodes hold their member lease") and
/// into a picture of the group ("which node holds which shard"), for
/// [`ShardedWorkers`](crate::ShardedWorkers) and for status pages.
///
/// # Cost
///
/// A backend serves a group from one list and one watch for the whole group, never from a request
/// per record per interval: on Kubernetes the namespace watch its leases already share (the
/// group is a filter over it, no request of its own); on etcd one range and one watch on the key
/// prefix per group and session, shared by every watch of the group (etcd deletes a record with
/// its holder's etcd lease, so its records carry no expiry); in memory the store itself. [`LeaseBackend::watch_group`](crate::LeaseBackend::watch_group) is
/// the capability; a backend that lacks it answers [`GroupError::Unsupported`].
///
/// # Races and time
///
/// A snapshot is what this process observed, up to the watch's delay: it can lag the store, and
/// two processes can see different snapshots for a moment. It is meant for placement and for
/// pictures, never for exclusivity (the lease of each record arbitrates that).
///
/// A record's expiry is judged as a contender judges a claim: from when *this process* observed
/// the record's current version, on its own monotonic clock, plus the duration the record states
/// ([`GroupRecord::expires_at`]); never from a timestamp another machine wrote. A record whose
/// holder stopped renewing therefore drops out of [`GroupSnapshot::live_holder`] at its expiry
/// without any event: a consumer that cares wakes at [`GroupSnapshot::next_expiry`].
///
/// Clones share the watch; it ends (its resources released) when the last clone and the
/// backend's own handle are dropped.
#[derive(Clone)]
pub struct GroupWatch {
    receiver: watch::Receiver<Arc<GroupSnapshot>>,
    _keep: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for GroupWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let snapshot = self.receiver.borrow();
        f.debug_struct("GroupWatch")
            .field("records", &snapshot.records.len())
            .field("synced", &snapshot.synced)
            .finish()
    }
}

impl GroupWatch {
    /// For backend implementers: a watch reading the snapshots `receiver` gets; `keep` is held as
    /// long as the watch lives (the task or subscription that feeds the sender, for example).
    pub fn new(
        receiver: watch::Receiver<Arc<GroupSnapshot>>,
        keep: impl Any + Send + Sync + 'static,
    ) -> Self {
        Self {
            receiver,
            _keep: Arc::new(keep),
        }
    }

    /// The latest snapshot.
    pub fn snapshot(&self) -> Arc<GroupSnapshot> {
        Arc::clone(&self.receiver.borrow())
    }

    /// Resolves when a snapshot newer than the last one this handle read with
    /// [`snapshot_and_mark`](Self::snapshot_and_mark) (or since it was made) arrives.
    ///
    /// # Errors
    ///
    /// [`GroupError::Ended`] when the watch ended (its backend or runtime is gone).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn changed(&mut self) -> Result<(), GroupError> {
        self.receiver.changed().await.map_err(|_| GroupError::Ended)
    }

    /// The latest snapshot, marked as read for [`changed`](Self::changed).
    pub fn snapshot_and_mark(&mut self) -> Arc<GroupSnapshot> {
        Arc::clone(&self.receiver.borrow_and_update())
    }
}

/// For backend implementers: the sending side of a [`GroupWatch`] (a `tokio::sync::watch` channel
/// of snapshots), made with [`group_channel`].
pub type GroupSender = watch::Sender<Arc<GroupSnapshot>>;

/// For backend implementers: a channel of group snapshots starting with an empty, unsynced one.
pub fn group_channel() -> (GroupSender, watch::Receiver<Arc<GroupSnapshot>>) {
    watch::channel(Arc::new(GroupSnapshot::default()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn records_expire_by_the_observers_clock_and_the_snapshot_says_when() {
        let now = Instant::now();
        let ttl = Duration::from_secs(3);
        let snapshot = GroupSnapshot::new(
            BTreeMap::from([
                (
                    "g-0".to_owned(),
                    GroupRecord::new(Some("a".into()), None, Some(now + ttl)),
                ),
                (
                    "g-1".to_owned(),
                    GroupRecord::new(Some("b".into()), None, None),
                ),
                ("g-2".to_owned(), GroupRecord::new(None, None, Some(now))),
            ]),
            true,
        );
        assert_eq!(snapshot.live_holder("g-0", now), Some("a"));
        assert_eq!(snapshot.live_holder("g-0", now + ttl), None);
        assert_eq!(snapshot.live_holder("g-1", now + ttl * 100), Some("b"));
        assert_eq!(snapshot.live_holder("g-2", now), None);
        assert_eq!(snapshot.live_holder("g-3", now), None);
        assert_eq!(snapshot.with_prefix("g-").count(), 3);
        let names: Vec<&String> = snapshot.with_prefix("g-1").map(|(n, _)| n).collect();
        assert_eq!(names, ["g-1"]);
        assert_eq!(snapshot.with_prefix("h").count(), 0);
        assert_eq!(snapshot.next_expiry(now), Some(now + ttl));
        assert_eq!(snapshot.next_expiry(now + ttl), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_whose_writer_says_its_claim_ended_is_no_member_however_recently_first_seen() {
        use std::time::SystemTime;
        let now = Instant::now();
        let wall = SystemTime::now();
        let ttl = Duration::from_secs(3);
        // First received just now (a listing, or a watch event delayed by a freeze): held for a
        // TTL by this process's clock, which exclusivity follows...
        let record = |stale_after| {
            GroupRecord::new(Some("a".into()), None, Some(now + ttl)).with_stale_after(stale_after)
        };
        let dead = record(Some(wall - Duration::from_secs(20)));
        assert_eq!(dead.live_holder(now), Some("a"));
        // ...but its writer renewed it last 23 s ago: no member to place work on.
        assert_eq!(dead.live_member(now, wall), None);
        let live = record(Some(wall + Duration::from_secs(2)));
        assert_eq!(live.live_member(now, wall), Some("a"));
        assert_eq!(live.live_member(now, wall + Duration::from_secs(2)), None);
        // A record without the writer's time (etcd, in memory) is judged by its expiry alone.
        assert_eq!(record(None).live_member(now, wall), Some("a"));
        assert_eq!(record(None).live_member(now + ttl, wall), None);
    }

    #[tokio::test]
    async fn a_watch_ends_when_its_sender_is_gone() {
        let (sender, receiver) = group_channel();
        let mut watch = GroupWatch::new(receiver, ());
        assert!(!watch.snapshot().is_synced());
        sender.send_replace(Arc::new(GroupSnapshot::new(BTreeMap::new(), true)));
        watch.changed().await.unwrap();
        assert!(watch.snapshot_and_mark().is_synced());
        drop(sender);
        assert!(matches!(watch.changed().await, Err(GroupError::Ended)));
    }
}
