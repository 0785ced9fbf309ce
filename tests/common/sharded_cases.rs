//! Sharded-worker cases every backend runs (issue 36): in memory under Tokio's paused clock
//! (`tests/sharded.rs`) and on the real etcd and kube-apiserver (`tests/sharded_servers.rs`).
//! Each node builds its leases from a session of its own, as a process of its own would, so that
//! what one node's session saw is not what another's saw.
//!
//! Deadlines are events with bounds, never timings: "within half a TTL" means that no shard
//! waited for a record to expire (everything here moves by handovers and releases, which take
//! milliseconds), and a case fails when one did.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    member_lease_name, shard_lease_name, FencingToken, GetGroupView, GetShards, Lease,
    LeaseSettings, ShardDirectory, ShardInfo, ShardLocation, ShardedSettings, ShardedWorkers,
    SharedLease, Shutdown,
};
use tokio::time::{sleep, Instant};

/// What a backend provides to run the cases.
pub trait Fleet {
    /// The lease factory of node `node`: every lease of the node from one session of its own
    /// (made once per node and fleet).
    fn node(&self, node: &str) -> Rc<dyn Fn(LeaseSettings) -> SharedLease>;

    /// The TTL of every lease.
    fn ttl(&self) -> Duration;

    /// A group name no other test uses (no `.`).
    fn unique(&self, base: &str) -> String;
}

/// The settings of lease `name` of `owner` in `fleet`.
pub fn settings(fleet: &impl Fleet, name: &str, owner: &str) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(fleet.ttl())
        .build()
        .unwrap()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Started { token: FencingToken },
    Stopped,
}

/// Every worker's start and stop: (instant, shard, node, event).
pub type Log = Rc<RefCell<Vec<(Instant, String, String, Event)>>>;

/// A shard's worker: logs its start and stop; takes `stop_after` to stop when asked to (a worker
/// finishing its step), which makes a node's shutdown last a while.
pub struct Worker {
    shard: String,
    node: String,
    log: Log,
    stop_after: StopAfter,
    stopping: bool,
}

/// How long the worker of a shard takes to stop, by shard id, asked when it is told to stop.
pub type StopAfter = Rc<dyn Fn(&str) -> Duration>;

impl Actor for Worker {
    type Context = Context<Self>;

    fn stopping(&mut self, ctx: &mut Context<Self>) -> Running {
        let stop_after = (self.stop_after)(&self.shard);
        if stop_after.is_zero() || self.stopping {
            return Running::Stop;
        }
        self.stopping = true;
        ctx.run_later(stop_after, |_, ctx| ctx.stop());
        Running::Continue
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.log.borrow_mut().push((
            Instant::now(),
            self.shard.clone(),
            self.node.clone(),
            Event::Stopped,
        ));
    }
}

pub type Node = Addr<ShardedWorkers<Worker, SharedLease>>;

/// Node `node` of `group` with these shards, its workers logging into `log` and taking
/// `stop_after` to stop.
pub fn start(
    fleet: &impl Fleet,
    group: &str,
    shards: &[&str],
    node: &str,
    log: &Log,
    stop_after: Duration,
) -> Node {
    start_with(
        fleet,
        group,
        shards,
        node,
        log,
        stop_after,
        ShardedSettings::default(),
    )
}

/// [`start`] with shard leases renewed on their own (not bound to the member lease): the
/// per-shard mode, whose shutdown hands shards over one at a time.
pub fn start_renewed(
    fleet: &impl Fleet,
    group: &str,
    shards: &[&str],
    node: &str,
    log: &Log,
    stop_after: Duration,
) -> Node {
    let settings = ShardedSettings {
        bind_shards: false,
        ..ShardedSettings::default()
    };
    start_with(fleet, group, shards, node, log, stop_after, settings)
}

/// [`start`] with `settings`.
pub fn start_with(
    fleet: &impl Fleet,
    group: &str,
    shards: &[&str],
    node: &str,
    log: &Log,
    stop_after: Duration,
    settings: ShardedSettings,
) -> Node {
    build_with(fleet, group, shards, node, log, stop_after, settings).start()
}

