//! A property-based check of the binding rule (see `actix_coordination::Binding`): random
//! schedules against three owners on one in-memory store, under tokio's paused clock. Each owner
//! has a member lease and a lease of each of two shared shard names, bound to its member. The
//! steps: acquire a member, acquire a shard (at once or waiting), release a member, release a
//! shard, a crash (every lease of an owner dropped, nothing released, and built again), faults
//! per owner (partition, pause, lost answers) and heals, an operator taking an owner's member
//! record, and clock advances. After every step, and in between whenever a tenure starts or ends
//! and every 50 ms of virtual time, it checks:
//!
//! * per shard, at most one owner has `check_alive() == true`;
//! * a bound lease alive ⇒ its owner's member alive, in the very member tenure the shard was
//!   claimed under, with the same deadline (the member lives at least as long);
//! * the store agrees: the shard record names the alive owner with its token and is held
//!   (judged by its member record); so does every alive member's record; and a shard record
//!   the store counts held is bound to its holder's member tenure that is live now, the very
//!   one it was claimed under (not a later one of the same owner);
//! * the fencing tokens of each shard strictly rise;
//! * a bound acquire without a live member tenure fails with `LeaseError::Unbound`;
//!
//! and at the end, that `on_lost` fired exactly once for each tenure that ended without its
//! owner's own release or drop (never for one that did), and that a bound tenure was only ever
//! lost with its member (`Unbound`, or `Expired` with it).
//!
//! `MODEL_CASES` sets the number of schedules (default 800) and `MODEL_SEED` (64 hex digits)
//! replays a run: the seed is printed with every failure. The check is shown to catch a backend
//! whose bound claims are plain claims (a record that expires by its TTL while the holder's
//! tenure follows its member).
//!
//! An operator taking a *live* member record is outside every lease's contract (its holder
//! cannot know before its watch, its next renewal or its deadline tells it, and a contender may
//! take the shards meanwhile): after such a step the schedule waits until the holder's member
//! tenure ended, and the store checks skip that member tenure's leases meanwhile. Exclusion
//! between owners is checked throughout.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_coordination::{
    InMemoryStore, Lease, LeaseError, LeaseLost, LostReason, LostSubscription,
};
use common::model::{
    cases, heal_and_settle, hex, lease, owner, paused_runtime, run_schedules, seed, Bug, Fault,
    ModelLease, TTL,
};
use futures_util::future::select_all;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tokio::time::Instant;

const OWNERS: usize = 3;
const SHARDS: usize = 2;

fn member_name(i: usize) -> String {
    format!("bmodel.member.{i}")
}

fn shard_name(s: usize) -> String {
    format!("bmodel.shard.{s}")
}

/// One step of a schedule.
#[derive(Debug, Clone)]
enum Op {
    AcquireMember(usize),
    /// Owner `.0` acquires shard `.1`.
    AcquireShard(usize, usize),
    /// Owner `.0` acquires shard `.1`, waiting up to this many milliseconds.
    AcquireShardWithin(usize, usize, u64),
    ReleaseMember(usize),
    ReleaseShard(usize, usize),
    /// Every lease of the owner dropped (nothing released), its member first or last, and built
    /// again.
    Crash(usize, bool),
    Fault(usize, Fault),
    Heal(usize),
    /// An operator takes the owner's member record (see the module docs).
    ForceTake(usize),
    /// Lets this many milliseconds of virtual time pass.
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let owner = 0..OWNERS;
    let shard = 0..SHARDS;
    let fault = prop_oneof![
        Just(Fault::Partition),
        Just(Fault::Pause),
        Just(Fault::ResponseLost),
    ];
    prop_oneof![
        3 => owner.clone().prop_map(Op::AcquireMember),
        4 => (owner.clone(), shard.clone()).prop_map(|(o, s)| Op::AcquireShard(o, s)),
        2 => (owner.clone(), shard.clone(), 0u64..5000)
            .prop_map(|(o, s, ms)| Op::AcquireShardWithin(o, s, ms)),
        1 => owner.clone().prop_map(Op::ReleaseMember),
        2 => (owner.clone(), shard).prop_map(|(o, s)| Op::ReleaseShard(o, s)),
        1 => (owner.clone(), any::<bool>()).prop_map(|(o, first)| Op::Crash(o, first)),
        2 => (owner.clone(), fault).prop_map(|(o, f)| Op::Fault(o, f)),
        2 => owner.clone().prop_map(Op::Heal),
        1 => owner.prop_map(Op::ForceTake),
        4 => (0u64..4000).prop_map(Op::Advance),
    ]
}

