//! An exhaustive model check of the Kubernetes bound-record protocol (issue 47), with
//! [stateright](https://docs.rs/stateright), on the crate's own decision functions.
//!
//! The model is a small fleet (three nodes, two shards) and one store of compare-and-swap
//! records: a member record per node (an incarnation per tenure, a list of shards handed on) and a
//! bound record per shard (holder, fencing token, member incarnation). Every decision a node
//! takes is asked of `actix_coordination::protocol`, the same functions the Kubernetes backend
//! calls: how its watch or a read shows a member incarnation (`member_verdict`), what to do about
//! a bound record (`bound_record`, `handed_record`), whether an answered claim starts a tenure
//! (`keep_bound_claim`), whether a holder may still write a record (`may_write_own`), which
//! records a leaving or expired member lists (`listable`), and the token a claim writes
//! (`claim_token`). The I/O around them is the model's: reads, compare-and-swap writes that land
//! at once or late, answers that arrive late or never, watches that lag (and catch up one version
//! at a time), each process's clock, freezes, crashes and restarts under the same name (a new
//! incarnation), a node that leaves handing its shards on, and a contender that releases an
//! expired member's record listing its shards.
//!
//! Time is discrete (one tick is one second of the nodes' monotonic clocks, which run at the
//! same rate; a frozen process's clock runs on). Within a tick every node takes every step it
//! can (renewing its member, judging and claiming shards, catching its watch up) in every order,
//! and time advances only once none is left: so without faults the fleet makes progress, and
//! every fault (a late request, a late or lost answer, a lagging watch, a freeze, a crash, a
//! leave) is a choice the checker explores at every point, up to a budget, while `now` is before
//! the configuration's `fault_until`.
//!
//! Checked in every reachable state:
//!
//! * **one holder**: at most one process holds a live tenure of a shard (a frozen process counts:
//!   it would act on thawing before its deadline);
//! * **tokens rise**: every tenure starts with a token above every earlier tenure's of the shard;
//! * **no stale free**: no release lands on the version of a record someone holds;
//! * **settled**: at the horizon, once no step is left, every shard is held by a running node
//!   (liveness: faults stop at `fault_until`, and the horizon leaves time to recover).
//!
//! The rules can be removed one at a time (`Rules`), each as the code before issue 47 had it or as
//! a plausible simplification, and each removal is caught (the `a_removed_rule_…` tests). The
//! configuration checked in CI and its state count are in the README ("The protocol, checked");
//! `scripts/bench.sh model` runs a larger one (`MODEL_CONFIG=large`, an ignored test).

use std::sync::OnceLock;
use std::time::Duration;

use actix_coordination::protocol::{self, MemberSeen, MemberVerdict, RecordSeen, Source, Step};
use actix_coordination::Binding;
use stateright::{Checker, HasDiscoveries, Model, Property};
use tokio::time::Instant;

/// Nodes.
const N: usize = 3;
/// Shards.
const S: usize = 2;
/// The slot of a node's member lease (shards are `0..S`).
const MEMBER: u8 = u8::MAX;

// ---------------------------------------------------------------------------------------------
// Configuration

/// The rules of the protocol that a test may remove, one at a time (all `false`: the crate's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Rules {
    /// The code before issue 47: a listed target takes a shard up *without a write* (token + 1,
    /// the record left at the version listed) and rebinds it later; a release of such a tenure
    /// reads first; a claim after a target that died writes the token plus two.
    take_up_without_write: bool,
    /// The code before issue 47: a claim answered after its member tenure ended, and a bound
    /// tenure given up, are released with a compare-and-swap all the same, and an unanswered
    /// claim is released when the *watch* shows its member tenure live.
    write_after_member_ended: bool,
    /// A member judged expired from the watch alone (no read, no release of the expired
    /// version before its shards count free).
    trust_watch_expiry: bool,
    /// A holder's deadline counted from when an answer arrives instead of when the write was
    /// sent.
    deadline_from_answer: bool,
    /// A bound claim answered under another (newer) member tenure of the same owner kept, bound
    /// in the holder's mind to that newer tenure.
    keep_claim_of_any_member: bool,
    /// An unanswered claim released over whatever the read shows (no check that it is still
    /// this owner's, with this token).
    release_unanswered_unchecked: bool,
}

/// What is explored.
#[derive(Clone, Copy, Debug)]
struct Config {
    /// The member records' duration, in ticks.
    ttl: u8,
    /// A member renews this many ticks after its last renewal was sent.
    renew_every: u8,
    /// Faults are chosen only while `now` is before this tick.
    fault_until: u8,
    /// Time stops here.
    horizon: u8,
    /// How many faults one run may have (late requests, late or lost answers, lagging watches,
    /// freezes, crashes, leaves).
    faults: u8,
    /// How many voluntary releases of a shard one run may have (a rebalance).
    releases: u8,
    /// How many shards start released (the last ones): claims, and their late answers, are
    /// explored from the start.
    free: u8,
    /// Whether a member renewal's answer may come late too (a fault; otherwise a member tenure
    /// ends at its holder by a freeze or a crash).
    member_faults: bool,
    /// Look for two holders at once only (a repeated token or a stale free is not reported, and
    /// the run goes on): what explains issue 47's item 9.
    overlap_only: bool,
    rules: Rules,
}

impl Config {
    /// The configuration CI checks exhaustively: faults in the first three ticks, up to two of
    /// them, and time enough after them for every shard to be held again.
    fn small() -> Self {
        Config {
            ttl: 2,
            renew_every: 1,
            fault_until: 3,
            horizon: 7,
            faults: 2,
            releases: 0,
            free: 1,
            member_faults: false,
            overlap_only: false,
            rules: Rules::default(),
        }
    }

    /// The same with a release of a shard (a rebalance) and one fault besides.
    fn small_with_a_release() -> Self {
        Config {
            faults: 1,
            releases: 1,
            ..Config::small()
        }
    }

    /// The larger one of `scripts/bench.sh model`: two faults (member renewals' answers among
    /// them) and a release, over four ticks.
    fn large() -> Self {
        Config {
            fault_until: 4,
            horizon: 8,
            faults: 2,
            releases: 1,
            member_faults: true,
            ..Config::small()
        }
    }

    fn with(mut self, rules: Rules) -> Self {
        self.rules = rules;
        self
    }
}

// ---------------------------------------------------------------------------------------------
// The store

/// A member tenure: the member record's `uid` and its `leaseTransitions`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Inc {
    uid: u8,
    n: u8,
}

impl Inc {
    fn name(self) -> String {
        format!("{}/{}", self.uid, self.n)
    }
}

/// An entry of a member record's list: shard `shard`, bound to incarnation `inc`, handed to
/// `owner`'s member incarnation `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Entry {
    inc: Inc,
    shard: u8,
    owner: u8,
    to: Inc,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct MemberObj {
    uid: u8,
    ver: u16,
    holder: Option<u8>,
    n: u8,
    list: Vec<Entry>,
}

