//! Bound tenures on the in-memory store (see `actix_coordination::Binding`), under Tokio's paused
//! clock: a lease bound to a member lease is claimed once and never renewed, its deadline is the
//! member's (moved by every member renewal), it ends with the member tenure (`Unbound` when the
//! member is released, lost or replaced, `Expired` when the member expires), and contenders count
//! its record free exactly when the store counts the member tenure gone.
//!
//! Each test asserts something that a broken binding would change: renewals that grow with the
//! number of bound leases, a deadline or a store expiry that does not follow the member, a bound
//! record free while its member lives (or held after it ended), a bound tenure that outlives its
//! member, an error that reads as "held by another owner".

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_coordination::{
    AcquireAttempt, Binding, FencingToken, InMemoryBackend, InMemoryError, InMemoryFault,
    InMemoryLease, InMemoryStore, Lease, LeaseBackend, LeaseError, LeaseLost, LeaseSettings,
    LostReason, LostSubscription,
};
use tokio::time::{sleep, sleep_until, Instant};

const TTL: Duration = Duration::from_secs(3);
const INTERVAL: Duration = Duration::from_secs(1);

fn settings(name: &str, owner: &str) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(TTL)
        .renewal_interval(INTERVAL)
        .operation_timeout(Duration::from_millis(800))
        .acquire_retries(0)
        .build()
        .unwrap()
}

fn member_name(owner: &str) -> String {
    format!("bind.member.{owner}")
}

fn shard_name(shard: usize) -> String {
    format!("bind.shard.{shard}")
}

/// One owner: its member lease and its leases of `shards`, each bound to the member.
struct Node {
    member: InMemoryLease,
    shards: Vec<InMemoryLease>,
}

fn node(store: &InMemoryStore, owner: &str, shards: usize) -> Node {
    let member = store.lease(settings(&member_name(owner), owner));
    let anchor = member
        .binding_anchor()
        .expect("the in-memory backend binds");
    let shards = (0..shards)
        .map(|s| {
            let lease = store.lease(settings(&shard_name(s), owner));
            lease.bind_to(&anchor).expect("bound");
            lease
        })
        .collect();
    Node { member, shards }
}

impl Node {
    /// The member, then every shard, acquired.
    async fn hold_all(&self) {
        assert!(self.member.acquire().await.unwrap(), "member acquired");
        for shard in &self.shards {
            assert!(shard.acquire().await.unwrap(), "{} acquired", shard.name());
        }
    }
}

/// Every loss of `lease`: when it was reported and why.
type Losses = Arc<Mutex<Vec<(Instant, LostReason)>>>;

fn losses(lease: &InMemoryLease) -> (LostSubscription, Losses) {
    let seen: Losses = Arc::default();
    let subscription = lease.on_lost({
        let seen = Arc::clone(&seen);
        move |lost: &LeaseLost| {
            seen.lock()
                .unwrap()
                .push((Instant::now(), lost.reason.clone()))
        }
    });
    (subscription, seen)
}

fn unbound(owner: &str) -> LostReason {
    LostReason::Unbound {
        member: member_name(owner),
    }
}

/// One renewal of the member renews all 16 bound leases: the store counts the member's renewals
/// only, every bound deadline is the member's after each renewal, and the store's expiry of each
/// bound record is the member record's.
#[tokio::test(start_paused = true)]
async fn one_member_renewal_renews_every_bound_lease() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 16);
    let subscriptions: Vec<_> = a.shards.iter().map(losses).collect();
    a.hold_all().await;
    let held_at = Instant::now();
    let before = store.stats();
    let mut last_deadline = a.member.deadline().unwrap();
    for shard in &a.shards {
        assert_eq!(shard.deadline(), Some(last_deadline), "{}", shard.name());
    }
    // Ten renewal intervals, looking a little after each renewal.
    for k in 1..=10u32 {
        sleep_until(held_at + INTERVAL * k + Duration::from_millis(10)).await;
        let stats = store.stats();
        assert_eq!(
            stats.renewals - before.renewals,
            u64::from(k),
            "after {k} intervals the store renewed the member only (not {} records)",
            1 + a.shards.len()
        );
        assert_eq!(stats.acquires, before.acquires, "no claim was made again");
        let deadline = a.member.deadline().expect("the member is held");
        assert!(
            deadline > last_deadline,
            "the member renewal moved its deadline"
        );
        last_deadline = deadline;
        let member_expiry = store
            .record(&member_name("a"))
            .and_then(|r| r.expires_at)
            .unwrap();
        for shard in &a.shards {
            assert!(
                shard.check_alive(),
                "{} alive after {k} intervals",
                shard.name()
            );
            assert_eq!(
                shard.deadline(),
                Some(deadline),
                "{}'s deadline is the member's",
                shard.name()
            );
            let record = store.record(shard.name()).unwrap();
            assert_eq!(record.holder.as_deref(), Some("a"));
            assert_eq!(
                record.expires_at,
                Some(member_expiry),
                "the store's expiry of {} follows the member record's",
                shard.name()
            );
        }
    }
    // Ten seconds: more than three TTLs with no write to any bound record.
    assert!(held_at.elapsed() > TTL * 3);
    for (shard, (_, lost)) in a.shards.iter().zip(&subscriptions) {
        assert!(lost.lock().unwrap().is_empty(), "{} lost", shard.name());
        assert_eq!(store.holder(shard.name()).as_deref(), Some("a"));
    }
}

