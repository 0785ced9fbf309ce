//! ClusterSingletonManager on the in-memory backend under a paused clock: the singleton runs on
//! exactly one node, moves on loss, restarts within bounds, and hands over at once on a graceful
//! stop. The randomized test drives many schedules of crashes, pauses, partitions, graceful stops
//! and eligibility changes and checks that two nodes never run the singleton at once.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    ClusterSingletonManager, FencingToken, GetSingleton, GetStatus, InMemoryFault, InMemoryLease,
    InMemoryStore, Lease, LeaseError, LeaseSettings, SetEligible, Shutdown, SingletonInfo,
    SingletonSettings, SingletonState, TransferLeadership,
};
use common::run_paused;
use tokio::time::{sleep, sleep_until, Instant};

const TTL: Duration = Duration::from_secs(9);
const LEASE: &str = "singleton";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Started { node: usize, token: FencingToken },
    Stopped { node: usize },
}

type Log = Rc<RefCell<Vec<(Instant, Event)>>>;

/// What the lease store said about the lease's holder when a singleton stopped.
type HolderAtStop = Rc<RefCell<Vec<Option<String>>>>;

/// The singleton under test: logs its life, can be told to stop or panic.
struct Probe {
    node: usize,
    log: Log,
    /// When set, `stopped` records the lease's holder in the store at that moment.
    observe: Option<(InMemoryStore, HolderAtStop)>,
}

impl Actor for Probe {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some((store, seen)) = &self.observe {
            seen.borrow_mut().push(store.holder(LEASE));
        }
        self.log
            .borrow_mut()
            .push((Instant::now(), Event::Stopped { node: self.node }));
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct StopYourself;

#[derive(Message)]
#[rtype(result = "()")]
struct Panic;

impl Handler<StopYourself> for Probe {
    type Result = ();
    fn handle(&mut self, _: StopYourself, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<Panic> for Probe {
    type Result = ();
    fn handle(&mut self, _: Panic, _: &mut Self::Context) {
        panic!("singleton bug (expected by the test)");
    }
}

type Manager = Addr<ClusterSingletonManager<Probe, InMemoryLease>>;

/// Stops the manager actor itself (`ctx.stop()`), as an application's own handler would.
#[derive(Message)]
#[rtype(result = "()")]
struct StopManager;

impl Handler<StopManager> for ClusterSingletonManager<Probe, InMemoryLease> {
    type Result = ();
    fn handle(&mut self, _: StopManager, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// Crashes the node: the manager panics, so it and its lease are dropped without any stopping
/// hook and without a release (the lease expires after its TTL, as after a killed process).
#[derive(Message)]
#[rtype(result = "()")]
struct Crash;

impl Handler<Crash> for ClusterSingletonManager<Probe, InMemoryLease> {
    type Result = ();
    fn handle(&mut self, _: Crash, _: &mut Self::Context) {
        panic!("node crash (expected by the test)");
    }
}

/// Keeps the panics the tests cause on purpose out of the output.
fn quiet_expected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let expected = info
                .payload()
                .downcast_ref::<&str>()
                .is_some_and(|m| m.contains("(expected by the test)"));
            if !expected {
                default(info);
            }
        }));
    });
}

fn settings(owner: &str) -> LeaseSettings {
    LeaseSettings::builder(LEASE, owner)
        .ttl(TTL)
        .build()
        .unwrap()
}

fn start_node(
    store: &InMemoryStore,
    node: usize,
    log: &Log,
    singleton: SingletonSettings,
) -> Manager {
    let lease = Arc::new(store.lease(settings(&format!("node-{node}"))));
    start_node_with(lease, node, log, singleton, None)
}

/// Like [`start_node`], on a lease the caller keeps too, optionally recording the holder of the
/// lease in the store whenever the singleton stops.
fn start_node_with(
    lease: Arc<InMemoryLease>,
    node: usize,
    log: &Log,
    singleton: SingletonSettings,
    observe: Option<(InMemoryStore, HolderAtStop)>,
) -> Manager {
    let log = log.clone();
    ClusterSingletonManager::from_arc(lease, move |info: &SingletonInfo, _| {
        log.borrow_mut().push((
            Instant::now(),
            Event::Started {
                node,
                token: info.fencing_token,
            },
        ));
        Probe {
            node,
            log: log.clone(),
            observe: observe.clone(),
        }
    })
    .settings(singleton)
    .start()
}

