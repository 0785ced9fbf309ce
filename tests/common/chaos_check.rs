//! The chaos harness's verdicts and figures as plain functions of the nodes' event logs: no server,
//! no process. The harness (`chaos.rs`) calls them after a run; `tests/chaos_checker.rs` feeds them
//! hand-written logs to show that each verdict fails on the violation it exists for.
//!
//! Each node (`examples/singleton_node.rs`) logs, per singleton instance, JSON lines with the
//! owner, the tenure's fencing token and `t_ns`: `start` (the singleton actor started), `tick`
//! (a 50 ms timer callback ran; its timestamp is taken first), `act` (the same tick, when the
//! tenure's guard allowed the step; same timestamp) and `stop` (the actor stopped).
//!
//! The verdicts:
//! - [`check_steps`]: acting tenures (owner, token: first `act` .. last `act`) never overlap or
//!   touch, and the fencing token rises from one to the next;
//! - [`check_lifetimes`]: the singletons themselves never run at once: no two tenures' *lifetimes*
//!   (from the `start` event to the last `tick`, whether the guard allowed it or not) overlap.
//!   A `stop` may come later (a resumed node's actor stops after another node started, which is
//!   fine as long as it ran nothing in between), so it does not count;
//! - [`check_no_tick_after_takeover`]: no singleton ticks at or after the first step of a tenure
//!   with a higher token;
//! - [`check_resumed`]: a holder frozen past its TTL runs nothing (no tick, no step) under its old
//!   token once resumed.
//!
//! [`check_run`] runs them all.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What a node logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// The singleton actor started.
    Start,
    /// A timer callback of the singleton ran (logged before its guard was checked).
    Tick,
    /// The tick's guard allowed the step.
    Act,
    /// The singleton actor stopped.
    Stop,
}

impl EventKind {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "start" => Self::Start,
            "tick" => Self::Tick,
            "act" => Self::Act,
            "stop" => Self::Stop,
            _ => return None,
        })
    }
}

/// One line of a node's event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    pub owner: String,
    pub kind: EventKind,
    pub token: u64,
    pub t_ns: u128,
}

impl NodeEvent {
    pub fn new(owner: &str, kind: EventKind, token: u64, t_ns: u128) -> Self {
        Self {
            owner: owner.to_owned(),
            kind,
            token,
            t_ns,
        }
    }

    /// Whether the singleton ran code (a tick, with or without a step).
    pub fn ran(&self) -> bool {
        matches!(self.kind, EventKind::Tick | EventKind::Act)
    }
}

/// The events of one log's text, in file order; lines that do not parse (one cut by SIGKILL) are
/// skipped.
pub fn parse_events(text: &str) -> Vec<NodeEvent> {
    text.lines()
        .filter_map(|line| {
            let v = serde_json::from_str::<serde_json::Value>(line).ok()?;
            Some(NodeEvent {
                owner: v["owner"].as_str()?.to_owned(),
                kind: EventKind::parse(v["event"].as_str()?)?,
                token: v["token"].as_u64()?,
                t_ns: v["t_ns"]
                    .as_u64()
                    .map(u128::from)
                    .or_else(|| v["t_ns"].as_str().and_then(|s| s.parse().ok()))?,
            })
        })
        .collect()
}

/// The events of every log, sorted by time (stable: a tick stays before its act).
pub fn read_events(paths: &[PathBuf]) -> Vec<NodeEvent> {
    let mut events: Vec<NodeEvent> = paths
        .iter()
        .flat_map(|p| parse_events(&std::fs::read_to_string(p).unwrap_or_default()))
        .collect();
    events.sort_by_key(|e| e.t_ns);
    events
}

/// The interval in which one owner acted under one token (its `act` events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenure {
    pub owner: String,
    pub token: u64,
    pub first_ns: u128,
    pub last_ns: u128,
    pub steps: usize,
}

/// The acting tenures, sorted by their first step.
pub fn tenures(events: &[NodeEvent]) -> Vec<Tenure> {
    let mut by_key: BTreeMap<(&str, u64), Tenure> = BTreeMap::new();
    for e in events.iter().filter(|e| e.kind == EventKind::Act) {
        by_key
            .entry((&e.owner, e.token))
            .and_modify(|t| {
                t.first_ns = t.first_ns.min(e.t_ns);
                t.last_ns = t.last_ns.max(e.t_ns);
                t.steps += 1;
            })
            .or_insert(Tenure {
                owner: e.owner.clone(),
                token: e.token,
                first_ns: e.t_ns,
                last_ns: e.t_ns,
                steps: 1,
            });
    }
    let mut tenures: Vec<Tenure> = by_key.into_values().collect();
    tenures.sort_by_key(|t| (t.first_ns, t.token));
    tenures
}

/// The lifetime of one owner's singleton under one token: from its `start` (or, if that line
/// was lost, its first tick) to its last tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifetime {
    pub owner: String,
    pub token: u64,
    pub start_ns: u128,
    /// The last tick (the start if it never ticked).
    pub end_ns: u128,
    pub ticks: usize,
}

/// The singletons' lifetimes, sorted by start.
pub fn lifetimes(events: &[NodeEvent]) -> Vec<Lifetime> {
    let mut by_key: BTreeMap<(&str, u64), Lifetime> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Start | EventKind::Tick))
    {
        let l = by_key.entry((&e.owner, e.token)).or_insert(Lifetime {
            owner: e.owner.clone(),
            token: e.token,
            start_ns: e.t_ns,
            end_ns: e.t_ns,
            ticks: 0,
        });
        l.start_ns = l.start_ns.min(e.t_ns);
        if e.kind == EventKind::Tick {
            l.end_ns = l.end_ns.max(e.t_ns);
            l.ticks += 1;
        }
    }
    let mut lifetimes: Vec<Lifetime> = by_key.into_values().collect();
    lifetimes.sort_by_key(|l| (l.start_ns, l.token));
    lifetimes
}

