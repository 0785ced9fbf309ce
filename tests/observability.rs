//! What an operator sees: every metric of [`METRICS`] with a recording exporter, through a
//! renewal, a loss and a handoff (in memory, on the real etcd and on the real kube-apiserver),
//! the singleton manager's and the coordinator gate's counters, the README's metrics table, and
//! the rule that `info` logs tell every change of leadership and nothing else.
//!
//! The metrics recorder is global to this test binary: the tests take turns (`serial()`), and
//! every value is read as the change since the test's own start (a [`Reading`]).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    ClusterSingletonManager, CoordinatorGate, EtcdSession, GateError, GetStatus, InMemoryFault,
    InMemoryStore, KubernetesLease, Lease, LeaseSettings, MetricKind, SetEligible, SingletonInfo,
    SingletonSettings, SingletonState, Submission, METRICS,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::{sleep, Instant};

use common::actors::{wait_for_state, wait_until};
use common::logs::CapturedLogs;

/// One metric series: its name and labels (sorted).
type Series = (String, BTreeMap<String, String>);

#[derive(Default)]
struct Totals {
    /// Counters and gauges: the sum of every change (the debugging recorder hands out changes).
    values: BTreeMap<Series, f64>,
    histograms: BTreeMap<Series, Vec<f64>>,
}

/// The process's recorder, installed once, and everything it recorded so far.
fn recorded() -> &'static (Snapshotter, Mutex<Totals>) {
    static RECORDER: OnceLock<(Snapshotter, Mutex<Totals>)> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        (snapshotter, Mutex::new(Totals::default()))
    })
}

/// The tests of this binary take turns: the backend metrics have no per-test label.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    recorded();
    SERIAL.lock().await
}

fn totals() -> std::sync::MutexGuard<'static, Totals> {
    let (snapshotter, totals) = recorded();
    let mut totals = totals.lock().unwrap_or_else(|p| p.into_inner());
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        let series = (key.name().to_owned(), labels);
        match value {
            DebugValue::Counter(n) => *totals.values.entry(series).or_default() += n as f64,
            DebugValue::Gauge(g) => *totals.values.entry(series).or_default() += g.into_inner(),
            DebugValue::Histogram(values) => totals
                .histograms
                .entry(series)
                .or_default()
                .extend(values.into_iter().map(|v| v.into_inner())),
        }
    }
    totals
}

/// The metrics as they stood when the reading was taken; `value`/`observations` give the change
/// since.
struct Reading {
    values: BTreeMap<Series, f64>,
    histograms: BTreeMap<Series, usize>,
}

impl Reading {
    fn now() -> Self {
        let totals = totals();
        Self {
            values: totals.values.clone(),
            histograms: totals
                .histograms
                .iter()
                .map(|(k, v)| (k.clone(), v.len()))
                .collect(),
        }
    }

    /// The change of a counter or gauge since the reading.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let series = series(name, labels);
        let now = totals().values.get(&series).copied().unwrap_or(0.0);
        now - self.values.get(&series).copied().unwrap_or(0.0)
    }

    /// The observations of a histogram since the reading.
    fn observations(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let series = series(name, labels);
        let skip = self.histograms.get(&series).copied().unwrap_or(0);
        totals()
            .histograms
            .get(&series)
            .map(|v| v[skip..].to_vec())
            .unwrap_or_default()
    }
}

fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    (
        name.to_owned(),
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

/// The metrics the tests below assert, by test: together they must be every metric.
const ASSERTED: &[&str] = &[
    // lease_metrics_follow_a_renewal_a_loss_and_a_handoff
    "actix_coordination_lease_held",
    "actix_coordination_acquire_attempts_total",
    "actix_coordination_renewals_total",
    "actix_coordination_renewal_duration_seconds",
    "actix_coordination_renewal_margin_seconds",
    "actix_coordination_lease_losses_total",
    "actix_coordination_releases_total",
    "actix_coordination_backend_requests_total",
    "actix_coordination_cas_conflicts_total",
    // singleton_metrics_count_starts_restarts_and_stops
    "actix_coordination_singleton_starts_total",
    "actix_coordination_singleton_stops_total",
    "actix_coordination_singleton_restarts_total",
    // coordinator_gate_metrics_count_admissions_and_refusals
    "actix_coordination_coordinator_admitted_total",
    "actix_coordination_coordinator_refused_total",
    // sharded_metrics_count_holdings_moves_and_handovers
    "actix_coordination_shards_held",
    "actix_coordination_shard_moves_total",
    "actix_coordination_shard_handover_seconds",
];

/// The cells of every table row (`| a | b | ... |`) of the README's "Running in production".
fn production_table_rows() -> Vec<Vec<String>> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("\n## Running in production")
        .nth(1)
        .expect("a \"Running in production\" section")
        .split("\n## ")
        .next()
        .unwrap();
    section
        .lines()
        .map(|line| {
            line.trim()
                .trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect()
}

#[test]
fn every_metric_is_asserted_and_documented_in_the_readme() {
    let listed: BTreeSet<&str> = METRICS.iter().map(|m| m.name).collect();
    let asserted: BTreeSet<&str> = ASSERTED.iter().copied().collect();
    assert_eq!(listed, asserted, "every metric has a test below");

    // The README's table: `| name | kind | labels | meaning |` rows in "Running in production".
    let mut rows = BTreeMap::new();
    for cells in production_table_rows() {
        let cells: Vec<&str> = cells.iter().map(String::as_str).collect();
        if let [name, kind, labels, _meaning] = cells[..] {
            if let Some(name) = name.strip_prefix("`actix_coordination_") {
                rows.insert(
                    format!("actix_coordination_{}", name.trim_end_matches('`')),
                    (kind.to_owned(), labels.to_owned()),
                );
            }
        }
    }
    let documented: BTreeSet<&str> = rows.keys().map(String::as_str).collect();
    assert_eq!(
        documented, listed,
        "the README lists exactly the metrics emitted"
    );
    for metric in METRICS {
        let (kind, labels) = &rows[metric.name];
        let expected_kind = match metric.kind {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        };
        assert_eq!(kind, expected_kind, "{}", metric.name);
        let documented_labels: Vec<&str> = labels
            .split(',')
            .map(|l| l.trim().trim_matches('`'))
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(documented_labels, metric.labels, "{}", metric.name);
    }
}

/// The README's recommended buckets (`| histogram | buckets | why |` rows in "Running in
/// production") are those `MetricDescription::buckets` gives, for every histogram.
#[test]
fn the_readme_recommends_the_buckets_the_crate_gives() {
    let mut rows = BTreeMap::new();
    for cells in production_table_rows() {
        let cells: Vec<&str> = cells.iter().map(String::as_str).collect();
        if let [name, buckets, _why] = cells[..] {
            if let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) {
                let buckets: Vec<f64> = buckets
                    .split(',')
                    .map(|b| {
                        b.trim()
                            .parse()
                            .unwrap_or_else(|e| panic!("{name}: {b}: {e}"))
                    })
                    .collect();
                rows.insert(name.to_owned(), buckets);
            }
        }
    }
    let histograms: BTreeMap<String, Vec<f64>> = METRICS
        .iter()
        .filter(|m| m.kind == MetricKind::Histogram)
        .map(|m| (m.name.to_owned(), m.buckets().expect("buckets").to_vec()))
        .collect();
    assert!(!histograms.is_empty());
    assert_eq!(rows, histograms, "the README's buckets");
}

fn in_memory_settings(name: &str, owner: &str) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(Duration::from_secs(3))
        .renewal_interval(Duration::from_secs(1))
        .acquire_retries(0)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn lease_metrics_follow_a_renewal_a_loss_and_a_handoff() {
    let _turn = serial().await;
    let before = Reading::now();
    let name = "metrics-lifecycle";
    let lease = [("lease", name)];
    let outcome = |o: &'static str| [("lease", name), ("outcome", o)];
    let request = |verb: &'static str, o: &'static str| {
        [("backend", "in-memory"), ("verb", verb), ("outcome", o)]
    };
    let store = InMemoryStore::new();
    let a = store.lease(in_memory_settings(name, "a"));
    let b = store.lease(in_memory_settings(name, "b"));

    // a acquires; b finds it held.
    assert!(a.acquire().await.unwrap());
    assert_eq!(before.value("actix_coordination_lease_held", &lease), 1.0);
    assert!(!b.acquire().await.unwrap());
    let acquired = before.value(
        "actix_coordination_acquire_attempts_total",
        &outcome("acquired"),
    );
    assert_eq!(acquired, 1.0);
    assert_eq!(
        before.value(
            "actix_coordination_acquire_attempts_total",
            &outcome("held_by_other")
        ),
        1.0
    );

    // Two renewals, each 1 s after the last: 2 s of the 3 s TTL left at each.
    sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        before.value("actix_coordination_renewals_total", &outcome("renewed")),
        2.0
    );
    assert_eq!(
        before
            .observations("actix_coordination_renewal_duration_seconds", &lease)
            .len(),
        2
    );
    // The local deadline is the TTL less the clock drift margin after the claim was sent.
    let settings = a.settings();
    let margin = settings.ttl() - settings.clock_drift_margin() - settings.renewal_interval();
    let margins = before.observations("actix_coordination_renewal_margin_seconds", &lease);
    assert_eq!(
        margins,
        vec![margin.as_secs_f64(); 2],
        "the paused clock makes them exact"
    );

    // A partition: renewals fail until the deadline, then the tenure is lost (expired).
    store.set_owner_fault("a", Some(InMemoryFault::Unavailable));
    sleep(Duration::from_secs(3)).await;
    assert!(!a.check_alive());
    assert!(before.value("actix_coordination_renewals_total", &outcome("error")) >= 1.0);
    assert_eq!(
        before.value(
            "actix_coordination_lease_losses_total",
            &[("lease", name), ("reason", "expired")]
        ),
        1.0
    );
    assert_eq!(before.value("actix_coordination_lease_held", &lease), 0.0);

    // b takes over, then hands over gracefully to a.
    store.set_owner_fault("a", None);
    assert!(b.acquire().await.unwrap());
    assert_eq!(before.value("actix_coordination_lease_held", &lease), 1.0);
    assert!(b.release().await.unwrap());
    assert_eq!(
        before.value("actix_coordination_releases_total", &outcome("released")),
        1.0
    );
    assert_eq!(before.value("actix_coordination_lease_held", &lease), 0.0);
    assert!(a.acquire().await.unwrap());

    // Someone else takes the record behind a's back: the backend's watch reports the loss.
    store.force_take(name, "c", Duration::from_secs(30));
    sleep(Duration::from_millis(10)).await;
    assert!(!a.check_alive());
    assert_eq!(
        before.value(
            "actix_coordination_lease_losses_total",
            &[("lease", name), ("reason", "taken_over")]
        ),
        1.0
    );
    assert_eq!(a.observed_holder().as_deref(), Some("c"));
    assert_eq!(before.value("actix_coordination_lease_held", &lease), 0.0);
    assert_eq!(
        before.value(
            "actix_coordination_acquire_attempts_total",
            &outcome("acquired")
        ),
        3.0
    );

    // What the backend was asked: 3 claims that won, 1 that found the lease held (a CAS
    // conflict), 2 + 1 renewals that answered, the partitioned ones that failed, 1 release.
    assert_eq!(
        before.value(
            "actix_coordination_backend_requests_total",
            &request("acquire", "ok")
        ),
        3.0
    );
    assert_eq!(
        before.value(
            "actix_coordination_backend_requests_total",
            &request("acquire", "conflict")
        ),
        1.0
    );
    assert_eq!(
        before.value(
            "actix_coordination_cas_conflicts_total",
            &[("backend", "in-memory"), ("verb", "acquire")]
        ),
        1.0
    );
    assert!(
        before.value(
            "actix_coordination_backend_requests_total",
            &request("renew", "ok")
        ) >= 2.0
    );
    assert_eq!(
        before.value(
            "actix_coordination_backend_requests_total",
            &request("renew", "error")
        ),
        before.value("actix_coordination_renewals_total", &outcome("error"))
    );
    assert_eq!(
        before.value(
            "actix_coordination_backend_requests_total",
            &request("release", "ok")
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_requests_are_counted_by_verb_on_the_real_etcd_and_kube_apiserver() {
    let _turn = serial().await;
    let before = Reading::now();
    let request = |backend: &'static str, verb: &'static str, o: &'static str| {
        [("backend", backend), ("verb", verb), ("outcome", o)]
    };
    // A 2.5 s call bound: a first claim opens its session's connection (TLS included), which took
    // more than the default (the renewal interval, 500 ms) in a fresh-clone CI run under load; a
    // claim that timed out has an unknown outcome and would end the test.
    let settings = |name: &str, owner: &str| {
        LeaseSettings::builder(name, owner)
            .ttl(Duration::from_secs(6))
            .renewal_interval(Duration::from_millis(500))
            .operation_timeout(Duration::from_millis(2500))
            .acquire_retries(0)
            .build()
            .unwrap()
    };

    // etcd: a claim, keep-alives, a contender's refused claim (a CAS conflict), a release.
    let endpoint = common::etcd::endpoint();
    let prefix = common::etcd::unique_prefix("observability");
    let session = EtcdSession::connect(common::etcd::etcd_settings(&endpoint, &prefix))
        .await
        .unwrap();
    let a = session.lease(settings("requests", "a"));
    let b = session.lease(settings("requests", "b"));
    assert!(a.acquire().await.unwrap());
    assert!(!b.acquire().await.unwrap());
    let renewed = a.stats().renewals;
    wait_until_async(Duration::from_secs(10), || {
        a.stats().renewals >= renewed + 2
    })
    .await;
    assert!(a.release().await.unwrap());
    let etcd = |verb, o| {
        before.value(
            "actix_coordination_backend_requests_total",
            &request("etcd", verb, o),
        )
    };
    assert!(
        etcd("txn", "ok") >= 2.0,
        "a's claim and release: {}",
        etcd("txn", "ok")
    );
    assert!(etcd("txn", "conflict") >= 1.0, "b's refused claim");
    assert_eq!(
        before.value(
            "actix_coordination_cas_conflicts_total",
            &[("backend", "etcd"), ("verb", "txn")]
        ),
        etcd("txn", "conflict")
    );
    assert!(etcd("lease_grant", "ok") >= 1.0);
    assert!(etcd("lease_keep_alive", "ok") >= 1.0);
    assert!(etcd("range", "ok") >= 1.0, "renewals read the key");

    // Kubernetes: create, then updates (renewals, the release), and the namespace watch.
    let k8s = |verb, o| {
        before.value(
            "actix_coordination_backend_requests_total",
            &request("kubernetes", verb, o),
        )
    };
    let name = common::k8s::unique("observability");
    let lease = KubernetesLease::new(
        settings(&name, "a"),
        common::k8s::settings_at(&common::k8s::env().url),
    )
    .unwrap();
    assert!(lease.acquire().await.unwrap());
    let renewed = lease.stats().renewals;
    wait_until_async(Duration::from_secs(10), || {
        lease.stats().renewals >= renewed + 2
    })
    .await;
    assert!(lease.release().await.unwrap());
    assert_eq!(k8s("create", "ok"), 1.0, "the object is created once");
    assert!(
        k8s("update", "ok") >= 3.0,
        "two renewals and the release: {}",
        k8s("update", "ok")
    );
    assert!(
        k8s("watch", "ok") + k8s("list", "ok") >= 1.0,
        "the namespace watch"
    );
    assert_eq!(k8s("update", "error"), 0.0);
}

async fn wait_until_async(within: Duration, condition: impl Fn() -> bool) {
    let give_up = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < give_up, "not within {within:?}");
        sleep(Duration::from_millis(10)).await;
    }
}

