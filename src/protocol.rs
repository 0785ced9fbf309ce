//! The decisions of the bound-record protocol, as pure functions: who holds a record bound to a
//! member tenure, when a contender may claim it, and when a holder may still write it.
//!
//! The Kubernetes backend decides every write on a shard record with these functions and
//! nothing else (its reads, watches and compare-and-swap writes are the I/O around them), the
//! group snapshot judges holders with them, and the model check of the protocol
//! (`tests/protocol_model.rs`) explores every interleaving of a small fleet calling the very same
//! functions. They take what one process knows (a record as read or as its watch shows it, its
//! own monotonic clock, its own member tenure) and answer; none reads a clock or a store.
//!
//! # The records
//!
//! A *member* record is renewed by its holder; each tenure of it is an *incarnation* (on
//! Kubernetes `<uid>/<leaseTransitions>`), which never lives again once over. A *bound* shard
//! record names its holder, a fencing token and the member incarnation it lives by
//! ([`Binding`]); it is written when its ownership changes and never renewed. A member record
//! may *list* shards under one of its incarnations, each with a target (an owner and that
//! owner's member incarnation): the holder's statement that it gave the shard up, for that
//! target (see [`Lease::retire_handing`](crate::Lease::retire_handing)).
//!
//! # The rules
//!
//! 1. **Every tenure starts with a compare-and-swap on the shard's own record** that names the
//!    new holder, its member incarnation and the fencing token of the version it replaced plus
//!    one. No tenure is ever taken up without a write: a shard listed to a target is claimed by
//!    that target with such a write ([`Step::Claim`]), at once and without waiting for any
//!    expiry, and acts only once the write is answered.
//! 2. **A contender counts a bound record free** only when the member incarnation it names is
//!    over: released, replaced by another holder or incarnation, deleted, listed the record
//!    ([`member_verdict`]), or expired by the observed-time rule (its version stood for the
//!    member's duration since *this* process first received it) *and* released by this
//!    contender's compare-and-swap on that very version ([`MemberVerdict::Expired`]: a list the
//!    holder wrote before its deadline but that lands later is then refused). A record listed to
//!    a target stays the target's while the target's incarnation lives ([`handed_record`]).
//! 3. **A holder writes a record it held only as that holder** ([`may_write_own`]): the record
//!    still names it with its token, and a bound record still names the member incarnation that
//!    lives now *by the holder's own clock*. A claim answered after its member incarnation ended,
//!    a release asked for after it, and an unanswered claim found later are written over by
//!    nobody but the next claimant ([`keep_bound_claim`]).
//! 4. **A member lists only records its incarnation holds** ([`listable`]), in the write that
//!    ends that incarnation (the holder's local tenure of each ended first). A member that
//!    leaves while a worker is slow to stop gives the others up before that write, each with a
//!    release or handover of its own record (rule 3), as a rebalance does; its mark of leaving
//!    (`Lease::mark_leaving`) only steers placement and decides nothing here.
//!
//! # Why one holder, and rising tokens
//!
//! A holder holds from the moment its compare-and-swap lands, at a version that names it, until
//! its member tenure's deadline on its own clock. Any other tenure must begin with a
//! compare-and-swap on that version or a later one, so its claimant judged that version free:
//! by rule 2 only after the holder's member incarnation is over, which no contender can see
//! before the holder's own deadline (the observed-time rule), or after the holder gave the
//! record up itself (a release or a list, both written after its local tenure ended). A write
//! that arrives late — a claim answered after its deadline, a release sent just before it, a
//! list that lands after the member expired — is a compare-and-swap on the version it read:
//! once anyone claimed since, it is refused; before that, it frees a record nobody holds. So no
//! stale write can free a record someone holds. Every tenure's token is its version's
//! predecessor's plus one, and versions of one record are totally ordered by the store: tokens
//! strictly rise.
//!
//! The model check (`tests/protocol_model.rs`, and `scripts/bench.sh model` for a larger
//! configuration) explores every interleaving of three nodes and two shards with late and lost
//! answers, late requests, lagging watches, freezes, crashes and restarts under the same name,
//! and fails when any one of these rules is removed.

use tokio::time::Instant;

use crate::vocab::Binding;

/// Where a process's knowledge of a record comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Its watch: a past state of the record, possibly an old one (a watch may lag, and after
    /// it resumes the changes it missed arrive late).
    Watch,
    /// A quorum read: the record as it is now.
    Read,
}