/// A fault that froze a node (SIGSTOP at `stopped_ns`, SIGCONT the instant after `resumed_ns`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pause {
    pub owner: String,
    pub stopped_ns: u128,
    pub resumed_ns: u128,
}

/// A safety violation found in a run's event logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Two acting tenures overlap or touch: the later one's first step is not after the earlier
    /// one's last step.
    StepsOverlap {
        earlier: Box<Tenure>,
        later: Box<Tenure>,
    },
    /// The tenure that acted next did not have a higher fencing token.
    TokenNotRising {
        earlier: Box<Tenure>,
        later: Box<Tenure>,
    },
    /// Two singletons were alive at once: the later one started before (or when) the earlier one
    /// ran its last tick.
    LifetimesOverlap {
        earlier: Box<Lifetime>,
        later: Box<Lifetime>,
    },
    /// A singleton ran a tick at or after the first step of a tenure with a higher token.
    TickAfterTakeover {
        owner: String,
        token: u64,
        tick_ns: u128,
        by_owner: String,
        by_token: u64,
        first_step_ns: u128,
    },
    /// A holder frozen past its TTL ran ticks or steps under its old token after it was resumed.
    RanAfterResume {
        owner: String,
        token: u64,
        resumed_ns: u128,
        runs: usize,
        first_ns: u128,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StepsOverlap { earlier: a, later: b } => write!(
                f,
                "steps overlap: {} (token {}) acted until {} but {} (token {}) acted from {}",
                a.owner, a.token, a.last_ns, b.owner, b.token, b.first_ns
            ),
            Self::TokenNotRising { earlier: a, later: b } => write!(
                f,
                "token not rising: {} acted with token {} after {} acted with token {}",
                b.owner, b.token, a.owner, a.token
            ),
            Self::LifetimesOverlap { earlier: a, later: b } => write!(
                f,
                "singletons alive at once: {} (token {}) ticked until {} but {} (token {}) started at {}",
                a.owner, a.token, a.end_ns, b.owner, b.token, b.start_ns
            ),
            Self::TickAfterTakeover {
                owner,
                token,
                tick_ns,
                by_owner,
                by_token,
                first_step_ns,
            } => write!(
                f,
                "{owner} (token {token}) ticked at {tick_ns}, after {by_owner} acted with the higher token {by_token} from {first_step_ns}"
            ),
            Self::RanAfterResume {
                owner,
                token,
                resumed_ns,
                runs,
                first_ns,
            } => write!(
                f,
                "{owner} ran {runs} ticks or steps with its old token {token} after it was resumed at {resumed_ns} (the first at {first_ns})"
            ),
        }
    }
}

/// Acting tenures never overlap or touch, and their tokens rise.
///
/// Tenures sorted by first step overlap somewhere only if two consecutive ones do (the later's
/// first step is before the earlier's last), so comparing neighbours finds every overlap,
/// nested ones included.
pub fn check_steps(tenures: &[Tenure]) -> Result<(), Violation> {
    let mut sorted = tenures.to_vec();
    sorted.sort_by_key(|t| (t.first_ns, t.token));
    for pair in sorted.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.first_ns <= a.last_ns {
            return Err(Violation::StepsOverlap {
                earlier: Box::new(a.clone()),
                later: Box::new(b.clone()),
            });
        }
    }
    for pair in sorted.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.token <= a.token {
            return Err(Violation::TokenNotRising {
                earlier: Box::new(a.clone()),
                later: Box::new(b.clone()),
            });
        }
    }
    Ok(())
}

/// No two singletons (distinct owner or token) were alive at once: each lifetime ends (last tick)
/// before the next one starts. The same neighbour argument as in [`check_steps`] applies.
pub fn check_lifetimes(lifetimes: &[Lifetime]) -> Result<(), Violation> {
    let mut sorted = lifetimes.to_vec();
    sorted.sort_by_key(|l| (l.start_ns, l.token));
    for pair in sorted.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.start_ns <= a.end_ns {
            return Err(Violation::LifetimesOverlap {
                earlier: Box::new(a.clone()),
                later: Box::new(b.clone()),
            });
        }
    }
    Ok(())
}

/// No singleton ticks (with or without a step) at or after the first step of a tenure with a
/// higher token: once a newer tenure acted, an older singleton runs nothing any more.
pub fn check_no_tick_after_takeover(events: &[NodeEvent]) -> Result<(), Violation> {
    let tenures = tenures(events);
    for tick in events.iter().filter(|e| e.kind == EventKind::Tick) {
        if let Some(newer) = tenures
            .iter()
            .filter(|t| t.token > tick.token && t.first_ns <= tick.t_ns)
            .min_by_key(|t| t.first_ns)
        {
            return Err(Violation::TickAfterTakeover {
                owner: tick.owner.clone(),
                token: tick.token,
                tick_ns: tick.t_ns,
                by_owner: newer.owner.clone(),
                by_token: newer.token,
                first_step_ns: newer.first_ns,
            });
        }
    }
    Ok(())
}

