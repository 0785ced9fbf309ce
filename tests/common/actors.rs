//! The actor suite: every backend runs it, in-memory under a paused clock and the real ones
//! against their servers. It checks that the actors built on a lease (the singleton manager, the
//! coordinator) never act outside a tenure, whichever way the tenure ends.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    AllocateShard, ClusterSingletonManager, FencingToken, GateState, GetGateState, GetLeader,
    GetStatus, HostShard, LeaderInfo, Lease, LeaseActor, RegisterRegion, ShardCoordinator,
    SingletonInfo, SingletonState, TransferLeadership,
};
use tokio::time::{sleep, Instant};

use super::contract::Fixture;

/// Expands to one `#[test]` per case of the actor suite; `$run` runs a future to completion in
/// an actix `System` (e.g. `common::run_paused`).
#[macro_export]
macro_rules! actor_suite {
    (fixture = $fixture:expr, run = $run:path) => {
        $crate::actor_suite!(@cases [$fixture] [$run]
            release_through_a_shared_lease_actor_stops_the_singleton
            release_through_another_handle_moves_the_coordinator_to_a_new_tenure
            shutdown_during_an_attempt_in_flight_releases_what_it_got
            every_node_finds_the_leader_and_a_transfer_moves_it
        );
    };
    (@cases [$fixture:expr] [$run:path] $($case:ident)*) => {
        $(
            #[test]
            fn $case() {
                $run(async {
                    let fixture = $fixture;
                    $crate::common::actors::$case(&fixture).await;
                });
            }
        )*
    };
}

/// What a singleton did, in order: `(instant, node, started?, token)`.
pub type Life = Rc<RefCell<Vec<(Instant, usize, bool, FencingToken)>>>;

/// A singleton that records its start and stop.
pub struct Recorder {
    node: usize,
    token: FencingToken,
    life: Life,
}

impl Actor for Recorder {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        self.life
            .borrow_mut()
            .push((Instant::now(), self.node, true, self.token));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.life
            .borrow_mut()
            .push((Instant::now(), self.node, false, self.token));
    }
}

/// A manager on `lease` whose singleton records its life in `life` as node `node`.
pub fn recorded_manager<L: Lease>(
    lease: Arc<L>,
    node: usize,
    life: &Life,
) -> Addr<ClusterSingletonManager<Recorder, L>> {
    let life = Rc::clone(life);
    ClusterSingletonManager::from_arc(lease, move |info: &SingletonInfo, _| {
        assert!(
            info.guard.check_alive(),
            "a singleton is only started under a live tenure"
        );
        Recorder {
            node,
            token: info.fencing_token,
            life: Rc::clone(&life),
        }
    })
    .start()
}