/// A member record as one process knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberSeen<'a> {
    /// Its holder (`None`: released).
    pub holder: Option<&'a str>,
    /// The incarnation of its current tenure (`None` when released).
    pub incarnation: Option<&'a str>,
    /// When the version seen expires on this process's monotonic clock: when this process first
    /// received that version, plus the record's duration. `None` where the store expires records
    /// itself (no expiry to judge).
    pub expires_at: Option<Instant>,
    /// What the record lists for the record being judged, under the incarnation that record is
    /// bound to: the target's owner and member incarnation.
    pub listed: Option<(&'a str, &'a Binding)>,
}

/// A member incarnation as one process judges it (see [`member_verdict`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberVerdict {
    /// It lives, at least until `until` on this process's clock (`None`: until the store says
    /// otherwise).
    Lives {
        /// Until when, at least.
        until: Option<Instant>,
    },
    /// It is over for good, without listing the record judged.
    Over,
    /// It gave the record judged up for `owner`, under `owner`'s member incarnation `to`.
    Handed {
        /// The target's owner.
        owner: String,
        /// The target's member incarnation.
        to: Binding,
    },
    /// It expired by the observed-time rule at the version read: over once a compare-and-swap
    /// of this process releases that version (a newer version must be judged again).
    Expired,
    /// The watch cannot tell (it may lag): read the record.
    Unsure,
}

/// Judges member incarnation `incarnation` held by `holder` from `seen` (`None`: no record) at
/// `now`, as `source` shows it.
///
/// A list entry is trusted from either source (written once, with the end of the incarnation or
/// by its holder giving the record up, and kept until the record moved on). A live holder is
/// trusted from the watch too (a lagging view only makes the judgement more careful). Anything
/// that would free the record — no record, another holder or incarnation, a release, an expiry
/// — needs a read, and an expiry needs a release of the version read besides.
pub fn member_verdict(
    seen: Option<MemberSeen<'_>>,
    source: Source,
    incarnation: &str,
    holder: &str,
    now: Instant,
) -> MemberVerdict {
    let Some(seen) = seen else {
        return match source {
            Source::Read => MemberVerdict::Over,
            Source::Watch => MemberVerdict::Unsure,
        };
    };
    if let Some((owner, to)) = seen.listed {
        return MemberVerdict::Handed {
            owner: owner.to_owned(),
            to: to.clone(),
        };
    }
    let holds = seen.holder == Some(holder) && seen.incarnation == Some(incarnation);
    match (holds, source) {
        (true, _) if seen.expires_at.is_none_or(|at| now < at) => MemberVerdict::Lives {
            until: seen.expires_at,
        },
        (true, Source::Read) => MemberVerdict::Expired,
        (false, Source::Read) => MemberVerdict::Over,
        (_, Source::Watch) => MemberVerdict::Unsure,
    }
}

/// What a contender does next about a bound record (see [`bound_record`] and
/// [`handed_record`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Held by `holder` at least until `until`: not claimed.
    Held {
        /// The holder (the record's, or the target it was listed to).
        holder: String,
        /// Until when, at least (`None`: until the store says otherwise).
        until: Option<Instant>,
    },
    /// Claim it: a compare-and-swap on the version judged, naming this owner, its member
    /// incarnation and the record's token plus one.
    Claim,
    /// It was listed to `owner` under `to`: judge that incarnation ([`handed_record`]).
    Target {
        /// The target's owner.
        owner: String,
        /// The target's member incarnation.
        to: Binding,
    },
    /// The member incarnation expired: release its record with a compare-and-swap on the
    /// version read, then judge again.
    Confirm,
    /// Read the member record, then judge again.
    Read,
}

/// The next step about a record held by `holder`, bound to a member incarnation judged
/// `member`, for a contender that would claim it as `me` (its owner and member incarnation).
pub fn bound_record(holder: &str, member: MemberVerdict, me: Option<(&str, &Binding)>) -> Step {
    match member {
        MemberVerdict::Lives { until } => Step::Held {
            holder: holder.to_owned(),
            until,
        },
        MemberVerdict::Over => Step::Claim,
        // Listed to this very owner under the member incarnation it claims with: claimed at
        // once, with a write (rule 1).
        MemberVerdict::Handed { owner, to } if me.is_some_and(|(o, b)| o == owner && *b == to) => {
            Step::Claim
        }
        MemberVerdict::Handed { owner, to } => Step::Target { owner, to },
        MemberVerdict::Expired => Step::Confirm,
        MemberVerdict::Unsure => Step::Read,
    }
}