/// A holder frozen from `stopped_ns` to `resumed_ns` (past its TTL) ran no tick and no step under
/// the token it last acted with before the freeze, once resumed. (A node that had not acted
/// before the freeze held nothing to check.)
pub fn check_resumed(events: &[NodeEvent], pause: &Pause) -> Result<(), Violation> {
    let Some(token) = events
        .iter()
        .filter(|e| e.owner == pause.owner && e.kind == EventKind::Act && e.t_ns < pause.stopped_ns)
        .map(|e| e.token)
        .max()
    else {
        return Ok(());
    };
    let late: Vec<&NodeEvent> = events
        .iter()
        .filter(|e| {
            e.owner == pause.owner && e.ran() && e.token == token && e.t_ns >= pause.resumed_ns
        })
        .collect();
    match late.first() {
        None => Ok(()),
        Some(first) => Err(Violation::RanAfterResume {
            owner: pause.owner.clone(),
            token,
            resumed_ns: pause.resumed_ns,
            runs: late.len(),
            first_ns: first.t_ns,
        }),
    }
}

/// Every verdict over a run: the first violation each check finds (one per pause for
/// [`check_resumed`]).
pub fn check_run(events: &[NodeEvent], pauses: &[Pause]) -> Result<(), Vec<Violation>> {
    let mut found: Vec<Violation> = [
        check_steps(&tenures(events)),
        check_lifetimes(&lifetimes(events)),
        check_no_tick_after_takeover(events),
    ]
    .into_iter()
    .chain(pauses.iter().map(|p| check_resumed(events, p)))
    .filter_map(Result::err)
    .collect();
    found.dedup();
    if found.is_empty() {
        Ok(())
    } else {
        Err(found)
    }
}

/// Panics with every violation [`check_run`] finds.
pub fn assert_safe(events: &[NodeEvent], pauses: &[Pause]) {
    if let Err(violations) = check_run(events, pauses) {
        panic!("{}", describe(&violations));
    }
}

/// One violation per line.
pub fn describe(violations: &[Violation]) -> String {
    let mut out = format!("{} safety violation(s):\n", violations.len());
    for v in violations {
        let _ = writeln!(out, "  {v}");
    }
    out
}

/// The kinds of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    Kill,
    Pause,
    Blackhole,
    ServerRestart,
    /// SIGTERM: the node stops its singleton, releases the lease and exits; a new process
    /// replaces it. The next tenure must start well before the TTL.
    GracefulStop,
    /// A three-member etcd cluster: one member (any) killed with SIGKILL, restarted a little later.
    MemberKill,
    /// The same for the member that leads the cluster.
    LeaderKill,
    /// One member frozen (SIGSTOP: cut off from its peers and its clients) for longer than the
    /// TTL, then resumed.
    MemberPartition,
    /// The kernel drops every packet between the node and the servers (nftables in the node's
    /// network namespace) for a random time below or above the TTL; connections stay open.
    Partition,
    /// Asymmetric: only the node's packets are dropped (its requests and acknowledgements).
    PartitionFromNode,
    /// Asymmetric: only the packets to the node are dropped, so its requests arrive (a renewal
    /// may take effect) but it never hears the answer.
    PartitionToNode,
    /// The node's wall clock (libfaketime) jumps ahead or behind by more than the TTL for two to
    /// three TTLs, then back; its monotonic clock is untouched.
    ClockSkew,
    /// A planned transfer (singleton nodes with a candidacy): SIGUSR1 makes the node hand
    /// leadership to the best other live candidate (`TransferLeadership::to_best`); a candidate
    /// killed a moment ago may still look live, and then the lease lapses for one TTL.
    Transfer,
    /// Late answers (sharded runs): the node's proxies hold every answer of the servers for 0.3 to
    /// 1.5 TTLs (`ProxyMode::SlowAnswers`) for one to two and a half TTLs, then pass again. A claim
    /// or a renewal takes effect on the server at once but is answered late, some after the node's
    /// own deadline. The fault ends when the last answer it delayed has been passed on.
    SlowAnswers,
    /// Lost answers (sharded runs): the node's proxies drop every answer of the servers
    /// (`ProxyMode::DropAnswers`: requests still take effect) for 0.3 to 1.5 TTLs, then pass again
    /// (the connections that lost answers are reset).
    LostAnswers,
}

impl Fault {
    /// The kinds of a run against one server.
    pub const ALL: [Fault; 9] = [
        Fault::Kill,
        Fault::Pause,
        Fault::Blackhole,
        Fault::ServerRestart,
        Fault::GracefulStop,
        Fault::Partition,
        Fault::PartitionFromNode,
        Fault::PartitionToNode,
        Fault::ClockSkew,
    ];

    /// The kinds of a run against a three-member etcd cluster: the node faults and the member
    /// faults (no whole-cluster restart).
    pub const CLUSTER: [Fault; 11] = [
        Fault::Kill,
        Fault::Pause,
        Fault::Blackhole,
        Fault::GracefulStop,
        Fault::Partition,
        Fault::PartitionFromNode,
        Fault::PartitionToNode,
        Fault::ClockSkew,
        Fault::MemberKill,
        Fault::LeaderKill,
        Fault::MemberPartition,
    ];

    /// The kinds of late and lost answers, which a sharded run adds to its backend's
    /// ([`Fault::sharded_kinds`]).
    pub const ANSWERS: [Fault; 2] = [Fault::SlowAnswers, Fault::LostAnswers];

    /// Every kind.
    pub const EVERY: [Fault; 15] = [
        Fault::Transfer,
        Fault::Kill,
        Fault::Pause,
        Fault::Blackhole,
        Fault::ServerRestart,
        Fault::GracefulStop,
        Fault::MemberKill,
        Fault::LeaderKill,
        Fault::MemberPartition,
        Fault::Partition,
        Fault::PartitionFromNode,
        Fault::PartitionToNode,
        Fault::ClockSkew,
        Fault::SlowAnswers,
        Fault::LostAnswers,
    ];

