//! Groups of leases served from the namespace watch (see the crate's [`group`](crate::GroupWatch)
//! documentation): a compact index of every `Lease` object of the namespace, folded from the
//! watch's events, and the group watches of the namespace, each updated by the events of its
//! records.
//!
//! # What is kept
//!
//! For every object of the namespace (not only those a lease of this process subscribed to: a
//! group watch started on a running watch must know the objects listed before it, without a
//! request): its lease name, `resourceVersion`, when this process first received that version,
//! and the [`GroupRecord`] it makes: holder, fencing token (`leaseTransitions`, as a tenure's),
//! and the expiry on this process's clock (first received + `leaseDurationSeconds`, as a contender
//! judges a claim; `None` without a holder). Nothing of the object itself is kept. Without any
//! group watch the index is still kept (a group watch started later needs it), whatever the
//! namespace holds: give the leases a namespace of their own.
//!
//! An object counts as lease `L` only when it is `L`'s object: its name is
//! [`object_name(L)`](super::object_name), where `L` is the annotation
//! [`LEASE_NAME_ANNOTATION`](super::LEASE_NAME_ANNOTATION), or the object name for an object
//! without it (client-go's). An object whose annotation names a lease of another object (a
//! collision, which that lease itself refuses) belongs to no group, so a lease name has one record.
//!
//! # Cost
//!
//! An event touches its object's entry and the groups whose prefix its lease name starts with:
//! each gets its new snapshot (changed in place: a copy of its map of records only while a reader
//! still holds the previous snapshot). A listing (at start and after
//! `410 Gone`) is buffered and replaces the index at its end, when every group is rebuilt once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use tokio::sync::watch;
use tokio::time::Instant;

use super::record::{
    binding_of, duration_of, handed_after, handed_shards_of, holder_of, incarnation_of, newer,
    older, revision_of, stale_after, watching_since_of,
};
use super::{object_name, LEASE_NAME_ANNOTATION};
use crate::group::{group_channel, GroupRecord, GroupSender, GroupSnapshot};
use crate::lease::FencingToken;

/// What the index keeps of one object.
#[derive(Debug, Clone)]
struct Seen {
    /// The lease the object is the object of.
    lease: LeaseOf,
    version: Option<String>,
    /// When this process first received `version`.
    first_seen: Instant,
    record: GroupRecord,
    /// Whether the holder wrote this version itself (a claim, a renewal), not another owner's
    /// handover to it: only such a version can date a handover to the holder (see the
    /// `handover` module).
    by_holder: bool,
}

impl Seen {
    /// What `lease` (object `object`, received at `at`) makes, given what was known of it:
    /// `None` when the object is older than what is known.
    fn of(object: &str, lease: &LeaseObject, at: Instant, known: Option<&Seen>) -> Option<Seen> {
        let version = lease.metadata.resource_version.clone();
        let first_seen = match (known, version.as_deref()) {
            (Some(known), Some(new)) => match known.version.as_deref() {
                Some(old) if older(new, old) => return None,
                Some(old) if old == new => known.first_seen,
                _ => at,
            },
            _ => at,
        };
        let holder = holder_of(lease).map(str::to_owned);
        let token = lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_transitions)
            .map(|t| FencingToken::new(t.max(0) as u64));
        // A bound record has no expiry of its own: its member record's decides (see
        // `GroupSnapshot::live_holder`).
        let binding = binding_of(lease);
        let expires_at = holder
            .as_ref()
            .filter(|_| binding.is_none())
            .map(|_| first_seen + duration_of(lease));
        Some(Seen {
            lease: LeaseOf::of(object, lease),
            version,
            first_seen,
            record: GroupRecord::new(holder, token, expires_at)
                .with_metadata(super::record::metadata_of(lease).map(str::to_owned))
                .with_incarnation(incarnation_of(lease))
                .with_stale_after(stale_after(lease).filter(|_| binding.is_none()))
                .with_watch_facts(revision_of(lease), watching_since_of(lease))
                .with_binding(binding)
                .with_handed(handed_shards_of(lease).map(Arc::new))
                .with_leaving(super::record::leaving_of(lease)),
            by_holder: handed_after(lease).is_none(),
        })
    }
}

