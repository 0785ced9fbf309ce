//! Candidacies and the handover policy of `ClusterSingletonManager`, on the in-memory backend
//! under a paused clock: a rolling update changes leadership once and ends on the new revision; a
//! worse candidate never takes over while a better one is live; a leader on its way out hands
//! over to the best remaining candidate; who leads comes with its address.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::cell::RefCell;
use std::convert::Infallible;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    Candidate, ClusterSingletonManager, GetLeader, HandoverPolicy, InMemoryLease, InMemoryStore,
    LeaseSettings, Shutdown, SingletonInfo, TransferLeadership,
};
use common::run_paused;
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(9);
const LEASE: &str = "singleton";

/// Singleton starts and stops, in order: (owner, started?).
type Log = Rc<RefCell<Vec<(String, bool)>>>;

struct Probe {
    owner: String,
    log: Log,
}

impl Actor for Probe {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        self.log.borrow_mut().push((self.owner.clone(), true));
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.log.borrow_mut().push((self.owner.clone(), false));
    }
}

type Manager = Addr<ClusterSingletonManager<Probe, InMemoryLease>>;

fn node(
    store: &InMemoryStore,
    owner: &str,
    revision: &str,
    started_ms: u64,
    policy: HandoverPolicy,
    log: &Log,
) -> Manager {
    let settings = LeaseSettings::builder(LEASE, owner)
        .ttl(TTL)
        .build()
        .unwrap();
    let lease = store.lease(settings);
    let log = log.clone();
    let candidate = Candidate::new()
        .revision(revision)
        .started_ms(started_ms)
        .address(format!("http://{owner}:8080"))
        .unwrap();
    let store = store.clone();
    ClusterSingletonManager::new(lease, move |info: &SingletonInfo, _| Probe {
        owner: info.owner.clone(),
        log: log.clone(),
    })
    .candidacy(candidate, |s| Ok::<_, Infallible>(store.lease(s)))
    .unwrap()
    .handover(policy)
    .start()
}

/// The owner running the singleton now, checking on the way that no two ever ran at once.
fn running(log: &Log) -> Option<String> {
    let mut now: Option<String> = None;
    for (owner, started) in log.borrow().iter() {
        if *started {
            assert!(now.is_none(), "{owner} started while {now:?} ran: {log:?}");
            now = Some(owner.clone());
        } else {
            assert_eq!(now.as_ref(), Some(owner), "{log:?}");
            now = None;
        }
    }
    now
}

/// How many times the singleton started.
fn starts(log: &Log) -> usize {
    log.borrow().iter().filter(|(_, started)| *started).count()
}

async fn wait_for_leader(log: &Log, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Some(owner) = running(log) {
            return owner;
        }
        assert!(Instant::now() < deadline, "nobody leads: {log:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Lets the candidates' watches and every handover settle.
async fn settle() {
    sleep(Duration::from_millis(200)).await;
}

/// A rolling update as a ReplicaSet runs it (maxSurge 1, maxUnavailable 0: start a new replica,
/// then stop the most recently started old one), whichever old replica leads at the start: with
/// the policy, leadership changes exactly once and ends on the new revision; without it, a new
/// replica's arrival moves nothing.
#[test]
fn a_rolling_update_changes_leadership_once_and_ends_on_the_new_revision() {
    for first_leader in 0..3 {
        let (changes, last) = run_paused(rollout(first_leader, HandoverPolicy::NewestRevision));
        assert_eq!(changes, 1, "leader o{first_leader}: one change");
        assert!(last.starts_with('n'), "the new revision leads: {last}");
        run_paused(rollout(first_leader, HandoverPolicy::Off));
    }
}

/// Runs a 3-replica rollout from v1 (o0, o1, o2, started in that order) to v2 (n0, n1, n2) with
/// `o{first_leader}` leading at the start; answers how many times leadership changed during the
/// rollout and who leads at the end.
async fn rollout(first_leader: usize, policy: HandoverPolicy) -> (usize, String) {
    let store = InMemoryStore::new();
    let log = Log::default();
    let mut old: Vec<(String, Manager)> = Vec::new();
    for i in 0..3 {
        let owner = format!("o{i}");
        old.push((
            owner.clone(),
            node(&store, &owner, "v1", 1 + i, policy.clone(), &log),
        ));
        if i == 0 {
            assert_eq!(wait_for_leader(&log, TTL).await, owner);
        }
    }
    settle().await;
    if first_leader != 0 {
        let to = TransferLeadership::to(format!("o{first_leader}"));
        assert!(matches!(old[0].1.send(to).await.unwrap(), Ok(true)));
        assert_eq!(wait_for_leader(&log, TTL).await, format!("o{first_leader}"));
        settle().await;
    }
    let before = starts(&log);
    let mut new = Vec::new();
    for step in 0..3 {
        let owner = format!("n{step}");
        new.push(node(&store, &owner, "v2", 100 + step, policy.clone(), &log));
        settle().await;
        if step == 0 {
            let expected = match policy {
                HandoverPolicy::Off => format!("o{first_leader}"),
                _ => "n0".to_owned(), // the old leader handed over as soon as n0 was up
            };
            assert_eq!(running(&log), Some(expected), "after n0 started");
        }
        // A ReplicaSet scales down the most recently started old replica first.
        let (gone, manager) = old.pop().unwrap();
        let answer = manager.send(Shutdown).await.unwrap();
        assert!(answer.is_ok(), "{gone}: {answer:?}");
        wait_for_leader(&log, TTL * 2).await;
        settle().await;
    }
    let last = wait_for_leader(&log, TTL * 2).await;
    (starts(&log) - before, last)
}

/// A worse candidate never takes over while a better one is live: when the new-revision leader
/// crashes, the other new-revision node takes over, not the old one; only when no new-revision
/// candidate is live any more does the old one lead.
#[test]
fn a_worse_candidate_defers_while_a_better_one_is_live() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let policy = HandoverPolicy::NewestRevision;
        let _n1 = node(&store, "n1", "v2", 10, policy.clone(), &log);
        assert_eq!(wait_for_leader(&log, TTL).await, "n1");
        let _o1 = node(&store, "o1", "v1", 1, policy.clone(), &log);
        let _n2 = node(&store, "n2", "v2", 11, policy.clone(), &log);
        settle().await;
        assert_eq!(running(&log).as_deref(), Some("n1"));

        store.partition("n1"); // a crash: n1 renews neither its lease nor its candidacy
        let cut = Instant::now();
        loop {
            sleep(Duration::from_millis(5)).await;
            match running(&log).as_deref() {
                Some("n1") | None => assert!(cut.elapsed() < TTL * 2, "{log:?}"),
                Some(other) => {
                    assert_eq!(other, "n2", "the old revision took over: {log:?}");
                    break;
                }
            }
        }
        store.partition("n2");
        let cut = Instant::now();
        assert_eq!(wait_for_leader_other_than(&log, "n2", TTL * 3).await, "o1");
        let took = cut.elapsed();
        assert!(
            took < TTL * 2 + Duration::from_secs(1),
            "o1 waited {took:?} for n2's claims to expire"
        );
    });
}