    /// The kinds of a sharded run (`chaos::run_sharded`) on a backend whose runs inject
    /// `backend_kinds`: those, and late and lost answers ([`Fault::ANSWERS`]). The singleton runs
    /// do not inject them, so what those assert (each of their kinds met a holder, graceful stops
    /// and planned transfers handed over within their bounds) stays as it was.
    pub fn sharded_kinds(backend_kinds: &[Fault]) -> Vec<Fault> {
        let mut kinds = backend_kinds.to_vec();
        for kind in Fault::ANSWERS {
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        kinds
    }

    /// Whether it hits the server side (no node in particular).
    pub fn is_server(self) -> bool {
        matches!(
            self,
            Fault::ServerRestart | Fault::MemberKill | Fault::LeaderKill | Fault::MemberPartition
        )
    }
}

/// The harness's choice of faults: every kind once, in an order shuffled by the seed, then random
/// kinds, every kind with the same weight. A kind of
/// the opening round that met no acting holder is drawn again next, so even a short run checks
/// what each kind of fault is for (a paused holder that runs nothing after the resume, a graceful
/// handover well before the TTL, ...). The same seed gives the same sequence for the same
/// outcomes.
#[derive(Debug)]
pub struct FaultSchedule {
    rng: fastrand::Rng,
    uncovered: VecDeque<Fault>,
    /// The kinds drawn after the opening round.
    draw: Vec<Fault>,
}

impl FaultSchedule {
    /// The schedule of a run against one server ([`Fault::ALL`]).
    pub fn new(seed: u64) -> Self {
        Self::with_kinds(seed, &Fault::ALL)
    }

    /// The schedule of a run with these kinds of fault.
    pub fn with_kinds(seed: u64, kinds: &[Fault]) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut opening = kinds.to_vec();
        rng.shuffle(&mut opening);
        // Drawn in this order: the node faults, then the server faults.
        let mut draw: Vec<Fault> = kinds.iter().copied().filter(|k| !k.is_server()).collect();
        draw.extend(kinds.iter().copied().filter(|k| k.is_server()));
        Self {
            rng,
            uncovered: opening.into(),
            draw,
        }
    }

    /// The next fault to inject.
    pub fn next_fault(&mut self) -> Fault {
        if let Some(&fault) = self.uncovered.front() {
            return fault;
        }
        let slots = u8::try_from(self.draw.len() * 2).unwrap_or(u8::MAX);
        self.draw[usize::from(self.rng.u8(0..slots) / 2)]
    }

    /// Reports how the fault from [`next_fault`](Self::next_fault) went: whether it met an acting
    /// holder. One that did not is drawn again while it is one of the opening round's.
    pub fn done(&mut self, fault: Fault, met_holder: bool) {
        if met_holder {
            self.uncovered.retain(|f| *f != fault);
        }
    }

    /// Whether every kind has met an acting holder.
    pub fn covered(&self) -> bool {
        self.uncovered.is_empty()
    }
}

/// A fault as it happened.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub fault: Fault,
    /// The node it hit (`None` for a server restart).
    pub owner: Option<String>,
    /// The tenure (owner, token) that was acting when it started (its last step within 500 ms),
    /// if any: for a node fault, the target itself.
    pub holder: Option<(String, u64)>,
    pub start_ns: u128,
    /// For a pause: the instant before `SIGCONT` was sent. For late answers: once the last answer
    /// the fault delayed was passed on (the proxies passed again up to one delay earlier).
    pub end_ns: u128,
}

impl FaultRecord {
    /// The [`Pause`] to check, if this is a pause.
    pub fn pause(&self) -> Option<Pause> {
        (self.fault == Fault::Pause).then(|| Pause {
            owner: self.owner.clone().unwrap_or_default(),
            stopped_ns: self.start_ns,
            resumed_ns: self.end_ns,
        })
    }
}

/// What a fault that met an acting holder led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultOutcome {
    pub fault: Fault,
    /// `None`: the holder went on acting under the same tenure after the fault (a server restart
    /// shorter than the TTL).
    pub takeover: Option<Takeover>,
}

/// A new tenure after a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Takeover {
    /// From the start of the fault to the new tenure's first step.
    pub after: Duration,
    /// From the holder's last step to the new tenure's first step.
    pub gap: Duration,
}

fn ns(d: u128) -> Duration {
    Duration::from_nanos(u64::try_from(d).unwrap_or(u64::MAX))
}

/// For every fault that met an acting holder: either the next tenure (when it acted, and how
/// long after the holder's last step), or that the holder went on under its tenure. A fault after
/// which nobody acted again is left out.
pub fn fault_outcomes(faults: &[FaultRecord], events: &[NodeEvent]) -> Vec<FaultOutcome> {
    let acts: Vec<&NodeEvent> = events.iter().filter(|e| e.kind == EventKind::Act).collect();
    let mut outcomes = Vec::new();
    for f in faults {
        let Some((owner, token)) = &f.holder else {
            continue;
        };
        let same = |e: &NodeEvent| &e.owner == owner && e.token == *token;
        let next = acts.iter().find(|e| e.t_ns > f.start_ns && !same(e));
        let survived = acts
            .iter()
            .any(|e| same(e) && e.t_ns >= f.end_ns && next.is_none_or(|n| e.t_ns < n.t_ns));
        if survived {
            outcomes.push(FaultOutcome {
                fault: f.fault,
                takeover: None,
            });
        } else if let Some(next) = next {
            let last = acts
                .iter()
                .filter(|e| same(e) && e.t_ns < next.t_ns)
                .map(|e| e.t_ns)
                .max()
                .unwrap_or(f.start_ns);
            outcomes.push(FaultOutcome {
                fault: f.fault,
                takeover: Some(Takeover {
                    after: ns(next.t_ns - f.start_ns),
                    gap: ns(next.t_ns - last),
                }),
            });
        }
    }
    outcomes
}

