//! Interop with client-go: a client-go `leaderelection` program (`resourcelock.LeaseLock`,
//! tests/clientgo/leaderelect/main.go) and a [`KubernetesLease`] on the same
//! `coordination.k8s.io/v1` Lease object of the real kube-apiserver, both as the `lease-holder`
//! user (the Role of deploy/rbac.yaml).
//!
//! Needs the test cluster of `scripts/test-cluster.sh` with its client-go program
//! (`ACTIX_COORD_TEST_CLIENTGO_BIN`); `scripts/test.sh` builds, starts and stops everything.
//!
//! Both directions: while one side renews the other never claims; a graceful release on either
//! side hands over at once; a killed holder is taken over only after the lease duration; every
//! handover raises `leaseTransitions`, which is our fencing token.

#[macro_use]
mod common;

use std::time::Duration;

use actix_coordination::{KubernetesLease, KubernetesSettings, Lease, LeaseSettings};
use common::clientgo::{ClientGo, ElectionTiming, ObjectHistory};
use common::k8s::{client, env, unique};
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use kube::api::Api;
use tokio::time::{sleep, Instant};

/// Our TTL and client-go's lease duration: the same few seconds on both sides.
const TTL: Duration = Duration::from_secs(4);
/// client-go's timings: lease duration = our TTL, renew deadline 3 s, retry period 500 ms.
const CLIENT_GO: ElectionTiming = ElectionTiming {
    lease_duration: TTL,
    renew_deadline: Duration::from_secs(3),
    retry_period: Duration::from_millis(500),
};
/// How long "several lease durations" is.
const WINDOW: Duration = Duration::from_secs(12);
/// client-go tries to acquire every retry period with a jitter factor of 1.2 (`wait.JitterUntil`):
/// at most 2.2 retry periods between two attempts.
const CLIENT_GO_POLL: Duration = Duration::from_millis(1100);
/// Margin for a round trip and scheduling on a busy 2-core machine, in bounds on lateness.
const SLACK: Duration = Duration::from_millis(700);
/// Margin in bounds on earliness: two watchers of the same write see it a few ms apart.
const EARLY: Duration = Duration::from_millis(150);

/// Our lease `name` for `owner`, with the same TTL as client-go's lease duration, one attempt per
/// `acquire`, through a session of its own with the `lease-holder` token.
fn ours(name: &str, owner: &str) -> KubernetesLease {
    let settings = LeaseSettings::builder(name, owner)
        .ttl(TTL)
        .acquire_retries(0)
        .build()
        .unwrap();
    let k8s = KubernetesSettings::new(&env().namespace)
        .with_api_url(&env().url)
        .with_token(&env().token)
        .with_ca_file(&env().ca);
    KubernetesLease::new(settings, k8s).unwrap()
}

async fn read(name: &str) -> LeaseObject {
    let admin: Api<LeaseObject> =
        Api::namespaced(client(&env().url, &env().admin_token), &env().namespace);
    admin.get(name).await.expect("admin get")
}

/// `(holderIdentity, leaseTransitions)` of the object now.
async fn holder_and_transitions(name: &str) -> (Option<String>, i32) {
    let spec = read(name).await.spec.expect("spec");
    (
        spec.holder_identity.filter(|h| !h.is_empty()),
        spec.lease_transitions.expect("leaseTransitions"),
    )
}

/// Ours (`rs`) took the object over from client-go, whose last tenure had `cg_transitions`: the
/// handover raised `leaseTransitions` by one, and our fencing token is it.
async fn assert_ours_took_over(name: &str, rs: &KubernetesLease, cg_transitions: i32) {
    let (holder, transitions) = holder_and_transitions(name).await;
    assert_eq!(holder.as_deref(), Some("rs"));
    assert_eq!(transitions, cg_transitions + 1);
    assert_eq!(rs.fencing_token().unwrap().value(), transitions as u64);
}