/// Checks, in the order events happened, that at most one node ran the singleton at any time and
/// that tokens never went back. Returns the number of starts.
fn assert_never_two(log: &Log) -> usize {
    let mut running: Option<usize> = None;
    let mut last_token = None;
    let mut starts = 0;
    for (at, event) in log.borrow().iter() {
        match *event {
            Event::Started { node, token } => {
                assert!(
                    running.is_none(),
                    "node-{node} started at {at:?} while node-{running:?} runs: {:#?}",
                    log.borrow()
                );
                assert!(Some(token) >= last_token, "token went back");
                last_token = Some(token);
                running = Some(node);
                starts += 1;
            }
            Event::Stopped { node } => {
                assert_eq!(
                    running,
                    Some(node),
                    "node-{node} stopped but was not running"
                );
                running = None;
            }
        }
    }
    starts
}

async fn wait_for_runner(managers: &[Manager], within: Duration) -> usize {
    let give_up = Instant::now() + within;
    loop {
        for (i, m) in managers.iter().enumerate() {
            if m.send(GetStatus).await.unwrap().state == SingletonState::Running {
                return i;
            }
        }
        assert!(Instant::now() < give_up, "no node runs the singleton");
        sleep(Duration::from_millis(10)).await;
    }
}

fn running_count(log: &Log) -> usize {
    let mut n: i64 = 0;
    for (_, e) in log.borrow().iter() {
        match e {
            Event::Started { .. } => n += 1,
            Event::Stopped { .. } => n -= 1,
        }
    }
    n as usize
}

#[test]
fn exactly_one_node_runs_the_singleton_and_knows_its_token() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let managers: Vec<_> = (0..3)
            .map(|i| start_node(&store, i, &log, Default::default()))
            .collect();
        let runner = wait_for_runner(&managers, TTL).await;
        sleep(TTL * 3).await;
        assert_eq!(assert_never_two(&log), 1, "started once, kept running");
        for (i, m) in managers.iter().enumerate() {
            let addr = m.send(GetSingleton::<Probe>::new()).await.unwrap();
            assert_eq!(addr.is_some(), i == runner, "node-{i}");
        }
        let token = store.record(LEASE).unwrap().token;
        assert!(matches!(log.borrow()[0].1, Event::Started { token: t, .. } if t == token));
        let status = managers[runner].send(GetStatus).await.unwrap();
        assert_eq!(status.fencing_token, Some(token));
    });
}

#[test]
fn graceful_stop_hands_over_well_before_the_ttl() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let managers: Vec<_> = (0..3)
            .map(|i| start_node(&store, i, &log, Default::default()))
            .collect();
        let first = wait_for_runner(&managers, TTL).await;
        let stop_at = Instant::now();
        assert!(
            managers[first].send(Shutdown).await.unwrap().unwrap(),
            "released"
        );
        assert!(!managers[first].connected() || managers[first].send(GetStatus).await.is_err());
        assert!(store.holder(LEASE).as_deref() != Some(format!("node-{first}").as_str()));
        let rest: Vec<_> = managers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != first)
            .map(|(_, m)| m.clone())
            .collect();
        wait_for_runner(&rest, TTL).await;
        let handover = stop_at.elapsed();
        assert!(
            handover < Duration::from_millis(100),
            "handover took {handover:?} with a {TTL:?} ttl"
        );
        assert_never_two(&log);
        assert_eq!(running_count(&log), 1);
    });
}