/// Per pause of an acting holder: how long after the resume (the instant before `SIGCONT`) the
/// singleton of the tenure it acted under stopped, and how many ticks or steps it ran under that
/// tenure after the resume (0 unless [`check_resumed`] fails).
pub fn pause_stops(faults: &[FaultRecord], events: &[NodeEvent]) -> Vec<(Duration, usize)> {
    let mut stops = Vec::new();
    for f in faults.iter().filter(|f| f.fault == Fault::Pause) {
        let Some((owner, token)) = &f.holder else {
            continue;
        };
        let ran = events
            .iter()
            .filter(|e| &e.owner == owner && e.token == *token && e.ran() && e.t_ns >= f.end_ns)
            .count();
        if let Some(stop) = events.iter().find(|e| {
            &e.owner == owner
                && e.kind == EventKind::Stop
                && e.token == *token
                && e.t_ns >= f.end_ns
        }) {
            stops.push((ns(stop.t_ns - f.end_ns), ran));
        }
    }
    stops.sort();
    stops
}

/// How many ticks the singletons ran, how many of them acted, and how many the guard refused
/// (a tick with no `act` of the same owner, token and time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickCounts {
    pub ticks: usize,
    pub acts: usize,
    pub refused: usize,
}

pub fn tick_counts(events: &[NodeEvent]) -> TickCounts {
    let acts: BTreeSet<(&str, u64, u128)> = events
        .iter()
        .filter(|e| e.kind == EventKind::Act)
        .map(|e| (e.owner.as_str(), e.token, e.t_ns))
        .collect();
    let ticks: Vec<&NodeEvent> = events
        .iter()
        .filter(|e| e.kind == EventKind::Tick)
        .collect();
    TickCounts {
        ticks: ticks.len(),
        acts: acts.len(),
        refused: ticks
            .iter()
            .filter(|e| !acts.contains(&(e.owner.as_str(), e.token, e.t_ns)))
            .count(),
    }
}

/// The `403 Forbidden` answers the nodes' logs report, by verb (`get`, `update`, `watch`, ...).
/// The library logs one error on several lines (the backend's, the driver's, the actor's): lines
/// of the same node naming the same verb within 10 ms count once. `logs` holds (node, log text).
pub fn forbidden_answers(logs: &[(String, String)]) -> BTreeMap<String, usize> {
    /// Seconds of the day of a line's leading RFC 3339 timestamp, as nanoseconds.
    fn time_ns(line: &str) -> Option<u128> {
        let time = line.split_whitespace().next()?.split('T').nth(1)?;
        let time = time.trim_end_matches('Z');
        let mut parts = time.split(':');
        let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
        let (secs, frac) = s.split_once('.').unwrap_or((s, "0"));
        let frac_ns: u128 = format!("{frac:0<9}")[..9].parse().ok()?;
        let whole: u128 = h.parse::<u128>().ok()? * 3600
            + m.parse::<u128>().ok()? * 60
            + secs.parse::<u128>().ok()?;
        Some(whole * 1_000_000_000 + frac_ns)
    }
    let mut counts = BTreeMap::new();
    for (_, text) in logs {
        let mut last: BTreeMap<&str, u128> = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.split("does not allow `").nth(1) else {
                continue;
            };
            let Some(verb) = rest.split('`').next() else {
                continue;
            };
            let t = time_ns(line).unwrap_or_default();
            let repeat = last
                .get(verb)
                .is_some_and(|prev| t.abs_diff(*prev) < 10_000_000);
            last.insert(verb, t);
            if !repeat {
                *counts.entry(verb.to_owned()).or_insert(0) += 1;
            }
        }
    }
    counts
}

/// The node logs (`node-*.log`) of a run directory, as (node, text).
pub fn node_logs(dir: &Path) -> Vec<(String, String)> {
    let mut logs: Vec<(String, String)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let node = name.strip_suffix(".log")?.strip_prefix("node-")?.to_owned();
            Some((
                format!("node-{node}"),
                std::fs::read_to_string(entry.path()).ok()?,
            ))
        })
        .collect();
    logs.sort();
    logs
}

/// The nodes' event logs (`node-*.jsonl`) of a run directory.
pub fn event_logs(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("node-") && n.ends_with(".jsonl"))
        })
        .collect();
    paths.sort();
    paths
}

/// The acting tenure (owner, token) whose last step came within 500 ms before `t_ns`, of `owner`
/// if given: how the harness finds the holder a fault meets. The tenure is the one in force at
/// `t_ns` ([`tenure_at`]): a holder whose tenure ended after its last step and that took the lease
/// again before the fault (a new token, not acted under yet) is met under its new token, and one
/// whose tenure ended with no new one met no holder.
pub fn holder_at(events: &[NodeEvent], t_ns: u128, owner: Option<&str>) -> Option<(String, u64)> {
    let act = events
        .iter()
        .rev()
        .filter(|e| e.t_ns < t_ns)
        .take_while(|e| e.t_ns + 500_000_000 >= t_ns)
        .find(|e| e.kind == EventKind::Act && owner.is_none_or(|o| e.owner == o))?;
    let token = tenure_at(events, &act.owner, act.token, act.t_ns, t_ns)?;
    Some((act.owner.clone(), token))
}

/// The token `owner` holds at `t_ns`, given that it acted under `token` at `acted_ns`: its
/// `start` and `stop` events in between move it to a new tenure or end it (`None`).
pub fn tenure_at(
    events: &[NodeEvent],
    owner: &str,
    token: u64,
    acted_ns: u128,
    t_ns: u128,
) -> Option<u64> {
    let mut current = Some(token);
    let mut between: Vec<&NodeEvent> = events
        .iter()
        .filter(|e| e.owner == owner && e.t_ns > acted_ns && e.t_ns < t_ns)
        .collect();
    between.sort_by_key(|e| e.t_ns);
    for e in between {
        match e.kind {
            EventKind::Start => current = Some(e.token),
            EventKind::Stop if current == Some(e.token) => current = None,
            _ => {}
        }
    }
    current
}

