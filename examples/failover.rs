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
//! 3. ends: the nodes left shut down gracefully, one after the other: the frozen one first, then
//!    each time the one running the singleton, which hands it to a node still waiting (so the
//!    last node starts it just before its own turn to shut down);
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

/// The first node other than `not` that runs the singleton, waiting at most `within`.
async fn wait_for_new_runner(
    managers: &[Manager],
    not: &[usize],
    within: Duration,
) -> Option<usize> {
    tokio::time::timeout(within, async {
        loop {
            match runner(managers).await {
                Some(i) if !not.contains(&i) => return i,
                _ => sleep(Duration::from_millis(5)).await,
            }
        }
    })
    .await
    .ok()
}

/// Shuts a node down gracefully (its singleton stops, then its lease is released) and says how
/// it went, in a sentence.
async fn shut_down(manager: &Manager, running: bool) -> String {
    match manager.send(Shutdown).await {
        Ok(Ok(true)) if running => "its singleton stopped, and it released the lease".to_owned(),
        Ok(Ok(true)) => "it held no lease".to_owned(),
        Ok(Ok(false)) => "another node holds the lease".to_owned(),
        Ok(Err(error)) => format!(
            "releasing the lease failed ({}); the lease expires after its TTL",
            chain(&error)
        ),
        Err(error) => format!("its manager was gone already ({})", chain(&error)),
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

    let Some(first) = wait_for_new_runner(&managers, &[], TTL * 2).await else {
        eprintln!("no node started the singleton");
        std::process::exit(1);
    };
    sleep(Duration::from_secs(2)).await;
    println!(
        "{:>6.2}s  -- node-{first} FREEZES (its calls hang: a pause or a partition) --",
        t0.elapsed().as_secs_f64()
    );
    store.pause(&format!("node-{first}"));
    let frozen_at = Instant::now();
    let Some(second) = wait_for_new_runner(&managers, &[first], TTL * 2).await else {
        eprintln!("\nno node took over from the frozen node-{first}");
        std::process::exit(1);
    };
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
    let stopped = shut_down(&managers[second], true).await;
    let Some(third) = wait_for_new_runner(&managers, &[first, second], TTL * 2).await else {
        eprintln!("\nno node took over from node-{second} ({stopped})");
        std::process::exit(1);
    };
    println!(
        "{:>6.2}s  -- node-{third} took over {:.1}ms after the graceful stop began (node-{second}: {stopped}) --",
        t0.elapsed().as_secs_f64(),
        stop_at.elapsed().as_secs_f64() * 1000.0
    );

    sleep(Duration::from_secs(2)).await;
    store.heal(&format!("node-{first}"));
    // The end of the demo: the nodes left shut down gracefully, one after the other. The frozen
    // one, waiting again, goes first; then, each time, the one running the singleton, which hands
    // it to a node still waiting: the last starts it just before its own turn comes.
    println!(
        "\n{:>6.2}s  -- THE DEMO ENDS: the {} nodes left shut down gracefully, one after the other: \
         node-{first} first, then each time the one running the singleton, and a node still \
         waiting takes it over --",
        t0.elapsed().as_secs_f64(),
        NODES - 1
    );
    let mut left: Vec<usize> = (0..NODES).filter(|&i| i != second).collect();
    let mut node = first;
    loop {
        left.retain(|&i| i != node);
        let running = runner(&managers).await == Some(node);
        println!(
            "{:>6.2}s  -- node-{node} shuts down --",
            t0.elapsed().as_secs_f64()
        );
        let outcome = shut_down(&managers[node], running).await;
        println!(
            "{:>6.2}s  -- node-{node} is down: {outcome} --",
            t0.elapsed().as_secs_f64()
        );
        if left.is_empty() {
            break;
        }
        let gone: Vec<usize> = (0..NODES).filter(|i| !left.contains(i)).collect();
        let Some(next) = wait_for_new_runner(&managers, &gone, TTL * 2).await else {
            eprintln!("\nnobody runs the singleton after node-{node} shut down");
            std::process::exit(1);
        };
        if running {
            println!(
                "{:>6.2}s  -- node-{next} took over: it was still waiting{} --",
                t0.elapsed().as_secs_f64(),
                if left.len() == 1 {
                    ", the last one; it shuts down next"
                } else {
                    ""
                }
            );
        }
        node = next;
    }
    println!(
        "{:>6.2}s  -- every node is down: the demo is over --",
        t0.elapsed().as_secs_f64()
    );
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
