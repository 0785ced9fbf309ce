//! The lease contract suite and the etcd specifics, against a real etcd.
//!
//! Needs `ACTIX_COORD_TEST_ETCD_ENDPOINT` (the shared test etcd) and `ACTIX_COORD_TEST_ETCD_BIN`
//! (to start private etcd processes that tests freeze, kill and restart); `scripts/test-cluster.sh`
//! provides both. Every test uses its own key prefix.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_coordination::{
    AcquireAttempt, BackendError, CoordinationConfig, EtcdBackend, EtcdError, EtcdLease,
    EtcdSession, EtcdSettings, FencingToken, Lease, LeaseBackend, LeaseProvider, LeaseSettings,
    LostReason, ReleaseOutcome,
};
use common::contract::{next_renewal, LostProbe};
use common::etcd::{
    admin_client, endpoint, etcd_settings, unique_prefix, EtcdFixture, EtcdProcess,
};
use common::proxy::{FaultProxy, ProxyMode};
use futures_util::future::join_all;
use tokio::time::{sleep, sleep_until, timeout, Instant};

contract_suite!(
    fixture = EtcdFixture::new(),
    test = #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
);

actor_suite!(fixture = EtcdFixture::new(), run = common::run_real);

fn settings(name: &str, owner: &str, ttl: Duration) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(ttl)
        .build()
        .unwrap()
}

/// Acquires until it succeeds; returns when the successful call finished.
async fn acquire_within(lease: &impl Lease, within: Duration) -> Instant {
    let give_up = Instant::now() + within;
    loop {
        if let Ok(true) = lease.acquire().await {
            return Instant::now();
        }
        assert!(
            Instant::now() < give_up,
            "{} never acquired {} within {within:?}",
            lease.owner(),
            lease.name()
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `condition` every 20 ms until it holds; panics with `what` after `within`.
async fn eventually(within: Duration, what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let give_up = Instant::now() + within;
    while !condition().await {
        assert!(Instant::now() < give_up, "{what} (waited {within:?})");
        sleep(Duration::from_millis(20)).await;
    }
}

/// The key is `<prefix><name>`, its value the owner, its etcd lease the session's shared one and
/// its revision the fencing token; release deletes it and revokes the unused etcd lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_layout_value_token_and_cleanup() {
    let endpoint = endpoint();
    let prefix = unique_prefix("layout");
    let session = EtcdSession::connect(etcd_settings(&endpoint, &prefix))
        .await
        .unwrap();
    let mut admin = admin_client(&endpoint).await;
    let name = "jobs/billing singleton";
    let lease = session.lease(settings(name, "node-1", Duration::from_secs(6)));
    assert!(lease.acquire().await.unwrap());
    let token = lease.fencing_token().unwrap();
    let key = format!("{prefix}{name}");
    let got = admin.get(key.as_str(), None).await.unwrap();
    let kv = got.kvs().first().expect("the key exists while held");
    assert_eq!(kv.value(), b"node-1");
    assert_eq!(FencingToken::new(kv.mod_revision() as u64), token);
    assert_eq!(
        kv.create_revision(),
        kv.mod_revision(),
        "a fresh claim creates the key"
    );
    let ids = session.shared_lease_ids().await;
    assert_eq!(
        ids,
        vec![kv.lease()],
        "attached to the session's shared etcd lease"
    );
    let etcd_lease = kv.lease();
    let ttl = admin.lease_time_to_live(etcd_lease, None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 6);

    assert!(lease.release().await.unwrap());
    assert!(admin
        .get(key.as_str(), None)
        .await
        .unwrap()
        .kvs()
        .is_empty());
    // Unused now: revoked after lingering one renewal interval (2 s).
    eventually(
        Duration::from_secs(8),
        "the unused etcd lease is revoked",
        async || {
            admin
                .lease_time_to_live(etcd_lease, None)
                .await
                .map(|r| r.ttl() == -1)
                .unwrap_or(false)
        },
    )
    .await;
    assert!(session.shared_lease_ids().await.is_empty());
}

/// Another client overwriting or deleting the key takes the lease away through the watch at
/// once: while the watch works an etcd renewal only asks for a keep-alive and reads nothing (a
/// renewal reads the key only while the watch is down, and would find the change at its next
/// interval at the earliest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_and_deletion_are_reported_at_once() {
    let endpoint = endpoint();
    let prefix = unique_prefix("watch");
    let session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let mut admin = admin_client(&endpoint).await;
    let ttl = Duration::from_secs(10);
    let a = session.lease(settings("watched", "a", ttl));
    let mut probe = LostProbe::new(&a);

    assert!(a.acquire().await.unwrap());
    let token = a.fencing_token().unwrap();
    admin
        .put(format!("{prefix}watched"), "intruder", None)
        .await
        .unwrap();
    let (_, lost) = probe.next(ttl).await;
    assert_eq!(
        lost.reason,
        LostReason::TakenOver {
            holder: Some("intruder".into())
        }
    );
    assert_eq!(lost.fencing_token, Some(token));
    assert!(!a.check_alive());
    assert!(!a.acquire().await.unwrap(), "the intruder holds it");
    // Once per loss (checked for a bounded time).
    probe.none(Duration::from_millis(500)).await;

    admin
        .delete(format!("{prefix}watched"), None)
        .await
        .unwrap();
    assert!(a.acquire().await.unwrap());
    admin
        .delete(format!("{prefix}watched"), None)
        .await
        .unwrap();
    let (_, lost) = probe.next(ttl).await;
    assert_eq!(lost.reason, LostReason::Deleted);
    assert!(!a.check_alive());
}

/// A contender waiting with retries is woken by the release through its watch: it gets the lease
/// long before its retry delay (a minute) would have let it try again, with one read that found
/// the lease held before (no claim: a contender without an etcd lease reads first) and one claim
/// after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_contender_is_woken_by_the_release() {
    const RETRY_DELAY: Duration = Duration::from_secs(60);
    let endpoint = endpoint();
    let prefix = unique_prefix("wake");
    let session_a = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let session_b = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let ttl = Duration::from_secs(10);
    let a = session_a.lease(settings("wake", "a", ttl));
    let b = session_b.lease(
        LeaseSettings::builder("wake", "b")
            .ttl(ttl)
            .acquire_retries(3)
            .acquire_retry_delay(RETRY_DELAY)
            .build()
            .unwrap(),
    );
    assert!(a.acquire().await.unwrap());
    let (got, released) = timeout(
        RETRY_DELAY / 2,
        futures_util::future::join(b.acquire(), async {
            // Release once b was refused (it then waits on its watch, not on its retry delay).
            let b = b.backend();
            eventually(
                Duration::from_secs(5),
                "b tried and found the lease held",
                async || b.seen_held() >= 1,
            )
            .await;
            a.release().await
        }),
    )
    .await
    .expect("b was woken by the release, not by its retry delay");
    assert!(released.unwrap());
    assert_eq!(
        (
            b.backend().seen_held(),
            b.backend().claims_sent(),
            b.backend().claims_refused()
        ),
        (1, 1, 0),
        "found it held once, then the one claim after the release: no polling"
    );
    assert!(got.unwrap(), "b gets the released lease");
    assert!(b.release().await.unwrap());
}

