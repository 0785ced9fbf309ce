//! The counter service (`examples/counters.rs`) as real processes on the real etcd and the real
//! kube-apiserver (issue 38): three replicas of one group of 64 shards; a client sends 10,000
//! increments (`COUNTER_INCREMENTS` sets another number) over 200 counters to random replicas
//! from eight threads, following the `307`s and retrying the `503`s and broken connections with
//! the same increment id; a third of the way through one replica is SIGTERMed (its shards are
//! handed over under load), and once it has exited a fourth one joins (shards move to it under
//! load). Every 50th increment is sent twice on purpose.
//!
//! Checked at the end: every counter, read from the fenced store's files and through the
//! service, equals the increments sent to it, and the store recorded each increment id exactly
//! once (none lost, none applied twice); the counts the service answered for the applied
//! increments of a counter are exactly 1..=n; each resent increment was answered from the record
//! with the count it made; in each shard's log of the store (written under the shard's lock, on
//! `CLOCK_MONOTONIC`) the fencing tokens of the applied increments never fall (no write under a
//! token lower than one already applied, so no two tenures interleave) and each token wrote from
//! one replica only. The `503`s are counted and printed with their windows (per shard: from a
//! `503` to the shard's next `200`), per phase (start, leave, join), with the load average.
//!
//! One test at a time (each starts four processes holding 64 leases); every wait is on an event
//! (a log line, an HTTP answer, a counter of the client) with a deadline, never a bare sleep.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SHARDS: usize = 64;
const ENTITIES: usize = 200;
const CLIENTS: usize = 8;
/// Every `RESEND`th increment is sent a second time once answered.
const RESEND: usize = 50;
const TTL: Duration = Duration::from_secs(3);
const RENEWAL: Duration = Duration::from_secs(1);
/// How long starting, settling or exiting may take (a loaded machine, 64 claims per replica).
const WITHIN: Duration = Duration::from_secs(90);
/// How long the whole load may take.
const LOAD_WITHIN: Duration = Duration::from_secs(240);

static SERIAL: Mutex<()> = Mutex::new(());

fn increments() -> usize {
    std::env::var("COUNTER_INCREMENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

/// `CLOCK_MONOTONIC` in nanoseconds, the clock of the store's log.
fn now_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("counter-processes")
        .join(format!("{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn timing() -> String {
    format!(
        "ttl = \"{}ms\"\nrenewal-interval = \"{}ms\"\n",
        TTL.as_millis(),
        RENEWAL.as_millis()
    )
}

/// The lease configuration the replicas share (config key `sharded`) and the group name.
struct Backend {
    name: &'static str,
    config: PathBuf,
    group: String,
}

fn etcd(dir: &Path) -> Backend {
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[leases.sharded]\nbackend = \"etcd\"\n{}\n[leases.sharded.etcd]\nendpoints = [\"{}\"]\nprefix = \"{}\"\n",
            timing(),
            common::etcd::endpoint(),
            common::etcd::unique_prefix("counters")
        ),
    )
    .unwrap();
    Backend {
        name: "etcd",
        config,
        group: "counters".into(),
    }
}

fn kubernetes(dir: &Path) -> Backend {
    let env = common::k8s::env();
    let token = dir.join("lease-holder.token");
    std::fs::write(&token, &env.token).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[leases.sharded]\nbackend = \"kubernetes\"\n{}\n[leases.sharded.kubernetes]\nnamespace = \"{}\"\napi-url = \"{}\"\ntoken-file = \"{}\"\nca-file = \"{}\"\n",
            timing(),
            env.namespace,
            env.url,
            token.display(),
            env.ca.display()
        ),
    )
    .unwrap();
    Backend {
        name: "kubernetes",
        config,
        group: common::k8s::unique("counters"),
    }
}

/// A replica process; killed (and reaped) when dropped.
struct Replica {
    node: String,
    child: Child,
    log: PathBuf,
    /// `host:port`, once it has said where it serves.
    address: Option<String>,
    exited: bool,
}

