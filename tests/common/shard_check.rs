//! The chaos harness's verdicts per shard of a group of sharded workers (issue 24): plain
//! functions of the nodes' event logs, no server, no process. The harness (`chaos::run_sharded`)
//! calls them after a run of `examples/sharded_node.rs` processes; `tests/chaos_checker.rs` feeds
//! them hand-written logs to show that an overlap or a falling token on one shard is caught and
//! named.
//!
//! A sharded node logs, per shard's worker, JSON lines with the owner, the shard, the tenure's
//! fencing token and `t_ns`: `start`, `stop`, `act` (a tick the guard allowed: a step) and `tick`
//! (a tick the guard refused). Each shard's lines are split off and checked on their own with
//! every verdict of `chaos_check` ([`check_run`]): acting tenures never overlap and their tokens
//! rise, no two workers of the shard are alive at once, none ticks after a newer tenure acted, and
//! a frozen holder runs nothing once resumed. An `act` line counts as its tick too (a singleton
//! node logs the pair).
//!
//! [`sharded_graceful_handovers`] measures, from the same logs and the harness's `faults.jsonl`,
//! how fast a gracefully stopped node's shards ran elsewhere (with no feature: `chaos_checker.rs`
//! runs in every build).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::chaos_check::*;

/// Every shard's events from the texts of sharded nodes' event logs, each shard's sorted by time
/// (stable: a step's tick stays before its act). Lines that do not parse or name no shard (one cut
/// by SIGKILL) are skipped.
pub fn shard_events<'a>(
    texts: impl IntoIterator<Item = &'a str>,
) -> BTreeMap<String, Vec<NodeEvent>> {
    let mut by_shard: BTreeMap<String, Vec<NodeEvent>> = BTreeMap::new();
    for line in texts.into_iter().flat_map(str::lines) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let kind = match v["event"].as_str() {
            Some("start") => EventKind::Start,
            Some("tick") => EventKind::Tick,
            Some("act") => EventKind::Act,
            Some("stop") => EventKind::Stop,
            _ => continue,
        };
        let t_ns = v["t_ns"]
            .as_u64()
            .map(u128::from)
            .or_else(|| v["t_ns"].as_str().and_then(|s| s.parse().ok()));
        let (Some(shard), Some(owner), Some(token), Some(t_ns)) = (
            v["shard"].as_str(),
            v["owner"].as_str(),
            v["token"].as_u64(),
            t_ns,
        ) else {
            continue;
        };
        let events = by_shard.entry(shard.to_owned()).or_default();
        if kind == EventKind::Act {
            events.push(NodeEvent::new(owner, EventKind::Tick, token, t_ns));
        }
        events.push(NodeEvent::new(owner, kind, token, t_ns));
    }
    for events in by_shard.values_mut() {
        events.sort_by_key(|e| e.t_ns);
    }
    by_shard
}

/// Every shard's events of the logs at `paths`.
pub fn read_shard_events(paths: &[PathBuf]) -> BTreeMap<String, Vec<NodeEvent>> {
    let texts: Vec<String> = paths
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    shard_events(texts.iter().map(String::as_str))
}

/// The shards in numeric order when their ids are numbers (`2` before `10`).
pub fn shard_order<'a>(shards: impl IntoIterator<Item = &'a String>) -> Vec<&'a String> {
    let mut ids: Vec<&String> = shards.into_iter().collect();
    ids.sort_by_key(|s| (s.len(), s.as_str()));
    ids
}

/// A safety violation on one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardViolation {
    pub shard: String,
    pub violation: Violation,
}

impl fmt::Display for ShardViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard {}: {}", self.shard, self.violation)
    }
}

/// Every verdict of [`check_run`] on each shard's events on their own; `pauses` (a node frozen
/// and resumed) apply to every shard (a pause's owner held some of them).
pub fn check_shards(
    by_shard: &BTreeMap<String, Vec<NodeEvent>>,
    pauses: &[Pause],
) -> Result<(), Vec<ShardViolation>> {
    let found: Vec<ShardViolation> = shard_order(by_shard.keys())
        .into_iter()
        .flat_map(|shard| {
            let violations = check_run(&by_shard[shard], pauses)
                .err()
                .unwrap_or_default();
            violations.into_iter().map(|violation| ShardViolation {
                shard: shard.clone(),
                violation,
            })
        })
        .collect();
    if found.is_empty() {
        Ok(())
    } else {
        Err(found)
    }
}