/// [`start_with`], not started yet.
pub fn build_with(
    fleet: &impl Fleet,
    group: &str,
    shards: &[&str],
    node: &str,
    log: &Log,
    stop_after: Duration,
    settings: ShardedSettings,
) -> ShardedWorkers<Worker, SharedLease> {
    let stop_after: StopAfter = Rc::new(move |_| stop_after);
    build_with_stops(fleet, group, shards, node, log, stop_after, settings)
}

/// [`build_with`], each worker's stop taking what `stop_after` answers for its shard.
pub fn build_with_stops(
    fleet: &impl Fleet,
    group: &str,
    shards: &[&str],
    node: &str,
    log: &Log,
    stop_after: StopAfter,
    settings: ShardedSettings,
) -> ShardedWorkers<Worker, SharedLease> {
    let leases = fleet.node(node);
    let (owner, ttl, log) = (node.to_owned(), fleet.ttl(), log.clone());
    ShardedWorkers::new(
        group,
        shards.iter().map(|s| (*s).to_owned()),
        move |name: &str| {
            leases(
                LeaseSettings::builder(name, &owner)
                    .ttl(ttl)
                    .build()
                    .unwrap(),
            )
        },
        move |shard: &ShardInfo, _: &mut Context<Worker>| {
            assert!(
                shard.guard.check_alive(),
                "a worker starts under a live tenure"
            );
            log.borrow_mut().push((
                Instant::now(),
                shard.shard.clone(),
                shard.owner.clone(),
                Event::Started {
                    token: shard.fencing_token,
                },
            ));
            Worker {
                shard: shard.shard.clone(),
                node: shard.owner.clone(),
                log: log.clone(),
                stop_after: Rc::clone(&stop_after),
                stopping: false,
            }
        },
    )
    .unwrap()
    .settings(settings)
    .unwrap()
}

/// Which shards run where, by the workers' own log (started and not stopped).
pub fn running(log: &Log) -> BTreeMap<String, String> {
    let mut running = BTreeMap::new();
    for (_, shard, node, event) in log.borrow().iter() {
        match event {
            Event::Started { .. } => {
                running.insert(shard.clone(), node.clone());
            }
            Event::Stopped => {
                running.remove(shard);
            }
        }
    }
    running
}

/// Waits until `done` holds, checking every 5 ms (Tokio's clock: virtual time under a paused
/// clock); panics after `within`, and answers the instant it held.
pub async fn until(within: Duration, what: &str, mut done: impl FnMut() -> bool) -> Instant {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        sleep(Duration::from_millis(5)).await;
    }
    Instant::now()
}

/// No shard ever ran on two nodes at once, and each new worker of a shard ran under a higher
/// fencing token than the one before.
pub fn assert_exactly_once(log: &Log) {
    let mut running: BTreeMap<String, String> = BTreeMap::new();
    let mut last: BTreeMap<String, FencingToken> = BTreeMap::new();
    for (at, shard, node, event) in log.borrow().iter() {
        match event {
            Event::Started { token } => {
                if let Some(other) = running.get(shard) {
                    panic!("{at:?}: shard {shard} started on {node} while running on {other}");
                }
                if let Some(before) = last.get(shard) {
                    assert!(
                        token > before,
                        "shard {shard}: token {token} after {before}"
                    );
                }
                running.insert(shard.clone(), node.clone());
                last.insert(shard.clone(), *token);
            }
            Event::Stopped => {
                assert_eq!(
                    running.remove(shard).as_deref(),
                    Some(node.as_str()),
                    "shard {shard} stopped on {node}, where it did not run"
                );
            }
        }
    }
}

