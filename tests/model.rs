//! A property-based check of the lease contract: random schedules of acquire, release, drop,
//! store faults (partition, pause, lost answers, slow answers), heals and clock advances, run
//! against three owners' [`ManagedLease`]s on one in-memory store under tokio's paused clock.
//! After every step, and in between whenever a tenure starts or ends and every 50 ms of virtual
//! time, it checks:
//!
//! * at most one owner has `check_alive() == true`, and the store agrees that owner holds the
//!   lease with that token, unexpired;
//! * every new tenure's fencing token is higher than every token seen before;
//! * `on_lost` fires exactly once for each tenure that ended without a release or a drop through
//!   this owner, and never for one that was released or dropped.
//!
//! The actors on top get the same schedules (faults, heals, releases through another handle,
//! clock advances): three `ClusterSingletonManager`s, whose singletons check every step of their
//! work against the store, and three `ShardCoordinator`s, whose every allocation is checked
//! against the store when the region receives it and when the coordinator answers it as done.
//! Neither may work outside a live tenure. And three `LeaseActor`s sharing the owners' leases get
//! acquires and releases sent in either order, back to back, and stops with an acquire in flight:
//! every message is answered, an acquire is superseded only by a later release or the stop, an
//! actor whose last message was a release holds nothing at the end, and neither does the lease
//! of an actor that stopped (another handle keeps it).
//!
//! A fourth check runs leases whose acquires come from runtimes that shut down at random points
//! (real runtimes and the real clock, since a paused clock belongs to one runtime): no tenure
//! outlives the runtime that renewed it, and each such end is reported exactly once (issue 27,
//! item 2).
//!
//! `MODEL_CASES` sets the number of schedules (default 5,000), `MODEL_ACTOR_CASES` those of each
//! actor check (default 500), `MODEL_RUNTIME_CASES` those of the runtime check (default 40), and `MODEL_SEED` (64 hex digits) replays a run: the seed is printed
//! with every failure. Each check is shown to fail on a deliberately broken renewal (one that
//! reports success when the store did not answer).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_coordination::{
    FencingToken, InMemoryLease, InMemoryStore, Lease, LeaseLost, LeaseSettings, LostSubscription,
    ManagedLease,
};
use common::model::{
    cases, heal_and_settle, hex, lease, paused_runtime, run_schedules, seed, Bug, Fault,
    ModelBackend, TTL,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tokio::time::Instant;

const NAME: &str = "model";
const OWNERS: usize = 3;

/// One step of a schedule.
#[derive(Debug, Clone)]
enum Op {
    Acquire(usize),
    /// `acquire_within` this many milliseconds.
    AcquireWithin(usize, u64),
    Release(usize),
    /// Drops the instance (like a crash of the process: nothing is released) and makes a new one.
    Drop(usize),
    Fault(usize, Fault),
    Heal(usize),
    /// Lets this many milliseconds of virtual time pass.
    Advance(u64),
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        Just(Fault::Partition),
        Just(Fault::Pause),
        Just(Fault::ResponseLost),
        (1u64..1500).prop_map(Fault::SlowAnswer),
        (1u64..1500).prop_map(Fault::Delay),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let owner = 0..OWNERS;
    let fault = fault();
    prop_oneof![
        3 => owner.clone().prop_map(Op::Acquire),
        2 => (owner.clone(), 0u64..5000).prop_map(|(o, ms)| Op::AcquireWithin(o, ms)),
        2 => owner.clone().prop_map(Op::Release),
        1 => owner.clone().prop_map(Op::Drop),
        2 => (owner.clone(), fault).prop_map(|(o, f)| Op::Fault(o, f)),
        2 => owner.prop_map(Op::Heal),
        4 => (0u64..4000).prop_map(Op::Advance),
    ]
}

/// What the checks remember across steps.
#[derive(Default)]
struct History {
    /// The highest token any acquire answered.
    max_token: u64,
    /// Every tenure: owner and whether it ended by a release or a drop through that owner.
    tenures: BTreeMap<u64, (usize, bool)>,
    /// `on_lost` notifications, by token.
    lost: BTreeMap<u64, usize>,
    violations: Vec<String>,
}

struct Node {
    lease: Arc<ManagedLease<ModelBackend>>,
    _lost: LostSubscription,
}

fn node(store: &InMemoryStore, owner: usize, broken: bool, history: &Arc<Mutex<History>>) -> Node {
    let lease = lease(
        store,
        NAME,
        owner,
        broken.then_some(Bug::RenewalWithoutAnswer),
    );
    let lost = lease.on_lost({
        let history = Arc::clone(history);
        move |lost: &LeaseLost| {
            let token = lost.fencing_token.map_or(0, |t| t.value());
            *history.lock().unwrap().lost.entry(token).or_default() += 1;
        }
    });
    Node { lease, _lost: lost }
}

/// At most one owner alive, and the store agrees with it.
fn check_exclusion(store: &InMemoryStore, nodes: &[Node], history: &Mutex<History>, at: &str) {
    let alive: Vec<(usize, u64)> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| n.lease.fencing_token().map(|t| (i, t.value())))
        .collect();
    let mut history = history.lock().unwrap();
    if alive.len() > 1 {
        history
            .violations
            .push(format!("{at}: owners alive at once: {alive:?}"));
    }
    if let Some(&(owner, token)) = alive.first() {
        let record = store.record(NAME);
        let ok = record.as_ref().is_some_and(|r| {
            r.holder.as_deref() == Some(&format!("owner-{owner}"))
                && r.token.value() == token
                && r.expires_at.is_some_and(|e| Instant::now() < e)
        });
        if !ok {
            history.violations.push(format!(
                "{at}: owner-{owner} alive with token {token}, the store has {record:?}"
            ));
        }
    }
}

