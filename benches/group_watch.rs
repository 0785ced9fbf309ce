//! The group watch at the scale of issue 37: one group of 10,000 shard records and 101 member
//! records, watched by one session, against the real servers of the test cluster.
//!
//! ```text
//! scripts/test-cluster.sh up target/bench-cluster && . target/bench-cluster/env
//! cargo bench --all-features --bench group_watch -- kubernetes etcd
//! ```
//!
//! For each backend the bench first writes the group with a client of its own (Kubernetes: the
//! admin token, in a fresh namespace `gw-bench-<unique>`, shard `g.<i>` bound to member
//! `g.member.node-<i % 100>`, as bound shard records are; etcd: keys under a fresh session
//! prefix, on one etcd lease, in transactions of 100 puts), then measures, for one session:
//!
//! * **listing**: from `watch_group("g.")` to its first synced snapshot with every record, and
//!   the list requests it took (Kubernetes: one per page of 500 objects, `session.stats()`);
//! * **memory**: the resident memory (`/proc/self/statm`, after `malloc_trim`) and the heap in
//!   use (this binary's allocator counts it) that the watch added, per object, with the session's
//!   connection opened before the baseline and nothing dropped before the second reading;
//! * **change delivery**: from sending a write of one record (the admin client) to the group
//!   watch's `changed()` showing it, `BENCH_GW_ROUNDS` times (default 50), twice: with the reader
//!   dropping each snapshot it read, and with the reader holding the previous snapshot while the
//!   next change arrives (a snapshot is changed in place, but copied while a reader holds it);
//!   the write's own round trip is reported beside it;
//! * **reading**: one `GroupSnapshot::live_holder` of a shard (a bound one also looks up its
//!   member record), a full scan (`live_holder` of every record) and a copy of the snapshot.
//!
//! The group is deleted afterwards (the Kubernetes namespace is left, empty: the test cluster runs
//! no namespace controller to finish deleting one). The results are appended to the results file
//! (see `benches/common/mod.rs`), with two targets checked: a change delivered within 100 ms
//! (median) and at most 2 KB of resident memory per object; with `--check` the bench exits with
//! status 1 when one is missed. `BENCH_GW_SHARDS` changes the number of shards (default 10,000).

mod common;

use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_coordination::{GroupSnapshot, GroupWatch, Lease, LeaseSettings};
use common::{ms, summarize, Check, Report, Summary};
use futures_util::stream::{self, StreamExt};
use tokio::time::{timeout, Instant};

/// The system allocator, counting the bytes in use.
struct Counting;

static HEAP: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is updated.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        HEAP.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        HEAP.fetch_add(new as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Members holding shards (the 101st member record is one that holds none: a node that just
/// joined).
const MEMBERS: usize = 100;

/// The most a change may take to reach the group watch (median), and the most resident memory
/// an object may cost: issue 37's bounds for this bench.
const DELIVERY_TARGET_MS: f64 = 100.0;
const BYTES_PER_OBJECT_TARGET: f64 = 2048.0;

fn shards() -> usize {
    std::env::var("BENCH_GW_SHARDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn rounds() -> usize {
    std::env::var("BENCH_GW_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

fn cluster_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: this bench needs the test cluster. Start it with \
             `scripts/test-cluster.sh up target/bench-cluster && . target/bench-cluster/env`"
        )
    })
}

/// This process's resident memory, after handing glibc's free pages back to the system.
fn rss_bytes() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only releases free memory of glibc's allocator.
        unsafe {
            malloc_trim(0);
        }
    }
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn heap_bytes() -> i64 {
    HEAP.load(Ordering::Relaxed) as i64
}

fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}-{:x}", std::process::id(), nanos)
}

/// A shard's member (`None`: index `MEMBERS`, the member holding no shard).
fn member_of(shard: usize) -> usize {
    shard % MEMBERS
}