/// One violation per line, each naming its shard.
pub fn describe_shards(violations: &[ShardViolation]) -> String {
    let mut out = format!("{} safety violation(s):\n", violations.len());
    for v in violations {
        let _ = writeln!(out, "  {v}");
    }
    out
}

/// The run's faults as one shard met them: each fault's holder is the tenure of this shard that
/// acted within 500 ms before it on the node it hit (on any node for a server fault), if any.
pub fn shard_faults(faults: &[FaultRecord], events: &[NodeEvent]) -> Vec<FaultRecord> {
    faults
        .iter()
        .map(|f| FaultRecord {
            holder: holder_at(events, f.start_ns, f.owner.as_deref()),
            ..f.clone()
        })
        .collect()
}

/// What a run of sharded nodes found: a [`ChaosReport`] per shard (its tenures, the faults as the
/// shard met them, their outcomes, its verdicts) and the run's figures.
#[derive(Debug, Clone)]
pub struct ShardedReport {
    pub backend: String,
    pub seed: u64,
    pub ttl: Duration,
    pub nodes: usize,
    pub duration: Duration,
    pub faults: Vec<FaultRecord>,
    pub shards: BTreeMap<String, ChaosReport>,
    pub violations: Vec<ShardViolation>,
    /// Per clock fault, how far off the target's wall clock was ([`clock_skews`]).
    pub clock_skews: Vec<Option<i128>>,
    pub forbidden: BTreeMap<String, usize>,
    /// The first shard's timeline (each shard has its own).
    pub svg: PathBuf,
}

/// The per-shard reports of a run from its events per shard and its faults (no clock faults or
/// node logs read: [`analyze_sharded`] adds them).
pub fn sharded_report(
    info: &RunInfo,
    by_shard: &BTreeMap<String, Vec<NodeEvent>>,
    faults: &[FaultRecord],
) -> ShardedReport {
    let pauses: Vec<Pause> = faults.iter().filter_map(FaultRecord::pause).collect();
    let shards: BTreeMap<String, ChaosReport> = by_shard
        .iter()
        .map(|(shard, events)| {
            let faults = shard_faults(faults, events);
            let report = ChaosReport {
                backend: format!("{} shard {shard}", info.backend),
                seed: info.seed,
                ttl: info.ttl,
                nodes: info.nodes,
                tenures: tenures(events),
                lifetimes: lifetimes(events),
                outcomes: fault_outcomes(&faults, events),
                pause_stops: pause_stops(&faults, events),
                ticks: tick_counts(events),
                forbidden: BTreeMap::new(),
                clock_skews: Vec::new(),
                violations: check_run(events, &pauses).err().unwrap_or_default(),
                faults,
                svg: PathBuf::new(),
                duration: info.duration,
            };
            (shard.clone(), report)
        })
        .collect();
    let violations = check_shards(by_shard, &pauses).err().unwrap_or_default();
    ShardedReport {
        backend: info.backend.clone(),
        seed: info.seed,
        ttl: info.ttl,
        nodes: info.nodes,
        duration: info.duration,
        faults: faults.to_vec(),
        shards,
        violations,
        clock_skews: Vec::new(),
        forbidden: BTreeMap::new(),
        svg: PathBuf::new(),
    }
}

/// Every verdict and figure of a sharded run, from the files in its directory (the nodes' event
/// logs and logs, `faults.jsonl`).
pub fn analyze_sharded(dir: &Path, info: &RunInfo) -> ShardedReport {
    let paths = event_logs(dir);
    let by_shard = read_shard_events(&paths);
    // The harness's holder of a fault is one shard's; each shard finds its own.
    let faults = parse_faults(
        &std::fs::read_to_string(dir.join("faults.jsonl")).unwrap_or_default(),
        &[],
    );
    let mut report = sharded_report(info, &by_shard, &faults);
    report.clock_skews = clock_skews(&faults, &wall_offsets(&paths), info.wall_offset_ns);
    report.forbidden = forbidden_answers(&node_logs(dir));
    report
}