/// Runs one schedule; `Err` with every violation found.
fn run(ops: &[Op], broken: bool) -> Result<(), TestCaseError> {
    paused_runtime().block_on(async {
        let store = InMemoryStore::new();
        let history = Arc::new(Mutex::new(History::default()));
        let mut nodes: Vec<Node> = (0..OWNERS)
            .map(|i| node(&store, i, broken, &history))
            .collect();
        // Exclusion between steps: whenever a tenure starts or ends anywhere, and every 50 ms of
        // virtual time.
        let current: Arc<Mutex<Vec<Arc<ManagedLease<ModelBackend>>>>> = Arc::new(Mutex::new(
            nodes.iter().map(|n| Arc::clone(&n.lease)).collect(),
        ));
        let checker = tokio::spawn({
            let current = Arc::clone(&current);
            let history = Arc::clone(&history);
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(50));
                loop {
                    let leases = current.lock().unwrap().clone();
                    let alive: Vec<usize> = (0..OWNERS).filter(|i| leases[*i].check_alive()).collect();
                    if alive.len() > 1 {
                        history.lock().unwrap().violations.push(format!(
                            "at {:?}: owners alive at once: {alive:?}",
                            Instant::now()
                        ));
                    }
                    let mut watches: Vec<_> = leases.iter().map(|l| l.tenure().clone()).collect();
                    // Holds no lease while it waits: a dropped lease is dropped at once.
                    drop(leases);
                    let [a, b, c] = &mut watches[..] else { unreachable!() };
                    tokio::select! {
                        _ = a.changed() => {}
                        _ = b.changed() => {}
                        _ = c.changed() => {}
                        _ = tick.tick() => {}
                    }
                }
            }
        });
        for (step, op) in ops.iter().enumerate() {
            let at = format!("step {step} ({op:?})");
            match *op {
                Op::Acquire(i) | Op::AcquireWithin(i, _) => {
                    let before = nodes[i].lease.fencing_token();
                    let lease = &nodes[i].lease;
                    let acquired = match *op {
                        Op::AcquireWithin(_, ms) => {
                            lease.acquire_within(Duration::from_millis(ms)).await
                        }
                        _ => lease.acquire().await,
                    };
                    if matches!(acquired, Ok(true)) {
                        if let Some(token) = lease.fencing_token() {
                            let token = token.value();
                            let mut h = history.lock().unwrap();
                            if before.map(|t| t.value()) != Some(token) {
                                if token <= h.max_token {
                                    let max = h.max_token;
                                    h.violations.push(format!("{at}: token {token} after {max}"));
                                }
                                h.max_token = h.max_token.max(token);
                                h.tenures.insert(token, (i, false));
                            }
                        }
                    }
                }
                Op::Release(i) => {
                    if let Some(token) = nodes[i].lease.fencing_token() {
                        if let Some(t) = history.lock().unwrap().tenures.get_mut(&token.value()) {
                            t.1 = true;
                        }
                    }
                    let _ = nodes[i].lease.release().await;
                }
                Op::Drop(i) => {
                    if let Some(token) = nodes[i].lease.fencing_token() {
                        if let Some(t) = history.lock().unwrap().tenures.get_mut(&token.value()) {
                            t.1 = true;
                        }
                    }
                    // The owner drops its lease, then its subscription: a tenure past its
                    // deadline that nobody noticed yet is reported lost by the drop.
                    let fresh = node(&store, i, broken, &history);
                    current.lock().unwrap()[i] = Arc::clone(&fresh.lease);
                    let Node { lease, _lost } = std::mem::replace(&mut nodes[i], fresh);
                    drop(lease);
                    drop(_lost);
                }
                Op::Fault(i, fault) => {
                    store.set_owner_fault(&format!("owner-{i}"), Some(fault.in_memory()));
                }
                Op::Heal(i) => store.heal(&format!("owner-{i}")),
                Op::Advance(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            }
            check_exclusion(&store, &nodes, &history, &at);
        }
        // Settle: heal everything and let every tenure end or renew, so that each involuntary end
        // has been reported.
        heal_and_settle(&store, OWNERS).await;
        check_exclusion(&store, &nodes, &history, "after settling");
        checker.abort();
        let alive: BTreeSet<u64> = nodes
            .iter()
            .filter_map(|n| n.lease.fencing_token().map(|t| t.value()))
            .collect();
        let mut h = history.lock().unwrap();
        let tenures = h.tenures.clone();
        for (token, (owner, voluntary)) in tenures {
            if alive.contains(&token) {
                continue;
            }
            let lost = h.lost.get(&token).copied().unwrap_or(0);
            let expected = if voluntary { 0 } else { 1 };
            if lost != expected {
                h.violations.push(format!(
                    "tenure {token} of owner-{owner} ({}) ended with {lost} on_lost calls, not {expected}",
                    if voluntary { "released or dropped" } else { "lost" }
                ));
            }
        }
        let unknown: Vec<u64> = h
            .lost
            .keys()
            .filter(|t| !h.tenures.contains_key(t))
            .copied()
            .collect();
        if !unknown.is_empty() {
            h.violations
                .push(format!("on_lost for tenures no acquire answered: {unknown:?}"));
        }
        if h.violations.is_empty() {
            Ok(())
        } else {
            Err(TestCaseError::fail(h.violations.join("\n")))
        }
    })
}