/// A contender never gets a bound lease while the member lives; it gets it the moment the member
/// is released, and the bound tenure ended (`Unbound`) before the member's release reached the
/// store.
#[tokio::test(start_paused = true)]
async fn a_bound_lease_is_held_while_its_member_lives_and_free_once_it_is_released() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 1);
    let b = node(&store, "b", 1);
    a.hold_all().await;
    assert!(b.member.acquire().await.unwrap());
    let shard = shard_name(0);
    let token_a = a.shards[0].fencing_token().unwrap();

    // Five TTLs of asking: never.
    let start = Instant::now();
    assert!(!b.shards[0].acquire_within(TTL * 5).await.unwrap());
    assert!(start.elapsed() >= TTL * 5);
    assert!(!b.shards[0].check_alive());
    assert!(a.shards[0].check_alive());
    assert_eq!(store.holder(&shard).as_deref(), Some("a"));

    // The probe: what the bound lease's loss saw of the member record, and when the member's
    // release returned.
    let order: Arc<Mutex<Vec<String>>> = Arc::default();
    let _probe = a.shards[0].on_lost({
        let (order, store) = (Arc::clone(&order), store.clone());
        move |lost: &LeaseLost| {
            order.lock().unwrap().push(format!(
                "lost {:?}, member held by {:?}",
                lost.reason,
                store.holder(&member_name("a"))
            ));
        }
    });
    assert!(a.member.release().await.unwrap());
    order.lock().unwrap().push("member released".into());
    assert_eq!(
        *order.lock().unwrap(),
        [
            format!("lost {:?}, member held by Some(\"a\")", unbound("a")),
            "member released".into()
        ],
        "the bound tenure ended before the member's release was sent"
    );
    assert!(!a.shards[0].check_alive());

    // Free at once.
    let released_at = Instant::now();
    assert!(b.shards[0].acquire().await.unwrap());
    assert_eq!(released_at.elapsed(), Duration::ZERO);
    assert!(b.shards[0].fencing_token().unwrap() > token_a);
    assert_eq!(store.holder(&shard).as_deref(), Some("b"));
}

/// A member record taken by someone else ends the bound tenure at once (`Unbound`), and a
/// contender gets the bound lease at once.
#[tokio::test(start_paused = true)]
async fn a_member_taken_over_ends_its_bound_tenures_at_once() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 2);
    let b = node(&store, "b", 2);
    a.hold_all().await;
    assert!(b.member.acquire().await.unwrap());
    let (_m, member_lost) = losses(&a.member);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _subscriptions: Vec<_> = a
        .shards
        .iter()
        .map(|shard| {
            let tx = tx.clone();
            shard.on_lost(move |lost: &LeaseLost| {
                let _ = tx.send((Instant::now(), lost.reason.clone()));
            })
        })
        .collect();
    sleep(INTERVAL / 2).await;
    let taken_at = Instant::now();
    store.force_take(&member_name("a"), "x", TTL);
    for _ in 0..2 {
        let (at, reason) = rx.recv().await.unwrap();
        assert_eq!(at, taken_at, "ended at once");
        assert_eq!(reason, unbound("a"));
    }
    assert_eq!(
        member_lost.lock().unwrap().as_slice(),
        [(
            taken_at,
            LostReason::TakenOver {
                holder: Some("x".into())
            }
        )]
    );
    for (mine, theirs) in a.shards.iter().zip(&b.shards) {
        assert!(!mine.check_alive());
        assert!(
            theirs.acquire().await.unwrap(),
            "{} free at once",
            theirs.name()
        );
    }
    assert_eq!(Instant::now(), taken_at);
}