/// Waits until `lease` renews once more (its counter moves), or panics after a TTL.
async fn next_renewal(lease: &KubernetesLease) {
    let before = lease.stats().renewals;
    let deadline = Instant::now() + TTL;
    while lease.stats().renewals == before {
        assert!(lease.check_alive(), "lost while waiting for a renewal");
        assert!(Instant::now() < deadline, "no renewal within {TTL:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// client-go holds and renews: for several lease durations our attempts are all refused and our
/// lease is never alive. Then SIGTERM: client-go releases (empty holder, leaseDurationSeconds 1)
/// and ours, waiting on its watch, takes over within a round trip, long before the TTL since
/// client-go's last renewal would have run out, with the next fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_go_holder_blocks_ours_and_its_graceful_release_hands_over() {
    let name = unique("cg-holds");
    let history = ObjectHistory::start(&name).await;
    let mut cg = ClientGo::start(&name, "cg", CLIENT_GO).await;
    cg.wait_for("started-leading", Duration::from_secs(10))
        .await;
    let rs = ours(&name, "rs");

    let window_start = Instant::now();
    let mut attempts = 0;
    while window_start.elapsed() < WINDOW {
        assert!(
            !rs.acquire().await.unwrap(),
            "ours acquired a lease client-go holds and renews (attempt {attempts}, {:?} in)",
            window_start.elapsed()
        );
        assert!(!rs.check_alive());
        assert_eq!(rs.fencing_token(), None);
        attempts += 1;
        sleep(Duration::from_millis(200)).await;
    }
    let window_end = Instant::now();
    assert!(attempts >= 20, "only {attempts} attempts in {WINDOW:?}");
    // client-go really renewed all along (every retry period), and never stopped leading.
    let renewals = history.writes_by("cg", window_start, window_end);
    assert!(
        renewals >= 10,
        "client-go wrote only {renewals} times in {WINDOW:?}: {:?}",
        history.versions()
    );
    assert!(!cg.printed("stopped-leading"), "{:?}", cg.seen());
    let (holder, cg_transitions) = holder_and_transitions(&name).await;
    assert_eq!(holder.as_deref(), Some("cg"));

    // Graceful release by client-go.
    let last_renewal = history.last_of("cg").expect("client-go wrote").at;
    let terminated = cg.terminate();
    let waiting = rs.acquire_within(TTL * 2);
    assert!(waiting.await.unwrap(), "ours did not take over");
    let acquired = Instant::now();
    let takeover = acquired - terminated;
    println!(
        "client-go SIGTERM -> ours holds: {takeover:?} ({:?} after client-go's last renewal)",
        acquired - last_renewal
    );
    assert!(
        takeover < SLACK * 2,
        "ours took over {takeover:?} after SIGTERM: not at the release"
    );
    assert!(
        acquired < last_renewal + TTL - Duration::from_secs(1),
        "the takeover came {:?} after client-go's last renewal: an expiry, not the release",
        acquired - last_renewal
    );
    assert!(cg.exited(Duration::from_secs(10)).await.success());
    assert!(cg.printed("stopped-leading"), "{:?}", cg.seen());
    // client-go's release record came between its tenure and ours.
    let versions = history.versions();
    let release = versions
        .iter()
        .position(|v| v.holder.is_none() && v.lease_duration_seconds == Some(1))
        .unwrap_or_else(|| panic!("no client-go release record: {versions:?}"));
    assert!(
        versions[release + 1..]
            .iter()
            .all(|v| v.holder.as_deref() == Some("rs")),
        "{versions:?}"
    );

    // Fencing: the handover raised leaseTransitions, and our token is it.
    assert_ours_took_over(&name, &rs, cg_transitions).await;
    assert!(rs.release().await.unwrap());
}

/// Ours holds and renews: client-go sees our record (`new-leader rs`) and never starts leading
/// over several lease durations. Then our `release()`: client-go starts leading at its next poll
/// (a retry period, with jitter), long before the lease duration since our last renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_holder_blocks_client_go_and_our_release_hands_over() {
    let name = unique("rs-holds");
    let history = ObjectHistory::start(&name).await;
    let rs = ours(&name, "rs");
    assert!(rs.acquire().await.unwrap());
    let token = rs.fencing_token().unwrap().value();
    assert_eq!(
        holder_and_transitions(&name).await,
        (Some("rs".into()), token as i32),
        "our fencing token is the object's leaseTransitions"
    );
    let mut cg = ClientGo::start(&name, "cg", CLIENT_GO).await;
    cg.wait_for("new-leader rs", Duration::from_secs(10)).await;

    let renewals_before = rs.stats().renewals;
    cg.assert_never("started-leading", WINDOW).await;
    assert!(rs.check_alive(), "ours lost the lease");
    let renewals = rs.stats().renewals - renewals_before;
    let expected = (WINDOW.as_millis() / rs.settings().renewal_interval().as_millis()) as u64;
    assert!(
        renewals + 2 >= expected,
        "ours renewed {renewals} times in {WINDOW:?} (expected about {expected})"
    );

    // Release right after a renewal: an expiry could not come before a whole TTL from now.
    next_renewal(&rs).await;
    let released = Instant::now();
    assert!(rs.release().await.unwrap());
    let started = cg.wait_for("started-leading", TTL * 2).await;
    let handover = started - released;
    println!("our release -> client-go started leading: {handover:?}");
    assert!(
        handover < CLIENT_GO_POLL + SLACK,
        "client-go started leading {handover:?} after our release (it polls every {:?} + jitter)",
        CLIENT_GO.retry_period
    );
    let last_renewal = history.last_of("rs").expect("ours wrote").at;
    assert!(
        started < last_renewal + TTL - Duration::from_secs(1),
        "client-go started leading {:?} after our last write: an expiry, not the release",
        started - last_renewal
    );
    // (client-go reports the new leader right before it starts leading)
    cg.printed_within("new-leader cg", Duration::from_secs(2))
        .await;

    // Fencing: the handover raised leaseTransitions.
    let (holder, transitions) = holder_and_transitions(&name).await;
    assert_eq!(holder.as_deref(), Some("cg"));
    assert_eq!(transitions, token as i32 + 1);
    // Our release left the holder empty and the count as it was; client-go counted on from it.
    let versions = history.versions();
    let release = versions
        .iter()
        .position(|v| v.holder.is_none())
        .unwrap_or_else(|| panic!("no release record: {versions:?}"));
    assert_eq!(versions[release].lease_transitions, Some(token as i32));

    // Now client-go holds it: ours is refused.
    assert!(!rs.acquire().await.unwrap());
    cg.terminate();
    assert!(cg.exited(Duration::from_secs(10)).await.success());
}

/// A transfer of ours (`release_to`) names a preferred holder only for our own contenders:
/// client-go sees an ordinary released Lease and starts leading at its next poll, whatever we
/// preferred. It keeps our annotations while it holds the Lease and leaves them in its own
/// release, but that release moved `leaseTransitions` on, so the stale preference blocks none of
/// ours: one takes over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_transfer_does_not_hold_client_go_back_and_leaves_no_stale_preference() {
    let name = unique("rs-transfers");
    let rs = ours(&name, "rs");
    assert!(rs.acquire().await.unwrap());
    let token = rs.fencing_token().unwrap().value();
    let mut cg = ClientGo::start(&name, "cg", CLIENT_GO).await;
    cg.wait_for("new-leader rs", Duration::from_secs(10)).await;

    next_renewal(&rs).await;
    let released = Instant::now();
    assert!(rs.release_to("rs-never-claims").await.unwrap());
    let object = read(&name).await;
    let annotations = object.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get(actix_coordination::KUBERNETES_PREFERRED_HOLDER_ANNOTATION)
            .map(String::as_str),
        Some("rs-never-claims"),
        "{object:?}"
    );
    let started = cg.wait_for("started-leading", TTL * 2).await;
    let handover = started - released;
    println!("our transfer to an absent owner -> client-go started leading: {handover:?}");
    assert!(
        handover < CLIENT_GO_POLL + SLACK,
        "client-go started leading {handover:?} after our transfer: held back by the preference"
    );
    let (holder, transitions) = holder_and_transitions(&name).await;
    assert_eq!(holder.as_deref(), Some("cg"));
    assert_eq!(transitions, token as i32 + 1);

    // client-go releases: ours (not the preferred owner) takes over at once.
    let other = ours(&name, "rs-other");
    let terminated = cg.terminate();
    assert!(
        other.acquire_within(TTL * 2).await.unwrap(),
        "ours did not take over"
    );
    let takeover = terminated.elapsed();
    println!("client-go SIGTERM -> ours (not preferred) holds: {takeover:?}");
    assert!(
        takeover < SLACK * 2,
        "ours took over {takeover:?} after client-go's release: held back by a stale preference"
    );
    assert!(cg.exited(Duration::from_secs(10)).await.success());
    assert!(other.release().await.unwrap());
}