/// Waits (up to `within`) until `manager` reports `state`.
pub async fn wait_for_state<A, L>(
    manager: &Addr<ClusterSingletonManager<A, L>>,
    state: SingletonState,
    within: Duration,
) where
    A: Actor<Context = Context<A>>,
    L: Lease,
{
    let give_up = Instant::now() + within;
    loop {
        if manager.send(GetStatus).await.unwrap().state == state {
            return;
        }
        assert!(Instant::now() < give_up, "not {state:?} within {within:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (up to `within`) until `condition` holds, checking every 5 ms.
pub async fn wait_until(within: Duration, condition: impl Fn() -> bool) {
    let give_up = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < give_up, "not within {within:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Checks, in the order the events happened, that at most one node ran a singleton at a time and
/// that tokens rose. Returns the number of starts.
pub fn assert_one_at_a_time(life: &Life) -> usize {
    let mut running: Option<usize> = None;
    let mut last = None;
    let mut starts = 0;
    for &(at, node, started, token) in life.borrow().iter() {
        if started {
            assert!(
                running.is_none(),
                "node {node} started at {at:?} while node {running:?} runs: {:?}",
                life.borrow()
            );
            assert!(Some(token) > last, "tokens rise: {:?}", life.borrow());
            last = Some(token);
            running = Some(node);
            starts += 1;
        } else {
            assert_eq!(running, Some(node), "{:?}", life.borrow());
            running = None;
        }
    }
    starts
}

/// A lease shared by a singleton manager and a `LeaseActor` (whose default `release_on_stop`
/// releases it when it stops): stopping the actor releases the lease through *its* handle. The
/// singleton must stop before the next one starts, and its manager must compete again. Who gets
/// the next tenure is a race: B, woken by the backend's change notification (or polling, on a
/// backend without one), or A's own manager competing again; either way one at a time, with a
/// higher token.
pub async fn release_through_a_shared_lease_actor_stops_the_singleton<F: Fixture>(f: &F) {
    let name = f.unique_name("shared-actor");
    let a = Arc::new(f.lease(f.settings(&name, "a")).await);
    let b = Arc::new(f.lease(f.settings(&name, "b")).await);
    let ttl = a.settings().ttl();
    let life = Life::default();
    let holder = LeaseActor::from_arc(Arc::clone(&a)).start();
    let manager_a = recorded_manager(Arc::clone(&a), 0, &life);
    wait_for_state(&manager_a, SingletonState::Running, ttl).await;
    let manager_b = recorded_manager(Arc::clone(&b), 1, &life);
    // B waits on the backend's watch.
    wait_for_state(&manager_b, SingletonState::Acquiring, ttl).await;
    // The other user of A's lease stops, and releases it.
    holder.send(StopActor).await.unwrap();
    wait_until(ttl * 2 + f.slack(), || life.borrow().len() >= 3).await;
    assert_eq!(assert_one_at_a_time(&life), 2);
    let events = life.borrow().clone();
    assert!(
        matches!(events[1], (_, 0, false, _)),
        "A's singleton stopped before the next one started: {events:?}"
    );
    let (_, winner, _, _) = events[2];
    let (running, waiting) = if winner == 0 {
        (&manager_a, &manager_b)
    } else {
        assert!(!a.check_alive());
        (&manager_b, &manager_a)
    };
    assert_eq!(
        running.send(GetStatus).await.unwrap().state,
        SingletonState::Running
    );
    assert_eq!(
        waiting.send(GetStatus).await.unwrap().state,
        SingletonState::Acquiring,
        "the other one competes"
    );
    drop(manager_a);
    drop(manager_b);
}

/// A release through another handle of the coordinator's shared lease ends its tenure: it leaves
/// the gate's `Open` state, competes again and serves under a higher token once it holds the
/// lease again; while another node holds it, nothing is served.
pub async fn release_through_another_handle_moves_the_coordinator_to_a_new_tenure<F: Fixture>(
    f: &F,
) {
    let name = f.unique_name("coordinator");
    let a = Arc::new(f.lease(f.settings(&name, "a")).await);
    let ttl = a.settings().ttl();
    let coordinator = ShardCoordinator::from_arc(Arc::clone(&a)).start();
    let region = Sink.start();
    let registered = tokio::time::timeout(
        ttl + f.slack(),
        coordinator.send(RegisterRegion(region.clone().recipient())),
    )
    .await
    .expect("served once the lease is held");
    assert_eq!(registered.unwrap(), Ok(1));
    let first = a.fencing_token().expect("held");
    assert_eq!(
        coordinator.send(GetGateState).await.unwrap(),
        GateState::Open(first)
    );
    // Another user of the shared lease releases it: the gate leaves the tenure at once.
    assert!(a.release().await.unwrap());
    let give_up = Instant::now() + ttl + f.slack();
    loop {
        match coordinator.send(GetGateState).await.unwrap() {
            GateState::Open(token) if token == first => {}
            _ => break,
        }
        assert!(
            Instant::now() < give_up,
            "the gate stayed open on a released tenure"
        );
        sleep(Duration::from_millis(5)).await;
    }
    let allocated = tokio::time::timeout(
        ttl * 2 + f.slack(),
        coordinator.send(AllocateShard("s1".into())),
    )
    .await
    .expect("served again under a new tenure")
    .unwrap()
    .unwrap();
    assert!(allocated.fencing_token > first, "{allocated:?}");
    drop(coordinator);
}

/// `Shutdown` arrives while the manager's claim is in flight (the backend applies requests at
/// once, answers come late). The attempt is not cut short: it finishes, what it got is released,
/// and only then does `Shutdown` answer `Ok(true)`; the lease is free for the next node at once
/// (within the delay of its backend's watch, long before the TTL).
pub async fn shutdown_during_an_attempt_in_flight_releases_what_it_got<F: Fixture>(f: &F) {
    let name = f.unique_name("in-flight");
    let a = Arc::new(f.lease(f.settings(&name, "a")).await);
    let b = f.lease(f.settings(&name, "b")).await;
    let settings = a.settings().clone();
    // Warm the connection, so that the next request is the claim itself.
    assert!(a.acquire().await.unwrap());
    assert!(a.release().await.unwrap());
    f.slow_answers("a", settings.operation_timeout() / 6).await;
    let sent = f.sent_by("a").await;
    let life = Life::default();
    let manager = recorded_manager(Arc::clone(&a), 0, &life);
    let give_up = Instant::now() + settings.ttl();
    while f.sent_by("a").await == sent {
        assert!(Instant::now() < give_up, "the manager sent no claim");
        sleep(Duration::from_millis(1)).await;
    }
    let released = manager.send(actix_coordination::Shutdown).await.unwrap();
    assert!(released.unwrap(), "released");
    assert!(!a.check_alive());
    f.heal("a").await;
    // Well within the TTL: b learns of the release (a backend that watches may report the lease
    // held for the watch's delay after it was released, and wakes b when the release arrives).
    let asked = Instant::now();
    assert!(
        b.acquire_within(f.slack()).await.unwrap(),
        "Shutdown answered the truth: the lease is free"
    );
    assert!(asked.elapsed() < settings.ttl(), "{:?}", asked.elapsed());
    assert!(b.release().await.unwrap());
}

/// `GetLeader` on every node names the node that runs the singleton, with its token (the leader
/// from its tenure, the others from the store's watch, without a request), and only the leader
/// says it is here; a `TransferLeadership` moves the singleton to the node it names, and every
/// node then names that one. Backends without group watches or preferences answer what they can
/// (the last holder seen, no token) and skip the transfer.
pub async fn every_node_finds_the_leader_and_a_transfer_moves_it<F: Fixture>(f: &F) {
    let name = f.unique_name("leader");
    let owners = ["n0", "n1", "n2"];
    let life = Life::default();
    let mut managers = Vec::new();
    for (node, owner) in owners.iter().enumerate() {
        let lease = Arc::new(f.lease(f.settings(&name, owner)).await);
        managers.push((recorded_manager(lease, node, &life), *owner));
    }
    let within = f.settings(&name, "n0").ttl() * 3 + f.slack();
    let mut leader = None;
    let give_up = Instant::now() + within;
    while leader.is_none() {
        for (node, (manager, _)) in managers.iter().enumerate() {
            if manager.send(GetStatus).await.unwrap().state == SingletonState::Running {
                leader = Some(node);
            }
        }
        assert!(Instant::now() < give_up, "no node runs the singleton");
        sleep(Duration::from_millis(5)).await;
    }
    let mut leader = leader.unwrap();
    let rounds = if f.watches_groups() { 2 } else { 0 };
    for round in 0..=rounds {
        let status = managers[leader].0.send(GetStatus).await.unwrap();
        let token = status.fencing_token.expect("the leader has a token");
        for (node, (manager, owner)) in managers.iter().enumerate() {
            let expected = LeaderInfo::new(owners[leader], Some(token), node == leader, None)
                .with_lease(name.as_str());
            if !f.watches_groups() {
                // The fallback knows the holder at best, and no token.
                let answer = manager.send(GetLeader).await.unwrap();
                if node == leader {
                    assert_eq!(answer, Some(expected), "round {round}: {owner}");
                }
                continue;
            }
            let give_up = Instant::now() + within;
            loop {
                let answer = manager.send(GetLeader).await.unwrap();
                if answer.as_ref() == Some(&expected) {
                    break;
                }
                assert!(
                    Instant::now() < give_up,
                    "round {round}: {owner} answers {answer:?}, not {expected:?}"
                );
                sleep(Duration::from_millis(5)).await;
            }
        }
        if round == rounds {
            break;
        }
        let lease_records = f
            .lease(f.settings(&name, "probe"))
            .await
            .records_preference();
        if !lease_records {
            break;
        }
        let next = (leader + 1 + round) % 3;
        let moved = managers[leader]
            .0
            .send(TransferLeadership::to(owners[next]))
            .await
            .unwrap();
        assert!(moved.unwrap(), "round {round}: transferred");
        wait_for_state(&managers[next].0, SingletonState::Running, within).await;
        leader = next;
    }
    assert_one_at_a_time(&life);
    for (manager, owner) in &managers {
        let released = manager.send(actix_coordination::Shutdown).await.unwrap();
        assert!(released.unwrap(), "{owner} shut down");
    }
}

/// Stops the actor it is sent to.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopActor;

impl<L: Lease> Handler<StopActor> for LeaseActor<L> {
    type Result = ();
    fn handle(&mut self, _: StopActor, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// A region that acknowledges every shard at once.
pub struct Sink;

impl Actor for Sink {
    type Context = Context<Self>;
}

impl Handler<HostShard> for Sink {
    type Result = ();
    fn handle(&mut self, _: HostShard, _: &mut Self::Context) {}
}