/// A lease outside the group that `node` holds from its session for as long as the returned
/// lease lives: a process that also runs something else (a singleton), whose session (and, on
/// etcd, its etcd lease) lives on after its group shut down.
pub async fn busy(fleet: &impl Fleet, group: &str, node: &str) -> SharedLease {
    let lease = (fleet.node(node))(settings(fleet, &format!("{group}-busy-{node}"), node));
    assert!(lease.acquire().await.unwrap());
    lease
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| i.to_string()).collect()
}

fn refs(ids: &[String]) -> Vec<&str> {
    ids.iter().map(String::as_str).collect()
}

/// Item 2: a node that shuts down hands each shard to the node that targets it *when its turn
/// comes*, not to the one that did when the shutdown began. `a` hands its shards over one at a
/// time, each worker taking a second to stop; meanwhile `b` shuts down and leaves. Every shard
/// then runs on `c` within half a TTL of `a`'s end: none was handed to `b` after it left (which
/// would keep it in `b`'s name, unrun, for a TTL; on etcd for as long as `b`'s session lives).
/// Both hold a lease outside the group, so that their sessions live on after they left it.
pub async fn a_leaving_node_hands_nothing_to_a_node_that_left_meanwhile(fleet: &impl Fleet) {
    let group = fleet.unique("leaving");
    let _busy = [
        busy(fleet, &group, "a").await,
        busy(fleet, &group, "b").await,
    ];
    let shards = ids(12);
    let log = Log::default();
    let slow = Duration::from_secs(1);
    let a = start_renewed(fleet, &group, &refs(&shards), "a", &log, slow);
    let b = start_renewed(fleet, &group, &refs(&shards), "b", &log, Duration::ZERO);
    let c = start_renewed(fleet, &group, &refs(&shards), "c", &log, Duration::ZERO);
    until(
        fleet.ttl() * 4,
        "three nodes run the 12 shards, 4 each",
        || {
            let running = running(&log);
            running.len() == 12 && running.values().filter(|n| *n == "a").count() == 4
        },
    )
    .await;
    let leaving_a = actix::spawn(a.send(Shutdown));
    // `a` has left the group (its member lease is gone from `c`'s view) and is stopping its
    // first worker: now `b` leaves, all at once.
    let view_without_a = || async {
        let view = c.send(GetGroupView).await.unwrap();
        !view.members.iter().any(|m| m == "a")
    };
    let deadline = Instant::now() + fleet.ttl();
    while !view_without_a().await {
        assert!(Instant::now() < deadline, "a's member lease never went");
        sleep(Duration::from_millis(5)).await;
    }
    assert!(
        b.send(Shutdown).await.unwrap().unwrap(),
        "b released everything"
    );
    assert!(
        leaving_a.await.unwrap().unwrap().unwrap(),
        "a released everything"
    );
    until(
        fleet.ttl() / 2,
        "every shard runs on c (none waits in the name of b, which left)",
        || {
            let running = running(&log);
            running.len() == 12 && running.values().all(|n| n == "c")
        },
    )
    .await;
    assert_exactly_once(&log);
    assert!(c.send(Shutdown).await.unwrap().unwrap());
}

/// Item 3: membership is the member leases named after their holders. A lease in the group's
/// member names held by a node that is not named so (an unrelated singleton someone called
/// `<group>.member.sync`) makes no member: no shard is placed on its holder, and the one node
/// runs every shard.
pub async fn a_lease_named_like_a_member_makes_no_member(fleet: &impl Fleet) {
    let group = fleet.unique("names");
    let stranger = (fleet.node("stranger"))(settings(
        fleet,
        &member_lease_name(&group, "sync"),
        "stranger",
    ));
    assert!(stranger.acquire().await.unwrap());
    let shards = ids(4);
    let log = Log::default();
    let node = start(fleet, &group, &refs(&shards), "n1", &log, Duration::ZERO);
    until(fleet.ttl() * 2, "n1 runs all 4 shards", || {
        running(&log).len() == 4
    })
    .await;
    let view = node.send(GetGroupView).await.unwrap();
    assert_eq!(view.members, ["n1"], "the stranger is no member: {view:?}");
    assert!(
        stranger.check_alive(),
        "the stranger's lease was held all along"
    );
    assert!(node.send(Shutdown).await.unwrap().unwrap());
    assert!(stranger.release().await.unwrap());
}

