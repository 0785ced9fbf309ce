//! Entities under a shard (issue 38, item 4), in memory under a paused clock: an entity starts on
//! its first message and keeps its state; a message for an entity whose shard runs elsewhere is
//! refused with the holder; a handover or a lost tenure stops a shard's entities before another
//! node starts them (no two actors of one entity id alive at once, each under a higher fencing
//! token); an idle entity stops and the next message starts it again; and no entity ever handles
//! a message after its shard's guard ended, not even one queued before.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    Entities, EntityError, EntityHost, EntityHosts, FencingToken, GetShards, InMemoryLease,
    InMemoryStore, LeaseSettings, LocateError, ShardInfo, ShardedWorkers, Shutdown,
};
use common::run_paused;
use common::sharded_cases::until;
use tokio::time::{sleep, Instant};

const GROUP: &str = "counters";
const SHARDS: usize = 8;
const TTL: Duration = Duration::from_secs(6);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Started { token: FencingToken },
    Stopped,
}

/// Every entity actor's start and stop: (instant, entity id, node, event).
type Log = Rc<RefCell<Vec<(Instant, String, String, Event)>>>;

/// Messages an entity handled while its guard said the tenure was over: must stay empty.
type Violations = Rc<RefCell<Vec<String>>>;

struct Counter {
    id: String,
    shard: ShardInfo,
    count: u64,
    log: Log,
    violations: Violations,
}

impl Counter {
    fn check(&self, what: &str) {
        if !self.shard.guard.check_alive() {
            let what = format!("{} on {}: {what}", self.id, self.shard.owner);
            self.violations.borrow_mut().push(what);
        }
    }
}

impl Actor for Counter {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        let (id, node) = (self.id.clone(), self.shard.owner.clone());
        (self.log.borrow_mut()).push((Instant::now(), id, node, Event::Stopped));
    }
}

#[derive(Message)]
#[rtype(result = "u64")]
struct Increment;

impl Handler<Increment> for Counter {
    type Result = u64;

    fn handle(&mut self, _: Increment, _: &mut Context<Self>) -> u64 {
        self.check("increment");
        self.count += 1;
        self.count
    }
}

/// Holds the entity's context for a while (`ctx.wait`): nothing else reaches it meanwhile.
#[derive(Message)]
#[rtype(result = "()")]
struct Hold(Duration);

impl Handler<Hold> for Counter {
    type Result = ();

    fn handle(&mut self, Hold(pause): Hold, ctx: &mut Context<Self>) {
        self.check("hold");
        ctx.wait(actix::fut::wrap_future(sleep(pause)));
    }
}

/// Answers after a while, the entity free meanwhile.
#[derive(Message)]
#[rtype(result = "u64")]
struct Slow(Duration);

impl Handler<Slow> for Counter {
    type Result = ResponseActFuture<Self, u64>;

    fn handle(&mut self, Slow(pause): Slow, _: &mut Context<Self>) -> Self::Result {
        self.check("slow");
        Box::pin(actix::fut::wrap_future(sleep(pause)).map(|(), act: &mut Self, _| act.count))
    }
}

/// The entity stops itself.
#[derive(Message)]
#[rtype(result = "()")]
struct StopSelf;

impl Handler<StopSelf> for Counter {
    type Result = ();

