//! `Lease::hand_over` on a real etcd: a planned move in one write. The holder puts the key in the
//! target's name on the target's own etcd lease (compare-and-swap on its tenure's revision), and
//! the waiting target takes it up from its watch without a write of its own.
//!
//! Needs `ACTIX_COORD_TEST_ETCD_ENDPOINT` (`scripts/test-cluster.sh`). Every test uses its own key
//! prefix.

mod common;

use std::sync::Arc;
use std::time::Duration;

use actix_coordination::{
    EtcdBackend, EtcdSession, GroupWatch, Lease, LeaseSettings, ManagedLease,
};
use common::etcd::{admin_client, endpoint, etcd_settings, unique_prefix};
use common::{event_driven_settings, eventually};
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(10);

fn settings(name: &str, owner: &str) -> LeaseSettings {
    event_driven_settings(name, owner, TTL)
}

/// The key's value and etcd lease, as etcd has it.
async fn key_now(admin: &mut etcd_client::Client, key: &str) -> Option<(String, i64, i64)> {
    let got = admin.get(key, None).await.unwrap();
    got.kvs().first().map(|kv| {
        (
            String::from_utf8_lossy(kv.value()).into_owned(),
            kv.lease(),
            kv.mod_revision(),
        )
    })
}

/// Two sessions on `prefix`, of owners `a` and `b`: `b` is a member of group `g-` (its key
/// `g-member-b` on its etcd lease), and a group watch of `a`'s session has seen it.
struct Pair {
    session_a: EtcdSession,
    session_b: EtcdSession,
    member_b: ManagedLease<EtcdBackend>,
    _group: GroupWatch,
}

async fn pair(endpoint: &str, prefix: &str) -> Pair {
    let session_a = EtcdSession::new(etcd_settings(endpoint, prefix));
    let session_b = EtcdSession::new(etcd_settings(endpoint, prefix));
    let member_b = session_b.lease(settings("g-member-b", "b"));
    assert!(member_b.acquire().await.unwrap());
    let group = session_a
        .lease(settings("g-watch", "a"))
        .watch_group("g-")
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "a's group watch shows b's member key",
        || {
            group
                .snapshot()
                .get("g-member-b")
                .is_some_and(|r| r.holder.as_deref() == Some("b"))
        },
    )
    .await;
    Pair {
        session_a,
        session_b,
        member_b,
        _group: group,
    }
}

/// `a` (on `session_a`) holds `shard`, and `b` (on `session_b`) waits for it
/// (`acquire_within` 30 s), having found it held.
async fn held_by_a_awaited_by_b(
    session_a: &EtcdSession,
    session_b: &EtcdSession,
    shard: &str,
) -> (
    ManagedLease<EtcdBackend>,
    Arc<ManagedLease<EtcdBackend>>,
    tokio::task::JoinHandle<Result<bool, actix_coordination::LeaseError>>,
) {
    let a = session_a.lease(settings(shard, "a"));
    let b = Arc::new(session_b.lease(settings(shard, "b")));
    assert!(a.acquire().await.unwrap());
    let b_wait = tokio::spawn({
        let b = Arc::clone(&b);
        async move { b.acquire_within(Duration::from_secs(30)).await }
    });
    eventually(Duration::from_secs(10), "b found the key held", || {
        b.backend().seen_held() >= 1
    })
    .await;
    (a, b, b_wait)
}

