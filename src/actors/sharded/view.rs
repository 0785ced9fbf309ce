//! The group as one [`ShardedWorkers`] node sees it (members, holders, targets), kept up to date
//! change by change, and which shards a reconcile must look at.
//!
//! A group watch delivers every write of every record: on Kubernetes with bound shards, every
//! member renewal (one per node per renewal interval). Such a change moves no member, no holder
//! and no target, and a reconcile that walked every shard of the group for it cost 5.6 ms at
//! 10,000 shards (BENCHMARKS.md, `benches/simulation.rs`), 100 times per interval with 100
//! nodes. Here a reconcile folds in only the records the snapshot names as changed since the one
//! folded last ([`GroupSnapshot::changes_since`]), and looks only at the shards that can call for
//! an action:
//!
//! * the shards this node has something of (a lease or a manager, or a tenure it held at the last
//!   count): their tenures change without a record changing;
//! * the shards whose record changed (a record handed to this node);
//! * the shards targeted here, whenever the targets were placed again;
//! * the shards whose lease could not be built (tried again).
//!
//! Any other shard has no lease here and so is not eligible, is not targeted here, and its record
//! named no tenure handed here when it was last looked at (else it would have been taken up):
//! the full walk would do nothing with it.
//!
//! Everything else is looked at in full, as before: the first look, a snapshot of another line
//! (a new listing, a change of `synced`, a change the backend made without saying which record),
//! a reconcile further behind than the snapshot's memory of changes, a change of this node's own
//! membership, a member record whose meaning changed (its live holder, incarnation or binding:
//! a member came, went, or restarted, and the shards bound to it with it; its mark of leaving), a shard record bound to
//! something other than a member record, and **time**: a record's expiry between the last look and
//! this one (a member that stopped renewing drops out with no event), found in O(log n) with
//! [`GroupSnapshot::next_expiry`], and a member record's writer's end of claim or its turning
//! quiet (see the `on_time` module), found by a walk of the member records (not of the shards).
//! Who may take which orphan is computed again on every full look and whenever the targets are
//! placed again; the targets are placed again when it changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use tokio::time::Instant;

use super::on_time::OnTime;
use super::ShardedWorkers;
use crate::group::{GroupRecord, GroupSnapshot, SnapshotVersion};
use crate::lease::Lease;

/// What a member record means for the others: its live holder, as a member
/// ([`GroupRecord::live_member`]) and for the shards bound to it, its incarnation, whether it is
/// bound, and what the placement of orphans reads of it (see the `on_time` module): since when
/// its watch ran, and whether it is quiet.
#[derive(Debug, PartialEq, Eq)]
struct MemberSeen {
    holder: Option<String>,
    member: Option<String>,
    incarnation: Option<String>,
    bound: bool,
    watching_since: Option<u64>,
    quiet: bool,
    /// What its ended tenures handed on (the holders of the shards bound to them).
    handed: Option<std::sync::Arc<crate::binding::HandedShards>>,
    /// Whether it is marked leaving (no target of placement).
    leaving: bool,
}

/// The instants of a look: this process's monotonic and wall clocks, and the group's TTL and
/// renewal interval (when a member is quiet).
#[derive(Clone, Copy)]
pub(super) struct At {
    pub(super) now: Instant,
    pub(super) wall: SystemTime,
    pub(super) ttl: Duration,
    pub(super) renewal: Duration,
}

impl MemberSeen {
    fn of(record: &GroupRecord, at: At) -> Self {
        Self {
            holder: record.live_holder(at.now).map(str::to_owned),
            member: record.live_member(at.now, at.wall).map(str::to_owned),
            incarnation: record.incarnation.clone(),
            bound: record.bound_to.is_some(),
            watching_since: record.watching_since,
            quiet: OnTime::is_quiet(record, (at.now, at.ttl, at.renewal)),
            handed: record.handed.clone(),
            leaving: record.leaving,
        }
    }