/// A member that expires (its owner paused) takes every bound tenure with it at the same
/// instant, as expired; a contender gets the bound leases only after that instant.
#[tokio::test(start_paused = true)]
async fn a_member_that_expires_takes_its_bound_tenures_with_it() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 3);
    let b = node(&store, "b", 3);
    a.hold_all().await;
    assert!(b.member.acquire().await.unwrap());
    let (_m, member_lost) = losses(&a.member);
    let subscriptions: Vec<_> = a.shards.iter().map(losses).collect();
    sleep(INTERVAL * 2 + INTERVAL / 2).await;
    store.pause("a");
    let deadline = a.member.deadline().unwrap();
    for shard in &a.shards {
        assert_eq!(shard.deadline(), Some(deadline));
    }
    // Up to the instant, everything of a's holds and b gets nothing.
    for shard in &b.shards {
        assert!(
            !shard.acquire().await.unwrap(),
            "{} held by a",
            shard.name()
        );
    }
    sleep_until(deadline - Duration::from_millis(1)).await;
    assert!(a.member.check_alive());
    for (mine, theirs) in a.shards.iter().zip(&b.shards) {
        assert!(mine.check_alive());
        assert!(
            !theirs.acquire().await.unwrap(),
            "{} held by a",
            theirs.name()
        );
    }
    sleep_until(deadline).await;
    assert!(!a.member.check_alive());
    for shard in &a.shards {
        assert!(
            !shard.check_alive(),
            "{} ended with its member",
            shard.name()
        );
    }
    // Reported at the member's deadline, as expired (each report names its own instant).
    sleep(Duration::from_millis(1)).await;
    let expired = |reason: &LostReason| matches!(reason, LostReason::Expired { .. });
    let member_lost = member_lost.lock().unwrap().clone();
    assert!(
        member_lost.len() == 1 && member_lost[0].0 == deadline && expired(&member_lost[0].1),
        "{member_lost:?}"
    );
    for (shard, (_, lost)) in a.shards.iter().zip(&subscriptions) {
        let lost = lost.lock().unwrap().clone();
        assert!(
            lost.len() == 1 && lost[0].0 == deadline && expired(&lost[0].1),
            "{}: {lost:?}",
            shard.name()
        );
    }
    // b gets each bound lease, but only after that instant (once the store's member record
    // expired).
    for shard in &b.shards {
        assert!(shard.acquire_within(TTL).await.unwrap());
        assert!(Instant::now() > deadline);
    }
    let member_expiry = store
        .record(&member_name("a"))
        .and_then(|r| r.expires_at)
        .unwrap();
    assert!(Instant::now() >= member_expiry);
}

/// A bound claim is not sent while the member's renewals are late enough that its tenure ends
/// sooner than the claim may take to be answered: it fails at once with `MemberEnding`
/// (transient), nothing sent, and is sent again once a renewal moved the deadline.
#[tokio::test(start_paused = true)]
async fn no_claim_is_sent_that_cannot_be_answered_before_the_member_tenure_ends() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 2);
    assert!(a.member.acquire().await.unwrap());
    assert!(
        a.shards[0].acquire().await.unwrap(),
        "a healthy member: claims go"
    );
    // The member's renewals hang from now on: its deadline comes closer.
    store.pause("a");
    let deadline = a.member.deadline().unwrap();
    sleep_until(deadline - Duration::from_millis(500)).await;
    assert!(a.member.check_alive());
    let before = store.stats();
    let error = a.shards[1].acquire().await.unwrap_err();
    assert!(
        matches!(&error, LeaseError::MemberEnding { member, left, timeout }
            if *member == member_name("a")
                && *left <= Duration::from_millis(500)
                && *timeout == Duration::from_millis(800)),
        "{error}"
    );
    assert!(error.is_transient());
    assert_eq!(store.stats().calls, before.calls, "nothing was sent");
    assert!(store.record(&shard_name(1)).is_none(), "never claimed");
}

