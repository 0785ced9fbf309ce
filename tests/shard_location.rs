//! A request finds its shard (issue 38, items 1 and 2), in memory under a paused clock: every
//! node answers the same holder, token and address for every shard from its own group watch,
//! `here` only on the holder, a shard that moves is answered with its new holder, a locate sends
//! nothing to the store, an entity maps to the same shard everywhere, and bad input is refused
//! with typed errors.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::convert::Infallible;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    shard_for, AddressError, GetShardDirectory, GetShards, InMemoryLease, InMemoryStore, Lease,
    LeaseSettings, LocateError, LocateShard, ShardDirectory, ShardInfo, ShardLocation,
    ShardedError, ShardedWorkers, Shutdown,
};
use common::run_paused;

const GROUP: &str = "orders";
const SHARDS: usize = 12;
const TTL: Duration = Duration::from_secs(6);

struct Worker;

impl Actor for Worker {
    type Context = Context<Self>;
}

type Node = Addr<ShardedWorkers<Worker, InMemoryLease>>;

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

/// A node of the group, not started, advertising `http://<node>.example:8080`.
fn build(store: &InMemoryStore, node: &str) -> ShardedWorkers<Worker, InMemoryLease> {
    let (leases, owner) = (store.clone(), node.to_owned());
    let store = store.clone();
    ShardedWorkers::with_count(
        GROUP,
        SHARDS,
        move |name: &str| leases.lease(settings(name, &owner)),
        |_: &ShardInfo, _: &mut Context<Worker>| Worker,
    )
    .unwrap()
    .advertise(address(node), move |s| Ok::<_, Infallible>(store.lease(s)))
    .unwrap()
}

fn start(store: &InMemoryStore, node: &str) -> (Node, ShardDirectory) {
    let workers = build(store, node);
    let directory = workers.directory();
    (workers.start(), directory)
}