/// The next step about a record listed to `owner`, whose member incarnation is judged
/// `target` (by [`member_verdict`] on the target's member record): the target's while it lives.
pub fn handed_record(owner: &str, target: MemberVerdict) -> Step {
    match target {
        MemberVerdict::Lives { until } => Step::Held {
            holder: owner.to_owned(),
            until,
        },
        // Over, or it listed the record on itself (it gave it up without claiming it).
        MemberVerdict::Over | MemberVerdict::Handed { .. } => Step::Claim,
        MemberVerdict::Expired => Step::Confirm,
        MemberVerdict::Unsure => Step::Read,
    }
}

/// A shard record as one process knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSeen<'a> {
    /// Its holder (`None`: released).
    pub holder: Option<&'a str>,
    /// The fencing token of its latest tenure.
    pub token: u64,
    /// The member incarnation it is bound to (`None`: not bound).
    pub binding: Option<&'a Binding>,
}

/// Whether `owner`, whose tenure of a record had fencing token `token`, may write that record
/// (release it, or give it up otherwise) as `record` shows it, while `live_member` is the member
/// incarnation that lives now by the owner's own clock (`None`: none).
///
/// Only as its holder: the record names `owner` with `token`, and a bound record names
/// `live_member`. A bound record of a member incarnation that ended is free by rule 2 already
/// (and may be listed to a target): writing it could only undo that.
pub fn may_write_own(
    record: RecordSeen<'_>,
    owner: &str,
    token: u64,
    live_member: Option<&Binding>,
) -> bool {
    record.holder == Some(owner)
        && record.token == token
        && record
            .binding
            .is_none_or(|bound| live_member == Some(bound))
}

/// Whether a bound claim made under member incarnation `claimed_under`, answered now, starts a
/// tenure: only while that incarnation is the one that lives now by the owner's own clock
/// (`live_member`). Otherwise nothing is written (rule 3): the record is bound to an
/// incarnation that is over, which makes it free for the next claimant.
pub fn keep_bound_claim(claimed_under: &Binding, live_member: Option<&Binding>) -> bool {
    live_member == Some(claimed_under)
}

/// Whether a bound claim may be sent at `now` under a member tenure that lives until
/// `member_deadline` by this process's clock, when its answer may take up to
/// `operation_timeout`: only if it can be answered before that deadline. A claim answered later
/// starts nothing ([`keep_bound_claim`]), so sending it would only load the store, and during a
/// fleet's start such claims queued ahead of the very member renewals that were late. Not a
/// safety rule (a claim sent anyway is judged by [`keep_bound_claim`] when answered), a liveness
/// one: a healthy member's tenure always has room (the settings keep `renewal_interval + 2 ×
/// operation_timeout` within the TTL), so this refuses claims only while its renewals fail.
pub fn may_send_bound_claim(
    now: Instant,
    member_deadline: Instant,
    operation_timeout: std::time::Duration,
) -> bool {
    now.checked_add(operation_timeout)
        .is_some_and(|answered| answered <= member_deadline)
}

/// Whether a member record may list `record` under incarnation `ended` of the member lease
/// held by `holder`: only a record that this holder holds bound to that very incarnation.
pub fn listable(record: RecordSeen<'_>, holder: &str, ended: &Binding) -> bool {
    record.holder == Some(holder) && record.binding == Some(ended)
}