/// A waiting contender watches its key from "now", not from the revision it saw the key held at
/// (etcd delivers a watch that starts in the past only when its catch-up loop next runs, every
/// 100 ms, once anything was written since: a planned move of 16 shards waited 95 ms per shard).
/// A release between the contender's attempt and its watch's start, with the store written again
/// after it, is found by the one read the wait then makes: the wait ends at once, not at its
/// deadline nor after the retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_before_the_waiters_watch_starts_is_not_missed() {
    let endpoint = endpoint();
    let prefix = unique_prefix("wake-gap");
    let mut admin = admin_client(&endpoint).await;
    let session_a = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let session_b = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let sa = settings("gap", "a", Duration::from_secs(10));
    let sb = LeaseSettings::builder("gap", "b")
        .ttl(Duration::from_secs(10))
        .acquire_retry_delay(Duration::from_secs(60))
        .build()
        .unwrap();
    let a = EtcdBackend::new(&session_a, "gap");
    let b = EtcdBackend::new(&session_b, "gap");
    let AcquireAttempt::Acquired { tenure, .. } = a.try_acquire(&sa).await.unwrap() else {
        panic!("a fresh key is free")
    };
    assert!(matches!(
        b.try_acquire(&sb).await.unwrap(),
        AcquireAttempt::HeldByOther { .. }
    ));
    // Released, and the store written after it, before b starts waiting.
    assert_eq!(
        a.release(&sa, tenure).await.unwrap(),
        ReleaseOutcome::Released
    );
    admin
        .put(format!("{prefix}unrelated"), "x", None)
        .await
        .unwrap();
    timeout(
        Duration::from_secs(30),
        b.wait_for_change(&sb, Instant::now() + Duration::from_secs(300)),
    )
    .await
    .expect("the wait ended on the release that came before it, not at its deadline");
    assert!(matches!(
        b.try_acquire(&sb).await.unwrap(),
        AcquireAttempt::Acquired { .. }
    ));
}

