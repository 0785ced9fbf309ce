//! A simulated fleet (issue 37): `ShardedWorkers` nodes of one group on one [`InMemoryStore`], in
//! one process, under whatever clock the caller runs (the paused clock in `tests/simulation.rs`
//! and `benches/simulation.rs`, which share this file by `#[path]`). Every worker's start and stop
//! is counted, and a start while another node runs the shard is an overlap.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    InMemoryLease, InMemoryStore, LeaseSettings, ShardInfo, ShardedWorkers, Shutdown,
};
use tokio::time::{sleep, Instant};

pub const GROUP: &str = "sim";

/// Which node runs each shard, by the workers' own starts and stops.
#[derive(Default)]
pub struct Running {
    pub by_shard: HashMap<String, String>,
    pub starts: u64,
    pub stops: u64,
    /// Starts of a shard's worker while another node's worker of it ran.
    pub overlaps: u64,
}

pub type Log = Rc<RefCell<Running>>;

pub struct Worker {
    shard: String,
    node: String,
    log: Log,
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        let mut log = self.log.borrow_mut();
        log.stops += 1;
        if log.by_shard.get(&self.shard) == Some(&self.node) {
            log.by_shard.remove(&self.shard);
        }
    }
}

pub type Node = Addr<ShardedWorkers<Worker, InMemoryLease>>;

/// The fleet: its store, its live nodes, and the ones it crashed (kept, frozen).
pub struct Fleet {
    pub store: InMemoryStore,
    pub shards: usize,
    pub ttl: Duration,
    pub renewal: Duration,
    pub log: Log,
    pub nodes: BTreeMap<String, Node>,
    pub crashed: Vec<(String, Node)>,
    /// Real time spent in [`settle`](Self::settle)'s checks (the observer's cost, not the
    /// fleet's).
    pub checking: Cell<Duration>,
    /// The shards' lease names, by shard number.
    names: Vec<String>,
}

/// Node `i`'s name: `node-000`, `node-001`, …
pub fn node_name(i: usize) -> String {
    format!("node-{i:03}")
}

impl Fleet {
    pub fn new(shards: usize, ttl: Duration, renewal: Duration) -> Self {
        Self {
            store: InMemoryStore::new(),
            shards,
            ttl,
            renewal,
            log: Log::default(),
            nodes: BTreeMap::new(),
            crashed: Vec::new(),
            checking: Cell::default(),
            names: (0..shards).map(|i| format!("{GROUP}.{i}")).collect(),
        }
    }

    /// Starts node `name` (shard leases bound to its member lease: the default).
    pub fn start(&mut self, name: &str) {
        let (store, owner, log) = (self.store.clone(), name.to_owned(), self.log.clone());
        let (ttl, renewal) = (self.ttl, self.renewal);
        let node = ShardedWorkers::with_count(
            GROUP,
            self.shards,
            move |lease: &str| {
                store.lease(
                    LeaseSettings::builder(lease, &owner)
                        .ttl(ttl)
                        .renewal_interval(renewal)
                        .build()
                        .expect("lease settings"),
                )
            },
            move |shard: &ShardInfo, _: &mut Context<Worker>| {
                assert!(
                    shard.guard.check_alive(),
                    "a worker starts under a live tenure"
                );
                let mut running = log.borrow_mut();
                running.starts += 1;
                if let Some(other) = running.by_shard.get(&shard.shard) {
                    if *other != shard.owner {
                        running.overlaps += 1;
                    }
                }
                running
                    .by_shard
                    .insert(shard.shard.clone(), shard.owner.clone());
                Worker {
                    shard: shard.shard.clone(),
                    node: shard.owner.clone(),
                    log: log.clone(),
                }
            },
        )
        .expect("sharded workers")
        .start();
        self.nodes.insert(name.to_owned(), node);
    }

    /// Starts nodes `node-000` to `node-<n-1>`, one every `spread / n` of the fleet's clock (with
    /// a spread of one renewal interval their member renewals are spread over the interval, as
    /// a fleet's are: started at one instant, every renewal of the fleet would fall on the same
    /// instant of the paused clock, and the nodes would see them as one change). A zero spread
    /// builds every node before any of them runs.
    pub async fn start_all(&mut self, n: usize, spread: Duration) {
        for i in 0..n {
            if i > 0 && !spread.is_zero() {
                sleep(spread / n as u32).await;
            }
            self.start(&node_name(i));
        }
    }