    /// Whether `record` at `at` means what this does: [`of`](Self::of) compared, with no copy
    /// (a look compares every member record that changed: a renewal each).
    fn means(&self, record: &GroupRecord, at: At) -> bool {
        let same = self.bound == record.bound_to.is_some()
            && self.leaving == record.leaving
            && self.watching_since == record.watching_since
            && self.incarnation == record.incarnation
            && self.holder.as_deref() == record.live_holder(at.now)
            && self.member.as_deref() == record.live_member(at.now, at.wall)
            && self.quiet == OnTime::is_quiet(record, (at.now, at.ttl, at.renewal))
            && self.handed == record.handed;
        debug_assert_eq!(same, *self == Self::of(record, at));
        same
    }
}

/// Whether `record` (a member's) changes its meaning with no event between `from` and `to`: its
/// expiry, its writer's end of claim, or the moment it turns quiet. The wall clock may go back
/// (an NTP step, a skewed clock set right): a writer's end of claim then lies *ahead* again, and a
/// member that had gone stale is one again; so the writer's end of claim turns the record when it
/// lies on either side of the two wall times (the chaos run with clock faults caught a view that
/// kept such a member out after its clock was set back).
fn turns_between(record: &GroupRecord, from: At, to: At) -> bool {
    let expiry = record
        .expires_at
        .is_some_and(|e| from.now < e && e <= to.now);
    let stale = record
        .stale_after
        .is_some_and(|s| (s <= from.wall) != (s <= to.wall));
    let quiet = OnTime::is_quiet(record, (from.now, from.ttl, from.renewal))
        != OnTime::is_quiet(record, (to.now, to.ttl, to.renewal));
    expiry || stale || quiet
}

/// One node's view of its group, folded from its group watch.
pub(super) struct View {
    /// The snapshot folded in last, and when (its expiries were judged at that instant); `None`
    /// before the first look.
    seen: Option<(SnapshotVersion, At)>,
    /// Who may take which orphan, as the targets were placed for.
    on_time: OnTime,
    /// Whether this node's member lease was alive at the last look.
    me_alive: bool,
    /// The member records (by lease name) at the last look.
    member_records: BTreeMap<String, MemberSeen>,
    /// A shard record bound to something other than a member record: then every look is full.
    bound_elsewhere: bool,
    /// The live members, sorted.
    pub(super) members: Vec<String>,
    /// This node's index in `members`.
    pub(super) me: Option<usize>,
    /// Per shard, its holder: this node when it holds it, else the live holder in the view.
    pub(super) holders: Vec<Option<String>>,
    /// Per shard, its target (an index into `members`).
    pub(super) targets: Vec<Option<usize>>,
    /// The members the targets were placed for (`None`: never placed).
    placed_members: Option<Vec<String>>,
    /// The holders the targets were placed for, where `holders` differs since.
    unplaced: HashMap<usize, Option<String>>,
    /// The shards' indices in the order of their lease names.
    by_name: Vec<u32>,
    /// The next reconcile looks at every shard.
    visit_all: bool,
    /// Shards the next reconcile looks at besides `watched` and `unstarted`.
    to_visit: BTreeSet<usize>,
    /// Shards this node has something of: a lease or a manager, or a tenure it held at the last
    /// count (added when a manager starts, dropped once the shard has none of these).
    pub(super) watched: BTreeSet<usize>,
    /// Shards whose lease could not be built at the last try.
    pub(super) unstarted: BTreeSet<usize>,
    /// Until when the tenures this node's shards had at the last read of them all stay as read
    /// (the earliest deadline among them; `None`: read them all at the next look), and the
    /// shards whose tenure started or ended since (see [`look_at_tenures`]).
    ///
    /// [`look_at_tenures`]: ShardedWorkers::look_at_tenures
    tenures_until: Option<Instant>,
    tenures_changed: BTreeSet<usize>,
    /// The watched shards whose tenure was not alive when last read: read again at every look
    /// (a claim in flight may have started one whose stream has not reported it yet).
    tenures_unheld: Vec<usize>,
    /// Looks at the group: folded from every record, and change by change (for tests).
    #[cfg(test)]
    looks: (u64, u64),
    /// Reads of a shard's tenure by the looks (for tests).
    #[cfg(test)]
    tenure_reads: u64,
}

