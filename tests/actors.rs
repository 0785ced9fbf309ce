//! The lease-holding actor and the sharding coordinator gate, on the in-memory backend under a
//! paused clock.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use std::sync::Arc;

use actix::prelude::*;
use actix_coordination::{
    Acquire, AllocateShard, CheckAlive, CoordinatorGate, GateError, GateState, GetFencingToken,
    GetGateState, HostShard, InMemoryFault, InMemoryStore, Lease, LeaseActor, LeaseError,
    LeaseLost, LeaseSettings, LostReason, Operation, RegisterRegion, Release, ShardCoordinator,
    Submission, SubscribeLeaseLost, TenureEnd, UnsubscribeLeaseLost,
};
use common::run_paused;
use tokio::time::{sleep, sleep_until, Instant};

const TTL: Duration = Duration::from_secs(9);

fn settings(name: &str, owner: &str) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(TTL)
        .acquire_retries(0)
        .build()
        .unwrap()
}

/// Collects the `LeaseLost` messages it receives.
struct Listener(Rc<RefCell<Vec<LeaseLost>>>);

impl Actor for Listener {
    type Context = Context<Self>;
}

impl Handler<LeaseLost> for Listener {
    type Result = ();
    fn handle(&mut self, lost: LeaseLost, _: &mut Self::Context) {
        self.0.borrow_mut().push(lost);
    }
}

#[test]
fn lease_actor_answers_acquire_release_and_check() {
    run_paused(async {
        let store = InMemoryStore::new();
        let a = LeaseActor::new(store.lease(settings("l", "a"))).start();
        let b = LeaseActor::new(store.lease(settings("l", "b"))).start();
        assert!(!a.send(CheckAlive).await.unwrap());
        assert!(a.send(Acquire).await.unwrap().unwrap());
        assert!(a.send(Acquire).await.unwrap().unwrap(), "reentrant");
        assert!(a.send(CheckAlive).await.unwrap());
        let token = a.send(GetFencingToken).await.unwrap().unwrap();
        assert!(!b.send(Acquire).await.unwrap().unwrap());
        assert!(b.send(Release).await.unwrap().unwrap(), "not held: no-op");
        assert!(a.send(Release).await.unwrap().unwrap());
        assert!(!a.send(CheckAlive).await.unwrap());
        assert!(b.send(Acquire).await.unwrap().unwrap());
        assert!(b.send(GetFencingToken).await.unwrap().unwrap() > token);
    });
}

#[test]
fn concurrent_messages_are_serialised() {
    run_paused(async {
        let store = InMemoryStore::new();
        store.set_fault(Some(actix_coordination::InMemoryFault::Delay(
            Duration::from_millis(100),
        )));
        let a = LeaseActor::new(store.lease(settings("l", "a"))).start();
        // Sent back to back without waiting: they take effect in order; the release supersedes
        // the acquire before it, the last acquire runs after the release.
        let r1 = a.send(Acquire);
        let r2 = a.send(Release);
        let r3 = a.send(Acquire);
        let alive_meanwhile = a.send(CheckAlive);
        assert!(
            !alive_meanwhile.await.unwrap(),
            "CheckAlive answers at once, not after the acquire"
        );
        let first = r1.await.unwrap();
        assert!(
            matches!(
                first,
                Err(LeaseError::Superseded {
                    operation: Operation::Acquire
                })
            ),
            "{first:?}"
        );
        assert!(r2.await.unwrap().unwrap());
        assert!(r3.await.unwrap().unwrap());
        assert!(a.send(CheckAlive).await.unwrap());
        assert_eq!(store.holder("l").as_deref(), Some("a"));
    });
}