/// Item 3: two groups whose names extend one another (`a` and `a-b`) share no lease: group `a`'s
/// shards `b-member-n1` and `b.member.n1` are not group `a-b`'s member lease of node `n1` (with
/// `-` as the only separator they were one lease: the two nodes fought over it, and on
/// Kubernetes `a-b`'s retire at shutdown deleted `a`'s shard object, its tokens starting over).
/// Both groups run everything, and `n1` leaving `a-b` (its member lease retired) leaves `a`'s
/// shards running under the same tenures.
pub async fn groups_whose_names_extend_each_other_share_no_lease(fleet: &impl Fleet) {
    let a = fleet.unique("ext");
    let ab = format!("{a}-b");
    let log = Log::default();
    let shards_a = ["b-member-n1", "b.member.n1", "0"];
    let m1 = start(fleet, &a, &shards_a, "m1", &log, Duration::ZERO);
    let n1 = start(fleet, &ab, &["x"], "n1", &log, Duration::ZERO);
    until(fleet.ttl() * 2, "both groups run their shards", || {
        let log = log.borrow();
        let started = |node: &str| {
            log.iter()
                .filter(|(_, _, n, e)| n == node && matches!(e, Event::Started { .. }))
                .count()
        };
        started("m1") == 3 && started("n1") == 1
    })
    .await;
    let tokens = |shards: Vec<actix_coordination::RunningShard>| {
        shards
            .into_iter()
            .map(|s| (s.shard, s.fencing_token))
            .collect::<BTreeMap<_, _>>()
    };
    let before = tokens(m1.send(GetShards).await.unwrap());
    assert_eq!(before.len(), 3, "m1 holds its 3 shards: {before:?}");
    assert!(n1.send(Shutdown).await.unwrap().unwrap());
    // For half a TTL after `n1` left: `a`'s shards run on, under the same tenures.
    let watch_until = Instant::now() + fleet.ttl() / 2;
    while Instant::now() < watch_until {
        assert_eq!(tokens(m1.send(GetShards).await.unwrap()), before);
        sleep(Duration::from_millis(50)).await;
    }
    let stopped = log
        .borrow()
        .iter()
        .filter(|(_, _, n, e)| n == "m1" && *e == Event::Stopped)
        .count();
    assert_eq!(stopped, 0, "no worker of group {a} stopped");
    assert_exactly_once(&log);
    assert!(m1.send(Shutdown).await.unwrap().unwrap());
}

/// Item 4: a shard handed to a node while it shuts down (by a node, or here an outsider, that
/// had not seen it leave) is passed on, not left in the leaving node's name with nothing
/// running it (for a TTL; on etcd for as long as that node's session lives): the remaining node
/// runs it within half a TTL of the leaving node's end. The leaving node holds a lease outside
/// the group, so that its session lives on after it left it.
pub async fn a_shard_handed_to_a_leaving_node_is_passed_on(fleet: &impl Fleet) {
    let group = fleet.unique("passon");
    let _busy = busy(fleet, &group, "a").await;
    let shards = ids(6);
    let log = Log::default();
    // An outsider holds shard 0 before the nodes start, and watches the group (a handover needs
    // its session to have seen the target).
    let outsider =
        (fleet.node("outsider"))(settings(fleet, &shard_lease_name(&group, "0"), "outsider"));
    assert!(outsider.acquire().await.unwrap());
    let watch = outsider.watch_group(&format!("{group}.")).unwrap();
    let a = start_renewed(
        fleet,
        &group,
        &refs(&shards),
        "a",
        &log,
        Duration::from_secs(1),
    );
    let c = start_renewed(fleet, &group, &refs(&shards), "c", &log, Duration::ZERO);
    until(fleet.ttl() * 4, "the nodes run the 5 free shards", || {
        let running = running(&log);
        running.len() == 5 && running.values().any(|n| n == "a")
    })
    .await;
    until(fleet.ttl(), "the outsider's session has seen a", || {
        let snapshot = watch.snapshot();
        snapshot
            .records()
            .values()
            .any(|r| r.live_holder(Instant::now()) == Some("a"))
    })
    .await;
    let leaving_a = actix::spawn(a.send(Shutdown));
    let member_a = member_lease_name(&group, "a");
    until(fleet.ttl(), "a leaves the group", || {
        watch
            .snapshot()
            .live_holder(&member_a, Instant::now())
            .is_none()
    })
    .await;
    assert!(
        outsider.hand_over("a").await.unwrap(),
        "the outsider held shard 0"
    );
    assert!(leaving_a.await.unwrap().unwrap().is_ok());
    until(fleet.ttl() / 2, "shard 0 runs on c", || {
        running(&log).get("0").map(String::as_str) == Some("c")
    })
    .await;
    all_run_on(fleet, &log, 6, "c").await;
    assert!(c.send(Shutdown).await.unwrap().unwrap());
}