/// Two clients race for one lease 100 times: one winner each round, the key says so, tokens grow.
/// The backends' counters show that each round was decided by etcd: the loser too sent its
/// claiming transaction, and etcd refused it (its compare found the winner's key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_race_for_100_rounds() {
    let endpoint = endpoint();
    let prefix = unique_prefix("race");
    let mut admin = admin_client(&endpoint).await;
    let sessions = [
        EtcdSession::new(etcd_settings(&endpoint, &prefix)),
        EtcdSession::new(etcd_settings(&endpoint, &prefix)),
    ];
    let leases: Vec<EtcdLease> = ["x", "y"]
        .iter()
        .zip(&sessions)
        .map(|(owner, session)| {
            session.lease(
                LeaseSettings::builder("race", *owner)
                    .ttl(Duration::from_secs(6))
                    .acquire_retries(0)
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let mut last: Option<FencingToken> = None;
    let mut wins = [0usize; 2];
    for round in 0..100 {
        let before: Vec<(u64, u64)> = leases
            .iter()
            .map(|l| (l.backend().claims_sent(), l.backend().claims_refused()))
            .collect();
        let results = join_all(leases.iter().map(|l| l.acquire())).await;
        let winners: Vec<usize> = (0..2).filter(|i| matches!(results[*i], Ok(true))).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let (w, l) = (winners[0], 1 - winners[0]);
        assert!(
            matches!(results[l], Ok(false)),
            "round {round}: {results:?}"
        );
        assert!(leases[w].check_alive() && !leases[l].check_alive());
        let spent = |i: usize| {
            let b = leases[i].backend();
            (
                b.claims_sent() - before[i].0,
                b.claims_refused() - before[i].1,
            )
        };
        assert_eq!(spent(w), (1, 0), "round {round}: the winner's one claim");
        assert_eq!(
            spent(l),
            (1, 1),
            "round {round}: the loser sent its claim too, and etcd refused it"
        );
        wins[w] += 1;
        let token = leases[w].fencing_token().unwrap();
        assert!(Some(token) > last, "round {round}: {token} after {last:?}");
        last = Some(token);
        if round % 10 == 0 {
            let got = admin.get(format!("{prefix}race"), None).await.unwrap();
            let kv = got.kvs().first().expect("held");
            assert_eq!(kv.value(), leases[w].owner().as_bytes(), "round {round}");
            assert_eq!(kv.mod_revision() as u64, token.value(), "round {round}");
        }
        assert!(leases[w].release().await.unwrap(), "round {round}");
    }
    println!("wins: {wins:?}");
}

/// 200 leases with one TTL in one session share ONE etcd lease (one keep-alive), stay held across
/// renewals, and all lose, each exactly once, when that etcd lease is revoked by someone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_shares_one_etcd_lease_and_loses_all_leases_with_it() {
    const N: usize = 200;
    let endpoint = endpoint();
    let prefix = unique_prefix("shared");
    let mut admin = admin_client(&endpoint).await;
    let session = EtcdSession::connect(etcd_settings(&endpoint, &prefix))
        .await
        .unwrap();
    let ttl = Duration::from_secs(6);
    let leases: Vec<EtcdLease> = (0..N)
        .map(|i| {
            session.lease(
                LeaseSettings::builder(format!("shard-{i}"), "node-1")
                    .ttl(ttl)
                    .operation_timeout(Duration::from_millis(1900))
                    .acquire_retries(5)
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let counts: Arc<Vec<AtomicUsize>> = Arc::new((0..N).map(|_| AtomicUsize::new(0)).collect());
    let reasons = Arc::new(std::sync::Mutex::new(Vec::new()));
    let _subs: Vec<_> = leases
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let (counts, reasons) = (Arc::clone(&counts), Arc::clone(&reasons));
            l.on_lost(move |lost| {
                counts[i].fetch_add(1, Ordering::SeqCst);
                reasons.lock().unwrap().push(lost.reason.clone());
            })
        })
        .collect();

    let results = join_all(leases.iter().map(|l| l.acquire())).await;
    for (i, r) in results.iter().enumerate() {
        assert!(matches!(r, Ok(true)), "lease {i}: {r:?}");
    }
    let ids = session.shared_lease_ids().await;
    assert_eq!(ids.len(), 1, "one etcd lease for one TTL: {ids:?}");
    let shared = ids[0];
    let got = admin
        .get(
            prefix.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(got.kvs().len(), N);
    assert!(
        got.kvs().iter().all(|kv| kv.lease() == shared),
        "every key on the shared etcd lease"
    );

    // Held across more than a TTL of renewals (every lease renews three more times: three
    // intervals, one TTL), all through the one etcd lease, with about one keep-alive per renewal
    // interval for all 200 leases together (not one per lease).
    const MORE: u64 = 3;
    let interval = leases[0].settings().renewal_interval();
    let renewals_before: Vec<u64> = leases.iter().map(|l| l.stats().renewals).collect();
    let (keep_alives_before, counted_from) = (session.keep_alives_sent(), Instant::now());
    let leases2 = &leases;
    eventually(ttl * 3, "every lease renews three more times", async || {
        assert!(leases2.iter().all(|l| l.check_alive()), "all held");
        leases2
            .iter()
            .zip(&renewals_before)
            .all(|(l, before)| l.stats().renewals >= before + MORE)
    })
    .await;
    let keep_alives = session.keep_alives_sent() - keep_alives_before;
    let intervals = counted_from.elapsed().as_secs_f64() / interval.as_secs_f64();
    let renewals: u64 = leases
        .iter()
        .zip(&renewals_before)
        .map(|(l, before)| l.stats().renewals - before)
        .sum();
    println!(
        "{keep_alives} keep-alives for {renewals} renewals of {N} leases in {intervals:.1} \
         renewal intervals"
    );
    assert!(keep_alives >= 1, "the renewals were backed by keep-alives");
    // The session sends one keep-alive per renewal interval on its own clock and renewals never
    // ask for one: at most one per interval (two here, leaving room for retries of a keep-alive
    // that failed on a loaded machine), plus one at the window's edge, however many leases
    // renew. A bound that load can only loosen (a longer window allows more), unlike a lower
    // bound on the count. `tests/etcd_keepalive.rs` counts them on etcd's side, to 1.2.
    let bound = (2.0 * intervals).floor() as u64 + 1;
    assert!(
        keep_alives <= bound,
        "{keep_alives} keep-alives in {intervals:.1} renewal intervals (at most {bound}): one \
         heartbeat per interval for the whole session, not one per lease"
    );
    let attached = admin
        .lease_time_to_live(
            shared,
            Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
        )
        .await
        .unwrap();
    assert_eq!(attached.keys().len(), N);
    assert_eq!(
        session.shared_lease_ids().await,
        vec![shared],
        "still the one etcd lease"
    );
    assert!(counts.iter().all(|c| c.load(Ordering::SeqCst) == 0));

    let revoked_at = Instant::now();
    admin.lease_revoke(shared).await.unwrap();
    let counts2 = Arc::clone(&counts);
    eventually(Duration::from_secs(4), "every lease is told", async || {
        counts2.iter().all(|c| c.load(Ordering::SeqCst) >= 1)
    })
    .await;
    let told_within = revoked_at.elapsed();
    assert!(leases.iter().all(|l| !l.check_alive()));
    // Exactly once, whatever reported it first (the key's deletion or the keep-alive's ttl 0):
    // no second notification within a bounded time after every lease was told.
    sleep(Duration::from_secs(2)).await;
    let fired: Vec<usize> = counts.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    assert!(fired.iter().all(|n| *n == 1), "on_lost counts {fired:?}");
    let reasons = reasons.lock().unwrap();
    assert!(
        reasons
            .iter()
            .all(|r| matches!(r, LostReason::Deleted | LostReason::Expired { .. })),
        "{reasons:?}"
    );
    println!("{N} leases told within {told_within:?}");
}

/// etcd frozen while a lease is held, then killed and restarted once the holder was told of the
/// loss: the holder is told at (not before) its deadline, and a contender that keeps trying from
/// the moment etcd froze gets the lease only in an attempt that started after that, while the
/// holder's `check_alive` is false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stopped_while_holding_tells_the_holder_before_anyone_else_acquires() {
    let mut etcd = EtcdProcess::start("stopped").await;
    let prefix = unique_prefix("stopped");
    let ttl = Duration::from_secs(3);
    let session_a = EtcdSession::new(etcd_settings(&etcd.endpoint(), &prefix));
    let a = session_a.lease(settings("stopped", "a", ttl));
    let mut probe = LostProbe::new(&a);
    let told = Arc::new(tokio::sync::Notify::new());
    let _told = a.on_lost({
        let told = Arc::clone(&told);
        move |_| told.notify_one()
    });
    assert!(a.acquire().await.unwrap());
    let token_a = a.fencing_token().unwrap();
    next_renewal(&a, ttl).await;
    // b is connected before etcd stops, so that each of its attempts reaches the frozen server
    // and is bounded by its operation timeout.
    let session_b = EtcdSession::connect(etcd_settings(&etcd.endpoint(), &prefix))
        .await
        .unwrap();
    let b = session_b.lease(
        LeaseSettings::builder("stopped", "b")
            .ttl(ttl)
            .acquire_retries(0)
            .build()
            .unwrap(),
    );

    etcd.freeze();
    // Nothing answers any more: a's deadline cannot move.
    let deadline = a.deadline().unwrap();
    let frozen_at = Instant::now();
    // b tries all along: (when the attempt started, whether it won).
    let contender = async {
        let mut attempts: Vec<(Instant, bool)> = Vec::new();
        loop {
            let start = Instant::now();
            let won = matches!(b.acquire().await, Ok(true));
            let a_alive = a.check_alive();
            attempts.push((start, won));
            if won {
                return (start, a_alive, attempts);
            }
            assert!(
                start < frozen_at + Duration::from_secs(40),
                "b never got the lease: {attempts:?}"
            );
            sleep(Duration::from_millis(50)).await;
        }
    };
    // etcd comes back once a was told.
    let restarter = async {
        told.notified().await;
        etcd.restart().await;
        Instant::now()
    };
    let ((won_start, a_alive_at_win, attempts), restarted_at) = tokio::join!(contender, restarter);

    let (lost_at, lost) = probe.next(Duration::ZERO).await;
    assert!(lost_at >= deadline, "told before its deadline");
    assert!(matches!(lost.reason, LostReason::Expired { .. }), "{lost}");
    assert!(
        attempts.iter().any(|(start, _)| *start < restarted_at),
        "b tried while etcd was down: {attempts:?}"
    );
    assert!(
        attempts
            .iter()
            .any(|(start, won)| *start >= restarted_at && !won),
        "b was refused (or failed) after the restart before it won: {attempts:?}"
    );
    assert!(
        won_start >= lost_at,
        "b's winning attempt started {:?} before a was told",
        lost_at - won_start
    );
    assert!(!a_alive_at_win, "a alive when b won");
    assert!(b.fencing_token().unwrap() > token_a);
    assert!(!a.check_alive());
    assert!(!a.acquire().await.unwrap(), "b holds it now");
    // Once (checked for a bounded time).
    probe.none(Duration::from_millis(200)).await;
    assert!(b.release().await.unwrap());
}

/// etcd killed and restarted within the TTL: the holder keeps its lease and tenure, nobody else
/// gets it, renewals resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restarted_within_the_ttl_keeps_the_lease() {
    let mut etcd = EtcdProcess::start("restarted").await;
    let prefix = unique_prefix("restarted");
    let ttl = Duration::from_secs(10);
    let session_a = EtcdSession::new(etcd_settings(&etcd.endpoint(), &prefix));
    let a = session_a.lease(settings("restarted", "a", ttl));
    let mut probe = LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    let token = a.fencing_token().unwrap();

    // The lease stays alive all through the restart (etcd starts in about a second; the TTL is
    // ten: a restart that took longer would be a broken precondition, reported here).
    let restarting = Instant::now();
    let watch_alive = async {
        loop {
            assert!(a.check_alive(), "alive while etcd restarts");
            sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        _ = etcd.restart() => {}
        _ = watch_alive => unreachable!(),
    }
    let restarted = Instant::now();
    println!("etcd restarted in {:?}", restarted - restarting);

    // Renewals resume: the deadline moves past what a pre-restart renewal could give.
    let a2 = &a;
    eventually(ttl, "a renewal after the restart", async || {
        assert!(a2.check_alive(), "alive until renewed after the restart");
        a2.deadline().unwrap() > restarted + a2.settings().local_validity()
    })
    .await;
    assert_eq!(a.fencing_token(), Some(token), "same tenure");
    // No loss was reported (checked for a bounded time after the renewal).
    probe.none(Duration::from_millis(200)).await;

    let session_b = EtcdSession::new(etcd_settings(&etcd.endpoint(), &prefix));
    let b = session_b.lease(
        LeaseSettings::builder("restarted", "b")
            .ttl(ttl)
            .acquire_retries(0)
            .build()
            .unwrap(),
    );
    assert!(!b.acquire().await.unwrap(), "a still holds it");
    assert!(a.release().await.unwrap());
    assert!(b.acquire().await.unwrap());
    assert!(b.fencing_token().unwrap() > token);
    assert!(b.release().await.unwrap());
}

/// A key that already holds our owner string (an earlier claim whose answer was lost) is claimed
/// again as a new tenure: a second compare-and-swap on its revision puts it on our etcd lease, and
/// the token is the key's new revision. Another owner is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_leftover_claim_is_taken_as_a_new_tenure() {
    let endpoint = endpoint();
    let prefix = unique_prefix("leftover");
    let mut admin = admin_client(&endpoint).await;
    let key = format!("{prefix}mine");
    let put = admin.put(key.as_str(), "a", None).await.unwrap();
    let put_revision = put.header().unwrap().revision();
    let session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let a = session.lease(settings("mine", "a", Duration::from_secs(6)));
    assert!(a.acquire().await.unwrap());
    let token = a.fencing_token().unwrap();
    assert_eq!(
        (a.backend().claims_sent(), a.backend().claims_refused()),
        (2, 1),
        "the create-only claim was refused, the compare-and-swap over our own value was not"
    );
    let got = admin.get(key.as_str(), None).await.unwrap();
    let kv = got.kvs().first().expect("held");
    assert_eq!(kv.value(), b"a");
    assert_eq!(
        kv.create_revision(),
        put_revision,
        "claimed over, not recreated"
    );
    assert!(kv.mod_revision() > put_revision);
    assert_eq!(token, FencingToken::new(kv.mod_revision() as u64));
    assert_eq!(session.shared_lease_ids().await, vec![kv.lease()]);

    let other = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let b = other.lease(
        LeaseSettings::builder("mine", "b")
            .ttl(Duration::from_secs(6))
            .acquire_retries(0)
            .build()
            .unwrap(),
    );
    assert!(!b.acquire().await.unwrap());
    assert!(a.check_alive());
    assert!(a.release().await.unwrap());
    assert!(admin
        .get(key.as_str(), None)
        .await
        .unwrap()
        .kvs()
        .is_empty());
}

/// A release that finds the key held by another owner (a takeover it had not heard of yet) leaves
/// that claim alone and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_that_finds_another_holder_leaves_it_alone() {
    let endpoint = endpoint();
    let prefix = unique_prefix("release-other");
    let mut admin = admin_client(&endpoint).await;
    let session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let s = settings("taken", "a", Duration::from_secs(6));
    let backend = EtcdBackend::new(&session, "taken");
    let AcquireAttempt::Acquired { tenure, token, .. } = backend.try_acquire(&s).await.unwrap()
    else {
        panic!("a fresh key is free")
    };
    let key = format!("{prefix}taken");
    let put = admin.put(key.as_str(), "intruder", None).await.unwrap();
    assert!(put.header().unwrap().revision() as u64 > token.value());
    assert_eq!(
        backend.release(&s, tenure).await.unwrap(),
        ReleaseOutcome::HeldByOther {
            holder: Some("intruder".into())
        }
    );
    let got = admin.get(key.as_str(), None).await.unwrap();
    let kv = got
        .kvs()
        .first()
        .expect("the intruder's claim is still there");
    assert_eq!(kv.value(), b"intruder");
    assert_eq!(kv.mod_revision(), put.header().unwrap().revision());
}