/// A transfer stops the singleton on the leader, then the node it names runs it, whichever
/// other nodes compete (each of 3 nodes names each other one in turn): at once, never two.
#[test]
fn a_transfer_hands_the_singleton_to_the_named_node_and_no_other() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let managers: Vec<_> = (0..3)
            .map(|i| start_node(&store, i, &log, Default::default()))
            .collect();
        let mut leader = wait_for_runner(&managers, TTL).await;
        for round in 0..6 {
            let target = (leader + 1 + round % 2) % 3;
            let asked = Instant::now();
            let answer = managers[leader]
                .send(TransferLeadership::to(format!("node-{target}")))
                .await
                .unwrap();
            assert!(matches!(answer, Ok(true)), "round {round}: {answer:?}");
            let now_leading = wait_for_runner(&managers, TTL).await;
            assert_eq!(now_leading, target, "round {round}: the named node leads");
            let took = asked.elapsed();
            assert!(
                took < Duration::from_millis(100),
                "round {round}: the transfer took {took:?} with a {TTL:?} ttl"
            );
            leader = target;
        }
        assert_eq!(assert_never_two(&log), 7);
        assert_eq!(running_count(&log), 1);
    });
}

/// What a transfer answers when there is nothing to hand over or it cannot work: a node that
/// does not lead says `false`; a target that cannot hold the lease is refused, and the singleton
/// keeps running.
#[test]
fn a_transfer_by_a_follower_or_to_an_invalid_target_changes_nothing() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let managers: Vec<_> = (0..2)
            .map(|i| start_node(&store, i, &log, Default::default()))
            .collect();
        let leader = wait_for_runner(&managers, TTL).await;
        let follower = 1 - leader;
        let answer = managers[follower]
            .send(TransferLeadership::to(format!("node-{leader}")))
            .await
            .unwrap();
        assert!(
            matches!(answer, Ok(false)),
            "a follower has nothing to hand over: {answer:?}"
        );
        for bad in [String::new(), format!("node-{leader}"), "a\tb".into()] {
            let answer = managers[leader]
                .send(TransferLeadership::to(bad.clone()))
                .await
                .unwrap();
            assert!(
                matches!(answer, Err(LeaseError::InvalidTransferTarget { .. })),
                "{bad:?}: {answer:?}"
            );
        }
        sleep(TTL).await;
        assert_eq!(assert_never_two(&log), 1, "the singleton kept running");
        let status = managers[leader].send(GetStatus).await.unwrap();
        assert_eq!(status.state, SingletonState::Running);
    });
}

/// A transfer to a node that is gone: every other node leaves the lease to it for one TTL, then
/// one of them (the old leader included) runs the singleton.
#[test]
fn a_transfer_to_a_dead_node_lapses_after_one_ttl() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let managers: Vec<_> = (0..2)
            .map(|i| start_node(&store, i, &log, Default::default()))
            .collect();
        let leader = wait_for_runner(&managers, TTL).await;
        let asked = Instant::now();
        let answer = managers[leader]
            .send(TransferLeadership::to("node-gone"))
            .await
            .unwrap();
        assert!(matches!(answer, Ok(true)), "{answer:?}");
        sleep(TTL - Duration::from_millis(100)).await;
        assert_eq!(running_count(&log), 0, "left to node-gone for one TTL");
        wait_for_runner(&managers, TTL).await;
        let took = asked.elapsed();
        assert!(took >= TTL, "{took:?}");
        assert!(took < TTL + Duration::from_secs(1), "{took:?}");
        assert_never_two(&log);
    });
}

#[test]
fn lost_lease_stops_the_singleton_before_another_node_starts_it() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let managers: Vec<_> = (0..3)
            .map(|i| start_node(&store, i, &log, Default::default()))
            .collect();
        let first = wait_for_runner(&managers, TTL).await;
        store.partition(&format!("node-{first}"));
        sleep(TTL * 2).await;
        assert_never_two(&log);
        let events = log.borrow().clone();
        let stopped = events
            .iter()
            .position(|(_, e)| *e == Event::Stopped { node: first })
            .expect("old singleton stopped");
        let restarted = events
            .iter()
            .position(|(_, e)| matches!(e, Event::Started { node, .. } if *node != first))
            .expect("moved");
        assert!(stopped < restarted);
        assert!(
            events[restarted].0 > events[stopped].0,
            "strictly later in time, not just in order"
        );
        // The old node competes again once healed, and it only gets the lease after a handover.
        store.heal(&format!("node-{first}"));
        sleep(TTL).await;
        assert_eq!(running_count(&log), 1);
        assert_never_two(&log);
    });
}