/// Stops that take `slow_stop` for the one shard named in the cell (none at first), and no time
/// for the others.
fn one_slow_stop(slow_stop: Duration) -> (Rc<RefCell<Option<String>>>, StopAfter) {
    let slow: Rc<RefCell<Option<String>>> = Rc::default();
    let named = Rc::clone(&slow);
    let stop_after: StopAfter = Rc::new(move |shard| {
        if named.borrow().as_deref() == Some(shard) {
            slow_stop
        } else {
            Duration::ZERO
        }
    });
    (slow, stop_after)
}

/// Issue 47, item 5: a leaving node's slow worker keeps only its own shard. `a` and `b` run 8
/// bound shards, 4 each; one of `a`'s workers takes two TTLs to stop. `a` shuts down: its
/// other 3 shards run on `b` within its leave grace plus half a TTL of the shutdown (they were
/// handed over, none waited for the slow worker, nor for a record to expire), while the slow
/// one still runs on `a`; it follows once its worker stopped, and `a`'s shutdown ends then.
pub async fn a_slow_worker_keeps_only_its_own_shard(fleet: &impl Fleet) {
    let group = fleet.unique("slowleave");
    let shards = ids(8);
    let log = Log::default();
    let (slow, stop_after) = one_slow_stop(fleet.ttl() * 2);
    let settings = ShardedSettings::default();
    let grace = settings.leave_grace;
    let a = build_with_stops(
        fleet,
        &group,
        &refs(&shards),
        "a",
        &log,
        stop_after,
        settings.clone(),
    )
    .start();
    let b = start_with(
        fleet,
        &group,
        &refs(&shards),
        "b",
        &log,
        Duration::ZERO,
        settings,
    );
    until(
        fleet.ttl() * 4,
        "two nodes run the 8 shards, 4 each",
        || {
            let running = running(&log);
            running.len() == 8 && running.values().filter(|n| *n == "a").count() == 4
        },
    )
    .await;
    let on_a: Vec<String> = running(&log)
        .into_iter()
        .filter(|(_, node)| node == "a")
        .map(|(shard, _)| shard)
        .collect();
    *slow.borrow_mut() = Some(on_a[0].clone());
    let leaving_a = actix::spawn(a.send(Shutdown));
    until(
        grace + fleet.ttl() / 2,
        "a's other 3 shards run on b while the slow worker stops",
        || {
            let running = running(&log);
            on_a[1..]
                .iter()
                .all(|shard| running.get(shard).map(String::as_str) == Some("b"))
        },
    )
    .await;
    assert_eq!(
        running(&log).get(&on_a[0]).map(String::as_str),
        Some("a"),
        "the slow worker still runs on a"
    );
    // a's member record says it leaves: b places nothing on it any more, though a holds a shard.
    let view = b.send(GetGroupView).await.unwrap();
    assert_eq!(view.members, ["b"], "a leaves: no member for b: {view:?}");
    assert!(
        !leaving_a.is_finished(),
        "a's shutdown waits for its slow worker"
    );
    assert!(
        leaving_a.await.unwrap().unwrap().unwrap(),
        "a released everything"
    );
    all_run_on(fleet, &log, 8, "b").await;
    assert!(b.send(Shutdown).await.unwrap().unwrap());
}