/// Which lease a tenure belongs to: an owner's member, or a shard name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Name {
    Member(usize),
    Shard(usize),
}

/// A tenure an acquire answered.
#[derive(Debug)]
struct Tenure {
    owner: usize,
    /// For a shard: the member tenure (its token) it was claimed under.
    member: Option<u64>,
    /// Ended by its owner's own release or drop.
    voluntary: bool,
}

/// What the checks remember across steps.
#[derive(Default)]
struct History {
    /// The highest token any acquire of each shard answered.
    max_token: [u64; SHARDS],
    tenures: BTreeMap<(Name, u64), Tenure>,
    /// `on_lost` notifications, by tenure.
    lost: BTreeMap<(Name, u64), Vec<LostReason>>,
    /// The member tenure of each owner that an operator overwrote.
    overwritten: [Option<u64>; OWNERS],
    violations: Vec<String>,
}

/// One owner's leases.
#[derive(Clone)]
struct Leases {
    member: ModelLease,
    shards: Vec<ModelLease>,
}

struct Owner {
    leases: Leases,
    /// The member's subscription, then each shard's.
    subscriptions: Vec<LostSubscription>,
}

fn subscribe(lease: &ModelLease, name: Name, history: &Arc<Mutex<History>>) -> LostSubscription {
    let history = Arc::clone(history);
    lease.on_lost(move |lost: &LeaseLost| {
        let token = lost.fencing_token.map_or(0, |t| t.value());
        history
            .lock()
            .unwrap()
            .lost
            .entry((name, token))
            .or_default()
            .push(lost.reason.clone());
    })
}

fn build(store: &InMemoryStore, i: usize, broken: bool, history: &Arc<Mutex<History>>) -> Owner {
    let bug = broken.then_some(Bug::BoundClaimAsPlain);
    let member = lease(store, &member_name(i), i, bug);
    let anchor = member
        .binding_anchor()
        .expect("the in-memory backend binds");
    let shards: Vec<ModelLease> = (0..SHARDS)
        .map(|s| {
            let shard = lease(store, &shard_name(s), i, bug);
            shard.bind_to(&anchor).expect("bound");
            shard
        })
        .collect();
    let mut subscriptions = vec![subscribe(&member, Name::Member(i), history)];
    for (s, shard) in shards.iter().enumerate() {
        subscriptions.push(subscribe(shard, Name::Shard(s), history));
    }
    Owner {
        leases: Leases { member, shards },
        subscriptions,
    }
}

