//! `Lease::retire_handing` on a real kube-apiserver: a member lease that leaves hands its bound
//! shards on in the one write that releases its object, each target claims its shards at once
//! with a compare-and-swap of its own (never taken up without a write: issue 47), and a
//! contender never holds a handed shard while its target's member lives (issue 37: a graceful
//! leave of 16 × 4,096 names every target in one write). And the rule that makes the one write
//! safe: a contender that finds a member expired releases its object first, so that a handover
//! landing late is refused.
//!
//! Needs the test cluster (`scripts/test-cluster.sh`). Every test uses objects of its own.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use actix_coordination::{
    kubernetes_object_name as object_name, Binding, GroupSnapshot, HandedShard, KubernetesLease,
    KubernetesSession, Lease, LeaseSettings, KUBERNETES_BOUND_DURATION_SECS,
    KUBERNETES_BOUND_INCARNATION_ANNOTATION, KUBERNETES_BOUND_TO_ANNOTATION,
    KUBERNETES_HANDED_SHARDS_ANNOTATION, KUBERNETES_LEASE_NAME_ANNOTATION,
};
use common::event_driven_settings;
use common::k8s::{admin_object, client, env, holder_of, settings_at, unique};
use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::Api;
use tokio::time::{sleep, timeout, Instant};

const TTL: Duration = Duration::from_secs(15);

/// One attempt per `acquire` (a shard another owner holds answers `false` at once).
fn settings(name: &str, owner: &str) -> LeaseSettings {
    event_driven_settings(name, owner, TTL)
        .to_builder()
        .acquire_retries(0)
        .build()
        .unwrap()
}

fn admin() -> Api<LeaseObject> {
    Api::namespaced(client(&env().url, &env().admin_token), &env().namespace)
}

/// `owner`'s member lease of `group` and its shard leases `shards`, bound to it.
fn node(
    session: &KubernetesSession,
    group: &str,
    owner: &str,
    shards: &[String],
) -> (KubernetesLease, Vec<KubernetesLease>) {
    let member = session.lease(settings(&format!("{group}.member.{owner}"), owner));
    let anchor = member.binding_anchor().unwrap();
    let shards = shards
        .iter()
        .map(|name| {
            let shard = session.lease(settings(name, owner));
            shard.bind_to(&anchor).unwrap();
            shard
        })
        .collect();
    (member, shards)
}

/// Waits (at most 20 s) until `lease`'s group watch of `group` shows `what`.
async fn watch_until(
    lease: &KubernetesLease,
    group: &str,
    what: &str,
    done: impl Fn(&GroupSnapshot) -> bool,
) {
    let mut watch = lease.watch_group(group).expect("a group watch");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(&watch.snapshot()) {
        timeout(deadline - Instant::now(), watch.changed())
            .await
            .unwrap_or_else(|_| panic!("{what} within 20 s"))
            .unwrap();
    }
}

/// Waits (at most 20 s) until the object of lease `name` satisfies `done` (`None`: no object).
async fn object_until(name: &str, what: &str, done: impl Fn(Option<&LeaseObject>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let object = admin_object(&env().namespace, &object_name(name)).await;
        if done(object.as_ref()) {
            return;
        }
        assert!(Instant::now() < deadline, "{what} within 20 s: {object:?}");
        sleep(Duration::from_millis(50)).await;
    }
}

fn annotation<'a>(object: &'a LeaseObject, key: &str) -> Option<&'a str> {
    object
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn transitions(object: &LeaseObject) -> i32 {
    object
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0)
}