/// The provider builds etcd leases from configuration; leases of one section share a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_configures_etcd_leases() {
    let endpoint = endpoint();
    let prefix = unique_prefix("provider");
    let config: CoordinationConfig = serde_json::from_value(serde_json::json!({
        "leases": {
            "jobs": {
                "backend": "etcd",
                "ttl": "6s",
                "etcd": { "endpoints": [endpoint], "prefix": prefix, "connect-timeout": "2s" }
            },
            "broken": { "backend": "etcd", "etcd": { "endpoints": [], "prefix": "/x/" } },
            "missing": { "backend": "etcd" }
        }
    }))
    .unwrap();
    let provider = LeaseProvider::new(config);
    let one = provider.get_lease("one", "jobs", "node-1").unwrap();
    let two = provider.get_lease("two", "jobs", "node-1").unwrap();
    assert!(one.acquire().await.unwrap());
    assert!(two.acquire().await.unwrap());
    let mut admin = admin_client(&endpoint).await;
    let got = admin
        .get(
            prefix.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(got.kvs().len(), 2);
    assert_eq!(
        got.kvs()[0].lease(),
        got.kvs()[1].lease(),
        "one session, one etcd lease"
    );
    assert!(one.release().await.unwrap());
    assert!(two.release().await.unwrap());

    let e = provider.get_lease("n", "broken", "node-1").unwrap_err();
    assert!(format!("{e:?}").contains("endpoints"), "{e:?}");
    let e = provider.get_lease("n", "missing", "node-1").unwrap_err();
    assert!(format!("{e:?}").contains("section"), "{e:?}");
    // Construction is lazy: a bad endpoint fails at acquire, as a transient error.
    let unreachable = EtcdSession::new(etcd_settings("http://127.0.0.1:9", &prefix));
    let lease = unreachable.lease(
        LeaseSettings::builder("n", "o")
            .ttl(Duration::from_secs(3))
            .acquire_retries(0)
            .build()
            .unwrap(),
    );
    let err = timeout(Duration::from_secs(10), lease.acquire())
        .await
        .expect("bounded by the operation timeout")
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
}