/// A client-go holder killed with SIGKILL (nothing released) is taken over by ours only a whole
/// lease duration after the last renewal ours could have seen, and soon after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_client_go_holder_is_taken_over_after_the_lease_duration() {
    let name = unique("cg-killed");
    let history = ObjectHistory::start(&name).await;
    let mut cg = ClientGo::start(&name, "cg", CLIENT_GO).await;
    cg.wait_for("started-leading", Duration::from_secs(10))
        .await;
    let rs = ours(&name, "rs");
    assert!(!rs.acquire().await.unwrap());
    // Let client-go renew a few times under our eyes.
    let from = Instant::now();
    while history.writes_by("cg", from, Instant::now()) < 3 {
        assert!(
            from.elapsed() < Duration::from_secs(5),
            "client-go does not renew: {:?}",
            history.versions()
        );
        sleep(Duration::from_millis(10)).await;
    }
    let (_, cg_transitions) = holder_and_transitions(&name).await;

    let killed = cg.kill();
    assert!(
        rs.acquire_within(TTL * 3).await.unwrap(),
        "never taken over"
    );
    let acquired = Instant::now();
    let last = history.last_of("cg").expect("client-go wrote");
    let since_kill = acquired - killed;
    println!(
        "client-go SIGKILL -> ours holds: {since_kill:?} ({:?} after client-go's last renewal)",
        acquired - last.at
    );
    assert!(
        acquired + EARLY >= last.at + TTL,
        "taken over {:?} after client-go's last renewal, before its lease duration {TTL:?}",
        acquired - last.at
    );
    assert!(
        since_kill + CLIENT_GO.retry_period + EARLY >= TTL,
        "taken over {since_kill:?} after the kill: client-go renewed at most a retry period before"
    );
    assert!(
        since_kill <= TTL + SLACK * 2,
        "taken over only {since_kill:?} after the kill"
    );

    assert_ours_took_over(&name, &rs, cg_transitions).await;
    assert!(rs.release().await.unwrap());
}