/// A singleton that stops itself on its first `tick` message, or (with `linger`) refuses to stop.
struct Job {
    linger: bool,
}

impl Actor for Job {
    type Context = Context<Self>;

    fn stopping(&mut self, _: &mut Self::Context) -> Running {
        if self.linger {
            Running::Continue
        } else {
            Running::Stop
        }
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Quit;

impl Handler<Quit> for Job {
    type Result = ();
    fn handle(&mut self, _: Quit, ctx: &mut Self::Context) {
        self.linger = false;
        ctx.stop();
    }
}

#[actix_rt::test]
async fn singleton_metrics_count_starts_restarts_and_stops() {
    let _turn = serial().await;
    let before = Reading::now();
    let name = "metrics-singleton";
    let lease_label = [("lease", name)];
    let store = InMemoryStore::new();
    let lease = Arc::new(store.lease(in_memory_settings(name, "a")));
    let linger = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let manager = ClusterSingletonManager::from_arc(Arc::clone(&lease), {
        let linger = Arc::clone(&linger);
        move |_: &SingletonInfo, _| Job {
            linger: linger.load(std::sync::atomic::Ordering::SeqCst),
        }
    })
    .settings(SingletonSettings {
        stop_timeout: Duration::from_millis(200),
        ..Default::default()
    })
    .start();
    wait_for_state(&manager, SingletonState::Running, Duration::from_secs(5)).await;
    assert_eq!(
        before.value("actix_coordination_singleton_starts_total", &lease_label),
        1.0
    );

    // It stops on its own: restarted under the same tenure.
    let singleton = manager
        .send(actix_coordination::GetSingleton::<Job>::new())
        .await
        .unwrap()
        .unwrap();
    linger.store(true, std::sync::atomic::Ordering::SeqCst);
    singleton.do_send(Quit);
    wait_until(Duration::from_secs(5), || {
        before.value("actix_coordination_singleton_restarts_total", &lease_label) == 1.0
    })
    .await;
    assert_eq!(
        before.value("actix_coordination_singleton_starts_total", &lease_label),
        2.0
    );
    assert_eq!(
        before.value(
            "actix_coordination_singleton_stops_total",
            &[("lease", name), ("reason", "stopped")]
        ),
        1.0
    );

    // The restarted one lingers when told to stop: terminated after the stop timeout.
    manager.send(SetEligible(false)).await.unwrap();
    wait_for_state(&manager, SingletonState::Idle, Duration::from_secs(5)).await;
    assert_eq!(
        before.value(
            "actix_coordination_singleton_stops_total",
            &[("lease", name), ("reason", "stop_timeout")]
        ),
        1.0
    );
    assert_eq!(manager.send(GetStatus).await.unwrap().unstopped, 1);
    assert_eq!(
        before.value("actix_coordination_lease_held", &lease_label),
        0.0,
        "released"
    );
}

/// Every counter and gauge of a lease, a singleton manager and a coordinator gate exists, at
/// zero, from the moment they are built: an alert on a missing `lease_held` or a `rate()` over
/// the first loss needs the series before anything happened.
#[tokio::test(start_paused = true)]
async fn every_series_exists_at_zero_from_registration() {
    let _turn = serial().await;
    let store = InMemoryStore::new();
    let name = "metrics-registered";
    let lease = Arc::new(store.lease(in_memory_settings(name, "a")));
    let _manager = ClusterSingletonManager::from_arc(
        Arc::clone(&lease),
        |_: &SingletonInfo, _: &mut Context<Job>| Job { linger: false },
    );
    let _gate: CoordinatorGate<_, u32, u32> = CoordinatorGate::new(Arc::clone(&lease));
    let totals = totals();
    let mut expected = vec![series("actix_coordination_lease_held", &[("lease", name)])];
    let labelled = |metric: &str, label: &str, values: &[&str]| {
        values
            .iter()
            .map(|v| series(metric, &[("lease", name), (label, v)]))
            .collect::<Vec<_>>()
    };
    expected.extend(labelled(
        "actix_coordination_acquire_attempts_total",
        "outcome",
        &["acquired", "held_by_other", "timeout", "error"],
    ));
    expected.extend(labelled(
        "actix_coordination_renewals_total",
        "outcome",
        &["renewed", "lost", "error", "timeout"],
    ));
    expected.extend(labelled(
        "actix_coordination_lease_losses_total",
        "reason",
        &[
            "expired",
            "taken_over",
            "deleted",
            "inconsistent",
            "renewal_stopped",
        ],
    ));
    expected.extend(labelled(
        "actix_coordination_releases_total",
        "outcome",
        &["released", "held_by_other", "error"],
    ));
    expected.push(series(
        "actix_coordination_singleton_starts_total",
        &[("lease", name)],
    ));
    expected.push(series(
        "actix_coordination_singleton_restarts_total",
        &[("lease", name)],
    ));
    expected.extend(labelled(
        "actix_coordination_singleton_stops_total",
        "reason",
        &["stopped", "stop_timeout"],
    ));
    expected.push(series(
        "actix_coordination_coordinator_admitted_total",
        &[("lease", name)],
    ));
    expected.extend(labelled(
        "actix_coordination_coordinator_refused_total",
        "reason",
        &[
            "not_held",
            "tenure_ended",
            "stopped",
            "no_regions",
            "queue_full",
            "queue_timeout",
        ],
    ));
    for series in &expected {
        assert_eq!(
            totals.values.get(series),
            Some(&0.0),
            "{series:?} exists at zero from registration"
        );
    }
}

/// Every request counter of a backend exists, at zero, from the moment the backend is built,
/// before its first request: a `rate()` over `cas_conflicts_total` sees the first conflict. A
/// recorder of this test's own (the process's one has seen requests of other tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_request_counters_exist_at_zero_from_when_a_backend_is_built() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _leases = metrics::with_local_recorder(&recorder, || {
        let settings = || in_memory_settings("backend-registered", "a");
        let store = InMemoryStore::new();
        let memory = store.lease(settings());
        // Neither connects when built; nothing is sent below.
        let etcd = EtcdSession::new(
            actix_coordination::EtcdSettings::builder(["http://127.0.0.1:1"])
                .build()
                .unwrap(),
        )
        .lease(settings());
        let kubernetes =
            KubernetesLease::new(settings(), common::k8s::settings_at("https://127.0.0.1:1"))
                .unwrap();
        (memory, etcd, kubernetes)
    });
    let recorded: BTreeMap<Series, u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            match value {
                DebugValue::Counter(n) => Some(((key.name().to_owned(), labels), n)),
                _ => None,
            }
        })
        .collect();
    let requests = |backend: &str, verbs: &[(&str, &[&str])]| {
        verbs
            .iter()
            .flat_map(|(verb, outcomes)| {
                outcomes.iter().map(move |outcome| {
                    series(
                        "actix_coordination_backend_requests_total",
                        &[("backend", backend), ("verb", verb), ("outcome", outcome)],
                    )
                })
            })
            .collect::<Vec<_>>()
    };
    let conflicts = |backend: &str, verbs: &[&str]| {
        verbs
            .iter()
            .map(|verb| {
                series(
                    "actix_coordination_cas_conflicts_total",
                    &[("backend", backend), ("verb", verb)],
                )
            })
            .collect::<Vec<_>>()
    };
    let reads: &[&str] = &["ok", "not_found", "error"];
    let writes: &[&str] = &["ok", "conflict", "not_found", "error"];
    let in_memory: &[&str] = &["ok", "conflict", "error"];
    let expected = [
        requests(
            "in-memory",
            &[
                ("acquire", in_memory),
                ("renew", in_memory),
                ("release", in_memory),
            ],
        ),
        conflicts("in-memory", &["acquire", "renew", "release"]),
        requests(
            "etcd",
            &[
                ("range", &["ok", "error"]),
                ("txn", &["ok", "conflict", "error"]),
                ("lease_grant", &["ok", "error"]),
                ("lease_keep_alive", &["ok", "not_found", "error"]),
            ],
        ),
        conflicts("etcd", &["txn"]),
        requests(
            "kubernetes",
            &[
                ("get", reads),
                ("list", reads),
                ("watch", reads),
                ("create", writes),
                ("update", writes),
                ("patch", writes),
            ],
        ),
        conflicts("kubernetes", &["create", "update", "patch"]),
    ]
    .concat();
    for series in &expected {
        assert_eq!(
            recorded.get(series),
            Some(&0),
            "{series:?} exists at zero once its backend is built: {recorded:?}"
        );
    }
    let backend_series = recorded
        .keys()
        .filter(|(name, _)| name.contains("backend_requests") || name.contains("cas_conflicts"))
        .count();
    assert_eq!(backend_series, expected.len(), "{recorded:?}");
}

