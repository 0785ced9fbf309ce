//! Where a dead member's shards go: to members that can claim them on time.
//!
//! A contender judges a holder's expiry from when it *itself* first received the record that
//! decides it (the holder's member record for a bound shard, the shard's own record otherwise),
//! never from the holder's clock. A member whose watch of the group ran all along received that
//! record's last version as a change, soon after it was written, and may claim the shard one TTL
//! after the holder's last renewal. A member that joined (or relisted) after that version was
//! written received it in its listing, later, and may claim only one TTL after *that*: placed on
//! it, a dead member's shards would wait up to its whole start-up longer (seen with real
//! processes: a crash during a join left shards without a worker for TTL + 2.4 s).
//!
//! So each member says since which version of the store its watch has received every change as
//! it happened (the Kubernetes backend writes it with every claim and renewal,
//! `actix-coordination/watching-since`), and an orphaned shard (held in a record whose holder is
//! not a live member) is placed only on the members whose watch predates the version that decides
//! its expiry ([`Placer::place_where`](crate::Placer::place_where)): every node reads the same
//! versions, so every node places the same way. A member that does not say (etcd, where the
//! store itself expires a holder's keys; the in-memory store; a node of an older version) counts
//! as on time, which is the placement as it was.
//!
//! Faults come together: the member an orphan is placed on may itself have died a moment ago
//! (its own record has not expired yet), and the orphan would wait for that second expiry too.
//! So among the members on time, those that have renewed lately are preferred: a member whose
//! latest version this node received more than one and a half renewal intervals ago is *quiet*
//! (where the backend shows renewals: on Kubernetes every renewal is a new version), and an
//! orphan goes to a quiet member only when no member on time is heard from. Nodes judge
//! quietness each by their own clock, so for a moment around a renewal that is late they may
//! disagree on an orphan's target: that costs a claim that loses its compare-and-swap, or a
//! moment more for the orphan, never two holders.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::group::GroupSnapshot;

/// Which member may take which orphaned shard (the default: any member, any shard).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct OnTime {
    /// Per shard: the store version of the record that decides its holder's expiry, when it is
    /// an orphan (held in its record by a holder that is not a live member).
    orphan: Vec<Option<u64>>,
    /// Per member (in the members' order): since which version its watch ran without a gap.
    watching_since: Vec<Option<u64>>,
    /// Per member: whether it is quiet (no renewal received lately).
    quiet: Vec<bool>,
    /// Per distinct orphan version: whether a member on time and not quiet exists (else any
    /// member on time will do).
    heard: Vec<(u64, bool)>,
}