/// `a` holds three bound shards and leaves, handing shards 0 and 1 to `b` in the one write that
/// releases its member object; shard 2, not listed, is freed. `b` claims its two at once, one
/// compare-and-swap each (token +1, bound to its member); `c` cannot have them while `b`'s
/// member lives, but claims the freed one; `a`'s object is deleted once both records moved on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_member_hands_its_bound_shards_on_in_one_write() {
    let group = unique("handing");
    let names: Vec<String> = (0..3).map(|i| format!("{group}.shard.{i}")).collect();
    let sessions: Vec<KubernetesSession> = (0..3)
        .map(|_| KubernetesSession::new(settings_at(env().url.clone())).unwrap())
        .collect();
    let (member_a, shards_a) = node(&sessions[0], &group, "a", &names);
    let (member_b, shards_b) = node(&sessions[1], &group, "b", &names);
    let (member_c, shards_c) = node(&sessions[2], &group, "c", &names);
    assert!(member_a.acquire().await.unwrap());
    for shard in &shards_a {
        assert!(shard.acquire().await.unwrap());
    }
    let tokens_a: Vec<u64> = shards_a
        .iter()
        .map(|s| s.fencing_token().unwrap().value())
        .collect();
    assert!(member_b.acquire().await.unwrap());
    assert!(member_c.acquire().await.unwrap());
    let member_b_name = format!("{group}.member.b");
    let all_seen = |snapshot: &GroupSnapshot| {
        let now = Instant::now();
        names
            .iter()
            .all(|n| snapshot.live_holder(n, now) == Some("a"))
            && snapshot.live_holder(&member_b_name, now) == Some("b")
            && snapshot.live_holder(&format!("{group}.member.c"), now) == Some("c")
    };
    watch_until(&member_a, &group, "a's watch saw the group", all_seen).await;
    watch_until(&member_b, &group, "b's watch saw the group", all_seen).await;
    watch_until(&member_c, &group, "c's watch saw the group", all_seen).await;
    let incarnation_b = member_b
        .watch_group(&group)
        .unwrap()
        .snapshot()
        .get(&member_b_name)
        .and_then(|r| r.incarnation.clone())
        .expect("b's member incarnation");
    let to_b = Binding::new(member_b_name.clone(), incarnation_b);
    let handed = vec![
        HandedShard::new(names[0].clone(), "b", to_b.clone()),
        HandedShard::new(names[1].clone(), "b", to_b.clone()),
    ];
    let before_a = member_a.backend().stats();
    let member_a = std::sync::Arc::new(member_a);
    let retiring = {
        let member_a = std::sync::Arc::clone(&member_a);
        tokio::spawn(async move { member_a.retire_handing(handed).await })
    };
    // The shards' tenures ended with the member, before its write.
    watch_until(&member_b, &group, "b's watch saw the handover", |s| {
        s.live_holder(&names[0], Instant::now()) == Some("b")
    })
    .await;
    assert!(shards_a.iter().all(|s| !s.check_alive()));
    // b claims shards 0 and 1 at once: one write each (never taken up without one), each
    // token one above a's.
    for i in 0..2 {
        let before = shards_b[i].backend().stats();
        assert!(shards_b[i].acquire().await.unwrap(), "b claimed shard {i}");
        let after = shards_b[i].backend().stats();
        assert_eq!(after.taken_up, before.taken_up, "not taken up: {after:?}");
        assert_eq!(after.updates, before.updates + 1, "one write: {after:?}");
        assert_eq!(after.creates, before.creates);
        assert_eq!(
            shards_b[i].fencing_token().unwrap().value(),
            tokens_a[i] + 1,
            "the token rose by one"
        );
    }
    // c cannot have them while b's member lives; it claims shard 2, which a freed.
    watch_until(&member_c, &group, "c's watch saw the handover", |s| {
        s.live_holder(&names[0], Instant::now()) == Some("b")
    })
    .await;
    assert!(!shards_c[0].acquire().await.unwrap(), "shard 0 is b's");
    assert_eq!(shards_c[0].observed_holder().as_deref(), Some("b"));
    assert!(
        shards_c[2].acquire().await.unwrap(),
        "c claimed the freed shard"
    );
    assert!(shards_c[2].fencing_token().unwrap().value() > tokens_a[2]);
    assert!(retiring.await.unwrap().unwrap(), "a retired");
    let after_a = member_a.backend().stats();
    assert_eq!(
        after_a.updates - before_a.updates,
        1,
        "a's leave was one write (and the delete): {after_a:?}"
    );
    // b's claims wrote both records: b, its token, bound to its member; then a's object was
    // deleted.
    for i in 0..2 {
        let token = shards_b[i].fencing_token().unwrap().value();
        let member = object_name(&member_b_name);
        object_until(&names[i], "the record claimed by b", |o| {
            o.is_some_and(|o| {
                holder_of(o) == Some("b")
                    && transitions(o) as u64 == token
                    && annotation(o, KUBERNETES_BOUND_TO_ANNOTATION) == Some(member_b_name.as_str())
                    && annotation(o, KUBERNETES_LEASE_NAME_ANNOTATION) == Some(names[i].as_str())
            })
        })
        .await;
        let _ = member;
    }
    object_until(
        &format!("{group}.member.a"),
        "a's member object deleted",
        |o| o.is_none(),
    )
    .await;
    // b leaves plainly: its shards are c's to claim, tokens rising.
    let token_b0 = shards_b[0].fencing_token().unwrap().value();
    assert!(shards_b[0].release().await.unwrap());
    // (c's lease decides from what its watch has shown: a record still shown held is held)
    watch_until(&member_c, &group, "c's watch saw b's release", |s| {
        s.live_holder(&names[0], Instant::now()).is_none()
    })
    .await;
    assert!(shards_c[0].acquire().await.unwrap());
    assert!(shards_c[0].fencing_token().unwrap().value() > token_b0);
    // b's member tenure ends with shard 1 still held under it (issue 47 item 8: a tenure that
    // ends without writing its record again): the next tenure's token is above b's, never b's.
    let token_b1 = shards_b[1].fencing_token().unwrap().value();
    assert!(member_b.retire().await.unwrap());
    watch_until(&member_c, &group, "c's watch saw b's member go", |s| {
        s.live_holder(&names[1], Instant::now()).is_none()
    })
    .await;
    assert!(shards_c[1].acquire().await.unwrap());
    assert_eq!(shards_c[1].fencing_token().unwrap().value(), token_b1 + 1);
    for shard in &shards_c {
        let _ = shard.release().await;
    }
    let _ = member_c.retire().await;
}

