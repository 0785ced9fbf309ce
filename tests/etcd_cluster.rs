//! The etcd backend against a real three-member etcd cluster, with members killed (SIGKILL),
//! stopped (SIGSTOP: a member cut off from everyone) and restarted.
//!
//! Needs `ACTIX_COORD_TEST_ETCD_CLUSTER_ENDPOINTS` and `ACTIX_COORD_TEST_ETCD_CLUSTER_DIR`, which
//! `scripts/test-cluster.sh` provides. The tests share the one cluster and run one at a time
//! ([`Cluster::exclusive`]); each leaves it whole, also when it fails. Every test uses its own key
//! prefix. Waits are on events (renewal counters, `on_lost`, an elected leader) with deadlines;
//! orders of events are asserted, never how long something took.

mod common;

use std::future::Future;
use std::time::Duration;

use actix_coordination::{
    EtcdLease, EtcdSession, FencingToken, Lease, LeaseError, LeaseSettings, LostReason,
};
use common::contract::{next_renewal, LostProbe};
use common::etcd::unique_prefix;
use common::etcd_cluster::{Cluster, MEMBERS};
use tokio::time::{sleep, Instant};

/// The TTL of every lease here: etcd's election takes 1–2 s, well within it.
const TTL: Duration = Duration::from_secs(6);

/// Extra time to wait for an event beyond the instant it is due (etcd revokes expired leases
/// every 500 ms, a new leader extends every lease by its TTL, and the machine is loaded).
const SLACK: Duration = Duration::from_secs(10);

/// How long the cluster may take to answer again after a fault ends (an election, a member
/// catching up).
const LEADER_RECOVERY: Duration = Duration::from_secs(30);

/// Every member.
const ALL: [usize; MEMBERS] = [0, 1, 2];

fn settings(name: &str, owner: &str) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(TTL)
        .acquire_retries(0)
        .build()
        .unwrap()
}

/// Polls `condition` every 20 ms until it holds; panics with `what` after `within`.
async fn eventually(within: Duration, what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let give_up = Instant::now() + within;
    while !condition().await {
        assert!(Instant::now() < give_up, "{what} (waited {within:?})");
        sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `scenario` while checking every 10 ms that `lease` is alive all along.
async fn while_alive<T>(lease: &EtcdLease, what: &str, scenario: impl Future<Output = T>) -> T {
    let watch = async {
        loop {
            assert!(
                lease.check_alive(),
                "{what}: {} lost {} (stats {:?})",
                lease.owner(),
                lease.name(),
                lease.stats()
            );
            sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        biased;
        out = scenario => out,
        never = watch => never,
    }
}

/// Acquires until `Ok(true)`, retrying on errors (a member that just died, an election) and, if
/// `until_free`, on `Ok(false)` too; panics after `within`. Returns the token.
async fn acquire_retrying(lease: &EtcdLease, within: Duration, until_free: bool) -> FencingToken {
    let give_up = Instant::now() + within;
    let mut results: Vec<Result<bool, String>> = Vec::new();
    loop {
        let result = lease.acquire().await;
        if let Ok(true) = result {
            if !results.is_empty() {
                println!(
                    "{} acquired {} after {} failed or refused attempts: {results:?}",
                    lease.owner(),
                    lease.name(),
                    results.len()
                );
            }
            return lease.fencing_token().expect("held");
        }
        assert!(
            until_free || !matches!(result, Ok(false)),
            "{} found {} held by another owner; earlier results: {results:?}",
            lease.owner(),
            lease.name()
        );
        results.push(result.map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e))));
        assert!(
            Instant::now() < give_up,
            "{} never acquired {} within {within:?}: {results:?}",
            lease.owner(),
            lease.name()
        );
        sleep(Duration::from_millis(100)).await;
    }
}

