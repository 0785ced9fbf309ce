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
    how: Behaviour,
    stop_asked: bool,
}

/// How a node's singleton behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Behaviour {
    Normal,
    /// Stops on its own as soon as it started (a singleton that cannot run on this node).
    Fails,
    /// Takes this long to stop when told to (it finishes its work first).
    SlowStop(Duration),
}

impl Actor for Probe {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.log.borrow_mut().push((self.owner.clone(), true));
        if self.how == Behaviour::Fails {
            ctx.stop();
        }
    }

    fn stopping(&mut self, ctx: &mut Self::Context) -> Running {
        match self.how {
            Behaviour::SlowStop(after) if !self.stop_asked => {
                self.stop_asked = true;
                ctx.run_later(after, |_, ctx| ctx.stop());
                Running::Continue
            }
            _ => Running::Stop,
        }
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
    manager(
        store,
        owner,
        revision,
        started_ms,
        policy,
        log,
        Behaviour::Normal,
    )
    .start()
}

/// A node's manager, not started yet, whose singleton behaves `how`.
fn manager(
    store: &InMemoryStore,
    owner: &str,
    revision: &str,
    started_ms: u64,
    policy: HandoverPolicy,
    log: &Log,
    how: Behaviour,
) -> ClusterSingletonManager<Probe, InMemoryLease> {
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
        how,
        stop_asked: false,
    })
    .candidacy(candidate, move |s| Ok::<_, Infallible>(store.lease(s)))
    .unwrap()
    .handover(policy)
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

/// Issue 39 item 3: an old replica restarted in the middle of a rollout inherits its revision's
/// age from the old replicas it saw live when it published its candidacy, so once the older
/// ones have left, the old revision does not look newer than the new one: leadership changes
/// once (o1 → n1) and stays on the new revision (it went o1 → n1 → o2 before).
#[test]
fn an_old_replica_restarted_mid_rollout_does_not_take_leadership_back() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let policy = HandoverPolicy::NewestRevision;
        let o1 = node(&store, "o1", "v1", 1, policy.clone(), &log);
        assert_eq!(wait_for_leader(&log, TTL).await, "o1");
        let o2 = node(&store, "o2", "v1", 2, policy.clone(), &log);
        settle().await;
        let before = starts(&log);
        let _n1 = node(&store, "n1", "v2", 10, policy.clone(), &log);
        settle().await;
        assert_eq!(running(&log).as_deref(), Some("n1"), "o1 handed over");
        // o2 restarts (a crash loop, an eviction): the same revision, a later start.
        assert!(o2.send(Shutdown).await.unwrap().is_ok());
        let _o2 = node(&store, "o2-restarted", "v1", 20, policy.clone(), &log);
        settle().await;
        // The rollout goes on: o1 leaves; only the restarted old replica is left of v1.
        assert!(o1.send(Shutdown).await.unwrap().is_ok());
        settle().await;
        sleep(TTL).await;
        assert_eq!(running(&log).as_deref(), Some("n1"), "{log:?}");
        assert_eq!(starts(&log) - before, 1, "one change: {log:?}");
    });
}

/// Issue 39 item 2: a newest candidate whose singleton keeps failing gives up, withdraws its
/// candidacy for the give-up pause, and an older node runs the singleton meanwhile (it deferred
/// to the failing node for good before).
#[test]
fn a_newest_candidate_that_cannot_run_the_singleton_lets_an_older_node_run_it() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let policy = HandoverPolicy::NewestRevision;
        let _o1 = node(&store, "o1", "v1", 1, policy.clone(), &log);
        assert_eq!(wait_for_leader(&log, TTL).await, "o1");
        let pause = Duration::from_secs(30);
        let _canary = manager(
            &store,
            "n1",
            "v2",
            10,
            policy.clone(),
            &log,
            Behaviour::Fails,
        )
        .settings(actix_coordination::SingletonSettings {
            give_up_pause: pause,
            ..Default::default()
        })
        .start();
        // The canary gets the lease (o1 hands over), fails 1 + max_restarts times, gives up.
        let deadline = Instant::now() + TTL;
        while !log.borrow().iter().any(|(o, s)| o == "n1" && *s) {
            assert!(Instant::now() < deadline, "o1 never handed over: {log:?}");
            sleep(Duration::from_millis(5)).await;
        }
        let gave_up = Instant::now();
        assert_eq!(
            wait_for_leader_other_than(&log, "n1", pause).await,
            "o1",
            "{log:?}"
        );
        let took = gave_up.elapsed();
        assert!(took < Duration::from_secs(1), "o1 waited {took:?}: {log:?}");
        // And keeps it for the rest of the pause.
        sleep(pause / 2).await;
        assert_eq!(running(&log).as_deref(), Some("o1"), "{log:?}");
    });
}

