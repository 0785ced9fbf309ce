//! A lease-gated shard coordinator on the embedded in-memory backend.
//!
//! Two nodes each start a `ShardCoordinator`; only the one holding the lease serves. Regions
//! register by address and shards go to the least-loaded region, fenced with the coordinator's
//! token. Then the active coordinator is cut off from the lease store: at its local deadline its
//! tenure ends, it rejects its pending allocations with `GateError::TenureEnded` and goes back to
//! competing; the standby coordinator takes over after the TTL, and allocations continue under a
//! higher fencing token. Finally the program drops its addresses of the coordinators: the active
//! one stops and releases its lease.
//!
//! ```text
//! cargo run --example sharding
//! ```

use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    AllocateShard, GateError, GateState, GetGateState, HostShard, InMemoryLease, InMemoryStore,
    LeaseSettings, RegisterRegion, ShardCoordinator,
};
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(3);

/// A shard region: hosts what it is told to; acknowledges after `ack_delay`.
struct Region {
    name: &'static str,
    ack_delay: Duration,
}

impl Actor for Region {
    type Context = Context<Self>;
}

impl Handler<HostShard> for Region {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: HostShard, _: &mut Self::Context) -> Self::Result {
        println!(
            "    {} hosts {} (fencing token {})",
            self.name, msg.shard, msg.fencing_token
        );
        let delay = self.ack_delay;
        Box::pin(async move { sleep(delay).await })
    }
}

type Coordinator = Addr<ShardCoordinator<InMemoryLease>>;

async fn active(coordinators: &[Coordinator]) -> Option<usize> {
    for (i, c) in coordinators.iter().enumerate() {
        if let Ok(GateState::Open(_)) = c.send(GetGateState).await {
            return Some(i);
        }
    }
    None
}

#[actix_rt::main]
async fn main() {
    if let Err(error) = demo().await {
        eprintln!("error: {}", chain(error.as_ref()));
        std::process::exit(1);
    }
}

/// An error's message followed by its causes' messages.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A gate's state, in words.
fn describe(state: &GateState) -> String {
    match state {
        GateState::Acquiring => "competing for the lease".to_owned(),
        GateState::Open(token) => format!("holding the lease (fencing token {token})"),
        GateState::Closed(error) => format!("stopped ({})", chain(error)),
    }
}

async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let store = InMemoryStore::new();
    let t0 = Instant::now();
    let lease = |owner: &str| {
        store.lease(
            LeaseSettings::builder("shard-coordinator", owner)
                .ttl(TTL)
                .build()
                .expect("valid settings"),
        )
    };
    let coordinators: Vec<Coordinator> = ["node-a", "node-b"]
        .iter()
        .map(|owner| ShardCoordinator::new(lease(owner)).start())
        .collect();
    let regions = [
        Region {
            name: "region-1",
            ack_delay: Duration::ZERO,
        }
        .start(),
        Region {
            name: "region-2",
            ack_delay: Duration::ZERO,
        }
        .start(),
        // A slow region: its allocations stay pending for a while.
        Region {
            name: "region-3",
            ack_delay: Duration::from_secs(10),
        }
        .start(),
    ];

    let first = loop {
        if let Some(i) = active(&coordinators).await {
            break i;
        }
        sleep(Duration::from_millis(10)).await;
    };
    println!(
        "{:>5.2}s coordinator on node-{} holds the lease",
        t0.elapsed().as_secs_f64(),
        ["a", "b"][first]
    );
    for region in &regions[..2] {
        coordinators[first]
            .send(RegisterRegion(region.clone().recipient()))
            .await??;
    }
    for shard in ["orders", "users", "payments", "search"] {
        let home = coordinators[first]
            .send(AllocateShard(shard.into()))
            .await??;
        println!(
            "{:>5.2}s allocated {shard} (token {})",
            t0.elapsed().as_secs_f64(),
            home.fencing_token
        );
    }

    // Only the slow region is left with room: new allocations wait for its acknowledgement.
    coordinators[first]
        .send(RegisterRegion(regions[2].clone().recipient()))
        .await??;
    let pending: Vec<_> = ["reports", "audit"]
        .iter()
        .map(|s| coordinators[first].send(AllocateShard((*s).into())))
        .collect();
    sleep(Duration::from_millis(100)).await;
    println!(
        "{:>5.2}s -- node-{} is cut off from the lease store, 2 allocations pending --",
        t0.elapsed().as_secs_f64(),
        ["a", "b"][first]
    );
    store.partition(["node-a", "node-b"][first]);
    for p in pending {
        match p.await {
            Ok(Err(GateError::TenureEnded(end))) => println!(
                "{:>5.2}s pending allocation rejected: tenure ended ({end})",
                t0.elapsed().as_secs_f64()
            ),
            Ok(Err(error)) => println!(
                "{:>5.2}s pending allocation rejected: {}",
                t0.elapsed().as_secs_f64(),
                chain(&error)
            ),
            Ok(Ok(home)) => println!(
                "{:>5.2}s pending allocation answered anyway (fencing token {})",
                t0.elapsed().as_secs_f64(),
                home.fencing_token
            ),
            Err(error) => println!(
                "{:>5.2}s pending allocation unanswered: {}",
                t0.elapsed().as_secs_f64(),
                chain(&error)
            ),
        }
    }
    sleep(Duration::from_millis(10)).await;
    println!(
        "{:>5.2}s the old coordinator is {} again",
        t0.elapsed().as_secs_f64(),
        describe(&coordinators[first].send(GetGateState).await?)
    );

    let second = 1 - first;
    while active(&coordinators[second..=second]).await.is_none() {
        sleep(Duration::from_millis(10)).await;
    }
    println!(
        "{:>5.2}s coordinator on node-{} holds the lease now",
        t0.elapsed().as_secs_f64(),
        ["a", "b"][second]
    );
    for region in &regions[..2] {
        coordinators[second]
            .send(RegisterRegion(region.clone().recipient()))
            .await??;
    }
    for shard in ["reports", "audit"] {
        let home = coordinators[second]
            .send(AllocateShard(shard.into()))
            .await??;
        println!(
            "{:>5.2}s allocated {shard} (token {})",
            t0.elapsed().as_secs_f64(),
            home.fencing_token
        );
    }

    // Nothing but these addresses keeps the coordinators alive: dropping them stops the active
    // one, which releases its lease (instead of leaving it to expire).
    drop(coordinators);
    let released = tokio::time::timeout(TTL, async {
        while store.holder("shard-coordinator").is_some() {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    println!(
        "{:>5.2}s coordinators dropped: the lease is {}",
        t0.elapsed().as_secs_f64(),
        if released.is_ok() {
            "released"
        } else {
            "still held"
        }
    );
    println!("{:>5.2}s the demo is over", t0.elapsed().as_secs_f64());
    Ok(())
}
