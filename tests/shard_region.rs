//! ShardRegion on the in-memory backend under a paused clock: a region a coordinator gives a
//! shard runs its entities only under the shard's own lease, stops them when that lease ends, and
//! releases it when the shard is handed off (Akka's bug: a handed-off shard that kept its lease)
//! or the region stops.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    AllocateShard, FencingToken, GetHostedShards, HandOffShard, HostShard, InMemoryLease,
    InMemoryStore, LeaseSettings, RegisterRegion, ShardCoordinator, ShardInfo, ShardRegion,
};
use common::run_paused;
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(6);

/// (region owner, shard, token, started or stopped)
type Log = Rc<RefCell<Vec<(Instant, String, String, Option<FencingToken>)>>>;

struct Entities {
    owner: String,
    shard: String,
    log: Log,
}

impl Actor for Entities {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.log
            .borrow_mut()
            .push((Instant::now(), self.owner.clone(), self.shard.clone(), None));
    }
}

fn settings(name: &str, owner: &str) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(TTL)
        .renewal_interval(Duration::from_secs(2))
        .build()
        .unwrap()
}

type Region = Addr<ShardRegion<Entities, InMemoryLease>>;

fn region(store: &InMemoryStore, owner: &str, log: &Log) -> Region {
    let (store, lease_owner, log) = (store.clone(), owner.to_owned(), log.clone());
    ShardRegion::new(
        "entities",
        move |name: &str| store.lease(settings(name, &lease_owner)),
        move |shard: &ShardInfo, _: &mut Context<Entities>| {
            assert!(shard.guard.check_alive());
            log.borrow_mut().push((
                Instant::now(),
                shard.owner.clone(),
                shard.shard.clone(),
                Some(shard.fencing_token),
            ));
            Entities {
                owner: shard.owner.clone(),
                shard: shard.shard.clone(),
                log: log.clone(),
            }
        },
    )
    .start()
}

async fn until(within: Duration, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Whether `owner`'s entities of `shard` run now, by the log.
fn running(log: &Log, owner: &str, shard: &str) -> bool {
    let mut on = false;
    for (_, o, s, token) in log.borrow().iter() {
        if o == owner && s == shard {
            on = token.is_some();
        }
    }
    on
}

/// No shard's entities ever ran in two regions at once.
fn assert_never_twice(log: &Log) {
    let mut running: std::collections::BTreeMap<String, String> = Default::default();
    for (at, owner, shard, token) in log.borrow().iter() {
        match token {
            Some(_) => {
                if let Some(other) = running.insert(shard.clone(), owner.clone()) {
                    panic!("{at:?}: {shard} started in {owner} while running in {other}");
                }
            }
            None => {
                running.remove(shard);
            }
        }
    }
}

#[test]
fn an_allocated_shard_runs_under_its_own_lease_with_its_token() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let a = region(&store, "node-a", &log);
        let coordinator =
            ShardCoordinator::new(store.lease(settings("coordinator", "node-a"))).start();
        coordinator
            .send(RegisterRegion(a.clone().recipient()))
            .await
            .unwrap()
            .unwrap();
        coordinator
            .send(AllocateShard("s1".into()))
            .await
            .unwrap()
            .unwrap();
        until(Duration::from_secs(5), "entities run", || {
            running(&log, "node-a", "s1")
        })
        .await;
        let record = store.record("entities-s1").unwrap();
        assert_eq!(record.holder.as_deref(), Some("node-a"));
        let hosted = a.send(GetHostedShards).await.unwrap();
        assert_eq!(hosted.len(), 1);
        assert_eq!(
            hosted[0].fencing_token, record.token,
            "the shard lease's token"
        );
    });
}

/// The Akka bug (akka/akka#31715): a handed-off shard kept its lease, and the next region waited a
/// TTL. Here the handoff answers once the entities stopped and the lease is released, and the
/// next region starts them at once.
#[test]
fn a_handed_off_shard_releases_its_lease_at_once() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let (a, b) = (
            region(&store, "node-a", &log),
            region(&store, "node-b", &log),
        );
        a.send(HostShard {
            shard: "s1".into(),
            fencing_token: FencingToken::new(1),
        })
        .await
        .unwrap();
        until(Duration::from_secs(5), "a runs s1", || {
            running(&log, "node-a", "s1")
        })
        .await;
        // b is told to host it too (a coordinator's new decision): it waits on the lease.
        b.send(HostShard {
            shard: "s1".into(),
            fencing_token: FencingToken::new(2),
        })
        .await
        .unwrap();
        sleep(Duration::from_secs(1)).await;
        assert!(
            !running(&log, "node-b", "s1"),
            "b runs nothing while a holds the lease"
        );

        let handed = Instant::now();
        assert!(a.send(HandOffShard("s1".into())).await.unwrap().unwrap());
        assert!(
            !running(&log, "node-a", "s1"),
            "a's entities stopped before the answer"
        );
        assert_ne!(store.holder("entities-s1").as_deref(), Some("node-a"));
        until(Duration::from_secs(5), "b runs s1", || {
            running(&log, "node-b", "s1")
        })
        .await;
        assert!(handed.elapsed() < TTL / 2, "b took {:?}", handed.elapsed());
        assert!(a.send(GetHostedShards).await.unwrap().is_empty());
        assert_never_twice(&log);
    });
}

/// A lost shard lease stops the entities before another region can take the shard; a stopped
/// region releases every lease it holds.
#[test]
fn a_lost_lease_stops_the_entities_and_a_stopped_region_releases_everything() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let a = region(&store, "node-a", &log);
        let b = region(&store, "node-b", &log);
        for shard in ["s1", "s2"] {
            a.send(HostShard {
                shard: shard.into(),
                fencing_token: FencingToken::new(1),
            })
            .await
            .unwrap();
        }
        until(Duration::from_secs(5), "a runs both", || {
            running(&log, "node-a", "s1") && running(&log, "node-a", "s2")
        })
        .await;
        // a is cut off from the store: its entities stop at its deadline, before b can claim.
        b.send(HostShard {
            shard: "s1".into(),
            fencing_token: FencingToken::new(2),
        })
        .await
        .unwrap();
        store.partition("node-a");
        until(TTL * 3, "b runs s1", || running(&log, "node-b", "s1")).await;
        assert!(!running(&log, "node-a", "s1"));
        assert_never_twice(&log);
        store.heal("node-a");
        until(TTL * 3, "a runs s2 again", || running(&log, "node-a", "s2")).await;

        // Stopping the region releases its leases (after its entities stopped).
        a.send(StopRegion).await.unwrap();
        until(Duration::from_secs(5), "a released s2", || {
            store.holder("entities-s2").is_none()
        })
        .await;
        assert!(!running(&log, "node-a", "s2"));
        assert_never_twice(&log);
    });
}

/// Stops the region from inside (as a handler that calls `ctx.stop()` would).
#[derive(Message)]
#[rtype(result = "()")]
struct StopRegion;

impl Handler<StopRegion> for ShardRegion<Entities, InMemoryLease> {
    type Result = ();
    fn handle(&mut self, _: StopRegion, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