/// The lease an object is the object of (see the module docs).
#[derive(Debug, Clone)]
enum LeaseOf {
    /// The lease of the object's own name (most objects: kept once, as the index's key).
    Object,
    /// A lease whose name maps to the object's name.
    Named(Box<str>),
    /// None: the object belongs to no group.
    Nothing,
}

impl LeaseOf {
    /// What object `object`, `lease`, is the object of.
    fn of(object: &str, lease: &LeaseObject) -> Self {
        match lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEASE_NAME_ANNOTATION))
        {
            None => LeaseOf::Object,
            Some(name) if name == object => LeaseOf::Object,
            Some(name) if object_name(name) == object => LeaseOf::Named(name.as_str().into()),
            Some(_) => LeaseOf::Nothing,
        }
    }

    /// The lease name, for object `object`.
    fn name<'a>(&'a self, object: &'a str) -> Option<&'a str> {
        match self {
            LeaseOf::Object => Some(object),
            LeaseOf::Named(name) => Some(name),
            LeaseOf::Nothing => None,
        }
    }
}

/// The records of the group of `prefix` among `objects`.
fn records_of(objects: &HashMap<String, Seen>, prefix: &str) -> BTreeMap<String, GroupRecord> {
    objects
        .iter()
        .filter_map(|(object, seen)| {
            let lease = seen.lease.name(object)?;
            lease
                .starts_with(prefix)
                .then(|| (lease.to_owned(), seen.record.clone()))
        })
        .collect()
}

/// One group watch of the namespace; its records live in the snapshot its sender holds, changed
/// in place (copied only while a reader still holds the previous snapshot).
struct Group {
    id: u64,
    prefix: String,
    sender: GroupSender,
}

impl Group {
    fn contains(&self, lease: Option<&str>) -> bool {
        lease.is_some_and(|l| l.starts_with(self.prefix.as_str()))
    }

    /// Sends the snapshot as it is, marked `synced` or not.
    fn send(&self, synced: bool) {
        self.sender
            .send_modify(|snapshot| Arc::make_mut(snapshot).set_synced(synced));
    }

    /// Replaces every record and sends.
    fn replace(&self, records: BTreeMap<String, GroupRecord>, synced: bool) {
        self.sender
            .send_replace(Arc::new(GroupSnapshot::new(records, synced)));
    }
}

/// The index of a namespace watch, and its group watches.
#[derive(Default)]
pub(super) struct Index {
    objects: HashMap<String, Seen>,
    /// The objects of the listing in progress, if one is.
    listing: Option<HashMap<String, Seen>>,
    /// Listed, not listing again, and not failing: what the groups show is current.
    synced: bool,
    /// A listing has ended (the index has once been complete).
    listed: bool,
    groups: Vec<Group>,
    last_id: u64,
    /// The newest numeric `resourceVersion` received (listed or changed).
    newest: u64,
    /// The newest version when the watch last became current (a listing ended, or it resumed):
    /// every later version reached it as a change. `None` while it is not current.
    watching_since: Option<u64>,
    /// The `uid`s of the objects whose deletion the watch received (the newest
    /// [`DELETED_KEPT`]): an object's `uid` is never used again, so each is gone for good.
    deleted: std::collections::VecDeque<String>,
    /// The same `uid`s, to look one up.
    deleted_set: std::collections::HashSet<String>,
}

/// How many deleted objects' `uid`s an [`Index`] keeps.
const DELETED_KEPT: usize = 4096;

impl Index {
    /// Adds a group watch of `prefix`: its id (for [`unsubscribe`](Self::unsubscribe)) and its
    /// receiver, which has the group as known now.
    pub(super) fn subscribe(&mut self, prefix: &str) -> (u64, watch::Receiver<Arc<GroupSnapshot>>) {
        self.groups.retain(|g| !g.sender.is_closed());
        self.last_id += 1;
        let (sender, receiver) = group_channel();
        let group = Group {
            id: self.last_id,
            prefix: prefix.to_owned(),
            sender,
        };
        group.replace(records_of(&self.objects, prefix), self.synced);
        self.groups.push(group);
        (self.last_id, receiver)
    }

    /// When this process first received version `version` of object `object`, if the index
    /// has that version.
    pub(super) fn first_seen(&self, object: &str, version: &str) -> Option<Instant> {
        self.objects
            .get(object)
            .filter(|seen| seen.version.as_deref() == Some(version))
            .map(|seen| seen.first_seen)
    }