#[test]
fn singleton_that_stops_or_panics_is_restarted_then_given_up() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let singleton = SingletonSettings {
            max_restarts: 2,
            give_up_pause: TTL,
            ..Default::default()
        };
        let managers: Vec<_> = (0..2)
            .map(|i| start_node(&store, i, &log, singleton.clone()))
            .collect();
        let first = wait_for_runner(&managers, TTL).await;
        let token = store.record(LEASE).unwrap().token;
        let get = |m: &Manager| m.send(GetSingleton::<Probe>::new());
        get(&managers[first])
            .await
            .unwrap()
            .unwrap()
            .do_send(StopYourself);
        sleep(Duration::from_millis(10)).await;
        get(&managers[first])
            .await
            .unwrap()
            .expect("restarted")
            .do_send(Panic);
        sleep(Duration::from_millis(10)).await;
        let third = get(&managers[first])
            .await
            .unwrap()
            .expect("restarted after a panic");
        assert_eq!(
            managers[first].send(GetStatus).await.unwrap().fencing_token,
            Some(token),
            "same tenure"
        );
        // Third failure within the window: give up, release, and let the other node run it.
        third.do_send(StopYourself);
        let other = 1 - first;
        wait_for_runner(&managers[other..=other], Duration::from_secs(1)).await;
        assert!(store.record(LEASE).unwrap().token > token);
        assert_never_two(&log);
        let starts_on_first = log
            .borrow()
            .iter()
            .filter(|(_, e)| matches!(e, Event::Started { node, .. } if *node == first))
            .count();
        assert_eq!(starts_on_first, 3, "one start and two restarts");
    });
}

#[test]
fn ineligible_node_releases_and_eligible_node_competes_again() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let managers: Vec<_> = (0..2)
            .map(|i| start_node(&store, i, &log, Default::default()))
            .collect();
        let first = wait_for_runner(&managers, TTL).await;
        let other = 1 - first;
        let t0 = Instant::now();
        managers[first].send(SetEligible(false)).await.unwrap();
        wait_for_runner(&managers[other..=other], TTL).await;
        assert!(t0.elapsed() < TTL / 4, "released, not expired");
        managers[first].send(SetEligible(true)).await.unwrap();
        managers[other].send(SetEligible(false)).await.unwrap();
        wait_for_runner(&managers[first..=first], TTL).await;
        assert_never_two(&log);
        assert_eq!(running_count(&log), 1);
    });
}

#[test]
fn shutdown_stops_the_singleton_then_releases() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let seen = HolderAtStop::default();
        let lease = Arc::new(store.lease(settings("node-0")));
        let observe = Some((store.clone(), Rc::clone(&seen)));
        let manager = start_node_with(lease, 0, &log, Default::default(), observe);
        wait_for_runner(std::slice::from_ref(&manager), TTL).await;
        assert!(manager.send(Shutdown).await.unwrap().unwrap());
        assert_eq!(running_count(&log), 0, "singleton stopped");
        assert_eq!(
            *seen.borrow(),
            vec![Some("node-0".to_owned())],
            "the singleton stopped while the lease was still held: release comes after"
        );
        assert_eq!(store.holder(LEASE), None, "then the lease was released");
        assert!(
            manager.send(Shutdown).await.unwrap_or(Ok(true)).unwrap(),
            "a second Shutdown answers the same"
        );
        assert_never_two(&log);
    });
}

/// The manager actor itself is stopped (`ctx.stop()` in a handler): it stops the singleton, waits
/// until it has stopped, releases the lease, and only then stops.
#[test]
fn stopping_the_manager_actor_stops_the_singleton_then_releases() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let seen = HolderAtStop::default();
        let lease = Arc::new(store.lease(settings("node-0")));
        let observe = Some((store.clone(), Rc::clone(&seen)));
        let manager = start_node_with(Arc::clone(&lease), 0, &log, Default::default(), observe);
        wait_for_runner(std::slice::from_ref(&manager), TTL).await;
        let renewals = store.stats().renewals;
        manager.send(StopManager).await.unwrap();
        sleep(Duration::from_millis(10)).await;
        assert_eq!(running_count(&log), 0, "singleton stopped");
        assert_eq!(
            *seen.borrow(),
            vec![Some("node-0".to_owned())],
            "the singleton stopped while the lease was still held"
        );
        assert_eq!(store.holder(LEASE), None, "then the lease was released");
        assert!(!lease.check_alive());
        assert!(
            manager.send(GetStatus).await.is_err(),
            "the manager has stopped"
        );
        sleep(TTL * 2).await;
        assert_eq!(
            store.stats().renewals,
            renewals,
            "no renewals after the stop"
        );
        assert_eq!(store.holder(LEASE), None);
        assert_never_two(&log);
    });
}

