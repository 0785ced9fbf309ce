//! `Lease::retire` on a real kube-apiserver: a lease given up for good deletes its object (one
//! `delete` with a precondition on the tenure's `resourceVersion`), so that member and candidacy
//! leases of identities that do not come back leave nothing in the namespace; an account whose
//! Role lacks `delete` releases instead, and the object stays.
//!
//! Needs the test cluster (`scripts/test-cluster.sh`). Every test uses objects of its own.

mod common;

use std::time::Duration;

use actix_coordination::{KubernetesSession, KubernetesSettings, Lease, LeaseSettings};
use common::event_driven_settings;
use common::k8s::{admin_object, client, env, holder_of, settings_at, unique};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::Api;

const TTL: Duration = Duration::from_secs(15);

fn settings(name: &str, owner: &str) -> LeaseSettings {
    event_driven_settings(name, owner, TTL)
}

/// A held lease retired: its object is gone after one `delete` (no `update`), the tenure ended,
/// and a new claim of the name creates the object afresh.
#[tokio::test]
async fn a_retired_lease_s_object_is_deleted_in_one_request() {
    let name = unique("retire");
    let session = KubernetesSession::new(settings_at(env().url.clone())).unwrap();
    let lease = session.lease(settings(&name, "a"));
    assert!(lease.acquire().await.unwrap());
    let before = lease.backend().stats();
    assert!(lease.retire().await.unwrap(), "retired");
    assert!(!lease.check_alive());
    let after = lease.backend().stats();
    assert_eq!(after.deletes - before.deletes, 1, "one delete");
    assert_eq!(after.updates, before.updates, "and no release write");
    assert!(
        admin_object(&env().namespace, &name).await.is_none(),
        "the object is gone"
    );
    // Another owner claims the name: a new object, created.
    let other = session.lease(settings(&name, "b"));
    assert!(other.acquire().await.unwrap());
    let object = admin_object(&env().namespace, &name)
        .await
        .expect("created");
    assert_eq!(holder_of(&object), Some("b"));
    assert!(other.release().await.unwrap());
}

/// A namespace of its own where user `lease-holder` has the shipped Role's verbs but `delete`:
/// removed when dropped.
struct NoDelete {
    namespace: String,
}

impl NoDelete {
    async fn new() -> Self {
        let admin = client(&env().url, &env().admin_token);
        let namespace = unique("nodelete");
        let post = PostParams::default();
        Api::<Namespace>::all(admin.clone())
            .create(
                &post,
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
            )
            .await
            .expect("create the namespace");
        let meta = ObjectMeta {
            name: Some("lease-no-delete".into()),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        };
        Api::<Role>::namespaced(admin.clone(), &namespace)
            .create(
                &post,
                &Role {
                    metadata: meta.clone(),
                    rules: Some(vec![PolicyRule {
                        api_groups: Some(vec!["coordination.k8s.io".into()]),
                        resources: Some(vec!["leases".into()]),
                        verbs: ["get", "list", "watch", "create", "update"]
                            .map(String::from)
                            .to_vec(),
                        ..PolicyRule::default()
                    }]),
                },
            )
            .await
            .expect("create the Role");
        Api::<RoleBinding>::namespaced(admin, &namespace)
            .create(
                &post,
                &RoleBinding {
                    metadata: meta,
                    role_ref: RoleRef {
                        api_group: Some("rbac.authorization.k8s.io".into()),
                        kind: "Role".into(),
                        name: "lease-no-delete".into(),
                    },
                    subjects: Some(vec![Subject {
                        kind: "User".into(),
                        name: "lease-holder".into(),
                        ..Subject::default()
                    }]),
                },
            )
            .await
            .expect("create the RoleBinding");
        Self { namespace }
    }
}

impl Drop for NoDelete {
    fn drop(&mut self) {
        let namespace = self.namespace.clone();
        // The namespace goes with everything in it; best effort, on a thread of its own (a
        // runtime cannot block inside another).
        let _ = std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                let admin = client(&env().url, &env().admin_token);
                let _ = Api::<Namespace>::all(admin)
                    .delete(&namespace, &DeleteParams::default())
                    .await;
            })
        })
        .join();
    }
}