/// A recorded holder as the events show it at the fault ([`tenure_at`] from its last step before
/// `t_ns`): the harness reads the nodes' events a few milliseconds late, so a holder that took the
/// lease again just before the fault was recorded under the token it last acted with.
pub fn recorded_holder_at(
    events: &[NodeEvent],
    (owner, token): (String, u64),
    t_ns: u128,
) -> Option<(String, u64)> {
    let Some(act) = events
        .iter()
        .rev()
        .filter(|e| e.t_ns < t_ns)
        .find(|e| e.kind == EventKind::Act && e.owner == owner && e.token == token)
    else {
        return Some((owner, token));
    };
    let now = tenure_at(events, &owner, token, act.t_ns, t_ns)?;
    Some((owner, now))
}

/// One line of `faults.jsonl`.
pub fn fault_line(f: &FaultRecord) -> String {
    let quoted = |o: Option<&String>| o.map_or("null".to_owned(), |o| format!("\"{o}\""));
    format!(
        "{{\"fault\":\"{:?}\",\"owner\":{},\"holder\":{},\"holder_token\":{},\"start_ns\":{},\"end_ns\":{}}}\n",
        f.fault,
        quoted(f.owner.as_ref()),
        quoted(f.holder.as_ref().map(|h| &h.0)),
        f.holder
            .as_ref()
            .map_or("null".to_owned(), |h| h.1.to_string()),
        f.start_ns,
        f.end_ns
    )
}

/// The faults of a `faults.jsonl`. Logs written before the harness recorded the holder (no
/// `holder` field) get it from `events` as the harness finds it ([`holder_at`]).
pub fn parse_faults(text: &str, events: &[NodeEvent]) -> Vec<FaultRecord> {
    text.lines()
        .filter_map(|line| {
            let v = serde_json::from_str::<serde_json::Value>(line).ok()?;
            let fault = *Fault::EVERY
                .iter()
                .find(|k| format!("{k:?}") == v["fault"].as_str().unwrap_or_default())?;
            let owner = v["owner"].as_str().map(str::to_owned);
            let start_ns = u128::from(v["start_ns"].as_u64()?);
            let holder = if v.get("holder").is_some() {
                v["holder"]
                    .as_str()
                    .zip(v["holder_token"].as_u64())
                    .and_then(|(o, t)| recorded_holder_at(events, (o.to_owned(), t), start_ns))
            } else {
                holder_at(events, start_ns, owner.as_deref())
            };
            Some(FaultRecord {
                fault,
                owner,
                holder,
                start_ns,
                end_ns: u128::from(v["end_ns"].as_u64()?),
            })
        })
        .collect()
}

/// What a run was, as `run.json` in its directory says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInfo {
    pub backend: String,
    pub seed: u64,
    pub ttl: Duration,
    pub nodes: usize,
    pub duration: Duration,
    /// The harness's wall clock minus its monotonic clock (the events' `t_ns`), in nanoseconds:
    /// the offset a node whose wall clock is right logs too.
    pub wall_offset_ns: Option<i128>,
    /// The run's first and last instant on the events' clock (`CLOCK_MONOTONIC`): the origin of
    /// the timeline's axis. Not in runs older than it.
    pub span_ns: Option<(u128, u128)>,
}

impl RunInfo {
    pub fn to_json(&self) -> String {
        format!(
            "{{\"backend\":\"{}\",\"seed\":{},\"ttl_ms\":{},\"nodes\":{},\"duration_ms\":{},\"wall_offset_ns\":{},\"start_ns\":{},\"end_ns\":{}}}\n",
            self.backend,
            self.seed,
            self.ttl.as_millis(),
            self.nodes,
            self.duration.as_millis(),
            self.wall_offset_ns
                .map_or("null".to_owned(), |o| o.to_string()),
            self.span_ns
                .map_or("null".to_owned(), |(start, _)| start.to_string()),
            self.span_ns
                .map_or("null".to_owned(), |(_, end)| end.to_string()),
        )
    }

    /// From `run.json`, or for a run older than it from the first line of its `summary.txt`
    /// (`<backend> chaos run: seed S, ttl 3s, [N nodes, ]609s, ...`; 3 nodes if not given).
    pub fn read(dir: &Path) -> Option<Self> {
        if let Ok(text) = std::fs::read_to_string(dir.join("run.json")) {
            let v = serde_json::from_str::<serde_json::Value>(&text).ok()?;
            return Some(Self {
                backend: v["backend"].as_str()?.to_owned(),
                seed: v["seed"].as_u64()?,
                ttl: Duration::from_millis(v["ttl_ms"].as_u64()?),
                nodes: usize::try_from(v["nodes"].as_u64()?).ok()?,
                duration: Duration::from_millis(v["duration_ms"].as_u64()?),
                wall_offset_ns: v["wall_offset_ns"]
                    .as_i64()
                    .map(i128::from)
                    .or_else(|| v["wall_offset_ns"].as_str().and_then(|s| s.parse().ok())),
                span_ns: v["start_ns"]
                    .as_u64()
                    .zip(v["end_ns"].as_u64())
                    .map(|(start, end)| (u128::from(start), u128::from(end))),
            });
        }
        let summary = std::fs::read_to_string(dir.join("summary.txt")).ok()?;
        let (backend, rest) = summary.lines().next()?.split_once(" chaos run: ")?;
        let fields: Vec<&str> = rest.split(", ").collect();
        let field = |prefix: &str| {
            fields
                .iter()
                .find_map(|f| f.strip_prefix(prefix))
                .map(str::to_owned)
        };
        let seconds = |s: &str| s.strip_suffix('s')?.parse::<u64>().ok();
        Some(Self {
            backend: backend.to_owned(),
            seed: field("seed ")?.parse().ok()?,
            ttl: Duration::from_secs(seconds(&field("ttl ")?)?),
            nodes: fields
                .iter()
                .find_map(|f| f.strip_suffix(" nodes")?.parse().ok())
                .unwrap_or(3),
            duration: Duration::from_secs(fields.iter().find_map(|f| seconds(f))?),
            wall_offset_ns: None,
            span_ns: None,
        })
    }
}