/// Nothing but the user's addresses keeps a manager alive (the lease's lost-handler and the
/// singleton only hold it weakly): dropping them shuts it down gracefully, whether it runs the
/// singleton or only competes.
#[test]
fn dropping_every_address_shuts_the_manager_down() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let seen = HolderAtStop::default();
        let observe = Some((store.clone(), Rc::clone(&seen)));
        let leases: Vec<_> = (0..2)
            .map(|i| Arc::new(store.lease(settings(&format!("node-{i}")))))
            .collect();
        let mut managers: Vec<Option<Manager>> = (0..2)
            .map(|i| {
                Some(start_node_with(
                    Arc::clone(&leases[i]),
                    i,
                    &log,
                    Default::default(),
                    observe.clone(),
                ))
            })
            .collect();
        let runner = {
            let all: Vec<Manager> = managers.iter().flatten().cloned().collect();
            wait_for_runner(&all, TTL).await
        };
        let other = 1 - runner;
        // The contender goes first: it must stop competing.
        drop(managers[other].take());
        sleep(Duration::from_millis(10)).await;
        let acquires = store.stats().acquires;
        sleep(TTL).await;
        assert_eq!(
            store.stats().acquires,
            acquires,
            "a dropped contender stops competing"
        );
        // Then the runner: singleton stopped, then the lease released (not left to expire).
        let renewals = store.stats().renewals;
        drop(managers[runner].take());
        sleep(Duration::from_millis(10)).await;
        assert_eq!(running_count(&log), 0, "the singleton was stopped");
        assert_eq!(
            *seen.borrow(),
            vec![Some(format!("node-{runner}"))],
            "stopped while still held"
        );
        assert_eq!(store.holder(LEASE), None, "released");
        assert!(!leases[runner].check_alive());
        sleep(TTL * 2).await;
        assert_eq!(
            store.stats().renewals,
            renewals,
            "no renewals after the stop"
        );
        assert_eq!(
            store.holder(LEASE),
            None,
            "nobody took it: both managers are gone"
        );
        assert_eq!(assert_never_two(&log), 1);
    });
}

/// On `LeaseLost` the singleton is stopped at once: at the instant of the lease's local deadline.
#[test]
fn lost_lease_stops_the_singleton_at_the_deadline() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let lease = Arc::new(store.lease(settings("node-0")));
        let manager = start_node_with(Arc::clone(&lease), 0, &log, Default::default(), None);
        wait_for_runner(std::slice::from_ref(&manager), TTL).await;
        sleep(TTL).await;
        // Renewals hang from now on: the lease is lost at its current deadline.
        store.pause("node-0");
        let deadline = lease.deadline().expect("held");
        sleep_until(deadline - Duration::from_millis(1)).await;
        assert_eq!(
            running_count(&log),
            1,
            "still running just before the deadline"
        );
        sleep_until(deadline + TTL).await;
        let stopped_at = log
            .borrow()
            .iter()
            .find(|(_, e)| *e == Event::Stopped { node: 0 })
            .map(|(at, _)| *at)
            .expect("stopped");
        assert!(
            stopped_at >= deadline && stopped_at <= deadline + Duration::from_micros(100),
            "stopped {:?} after the deadline",
            stopped_at.saturating_duration_since(deadline)
        );
        assert_never_two(&log);
    });
}