    fn handle(&mut self, _: StopSelf, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

type Node = Addr<ShardedWorkers<EntityHost<Counter>, InMemoryLease>>;

fn settings(name: &str, node: &str) -> LeaseSettings {
    LeaseSettings::builder(name, node)
        .ttl(TTL)
        .renewal_interval(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn address(node: &str) -> String {
    format!("http://{node}.example:8080")
}

struct Test {
    store: InMemoryStore,
    log: Log,
    violations: Violations,
}

impl Test {
    fn new() -> Self {
        Self {
            store: InMemoryStore::new(),
            log: Log::default(),
            violations: Violations::default(),
        }
    }

    /// A node of the group whose entities log into the test's log, advertising its address.
    fn node(&self, node: &str, idle: Option<Duration>) -> (Node, Entities<Counter>) {
        let (leases, owner) = (self.store.clone(), node.to_owned());
        let store = self.store.clone();
        let (log, violations) = (self.log.clone(), self.violations.clone());
        let hosts = EntityHosts::new().with_idle_timeout(idle);
        let workers = ShardedWorkers::with_count(
            GROUP,
            SHARDS,
            move |name: &str| leases.lease(settings(name, &owner)),
            hosts.factory(
                move |id: &str, shard: &ShardInfo, _: &mut Context<Counter>| {
                    assert!(
                        shard.guard.check_alive(),
                        "an entity starts under a live tenure"
                    );
                    let started = Event::Started {
                        token: shard.fencing_token,
                    };
                    let entry = (Instant::now(), id.to_owned(), shard.owner.clone(), started);
                    log.borrow_mut().push(entry);
                    Counter {
                        id: id.to_owned(),
                        shard: shard.clone(),
                        count: 0,
                        log: log.clone(),
                        violations: violations.clone(),
                    }
                },
            ),
        )
        .unwrap()
        .advertise(address(node), move |s| Ok::<_, Infallible>(store.lease(s)))
        .unwrap();
        let entities = hosts.entities(workers.directory());
        (workers.start(), entities)
    }

    /// Which entity ids run where, by the entities' own log.
    fn running(&self) -> BTreeMap<String, String> {
        let mut running = BTreeMap::new();
        for (_, id, node, event) in self.log.borrow().iter() {
            match event {
                Event::Started { .. } => running.insert(id.clone(), node.clone()),
                Event::Stopped => running.remove(id),
            };
        }
        running
    }

    /// How many actors of entity `id` were started.
    fn starts(&self, id: &str) -> usize {
        let log = self.log.borrow();
        let started = |e: &&(_, String, _, Event)| e.1 == id && e.3 != Event::Stopped;
        log.iter().filter(started).count()
    }

    /// No two actors of one entity id were ever alive at once (each stopped before the next
    /// started), each one under a higher fencing token than the one before, and none handled a
    /// message after its guard ended.
    fn assert_one_at_a_time(&self) {
        let mut alive: BTreeMap<&str, &str> = BTreeMap::new();
        let mut last: BTreeMap<&str, FencingToken> = BTreeMap::new();
        let log = self.log.borrow();
        for (at, id, node, event) in log.iter() {
            match event {
                Event::Started { token } => {
                    if let Some(other) = alive.insert(id, node) {
                        panic!("{at:?}: entity {id} started on {node} while alive on {other}");
                    }
                    if let Some(before) = last.insert(id, *token) {
                        assert!(
                            *token >= before,
                            "entity {id}: token {token} after {before}"
                        );
                    }
                }
                Event::Stopped => {
                    let was = alive.remove(id.as_str());
                    assert_eq!(was, Some(node.as_str()), "{at:?}: {id} stopped on {node}");
                }
            }
        }
        assert_eq!(*self.violations.borrow(), Vec::<String>::new());
    }
}

/// The node holding shard `shard` in the store.
fn holder(store: &InMemoryStore, shard: &str) -> Option<String> {
    store.holder(&format!("{GROUP}.{shard}"))
}

/// Waits until every shard is held, by `nodes` nodes.
async fn settled(store: &InMemoryStore, nodes: usize) {
    until(Duration::from_secs(30), "the group settles", || {
        let holders: Vec<Option<String>> =
            (0..SHARDS).map(|i| holder(store, &i.to_string())).collect();
        let mut distinct: Vec<&String> = holders.iter().flatten().collect();
        distinct.sort();
        distinct.dedup();
        holders.iter().all(Option::is_some) && distinct.len() == nodes
    })
    .await;
}

/// The shard entity `id` belongs to.
fn shard_of(entities: &Entities<Counter>, id: &str) -> String {
    let directory = entities.directory();
    directory.shards()[directory.shard_of(id).unwrap()].clone()
}

/// Entity ids, `count` of them, spread over the shards.
fn ids(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("customer-{i}")).collect()
}

#[test]
fn an_entity_starts_on_its_first_message_and_keeps_its_state() {
    run_paused(async {
        let test = Test::new();
        let (node, entities) = test.node("node-1", None);
        settled(&test.store, 1).await;
        assert!(
            test.running().is_empty(),
            "no entity before its first message"
        );
        for expected in 1..=3 {
            assert_eq!(entities.send("a", Increment).await.unwrap(), expected);
        }
        assert_eq!(entities.send("b", Increment).await.unwrap(), 1);
        assert_eq!(entities.send("a", Increment).await.unwrap(), 4);
        assert_eq!((test.starts("a"), test.starts("b")), (1, 1));
        // Each runs under its shard's tenure: the token of the shard it maps to.
        let running = node.send(GetShards).await.unwrap();
        for id in ["a", "b"] {
            let shard = &entities.locate(id).unwrap().shard;
            let token = running.iter().find(|s| &s.shard == shard).unwrap();
            let started = test
                .log
                .borrow()
                .iter()
                .find(|e| e.1 == id)
                .unwrap()
                .3
                .clone();
            let expected = Event::Started {
                token: token.fencing_token,
            };
            assert_eq!(started, expected, "{id}");
        }
        // A clone is the same handle, usable from any thread.
        let clone = entities.clone();
        assert_eq!(clone.send("a", Increment).await.unwrap(), 5);
        // A shard function out of range is refused, typed.
        let broken = entities
            .clone()
            .with_shard_function(|_: &str, shards: usize| shards);
        let error = broken.send("a", Increment).await.unwrap_err();
        assert!(
            matches!(&error, EntityError::Locate { entity, source: LocateError::ShardOutOfRange { .. } } if entity == "a"),
            "{error:?}"
        );
        // Shutting the node down stops every entity before it answers.
        assert!(node.send(Shutdown).await.unwrap().unwrap());
        assert!(test.running().is_empty(), "{:?}", test.running());
        let error = entities.send("a", Increment).await.unwrap_err();
        assert!(
            matches!(
                error,
                EntityError::Moving { .. } | EntityError::NotHere { .. }
            ),
            "{error:?}"
        );
        test.assert_one_at_a_time();
    });
}

#[test]
fn a_message_for_an_entity_whose_shard_runs_elsewhere_is_not_here() {
    run_paused(async {
        let test = Test::new();
        let (_one, on_one) = test.node("node-1", None);
        let (_two, on_two) = test.node("node-2", None);
        settled(&test.store, 2).await;
        let mut checked = 0;
        for id in ids(16) {
            let location = on_one.locate(&id).unwrap();
            let (here, there) = match holder(&test.store, &location.shard).as_deref() {
                Some("node-1") => (&on_one, &on_two),
                Some("node-2") => (&on_two, &on_one),
                other => panic!("{id}: shard {} held by {other:?}", location.shard),
            };
            let holder = holder(&test.store, &location.shard).unwrap();
            let error = there.send(&id, Increment).await.unwrap_err();
            let token = test.store.record(&format!("{GROUP}.{}", location.shard));
            assert_eq!(
                error,
                EntityError::NotHere {
                    entity: id.clone(),
                    shard: location.shard.clone(),
                    holder: holder.clone(),
                    token: token.map(|r| r.token),
                    address: Some(address(&holder)),
                }
            );
            assert!(error.to_string().contains("not here"), "{error}");
            assert_eq!(here.send(&id, Increment).await.unwrap(), 1);
            assert_eq!(
                test.running().get(&id),
                Some(&holder),
                "it runs on the holder"
            );
            checked += 1;
        }
        assert_eq!(checked, 16);
        assert_eq!(
            test.log.borrow().len(),
            16,
            "one actor per entity, none elsewhere"
        );
        test.assert_one_at_a_time();
    });
}

/// A node joins: the shards handed over to it stop their entities on the old holder (the host
/// stops every entity before the lease is released, waiting for the ones held busy), and the new
/// holder starts them afresh on their next message, under a higher token.
#[test]
fn a_handed_over_shard_stops_its_entities_before_the_new_holder_starts_them() {
    run_paused(async {
        let test = Test::new();
        let (_one, on_one) = test.node("node-1", None);
        settled(&test.store, 1).await;
        let ids = ids(32);
        for id in &ids {
            assert_eq!(on_one.send(id, Increment).await.unwrap(), 1);
            // Busy for a while: a handover must wait until it has stopped.
            on_one.send(id, Hold(Duration::from_secs(3))).await.unwrap();
        }
        let (_two, on_two) = test.node("node-2", None);
        settled(&test.store, 2).await;
        // No wait for the old actors to stop: the shard's lease was released only after they did.
        // The moved entities first (node-1's are still busy holding).
        let (mut moved, mut kept) = (Vec::new(), Vec::new());
        for id in &ids {
            let shard = on_one.locate(id).unwrap().shard;
            match holder(&test.store, &shard).as_deref() {
                Some("node-2") => moved.push(id),
                _ => kept.push(id),
            }
        }
        assert!(!moved.is_empty() && !kept.is_empty(), "{moved:?} moved");
        for id in &moved {
            // Started afresh on node-2; node-1 refuses it.
            assert_eq!(on_two.send(id, Increment).await.unwrap(), 1, "{id}");
            let error = on_one.send(id, Increment).await.unwrap_err();
            assert!(matches!(error, EntityError::NotHere { .. }), "{error:?}");
        }
        for id in &kept {
            assert_eq!(
                on_one.send(id, Increment).await.unwrap(),
                2,
                "{id} kept its state"
            );
        }
        test.assert_one_at_a_time();
    });
}

/// A node freezes (its store calls hang): its entities stop at its own deadline, before the
/// other node can claim their shards and start them there, and none handles a message after it.
#[test]
fn a_lost_tenure_stops_its_entities_before_another_node_starts_them() {
    run_paused(async {
        let test = Test::new();
        let (_one, on_one) = test.node("node-1", None);
        let (_two, on_two) = test.node("node-2", None);
        settled(&test.store, 2).await;
        let ids = ids(16);
        let on_two_ids: Vec<&String> = (ids.iter())
            .filter(|id| {
                let shard = on_one.locate(id).unwrap().shard;
                holder(&test.store, &shard).as_deref() == Some("node-2")
            })
            .collect();
        assert!(!on_two_ids.is_empty());
        for id in &on_two_ids {
            assert_eq!(on_two.send(id, Increment).await.unwrap(), 1);
        }
        test.store.pause("node-2");
        let frozen = Instant::now();
        // Keep sending to node-2's entities until they stop there.
        let mut refused = Vec::new();
        while test.running().values().any(|n| n == "node-2") {
            for id in &on_two_ids {
                if let Err(error) = on_two.send(id, Increment).await {
                    refused.push(error);
                }
            }
            sleep(Duration::from_millis(50)).await;
            assert!(
                Instant::now() - frozen < TTL * 2,
                "node-2's entities stopped"
            );
        }
        let stopped = Instant::now() - frozen;
        assert!(stopped <= TTL + Duration::from_millis(100), "{stopped:?}");
        assert!(
            refused.iter().all(|e| matches!(
                e,
                EntityError::TenureEnded { .. } | EntityError::Moving { .. }
            )),
            "{refused:?}"
        );
        // node-1 takes the shards over and starts the entities there, afresh.
        settled(&test.store, 1).await;
        for id in &on_two_ids {
            assert_eq!(on_one.send(id, Increment).await.unwrap(), 1);
        }
        test.assert_one_at_a_time();
    });
}

/// A message queued for an entity while its tenure was alive, and reached only after the tenure
/// ended (the entity was held on `ctx.wait` meanwhile), is dropped unhandled: its sender learns
/// that the tenure ended. (Through the actix mailbox, it would have been handled after the end.)
#[test]
fn a_message_queued_before_the_tenure_ended_is_never_handled_after_it() {
    run_paused(async {
        let test = Test::new();
        let (_node, entities) = test.node("node-1", None);
        settled(&test.store, 1).await;
        assert_eq!(entities.send("a", Increment).await.unwrap(), 1);
        entities.send("a", Hold(TTL * 3)).await.unwrap();
        let queued = {
            let entities = entities.clone();
            actix_rt::spawn(async move { entities.send("a", Increment).await })
        };
        sleep(Duration::from_millis(10)).await;
        test.store.pause("node-1");
        let answer = queued.await.unwrap();
        assert_eq!(
            answer,
            Err(EntityError::TenureEnded {
                entity: "a".into(),
                shard: shard_of(&entities, "a"),
            })
        );
        assert!(test.running().is_empty(), "the entity stopped");
        test.assert_one_at_a_time();
    });
}

#[test]
fn an_idle_entity_stops_and_its_next_message_starts_it_again() {
    run_paused(async {
        let test = Test::new();
        let idle = Duration::from_secs(10);
        let (_node, entities) = test.node("node-1", Some(idle));
        settled(&test.store, 1).await;
        assert_eq!(entities.send("a", Increment).await.unwrap(), 1);
        sleep(idle / 2).await;
        assert_eq!(entities.send("a", Increment).await.unwrap(), 2);
        sleep(idle * 3 / 4).await;
        assert_eq!(test.starts("a"), 1, "a message keeps it alive");
        // An answer awaited longer than the idle timeout keeps it alive too.
        assert_eq!(entities.send("a", Slow(idle * 2)).await.unwrap(), 2);
        assert!(test.running().contains_key("a"));
        let quiet = Instant::now();
        until(idle * 2, "the idle entity stops", || {
            test.running().is_empty()
        })
        .await;
        let stopped = Instant::now() - quiet;
        assert!(stopped >= idle && stopped <= idle + idle / 2, "{stopped:?}");
        assert_eq!(
            entities.send("a", Increment).await.unwrap(),
            1,
            "started again"
        );
        assert_eq!(test.starts("a"), 2);
        test.assert_one_at_a_time();
    });
}

#[test]
fn an_entity_that_stops_itself_is_started_again_by_its_next_message() {
    run_paused(async {
        let test = Test::new();
        let (_node, entities) = test.node("node-1", None);
        settled(&test.store, 1).await;
        assert_eq!(entities.send("a", Increment).await.unwrap(), 1);
        entities.send("a", StopSelf).await.unwrap();
        // The next message waits for the old actor to be gone, then starts a new one.
        assert_eq!(entities.send("a", Increment).await.unwrap(), 1);
        assert_eq!(test.starts("a"), 2);
        test.assert_one_at_a_time();
    });
}
