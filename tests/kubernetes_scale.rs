//! What many Kubernetes leases of one process cost, built the plain way
//! (`KubernetesLease::new` with equal settings): connections, heap, watches, against a real
//! kube-apiserver (the test cluster of `scripts/test-cluster.sh`).
//!
//! The heap is counted by this binary's global allocator (bytes live), so the tests of this file
//! run one at a time (`SERIAL`), and nothing else runs in this process meanwhile.

#[macro_use]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_coordination::{
    GroupSnapshot, GroupWatch, KubernetesLease, KubernetesSession, Lease, LeaseSettings,
    KUBERNETES_WATCH_FLOOR,
};
use common::k8s::{
    acquire_all_and_watch, client, env, established_connections_to, through, unique,
};
use common::proxy::FaultProxy;
use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::time::{sleep, timeout, Instant};

/// Counts the bytes allocated and not yet freed, by every thread of the process.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is updated.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// One test at a time: the heap and the connection counts are the process's.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LEASES: usize = 200;

/// How often the leases of these tests renew.
const RENEWAL_INTERVAL: Duration = Duration::from_secs(3);

/// Settings of the leases of these tests: a TTL and an operation timeout long enough for 200
/// claims at once on a loaded 2-core machine (also with a connection per lease, as before shared
/// sessions, so that such a run fails on the counts rather than on a timeout).
fn settings(name: String) -> LeaseSettings {
    LeaseSettings::builder(name, "a")
        .ttl(Duration::from_secs(30))
        .renewal_interval(RENEWAL_INTERVAL)
        .operation_timeout(RENEWAL_INTERVAL)
        .build()
        .unwrap()
}

/// The bytes live now, as the least of a few samples a tenth of a second apart: the heap of the
/// leases held, without the passing buffers of the renewals in flight.
async fn settled_live() -> isize {
    let mut least = isize::MAX;
    for _ in 0..10 {
        least = least.min(LIVE.load(Ordering::Relaxed));
        sleep(Duration::from_millis(100)).await;
    }
    least
}

/// Waits until no connection to `proxy` is left (a session that ended), within 30 s.
async fn no_connection_left(proxy: &FaultProxy, what: &str) {
    timeout(Duration::from_secs(30), async {
        while established_connections_to(proxy.addr()) > 0 {
            sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{what}: {} connections still open after 30 s",
            established_connections_to(proxy.addr())
        )
    });
}