impl ShardedReport {
    /// The kinds of fault that met an acting holder of some shard.
    pub fn kinds_met(&self) -> BTreeSet<Fault> {
        self.shards.values().flat_map(|r| r.kinds_met()).collect()
    }

    /// The run in figures, in the form of [`ChaosReport::summary`] (so that
    /// `scripts/chaos-summary.py` reads it): tenures, takeovers and kept tenures count shard
    /// tenures; a fault is "at holder" when it met an acting tenure of at least one shard.
    pub fn summary(&self) -> String {
        let tenures: usize = self.shards.values().map(|r| r.tenures.len()).sum();
        let top_token = self
            .shards
            .values()
            .flat_map(|r| r.tenures.iter().map(|t| t.token))
            .max()
            .unwrap_or_default();
        let mut out = format!(
            "{} chaos run: seed {}, ttl {:?}, {} nodes, {:.0?}, {} faults, {} tenures ({} shards, tokens up to {top_token}); timeline: {} (one per shard)\n",
            self.backend,
            self.seed,
            self.ttl,
            self.nodes,
            self.duration,
            self.faults.len(),
            tenures,
            self.shards.len(),
            self.svg.display()
        );
        if self.violations.is_empty() {
            let _ = writeln!(
                out,
                "verdict: no violation on any of the {} shards (steps, lifetimes, ticks after a takeover, paused holders)",
                self.shards.len()
            );
        } else {
            out.push_str(&describe_shards(&self.violations));
        }
        let sum = |f: fn(&TickCounts) -> usize| -> usize {
            self.shards.values().map(|r| f(&r.ticks)).sum()
        };
        let _ = writeln!(
            out,
            "ticks: {}, steps: {}, ticks refused by the guard: {}",
            sum(|t| t.ticks),
            sum(|t| t.acts),
            sum(|t| t.refused)
        );
        // How close each shard came to an overlap, the closest of all shards.
        let closest_handover = self
            .shards
            .iter()
            .flat_map(|(s, r)| r.tenures.windows(2).map(move |p| (s, &p[0], &p[1])))
            .filter(|(_, a, b)| a.owner != b.owner)
            .min_by_key(|(_, a, b)| b.first_ns.saturating_sub(a.last_ns));
        if let Some((s, a, b)) = closest_handover {
            let _ = writeln!(
                out,
                "closest handover between processes: {:.3}s on shard {s} from {}'s last step (token {}) to {}'s first (token {})",
                b.first_ns.saturating_sub(a.last_ns) as f64 / 1e9,
                a.owner,
                a.token,
                b.owner,
                b.token
            );
        }
        let closest_lifetimes = self
            .shards
            .iter()
            .flat_map(|(s, r)| r.lifetimes.windows(2).map(move |p| (s, &p[0], &p[1])))
            .min_by_key(|(_, a, b)| b.start_ns.saturating_sub(a.end_ns));
        if let Some((s, a, b)) = closest_lifetimes {
            let _ = writeln!(
                out,
                "closest lifetimes: {:.3}s on shard {s} from {}'s last tick (token {}) to {}'s start (token {})",
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
            let indices: Vec<usize> = (0..self.faults.len())
                .filter(|&i| self.faults[i].fault == kind)
                .collect();
            if indices.is_empty() {
                continue;
            }
            let at_holder = indices
                .iter()
                .filter(|&&i| {
                    self.shards
                        .values()
                        .any(|r| r.faults.get(i).is_some_and(|f| f.holder.is_some()))
                })
                .count();
            let outcomes: Vec<&FaultOutcome> = self
                .shards
                .values()
                .flat_map(|r| r.outcomes.iter().filter(|o| o.fault == kind))
                .collect();
            let takeovers: Vec<Takeover> = outcomes.iter().filter_map(|o| o.takeover).collect();
            let _ = writeln!(
                out,
                "{:<18} {:>6} {:>9} {:>9} {:>5} | {:>24} | {:>24}",
                format!("{kind:?}"),
                indices.len(),
                at_holder,
                takeovers.len(),
                outcomes.len() - takeovers.len(),
                show(min_median_max(takeovers.iter().map(|t| t.after).collect())),
                show(min_median_max(takeovers.iter().map(|t| t.gap).collect())),
            );
        }
        let stops: Vec<(Duration, usize)> = self
            .shards
            .values()
            .flat_map(|r| r.pause_stops.iter().copied())
            .collect();
        if let Some((min, median, max)) = min_median_max(stops.iter().map(|(d, _)| *d).collect()) {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let _ = writeln!(
                out,
                "paused holders: {}, ticks or steps after the resume: {}, worker stopped after the resume: {:.1} / {:.1} / {:.1} ms (min / median / max; shard tenures)",
                stops.len(),
                stops.iter().map(|(_, ran)| ran).sum::<usize>(),
                ms(min),
                ms(median),
                ms(max),
            );
        }
        if !self.clock_skews.is_empty() {
            let seen: Vec<f64> = self
                .clock_skews
                .iter()
                .flatten()
                .map(|o| *o as f64 / 1e9)
                .collect();
            let side = |ahead: bool| {
                let v: Vec<f64> = seen
                    .iter()
                    .filter(|o| (**o > 0.0) == ahead)
                    .map(|o| o.abs())
                    .collect();
                let word = if ahead { "ahead" } else { "behind" };
                match (
                    v.iter().copied().reduce(f64::min),
                    v.iter().copied().reduce(f64::max),
                ) {
                    (Some(least), Some(most)) => {
                        format!("{} {word} by {least:.1}..{most:.1}s", v.len())
                    }
                    _ => format!("0 {word}"),
                }
            };
            let _ = writeln!(
                out,
                "clock faults: {} (wall clock as the node's own events show it: {}, {}, {} with no event meanwhile)",
                self.clock_skews.len(),
                side(true),
                side(false),
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

/// A graceful stop of a sharded node hands over at once: of the shards it ran, the first runs
/// elsewhere within TTL / 2 (its release wakes a waiting node's watch), not after the TTL like a
/// crash. The fastest shard, not each: placement may send a released shard to the stopped node's
/// replacement, started at once, which takes seconds to start and claim, or to a node another
/// fault of the run just hit (a partition, an API server restart), and both cost time that is no
/// handover's (a short run in CI failed on one such shard, while the stopped node's other shards
/// ran elsewhere within 0.1 s).
pub fn assert_sharded_graceful_handovers(dir: &Path, ttl: Duration) {
    for (owner, fastest) in sharded_graceful_handovers(dir) {
        assert!(
            fastest < ttl / 2,
            "a graceful stop of {owner} took {fastest:?} to hand over its first shard (ttl {ttl:?})"
        );
    }
}

/// For each graceful stop of a node that ran shards which then ran elsewhere: the node, and the
/// time from the stop to the first start of one of its shards on another node.
pub fn sharded_graceful_handovers(dir: &Path) -> Vec<(String, Duration)> {
    let lines = |path: PathBuf| -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let mut events: Vec<(u64, String, String, bool)> = Vec::new(); // (t_ns, owner, shard, start)
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("node-") && name.ends_with(".jsonl")) {
            continue;
        }
        for e in lines(path) {
            let start = match e["event"].as_str() {
                Some("start") => true,
                Some("stop") => false,
                _ => continue,
            };
            if let (Some(t), Some(owner), Some(shard)) =
                (e["t_ns"].as_u64(), e["owner"].as_str(), e["shard"].as_str())
            {
                events.push((t, owner.to_owned(), shard.to_owned(), start));
            }
        }
    }
    events.sort();
    let mut result = Vec::new();
    for fault in lines(dir.join("faults.jsonl")) {
        if fault["fault"].as_str() != Some("GracefulStop") {
            continue;
        }
        let (Some(owner), Some(at)) = (fault["owner"].as_str(), fault["start_ns"].as_u64()) else {
            continue;
        };
        let mut running = std::collections::BTreeSet::new();
        for (_, o, shard, start) in events.iter().take_while(|e| e.0 <= at) {
            if o == owner {
                if *start {
                    running.insert(shard.clone());
                } else {
                    running.remove(shard);
                }
            }
        }
        let fastest = running
            .iter()
            .filter_map(|shard| {
                events
                    .iter()
                    .find(|(t, o, s, start)| *t > at && o != owner && s == shard && *start)
                    .map(|(t, ..)| Duration::from_nanos(t - at))
            })
            .min();
        if let Some(fastest) = fastest {
            result.push((owner.to_owned(), fastest));
        }
    }
    result
}