    /// The newest version of an object held by `holder` that `holder` wrote itself (not a
    /// handover to it) (`(object, resourceVersion)`), while the index is current: what a
    /// handover to `holder` names (see the `handover` module). Only objects `holder` still holds
    /// at `now` as this process judges it count: a holder whose every object has expired has
    /// most likely stopped, and a handover to it would leave the lease unrun for a TTL (the
    /// caller releases plainly instead).
    pub(super) fn latest_held_by(&self, holder: &str, now: Instant) -> Option<(String, String)> {
        if !self.synced {
            return None;
        }
        self.objects
            .iter()
            .filter(|(_, seen)| seen.by_holder && seen.record.live_holder(now) == Some(holder))
            .filter_map(|(object, seen)| Some((object, seen.version.as_deref()?)))
            .reduce(|a, b| if newer(b.1, a.1) { b } else { a })
            .map(|(object, version)| (object.clone(), version.to_owned()))
    }

    /// The record of object `object` and its `resourceVersion` (`None`: the namespace has no
    /// such object), while the index is current: listed, not listing again, not failing.
    pub(super) fn record_of(&self, object: &str) -> Option<Option<(GroupRecord, Option<String>)>> {
        self.synced.then(|| {
            self.objects
                .get(object)
                .map(|s| (s.record.clone(), s.version.clone()))
        })
    }

    /// What a claim of lease `name` (object `object`) can be decided from without a read, while
    /// the index is current: `Some(None)` when the namespace has no such object, the object's
    /// record and `resourceVersion` when it is the object of `name` (by its
    /// [`LEASE_NAME_ANNOTATION`]), `None` otherwise (not current, no version, another lease's
    /// object, or an object without the annotation under another name: a read decides).
    pub(super) fn claimable(
        &self,
        object: &str,
        name: &str,
    ) -> Option<Option<(GroupRecord, String)>> {
        if !self.synced {
            return None;
        }
        let Some(seen) = self.objects.get(object) else {
            return Some(None);
        };
        if seen.lease.name(object) != Some(name) {
            return None;
        }
        Some(Some((seen.record.clone(), seen.version.clone()?)))
    }

    /// The `resourceVersion` of object `object` in the index (`None`: it has none of the
    /// object), while the index is current: listed, not listing again, not failing.
    pub(super) fn current_version(&self, object: &str) -> Option<Option<&str>> {
        self.synced
            .then(|| self.objects.get(object).and_then(|s| s.version.as_deref()))
    }

    /// Since which version the watch has received every change as it happened (see
    /// [`WATCHING_SINCE_ANNOTATION`](super::record::WATCHING_SINCE_ANNOTATION)), while it is
    /// current.
    ///
    /// After a failure the watch resumes from where it was, and the changes written meanwhile
    /// arrive late but above this version: a member that died during such an outage may be
    /// judged on time by this process when it is not (a longer gap for its shards, never two
    /// holders).
    pub(super) fn watching_since(&self) -> Option<u64> {
        self.watching_since.filter(|_| self.synced)
    }

    /// Whether the watch received the deletion of the object with `uid` (among the newest
    /// deletions it keeps): that object is gone for good, whatever a lagging view shows.
    pub(super) fn was_deleted(&self, uid: &str) -> bool {
        self.deleted_set.contains(uid)
    }

    /// Notes the version of `lease`, received.
    fn received(&mut self, lease: &LeaseObject) {
        if let Some(version) = revision_of(lease) {
            self.newest = self.newest.max(version);
        }
    }

    /// Removes group watch `id`.
    pub(super) fn unsubscribe(&mut self, id: u64) {
        self.groups.retain(|g| g.id != id);
    }

    /// The watch ended: every group watch ends, its last snapshot not synced (its receivers see
    /// the sender gone).
    pub(super) fn end(&mut self) {
        self.synced = false;
        for group in self.groups.drain(..) {
            group.send(false);
        }
    }

    /// A list or watch request of the watch failed: until a watch request is answered again (or a
    /// listing ends), changes may be missing, so no group is current.
    pub(super) fn suspend(&mut self) {
        if std::mem::replace(&mut self.synced, false) {
            for group in &self.groups {
                group.send(false);
            }
        }
    }

