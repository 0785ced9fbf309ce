//! `examples/web_service.rs` as real processes, called over HTTP: the routes answer what the
//! README says (health, readiness, Prometheus metrics with bucketed histograms, leases, the job),
//! SIGTERM releases the lease before the HTTP server stops, and two instances on one lease, on the
//! real etcd and on the real kube-apiserver, have exactly one leader, which a SIGTERM moves to the
//! other faster than the TTL (a release, not an expiry), also when the release is slowed well
//! past the HTTP server's own shutdown (requests through a proxy that delays them); without the
//! helper (`--shutdown actix-web` or `both`) the same SIGTERM leaves the lease to expire. The
//! README's alert expressions read series that exist in the example's `/metrics`, with the types
//! they need, before any leader, while leading and after a loss.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{sleep, Instant};

/// The example's arguments for a group of 8 sharded partitions (`/shards`).
const SHARDED: &[&str] = &["--shards", "8"];

fn binary() -> PathBuf {
    common::example_binary("web_service")
}

/// A running service; killed if a test fails before stopping it.
struct Service {
    owner: String,
    port: u16,
    child: Child,
    log: PathBuf,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("web-service")
        .join(format!("{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Service {
    /// Starts the example as `owner` with `config` (a TOML file) on lease `lease`, and waits (up
    /// to 60 s) until `/healthz` answers.
    async fn start(
        dir: &Path,
        owner: &str,
        config: &Path,
        lease: &str,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_with(dir, owner, config, lease, env, &[]).await
    }

    /// [`Service::start`] with more arguments (for example [`SHARDED`]).
    async fn start_with(
        dir: &Path,
        owner: &str,
        config: &Path,
        lease: &str,
        env: &[(&str, &str)],
        more: &[&str],
    ) -> Self {
        let port = free_port();
        let log = dir.join(format!("{owner}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary())
            .args([
                "--config",
                config.to_str().unwrap(),
                "--lease",
                lease,
                "--owner",
                owner,
            ])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(more)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("start web_service");
        let service = Service {
            owner: owner.to_owned(),
            port,
            child,
            log,
        };
        let give_up = Instant::now() + Duration::from_secs(60);
        while service.try_get("/healthz").await.is_none() {
            assert!(
                Instant::now() < give_up,
                "{owner} did not answer /healthz: {}",
                service.log_text()
            );
            sleep(Duration::from_millis(20)).await;
        }
        service
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path`: status and body, `None` when nothing answers.
    async fn try_get(&self, path: &str) -> Option<(u16, String)> {
        self.try_request("GET", path)
            .await
            .map(|(status, _, body)| (status, body))
    }

    /// `method path` without a body: status, head and body, `None` when nothing answers.
    async fn try_request(&self, method: &str, path: &str) -> Option<(u16, String, String)> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
            .await
            .ok()?
            .ok()?;
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        // Bodies come with a content length here (no chunked encoding for these routes).
        Some((status, head.to_owned(), body.to_owned()))
    }

    /// `POST path`: status, head and body.
    async fn post(&self, path: &str) -> (u16, String, String) {
        self.try_request("POST", path)
            .await
            .unwrap_or_else(|| panic!("{} did not answer POST {path}", self.owner))
    }

    async fn get(&self, path: &str) -> (u16, String) {
        self.try_get(path)
            .await
            .unwrap_or_else(|| panic!("{} did not answer {path}", self.owner))
    }

    async fn json(&self, path: &str) -> Value {
        let (status, body) = self.get(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    /// The report of `lease` from `/leases`.
    async fn lease(&self, lease: &str) -> Value {
        let leases = self.json("/leases").await;
        leases
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == lease)
            .cloned()
            .unwrap_or_else(|| panic!("{lease} not in {leases}"))
    }

    /// SIGTERM, then waits (up to 20 s) for a successful exit.
    async fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "{} exited with {status}: {}",
                    self.owner,
                    self.log_text()
                );
                return;
            }
            assert!(
                Instant::now() < give_up,
                "{} did not exit after SIGTERM",
                self.owner
            );
            sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Waits (up to `within`) until `condition` holds for what `probe` returns; returns it.
async fn until<T, F: std::future::Future<Output = T>>(
    within: Duration,
    mut probe: impl FnMut() -> F,
    condition: impl Fn(&T) -> bool,
) -> T {
    let give_up = Instant::now() + within;
    loop {
        let value = probe().await;
        if condition(&value) {
            return value;
        }
        assert!(Instant::now() < give_up, "not within {within:?}");
        sleep(Duration::from_millis(20)).await;
    }
}

/// The example's histograms and the buckets it configures for them.
const HISTOGRAMS: [(&str, &[f64]); 2] = [
    (
        "actix_coordination_renewal_duration_seconds",
        actix_coordination::RENEWAL_DURATION_BUCKETS,
    ),
    (
        "actix_coordination_renewal_margin_seconds",
        actix_coordination::RENEWAL_MARGIN_BUCKETS,
    ),
];

/// The count of the `_bucket` series of histogram `name` for `lease` and upper bound `le`, from
/// a Prometheus text exposition.
fn bucket_count(text: &str, name: &str, lease: &str, le: &str) -> Option<u64> {
    let series = format!("{name}_bucket{{lease=\"{lease}\",le=\"{le}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|count| count.trim().parse().ok())
}

/// The time (seconds since the Unix epoch) of the first line containing `text` in `log`, from
/// the `fmt` subscriber's RFC 3339 timestamp (`2026-11-26T05:55:22.831206Z`).
fn time_of(log: &str, text: &str) -> f64 {
    let line = &log.lines().collect::<Vec<_>>()[line_of(log, text)];
    let stamp = line.split_whitespace().next().unwrap();
    let field = |range: std::ops::Range<usize>| -> i64 { stamp[range].parse().unwrap() };
    let (y, m, d) = (field(0..4), field(5..7), field(8..10));
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let seconds: f64 = stamp[17..stamp.len() - 1].parse().unwrap();
    (days * 86_400 + field(11..13) * 3600 + field(14..16) * 60) as f64 + seconds
}

/// The position of the first line containing `text` in `log`.
fn line_of(log: &str, text: &str) -> usize {
    log.lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("no {text:?} in the log:\n{log}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_and_sigterm_releases_before_the_server_stops() {
    let dir = scratch("routes");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        "[leases.singleton]\nbackend = \"in-memory\"\nttl = \"2s\"\nrenewal-interval = \"500ms\"\n",
    )
    .unwrap();
    let lease = "routes-jobs";
    let mut solo = Service::start_with(&dir, "solo", &config, lease, &[], SHARDED).await;

    assert_eq!(solo.get("/healthz").await, (200, "ok".to_owned()));
    // Ready once its candidacy is published (issue 39).
    let ready = until(
        Duration::from_secs(10),
        || solo.get("/readyz"),
        |r| r.0 == 200,
    )
    .await;
    assert_eq!(ready, (200, "ok".to_owned()));
    let report = until(
        Duration::from_secs(10),
        || solo.lease(lease),
        |r| r["held"] == true,
    )
    .await;
    assert_eq!(report["owner"], "solo");
    assert_eq!(report["holder"], "solo");
    assert_eq!(report["fencing_token"], 1);
    let left = report["deadline_in_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 2000, "{report}");

    // The sharded partitions (8 by default) all run here, alone in the group; readiness does not
    // depend on them.
    let shards = until(
        Duration::from_secs(10),
        || solo.json("/shards"),
        |s| s["here"].as_array().unwrap().len() == 8,
    )
    .await;
    assert_eq!(shards["members"], serde_json::json!(["solo"]), "{shards}");
    assert!(
        shards["here"][0]["fencing_token"].as_u64().unwrap() >= 1,
        "{shards}"
    );

    // The job runs, under the lease's token.
    let job = until(
        Duration::from_secs(10),
        || solo.json("/singleton"),
        |j| j["runs"].as_u64().unwrap() >= 3,
    )
    .await;
    assert_eq!(job["running"], true);
    assert_eq!(job["fencing_token"], 1);

    // Prometheus text: the lease is held, renewals happen, and every metric has its help text.
    let held = format!("actix_coordination_lease_held{{lease=\"{lease}\"}} 1");
    let renewed =
        format!("actix_coordination_renewals_total{{lease=\"{lease}\",outcome=\"renewed\"}} ");
    // A renewal has been recorded in both histograms (a `_count` series, whatever they render as).
    let observed = |t: &str| {
        HISTOGRAMS.iter().all(|(name, _)| {
            let series = format!("{name}_count{{lease=\"{lease}\"}} ");
            t.lines()
                .filter_map(|l| l.strip_prefix(&series))
                .any(|n| n.trim().parse::<u64>().is_ok_and(|n| n >= 1))
        })
    };
    let (status, text) = until(
        Duration::from_secs(10),
        || solo.get("/metrics"),
        |(_, t)| t.contains(&renewed) && observed(t),
    )
    .await;
    assert_eq!(status, 200);
    assert!(text.contains(&held), "{text}");
    for name in [
        "actix_coordination_lease_held",
        "actix_coordination_renewals_total",
        "actix_coordination_singleton_starts_total",
    ] {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}: {text}");
    }
    // The histograms render as Prometheus histograms (not summaries, which cannot be aggregated
    // across replicas) with the crate's recommended buckets, each bucket a cumulative count.
    for (name, buckets) in HISTOGRAMS {
        assert!(
            text.contains(&format!("\n# TYPE {name} histogram\n")),
            "{name}: {text}"
        );
        assert!(
            !text.contains(&format!("{name}{{lease=\"{lease}\",quantile=")),
            "{text}"
        );
        let mut last = 0;
        for le in buckets
            .iter()
            .map(f64::to_string)
            .chain(["+Inf".to_owned()])
        {
            let count = bucket_count(&text, name, lease, &le)
                .unwrap_or_else(|| panic!("{name}: no bucket le={le}: {text}"));
            assert!(
                count >= last,
                "{name}: le={le} counts {count} < {last}: {text}"
            );
            last = count;
        }
        assert!(last >= 1, "{name}: no observation: {text}");
    }

    // SIGTERM: the job stops, the lease is released, and only then does the server stop.
    solo.terminate().await;
    let log = solo.log_text();
    let stopped = line_of(&log, "job stopped");
    // The singleton's lease (the example's partitions log releases of their leases too).
    let released = line_of(&log, &format!("lease released lease={lease} "));
    let server_stopped = line_of(&log, "http server stopped");
    assert!(stopped < released && released < server_stopped, "{log}");
    assert!(log.contains("released=true"), "{log}");
}

/// Two services on one lease through `config`: one leads, the other follows; SIGTERM to the
/// leader hands the lease to the other faster than `ttl`, under a higher fencing token.
async fn two_instances_one_leader(
    dir: &Path,
    config: &Path,
    lease: &str,
    ttl: Duration,
    env: &[(&str, &str)],
) {
    let mut a = Service::start_with(dir, "node-a", config, lease, env, SHARDED).await;
    let first = until(
        Duration::from_secs(20),
        || a.lease(lease),
        |r| r["held"] == true,
    )
    .await;
    let b = Service::start_with(dir, "node-b", config, lease, env, SHARDED).await;

    // Exactly one leads: b sees a as the holder, runs no job, and both are live and ready.
    let follower = until(
        Duration::from_secs(20),
        || b.lease(lease),
        |r| r["holder"] == "node-a",
    )
    .await;
    assert_eq!(follower["held"], false, "{follower}");
    assert_eq!(follower["fencing_token"], Value::Null);
    assert_eq!(a.lease(lease).await["held"], true);
    assert_eq!(a.json("/singleton").await["running"], true);
    assert_eq!(b.json("/singleton").await["running"], false);
    for service in [&a, &b] {
        assert_eq!(service.get("/healthz").await.0, 200);
        // Ready once its candidacy is published (issue 39).
        until(
            Duration::from_secs(20),
            || service.get("/readyz"),
            |r| r.0 == 200,
        )
        .await;
    }
    // Both know who leads and where (a's advertised address, from its candidacy); the leader-only
    // route runs on a, and b redirects it there.
    let a_address = format!("http://127.0.0.1:{}", a.port);
    for (service, here) in [(&a, true), (&b, false)] {
        // `503` until the replica's watch of the lease has listed it; no address until its watch
        // of the candidacies has seen a's (published once a's own watch is up).
        let (_, body) = until(
            Duration::from_secs(20),
            || service.get("/leader"),
            |(status, body)| {
                *status == 200 && body.contains("node-a") && !body.contains("\"address\":null")
            },
        )
        .await;
        let leader: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(leader["here"], here, "{leader}");
        assert_eq!(leader["address"], a_address.as_str(), "{leader}");
        assert_eq!(leader["fencing_token"], first["fencing_token"], "{leader}");
    }
    let (status, _, body) = a.post("/leader-only/run-now").await;
    assert_eq!(status, 202, "{body}");
    let (status, head, body) = b.post("/leader-only/run-now?now=1").await;
    assert_eq!(status, 307, "{head}\n{body}");
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains(&format!("location: {a_address}/leader-only/run-now?now=1")),
        "{head}"
    );
    assert!(head.contains("x-leader: node-a"), "{head}");
    // The 8 partitions split 4 and 4 between the replicas; both stay ready whatever they hold.
    for service in [&a, &b] {
        let shards = until(
            Duration::from_secs(30),
            || service.json("/shards"),
            |s| {
                s["here"].as_array().unwrap().len() == 4
                    && s["members"].as_array().unwrap().len() == 2
                    && s["holders"]
                        .as_object()
                        .unwrap()
                        .values()
                        .all(|h| !h.is_null())
            },
        )
        .await;
        assert_eq!(shards["holders"].as_object().unwrap().len(), 8, "{shards}");
        assert_eq!(service.get("/readyz").await.0, 200);
    }

    // SIGTERM moves it: b leads within a fraction of the TTL, which only a release allows.
    let signalled = Instant::now();
    a.terminate().await;
    let leader = until(
        Duration::from_secs(30),
        || b.lease(lease),
        |r| r["held"] == true,
    )
    .await;
    let took = signalled.elapsed();
    assert!(
        took < ttl,
        "b took over {took:?} after the SIGTERM: not faster than the TTL {ttl:?}"
    );
    assert!(
        leader["fencing_token"].as_u64().unwrap() > first["fencing_token"].as_u64().unwrap(),
        "{first} then {leader}"
    );
    let job = until(
        Duration::from_secs(10),
        || b.json("/singleton"),
        |j| j["running"] == true && j["runs"].as_u64().unwrap() >= 1,
    )
    .await;
    assert_eq!(job["fencing_token"], leader["fencing_token"]);
    assert!(a.log_text().contains("released=true"), "{}", a.log_text());
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_etcd_have_one_leader_and_sigterm_moves_it() {
    let dir = scratch("etcd");
    let config = dir.join("config.toml");
    let prefix = common::etcd::unique_prefix("web-service");
    std::fs::write(
        &config,
        format!(
            "[leases.singleton]\nbackend = \"etcd\"\nttl = \"10s\"\nrenewal-interval = \"2s\"\n\n\
             [leases.singleton.etcd]\nendpoints = [\"{}\"]\nprefix = \"{prefix}\"\n",
            common::etcd::endpoint()
        ),
    )
    .unwrap();
    two_instances_one_leader(&dir, &config, "web-jobs", Duration::from_secs(10), &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_kubernetes_have_one_leader_and_sigterm_moves_it() {
    let env = common::k8s::env();
    let dir = scratch("kubernetes");
    let config = dir.join("config.toml");
    let token_file = dir.join("token");
    std::fs::write(&token_file, &env.token).unwrap();
    // The namespace comes from $POD_NAMESPACE (the downward API in deploy/), not the file.
    std::fs::write(
        &config,
        format!(
            "[leases.singleton]\nbackend = \"kubernetes\"\nttl = \"10s\"\nrenewal-interval = \"2s\"\n\n\
             [leases.singleton.kubernetes]\nnamespace = \"not-this-one\"\napi-url = \"{}\"\n\
             token-file = \"{}\"\nca-file = \"{}\"\n",
            env.url,
            token_file.display(),
            env.ca.display()
        ),
    )
    .unwrap();
    let lease = common::k8s::unique("web-jobs");
    two_instances_one_leader(
        &dir,
        &config,
        &lease,
        Duration::from_secs(10),
        &[("POD_NAMESPACE", env.namespace.as_str())],
    )
    .await;
    // node-a, shut down by SIGTERM, gave its candidacy and its member lease up for good
    // (`Lease::retire`): their objects are gone; the singleton's and the shards' stay.
    let admin: kube::Api<k8s_openapi::api::coordination::v1::Lease> = kube::Api::namespaced(
        common::k8s::client(&env.url, &env.admin_token),
        &env.namespace,
    );
    for gone in [
        format!("{lease}-candidate-node-a"),
        format!("{lease}-shards.member.node-a"),
    ] {
        let found = admin.get_opt(&gone).await.expect("admin get");
        assert!(found.is_none(), "{gone} was deleted: {found:?}");
    }
    for kept in [lease.clone(), format!("{lease}-shards.0")] {
        let found = admin.get_opt(&kept).await.expect("admin get");
        assert!(found.is_some(), "{kept} stays");
    }
}

/// How long the leader's release is slowed: every request it sends reaches the store this much
/// later, far past the HTTP server's own shutdown (a few milliseconds with no request in flight).
const SLOW_RELEASE: Duration = Duration::from_secs(2);

/// The TTL of the slow-release tests: long enough for an operation timeout (5 s) that a release
/// slowed by [`SLOW_RELEASE`] fits in (`renewal-interval + 2 × operation-timeout ≤ ttl - margin`).
const TTL_SLOW: Duration = Duration::from_secs(15);

/// Two services on one lease, the leader `node-a` through `proxy` (`config_a`), the follower
/// `node-b` directly (`config_b`). Once `node-a` leads, every request it sends is delayed by
/// [`SLOW_RELEASE`]; SIGTERM to it: the job stops, the lease is released (which takes the delay),
/// and only then does the HTTP server stop, and the process exits 0; `node-b` leads right after
/// the release, faster than the TTL (prints the measured takeover).
async fn a_slow_release_completes_before_the_server_stops(
    dir: &Path,
    (config_a, config_b): (&Path, &Path),
    proxy: &common::proxy::FaultProxy,
    lease: &str,
    ttl: Duration,
    env: &[(&str, &str)],
) {
    let mut a = Service::start(dir, "node-a", config_a, lease, env).await;
    let first = until(
        Duration::from_secs(20),
        || a.lease(lease),
        |r| r["held"] == true,
    )
    .await;
    let b = Service::start(dir, "node-b", config_b, lease, env).await;
    until(
        Duration::from_secs(20),
        || b.lease(lease),
        |r| r["holder"] == "node-a",
    )
    .await;

    proxy.set_mode(common::proxy::ProxyMode::SlowRequests(SLOW_RELEASE));
    let signalled = Instant::now();
    a.terminate().await;
    let leader = until(
        Duration::from_secs(30),
        || b.lease(lease),
        |r| r["held"] == true,
    )
    .await;
    let took = signalled.elapsed();
    assert!(
        took < ttl,
        "b took over {took:?} after the SIGTERM: not faster than the TTL {ttl:?}"
    );
    assert!(
        leader["fencing_token"].as_u64().unwrap() > first["fencing_token"].as_u64().unwrap(),
        "{first} then {leader}"
    );

    // In a's log: the job stopped, the lease was released (which took the delay, by
    // construction), and only then did the HTTP server stop.
    let log = a.log_text();
    let stopped = line_of(&log, "job stopped");
    // The singleton's lease (the example's partitions log releases of their leases too).
    let released = line_of(&log, &format!("lease released lease={lease} "));
    let server_stopped = line_of(&log, "http server stopped");
    assert!(stopped < released && released < server_stopped, "{log}");
    assert!(log.contains("released=true"), "{log}");
    let requested = time_of(&log, "termination requested");
    let release_took = time_of(&log, &format!("lease released lease={lease} ")) - requested;
    assert!(
        release_took >= SLOW_RELEASE.as_secs_f64(),
        "the release was not slowed ({release_took} s): {log}"
    );
    // What the numbers were (not asserted: timings belong in benches).
    let server_took = time_of(&log, "http server stopped")
        - time_of(&log, &format!("shutdown: lease released lease={lease} "));
    let b_log = b.log_text();
    let acquired_after_a = b_log
        .lines()
        .rfind(|l| l.contains("lease acquired"))
        .map(|l| time_of(l, "lease acquired"))
        .unwrap_or_else(|| panic!("b never logged an acquisition: {b_log}"));
    let takeover = acquired_after_a - time_of(&log, &format!("lease released lease={lease} "));
    eprintln!(
        "measured: release {:.0} ms (slowed by {SLOW_RELEASE:?}), http server stop after it {:.1} ms, \
         takeover by node-b {:.1} ms after node-a logged the release, {took:?} after the SIGTERM",
        release_took * 1e3,
        server_took * 1e3,
        takeover * 1e3
    );
    drop(b);
}

/// The configuration of the slow-release tests on etcd, in `dir`: `(through proxy, direct)`.
fn slow_release_etcd_configs(dir: &Path, proxy: &common::proxy::FaultProxy) -> (PathBuf, PathBuf) {
    let endpoint = common::etcd::endpoint();
    let prefix = common::etcd::unique_prefix("web-slow-release");
    let config = |endpoint: &str, name: &str| {
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "[leases.singleton]\nbackend = \"etcd\"\nttl = \"15s\"\nrenewal-interval = \"2s\"\n\
                 operation-timeout = \"5s\"\n\n[leases.singleton.etcd]\nendpoints = [\"{endpoint}\"]\nprefix = \"{prefix}\"\n"
            ),
        )
        .unwrap();
        path
    };
    (
        config(&format!("http://{}", proxy.addr()), "a.toml"),
        config(&endpoint, "b.toml"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_a_release_slower_than_the_server_shutdown_completes_before_exit() {
    let dir = scratch("etcd-slow-release");
    let proxy =
        common::proxy::FaultProxy::start(common::etcd::socket_addr(&common::etcd::endpoint()))
            .await;
    let (through_proxy, direct) = slow_release_etcd_configs(&dir, &proxy);
    a_slow_release_completes_before_the_server_stops(
        &dir,
        (&through_proxy, &direct),
        &proxy,
        "web-slow-release",
        TTL_SLOW,
        &[],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kubernetes_a_release_slower_than_the_server_shutdown_completes_before_exit() {
    let env = common::k8s::env();
    let dir = scratch("kubernetes-slow-release");
    let proxy = common::proxy::FaultProxy::start(env.upstream).await;
    let token_file = dir.join("token");
    std::fs::write(&token_file, &env.token).unwrap();
    let config = |url: &str, name: &str| {
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "[leases.singleton]\nbackend = \"kubernetes\"\nttl = \"15s\"\nrenewal-interval = \"2s\"\n\
                 operation-timeout = \"5s\"\n\n[leases.singleton.kubernetes]\napi-url = \"{url}\"\n\
                 token-file = \"{}\"\nca-file = \"{}\"\n",
                token_file.display(),
                env.ca.display()
            ),
        )
        .unwrap();
        path
    };
    let through_proxy = config(&format!("https://{}", proxy.addr()), "a.toml");
    let direct = config(&env.url, "b.toml");
    let lease = common::k8s::unique("web-slow-release");
    a_slow_release_completes_before_the_server_stops(
        &dir,
        (&through_proxy, &direct),
        &proxy,
        &lease,
        TTL_SLOW,
        &[("POD_NAMESPACE", env.namespace.as_str())],
    )
    .await;
}

/// For comparison, the same setup on etcd without the helper (the example's `--shutdown`,
/// `actix-web` or `both`, as the README's "In an actix-web service" describes): SIGTERM stops the
/// HTTP server, `main` returns and the process exits 0, but the lease is not released (with
/// `both`, the manager's release is still on its way when `main` returns and is dropped with
/// it): the store still names the old holder, and the follower leads only once the record has
/// expired, not sooner than half the TTL after the SIGTERM.
async fn without_the_helper_the_lease_is_not_released(mode: &str) {
    let dir = scratch(&format!("etcd-without-helper-{mode}"));
    let proxy =
        common::proxy::FaultProxy::start(common::etcd::socket_addr(&common::etcd::endpoint()))
            .await;
    let (config_a, config_b) = slow_release_etcd_configs(&dir, &proxy);
    let lease = "web-without-helper";
    let mut a =
        Service::start_with(&dir, "node-a", &config_a, lease, &[], &["--shutdown", mode]).await;
    until(
        Duration::from_secs(20),
        || a.lease(lease),
        |r| r["held"] == true,
    )
    .await;
    let b = Service::start(&dir, "node-b", &config_b, lease, &[]).await;
    until(
        Duration::from_secs(20),
        || b.lease(lease),
        |r| r["holder"] == "node-a",
    )
    .await;

    proxy.set_mode(common::proxy::ProxyMode::SlowRequests(SLOW_RELEASE));
    let signalled = Instant::now();
    a.terminate().await;
    let log = a.log_text();
    assert!(log.contains("http server stopped"), "{log}");
    assert!(
        !log.contains(&format!("lease released lease={lease} ")),
        "{log}"
    );
    let follower = b.lease(lease).await;
    assert_eq!(follower["holder"], "node-a", "{follower}");
    assert_eq!(follower["held"], false, "{follower}");
    until(TTL_SLOW * 3, || b.lease(lease), |r| r["held"] == true).await;
    let took = signalled.elapsed();
    assert!(
        took >= TTL_SLOW / 2,
        "b took over {took:?} after the SIGTERM: a release, not an expiry"
    );
    eprintln!("measured ({mode}): takeover {took:?} after the SIGTERM (TTL {TTL_SLOW:?})\n{log}");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_helper_actix_web_alone_never_releases() {
    without_the_helper_the_lease_is_not_released("actix-web").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_helper_handle_signals_drops_a_slow_release_when_main_returns() {
    without_the_helper_the_lease_is_not_released("both").await;
}

/// The alert expressions of the README: the ```promql block after "Useful alerts", one
/// expression a line (`#` lines are comments).
fn readme_alerts() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let (_, after) = readme
        .split_once("Useful alerts")
        .expect("README: \"Useful alerts\"");
    let (_, block) = after
        .split_once("```promql\n")
        .expect("README: a ```promql block after \"Useful alerts\"");
    let (block, _) = block.split_once("```").unwrap();
    let alerts: Vec<String> = block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    assert!(alerts.len() >= 4, "{alerts:?}");
    alerts
}

/// One series an alert expression reads: the metric name, the function applied to it
/// (`rate`, `increase`, or none), and the labels the aggregation around it keeps.
#[derive(Debug)]
struct Read {
    metric: String,
    function: Option<String>,
    by: Vec<String>,
}

/// The series `expr` reads, checking its shape on the way: balanced parentheses, only the
/// functions and aggregations the checks below know, a range on every `rate`/`increase`, and
/// `histogram_quantile` over the `rate` of a `_bucket` series summed by `le`.
fn reads(expr: &str) -> Vec<Read> {
    let mut depth = 0i32;
    for c in expr.chars() {
        depth += match c {
            '(' => 1,
            ')' => -1,
            _ => 0,
        };
        assert!(depth >= 0, "unbalanced: {expr}");
    }
    assert_eq!(depth, 0, "unbalanced: {expr}");
    let words: Vec<&str> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.chars().next().is_some_and(|c| c.is_ascii_alphabetic()))
        .collect();
    for word in &words {
        assert!(
            word.starts_with("actix_coordination_")
                || [
                    "sum",
                    "by",
                    "rate",
                    "increase",
                    "histogram_quantile",
                    "le",
                    "lease"
                ]
                .contains(word),
            "{word:?} in {expr}: not a function, aggregation, label or metric these checks know"
        );
    }
    let by: Vec<String> = expr
        .split("by (")
        .skip(1)
        .flat_map(|rest| rest.split_once(')').unwrap().0.split(','))
        .map(|l| l.trim().to_owned())
        .collect();
    let mut found = Vec::new();
    for (at, _) in expr.match_indices("actix_coordination_") {
        let metric: String = expr[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let before = expr[..at].trim_end_matches('(');
        let function = ["rate", "increase"]
            .into_iter()
            .find(|f| before.ends_with(f))
            .map(str::to_owned);
        if function.is_some() {
            let rest = &expr[at + metric.len()..];
            assert!(
                rest.starts_with('[') && rest.contains("m])"),
                "{metric}: a range vector in {expr}"
            );
        }
        if metric.ends_with("_bucket") {
            assert!(
                expr.starts_with("histogram_quantile(") && function.as_deref() == Some("rate"),
                "{metric}: histogram_quantile over rate() in {expr}"
            );
            assert!(by.iter().any(|l| l == "le"), "{expr} keeps le");
        }
        found.push(Read {
            metric,
            function,
            by: by.clone(),
        });
    }
    assert!(!found.is_empty(), "{expr} reads no metric of the crate");
    found
}

/// Checks every series `alerts` read against a Prometheus text exposition: it exists, with the
/// `# TYPE` its use needs and the labels it is summed by.
fn check_alerts_against(alerts: &[String], text: &str, stage: &str) {
    for expr in alerts {
        for read in reads(expr) {
            let (family, kind) = match read.metric.strip_suffix("_bucket") {
                Some(base) => (base.to_owned(), "histogram"),
                None if read.function.is_some() => (read.metric.clone(), "counter"),
                None => (read.metric.clone(), "gauge"),
            };
            assert!(
                text.contains(&format!("\n# TYPE {family} {kind}\n")),
                "{stage}: {expr}: no `# TYPE {family} {kind}`:\n{text}"
            );
            let samples: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{}{{", read.metric)))
                .collect();
            assert!(
                !samples.is_empty(),
                "{stage}: {expr}: no {} series:\n{text}",
                read.metric
            );
            for sample in &samples {
                for label in &read.by {
                    assert!(
                        sample.contains(&format!("{label}=\"")),
                        "{stage}: {expr}: {sample} has no label {label}"
                    );
                }
            }
        }
    }
}

/// The sum of the samples of `metric` with `label` in a Prometheus text exposition.
fn sum_of(text: &str, metric: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The README's alert expressions against the example's real `/metrics` on etcd: before any
/// replica could lead (the store unreachable through a proxy that resets every connection),
/// while it leads, and after a loss (its key deleted): each time every series each expression
/// reads exists, with its type and the labels it sums by; `lease_held` is 0, then 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_alerts_read_series_that_exist_before_a_leader_while_leading_and_after_a_loss() {
    let alerts = readme_alerts();
    let dir = scratch("alerts");
    let endpoint = common::etcd::endpoint();
    let proxy = common::proxy::FaultProxy::start(common::etcd::socket_addr(&endpoint)).await;
    proxy.set_mode(common::proxy::ProxyMode::Reset);
    let prefix = common::etcd::unique_prefix("web-alerts");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[leases.singleton]\nbackend = \"etcd\"\nttl = \"10s\"\nrenewal-interval = \"1s\"\n\n\
             [leases.singleton.etcd]\nendpoints = [\"http://{}\"]\nprefix = \"{prefix}\"\n",
            proxy.addr()
        ),
    )
    .unwrap();
    let lease = "web-alerts";
    let held = format!("lease=\"{lease}\"");
    let service = Service::start(&dir, "node-a", &config, lease, &[]).await;

    // Before any leader: the store cannot be reached; an acquire attempt has failed.
    let (_, before) = until(
        Duration::from_secs(20),
        || service.get("/metrics"),
        |(_, t)| {
            sum_of(
                t,
                "actix_coordination_acquire_attempts_total",
                "outcome=\"error\"",
            ) >= 1.0
        },
    )
    .await;
    assert_eq!(service.lease(lease).await["held"], false);
    assert_eq!(
        sum_of(&before, "actix_coordination_lease_held", &held),
        0.0,
        "{before}"
    );
    check_alerts_against(&alerts, &before, "before any leader");

    // While leading, after a renewal.
    proxy.set_mode(common::proxy::ProxyMode::Pass);
    let (_, leading) = until(
        Duration::from_secs(30),
        || service.get("/metrics"),
        |(_, t)| {
            sum_of(t, "actix_coordination_lease_held", &held) == 1.0
                && sum_of(
                    t,
                    "actix_coordination_renewals_total",
                    "outcome=\"renewed\"",
                ) >= 1.0
        },
    )
    .await;
    check_alerts_against(&alerts, &leading, "while leading");

    // After a loss: the key deleted under the holder.
    let mut admin = common::etcd::admin_client(&endpoint).await;
    admin
        .delete(format!("{prefix}{lease}"), None)
        .await
        .expect("delete the lease's key");
    let (_, after) = until(
        Duration::from_secs(30),
        || service.get("/metrics"),
        |(_, t)| sum_of(t, "actix_coordination_lease_losses_total", &held) >= 1.0,
    )
    .await;
    check_alerts_against(&alerts, &after, "after a loss");
    drop(service);
}