/// With etcd authentication on: the right user works within its prefix; a wrong password or a key
/// outside the user's permission fails at once, as errors a retry cannot fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_permission_errors_are_not_transient() {
    let etcd = EtcdProcess::start("auth").await;
    let mut root = admin_client(&etcd.endpoint()).await;
    root.user_add("root", "root-pw", None).await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root.role_add("leases").await.unwrap();
    root.role_grant_permission(
        "leases",
        etcd_client::Permission::read_write("/app/leases/").with_prefix(),
    )
    .await
    .unwrap();
    root.user_add("app", "app-pw", None).await.unwrap();
    root.user_grant_role("app", "leases").await.unwrap();
    root.auth_enable().await.unwrap();
    let with = |prefix: &str, password: &str| {
        EtcdSettings::builder([etcd.endpoint()])
            .prefix(prefix)
            .credentials("app", password)
            .build()
            .unwrap()
    };
    let lease_settings = || {
        LeaseSettings::builder("singleton", "node-1")
            .ttl(Duration::from_secs(6))
            .build()
            .unwrap()
    };

    let session = EtcdSession::connect(with("/app/leases/", "app-pw"))
        .await
        .unwrap();
    let lease = session.lease(lease_settings());
    assert!(lease.acquire().await.unwrap());
    next_renewal(&lease, Duration::from_secs(6)).await;
    assert!(lease.check_alive(), "renewed with credentials");
    assert!(lease.release().await.unwrap());

    let err = EtcdSession::connect(with("/app/leases/", "wrong"))
        .await
        .unwrap_err();
    assert!(matches!(err, EtcdError::Unauthenticated { .. }), "{err:?}");
    assert!(!err.is_transient());
    let lease = EtcdSession::new(with("/app/leases/", "wrong")).lease(lease_settings());
    assert!(lease.settings().acquire_retries() > 0);
    let err = lease.acquire().await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert!(
        matches!(
            err.backend_error::<EtcdError>(),
            Some(EtcdError::Unauthenticated { .. })
        ),
        "{err:?}"
    );
    assert_eq!(lease.stats().acquire_attempts, 1, "no retries");

    let err = EtcdSession::connect(with("/elsewhere/", "app-pw"))
        .await
        .unwrap_err();
    assert!(matches!(err, EtcdError::PermissionDenied { .. }), "{err:?}");
    let lease = EtcdSession::new(with("/elsewhere/", "app-pw")).lease(lease_settings());
    let err = lease.acquire().await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert!(
        matches!(
            err.backend_error::<EtcdError>(),
            Some(EtcdError::PermissionDenied { .. })
        ),
        "{err:?}"
    );
    assert!(!lease.check_alive());
}

/// A lease dropped without release (a crash) frees its key after its TTL even though the shared
/// etcd lease lives on for the process's other leases, which stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_lease_expires_while_its_shared_etcd_lease_lives_on() {
    let endpoint = endpoint();
    let prefix = unique_prefix("orphan");
    let ttl = Duration::from_secs(3);
    let session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let x = session.lease(settings("x", "a", ttl));
    let y = session.lease(settings("y", "a", ttl));
    assert!(x.acquire().await.unwrap());
    assert!(y.acquire().await.unwrap());
    // Dropped right after a renewal: the key must outlive it by the TTL from there.
    let renewed_at = next_renewal(&x, ttl).await - x.settings().local_validity();
    drop(x);

    let other = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let b = other.lease(
        LeaseSettings::builder("x", "b")
            .ttl(ttl)
            .acquire_retries(0)
            .build()
            .unwrap(),
    );
    // Freed at all (the session deletes it: the shared etcd lease would keep it forever), and
    // not before the TTL.
    let acquired_at = acquire_within(&b, ttl * 3).await;
    assert!(
        acquired_at >= renewed_at + ttl,
        "taken {:?} before the ttl ran out",
        (renewed_at + ttl) - acquired_at
    );
    // The other lease of the process kept its key and its etcd lease all along.
    assert!(y.check_alive());
    let mut admin = admin_client(&endpoint).await;
    let got = admin.get(format!("{prefix}y"), None).await.unwrap();
    assert_eq!(got.kvs().first().map(|kv| kv.value()), Some(&b"a"[..]));
    assert_eq!(session.shared_lease_ids().await.len(), 1);
    assert!(y.release().await.unwrap());
    assert!(b.release().await.unwrap());
}

/// When the watch stream breaks and the history since the claim was compacted meanwhile, the
/// holder checks the key and watches on: it keeps the lease, and a later takeover is still
/// reported by the watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_survives_a_broken_stream_and_a_compacted_history() {
    let endpoint = endpoint();
    let prefix = unique_prefix("compacted");
    let proxy = FaultProxy::start(common::etcd::socket_addr(&endpoint)).await;
    let session = EtcdSession::new(etcd_settings(&format!("http://{}", proxy.addr()), &prefix));
    let ttl = Duration::from_secs(10);
    let a = session.lease(settings("compacted", "a", ttl));
    let mut probe = LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    let token = a.fencing_token().unwrap();
    let a2 = &a;
    eventually(ttl / 2, "the tenure's watch started", async || {
        a2.stats().watch_starts >= 1
    })
    .await;

    let mut admin = admin_client(&endpoint).await;
    let mut revision = 0;
    for i in 0..5 {
        let put = admin
            .put(format!("{prefix}other"), format!("{i}"), None)
            .await
            .unwrap();
        revision = put.header().unwrap().revision();
    }
    // Break every stream of the session (well within the ttl)...
    proxy.set_mode(ProxyMode::Reset);
    eventually(ttl / 2, "the watch broke", async || {
        a2.stats().watch_breaks >= 1
    })
    .await;
    // ...and compact the history past the claim before the watch can come back.
    admin.compact(revision, None).await.unwrap();
    proxy.set_mode(ProxyMode::Pass);
    // The watch is re-established, finds the history compacted, reads the key (still a's) and
    // watches on from the current revision.
    eventually(
        ttl / 2,
        "the watch resumed past the compaction",
        async || a2.backend().compacted_watch_resumes() >= 1,
    )
    .await;
    // Renewals resume too.
    let resumed = Instant::now();
    eventually(ttl / 2, "a renewal after the partition", async || {
        a2.deadline().unwrap() > resumed + a2.settings().local_validity()
    })
    .await;
    // No loss was reported (checked for a bounded time after the resumption).
    probe.none(Duration::from_millis(200)).await;
    assert!(a.check_alive());
    assert_eq!(a.fencing_token(), Some(token));

    admin
        .put(format!("{prefix}compacted"), "intruder", None)
        .await
        .unwrap();
    // The watch is established again: renewals read nothing, the watch reports the takeover.
    let (_, lost) = probe.next(ttl).await;
    assert_eq!(
        lost.reason,
        LostReason::TakenOver {
            holder: Some("intruder".into())
        }
    );
}