/// Runs `cases` schedules of up to 40 steps from `seed`.
fn check(cases: u32, seed: [u8; 32], broken: bool) -> Result<(), String> {
    run_schedules(op(), 40, cases, seed, |ops| run(ops, broken))
}

#[test]
fn the_contract_holds_on_random_schedules_of_faults() {
    let cases = cases("MODEL_CASES", 5_000);
    let seed = seed();
    let started = std::time::Instant::now();
    if let Err(failure) = check(cases, seed, false) {
        panic!(
            "the lease contract failed (replay with MODEL_SEED={}):\n{failure}",
            hex(&seed)
        );
    }
    println!(
        "{cases} schedules passed in {:?} (MODEL_SEED={})",
        started.elapsed(),
        hex(&seed)
    );
}

/// The steps both actor schedules share.
#[derive(Debug, Clone)]
enum CommonOp {
    Fault(usize, Fault),
    Heal(usize),
    /// A release through another handle of the actor's lease.
    Release(usize),
    Advance(u64),
}

fn common_op() -> impl Strategy<Value = CommonOp> {
    let owner = 0..OWNERS;
    prop_oneof![
        2 => (owner.clone(), fault()).prop_map(|(o, f)| CommonOp::Fault(o, f)),
        2 => owner.clone().prop_map(CommonOp::Heal),
        1 => owner.prop_map(CommonOp::Release),
        4 => (0u64..4000).prop_map(CommonOp::Advance),
    ]
}

/// What the actor checks share: three owners' leases on a fresh store (under the paused clock of
/// the actix system they run in), the violations found and a count of the work the actors did.
struct ActorWorld {
    store: InMemoryStore,
    nodes: Vec<Node>,
    violations: Arc<Mutex<Vec<String>>>,
    work: Arc<std::sync::atomic::AtomicU64>,
}

impl ActorWorld {
    fn new(broken: bool) -> Self {
        tokio::time::pause();
        let store = InMemoryStore::new();
        let history = Arc::new(Mutex::new(History::default()));
        let nodes = (0..OWNERS)
            .map(|i| node(&store, i, broken, &history))
            .collect();
        Self {
            store,
            nodes,
            violations: Arc::new(Mutex::new(Vec::new())),
            work: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        }
    }