/// Acquire errors are retried with an exponential backoff that stops growing at the cap; once
/// the store answers again the singleton starts within one capped pause.
#[test]
fn acquire_errors_back_off_exponentially_up_to_the_cap() {
    run_paused(async {
        const CAP: Duration = Duration::from_secs(2);
        let store = InMemoryStore::new();
        store.set_fault(Some(InMemoryFault::Unavailable));
        let log = Log::default();
        let singleton = SingletonSettings {
            retry_delay: Some(Duration::from_millis(200)),
            max_error_backoff: CAP,
            ..Default::default()
        };
        let manager = start_node(&store, 0, &log, singleton);
        // Every attempt is refused. The first gap is the retry within the first round; the
        // backoff starts after it.
        let gaps = common::refused_attempt_gaps(&store, Duration::from_secs(30)).await;
        common::assert_backoff_up_to(&gaps, 1, 3, CAP);
        assert_eq!(running_count(&log), 0);
        assert_eq!(
            manager.send(GetStatus).await.unwrap().state,
            SingletonState::Acquiring
        );

        store.set_fault(None);
        let healed = Instant::now();
        wait_for_runner(std::slice::from_ref(&manager), CAP * 2).await;
        assert!(
            healed.elapsed() <= CAP + Duration::from_millis(2),
            "started {:?} after the store healed",
            healed.elapsed()
        );
        assert_eq!(store.holder(LEASE).as_deref(), Some("node-0"));
    });
}

/// Restarts are counted within `restart_window` only: a singleton that fails once in a while is
/// restarted every time; one that fails too often within the window is given up.
#[test]
fn restarts_are_counted_within_the_restart_window() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let singleton = SingletonSettings {
            max_restarts: 1,
            restart_window: Duration::from_secs(10),
            give_up_pause: TTL,
            ..Default::default()
        };
        let manager = start_node(&store, 0, &log, singleton);
        wait_for_runner(std::slice::from_ref(&manager), TTL).await;
        let token = store.record(LEASE).unwrap().token;
        let starts = || {
            log.borrow()
                .iter()
                .filter(|(_, e)| matches!(e, Event::Started { .. }))
                .count()
        };
        let stop_singleton = || async {
            manager
                .send(GetSingleton::<Probe>::new())
                .await
                .unwrap()
                .expect("runs")
                .do_send(StopYourself);
            sleep(Duration::from_millis(10)).await;
        };
        stop_singleton().await;
        assert_eq!(starts(), 2, "restarted");
        // The first restart falls out of the window: the next failure is restarted again.
        sleep(Duration::from_secs(11)).await;
        stop_singleton().await;
        assert_eq!(
            starts(),
            3,
            "restarted: the earlier restart is out of the window"
        );
        assert_eq!(store.record(LEASE).unwrap().token, token, "same tenure");
        // A second failure within the window: given up, the lease released.
        stop_singleton().await;
        assert_eq!(starts(), 3, "given up");
        assert_ne!(
            manager.send(GetStatus).await.unwrap().state,
            SingletonState::Running
        );
        assert_eq!(store.holder(LEASE), None, "released for another node");
        // It competes again after the pause, in a new tenure.
        wait_for_runner(std::slice::from_ref(&manager), TTL * 2).await;
        assert_eq!(starts(), 4);
        assert!(store.record(LEASE).unwrap().token > token);
        assert_never_two(&log);
    });
}