impl MemberObj {
    fn inc(&self) -> Option<Inc> {
        self.holder.map(|_| Inc {
            uid: self.uid,
            n: self.n,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ShardObj {
    ver: u16,
    holder: Option<u8>,
    token: u8,
    bound: Option<(u8, Inc)>,
}

// ---------------------------------------------------------------------------------------------
// The processes

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Life {
    Up,
    Frozen,
    /// Crashed (it may restart under the same name).
    Down,
    /// Left the group (it does not come back).
    Gone,
}

/// A member tenure as its holder knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct MemberTenure {
    inc: Inc,
    deadline: u8,
    ver: u16,
    /// When the last renewal (or the claim) was sent.
    renewed: u8,
}

/// A shard tenure as its holder knows it (its deadline is its member tenure's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ShardTenure {
    token: u8,
    inc: Inc,
    /// The record's version this tenure wrote (or, taken up without a write, was listed at).
    ver: u16,
    /// Taken up without a write and not rebound yet (the code before issue 47 only).
    taken: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Proc {
    life: Life,
    /// Restarts so far: answers to an earlier process are dropped.
    gen: u8,
    /// Its watch lags: it receives the store's changes one at a time, whenever it does.
    lag: bool,
    member: Option<MemberTenure>,
    /// A request of the member lease is in flight.
    member_busy: bool,
    shards: [Option<ShardTenure>; S],
    shard_busy: [bool; S],
    /// Claims whose answer was lost: the token and the member incarnation each claimed with.
    unanswered: [Option<(u8, Inc)>; S],
    /// The watch: an index into each object's history, and when the member records' versions
    /// shown were first received.
    view_members: [u8; N],
    view_members_at: [u8; N],
    view_shards: [u8; S],
    /// Member versions first received by a read, and when.
    read_at: [Option<(u16, u8)>; N],
}

impl Proc {
    fn new(gen: u8) -> Self {
        Proc {
            life: Life::Up,
            gen,
            lag: false,
            member: None,
            member_busy: false,
            shards: [None; S],
            shard_busy: [false; S],
            unanswered: [None; S],
            view_members: [0; N],
            view_members_at: [0; N],
            view_shards: [0; S],
            read_at: [None; N],
        }
    }

    fn runs(&self) -> bool {
        matches!(self.life, Life::Up | Life::Frozen)
    }

    /// The member tenure that lives at `now` by this process's clock.
    fn live_member(&self, now: u8) -> Option<MemberTenure> {
        self.member.filter(|m| now < m.deadline)
    }

    /// Its live tenure of shard `s` at `now`.
    fn holds(&self, s: usize, now: u8) -> Option<ShardTenure> {
        let member = self.live_member(now)?;
        self.shards[s].filter(|t| t.inc == member.inc)
    }
}

// ---------------------------------------------------------------------------------------------
// Messages

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Req {
    MemberClaim {
        expect: Option<u16>,
    },
    MemberRenew {
        expect: u16,
    },
    MemberRelease {
        expect: u16,
    },
    /// A leaving node releases its member record listing its shards.
    Retire {
        expect: u16,
        list: Vec<Entry>,
    },
    /// A contender judging shard `s` releases an expired member record `member`, listing its
    /// planned targets.
    Confirm {
        s: u8,
        member: u8,
        expect: u16,
        list: Vec<Entry>,
    },
    /// A claim (`rebind`: the later write of a tenure taken up without one).
    ShardClaim {
        s: u8,
        expect: Option<u16>,
        token: u8,
        inc: Inc,
        rebind: bool,
    },
    ShardRelease {
        s: u8,
        expect: u16,
        token: u8,
    },
}

impl Req {
    fn slot(&self) -> u8 {
        match self {
            Req::ShardClaim { s, .. } | Req::ShardRelease { s, .. } | Req::Confirm { s, .. } => *s,
            _ => MEMBER,
        }
    }
}

/// What a write answers: the version written and the member incarnation it made (`None`: a
/// compare-and-swap that failed).
type Answer = Option<(u16, Option<Inc>)>;

/// A request or an answer that is late: parked until the checker delivers it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Parked {
    node: u8,
    gen: u8,
    sent: u8,
    req: Req,
    /// `None` until it landed.
    answer: Option<Answer>,
    /// The slot (a shard, or the member lease) the request keeps busy.
    busy: Option<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Fate {
    Normal,
    LateRequest,
    LateAnswer,
    LostAnswer,
}

// ---------------------------------------------------------------------------------------------
// The state

/// A violation seen at the moment it happened (a token or a release), kept for the properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Bad {
    TokenRepeated { shard: u8, token: u8 },
    StaleFree { shard: u8 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u8,
    faults: u8,
    releases: u8,
    uids: u8,
    /// Each object's history, oldest first (kept from the oldest version a watch still shows).
    members: [Vec<Option<MemberObj>>; N],
    shards: [Vec<Option<ShardObj>>; S],
    procs: [Proc; N],
    parked: Vec<Parked>,
    /// The highest token any tenure of each shard started with.
    granted: [u8; S],
    bad: Option<Bad>,
}

impl State {
    fn member(&self, m: usize) -> Option<&MemberObj> {
        self.members[m].last().and_then(Option::as_ref)
    }

    fn shard(&self, s: usize) -> Option<&ShardObj> {
        self.shards[s].last().and_then(Option::as_ref)
    }

    /// The record of member `m` as node `n`'s watch shows it, with when it first received it.
    fn member_in_view(&self, n: usize, m: usize) -> (Option<&MemberObj>, u8) {
        let p = &self.procs[n];
        let index = p.view_members[m] as usize;
        (self.members[m][index].as_ref(), p.view_members_at[m])
    }

    fn shard_in_view(&self, n: usize, s: usize) -> Option<&ShardObj> {
        let index = self.procs[n].view_shards[s] as usize;
        self.shards[s][index].as_ref()
    }
}

// ---------------------------------------------------------------------------------------------
// The crate's decisions, called with the model's values

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn at(tick: u8) -> Instant {
    base() + Duration::from_secs(u64::from(tick))
}

fn owner(n: u8) -> String {
    format!("n{n}")
}

fn binding(n: u8, inc: Inc) -> Binding {
    Binding::new(format!("m{n}"), inc.name())
}

/// `protocol::member_verdict` on member `m`'s record `obj` (first received at `first_seen`) for
/// the incarnation `inc` held by `holder`, as record `s` would be judged by it.
#[allow(clippy::too_many_arguments)]
fn member_verdict(
    obj: Option<&MemberObj>,
    first_seen: u8,
    source: Source,
    inc: Inc,
    holder: u8,
    s: u8,
    now: u8,
    ttl: u8,
) -> MemberVerdict {
    let incarnation = inc.name();
    let holder = owner(holder);
    let Some(obj) = obj else {
        return protocol::member_verdict(None, source, &incarnation, &holder, at(now));
    };
    let obj_holder = obj.holder.map(owner);
    let obj_inc = obj.inc().map(Inc::name);
    let listed = obj
        .list
        .iter()
        .find(|e| e.inc == inc && e.shard == s)
        .map(|e| (owner(e.owner), binding(e.owner, e.to)));
    let seen = MemberSeen {
        holder: obj_holder.as_deref(),
        incarnation: obj_inc.as_deref(),
        expires_at: Some(at(first_seen.saturating_add(ttl))),
        listed: listed.as_ref().map(|(o, b)| (o.as_str(), b)),
    };
    protocol::member_verdict(Some(seen), source, &incarnation, &holder, at(now))
}

fn record_seen<'a>(
    holder: &'a Option<String>,
    token: u8,
    bound: &'a Option<Binding>,
) -> RecordSeen<'a> {
    RecordSeen {
        holder: holder.as_deref(),
        token: u64::from(token),
        binding: bound.as_ref(),
    }
}

/// `protocol::may_write_own`: may node `n`, whose tenure had `token`, write shard record `rec`,
/// while its live member incarnation is `live`?
fn may_write_own(rec: &ShardObj, n: u8, token: u8, live: Option<Inc>) -> bool {
    let holder = rec.holder.map(owner);
    let bound = rec.bound.map(|(m, inc)| binding(m, inc));
    let live = live.map(|inc| binding(n, inc));
    protocol::may_write_own(
        record_seen(&holder, rec.token, &bound),
        &owner(n),
        u64::from(token),
        live.as_ref(),
    )
}

/// `protocol::listable`: may member `m`'s incarnation `inc` list record `rec`?
fn listable(rec: Option<&ShardObj>, m: u8, inc: Inc) -> bool {
    let Some(rec) = rec else { return false };
    let holder = rec.holder.map(owner);
    let bound = rec.bound.map(|(b, i)| binding(b, i));
    protocol::listable(
        record_seen(&holder, rec.token, &bound),
        &owner(m),
        &binding(m, inc),
    )
}

fn claim_token(token: u8) -> u8 {
    let next = protocol::claim_token(u64::from(token)).expect("tokens stay small");
    u8::try_from(next).expect("tokens stay small")
}

// ---------------------------------------------------------------------------------------------
// The model

struct Protocol {
    config: Config,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// Time advances one tick (only once no step is left).
    Tick,
    /// A step of node `.0`'s lease `.1` (a shard, or [`MEMBER`]), its requests sent with `.2`.
    Step(u8, u8, Fate),
    /// Node `.0`'s watch receives the next version of object `.1` (members `0..N`, shards
    /// `N..N+S`).
    Deliver(u8, u8),
    /// Parked message `.0` arrives (a request lands, an answer is received).
    Unpark(usize),
    Crash(u8),
    Restart(u8),
    Freeze(u8),
    Thaw(u8),
    Lag(u8),
    Unlag(u8),
    /// Node `.0` leaves, handing its shards on (its write sent with `.1`).
    Leave(u8, Fate),
    /// Node `.0` releases shard `.1` (a rebalance).
    Release(u8, u8, Fate),
    /// Node `.0` removes its unanswered claim of shard `.1`.
    ReleaseUnanswered(u8, u8),
    /// Node `.0` rebinds shard `.1`, taken up without a write (the code before issue 47 did it
    /// 250 ms to 1 s after the take-up, off the move's path: whenever).
    Rebind(u8, u8, Fate),
}

/// What a shard step decided.
enum Decision {
    Nothing,
    Claim {
        expect: Option<u16>,
        token: u8,
    },
    TakeUp {
        ver: u16,
        token: u8,
    },
    Confirm {
        s: u8,
        member: u8,
        expect: u16,
        list: Vec<Entry>,
    },
}

impl Protocol {
    fn ttl(&self) -> u8 {
        self.config.ttl
    }

