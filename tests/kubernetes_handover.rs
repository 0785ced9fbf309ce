//! `Lease::hand_over` on a real kube-apiserver: a planned move in one write. The holder's
//! compare-and-swap names the target as the holder and, in an annotation, the newest version of
//! an object held by the target that its session's watch had received; a target whose own session
//! wrote that version takes the object up without a write of its own, valid from when it sent
//! that write (a moment before the handover, on its own clock).
//!
//! Needs the test cluster (`scripts/test-cluster.sh`). Every test uses objects of its own.

mod common;

use std::sync::Arc;
use std::time::Duration;

use actix_coordination::{
    GroupWatch, KubernetesLease, KubernetesSession, KubernetesStats, Lease, LeaseSettings,
    KUBERNETES_HANDED_OVER_AFTER_ANNOTATION, KUBERNETES_HANDED_OVER_BY_ANNOTATION,
};
use common::k8s::{admin_object, env, holder_of, settings_at, unique};
use common::{event_driven_settings, eventually};
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(15);

fn settings(name: &str, owner: &str) -> LeaseSettings {
    event_driven_settings(name, owner, TTL)
}

/// A contender that tries once.
fn once(name: &str, owner: &str) -> LeaseSettings {
    settings(name, owner)
        .to_builder()
        .acquire_retries(0)
        .build()
        .unwrap()
}

fn session() -> KubernetesSession {
    KubernetesSession::new(settings_at(env().url.clone())).unwrap()
}

/// The object of lease `name`, as the API server has it now.
async fn object(name: &str) -> LeaseObject {
    admin_object(&env().namespace, name)
        .await
        .expect("the object exists")
}