/// The key moves to the waiting contender in the holder's one compare-and-swap: it is then in
/// the contender's name on the contender's etcd lease (the one its other key uses), the contender
/// holds it without sending a claim, with a higher fencing token, renews it with its etcd lease's
/// keep-alives, and releases it like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_moves_the_key_to_the_waiting_contender_in_one_write() {
    let endpoint = endpoint();
    let prefix = unique_prefix("hand-over");
    let mut admin = admin_client(&endpoint).await;
    // b is a member of the group (a key of its own on its etcd lease), which a watches.
    let Pair {
        session_a,
        session_b,
        member_b,
        ..
    } = pair(&endpoint, &prefix).await;
    let (a, b, b_wait) = held_by_a_awaited_by_b(&session_a, &session_b, "g-0").await;
    let a_token = a.fencing_token().unwrap();
    let claims_before = b.backend().claims_sent();
    assert!(a.hand_over("b").await.unwrap(), "a held it: handed over");
    assert!(!a.check_alive());
    let got = timeout(Duration::from_secs(20), b_wait)
        .await
        .expect("b takes the key up from its watch, not after its retry delay")
        .unwrap();
    assert!(got.unwrap(), "b holds the lease");
    assert_eq!(a.backend().handed_over(), 1, "a wrote the handover");
    assert_eq!(b.backend().taken_up(), 1, "b took the key up");
    assert_eq!(
        b.backend().claims_sent(),
        claims_before,
        "b sent no claim after the handover: one write for the move"
    );
    let b_token = b.fencing_token().unwrap();
    assert!(b_token > a_token, "tokens rise: {a_token:?} -> {b_token:?}");

    let key = format!("{prefix}g-0");
    let member_key = format!("{prefix}g-member-b");
    let (value, lease, revision) = key_now(&mut admin, &key).await.expect("the key is there");
    let (_, member_lease, _) = key_now(&mut admin, &member_key).await.unwrap();
    assert!(value.starts_with("b\0"), "the key names b: {value:?}");
    assert_eq!(lease, member_lease, "on b's own etcd lease");
    assert_eq!(
        b_token.value(),
        revision as u64,
        "b's token is the handover's revision"
    );

    // b's tenure renews like a claimed one: it stays held across more renewals than one TTL
    // would allow without them (the renewals are the etcd lease's keep-alives).
    let renewals = b.stats().renewals;
    eventually(TTL * 3, "b renews the lease it took up", || {
        assert!(b.check_alive(), "b keeps the lease");
        b.stats().renewals >= renewals + 3
    })
    .await;
    assert!(b.release().await.unwrap());
    assert_eq!(
        key_now(&mut admin, &key).await,
        None,
        "b's release deletes the key"
    );
    assert!(member_b.release().await.unwrap());
}

/// Without a known etcd lease for the target (no group watch of this session saw it hold a
/// key), a handover is a plain release: the key is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_an_owner_never_seen_is_a_plain_release() {
    let endpoint = endpoint();
    let prefix = unique_prefix("hand-over-unknown");
    let mut admin = admin_client(&endpoint).await;
    let session = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let a = session.lease(settings("g-0", "a"));
    assert!(a.acquire().await.unwrap());
    assert!(a.hand_over("b").await.unwrap());
    assert_eq!(a.backend().handed_over(), 0);
    assert_eq!(key_now(&mut admin, &format!("{prefix}g-0")).await, None);
    assert!(
        a.hand_over("a").await.is_err(),
        "handing over to oneself is refused"
    );
}

/// A target whose etcd lease is gone (it stopped) gets nothing: etcd refuses the write, and the
/// handover releases plainly instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_a_stopped_owner_is_a_plain_release() {
    let endpoint = endpoint();
    let prefix = unique_prefix("hand-over-gone");
    let mut admin = admin_client(&endpoint).await;
    let Pair {
        session_a,
        session_b,
        ..
    } = pair(&endpoint, &prefix).await;
    let a = session_a.lease(settings("g-0", "a"));
    assert!(a.acquire().await.unwrap());
    // b's etcd lease is gone (as when b stops, or when it expires).
    let ids = session_b.shared_lease_ids().await;
    assert_eq!(ids.len(), 1, "b's one etcd lease: {ids:?}");
    admin.lease_revoke(ids[0]).await.unwrap();
    assert!(a.hand_over("b").await.unwrap());
    assert_eq!(a.backend().handed_over(), 0, "etcd refused the handover");
    assert_eq!(
        key_now(&mut admin, &format!("{prefix}g-0")).await,
        None,
        "released plainly"
    );
}

/// A key handed to an owner that is not waiting for it is not lost to it: the owner's next
/// acquire takes it up (on the etcd lease it was handed to, without a write), while others see it
/// held; an instance of that owner on another etcd lease takes it over with a new token instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_handed_to_an_owner_not_waiting_is_taken_when_it_competes() {
    let endpoint = endpoint();
    let prefix = unique_prefix("hand-over-idle");
    let mut admin = admin_client(&endpoint).await;
    let Pair {
        session_a,
        session_b,
        member_b,
        ..
    } = pair(&endpoint, &prefix).await;
    let a0 = session_a.lease(settings("g-0", "a"));
    let a1 = session_a.lease(settings("g-1", "a"));
    assert!(a0.acquire().await.unwrap());
    assert!(a1.acquire().await.unwrap());
    assert!(a0.hand_over("b").await.unwrap());
    assert!(a1.hand_over("b").await.unwrap());
    assert_eq!(a0.backend().handed_over() + a1.backend().handed_over(), 2);
    let (value, _, handed_0) = key_now(&mut admin, &format!("{prefix}g-0")).await.unwrap();
    assert!(value.starts_with("b\0"), "the key names b: {value:?}");
    let (_, _, handed_1) = key_now(&mut admin, &format!("{prefix}g-1")).await.unwrap();
    // Another contender sees it held by b.
    let c = EtcdSession::new(etcd_settings(&endpoint, &prefix)).lease(settings("g-0", "c"));
    assert!(
        !c.acquire_within(Duration::ZERO).await.unwrap(),
        "held by b"
    );
    // b, on the etcd lease it was handed to: taken up as it is.
    let b = session_b.lease(settings("g-0", "b"));
    assert!(b.acquire().await.unwrap(), "b takes the key up");
    assert_eq!(b.backend().taken_up(), 1);
    assert_eq!(b.fencing_token().unwrap().value(), handed_0 as u64);
    // b on another etcd lease: a compare-and-swap over it, with a new token.
    let b_elsewhere =
        EtcdSession::new(etcd_settings(&endpoint, &prefix)).lease(settings("g-1", "b"));
    assert!(b_elsewhere.acquire().await.unwrap());
    assert_eq!(b_elsewhere.backend().taken_up(), 0);
    assert!(b_elsewhere.fencing_token().unwrap().value() > handed_1 as u64);
    assert!(b.release().await.unwrap());
    assert!(b_elsewhere.release().await.unwrap());
    assert!(member_b.release().await.unwrap());
}