/// Settings whose `acquire` keeps retrying for a while when another owner holds the lease.
fn retrying_settings(name: &str, owner: &str) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(TTL)
        .acquire_retries(3)
        .acquire_retry_delay(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// Issue 27, item 3: a `Release` sent after an `Acquire` takes effect after it. An acquire
/// retrying while another owner holds the lease used to let the release run between two of its
/// attempts (answering `Ok(true)`), then took the lease with its next attempt: the actor held
/// the lease its caller had let go of. Now the release supersedes it. And a claim that an attempt
/// in flight obtains is released before the `Release` answers.
#[test]
fn release_supersedes_a_retrying_acquire() {
    run_paused(async {
        // Retrying: another owner holds the lease, and lets it go after the release answered.
        let store = InMemoryStore::new();
        let b = store.lease(settings("l", "b"));
        assert!(b.acquire().await.unwrap());
        let a = LeaseActor::new(store.lease(retrying_settings("l", "a"))).start();
        let acquiring = a.send(Acquire);
        // The first attempt found the lease held; the acquire waits for its next attempt.
        sleep(Duration::from_millis(10)).await;
        assert!(a.send(Release).await.unwrap().unwrap());
        assert!(b.release().await.unwrap());
        let acquired = acquiring.await.unwrap();
        // No later attempt takes the lease either.
        sleep(TTL).await;
        assert_eq!(store.holder("l"), None, "acquire answered {acquired:?}");
        assert!(!a.send(CheckAlive).await.unwrap());
        assert!(
            matches!(
                acquired,
                Err(LeaseError::Superseded {
                    operation: Operation::Acquire
                })
            ),
            "{acquired:?}"
        );

        // An attempt in flight when the release arrives: its claim is released before the
        // release answers.
        let store = InMemoryStore::new();
        store.set_fault(Some(InMemoryFault::Delay(Duration::from_millis(100))));
        let a = LeaseActor::new(store.lease(retrying_settings("l", "a"))).start();
        let acquiring = a.send(Acquire);
        sleep(Duration::from_millis(10)).await;
        assert!(a.send(Release).await.unwrap().unwrap());
        assert_eq!(
            store.holder("l"),
            None,
            "released before the release answered"
        );
        assert!(matches!(
            acquiring.await.unwrap(),
            Err(LeaseError::Superseded { .. })
        ));
        assert!(!a.send(CheckAlive).await.unwrap());
    });
}

/// Issue 27, item 1: an actor stopped (its every address dropped) while an `Acquire` is in
/// flight leaves nothing held: neither on a lease it owns (whose record used to stay held for a
/// TTL) nor on a shared lease (which used to stay held, and renewed, for as long as any handle
/// lived). Each with the attempt in flight at the stop, and with the acquire retrying while
/// another owner holds the lease (that owner lets go after the stop).
#[test]
fn stopping_with_an_acquire_in_flight_leaves_nothing_held() {
    run_paused(async {
        for shared in [false, true] {
            for retrying in [false, true] {
                let case = format!("shared: {shared}, retrying: {retrying}");
                let store = InMemoryStore::new();
                let b = store.lease(settings("l", "b"));
                if retrying {
                    assert!(b.acquire().await.unwrap());
                } else {
                    store.set_fault(Some(InMemoryFault::Delay(Duration::from_millis(100))));
                }
                let lease = Arc::new(store.lease(retrying_settings("l", "a")));
                let actor = LeaseActor::from_arc(Arc::clone(&lease)).start();
                let weak = Arc::downgrade(&lease);
                let kept = shared.then_some(lease);
                let acquiring = actor.send(Acquire);
                sleep(Duration::from_millis(10)).await;
                drop(actor);
                if retrying {
                    assert!(b.release().await.unwrap());
                }
                let acquired = acquiring.await.unwrap();
                // Well within the TTL: whatever the acquire obtained was released.
                sleep(TTL / 3).await;
                assert_eq!(
                    store.holder("l"),
                    None,
                    "{case}: acquire answered {acquired:?}"
                );
                if let Some(lease) = kept {
                    assert!(!lease.check_alive(), "{case}");
                } else {
                    assert!(
                        weak.upgrade().is_none(),
                        "{case}: the actor's lease is gone"
                    );
                }
                assert!(
                    matches!(acquired, Err(LeaseError::Superseded { .. })),
                    "{case}: {acquired:?}"
                );
            }
        }
    });
}

#[test]
fn subscribers_get_exactly_one_lease_lost_per_loss() {
    run_paused(async {
        let store = InMemoryStore::new();
        let lease = LeaseActor::new(store.lease(settings("l", "a"))).start();
        let (seen1, seen2, seen3) = (Rc::default(), Rc::default(), Rc::default());
        let l1 = Listener(Rc::clone(&seen1)).start();
        let l2 = Listener(Rc::clone(&seen2)).start();
        let l3 = Listener(Rc::clone(&seen3)).start();
        let id1 = lease
            .send(SubscribeLeaseLost(l1.clone().recipient()))
            .await
            .unwrap();
        let id2 = lease
            .send(SubscribeLeaseLost(l2.clone().recipient()))
            .await
            .unwrap();
        let id3 = lease
            .send(SubscribeLeaseLost(l3.clone().recipient()))
            .await
            .unwrap();
        assert!(lease.send(UnsubscribeLeaseLost(id2)).await.unwrap());
        assert!(!lease.send(UnsubscribeLeaseLost(id2)).await.unwrap());

        assert!(lease.send(Acquire).await.unwrap().unwrap());
        let token = lease.send(GetFencingToken).await.unwrap();
        store.partition("a");
        sleep(TTL * 2).await;
        assert_eq!(seen1.borrow().len(), 1);
        assert_eq!(seen2.borrow().len(), 0, "unsubscribed");
        assert_eq!(seen3.borrow().len(), 1);
        let lost = seen1.borrow()[0].clone();
        assert_eq!((lost.name.as_str(), lost.owner.as_str()), ("l", "a"));
        assert_eq!(lost.fencing_token, token);
        assert!(matches!(lost.reason, LostReason::Expired { .. }));

        // A stopped subscriber is dropped; the others get the next loss once.
        l3.send(StopListener).await.unwrap();
        store.heal("a");
        assert!(lease.send(Acquire).await.unwrap().unwrap());
        store.force_take("l", "intruder", TTL);
        sleep(Duration::from_millis(10)).await;
        assert_eq!(seen1.borrow().len(), 2);
        assert!(
            matches!(seen1.borrow()[1].reason, LostReason::TakenOver { ref holder } if holder.as_deref() == Some("intruder"))
        );
        assert_eq!(seen3.borrow().len(), 1);
        // The stopped subscriber's subscription is gone (dropped at the loss), the live one's not.
        assert!(
            !lease.send(UnsubscribeLeaseLost(id3)).await.unwrap(),
            "the stopped subscriber was dropped"
        );
        assert!(
            lease.send(UnsubscribeLeaseLost(id1)).await.unwrap(),
            "the live subscriber is still subscribed"
        );
    });
}

#[derive(Message)]
#[rtype(result = "()")]
struct StopListener;

impl Handler<StopListener> for Listener {
    type Result = ();
    fn handle(&mut self, _: StopListener, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// A shard region that records what it hosts; it acknowledges `HostShard` after `ack_delay`.
struct Region {
    hosted: Rc<RefCell<Vec<HostShard>>>,
    ack_delay: Duration,
}

impl Actor for Region {
    type Context = Context<Self>;
}

impl Handler<HostShard> for Region {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, msg: HostShard, _: &mut Self::Context) -> Self::Result {
        self.hosted.borrow_mut().push(msg);
        let delay = self.ack_delay;
        Box::pin(async move { sleep(delay).await })
    }
}

fn region(ack_delay: Duration) -> (Addr<Region>, Rc<RefCell<Vec<HostShard>>>) {
    let hosted = Rc::new(RefCell::new(Vec::new()));
    (
        Region {
            hosted: Rc::clone(&hosted),
            ack_delay,
        }
        .start(),
        hosted,
    )
}

#[test]
fn coordinator_allocates_to_the_least_loaded_region() {
    run_paused(async {
        let store = InMemoryStore::new();
        let coordinator = ShardCoordinator::new(store.lease(settings("coord", "c1"))).start();
        let (r1, hosted1) = region(Duration::ZERO);
        let (r2, hosted2) = region(Duration::ZERO);
        assert_eq!(
            coordinator
                .send(RegisterRegion(r1.clone().recipient()))
                .await
                .unwrap(),
            Ok(1)
        );
        assert_eq!(
            coordinator
                .send(RegisterRegion(r2.clone().recipient()))
                .await
                .unwrap(),
            Ok(2)
        );
        assert_eq!(
            coordinator
                .send(RegisterRegion(r2.clone().recipient()))
                .await
                .unwrap(),
            Ok(2),
            "idempotent"
        );
        let token = store.record("coord").unwrap().token;
        let mut regions = Vec::new();
        for shard in ["s1", "s2", "s3", "s4"] {
            let a = coordinator
                .send(AllocateShard(shard.into()))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(a.fencing_token, token);
            regions.push(a.region);
        }
        assert_eq!(hosted1.borrow().len(), 2);
        assert_eq!(hosted2.borrow().len(), 2);
        assert_ne!(regions[0], regions[1], "balanced");
        let again = coordinator
            .send(AllocateShard("s1".into()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            again.region, regions[0],
            "an allocated shard stays where it is"
        );
        assert_eq!(
            hosted1.borrow().len() + hosted2.borrow().len(),
            4,
            "no second HostShard"
        );
        // A stopped region's shards go elsewhere.
        drop(regions);
        drop(again);
        r1.send(StopRegion).await.unwrap();
        sleep(Duration::from_millis(1)).await;
        let moved = coordinator
            .send(AllocateShard("s1".into()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(moved.region, r2.clone().recipient());
    });
}

#[derive(Message)]
#[rtype(result = "()")]
struct StopRegion;

impl Handler<StopRegion> for Region {
    type Result = ();
    fn handle(&mut self, _: StopRegion, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

#[test]
fn requests_wait_while_the_coordinator_acquires() {
    run_paused(async {
        let store = InMemoryStore::new();
        // Another coordinator holds the lease: ours must wait, not allocate.
        let other = store.lease(settings("coord", "other"));
        assert!(other.acquire().await.unwrap());
        let coordinator = ShardCoordinator::new(store.lease(settings("coord", "c1"))).start();
        let (r1, hosted) = region(Duration::ZERO);
        let registered = coordinator.send(RegisterRegion(r1.recipient()));
        let allocated = coordinator.send(AllocateShard("s1".into()));
        sleep(TTL / 3).await;
        assert_eq!(
            coordinator.send(GetGateState).await.unwrap(),
            GateState::Acquiring
        );
        assert!(
            hosted.borrow().is_empty(),
            "nothing allocated without the lease"
        );
        let released_at = Instant::now();
        assert!(other.release().await.unwrap());
        assert_eq!(registered.await.unwrap(), Ok(1));
        let allocation = allocated.await.unwrap().unwrap();
        assert!(
            released_at.elapsed() <= Duration::from_secs(1),
            "served soon after the lease freed up"
        );
        assert_eq!(
            allocation.fencing_token,
            store.record("coord").unwrap().token
        );
        assert_eq!(hosted.borrow().len(), 1);
    });
}

/// When the coordinator's tenure ends (here: its renewals fail until the deadline), every pending
/// allocation is rejected with `TenureEnded`, and the coordinator competes again instead of
/// stopping: once the store is reachable again it holds the lease under a higher token and serves.
#[test]
fn tenure_end_rejects_pending_allocations_and_the_coordinator_competes_again() {
    run_paused(async {
        let store = InMemoryStore::new();
        // The region acknowledges slowly (within the acknowledgement timeout): allocations stay
        // pending.
        let coordinator = ShardCoordinator::new(store.lease(settings("coord", "c1")))
            .with_ack_timeout(TTL * 20)
            .unwrap()
            .start();
        let (r1, _hosted) = region(TTL * 10);
        assert_eq!(
            coordinator
                .send(RegisterRegion(r1.recipient()))
                .await
                .unwrap(),
            Ok(1)
        );
        let first = store.record("coord").unwrap().token;
        let pending: Vec<_> = (0..3)
            .map(|i| coordinator.send(AllocateShard(format!("s{i}"))))
            .collect();
        sleep(Duration::from_millis(1)).await;
        store.partition("c1");
        for p in pending {
            let result = p.await.unwrap();
            assert!(
                matches!(
                    result,
                    Err(GateError::TenureEnded(
                        TenureEnd::DeadlinePassed | TenureEnd::Lost(LostReason::Expired { .. })
                    ))
                ),
                "{result:?}"
            );
        }
        sleep(Duration::from_millis(1)).await;
        assert!(coordinator.connected(), "the coordinator keeps running");
        assert_eq!(
            coordinator.send(GetGateState).await.unwrap(),
            GateState::Acquiring
        );
        // Requests wait again while it competes; it serves them once it holds the lease again.
        let (r2, hosted) = region(Duration::ZERO);
        let waiting = coordinator.send(RegisterRegion(r2.recipient()));
        store.heal("c1");
        let registered = tokio::time::timeout(TTL * 3, waiting)
            .await
            .expect("served once the lease is held again")
            .unwrap();
        assert_eq!(registered, Ok(2));
        let second = store.record("coord").unwrap().token;
        assert!(second > first, "a new tenure");
        assert_eq!(
            coordinator.send(GetGateState).await.unwrap(),
            GateState::Open(second)
        );
        // The shard table of the old tenure was forgotten; allocations go on under the new token.
        let a = coordinator
            .send(AllocateShard("s10".into()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(a.fencing_token, second);
        assert!(hosted.borrow().iter().all(|h| h.fencing_token == second));
    });
}

/// The gate's own check before each allocation: past the lease's local deadline `admit` refuses
/// with `NotHeld`, even though no `LeaseLost` reached the gate (a bare gate has no subscription).
#[test]
fn gate_refuses_past_the_lease_deadline_without_a_loss_notification() {
    run_paused(async {
        let store = InMemoryStore::new();
        let lease = Arc::new(store.lease(settings("coord", "c1")));
        let mut gate = CoordinatorGate::<_, u32, ()>::new(Arc::clone(&lease));
        assert_eq!(
            gate.admit(),
            Err(GateError::NotHeld),
            "a gate that never opened refuses"
        );
        assert!(lease.acquire().await.unwrap());
        let (token, queued) = gate.open(lease.tenure().guard().unwrap()).expect("held");
        assert!(queued.is_empty());
        assert_eq!(gate.admit(), Ok(token));
        // Renewals hang from now on.
        store.pause("c1");
        let deadline = lease.deadline().unwrap();
        sleep_until(deadline - Duration::from_millis(1)).await;
        assert_eq!(gate.admit(), Ok(token), "alive until the deadline");
        sleep_until(deadline).await;
        assert_eq!(gate.state(), &GateState::Open(token), "nobody closed it");
        assert_eq!(gate.admit(), Err(GateError::NotHeld));
        assert!(matches!(
            gate.submit(7),
            Submission::Refused(GateError::NotHeld)
        ));
    });
}

/// A release through another handle of a shared lease ends the coordinator's tenure like a loss
/// (before, the gate stayed `Open` with the old token forever and the coordinator never competed
/// again): it leaves the old tenure, competes, and serves under a higher token; while another
/// node holds the lease it serves nothing.
#[test]
fn release_through_another_handle_ends_the_coordinators_tenure() {
    run_paused(async {
        let store = InMemoryStore::new();
        let lease = Arc::new(store.lease(settings("coord", "c1")));
        let coordinator = ShardCoordinator::from_arc(Arc::clone(&lease)).start();
        let (r1, hosted) = region(Duration::ZERO);
        assert_eq!(
            coordinator
                .send(RegisterRegion(r1.recipient()))
                .await
                .unwrap(),
            Ok(1)
        );
        let s1 = coordinator
            .send(AllocateShard("s1".into()))
            .await
            .unwrap()
            .unwrap();
        let first = s1.fencing_token;
        // Another node waits for the lease; another user of the shared lease releases it.
        let other = store.lease(settings("coord", "c2"));
        let waiting = tokio::spawn(async move {
            let got = other.acquire_within(TTL * 10).await;
            (got, other)
        });
        sleep(Duration::from_millis(1)).await;
        assert!(lease.release().await.unwrap());
        let (got, other) = waiting.await.unwrap();
        assert!(got.unwrap(), "the other node took over at once");
        sleep(Duration::from_millis(1)).await;
        assert_eq!(
            coordinator.send(GetGateState).await.unwrap(),
            GateState::Acquiring,
            "the gate left the released tenure"
        );
        let refused = tokio::time::timeout(TTL, coordinator.send(AllocateShard("s2".into()))).await;
        assert!(
            refused.is_err(),
            "nothing is served while another node holds the lease"
        );
        assert_eq!(hosted.borrow().len(), 1, "s2 was not allocated");
        // The other node releases: the coordinator takes over and serves under a higher token.
        assert!(other.release().await.unwrap());
        let s3 = tokio::time::timeout(TTL * 3, coordinator.send(AllocateShard("s3".into())))
            .await
            .expect("served after the takeover")
            .unwrap()
            .unwrap();
        assert!(s3.fencing_token > first, "{s3:?}");
        assert!(lease.check_alive(), "the shared lease is held again");
    });
}

/// Nothing but the user's addresses keeps a coordinator alive: dropping them stops it, and it
/// releases its lease, or stops waiting for it.
#[test]
fn dropping_every_address_stops_the_coordinator() {
    run_paused(async {
        let store = InMemoryStore::new();
        // Holding the lease.
        let coordinator = ShardCoordinator::new(store.lease(settings("coord", "c1"))).start();
        let (r1, _hosted) = region(Duration::ZERO);
        assert_eq!(
            coordinator
                .send(RegisterRegion(r1.recipient()))
                .await
                .unwrap(),
            Ok(1)
        );
        assert_eq!(store.holder("coord").as_deref(), Some("c1"));
        drop(coordinator);
        sleep(Duration::from_millis(10)).await;
        assert_eq!(store.holder("coord"), None, "released");

        // Waiting for the lease.
        let other = store.lease(settings("coord", "other"));
        assert!(other.acquire().await.unwrap());
        let waiting = ShardCoordinator::new(store.lease(settings("coord", "c2"))).start();
        sleep(Duration::from_millis(10)).await;
        assert_eq!(
            waiting.send(GetGateState).await.unwrap(),
            GateState::Acquiring
        );
        drop(waiting);
        sleep(Duration::from_millis(10)).await;
        assert!(other.release().await.unwrap());
        sleep(TTL * 3).await;
        assert_eq!(
            store.holder("coord"),
            None,
            "the dropped coordinator stopped waiting"
        );
    });
}

/// A coordinator that cannot reach the store backs off exponentially up to its cap, instead of
/// retrying at a fixed pace; once the store answers again, the gate opens within one capped pause.
#[test]
fn coordinator_acquire_errors_back_off_up_to_the_cap() {
    run_paused(async {
        const CAP: Duration = Duration::from_secs(2);
        let store = InMemoryStore::new();
        store.set_fault(Some(InMemoryFault::Unavailable));
        let lease = LeaseSettings::builder("coord", "c1")
            .ttl(TTL)
            .acquire_retry_delay(Duration::from_millis(200))
            .build()
            .unwrap();
        let coordinator = ShardCoordinator::new(store.lease(lease))
            .with_max_error_backoff(CAP)
            .start();
        let gaps = common::refused_attempt_gaps(&store, Duration::from_secs(30)).await;
        assert!(
            gaps[0] >= Duration::from_millis(160),
            "no fast retries: {gaps:?}"
        );
        common::assert_backoff_up_to(&gaps, 0, 3, CAP);
        assert_eq!(
            coordinator.send(GetGateState).await.unwrap(),
            GateState::Acquiring
        );

        store.set_fault(None);
        let healed = Instant::now();
        while !matches!(
            coordinator.send(GetGateState).await.unwrap(),
            GateState::Open(_)
        ) {
            assert!(
                healed.elapsed() <= CAP + Duration::from_millis(2),
                "gate still closed"
            );
            sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(store.holder("coord").as_deref(), Some("c1"));
    });
}

/// The queue of requests waiting for the coordinator's lease is bounded: past the bound a request
/// is refused at once, and one that waited longer than the wait bound is refused then.
#[test]
fn the_coordinators_queue_is_bounded_in_size_and_in_time() {
    run_paused(async {
        let store = InMemoryStore::new();
        let holder = store.lease(settings("coord", "elsewhere"));
        assert!(holder.acquire().await.unwrap());
        let wait = Duration::from_secs(5);
        let coordinator = ShardCoordinator::new(store.lease(settings("coord", "c1")))
            .with_queue_bound(2, wait)
            .start();
        let start = Instant::now();
        let first = coordinator.send(AllocateShard("s1".into()));
        let second = coordinator.send(AllocateShard("s2".into()));
        sleep(Duration::from_millis(1)).await;
        assert_eq!(
            coordinator.send(AllocateShard("s3".into())).await.unwrap(),
            Err(GateError::QueueFull { capacity: 2 })
        );
        for queued in [first, second] {
            let refused = queued.await.unwrap();
            assert!(
                matches!(refused, Err(GateError::QueueTimeout { waited }) if waited >= wait),
                "{refused:?}"
            );
        }
        assert!(start.elapsed() >= wait && start.elapsed() < wait + Duration::from_millis(100));
        assert_eq!(
            coordinator.send(GetGateState).await.unwrap(),
            GateState::Acquiring
        );
    });
}

/// Stops the coordinator from inside, as an application's handler would.
#[derive(Message)]
#[rtype(result = "()")]
struct StopCoordinator;

impl Handler<StopCoordinator> for ShardCoordinator<actix_coordination::InMemoryLease> {
    type Result = ();
    fn handle(&mut self, _: StopCoordinator, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// Under `actix::Supervisor` the coordinator is restarted after it stops: it released its lease,
/// competes again from scratch, and serves under a new tenure.
#[test]
fn a_supervised_coordinator_restarts_and_competes_again() {
    run_paused(async {
        let store = InMemoryStore::new();
        let lease = Arc::new(store.lease(settings("coord", "c1")));
        let coordinator = {
            let lease = Arc::clone(&lease);
            actix::Supervisor::start(move |_| ShardCoordinator::from_arc(Arc::clone(&lease)))
        };
        let (r1, _) = region(Duration::ZERO);
        assert_eq!(
            coordinator
                .send(RegisterRegion(r1.clone().recipient()))
                .await
                .unwrap(),
            Ok(1)
        );
        let first = lease.fencing_token().unwrap();
        coordinator.send(StopCoordinator).await.unwrap();
        // It stops, releases, restarts and competes again: a request waits for the new tenure.
        let registered =
            tokio::time::timeout(TTL, coordinator.send(RegisterRegion(r1.recipient())))
                .await
                .expect("served again")
                .unwrap();
        assert_eq!(registered, Ok(1), "a fresh coordinator");
        let second = lease.fencing_token().expect("held again");
        assert!(second > first, "a new tenure: {second} > {first}");
        assert_eq!(
            coordinator.send(GetGateState).await.unwrap(),
            GateState::Open(second)
        );
    });
}

/// `GetTenure` hands out the lease's `TenureWatch`: it sees the tenure start through the actor
/// and end through another handle of the shared lease.
#[test]
fn the_lease_actor_hands_out_its_tenure_watch() {
    run_paused(async {
        let store = InMemoryStore::new();
        let lease = Arc::new(store.lease(settings("l", "a")));
        let actor = LeaseActor::from_arc(Arc::clone(&lease)).start();
        let watch = actor.send(actix_coordination::GetTenure).await.unwrap();
        assert_eq!(watch.current(), None);
        let started = {
            let mut watch = watch.clone();
            tokio::spawn(async move { watch.changed().await })
        };
        sleep(Duration::from_millis(1)).await;
        assert!(actor.send(Acquire).await.unwrap().unwrap());
        let tenure = started.await.unwrap().expect("a tenure started");
        assert_eq!(Some(tenure.token()), lease.fencing_token());
        let guard = watch.guard().unwrap();
        let ended = tokio::spawn(async move {
            let mut watch = watch;
            watch.changed().await
        });
        sleep(Duration::from_millis(1)).await;
        assert!(lease.release().await.unwrap(), "released through the Arc");
        assert_eq!(ended.await.unwrap(), None);
        assert_eq!(guard.end(), Some(TenureEnd::Released));
        assert!(!actor.send(CheckAlive).await.unwrap());
    });
}

/// A region that never acknowledges `HostShard` (its answer never comes: wedged).
struct WedgedRegion(Rc<RefCell<Vec<HostShard>>>);

impl Actor for WedgedRegion {
    type Context = Context<Self>;
}

impl Handler<HostShard> for WedgedRegion {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, msg: HostShard, _: &mut Self::Context) -> Self::Result {
        self.0.borrow_mut().push(msg);
        Box::pin(std::future::pending())
    }
}

/// Issue 27 item 9: an allocation waits for a wedged region's acknowledgement at most the
/// coordinator's acknowledgement timeout (validated; default `DEFAULT_ACK_TIMEOUT`), then fails
/// with `GateError::AckTimeout`; the shard stays with that region (no second `HostShard`
/// elsewhere), and the coordinator keeps serving.
#[test]
fn an_allocation_waits_for_a_wedged_region_at_most_the_ack_timeout() {
    use actix_coordination::{SettingsError, DEFAULT_ACK_TIMEOUT};

    run_paused(async {
        let store = InMemoryStore::new();
        let rejected = ShardCoordinator::new(store.lease(settings("coord", "x")))
            .with_ack_timeout(Duration::ZERO)
            .err();
        assert_eq!(
            rejected,
            Some(SettingsError::Zero {
                field: "ack-timeout"
            })
        );
        let rejected = ShardCoordinator::new(store.lease(settings("coord", "x")))
            .with_ack_timeout(LeaseSettings::MAX_DURATION + Duration::from_secs(1))
            .err();
        assert!(
            matches!(
                rejected,
                Some(SettingsError::DurationTooLong {
                    field: "ack-timeout",
                    ..
                })
            ),
            "{rejected:?}"
        );

        // The default bound.
        let coordinator = ShardCoordinator::new(store.lease(settings("coord", "c1"))).start();
        let wedged_hosts = Rc::new(RefCell::new(Vec::new()));
        let wedged = WedgedRegion(Rc::clone(&wedged_hosts)).start();
        assert_eq!(
            coordinator
                .send(RegisterRegion(wedged.clone().recipient()))
                .await
                .unwrap(),
            Ok(1)
        );
        let asked = Instant::now();
        let answer = tokio::time::timeout(
            DEFAULT_ACK_TIMEOUT * 3,
            coordinator.send(AllocateShard("s1".into())),
        )
        .await
        .expect("answered within the acknowledgement timeout")
        .unwrap();
        assert_eq!(
            answer,
            Err(GateError::AckTimeout {
                timeout: DEFAULT_ACK_TIMEOUT
            })
        );
        assert_eq!(asked.elapsed(), DEFAULT_ACK_TIMEOUT);
        assert_eq!(wedged_hosts.borrow().len(), 1, "it was asked once");
        // The coordinator serves on; the shard stays with the wedged region, a new one goes to
        // the healthy region.
        let (healthy, hosted) = region(Duration::ZERO);
        assert_eq!(
            coordinator
                .send(RegisterRegion(healthy.clone().recipient()))
                .await
                .unwrap(),
            Ok(2)
        );
        let s1 = coordinator
            .send(AllocateShard("s1".into()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s1.region, wedged.clone().recipient(), "s1 is not moved");
        let s2 = coordinator
            .send(AllocateShard("s2".into()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s2.region, healthy.clone().recipient());
        assert_eq!(hosted.borrow().len(), 1);
        assert_eq!(wedged_hosts.borrow().len(), 1, "no second HostShard");
        drop(coordinator);

        // A configured bound.
        let timeout = Duration::from_secs(2);
        let coordinator = ShardCoordinator::new(store.lease(settings("coord2", "c1")))
            .with_ack_timeout(timeout)
            .unwrap()
            .start();
        coordinator
            .send(RegisterRegion(wedged.recipient()))
            .await
            .unwrap()
            .unwrap();
        let asked = Instant::now();
        let answer = coordinator.send(AllocateShard("s3".into())).await.unwrap();
        assert_eq!(answer, Err(GateError::AckTimeout { timeout }));
        assert_eq!(asked.elapsed(), timeout);
    });
}
