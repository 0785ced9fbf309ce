//! ClusterSingletonManager on the in-memory backend under a paused clock: the singleton runs on
//! exactly one node, moves on loss, restarts within bounds, and hands over at once on a graceful
//! stop. The randomized test drives many schedules of pauses, partitions, graceful stops and
//! eligibility changes and checks that two nodes never run the singleton at once.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    ClusterSingletonManager, FencingToken, GetSingleton, GetStatus, InMemoryLease, InMemoryStore,
    LeaseSettings, SetEligible, Shutdown, SingletonInfo, SingletonSettings, SingletonState,
};
use common::run_paused;
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(9);
const LEASE: &str = "singleton";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Started { node: usize, token: FencingToken },
    Stopped { node: usize },
}

type Log = Rc<RefCell<Vec<(Instant, Event)>>>;

/// The singleton under test: logs its life, can be told to stop or panic.
struct Probe {
    node: usize,
    log: Log,
}

impl Actor for Probe {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
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
    let log = log.clone();
    ClusterSingletonManager::new(
        store.lease(settings(&format!("node-{node}"))),
        move |info: &SingletonInfo, _| {
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
            }
        },
    )
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
fn stopping_the_manager_stops_the_singleton_then_releases() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let manager = start_node(&store, 0, &log, Default::default());
        wait_for_runner(std::slice::from_ref(&manager), TTL).await;
        assert!(manager.send(Shutdown).await.unwrap().unwrap());
        assert_eq!(running_count(&log), 0, "singleton stopped");
        assert_eq!(
            store.holder(LEASE),
            None,
            "lease released after the singleton stopped"
        );
        assert_never_two(&log);
    });
}

/// Many random schedules of pauses (calls hang), partitions (calls fail), graceful stops with
/// restarts, and eligibility flips, on three nodes: never two singletons at once, and a singleton
/// runs again once the faults heal.
#[test]
fn never_two_singletons_over_random_schedules() {
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
                match rng.u8(0..5) {
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