impl View {
    /// The view of a group whose shards have these lease names (nothing seen yet).
    pub(super) fn new<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> Self {
        let names: Vec<&str> = names.collect();
        let mut by_name: Vec<u32> = (0..names.len() as u32).collect();
        by_name.sort_unstable_by_key(|&i| names[i as usize]);
        Self {
            seen: None,
            on_time: OnTime::default(),
            me_alive: false,
            member_records: BTreeMap::new(),
            bound_elsewhere: false,
            members: Vec::new(),
            me: None,
            holders: Vec::new(),
            targets: Vec::new(),
            placed_members: None,
            unplaced: HashMap::new(),
            by_name,
            visit_all: true,
            to_visit: BTreeSet::new(),
            watched: BTreeSet::new(),
            unstarted: BTreeSet::new(),
            tenures_until: None,
            tenures_changed: BTreeSet::new(),
            tenures_unheld: Vec::new(),
            #[cfg(test)]
            looks: (0, 0),
            #[cfg(test)]
            tenure_reads: 0,
        }
    }

    /// Sets the holder of shard `index`, remembering what the targets were placed for.
    fn set_holder(&mut self, index: usize, holder: Option<String>) {
        if self.holders[index] != holder {
            let old = std::mem::replace(&mut self.holders[index], holder);
            self.unplaced.entry(index).or_insert(old);
        }
    }

    /// A tenure of shard `index`'s lease started or ended: the next look reads it.
    pub(super) fn tenure_changed(&mut self, index: usize) {
        self.tenures_changed.insert(index);
    }

    /// The version of the snapshot folded in last (`None` before the first look).
    pub(super) fn seen_version(&self) -> Option<SnapshotVersion> {
        self.seen.map(|(version, _)| version)
    }

    /// The shards the next reconcile looks at, in index order (and forgets them).
    pub(super) fn take_visits(&mut self, shards: usize) -> Vec<usize> {
        let unstarted = std::mem::take(&mut self.unstarted);
        let to_visit = std::mem::take(&mut self.to_visit);
        if std::mem::take(&mut self.visit_all) {
            return (0..shards).collect();
        }
        let mut visit: Vec<usize> = (to_visit.into_iter())
            .chain(self.watched.iter().copied())
            .chain(unstarted)
            .collect();
        visit.sort_unstable();
        visit.dedup();
        visit
    }
}

impl<A: Actor<Context = Context<A>>, L: Lease> ShardedWorkers<A, L> {
    /// The instants of a look at `now` (see [`At`]).
    fn at(&self, now: Instant) -> At {
        At {
            now,
            wall: SystemTime::now(),
            ttl: self.ttl,
            renewal: self.renewal,
        }
    }

    /// The index of the shard whose lease is `name`.
    pub(super) fn shard_index(&self, name: &str) -> Option<usize> {
        let by_name = &self.view.by_name;
        by_name
            .binary_search_by(|&i| self.shards[i as usize].name.as_str().cmp(name))
            .ok()
            .map(|at| by_name[at] as usize)
    }