/// The errors: an acquire with no member tenure is `Unbound` (never "held by another"), and the
/// bindings `bind_to` refuses.
#[tokio::test(start_paused = true)]
async fn binding_errors() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 1);
    let before = store.stats();
    let error = a.shards[0].acquire().await.unwrap_err();
    assert!(
        matches!(&error, LeaseError::Unbound { member } if *member == member_name("a")),
        "{error}"
    );
    assert!(error.is_transient());
    assert_eq!(store.stats().calls, before.calls, "nothing was sent");
    let error = a.shards[0].acquire_within(TTL).await.unwrap_err();
    assert!(matches!(error, LeaseError::Unbound { .. }), "{error}");
    // After the member's release too.
    assert!(a.member.acquire().await.unwrap());
    assert!(a.member.release().await.unwrap());
    let error = a.shards[0].acquire().await.unwrap_err();
    assert!(matches!(error, LeaseError::Unbound { .. }), "{error}");
    assert!(store.record(&shard_name(0)).is_none(), "never claimed");

    // bind_to: a lease bound to another lease already, a lease bound to itself, an anchor of
    // another store, an anchor whose lease is bound itself. Binding again to the same anchor
    // changes nothing (a lease built again from a provider's cache).
    let unsupported = |result: Result<(), LeaseError>| {
        assert!(
            matches!(result, Err(LeaseError::Unsupported { .. })),
            "{result:?}"
        );
    };
    let anchor = a.member.binding_anchor().unwrap();
    a.shards[0].bind_to(&anchor).unwrap();
    assert_eq!(a.shards[0].bound_to(), Some(member_name("a")));
    let second = store.lease(settings("bind.second-member", "a"));
    unsupported(a.shards[0].bind_to(&second.binding_anchor().unwrap()));
    assert!(
        a.shards[0].binding_anchor().is_none(),
        "a bound lease anchors nothing"
    );
    let lone = store.lease(settings("bind.lone", "a"));
    unsupported(lone.bind_to(&lone.binding_anchor().unwrap()));
    let other_store = InMemoryStore::new();
    let elsewhere = other_store.lease(settings(&member_name("a"), "a"));
    unsupported(lone.bind_to(&elsewhere.binding_anchor().unwrap()));
    assert_eq!(lone.bound_to(), None, "a refused binding binds nothing");
    lone.bind_to(&anchor).unwrap();
    assert_eq!(lone.bound_to(), Some(member_name("a")));

    // The store refuses a bound claim naming a member tenure it does not hold for the owner
    // (here an incarnation the member never had), and writes nothing.
    assert!(a.member.acquire().await.unwrap());
    let incarnation = a.member.fencing_token().unwrap().value();
    let backend = InMemoryBackend::new(&store);
    let stale = Binding::new(member_name("a"), (incarnation + 7).to_string());
    let refused = backend
        .try_acquire_bound(&settings(&shard_name(0), "a"), &stale)
        .await;
    assert!(
        matches!(refused, Err(InMemoryError::Unbound { .. })),
        "{refused:?}"
    );
    let other_owner = Binding::new(member_name("a"), incarnation.to_string());
    let refused = backend
        .try_acquire_bound(&settings(&shard_name(0), "b"), &other_owner)
        .await;
    assert!(
        matches!(refused, Err(InMemoryError::Unbound { .. })),
        "{refused:?}"
    );
    assert!(store.record(&shard_name(0)).is_none(), "nothing written");
}

/// A member acquired again is a new incarnation: the records bound to the old one are free (a
/// contender takes them at once) although the same owner holds the member, and a bound claim
/// under the new one is a new claim with a higher token.
#[tokio::test(start_paused = true)]
async fn a_new_member_tenure_frees_the_records_of_the_old_one() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 2);
    let b = node(&store, "b", 2);
    a.hold_all().await;
    assert!(b.member.acquire().await.unwrap());
    let old: Vec<FencingToken> = a
        .shards
        .iter()
        .map(|s| s.fencing_token().unwrap())
        .collect();
    let (_s, lost) = losses(&a.shards[1]);
    assert!(a.member.release().await.unwrap());
    assert_eq!(
        lost.lock().unwrap().last().map(|l| l.1.clone()),
        Some(unbound("a"))
    );
    assert!(a.member.acquire().await.unwrap());
    let at = Instant::now();
    assert!(b.shards[0].acquire().await.unwrap(), "free at once");
    assert_eq!(at.elapsed(), Duration::ZERO);
    assert!(a.shards[1].acquire().await.unwrap());
    let fresh = a.shards[1].fencing_token().unwrap();
    assert!(fresh > old[1], "{fresh} after {}", old[1]);
    assert_eq!(a.shards[1].deadline(), a.member.deadline());
    // And a's shard 0 is b's now: a cannot take it back while b's member lives.
    assert!(!a.shards[0].acquire().await.unwrap());
}