/// Issue 47, item 5: a shard handed to a node whose leave waits for a slow worker is passed on
/// once the leave grace passed, not when that worker stopped. An outsider holds shard 0; `a`
/// (one worker of which takes two TTLs to stop) and `c` run the other 5 bound shards. `a` shuts
/// down, and before its grace passed the outsider hands shard 0 over to `a` (it had not seen `a`
/// go). Shard 0 runs on `c` within the grace plus half a TTL, while the slow worker still runs
/// on `a`.
pub async fn a_shard_handed_to_a_node_leaving_slowly_is_passed_on_at_once(fleet: &impl Fleet) {
    handed_to_a_node_leaving_slowly(fleet, false).await;
}

/// [`a_shard_handed_to_a_node_leaving_slowly_is_passed_on_at_once`] with shard 0 handed to `a`
/// *after* its grace (as a dead member's list written a moment before `a`'s mark of leaving
/// reached its writer): passed on at the group's change, within half a TTL of the handover.
pub async fn a_shard_handed_to_a_node_past_its_grace_is_passed_on_at_once(fleet: &impl Fleet) {
    handed_to_a_node_leaving_slowly(fleet, true).await;
}

async fn handed_to_a_node_leaving_slowly(fleet: &impl Fleet, past_grace: bool) {
    let group = fleet.unique("slowpasson");
    let shards = ids(6);
    let log = Log::default();
    let outsider =
        (fleet.node("outsider"))(settings(fleet, &shard_lease_name(&group, "0"), "outsider"));
    assert!(outsider.acquire().await.unwrap());
    let watch = outsider.watch_group(&format!("{group}.")).unwrap();
    let (slow, stop_after) = one_slow_stop(fleet.ttl() * 2);
    let settings = ShardedSettings::default();
    let grace = settings.leave_grace;
    let a = build_with_stops(
        fleet,
        &group,
        &refs(&shards),
        "a",
        &log,
        stop_after,
        settings.clone(),
    )
    .start();
    let c = start_with(
        fleet,
        &group,
        &refs(&shards),
        "c",
        &log,
        Duration::ZERO,
        settings,
    );
    until(fleet.ttl() * 4, "the nodes run the 5 free shards", || {
        let running = running(&log);
        running.len() == 5 && running.values().any(|n| n == "a")
    })
    .await;
    until(fleet.ttl(), "the outsider's session has seen a", || {
        let snapshot = watch.snapshot();
        snapshot
            .records()
            .values()
            .any(|r| r.live_holder(Instant::now()) == Some("a"))
    })
    .await;
    let on_a = running(&log)
        .into_iter()
        .find(|(_, node)| node == "a")
        .map(|(shard, _)| shard)
        .unwrap();
    *slow.borrow_mut() = Some(on_a.clone());
    let leaving_a = actix::spawn(a.send(Shutdown));
    sleep(if past_grace { grace * 2 } else { grace / 5 }).await;
    assert!(
        outsider.hand_over("a").await.unwrap(),
        "the outsider held shard 0"
    );
    until(
        if past_grace {
            fleet.ttl() / 2
        } else {
            grace + fleet.ttl() / 2
        },
        "shard 0 runs on c while a's slow worker stops",
        || running(&log).get("0").map(String::as_str) == Some("c"),
    )
    .await;
    assert_eq!(
        running(&log).get(&on_a).map(String::as_str),
        Some("a"),
        "the slow worker still runs on a"
    );
    assert!(leaving_a.await.unwrap().unwrap().is_ok());
    all_run_on(fleet, &log, 6, "c").await;
    assert!(c.send(Shutdown).await.unwrap().unwrap());
}