    async fn step(&self, op: &CommonOp) {
        match *op {
            CommonOp::Fault(i, fault) => {
                self.store
                    .set_owner_fault(&format!("owner-{i}"), Some(fault.in_memory()));
            }
            CommonOp::Heal(i) => self.store.heal(&format!("owner-{i}")),
            CommonOp::Release(i) => {
                let lease = Arc::clone(&self.nodes[i].lease);
                actix::spawn(async move {
                    let _ = lease.release().await;
                });
            }
            CommonOp::Advance(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }

    /// Heals every owner and lets the actors run for two more TTLs.
    async fn heal_and_run_on(&self) {
        heal_and_settle(&self.store, OWNERS).await;
    }

    /// Adds the work done to `total`; `Err` with every violation found.
    fn verdict(&self, total: &std::sync::atomic::AtomicU64) -> Result<(), TestCaseError> {
        use std::sync::atomic::Ordering::Relaxed;
        total.fetch_add(self.work.load(Relaxed), Relaxed);
        let violations = self.violations.lock().unwrap();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(TestCaseError::fail(violations.join("\n")))
        }
    }
}

/// A step of a schedule for singleton managers.
#[derive(Debug, Clone)]
enum ActorOp {
    Common(CommonOp),
    Eligible(usize, bool),
}

fn actor_op() -> impl Strategy<Value = ActorOp> {
    prop_oneof![
        9 => common_op().prop_map(ActorOp::Common),
        1 => (0..OWNERS, any::<bool>()).prop_map(|(o, e)| ActorOp::Eligible(o, e)),
    ]
}

/// A singleton that works every 20 ms under its guard, and checks each step against the store:
/// the step runs only if the store holds the lease for this owner and this token, unexpired.
struct Worker {
    info: actix_coordination::SingletonInfo,
    store: InMemoryStore,
    violations: Arc<Mutex<Vec<String>>>,
    steps: Arc<std::sync::atomic::AtomicU64>,
}

impl actix::Actor for Worker {
    type Context = actix::Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        use actix::AsyncContext;
        ctx.run_interval(Duration::from_millis(20), |worker, _| {
            if !worker.info.guard.check_alive() {
                return;
            }
            let record = worker.store.record(NAME);
            let holds = record.as_ref().is_some_and(|r| {
                r.holder.as_deref() == Some(worker.info.owner.as_str())
                    && r.token == worker.info.fencing_token
                    && r.expires_at.is_some_and(|e| Instant::now() < e)
            });
            if !holds {
                worker.violations.lock().unwrap().push(format!(
                    "{} worked under token {} while the store had {record:?}",
                    worker.info.owner, worker.info.fencing_token
                ));
            }
            worker
                .steps
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
    }
}

/// Runs one schedule against three singleton managers; `Err` with every violation found.
fn run_actors(ops: &[ActorOp], broken: bool) -> Result<(), TestCaseError> {
    use actix::Actor;
    let system = actix::System::new();
    system.block_on(async {
        let world = ActorWorld::new(broken);
        let managers: Vec<_> = world
            .nodes
            .iter()
            .map(|n| {
                let (store, violations, steps) = (
                    world.store.clone(),
                    Arc::clone(&world.violations),
                    Arc::clone(&world.work),
                );
                actix_coordination::ClusterSingletonManager::from_arc(
                    Arc::clone(&n.lease),
                    move |info: &actix_coordination::SingletonInfo, _| Worker {
                        info: info.clone(),
                        store: store.clone(),
                        violations: Arc::clone(&violations),
                        steps: Arc::clone(&steps),
                    },
                )
                .settings(actix_coordination::SingletonSettings {
                    stop_timeout: Duration::from_millis(500),
                    max_error_backoff: Duration::from_secs(1),
                    ..Default::default()
                })
                .start()
            })
            .collect();
        for op in ops {
            match op {
                ActorOp::Common(op) => world.step(op).await,
                ActorOp::Eligible(i, eligible) => {
                    managers[*i]
                        .send(actix_coordination::SetEligible(*eligible))
                        .await
                        .unwrap();
                }
            }
        }
        world.heal_and_run_on().await;
        for manager in &managers {
            let _ = manager.send(actix_coordination::Shutdown).await;
        }
        world.verdict(&ACTOR_STEPS)
    })
}

/// Steps the singletons took, over every schedule of this process.
static ACTOR_STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn check_actors(cases: u32, seed: [u8; 32], broken: bool) -> Result<(), String> {
    run_schedules(actor_op(), 30, cases, seed, |ops| run_actors(ops, broken))
}

fn actor_cases() -> u32 {
    cases("MODEL_ACTOR_CASES", 500)
}

#[test]
fn singletons_only_work_under_a_live_tenure() {
    let (cases, seed) = (actor_cases(), seed());
    if let Err(failure) = check_actors(cases, seed, false) {
        panic!(
            "a singleton worked outside a live tenure (replay with MODEL_SEED={}):\n{failure}",
            hex(&seed)
        );
    }
    assert!(
        ACTOR_STEPS.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no singleton ever worked: the schedules test nothing"
    );
    // The same check catches singletons that run on a broken renewal.
    let failure =
        check_actors(cases, seed, true).expect_err("singletons on a broken renewal went unnoticed");
    assert!(failure.contains("worked under token"), "{failure}");
}

/// A step of a schedule for lease actors.
#[derive(Debug, Clone)]
enum LeaseActorOp {
    Common(CommonOp),
    /// Sends `Acquire` to owner `.0`'s actor (its answer is awaited on a task of its own).
    Acquire(usize),
    /// Sends `Release` to owner `.0`'s actor.
    Release(usize),
    /// Sends `Acquire` and `Release` back to back, `Acquire` first when `.1`.
    Both(usize, bool),
    /// Stops owner `.0`'s actor (drops its every address), right after sending it `Acquire` when
    /// `.1`, and starts a fresh actor on a fresh lease instance of that owner. The stopped actor's
    /// lease is kept, like a provider's shared lease.
    Stop(usize, bool),
}

fn lease_actor_op() -> impl Strategy<Value = LeaseActorOp> {
    let owner = 0..OWNERS;
    prop_oneof![
        6 => common_op().prop_map(LeaseActorOp::Common),
        3 => owner.clone().prop_map(LeaseActorOp::Acquire),
        2 => owner.clone().prop_map(LeaseActorOp::Release),
        2 => (owner.clone(), any::<bool>()).prop_map(|(o, a)| LeaseActorOp::Both(o, a)),
        1 => (owner, any::<bool>()).prop_map(|(o, a)| LeaseActorOp::Stop(o, a)),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Message {
    Acquire,
    Release,
}

/// The messages one actor was sent, in order, with their answers once they came.
type Exchanges = std::rc::Rc<std::cell::RefCell<Vec<(Message, Option<String>)>>>;

type ModelActor = actix_coordination::LeaseActor<ManagedLease<ModelBackend>>;

/// One owner's lease actor, on its lease.
struct ActorSlot {
    lease: Arc<ManagedLease<ModelBackend>>,
    /// `None` once stopped.
    addr: Option<actix::Addr<ModelActor>>,
    sent: Exchanges,
    /// Counts the acquires answered `Ok(true)`.
    acquired: Arc<std::sync::atomic::AtomicU64>,
}

impl ActorSlot {
    fn start(
        lease: &Arc<ManagedLease<ModelBackend>>,
        acquired: &Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        use actix::Actor;
        Self {
            lease: Arc::clone(lease),
            addr: Some(actix_coordination::LeaseActor::from_arc(Arc::clone(lease)).start()),
            sent: Default::default(),
            acquired: Arc::clone(acquired),
        }
    }

    /// Sends `message` now (it is in the mailbox when this returns) and records its answer when
    /// it comes.
    fn send(&self, message: Message) {
        let sent = std::rc::Rc::clone(&self.sent);
        let index = {
            let mut sent = sent.borrow_mut();
            sent.push((message, None));
            sent.len() - 1
        };
        let acquired = Arc::clone(&self.acquired);
        let record = move |answer: String| {
            if message == Message::Acquire && answer == "Ok(Ok(true))" {
                acquired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if answer.contains("Superseded") {
                SUPERSEDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            sent.borrow_mut()[index].1 = Some(answer);
        };
        let addr = self.addr.as_ref().expect("a running actor");
        match message {
            Message::Acquire => {
                let request = addr.send(actix_coordination::Acquire);
                actix::spawn(async move { record(format!("{:?}", request.await)) });
            }
            Message::Release => {
                let request = addr.send(actix_coordination::Release);
                actix::spawn(async move { record(format!("{:?}", request.await)) });
            }
        }
    }

    /// What is wrong with this actor's exchanges at the end of a schedule: a message never
    /// answered; an acquire superseded although nothing was sent after it (and the actor was not
    /// stopped); and a lease held although the last message was a release, or the actor stopped.
    fn check(&self, owner: usize, stopped: Option<usize>, violations: &mut Vec<String>) {
        let who = match stopped {
            Some(step) => format!("owner-{owner}'s actor stopped at step {step}"),
            None => format!("owner-{owner}'s actor"),
        };
        let sent = self.sent.borrow();
        for (i, (message, answer)) in sent.iter().enumerate() {
            match answer {
                None => violations.push(format!("{who}: {message:?} #{i} was never answered")),
                Some(answer)
                    if answer.contains("Superseded")
                        && stopped.is_none()
                        && !sent[i + 1..].iter().any(|(m, _)| *m == Message::Release) =>
                {
                    violations.push(format!(
                        "{who}: {message:?} #{i} answered {answer} with no release after it"
                    ))
                }
                Some(_) => {}
            }
        }
        let last_release = sent.last().is_some_and(|(m, _)| *m == Message::Release);
        if (stopped.is_some() || last_release) && self.lease.check_alive() {
            violations.push(format!(
                "{who} still holds the lease (token {:?}); its messages: {sent:?}",
                self.lease.fencing_token()
            ));
        }
    }
}

/// Runs one schedule against three lease actors sharing their owners' leases; `Err` with every
/// violation found. Every message is answered; an acquire is superseded only by a release sent
/// after it or by the stop; an actor whose last message was a release, and an actor that
/// stopped (with its lease kept by another handle), hold nothing at the end.
fn run_lease_actors(ops: &[LeaseActorOp]) -> Result<(), TestCaseError> {
    let system = actix::System::new();
    system.block_on(async {
        let mut world = ActorWorld::new(false);
        let history = Arc::new(Mutex::new(History::default()));
        let mut slots: Vec<ActorSlot> = world
            .nodes
            .iter()
            .map(|n| ActorSlot::start(&n.lease, &world.work))
            .collect();
        let mut stopped: Vec<(usize, usize, ActorSlot)> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            match *op {
                LeaseActorOp::Common(ref op) => world.step(op).await,
                LeaseActorOp::Acquire(i) => slots[i].send(Message::Acquire),
                LeaseActorOp::Release(i) => slots[i].send(Message::Release),
                LeaseActorOp::Both(i, acquire_first) => {
                    let (first, second) = if acquire_first {
                        (Message::Acquire, Message::Release)
                    } else {
                        (Message::Release, Message::Acquire)
                    };
                    slots[i].send(first);
                    slots[i].send(second);
                }
                LeaseActorOp::Stop(i, with_acquire) => {
                    if with_acquire {
                        slots[i].send(Message::Acquire);
                    }
                    world.nodes[i] = node(&world.store, i, false, &history);
                    let fresh = ActorSlot::start(&world.nodes[i].lease, &world.work);
                    let mut old = std::mem::replace(&mut slots[i], fresh);
                    // The old actor's last address goes: it stops.
                    old.addr = None;
                    stopped.push((i, step, old));
                }
            }
            // Lets the actors take their messages before the next step (their mailboxes stay
            // short, so that every send is in order).
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        world.heal_and_run_on().await;
        let mut violations = Vec::new();
        for (owner, slot) in slots.iter().enumerate() {
            slot.check(owner, None, &mut violations);
        }
        for (owner, step, slot) in &stopped {
            slot.check(*owner, Some(*step), &mut violations);
        }
        world.violations.lock().unwrap().extend(violations);
        world.verdict(&LEASE_ACTOR_ACQUIRES)
    })
}

/// Acquires the lease actors answered `Ok(true)`, over every schedule of this process.
static LEASE_ACTOR_ACQUIRES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Acquires answered `Superseded`, over every schedule of this process.
static SUPERSEDED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[test]
fn lease_actors_follow_their_messages_in_order_and_release_on_stop() {
    let (cases, seed) = (actor_cases(), seed());
    if let Err(failure) = run_schedules(lease_actor_op(), 30, cases, seed, run_lease_actors) {
        panic!(
            "a lease actor broke the order of its messages or kept a lease (replay with MODEL_SEED={}):\n{failure}",
            hex(&seed)
        );
    }
    let acquires = LEASE_ACTOR_ACQUIRES.load(std::sync::atomic::Ordering::Relaxed);
    let superseded = SUPERSEDED.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        acquires > 0,
        "no actor ever acquired: the schedules test nothing"
    );
    assert!(
        superseded > 0,
        "no acquire was ever superseded: the schedules miss the races"
    );
    println!("{cases} lease actor schedules passed: {acquires} acquires, {superseded} superseded");
}

/// A step of a schedule for shard coordinators.
#[derive(Debug, Clone)]
enum CoordinatorOp {
    Common(CommonOp),
    /// Register both regions with coordinator `.0` and ask it to allocate shard `.1` (requests
    /// wait in the coordinator's queue while it has no tenure).
    Allocate(usize, u8),
}

fn coordinator_op() -> impl Strategy<Value = CoordinatorOp> {
    prop_oneof![
        9 => common_op().prop_map(CoordinatorOp::Common),
        4 => (0..OWNERS, 0u8..6).prop_map(|(o, s)| CoordinatorOp::Allocate(o, s)),
    ]
}

/// Whether the store holds the lease under `token`, unexpired: the check of every step a
/// coordinator takes.
fn store_holds(store: &InMemoryStore, token: FencingToken) -> bool {
    store.record(NAME).is_some_and(|r| {
        r.holder.is_some() && r.token == token && r.expires_at.is_some_and(|e| Instant::now() < e)
    })
}

/// A region: it checks each shard it is told to host against the store, at the moment it
/// receives it (the coordinator sent it under a tenure it had just checked: the store must still
/// hold that tenure; the paused clock does not move while a message is in flight).
struct Region {
    store: InMemoryStore,
    violations: Arc<Mutex<Vec<String>>>,
    hosted: Arc<std::sync::atomic::AtomicU64>,
}

impl actix::Actor for Region {
    type Context = actix::Context<Self>;
}

impl actix::Handler<actix_coordination::HostShard> for Region {
    type Result = ();

    fn handle(&mut self, host: actix_coordination::HostShard, _: &mut Self::Context) {
        if !store_holds(&self.store, host.fencing_token) {
            self.violations.lock().unwrap().push(format!(
                "shard {} allocated under token {} while the store had {:?}",
                host.shard,
                host.fencing_token,
                self.store.record(NAME)
            ));
        }
        self.hosted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Runs one schedule against three shard coordinators; `Err` with every violation found. Every
/// allocation a region receives, and every allocation a coordinator answers as done, must carry
/// a token the store holds at that moment.
fn run_coordinators(ops: &[CoordinatorOp], broken: bool) -> Result<(), TestCaseError> {
    use actix::Actor;
    let system = actix::System::new();
    system.block_on(async {
        let world = ActorWorld::new(broken);
        let coordinators: Vec<_> = world
            .nodes
            .iter()
            .map(|n| {
                actix_coordination::ShardCoordinator::from_arc(Arc::clone(&n.lease))
                    .with_max_error_backoff(Duration::from_secs(1))
                    .with_queue_bound(16, Duration::from_secs(2))
                    .start()
            })
            .collect();
        let regions: Vec<_> = (0..2)
            .map(|_| {
                Region {
                    store: world.store.clone(),
                    violations: Arc::clone(&world.violations),
                    hosted: Arc::clone(&world.work),
                }
                .start()
            })
            .collect();
        for op in ops {
            match op {
                CoordinatorOp::Common(op) => world.step(op).await,
                &CoordinatorOp::Allocate(i, shard) => {
                    let coordinator = coordinators[i].clone();
                    let recipients: Vec<_> =
                        regions.iter().map(|r| r.clone().recipient()).collect();
                    let (store, violations) = (world.store.clone(), Arc::clone(&world.violations));
                    actix::spawn(async move {
                        for region in recipients {
                            let _ = coordinator
                                .send(actix_coordination::RegisterRegion(region))
                                .await;
                        }
                        let answer = coordinator
                            .send(actix_coordination::AllocateShard(format!("shard-{shard}")))
                            .await;
                        if let Ok(Ok(allocation)) = answer {
                            if !store_holds(&store, allocation.fencing_token) {
                                violations.lock().unwrap().push(format!(
                                    "owner-{i} answered an allocation of {} under token {} while the store had {:?}",
                                    allocation.shard,
                                    allocation.fencing_token,
                                    store.record(NAME)
                                ));
                            }
                        }
                    });
                }
            }
        }
        world.heal_and_run_on().await;
        // A coordinator stops when its last address is gone, and releases its lease.
        drop(coordinators);
        tokio::time::sleep(TTL).await;
        world.verdict(&COORDINATOR_ALLOCATIONS)
    })
}

/// Shards the regions were told to host, over every schedule of this process.
static COORDINATOR_ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn check_coordinators(cases: u32, seed: [u8; 32], broken: bool) -> Result<(), String> {
    run_schedules(coordinator_op(), 30, cases, seed, |ops| {
        run_coordinators(ops, broken)
    })
}

#[test]
fn coordinators_only_allocate_under_a_live_tenure() {
    let (cases, seed) = (actor_cases(), seed());
    if let Err(failure) = check_coordinators(cases, seed, false) {
        panic!(
            "a coordinator allocated outside a live tenure (replay with MODEL_SEED={}):\n{failure}",
            hex(&seed)
        );
    }
    let allocations = COORDINATOR_ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        allocations > 0,
        "no shard was ever allocated: the schedules test nothing"
    );
    println!("{cases} coordinator schedules passed, {allocations} shards allocated");
    // The same check catches coordinators that allocate on a broken renewal.
    let failure = check_coordinators(cases, seed, true)
        .expect_err("coordinators on a broken renewal went unnoticed");
    assert!(failure.contains("under token"), "{failure}");
    println!("caught (MODEL_SEED={}):\n{failure}", hex(&seed));
}

#[test]
fn the_check_catches_a_broken_renewal() {
    let seed = seed();
    let failure = check(2_000, seed, true).expect_err(&format!(
        "a renewal that reports success without the store went unnoticed (MODEL_SEED={})",
        hex(&seed)
    ));
    assert!(
        failure.contains("alive at once") || failure.contains("the store has"),
        "{failure}"
    );
    println!("caught (MODEL_SEED={}):\n{failure}", hex(&seed));
}

/// Steps of the schedules where acquires run on runtimes that stop (issue 27, item 2): the
/// runtime of an `acquire` runs the renewal task of the tenure it started; when it shuts down (an
/// arbiter stopped, an actix-web worker restarted) that task goes with it. Real runtimes (each
/// one worker thread) and the real clock, since a paused clock belongs to one runtime; the checks
/// are about order and counts, which load cannot change.
#[derive(Debug, Clone)]
enum RuntimeOp {
    /// Owner `.0` acquires from runtime `.1`.
    Acquire(usize, usize),
    /// Owner `.0` releases (from the runtime that never stops).
    Release(usize),
    /// Runtime `.0` shuts down, and a new one takes its place.
    StopRuntime(usize),
    /// This many milliseconds pass.
    Wait(u64),
}

const RUNTIMES: usize = 2;
const RUNTIME_TTL: Duration = Duration::from_millis(900);

fn runtime_op() -> impl Strategy<Value = RuntimeOp> {
    prop_oneof![
        3 => (0..OWNERS, 0..RUNTIMES).prop_map(|(o, r)| RuntimeOp::Acquire(o, r)),
        2 => (0..OWNERS).prop_map(RuntimeOp::Release),
        2 => (0..RUNTIMES).prop_map(RuntimeOp::StopRuntime),
        2 => (0u64..400).prop_map(RuntimeOp::Wait),
    ]
}

fn one_worker() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs one schedule; `Err` with every violation found.
fn run_with_runtimes(ops: &[RuntimeOp]) -> Result<(), TestCaseError> {
    let store = InMemoryStore::new();
    let history = Arc::new(Mutex::new(History::default()));
    let leases: Vec<Arc<InMemoryLease>> = (0..OWNERS)
        .map(|i| {
            Arc::new(InMemoryLease::new(
                LeaseSettings::builder(NAME, format!("owner-{i}"))
                    .ttl(RUNTIME_TTL)
                    .renewal_interval(Duration::from_millis(300))
                    .operation_timeout(Duration::from_millis(250))
                    .acquire_retries(0)
                    .build()
                    .unwrap(),
                &store,
            ))
        })
        .collect();
    let _subscriptions: Vec<LostSubscription> = leases
        .iter()
        .map(|lease| {
            let history = Arc::clone(&history);
            lease.on_lost(move |lost: &LeaseLost| {
                let token = lost.fencing_token.map_or(0, |t| t.value());
                *history.lock().unwrap().lost.entry(token).or_default() += 1;
            })
        })
        .collect();
    let lasting = one_worker();
    let mut runtimes: Vec<tokio::runtime::Runtime> = (0..RUNTIMES).map(|_| one_worker()).collect();
    // Which runtime renews each owner's current tenure.
    let mut renewed_on: Vec<Option<usize>> = vec![None; OWNERS];
    for (step, op) in ops.iter().enumerate() {
        let at = format!("step {step} ({op:?})");
        match *op {
            RuntimeOp::Acquire(i, r) => {
                let before = leases[i].fencing_token();
                if let Ok(true) = runtimes[r].block_on(leases[i].acquire()) {
                    if let Some(token) = leases[i].fencing_token() {
                        if before != Some(token) {
                            let token = token.value();
                            let mut h = history.lock().unwrap();
                            if token <= h.max_token {
                                let max = h.max_token;
                                h.violations
                                    .push(format!("{at}: token {token} after {max}"));
                            }
                            h.max_token = h.max_token.max(token);
                            h.tenures.insert(token, (i, false));
                            renewed_on[i] = Some(r);
                        }
                    }
                }
            }
            RuntimeOp::Release(i) => {
                if let Some(token) = leases[i].fencing_token() {
                    if let Some(t) = history.lock().unwrap().tenures.get_mut(&token.value()) {
                        t.1 = true;
                    }
                }
                let _ = lasting.block_on(leases[i].release());
            }
            RuntimeOp::StopRuntime(r) => {
                drop(std::mem::replace(&mut runtimes[r], one_worker()));
                // Every tenure that runtime renewed has ended by now, and was reported.
                for (i, lease) in leases.iter().enumerate() {
                    if renewed_on[i] == Some(r) {
                        if let Some(token) = lease.fencing_token() {
                            history.lock().unwrap().violations.push(format!(
                                "{at}: owner-{i}'s tenure {token} outlived the runtime that renewed it"
                            ));
                        }
                        renewed_on[i] = None;
                    }
                }
            }
            RuntimeOp::Wait(ms) => std::thread::sleep(Duration::from_millis(ms)),
        }
        let alive: Vec<usize> = (0..OWNERS).filter(|i| leases[*i].check_alive()).collect();
        if alive.len() > 1 {
            history
                .lock()
                .unwrap()
                .violations
                .push(format!("{at}: owners alive at once: {alive:?}"));
        }
    }
    // Settle: every runtime stops; every tenure ends, and each involuntary end was reported.
    drop(runtimes);
    drop(lasting);
    let mut h = history.lock().unwrap();
    for (i, lease) in leases.iter().enumerate() {
        if let Some(token) = lease.fencing_token() {
            h.violations
                .push(format!("owner-{i}'s tenure {token} outlived every runtime"));
        }
    }
    for (token, (owner, voluntary)) in h.tenures.clone() {
        let lost = h.lost.get(&token).copied().unwrap_or(0);
        let expected = usize::from(!voluntary);
        if lost != expected {
            h.violations.push(format!(
                "tenure {token} of owner-{owner} ({}) ended with {lost} on_lost calls, not {expected}",
                if voluntary { "released" } else { "lost" }
            ));
        }
    }
    if h.violations.is_empty() {
        Ok(())
    } else {
        Err(TestCaseError::fail(h.violations.join("\n")))
    }
}

#[test]
fn every_tenure_of_a_runtime_that_stops_ends_and_is_reported_once() {
    let cases = cases("MODEL_RUNTIME_CASES", 40);
    let seed = seed();
    if let Err(failure) = run_schedules(runtime_op(), 12, cases, seed, run_with_runtimes) {
        panic!(
            "a tenure of a runtime that stopped was not reported once (replay with MODEL_SEED={}):\n{failure}",
            hex(&seed)
        );
    }
}
