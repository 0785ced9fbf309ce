//! Sharded workers on the embedded in-memory backend: 24 shards of work spread over the live
//! nodes, each running exactly once, moved when nodes come and go.
//!
//! Every simulated node runs a `ShardedWorkers` for the group `ingest` (a lease per shard, a member
//! lease per node, placement computed alike by every node from the group watch). The demo
//!
//! 1. starts three nodes: 8 shards each;
//! 2. adds a fourth: it takes exactly its quota (6), handed over by the others a few at a time;
//! 3. shuts node-2 down gracefully: exactly its shards move, within milliseconds;
//! 4. freezes node-3 (its calls to the store hang, as a paused process's): its workers stop at
//!    its own deadline and its shards move once its leases have expired (the TTL);
//! 5. rolls the fleet: each old node is replaced by a new one, one at a time;
//!
//! and prints after each step which node runs which shard, with how many shards moved.
//!
//! The in-memory store lives in this process: the nodes here share it, two processes never do.
//!
//! ```text
//! cargo run --example sharded_workers
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    shard_lease_name, InMemoryLease, InMemoryStore, LeaseSettings, ShardInfo, ShardedWorkers,
    Shutdown,
};
use tokio::time::{sleep, Instant};

const GROUP: &str = "ingest";
const SHARDS: usize = 24;
const TTL: Duration = Duration::from_secs(2);

/// A shard's worker: it would consume its partition, writing with its fencing token.
struct Partition;

impl Actor for Partition {
    type Context = Context<Self>;
}

type Node = Addr<ShardedWorkers<Partition, InMemoryLease>>;

fn start(store: &InMemoryStore, node: &str) -> Node {
    let (store, owner) = (store.clone(), node.to_owned());
    ShardedWorkers::with_count(
        GROUP,
        SHARDS,
        move |name: &str| {
            let settings = LeaseSettings::builder(name, owner.as_str())
                .ttl(TTL)
                .renewal_interval(TTL / 4)
                .build()
                .expect("valid settings");
            store.lease(settings)
        },
        |_: &ShardInfo, _: &mut Context<Partition>| Partition,
    )
    .expect("a valid group")
    .start()
}

/// Who holds each shard in the store, by shard number.
fn holders(store: &InMemoryStore) -> BTreeMap<usize, String> {
    (0..SHARDS)
        .filter_map(|i| Some((i, store.holder(&shard_lease_name(GROUP, &i.to_string()))?)))
        .collect()
}

/// Waits until every shard is held and each live node holds `⌊24/n⌋` or `⌈24/n⌉`, then prints
/// the table and how many shards moved since `before`.
async fn settle(
    store: &InMemoryStore,
    step: &str,
    live: &[&str],
    before: &BTreeMap<usize, String>,
) -> BTreeMap<usize, String> {
    let began = Instant::now();
    let (low, high) = (SHARDS / live.len(), SHARDS.div_ceil(live.len()));
    let deadline = began + TTL * 10;
    let now = loop {
        let now = holders(store);
        let balanced = now.len() == SHARDS
            && live.iter().all(|node| {
                let n = now.values().filter(|h| h == node).count();
                (low..=high).contains(&n)
            });
        if balanced {
            break now;
        }
        assert!(Instant::now() < deadline, "{step}: did not settle");
        sleep(Duration::from_millis(2)).await;
    };
    let moved = now.iter().filter(|(s, h)| before.get(s) != Some(h)).count();
    println!();
    println!("{step}");
    println!(
        "  settled in {} ms; {moved} shard(s) moved",
        began.elapsed().as_millis()
    );
    for node in live {
        let mine: Vec<String> = now
            .iter()
            .filter(|(_, h)| h == node)
            .map(|(s, _)| format!("{s:>2}"))
            .collect();
        println!("  {node:<7} {:>2} | {}", mine.len(), mine.join(" "));
    }
    now
}

#[actix::main]
async fn main() {
    println!(
        "{SHARDS} shards of group {GROUP:?} on an in-memory store shared by simulated nodes \
         (TTL {TTL:?}); a table after each step shows which node runs which shard."
    );
    let store = InMemoryStore::new();
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    for name in ["node-1", "node-2", "node-3"] {
        nodes.insert(name.into(), start(&store, name));
    }
    let table = settle(
        &store,
        "1. three nodes start",
        &["node-1", "node-2", "node-3"],
        &BTreeMap::new(),
    )
    .await;

    nodes.insert("node-4".into(), start(&store, "node-4"));
    let table = settle(
        &store,
        "2. node-4 joins: it takes exactly its quota",
        &["node-1", "node-2", "node-3", "node-4"],
        &table,
    )
    .await;

    let leaving = nodes.remove("node-2").expect("node-2");
    let released = leaving.send(Shutdown).await.expect("node-2 answers");
    println!(
        "\n(node-2 shut down: released everything: {})",
        released.is_ok_and(|r| r)
    );
    let table = settle(
        &store,
        "3. node-2 shut down: exactly its shards moved",
        &["node-1", "node-3", "node-4"],
        &table,
    )
    .await;

    store.pause("node-3");
    println!(
        "\n(node-3 frozen: its calls to the store hang; the others wait for its leases to expire)"
    );
    let table = settle(
        &store,
        "4. node-3 froze: its shards moved after its TTL",
        &["node-1", "node-4"],
        &table,
    )
    .await;
    // The frozen node is gone for good (a real one would be killed and replaced).
    drop(nodes.remove("node-3"));
    store.heal("node-3");

    // A rolling update: a new node comes up, then an old one shuts down, one at a time.
    let mut live: Vec<String> = vec!["node-1".into(), "node-4".into()];
    let mut table = table;
    for (old, new) in [("node-1", "node-5"), ("node-4", "node-6")] {
        nodes.insert(new.into(), start(&store, new));
        live.push(new.into());
        let names: Vec<&str> = live.iter().map(String::as_str).collect();
        table = settle(
            &store,
            &format!("5. rolling update: {new} up"),
            &names,
            &table,
        )
        .await;
        let released = nodes.remove(old).expect("old node").send(Shutdown).await;
        assert!(
            matches!(released, Ok(Ok(true))),
            "{old} released everything"
        );
        live.retain(|n| n != old);
        let names: Vec<&str> = live.iter().map(String::as_str).collect();
        table = settle(
            &store,
            &format!("5. rolling update: {old} shut down"),
            &names,
            &table,
        )
        .await;
    }

    println!("\nThe demo ends: the remaining nodes shut down, releasing every shard.");
    for (name, node) in nodes {
        let released = node.send(Shutdown).await;
        println!(
            "  {name}: released everything: {}",
            matches!(released, Ok(Ok(true)))
        );
    }
}