/// Every check of one instant (see the module docs); the store's view only with `store_checks`.
fn check(
    store: &InMemoryStore,
    owners: &[Leases],
    history: &mut History,
    store_checks: bool,
    at: &str,
) {
    let now = Instant::now();
    let mut violations = Vec::new();
    let members: Vec<Option<(u64, Instant)>> = owners
        .iter()
        .map(|o| {
            o.member
                .tenure()
                .current()
                .map(|t| (t.token().value(), t.deadline()))
        })
        .collect();
    for (i, member) in members.iter().enumerate() {
        let Some((token, _)) = *member else { continue };
        if !store_checks || history.overwritten[i] == Some(token) {
            continue;
        }
        let record = store.record(&member_name(i));
        let ok = record.as_ref().is_some_and(|r| {
            r.holder.as_deref() == Some(owner(i).as_str())
                && r.token.value() == token
                && r.expires_at.is_some_and(|e| now < e)
        });
        if !ok {
            violations.push(format!(
                "{at}: owner-{i}'s member alive with token {token}, the store has {record:?}"
            ));
        }
    }
    for s in 0..SHARDS {
        // The store's judgement, checked against the rule itself: a bound record is held only
        // while its holder's member record shows the very tenure it was claimed under (a record
        // kept held through a *later* member tenure of the same owner would block every
        // contender with no tenure alive under it).
        if let (true, Some(holder), Some(record)) = (
            store_checks,
            store.holder(&shard_name(s)),
            store.record(&shard_name(s)),
        ) {
            if let Some((member, member_token)) = &record.bound_to {
                let member_record = store.record(member);
                let lives = member_record.as_ref().is_some_and(|m| {
                    m.holder.as_deref() == Some(holder.as_str())
                        && m.token == *member_token
                        && m.expires_at.is_some_and(|e| now < e)
                });
                if !lives {
                    violations.push(format!(
                        "{at}: the store has shard {s} held by {holder} bound to {member} tenure {member_token:?}, while that record is {member_record:?}"
                    ));
                }
            }
        }
        let alive: Vec<(usize, u64, Instant)> = owners
            .iter()
            .enumerate()
            .filter_map(|(i, o)| {
                o.shards[s]
                    .tenure()
                    .current()
                    .map(|t| (i, t.token().value(), t.deadline()))
            })
            .collect();
        if alive.len() > 1 {
            violations.push(format!(
                "{at}: owners alive at once on shard {s} (owner, token, deadline): {alive:?}"
            ));
        }
        for &(i, token, deadline) in &alive {
            let claimed_under = history
                .tenures
                .get(&(Name::Shard(s), token))
                .and_then(|t| t.member);
            match members[i] {
                Some((member, member_deadline)) if Some(member) == claimed_under => {
                    if deadline != member_deadline {
                        violations.push(format!(
                            "{at}: owner-{i}'s shard {s} (token {token}) has deadline {deadline:?}, its member {member_deadline:?}"
                        ));
                    }
                }
                other => violations.push(format!(
                    "{at}: owner-{i}'s shard {s} (token {token}) alive, claimed under member tenure {claimed_under:?}, while its member is {:?}",
                    other.map(|(token, _)| token)
                )),
            }
            if !store_checks
                || members[i].is_some_and(|(member, _)| history.overwritten[i] == Some(member))
            {
                continue;
            }
            let record = store.record(&shard_name(s));
            let holder = store.holder(&shard_name(s));
            let ok = holder.as_deref() == Some(owner(i).as_str())
                && record.as_ref().is_some_and(|r| r.token.value() == token);
            if !ok {
                violations.push(format!(
                    "{at}: owner-{i} alive on shard {s} with token {token}, the store has {record:?} held by {holder:?}"
                ));
            }
        }
    }
    history.violations.extend(violations);
}

/// The tenure of `lease` alive now, as `(token)`.
fn token(lease: &ModelLease) -> Option<u64> {
    lease.fencing_token().map(|t| t.value())
}

/// Marks the tenure of `lease` alive now (if any) as ended by its owner's own act.
fn mark_voluntary(history: &Mutex<History>, name: Name, lease: &ModelLease) {
    if let Some(token) = token(lease) {
        if let Some(t) = history.lock().unwrap().tenures.get_mut(&(name, token)) {
            t.voluntary = true;
        }
    }
}

/// How a run checks: the backend, and whether the store's view is checked too.
#[derive(Debug, Clone, Copy)]
struct Mode {
    broken: bool,
    store_checks: bool,
}