    fn rules(&self) -> Rules {
        self.config.rules
    }

    fn faults_allowed(&self, st: &State) -> bool {
        st.now < self.config.fault_until && st.faults < self.config.faults
    }

    // --- the store ----------------------------------------------------------------------------

    /// A write lands: the store applies it (compare-and-swap) and answers.
    fn land(&self, st: &mut State, node: u8, req: &Req) -> Answer {
        match req {
            Req::MemberClaim { expect } => {
                let n = node as usize;
                let current = st.member(n).cloned();
                if current.as_ref().map(|o| o.ver) != *expect {
                    return None;
                }
                let next = match current {
                    None => {
                        st.uids += 1;
                        MemberObj {
                            uid: st.uids,
                            ver: 1,
                            holder: Some(node),
                            n: 1,
                            list: Vec::new(),
                        }
                    }
                    Some(o) => MemberObj {
                        ver: o.ver + 1,
                        holder: Some(node),
                        n: o.n + 1,
                        ..o
                    },
                };
                let answer = (next.ver, next.inc());
                self.write_member(st, n, next);
                Some(answer)
            }
            Req::MemberRenew { expect } => {
                let n = node as usize;
                let o = st.member(n).cloned().filter(|o| o.ver == *expect)?;
                let next = MemberObj {
                    ver: o.ver + 1,
                    ..o
                };
                let answer = (next.ver, next.inc());
                self.write_member(st, n, next);
                Some(answer)
            }
            Req::MemberRelease { expect } | Req::Retire { expect, .. } => {
                let n = node as usize;
                let o = st.member(n).cloned().filter(|o| o.ver == *expect)?;
                let mut list = o.list.clone();
                if let Req::Retire { list: more, .. } = req {
                    list.extend(more.iter().copied());
                }
                let next = MemberObj {
                    ver: o.ver + 1,
                    holder: None,
                    list,
                    ..o
                };
                let answer = (next.ver, None);
                self.write_member(st, n, next);
                Some(answer)
            }
            Req::Confirm {
                member,
                expect,
                list,
                ..
            } => {
                let m = *member as usize;
                let o = st.member(m).cloned().filter(|o| o.ver == *expect)?;
                let mut all = o.list.clone();
                all.extend(list.iter().copied());
                let next = MemberObj {
                    ver: o.ver + 1,
                    holder: None,
                    list: all,
                    ..o
                };
                let answer = (next.ver, None);
                self.write_member(st, m, next);
                Some(answer)
            }
            Req::ShardClaim {
                s,
                expect,
                token,
                inc,
                ..
            } => {
                let s = *s as usize;
                let current = st.shard(s).copied();
                if current.map(|o| o.ver) != *expect {
                    return None;
                }
                let next = ShardObj {
                    ver: current.map_or(1, |o| o.ver + 1),
                    holder: Some(node),
                    token: *token,
                    bound: Some((node, *inc)),
                };
                self.write_shard(st, s, next);
                Some((next.ver, None))
            }
            Req::ShardRelease { s, expect, token } => {
                let s = *s as usize;
                let o = st.shard(s).copied().filter(|o| o.ver == *expect)?;
                // A release that lands on the version some other process holds frees a record
                // someone holds.
                let now = st.now;
                let held_by_other = st.procs.iter().enumerate().any(|(i, p)| {
                    i != node as usize
                        && p.runs()
                        && p.holds(s, now).is_some_and(|t| t.ver == *expect)
                });
                if held_by_other && st.bad.is_none() {
                    st.bad = Some(Bad::StaleFree { shard: s as u8 });
                }
                let next = ShardObj {
                    ver: o.ver + 1,
                    holder: None,
                    token: *token,
                    bound: None,
                };
                self.write_shard(st, s, next);
                Some((next.ver, None))
            }
        }
    }

    fn write_member(&self, st: &mut State, m: usize, obj: MemberObj) {
        st.members[m].push(Some(obj));
        let last = (st.members[m].len() - 1) as u8;
        let now = st.now;
        for p in st.procs.iter_mut() {
            if p.life == Life::Up && !p.lag {
                p.view_members[m] = last;
                p.view_members_at[m] = now;
            }
        }
    }

    fn write_shard(&self, st: &mut State, s: usize, obj: ShardObj) {
        st.shards[s].push(Some(obj));
        let last = (st.shards[s].len() - 1) as u8;
        for p in st.procs.iter_mut() {
            if p.life == Life::Up && !p.lag {
                p.view_shards[s] = last;
            }
        }
    }

    /// Drops the versions no watch shows any more, so that equal situations are equal states.
    fn compact(&self, st: &mut State) {
        for m in 0..N {
            let oldest = st
                .procs
                .iter()
                .filter(|p| p.runs())
                .map(|p| p.view_members[m])
                .min()
                .unwrap_or((st.members[m].len() - 1) as u8);
            if oldest > 0 {
                st.members[m].drain(..oldest as usize);
                for p in st.procs.iter_mut().filter(|p| p.runs()) {
                    p.view_members[m] -= oldest;
                }
            }
        }
        for s in 0..S {
            let oldest = st
                .procs
                .iter()
                .filter(|p| p.runs())
                .map(|p| p.view_shards[s])
                .min()
                .unwrap_or((st.shards[s].len() - 1) as u8);
            if oldest > 0 {
                st.shards[s].drain(..oldest as usize);
                for p in st.procs.iter_mut().filter(|p| p.runs()) {
                    p.view_shards[s] -= oldest;
                }
            }
        }
        st.parked.sort();
    }

