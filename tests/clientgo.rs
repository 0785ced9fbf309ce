//! Interop with client-go: a client-go `leaderelection` program (`resourcelock.LeaseLock`,
//! tests/clientgo/leaderelect/main.go) and a [`KubernetesLease`] on the same
//! `coordination.k8s.io/v1` Lease object of the real kube-apiserver, both as the `lease-holder`
//! user (the Role of deploy/rbac.yaml).
//!
//! Needs the test cluster of `scripts/test-cluster.sh` with its client-go programs
//! (`ACTIX_COORD_TEST_CLIENTGO_BIN`, client-go 1.20, and `ACTIX_COORD_TEST_CLIENTGO_NEW_BIN`,
//! client-go 0.32.3); `scripts/test.sh` builds, starts and stops everything.
//!
//! Both directions: while one side renews the other never claims; a graceful release on either
//! side hands over at once; a killed holder is taken over only after the lease duration; every
//! handover raises `leaseTransitions`, which is our fencing token.
//!
//! Bound shard leases ([`Lease::bind_to`]): a bound record is written once, never renewed, with
//! `leaseDurationSeconds` [`KUBERNETES_BOUND_DURATION_SECS`]. client-go 1.27 and later judges
//! expiry by that field and never takes the record while it stands; client-go before 1.27 applies
//! its own lease duration and takes it over while its member lives (the README's warning).

#[macro_use]
mod common;

use std::time::Duration;

use actix_coordination::{
    kubernetes_object_name, KubernetesLease, KubernetesSession, KubernetesSettings, Lease,
    LeaseLost, LeaseSettings, LostReason, LostSubscription, KUBERNETES_BOUND_DURATION_SECS,
    KUBERNETES_BOUND_INCARNATION_ANNOTATION, KUBERNETES_BOUND_TO_ANNOTATION,
};
use common::clientgo::{Build, ClientGo, ElectionTiming, ObjectHistory};
use common::k8s::{client, env, unique};
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use kube::api::Api;
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout, Instant};

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

/// client-go's timings against bound records: a short lease duration, so that several of them
/// pass while our member lease lives.
const BOUND_CLIENT_GO: ElectionTiming = ElectionTiming {
    lease_duration: Duration::from_secs(2),
    renew_deadline: Duration::from_millis(1500),
    retry_period: Duration::from_millis(500),
};
/// Five of `BOUND_CLIENT_GO`'s lease durations.
const BOUND_WINDOW: Duration = Duration::from_secs(10);

/// A node of group `group` on a session of its own: member lease `<group>.member.<owner>` and
/// shard lease `<group>.0` bound to it, both of `owner`, with our TTL; every loss of the shard
/// tenure is sent to `shard_lost`.
struct Node {
    member: KubernetesLease,
    shard: KubernetesLease,
    shard_lost: mpsc::UnboundedReceiver<LeaseLost>,
    _told: LostSubscription,
}

impl Node {
    fn new(group: &str, owner: &str) -> Self {
        let k8s = KubernetesSettings::new(&env().namespace)
            .with_api_url(&env().url)
            .with_token(&env().token)
            .with_ca_file(&env().ca);
        let session = KubernetesSession::new(k8s).unwrap();
        let settings = |name: String| {
            LeaseSettings::builder(name, owner)
                .ttl(TTL)
                .acquire_retries(0)
                .build()
                .unwrap()
        };
        let member = session.lease(settings(format!("{group}.member.{owner}")));
        let shard = session.lease(settings(shard_of(group)));
        shard
            .bind_to(&member.binding_anchor().expect("Kubernetes leases bind"))
            .expect("bound");
        let (tx, shard_lost) = mpsc::unbounded_channel();
        let told = shard.on_lost(move |lost| {
            let _ = tx.send(lost.clone());
        });
        Self {
            member,
            shard,
            shard_lost,
            _told: told,
        }
    }

    /// Acquires the member lease, then the shard lease bound to it.
    async fn acquire_both(&self) {
        assert!(self.member.acquire().await.unwrap(), "member lease free");
        assert!(self.shard.acquire().await.unwrap(), "shard lease free");
        assert_eq!(self.shard.bound_to().as_deref(), Some(self.member.name()));
    }

    /// The next loss of the shard tenure, or a panic after `within`.
    async fn shard_lost_within(&mut self, within: Duration) -> (Instant, LeaseLost) {
        let lost = timeout(within, self.shard_lost.recv())
            .await
            .unwrap_or_else(|_| panic!("the shard tenure was not lost within {within:?}"))
            .expect("subscribed");
        (Instant::now(), lost)
    }