/// Runs one schedule; `Err` with the violations found.
fn run(ops: &[Op], mode: Mode) -> Result<(), TestCaseError> {
    let Mode {
        broken,
        store_checks,
    } = mode;
    paused_runtime().block_on(async {
        let store = InMemoryStore::new();
        let history = Arc::new(Mutex::new(History::default()));
        let mut owners: Vec<Owner> = (0..OWNERS)
            .map(|i| build(&store, i, broken, &history))
            .collect();
        // The checks between steps: whenever a tenure starts or ends anywhere, and every 50 ms
        // of virtual time.
        let current: Arc<Mutex<Vec<Leases>>> = Arc::new(Mutex::new(
            owners.iter().map(|o| o.leases.clone()).collect(),
        ));
        let checker = tokio::spawn({
            let (current, history, store) =
                (Arc::clone(&current), Arc::clone(&history), store.clone());
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(50));
                loop {
                    let leases = current.lock().unwrap().clone();
                    let at = format!("at {:?}", Instant::now());
                    check(&store, &leases, &mut history.lock().unwrap(), store_checks, &at);
                    let mut watches: Vec<_> = leases
                        .iter()
                        .flat_map(|o| std::iter::once(&o.member).chain(&o.shards))
                        .map(|l| l.tenure().clone())
                        .collect();
                    // Holds no lease while it waits: a dropped lease is dropped at once.
                    drop(leases);
                    let changes = select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
                    tokio::select! {
                        _ = changes => {}
                        _ = tick.tick() => {}
                    }
                }
            }
        });
        for (step, op) in ops.iter().enumerate() {
            let at = format!("step {step} ({op:?})");
            match *op {
                Op::AcquireMember(i) => {
                    let member = &owners[i].leases.member;
                    let before = token(member);
                    if let Ok(true) = member.acquire().await {
                        if let Some(token) = token(member).filter(|t| Some(*t) != before) {
                            history.lock().unwrap().tenures.insert(
                                (Name::Member(i), token),
                                Tenure {
                                    owner: i,
                                    member: None,
                                    voluntary: false,
                                },
                            );
                        }
                    }
                }
                Op::AcquireShard(i, s) | Op::AcquireShardWithin(i, s, _) => {
                    let Leases { member, shards } = &owners[i].leases;
                    let shard = &shards[s];
                    let before = token(shard);
                    let member_before = token(member);
                    let acquired = match *op {
                        Op::AcquireShardWithin(.., ms) => {
                            shard.acquire_within(Duration::from_millis(ms)).await
                        }
                        _ => shard.acquire().await,
                    };
                    let mut h = history.lock().unwrap();
                    match acquired {
                        Ok(true) => {
                            if let Some(token) = token(shard).filter(|t| Some(*t) != before) {
                                if token <= h.max_token[s] {
                                    let max = h.max_token[s];
                                    h.violations.push(format!(
                                        "{at}: shard {s} token {token} after {max}"
                                    ));
                                }
                                h.max_token[s] = h.max_token[s].max(token);
                                h.tenures.insert(
                                    (Name::Shard(s), token),
                                    Tenure {
                                        owner: i,
                                        member: member_before,
                                        voluntary: false,
                                    },
                                );
                            }
                        }
                        // A waiting acquire may see the member go meanwhile; one that starts
                        // without a member must say so at once.
                        Ok(false) if member_before.is_none() => h.violations.push(format!(
                            "{at}: a bound acquire without a member tenure answered Ok(false)"
                        )),
                        Err(LeaseError::Unbound { .. }) | Ok(false) => {}
                        Err(_) if member_before.is_some() => {}
                        Err(error) => h.violations.push(format!(
                            "{at}: a bound acquire without a member tenure failed with {error}, not Unbound"
                        )),
                    }
                }
                Op::ReleaseMember(i) => {
                    let member = &owners[i].leases.member;
                    mark_voluntary(&history, Name::Member(i), member);
                    let _ = member.release().await;
                }
                Op::ReleaseShard(i, s) => {
                    let shard = &owners[i].leases.shards[s];
                    mark_voluntary(&history, Name::Shard(s), shard);
                    let _ = shard.release().await;
                }
                Op::Crash(i, member_first) => {
                    let fresh = build(&store, i, broken, &history);
                    current.lock().unwrap()[i] = fresh.leases.clone();
                    let Owner {
                        leases: Leases { member, shards },
                        subscriptions,
                    } = std::mem::replace(&mut owners[i], fresh);
                    let drop_member = |member: ModelLease| {
                        mark_voluntary(&history, Name::Member(i), &member);
                        drop(member);
                    };
                    let mut member = Some(member);
                    if member_first {
                        drop_member(member.take().unwrap());
                    }
                    for (s, shard) in shards.into_iter().enumerate() {
                        mark_voluntary(&history, Name::Shard(s), &shard);
                        drop(shard);
                    }
                    if let Some(member) = member {
                        drop_member(member);
                    }
                    drop(subscriptions);
                }
                Op::Fault(i, fault) => store.set_owner_fault(&owner(i), Some(fault.in_memory())),
                Op::Heal(i) => store.heal(&owner(i)),
                Op::ForceTake(i) => {
                    let member = Arc::clone(&owners[i].leases.member);
                    history.lock().unwrap().overwritten[i] = token(&member);
                    store.force_take(&member_name(i), "operator", TTL);
                    // Nobody acts until the holder knows (its watch, its next renewal or its
                    // deadline).
                    let until = Instant::now() + TTL;
                    while member.check_alive() && Instant::now() < until {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    if member.check_alive() {
                        history.lock().unwrap().violations.push(format!(
                            "{at}: owner-{i}'s member outlived a TTL after an operator took it"
                        ));
                    }
                }
                Op::Advance(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            }
            let leases: Vec<Leases> = owners.iter().map(|o| o.leases.clone()).collect();
            check(&store, &leases, &mut history.lock().unwrap(), store_checks, &at);
        }
        // Settle: heal everything and let every tenure renew or end, so that each involuntary
        // end has been reported.
        heal_and_settle(&store, OWNERS).await;
        let leases: Vec<Leases> = owners.iter().map(|o| o.leases.clone()).collect();
        check(
            &store,
            &leases,
            &mut history.lock().unwrap(),
            store_checks,
            "after settling",
        );
        checker.abort();
        let mut alive = Vec::new();
        for (i, o) in leases.iter().enumerate() {
            alive.extend(token(&o.member).map(|t| (Name::Member(i), t)));
            for (s, shard) in o.shards.iter().enumerate() {
                alive.extend(token(shard).map(|t| (Name::Shard(s), t)));
            }
        }
        let mut h = history.lock().unwrap();
        let mut violations = std::mem::take(&mut h.violations);
        for (key, tenure) in &h.tenures {
            let lost = h.lost.get(key).map_or(&[][..], Vec::as_slice);
            let expected = usize::from(!tenure.voluntary && !alive.contains(key));
            if lost.len() != expected {
                violations.push(format!(
                    "tenure {key:?} of owner-{} ({}) had on_lost {lost:?}, not {expected} call(s)",
                    tenure.owner,
                    if tenure.voluntary { "released or dropped" } else { "not released" }
                ));
            }
            if let Name::Shard(_) = key.0 {
                let with_member = |reason: &LostReason| match reason {
                    LostReason::Unbound { member } => *member == member_name(tenure.owner),
                    LostReason::Expired { .. } => true,
                    _ => false,
                };
                if let Some(reason) = lost.iter().find(|r| !with_member(r)) {
                    violations.push(format!(
                        "bound tenure {key:?} of owner-{} was lost apart from its member: {reason}",
                        tenure.owner
                    ));
                }
            }
        }
        let unknown: Vec<_> = h.lost.keys().filter(|k| !h.tenures.contains_key(k)).collect();
        if !unknown.is_empty() {
            violations.push(format!("on_lost for tenures no acquire answered: {unknown:?}"));
        }
        count(&h);
        drop(h);
        drop(owners);
        if violations.is_empty() {
            return Ok(());
        }
        // The first ones tell the story (a broken run repeats itself every 50 ms).
        let more = violations.len().saturating_sub(12);
        violations.truncate(12);
        if more > 0 {
            violations.push(format!("… and {more} more"));
        }
        Err(TestCaseError::fail(violations.join("\n")))
    })
}