/// Issue 48: a contender whose session watches the key's group waits on that watch's records
/// for the key to change, not on a watch of the key's own and a read: a handover to it and a
/// release each wake it (its next claim takes the handed key up, or claims the deleted one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_watching_the_group_waits_on_its_records() {
    let endpoint = endpoint();
    let prefix = unique_prefix("group-wait");
    let Pair {
        session_a,
        session_b,
        member_b,
        ..
    } = pair(&endpoint, &prefix).await;
    let group_b = session_b
        .lease(settings("g-watch", "b"))
        .watch_group("g-")
        .unwrap();
    eventually(Duration::from_secs(10), "b's group watch is listed", || {
        group_b.snapshot().is_synced()
    })
    .await;
    for (shard, handed) in [("g-0", true), ("g-1", false)] {
        let (a, b, b_wait) = held_by_a_awaited_by_b(&session_a, &session_b, shard).await;
        let a_token = a.fencing_token().unwrap();
        if handed {
            assert!(a.hand_over("b").await.unwrap());
        } else {
            assert!(a.release().await.unwrap());
        }
        let got = timeout(Duration::from_secs(20), b_wait)
            .await
            .expect("b's wait ends on the change, not at its deadline")
            .unwrap();
        assert!(got.unwrap(), "b holds {shard}");
        assert_eq!(
            b.backend().changes_seen_in_group(),
            1,
            "the group watch answered b's wait ({shard})"
        );
        assert_eq!(b.backend().taken_up(), u64::from(handed), "{shard}");
        assert!(b.fencing_token().unwrap() > a_token, "tokens rise");
        assert!(b.release().await.unwrap());
    }
    assert!(member_b.release().await.unwrap());
}

/// Issue 48: handovers sent together are written together. `a` holds 24 keys and hands them all
/// to `b` at once: batch transactions move them (one on a quiet machine; the batch lingers 1 ms
/// for the next write, so a caller preempted longer than that on a loaded machine starts a
/// second), each key at the revision of its batch (etcd's own history: as many revisions as
/// batches, no handover written alone), and every key is then in `b`'s name on `b`'s etcd
/// lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handovers_sent_together_are_written_in_one_transaction() {
    let endpoint = endpoint();
    let prefix = unique_prefix("batch");
    let pair = pair(&endpoint, &prefix).await;
    let leases: Vec<_> = (0..24)
        .map(|i| Arc::new(pair.session_a.lease(settings(&format!("g-{i}"), "a"))))
        .collect();
    for lease in &leases {
        assert!(lease.acquire().await.unwrap());
    }
    let handed = futures_util::future::join_all(leases.iter().map(|l| l.hand_over("b"))).await;
    assert!(handed.iter().all(|h| matches!(h, Ok(true))), "{handed:?}");
    let batches = pair.session_a.write_batches_sent();
    assert!(
        (1..=3).contains(&batches),
        "24 handovers sent together in {batches} batches"
    );
    let mut admin = admin_client(&endpoint).await;
    let b_lease = key_now(&mut admin, &format!("{prefix}g-member-b"))
        .await
        .unwrap()
        .1;
    let mut revisions = std::collections::BTreeSet::new();
    for i in 0..24 {
        let (value, lease, revision) = key_now(&mut admin, &format!("{prefix}g-{i}"))
            .await
            .unwrap();
        assert!(value.starts_with("b\0"), "key {i}: {value:?}");
        assert_eq!(lease, b_lease, "key {i} is on b's etcd lease");
        revisions.insert(revision);
    }
    assert_eq!(
        revisions.len() as u64,
        batches,
        "each key written by its batch, none alone: {revisions:?}"
    );
    assert!(leases
        .iter()
        .all(|l| l.backend().handed_over() == 1 && !l.check_alive()));
    drop(pair.member_b);
    drop(pair.session_b);
}