#[tokio::test(start_paused = true)]
async fn coordinator_gate_metrics_count_admissions_and_refusals() {
    let _turn = serial().await;
    let before = Reading::now();
    let name = "metrics-gate";
    let refused = |reason: &'static str| [("lease", name), ("reason", reason)];
    let store = InMemoryStore::new();
    let lease = Arc::new(store.lease(in_memory_settings(name, "a")));
    let mut gate: CoordinatorGate<_, u32, u32> =
        CoordinatorGate::new(Arc::clone(&lease)).with_queue_bound(1, Duration::from_secs(1));

    // Acquiring: one request queues, the next is refused; the queued one times out.
    assert!(matches!(gate.submit(1), Submission::Queued(_)));
    assert!(matches!(
        gate.submit(2),
        Submission::Refused(GateError::QueueFull { .. })
    ));
    sleep(Duration::from_secs(1)).await;
    assert_eq!(gate.expire(), 1);
    assert_eq!(gate.admit(), Err(GateError::NotHeld));
    assert_eq!(
        before.value(
            "actix_coordination_coordinator_refused_total",
            &refused("queue_full")
        ),
        1.0
    );
    assert_eq!(
        before.value(
            "actix_coordination_coordinator_refused_total",
            &refused("queue_timeout")
        ),
        1.0
    );
    assert_eq!(
        before.value(
            "actix_coordination_coordinator_refused_total",
            &refused("not_held")
        ),
        1.0
    );

    // Open under a live tenure: each check before an allocation step is counted.
    assert!(lease.acquire().await.unwrap());
    gate.open(lease.tenure().guard().unwrap()).unwrap();
    assert!(matches!(gate.submit(3), Submission::Admitted(3, _)));
    assert!(gate.admit().is_ok());
    assert_eq!(
        before.value(
            "actix_coordination_coordinator_admitted_total",
            &[("lease", name)]
        ),
        2.0
    );

    // Closed: what waits and what comes is refused as stopped.
    gate.close(GateError::Stopped);
    assert!(matches!(
        gate.submit(4),
        Submission::Refused(GateError::Stopped)
    ));
    assert_eq!(
        before.value(
            "actix_coordination_coordinator_refused_total",
            &refused("stopped")
        ),
        1.0
    );
}

