//! Watching a group of lease records at once: who is alive and who holds what, from one watch.

use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::binding::{Binding, HandedShards};
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
    /// The shards the ended tenures of this (member) record handed on as they ended
    /// ([`Lease::retire_handing`](crate::Lease::retire_handing)): a record bound to such a
    /// tenure and listed is held by its target while the target's member tenure lives.
    pub(crate) handed: Option<Arc<HandedShards>>,
    /// Whether the holder marked its current tenure as leaving
    /// ([`Lease::mark_leaving`](crate::Lease::mark_leaving)): a member record so marked is no
    /// target of placement any more (its node shuts down, and hands on what it holds).
    pub leaving: bool,
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
            handed: None,
            leaving: false,
        }
    }

    /// The record, marked leaving or not (see [`leaving`](Self::leaving)).
    pub fn with_leaving(mut self, leaving: bool) -> Self {
        self.leaving = leaving;
        self
    }

    /// The record with the shards its ended tenures handed on (see [`HandedShards`]).
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub(crate) fn with_handed(mut self, handed: Option<Arc<HandedShards>>) -> Self {
        self.handed = handed;
        self
    }

    /// Whom this (member) record says its ended incarnation `incarnation` handed shard lease
    /// `lease` to: the target's owner and member tenure.
    pub(crate) fn handed_to(&self, incarnation: &str, lease: &str) -> Option<(&str, &Binding)> {
        self.handed.as_ref()?.target(incarnation, lease)
    }

    /// The record with its version in the store and its writer's `watching_since`.
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
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
///
/// A snapshot also knows which records changed since an earlier snapshot of the same watch
/// ([`changes_since`](Self::changes_since), within its last changes: up to 1,024), so that a
/// consumer can fold in what changed instead of looking at every record again, and where the
/// next expiry is without a look at every record ([`next_expiry`](Self::next_expiry)).
#[derive(Clone)]
pub struct GroupSnapshot {
    records: BTreeMap<String, GroupRecord>,
    synced: bool,
    /// Which state of which watch this is: see [`SnapshotVersion`].
    version: SnapshotVersion,
    /// The names changed by the last `changed.len()` versions, oldest first.
    changed: VecDeque<String>,
    /// The expiries of the records with a holder, counted (`None` after
    /// [`records_mut`](Self::records_mut): built again at the next tracked change).
    expiries: Option<BTreeMap<Instant, u32>>,
}

/// One state of the snapshots of one watch: [`GroupSnapshot::changes_since`] tells what changed
/// after it.
///
/// A version names a *line* of snapshots (each one made with [`GroupSnapshot::new`] or
/// `default` starts its own, as does every change it cannot tell record by record) and a count
/// of the changes along it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotVersion {
    line: u64,
    changes: u64,
}

impl SnapshotVersion {
    /// A line of snapshots no other shares.
    fn new_line() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self {
            line: NEXT.fetch_add(1, Ordering::Relaxed),
            changes: 0,
        }
    }
}

/// How many changed names a snapshot remembers at most (and at least `MIN_CHANGE_LOG`, or the
/// number of its records if that is more): a consumer further behind looks at every record.
const MAX_CHANGE_LOG: usize = 1024;
const MIN_CHANGE_LOG: usize = 64;

impl Default for GroupSnapshot {
    fn default() -> Self {
        Self::new(BTreeMap::new(), false)
    }
}

/// Two snapshots are equal when they show the same records and the same `synced`, whatever
/// their versions.
impl PartialEq for GroupSnapshot {
    fn eq(&self, other: &Self) -> bool {
        self.synced == other.synced && self.records == other.records
    }
}

impl Eq for GroupSnapshot {}

impl fmt::Debug for GroupSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupSnapshot")
            .field("records", &self.records)
            .field("synced", &self.synced)
            .field("version", &self.version)
            .finish()
    }
}

/// The expiry a record counts with in [`GroupSnapshot::next_expiry`].
fn expiry(record: &GroupRecord) -> Option<Instant> {
    record.holder.as_ref().and(record.expires_at)
}

fn count_expiries<'a>(records: impl Iterator<Item = &'a GroupRecord>) -> BTreeMap<Instant, u32> {
    let mut expiries = BTreeMap::new();
    for at in records.filter_map(expiry) {
        *expiries.entry(at).or_insert(0) += 1;
    }
    expiries
}