    /// Panics if the shard tenure was lost so far.
    fn assert_shard_never_lost(&mut self) {
        if let Ok(lost) = self.shard_lost.try_recv() {
            panic!("the shard tenure was lost: {lost}");
        }
    }
}

/// The shard lease name of `group`.
fn shard_of(group: &str) -> String {
    format!("{group}.0")
}

/// `lease` held by `holder`, bound to `member`'s tenure with the bound duration, as the API
/// server has it now.
async fn assert_bound_record(object: &str, holder: &str, member: &KubernetesLease) -> LeaseObject {
    let lease = read(object).await;
    let spec = lease.spec.clone().expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some(holder), "{lease:?}");
    assert_eq!(
        spec.lease_duration_seconds,
        Some(KUBERNETES_BOUND_DURATION_SECS),
        "{lease:?}"
    );
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get(KUBERNETES_BOUND_TO_ANNOTATION)
            .map(String::as_str),
        Some(member.name()),
        "{lease:?}"
    );
    let member_object = read(member.backend().object_name()).await;
    let incarnation = format!(
        "{}/{}",
        member_object.metadata.uid.as_deref().expect("uid"),
        member_object
            .spec
            .and_then(|s| s.lease_transitions)
            .expect("leaseTransitions")
    );
    assert_eq!(
        annotations
            .get(KUBERNETES_BOUND_INCARNATION_ANNOTATION)
            .map(String::as_str),
        Some(incarnation.as_str()),
        "{lease:?}"
    );
    lease
}

/// client-go 1.27+ against a bound shard record: it reads `leaseDurationSeconds` (about 68 years)
/// and never claims the record, over many of its own lease durations, while the member lease
/// renews and the shard record is never written again. Then the member's release ends the shard
/// tenure (`Unbound`), and the shard is free at once for a client of this crate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_go_never_takes_a_bound_shard_while_its_member_lives() {
    let group = unique("cg-bound");
    let object = kubernetes_object_name(&shard_of(&group));
    let history = ObjectHistory::start(&object).await;
    let mut a = Node::new(&group, "a");
    a.acquire_both().await;
    let claim = assert_bound_record(&object, "a", &a.member).await;
    let claimed_version = claim.metadata.resource_version.clone().expect("version");

    let mut cg = ClientGo::start_build(Build::New, &object, "cg", BOUND_CLIENT_GO).await;
    cg.wait_for("new-leader a", Duration::from_secs(10)).await;
    let renewals_before = a.member.stats().renewals;
    let window_start = Instant::now();
    cg.assert_never("started-leading", BOUND_WINDOW).await;
    // The window was also one of several member renewals, and the member lived through it.
    let renewals = a.member.stats().renewals - renewals_before;
    let expected =
        (BOUND_WINDOW.as_millis() / a.member.settings().renewal_interval().as_millis()) as u64;
    assert!(
        renewals + 2 >= expected,
        "the member renewed {renewals} times in {BOUND_WINDOW:?} (expected about {expected})"
    );
    assert!(
        window_start.elapsed() >= BOUND_CLIENT_GO.lease_duration * 4,
        "{:?}",
        window_start.elapsed()
    );
    assert!(a.member.check_alive(), "the member lease was lost");
    assert!(a.shard.check_alive(), "the shard tenure ended");
    a.assert_shard_never_lost();
    assert_eq!(a.shard.stats().renewals, 0, "a bound tenure renews nothing");
    // Nobody wrote the shard record after the claim: not client-go, not a renewal of ours.
    let now = assert_bound_record(&object, "a", &a.member).await;
    assert_eq!(
        now.metadata.resource_version.as_deref(),
        Some(claimed_version.as_str()),
        "the shard record was written after its claim: {:?}",
        history.versions()
    );
    let versions = history.versions();
    assert!(
        versions
            .iter()
            .all(|v| v.resource_version == claimed_version),
        "{versions:?}"
    );

    // The member's end ends the shard tenure, and frees the shard for clients of this crate.
    let mut b = Node::new(&group, "b");
    assert!(b.member.acquire().await.unwrap());
    assert!(
        !b.shard.acquire().await.unwrap(),
        "b claimed a shard bound to a live member"
    );
    next_renewal(&a.member).await;
    let released = Instant::now();
    assert!(a.member.release().await.unwrap());
    let (_, lost) = a.shard_lost_within(Duration::from_secs(1)).await;
    assert_eq!(
        lost.reason,
        LostReason::Unbound {
            member: a.member.name().to_owned()
        },
        "{lost}"
    );
    assert!(!a.shard.check_alive());
    assert!(
        b.shard.acquire_within(TTL).await.unwrap(),
        "b did not take the shard"
    );
    let taken = released.elapsed();
    println!("a's member released -> b holds the shard: {taken:?}");
    assert!(
        taken < SLACK * 2,
        "b took the shard {taken:?} after a's member release: not at once"
    );
    assert_bound_record(&object, "b", &b.member).await;
    assert_eq!(
        b.shard.fencing_token().unwrap().value(),
        transitions_in(&claim) + 1,
        "the claim moved leaseTransitions on"
    );
    // client-go saw the new holder, and still does not claim.
    cg.wait_for("new-leader b", Duration::from_secs(5)).await;
    assert!(!cg.printed("started-leading"), "{:?}", cg.seen());
    cg.terminate();
    assert!(cg.exited(Duration::from_secs(10)).await.success());
    assert!(!cg.printed("started-leading"), "{:?}", cg.seen());
    assert!(b.shard.check_alive());
    b.assert_shard_never_lost();
    assert!(b.member.release().await.unwrap());
    let (_, lost) = b.shard_lost_within(Duration::from_secs(1)).await;
    assert!(matches!(lost.reason, LostReason::Unbound { .. }), "{lost}");
}