/// `lease`'s object created by the admin: `holder`, `duration` seconds, `transitions`, and the
/// annotations `extra` (with the lease name).
async fn raw_object(
    lease: &str,
    holder: Option<&str>,
    duration: i32,
    transitions: i32,
    extra: &[(&str, String)],
) -> LeaseObject {
    let mut annotations = BTreeMap::from([(
        KUBERNETES_LEASE_NAME_ANNOTATION.to_owned(),
        lease.to_owned(),
    )]);
    for (key, value) in extra {
        annotations.insert((*key).to_owned(), value.clone());
    }
    let object = LeaseObject {
        metadata: ObjectMeta {
            name: Some(object_name(lease)),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(duration),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    };
    admin()
        .create(&PostParams::default(), &object)
        .await
        .unwrap()
}

fn incarnation_of(object: &LeaseObject) -> String {
    format!(
        "{}/{}",
        object.metadata.uid.as_deref().unwrap(),
        transitions(object)
    )
}

/// A shard record bound to `x`'s member, whose object expires (2 s) with nobody renewing it:
/// the contender claims the shard only after it released the member object (holder gone), and
/// a handover written on the member's expired version afterwards is refused (`409`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_releases_an_expired_member_before_claiming_so_a_late_handover_is_refused() {
    let group = unique("expired-member");
    let member_x = format!("{group}.member.x");
    let shard = format!("{group}.shard");
    let member = raw_object(&member_x, Some("x"), 2, 1, &[]).await;
    let bound = [
        (KUBERNETES_BOUND_TO_ANNOTATION, member_x.clone()),
        (
            KUBERNETES_BOUND_INCARNATION_ANNOTATION,
            incarnation_of(&member),
        ),
    ];
    raw_object(&shard, Some("x"), KUBERNETES_BOUND_DURATION_SECS, 4, &bound).await;
    let session = KubernetesSession::new(settings_at(env().url.clone())).unwrap();
    let (member_c, shards_c) = node(&session, &group, "c", std::slice::from_ref(&shard));
    assert!(member_c.acquire().await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !shards_c[0].acquire().await.unwrap() {
        assert!(Instant::now() < deadline, "c claimed the shard within 20 s");
        sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(shards_c[0].fencing_token().unwrap().value(), 5);
    let now = admin_object(&env().namespace, &object_name(&member_x))
        .await
        .expect("the member object stays");
    assert_eq!(holder_of(&now), None, "released by the contender first");
    // x's handover, written on the version that expired, lands too late: refused.
    let mut late = member.clone();
    late.spec.as_mut().unwrap().holder_identity = None;
    late.metadata.annotations.as_mut().unwrap().insert(
        KUBERNETES_HANDED_SHARDS_ANNOTATION.to_owned(),
        "{}".to_owned(),
    );
    let refused = admin()
        .replace(&object_name(&member_x), &PostParams::default(), &late)
        .await
        .expect_err("a write on the expired version is refused");
    assert!(
        matches!(&refused, kube::Error::Api(status) if status.code == 409),
        "409 Conflict: {refused}"
    );
    assert!(shards_c[0].release().await.unwrap());
    assert!(member_c.release().await.unwrap());
    let _ = admin()
        .delete(&object_name(&member_x), &DeleteParams::default())
        .await;
}

/// In group `group`: `t`'s member object, `m`'s, and a shard record held by `m` bound to `m`'s
/// member tenure (token 4); then `m`'s tenure ends handing the shard to `t` (its object
/// released, with the list). Answers the names of `m`'s and `t`'s member leases and the shard's.
async fn handed_to_t(group: &str) -> (String, String, String) {
    let member_t = member_t_name(group);
    let target = raw_object(&member_t, Some("t"), 3600, 1, &[]).await;
    let (member_m, shard) = m_hands_to_t(group, &target).await;
    (member_m, member_t, shard)
}

/// In group `group`: `m`'s member object and a shard record held by `m` bound to `m`'s member
/// tenure (token 4); then `m`'s tenure ends handing the shard to `t`, whose member object is
/// `target` (`m`'s object released, with the list). Answers the names of `m`'s member lease
/// and the shard's.
async fn m_hands_to_t(group: &str, target: &LeaseObject) -> (String, String) {
    let member_m = format!("{group}.member.m");
    let shard = format!("{group}.shard");
    let member = raw_object(&member_m, Some("m"), 3600, 1, &[]).await;
    let incarnation_m = incarnation_of(&member);
    let bound = [
        (KUBERNETES_BOUND_TO_ANNOTATION, member_m.clone()),
        (
            KUBERNETES_BOUND_INCARNATION_ANNOTATION,
            incarnation_m.clone(),
        ),
    ];
    raw_object(&shard, Some("m"), KUBERNETES_BOUND_DURATION_SECS, 4, &bound).await;
    let mut released = member.clone();
    released.spec.as_mut().unwrap().holder_identity = None;
    let list = serde_json::json!({
        incarnation_m: [{
            "owner": "t",
            "member": member_t_name(group),
            "incarnation": incarnation_of(target),
            "leases": [shard],
        }]
    });
    released.metadata.annotations.as_mut().unwrap().insert(
        KUBERNETES_HANDED_SHARDS_ANNOTATION.to_owned(),
        list.to_string(),
    );
    admin()
        .replace(&object_name(&member_m), &PostParams::default(), &released)
        .await
        .unwrap();
    (member_m, shard)
}

/// A shard that a released member object lists as handed to `t`: held by `t` for a contender
/// while `t`'s member object lives, and claimed with the record's token plus one once it is
/// gone (`t` never claimed it: no tenure starts without a write on the record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_handed_on_is_the_target_s_while_its_member_lives() {
    let group = unique("handed-target");
    let (member_m, member_t, shard) = handed_to_t(&group).await;
    let session = KubernetesSession::new(settings_at(env().url.clone())).unwrap();
    let (member_c, shards_c) = node(&session, &group, "c", std::slice::from_ref(&shard));
    assert!(member_c.acquire().await.unwrap());
    assert!(!shards_c[0].acquire().await.unwrap(), "t's while t lives");
    assert_eq!(shards_c[0].observed_holder().as_deref(), Some("t"));
    watch_until(&member_c, &group, "c's watch shows t holding it", |s| {
        s.live_holder(&shard, Instant::now()) == Some("t")
    })
    .await;
    // t's member object goes: the shard is free, its token one above the record's.
    admin()
        .delete(&object_name(&member_t), &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !shards_c[0].acquire().await.unwrap() {
        assert!(Instant::now() < deadline, "c claimed the shard within 20 s");
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(shards_c[0].fencing_token().unwrap().value(), 5);
    assert!(shards_c[0].release().await.unwrap());
    assert!(member_c.release().await.unwrap());
    let _ = admin()
        .delete(&object_name(&member_m), &DeleteParams::default())
        .await;
}

/// Issue 47 item 8: a tenure of a listed shard that ends at once (its member tenure lost the
/// moment after the shard was acquired) is never followed by a tenure with the same token.
/// `m`'s released member object lists the shard (token 4) to `t`, a live member; `t` acquires
/// it, and its member object is deleted at once; `c` then claims the shard with `t`'s token plus
/// one. (Before issue 47 `t` took the shard up without a write and rebound it 250 ms to 1 s
/// later: a member lost sooner left the record at token 4, and `c` claimed it with `t`'s token
/// 5.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_tenure_that_ends_at_once_is_never_followed_by_its_own_token() {
    let group = unique("ended-at-once");
    let shard = format!("{group}.shard");
    let session_t = KubernetesSession::new(settings_at(env().url.clone())).unwrap();
    let (member_t, shards_t) = node(&session_t, &group, "t", std::slice::from_ref(&shard));
    assert!(member_t.acquire().await.unwrap());
    let target = admin()
        .get(&object_name(&member_t_name(&group)))
        .await
        .unwrap();
    let (member_m, _) = m_hands_to_t(&group, &target).await;
    watch_until(&member_t, &group, "t's watch shows the list", |s| {
        s.live_holder(&shard, Instant::now()) == Some("t")
    })
    .await;
    assert!(shards_t[0].acquire().await.unwrap(), "t acquired its shard");
    let token_t = shards_t[0].fencing_token().unwrap().value();
    assert_eq!(token_t, 5, "the record's token plus one");
    // t's member tenure is lost at once (its object deleted under it: t writes nothing more).
    admin()
        .delete(
            &object_name(&member_t_name(&group)),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while shards_t[0].check_alive() {
        assert!(
            Instant::now() < deadline,
            "t's shard tenure ended within 20 s"
        );
        sleep(Duration::from_millis(10)).await;
    }
    let session_c = KubernetesSession::new(settings_at(env().url.clone())).unwrap();
    let (member_c, shards_c) = node(&session_c, &group, "c", std::slice::from_ref(&shard));
    assert!(member_c.acquire().await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !shards_c[0].acquire().await.unwrap() {
        assert!(Instant::now() < deadline, "c claimed the shard within 20 s");
        sleep(Duration::from_millis(100)).await;
    }
    let token_c = shards_c[0].fencing_token().unwrap().value();
    assert_eq!(
        token_c,
        token_t + 1,
        "c's token is t's plus one, never t's own"
    );
    assert!(shards_c[0].release().await.unwrap());
    assert!(member_c.release().await.unwrap());
    let _ = admin()
        .delete(&object_name(&member_m), &DeleteParams::default())
        .await;
}

/// The name of `t`'s member lease in `group`.
fn member_t_name(group: &str) -> String {
    format!("{group}.member.t")
}

/// Two shard records bound to `x`'s member, whose object expires (2 s) with nobody renewing it:
/// `c` planned where they go (shard 0 to itself, shard 1 to `t`), so the claim that finds `x`
/// expired ends `x`'s object listing both, in one write; `c` then claims shard 0 with one
/// more write (token +1), `t` claims shard 1 with one write of its own, and `c` cannot have
/// shard 1 while `t`'s member lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_that_finds_a_member_expired_hands_its_shards_on_in_the_release() {
    let group = unique("expired-handing");
    let member_x = format!("{group}.member.x");
    let names: Vec<String> = (0..2).map(|i| format!("{group}.shard.{i}")).collect();
    let member = raw_object(&member_x, Some("x"), 2, 1, &[]).await;
    let bound = [
        (KUBERNETES_BOUND_TO_ANNOTATION, member_x.clone()),
        (
            KUBERNETES_BOUND_INCARNATION_ANNOTATION,
            incarnation_of(&member),
        ),
    ];
    raw_object(
        &names[0],
        Some("x"),
        KUBERNETES_BOUND_DURATION_SECS,
        4,
        &bound,
    )
    .await;
    raw_object(
        &names[1],
        Some("x"),
        KUBERNETES_BOUND_DURATION_SECS,
        7,
        &bound,
    )
    .await;
    let sessions: Vec<KubernetesSession> = (0..2)
        .map(|_| KubernetesSession::new(settings_at(env().url.clone())).unwrap())
        .collect();
    let (member_c, shards_c) = node(&sessions[0], &group, "c", &names);
    let (member_t, shards_t) = node(&sessions[1], &group, "t", &names);
    assert!(member_c.acquire().await.unwrap());
    assert!(member_t.acquire().await.unwrap());
    let member_c_name = format!("{group}.member.c");
    let member_t_name = format!("{group}.member.t");
    let incarnation = |snapshot: &GroupSnapshot, member: &str| {
        snapshot
            .get(member)
            .and_then(|r| r.incarnation.clone())
            .expect("a member incarnation")
    };
    let live = |s: &GroupSnapshot| {
        let now = Instant::now();
        s.live_holder(&member_c_name, now) == Some("c")
            && s.live_holder(&member_t_name, now) == Some("t")
            && names.iter().all(|n| s.get(n).is_some())
    };
    watch_until(&member_c, &group, "c's watch saw the group", live).await;
    watch_until(&member_t, &group, "t's watch saw the group", live).await;
    let snapshot = member_c.watch_group(&group).unwrap().snapshot();
    let to_c = Binding::new(
        member_c_name.clone(),
        incarnation(&snapshot, &member_c_name),
    );
    let to_t = Binding::new(
        member_t_name.clone(),
        incarnation(&snapshot, &member_t_name),
    );
    member_c.plan_hand_on(
        &Binding::new(member_x.clone(), incarnation_of(&member)),
        vec![
            HandedShard::new(names[0].clone(), "c", to_c),
            HandedShard::new(names[1].clone(), "t", to_t),
        ],
    );
    let before = shards_c[0].backend().stats();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !shards_c[0].acquire().await.unwrap() {
        assert!(Instant::now() < deadline, "c had shard 0 within 20 s");
        sleep(Duration::from_millis(200)).await;
    }
    let after = shards_c[0].backend().stats();
    assert_eq!(after.taken_up, before.taken_up, "not taken up: {after:?}");
    assert_eq!(
        after.updates - before.updates,
        2,
        "two writes: the release of x's object, listing both shards, and the claim ({after:?})"
    );
    assert_eq!(after.creates, before.creates);
    assert_eq!(shards_c[0].fencing_token().unwrap().value(), 5);
    let released = admin_object(&env().namespace, &object_name(&member_x))
        .await
        .expect("x's object stays, released");
    assert_eq!(holder_of(&released), None);
    let list = annotation(&released, KUBERNETES_HANDED_SHARDS_ANNOTATION).expect("a list");
    assert!(
        names.iter().all(|n| list.contains(n.as_str())),
        "both shards listed: {list}"
    );
    // t claims shard 1 with one write; c cannot have it while t's member lives.
    watch_until(&member_t, &group, "t's watch saw x's list", |s| {
        s.live_holder(&names[1], Instant::now()) == Some("t")
    })
    .await;
    let before_t = shards_t[1].backend().stats();
    assert!(shards_t[1].acquire().await.unwrap(), "t claimed shard 1");
    let after_t = shards_t[1].backend().stats();
    assert_eq!(after_t.taken_up, before_t.taken_up);
    assert_eq!(
        after_t.updates,
        before_t.updates + 1,
        "one write: {after_t:?}"
    );
    assert_eq!(shards_t[1].fencing_token().unwrap().value(), 8);
    assert!(!shards_c[1].acquire().await.unwrap(), "shard 1 is t's");
    assert_eq!(shards_c[1].observed_holder().as_deref(), Some("t"));
    // Both records name their claimant, bound to its member, with its token.
    for (i, (owner, member, token)) in [("c", &member_c_name, 5), ("t", &member_t_name, 8)]
        .into_iter()
        .enumerate()
    {
        object_until(&names[i], "the record claimed", |o| {
            o.is_some_and(|o| {
                holder_of(o) == Some(owner)
                    && transitions(o) == token
                    && annotation(o, KUBERNETES_BOUND_TO_ANNOTATION) == Some(member.as_str())
            })
        })
        .await;
    }
    assert!(shards_c[0].release().await.unwrap());
    assert!(shards_t[1].release().await.unwrap());
    assert!(member_c.release().await.unwrap());
    assert!(member_t.release().await.unwrap());
    let _ = admin()
        .delete(&object_name(&member_x), &DeleteParams::default())
        .await;
}

/// A member that ended handing a shard on to `t` comes back (a new member tenure of the same
/// owner, a node back from a freeze or restarted under its name): the record still names it
/// (`t` has not claimed it yet), but it is `t`'s while `t`'s member lives, and the owner's
/// claim is refused until then; once `t`'s member is gone it is claimed with token + 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_back_under_a_new_member_tenure_does_not_claim_what_its_last_one_handed_on() {
    let group = unique("handed-back");
    let (member_m, member_t, shard) = handed_to_t(&group).await;
    // m comes back: a new member tenure (its object claimed again, the list kept).
    let session = KubernetesSession::new(settings_at(env().url.clone())).unwrap();
    let (member_back, shards_back) = node(&session, &group, "m", std::slice::from_ref(&shard));
    assert!(member_back.acquire().await.unwrap());
    let again = admin_object(&env().namespace, &object_name(&member_m))
        .await
        .unwrap();
    assert_eq!(holder_of(&again), Some("m"));
    assert!(
        annotation(&again, KUBERNETES_HANDED_SHARDS_ANNOTATION).is_some(),
        "the list stays while a record may follow it"
    );
    assert!(
        !shards_back[0].acquire().await.unwrap(),
        "t's while t's member lives, though the record names m"
    );
    assert_eq!(shards_back[0].observed_holder().as_deref(), Some("t"));
    let record = admin_object(&env().namespace, &object_name(&shard))
        .await
        .unwrap();
    assert_eq!(
        transitions(&record),
        4,
        "the record is as m's last tenure left it"
    );
    // t's member object goes: m claims the shard, its token one above the record's.
    admin()
        .delete(&object_name(&member_t), &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !shards_back[0].acquire().await.unwrap() {
        assert!(Instant::now() < deadline, "m claimed the shard within 20 s");
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(shards_back[0].fencing_token().unwrap().value(), 5);
    assert!(shards_back[0].release().await.unwrap());
    assert!(member_back.release().await.unwrap());
    let _ = admin()
        .delete(&object_name(&member_m), &DeleteParams::default())
        .await;
}