/// Our holder dropped without release (which is what a crash leaves: renewal stops, nothing is
/// written) is taken over by client-go only a whole lease duration after our last renewal, and
/// soon after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_holder_of_ours_is_taken_over_by_client_go_after_the_lease_duration() {
    let name = unique("rs-dropped");
    let history = ObjectHistory::start(&name).await;
    let rs = ours(&name, "rs");
    assert!(rs.acquire().await.unwrap());
    let token = rs.fencing_token().unwrap().value();
    let mut cg = ClientGo::start(&name, "cg", CLIENT_GO).await;
    cg.wait_for("new-leader rs", Duration::from_secs(10)).await;

    // Drop right after a renewal, which client-go must respect for a whole lease duration.
    next_renewal(&rs).await;
    drop(rs);
    let dropped = Instant::now();
    let started = cg.wait_for("started-leading", TTL * 3).await;
    let last = history.last_of("rs").expect("ours wrote");
    let since_drop = started - dropped;
    println!(
        "ours dropped -> client-go started leading: {since_drop:?} ({:?} after our last renewal)",
        started - last.at
    );
    assert!(
        since_drop + EARLY >= TTL,
        "client-go started leading {since_drop:?} after our holder was dropped: before {TTL:?}"
    );
    assert!(
        started + EARLY >= last.at + TTL,
        "client-go started leading {:?} after our last renewal",
        started - last.at
    );
    assert!(
        since_drop <= TTL + CLIENT_GO_POLL * 2 + SLACK,
        "client-go started leading only {since_drop:?} after the drop"
    );
    // Nothing was written for us after the drop (no release, no renewal).
    assert!(
        last.at < dropped + EARLY,
        "ours wrote {:?} after it was dropped: {:?}",
        last.at - dropped,
        history.versions()
    );
    assert!(
        history.versions().iter().all(|v| v.holder.is_some()),
        "nothing released: {:?}",
        history.versions()
    );

    let (holder, transitions) = holder_and_transitions(&name).await;
    assert_eq!(holder.as_deref(), Some("cg"));
    assert_eq!(transitions, token as i32 + 1);
    cg.terminate();
    assert!(cg.exited(Duration::from_secs(10)).await.success());
}