/// A member tenure's end is one event, logged once by the member lease: a leaving node that
/// retires its member (freeing the shards bound to it in that one write) logs no `lease lost` for
/// its bound shards, and a member lost (a partition past its deadline) warns once, for the
/// member, not once per bound shard (the example's leaving node with 64 shards warned 64 times).
#[actix_rt::test]
async fn bound_shards_end_with_their_member_and_warn_no_more_than_it() {
    let _turn = serial().await;
    let (logs, _capture) = CapturedLogs::install();
    let store = InMemoryStore::new();
    let node = |owner: &str| {
        let member = store.lease(in_memory_settings("logs-bound.member", owner));
        let anchor = member
            .binding_anchor()
            .expect("the in-memory backend binds");
        let shards: Vec<_> = (0..8)
            .map(|s| {
                let shard =
                    store.lease(in_memory_settings(&format!("logs-bound.shard.{s}"), owner));
                shard.bind_to(&anchor).expect("bound");
                shard
            })
            .collect();
        (member, shards)
    };
    let warnings = |owner: &str| {
        logs.text()
            .lines()
            .filter(|l| {
                l.contains(" WARN ")
                    && l.contains("lease lost")
                    && l.contains(&format!("owner={owner}"))
            })
            .count()
    };
    // A node that leaves: its member retired, its 8 bound shards end with it, no warning.
    let (member, shards) = node("a");
    assert!(member.acquire().await.unwrap());
    for shard in &shards {
        assert!(shard.acquire().await.unwrap());
    }
    assert!(member.retire().await.unwrap());
    assert!(
        shards.iter().all(|s| !s.check_alive()),
        "ended with the member"
    );
    assert_eq!(warnings("a"), 0, "{}", logs.text());
    // A node whose member is lost: one warning, the member's.
    let (member, shards) = node("b");
    assert!(member.acquire().await.unwrap());
    for shard in &shards {
        assert!(shard.acquire().await.unwrap());
    }
    store.set_owner_fault("b", Some(InMemoryFault::Unavailable));
    wait_until(Duration::from_secs(10), || !member.check_alive()).await;
    assert!(
        shards.iter().all(|s| !s.check_alive()),
        "lost with the member"
    );
    // The loss is logged by the member's renewal task once it sees the deadline pass (a moment
    // after `check_alive` turned false, by the clock), and the shards' ends in the same step.
    let ended_logged = || {
        logs.text()
            .lines()
            .filter(|l| {
                l.contains("bound tenure ended with its member tenure") && l.contains("owner=b")
            })
            .count()
            == shards.len()
    };
    wait_until(Duration::from_secs(10), || {
        warnings("b") >= 1 && ended_logged()
    })
    .await;
    assert_eq!(warnings("b"), 1, "{}", logs.text());
    assert!(
        logs.text()
            .lines()
            .any(|l| l.contains("bound tenure ended with its member tenure")
                && l.contains("owner=b")),
        "the shards' ends are logged at debug: {}",
        logs.text()
    );
}