/// What a backend offers the measurements: a way to change one record, and to tell the change
/// in a snapshot.
trait Store {
    /// Changes shard `shard` for round `round`; returns the write's own round trip.
    async fn change(&self, shard: usize, round: usize) -> Duration;
    /// Whether `snapshot` shows round `round`'s change of shard `shard`.
    fn shows(&self, snapshot: &GroupSnapshot, shard: usize, round: usize) -> bool;
}

/// The figures of one backend.
struct Figures {
    objects: usize,
    list: Duration,
    list_requests: Option<u64>,
    rss_per_object: f64,
    heap_per_object: f64,
    rss_mib: (u64, u64),
    delivery: Summary,
    delivery_held: Summary,
    write: Summary,
    lookup_ns: f64,
    scan_ms: f64,
    copy_ms: f64,
    live: usize,
}

/// Waits until the watch's snapshot satisfies `done`.
async fn until(
    watch: &mut GroupWatch,
    what: &str,
    done: impl Fn(&GroupSnapshot) -> bool,
) -> Arc<GroupSnapshot> {
    timeout(Duration::from_secs(120), async {
        loop {
            let snapshot = watch.snapshot_and_mark();
            if done(&snapshot) {
                return snapshot;
            }
            drop(snapshot);
            watch.changed().await.expect("the group watch ended");
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not within 120 s"))
}

/// Lists the group (`watch`: made by `start`), then measures memory, delivery and reading.
async fn measure<S: Store>(
    store: &S,
    objects: usize,
    shards: usize,
    start: impl FnOnce() -> GroupWatch,
    list_requests: impl Fn() -> Option<u64>,
) -> (Figures, GroupWatch) {
    let requests_before = list_requests();
    let rss_before = rss_bytes();
    let heap_before = heap_bytes();
    let started = Instant::now();
    let mut watch = start();
    let listed = until(&mut watch, "the listing", |s| {
        s.is_synced() && s.records().len() == objects
    })
    .await;
    let list = started.elapsed();
    let list_requests = list_requests()
        .zip(requests_before)
        .map(|(after, before)| after - before);
    drop(listed);
    let rss_after = rss_bytes();
    let heap_after = heap_bytes();

    // Change delivery: `rounds` with the reader dropping each snapshot, `rounds` holding one.
    let rounds = rounds();
    let mut delivery = Vec::new();
    let mut delivery_held = Vec::new();
    let mut write = Vec::new();
    for round in 0..2 * rounds {
        let shard = (round * 7919) % shards;
        let held = (round >= rounds).then(|| watch.snapshot_and_mark());
        watch.snapshot_and_mark();
        let sent = Instant::now();
        let (written, seen) = tokio::join!(store.change(shard, round), async {
            until(&mut watch, "a change", |s| store.shows(s, shard, round)).await;
            sent.elapsed()
        });
        drop(held);
        write.push(ms(written));
        if round < rounds {
            delivery.push(ms(seen));
        } else {
            delivery_held.push(ms(seen));
        }
    }

    // Reading.
    let snapshot = watch.snapshot();
    let now = Instant::now();
    let names: Vec<String> = (0..shards).map(|i| format!("g.{i}")).collect();
    let timed = Instant::now();
    let mut live = 0;
    for name in &names {
        live += usize::from(snapshot.live_holder(name, now).is_some());
    }
    let lookup_ns = timed.elapsed().as_nanos() as f64 / shards as f64;
    assert_eq!(live, shards, "every shard has a live holder");
    let scans = 20;
    let timed = Instant::now();
    for _ in 0..scans {
        let live = snapshot
            .records()
            .keys()
            .filter(|name| snapshot.live_holder(name, now).is_some())
            .count();
        std::hint::black_box(live);
    }
    let scan_ms = ms(timed.elapsed()) / scans as f64;
    let timed = Instant::now();
    for _ in 0..scans {
        std::hint::black_box(GroupSnapshot::clone(&snapshot));
    }
    let copy_ms = ms(timed.elapsed()) / scans as f64;
    let live = snapshot
        .records()
        .keys()
        .filter(|name| snapshot.live_holder(name, now).is_some())
        .count();

    let figures = Figures {
        objects,
        list,
        list_requests,
        rss_per_object: rss_after.saturating_sub(rss_before) as f64 / objects as f64,
        heap_per_object: (heap_after - heap_before) as f64 / objects as f64,
        rss_mib: (rss_before >> 20, rss_after >> 20),
        delivery: summarize(&delivery),
        delivery_held: summarize(&delivery_held),
        write: summarize(&write),
        lookup_ns,
        scan_ms,
        copy_ms,
        live,
    };
    (figures, watch)
}

fn print(backend: &str, f: &Figures) {
    println!("backend:                  {backend}");
    println!(
        "objects in the group:     {} ({} shards, {} members)",
        f.objects,
        f.objects - MEMBERS - 1,
        MEMBERS + 1
    );
    match f.list_requests {
        Some(n) => println!(
            "listing to synced:        {:.0} ms, {n} list requests",
            ms(f.list)
        ),
        None => println!("listing to synced:        {:.0} ms", ms(f.list)),
    }
    println!(
        "memory per object:        {:.0} bytes resident (RSS {} MiB -> {} MiB), {:.0} bytes of heap in use",
        f.rss_per_object, f.rss_mib.0, f.rss_mib.1, f.heap_per_object
    );
    println!("change delivered:         {}", f.delivery);
    println!("  reader holding one:     {}", f.delivery_held);
    println!("  the write itself:       {}", f.write);
    println!(
        "live_holder of a shard:   {:.0} ns; full scan: {:.2} ms ({} live); copy of the snapshot: {:.2} ms",
        f.lookup_ns, f.scan_ms, f.live, f.copy_ms
    );
    println!("load average:             {}", common::load_average());
}

fn record(report: &mut Report, backend: &str, f: &Figures) {
    report.record(
        "group_watch",
        backend,
        Some(&format!("{}x{}", f.objects - MEMBERS - 1, MEMBERS)),
        serde_json::json!({
            "reference": "one session's group watch of every record, from watch_group to synced; \
                          a change from the write's start to changed() showing it",
            "stats": {
                "delivery": f.delivery.json(),
                "delivery_reader_holding": f.delivery_held.json(),
                "write": f.write.json(),
            },
            "values": {
                "objects": f.objects,
                "shards": f.objects - MEMBERS - 1,
                "members": MEMBERS + 1,
                "list_ms": ms(f.list),
                "list_requests": f.list_requests,
                "rss_per_object_bytes": f.rss_per_object,
                "heap_per_object_bytes": f.heap_per_object,
                "rss_mib_before": f.rss_mib.0,
                "rss_mib_after": f.rss_mib.1,
                "live_holder_ns": f.lookup_ns,
                "scan_ms": f.scan_ms,
                "copy_ms": f.copy_ms,
            },
        }),
        &[
            Check::at_most(
                "group-watch-delivery",
                f.delivery.median,
                DELIVERY_TARGET_MS,
                "ms from a write to the group watch showing it (median)",
            ),
            Check::at_most(
                "group-watch-memory",
                f.rss_per_object,
                BYTES_PER_OBJECT_TARGET,
                "bytes resident per object of the group",
            ),
        ],
    );
}

mod kubernetes {
    use std::collections::BTreeMap;

    use actix_coordination::{
        FencingToken, KubernetesSession, KubernetesSettings, KUBERNETES_BOUND_DURATION_SECS,
        KUBERNETES_BOUND_INCARNATION_ANNOTATION, KUBERNETES_BOUND_TO_ANNOTATION,
        KUBERNETES_LEASE_NAME_ANNOTATION,
    };
    use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
    use kube::Api;

    use super::*;

    fn settings(namespace: &str) -> KubernetesSettings {
        KubernetesSettings::new(namespace)
            .with_api_url(cluster_var("ACTIX_COORD_TEST_K8S_URL"))
            .with_ca_file(cluster_var("ACTIX_COORD_TEST_K8S_CA"))
            .with_token(cluster_var("ACTIX_COORD_TEST_K8S_ADMIN_TOKEN"))
    }

    fn object(name: &str, holder: &str, bound: Option<(&str, &str)>) -> LeaseObject {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let mut annotations =
            BTreeMap::from([(KUBERNETES_LEASE_NAME_ANNOTATION.to_owned(), name.to_owned())]);
        if let Some((member, incarnation)) = bound {
            annotations.insert(KUBERNETES_BOUND_TO_ANNOTATION.to_owned(), member.to_owned());
            annotations.insert(
                KUBERNETES_BOUND_INCARNATION_ANNOTATION.to_owned(),
                incarnation.to_owned(),
            );
        }
        LeaseObject {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                annotations: Some(annotations),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "actix-coordination".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_duration_seconds: Some(if bound.is_some() {
                    KUBERNETES_BOUND_DURATION_SECS
                } else {
                    3600
                }),
                lease_transitions: Some(1),
                ..LeaseSpec::default()
            }),
        }
    }

    struct Kube {
        leases: Api<LeaseObject>,
    }

    impl Store for Kube {
        async fn change(&self, shard: usize, round: usize) -> Duration {
            let sent = Instant::now();
            let patch = serde_json::json!({"spec": {"leaseTransitions": 1000 + round}});
            self.leases
                .patch(
                    &format!("g.{shard}"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .expect("patch a shard");
            sent.elapsed()
        }

        fn shows(&self, snapshot: &GroupSnapshot, shard: usize, round: usize) -> bool {
            snapshot.get(&format!("g.{shard}")).and_then(|r| r.token)
                == Some(FencingToken::new(1000 + round as u64))
        }
    }

    pub(super) async fn run(report: &mut Report) {
        let shards = shards();
        let namespace = format!("gw-bench-{}", unique());
        let admin = KubernetesSession::new(settings(&namespace)).expect("admin session");
        let client = admin.client();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .expect("create the namespace");
        let leases: Api<LeaseObject> = Api::namespaced(client, &namespace);

        let setup = Instant::now();
        let members: Vec<(String, String)> = stream::iter(0..=MEMBERS)
            .map(|j| {
                let leases = leases.clone();
                async move {
                    let name = format!("g.member.node-{j}");
                    let created = leases
                        .create(
                            &PostParams::default(),
                            &object(&name, &format!("node-{j}"), None),
                        )
                        .await
                        .expect("create a member");
                    let uid = created.metadata.uid.expect("a uid");
                    (name, format!("{uid}/1"))
                }
            })
            .buffered(32)
            .collect()
            .await;
        let created = stream::iter(0..shards)
            .map(|i| {
                let leases = leases.clone();
                let (member, incarnation) = &members[member_of(i)];
                let object = object(
                    &format!("g.{i}"),
                    &format!("node-{}", member_of(i)),
                    Some((member, incarnation)),
                );
                async move {
                    leases
                        .create(&PostParams::default(), &object)
                        .await
                        .expect("create a shard");
                }
            })
            .buffer_unordered(64)
            .count()
            .await;
        println!(
            "setup: {} objects created in {:.1} s (namespace {namespace})",
            created + members.len(),
            setup.elapsed().as_secs_f64()
        );

        let session = KubernetesSession::new(settings(&namespace)).expect("session");
        // Opens the session's connection before the baseline.
        Api::<LeaseObject>::namespaced(session.client(), &namespace)
            .get_opt("g.member.node-0")
            .await
            .expect("a first request");
        let lease = session.lease(
            LeaseSettings::builder("g.member.bench", "bench")
                .build()
                .expect("settings"),
        );
        let store = Kube {
            leases: leases.clone(),
        };
        let (figures, watch) = measure(
            &store,
            shards + MEMBERS + 1,
            shards,
            || lease.watch_group("g.").expect("a group watch"),
            || Some(session.stats().watch.list_requests),
        )
        .await;
        drop(watch);
        print("kubernetes", &figures);
        record(report, "kubernetes", &figures);

        leases
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .expect("delete the group");
    }
}

mod etcd {
    use actix_coordination::{EtcdSession, EtcdSettings};
    use etcd_client::{Client, DeleteOptions, PutOptions, Txn, TxnOp};

    use super::*;

    struct Etcd {
        client: Client,
        prefix: String,
        lease: i64,
    }

    impl Store for Etcd {
        async fn change(&self, shard: usize, round: usize) -> Duration {
            let sent = Instant::now();
            self.client
                .kv_client()
                .put(
                    format!("{}g.{shard}", self.prefix),
                    format!("node-{}", 1000 + round),
                    Some(PutOptions::new().with_lease(self.lease)),
                )
                .await
                .expect("put a shard");
            sent.elapsed()
        }

        fn shows(&self, snapshot: &GroupSnapshot, shard: usize, round: usize) -> bool {
            snapshot
                .get(&format!("g.{shard}"))
                .and_then(|r| r.holder.as_deref())
                == Some(format!("node-{}", 1000 + round).as_str())
        }
    }

    pub(super) async fn run(report: &mut Report) {
        let shards = shards();
        let endpoint = cluster_var("ACTIX_COORD_TEST_ETCD_ENDPOINT");
        let prefix = format!("/actix-coordination-bench/group-watch/{}/", unique());
        let client = Client::connect([endpoint.as_str()], None)
            .await
            .expect("connect to etcd");
        let lease = client
            .lease_client()
            .grant(3600, None)
            .await
            .expect("an etcd lease")
            .id();
        let setup = Instant::now();
        let keys: Vec<(String, String)> = (0..=MEMBERS)
            .map(|j| (format!("g.member.node-{j}"), format!("node-{j}")))
            .chain((0..shards).map(|i| (format!("g.{i}"), format!("node-{}", member_of(i)))))
            .collect();
        let written = stream::iter(keys.chunks(100))
            .map(|chunk| {
                let mut kv = client.kv_client();
                let ops: Vec<TxnOp> = chunk
                    .iter()
                    .map(|(name, holder)| {
                        TxnOp::put(
                            format!("{prefix}{name}"),
                            holder.as_str(),
                            Some(PutOptions::new().with_lease(lease)),
                        )
                    })
                    .collect();
                async move {
                    kv.txn(Txn::new().and_then(ops)).await.expect("put keys");
                    chunk.len()
                }
            })
            .buffer_unordered(8)
            .fold(0, |a, n| async move { a + n })
            .await;
        println!(
            "setup: {written} keys written in {:.1} s (prefix {prefix})",
            setup.elapsed().as_secs_f64()
        );

        let session = EtcdSession::new(
            EtcdSettings::builder([endpoint.as_str()])
                .prefix(prefix.clone())
                .build()
                .expect("etcd settings"),
        );
        let lease_of_session = session.lease(
            LeaseSettings::builder("g.member.bench", "bench")
                .build()
                .expect("settings"),
        );
        // Connects the session and opens its watch stream before the baseline.
        let mut warm = lease_of_session
            .watch_group("warm-up.")
            .expect("a group watch");
        until(&mut warm, "the warm-up watch", GroupSnapshot::is_synced).await;
        let store = Etcd {
            client: client.clone(),
            prefix: prefix.clone(),
            lease,
        };
        let (figures, watch) = measure(
            &store,
            shards + MEMBERS + 1,
            shards,
            || lease_of_session.watch_group("g.").expect("a group watch"),
            || None,
        )
        .await;
        drop(watch);
        drop(warm);
        print("etcd", &figures);
        record(report, "etcd", &figures);

        client
            .kv_client()
            .delete(prefix.as_str(), Some(DeleteOptions::new().with_prefix()))
            .await
            .expect("delete the group");
        let _ = client.lease_client().revoke(lease).await;
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let backends: Vec<&str> = if args.is_empty() {
        vec!["kubernetes", "etcd"]
    } else {
        args.iter().map(String::as_str).collect()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut report = Report::new("group_watch");
    for backend in backends {
        match backend {
            "kubernetes" => runtime.block_on(kubernetes::run(&mut report)),
            "etcd" => runtime.block_on(etcd::run(&mut report)),
            other => panic!("unknown backend {other:?} (kubernetes, etcd)"),
        }
    }
    drop(runtime);
    report.finish();
}