/// The fencing token a claim writes over a record whose latest tenure had `token` (`None`: it
/// cannot grow any more).
pub fn claim_token(token: u64) -> Option<u64> {
    token.checked_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn seen<'a>(
        holder: Option<&'a str>,
        incarnation: Option<&'a str>,
        expires_at: Option<Instant>,
    ) -> MemberSeen<'a> {
        MemberSeen {
            holder,
            incarnation,
            expires_at,
            listed: None,
        }
    }

    #[test]
    fn a_member_is_over_only_by_a_read_and_expired_only_with_a_release() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        let live = seen(Some("b"), Some("u/1"), Some(later));
        for source in [Source::Watch, Source::Read] {
            assert_eq!(
                member_verdict(Some(live), source, "u/1", "b", now),
                MemberVerdict::Lives { until: Some(later) }
            );
        }
        let past = seen(Some("b"), Some("u/1"), Some(now));
        assert_eq!(
            member_verdict(Some(past), Source::Watch, "u/1", "b", now),
            MemberVerdict::Unsure
        );
        assert_eq!(
            member_verdict(Some(past), Source::Read, "u/1", "b", now),
            MemberVerdict::Expired
        );
        let other = seen(Some("b"), Some("u/2"), Some(later));
        assert_eq!(
            member_verdict(Some(other), Source::Watch, "u/1", "b", now),
            MemberVerdict::Unsure
        );
        assert_eq!(
            member_verdict(Some(other), Source::Read, "u/1", "b", now),
            MemberVerdict::Over
        );
        assert_eq!(
            member_verdict(None, Source::Watch, "u/1", "b", now),
            MemberVerdict::Unsure
        );
        assert_eq!(
            member_verdict(None, Source::Read, "u/1", "b", now),
            MemberVerdict::Over
        );
    }

    #[test]
    fn a_listed_record_is_claimed_by_its_target_and_held_for_it_while_the_target_lives() {
        let now = Instant::now();
        let to = Binding::new("m.d", "v/3");
        let listed = MemberSeen {
            holder: None,
            incarnation: None,
            expires_at: None,
            listed: Some(("d", &to)),
        };
        let verdict = member_verdict(Some(listed), Source::Watch, "u/1", "b", now);
        assert_eq!(
            verdict,
            MemberVerdict::Handed {
                owner: "d".into(),
                to: to.clone()
            }
        );
        assert_eq!(
            bound_record("b", verdict.clone(), Some(("d", &to))),
            Step::Claim
        );
        let other = Binding::new("m.d", "v/4");
        assert_eq!(
            bound_record("b", verdict.clone(), Some(("d", &other))),
            Step::Target {
                owner: "d".into(),
                to: to.clone()
            }
        );
        assert_eq!(
            handed_record("d", MemberVerdict::Lives { until: None }),
            Step::Held {
                holder: "d".into(),
                until: None
            }
        );
        assert_eq!(handed_record("d", MemberVerdict::Over), Step::Claim);
        assert_eq!(handed_record("d", MemberVerdict::Expired), Step::Confirm);
    }

    #[test]
    fn a_holder_writes_only_under_the_member_incarnation_that_lives() {
        let live = Binding::new("m.b", "u/2");
        let ended = Binding::new("m.b", "u/1");
        let record = |binding| RecordSeen {
            holder: Some("b"),
            token: 7,
            binding,
        };
        assert!(may_write_own(record(Some(&live)), "b", 7, Some(&live)));
        assert!(!may_write_own(record(Some(&ended)), "b", 7, Some(&live)));
        assert!(!may_write_own(record(Some(&live)), "b", 7, None));
        assert!(!may_write_own(record(Some(&live)), "b", 6, Some(&live)));
        assert!(!may_write_own(record(Some(&live)), "c", 7, Some(&live)));
        assert!(may_write_own(record(None), "b", 7, None));
        assert!(keep_bound_claim(&live, Some(&live)));
        assert!(!keep_bound_claim(&ended, Some(&live)));
        assert!(!keep_bound_claim(&live, None));
        assert!(listable(record(Some(&ended)), "b", &ended));
        assert!(!listable(record(Some(&live)), "b", &ended));
        assert!(!listable(
            RecordSeen {
                holder: None,
                token: 7,
                binding: Some(&ended)
            },
            "b",
            &ended
        ));
    }

    #[test]
    fn a_bound_claim_is_sent_only_if_it_can_be_answered_before_the_member_deadline() {
        let now = Instant::now();
        let timeout = Duration::from_millis(800);
        assert!(may_send_bound_claim(now, now + timeout * 2, timeout));
        assert!(may_send_bound_claim(now, now + timeout, timeout));
        assert!(!may_send_bound_claim(now, now + timeout / 2, timeout));
        assert!(!may_send_bound_claim(now, now, timeout));
        assert!(!may_send_bound_claim(now + timeout, now, timeout));
        assert!(!may_send_bound_claim(now, now + timeout, Duration::MAX));
    }
}