fn annotation<'a>(lease: &'a LeaseObject, key: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Two sessions, of owners `a` and `b` (`<group>a` and `<group>b`: every test has owners of its
/// own, since a handover names the newest object the target holds in the whole namespace): `b`
/// holds its member lease `<group>member-b` (written by `b`'s session), and a group watch of
/// `a`'s session has seen it.
struct Pair {
    a: String,
    b: String,
    session_a: KubernetesSession,
    session_b: KubernetesSession,
    member_b: KubernetesLease,
    /// Keeps `a`'s session's namespace watch, and what it has seen, running: bind it for the
    /// whole test (a handover to a target the watch has not seen is a plain release).
    _group: GroupWatch,
}

async fn pair(group: &str) -> Pair {
    let (a, b) = (format!("{group}a"), format!("{group}b"));
    let session_a = session();
    let session_b = session();
    let member_b = session_b.lease(settings(&format!("{group}member-b"), &b));
    assert!(member_b.acquire().await.unwrap());
    let watch = session_a
        .lease(settings(&format!("{group}watch"), &a))
        .watch_group(group)
        .unwrap();
    let member = format!("{group}member-b");
    eventually(
        Duration::from_secs(10),
        "a's group watch shows b's member lease",
        || {
            watch
                .snapshot()
                .get(&member)
                .is_some_and(|r| r.holder.as_deref() == Some(b.as_str()))
        },
    )
    .await;
    Pair {
        a,
        b,
        session_a,
        session_b,
        member_b,
        _group: watch,
    }
}

/// `b` waits for lease `a` holds (until it has seen `a` hold it), then `a` hands it over to `b`
/// with one write, and `b` acquires it from its watch: `b`'s stats before the handover.
async fn hand_over_to_waiting(a: &KubernetesLease, b: &Arc<KubernetesLease>) -> KubernetesStats {
    let b_wait = tokio::spawn({
        let b = Arc::clone(b);
        async move { b.acquire_within(Duration::from_secs(30)).await }
    });
    eventually(Duration::from_secs(10), "b found the object held", || {
        b.observed_holder().as_deref() == Some(a.owner())
    })
    .await;
    let b_before = b.backend().stats();
    assert!(
        a.hand_over(b.owner()).await.unwrap(),
        "a held it: handed over"
    );
    assert!(!a.check_alive());
    assert_eq!(a.backend().stats().handed_over, 1, "a wrote a handover");
    let got = timeout(Duration::from_secs(20), b_wait)
        .await
        .expect("b gets the object from its watch, not after its retry delay")
        .unwrap();
    assert!(got.unwrap(), "b holds the lease");
    b_before
}

/// The object moves to the waiting contender in the holder's one compare-and-swap: the contender
/// holds it without a request of its own, with the next fencing token, while a third contender
/// sees it held by the target; the target's first renewal removes the handover's annotations, and
/// it releases like any other holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_moves_the_object_to_the_waiting_contender_in_one_write() {
    let group = format!("{}-", unique("hand"));
    let Pair {
        a: a_owner,
        b: b_owner,
        session_a,
        session_b,
        member_b,
        _group,
        ..
    } = pair(&group).await;
    let name = format!("{group}0");
    let a = session_a.lease(settings(&name, &a_owner));
    let b = Arc::new(session_b.lease(settings(&name, &b_owner)));
    let c = session().lease(once(&name, &format!("{group}c")));
    assert!(a.acquire().await.unwrap());
    let a_token = a.fencing_token().unwrap();

    let b_before = hand_over_to_waiting(&a, &b).await;
    let b_after = b.backend().stats();
    assert_eq!(b_after.taken_up, 1, "b took the object up");
    assert_eq!(
        b_after.requests(),
        b_before.requests(),
        "b sent no request to take it up: one write for the move"
    );
    let b_token = b.fencing_token().unwrap();
    assert_eq!(b_token.value(), a_token.value() + 1, "the next token");

    let handed = object(&name).await;
    assert_eq!(holder_of(&handed), Some(b_owner.as_str()));
    assert_eq!(
        annotation(&handed, KUBERNETES_HANDED_OVER_BY_ANNOTATION),
        Some(a_owner.as_str())
    );
    let after = annotation(&handed, KUBERNETES_HANDED_OVER_AFTER_ANNOTATION).unwrap();
    let member_object = member_b.backend().object_name().to_owned();
    assert!(
        after.starts_with(&format!("{member_object}/")),
        "the handover names a version of b's member lease: {after}"
    );

    // A third contender sees the object held by b, and does not get it.
    assert!(!c.acquire().await.unwrap(), "c took a lease b holds");
    assert_eq!(c.observed_holder().as_deref(), Some(b_owner.as_str()));

    // b renews its tenure: the annotations go, the token stays. Waits for a renewal b counts as
    // renewed (its write answered, so in the object), not for the backend's `updates`, which
    // counts the write when it is sent.
    let renewed_from = b.stats().renewals;
    eventually(TTL, "b renewed", || b.stats().renewals > renewed_from).await;
    assert!(b.check_alive());
    let renewed = object(&name).await;
    assert_eq!(holder_of(&renewed), Some(b_owner.as_str()));
    assert_eq!(
        annotation(&renewed, KUBERNETES_HANDED_OVER_BY_ANNOTATION),
        None
    );
    assert_eq!(
        annotation(&renewed, KUBERNETES_HANDED_OVER_AFTER_ANNOTATION),
        None
    );
    assert_eq!(b.fencing_token(), Some(b_token));
    assert!(b.release().await.unwrap());
    assert_eq!(holder_of(&object(&name).await), None);
}

