//! Several simulated nodes run a cluster singleton on the embedded in-memory backend.
//!
//! Each node runs a `ClusterSingletonManager` with its own lease (same name, its own owner); the node
//! holding the lease runs the singleton, which works with its fencing token. The demo then
//!
//! 1. freezes the node running the singleton (its calls to the store hang, like a paused process or
//!    a partition): its singleton stops at its local deadline, and another node takes over once the
//!    TTL has passed;
//! 2. stops the next one gracefully: its singleton stops, the lease is released, and a waiting node
//!    takes over within milliseconds;
//!
//! and prints a timeline of who ran the singleton, with the fencing token rising at every change.
//!
//! ```text
//! cargo run --example failover
//! ```

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    ClusterSingletonManager, GetStatus, InMemoryLease, InMemoryStore, LeaseSettings, Shutdown,
    SingletonInfo, SingletonState,
};
use tokio::time::{sleep, Instant};

const NODES: usize = 4;
const TTL: Duration = Duration::from_secs(3);
const LEASE: &str = "demo-singleton";

/// (node, fencing token, started, stopped)
type Timeline = Rc<RefCell<Vec<(usize, u64, Duration, Option<Duration>)>>>;

/// The singleton: "works" every 500 ms with its fencing token, while its tenure's guard says so.
struct Worker {
    node: usize,
    info: SingletonInfo,
    timeline: Timeline,
    t0: Instant,
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let at = self.t0.elapsed();
        let token = self.info.fencing_token.value();
        println!(
            "{:>6.2}s  node-{} STARTS the singleton (fencing token {token})",
            at.as_secs_f64(),
            self.node
        );
        self.timeline
            .borrow_mut()
            .push((self.node, token, at, None));
        ctx.run_interval(Duration::from_millis(500), |act, _| {
            // Gate every step on the tenure's guard, and fence every write with its token: the
            // guard turns false before any other node can acquire the lease.
            if !act.info.guard.check_alive() {
                return;
            }
            println!(
                "{:>6.2}s  node-{} works, fencing token {}",
                act.t0.elapsed().as_secs_f64(),
                act.node,
                act.info.fencing_token
            );
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        let at = self.t0.elapsed();
        println!(
            "{:>6.2}s  node-{} stops the singleton",
            at.as_secs_f64(),
            self.node
        );
        if let Some(entry) = self
            .timeline
            .borrow_mut()
            .iter_mut()
            .rev()
            .find(|e| e.0 == self.node)
        {
            entry.3 = Some(at);
        }
    }
}

type Manager = Addr<ClusterSingletonManager<Worker, InMemoryLease>>;

async fn runner(managers: &[Manager]) -> Option<usize> {
    for (i, m) in managers.iter().enumerate() {
        if matches!(m.send(GetStatus).await, Ok(s) if s.state == SingletonState::Running) {
            return Some(i);
        }
    }
    None
}

async fn wait_for_new_runner(managers: &[Manager], not: &[usize]) -> usize {
    loop {
        match runner(managers).await {
            Some(i) if !not.contains(&i) => return i,
            _ => sleep(Duration::from_millis(5)).await,
        }
    }
}

fn draw(timeline: &Timeline, end: Duration) {
    const WIDTH: f64 = 60.0;
    println!(
        "\nwho ran the singleton (each column = {:.2}s):",
        end.as_secs_f64() / WIDTH
    );
    for node in 0..NODES {
        let mut row = vec![' '; WIDTH as usize];
        for &(n, token, start, stop) in timeline.borrow().iter() {
            if n != node {
                continue;
            }
            let from = (start.as_secs_f64() / end.as_secs_f64() * WIDTH) as usize;
            let to =
                (stop.unwrap_or(end).as_secs_f64() / end.as_secs_f64() * WIDTH).ceil() as usize;
            for cell in row.iter_mut().take(to.min(WIDTH as usize)).skip(from) {
                *cell = char::from_digit((token % 10) as u32, 10).unwrap_or('#');
            }
        }
        println!("  node-{node} |{}|", row.into_iter().collect::<String>());
    }
    println!("  (digits: the fencing token of the tenure)");
}

#[actix_rt::main]
async fn main() {
    let store = InMemoryStore::new();
    let timeline = Timeline::default();
    let t0 = Instant::now();
    println!("{NODES} nodes run one singleton over lease {LEASE:?} (ttl {TTL:?}) on the in-memory backend\n");
    let managers: Vec<Manager> = (0..NODES)
        .map(|node| {
            let settings = LeaseSettings::builder(LEASE, format!("node-{node}"))
                .ttl(TTL)
                .build()
                .expect("valid settings");
            let timeline = timeline.clone();
            ClusterSingletonManager::new(store.lease(settings), move |info: &SingletonInfo, _| {
                Worker {
                    node,
                    info: info.clone(),
                    timeline: timeline.clone(),
                    t0,
                }
            })
            .start()
        })
        .collect();

    let first = wait_for_new_runner(&managers, &[]).await;
    sleep(Duration::from_secs(2)).await;
    println!(
        "{:>6.2}s  -- node-{first} FREEZES (its calls hang: a pause or a partition) --",
        t0.elapsed().as_secs_f64()
    );
    store.pause(&format!("node-{first}"));
    let frozen_at = Instant::now();
    let second = wait_for_new_runner(&managers, &[first]).await;
    println!(
        "{:>6.2}s  -- node-{second} took over {:.2}s after the freeze (ttl {TTL:?}) --",
        t0.elapsed().as_secs_f64(),
        frozen_at.elapsed().as_secs_f64()
    );

    sleep(Duration::from_secs(2)).await;
    println!(
        "{:>6.2}s  -- node-{second} STOPS GRACEFULLY --",
        t0.elapsed().as_secs_f64()
    );
    let stop_at = Instant::now();
    let released = managers[second].send(Shutdown).await;
    let third = wait_for_new_runner(&managers, &[first, second]).await;
    println!(
        "{:>6.2}s  -- node-{third} took over {:.1}ms after the graceful stop began (released: {released:?}) --",
        t0.elapsed().as_secs_f64(),
        stop_at.elapsed().as_secs_f64() * 1000.0
    );

    sleep(Duration::from_secs(2)).await;
    store.heal(&format!("node-{first}"));
    for (i, m) in managers.iter().enumerate() {
        if i != second {
            let _ = m.send(Shutdown).await;
        }
    }
    draw(&timeline, t0.elapsed());
    let token = store.record(LEASE).map(|r| r.token.value()).unwrap_or(0);
    println!("\nlast fencing token: {token} (one per tenure; it never goes back)");
    if let Err(problem) = check(&timeline) {
        eprintln!("\nINVARIANT BROKEN: {problem}");
        std::process::exit(1);
    }
    println!("checked: never two singletons at once, fencing tokens strictly rising");
}

/// The demo's own check (CI runs this example): tenures never overlap and every new tenure has a
/// higher fencing token than the one before.
fn check(timeline: &Timeline) -> Result<(), String> {
    let mut tenures = timeline.borrow().clone();
    tenures.sort_by_key(|t| t.2);
    if tenures.len() < 3 {
        return Err(format!(
            "expected at least 3 tenures, saw {}",
            tenures.len()
        ));
    }
    for pair in tenures.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let a_stop =
            a.3.ok_or_else(|| format!("node-{} never stopped its singleton", a.0))?;
        if a_stop > b.2 {
            return Err(format!(
                "node-{} started at {:?} while node-{} ran until {:?}",
                b.0, b.2, a.0, a_stop
            ));
        }
        if b.1 <= a.1 {
            return Err(format!("fencing token went from {} to {}", a.1, b.1));
        }
    }
    Ok(())
}