/// Issue 39 item 4: a transfer to a node that is no live candidate, or that a live candidate
/// outranks under the policy (it would defer, and nobody would lead for a TTL), is refused with
/// `InvalidTransferTarget`, and nothing changes; a transfer to an equal of the best works.
#[test]
fn a_transfer_the_policy_would_undo_is_refused_and_changes_nothing() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let policy = HandoverPolicy::NewestRevision;
        let n1 = node(&store, "n1", "v2", 10, policy.clone(), &log);
        assert_eq!(wait_for_leader(&log, TTL).await, "n1");
        let _o1 = node(&store, "o1", "v1", 1, policy.clone(), &log);
        let _n2 = node(&store, "n2", "v2", 11, policy.clone(), &log);
        settle().await;
        for target in ["o1", "ghost"] {
            let answer = n1.send(TransferLeadership::to(target)).await.unwrap();
            assert!(
                matches!(
                    answer,
                    Err(actix_coordination::LeaseError::InvalidTransferTarget { .. })
                ),
                "to {target}: {answer:?}"
            );
        }
        settle().await;
        assert_eq!(running(&log).as_deref(), Some("n1"), "{log:?}");
        assert_eq!(starts(&log), 1, "nothing changed: {log:?}");
        assert!(matches!(
            n1.send(TransferLeadership::to("n2")).await.unwrap(),
            Ok(true)
        ));
        assert_eq!(wait_for_leader_other_than(&log, "n1", TTL).await, "n2");
    });
}

/// Issue 39 item 5: a `Shutdown` that overtakes a pending transfer hands the lease to the
/// transfer's target, so the transfer's `Ok(true)` is true (it was a plain release, taken by
/// whoever claimed first).
#[test]
fn a_shutdown_that_overtakes_a_transfer_hands_over_to_its_target() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let policy = HandoverPolicy::NewestRevision;
        // a's singleton takes a while to stop: the shutdown comes before the transfer's release.
        let slow_stop = Behaviour::SlowStop(Duration::from_millis(300));
        let a = manager(&store, "a", "v1", 1, policy.clone(), &log, slow_stop).start();
        assert_eq!(wait_for_leader(&log, TTL).await, "a");
        let _b = node(&store, "b", "v1", 2, policy.clone(), &log);
        let _c = node(&store, "c", "v1", 3, policy.clone(), &log);
        settle().await;
        // c is slow to answer: after a plain release, b would take the lease first.
        let slow = actix_coordination::InMemoryFault::Delay(Duration::from_millis(100));
        store.set_owner_fault("c", Some(slow));
        let transfer = a.send(TransferLeadership::to("c"));
        let shutdown = a.send(Shutdown);
        let (transfer, shutdown) = futures_util::future::join(transfer, shutdown).await;
        assert!(shutdown.unwrap().is_ok());
        assert!(matches!(transfer.unwrap(), Ok(true)));
        assert_eq!(wait_for_leader(&log, TTL).await, "c", "{log:?}");
        sleep(TTL).await;
        assert_eq!(running(&log).as_deref(), Some("c"), "{log:?}");
    });
}