    // --- sending and answers ---------------------------------------------------------------------

    fn send(&self, st: &mut State, node: u8, req: Req, fate: Fate) {
        let busy = req.slot();
        let gen = st.procs[node as usize].gen;
        let sent = st.now;
        if fate != Fate::Normal && !matches!(req, Req::Retire { .. }) {
            st.faults += 1;
        }
        self.set_busy(
            st,
            node,
            busy,
            fate != Fate::Normal && fate != Fate::LostAnswer,
        );
        match fate {
            Fate::Normal => {
                let answer = self.land(st, node, &req);
                self.answered(st, node, sent, &req, Some(answer));
            }
            Fate::LateRequest => st.parked.push(Parked {
                node,
                gen,
                sent,
                req,
                answer: None,
                busy: Some(busy),
            }),
            Fate::LateAnswer => {
                let answer = self.land(st, node, &req);
                st.parked.push(Parked {
                    node,
                    gen,
                    sent,
                    req,
                    answer: Some(answer),
                    busy: Some(busy),
                });
            }
            Fate::LostAnswer => {
                self.land(st, node, &req);
                self.answered(st, node, sent, &req, None);
            }
        }
    }

    fn set_busy(&self, st: &mut State, node: u8, slot: u8, busy: bool) {
        let p = &mut st.procs[node as usize];
        match slot {
            MEMBER => p.member_busy = busy,
            s if (s as usize) < S => p.shard_busy[s as usize] = busy,
            _ => {}
        }
    }

    /// Node `node` receives the answer to `req` (sent at `sent`); `None`: it never will.
    fn answered(&self, st: &mut State, node: u8, sent: u8, req: &Req, answer: Option<Answer>) {
        let now = st.now;
        let ttl = self.ttl();
        let rules = self.rules();
        let n = node as usize;
        match (req, answer) {
            (Req::MemberClaim { .. }, Some(Some((ver, Some(inc))))) => {
                let from = if rules.deadline_from_answer {
                    now
                } else {
                    sent
                };
                let deadline = from + ttl;
                if now >= deadline {
                    // Answered after its own validity: released (the member lease is not bound).
                    self.send(st, node, Req::MemberRelease { expect: ver }, Fate::Normal);
                    return;
                }
                st.procs[n].member = Some(MemberTenure {
                    inc,
                    deadline,
                    ver,
                    renewed: sent,
                });
            }
            (Req::MemberRenew { .. }, Some(Some((ver, Some(inc))))) => {
                let p = &mut st.procs[n];
                if let Some(m) = p
                    .member
                    .as_mut()
                    .filter(|m| m.inc == inc && now < m.deadline)
                {
                    let from = if rules.deadline_from_answer {
                        now
                    } else {
                        sent
                    };
                    m.deadline = m.deadline.max(from + ttl);
                    m.ver = ver;
                }
            }
            (Req::MemberRenew { .. }, Some(None)) => {
                // Read, and decide: still this tenure (a renewal whose answer was lost landed),
                // or lost.
                let current = st.member(n).cloned();
                let p = &mut st.procs[n];
                match (p.member.as_mut(), current) {
                    (Some(m), Some(o)) if o.holder == Some(node) && o.inc() == Some(m.inc) => {
                        m.ver = o.ver;
                    }
                    _ => p.member = None,
                }
            }
            (
                Req::ShardClaim {
                    s,
                    token,
                    inc,
                    rebind: false,
                    ..
                },
                Some(Some((ver, _))),
            ) => {
                let s = *s as usize;
                let live = st.procs[n].live_member(now);
                let kept_inc = if rules.keep_claim_of_any_member {
                    live.map(|m| m.inc)
                } else {
                    let live_binding = live.map(|m| binding(node, m.inc));
                    protocol::keep_bound_claim(&binding(node, *inc), live_binding.as_ref())
                        .then_some(*inc)
                };
                match kept_inc {
                    Some(inc) => self.start(st, node, s, *token, inc, ver, false),
                    None if rules.write_after_member_ended => {
                        // The code before issue 47: the abandoned claim is released.
                        self.send(
                            st,
                            node,
                            Req::ShardRelease {
                                s: s as u8,
                                expect: ver,
                                token: *token,
                            },
                            Fate::Normal,
                        );
                    }
                    None => {}
                }
            }
            (
                Req::ShardClaim {
                    s,
                    token,
                    inc,
                    rebind: false,
                    ..
                },
                None,
            ) => {
                st.procs[n].unanswered[*s as usize] = Some((*token, *inc));
            }
            (
                Req::ShardClaim {
                    s, rebind: true, ..
                },
                Some(answer),
            ) => {
                let s = *s as usize;
                let p = &mut st.procs[n];
                match answer {
                    Some((ver, _)) => {
                        if let Some(t) = p.shards[s].as_mut().filter(|t| t.taken) {
                            t.ver = ver;
                            t.taken = false;
                        }
                    }
                    None => p.shards[s] = None,
                }
            }
            _ => {}
        }
    }

    /// A tenure of shard `s` starts at node `node`.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        st: &mut State,
        node: u8,
        s: usize,
        token: u8,
        inc: Inc,
        ver: u16,
        taken: bool,
    ) {
        if token <= st.granted[s] && st.bad.is_none() {
            st.bad = Some(Bad::TokenRepeated {
                shard: s as u8,
                token,
            });
        }
        st.granted[s] = st.granted[s].max(token);
        st.procs[node as usize].shards[s] = Some(ShardTenure {
            token,
            inc,
            ver,
            taken,
        });
    }

    // --- the steps of a node ----------------------------------------------------------------------

    fn member_step(&self, st: &mut State, node: u8, fate: Fate) -> bool {
        let n = node as usize;
        let now = st.now;
        let p = &st.procs[n];
        if p.life != Life::Up || p.member_busy {
            return false;
        }
        match p.live_member(now) {
            None => {
                // Claim its own member record: free for this owner whoever of its names held it
                // (a restart under the same name claims it at once: a new incarnation).
                let expect = st.member(n).map(|o| o.ver);
                st.procs[n].member = None;
                self.send(st, node, Req::MemberClaim { expect }, fate);
                true
            }
            Some(m) if now >= m.renewed + self.config.renew_every => {
                st.procs[n].member.as_mut().expect("live").renewed = now;
                self.send(st, node, Req::MemberRenew { expect: m.ver }, fate);
                true
            }
            Some(_) => false,
        }
    }