/// Waits until each of `nodes` runs `each` shards.
async fn settle(nodes: &[&Node], each: usize) {
    for _ in 0..600 {
        let mut all = true;
        for node in nodes {
            all &= node.send(GetShards).await.unwrap().len() == each;
        }
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the nodes did not settle on {each} shards each");
}

/// Every directory's answer for every shard: the same holder, token and address on every node,
/// the holder's address, the store's holder and token, `here` on the holder alone. Answers the
/// holders.
fn assert_agree(store: &InMemoryStore, directories: &[&ShardDirectory]) -> Vec<String> {
    let mut holders = Vec::new();
    for index in 0..SHARDS {
        let shard = index.to_string();
        let answers: Vec<ShardLocation> = directories
            .iter()
            .map(|d| d.locate(&shard).unwrap())
            .collect();
        let first = &answers[0];
        let holder = first.holder.clone().expect("every shard has a holder");
        let record = store.record(&format!("{GROUP}.{shard}")).unwrap();
        assert_eq!(Some(&holder), record.holder.as_ref(), "shard {shard}");
        assert_eq!(first.token, Some(record.token), "shard {shard}");
        assert_eq!(first.address, Some(address(&holder)), "shard {shard}");
        for (directory, answer) in directories.iter().zip(&answers) {
            assert_eq!(answer.shard, shard);
            assert_eq!(answer.index, index);
            assert_eq!(
                (&answer.holder, answer.token, &answer.address),
                (&first.holder, first.token, &first.address),
                "shard {shard}: node {} answers otherwise",
                directory.node()
            );
            assert_eq!(
                answer.here,
                directory.node() == holder,
                "shard {shard} on node {}",
                directory.node()
            );
        }
        holders.push(holder);
    }
    holders
}

/// Three nodes: every node answers the same holder, token and address for every shard, `here`
/// only on the holder; the message answers as the directory does; a shard that moves (a node
/// shuts down, another joins) is answered with its new holder and a higher token.
#[test]
fn every_node_answers_the_same_location_and_a_moved_shard_its_new_holder() {
    run_paused(async {
        let store = InMemoryStore::new();
        let (a, da) = start(&store, "a");
        let (b, db) = start(&store, "b");
        let (c, dc) = start(&store, "c");
        settle(&[&a, &b, &c], 4).await;
        let before = assert_agree(&store, &[&da, &db, &dc]);
        for (index, holder) in before.iter().enumerate() {
            let answer = b.send(LocateShard::new(index.to_string())).await.unwrap();
            assert_eq!(answer.unwrap(), db.locate(&index.to_string()).unwrap());
            assert_eq!(holder, &da.locate_index(index).unwrap().holder.unwrap());
        }
        let tokens: Vec<_> = (0..SHARDS)
            .map(|i| da.locate_index(i).unwrap().token)
            .collect();

        // c leaves: its shards, and only those, are answered with their new holders.
        assert!(c.send(Shutdown).await.unwrap().unwrap());
        settle(&[&a, &b], 6).await;
        let after = assert_agree(&store, &[&da, &db]);
        for index in 0..SHARDS {
            if before[index] == "c" {
                assert_ne!(after[index], "c", "shard {index} moved");
                assert!(da.locate_index(index).unwrap().token > tokens[index]);
            } else {
                assert_eq!(after[index], before[index], "shard {index} stayed");
            }
            // c's directory outlives its node: it holds nothing, and still sees the group.
            let from_c = dc.locate_index(index).unwrap();
            assert!(!from_c.here);
            assert_eq!(from_c.holder.as_deref(), Some(after[index].as_str()));
        }

        // d joins: it takes its quota, and every node answers it for those shards.
        let (d, dd) = start(&store, "d");
        settle(&[&a, &b, &d], 4).await;
        let joined = assert_agree(&store, &[&da, &db, &dd, &dc]);
        assert_eq!(joined.iter().filter(|h| *h == "d").count(), 4);
        for node in [a, b, d] {
            assert!(node.send(Shutdown).await.unwrap().unwrap());
        }
    });
}

/// A locate is a read of the node's group watch: no call reaches the store, whether through the
/// directory or the message.
#[test]
fn a_locate_sends_nothing_to_the_store() {
    run_paused(async {
        let store = InMemoryStore::new();
        let (a, da) = start(&store, "a");
        let (b, _db) = start(&store, "b");
        settle(&[&a, &b], 6).await;
        let calls = store.stats().calls;
        for round in 0..100 {
            for index in 0..SHARDS {
                let location = da.locate_index(index).unwrap();
                assert!(location.holder.is_some());
                if round == 0 {
                    let answer = a.send(LocateShard::new(index.to_string())).await;
                    assert_eq!(answer.unwrap().unwrap(), location);
                }
            }
            da.locate_entity(&format!("customer-{round}")).unwrap();
        }
        assert_eq!(
            store.stats().calls - calls,
            0,
            "1,312 locates sent calls to the store"
        );
        for node in [a, b] {
            assert!(node.send(Shutdown).await.unwrap().unwrap());
        }
    });
}

/// An entity maps to the same shard on every node (`shard_for`, pinned), and to the user's own
/// function's shard when one is given; the location is that shard's.
#[test]
fn an_entity_finds_the_same_shard_on_every_node() {
    run_paused(async {
        let store = InMemoryStore::new();
        let (a, da) = start(&store, "a");
        let (b, db) = start(&store, "b");
        settle(&[&a, &b], 6).await;
        for i in 0..200 {
            let entity = format!("customer-{i}");
            let index = shard_for(&entity, SHARDS);
            assert_eq!(da.shard_of(&entity), Ok(index));
            assert_eq!(db.shard_of(&entity), Ok(index));
            let (la, lb) = (
                da.locate_entity(&entity).unwrap(),
                db.locate_entity(&entity).unwrap(),
            );
            assert_eq!(la.shard, index.to_string());
            assert_eq!((&la.holder, la.token), (&lb.holder, lb.token));
            assert!(la.here != lb.here);
        }
        // The user's own mapping: tenants by a table, the same on every node.
        let by_tenant = |entity: &str, _: usize| match entity.split_once('/') {
            Some(("acme", _)) => 3,
            _ => 0,
        };
        let da = da.with_shard_function(by_tenant);
        assert_eq!(da.locate_entity("acme/order-1").unwrap().shard, "3");
        assert_eq!(da.locate_entity("other/order-1").unwrap().shard, "0");
        // One that answers out of range is refused, not trusted.
        let broken = db
            .clone()
            .with_shard_function(|_: &str, shards: usize| shards);
        assert_eq!(
            broken.locate_entity("x"),
            Err(LocateError::ShardOutOfRange {
                group: GROUP.into(),
                entity: "x".into(),
                index: SHARDS,
                shards: SHARDS,
            })
        );
        // The directory from the message is the same directory.
        let from_message = b.send(GetShardDirectory).await.unwrap();
        assert_eq!(from_message.locate("5"), db.locate("5"));
        for node in [a, b] {
            assert!(node.send(Shutdown).await.unwrap().unwrap());
        }
    });
}

/// A node that advertises nothing is answered without an address; unknown shards and indices
/// are typed errors.
#[test]
fn no_address_and_unknown_shards() {
    run_paused(async {
        let store = InMemoryStore::new();
        let leases = store.clone();
        let quiet = ShardedWorkers::with_count(
            GROUP,
            SHARDS,
            move |name: &str| leases.lease(settings(name, "quiet")),
            |_: &ShardInfo, _: &mut Context<Worker>| Worker,
        )
        .unwrap();
        let directory = quiet.directory();
        assert_eq!(directory.group(), GROUP);
        assert_eq!(directory.node(), "quiet");
        assert_eq!(directory.shards().len(), SHARDS);
        let quiet = quiet.start();
        settle(&[&quiet], SHARDS).await;
        let location = directory.locate("7").unwrap();
        assert_eq!(
            (location.holder.as_deref(), location.here, location.address),
            (Some("quiet"), true, None)
        );
        assert_eq!(
            directory.locate("12"),
            Err(LocateError::UnknownShard {
                group: GROUP.into(),
                shard: "12".into()
            })
        );
        assert_eq!(
            quiet.send(LocateShard::new("member.quiet")).await.unwrap(),
            Err(LocateError::UnknownShard {
                group: GROUP.into(),
                shard: "member.quiet".into()
            })
        );
        assert_eq!(
            directory.locate_index(SHARDS),
            Err(LocateError::NoIndex {
                group: GROUP.into(),
                index: SHARDS,
                shards: SHARDS
            })
        );
        assert!(quiet.send(Shutdown).await.unwrap().unwrap());
        // Stopped: it holds nothing, and the record it released names nobody.
        let location = directory.locate("7").unwrap();
        assert!(!location.here);
        assert_eq!(location.holder, None);
        assert_eq!(location.token, None);
    });
}

/// An advertised address is checked once, at construction: an absolute `http` or `https` URL
/// with a host and an optional port, nothing else; the member lease built again must be the
/// member lease.
#[test]
fn an_advertised_address_is_an_origin_and_nothing_else() {
    run_paused(async {
        let store = InMemoryStore::new();
        let workers = || {
            let leases = store.clone();
            ShardedWorkers::with_count(
                GROUP,
                SHARDS,
                move |name: &str| leases.lease(settings(name, "a")),
                |_: &ShardInfo, _: &mut Context<Worker>| Worker,
            )
            .unwrap()
        };
        let refused = |address: &str| {
            let leases = store.clone();
            match workers().advertise(address, move |s| Ok::<_, Infallible>(leases.lease(s))) {
                Err(ShardedError::InvalidAddress { address: a, source }) => {
                    assert_eq!(a, address);
                    source
                }
                Err(other) => panic!("{address:?}: {other}"),
                Ok(_) => panic!("{address:?} was accepted"),
            }
        };
        assert!(matches!(
            refused("10.0.0.1:8080"),
            AddressError::NotAbsolute
        ));
        assert!(matches!(
            refused("not a url"),
            AddressError::Character { .. }
        ));
        assert!(matches!(refused("ftp://a:21"), AddressError::Scheme { .. }));
        assert!(matches!(
            refused("http://a:8080/api"),
            AddressError::Path { .. }
        ));
        assert!(matches!(refused("http://a:8080?x=1"), AddressError::Query));
        assert!(matches!(refused("http://a#top"), AddressError::Fragment));
        assert!(matches!(
            refused("http://user:pw@a"),
            AddressError::UserInfo
        ));
        assert!(matches!(
            refused("http://a:99999"),
            AddressError::Port { .. }
        ));
        assert!(matches!(refused("http://:80"), AddressError::NoHost));
        assert!(matches!(
            refused("http://a:80\n"),
            AddressError::TrailingNewline
        ));
        let error = refused("http://a:8080/api");
        assert_eq!(
            error.to_string(),
            r#"the address has the path "/api": only a host and a port, redirects keep the request's own path"#
        );
        for fine in [
            "http://a:8080",
            "https://node-1.example.com",
            "http://[::1]:80/",
        ] {
            let leases = store.clone();
            let built = workers().advertise(fine, move |s| Ok::<_, Infallible>(leases.lease(s)));
            assert!(built.is_ok(), "{fine:?} was refused");
        }
        // The member lease built again must be the member lease, and its builder may fail.
        let leases = store.clone();
        let wrong = workers().advertise("http://a:1", move |s: LeaseSettings| {
            Ok::<_, Infallible>(leases.lease(s.to_builder().name("orders.other").build().unwrap()))
        });
        assert!(matches!(wrong, Err(ShardedError::WrongLease { .. })));
        let failing = workers().advertise("http://a:1", |_| Err::<InMemoryLease, _>("no session"));
        match failing {
            Err(ShardedError::MemberLease { name, source }) => {
                assert_eq!(name, "orders.member.a");
                assert_eq!(source.to_string(), "no session");
            }
            other => panic!("{:?}", other.err()),
        }
        // The member lease carries the address to the store.
        let leases = store.clone();
        let advertised = workers()
            .advertise("http://a:1", move |s| Ok::<_, Infallible>(leases.lease(s)))
            .unwrap()
            .start();
        settle(&[&advertised], SHARDS).await;
        let watcher = store.lease(settings("orders.member.watcher", "watcher"));
        let watch = watcher.watch_group("orders.member.").unwrap();
        let snapshot = watch.snapshot();
        let record = snapshot.get("orders.member.a").unwrap();
        assert_eq!(
            record.metadata.as_deref(),
            Some(r#"{"address":"http://a:1"}"#)
        );
        assert!(advertised.send(Shutdown).await.unwrap().unwrap());
    });
}