impl GroupSnapshot {
    /// A snapshot of `records`; `synced` tells whether the watch has listed the whole group yet.
    /// It starts a line of its own ([`SnapshotVersion`]).
    pub fn new(records: BTreeMap<String, GroupRecord>, synced: bool) -> Self {
        Self {
            expiries: Some(count_expiries(records.values())),
            records,
            synced,
            version: SnapshotVersion::new_line(),
            changed: VecDeque::new(),
        }
    }

    /// For backend implementers: records `record` as lease `name`'s (replacing its previous one,
    /// which is answered), remembered as a change of `name` ([`changes_since`](Self::changes_since)).
    /// Sending a change of one record costs O(log n), not a copy of the group, with
    /// `sender.send_modify(|s| { Arc::make_mut(s).insert(..); })`: the snapshot is copied only
    /// while a reader still holds the previous one.
    pub fn insert(&mut self, name: String, record: GroupRecord) -> Option<GroupRecord> {
        self.track_expiries();
        self.count(expiry(&record), 1);
        let old = self.records.insert(name.clone(), record);
        self.count(old.as_ref().and_then(expiry), -1);
        self.log(name);
        old
    }

    /// For backend implementers: removes lease `name`'s record (answered), remembered as a change
    /// of `name`; see [`insert`](Self::insert).
    pub fn remove(&mut self, name: &str) -> Option<GroupRecord> {
        self.track_expiries();
        let old = self.records.remove(name)?;
        self.count(expiry(&old), -1);
        self.log(name.to_owned());
        Some(old)
    }

    /// For backend implementers: the records, to change in place as one wishes. Prefer
    /// [`insert`](Self::insert) and [`remove`](Self::remove): a snapshot cannot tell what was
    /// changed here, so the next look of every consumer ([`changes_since`](Self::changes_since))
    /// is at every record, and so is the next [`next_expiry`](Self::next_expiry).
    pub fn records_mut(&mut self) -> &mut BTreeMap<String, GroupRecord> {
        self.new_line();
        self.expiries = None;
        &mut self.records
    }

    /// For backend implementers: marks whether the watch has listed the whole group (a change
    /// of it starts a new line of versions: a consumer looks at every record again).
    pub fn set_synced(&mut self, synced: bool) {
        if self.synced != synced {
            self.synced = synced;
            self.new_line();
        }
    }

    fn new_line(&mut self) {
        self.version = SnapshotVersion::new_line();
        self.changed.clear();
    }

    /// Counts the expiries again if a change through `records_mut` left them uncounted.
    fn track_expiries(&mut self) {
        if self.expiries.is_none() {
            self.expiries = Some(count_expiries(self.records.values()));
        }
    }

    fn count(&mut self, at: Option<Instant>, delta: i32) {
        let (Some(at), Some(expiries)) = (at, self.expiries.as_mut()) else {
            return;
        };
        if delta > 0 {
            *expiries.entry(at).or_insert(0) += 1;
        } else if let Some(n) = expiries.get_mut(&at) {
            *n -= 1;
            if *n == 0 {
                expiries.remove(&at);
            }
        }
    }

    fn log(&mut self, name: String) {
        self.version.changes += 1;
        let cap = self.records.len().clamp(MIN_CHANGE_LOG, MAX_CHANGE_LOG);
        while self.changed.len() >= cap {
            self.changed.pop_front();
        }
        self.changed.push_back(name);
    }

    /// This snapshot's version: pass it to [`changes_since`](Self::changes_since) of a later
    /// snapshot of the same watch.
    pub fn version(&self) -> SnapshotVersion {
        self.version
    }