/// A takeover written while the holder is cut off (its watch stream broken and not
/// re-established) is still reported once the connection is back, before the deadline: the watch
/// resumes from the revision of the claim, so the write in between is not missed, and a renewal
/// made while the watch is down reads the key too (`renewals_verify_the_key_while_the_watch_is_down`
/// shows that path on its own); whichever comes first reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_written_while_the_watch_is_broken_is_reported() {
    let endpoint = endpoint();
    let prefix = unique_prefix("broken-watch");
    let proxy = FaultProxy::start(common::etcd::socket_addr(&endpoint)).await;
    let session = EtcdSession::new(etcd_settings(&format!("http://{}", proxy.addr()), &prefix));
    let ttl = Duration::from_secs(10);
    let a = session.lease(settings("broken", "a", ttl));
    let mut probe = LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    let token = a.fencing_token().unwrap();
    let a2 = &a;
    eventually(ttl / 2, "the tenure's watch started", async || {
        a2.stats().watch_starts >= 1
    })
    .await;

    // Cut the session off: the watch stream breaks, and no new one can open while the proxy
    // resets every connection.
    proxy.set_mode(ProxyMode::Reset);
    eventually(ttl / 2, "the watch broke", async || {
        a2.stats().watch_breaks >= 1
    })
    .await;
    let mut admin = admin_client(&endpoint).await;
    let put = admin
        .put(format!("{prefix}broken"), "intruder", None)
        .await
        .unwrap();
    assert!(put.header().unwrap().revision() as u64 > token.value());
    assert!(a.check_alive(), "nothing could tell a yet");
    proxy.set_mode(ProxyMode::Pass);

    let (_, lost) = probe.next(ttl).await;
    assert_eq!(
        lost.reason,
        LostReason::TakenOver {
            holder: Some("intruder".into())
        },
        "reported once the connection is back, before the deadline"
    );
    assert_eq!(lost.fencing_token, Some(token));
    assert!(!a.check_alive());
    assert!(a.stats().watch_starts >= 2, "the watch was re-established");
}

/// Two instances of one lease (same cluster and prefix, name and owner) in one process would both
/// believe they hold it (the second would reuse the first one's key): the second is refused while
/// the first holds it, also when it comes from another session to the same cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_of_the_same_lease_is_refused() {
    let prefix = unique_prefix("duplicate");
    let session = EtcdSession::new(etcd_settings(&endpoint(), &prefix));
    let other_session = EtcdSession::new(etcd_settings(&endpoint(), &prefix));
    let first = EtcdLease::new(settings("dup", "a", Duration::from_secs(3)), &session);
    let second = EtcdLease::new(settings("dup", "a", Duration::from_secs(3)), &other_session);
    assert!(first.acquire().await.unwrap());
    let error = second.acquire().await.unwrap_err();
    assert!(
        matches!(&error, actix_coordination::LeaseError::DuplicateInstance { owner, .. } if owner == "a"),
        "{error}"
    );
    assert!(first.check_alive());
    assert!(first.release().await.unwrap());
    assert!(second.acquire().await.unwrap(), "free for it once released");
    assert!(second.release().await.unwrap());
}

/// Settings for the claim tests: TTL 6 s, renewal every 2 s, operation timeout 1 s.
fn claim_settings(name: &str, owner: &str) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(Duration::from_secs(6))
        .renewal_interval(Duration::from_secs(2))
        .operation_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// The value of `key`, read straight from etcd.
async fn value_of(admin: &mut etcd_client::Client, key: &str) -> Option<String> {
    let response = admin.get(key, None).await.unwrap();
    response
        .kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
}

/// A claim that lands in etcd but whose answer is dropped (the acquire times out) does not block
/// the lease while the same session keeps its shared etcd lease alive for another lease: the
/// backend removes it (compare-and-swap on owner and etcd lease), and another node acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_is_lost_is_removed() {
    let endpoint = endpoint();
    let prefix = unique_prefix("lost-answer");
    let proxy = FaultProxy::start(common::etcd::socket_addr(&endpoint)).await;
    let n1 = EtcdSession::new(etcd_settings(&format!("http://{}", proxy.addr()), &prefix));
    let n2 = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let mut admin = admin_client(&endpoint).await;
    let other = n1.lease(claim_settings("other", "n1"));
    assert!(other.acquire().await.unwrap());
    let victim = n1.lease(claim_settings("victim", "n1"));

    proxy.set_mode(ProxyMode::DropAnswers);
    let error = victim.acquire().await.unwrap_err();
    assert!(
        matches!(error, actix_coordination::LeaseError::Timeout { .. }),
        "{error}"
    );
    assert_eq!(
        value_of(&mut admin, &format!("{prefix}victim"))
            .await
            .as_deref(),
        Some("n1"),
        "the claim landed although its answer was lost"
    );
    proxy.set_mode(ProxyMode::Pass);

    let key = format!("{prefix}victim");
    let admin2 = &mut admin;
    eventually(
        Duration::from_secs(6),
        "the unanswered claim is removed within a ttl",
        async || value_of(admin2, &key).await.is_none(),
    )
    .await;
    // The shared etcd lease lived on all along (so etcd did not expire the key): the backend
    // removed it. (Which attempt did cannot be told: a delete whose answer the proxy dropped may
    // have done it.)
    assert!(
        other.check_alive(),
        "the other lease of n1 was not disturbed"
    );
    let contender = n2.lease(claim_settings("victim", "n2"));
    assert!(
        contender.acquire().await.unwrap(),
        "n2 gets the lease at once"
    );
    assert!(other.release().await.unwrap());
    assert!(contender.release().await.unwrap());
}

/// Issue 36, item 9: the claim of a lease whose operation timeout is shorter than a round trip
/// to etcd lands but its answer is lost, while another lease of the same session keeps the
/// session's etcd lease alive; its release times out too, and the lease is dropped. The claim is
/// still removed and another owner gets the lease within two TTLs (the removal bounded each
/// attempt by that tiny operation timeout: none ever completed, and the key blocked the lease for
/// good). The proxy delays every answer to n1 by 300 ms, longer than the victim's 50 ms and
/// shorter than the other lease's 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_of_a_dropped_lease_with_a_tiny_operation_timeout_is_removed() {
    let endpoint = endpoint();
    let prefix = unique_prefix("tiny-timeout-claim");
    let proxy = FaultProxy::start(common::etcd::socket_addr(&endpoint)).await;
    let n1 = EtcdSession::new(etcd_settings(&format!("http://{}", proxy.addr()), &prefix));
    let n2 = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let mut admin = admin_client(&endpoint).await;
    let ttl = claim_settings("x", "x").ttl();
    let other = n1.lease(claim_settings("other", "n1"));
    assert!(other.acquire().await.unwrap());
    let victim = n1.lease(
        LeaseSettings::builder("victim", "n1")
            .ttl(ttl)
            .renewal_interval(Duration::from_secs(2))
            .operation_timeout(Duration::from_millis(50))
            .build()
            .unwrap(),
    );
    let key = format!("{prefix}victim");

    proxy.set_mode(ProxyMode::SlowAnswers(Duration::from_millis(300)));
    // Until a claim lands (an attempt may time out before its claim is even sent).
    let give_up = Instant::now() + ttl;
    loop {
        let error = victim
            .acquire()
            .await
            .expect_err("no answer comes within the operation timeout");
        assert!(
            matches!(error, actix_coordination::LeaseError::Timeout { .. }),
            "{error}"
        );
        if value_of(&mut admin, &key).await.as_deref() == Some("n1") {
            break;
        }
        assert!(Instant::now() < give_up, "no claim landed within {ttl:?}");
        sleep(Duration::from_millis(50)).await;
    }
    let released = victim.release().await;
    assert!(
        matches!(
            released,
            Err(actix_coordination::LeaseError::Timeout { .. })
        ),
        "the release times out too: {released:?}"
    );
    drop(victim);

    // The other lease keeps the etcd lease the claim is attached to alive: etcd never expires
    // the key, the session's clean-up must delete it.
    let contender = n2.lease(claim_settings("victim", "n2"));
    acquire_within(&contender, ttl * 2).await;
    assert!(
        other.check_alive(),
        "the other lease of n1 was not disturbed (its etcd lease lived on)"
    );
    proxy.set_mode(ProxyMode::Pass);
    assert!(contender.release().await.unwrap());
    assert!(other.release().await.unwrap());
}