/// Issue 39 item 9: a leader on its way out does not wait for its candidacy's withdrawal before
/// it releases: with every call of the leaving node taking `delay`, its successor leads after
/// one delay, not two.
#[test]
fn a_leaving_leader_releases_without_waiting_for_its_withdrawal() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let policy = HandoverPolicy::NewestRevision;
        let a = node(&store, "a", "v1", 1, policy.clone(), &log);
        assert_eq!(wait_for_leader(&log, TTL).await, "a");
        let _b = node(&store, "b", "v1", 2, policy.clone(), &log);
        settle().await;
        let delay = Duration::from_millis(500);
        store.set_owner_fault("a", Some(actix_coordination::InMemoryFault::Delay(delay)));
        let asked = Instant::now();
        let shutdown = a.send(Shutdown);
        assert_eq!(wait_for_leader_other_than(&log, "a", TTL).await, "b");
        let took = asked.elapsed();
        assert!(took < delay * 3 / 2, "b led {took:?} after the SIGTERM");
        assert!(shutdown.await.unwrap().is_ok());
        assert!(
            store.holder("singleton-candidate-a").is_none(),
            "a withdrew"
        );
    });
}

/// Issue 39 item 1: with a candidacy, readiness waits until the candidacy is published (a
/// Deployment then stops the next old replica only once this one is a candidate the leader can
/// hand over to).
#[test]
fn readiness_waits_until_the_candidacy_is_published() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let policy = HandoverPolicy::NewestRevision;
        let _o1 = node(&store, "o1", "v1", 1, policy.clone(), &log);
        assert_eq!(wait_for_leader(&log, TTL).await, "o1");
        let check = actix_coordination::HealthCheck::new();
        store.partition("n1"); // its candidacy cannot be published yet
        let n1 = manager(
            &store,
            "n1",
            "v2",
            10,
            policy.clone(),
            &log,
            Behaviour::Normal,
        )
        .health(&check);
        let mut status = n1.candidacy_status().expect("a candidacy");
        let n1 = n1.start();
        sleep(TTL).await;
        assert!(check.readiness().is_err(), "ready without a candidacy");
        assert!(!status.is_published());
        store.heal("n1");
        let healed = Instant::now();
        assert!(status.published().await);
        assert!(
            healed.elapsed() < TTL,
            "published {:?} after",
            healed.elapsed()
        );
        assert!(
            store.holder("singleton-candidate-n1").is_some(),
            "published: held"
        );
        assert_eq!(check.readiness(), Ok(()), "ready once published");
        // Withdrawn on the way out.
        let shutdown = n1.send(Shutdown);
        assert_eq!(status.changed().await, Some(false));
        assert!(shutdown.await.unwrap().is_ok());
    });
}

/// Issue 39 item 5: when the transfer's target left before the shutdown that overtook the
/// transfer released the lease, the release does not name it (it would leave the lease unrun for
/// a TTL), and the transfer answers `Superseded`, not `Ok(true)`.
#[test]
fn a_transfer_overtaken_by_a_shutdown_after_its_target_left_answers_superseded() {
    run_paused(async {
        let store = InMemoryStore::new();
        let log = Log::default();
        let policy = HandoverPolicy::NewestRevision;
        let slow_stop = Behaviour::SlowStop(Duration::from_millis(300));
        let a = manager(&store, "a", "v1", 1, policy.clone(), &log, slow_stop).start();
        assert_eq!(wait_for_leader(&log, TTL).await, "a");
        let _b = node(&store, "b", "v1", 2, policy.clone(), &log);
        let c = node(&store, "c", "v1", 3, policy.clone(), &log);
        settle().await;
        let transfer = a.send(TransferLeadership::to("c"));
        sleep(Duration::from_millis(10)).await;
        assert!(c.send(Shutdown).await.unwrap().is_ok()); // c leaves: it withdraws
        sleep(Duration::from_millis(10)).await;
        let shutdown = a.send(Shutdown);
        let (transfer, shutdown) = futures_util::future::join(transfer, shutdown).await;
        assert!(matches!(shutdown.unwrap(), Ok(true)));
        let answer = transfer.unwrap();
        assert!(
            matches!(
                answer,
                Err(actix_coordination::LeaseError::Superseded { .. })
            ),
            "{answer:?}"
        );
        let took = Instant::now();
        assert_eq!(wait_for_leader_other_than(&log, "a", TTL).await, "b");
        assert!(took.elapsed() < Duration::from_millis(100), "b at once");
    });
}