    /// A watch request was answered after a failure, with no listing since: the watch goes on
    /// from where it was, with nothing missed, and the groups are current again.
    pub(super) fn resume(&mut self) {
        if self.listed && self.listing.is_none() && !std::mem::replace(&mut self.synced, true) {
            self.watching_since = Some(self.newest);
            for group in &self.groups {
                group.send(true);
            }
        }
    }

    /// Object `object` is `lease`, received at `at` (a change after the listing).
    pub(super) fn apply(&mut self, object: &str, lease: &LeaseObject, at: Instant) {
        self.received(lease);
        let known = self.objects.get(object);
        let Some(seen) = Seen::of(object, lease, at, known) else {
            return;
        };
        let old = self.objects.insert(object.to_owned(), seen);
        self.changed(object, old);
    }

    /// Object `object` was deleted (`version`: of the deletion, if known).
    pub(super) fn delete(&mut self, object: &str, version: Option<&str>, uid: Option<&str>) {
        if let Some(uid) = uid.filter(|uid| !self.deleted_set.contains(*uid)) {
            if self.deleted.len() == DELETED_KEPT {
                if let Some(oldest) = self.deleted.pop_front() {
                    self.deleted_set.remove(&oldest);
                }
            }
            self.deleted.push_back(uid.to_owned());
            self.deleted_set.insert(uid.to_owned());
        }
        let newer_known = self.objects.get(object).is_some_and(|known| {
            version
                .zip(known.version.as_deref())
                .is_some_and(|(gone, known)| older(gone, known))
        });
        if newer_known {
            return;
        }
        if let Some(old) = self.objects.remove(object) {
            self.changed(object, Some(old));
        }
    }

    /// A listing starts: the groups are not synced until it ends.
    pub(super) fn begin_listing(&mut self) {
        self.listing = Some(HashMap::new());
        if std::mem::replace(&mut self.synced, false) {
            for group in &self.groups {
                group.send(false);
            }
        }
    }

    /// The listing in progress has `lease`, received at `at`.
    pub(super) fn listed(&mut self, object: &str, lease: &LeaseObject, at: Instant) {
        self.received(lease);
        let known = self.objects.get(object);
        let listing = self.listing.get_or_insert_with(HashMap::new);
        // An object older than what is known keeps what is known.
        let seen = Seen::of(object, lease, at, known).or_else(|| known.cloned());
        if let Some(seen) = seen {
            listing.insert(object.to_owned(), seen);
        }
    }

    /// The listing ended: it is what the namespace has (an object it lacks is gone), and every
    /// group is rebuilt from it.
    pub(super) fn end_listing(&mut self) {
        self.objects = self.listing.take().unwrap_or_default();
        self.synced = true;
        self.watching_since = Some(self.newest);
        self.listed = true;
        self.groups.retain(|g| !g.sender.is_closed());
        for group in &self.groups {
            group.replace(records_of(&self.objects, &group.prefix), true);
        }
    }