impl OnTime {
    /// The rule for `names` (the shards' lease names), whose live holders are `holders`, among
    /// `members` (member `m`'s record is `<member_prefix><m>`), as `snapshot` shows them.
    ///
    /// A member is quiet at `now` when its record's expiry (one `ttl` after its latest version
    /// was received) is less than `ttl − 1.5 × renewal` away.
    pub(super) fn new<'a>(
        snapshot: &GroupSnapshot,
        names: impl Iterator<Item = &'a str>,
        holders: &[Option<String>],
        members: &[String],
        member_prefix: &str,
        (now, ttl, renewal): (Instant, Duration, Duration),
    ) -> Self {
        let live: HashMap<&str, ()> = members.iter().map(|m| (m.as_str(), ())).collect();
        let orphan = names
            .zip(holders)
            .map(|(name, holder)| {
                if holder.as_deref().is_some_and(|h| live.contains_key(h)) {
                    return None;
                }
                let record = snapshot.get(name)?;
                record.holder.as_ref()?;
                match &record.bound_to {
                    // A record its member tenure listed to a target lives by the target's member
                    // record, and expires with it: that record's version decides (issue 47,
                    // item 7), not the lister's.
                    Some(binding) => {
                        let decides = snapshot
                            .handed_to(name)
                            .map_or(binding.member(), |(_, to, _)| to.member());
                        snapshot.get(decides)?.revision
                    }
                    None => record.revision,
                }
            })
            .collect();
        let records: Vec<_> = members
            .iter()
            .map(|m| snapshot.get(&format!("{member_prefix}{m}")))
            .collect();
        let watching_since: Vec<Option<u64>> = records
            .iter()
            .map(|r| r.and_then(|r| r.watching_since))
            .collect();
        let quiet: Vec<bool> = records
            .iter()
            .map(|r| r.is_some_and(|r| Self::is_quiet(r, (now, ttl, renewal))))
            .collect();
        let mut on_time = Self {
            orphan,
            watching_since,
            quiet,
            heard: Vec::new(),
        };
        let mut versions: Vec<u64> = on_time.orphan.iter().flatten().copied().collect();
        versions.sort_unstable();
        versions.dedup();
        on_time.heard = versions
            .into_iter()
            .map(|v| {
                let heard =
                    (0..members.len()).any(|j| on_time.watched(Some(v), j) && !on_time.quiet[j]);
                (v, heard)
            })
            .collect();
        on_time
    }

    /// Whether `record` (a member's) is quiet at `now` (see [`new`](Self::new)).
    pub(super) fn is_quiet(
        record: &crate::group::GroupRecord,
        (now, ttl, renewal): (Instant, Duration, Duration),
    ) -> bool {
        let heard_within = ttl.saturating_sub(renewal + renewal / 2);
        record
            .expires_at
            .is_some_and(|at| at.saturating_duration_since(now) < heard_within)
    }

    /// When the next member turns quiet (for a wake-up: nothing is received then).
    pub(super) fn next_quiet<'a>(
        records: impl Iterator<Item = &'a crate::group::GroupRecord>,
        (now, ttl, renewal): (Instant, Duration, Duration),
    ) -> Option<Instant> {
        let heard_within = ttl.saturating_sub(renewal + renewal / 2);
        records
            .filter_map(|r| r.expires_at?.checked_sub(heard_within))
            .filter(|at| *at > now)
            .min()
    }

    /// Whether member `member` received version `revision` on time (see the module docs).
    fn watched(&self, revision: Option<u64>, member: usize) -> bool {
        let since = self.watching_since.get(member).copied().flatten();
        match (revision, since) {
            (Some(revision), Some(since)) => since < revision,
            _ => true,
        }
    }

    /// Whether the member at `member` (an index into the members) may take the shard at `shard`:
    /// any shard that is no orphan; an orphan only if its watch predates the version that
    /// decides the orphan's expiry, and, when some such member is not quiet, only if it is not.
    pub(super) fn may_take(&self, shard: usize, member: usize) -> bool {
        let Some(revision) = self.orphan.get(shard).copied().flatten() else {
            return true;
        };
        if !self.watched(Some(revision), member) {
            return false;
        }
        let heard = self
            .heard
            .binary_search_by_key(&revision, |(v, _)| *v)
            .is_ok_and(|i| self.heard[i].1);
        !heard || !self.quiet.get(member).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::binding::Binding;
    use crate::group::GroupRecord;

    const TTL: Duration = Duration::from_secs(3);
    const RENEWAL: Duration = Duration::from_secs(1);

    /// Member `name`'s record: version `revision`, watching since `since`, its latest version
    /// received `ago` before `now`.
    fn member(name: &str, revision: u64, since: u64, now: Instant, ago: Duration) -> GroupRecord {
        GroupRecord::new(Some(name.into()), None, Some(now - ago + TTL))
            .with_watch_facts(Some(revision), Some(since))
    }

    /// `d` died (its member record's last version is 100); `a` has watched since 50, `b` joined
    /// after that version (watching since 120): `d`'s bound shard goes to `a` only, and a free
    /// shard to anyone.
    #[tokio::test(start_paused = true)]
    async fn a_dead_members_shard_goes_only_to_members_that_watched_its_last_version() {
        let now = Instant::now();
        let mut records = BTreeMap::new();
        records.insert(
            "g.member.a".to_owned(),
            member("a", 130, 50, now, RENEWAL / 2),
        );
        records.insert(
            "g.member.b".to_owned(),
            member("b", 131, 120, now, RENEWAL / 2),
        );
        records.insert(
            "g.member.d".to_owned(),
            GroupRecord::new(
                Some("d".into()),
                None,
                Some(now + Duration::from_millis(100)),
            )
            .with_watch_facts(Some(100), Some(10)),
        );
        let binding = Binding::new("g.member.d", "uid/1");
        records.insert(
            "g.0".to_owned(),
            GroupRecord::new(Some("d".into()), None, None).with_binding(Some(binding)),
        );
        records.insert("g.1".to_owned(), GroupRecord::new(None, None, None));
        let snapshot = GroupSnapshot::new(records, true);
        let members = ["a".to_owned(), "b".to_owned()];
        let on_time = OnTime::new(
            &snapshot,
            ["g.0", "g.1"].into_iter(),
            &[None, None],
            &members,
            "g.member.",
            (now, TTL, RENEWAL),
        );
        assert!(
            on_time.may_take(0, 0),
            "a watched d's last version as it was written"
        );
        assert!(
            !on_time.may_take(0, 1),
            "b listed d's last version only after it joined"
        );
        assert!(
            on_time.may_take(1, 0) && on_time.may_take(1, 1),
            "a free shard is no orphan"
        );

        // Placed so: the orphan on `a` even when its ideal member is `b`, over `a`'s quota if
        // need be; the free shard where the rule puts it.
        let mut placer = crate::Placer::default();
        for shards in [["g.0", "g.1"], ["g.1", "g.0"]] {
            let orphan = shards.iter().position(|s| *s == "g.0").unwrap();
            let targets = placer.place_where(
                &shards,
                &members,
                |_| None,
                |s, m| on_time.may_take(if s == orphan { 0 } else { 1 }, m),
            );
            assert_eq!(targets[orphan], Some(0), "{targets:?}");
        }

        // When `a` is quiet (not heard from for 1.5 renewal intervals) and `c`, also on time,
        // is not, the orphan goes to `c`; when every member on time is quiet, to any of them.
        let mut records = snapshot.records().clone();
        records.insert(
            "g.member.a".to_owned(),
            member("a", 130, 50, now, RENEWAL * 2),
        );
        records.insert(
            "g.member.c".to_owned(),
            member("c", 132, 60, now, RENEWAL / 2),
        );
        let snapshot = GroupSnapshot::new(records, true);
        let members = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let rule = |snapshot: &GroupSnapshot| {
            OnTime::new(
                snapshot,
                ["g.0"].into_iter(),
                &[None],
                &members,
                "g.member.",
                (now, TTL, RENEWAL),
            )
        };
        let on_time = rule(&snapshot);
        assert_eq!(
            (0..3).map(|m| on_time.may_take(0, m)).collect::<Vec<_>>(),
            [false, false, true]
        );
        let mut records = snapshot.records().clone();
        records.insert(
            "g.member.c".to_owned(),
            member("c", 132, 60, now, RENEWAL * 2),
        );
        let on_time = rule(&GroupSnapshot::new(records, true));
        assert_eq!(
            (0..3).map(|m| on_time.may_take(0, m)).collect::<Vec<_>>(),
            [true, false, true]
        );
    }

    /// Issue 47, item 7: `l` left listing shard `g.0` to `t`, whose member record (version 200)
    /// is not live any more: the shard is an orphan whose expiry `t`'s record decides, so a
    /// member that has watched since 150 (before `t`'s last version, after `l`'s 100) is on
    /// time for it, and one that joined after 200 is not.
    #[tokio::test(start_paused = true)]
    async fn a_listed_orphan_is_timed_by_its_target_s_member_record_not_the_lister_s() {
        use crate::binding::{HandedShard, HandedShards};
        let now = Instant::now();
        let mut records = BTreeMap::new();
        records.insert(
            "g.member.a".to_owned(),
            member("a", 300, 150, now, RENEWAL / 2),
        );
        records.insert(
            "g.member.b".to_owned(),
            member("b", 301, 250, now, RENEWAL / 2),
        );
        let to_t = Binding::new("g.member.t", "ut/1");
        let mut listed = HandedShards::default();
        listed.add("ul/1", &[HandedShard::new("g.0", "t", to_t.clone())]);
        let mut leaver = GroupRecord::new(None, None, None).with_watch_facts(Some(100), Some(10));
        leaver.handed = Some(std::sync::Arc::new(listed));
        records.insert("g.member.l".to_owned(), leaver);
        records.insert(
            "g.member.t".to_owned(),
            GroupRecord::new(
                Some("t".into()),
                None,
                Some(now + Duration::from_millis(100)),
            )
            .with_incarnation(Some("ut/1".into()))
            .with_watch_facts(Some(200), Some(20)),
        );
        records.insert(
            "g.0".to_owned(),
            GroupRecord::new(Some("l".into()), None, None)
                .with_binding(Some(Binding::new("g.member.l", "ul/1"))),
        );
        let snapshot = GroupSnapshot::new(records, true);
        let members = ["a".to_owned(), "b".to_owned()];
        let on_time = OnTime::new(
            &snapshot,
            ["g.0"].into_iter(),
            &[None],
            &members,
            "g.member.",
            (now, TTL, RENEWAL),
        );
        assert!(
            on_time.may_take(0, 0),
            "a watched t's last version as it was written"
        );
        assert!(
            !on_time.may_take(0, 1),
            "b listed t's last version only after it joined"
        );
    }
}