/// A crash (every lease dropped, nothing released) leaves the records held until the member
/// record expires; the owner's new instance acquiring the member again (a new incarnation, at
/// once: the record is its own) frees the records bound to the old one at once.
#[tokio::test(start_paused = true)]
async fn a_crashed_member_reacquired_frees_the_old_bound_records() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 2);
    let b = node(&store, "b", 2);
    a.hold_all().await;
    assert!(b.member.acquire().await.unwrap());
    let member_token = a.member.fencing_token().unwrap();
    drop(a);
    assert!(
        !b.shards[0].acquire().await.unwrap(),
        "held until the member record expires"
    );
    sleep(INTERVAL).await;
    assert!(!b.shards[0].acquire().await.unwrap(), "still held");
    let a = node(&store, "a", 2);
    assert!(a.member.acquire().await.unwrap());
    assert!(a.member.fencing_token().unwrap() > member_token);
    let at = Instant::now();
    assert!(b.shards[0].acquire().await.unwrap(), "free at once");
    assert!(a.shards[1].acquire().await.unwrap());
    assert_eq!(at.elapsed(), Duration::ZERO);
}

/// The group view: a bound record is held while its member lives, through many TTLs without a
/// write, and not held once the member is released or expired.
#[tokio::test(start_paused = true)]
async fn the_group_view_judges_a_bound_record_by_its_member() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 1);
    let watch = a.member.watch_group("bind.").unwrap();
    let shard = shard_name(0);
    a.hold_all().await;
    let token = store.record(&shard).unwrap().token;
    let snapshot = watch.snapshot();
    let record = snapshot.get(&shard).unwrap();
    assert_eq!(
        record.expires_at, None,
        "a bound record has no expiry of its own"
    );
    assert_eq!(
        record.bound_to,
        Some(Binding::new(
            member_name("a"),
            a.member.fencing_token().unwrap().value().to_string()
        ))
    );
    for _ in 0..5 {
        sleep(TTL).await;
        assert_eq!(
            watch.snapshot().live_holder(&shard, Instant::now()),
            Some("a"),
            "held while the member lives"
        );
    }
    assert_eq!(
        store.record(&shard).unwrap().token,
        token,
        "no write to the record"
    );
    assert!(a.member.release().await.unwrap());
    assert_eq!(watch.snapshot().live_holder(&shard, Instant::now()), None);

    // Expired: the member's owner paused, its record expires in the store.
    assert!(a.member.acquire().await.unwrap());
    assert!(a.shards[0].acquire().await.unwrap());
    assert_eq!(
        watch.snapshot().live_holder(&shard, Instant::now()),
        Some("a")
    );
    store.pause("a");
    let expiry = store
        .record(&member_name("a"))
        .and_then(|r| r.expires_at)
        .unwrap();
    sleep_until(expiry - Duration::from_millis(1)).await;
    assert_eq!(
        watch.snapshot().live_holder(&shard, Instant::now()),
        Some("a")
    );
    assert_eq!(store.holder(&shard).as_deref(), Some("a"));
    sleep_until(expiry).await;
    assert_eq!(
        watch.snapshot().live_holder(&shard, Instant::now()),
        None,
        "not held once the member record expired"
    );
    assert_eq!(store.holder(&shard), None);
}