/// Acquires every lease (25 at a time) and waits until the namespace watch of each is listed.
async fn acquire_and_watch(leases: &[KubernetesLease]) {
    for chunk in leases.chunks(25) {
        let acquired = futures_util::future::join_all(chunk.iter().map(|l| l.acquire())).await;
        for (lease, acquired) in chunk.iter().zip(acquired) {
            assert!(acquired.unwrap(), "{} was free", lease.name());
        }
    }
    timeout(Duration::from_secs(60), async {
        while leases.iter().any(|l| !l.backend().watching()) {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every lease watches its namespace");
}

/// Releases every lease (each was held) and drops them.
async fn release_all(leases: Vec<KubernetesLease>) {
    let released = futures_util::future::join_all(leases.iter().map(|l| l.release())).await;
    assert!(released.into_iter().all(|r| r.unwrap()), "released");
}

/// The most connections to `proxy` seen over two renewal intervals.
async fn most_connections_during_renewals(proxy: &FaultProxy) -> usize {
    let mut most = 0;
    let end = Instant::now() + RENEWAL_INTERVAL * 2;
    while Instant::now() < end {
        sleep(Duration::from_millis(250)).await;
        most = most.max(established_connections_to(proxy.addr()));
    }
    most
}

/// 200 leases built with the plain constructor and equal settings cost what 200 leases of one
/// explicit session cost: at most 2 TCP connections to the API server (counted in the kernel's
/// table, `/proc/self/net/tcp*`, for a proxy only this test talks through) and about the same
/// heap per lease. With a session per lease (before shared sessions) the same 200 kept 200
/// connections and a connection's TLS and HTTP/2 state each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_plain_leases_share_one_session() {
    let _serial = SERIAL.lock().await;
    let _ = env();
    // Warm-up: the sessions' runtime, TLS and logging statics exist before anything is counted.
    {
        let proxy = FaultProxy::start(env().upstream).await;
        let session = KubernetesSession::new(through(&proxy)).unwrap();
        let lease = session.lease(settings(unique("scale-warm")));
        acquire_all_and_watch(std::slice::from_ref(&lease)).await;
        release_all(vec![lease]).await;
        drop(session);
        no_connection_left(&proxy, "the warm-up session").await;
    }

    // The session path: 200 leases of one explicit session.
    let proxy = FaultProxy::start(env().upstream).await;
    let before = settled_live().await;
    let session = KubernetesSession::new(through(&proxy)).unwrap();
    let base = unique("scale-session");
    let leases: Vec<KubernetesLease> = (0..LEASES)
        .map(|i| session.lease(settings(format!("{base}-{i}"))))
        .collect();
    acquire_and_watch(&leases).await;
    let session_connections = most_connections_during_renewals(&proxy).await;
    let session_path = (settled_live().await - before) / LEASES as isize;
    release_all(leases).await;
    drop(session);
    no_connection_left(&proxy, "the explicit session after its leases").await;

    // The plain path: 200 leases of `KubernetesLease::new` with equal settings.
    let proxy = FaultProxy::start(env().upstream).await;
    let before = settled_live().await;
    let base = unique("scale-plain");
    let leases: Vec<KubernetesLease> = (0..LEASES)
        .map(|i| KubernetesLease::new(settings(format!("{base}-{i}")), through(&proxy)).unwrap())
        .collect();
    acquire_and_watch(&leases).await;
    let plain_connections = most_connections_during_renewals(&proxy).await;
    let plain = (settled_live().await - before) / LEASES as isize;
    // However long a loaded machine takes for a round of renewals.
    timeout(Duration::from_secs(60), async {
        while leases.iter().any(|l| l.backend().stats().updates < 1) {
            sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("renewals went on");
    let shared = leases[0].backend().session().unwrap().clone();
    let stats = shared.stats();
    println!(
        "{LEASES} leases: explicit session {session_connections} connections, {session_path} \
         bytes per lease; KubernetesLease::new {plain_connections} connections, {plain} bytes \
         per lease; {stats:?}"
    );
    assert!(session_connections >= 1, "the count sees the session's");
    assert!(
        plain_connections <= 2,
        "{plain_connections} connections for {LEASES} leases built with equal settings"
    );
    assert!(
        leases
            .iter()
            .all(|l| l.backend().session().unwrap().session_id() == shared.session_id()),
        "one session for all"
    );
    assert_eq!(stats.watch.listings, 1, "one namespace watch: {stats:?}");
    assert!(
        plain <= session_path * 3 / 2 + 2048,
        "{plain} bytes per lease built with KubernetesLease::new, {session_path} on the session \
         path"
    );
    drop(shared);
    release_all(leases).await;
}

/// The shared session lives as long as its leases: when the last lease built with
/// `KubernetesLease::new` is dropped, its connection closes (no session is kept by the process),
/// and the next `new` with the same settings builds a fresh session that works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_session_ends_with_its_last_lease() {
    let _serial = SERIAL.lock().await;
    let proxy = FaultProxy::start(env().upstream).await;
    let base = unique("scale-ends");
    let leases: Vec<KubernetesLease> = (0..20)
        .map(|i| KubernetesLease::new(settings(format!("{base}-{i}")), through(&proxy)).unwrap())
        .collect();
    acquire_all_and_watch(&leases).await;
    let shared = leases[0].backend().session().unwrap().session_id();
    assert!(
        leases
            .iter()
            .all(|l| l.backend().session().unwrap().session_id() == shared),
        "one session for all"
    );
    let first = leases[0].backend().session().unwrap().stats();
    assert!(first.connections >= 1, "{first:?}");
    assert!(established_connections_to(proxy.addr()) >= 1);
    // One lease left (still holding its lease): the session and its connection stay.
    let last = leases.last().unwrap().name().to_owned();
    let mut leases = leases;
    let kept = leases.pop().unwrap();
    release_all(leases).await;
    sleep(Duration::from_millis(500)).await;
    assert!(
        established_connections_to(proxy.addr()) >= 1,
        "the session ended while {last} still used it"
    );
    assert!(kept.check_alive());
    // Dropped while held (as a crash would): the last user is gone.
    drop(kept);
    no_connection_left(&proxy, "the shared session after its last lease").await;

    let again = KubernetesLease::new(settings(format!("{base}-again")), through(&proxy)).unwrap();
    assert_eq!(
        again.backend().session().unwrap().stats().connections,
        0,
        "a fresh session"
    );
    let started = Instant::now();
    assert!(again.acquire().await.unwrap());
    assert!(established_connections_to(proxy.addr()) >= 1);
    assert!(again.release().await.unwrap());
    println!("the fresh session acquired in {:?}", started.elapsed());
}

/// The watches on `Lease` objects the API server is serving now
/// (`apiserver_longrunning_gauge{resource="leases",verb="WATCH"}` of its metrics).
async fn open_lease_watches(admin: &kube::Client) -> i64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin.request_text(request).await.expect("metrics");
    text.lines()
        .filter_map(|line| line.strip_prefix("apiserver_longrunning_gauge{"))
        .filter_map(|rest| rest.split_once("} "))
        .filter(|(labels, _)| {
            labels.contains("resource=\"leases\"") && labels.contains("verb=\"WATCH\"")
        })
        .map(|(_, value)| value.trim().parse::<f64>().unwrap() as i64)
        .sum()
}

/// Waits until the API server serves `expected` lease watches, within 30 s; the count seen last.
async fn lease_watches_become(admin: &kube::Client, expected: i64) -> i64 {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let open = open_lease_watches(admin).await;
        if open == expected || Instant::now() > give_up {
            return open;
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Leases on a ready client share one namespace watch when built from one
/// `KubernetesSession::from_client` (counted by the API server: one watch more while they hold,
/// none left after they are dropped), where leases built `with_client` on clones of the same
/// client have one each (a `kube::Client` has no identity to share by).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_a_client_session_share_one_watch() {
    const MANY: usize = 20;
    const EACH: usize = 3;
    let _serial = SERIAL.lock().await;
    let admin = client(&env().url, &env().admin_token);
    // No lease watch of an earlier test of this process is left.
    let before = lease_watches_become(&admin, 0).await;
    let client = client(&env().url, &env().token);
    let session = KubernetesSession::from_client(client.clone(), env().namespace.clone()).unwrap();
    let base = unique("scale-client");
    let leases: Vec<KubernetesLease> = (0..MANY)
        .map(|i| session.lease(settings(format!("{base}-{i}"))))
        .collect();
    acquire_and_watch(&leases).await;
    let shared = lease_watches_become(&admin, before + 1).await;
    assert_eq!(
        shared,
        before + 1,
        "{MANY} leases of one client session: {} watches",
        shared - before
    );
    assert_eq!(session.stats().watch.listings, 1, "{:?}", session.stats());

    // The calibration: leases built `with_client` each open a watch of their own.
    let each: Vec<KubernetesLease> = (0..EACH)
        .map(|i| {
            KubernetesLease::with_client(
                settings(format!("{base}-each-{i}")),
                client.clone(),
                env().namespace.clone(),
            )
            .unwrap()
        })
        .collect();
    acquire_and_watch(&each).await;
    let expected = before + 1 + EACH as i64;
    assert_eq!(lease_watches_become(&admin, expected).await, expected);

    release_all(each).await;
    release_all(leases).await;
    drop(session);
    assert_eq!(
        lease_watches_become(&admin, before).await,
        before,
        "the watches end with their leases"
    );
}

/// `apiserver_request_total{resource="leases"}` of the API server's metrics, by verb.
async fn lease_requests(admin: &kube::Client) -> BTreeMap<String, u64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin.request_text(request).await.expect("metrics");
    let mut by_verb = BTreeMap::new();
    for (labels, value) in text
        .lines()
        .filter_map(|line| line.strip_prefix("apiserver_request_total{"))
        .filter_map(|rest| rest.split_once("} "))
        .filter(|(labels, _)| labels.contains("resource=\"leases\""))
    {
        let verb = labels
            .split(',')
            .find_map(|l| l.strip_prefix("verb=\""))
            .map(|v| v.trim_end_matches('"').to_owned())
            .unwrap_or_default();
        *by_verb.entry(verb).or_insert(0) += value.trim().parse::<f64>().unwrap() as u64;
    }
    by_verb
}

/// Waits until the latest snapshot of `group` satisfies `check` (at the instant it is checked),
/// within 30 s; that snapshot.
async fn group_becomes(
    group: &mut GroupWatch,
    what: &str,
    check: impl Fn(&GroupSnapshot, Instant) -> bool,
) -> Arc<GroupSnapshot> {
    timeout(Duration::from_secs(30), async {
        loop {
            let snapshot = group.snapshot_and_mark();
            if check(&snapshot, Instant::now()) {
                return snapshot;
            }
            group.changed().await.expect("the group watch runs");
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not within 30 s: {:?}", group.snapshot()))
}

/// A group watch over 50 leases held by one session is a filter over the namespace watch the
/// leases share: starting it and following it sends no request (the session's watch counters and
/// the API server's counts of `LIST`, `WATCH`, `GET` and `CREATE` on leases stay as they were)
/// and opens no watch. It sees a record another session (a separate client) claims, releases
/// and deletes, and it keeps the namespace watch running after the leases are gone, until it is
/// dropped itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_watch_adds_no_request() {
    const HELD: usize = 50;
    let _serial = SERIAL.lock().await;
    let admin = client(&env().url, &env().admin_token);
    // No lease watch of an earlier test of this process is left (an ending one counts a request).
    let before_watches = lease_watches_become(&admin, 0).await;
    let proxy = FaultProxy::start(env().upstream).await;
    let session = KubernetesSession::new(through(&proxy)).unwrap();
    let base = unique("scale-group");
    let prefix = format!("{base}-");
    let leases: Vec<KubernetesLease> = (0..HELD)
        .map(|i| session.lease(settings(format!("{base}-{i}"))))
        .collect();
    acquire_and_watch(&leases).await;
    assert_eq!(
        lease_watches_become(&admin, before_watches + 1).await,
        before_watches + 1
    );
    let quiet = |by_verb: &BTreeMap<String, u64>| -> BTreeMap<String, u64> {
        by_verb
            .iter()
            .filter(|(verb, _)| ["LIST", "WATCH", "GET", "CREATE"].contains(&verb.as_str()))
            .map(|(verb, n)| (verb.clone(), *n))
            .collect()
    };
    let server_before = quiet(&lease_requests(&admin).await);
    let watch_before = session.stats().watch;

    let mut group = leases[0].watch_group(&prefix).expect("a group watch");
    let all = group_becomes(&mut group, "every held lease", |s, now| {
        s.is_synced()
            && s.records().len() == HELD
            && (0..HELD).all(|i| s.live_holder(&format!("{base}-{i}"), now) == Some("a"))
    })
    .await;
    for lease in &leases {
        let record = all.get(lease.name()).unwrap();
        assert_eq!(record.token, lease.fencing_token(), "{record:?}");
    }
    let server_after = quiet(&lease_requests(&admin).await);
    assert_eq!(server_after, server_before, "requests of the group watch");
    assert_eq!(session.stats().watch, watch_before, "{:?}", session.stats());
    assert_eq!(open_lease_watches(&admin).await, before_watches + 1);

    // Another session, with a client of its own, claims, releases and deletes a record.
    let other_session = KubernetesSession::new(through(&proxy)).unwrap();
    assert_ne!(other_session.session_id(), session.session_id());
    let other_name = format!("{base}-other");
    let other = other_session.lease(
        LeaseSettings::builder(&other_name, "b")
            .ttl(Duration::from_secs(30))
            .build()
            .unwrap(),
    );
    assert!(other.acquire().await.unwrap());
    let token = other.fencing_token();
    let seen = group_becomes(&mut group, "the other session's claim", |s, now| {
        s.live_holder(&other_name, now) == Some("b")
    })
    .await;
    assert_eq!(seen.get(&other_name).unwrap().token, token);
    assert!(other.release().await.unwrap());
    group_becomes(&mut group, "the other session's release", |s, _| {
        s.get(&other_name).is_some_and(|r| r.holder.is_none())
    })
    .await;
    let objects: kube::Api<LeaseObject> = kube::Api::namespaced(admin.clone(), &env().namespace);
    objects
        .delete(&other_name, &Default::default())
        .await
        .expect("delete");
    group_becomes(&mut group, "the deletion", |s, _| {
        s.get(&other_name).is_none() && s.records().len() == HELD
    })
    .await;
    drop(other);
    drop(other_session);
    assert_eq!(
        session.stats().watch,
        watch_before,
        "the group watch sent nothing: {:?}",
        session.stats()
    );

    // The leases go; the group watch keeps the namespace watch (it still sees a client-go style
    // object, without our annotation, created afterwards), until it goes too.
    release_all(leases).await;
    group_becomes(&mut group, "every release", |s, _| {
        s.records().values().all(|r| r.holder.is_none())
    })
    .await;
    let late = format!("{base}-late");
    let object = LeaseObject {
        metadata: ObjectMeta {
            name: Some(late.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("c".into()),
            lease_duration_seconds: Some(30),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    };
    objects
        .create(&Default::default(), &object)
        .await
        .expect("create");
    group_becomes(
        &mut group,
        "an object created after the leases went",
        |s, now| s.live_holder(&late, now) == Some("c"),
    )
    .await;
    assert_eq!(
        open_lease_watches(&admin).await,
        before_watches + 1,
        "the group watch keeps the namespace watch"
    );
    drop(group);
    assert_eq!(
        lease_watches_become(&admin, before_watches).await,
        before_watches,
        "the namespace watch ends with the last group watch"
    );
    drop(session);
    objects
        .delete(&late, &Default::default())
        .await
        .expect("delete");
}

/// A sharded worker (does nothing).
struct Part;

impl actix::Actor for Part {
    type Context = actix::Context<Self>;
}

/// A node of a `ShardedWorkers` group holding 256 shards, bound to its member lease (the
/// default), costs the API server one write per renewal interval (its member lease's) and no
/// read: counted by the API server (`apiserver_request_total` on leases, every mutating verb)
/// over four renewal intervals once the node has settled: at most 5 updates, no GET, LIST,
/// CREATE, PATCH or DELETE at all, and at most one re-opened watch per interval (see below).
#[test]
fn a_sharded_node_holding_256_bound_shards_writes_once_per_interval_and_reads_nothing() {
    sharded_node_costs(true);
}

/// With shard leases renewed on their own (`bind_shards: false`), a node holding 256 shards
/// costs one write per shard (and one for its member lease) per renewal interval and no read:
/// at most (256 + 1) × 5 updates over four intervals.
#[test]
fn a_sharded_node_holding_256_shards_writes_once_per_shard_per_interval_and_reads_nothing() {
    sharded_node_costs(false);
}

fn sharded_node_costs(bind: bool) {
    use actix::Actor;
    use actix_coordination::{GetShards, ShardInfo, ShardedSettings, ShardedWorkers, Shutdown};
    const SHARDS: usize = 256;
    const INTERVALS: u32 = 4;
    actix_rt::System::new().block_on(async {
        let _serial = SERIAL.lock().await;
        let admin = client(&env().url, &env().admin_token);
        let session = KubernetesSession::new(through_url()).unwrap();
        let group = unique("scale-shards");
        let leases = session.clone();
        let node = ShardedWorkers::with_count(
            group.clone(),
            SHARDS,
            move |name: &str| leases.lease(settings(name.to_owned())),
            |_: &ShardInfo, _| Part,
        )
        .unwrap()
        .settings(ShardedSettings {
            bind_shards: bind,
            ..ShardedSettings::default()
        })
        .unwrap()
        .start();
        timeout(Duration::from_secs(120), async {
            while node.send(GetShards).await.unwrap().len() < SHARDS {
                sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("the node holds every shard within 2 minutes");
        // One interval to settle (claims done, renewals on their clock), then count.
        sleep(RENEWAL_INTERVAL).await;
        let before = lease_requests(&admin).await;
        let watch_before = session.stats().watch;
        sleep(RENEWAL_INTERVAL * INTERVALS).await;
        let after = lease_requests(&admin).await;
        let watch_after = session.stats().watch;
        println!("watch stats {watch_before:?} → {watch_after:?}");
        let delta = |verb: &str| {
            after.get(verb).copied().unwrap_or(0) - before.get(verb).copied().unwrap_or(0)
        };
        let updates = delta("UPDATE") + delta("PUT");
        // Bound: the member lease alone is renewed; renewed: every shard lease too.
        let renewed = if bind { 1 } else { SHARDS as u64 + 1 };
        assert!(
            updates <= renewed * u64::from(INTERVALS + 1),
            "{updates} updates in {INTERVALS} intervals: {before:?} → {after:?}"
        );
        assert!(
            updates >= renewed * u64::from(INTERVALS - 1),
            "{updates} updates: the leases are not being renewed: {before:?} → {after:?}"
        );
        for verb in ["GET", "LIST", "CREATE", "PATCH", "DELETE"] {
            assert_eq!(delta(verb), 0, "{verb}: {before:?} → {after:?}");
        }
        // The API server ends the namespace watch's stream early now and then under this write
        // load (about 85 events a second), the more often the busier the machine: 0–3 times in
        // the window on a quiet machine, 7 under `scripts/ci-under-load.sh` (load 8). Not
        // explained; what the crate promises is that each is re-opened from where it was,
        // without a listing (LIST stays 0, no new listing), and never sooner than
        // `KUBERNETES_WATCH_FLOOR` after the previous one, so a re-open can never become a
        // request loop: at most one per floor delay over the window.
        let window = RENEWAL_INTERVAL * INTERVALS;
        let most = window.as_secs_f64() / KUBERNETES_WATCH_FLOOR.as_secs_f64() + 1.0;
        assert!(
            delta("WATCH") as f64 <= most,
            "{} watch re-opens in {window:?} (at most one per {KUBERNETES_WATCH_FLOOR:?}): {watch_before:?} → {watch_after:?}",
            delta("WATCH")
        );
        assert_eq!(watch_after.listings, watch_before.listings, "no listing");
        println!(
            "a node of {SHARDS} shards (bound: {bind}): {:.2} writes per renewal interval, 0 reads",
            updates as f64 / f64::from(INTERVALS)
        );
        // Every shard still held (and, bound, by no write of its own).
        assert_eq!(node.send(GetShards).await.unwrap().len(), SHARDS);
        assert!(node.send(Shutdown).await.unwrap().unwrap());
    });
}

/// The API server's settings of the suite (no proxy).
fn through_url() -> actix_coordination::KubernetesSettings {
    common::k8s::settings_at(&env().url)
}