/// Many random schedules of pauses (calls hang), partitions (calls fail), graceful stops with
/// restarts, crashes (the manager and its lease dropped without a release) with restarts, and
/// eligibility flips, on three nodes: never two singletons at once, and a singleton runs again
/// once the faults heal.
#[test]
fn never_two_singletons_over_random_schedules() {
    quiet_expected_panics();
    for seed in 0..60u64 {
        run_paused(async move {
            let mut rng = fastrand::Rng::with_seed(seed);
            let store = InMemoryStore::new();
            let log = Log::default();
            let nodes = 3;
            let mut managers: Vec<Manager> = (0..nodes)
                .map(|i| start_node(&store, i, &log, Default::default()))
                .collect();
            for _ in 0..30 {
                let node = rng.usize(0..nodes);
                let owner = format!("node-{node}");
                let hold = Duration::from_millis(rng.u64(0..2 * TTL.as_millis() as u64));
                match rng.u8(0..6) {
                    0 => {
                        store.pause(&owner);
                        let store = store.clone();
                        actix_rt::spawn(async move {
                            sleep(hold).await;
                            store.heal(&owner);
                        });
                    }
                    1 => {
                        store.partition(&owner);
                        let store = store.clone();
                        actix_rt::spawn(async move {
                            sleep(hold).await;
                            store.heal(&owner);
                        });
                    }
                    2 => {
                        // Graceful stop (may fail to release when faulted), then a fresh start.
                        let _ = managers[node].send(Shutdown).await;
                        sleep(hold / 4).await;
                        managers[node] = start_node(&store, node, &log, Default::default());
                    }
                    4 => {
                        // Crash: no stopping hook, no release; the node restarts later.
                        managers[node].do_send(Crash);
                        sleep(hold / 4).await;
                        assert!(!managers[node].connected(), "seed {seed}: crashed");
                        managers[node] = start_node(&store, node, &log, Default::default());
                    }
                    3 => {
                        managers[node].do_send(SetEligible(false));
                        let m = managers[node].clone();
                        actix_rt::spawn(async move {
                            sleep(hold).await;
                            m.do_send(SetEligible(true));
                        });
                    }
                    _ => {}
                }
                sleep(Duration::from_millis(rng.u64(0..TTL.as_millis() as u64))).await;
                assert!(running_count(&log) <= 1, "seed {seed}");
            }
            // Heal everything: a singleton must run again.
            for (node, manager) in managers.iter().enumerate() {
                store.heal(&format!("node-{node}"));
                manager.do_send(SetEligible(true));
            }
            sleep(TTL * 3).await;
            wait_for_runner(&managers, TTL * 2).await;
            let starts = assert_never_two(&log);
            assert!(starts >= 1, "seed {seed}");
            assert_eq!(
                running_count(&log),
                1,
                "seed {seed}: exactly one runs at the end"
            );
        });
    }
}

/// Issue 27, item 4: a singleton started `on_arbiter` on an arbiter that is busy until after its
/// tenure ended (released through another handle, and another node acquired) is not built: the
/// guard is checked on that arbiter right before the factory runs, so neither the factory nor
/// `started` runs under the dead tenure. The manager competes again, and starts the singleton
/// (once) under its next tenure. On a real clock: the arbiter is a thread of its own.
#[test]
fn a_busy_arbiter_does_not_start_the_singleton_after_its_tenure_ended() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// Counts its `started` calls.
    struct Counted(Arc<AtomicUsize>);
    impl Actor for Counted {
        type Context = Context<Self>;
        fn started(&mut self, _: &mut Self::Context) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    let within = Duration::from_secs(30);
    actix_rt::System::new().block_on(async move {
        let store = InMemoryStore::new();
        let lease = Arc::new(store.lease(settings("a")));
        let other = store.lease(settings("b"));
        let arbiter = actix_rt::Arbiter::new();
        // Busy until told (bounded, so that a failing test cannot hang).
        let (unblock, blocked) = std::sync::mpsc::channel::<()>();
        arbiter.spawn_fn(move || {
            let _ = blocked.recv_timeout(Duration::from_secs(60));
        });
        let built: Arc<Mutex<Vec<(FencingToken, bool)>>> = Arc::default();
        let started = Arc::new(AtomicUsize::new(0));
        let manager = {
            let (built, started) = (Arc::clone(&built), Arc::clone(&started));
            ClusterSingletonManager::on_arbiter(
                Arc::clone(&lease),
                arbiter.handle(),
                move |info: &SingletonInfo, _| {
                    built
                        .lock()
                        .unwrap()
                        .push((info.fencing_token, info.guard.check_alive()));
                    Counted(Arc::clone(&started))
                },
            )
            .settings(SingletonSettings {
                // The arbiter is busy on purpose: the manager waits for the singleton's end.
                stop_timeout: within * 2,
                ..Default::default()
            })
            .start()
        };
        common::actors::wait_for_state(&manager, SingletonState::Running, within).await;
        let first = lease.fencing_token().expect("the manager holds the lease");
        // The tenure ends while the arbiter is busy, and another node takes the lease.
        assert!(lease.release().await.unwrap());
        assert!(other.acquire().await.unwrap());
        unblock.send(()).unwrap();
        // Once the arbiter got to it, the manager learns that the instance is gone and competes.
        common::actors::wait_for_state(&manager, SingletonState::Acquiring, within).await;
        assert_eq!(
            *built.lock().unwrap(),
            vec![],
            "the factory ran after the tenure ended"
        );
        assert_eq!(started.load(Ordering::SeqCst), 0);
        // The next tenure starts it, once, under a live guard.
        assert!(other.release().await.unwrap());
        common::actors::wait_until(within, || !built.lock().unwrap().is_empty()).await;
        common::actors::wait_until(within, || started.load(Ordering::SeqCst) == 1).await;
        let built = built.lock().unwrap().clone();
        assert_eq!(built.len(), 1, "{built:?}");
        assert!(built[0].1, "built under a live guard");
        assert!(built[0].0 > first, "{built:?}");
        assert!(manager.send(Shutdown).await.unwrap().unwrap());
        arbiter.stop();
    });
}