/// A target whose session did not write the version the handover names (here: its lease lives in
/// another session than its member lease) cannot tell from its own clock when the record was
/// written: it claims it with a compare-and-swap, as a new tenure with the token after the
/// handover's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_cannot_prove_the_handover_claims_it() {
    let group = format!("{}-", unique("hand-claim"));
    let Pair {
        a: a_owner,
        b: b_owner,
        session_a,
        _group,
        ..
    } = pair(&group).await;
    let name = format!("{group}0");
    let a = session_a.lease(settings(&name, &a_owner));
    let b = Arc::new(session().lease(settings(&name, &b_owner)));
    assert!(a.acquire().await.unwrap());
    let a_token = a.fencing_token().unwrap();
    let b_before = hand_over_to_waiting(&a, &b).await;
    let b_after = b.backend().stats();
    assert_eq!(b_after.taken_up, 0, "nothing to take up without a proof");
    assert_eq!(b_after.updates, b_before.updates + 1, "one claim");
    assert_eq!(
        b.fencing_token().unwrap().value(),
        a_token.value() + 2,
        "a new tenure after the handover's"
    );
    let claimed = object(&name).await;
    assert_eq!(holder_of(&claimed), Some(b_owner.as_str()));
    assert_eq!(
        annotation(&claimed, KUBERNETES_HANDED_OVER_BY_ANNOTATION),
        None
    );
    assert!(b.release().await.unwrap());
}

/// A target that holds nothing this session has seen gets a plain release: nothing names it, and
/// the next contender claims the free object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_an_unknown_target_is_a_plain_release() {
    let group = format!("{}-", unique("hand-unknown"));
    let Pair {
        a: a_owner,
        session_a,
        _group,
        ..
    } = pair(&group).await;
    let name = format!("{group}0");
    let a = session_a.lease(settings(&name, &a_owner));
    assert!(a.acquire().await.unwrap());
    assert!(a.hand_over("nobody").await.unwrap());
    assert_eq!(a.backend().stats().handed_over, 0, "a released plainly");
    let released = object(&name).await;
    assert_eq!(holder_of(&released), None);
    assert_eq!(
        annotation(&released, KUBERNETES_HANDED_OVER_BY_ANNOTATION),
        None
    );
    let c = session().lease(once(&name, &format!("{group}c")));
    assert!(c.acquire().await.unwrap(), "free for anyone");
}

/// A target whose every object expired as the holder's session judges it (a node that crashed or
/// froze) gets a plain release too: a handover in its name would leave the lease unrun for a TTL
/// (issue 36, item 4). `b` holds its member lease with a 3 s TTL, then stops renewing; once `a`'s
/// group watch finds it expired, `a`'s handover to `b` is a plain release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_a_target_whose_objects_expired_is_a_plain_release() {
    let group = format!("{}-", unique("hand-expired"));
    let (a_owner, b_owner) = (format!("{group}a"), format!("{group}b"));
    let session_a = session();
    let session_b = session();
    let member = format!("{group}member-b");
    let short = Duration::from_secs(3);
    let member_b = session_b.lease(event_driven_settings(&member, &b_owner, short));
    assert!(member_b.acquire().await.unwrap());
    let watch = session_a
        .lease(settings(&format!("{group}watch"), &a_owner))
        .watch_group(&group)
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "a's group watch shows b's member lease",
        || {
            watch
                .snapshot()
                .get(&member)
                .is_some_and(|r| r.holder.as_deref() == Some(b_owner.as_str()))
        },
    )
    .await;
    // b stops renewing (a crash: no release), and a's watch sees its claim expire.
    drop(member_b);
    drop(session_b);
    eventually(short * 3, "b's member lease expires in a's view", || {
        watch
            .snapshot()
            .live_holder(&member, tokio::time::Instant::now())
            .is_none()
    })
    .await;
    let name = format!("{group}0");
    let a = session_a.lease(settings(&name, &a_owner));
    assert!(a.acquire().await.unwrap());
    assert!(a.hand_over(&b_owner).await.unwrap());
    assert_eq!(a.backend().stats().handed_over, 0, "a released plainly");
    let released = object(&name).await;
    assert_eq!(holder_of(&released), None, "nothing names b");
    let c = session().lease(once(&name, &format!("{group}c")));
    assert!(c.acquire().await.unwrap(), "free for anyone");
}
