//! Writes that arrive late on a real kube-apiserver (issue 47): a holder's claim answered after
//! its member tenure ended, and a claim whose answer was lost, released later behind a lagging
//! watch, while a dead member's shard is handed on to a live target. Before issue 47 the target
//! took the shard up *without a write*, so the record stayed at the version the old holder
//! wrote; the old holder's release of that version still landed, and the next claimant wrote
//! the target's token again: two holders with one token. Now every tenure starts with a
//! compare-and-swap on the record itself, and a holder writes a bound record only while the
//! member tenure it names lives by its own clock (`actix_coordination::protocol`).
//!
//! Each test checks, against the API server's own record: one holder at a time, and fencing
//! tokens that strictly rise from tenure to tenure. The two whose stale write comes *right
//! after* the target's claim (the fault proxy holds or drops `b`'s answers until then) fail on
//! the code before issue 47 (00d3dfb): `c` claimed the shard `d` held, with `d`'s token.
//!
//! Needs the test cluster (`scripts/test-cluster.sh`). Every test uses objects of its own.

mod common;

use std::time::Duration;

use actix_coordination::{
    kubernetes_object_name as object_name, Binding, GroupSnapshot, HandedShard, KubernetesLease,
    KubernetesSession, Lease, LeaseError, LeaseSettings,
};
use common::k8s::{admin_object, env, holder_of, settings_at, through, unique};
use common::proxy::{FaultProxy, ProxyMode};
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use tokio::time::{sleep, timeout, Instant};

/// The TTL of `b`'s member lease: short, so that it expires while `b`'s answers are late.
const SHORT_TTL: Duration = Duration::from_secs(3);
/// The TTL of the other members (they live through the test).
const LONG_TTL: Duration = Duration::from_secs(30);

fn member_settings(name: &str, owner: &str, ttl: Duration) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(ttl)
        .acquire_retries(0)
        .build()
        .unwrap()
}

/// A shard lease's settings: one attempt per `acquire`, and an operation timeout of
/// `operation_timeout` (a bound lease's own TTL only bounds its calls).
fn shard_settings(name: &str, owner: &str, operation_timeout: Duration) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(Duration::from_secs(60))
        .operation_timeout(operation_timeout)
        .acquire_retries(0)
        .build()
        .unwrap()
}

/// `owner`'s member lease of `group` (TTL `ttl`) and its lease of `shard`, bound to it.
fn node(
    session: &KubernetesSession,
    group: &str,
    owner: &str,
    shard: &str,
    ttl: Duration,
    operation_timeout: Duration,
) -> (KubernetesLease, KubernetesLease) {
    let member = session.lease(member_settings(
        &format!("{group}.member.{owner}"),
        owner,
        ttl,
    ));
    let lease = session.lease(shard_settings(shard, owner, operation_timeout));
    lease.bind_to(&member.binding_anchor().unwrap()).unwrap();
    (member, lease)
}

async fn watch_until(
    lease: &KubernetesLease,
    group: &str,
    what: &str,
    done: impl Fn(&GroupSnapshot) -> bool,
) -> GroupSnapshot {
    let mut watch = lease.watch_group(group).unwrap();
    timeout(Duration::from_secs(20), async {
        loop {
            let snapshot = watch.snapshot();
            if done(&snapshot) {
                return GroupSnapshot::clone(&snapshot);
            }
            watch.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} within 20 s"))
}

/// The shard's object as the API server has it now.
async fn record(shard: &str) -> LeaseObject {
    admin_object(&env().namespace, &object_name(shard))
        .await
        .expect("the shard's object")
}

fn token_of(object: &LeaseObject) -> u64 {
    object
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0) as u64
}

/// Waits until the shard's object exists and `what` holds for it (polled, within 20 s: a claim
/// sent a moment ago may not have created it yet).
async fn record_until(shard: &str, what: &str, done: impl Fn(&LeaseObject) -> bool) -> LeaseObject {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let object = admin_object(&env().namespace, &object_name(shard)).await;
        if let Some(object) = object.filter(|o| done(o)) {
            return object;
        }
        assert!(Instant::now() < deadline, "{what} within 20 s");
        sleep(Duration::from_millis(50)).await;
    }
}