/// What the schedules of this process exercised, to show that they test something.
#[derive(Debug, Default)]
struct Exercised {
    /// Bound tenures (shard tenures) started.
    shard_tenures: AtomicU64,
    /// Shard tenures of an owner after another owner's tenure of the same shard.
    shard_moves: AtomicU64,
    /// Bound tenures that ended with their member: `Unbound`, `Expired`.
    unbound: AtomicU64,
    expired: AtomicU64,
}

static EXERCISED: Exercised = Exercised {
    shard_tenures: AtomicU64::new(0),
    shard_moves: AtomicU64::new(0),
    unbound: AtomicU64::new(0),
    expired: AtomicU64::new(0),
};

fn count(history: &History) {
    let mut last_owner: [Option<usize>; SHARDS] = [None; SHARDS];
    for ((name, _), tenure) in &history.tenures {
        if let Name::Shard(s) = *name {
            EXERCISED.shard_tenures.fetch_add(1, Ordering::Relaxed);
            if last_owner[s].is_some_and(|o| o != tenure.owner) {
                EXERCISED.shard_moves.fetch_add(1, Ordering::Relaxed);
            }
            last_owner[s] = Some(tenure.owner);
        }
    }
    for ((name, _), reasons) in &history.lost {
        if let Name::Shard(_) = name {
            for reason in reasons {
                match reason {
                    LostReason::Unbound { .. } => &EXERCISED.unbound,
                    LostReason::Expired { .. } => &EXERCISED.expired,
                    _ => continue,
                }
                .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Runs `cases` schedules of up to 40 steps from `seed`; the failure (shrunk to a minimal
/// schedule) as text.
fn check_schedules(cases: u32, seed: [u8; 32], mode: Mode) -> Result<(), String> {
    run_schedules(op(), 40, cases, seed, |ops| run(ops, mode))
}

const CORRECT: Mode = Mode {
    broken: false,
    store_checks: true,
};

#[test]
fn bound_leases_live_and_die_with_their_member_on_random_schedules() {
    let cases = cases("MODEL_CASES", 800);
    let seed = seed();
    let started = std::time::Instant::now();
    if let Err(failure) = check_schedules(cases, seed, CORRECT) {
        panic!(
            "the binding rule failed (replay with MODEL_SEED={}):\n{failure}",
            hex(&seed)
        );
    }
    let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
    let (tenures, moves) = (load(&EXERCISED.shard_tenures), load(&EXERCISED.shard_moves));
    let (unbound, expired) = (load(&EXERCISED.unbound), load(&EXERCISED.expired));
    println!(
        "{cases} schedules passed in {:?} (MODEL_SEED={}): {tenures} bound tenures, {moves} moved to another owner, {unbound} ended unbound, {expired} expired with their member",
        started.elapsed(),
        hex(&seed)
    );
    assert!(
        tenures > 0 && moves > 0 && unbound > 0 && expired > 0,
        "the schedules miss the binding's cases"
    );
}

/// Bound claims written as plain claims: the record expires by its TTL while the holder's
/// tenure follows its member. The store's view disagrees with the holder, and, with the store's
/// view left out, two owners are alive at once.
#[test]
fn the_check_catches_bound_claims_written_as_plain_claims() {
    let seed = seed();
    for store_checks in [true, false] {
        let mode = Mode {
            broken: true,
            store_checks,
        };
        let failure = check_schedules(400, seed, mode).expect_err(&format!(
            "bound claims written as plain claims went unnoticed with {mode:?} (MODEL_SEED={})",
            hex(&seed)
        ));
        let expected = if store_checks {
            "the store has"
        } else {
            "alive at once"
        };
        assert!(failure.contains(expected), "{mode:?}: {failure}");
        println!(
            "caught with {mode:?} (MODEL_SEED={}):\n{failure}",
            hex(&seed)
        );
    }
}