    /// The holder of shard `index` (see [`holders`](Self::holders)), with this node's tenure as
    /// this look read it.
    fn holder<'a>(
        &'a self,
        index: usize,
        snapshot: &'a GroupSnapshot,
        now: Instant,
    ) -> Option<&'a str> {
        let shard = &self.shards[index];
        if shard.held_seen() {
            return Some(&self.node);
        }
        snapshot
            .live_holder(&shard.name, now)
            .filter(|holder| *holder != self.node)
    }

    /// Brings the view up to `snapshot` at `now`: the changed records only when the snapshot
    /// can name them and nothing else can have changed (see the module docs), else every record;
    /// then the targets, placed again when the members or the holders differ from what they were
    /// placed for.
    ///
    /// The tenures this node has of its shards are read first ([`look_at_tenures`]): the view
    /// and the rest of the look use what was read.
    ///
    /// [`look_at_tenures`]: Self::look_at_tenures
    pub(super) fn refresh_view(&mut self, snapshot: &GroupSnapshot, now: Instant) {
        let me_alive = self.member_lease.check_alive();
        let at = self.at(now);
        let changed = self.changed_shards(snapshot, at, me_alive);
        self.look_at_tenures(now, changed.as_deref());
        let full = changed.is_none();
        match changed {
            Some(changed) => {
                let look: Vec<usize> = changed.iter().chain(&self.view.watched).copied().collect();
                for index in look {
                    let holder = self.holder(index, snapshot, now);
                    if self.view.holders[index].as_deref() != holder {
                        let holder = holder.map(str::to_owned);
                        self.view.set_holder(index, holder);
                    }
                }
                self.view.to_visit.extend(changed);
                #[cfg(test)]
                {
                    self.view.looks.1 += 1;
                }
            }
            None => self.fold_all(snapshot, at, me_alive),
        }
        self.view.seen = Some((snapshot.version(), at));
        let view = &self.view;
        // The members change only in a full look (`fold_all`), and every look ends with the
        // targets placed for them: a look change by change has the same members (a compare of
        // every member's name on every renewal is what it saves).
        debug_assert!(full || view.placed_members.as_ref() == Some(&view.members));
        let stale = (full && view.placed_members.as_ref() != Some(&view.members))
            || view
                .unplaced
                .iter()
                .any(|(&index, placed)| view.holders[index] != *placed);
        if self.view.unplaced.capacity() > 1024 {
            // A fold of many changes (at a start): give the memory back.
            self.view.unplaced = HashMap::new();
        } else if !self.view.unplaced.is_empty() {
            self.view.unplaced.clear();
        }
        // Who may take which orphan changes only with the members, the holders, or a member's
        // meaning (each of which makes this look a full one, or the targets stale).
        let on_time = (stale || full).then(|| {
            OnTime::new(
                snapshot,
                self.shards.iter().map(|s| s.name.as_str()),
                &self.view.holders,
                &self.view.members,
                &self.member_prefix,
                (now, self.ttl, self.renewal),
            )
        });
        let stale = stale || on_time.as_ref().is_some_and(|o| *o != self.view.on_time);
        if let Some(on_time) = on_time {
            self.view.on_time = on_time;
        }
        if stale {
            let members = std::mem::take(&mut self.view.members);
            let holders = std::mem::take(&mut self.view.holders);
            let on_time = std::mem::take(&mut self.view.on_time);
            self.view.targets = self.place(&members, &holders, &on_time);
            self.view.on_time = on_time;
            self.view.members = members;
            self.view.holders = holders;
            self.view.placed_members = Some(self.view.members.clone());
            // The shards targeted here now are looked at (each one targeted here before is
            // watched, or unstarted).
            let view = &mut self.view;
            if let Some(me) = view.me.filter(|_| !view.visit_all) {
                let mine = view.targets.iter().enumerate();
                let mine = mine
                    .filter(|(_, target)| **target == Some(me))
                    .map(|(i, _)| i);
                view.to_visit.extend(mine);
            }
        }
    }

    /// Reads the tenures this node has of its shards ([`Shard::look`]; only a watched shard has
    /// a lease) for this look at `now`: every one of them when the look is a full one (`changed`
    /// is `None`) or the earliest deadline read at the last such read has passed; else only
    /// those not alive when last read, those whose tenure started or ended since (each one's
    /// lease stream says so: see `start_manager`) and those whose record changed. A tenure read
    /// alive changes with none of these only by a renewal (its deadline moves later), or by its
    /// end: at its deadline (which the earliest deadline bounds) or before it (a loss or a
    /// release, which its stream reports). Each read is a lock and a walk to the lease's memory:
    /// at 100 held shards a reconcile that read them all spent a quarter of its time on it
    /// (`benches/simulation.rs`).
    ///
    /// [`Shard::look`]: super::Shard::look
    fn look_at_tenures(&mut self, now: Instant, changed: Option<&[usize]>) {
        let view = &mut self.view;
        let changed_tenures = std::mem::take(&mut view.tenures_changed);
        let read_all = match (changed, view.tenures_until) {
            (Some(_), Some(until)) => now >= until,
            _ => true,
        };
        let unheld = std::mem::take(&mut view.tenures_unheld);
        let again: BTreeSet<usize> = if read_all {
            view.watched.clone()
        } else {
            (changed_tenures.into_iter())
                .chain(changed.into_iter().flatten().copied())
                .chain(unheld)
                .filter(|index| view.watched.contains(index))
                .collect()
        };
        let mut until = match view.tenures_until {
            Some(until) if !read_all => until,
            _ => now + self.ttl,
        };
        #[cfg(test)]
        {
            view.tenure_reads += again.len() as u64;
        }
        for index in again {
            match self.shards[index].look(now) {
                Some(deadline) => until = until.min(deadline),
                None => view.tenures_unheld.push(index),
            }
        }
        view.tenures_until = Some(until);
    }

    /// The shards whose records changed since the last look, when nothing else can have
    /// changed the view; `None` when the view must be folded from every record.
    fn changed_shards(
        &self,
        snapshot: &GroupSnapshot,
        at: At,
        me_alive: bool,
    ) -> Option<Vec<usize>> {
        let view = &self.view;
        let now = at.now;
        let (version, then) = view.seen?;
        if me_alive != view.me_alive || view.bound_elsewhere {
            return None;
        }
        // A record whose expiry passed since the last look changed its meaning with no event.
        if snapshot
            .next_expiry(then.now)
            .is_some_and(|expiry| expiry <= now)
        {
            return None;
        }
        // So did a member whose writer's end of claim passed, or that turned quiet (a walk of
        // the members, not of the shards).
        if snapshot
            .with_prefix(&self.member_prefix)
            .any(|(_, record)| turns_between(record, then, at))
        {
            return None;
        }
        let mut changed = Vec::new();
        for name in snapshot.changes_since(version)? {
            let record = snapshot.get(name);
            if name.starts_with(self.member_prefix.as_str()) {
                let same = match (view.member_records.get(name), record) {
                    (Some(seen), Some(record)) => seen.means(record, at),
                    (None, None) => true,
                    _ => false,
                };
                if !same {
                    return None;
                }
            } else if let Some(index) = self.shard_index(name) {
                let binding = record.and_then(|record| record.bound_to.as_ref());
                if binding.is_some_and(|b| !b.member().starts_with(self.member_prefix.as_str())) {
                    return None;
                }
                changed.push(index);
            }
        }
        Some(changed)
    }

    /// Folds the view from every record of `snapshot`, and has the next reconcile look at every
    /// shard.
    fn fold_all(&mut self, snapshot: &GroupSnapshot, at: At, me_alive: bool) {
        let now = at.now;
        let prefix = self.member_prefix.as_str();
        self.view.member_records = snapshot
            .with_prefix(prefix)
            .map(|(name, record)| (name.clone(), MemberSeen::of(record, at)))
            .collect();
        self.view.bound_elsewhere = self.shards.iter().any(|shard| {
            snapshot
                .get(&shard.name)
                .and_then(|record| record.bound_to.as_ref())
                .is_some_and(|binding| !binding.member().starts_with(prefix))
        });
        // The members at the instants of this look (the wall clock read once per look: a
        // member's writer's end of claim can pass while the look runs).
        let mut members: BTreeSet<String> = self
            .other_members(snapshot, now, at.wall)
            .into_iter()
            .collect();
        // This node's own membership is what its member lease says now (the view may lag).
        if me_alive {
            members.insert(self.node.clone());
        } else {
            members.remove(&self.node);
        }
        self.view.members = members.into_iter().collect();
        self.view.me = self.view.members.iter().position(|m| *m == self.node);
        self.view.me_alive = me_alive;
        let holders = self.holders(snapshot, now);
        if self.view.holders.len() == holders.len() {
            for (index, holder) in holders.into_iter().enumerate() {
                self.view.set_holder(index, holder);
            }
        } else {
            self.view.holders = holders;
            self.view.placed_members = None;
        }
        self.view.visit_all = true;
        #[cfg(test)]
        {
            self.view.looks.0 += 1;
        }
    }

    /// Debug builds: checks the view against the walk of every shard at `now`, and that each
    /// shard left out of `visits` is one the walk would do nothing with (no lease, no manager,
    /// not eligible, not targeted here, no record handed here).
    #[cfg(debug_assertions)]
    pub(super) fn check_view(&self, snapshot: &GroupSnapshot, now: Instant, visits: &[usize]) {
        // Judged at the look's own instants (its wall clock, its reading of this node's member
        // lease): a member's end of claim, or this node's deadline, can pass between the look
        // and this check (the chaos runs' debug nodes failed it so, at a wake-up timed for a
        // writer's end of claim).
        let wall = self
            .view
            .seen
            .map_or_else(SystemTime::now, |(_, at)| at.wall);
        let mut members: BTreeSet<String> = self
            .other_members(snapshot, now, wall)
            .into_iter()
            .collect();
        if self.view.me_alive {
            members.insert(self.node.clone());
        } else {
            members.remove(&self.node);
        }
        let members: Vec<String> = members.into_iter().collect();
        assert_eq!(self.view.members, members, "the view's members");
        assert_eq!(self.view.placed_members.as_ref(), Some(&members));
        // This node's own tenures are read as they are *now* (a deadline can pass between the
        // look and this check: a chaos run's debug node failed it so); the others' at `now`.
        let walked = self.holders(snapshot, now);
        let mine = Some(self.node.as_str());
        for (index, (seen, walked)) in self.view.holders.iter().zip(&walked).enumerate() {
            if seen.as_deref() == mine || walked.as_deref() == mine {
                continue;
            }
            assert_eq!(seen, walked, "the view's holder of shard {index}");
        }
        assert_eq!(self.view.holders.len(), walked.len(), "the view's holders");
        let mut visits = visits.iter().peekable();
        let handing = self.members_handing_on(snapshot);
        for (index, shard) in self.shards.iter().enumerate() {
            if visits.next_if(|&&visit| visit == index).is_some() {
                continue;
            }
            let handed_here = self.handed_here_among(index, snapshot, now, &handing);
            let target = self.view.targets[index];
            assert!(
                shard.lease.is_none()
                    && shard.manager.is_none()
                    && !shard.eligible
                    && !shard.was_held
                    && !handed_here
                    && (target.is_none() || target != self.view.me),
                "shard {} left out of a reconcile that had something to do with it",
                shard.id
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use actix::prelude::*;
    use tokio::time::sleep;

    use super::ShardedWorkers;
    use crate::lease::Lease;
    use crate::{GetShards, InMemoryLease, InMemoryStore, LeaseSettings, ShardInfo};

    const TTL: Duration = Duration::from_secs(6);

    struct Worker;

    impl Actor for Worker {
        type Context = Context<Self>;
    }

    /// How many looks at the group a node took: from every record, and change by change.
    #[derive(Message)]
    #[rtype(result = "(u64, u64)")]
    struct Looks;

    impl<A: Actor<Context = Context<A>>, L: Lease> Handler<Looks> for ShardedWorkers<A, L> {
        type Result = MessageResult<Looks>;

        fn handle(&mut self, _: Looks, _: &mut Context<Self>) -> Self::Result {
            MessageResult(self.view.looks)
        }
    }

    /// How many times the looks read a shard's tenure.
    #[derive(Message)]
    #[rtype(result = "u64")]
    struct TenureReads;

    impl<A: Actor<Context = Context<A>>, L: Lease> Handler<TenureReads> for ShardedWorkers<A, L> {
        type Result = u64;

        fn handle(&mut self, _: TenureReads, _: &mut Context<Self>) -> u64 {
            self.view.tenure_reads
        }
    }

    type Node = Addr<ShardedWorkers<Worker, InMemoryLease>>;

    fn node(store: &InMemoryStore, owner: &str) -> Node {
        let (store, owner) = (store.clone(), owner.to_owned());
        ShardedWorkers::with_count(
            "g",
            12,
            move |name: &str| {
                store.lease(
                    LeaseSettings::builder(name, &owner)
                        .ttl(TTL)
                        .renewal_interval(Duration::from_secs(2))
                        .build()
                        .unwrap(),
                )
            },
            |_: &ShardInfo, _: &mut Context<Worker>| Worker,
        )
        .unwrap()
        .start()
    }

    /// Waits (at most a minute of the paused clock) until every node runs `each` shards.
    async fn until_each_runs(nodes: &[&Node], each: usize) {
        for _ in 0..600 {
            let mut all = true;
            for node in nodes {
                all &= node.send(GetShards).await.unwrap().len() == each;
            }
            if all {
                return;
            }
            sleep(Duration::from_millis(100)).await;
        }
        panic!("the nodes did not settle on {each} shards each");
    }

    fn run_paused<F: std::future::Future>(f: F) -> F::Output {
        actix_rt::System::with_tokio_rt(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("tokio runtime")
        })
        .block_on(f)
    }

    /// Member renewals are folded in record by record (no look at every record); a member whose
    /// lease expires with no event (its process frozen: no write, no release) is still noticed
    /// at its expiry, and its shards move. Were the change-by-change look to skip the expiry,
    /// the shards would stay with the frozen node: the others' renewals change nothing else.
    /// A member record that went stale by this node's wall clock is a member again when the
    /// clock is set back (the chaos run's clock faults: debug nodes failed the view check); a
    /// full look must follow, in either direction of the wall clock.
    #[test]
    fn a_writer_s_end_of_claim_turns_a_member_when_the_wall_clock_goes_either_way() {
        use std::time::SystemTime;

        use super::{turns_between, At};
        use crate::group::GroupRecord;

        let now = tokio::time::Instant::now();
        let wall = SystemTime::now();
        let at = |wall: SystemTime| At {
            now,
            wall,
            ttl: TTL,
            renewal: Duration::from_secs(2),
        };
        let record =
            GroupRecord::new(Some("b".into()), None, Some(now + TTL)).with_stale_after(Some(wall));
        let before = at(wall - Duration::from_secs(5));
        let after = at(wall + Duration::from_secs(5));
        assert!(turns_between(&record, before, after), "went stale");
        assert!(
            turns_between(&record, after, before),
            "the clock set back: a member again"
        );
        assert!(!turns_between(&record, after, after));
        assert!(!turns_between(
            &record,
            before,
            at(wall - Duration::from_secs(1))
        ));
    }

    #[test]
    fn renewals_are_folded_record_by_record_and_an_expiry_with_no_event_still_moves_shards() {
        run_paused(async {
            let store = InMemoryStore::new();
            let (a, b, c) = (node(&store, "a"), node(&store, "b"), node(&store, "c"));
            until_each_runs(&[&a, &b, &c], 4).await;
            sleep(TTL).await;
            let before = a.send(Looks).await.unwrap();
            // Three intervals of renewals only: nothing moves, nothing is looked at in full.
            sleep(Duration::from_secs(6)).await;
            let after = a.send(Looks).await.unwrap();
            assert_eq!(after.0, before.0, "renewals looked at every record");
            assert!(
                after.1 >= before.1 + 3,
                "renewals reached the node: {after:?}"
            );
            until_each_runs(&[&a, &b, &c], 4).await;
            // c freezes: its member lease expires a TTL after its last renewal, with no event.
            store.pause("c");
            until_each_runs(&[&a, &b], 6).await;
            assert!(a.send(Looks).await.unwrap().0 > after.0);
        });
    }

    /// A look reads again only the tenures that started or ended since the last (each lease's
    /// stream says so) or whose record changed, and all of them once the earliest deadline it
    /// read has passed: renewals read far fewer than one tenure per held shard and look (every
    /// one of them, 24 in 4 looks, without). Shards handed over by a leaving node are then seen
    /// held by their taker, and a tenure that ends with no write of its record (its node frozen)
    /// still moves its shard.
    #[test]
    fn a_look_reads_only_the_tenures_that_changed() {
        run_paused(async {
            let store = InMemoryStore::new();
            let (a, b) = (node(&store, "a"), node(&store, "b"));
            until_each_runs(&[&a, &b], 6).await;
            sleep(TTL).await;
            let (looks, reads) = (
                a.send(Looks).await.unwrap(),
                a.send(TenureReads).await.unwrap(),
            );
            // Four intervals of renewals only.
            sleep(Duration::from_secs(8)).await;
            let looked = a.send(Looks).await.unwrap().1 - looks.1;
            let read = a.send(TenureReads).await.unwrap() - reads;
            assert!(looked >= 4, "renewals reached the node: {looked} looks");
            assert!(
                read * 2 <= looked * 6,
                "{read} reads of a tenure in {looked} looks at 6 held shards"
            );
            // b leaves, handing its shards to a's member tenure: a's view shows a holding them.
            let _ = b.send(crate::Shutdown).await;
            until_each_runs(&[&a], 12).await;
            let view = a.send(crate::GetGroupView).await.unwrap();
            assert!(
                view.holders.values().all(|h| h.as_deref() == Some("a")),
                "{view:?}"
            );
            // c joins and a freezes: a's tenures end at their deadlines with no write of theirs,
            // and c takes every shard.
            let c = node(&store, "c");
            until_each_runs(&[&a, &c], 6).await;
            store.pause("a");
            until_each_runs(&[&c], 12).await;
        });
    }
}