/// The fleet of each test: `b` reaches the API server through a fault proxy, with a member TTL
/// of 3 s; `c` and `d` directly, with long-lived members. `c` planned that `b`'s shard goes to
/// `d` should it find `b`'s member expired.
struct Fleet {
    proxy: FaultProxy,
    group: String,
    shard: String,
    member_b: KubernetesLease,
    shard_b: std::sync::Arc<KubernetesLease>,
    member_c: KubernetesLease,
    shard_c: KubernetesLease,
    member_d: KubernetesLease,
    shard_d: KubernetesLease,
}

impl Fleet {
    async fn new(base: &str, b_operation_timeout: Duration) -> Self {
        let group = unique(base);
        let shard = format!("{group}.shard.0");
        let proxy = FaultProxy::start(env().upstream).await;
        let session_b = KubernetesSession::new(through(&proxy)).unwrap();
        let session_c = KubernetesSession::new(settings_at(env().url.clone())).unwrap();
        let session_d = KubernetesSession::new(settings_at(env().url.clone())).unwrap();
        let (member_b, shard_b) = node(
            &session_b,
            &group,
            "b",
            &shard,
            SHORT_TTL,
            b_operation_timeout,
        );
        let ops = Duration::from_secs(5);
        let (member_c, shard_c) = node(&session_c, &group, "c", &shard, LONG_TTL, ops);
        let (member_d, shard_d) = node(&session_d, &group, "d", &shard, LONG_TTL, ops);
        for member in [&member_b, &member_c, &member_d] {
            assert!(
                member.acquire().await.unwrap(),
                "{} was free",
                member.name()
            );
        }
        let names: Vec<String> = ["b", "c", "d"]
            .iter()
            .map(|o| format!("{group}.member.{o}"))
            .collect();
        let all_live = |s: &GroupSnapshot| {
            let now = Instant::now();
            names
                .iter()
                .zip(["b", "c", "d"])
                .all(|(n, o)| s.live_holder(n, now) == Some(o))
        };
        let snapshot = watch_until(&member_c, &group, "c's watch saw the members", all_live).await;
        watch_until(&member_d, &group, "d's watch saw the members", all_live).await;
        let incarnation = |name: &str| {
            snapshot
                .get(name)
                .and_then(|r| r.incarnation.clone())
                .expect("a member incarnation")
        };
        let to_d = Binding::new(names[2].clone(), incarnation(&names[2]));
        let ended_b = Binding::new(names[0].clone(), incarnation(&names[0]));
        member_c.plan_hand_on(&ended_b, vec![HandedShard::new(shard.clone(), "d", to_d)]);
        Fleet {
            proxy,
            group,
            shard,
            member_b,
            shard_b: std::sync::Arc::new(shard_b),
            member_c,
            shard_c,
            member_d,
            shard_d,
        }
    }

    /// `b`'s claim of the shard, sent now (the API server applies it at once, whatever the
    /// proxy does to its answer); answers once the record shows it, with `b`'s token.
    async fn b_claims(&self) -> (tokio::task::JoinHandle<Result<bool, LeaseError>>, u64) {
        let claim = {
            let shard_b = std::sync::Arc::clone(&self.shard_b);
            tokio::spawn(async move { shard_b.acquire().await })
        };
        let claimed = record_until(&self.shard, "b's claim landed", |o| {
            holder_of(o) == Some("b")
        })
        .await;
        (claim, token_of(&claimed))
    }

    /// `c` tries the shard until it finds `b`'s member expired: it releases `b`'s member object
    /// listing the shard to `d`, and then counts the shard `d`'s.
    async fn c_finds_b_expired_and_lists_the_shard_to_d(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            assert!(
                !self.shard_c.acquire().await.unwrap(),
                "c never holds the shard: b's, then d's"
            );
            if self.shard_c.observed_holder().as_deref() == Some("d") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "c found b's member expired within 20 s"
            );
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// `d` claims the shard listed to it: with one write, its token one above `b`'s claim
    /// (`token_b`). Answers `d`'s token.
    async fn d_claims_above(&self, token_b: u64) -> u64 {
        assert!(self.shard_d.acquire().await.unwrap(), "d claimed its shard");
        let token_d = self.shard_d.fencing_token().unwrap().value();
        assert_eq!(token_d, token_b + 1, "d holds it with b's token plus one");
        token_d
    }

