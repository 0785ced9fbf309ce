//! Several simulated nodes compete for one lease on the embedded in-memory backend.
//!
//! Every node tries to acquire the lease; the holder does "leader work" stamped with its fencing
//! token. The demo then crashes the holder (no release: the others wait for the TTL) and later stops
//! the next holder gracefully (release: the lease changes hands at once). Watch the fencing token
//! rise with every change of holder.
//!
//! ```text
//! cargo run --example failover
//! ```

use std::sync::Arc;
use std::time::Duration;

use actix_coordination::prelude::*;
use tokio::sync::watch;
use tokio::time::{sleep, Instant};

const NODES: usize = 4;
const TTL: Duration = Duration::from_secs(3);

/// How a node stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Running,
    Crash,
    Graceful,
}

async fn node(
    id: usize,
    store: InMemoryStore,
    mut stop: watch::Receiver<Stop>,
    started: Instant,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let owner = format!("node-{id}");
    let settings = LeaseSettings::builder("demo-singleton", owner.clone())
        .ttl(TTL)
        .acquire_retry_delay(Duration::from_millis(200))
        .build()?;
    let lease = Arc::new(InMemoryLease::new(settings, &store));
    let t = move || format!("{:>5.2}s", started.elapsed().as_secs_f64());
    let _lost = lease.on_lost({
        move |lost| println!("{} {:<7} lost the lease: {}", t(), lost.owner, lost.reason)
    });
    loop {
        match *stop.borrow() {
            Stop::Running => {}
            Stop::Crash => {
                println!(
                    "{} {owner:<7} CRASHES (no release; the others wait for the TTL)",
                    t()
                );
                return Ok(()); // dropping the lease stops renewal without releasing
            }
            Stop::Graceful => {
                let released = lease.release().await?;
                println!("{} {owner:<7} stops gracefully, released: {released}", t());
                return Ok(());
            }
        }
        match lease.acquire().await {
            Ok(true) => {
                let token = lease.fencing_token().expect("held");
                // Leader-only work, as long as the lease is alive.
                while lease.check_alive() && *stop.borrow() == Stop::Running {
                    println!(
                        "{} {owner:<7} is the leader, working with fencing token {token}",
                        t()
                    );
                    tokio::select! {
                        _ = sleep(Duration::from_millis(700)) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
            Ok(false) => {}
            Err(error) => println!("{} {owner:<7} acquire failed: {error}", t()),
        }
        tokio::select! {
            _ = sleep(Duration::from_millis(100)) => {}
            _ = stop.changed() => {}
        }
    }
}

#[actix_rt::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let store = InMemoryStore::new();
    let started = Instant::now();
    println!(
        "{NODES} nodes compete for lease \"demo-singleton\" (ttl {TTL:?}) on the in-memory backend"
    );
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    for id in 1..=NODES {
        let (tx, rx) = watch::channel(Stop::Running);
        stops.push(tx);
        tasks.push(actix_rt::spawn(node(id, store.clone(), rx, started)));
    }
    let holder_index = |store: &InMemoryStore| {
        store
            .holder("demo-singleton")
            .and_then(|h| {
                h.strip_prefix("node-")
                    .and_then(|n| n.parse::<usize>().ok())
            })
            .map(|n| n - 1)
    };

    sleep(Duration::from_secs(2)).await;
    let first = holder_index(&store).expect("someone holds the lease");
    stops[first].send_replace(Stop::Crash);
    let crashed_at = Instant::now();
    let second = loop {
        match holder_index(&store) {
            Some(h) if h != first => break h,
            _ => sleep(Duration::from_millis(20)).await,
        }
    };
    println!(
        "  -> node-{} took over {:.2}s after the crash (ttl {TTL:?})",
        second + 1,
        crashed_at.elapsed().as_secs_f64()
    );

    sleep(Duration::from_secs(2)).await;
    stops[second].send_replace(Stop::Graceful);
    let stopped_at = Instant::now();
    let third = loop {
        match holder_index(&store) {
            Some(h) if h != first && h != second => break h,
            _ => sleep(Duration::from_millis(5)).await,
        }
    };
    println!(
        "  -> node-{} took over {:.0}ms after the graceful stop",
        third + 1,
        stopped_at.elapsed().as_secs_f64() * 1000.0
    );

    sleep(Duration::from_secs(2)).await;
    for stop in &stops {
        stop.send_replace(Stop::Graceful);
    }
    for task in tasks {
        task.await??;
    }
    let record = store.record("demo-singleton").expect("record");
    println!(
        "done: last fencing token {} (one per ownership transition)",
        record.token
    );
    Ok(())
}