    /// Judges member `m`'s incarnation `inc` held by `holder` for record `s`, from node `n`'s
    /// watch, reading the record when the watch cannot tell (the read is remembered): the
    /// verdict, and the version read (for a release of an expired one).
    #[allow(clippy::too_many_arguments)]
    fn judge_member(
        &self,
        st: &mut State,
        n: usize,
        m: u8,
        inc: Inc,
        holder: u8,
        s: u8,
    ) -> (MemberVerdict, Option<u16>) {
        let now = st.now;
        let ttl = self.ttl();
        let (obj, first_seen) = st.member_in_view(n, m as usize);
        let verdict = member_verdict(obj, first_seen, Source::Watch, inc, holder, s, now, ttl);
        if verdict != MemberVerdict::Unsure {
            return (verdict, None);
        }
        if self.rules().trust_watch_expiry {
            // Removed rule: an expiry the watch shows counts, without a read or a release.
            let holds = obj.is_some_and(|o| o.holder == Some(holder) && o.inc() == Some(inc));
            if holds {
                return (MemberVerdict::Over, None);
            }
        }
        // A read: the record as it is now, and when this process first received its version.
        let current = st.member(m as usize).cloned();
        let view_version = obj.map(|o| o.ver);
        let view_at = first_seen;
        let p = &mut st.procs[n];
        let first_seen = match &current {
            None => now,
            Some(o) => {
                let read = match p.read_at[m as usize] {
                    Some((ver, t)) if ver == o.ver => t,
                    _ => {
                        p.read_at[m as usize] = Some((o.ver, now));
                        now
                    }
                };
                if view_version == Some(o.ver) {
                    read.min(view_at)
                } else {
                    read
                }
            }
        };
        let verdict = member_verdict(
            current.as_ref(),
            first_seen,
            Source::Read,
            inc,
            holder,
            s,
            now,
            ttl,
        );
        (verdict, current.map(|o| o.ver))
    }

    /// Where the shards bound to member `m`'s expired incarnation `inc` go, as node `n`'s
    /// watch shows the group: each record it may list, to the first other node whose member
    /// lives in that view.
    fn plan(&self, st: &State, n: usize, m: u8, inc: Inc) -> Vec<Entry> {
        let now = st.now;
        let ttl = self.ttl();
        let target = (0..N as u8).filter(|&t| t != m).find_map(|t| {
            let (obj, at) = st.member_in_view(n, t as usize);
            let to = obj?.inc()?;
            let lives = matches!(
                member_verdict(obj, at, Source::Watch, to, t, u8::MAX, now, ttl),
                MemberVerdict::Lives { .. }
            );
            lives.then_some((t, to))
        });
        let Some((owner, to)) = target else {
            return Vec::new();
        };
        (0..S as u8)
            .filter(|&s| listable(st.shard_in_view(n, s as usize), m, inc))
            .map(|shard| Entry {
                inc,
                shard,
                owner,
                to,
            })
            .collect()
    }

    /// What node `n` decides about shard `s` it does not hold (its reads remembered).
    fn decide(&self, st: &mut State, n: usize, s: usize, live: MemberTenure) -> Decision {
        let node = n as u8;
        let rules = self.rules();
        let Some(rec) = st.shard_in_view(n, s).copied() else {
            return Decision::Claim {
                expect: None,
                token: 1,
            };
        };
        let (Some(holder), Some((m, inc))) = (rec.holder, rec.bound) else {
            return Decision::Claim {
                expect: Some(rec.ver),
                token: claim_token(rec.token),
            };
        };
        // A record of this owner bound to its live member tenure: its own claim (its answer
        // lost), claimed again.
        if holder == node && inc == live.inc {
            return Decision::Claim {
                expect: Some(rec.ver),
                token: claim_token(rec.token),
            };
        }
        let me_owner = owner(node);
        let me_binding = binding(node, live.inc);
        let me = Some((me_owner.as_str(), &me_binding));
        let (verdict, read) = self.judge_member(st, n, m, inc, holder, s as u8);
        if rules.take_up_without_write {
            if let MemberVerdict::Handed { owner: o, to } = &verdict {
                if *o == me_owner && *to == me_binding {
                    return Decision::TakeUp {
                        ver: rec.ver,
                        token: claim_token(rec.token),
                    };
                }
            }
        }
        let mut hops = 0;
        let step = match protocol::bound_record(&owner(holder), verdict, me) {
            Step::Target { owner: o, to } => {
                let target: u8 = o[1..].parse().expect("a node name");
                let to_inc = {
                    let (uid, n) = to.incarnation().split_once('/').expect("uid/n");
                    Inc {
                        uid: uid.parse().expect("a uid"),
                        n: n.parse().expect("a count"),
                    }
                };
                let (tv, tread) = self.judge_member(st, n, target, to_inc, target, s as u8);
                if rules.take_up_without_write {
                    hops = 1;
                }
                match protocol::handed_record(&o, tv) {
                    Step::Confirm => {
                        return Decision::Confirm {
                            s: s as u8,
                            member: target,
                            expect: tread.expect("a read"),
                            list: Vec::new(),
                        }
                    }
                    step => step,
                }
            }
            step => step,
        };
        match step {
            Step::Held { .. } => Decision::Nothing,
            Step::Claim => Decision::Claim {
                expect: Some(rec.ver),
                token: claim_token(rec.token) + hops,
            },
            Step::Confirm => Decision::Confirm {
                s: s as u8,
                member: m,
                expect: read.expect("a read"),
                list: self.plan(st, n, m, inc),
            },
            Step::Target { .. } | Step::Read => unreachable!("resolved above"),
        }
    }

    fn shard_step(&self, st: &mut State, node: u8, s: usize, fate: Fate) -> bool {
        let n = node as usize;
        let now = st.now;
        let p = &st.procs[n];
        if p.life != Life::Up || p.shard_busy[s] {
            return false;
        }
        if p.holds(s, now).is_some() {
            return false;
        }
        let Some(live) = p.live_member(now) else {
            return false;
        };
        if st.procs[n].shards[s].is_some() {
            // A tenure that ended with its member.
            st.procs[n].shards[s] = None;
        }
        let before = st.procs[n].read_at;
        match self.decide(st, n, s, live) {
            Decision::Nothing => st.procs[n].read_at != before,
            Decision::Claim { expect, token } => {
                self.send(
                    st,
                    node,
                    Req::ShardClaim {
                        s: s as u8,
                        expect,
                        token,
                        inc: live.inc,
                        rebind: false,
                    },
                    fate,
                );
                true
            }
            Decision::TakeUp { ver, token } => {
                self.start(st, node, s, token, live.inc, ver, true);
                true
            }
            Decision::Confirm {
                s,
                member,
                expect,
                list,
            } => {
                self.send(
                    st,
                    node,
                    Req::Confirm {
                        s,
                        member,
                        expect,
                        list,
                    },
                    fate,
                );
                true
            }
        }
    }

    /// Node `node` gives shard `s` up (its tenure ended locally first).
    fn release(&self, st: &mut State, node: u8, s: usize, fate: Fate) {
        let n = node as usize;
        let now = st.now;
        let t = st.procs[n].holds(s, now).expect("held");
        st.procs[n].shards[s] = None;
        if t.taken {
            // The code before issue 47: a tenure taken up and not rebound reads first, and
            // releases the record if it is still the version handed on, or its own.
            let Some(rec) = st.shard(s).copied() else {
                return;
            };
            if rec.ver == t.ver || (rec.holder == Some(node) && rec.token == t.token) {
                let req = Req::ShardRelease {
                    s: s as u8,
                    expect: rec.ver,
                    token: t.token,
                };
                self.send(st, node, req, fate);
            }
            return;
        }
        let own = ShardObj {
            ver: t.ver,
            holder: Some(node),
            token: t.token,
            bound: Some((node, t.inc)),
        };
        let live = st.procs[n].live_member(now).map(|m| m.inc);
        if self.rules().write_after_member_ended || may_write_own(&own, node, t.token, live) {
            let req = Req::ShardRelease {
                s: s as u8,
                expect: t.ver,
                token: t.token,
            };
            self.send(st, node, req, fate);
        }
    }