/// Without `delete`: `retire` still gives the lease up (a plain release after the refused
/// delete, which it does not try again), and the object stays, released.
#[tokio::test]
async fn without_delete_permission_a_retired_lease_is_released_and_its_object_stays() {
    let scope = NoDelete::new().await;
    let k8s = KubernetesSettings::new(&scope.namespace)
        .with_api_url(env().url.clone())
        .with_token(&env().token)
        .with_ca_file(&env().ca);
    let session = KubernetesSession::new(k8s).unwrap();
    let name = unique("retire-forbidden");
    let lease = session.lease(settings(&name, "a"));
    // RBAC may take a moment to see the new binding.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match lease.acquire().await {
            Ok(true) => break,
            other => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the new Role lets lease-holder claim: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(lease.retire().await.unwrap(), "given up");
    assert!(!lease.check_alive());
    let object = admin_object(&scope.namespace, &name)
        .await
        .expect("the object stays");
    assert_eq!(holder_of(&object), None, "released");
    let stats = lease.backend().stats();
    assert_eq!(stats.deletes, 1, "the delete was tried once");
    // Held again and retired again: no second delete (the refusal is remembered), released.
    assert!(lease.acquire().await.unwrap());
    assert!(lease.retire().await.unwrap());
    assert_eq!(lease.backend().stats().deletes, 1, "not tried again");
    let object = admin_object(&scope.namespace, &name).await.expect("stays");
    assert_eq!(holder_of(&object), None, "released again");
}

/// Without `patch` (a Role from before the crate asked for it): a bound claim that would be
/// decided from the namespace watch and written as a merge patch is refused once, remembered,
/// and made as before: a read of the object, then a replace. The shard is claimed, bound to the
/// claimant's member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_patch_permission_a_bound_claim_reads_and_replaces() {
    let scope = NoDelete::new().await;
    let k8s = KubernetesSettings::new(&scope.namespace)
        .with_api_url(env().url.clone())
        .with_token(&env().token)
        .with_ca_file(&env().ca);
    let session_a = KubernetesSession::new(k8s.clone()).unwrap();
    let session_b = KubernetesSession::new(k8s).unwrap();
    let group = unique("nopatch");
    let shard = format!("{group}.shard");
    let node = |session: &KubernetesSession, owner: &str| {
        let member = session.lease(settings(&format!("{group}.member.{owner}"), owner));
        let shard = session.lease(settings(&shard, owner));
        shard.bind_to(&member.binding_anchor().unwrap()).unwrap();
        (member, shard)
    };
    let (member_a, shard_a) = node(&session_a, "a");
    let (member_b, shard_b) = node(&session_b, "b");
    // RBAC may take a moment to see the new binding.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match member_a.acquire().await {
            Ok(true) => break,
            other => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the new Role lets lease-holder claim: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(shard_a.acquire().await.unwrap());
    assert!(member_b.acquire().await.unwrap());
    let mut watch = member_b.watch_group(&group).expect("a group watch");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while watch
        .snapshot()
        .live_holder(&shard, tokio::time::Instant::now())
        != Some("a")
    {
        tokio::time::timeout(deadline - tokio::time::Instant::now(), watch.changed())
            .await
            .expect("b's watch received a's shard within 10 s")
            .unwrap();
    }
    // Without `delete`, retiring releases a's member: every shard bound to it is free.
    assert!(member_a.retire().await.unwrap());
    while watch
        .snapshot()
        .live_holder(&shard, tokio::time::Instant::now())
        .is_some()
    {
        tokio::time::timeout(deadline - tokio::time::Instant::now(), watch.changed())
            .await
            .expect("b's watch received the release of a's member within 10 s")
            .unwrap();
    }
    let before = shard_b.backend().stats();
    assert!(shard_b.acquire().await.unwrap(), "b claimed the shard");
    let after = shard_b.backend().stats();
    assert_eq!(
        after.updates,
        before.updates + 2,
        "the refused patch, then the replace: {before:?} → {after:?}"
    );
    assert!(after.gets > before.gets, "the claim read the object");
    let object = admin_object(&scope.namespace, &shard)
        .await
        .expect("the shard's object");
    assert_eq!(holder_of(&object), Some("b"));
    assert!(shard_b.release().await.unwrap());
    assert!(member_b.release().await.unwrap());
}