/// The `leaseTransitions` of a claimed record.
fn transitions_in(claim: &LeaseObject) -> u64 {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .expect("leaseTransitions") as u64
}

/// client-go before 1.27 against a bound shard record (the documented limitation): it applies
/// its own lease duration to a record it sees unchanged, so it starts leading about that long
/// after it first saw the record, while the member lease lives and renews; the shard tenure is
/// told it lost the lease (taken over, through its watch). Pointing old client-go at bound records
/// is therefore unsafe, as the README says. Ours still respects client-go's tenure afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_client_go_takes_a_bound_shard_after_its_own_duration() {
    let group = unique("cg-bound-old");
    let object = kubernetes_object_name(&shard_of(&group));
    let mut a = Node::new(&group, "a");
    a.acquire_both().await;
    let claim = assert_bound_record(&object, "a", &a.member).await;

    let mut cg = ClientGo::start_build(Build::Old, &object, "cg", BOUND_CLIENT_GO).await;
    // client-go times the record from its first read, right before it reports the holder.
    let seen = cg.wait_for("new-leader a", Duration::from_secs(10)).await;
    let renewals_before = a.member.stats().renewals;
    let started = cg
        .wait_for("started-leading", BOUND_CLIENT_GO.lease_duration * 3)
        .await;
    let after = started - seen;
    println!("old client-go saw the bound record held by a -> started leading: {after:?}");
    assert!(
        after + EARLY >= BOUND_CLIENT_GO.lease_duration,
        "old client-go started leading {after:?} after it saw the record: before its own duration"
    );
    assert!(
        after <= BOUND_CLIENT_GO.lease_duration + CLIENT_GO_POLL + SLACK,
        "old client-go started leading only {after:?} after it saw the record"
    );
    // ... while the member lived and renewed.
    assert!(a.member.check_alive(), "the member lease was lost");
    assert!(
        a.member.stats().renewals > renewals_before,
        "the member did not renew meanwhile"
    );

    // a's shard tenure learns it from its watch.
    let (lost_at, lost) = a.shard_lost_within(TTL).await;
    println!(
        "old client-go started leading -> a's shard tenure lost: {:?}",
        lost_at - started
    );
    assert_eq!(
        lost.reason,
        LostReason::TakenOver {
            holder: Some("cg".into())
        },
        "{lost}"
    );
    assert!(!a.shard.check_alive());
    assert!(a.member.check_alive(), "the member lives on");
    let (holder, transitions) = holder_and_transitions(&object).await;
    assert_eq!(holder.as_deref(), Some("cg"));
    assert_eq!(transitions as u64, transitions_in(&claim) + 1);

    // client-go holds and renews now: ours is refused, bound (a, b) or not (rs), for several of
    // client-go's lease durations.
    let b = Node::new(&group, "b");
    assert!(b.member.acquire().await.unwrap());
    let rs = ours(&object, "rs");
    let window_start = Instant::now();
    while window_start.elapsed() < BOUND_CLIENT_GO.lease_duration * 3 {
        assert!(
            !a.shard.acquire().await.unwrap(),
            "a took the shard back from client-go"
        );
        assert!(
            !b.shard.acquire().await.unwrap(),
            "b took the shard from client-go"
        );
        assert!(
            !rs.acquire().await.unwrap(),
            "ours took the shard from client-go"
        );
        sleep(Duration::from_millis(300)).await;
    }
    assert!(!cg.printed("stopped-leading"), "{:?}", cg.seen());
    cg.terminate();
    assert!(cg.exited(Duration::from_secs(10)).await.success());
    assert!(a.member.release().await.unwrap());
    assert!(b.member.release().await.unwrap());
}