/// The answer of `lease.acquire()`, retried on errors (a member that was just restarted or
/// continued may still be catching up) until `within`.
async fn acquire_answer(lease: &EtcdLease, within: Duration) -> bool {
    let give_up = Instant::now() + within;
    loop {
        match lease.acquire().await {
            Ok(got) => return got,
            Err(e) => {
                assert!(
                    Instant::now() < give_up,
                    "{}'s acquire of {} still failing after {within:?}: {e}",
                    lease.owner(),
                    lease.name()
                );
                println!("{}'s acquire of {}: {e}", lease.owner(), lease.name());
            }
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// The value and mod revision of `key`, read through member `m`.
async fn read_key(cluster: &Cluster, m: usize, key: &str) -> Option<(String, u64)> {
    let mut client = cluster.client(m).await;
    let got = client.get(key, None).await.expect("read the key");
    got.kvs().first().map(|kv| {
        (
            String::from_utf8_lossy(kv.value()).into_owned(),
            kv.mod_revision() as u64,
        )
    })
}

/// A lease held through a session given all three endpoints survives the SIGKILL of member
/// `victim`: never lost, alive all along, renewed at least twice after the fault (after the
/// election when the victim led), same tenure; once the member is back a contender using only it
/// is refused.
async fn a_held_lease_survives_the_kill_of(cluster: &Cluster, victim: usize, test: &str) {
    let prefix = unique_prefix(test);
    let session = EtcdSession::connect(cluster.settings(&ALL, &prefix))
        .await
        .unwrap();
    let a = session.lease(settings("held", "a"));
    let mut probe = LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    let token = a.fencing_token().unwrap();
    next_renewal(&a, TTL).await;
    let was_leader = cluster.leader().await == victim;

    let renewals_after = while_alive(&a, "across the kill", async {
        cluster.kill(victim).await;
        if was_leader {
            cluster.new_leader(victim).await;
        } else {
            cluster.leader().await;
        }
        let after = a.stats().renewals;
        eventually(
            TTL * 3,
            "two renewals after the kill (and election)",
            async || a.stats().renewals >= after + 2,
        )
        .await;
        a.stats().renewals - after
    })
    .await;
    assert!(renewals_after >= 2);
    assert!(a.check_alive());
    assert_eq!(a.fencing_token(), Some(token), "the same tenure");
    if let Some((_, lost)) = probe.try_next() {
        panic!("on_lost fired: {lost}");
    }
    let survivor = (victim + 1) % MEMBERS;
    assert_eq!(
        read_key(cluster, survivor, &format!("{prefix}held")).await,
        Some(("a".to_owned(), token.value())),
        "the key is still a's claim"
    );
    println!(
        "{test}: killed n{} (leader: {was_leader}); stats {:?}",
        victim + 1,
        a.stats()
    );

    cluster.restart(victim).await;
    let other = EtcdSession::new(cluster.settings(&[victim], &prefix));
    let b = other.lease(settings("held", "b"));
    assert!(
        !acquire_answer(&b, LEADER_RECOVERY).await,
        "b got a lease a holds"
    );
    assert!(a.check_alive());
    assert_eq!(a.fencing_token(), Some(token));
    release_at_the_end(&a, test).await;
}

/// Releases `lease` at the end of a test, with a member dead or just restarted: the client may
/// route the request to that member first (connection refused, or the stale error of its failed
/// reconnection); the backend retries an unavailable cluster within the operation timeout, so the
/// release succeeds.
async fn release_at_the_end(lease: &EtcdLease, test: &str) {
    match lease.release().await {
        Ok(released) => assert!(released, "{test}: another owner holds {}", lease.name()),
        Err(e) => panic!(
            "{test}: release of {} failed: {e}: {:?}",
            lease.name(),
            std::error::Error::source(&e)
        ),
    }
}

/// (a) SIGKILL of the leader: the lease is kept across the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_a_held_lease() {
    let cluster = Cluster::exclusive().await;
    let leader = cluster.leader().await;
    a_held_lease_survives_the_kill_of(&cluster, leader, "leader-kill").await;
}

/// (b) SIGKILL of a member that does not lead: the lease is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_follower_keeps_a_held_lease() {
    let cluster = Cluster::exclusive().await;
    let follower = cluster.follower().await;
    a_held_lease_survives_the_kill_of(&cluster, follower, "follower-kill").await;
}

/// (c) Holder a talks to one member only, and that member (the leader) is cut off from everyone
/// (SIGSTOP): contender b, talking to the two others, gets the lease only after a was told it lost
/// it, and a never holds it again; once the member is back, a knows it lost the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_never_lets_two_owners_hold() {
    let cluster = Cluster::exclusive().await;
    let cut = cluster.leader().await;
    let others: Vec<usize> = ALL.into_iter().filter(|m| *m != cut).collect();
    let prefix = unique_prefix("cut-off");
    let session_a = EtcdSession::connect(cluster.settings(&[cut], &prefix))
        .await
        .unwrap();
    let session_b = EtcdSession::connect(cluster.settings(&others, &prefix))
        .await
        .unwrap();
    let a = session_a.lease(settings("cut", "a"));
    let b = session_b.lease(settings("cut", "b"));
    let mut probe = LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    let token_a = a.fencing_token().unwrap();
    next_renewal(&a, TTL).await;
    assert!(!b.acquire().await.unwrap(), "a holds it");

    cluster.stop(cut).await;
    let stopped_at = Instant::now();
    assert!(a.check_alive(), "still held right after the stop");
    let deadline = a.deadline().unwrap();
    // b tries all along; each attempt: (start after the stop, result, a alive when it returned).
    let mut attempts = Vec::new();
    let (won_at, a_alive_at_win) = loop {
        let start = Instant::now();
        let result = b.acquire().await;
        let (end, a_alive) = (Instant::now(), a.check_alive());
        let won = matches!(result, Ok(true));
        attempts.push((
            start - stopped_at,
            result.map_err(|e| e.to_string()),
            a_alive,
        ));
        if won {
            break (end, a_alive);
        }
        assert!(
            end < stopped_at + TTL * 2 + SLACK,
            "b never got the lease: {attempts:?}"
        );
        sleep(Duration::from_millis(50)).await;
    };
    let (lost_at, lost) = probe
        .try_next()
        .unwrap_or_else(|| panic!("b acquired, but a was never told it lost: {attempts:?}"));
    assert!(
        lost_at <= won_at,
        "a was told {:?} after b's acquire returned Ok(true): {attempts:?}",
        lost_at - won_at
    );
    assert!(!a_alive_at_win, "a alive when b won: {attempts:?}");
    assert!(lost_at >= deadline, "a was told before its deadline");
    assert!(matches!(lost.reason, LostReason::Expired { .. }), "{lost}");
    let token_b = b.fencing_token().unwrap();
    assert!(token_b > token_a);
    println!("cut-off: b's attempts after the stop: {attempts:?}");

    cluster.cont(cut).await;
    cluster.wait_whole().await;
    // a's member is back (and caught up): a does not believe it holds the lease, and b does.
    assert!(!a.check_alive(), "a believes it holds the lease again");
    assert_eq!(a.fencing_token(), None);
    assert!(
        !acquire_answer(&a, LEADER_RECOVERY).await,
        "a got the lease b holds"
    );
    assert!(b.check_alive());
    assert_eq!(b.fencing_token(), Some(token_b));
    assert_eq!(
        read_key(&cluster, cut, &format!("{prefix}cut")).await,
        Some(("b".to_owned(), token_b.value()))
    );
    // One loss, one notification (checked for a bounded time).
    probe.none(Duration::from_millis(200)).await;
    assert!(b.release().await.unwrap());
}