/// `release()` after an acquire whose answer was lost removes the claim before it answers
/// `Ok(true)` (it used to answer `Ok(true)` as a no-op and leave the key blocking others).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_a_lost_answer_removes_the_claim() {
    let endpoint = endpoint();
    let prefix = unique_prefix("release-lost-answer");
    let proxy = FaultProxy::start(common::etcd::socket_addr(&endpoint)).await;
    let n1 = EtcdSession::new(etcd_settings(&format!("http://{}", proxy.addr()), &prefix));
    let mut admin = admin_client(&endpoint).await;
    let other = n1.lease(claim_settings("other", "n1"));
    assert!(other.acquire().await.unwrap());
    let victim = n1.lease(claim_settings("victim", "n1"));
    proxy.set_mode(ProxyMode::DropAnswers);
    assert!(victim.acquire().await.is_err());
    assert_eq!(victim.backend().unanswered_claims(), 1);
    proxy.set_mode(ProxyMode::Pass);
    // The background removal may be first; either way the key is gone when release answers.
    let released = loop {
        match victim.release().await {
            Ok(released) => break released,
            // The reconnect after the proxy's reset may take a moment.
            Err(error) => assert!(error.is_transient(), "{error}"),
        }
    };
    assert!(released);
    assert_eq!(value_of(&mut admin, &format!("{prefix}victim")).await, None);
    assert!(other.release().await.unwrap());
}

/// A claim that etcd applies more than a TTL after it was sent (a request held up on its way)
/// is still removed while the etcd lease it names lives on for other leases (issue 27, item 10):
/// the guard of an unanswered claim holds until that etcd lease is gone, not one TTL. The claim
/// is held up by a blackholed connection (it never arrives), and its late landing is played by
/// writing the key exactly as the claim would (value = owner, the session's etcd lease) after the
/// guard's check at `sent + ttl`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_lands_more_than_a_ttl_late_is_removed_while_its_etcd_lease_lives() {
    let endpoint = endpoint();
    let prefix = unique_prefix("late-claim");
    let proxy = FaultProxy::start(common::etcd::socket_addr(&endpoint)).await;
    let n1 = EtcdSession::new(etcd_settings(&format!("http://{}", proxy.addr()), &prefix));
    let n2 = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let mut admin = admin_client(&endpoint).await;
    let ttl = claim_settings("x", "x").ttl();
    let other = n1.lease(claim_settings("other", "n1"));
    assert!(other.acquire().await.unwrap());
    let grant = admin
        .get(format!("{prefix}other"), None)
        .await
        .unwrap()
        .kvs()[0]
        .lease();
    let victim = n1.lease(claim_settings("victim", "n1"));
    let key = format!("{prefix}victim");

    // The claim is held up on its way: it does not reach etcd now.
    proxy.set_mode(ProxyMode::Blackhole);
    let started = Instant::now();
    assert!(victim.acquire().await.is_err());
    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(value_of(&mut admin, &key).await, None);
    // Past the guard's check one TTL after the claim was sent, the claim lands.
    sleep_until(started + ttl + Duration::from_secs(3)).await;
    admin
        .put(
            key.as_str(),
            "n1",
            Some(etcd_client::PutOptions::new().with_lease(grant)),
        )
        .await
        .unwrap();
    let admin2 = &mut admin;
    eventually(
        ttl * 3,
        "a claim landing more than a ttl late is removed while its etcd lease lives",
        async || value_of(admin2, &key).await.is_none(),
    )
    .await;
    assert!(other.check_alive(), "the other lease was not disturbed");
    let contender = n2.lease(claim_settings("victim", "n2"));
    assert!(contender.acquire().await.unwrap(), "n2 gets the lease");
    assert!(contender.release().await.unwrap());

    // A claim that never lands keeps its guard beyond one TTL, until the etcd lease is gone (its
    // last user released).
    proxy.set_mode(ProxyMode::Blackhole);
    let started = Instant::now();
    assert!(victim.acquire().await.is_err());
    proxy.set_mode(ProxyMode::Pass);
    sleep_until(started + ttl + Duration::from_secs(3)).await;
    assert_eq!(victim.backend().unanswered_claims(), 1, "still guarded");
    assert!(other.release().await.unwrap());
    let victim2 = &victim;
    eventually(ttl * 3, "the guard ends with the etcd lease", async || {
        victim2.backend().unanswered_claims() == 0
    })
    .await;
}

/// A renewal proves ownership itself while the tenure's watch is down: the key deleted and taken
/// by another owner is found by the next renewal, although the keep-alives still succeed. While
/// the watch works, renewals read nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_verify_the_key_while_the_watch_is_down() {
    let endpoint = endpoint();
    let prefix = unique_prefix("verify");
    let a_session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let b_session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let a = a_session.lease(claim_settings("verified", "a"));
    let mut probe = LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    let token = a.fencing_token().unwrap();

    // Watch established: three renewals, no read of the key.
    let a2 = &a;
    eventually(
        Duration::from_secs(6),
        "a renewal without a read",
        async || a2.stats().renewals >= 1 && a2.backend().verified_renewals() < a2.stats().renewals,
    )
    .await;
    let (renewals, reads) = (a.stats().renewals, a.backend().verified_renewals());
    eventually(Duration::from_secs(10), "three more renewals", async || {
        a2.stats().renewals >= renewals + 3
    })
    .await;
    assert_eq!(
        a.backend().verified_renewals(),
        reads,
        "no read while the watch works"
    );

    // The watch goes down; the key is deleted and taken by b.
    a_session.suspend_watches_for_tests(true);
    eventually(Duration::from_secs(6), "the watch broke", async || {
        a2.stats().watch_breaks >= 1
    })
    .await;
    let mut admin = admin_client(&endpoint).await;
    admin
        .delete(format!("{prefix}verified"), None)
        .await
        .unwrap();
    let b = b_session.lease(claim_settings("verified", "b"));
    assert!(b.acquire().await.unwrap());
    let b_token = b.fencing_token().unwrap();
    assert!(b_token > token);

    // a's next renewal (every 2 s) reads the key and reports the loss; without it, a would hold
    // on for as long as its keep-alives succeed.
    let (_, lost) = probe.next(Duration::from_secs(5)).await;
    assert_eq!(
        lost.reason,
        LostReason::TakenOver {
            holder: Some("b".into())
        }
    );
    assert_eq!(lost.fencing_token, Some(token));
    assert!(a.backend().verified_renewals() > reads);
    assert!(!a.check_alive());
    a_session.suspend_watches_for_tests(false);
    assert!(b.release().await.unwrap());
}