/// The messages `info` may carry: changes of leadership only.
const LEADERSHIP: &[&str] = &[
    "lease acquired",
    "lease released",
    "singleton started",
    "singleton stopped",
    "coordinator holds its lease",
];

#[actix_rt::test]
async fn info_logs_tell_every_change_of_leadership_and_nothing_else() {
    let _turn = serial().await;
    let (logs, _capture) = CapturedLogs::install();
    let name = "logs-leadership";
    let store = InMemoryStore::new();
    let a = Arc::new(store.lease(in_memory_settings(name, "a")));
    let b = Arc::new(store.lease(in_memory_settings(name, "b")));
    // A singleton on a, a contender b; renewals, a partition of a (errors, then a loss), b takes
    // over, a is ineligible and eligible again, b shuts down gracefully, a takes over.
    let manager_a = ClusterSingletonManager::from_arc(Arc::clone(&a), |_: &SingletonInfo, _| Job {
        linger: false,
    })
    .start();
    wait_for_state(&manager_a, SingletonState::Running, Duration::from_secs(5)).await;
    let manager_b = ClusterSingletonManager::from_arc(Arc::clone(&b), |_: &SingletonInfo, _| Job {
        linger: false,
    })
    .start();
    let renewed = a.stats().renewals;
    wait_until(Duration::from_secs(5), || a.stats().renewals >= renewed + 2).await;
    store.set_owner_fault("a", Some(InMemoryFault::Unavailable));
    wait_for_state(&manager_b, SingletonState::Running, Duration::from_secs(10)).await;
    manager_a.send(SetEligible(false)).await.unwrap();
    store.set_owner_fault("a", None);
    manager_a.send(SetEligible(true)).await.unwrap();
    assert!(manager_b
        .send(actix_coordination::Shutdown)
        .await
        .unwrap()
        .unwrap());
    wait_for_state(&manager_a, SingletonState::Running, Duration::from_secs(10)).await;
    assert!(manager_a
        .send(actix_coordination::Shutdown)
        .await
        .unwrap()
        .unwrap());

    let text = logs.text();
    let info: Vec<&str> = text.lines().filter(|l| l.contains(" INFO ")).collect();
    for line in &info {
        assert!(
            LEADERSHIP.iter().any(|m| line.contains(m)),
            "an info line that is not a change of leadership: {line}"
        );
    }
    // Every change is there: a acquired twice (and started the singleton twice), b once; a lost
    // once (a warning), b and a released on shutdown.
    let count = |owner: &str, message: &str| {
        info.iter()
            .filter(|l| l.contains(message) && l.contains(&format!("owner={owner}")))
            .count()
    };
    assert_eq!(count("a", "lease acquired"), 2, "{text}");
    assert_eq!(count("b", "lease acquired"), 1, "{text}");
    assert_eq!(count("a", "singleton started"), 2, "{text}");
    assert_eq!(count("b", "lease released"), 1, "{text}");
    assert_eq!(count("a", "lease released"), 1, "{text}");
    let lost = text
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("lease lost") && l.contains("owner=a"))
        .count();
    assert_eq!(lost, 1, "{text}");
    // Each operation's span names the lease, the owner, the token and the outcome.
    assert!(
        text.lines().any(
            |l| l.contains("lease_operation{operation=\"lease_acquire\"")
                && l.contains("outcome=\"acquired\"")
        ),
        "{text}"
    );
    // One outcome per operation, its last: b's acquire waited behind a through attempts that
    // found the lease held, and its span says only `acquired`.
    assert!(
        text.lines()
            .any(|l| l.contains("lease acquired") && l.contains("owner=b")),
        "{text}"
    );
    for line in text.lines() {
        assert!(
            line.matches("outcome=").count() <= 1,
            "a span with two outcomes: {line}"
        );
    }
    // The tenure's renewals run in a span of their own, not inside the acquire's (which ends
    // with the acquire): a's renewals failed during the partition.
    let renewal_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("lease_renewal{"))
        .collect();
    assert!(
        renewal_lines.iter().any(|l| l.contains("owner=a")),
        "{text}"
    );
    for line in renewal_lines {
        assert!(
            !line.contains("lease_operation"),
            "a renewal inside an operation's span: {line}"
        );
    }
}