    /// Who holds each shard in the store, by shard number.
    pub fn holders(&self) -> Vec<Option<String>> {
        self.names.iter().map(|n| self.store.holder(n)).collect()
    }

    /// How many shards each live node holds (every live node listed, 0 included).
    pub fn counts(&self, holders: &[Option<String>]) -> BTreeMap<String, usize> {
        let mut counts: BTreeMap<String, usize> =
            self.nodes.keys().map(|n| (n.clone(), 0)).collect();
        for holder in holders.iter().flatten() {
            *counts.entry(holder.clone()).or_insert(0) += 1;
        }
        counts
    }

    /// `Ok` when the fleet is settled: every shard held by a live node in the store, its worker
    /// running there and nowhere else, and every live node holding ⌊S/N⌋ or ⌈S/N⌉.
    pub fn settled(&self) -> Result<Vec<Option<String>>, String> {
        let holders = self.holders();
        let unheld = holders.iter().filter(|h| h.is_none()).count();
        if unheld > 0 {
            return Err(format!("{unheld} shards unheld"));
        }
        let n = self.nodes.len();
        let (low, high) = (self.shards / n, self.shards.div_ceil(n));
        let counts = self.counts(&holders);
        if counts.len() != n {
            return Err(format!("held by nodes that are not live: {counts:?}"));
        }
        if let Some((node, c)) = counts.iter().find(|(_, &c)| c < low || c > high) {
            return Err(format!("{node} holds {c}, not {low}..={high}"));
        }
        let running = self.log.borrow();
        let off = (0..self.shards)
            .filter(|&i| running.by_shard.get(&i.to_string()) != holders[i].as_ref())
            .count();
        if off > 0 || running.by_shard.len() != self.shards {
            return Err(format!("{off} shards not running on their holder"));
        }
        Ok(holders)
    }

    /// Waits (polling every `poll` of the fleet's clock) until [`settled`](Self::settled);
    /// answers the holders then, and how long it took on that clock.
    pub async fn settle(
        &self,
        within: Duration,
        poll: Duration,
    ) -> (Vec<Option<String>>, Duration) {
        let start = Instant::now();
        loop {
            let checked = std::time::Instant::now();
            let settled = self.settled();
            self.checking.set(self.checking.get() + checked.elapsed());
            match settled {
                Ok(holders) => return (holders, start.elapsed()),
                Err(why) if start.elapsed() > within => {
                    panic!("not settled within {within:?}: {why}")
                }
                Err(_) => sleep(poll).await,
            }
        }
    }

    /// Shuts node `name` down (gracefully: its shards are handed over), and forgets it.
    pub async fn leave(&mut self, name: &str) {
        let node = self.nodes.remove(name).expect("a live node");
        node.send(Shutdown)
            .await
            .expect("the node answers")
            .expect("a clean shutdown");
    }

    /// Crashes node `name`: the store never answers it again (a frozen or dead process: no
    /// release, its member lease expires after the TTL); kept, no longer counted as live.
    pub fn crash(&mut self, name: &str) {
        let node = self.nodes.remove(name).expect("a live node");
        self.store.pause(name);
        self.crashed.push((name.to_owned(), node));
    }

    /// The writes the store has answered: acquires, renewals, releases.
    pub fn writes(&self) -> u64 {
        let s = self.store.stats();
        s.acquires + s.renewals + s.releases
    }
}

/// The shards whose holder differs between `before` and `after`.
pub fn moved(before: &[Option<String>], after: &[Option<String>]) -> Vec<usize> {
    (0..before.len())
        .filter(|&i| before[i] != after[i])
        .collect()
}

/// The shards `node` holds in `holders`.
pub fn held_by(holders: &[Option<String>], node: &str) -> Vec<usize> {
    (0..holders.len())
        .filter(|&i| holders[i].as_deref() == Some(node))
        .collect()
}