    fn release_unanswered(&self, st: &mut State, node: u8, s: usize) {
        let n = node as usize;
        let now = st.now;
        let Some((token, inc)) = st.procs[n].unanswered[s].take() else {
            return;
        };
        let Some(rec) = st.shard(s).copied() else {
            return;
        };
        let rules = self.rules();
        let write = if rules.release_unanswered_unchecked {
            true
        } else if rules.write_after_member_ended {
            // The code before issue 47: its own claim, and its member tenure live as the watch
            // shows it.
            let ours = rec.holder == Some(node) && rec.token == token;
            let (obj, first_seen) = st.member_in_view(n, n);
            let lives = obj.is_some_and(|o| {
                o.holder == Some(node) && o.inc() == Some(inc) && now < first_seen + self.ttl()
            });
            ours && lives
        } else {
            let live = st.procs[n].live_member(now).map(|m| m.inc);
            may_write_own(&rec, node, token, live)
        };
        if write {
            let req = Req::ShardRelease {
                s: s as u8,
                expect: rec.ver,
                token: rec.token,
            };
            self.send(st, node, req, Fate::Normal);
        }
    }

    fn leave(&self, st: &mut State, node: u8, fate: Fate) {
        let n = node as usize;
        let now = st.now;
        let Some(member) = st.procs[n].live_member(now) else {
            return;
        };
        // Every worker stops (its tenure ends here, nothing written), then one write lists each
        // shard the watch shows held by this incarnation, to the first other live member.
        let held: Vec<usize> = (0..S)
            .filter(|&s| st.procs[n].holds(s, now).is_some())
            .collect();
        let plan = self.plan(st, n, node, member.inc);
        let list: Vec<Entry> = plan
            .into_iter()
            .filter(|e| held.contains(&(e.shard as usize)))
            .collect();
        st.procs[n].shards = [None; S];
        self.send(
            st,
            node,
            Req::Retire {
                expect: member.ver,
                list,
            },
            fate,
        );
        st.procs[n] = Proc {
            life: Life::Gone,
            ..Proc::new(st.procs[n].gen)
        };
    }

    /// Whether some step must still be taken before time advances.
    fn urgent(&self, st: &State) -> bool {
        if self.steps_pending(st) {
            return true;
        }
        // Faults end: every message arrives, every process thaws, every watch catches up.
        st.now >= self.config.fault_until
            && (!st.parked.is_empty()
                || st.procs.iter().any(|p| {
                    p.life == Life::Frozen
                        || p.lag
                        || (p.life == Life::Up
                            && (0..S).any(|s| p.holds(s, st.now).is_some_and(|t| t.taken)))
                }))
    }

    /// Whether a node has a step to take (or a watch that does not lag, a change to receive).
    fn steps_pending(&self, st: &State) -> bool {
        for n in 0..N as u8 {
            let p = &st.procs[n as usize];
            if p.life != Life::Up {
                continue;
            }
            if !p.lag && self.catch_up_pending(st, n as usize) {
                return true;
            }
            for lease in (0..S as u8).chain([MEMBER]) {
                let mut next = st.clone();
                if self.step(&mut next, n, lease, Fate::Normal) && next != *st {
                    return true;
                }
            }
        }
        false
    }

    fn catch_up_pending(&self, st: &State, n: usize) -> bool {
        let p = &st.procs[n];
        (0..N).any(|m| (p.view_members[m] as usize) + 1 < st.members[m].len())
            || (0..S).any(|s| (p.view_shards[s] as usize) + 1 < st.shards[s].len())
    }

    fn step(&self, st: &mut State, node: u8, lease: u8, fate: Fate) -> bool {
        if lease == MEMBER {
            self.member_step(st, node, fate)
        } else {
            self.shard_step(st, node, lease as usize, fate)
        }
    }

    fn settled(&self, st: &State) -> bool {
        let now = st.now;
        let running = st
            .procs
            .iter()
            .any(|p| p.life == Life::Up && p.live_member(now).is_some());
        !running
            || (0..S).all(|s| {
                st.procs
                    .iter()
                    .any(|p| p.life == Life::Up && p.holds(s, now).is_some())
            })
    }