/// (d) Two members stopped (no quorum): an acquire fails (never `Ok(false)`: nobody can say the
/// lease is held), the holder is told at its deadline; once the quorum is back the leases are
/// acquirable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_quorum_fails_acquire_and_expires_the_holder() {
    let cluster = Cluster::exclusive().await;
    let leader = cluster.leader().await;
    // The two followers: the leader is left alone, without a quorum.
    let stopped = [(leader + 1) % MEMBERS, (leader + 2) % MEMBERS];
    let prefix = unique_prefix("quorum");
    let session_h = EtcdSession::connect(cluster.settings(&ALL, &prefix))
        .await
        .unwrap();
    let session_c = EtcdSession::connect(cluster.settings(&ALL, &prefix))
        .await
        .unwrap();
    let h = session_h.lease(settings("held", "h"));
    let mut probe = LostProbe::new(&h);
    assert!(h.acquire().await.unwrap());
    let token_h = h.fencing_token().unwrap();
    next_renewal(&h, TTL).await;
    // Short operation timeout: each attempt without a quorum ends after one second.
    let c_other = session_c.lease(
        settings("other", "c")
            .to_builder()
            .operation_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
    );

    for m in stopped {
        cluster.stop(m).await;
    }
    assert!(h.check_alive(), "still held right after the stop");
    let deadline = h.deadline().unwrap();
    let mut errors = Vec::new();
    for attempt in 0..3 {
        match c_other.acquire().await {
            Err(e) => errors.push(e),
            Ok(got) => panic!(
                "attempt {attempt}: acquire without a quorum answered Ok({got}); errors before: \
                 {errors:?}"
            ),
        }
    }
    assert!(!c_other.check_alive());
    let (lost_at, lost) = probe.next(TTL + SLACK).await;
    assert!(
        lost_at >= deadline,
        "the holder was told {:?} before its deadline",
        deadline - lost_at
    );
    assert!(matches!(lost.reason, LostReason::Expired { .. }), "{lost}");
    assert!(!h.check_alive());
    println!(
        "lost quorum: acquire errors {:?}; holder told: {lost}",
        errors.iter().map(LeaseError::to_string).collect::<Vec<_>>()
    );

    for m in stopped {
        cluster.cont(m).await;
    }
    // A free name: errors until the cluster answers again, then Ok(true), never Ok(false).
    acquire_retrying(&c_other, LEADER_RECOVERY, false).await;
    // The name h held: free once h's claim is gone (released by h's session or expired; a new
    // leader extends every etcd lease by its TTL first).
    let c_held = session_c.lease(settings("held", "c"));
    let token_c = acquire_retrying(&c_held, TTL * 3 + SLACK, true).await;
    assert!(token_c > token_h);
    assert!(!h.check_alive());
    probe.none(Duration::from_millis(200)).await;
    assert!(c_held.release().await.unwrap());
    assert!(c_other.release().await.unwrap());
}

/// (e) Fencing tokens strictly increase across leader changes: acquire and release, kill the
/// leader, wait for the new one, acquire again; twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_rise_across_leader_changes() {
    let cluster = Cluster::exclusive().await;
    let prefix = unique_prefix("tokens");
    let session = EtcdSession::connect(cluster.settings(&ALL, &prefix))
        .await
        .unwrap();
    let lease = session.lease(settings("tokens", "a"));
    let mut last = acquire_retrying(&lease, LEADER_RECOVERY, false).await;
    let mut tokens = vec![last];
    assert!(lease.release().await.unwrap());
    for round in 0..2 {
        let leader = cluster.leader().await;
        cluster.kill(leader).await;
        let new_leader = cluster.new_leader(leader).await;
        let token = acquire_retrying(&lease, LEADER_RECOVERY, false).await;
        assert!(
            token > last,
            "round {round}: token {token} after {last} (leader n{} -> n{})",
            leader + 1,
            new_leader + 1
        );
        tokens.push(token);
        last = token;
        release_at_the_end(&lease, &format!("tokens round {round}")).await;
        cluster.restart(leader).await;
    }
    println!("tokens across leader changes: {tokens:?}");
}