/// Each node's wall clock as it logged it: per owner, `(t_ns, wall_ns - t_ns)` of every event
/// that carries a `wall_ns`.
pub fn wall_offsets(paths: &[PathBuf]) -> BTreeMap<String, Vec<(u128, i128)>> {
    let mut by_owner: BTreeMap<String, Vec<(u128, i128)>> = BTreeMap::new();
    for path in paths {
        for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let number = |key: &str| {
                v[key]
                    .as_u64()
                    .map(u128::from)
                    .or_else(|| v[key].as_str().and_then(|s| s.parse().ok()))
            };
            if let (Some(owner), Some(t), Some(wall)) =
                (v["owner"].as_str(), number("t_ns"), number("wall_ns"))
            {
                by_owner
                    .entry(owner.to_owned())
                    .or_default()
                    .push((t, wall as i128 - t as i128));
            }
        }
    }
    by_owner
}

/// Per clock fault: how far off the target's wall clock was while the fault lasted (the
/// largest difference, with its sign, between its logged offset and the harness's, in
/// nanoseconds; positive: ahead), or `None`
/// when the node logged nothing meanwhile or the run has no base offset.
pub fn clock_skews(
    faults: &[FaultRecord],
    offsets: &BTreeMap<String, Vec<(u128, i128)>>,
    base: Option<i128>,
) -> Vec<Option<i128>> {
    faults
        .iter()
        .filter(|f| f.fault == Fault::ClockSkew)
        .map(|f| {
            let base = base?;
            let seen = offsets.get(f.owner.as_ref()?)?;
            seen.iter()
                .filter(|(t, _)| (f.start_ns..=f.end_ns).contains(t))
                .map(|(_, o)| o - base)
                .max_by_key(|o| o.abs())
        })
        .collect()
}

/// Every verdict and figure of a run, from the files in its directory: the nodes' event logs
/// and logs and `faults.jsonl`. The harness writes `summary.txt` from this; it also re-checks a
/// run made before a verdict was added.
pub fn analyze(dir: &Path, info: &RunInfo) -> ChaosReport {
    let events = read_events(&event_logs(dir));
    let faults = parse_faults(
        &std::fs::read_to_string(dir.join("faults.jsonl")).unwrap_or_default(),
        &events,
    );
    let pauses: Vec<Pause> = faults.iter().filter_map(FaultRecord::pause).collect();
    ChaosReport {
        backend: info.backend.clone(),
        seed: info.seed,
        ttl: info.ttl,
        nodes: info.nodes,
        tenures: tenures(&events),
        lifetimes: lifetimes(&events),
        outcomes: fault_outcomes(&faults, &events),
        pause_stops: pause_stops(&faults, &events),
        ticks: tick_counts(&events),
        forbidden: forbidden_answers(&node_logs(dir)),
        clock_skews: clock_skews(
            &faults,
            &wall_offsets(&event_logs(dir)),
            info.wall_offset_ns,
        ),
        violations: check_run(&events, &pauses).err().unwrap_or_default(),
        faults,
        svg: dir.join("timeline.svg"),
        duration: info.duration,
    }
}

/// What a run found.
#[derive(Debug, Clone)]
pub struct ChaosReport {
    pub backend: String,
    pub seed: u64,
    pub ttl: Duration,
    pub nodes: usize,
    pub tenures: Vec<Tenure>,
    pub lifetimes: Vec<Lifetime>,
    pub faults: Vec<FaultRecord>,
    pub outcomes: Vec<FaultOutcome>,
    /// Per pause of the acting holder: how long after the resume its singleton stopped, and how
    /// many ticks or steps it ran under its old tenure after the resume.
    pub pause_stops: Vec<(Duration, usize)>,
    pub ticks: TickCounts,
    pub forbidden: BTreeMap<String, usize>,
    /// Per clock fault, how far off the target's wall clock was by its own events
    /// ([`clock_skews`]).
    pub clock_skews: Vec<Option<i128>>,
    pub violations: Vec<Violation>,
    pub svg: PathBuf,
    pub duration: Duration,
}

/// Min, median and max of `values` (sorted here), or `None` when empty.
pub fn min_median_max(mut values: Vec<Duration>) -> Option<(Duration, Duration, Duration)> {
    values.sort();
    let n = values.len();
    (n > 0).then(|| {
        (
            values[0],
            (values[(n - 1) / 2] + values[n / 2]) / 2,
            values[n - 1],
        )
    })
}

impl ChaosReport {
    /// The kinds of fault that met an acting holder (a takeover or a kept tenure).
    pub fn kinds_met(&self) -> BTreeSet<Fault> {
        self.outcomes.iter().map(|o| o.fault).collect()
    }