    fn fates(&self, st: &State) -> &'static [Fate] {
        if self.faults_allowed(st) {
            &[
                Fate::Normal,
                Fate::LateRequest,
                Fate::LateAnswer,
                Fate::LostAnswer,
            ]
        } else {
            &[Fate::Normal]
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    /// A settled fleet: every node holds its member record (renewed at tick 0), and shard `s`
    /// is held by node `s` with token 1, bound to its member tenure, but for the last `free`
    /// shards, released (token 1); every watch shows it all.
    fn init_states(&self) -> Vec<State> {
        let inc = |n: usize| Inc {
            uid: n as u8 + 1,
            n: 1,
        };
        let members = std::array::from_fn(|n| {
            vec![Some(MemberObj {
                uid: inc(n).uid,
                ver: 1,
                holder: Some(n as u8),
                n: 1,
                list: Vec::new(),
            })]
        });
        let held = S - usize::from(self.config.free);
        let shards = std::array::from_fn(|s| {
            vec![Some(if s < held {
                ShardObj {
                    ver: 1,
                    holder: Some(s as u8),
                    token: 1,
                    bound: Some((s as u8, inc(s))),
                }
            } else {
                ShardObj {
                    ver: 1,
                    holder: None,
                    token: 1,
                    bound: None,
                }
            })]
        });
        let procs = std::array::from_fn(|n| {
            let mut p = Proc::new(0);
            p.member = Some(MemberTenure {
                inc: inc(n),
                deadline: self.ttl(),
                ver: 1,
                renewed: 0,
            });
            if n < held {
                p.shards[n] = Some(ShardTenure {
                    token: 1,
                    inc: inc(n),
                    ver: 1,
                    taken: false,
                });
            }
            p
        });
        vec![State {
            now: 0,
            faults: 0,
            releases: 0,
            uids: N as u8,
            members,
            shards,
            procs,
            parked: Vec::new(),
            granted: [1; S],
            bad: None,
        }]
    }

    fn actions(&self, st: &State, actions: &mut Vec<Action>) {
        if st.bad.is_some() && !self.config.overlap_only {
            return;
        }
        // Within a tick every node takes every step it can, in every order (and a watch that
        // does not lag catches up). Everything else comes between those steps, once none is
        // left: a fault that is an event of its own (a crash, a freeze, a lagging watch, a leave,
        // a release: one before a node's renewal in a tick is the same as one at the end of the
        // tick before), a late message arriving, a lagging watch receiving, a heal, and the tick.
        // A fault of a message (late, or its answer lost) is chosen at its send.
        if self.steps_pending(st) {
            for n in 0..N as u8 {
                let p = &st.procs[n as usize];
                if p.life != Life::Up {
                    continue;
                }
                // The member lease's own requests are late only where the configuration says so:
                // otherwise a member tenure ends at its holder by a freeze or a crash.
                actions.push(Action::Step(n, MEMBER, Fate::Normal));
                if self.config.member_faults && self.faults_allowed(st) {
                    actions.push(Action::Step(n, MEMBER, Fate::LateAnswer));
                    actions.push(Action::Step(n, MEMBER, Fate::LateRequest));
                }
                for lease in 0..S as u8 {
                    for &fate in self.fates(st) {
                        actions.push(Action::Step(n, lease, fate));
                    }
                }
                if !p.lag {
                    for object in 0..(N + S) as u8 {
                        actions.push(Action::Deliver(n, object));
                    }
                }
            }
            return;
        }
        let faults = self.faults_allowed(st);
        for n in 0..N as u8 {
            let p = &st.procs[n as usize];
            match p.life {
                Life::Up => {
                    if p.lag {
                        for object in 0..(N + S) as u8 {
                            actions.push(Action::Deliver(n, object));
                        }
                        actions.push(Action::Unlag(n));
                    }
                    if faults {
                        actions.push(Action::Crash(n));
                        actions.push(Action::Freeze(n));
                        if !p.lag {
                            actions.push(Action::Lag(n));
                        }
                        actions.push(Action::Leave(n, Fate::Normal));
                        actions.push(Action::Leave(n, Fate::LateRequest));
                    }
                    if st.now < self.config.fault_until && st.releases < self.config.releases {
                        for s in 0..S as u8 {
                            for &fate in self.fates(st) {
                                actions.push(Action::Release(n, s, fate));
                            }
                        }
                    }
                    for s in 0..S as u8 {
                        if p.unanswered[s as usize].is_some() {
                            actions.push(Action::ReleaseUnanswered(n, s));
                        }
                        if p.holds(s as usize, st.now).is_some_and(|t| t.taken)
                            && !p.shard_busy[s as usize]
                        {
                            for &fate in self.fates(st) {
                                actions.push(Action::Rebind(n, s, fate));
                            }
                        }
                    }
                }
                Life::Frozen => actions.push(Action::Thaw(n)),
                Life::Down if st.now < self.config.fault_until => actions.push(Action::Restart(n)),
                _ => {}
            }
        }
        for i in 0..st.parked.len() {
            actions.push(Action::Unpark(i));
        }
        if st.now < self.config.horizon && !self.urgent(st) {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut st = last.clone();
        let now = st.now;
        match action {
            Action::Tick => st.now += 1,
            Action::Step(n, lease, fate) => {
                if !self.step(&mut st, n, lease, fate) {
                    return None;
                }
                // A fate that no message took is the step without it.
                if fate != Fate::Normal && st.faults == last.faults {
                    return None;
                }
            }
            Action::Deliver(n, object) => {
                // The watch catches up with the object (a lagging watch skips no change's
                // effect: each version it shows was the object's at some point).
                let p = &mut st.procs[n as usize];
                let o = object as usize;
                if o < N {
                    let last = (st.members[o].len() - 1) as u8;
                    if p.view_members[o] == last {
                        return None;
                    }
                    p.view_members[o] = last;
                    p.view_members_at[o] = now;
                } else {
                    let s = o - N;
                    let last = (st.shards[s].len() - 1) as u8;
                    if p.view_shards[s] == last {
                        return None;
                    }
                    p.view_shards[s] = last;
                }
            }
            Action::Unpark(i) => {
                let mut msg = st.parked.remove(i);
                let receiver = &st.procs[msg.node as usize];
                let alive = receiver.gen == msg.gen && receiver.runs();
                if msg.answer.is_none() {
                    msg.answer = Some(self.land(&mut st, msg.node, &msg.req));
                }
                if !alive {
                    // Nobody to answer (crashed, left): dropped.
                } else if st.procs[msg.node as usize].life == Life::Frozen {
                    // Landed; the answer waits for the process to thaw.
                    st.parked.push(msg);
                } else {
                    if let Some(slot) = msg.busy {
                        self.set_busy(&mut st, msg.node, slot, false);
                    }
                    self.answered(&mut st, msg.node, msg.sent, &msg.req, msg.answer);
                }
            }
            Action::Crash(n) => {
                st.faults += 1;
                let gen = st.procs[n as usize].gen;
                st.procs[n as usize] = Proc {
                    life: Life::Down,
                    ..Proc::new(gen)
                };
            }
            Action::Restart(n) => {
                let gen = st.procs[n as usize].gen + 1;
                let mut p = Proc::new(gen);
                // It lists the group: its watch starts at each object as it is now.
                for m in 0..N {
                    p.view_members[m] = (st.members[m].len() - 1) as u8;
                    p.view_members_at[m] = now;
                }
                for s in 0..S {
                    p.view_shards[s] = (st.shards[s].len() - 1) as u8;
                }
                st.procs[n as usize] = p;
            }
            Action::Freeze(n) => {
                st.faults += 1;
                st.procs[n as usize].life = Life::Frozen;
            }
            Action::Thaw(n) => st.procs[n as usize].life = Life::Up,
            Action::Lag(n) => {
                st.faults += 1;
                st.procs[n as usize].lag = true;
            }
            Action::Unlag(n) => st.procs[n as usize].lag = false,
            Action::Leave(n, fate) => {
                if st.procs[n as usize].live_member(now).is_none()
                    || st.procs[n as usize].member_busy
                {
                    return None;
                }
                st.faults += 1;
                self.leave(&mut st, n, fate);
            }
            Action::Release(n, s, fate) => {
                let p = &st.procs[n as usize];
                if p.holds(s as usize, now).is_none() || p.shard_busy[s as usize] {
                    return None;
                }
                st.releases += 1;
                self.release(&mut st, n, s as usize, fate);
                if fate != Fate::Normal && st.faults == last.faults {
                    return None;
                }
            }
            Action::Rebind(n, s, fate) => {
                let p = &st.procs[n as usize];
                let t = p.holds(s as usize, now).filter(|t| t.taken)?;
                self.send(
                    &mut st,
                    n,
                    Req::ShardClaim {
                        s,
                        expect: Some(t.ver),
                        token: t.token,
                        inc: t.inc,
                        rebind: true,
                    },
                    fate,
                );
                if fate != Fate::Normal && st.faults == last.faults {
                    return None;
                }
            }
            Action::ReleaseUnanswered(n, s) => {
                if st.procs[n as usize].shard_busy[s as usize] {
                    return None;
                }
                self.release_unanswered(&mut st, n, s as usize);
            }
        }
        self.compact(&mut st);
        (st != *last).then_some(st)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one holder", |_, st: &State| {
                (0..S).all(|s| {
                    st.procs
                        .iter()
                        .filter(|p| p.runs() && p.holds(s, st.now).is_some())
                        .count()
                        <= 1
                })
            }),
            Property::always("tokens rise", |model: &Protocol, st: &State| {
                model.config.overlap_only || !matches!(st.bad, Some(Bad::TokenRepeated { .. }))
            }),
            Property::always("no stale free", |model: &Protocol, st: &State| {
                model.config.overlap_only || !matches!(st.bad, Some(Bad::StaleFree { .. }))
            }),
            Property::always("settled", |model: &Protocol, st: &State| {
                model.config.overlap_only
                    || st.now < model.config.horizon
                    || model.urgent(st)
                    || model.settled(st)
            }),
        ]
    }
}

// ---------------------------------------------------------------------------------------------
// The checks