/// A bound lease handed over to an owner whose lease is bound to its own member: the target
/// claims it anew, bound to its member (a higher token, the member's deadline, held past a TTL
/// without renewal), and the giver's tenure ended without a loss.
#[tokio::test(start_paused = true)]
async fn a_bound_lease_handed_over_is_claimed_bound_by_the_target() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 1);
    let b = node(&store, "b", 1);
    a.hold_all().await;
    assert!(b.member.acquire().await.unwrap());
    let watch = a.member.watch_group("bind.").unwrap();
    let (_s, lost) = losses(&a.shards[0]);
    let token_a = a.shards[0].fencing_token().unwrap();
    let shard = shard_name(0);
    assert!(a.shards[0].hand_over("b").await.unwrap());
    assert!(!a.shards[0].check_alive());
    assert_eq!(a.shards[0].fencing_token(), None);
    assert_eq!(store.holder(&shard).as_deref(), Some("b"));
    assert!(b.shards[0].acquire().await.unwrap());
    let token_b = b.shards[0].fencing_token().unwrap();
    assert!(token_b > token_a);
    assert_eq!(
        store.record(&shard).unwrap().token,
        token_b,
        "a claim of b's own"
    );
    assert_eq!(b.shards[0].deadline(), b.member.deadline());
    assert_eq!(
        watch.snapshot().get(&shard).unwrap().bound_to,
        Some(Binding::new(
            member_name("b"),
            b.member.fencing_token().unwrap().value().to_string()
        )),
        "bound to b's member"
    );
    sleep(TTL * 2).await;
    assert!(b.shards[0].check_alive());
    assert_eq!(store.holder(&shard).as_deref(), Some("b"));
    assert!(!a.shards[0].acquire().await.unwrap(), "b's now");
    assert!(lost.lock().unwrap().is_empty(), "a handover is no loss");
    // And b's tenure lives by b's member.
    assert!(b.member.release().await.unwrap());
    assert!(!b.shards[0].check_alive());
    assert!(a.shards[0].acquire().await.unwrap());
}

/// The store's check that a bound claim names a live member tenure of its owner, through
/// the backend directly: a claim under the member's live incarnation is bound, and taken by
/// nobody else while the member lives.
#[tokio::test(start_paused = true)]
async fn a_bound_claim_through_the_backend_lives_by_the_member_record() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 0);
    assert!(a.member.acquire().await.unwrap());
    let backend = InMemoryBackend::new(&store);
    let binding = Binding::new(
        member_name("a"),
        a.member.fencing_token().unwrap().value().to_string(),
    );
    let claimed = backend
        .try_acquire_bound(&settings(&shard_name(0), "a"), &binding)
        .await
        .unwrap();
    assert!(matches!(claimed, AcquireAttempt::Acquired { .. }));
    sleep(TTL * 3).await;
    let other = backend
        .try_acquire(&settings(&shard_name(0), "b"))
        .await
        .unwrap();
    assert!(
        matches!(other, AcquireAttempt::HeldByOther { ref holder, .. } if holder.as_deref() == Some("a")),
        "the bound record is held while its member lives"
    );
    drop(a);
    // The member record expires a TTL after its last renewal: then the bound record is free.
    sleep(TTL).await;
    let other = backend
        .try_acquire(&settings(&shard_name(0), "b"))
        .await
        .unwrap();
    assert!(matches!(other, AcquireAttempt::Acquired { .. }));
}

/// A lease bound to a lease that is itself bound (a chain): the store counts a record bound to a
/// bound record free (only a plain member claim keeps it held), so such a claim must fail, never
/// start a tenure that a contender can overlap. (Before the fix the chained acquire succeeded and
/// a contender took the record at once while the chained tenure was alive.)
#[tokio::test(start_paused = true)]
async fn a_lease_bound_to_a_bound_lease_never_holds_a_free_record() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 1);
    let b = node(&store, "b", 0);
    a.hold_all().await;
    assert!(b.member.acquire().await.unwrap());
    let chained = store.lease(settings("bind.chained", "a"));
    let contender = store.lease(settings("bind.chained", "b"));
    contender
        .bind_to(&b.member.binding_anchor().unwrap())
        .unwrap();
    // A bound lease hands out no anchor, and an anchor taken before its lease was bound is
    // refused once it is.
    assert!(a.shards[0].binding_anchor().is_none());
    let middle = store.lease(settings("bind.middle", "a"));
    let early = middle.binding_anchor().unwrap();
    middle.bind_to(&a.member.binding_anchor().unwrap()).unwrap();
    assert!(matches!(
        chained.bind_to(&early),
        Err(LeaseError::Unsupported { .. })
    ));
    assert_eq!(chained.bound_to(), None);
    // The store refuses such a claim too (a backend used without `ManagedLease`): nothing is
    // written.
    assert!(middle.acquire().await.unwrap());
    let refused = InMemoryBackend::new(&store)
        .try_acquire_bound(
            &settings("bind.chained", "a"),
            &Binding::new(
                "bind.middle",
                middle.fencing_token().unwrap().value().to_string(),
            ),
        )
        .await;
    assert!(
        matches!(refused, Err(InMemoryError::Unbound { .. })),
        "{refused:?}"
    );
    assert!(!chained.check_alive());
    assert!(store.record("bind.chained").is_none(), "nothing written");
    assert!(contender.acquire().await.unwrap());
    assert!(!chained.check_alive());
}