/// A batch whose compare fails for one key (it changed behind its holder's back, before its
/// holder's watch showed it) writes nothing; the other keys go on in the next batch, and the changed key's handover,
/// written alone, says it was held by another owner. Nothing is written over the key that
/// changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_changed_key_hands_the_others_over_and_not_that_one() {
    let endpoint = endpoint();
    let prefix = unique_prefix("batchfail");
    let pair = pair(&endpoint, &prefix).await;
    let leases: Vec<_> = (0..8)
        .map(|i| Arc::new(pair.session_a.lease(settings(&format!("g-{i}"), "a"))))
        .collect();
    for lease in &leases {
        assert!(lease.acquire().await.unwrap());
    }
    // a's session does not see the change (its watches broken): its tenure of key 3 still
    // looks held, as in the moment between a takeover and its event.
    pair.session_a.suspend_watches_for_tests(true);
    let mut admin = admin_client(&endpoint).await;
    admin
        .put(format!("{prefix}g-3"), "intruder", None)
        .await
        .unwrap();
    let handed = futures_util::future::join_all(leases.iter().map(|l| l.hand_over("b"))).await;
    for (i, answer) in handed.iter().enumerate() {
        if i == 3 {
            assert!(matches!(answer, Ok(false)), "key 3: {answer:?}");
        } else {
            assert!(matches!(answer, Ok(true)), "key {i}: {answer:?}");
        }
    }
    assert_eq!(
        key_now(&mut admin, &format!("{prefix}g-3"))
            .await
            .unwrap()
            .0,
        "intruder",
        "nothing was written over the changed key"
    );
    let mut revisions = std::collections::BTreeSet::new();
    for i in (0..8).filter(|&i| i != 3) {
        let (value, _, revision) = key_now(&mut admin, &format!("{prefix}g-{i}"))
            .await
            .unwrap();
        assert!(value.starts_with("b\0"), "key {i}: {value:?}");
        revisions.insert(revision);
    }
    assert_eq!(
        revisions.len(),
        1,
        "the 7 others went on in one batch: {revisions:?}"
    );
    assert_eq!(pair.session_a.write_batches_sent(), 2);
}

/// Issue 48: claims sent together are written together, as a node claims the shards a crashed
/// node held. `a` acquires 24 free keys at once while another owner holds a 25th: the 24 are
/// written in one batch transaction (one revision of the store, and each tenure's fencing token
/// is that revision), and the held key's claim, refused in its batch, answers `false` from what
/// the batch read, without a transaction of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_sent_together_are_written_in_one_transaction() {
    let endpoint = endpoint();
    let prefix = unique_prefix("batchclaim");
    let session_a = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let session_c = EtcdSession::new(etcd_settings(&endpoint, &prefix));
    let held = session_c.lease(settings("g-24", "c"));
    assert!(held.acquire().await.unwrap());
    // The session's etcd lease exists before the claims (its grant is no claim).
    let first = session_a.lease(settings("g-first", "a"));
    assert!(first.acquire().await.unwrap());
    let leases: Vec<_> = (0..25)
        .map(|i| Arc::new(session_a.lease(settings(&format!("g-{i}"), "a"))))
        .collect();
    let batches_before = session_a.write_batches_sent();
    // One attempt each (the held key's `acquire` would wait for it to be freed).
    let acquired =
        futures_util::future::join_all(leases.iter().map(|l| l.acquire_within(Duration::ZERO)))
            .await;
    for (i, answer) in acquired.iter().enumerate() {
        assert_eq!(
            answer.as_ref().ok(),
            Some(&(i != 24)),
            "key {i}: {answer:?}"
        );
    }
    let mut admin = admin_client(&endpoint).await;
    let mut revisions = std::collections::BTreeSet::new();
    for (i, lease) in leases.iter().enumerate().take(24) {
        let (value, _, revision) = key_now(&mut admin, &format!("{prefix}g-{i}"))
            .await
            .unwrap();
        assert!(value.starts_with('a'), "key {i}: {value:?}");
        assert_eq!(
            lease.fencing_token().map(|t| t.value()),
            Some(revision as u64),
            "key {i}: the token is the batch's revision"
        );
        revisions.insert(revision);
    }
    let batches = session_a.write_batches_sent() - batches_before;
    assert!(
        revisions.len() <= 2 && batches <= 3,
        "24 claims in {} revisions and {batches} batches: {revisions:?}",
        revisions.len()
    );
    assert_eq!(
        key_now(&mut admin, &format!("{prefix}g-24"))
            .await
            .unwrap()
            .0,
        "c",
        "the held key is c's still"
    );
}