    /// Updates the groups of `object`, which was `old` (if known) and is what the index has now.
    fn changed(&mut self, object: &str, old: Option<Seen>) {
        let new = self.objects.get(object);
        let old_lease = old.as_ref().and_then(|o| o.lease.name(object));
        let new_lease = new.and_then(|n| n.lease.name(object));
        let mut closed = false;
        for group in &mut self.groups {
            let (was, is) = (group.contains(old_lease), group.contains(new_lease));
            if !was && !is {
                continue;
            }
            let synced = self.synced;
            group.sender.send_if_modified(|snapshot| {
                let mut modified = false;
                if was && old_lease != new_lease.filter(|_| is) {
                    if let Some(lease) = old_lease.filter(|l| snapshot.get(l).is_some()) {
                        Arc::make_mut(snapshot).remove(lease);
                        modified = true;
                    }
                }
                if let (true, Some(new), Some(lease)) = (is, new, new_lease) {
                    if snapshot.get(lease) != Some(&new.record) {
                        Arc::make_mut(snapshot).insert(lease.to_owned(), new.record.clone());
                        modified = true;
                    }
                }
                if modified && snapshot.is_synced() != synced {
                    Arc::make_mut(snapshot).set_synced(synced);
                }
                modified
            });
            closed |= group.sender.is_closed();
        }
        if closed {
            self.groups.retain(|g| !g.sender.is_closed());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn object(
        name: Option<&str>,
        version: &str,
        holder: Option<&str>,
        transitions: i32,
    ) -> LeaseObject {
        LeaseObject {
            metadata: ObjectMeta {
                resource_version: Some(version.into()),
                annotations: name
                    .map(|n| BTreeMap::from([(LEASE_NAME_ANNOTATION.to_owned(), n.to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_transitions: Some(transitions),
                lease_duration_seconds: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    fn listed(index: &mut Index, objects: &[(&str, LeaseObject)]) {
        index.begin_listing();
        for (name, lease) in objects {
            index.listed(name, lease, Instant::now());
        }
        index.end_listing();
    }

    fn holders(receiver: &watch::Receiver<Arc<GroupSnapshot>>) -> Vec<(String, Option<String>)> {
        receiver
            .borrow()
            .records()
            .iter()
            .map(|(name, r)| (name.clone(), r.holder.clone()))
            .collect()
    }

    /// What a writer says of its watch (`watching-since`): the newest version of its last
    /// listing, nothing while it fails, and the newest version received once it resumes; and
    /// what the records show of their writers.
    #[tokio::test(start_paused = true)]
    async fn the_watch_says_since_when_it_received_every_change_as_it_happened() {
        let mut index = Index::default();
        let (_, mut group) = index.subscribe("g-");
        assert_eq!(index.watching_since(), None, "not listed yet");
        let mut member = object(None, "9", Some("a"), 1);
        super::super::record::set_watching_since(&mut member, Some(Some(4)));
        member.spec.as_mut().unwrap().renew_time = Some(super::super::record::now_micro());
        listed(
            &mut index,
            &[("g-0", object(None, "5", Some("b"), 2)), ("g-m", member)],
        );
        assert_eq!(index.watching_since(), Some(9));
        let record = group.borrow_and_update().get("g-m").unwrap().clone();
        assert_eq!((record.revision, record.watching_since), (Some(9), Some(4)));
        let stale = record
            .stale_after
            .expect("the writer's renewal time and duration");
        let from_now = stale.duration_since(std::time::SystemTime::now()).unwrap();
        assert!(from_now <= Duration::from_secs(3) && from_now > Duration::from_secs(2));
        index.apply("g-0", &object(None, "12", Some("b"), 2), Instant::now());
        assert_eq!(
            index.watching_since(),
            Some(9),
            "changes came as they happened"
        );
        index.suspend();
        assert_eq!(
            index.watching_since(),
            None,
            "a failing watch watches nothing on time"
        );
        index.resume();
        assert_eq!(index.watching_since(), Some(12));
        // A writer whose watch was not synced says `none`: on time for nothing.
        let mut unsynced = object(None, "13", Some("c"), 1);
        super::super::record::set_watching_since(&mut unsynced, Some(None));
        index.apply("g-c", &unsynced, Instant::now());
        let record = group.borrow_and_update().get("g-c").unwrap().clone();
        assert_eq!(record.watching_since, Some(u64::MAX));
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_counts_from_when_a_version_was_first_received() {
        let mut index = Index::default();
        let (_, mut group) = index.subscribe("g-");
        assert!(!group.borrow_and_update().is_synced());
        let start = Instant::now();
        listed(&mut index, &[("g-0", object(None, "5", Some("a"), 2))]);
        let snapshot = group.borrow_and_update().clone();
        assert!(snapshot.is_synced());
        let record = snapshot.get("g-0").unwrap();
        assert_eq!(record.token, Some(FencingToken::new(2)));
        assert_eq!(record.expires_at, Some(start + Duration::from_secs(3)));

        // The same version again (a relist, or a late duplicate) keeps its clock.
        tokio::time::advance(Duration::from_secs(2)).await;
        index.apply("g-0", &object(None, "5", Some("a"), 2), Instant::now());
        assert!(!group.has_changed().unwrap(), "nothing new to send");
        listed(&mut index, &[("g-0", object(None, "5", Some("a"), 2))]);
        let record = group.borrow_and_update().get("g-0").unwrap().clone();
        assert_eq!(record.expires_at, Some(start + Duration::from_secs(3)));
        assert_eq!(
            record.live_holder(start + Duration::from_secs(3)),
            None,
            "expired by the observer's clock"
        );

        // A renewal (a new version) starts it again, from when it arrived.
        let renewed = Instant::now();
        index.apply("g-0", &object(None, "6", Some("a"), 2), renewed);
        let record = group.borrow_and_update().get("g-0").unwrap().clone();
        assert_eq!(record.expires_at, Some(renewed + Duration::from_secs(3)));

        // Released: no holder, no expiry, the tenure's token stays.
        index.apply("g-0", &object(None, "7", None, 2), Instant::now());
        let record = group.borrow_and_update().get("g-0").unwrap().clone();
        assert_eq!(
            record,
            GroupRecord::new(None, Some(FencingToken::new(2)), None)
                .with_watch_facts(Some(7), None)
                .with_stale_after(record.stale_after)
        );
    }

    #[tokio::test]
    async fn older_versions_are_ignored_and_deletions_remove_records() {
        let mut index = Index::default();
        listed(&mut index, &[]);
        let (_, mut group) = index.subscribe("g-");
        group.borrow_and_update();
        index.apply("g-0", &object(None, "10", Some("b"), 4), Instant::now());
        index.apply("g-0", &object(None, "9", Some("a"), 3), Instant::now());
        assert_eq!(holders(&group), [("g-0".into(), Some("b".into()))]);
        // A deletion older than what is known (the object was created again since) is ignored.
        // Its object (its first `uid`) is gone for good all the same.
        index.delete("g-0", Some("8"), Some("uid-first"));
        assert_eq!(group.borrow().records().len(), 1);
        assert!(index.was_deleted("uid-first"));
        index.delete("g-0", Some("11"), Some("uid-second"));
        assert!(group.borrow_and_update().records().is_empty());
        assert!(index.was_deleted("uid-second") && !index.was_deleted("uid-third"));
        // Created again.
        index.apply("g-0", &object(None, "12", Some("c"), 1), Instant::now());
        assert_eq!(holders(&group), [("g-0".into(), Some("c".into()))]);
        // A relist that lacks an object removes it.
        listed(&mut index, &[]);
        assert!(group.borrow_and_update().records().is_empty());
        assert!(group.borrow().is_synced());
    }

    /// A target whose every object expired as this process judges it (most likely stopped) is
    /// named by no version: the handover is then a plain release, not a write in the name of a
    /// node that left (issue 36, item 4).
    #[tokio::test]
    async fn a_handover_names_no_version_of_a_target_whose_objects_all_expired() {
        let mut index = Index::default();
        listed(
            &mut index,
            &[
                ("g-0", object(None, "5", Some("b"), 1)),
                ("g-1", object(None, "7", Some("b"), 1)),
            ],
        );
        let now = Instant::now();
        assert_eq!(
            index.latest_held_by("b", now),
            Some(("g-1".into(), "7".into()))
        );
        // 3 s (the objects' duration) after this process first received them: expired.
        let later = now + std::time::Duration::from_secs(4);
        assert_eq!(index.latest_held_by("b", later), None);
        // b renews one of them: that one names b again.
        index.apply("g-0", &object(None, "9", Some("b"), 1), later);
        assert_eq!(
            index.latest_held_by("b", later),
            Some(("g-0".into(), "9".into()))
        );
    }

    #[tokio::test]
    async fn a_handover_names_the_newest_version_the_target_wrote_itself() {
        let mut index = Index::default();
        assert_eq!(
            index.latest_held_by("b", Instant::now()),
            None,
            "not listed yet"
        );
        listed(
            &mut index,
            &[
                ("g-0", object(None, "5", Some("b"), 1)),
                ("g-1", object(None, "7", Some("b"), 1)),
                ("g-2", object(None, "9", Some("a"), 1)),
            ],
        );
        assert_eq!(
            index.latest_held_by("b", Instant::now()),
            Some(("g-1".into(), "7".into()))
        );
        // A record another owner handed over to b is not b's write: it cannot date a handover.
        let handed = crate::kubernetes::record::handed(
            object(None, "11", Some("a"), 1),
            "a",
            "b",
            ("g-1", "7"),
            std::time::Duration::from_secs(15),
        )
        .unwrap();
        index.apply("g-2", &handed, Instant::now());
        assert_eq!(
            index.latest_held_by("b", Instant::now()),
            Some(("g-1".into(), "7".into()))
        );
        // b's renewal of it is.
        index.apply("g-2", &object(None, "12", Some("b"), 2), Instant::now());
        assert_eq!(
            index.latest_held_by("b", Instant::now()),
            Some(("g-2".into(), "12".into()))
        );
        assert_eq!(index.latest_held_by("c", Instant::now()), None);
    }

    #[tokio::test]
    async fn groups_are_by_lease_name_and_see_only_their_records() {
        let mut index = Index::default();
        let mapped = object_name("G-Jobs/0");
        listed(
            &mut index,
            &[
                // client-go's object: no annotation, its name is the lease name.
                ("g-0", object(None, "1", Some("a"), 1)),
                // A mapped name, in the group by its original lease name.
                (&mapped, object(Some("G-Jobs/0"), "2", Some("b"), 1)),
                // Same start, other group.
                ("gx-0", object(None, "3", Some("c"), 1)),
                // A collision: the annotation names a lease whose object is another one.
                ("g-forged", object(Some("g-0"), "4", Some("d"), 1)),
            ],
        );
        let (_, lower) = index.subscribe("g-");
        let (_, upper) = index.subscribe("G-Jobs/");
        assert_eq!(holders(&lower), [("g-0".into(), Some("a".into()))]);
        assert_eq!(holders(&upper), [("G-Jobs/0".into(), Some("b".into()))]);
        // An event of an object outside a group leaves its snapshot alone.
        let mut lower = lower;
        lower.borrow_and_update();
        index.apply("gx-0", &object(None, "5", None, 1), Instant::now());
        assert!(!lower.has_changed().unwrap());
        index.delete(&mapped, None, None);
        assert!(upper.borrow().records().is_empty());
    }

    #[tokio::test]
    async fn relisting_unsyncs_and_dropped_or_ended_groups_are_forgotten() {
        let mut index = Index::default();
        listed(&mut index, &[("g-0", object(None, "1", Some("a"), 1))]);
        let (id, mut group) = index.subscribe("g-");
        assert!(group.borrow_and_update().is_synced());
        index.begin_listing();
        assert!(!group.borrow_and_update().is_synced());
        assert_eq!(group.borrow().records().len(), 1, "kept while relisting");
        index.listed("g-1", &object(None, "2", Some("b"), 1), Instant::now());
        index.end_listing();
        let snapshot = group.borrow_and_update().clone();
        assert!(snapshot.is_synced());
        assert_eq!(
            snapshot.records().keys().collect::<Vec<_>>(),
            ["g-1"],
            "the listing replaces what was known"
        );
        index.unsubscribe(id);
        assert!(index.groups.is_empty());
        let (_, other) = index.subscribe("g-");
        drop(other);
        index.apply("g-2", &object(None, "3", Some("c"), 1), Instant::now());
        assert!(index.groups.is_empty(), "a group nobody reads is forgotten");
        let (_, mut ended) = index.subscribe("g-");
        ended.borrow_and_update();
        index.end();
        assert!(!ended.borrow_and_update().is_synced(), "its last word");
        assert!(ended.changed().await.is_err(), "the watch ended");
    }

    /// A failing watch unsyncs its groups until it works again; resuming neither syncs a group
    /// before the first listing has ended nor in the middle of a relisting.
    #[tokio::test]
    async fn a_failing_watch_unsyncs_its_groups_until_it_works_again() {
        let mut index = Index::default();
        let (_, mut group) = index.subscribe("g-");
        index.resume();
        assert!(!group.borrow_and_update().is_synced(), "never listed");
        listed(&mut index, &[("g-0", object(None, "1", Some("a"), 1))]);
        assert!(group.borrow_and_update().is_synced());
        index.suspend();
        assert!(group.has_changed().unwrap(), "the change is sent");
        assert!(
            !group.borrow_and_update().is_synced(),
            "not current while failing"
        );
        assert_eq!(group.borrow().records().len(), 1, "what was known is kept");
        index.resume();
        assert!(group.borrow_and_update().is_synced(), "current again");
        index.suspend();
        index.begin_listing();
        index.resume();
        assert!(!group.borrow_and_update().is_synced(), "relisting");
        index.end_listing();
        assert!(group.borrow_and_update().is_synced());
    }
}