/// A bound record does not expire while its member lives, so a release that fails (its outcome
/// unknown: here the store hangs for the owner, and the release times out) must not leave it
/// held for as long as the member: once the store answers again, the lease releases the claim
/// itself, and a contender gets the shard while the holder's member still lives (issue 37, item
/// 4: a release that times out costs no TTL, and a bound one no more than that).
#[tokio::test(start_paused = true)]
async fn a_bound_release_that_timed_out_is_released_once_the_store_answers() {
    let store = InMemoryStore::new();
    let a = node(&store, "a", 1);
    let b = node(&store, "b", 1);
    a.hold_all().await;
    assert!(b.member.acquire().await.unwrap());
    store.set_owner_fault("a", Some(InMemoryFault::Hang));
    let error = a.shards[0].release().await.unwrap_err();
    assert!(matches!(error, LeaseError::Timeout { .. }), "{error}");
    store.heal("a");
    assert_eq!(
        store.holder(&shard_name(0)).as_deref(),
        Some("a"),
        "the release never reached the store"
    );
    // The member survives the hang (its renewal is retried in time) and lives on.
    let start = Instant::now();
    let taken = loop {
        assert!(a.member.check_alive(), "a's member lives throughout");
        if b.shards[0].acquire().await.unwrap() {
            break Instant::now();
        }
        assert!(
            start.elapsed() < TTL,
            "the claim whose release failed is still held after a TTL"
        );
        sleep(Duration::from_millis(50)).await;
    };
    assert!(taken - start < INTERVAL * 2, "released at the first retry");
    assert!(a.member.check_alive());
    assert!(!a.shards[0].check_alive());
    assert!(a.shards[0].release().await.unwrap(), "nothing of a's left");
}

/// A bound tenure released after its deadline, before its renewal task could tell (a process
/// frozen past its TTL, then told to release: a node back from `SIGSTOP`), writes nothing: its
/// member tenure has ended, so the record is free by the binding rule already, and may have been
/// listed to a target since (`protocol::may_write_own`). Real time on a runtime of its own,
/// frozen by blocking its thread.
#[test]
fn a_bound_tenure_released_after_its_deadline_writes_nothing() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = InMemoryStore::new();
        let ttl = Duration::from_millis(600);
        let settings = |name: &str| {
            LeaseSettings::builder(name, "a")
                .ttl(ttl)
                .renewal_interval(Duration::from_millis(200))
                .operation_timeout(Duration::from_millis(150))
                .acquire_retries(0)
                .build()
                .unwrap()
        };
        let member = store.lease(settings(&member_name("a")));
        let shard = store.lease(settings(&shard_name(0)));
        shard.bind_to(&member.binding_anchor().unwrap()).unwrap();
        assert!(member.acquire().await.unwrap());
        assert!(shard.acquire().await.unwrap());
        let before = store.stats();
        // Frozen: nothing of this runtime runs for twice the TTL.
        std::thread::sleep(ttl * 2);
        assert!(shard.release().await.unwrap(), "nothing of its own left");
        assert_eq!(
            store.stats().releases,
            before.releases,
            "no release reached the store"
        );
        assert!(!shard.check_alive());
    });
}

/// An in-memory backend whose bound claims are applied at once but answered `delay` later (a
/// slow way back), while everything else — the member's renewals — is answered promptly.
struct LateBoundClaims {
    inner: InMemoryBackend,
    delay: Duration,
}

impl LeaseBackend for LateBoundClaims {
    type Tenure = actix_coordination::InMemoryTenure;
    type Error = InMemoryError;

    fn store_id(&self) -> Option<String> {
        self.inner.store_id()
    }

    async fn try_acquire(
        &self,
        settings: &LeaseSettings,
    ) -> Result<AcquireAttempt<Self::Tenure>, InMemoryError> {
        self.inner.try_acquire(settings).await
    }

    async fn renew(
        &self,
        settings: &LeaseSettings,
        tenure: &mut Self::Tenure,
    ) -> Result<actix_coordination::RenewOutcome, InMemoryError> {
        self.inner.renew(settings, tenure).await
    }