/// A worker of a sharded group (does nothing).
struct Part;

impl Actor for Part {
    type Context = Context<Self>;
}

/// `shards_held` follows what the group's nodes in this process hold, `shard_moves_total` counts
/// every shard a node stopped holding by reason, and `shard_handover_seconds` times each planned
/// handover; every series exists at zero from the start.
#[actix_rt::test]
async fn sharded_metrics_count_holdings_moves_and_handovers() {
    use actix_coordination::{ShardInfo, ShardedWorkers, Shutdown};
    let _turn = serial().await;
    let before = Reading::now();
    let group = "metrics-sharded";
    let label = [("group", group)];
    let moves = |reason: &'static str| [("group", group), ("reason", reason)];
    let store = InMemoryStore::new();
    let node = |owner: &'static str| {
        let store = store.clone();
        ShardedWorkers::with_count(
            group,
            4,
            move |name: &str| store.lease(in_memory_settings(name, owner)),
            |_: &ShardInfo, _: &mut Context<Part>| Part,
        )
        .unwrap()
        .start()
    };
    let a = node("a");
    // Registered at zero, before anything moved.
    {
        let totals = totals();
        for reason in ["rebalance", "shutdown", "lost"] {
            let moved = series("actix_coordination_shard_moves_total", &moves(reason));
            assert!(totals.values.contains_key(&moved), "{reason}");
        }
    }
    wait_until(Duration::from_secs(10), || {
        before.value("actix_coordination_shards_held", &label) == 4.0
    })
    .await;

    // b joins: a hands two shards over, timed from their start to b's claim.
    let b = node("b");
    wait_until(Duration::from_secs(10), || {
        before
            .observations("actix_coordination_shard_handover_seconds", &label)
            .len()
            == 2
    })
    .await;
    assert_eq!(
        before.value("actix_coordination_shard_moves_total", &moves("rebalance")),
        2.0
    );
    for took in before.observations("actix_coordination_shard_handover_seconds", &label) {
        assert!((0.0..3.0).contains(&took), "{took}");
    }
    wait_until(Duration::from_secs(10), || {
        before.value("actix_coordination_shards_held", &label) == 4.0
    })
    .await;

    // a shuts down: its two shards count as moved on shutdown, and b holds all four.
    assert!(a.send(Shutdown).await.unwrap().unwrap());
    assert_eq!(
        before.value("actix_coordination_shard_moves_total", &moves("shutdown")),
        2.0
    );
    wait_until(Duration::from_secs(10), || {
        before.value("actix_coordination_shards_held", &label) == 4.0
            && store.holder(&format!("{group}.0")).as_deref() == Some("b")
    })
    .await;
    assert_eq!(
        before.value("actix_coordination_shard_moves_total", &moves("lost")),
        0.0
    );
    assert!(b.send(Shutdown).await.unwrap().unwrap());
    assert_eq!(before.value("actix_coordination_shards_held", &label), 0.0);
}