async fn wait_for_leader_other_than(log: &Log, than: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Some(owner) = running(log).filter(|o| o != than) {
            return owner;
        }
        assert!(
            Instant::now() < deadline,
            "nobody but {than} leads: {log:?}"
        );
        sleep(Duration::from_millis(5)).await;
    }
}

/// A leader that shuts down hands the lease to the best remaining candidate (a new-revision
/// node, not an old one), which runs the singleton at once; it withdrew its candidacy first.
#[test]
fn a_leader_on_its_way_out_hands_over_to_the_best_candidate() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let policy = HandoverPolicy::NewestRevision;
        let n1 = node(&store, "n1", "v2", 10, policy.clone(), &log);
        assert_eq!(wait_for_leader(&log, TTL).await, "n1");
        let _o1 = node(&store, "o1", "v1", 1, policy.clone(), &log);
        let _n2 = node(&store, "n2", "v2", 11, policy.clone(), &log);
        settle().await;
        let asked = Instant::now();
        assert!(matches!(n1.send(Shutdown).await.unwrap(), Ok(true)));
        assert_eq!(wait_for_leader(&log, TTL).await, "n2");
        assert!(asked.elapsed() < Duration::from_millis(100), "at once");
        assert!(
            store.holder("singleton-candidate-n1").is_none(),
            "n1 withdrew"
        );
        assert_eq!(starts(&log), 2);
    });
}

/// `GetLeader` answers the leader's advertised address on every node, and `to_best` hands over
/// to the best other candidate (or answers `false` with nobody to hand to).
#[test]
fn every_node_finds_the_leaders_address_and_to_best_picks_the_best() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let policy = HandoverPolicy::Off;
        let a = node(&store, "a", "v1", 1, policy.clone(), &log);
        assert_eq!(wait_for_leader(&log, TTL).await, "a");
        assert!(matches!(
            a.send(TransferLeadership::to_best()).await.unwrap(),
            Ok(false)
        ));
        let b = node(&store, "b", "v1", 3, policy.clone(), &log);
        let c = node(&store, "c", "v1", 2, policy.clone(), &log);
        settle().await;
        for manager in [&a, &b, &c] {
            let leader = manager.send(GetLeader).await.unwrap().expect("a leader");
            assert_eq!(leader.holder, "a");
            assert_eq!(leader.address.as_deref(), Some("http://a:8080"));
        }
        // With the policy off, the best is the earliest started other candidate: c.
        assert!(matches!(
            a.send(TransferLeadership::to_best()).await.unwrap(),
            Ok(true)
        ));
        assert_eq!(wait_for_leader(&log, TTL).await, "c");
        let leader = b.send(GetLeader).await.unwrap().expect("a leader");
        assert_eq!(leader.address.as_deref(), Some("http://c:8080"));
    });
}

/// Among equals a leader on its way out releases plainly: an equal candidate that crashed a
/// moment ago still looks live until its candidacy expires, and naming it would leave the lease
/// to a dead node for a TTL. The live one takes over at once.
#[test]
fn a_leader_on_its_way_out_never_names_an_equal_that_may_be_dead() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let policy = HandoverPolicy::NewestRevision;
        let a = node(&store, "a", "v1", 3, policy.clone(), &log);
        assert_eq!(wait_for_leader(&log, TTL).await, "a");
        // b started first: among equals, the best by start time.
        let _b = node(&store, "b", "v1", 1, policy.clone(), &log);
        let _c = node(&store, "c", "v1", 2, policy.clone(), &log);
        settle().await;
        store.partition("b"); // b crashes; its candidacy looks live until it expires
        let asked = Instant::now();
        assert!(matches!(a.send(Shutdown).await.unwrap(), Ok(true)));
        assert_eq!(wait_for_leader(&log, TTL).await, "c");
        let took = asked.elapsed();
        assert!(took < Duration::from_millis(100), "c waited {took:?}");
    });
}