    /// The names of the records changed (inserted, replaced or removed) after the snapshot of
    /// version `since`, oldest first, a name once per change (a record whose change undid an
    /// earlier one is named too); `None` when this snapshot cannot tell: `since` is of another
    /// line (another watch, a new listing, a change of `synced`, a change made through
    /// [`records_mut`](Self::records_mut)) or further back than the changes it remembers. Then
    /// any record may have changed.
    ///
    /// Time changes nothing here: a record that expired without a change is not named (see
    /// [`next_expiry`](Self::next_expiry)).
    pub fn changes_since(&self, since: SnapshotVersion) -> Option<impl Iterator<Item = &str>> {
        if since.line != self.version.line || since.changes > self.version.changes {
            return None;
        }
        let behind = usize::try_from(self.version.changes - since.changes).ok()?;
        let skip = self.changed.len().checked_sub(behind)?;
        Some(self.changed.iter().skip(skip).map(String::as_str))
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
    ///
    /// A bound record whose member tenure ended handing it on (the member record lists it for
    /// that incarnation: [`Lease::retire_handing`](crate::Lease::retire_handing)) is held by the
    /// target the list names while the target's member record, in this snapshot, shows that
    /// target's member tenure held and not expired.
    pub fn live_holder(&self, name: &str, now: Instant) -> Option<&str> {
        let record = self.records.get(name)?;
        let holder = record.live_holder(now)?;
        match &record.bound_to {
            None => Some(holder),
            Some(binding) => {
                let member = self.records.get(binding.member())?;
                if let Some((target, to)) = member.handed_to(binding.incarnation(), name) {
                    return self.member_lives(to, target, now).then_some(target);
                }
                self.member_lives(binding, holder, now).then_some(holder)
            }
        }
    }

    /// Whether the member record `binding` names shows that incarnation held by `holder`, not
    /// expired at `now`.
    fn member_lives(&self, binding: &Binding, holder: &str, now: Instant) -> bool {
        self.records.get(binding.member()).is_some_and(|member| {
            member.bound_to.is_none()
                && member.live_holder(now) == Some(holder)
                && member.incarnation.as_deref() == Some(binding.incarnation())
        })
    }

    /// The target a bound record's ended member tenure handed it to, as this snapshot shows
    /// it: the target's owner and member tenure, and the fencing token the target's claim
    /// writes (the record's plus one).
    pub fn handed_to(&self, name: &str) -> Option<(&str, &Binding, Option<FencingToken>)> {
        let record = self.records.get(name)?;
        let binding = record.bound_to.as_ref()?;
        let (owner, to) = self
            .records
            .get(binding.member())?
            .handed_to(binding.incarnation(), name)?;
        let token = record.token.map(|t| FencingToken::new(t.value() + 1));
        Some((owner, to, token))
    }

    /// The earliest instant after `now` at which a live record expires: when the snapshot's
    /// meaning changes without a new snapshot. O(log n) (after a change through
    /// [`records_mut`](Self::records_mut), O(n) until the next tracked change).
    pub fn next_expiry(&self, now: Instant) -> Option<Instant> {
        match &self.expiries {
            Some(expiries) => expiries
                .range((std::ops::Bound::Excluded(now), std::ops::Bound::Unbounded))
                .next()
                .map(|(at, _)| *at),
            None => self
                .records
                .values()
                .filter_map(expiry)
                .filter(|at| *at > now)
                .min(),
        }
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

    /// A shard bound to member `m`'s incarnation `m1`, which ended handing it on to `t`'s
    /// incarnation `t1`: `t` holds it while `t`'s record shows `t1` live; nobody once it does
    /// not; and an entry of another incarnation or shard changes nothing.
    #[tokio::test(start_paused = true)]
    async fn a_shard_handed_on_is_held_by_its_target_while_the_target_s_member_lives() {
        let now = Instant::now();
        let ttl = Duration::from_secs(3);
        let to_t = Binding::new("g.member.t", "t1");
        let mut handed = HandedShards::default();
        handed.add_one("m1", "g.shard.0", "t", &to_t);
        handed.add_one("m0", "g.shard.1", "t", &to_t);
        let member = |holder: &str, incarnation: &str, until| {
            GroupRecord::new(Some(holder.into()), None, Some(until))
                .with_incarnation(Some(incarnation.into()))
        };
        let shard = |token| {
            GroupRecord::new(Some("m".into()), Some(FencingToken::new(token)), None)
                .with_binding(Some(Binding::new("g.member.m", "m1")))
        };
        let snapshot = |t: GroupRecord| {
            GroupSnapshot::new(
                BTreeMap::from([
                    (
                        "g.member.m".to_owned(),
                        GroupRecord::new(None, None, None)
                            .with_handed(Some(Arc::new(handed.clone()))),
                    ),
                    ("g.member.t".to_owned(), t),
                    ("g.shard.0".to_owned(), shard(4)),
                    ("g.shard.1".to_owned(), shard(7)),
                ]),
                true,
            )
        };
        let live = snapshot(member("t", "t1", now + ttl));
        assert_eq!(live.live_holder("g.shard.0", now), Some("t"));
        assert_eq!(live.live_holder("g.shard.0", now + ttl), None, "t expired");
        let (owner, to, token) = live.handed_to("g.shard.0").unwrap();
        assert_eq!((owner, to), ("t", &to_t));
        assert_eq!(
            token,
            Some(FencingToken::new(5)),
            "the record's token plus one"
        );
        // Listed for another incarnation of m: m released, so the shard is free.
        assert_eq!(live.live_holder("g.shard.1", now), None);
        assert!(live.handed_to("g.shard.1").is_none());
        // t's member record shows another incarnation: its tenure t1 is over.
        let restarted = snapshot(member("t", "t2", now + ttl));
        assert_eq!(restarted.live_holder("g.shard.0", now), None);
    }

    fn changes(snapshot: &GroupSnapshot, since: SnapshotVersion) -> Option<Vec<&str>> {
        snapshot.changes_since(since).map(Iterator::collect)
    }

    #[tokio::test(start_paused = true)]
    async fn a_snapshot_names_the_records_changed_since_an_earlier_version_and_counts_expiries() {
        let now = Instant::now();
        let held =
            |at: u64| GroupRecord::new(Some("a".into()), None, Some(now + Duration::from_secs(at)));
        let mut snapshot = GroupSnapshot::new(BTreeMap::from([("g-0".to_owned(), held(5))]), true);
        let start = snapshot.version();
        assert_eq!(changes(&snapshot, start), Some(vec![]));
        assert_eq!(snapshot.insert("g-1".into(), held(3)), None);
        assert_eq!(snapshot.insert("g-0".into(), held(9)), Some(held(5)));
        let middle = snapshot.version();
        assert_eq!(snapshot.remove("g-1"), Some(held(3)));
        assert_eq!(snapshot.remove("g-1"), None, "nothing removed: no change");
        assert_eq!(changes(&snapshot, start), Some(vec!["g-1", "g-0", "g-1"]));
        assert_eq!(changes(&snapshot, middle), Some(vec!["g-1"]));
        // The expiries follow every change: g-0's first one and g-1's are gone.
        assert_eq!(
            snapshot.next_expiry(now),
            Some(now + Duration::from_secs(9))
        );
        snapshot.insert(
            "g-2".into(),
            GroupRecord::new(None, None, Some(now + Duration::from_secs(1))),
        );
        assert_eq!(
            snapshot.next_expiry(now),
            Some(now + Duration::from_secs(9)),
            "released"
        );
        // Another snapshot's version, a change of `synced` or of the records in place: any
        // record may have changed.
        let other = GroupSnapshot::new(BTreeMap::new(), true);
        assert_eq!(changes(&snapshot, other.version()), None);
        let before = snapshot.version();
        snapshot.set_synced(true);
        assert_eq!(
            changes(&snapshot, before),
            Some(vec![]),
            "no change of `synced`"
        );
        snapshot.set_synced(false);
        assert_eq!(changes(&snapshot, before), None);
        let before = snapshot.version();
        snapshot.records_mut().insert("g-3".into(), held(2));
        assert_eq!(changes(&snapshot, before), None);
        assert_eq!(
            snapshot.next_expiry(now),
            Some(now + Duration::from_secs(2))
        );
        let after = snapshot.version();
        snapshot.remove("g-3");
        assert_eq!(changes(&snapshot, after), Some(vec!["g-3"]));
        assert_eq!(
            snapshot.next_expiry(now),
            Some(now + Duration::from_secs(9))
        );
        // Further back than the changes it remembers: it cannot tell.
        let old = snapshot.version();
        for i in 0..MIN_CHANGE_LOG {
            snapshot.insert("g-0".into(), held(10 + i as u64));
        }
        assert_eq!(
            changes(&snapshot, old).map(|c| c.len()),
            Some(MIN_CHANGE_LOG)
        );
        snapshot.insert("g-0".into(), held(5));
        assert_eq!(changes(&snapshot, old), None);
        assert_eq!(
            snapshot.next_expiry(now),
            Some(now + Duration::from_secs(5))
        );
        // Equality is the records' and `synced`'s, whatever the versions.
        let copy = GroupSnapshot::new(snapshot.records().clone(), snapshot.is_synced());
        assert_eq!(copy, snapshot);
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