    /// One holder: `c` cannot claim the shard while `d` holds it with `token`, and the API
    /// server's record names `d` with that token.
    async fn d_alone_holds_it(&self, token: u64) {
        assert!(self.shard_d.check_alive());
        assert_eq!(self.shard_d.fencing_token().unwrap().value(), token);
        let claimed = self.shard_c.acquire().await.unwrap();
        let now = record(&self.shard).await;
        assert!(
            !claimed,
            "c claimed the shard d holds, with token {:?} (d's: {token}); the record: {now:?}",
            self.shard_c.fencing_token()
        );
        assert_eq!(self.shard_c.observed_holder().as_deref(), Some("d"));
        assert_eq!(holder_of(&now), Some("d"), "the record names d: {now:?}");
        assert_eq!(token_of(&now), token, "with d's token: {now:?}");
        assert!(!self.shard_b.check_alive());
    }

    /// `d` releases the shard: `c` claims it next, with a token above `d`'s.
    async fn then_c_claims_above(&self, token_d: u64) {
        assert!(self.shard_d.release().await.unwrap());
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.shard_c.acquire().await.unwrap() {
            assert!(Instant::now() < deadline, "c claimed the shard within 20 s");
            sleep(Duration::from_millis(100)).await;
        }
        let token_c = self.shard_c.fencing_token().unwrap().value();
        assert!(
            token_c > token_d,
            "tokens rise: c's {token_c} after d's {token_d}"
        );
        assert_eq!(token_of(&record(&self.shard).await), token_c);
        assert!(!self.shard_d.check_alive());
        let _ = self.shard_c.release().await;
        let _ = self.member_c.release().await;
        let _ = self.member_d.release().await;
        let _ = self.member_b.release().await;
        let _ = &self.group;
    }
}

/// Paths 1-4 of issue 47: `b`'s claim lands at once but its answer comes 5 s late, after `b`'s
/// member tenure ended (its renewals are late too); meanwhile `c` finds `b`'s member expired and
/// lists the shard to `d`, which claims it (a write: token + 1). `b`'s late answer writes
/// nothing, and `d` holds the shard alone with a token no one else gets; the next holder's token
/// is higher. (Before: `d` took the shard up without a write, `b` released its late claim over
/// the version `d` held, and `c` claimed it with `d`'s token.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_after_its_member_ended_writes_nothing_over_the_listed_target() {
    // b's claim waits up to 8 s for its answer; the proxy delays every answer by 5 s.
    let fleet = Fleet::new("stale-answer", Duration::from_secs(8)).await;
    fleet
        .proxy
        .set_mode(ProxyMode::SlowAnswers(Duration::from_secs(5)));
    let (claim, token_b) = fleet.b_claims().await;
    fleet.c_finds_b_expired_and_lists_the_shard_to_d().await;
    let token_d = fleet.d_claims_above(token_b).await;
    // b's answer arrives after its member tenure ended: no tenure, and nothing written.
    let answer = claim.await.unwrap();
    assert!(
        !matches!(answer, Ok(true)),
        "b's claim answered after its member ended started a tenure"
    );
    assert!(!fleet.shard_b.check_alive());
    // A release by b waits for any release of the abandoned claim (it holds the lease's
    // operations lock): after it, whatever b was to write has been written.
    fleet.proxy.set_mode(ProxyMode::Pass);
    let _ = fleet.shard_b.release().await;
    fleet.d_alone_holds_it(token_d).await;
    fleet.then_c_claims_above(token_d).await;
}