/// A dropped tenure's key is removed one TTL after the drop even when the first attempts fail:
/// the removal is retried until it succeeds, while the session's shared etcd lease lives on for
/// another lease (one best-effort delete used to leave the key there for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_tenure_is_removed_even_when_the_first_delete_fails() {
    let endpoint = endpoint();
    let prefix = unique_prefix("dropped-retry");
    let proxy = FaultProxy::start(common::etcd::socket_addr(&endpoint)).await;
    let session = EtcdSession::new(etcd_settings(&format!("http://{}", proxy.addr()), &prefix));
    let mut admin = admin_client(&endpoint).await;
    let ttl = Duration::from_secs(6);
    let other = session.lease(claim_settings("other", "n1"));
    let dropped = session.lease(claim_settings("dropped", "n1"));
    assert!(other.acquire().await.unwrap());
    assert!(dropped.acquire().await.unwrap());
    let dropped_at = Instant::now();
    drop(dropped);

    // The removal is due one TTL after the drop: cut the connection from just before until well
    // after, short of `other`'s deadline (its keep-alives fail meanwhile and are retried).
    sleep_until(dropped_at + ttl - Duration::from_millis(500)).await;
    proxy.set_mode(ProxyMode::Reset);
    tokio::time::sleep_until(dropped_at + ttl + Duration::from_millis(1500)).await;
    assert_eq!(
        value_of(&mut admin, &format!("{prefix}dropped"))
            .await
            .as_deref(),
        Some("n1"),
        "the first attempts failed"
    );
    proxy.set_mode(ProxyMode::Pass);
    let key = format!("{prefix}dropped");
    let admin2 = &mut admin;
    eventually(ttl, "the retried removal deleted the key", async || {
        value_of(admin2, &key).await.is_none()
    })
    .await;
    assert!(other.check_alive(), "the shared etcd lease lived on");
    assert!(other.release().await.unwrap());
}

/// A contender that finds the lease held reads the key and waits on the watch: it asks etcd for
/// no etcd lease (it used to grant and revoke one every round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_contender_grants_no_etcd_lease() {
    let endpoint = endpoint();
    let prefix = unique_prefix("no-grant");
    let holder_session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let contender_session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let holder = holder_session.lease(claim_settings("busy", "a"));
    let contender = contender_session.lease(claim_settings("busy", "b"));
    assert!(holder.acquire().await.unwrap());
    for _ in 0..5 {
        assert!(!contender.acquire().await.unwrap());
    }
    assert!(!contender
        .acquire_within(Duration::from_secs(3))
        .await
        .unwrap());
    assert_eq!(contender_session.grants_requested(), 0);
    assert!(contender.backend().claims_sent() == 0);
    assert!(holder.release().await.unwrap());
    assert!(
        contender.acquire().await.unwrap(),
        "free: it grants and claims"
    );
    assert_eq!(contender_session.grants_requested(), 1);
    assert!(contender.release().await.unwrap());
}

/// A slow grant does not hold the session's lock: the session still answers (here
/// `shared_lease_ids`) while a grant request hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_grant_does_not_block_the_session() {
    let endpoint = endpoint();
    let prefix = unique_prefix("slow-grant");
    let proxy = FaultProxy::start(common::etcd::socket_addr(&endpoint)).await;
    let session = EtcdSession::connect(etcd_settings(&format!("http://{}", proxy.addr()), &prefix))
        .await
        .unwrap();
    let lease = session.lease(claim_settings("slow", "a"));
    proxy.set_mode(ProxyMode::Blackhole);
    let acquiring = tokio::spawn(async move { lease.acquire().await });
    // Checking an absence for a bounded time: the acquire is stuck in its grant meanwhile.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!acquiring.is_finished());
    let ids = timeout(Duration::from_millis(500), session.shared_lease_ids()).await;
    assert_eq!(ids.expect("answered during the grant"), Vec::<i64>::new());
    proxy.set_mode(ProxyMode::Pass);
    // Whether the grant timed out or went through after the proxy's reset: the call ends.
    let _ = acquiring.await.unwrap();
}

/// The session's connections and background tasks run on its own thread: the actix arbiter that
/// used the session first stops, and a lease of the same session acquired on another arbiter
/// stays held, renewed and watched (its keep-alives used to die with the first arbiter).
#[actix_rt::test]
async fn the_session_outlives_the_arbiter_that_used_it_first() {
    let endpoint = endpoint();
    let prefix = unique_prefix("first-arbiter");
    let session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let first = actix_rt::Arbiter::new();
    let (done, used) = tokio::sync::oneshot::channel();
    let s1 = session.clone();
    first.spawn(async move {
        let lease = s1.lease(claim_settings("on-the-first-arbiter", "a"));
        assert!(lease.acquire().await.unwrap());
        let _ = done.send(lease);
    });
    let on_first = used.await.unwrap();
    // Stop the first arbiter; its runtime and everything spawned on it goes away.
    first.stop();
    first.join().unwrap();

    let lease = session.lease(claim_settings("kept", "a"));
    let mut probe = LostProbe::new(&lease);
    assert!(lease.acquire().await.unwrap());
    let lease2 = &lease;
    let start = lease.stats().renewals;
    eventually(
        Duration::from_secs(20),
        "renewed through two ttls",
        async || lease2.stats().renewals >= start + 6,
    )
    .await;
    assert!(lease.check_alive());
    assert!(probe.try_next().is_none(), "never lost");
    let stats = lease.stats();
    assert_eq!(stats.renewal_errors + stats.renewal_timeouts, 0);
    assert!(lease.release().await.unwrap());
    drop(on_first);
}

/// A group watch lives on its session's thread and does not keep the session alive: once the
/// last handle of the session (here its lease) is gone, the watch ends
/// ([`GroupError::Ended`](actix_coordination::GroupError)) instead of running on unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_watch_ends_with_its_session() {
    let endpoint = endpoint();
    let prefix = unique_prefix("group-end");
    let session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let lease = session.lease(settings("g-0", "a", Duration::from_secs(5)));
    assert!(lease.acquire().await.unwrap());
    let mut watch = lease.watch_group("g-").unwrap();
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let snapshot = watch.snapshot_and_mark();
        if snapshot.get("g-0").and_then(|r| r.holder.as_deref()) == Some("a") {
            break;
        }
        timeout(give_up - Instant::now(), watch.changed())
            .await
            .expect("the watch shows the holder within 30 s")
            .unwrap();
    }
    assert!(lease.release().await.unwrap());
    drop(lease);
    drop(session);
    let ended = async {
        loop {
            if let Err(error) = watch.changed().await {
                return error;
            }
        }
    };
    let error = timeout(Duration::from_secs(30), ended)
        .await
        .expect("the watch ends within 30 s of its session");
    assert!(
        matches!(error, actix_coordination::GroupError::Ended),
        "{error:?}"
    );
}