/// Checks `config` exhaustively (depth first, on every core), prints the states it explored
/// as configuration `name`, and asserts every property: the checker, and what it found.
fn check(name: &str, config: Config) -> impl Checker<Protocol> {
    let started = std::time::Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let checker = Protocol { config }.checker().threads(threads).spawn_dfs();
    let checker = if std::env::var_os("MODEL_PROGRESS").is_some() {
        checker.join_and_report(&mut stateright::report::WriteReporter::new(
            &mut std::io::stderr(),
        ))
    } else {
        checker.join()
    };
    eprintln!(
        "protocol model ({name}): {} states ({} unique), depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    checker.assert_properties();
    checker
}

/// One step of a path, as a sentence.
fn describe(action: &Action) -> String {
    let fate = |fate: &Fate| match fate {
        Fate::Normal => "",
        Fate::LateRequest => " (the request lands late)",
        Fate::LateAnswer => " (its answer comes late)",
        Fate::LostAnswer => " (its answer is lost)",
    };
    let lease = |lease: u8| match lease {
        MEMBER => "its member record".to_owned(),
        s => format!("shard {s}"),
    };
    match action {
        Action::Tick => "— a tick passes —".to_owned(),
        Action::Step(n, l, f) => format!("n{n} acts on {}{}", lease(*l), fate(f)),
        Action::Deliver(n, o) if (*o as usize) < N => {
            format!("n{n}'s watch receives member record m{o}")
        }
        Action::Deliver(n, o) => format!("n{n}'s watch receives shard {}", *o as usize - N),
        Action::Unpark(i) => format!("late message {i} arrives"),
        Action::Crash(n) => format!("n{n} crashes"),
        Action::Restart(n) => format!("n{n} restarts under its name"),
        Action::Freeze(n) => format!("n{n} freezes"),
        Action::Thaw(n) => format!("n{n} thaws"),
        Action::Lag(n) => format!("n{n}'s watch starts lagging"),
        Action::Unlag(n) => format!("n{n}'s watch stops lagging"),
        Action::Leave(n, f) => format!("n{n} leaves, listing its shards{}", fate(f)),
        Action::Release(n, s, f) => format!("n{n} releases shard {s}{}", fate(f)),
        Action::ReleaseUnanswered(n, s) => {
            format!("n{n} releases its unanswered claim of shard {s}")
        }
        Action::Rebind(n, s, f) => format!("n{n} rebinds shard {s}{}", fate(f)),
    }
}

/// Checks `config` until the first violation: its name and the steps that lead to it.
fn first_violation(config: Config) -> Option<(&'static str, String)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let checker = Protocol { config }
        .checker()
        .threads(threads)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let discoveries = checker.discoveries();
    let (name, path) = discoveries.into_iter().next()?;
    let steps: Vec<String> = path.into_actions().iter().map(describe).collect();
    Some((name, steps.join("\n")))
}

/// The crate's rules keep one holder, rising tokens and no stale free in every interleaving of
/// the small configuration, and every shard is held again once faults stop.
#[test]
fn every_interleaving_of_three_nodes_and_two_shards_keeps_one_holder_with_rising_tokens() {
    let checker = check("small", configured(Config::small()));
    assert!(
        checker.unique_state_count() > 1_000_000,
        "the model explores the whole space: {} states",
        checker.unique_state_count()
    );
}

/// The same with a shard released (a rebalance) among the faults.
#[test]
fn every_interleaving_with_a_release_keeps_one_holder_with_rising_tokens() {
    let checker = check(
        "small, with a release",
        configured(Config::small_with_a_release()),
    );
    assert!(
        checker.unique_state_count() > 50_000,
        "the model explores the whole space: {} states",
        checker.unique_state_count()
    );
}

/// The larger configuration (`scripts/bench.sh model`: 338,402,547 distinct states, 43 minutes
/// on two cores in a release build at load 3-4): two faults and a release in the first four ticks.
#[test]
#[ignore = "minutes of CPU: run by scripts/bench.sh model"]
fn every_interleaving_of_the_large_configuration() {
    check("large", configured(Config::large()));
}

/// Asserts that removing `rules` is caught in the small configuration, by a violation of one
/// of `expected`.
fn caught(rules: Rules, expected: &[&str]) {
    caught_in(configured(Config::small()), rules, expected);
}

fn caught_in(config: Config, rules: Rules, expected: &[&str]) {
    let started = std::time::Instant::now();
    let (name, path) = first_violation(config.with(rules))
        .unwrap_or_else(|| panic!("removing {rules:?} was not caught"));
    eprintln!(
        "removing {rules:?}: {name} violated after {:.1} s:\n{path}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        expected.contains(&name),
        "removing {rules:?} violated {name}, expected one of {expected:?}"
    );
}

/// The code before issue 47 (a take-up without a write, abandoned and unanswered claims
/// released all the same): the model finds two holders with one token (paths 1-4 and item 8).
#[test]
fn the_code_before_issue_47_is_caught() {
    caught(
        Rules {
            take_up_without_write: true,
            write_after_member_ended: true,
            ..Rules::default()
        },
        &["tokens rise", "one holder", "no stale free"],
    );
}

/// Issue 47, item 9 (a shard run on two nodes at once, with tokens 17 and 18): under the code
/// before issue 47, the first overlap of two holders the model finds. The explanation is in the
/// README ("The protocol, checked").
#[test]
fn item_9_two_holders_at_once_under_the_code_before_issue_47() {
    let config = Config {
        overlap_only: true,
        ..configured(Config::small())
    };
    caught_in(
        config,
        Rules {
            take_up_without_write: true,
            write_after_member_ended: true,
            ..Rules::default()
        },
        &["one holder"],
    );
}

/// Rule 1 alone removed: a listed target takes its shard up without a write. The stale write
/// that then lands on the version it holds is the old holder's release, sent before its member
/// tenure ended but arriving late: a release among the faults.
#[test]
fn a_removed_rule_take_up_without_a_write_is_caught() {
    let config = Config {
        releases: 1,
        ..configured(Config::small())
    };
    caught_in(
        config,
        Rules {
            take_up_without_write: true,
            ..Rules::default()
        },
        &["tokens rise", "one holder", "no stale free"],
    );
}

/// Rule 2 removed: a member counted expired from the watch alone.
#[test]
fn a_removed_rule_expiry_confirmed_by_a_read_is_caught() {
    caught(
        Rules {
            trust_watch_expiry: true,
            ..Rules::default()
        },
        &["one holder", "tokens rise"],
    );
}

/// The holder's deadline from the send of its write, removed: counted from the answer (a
/// member renewal's answer may come late here).
#[test]
fn a_removed_rule_deadline_from_the_send_is_caught() {
    // A TTL of three ticks: an answer can then come a tick late and still before the last
    // deadline, and the next renewal can be late besides.
    let config = Config {
        ttl: 3,
        fault_until: 4,
        horizon: 9,
        member_faults: true,
        ..configured(Config::small())
    };
    caught_in(
        config,
        Rules {
            deadline_from_answer: true,
            ..Rules::default()
        },
        &["one holder", "tokens rise"],
    );
}

/// Rule 3 removed (the claim's member tenure judged at its answer): a claim answered under a
/// newer member tenure kept.
#[test]
fn a_removed_rule_claim_kept_only_under_its_own_member_tenure_is_caught() {
    caught(
        Rules {
            keep_claim_of_any_member: true,
            ..Rules::default()
        },
        &["one holder", "tokens rise"],
    );
}

/// Rule 3 removed (a holder writes only as that holder): an unanswered claim released over
/// whatever is read.
#[test]
fn a_removed_rule_unanswered_release_only_of_its_own_claim_is_caught() {
    caught(
        Rules {
            release_unanswered_unchecked: true,
            ..Rules::default()
        },
        &["no stale free", "one holder", "tokens rise"],
    );
}

/// The configuration of the `MODEL_*` variables over `base` (for trying others by hand).
fn configured(base: Config) -> Config {
    let var = |name: &str, default: u8| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    Config {
        ttl: var("MODEL_TTL", base.ttl),
        renew_every: var("MODEL_RENEW_EVERY", base.renew_every),
        free: var("MODEL_FREE", base.free),
        fault_until: var("MODEL_FAULT_UNTIL", base.fault_until),
        horizon: var("MODEL_HORIZON", base.horizon),
        faults: var("MODEL_FAULTS", base.faults),
        releases: var("MODEL_RELEASES", base.releases),
        ..base
    }
}