impl Drop for Replica {
    fn drop(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Replica {
    fn spawn(backend: &Backend, store: &Path, dir: &Path, node: &str) -> Self {
        let log = dir.join(format!("{node}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(common::example_binary("counters"))
            .args(["--config", backend.config.to_str().unwrap()])
            .args(["--group", &backend.group])
            .args(["--shards", &SHARDS.to_string()])
            .args(["--node", node])
            .args(["--listen", "127.0.0.1:0"])
            .args(["--store", store.to_str().unwrap()])
            .env("RUST_LOG", "actix_coordination=info")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("ACTIX_COORDINATION_ADDRESS")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start the counters example");
        Replica {
            node: node.to_owned(),
            child,
            log,
            address: None,
            exited: false,
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where it serves, once it said so; panics if it exited.
    fn address(&mut self) -> Option<String> {
        if self.address.is_none() {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("{} exited ({status}):\n{}", self.node, self.output());
            }
            let output = self.output();
            let (_, rest) = output.split_once(" as http://")?;
            self.address = Some(rest.split(',').next()?.to_owned());
        }
        self.address.clone()
    }

    /// The shards it runs (`GET /shards`).
    fn shards(&mut self) -> Option<usize> {
        let address = self.address()?;
        let answer = Client::default().once("GET", &address, "/shards").ok()?;
        let json: serde_json::Value = serde_json::from_str(&answer.body).ok()?;
        Some(json["shards"].as_object()?.len())
    }

    /// SIGTERM, then a successful exit within [`WITHIN`].
    fn terminate(&mut self) {
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0, "SIGTERM to {}", self.node);
        let status = wait_for(WITHIN, &format!("{} to exit", self.node), || {
            self.child.try_wait().unwrap()
        });
        self.exited = true;
        assert!(
            status.success(),
            "{} exited with {status}:\n{}",
            self.node,
            self.output()
        );
        // GracefulShutdown released the group's member lease (and so every shard) before the
        // server stopped.
        let output = self.output();
        assert!(output.contains("] shut down"), "{output}");
        assert!(
            output.contains("shutdown: lease released") && output.contains("released=true"),
            "{} did not release its leases:\n{output}",
            self.node
        );
    }
}

/// Polls `condition` every 20 ms until it answers something, for at most `within`.
fn wait_for<T>(within: Duration, what: &str, mut condition: impl FnMut() -> Option<T>) -> T {
    let give_up = Instant::now() + within;
    loop {
        if let Some(value) = condition() {
            return value;
        }
        assert!(Instant::now() < give_up, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// --- The client -------------------------------------------------------------------------------

struct Answer {
    status: u16,
    location: Option<String>,
    shard: Option<usize>,
    body: String,
}

/// An attempt's outcome for a shard: `503` or `200`, when.
#[derive(Clone, Copy)]
struct Seen {
    shard: usize,
    t_ns: u128,
    ok: bool,
}

/// A small HTTP/1.1 client: one kept-alive connection per address, redirects followed.
#[derive(Default)]
struct Client {
    connections: HashMap<String, BufReader<TcpStream>>,
    redirects: usize,
    unavailable: usize,
    /// `503`s that name no shard: a replica whose group watch has not listed the group yet
    /// (a replica that has just started).
    unlisted: usize,
    /// The body of the last of them.
    unlisted_body: Option<String>,
    broken: usize,
    seen: Vec<Seen>,
}

impl Client {
    fn once(&mut self, method: &str, authority: &str, path: &str) -> std::io::Result<Answer> {
        let result = self.exchange(method, authority, path);
        if result.is_err() {
            self.connections.remove(authority);
        }
        result
    }

    fn exchange(&mut self, method: &str, authority: &str, path: &str) -> std::io::Result<Answer> {
        if !self.connections.contains_key(authority) {
            let stream = TcpStream::connect(authority)?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(Duration::from_secs(20)))?;
            (self.connections).insert(authority.to_owned(), BufReader::new(stream));
        }
        let connection = self.connections.get_mut(authority).unwrap();
        write!(
            connection.get_mut(),
            "{method} {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-length: 0\r\n\r\n"
        )?;
        let mut line = String::new();
        if connection.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let status = (line.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or(std::io::ErrorKind::InvalidData)?;
        let (mut length, mut location, mut shard, mut close) = (0, None, None, false);
        loop {
            line.clear();
            connection.read_line(&mut line)?;
            let Some((name, value)) = line.trim_end().split_once(':') else {
                break;
            };
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => {
                    length = value.parse().map_err(|_| std::io::ErrorKind::InvalidData)?
                }
                "location" => location = Some(value.to_owned()),
                "x-shard" => shard = value.parse().ok(),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        connection.read_exact(&mut body)?;
        if close {
            self.connections.remove(authority);
        }
        Ok(Answer {
            status,
            location,
            shard,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }

    /// `method path` on a random one of `entries`, following redirects, retrying `503`s (after
    /// a backoff from 20 ms doubling to the `Retry-After` of 1 s) and broken connections (on
    /// another entry), for up to 60 s: the same request every time.
    fn send(&mut self, method: &str, entries: &Mutex<Vec<String>>, path: &str) -> Answer {
        let entry = || {
            let entries = entries.lock().unwrap();
            entries[fastrand::usize(..entries.len())].clone()
        };
        let give_up = Instant::now() + Duration::from_secs(60);
        let (mut authority, mut path) = (entry(), path.to_owned());
        let mut backoff = Duration::from_millis(20);
        loop {
            match self.once(method, &authority, &path) {
                Ok(answer) if answer.status == 307 => {
                    let location = answer.location.expect("a redirect names its location");
                    let rest = location.strip_prefix("http://").expect("an http location");
                    let (to, to_path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                    (authority, path) = (to.to_owned(), to_path.to_owned());
                    self.redirects += 1;
                    continue;
                }
                Ok(answer) if answer.status == 503 => {
                    self.unavailable += 1;
                    if answer.shard.is_none() {
                        self.unlisted += 1;
                        self.unlisted_body = Some(answer.body.clone());
                    }
                    if let Some(shard) = answer.shard {
                        let t_ns = now_ns();
                        self.seen.push(Seen {
                            shard,
                            t_ns,
                            ok: false,
                        });
                    }
                }
                Ok(answer) => {
                    if let (Some(shard), 200) = (answer.shard, answer.status) {
                        let t_ns = now_ns();
                        self.seen.push(Seen {
                            shard,
                            t_ns,
                            ok: true,
                        });
                    }
                    return answer;
                }
                Err(_) => {
                    self.broken += 1;
                    authority = entry();
                }
            }
            assert!(
                Instant::now() < give_up,
                "{method} {path}: no answer within 60 s"
            );
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

/// What the clients got: per entity, the count each increment made.
#[derive(Default)]
struct Results {
    counts: BTreeMap<usize, Vec<u64>>,
    resent: usize,
    /// Increments whose first answer came from the record (a retry of one already applied).
    retried_applied: usize,
}

fn entity(i: usize) -> usize {
    i % ENTITIES
}

/// Raises its flag when dropped by a panic (a client thread that failed).
struct Failed(Arc<AtomicBool>);

impl Drop for Failed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// One client thread: takes increment numbers below `allowed` until `n`, sends each (and every
/// `RESEND`th again).
fn client_thread(
    n: usize,
    entries: Arc<Mutex<Vec<String>>>,
    next: Arc<AtomicUsize>,
    allowed: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
    results: Arc<Mutex<Results>>,
) -> Client {
    let mut client = Client::default();
    loop {
        let i = next.fetch_add(1, Ordering::SeqCst);
        if i >= n {
            return client;
        }
        wait_for(LOAD_WITHIN, "the next phase", || {
            (i < allowed.load(Ordering::SeqCst)).then_some(())
        });
        let path = format!("/counters/counter-{}/increment?increment=i{i}", entity(i));
        let answer = client.send("POST", &entries, &path);
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        let json: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        // The count this increment made: applied now, or (a retry after an answer that was
        // lost) answered from the record.
        let count = json["count"].as_u64().unwrap();
        let mut results_now = results.lock().unwrap();
        results_now.counts.entry(entity(i)).or_default().push(count);
        if json["applied"] == false {
            results_now.retried_applied += 1;
        }
        drop(results_now);
        if i.is_multiple_of(RESEND) {
            let again = client.send("POST", &entries, &path);
            assert_eq!(again.status, 200, "{path} again: {}", again.body);
            let json: serde_json::Value = serde_json::from_str(&again.body).unwrap();
            assert_eq!(
                json["applied"], false,
                "{path} sent again was applied again"
            );
            assert_eq!(json["count"].as_u64(), Some(count), "{path} sent again");
            results.lock().unwrap().resent += 1;
        }
        done.fetch_add(1, Ordering::SeqCst);
    }
}

// --- The scenario -----------------------------------------------------------------------------

/// The `503` windows of `seen`: per shard, from a `503` to the shard's next `200` (or to `end_ns`
/// if none came), as (shard, start, end) in ns.
fn windows(seen: &[Seen], end_ns: u128) -> Vec<(usize, u128, u128)> {
    let mut by_shard: BTreeMap<usize, Vec<Seen>> = BTreeMap::new();
    for s in seen {
        by_shard.entry(s.shard).or_default().push(*s);
    }
    let mut windows = Vec::new();
    for (shard, mut events) in by_shard {
        events.sort_by_key(|s| s.t_ns);
        let mut open: Option<u128> = None;
        for s in events {
            match (s.ok, open) {
                (false, None) => open = Some(s.t_ns),
                (true, Some(start)) => {
                    windows.push((shard, start, s.t_ns));
                    open = None;
                }
                _ => {}
            }
        }
        if let Some(start) = open {
            windows.push((shard, start, end_ns));
        }
    }
    windows
}

fn run(test: &str, backend: fn(&Path) -> Backend) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let n = increments();
    let dir = scratch(test);
    let backend = backend(&dir);
    // Kept when the test fails: the replicas' logs and the store.
    println!("{}: logs and store in {}", backend.name, dir.display());
    let store = dir.join("store");
    let name = backend.name;
    let started = Instant::now();
    let load_before = load_average();
    let mut replicas: Vec<Replica> = ["node-1", "node-2", "node-3"]
        .iter()
        .map(|node| Replica::spawn(&backend, &store, &dir, node))
        .collect();
    wait_for(WITHIN, "three replicas sharing the 64 shards", || {
        let counts: Vec<Option<usize>> = replicas.iter_mut().map(Replica::shards).collect();
        let settled = counts
            .iter()
            .all(|c| c.is_some_and(|c| (21..=22).contains(&c)))
            && counts.iter().flatten().sum::<usize>() == SHARDS;
        settled.then_some(())
    });
    let settled = started.elapsed();
    let entries = Arc::new(Mutex::new(
        replicas.iter_mut().map(|r| r.address().unwrap()).collect(),
    ));
    println!("{name}: 3 replicas settled in {settled:?}; load average {load_before}");

    let (next, allowed, done) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(n / 3)),
        Arc::new(AtomicUsize::new(0)),
    );
    let results = Arc::new(Mutex::new(Results::default()));
    let failed = Arc::new(AtomicBool::new(false));
    let load_started = Instant::now();
    let start_ns = now_ns();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (entries, next, allowed, done, results) = (
                entries.clone(),
                next.clone(),
                allowed.clone(),
                done.clone(),
                results.clone(),
            );
            let failed = Failed(failed.clone());
            std::thread::spawn(move || {
                let client = client_thread(n, entries, next, allowed, done, results);
                drop(failed);
                client
            })
        })
        .collect();
    let progress = |what: &str, at_least: usize| {
        wait_for(LOAD_WITHIN, what, || {
            assert!(
                !failed.load(Ordering::SeqCst),
                "a client thread failed (its panic is above)"
            );
            (done.load(Ordering::SeqCst) >= at_least).then_some(())
        })
    };
    progress("the first third of the increments", n / 3);

    // node-2 leaves under load: its shards are handed over.
    allowed.store(n - n / 3, Ordering::SeqCst);
    let leaving = replicas[1].address().unwrap();
    let sigterm_ns = now_ns();
    // The clients stop picking it first (those redirected to it, or on it now, retry elsewhere).
    entries.lock().unwrap().retain(|a| *a != leaving);
    replicas[1].terminate();
    let left_ns = now_ns();
    println!(
        "{name}: node-2 SIGTERMed after {} increments, exited after {:.0} ms",
        done.load(Ordering::SeqCst),
        (left_ns - sigterm_ns) as f64 / 1e6
    );

    // node-4 joins under load: shards move to it.
    let join_ns = now_ns();
    replicas.push(Replica::spawn(&backend, &store, &dir, "node-4"));
    // Its address goes to the clients once it is ready (its group watch has listed the group),
    // as a load balancer behind a readiness probe would add it.
    let joined = wait_for(WITHIN, "node-4 ready", || {
        let address = replicas[3].address()?;
        replicas[3].output().contains("] ready:").then_some(address)
    });
    entries.lock().unwrap().push(joined);
    allowed.store(n, Ordering::SeqCst);
    wait_for(
        WITHIN,
        "node-1, node-3 and node-4 sharing the shards",
        || {
            let counts: Vec<Option<usize>> = [0, 2, 3].map(|i| replicas[i].shards()).into();
            let settled = counts
                .iter()
                .all(|c| c.is_some_and(|c| (21..=22).contains(&c)))
                && counts.iter().flatten().sum::<usize>() == SHARDS;
            settled.then_some(())
        },
    );
    let balanced_ns = now_ns();
    println!(
        "{name}: node-4 joined; the three replicas balanced {:.0} ms after its start ({} increments done)",
        (balanced_ns - join_ns) as f64 / 1e6,
        done.load(Ordering::SeqCst)
    );
    progress("every increment", n);
    let load_took = load_started.elapsed();
    let mut client = Client::default();
    for thread in threads {
        let done = thread.join().expect("a client thread panicked");
        client.redirects += done.redirects;
        client.unavailable += done.unavailable;
        client.unlisted += done.unlisted;
        client.unlisted_body = client.unlisted_body.or(done.unlisted_body);
        client.broken += done.broken;
        client.seen.extend(done.seen);
    }
    let end_ns = now_ns();
    let load_after = load_average();
    println!(
        "{name}: {n} increments over {ENTITIES} counters from {CLIENTS} threads in {load_took:?}: {} redirects followed, {} 503s retried ({} of them naming no shard: a replica not listing the group yet), {} broken connections retried; load average {load_after}",
        client.redirects, client.unavailable, client.unlisted, client.broken
    );
    if let Some(body) = &client.unlisted_body {
        println!("{name}:   a 503 naming no shard: {body}");
    }
    let windows = windows(&client.seen, end_ns);
    for (phase, from, to) in [
        ("start", start_ns, sigterm_ns),
        ("node-2 leaving", sigterm_ns, join_ns),
        ("node-4 joining", join_ns, end_ns),
    ] {
        let errors = (client.seen.iter())
            .filter(|s| !s.ok && (from..to).contains(&s.t_ns))
            .count();
        let started: Vec<_> = (windows.iter())
            .filter(|w| (from..to).contains(&w.1))
            .collect();
        let longest = started.iter().max_by_key(|w| w.2 - w.1);
        println!(
            "{name}:   {phase}: {errors} 503s in {} window(s) (per shard: from a 503 to its next 200), the longest {}",
            started.len(),
            longest.map_or("none".into(), |w| format!(
                "{:.0} ms (shard {})",
                (w.2 - w.1) as f64 / 1e6,
                w.0
            ))
        );
    }

    // Through the service: every counter equals what was sent to it.
    let expected = |e: usize| (0..n).filter(|&i| entity(i) == e).count() as u64;
    let mut reader = Client::default();
    for e in 0..ENTITIES {
        let answer = reader.send("GET", &entries, &format!("/counters/counter-{e}"));
        assert_eq!(answer.status, 200, "{}", answer.body);
        let json: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(
            json["count"].as_u64(),
            Some(expected(e)),
            "counter-{e} through the service"
        );
    }
    // The counts the increments of each counter made: exactly 1..=n.
    let results = results.lock().unwrap();
    for e in 0..ENTITIES {
        let mut counts = results.counts.get(&e).cloned().unwrap_or_default();
        counts.sort_unstable();
        assert_eq!(
            counts,
            (1..=expected(e)).collect::<Vec<_>>(),
            "counter-{e}: the counts its increments made"
        );
    }
    assert_eq!(results.resent, n.div_ceil(RESEND));
    println!(
        "{name}: {} increments resent on purpose, each answered from the record; {} retries of an increment already applied (its first answer lost) answered from the record",
        results.resent, results.retried_applied
    );

    // The store: every counter, and every increment id recorded once.
    let (applied_ids, events) = check_store(&store, n);
    println!(
        "{name}: store: {applied_ids} increment ids recorded once each; log: {} applied, {} answered from the record, {} refused by the fence, {} tenure change(s) seen by the writes",
        events.applied, events.duplicate, events.fenced, events.tenures
    );

    for replica in replicas.iter_mut().filter(|r| !r.exited) {
        replica.terminate();
    }
    println!(
        "{name}: done in {:?}; load average {}",
        started.elapsed(),
        load_average()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[derive(Default)]
struct LogCounts {
    applied: usize,
    duplicate: usize,
    fenced: usize,
    tenures: usize,
}

/// Reads the store's files and logs: each counter holds exactly the ids sent to it, and each
/// shard's applied tokens never fall and each token wrote from one node.
fn check_store(store: &Path, n: usize) -> (usize, LogCounts) {
    let mut ids: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut counts = LogCounts::default();
    let mut files = 0;
    for entry in std::fs::read_dir(store).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        if file.ends_with(".json") {
            files += 1;
            let record: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            for (entity, counter) in record["counters"].as_object().unwrap() {
                let applied = counter["applied"].as_object().unwrap();
                assert_eq!(
                    counter["count"].as_u64(),
                    Some(applied.len() as u64),
                    "{entity}: its count is the number of ids applied"
                );
                let set = ids.entry(entity.clone()).or_default();
                for id in applied.keys() {
                    assert!(set.insert(id.clone()), "{entity}: {id} recorded twice");
                }
            }
        } else if file.ends_with(".log.jsonl") {
            let (mut last_token, mut last_t) = (0u64, 0u128);
            let mut writers: HashMap<u64, String> = HashMap::new();
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let event: serde_json::Value = serde_json::from_str(line).unwrap();
                let token = event["token"].as_u64().unwrap();
                let t_ns = u128::from(event["t_ns"].as_u64().unwrap());
                assert!(t_ns >= last_t, "{file}: the log's times fall at {line}");
                last_t = t_ns;
                match event["event"].as_str().unwrap() {
                    "applied" => {
                        counts.applied += 1;
                        assert!(
                            token >= last_token,
                            "{file}: applied under token {token} after {last_token}: {line}"
                        );
                        if token > last_token && last_token > 0 {
                            counts.tenures += 1;
                        }
                        last_token = token;
                        let node = event["node"].as_str().unwrap().to_owned();
                        let writer = writers.entry(token).or_insert_with(|| node.clone());
                        assert_eq!(*writer, node, "{file}: token {token} wrote from two nodes");
                    }
                    "duplicate" => counts.duplicate += 1,
                    "fenced" => counts.fenced += 1,
                    other => panic!("{file}: unknown event {other}"),
                }
            }
        }
    }
    assert!(files > 0, "no shard file in the store");
    let mut total = 0;
    for e in 0..ENTITIES {
        let expected: BTreeSet<String> = (0..n)
            .filter(|&i| entity(i) == e)
            .map(|i| format!("i{i}"))
            .collect();
        let got = ids.remove(&format!("counter-{e}")).unwrap_or_default();
        assert_eq!(got, expected, "counter-{e}: the increment ids in the store");
        total += got.len();
    }
    assert!(ids.is_empty(), "counters nobody sent to: {:?}", ids.keys());
    assert_eq!(counts.applied, n, "one applied line per increment");
    (total, counts)
}

#[test]
fn ten_thousand_increments_through_a_leave_and_a_join_etcd() {
    run("etcd", etcd);
}

#[test]
fn ten_thousand_increments_through_a_leave_and_a_join_kubernetes() {
    run("kubernetes", kubernetes);
}