/// Paths 1-4 with the late answer arriving *right after* `d` claimed: the proxy holds `b`'s
/// answers until then. Before issue 47 `d` took the shard up without a write and rebound it
/// 250 ms to 1 s later; `b`'s release of its abandoned claim landed on the version `d` held in
/// that window, and `c` claimed the shard with `d`'s token while `d` held it (this test failed
/// so on 00d3dfb). Now `d`'s claim is a write, and `b` writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_right_after_the_target_claimed_writes_nothing() {
    let fleet = Fleet::new("held-answer", Duration::from_secs(15)).await;
    fleet.proxy.set_mode(ProxyMode::HoldAnswers);
    let (claim, token_b) = fleet.b_claims().await;
    fleet.c_finds_b_expired_and_lists_the_shard_to_d().await;
    let token_d = fleet.d_claims_above(token_b).await;
    // b's answers arrive now, its claim's among them, long after its member tenure ended.
    fleet.proxy.set_mode(ProxyMode::Pass);
    let answer = claim.await.unwrap();
    assert!(
        !matches!(answer, Ok(true)),
        "b's claim answered after its member ended started a tenure"
    );
    // A release by b waits for any release of the abandoned claim (the operations lock).
    let _ = fleet.shard_b.release().await;
    fleet.d_alone_holds_it(token_d).await;
    fleet.then_c_claims_above(token_d).await;
}

/// The same with `b`'s claim unanswered (its answer dropped, the claim timed out): later, with
/// `b`'s connections back but slow (its namespace watch lists again 1 s late), `b` asks its
/// lease to release what it may hold. The record is `d`'s by then: nothing of `b`'s is written.
/// (Before: `b` judged its claim's member by its lagging watch and released the record `d` had
/// taken up without a write.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_claim_is_not_released_over_the_listed_target_behind_a_lagging_watch() {
    let fleet = Fleet::new("stale-unanswered", Duration::from_secs(4)).await;
    fleet.proxy.set_mode(ProxyMode::DropAnswers);
    let (claim, token_b) = fleet.b_claims().await;
    fleet.c_finds_b_expired_and_lists_the_shard_to_d().await;
    let token_d = fleet.d_claims_above(token_b).await;
    let answer = claim.await.unwrap();
    assert!(
        !matches!(answer, Ok(true)),
        "b's unanswered claim started a tenure"
    );
    fleet
        .proxy
        .set_mode(ProxyMode::SlowAnswers(Duration::from_secs(1)));
    // Nothing held: the lease removes its unanswered claim if, and only if, it may.
    let _ = fleet.shard_b.release().await;
    fleet.proxy.set_mode(ProxyMode::Pass);
    let _ = fleet.shard_b.release().await;
    fleet.d_alone_holds_it(token_d).await;
    fleet.then_c_claims_above(token_d).await;
}

/// The unanswered claim released *right after* `d` claimed: `b`'s claim timed out with its
/// answer dropped, then `c` lists the shard to `d`, `d` claims it, and the moment `b`'s
/// connections are back `b` asks its lease to release what it may hold, its namespace watch
/// still showing the state from before the drop. Before issue 47 `b` judged its claim's member
/// live by that watch and released the record at the version `d` had taken up without a
/// write, and `c` claimed it with `d`'s token (this test failed so on 00d3dfb). Now `b` writes
/// nothing: its member tenure ended by its own clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_claim_released_right_after_the_target_claimed_writes_nothing() {
    let fleet = Fleet::new("dropped-answer", Duration::from_secs(4)).await;
    fleet.proxy.set_mode(ProxyMode::DropAnswers);
    let (claim, token_b) = fleet.b_claims().await;
    let answer = claim.await.unwrap();
    assert!(
        !matches!(answer, Ok(true)),
        "b's unanswered claim started a tenure"
    );
    fleet.c_finds_b_expired_and_lists_the_shard_to_d().await;
    let token_d = fleet.d_claims_above(token_b).await;
    fleet.proxy.set_mode(ProxyMode::Pass);
    // Nothing held: the lease removes its unanswered claim if, and only if, it may.
    let _ = fleet.shard_b.release().await;
    fleet.d_alone_holds_it(token_d).await;
    fleet.then_c_claims_above(token_d).await;
}