/// Issue 38: the address a member advertises travels through the real store. Two nodes, each
/// advertising its own address, run 6 shards: every node's [`ShardDirectory`] answers each
/// shard's holder, fencing token and the holder's address alike, from its own session's watch,
/// and `here` on the holder only; the holder's worker runs under that token. When a node leaves,
/// the other answers its shards as its own.
pub async fn every_node_locates_every_shard_with_its_holders_address(fleet: &impl Fleet) {
    let group = fleet.unique("locate");
    let shards = ids(6);
    let log = Log::default();
    let address = |node: &str| format!("http://{node}.example:8080");
    let mut nodes = Vec::new();
    let mut directories: Vec<ShardDirectory> = Vec::new();
    for node in ["a", "b"] {
        let leases = fleet.node(node);
        let workers = build_with(
            fleet,
            &group,
            &refs(&shards),
            node,
            &log,
            Duration::ZERO,
            ShardedSettings::default(),
        )
        .advertise(address(node), move |s| {
            Ok::<_, std::convert::Infallible>(leases(s))
        })
        .unwrap();
        directories.push(workers.directory());
        nodes.push(workers.start());
    }
    until(fleet.ttl() * 4, "two nodes run 3 shards each", || {
        let running = running(&log);
        running.len() == 6 && running.values().filter(|n| *n == "a").count() == 3
    })
    .await;
    let locate = |d: &ShardDirectory, shard: &str| d.locate(shard).ok();
    // Both watches have seen every claim (and its holder's member record) within a TTL.
    let agreed = |directories: &[ShardDirectory]| {
        shards.iter().all(|shard| {
            let answers: Vec<Option<ShardLocation>> =
                directories.iter().map(|d| locate(d, shard)).collect();
            let Some(Some(first)) = answers.first() else {
                return false;
            };
            let holder = first.holder.clone();
            holder.is_some()
                && first.address == holder.as_deref().map(address)
                && answers.iter().zip(directories).all(|(answer, d)| {
                    answer.as_ref().is_some_and(|a| {
                        (&a.holder, a.token, &a.address)
                            == (&first.holder, first.token, &first.address)
                            && a.here == (holder.as_deref() == Some(d.node()))
                    })
                })
        })
    };
    until(
        fleet.ttl(),
        "both nodes answer alike for every shard",
        || agreed(&directories),
    )
    .await;
    // The holder's worker runs under the token every node answers.
    let mut tokens = BTreeMap::new();
    for (_, shard, node, event) in log.borrow().iter() {
        if let Event::Started { token } = event {
            tokens.insert(shard.clone(), (node.clone(), *token));
        }
    }
    for shard in &shards {
        let location = directories[0].locate(shard).unwrap();
        let (node, token) = &tokens[shard];
        assert_eq!(location.holder.as_ref(), Some(node), "shard {shard}");
        assert_eq!(location.token, Some(*token), "shard {shard}");
    }
    let b = nodes.pop().unwrap();
    assert!(b.send(Shutdown).await.unwrap().unwrap());
    until(fleet.ttl(), "a answers every shard as its own", || {
        shards.iter().all(|shard| {
            locate(&directories[0], shard).is_some_and(|l| {
                l.here && l.holder.as_deref() == Some("a") && l.address == Some(address("a"))
            })
        })
    })
    .await;
    assert_exactly_once(&log);
    let a = nodes.pop().unwrap();
    assert!(a.send(Shutdown).await.unwrap().unwrap());
}

/// Waits up to half a TTL until every one of the `count` shards runs on `node`, then checks
/// that each ran exactly once at any time: the common end of the leave cases.
async fn all_run_on(fleet: &impl Fleet, log: &Log, count: usize, node: &str) {
    until(
        fleet.ttl() / 2,
        &format!("every shard runs on {node}"),
        || {
            let running = running(log);
            running.len() == count && running.values().all(|n| n == node)
        },
    )
    .await;
    assert_exactly_once(log);
}