    async fn release(
        &self,
        settings: &LeaseSettings,
        tenure: Self::Tenure,
    ) -> Result<actix_coordination::ReleaseOutcome, InMemoryError> {
        self.inner.release(settings, tenure).await
    }

    fn binds(&self) -> bool {
        true
    }

    fn incarnation(&self, tenure: &Self::Tenure) -> Option<String> {
        self.inner.incarnation(tenure)
    }

    async fn try_acquire_bound(
        &self,
        settings: &LeaseSettings,
        binding: &Binding,
    ) -> Result<AcquireAttempt<Self::Tenure>, InMemoryError> {
        let answer = self.inner.try_acquire_bound(settings, binding).await;
        sleep(self.delay).await;
        answer
    }
}

/// `owner`'s member lease, and its lease of shard 0 bound to it, whose claims are answered
/// `delay` late (the shard lease's operation timeout is longer than that).
fn late_answered_node(
    store: &InMemoryStore,
    owner: &str,
    delay: Duration,
) -> (
    InMemoryLease,
    actix_coordination::ManagedLease<LateBoundClaims>,
) {
    let member = store.lease(settings(&member_name(owner), owner));
    let shard_settings = LeaseSettings::builder(shard_name(0), owner)
        .ttl(Duration::from_secs(60))
        .operation_timeout(Duration::from_secs(5))
        .acquire_retries(0)
        .build()
        .unwrap();
    let shard = actix_coordination::ManagedLease::from_backend(
        shard_settings,
        LateBoundClaims {
            inner: InMemoryBackend::new(store),
            delay,
        },
    );
    shard.bind_to(&member.binding_anchor().unwrap()).unwrap();
    (member, shard)
}

/// Issue 47, item 6: a bound claim answered after the member deadline that held when it was
/// sent, while the member was renewed meanwhile, is judged by the member tenure as it is when
/// the answer comes: it starts a tenure with the member's deadline now (it used to be abandoned,
/// and released).
#[tokio::test(start_paused = true)]
async fn a_bound_claim_answered_late_is_judged_by_its_member_tenure_as_it_is_then() {
    let store = InMemoryStore::new();
    let (member, shard) = late_answered_node(&store, "a", TTL + INTERVAL);
    assert!(member.acquire().await.unwrap());
    let deadline_at_send = member.deadline().unwrap();
    let before = store.stats();
    assert!(
        shard.acquire().await.unwrap(),
        "a claim answered under the member tenure it was made under holds"
    );
    assert!(Instant::now() > deadline_at_send, "answered past it");
    assert!(shard.check_alive());
    assert_eq!(
        shard.deadline(),
        member.deadline(),
        "the member's deadline now"
    );
    assert_eq!(
        store.stats().releases,
        before.releases,
        "nothing was released"
    );
    let record = store.record(&shard_name(0)).unwrap();
    assert_eq!(record.holder.as_deref(), Some("a"));
}

/// A bound claim answered after its member tenure ended (released meanwhile) starts nothing and
/// writes nothing more: the record names an incarnation that is over, and another owner claims
/// it at once (`protocol::keep_bound_claim`).
#[tokio::test(start_paused = true)]
async fn a_bound_claim_answered_after_its_member_tenure_ended_writes_nothing() {
    let store = InMemoryStore::new();
    let (member, shard) = late_answered_node(&store, "a", INTERVAL);
    let b = node(&store, "b", 1);
    assert!(member.acquire().await.unwrap());
    assert!(b.member.acquire().await.unwrap());
    let claim = {
        let shard = Arc::new(shard);
        let claiming = Arc::clone(&shard);
        (tokio::spawn(async move { claiming.acquire().await }), shard)
    };
    sleep(INTERVAL / 2).await;
    assert!(member.release().await.unwrap(), "the member tenure ends");
    let before = store.stats();
    let answer = claim.0.await.unwrap();
    assert!(
        matches!(answer, Err(LeaseError::Unbound { .. })),
        "{answer:?}"
    );
    assert!(!claim.1.check_alive());
    assert_eq!(
        store.stats().releases,
        before.releases,
        "the claim answered late was not released"
    );
    assert!(
        b.shards[0].acquire().await.unwrap(),
        "free by the binding rule: b claims it at once"
    );
}