/// A singleton that does nothing.
struct Quiet;

impl Actor for Quiet {
    type Context = Context<Self>;
}

/// Issue 27 item 5: plain data never panics the manager. `try_settings` rejects a duration past
/// one day with a typed error naming the field; given unvalidated through `settings`, a
/// `retry_delay` of `Duration::MAX` used to overflow the jitter of the next round inside a
/// message handler (here: rounds that find the lease busy with another acquire in flight),
/// killing the manager: now that pause saturates and the manager keeps answering, and shuts
/// down gracefully.
#[test]
fn plain_data_never_panics_the_manager_and_try_settings_rejects_it() {
    use actix_coordination::SettingsError;

    let endless = SingletonSettings {
        retry_delay: Some(Duration::MAX),
        ..Default::default()
    };
    assert!(matches!(
        endless.validate(),
        Err(SettingsError::DurationTooLong { field: "retry-delay", value, .. }) if value == Duration::MAX
    ));
    let stop = SingletonSettings {
        stop_timeout: LeaseSettings::MAX_DURATION + Duration::from_secs(1),
        ..Default::default()
    };
    let error = stop.validate().unwrap_err();
    assert_eq!(error.field(), "stop-timeout");
    assert_eq!(SingletonSettings::default().validate(), Ok(()));
    let day = SingletonSettings {
        retry_delay: Some(LeaseSettings::MAX_DURATION),
        max_error_backoff: LeaseSettings::MAX_DURATION,
        restart_window: LeaseSettings::MAX_DURATION,
        give_up_pause: LeaseSettings::MAX_DURATION,
        stop_timeout: LeaseSettings::MAX_DURATION,
        handle_signals: false,
        max_restarts: 1,
    };
    assert_eq!(day.validate(), Ok(()), "one day is accepted");

    run_paused(async {
        let store = InMemoryStore::new();
        let rejected =
            ClusterSingletonManager::new(store.lease(settings("x")), |_: &SingletonInfo, _| Quiet)
                .try_settings(endless.clone());
        assert!(matches!(
            rejected.err(),
            Some(SettingsError::DurationTooLong {
                field: "retry-delay",
                ..
            })
        ));

        let a = store.lease(settings("a"));
        assert!(a.acquire().await.unwrap());
        // Another acquire through the manager's lease hangs in flight for an operation timeout:
        // meanwhile every round of the manager finds the lease busy and schedules the next one
        // after the jitter of the retry delay (capped at 100 ms): dozens of jitters of
        // `Duration::MAX`.
        let b = Arc::new(store.lease(settings("b")));
        store.pause("b");
        let in_flight = tokio::spawn({
            let b = Arc::clone(&b);
            async move { b.acquire().await }
        });
        sleep(Duration::from_millis(1)).await;
        let manager =
            ClusterSingletonManager::from_arc(Arc::clone(&b), |_: &SingletonInfo, _| Quiet)
                .settings(endless)
                .start();
        sleep(b.settings().operation_timeout() / 2).await;
        store.heal("b");
        assert!(
            in_flight.await.unwrap().is_err(),
            "the hung acquire timed out"
        );
        sleep(Duration::from_secs(1)).await;
        let status = manager.send(GetStatus).await.expect("the manager is alive");
        assert_eq!(status.state, SingletonState::Acquiring);
        assert_eq!(status.started, 0);
        assert_eq!(
            b.observed_holder().as_deref(),
            Some("a"),
            "once the lease was free of the hung acquire, a round found it held by a"
        );
        assert!(manager.send(Shutdown).await.unwrap().unwrap());
        assert_eq!(store.holder(LEASE).as_deref(), Some("a"));
    });
}