    /// The run in figures: every figure docs/chaos/RESULTS.md reports.
    pub fn summary(&self) -> String {
        let tokens = self.tenures.iter().map(|t| t.token);
        let mut out = format!(
            "{} chaos run: seed {}, ttl {:?}, {} nodes, {:.0?}, {} faults, {} tenures (tokens {}..={}); timeline: {}\n",
            self.backend,
            self.seed,
            self.ttl,
            self.nodes,
            self.duration,
            self.faults.len(),
            self.tenures.len(),
            tokens.clone().min().unwrap_or_default(),
            tokens.max().unwrap_or_default(),
            self.svg.display()
        );
        if self.violations.is_empty() {
            out.push_str(
                "verdict: no violation (steps, lifetimes, ticks after a takeover, paused holders)\n",
            );
        } else {
            out.push_str(&describe(&self.violations));
        }
        let _ = writeln!(
            out,
            "ticks: {}, steps: {}, ticks refused by the guard: {}",
            self.ticks.ticks, self.ticks.acts, self.ticks.refused
        );
        // How close the run came to an overlap: the shortest time between one tenure's last step
        // and the next tenure's first, overall and between different processes.
        let closest = |different: bool| {
            self.tenures
                .windows(2)
                .map(|p| (&p[0], &p[1]))
                .filter(|(a, b)| !different || a.owner != b.owner)
                .min_by_key(|(a, b)| b.first_ns.saturating_sub(a.last_ns))
        };
        for (label, pair) in [
            ("closest handover", closest(false)),
            ("closest handover between processes", closest(true)),
        ] {
            if let Some((a, b)) = pair {
                let _ = writeln!(
                    out,
                    "{label}: {:.3}s from {}'s last step (token {}) to {}'s first (token {})",
                    b.first_ns.saturating_sub(a.last_ns) as f64 / 1e9,
                    a.owner,
                    a.token,
                    b.owner,
                    b.token
                );
            }
        }
        if let Some((a, b)) = self
            .lifetimes
            .windows(2)
            .map(|p| (&p[0], &p[1]))
            .min_by_key(|(a, b)| b.start_ns.saturating_sub(a.end_ns))
        {
            let _ = writeln!(
                out,
                "closest lifetimes: {:.3}s from {}'s last tick (token {}) to {}'s start (token {})",
                b.start_ns.saturating_sub(a.end_ns) as f64 / 1e9,
                a.owner,
                a.token,
                b.owner,
                b.token
            );
        }
        let _ = writeln!(
            out,
            "{:<18} {:>6} {:>9} {:>9} {:>5} | {:>24} | {:>24}",
            "fault",
            "faults",
            "at holder",
            "takeovers",
            "kept",
            "takeover min/median/max",
            "gap min/median/max"
        );
        let show = |m: Option<(Duration, Duration, Duration)>| {
            m.map_or("-".to_owned(), |(a, b, c)| {
                format!(
                    "{:.2}/{:.2}/{:.2}s",
                    a.as_secs_f64(),
                    b.as_secs_f64(),
                    c.as_secs_f64()
                )
            })
        };
        for kind in Fault::EVERY {
            if !self.faults.iter().any(|f| f.fault == kind) {
                continue;
            }
            let outcomes: Vec<&FaultOutcome> =
                self.outcomes.iter().filter(|o| o.fault == kind).collect();
            let takeovers: Vec<Takeover> = outcomes.iter().filter_map(|o| o.takeover).collect();
            let _ = writeln!(
                out,
                "{:<18} {:>6} {:>9} {:>9} {:>5} | {:>24} | {:>24}",
                format!("{kind:?}"),
                self.faults.iter().filter(|f| f.fault == kind).count(),
                outcomes.len(),
                takeovers.len(),
                outcomes.len() - takeovers.len(),
                show(min_median_max(takeovers.iter().map(|t| t.after).collect())),
                show(min_median_max(takeovers.iter().map(|t| t.gap).collect())),
            );
        }
        if let Some((min, median, max)) =
            min_median_max(self.pause_stops.iter().map(|(d, _)| *d).collect())
        {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let _ = writeln!(
                out,
                "paused holders: {}, ticks or steps after the resume: {}, singleton stopped after the resume: {:.1} / {:.1} / {:.1} ms (min / median / max)",
                self.pause_stops.len(),
                self.pause_stops.iter().map(|(_, ran)| ran).sum::<usize>(),
                ms(min),
                ms(median),
                ms(max),
            );
        }
        if !self.clock_skews.is_empty() {
            let seen: Vec<i128> = self.clock_skews.iter().flatten().copied().collect();
            // "2 ahead by 5.2..6.0s", or "0 ahead" when there is no range to show.
            let side = |offsets: Vec<f64>, word: &str| match (
                offsets.iter().copied().reduce(f64::min),
                offsets.iter().copied().reduce(f64::max),
            ) {
                (Some(least), Some(most)) => {
                    format!("{} {word} by {least:.1}..{most:.1}s", offsets.len())
                }
                _ => format!("0 {word}"),
            };
            let secs = |o: &i128| (*o as f64 / 1e9).abs();
            let _ = writeln!(
                out,
                "clock faults: {} (wall clock as the node's own events show it: {}, {}, {} with no event meanwhile)",
                self.clock_skews.len(),
                side(seen.iter().filter(|o| **o > 0).map(secs).collect(), "ahead"),
                side(seen.iter().filter(|o| **o < 0).map(secs).collect(), "behind"),
                self.clock_skews.len() - seen.len()
            );
        }
        if !self.forbidden.is_empty() {
            let by_verb: Vec<String> = self
                .forbidden
                .iter()
                .map(|(verb, n)| format!("{verb} {n}"))
                .collect();
            let _ = writeln!(
                out,
                "403 Forbidden answers in the node logs: {} ({})",
                self.forbidden.values().sum::<usize>(),
                by_verb.join(", ")
            );
        }
        out
    }
}
