//! Counters behind an actix-web service on three replicas: one group of 64 shards, an
//! [`EntityHost`] per shard running one counter actor per counter id, requests routed to the
//! shard's replica by [`ShardRouting`], and every increment written to a fenced store with the
//! shard's fencing token, applied at most once per increment id.
//!
//! ```text
//! # in memory (one process: three replicas on three ports, one lease store; the default):
//! cargo run --features web --example counters -- --demo 2000
//! # on Kubernetes or etcd, one replica per process (or pod), one store directory for all:
//! cargo run --all-features --example counters -- --config examples/kubernetes.toml --node node-1 --listen 127.0.0.1:8091 --store target/counters-store # or etcd.toml
//! cargo run --all-features --example counters -- --config examples/kubernetes.toml --node node-2 --listen 127.0.0.1:8092 --store target/counters-store # or etcd.toml
//! cargo run --all-features --example counters -- --config examples/kubernetes.toml --node node-3 --listen 127.0.0.1:8093 --store target/counters-store # or etcd.toml
//! ```
//!
//! Routes (each behind [`ShardRouting`], the counter id from the path):
//!
//! * `POST /counters/{id}/increment?increment=ID`: adds one to counter `id`, once per increment
//!   id: `ID` is chosen by the client, unique per increment, and sent again unchanged when the
//!   client retries. `200` with JSON `{"entity", "count", "applied", "shard", "token", "node"}`:
//!   `applied` is `false` when the increment id was applied before (the answer is the count it
//!   made then, read from the store's record: nothing is applied twice). `307` to the replica
//!   that runs the counter's shard (follow it: the method and the query are kept); `503` with
//!   `Retry-After` while the shard moves, or when the store refuses the write (a newer tenure of
//!   the shard wrote first).
//! * `GET /counters/{id}`: `{"entity", "count", "shard", "token", "node"}`, from the store.
//! * `GET /shards`: `{"node", "shards"}`: the shards this replica runs, with their tokens.
//! * `GET /readyz`: `200` once the replica's group watch has listed the group, `503` before
//!   (it routes nothing yet: send it no traffic; a replica says `ready` when it is).
//!
//! **The fenced store.** The counters live in a directory that every replica reaches (`--store`;
//! the in-memory demo uses a fresh one in the temporary directory): one JSON file per shard with
//! each counter, the increment ids applied to it (and the count each one made), and the highest
//! fencing token that wrote; a write whose token is lower than the stored one is refused. Each
//! file is locked (`flock`) for a read-modify-write, and every write appends a line to the
//! shard's log (`shard-N.log.jsonl`: the event, the shard, the token, the counter, the increment
//! id, the node, `CLOCK_MONOTONIC` nanoseconds) *before* it writes the file, which records how
//! much of the log it reflects: a process killed between the two leaves a line the next write of
//! the shard applies first (a write-ahead log), so the log and the counters never disagree (a
//! line cut short by a kill was never answered, and is dropped). It stands for your database: replace it with
//! yours, and pass the token (a conditional write, a column compared in the `UPDATE`'s `WHERE`,
//! a Kafka producer epoch). Tokens are comparable within one lease store only: give each
//! backend its own directory.
//!
//! **Under the tenure.** A request reaches a handler only on the replica that holds its shard's
//! tenure ([`RoutedShard`]); the handler checks the guard, and the counter actor checks it again
//! right before it writes, with the token the request was routed under (a request routed under
//! an older tenure of the shard is refused, not applied under the newer one). The write itself
//! carries the token: the store refuses a replica whose tenure ended while it wrote.
//!
//! `--demo N` (in memory) sends N increments over 16 counters to random replicas from four client
//! threads, following the redirects and retrying the `503`s with the same increment id; half-way
//! through, replica-2 shuts down gracefully and its shards move to the other two. It then sends
//! 100 of the increments again (answered from the record, not applied), checks every counter
//! against what was sent and the store's log, tries a write under a stale token (refused), prints
//! what it found, and exits (1 if a check failed). Without `--demo` the three replicas serve until ctrl-c.
//!
//! With `--config FILE` (a `CoordinationConfig`; `--config-key` picks its lease configuration,
//! default `sharded`) the process is one replica: `--node` names it (default `$POD_NAME`, then the
//! host name and process id), `--listen` is its address (default `0.0.0.0:8080`; port 0 picks one), `--advertise`
//! the URL the other replicas redirect to (default `$ACTIX_COORDINATION_ADDRESS`, else `http://`
//! and the address bound, `0.0.0.0` read as `127.0.0.1`), `--group` the group (default
//! `counters`), `--shards` its size (default 64). SIGTERM or ctrl-c hands its shards over (each
//! counter actor stops first), then stops the server. `$POD_NAMESPACE` replaces the namespace of
//! every `kubernetes` section. `tests/counter_processes.rs` runs three replicas on etcd and on
//! Kubernetes under 10,000 increments while one leaves and another joins.

use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_coordination::{
    member_lease_name, shard_for, CoordinationConfig, Entities, EntityError, EntityHost,
    EntityHosts, EntityId, FencingToken, GetShards, GracefulShutdown, Lease, LeaseProvider,
    LocateError, RoutedShard, ShardInfo, ShardRouting, ShardedSettings, ShardedWorkers,
    SharedLease, Shutdown, SingletonSettings, IN_MEMORY_BACKEND,
};
use actix_web::dev::Server;
use actix_web::{web, App, HttpResponse, HttpServer};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------------
// The fenced store: replace with your database; pass the token.
// ---------------------------------------------------------------------------------------------

/// A counter as the store keeps it.
#[derive(Default, Serialize, Deserialize)]
struct CounterRecord {
    count: u64,
    /// Every increment id applied to it, with the count it made.
    applied: BTreeMap<String, u64>,
}

/// One shard's file.
#[derive(Default, Serialize, Deserialize)]
struct ShardRecord {
    /// The highest fencing token that wrote to the shard.
    token: u64,
    counters: BTreeMap<String, CounterRecord>,
    /// How many bytes of the shard's log this record reflects: the lines after them were
    /// appended by a write that did not get to write this file, and are applied first.
    #[serde(default)]
    log_bytes: u64,
}

impl ShardRecord {
    /// Applies a line of the shard's log (what the write that appended it did to the record).
    fn redo(&mut self, line: &[u8]) -> std::io::Result<()> {
        let event: serde_json::Value = serde_json::from_slice(line)?;
        let field = |name: &str| event[name].as_u64().unwrap_or_default();
        match event["event"].as_str() {
            Some("applied") => {
                self.token = self.token.max(field("token"));
                let entity = event["entity"].as_str().unwrap_or_default();
                let increment = event["increment"].as_str().unwrap_or_default();
                let counter = self.counters.entry(entity.to_owned()).or_default();
                counter.count = field("count");
                counter.applied.insert(increment.to_owned(), field("count"));
            }
            Some("duplicate") => self.token = self.token.max(field("token")),
            _ => {} // refused by the fence: nothing changed
        }
        Ok(())
    }
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Applied: the counter's new count.
    Applied(u64),
    /// The increment id was applied before: the count it made then. Nothing changed.
    Duplicate(u64),
    /// Refused: the shard was written with a higher token (`stored`) than the writer's.
    Fenced { stored: u64 },
}

/// A directory every replica reaches: one file per shard, written under an exclusive lock, each
/// write refused when its fencing token is lower than the one stored.
#[derive(Clone)]
struct FencedStore {
    dir: PathBuf,
    node: Arc<str>,
}

impl FencedStore {
    fn open(dir: &Path, node: &str) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            node: node.into(),
        })
    }

    /// Runs `change` on shard `shard`'s record under the shard's lock, after the lines of the
    /// shard's log that the record does not reflect yet; appends the `log` line `change` gives
    /// to the log, then writes the record back (atomically: a new file renamed over the old).
    fn locked<T>(
        &self,
        shard: &str,
        change: impl FnOnce(&mut ShardRecord) -> (T, bool, String),
    ) -> std::io::Result<T> {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(format!("shard-{shard}.lock")))?;
        // SAFETY: flock(2) on a file descriptor this function owns; released when `lock` closes.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let path = self.dir.join(format!("shard-{shard}.json"));
        let mut record: ShardRecord = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ShardRecord::default(),
            Err(e) => return Err(e),
        };
        let mut log_file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(self.dir.join(format!("shard-{shard}.log.jsonl")))?;
        let redone = Self::redo_tail(&mut record, &mut log_file)?;
        let (answer, write, log) = change(&mut record);
        if !log.is_empty() {
            log_file.write_all(log.as_bytes())?;
            record.log_bytes += log.len() as u64;
        }
        if write || redone || !log.is_empty() {
            let temporary = self
                .dir
                .join(format!("shard-{shard}.json.{}", std::process::id()));
            std::fs::write(&temporary, serde_json::to_vec(&record)?)?;
            std::fs::rename(&temporary, &path)?;
        }
        drop(lock);
        Ok(answer)
    }

    /// Applies to `record` the lines of `log` after the ones it reflects, and drops a last line
    /// cut short (no newline: its write was killed while appending it, and never answered).
    /// Whether there were any.
    fn redo_tail(record: &mut ShardRecord, log: &mut std::fs::File) -> std::io::Result<bool> {
        use std::io::{Seek, SeekFrom};
        if log.metadata()?.len() <= record.log_bytes {
            return Ok(false);
        }
        let mut tail = Vec::new();
        log.seek(SeekFrom::Start(record.log_bytes))?;
        log.read_to_end(&mut tail)?;
        let complete = tail.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        for line in tail[..complete].split(|&b| b == b'\n') {
            if !line.is_empty() {
                record.redo(line)?;
            }
        }
        record.log_bytes += complete as u64;
        if complete < tail.len() {
            log.set_len(record.log_bytes)?;
        }
        Ok(true)
    }

    /// Adds one to `entity` of `shard` once per `increment` id, fenced by `token`.
    fn increment(
        &self,
        shard: &str,
        token: u64,
        entity: &str,
        increment: &str,
    ) -> std::io::Result<Outcome> {
        let node = self.node.clone();
        self.locked(shard, |record| {
            let line = |event: &str, count: u64, stored: u64| {
                format!(
                    "{{\"event\":\"{event}\",\"shard\":\"{shard}\",\"token\":{token},\"stored\":{stored},\"entity\":\"{entity}\",\"increment\":\"{increment}\",\"count\":{count},\"node\":\"{node}\",\"t_ns\":{}}}\n",
                    now_ns()
                )
            };
            if token < record.token {
                let stored = record.token;
                return (Outcome::Fenced { stored }, false, line("fenced", 0, stored));
            }
            let stored = record.token;
            record.token = token;
            let counter = record.counters.entry(entity.to_owned()).or_default();
            if let Some(&count) = counter.applied.get(increment) {
                // Answered from the record; the token may still rise (a new tenure's first
                // write), so the record is written when it did.
                return (
                    Outcome::Duplicate(count),
                    stored != token,
                    line("duplicate", count, stored),
                );
            }
            counter.count += 1;
            let count = counter.count;
            counter.applied.insert(increment.to_owned(), count);
            (Outcome::Applied(count), true, line("applied", count, stored))
        })
    }

    /// The count of `entity` of `shard`.
    fn read(&self, shard: &str, entity: &str) -> std::io::Result<u64> {
        self.locked(shard, |record| {
            let count = record.counters.get(entity).map_or(0, |c| c.count);
            (count, false, String::new())
        })
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process of the machine.
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

// ---------------------------------------------------------------------------------------------
// The counter entity.
// ---------------------------------------------------------------------------------------------

/// One counter: an entity of its shard's host, alive while the shard's tenure is. Its state is
/// the store's: a counter that moves with its shard starts from there on the next replica.
struct Counter {
    id: String,
    shard: ShardInfo,
    store: FencedStore,
}

impl Actor for Counter {
    type Context = Context<Self>;
}

/// Why a counter refused a message: the shard's tenure here is not the one the request was
/// routed under, or it ended.
#[derive(Debug)]
enum Refused {
    OtherTenure,
    TenureEnded,
    Store(std::io::Error),
}

/// Add one, once per increment id, under the tenure `token` the request was routed under.
#[derive(Message)]
#[rtype(result = "Result<Outcome, Refused>")]
struct Increment {
    id: String,
    token: FencingToken,
}

impl Handler<Increment> for Counter {
    type Result = Result<Outcome, Refused>;

    fn handle(&mut self, increment: Increment, _: &mut Context<Self>) -> Self::Result {
        if increment.token != self.shard.fencing_token {
            return Err(Refused::OtherTenure);
        }
        // Checked right before the write, which carries the token: the store refuses it if a
        // newer tenure has written meanwhile.
        if !self.shard.guard.check_alive() {
            return Err(Refused::TenureEnded);
        }
        let token = self.shard.fencing_token.value();
        (self.store)
            .increment(&self.shard.shard, token, &self.id, &increment.id)
            .map_err(Refused::Store)
    }
}

/// The counter's count.
#[derive(Message)]
#[rtype(result = "Result<u64, Refused>")]
struct GetCount;

impl Handler<GetCount> for Counter {
    type Result = Result<u64, Refused>;

    fn handle(&mut self, _: GetCount, _: &mut Context<Self>) -> Self::Result {
        if !self.shard.guard.check_alive() {
            return Err(Refused::TenureEnded);
        }
        (self.store)
            .read(&self.shard.shard, &self.id)
            .map_err(Refused::Store)
    }
}

// ---------------------------------------------------------------------------------------------
// The replica: the shard group, its entities and the HTTP routes.
// ---------------------------------------------------------------------------------------------

type Workers = Addr<ShardedWorkers<EntityHost<Counter>, SharedLease>>;

/// What the handlers share.
struct Replica {
    node: String,
    entities: Entities<Counter>,
    workers: Workers,
}

/// `503` with `Retry-After: 1`: the client retries (with the same increment id).
fn unavailable(why: impl std::fmt::Display) -> HttpResponse {
    HttpResponse::ServiceUnavailable()
        .insert_header(("retry-after", "1"))
        .body(why.to_string())
}

/// The answer to a counter's refusal or an entity error.
fn refused(error: Result<Refused, EntityError>) -> HttpResponse {
    match error {
        Ok(Refused::Store(e)) => HttpResponse::InternalServerError().body(format!("store: {e}")),
        Ok(refused) => unavailable(format!("the shard's tenure changed: {refused:?}")),
        Err(error @ EntityError::Locate { .. }) => {
            HttpResponse::InternalServerError().body(error.to_string())
        }
        // Moving, ended, stopped before it answered (a retry with the same id is safe), or
        // elsewhere since the request was routed.
        Err(error) => unavailable(error),
    }
}

#[derive(Deserialize)]
struct IncrementQuery {
    increment: String,
}

/// `POST /counters/{id}/increment?increment=ID`: runs only on the shard's replica.
async fn increment(
    routed: RoutedShard,
    id: web::Path<String>,
    query: web::Query<IncrementQuery>,
    replica: web::Data<Replica>,
) -> HttpResponse {
    if !routed.check_alive() {
        return unavailable("the shard's tenure ended");
    }
    let message = Increment {
        id: query.into_inner().increment,
        token: routed.fencing_token,
    };
    let (count, applied) = match replica.entities.send(&id, message).await {
        Ok(Ok(Outcome::Applied(count))) => (count, true),
        Ok(Ok(Outcome::Duplicate(count))) => (count, false),
        Ok(Ok(Outcome::Fenced { stored })) => {
            return unavailable(format!(
                "fenced: the store holds token {stored}, above this tenure's {}",
                routed.fencing_token.value()
            ))
        }
        Ok(Err(refusal)) => return refused(Ok(refusal)),
        Err(error) => return refused(Err(error)),
    };
    HttpResponse::Ok().json(serde_json::json!({
        "entity": id.as_str(),
        "count": count,
        "applied": applied,
        "shard": routed.shard,
        "token": routed.fencing_token.value(),
        "node": replica.node,
    }))
}

/// `GET /counters/{id}`.
async fn read(
    routed: RoutedShard,
    id: web::Path<String>,
    replica: web::Data<Replica>,
) -> HttpResponse {
    match replica.entities.send(&id, GetCount).await {
        Ok(Ok(count)) => HttpResponse::Ok().json(serde_json::json!({
            "entity": id.as_str(),
            "count": count,
            "shard": routed.shard,
            "token": routed.fencing_token.value(),
            "node": replica.node,
        })),
        Ok(Err(refusal)) => refused(Ok(refusal)),
        Err(error) => refused(Err(error)),
    }
}

/// Whether this replica's group watch has listed the group: before, it can route nothing (every
/// routed request is answered `503`).
fn listed(entities: &Entities<Counter>) -> bool {
    !matches!(
        entities.directory().locate_index(0),
        Err(LocateError::NotListed { .. })
    )
}

/// `GET /readyz`: `200` once the group watch has listed the group (send no traffic before).
async fn readyz(replica: web::Data<Replica>) -> HttpResponse {
    if listed(&replica.entities) {
        HttpResponse::Ok().body("ready")
    } else {
        unavailable("the group watch has not listed the group yet")
    }
}

/// `GET /shards`: the shards this replica runs.
async fn shards(replica: web::Data<Replica>) -> HttpResponse {
    let Ok(running) = replica.workers.send(GetShards).await else {
        return unavailable("the shard group stopped");
    };
    let shards: BTreeMap<String, u64> = running
        .into_iter()
        .map(|s| (s.shard, s.fencing_token.value()))
        .collect();
    HttpResponse::Ok().json(serde_json::json!({"node": replica.node, "shards": shards}))
}

/// What every replica of the group shares.
struct Group {
    provider: LeaseProvider,
    config_key: String,
    name: String,
    shards: usize,
}

/// Starts replica `node`: its shard group (advertising `advertise`) and its HTTP server on
/// `listener`; answers the server (not awaited yet), the group and its entities handle.
fn replica(
    group: &Group,
    node: &str,
    listener: std::net::TcpListener,
    advertise: &str,
    store: &FencedStore,
) -> Result<(Server, Workers, Entities<Counter>), Box<dyn std::error::Error>> {
    let hosts = EntityHosts::new();
    let store = FencedStore {
        node: node.into(),
        ..store.clone()
    };
    let workers = ShardedWorkers::from_provider(
        &group.provider,
        &group.config_key,
        group.name.as_str(),
        (0..group.shards).map(|i| i.to_string()),
        node,
        hosts.factory(move |id: &str, shard: &ShardInfo, _| Counter {
            id: id.to_owned(),
            shard: shard.clone(),
            store: store.clone(),
        }),
    )?;
    let (provider, key) = (group.provider.clone(), group.config_key.clone());
    let workers = workers.advertise(advertise, move |s| provider.lease_with_settings(&key, s))?;
    // Back off at most one TTL after errors: a replica waiting behind a long backoff would miss
    // a graceful handover.
    let member = member_lease_name(&group.name, node);
    let ttl = (group.provider)
        .get_lease(&member, &group.config_key, node)?
        .settings()
        .ttl();
    let workers = workers.settings(ShardedSettings {
        shard: SingletonSettings {
            max_error_backoff: ttl,
            ..Default::default()
        },
        ..Default::default()
    })?;
    let routing = ShardRouting::new(workers.directory(), EntityId::path("id"));
    let entities = hosts.entities(workers.directory());
    let workers = workers.start();
    let data = web::Data::new(Replica {
        node: node.to_owned(),
        entities: entities.clone(),
        workers: workers.clone(),
    });
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .service(
                web::resource("/counters/{id}/increment")
                    .wrap(routing.clone())
                    .route(web::post().to(increment)),
            )
            .service(
                web::resource("/counters/{id}")
                    .wrap(routing.clone())
                    .route(web::get().to(read)),
            )
            .route("/shards", web::get().to(shards))
            .route("/readyz", web::get().to(readyz))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(5)
    .listen(listener)?
    .run();
    Ok((server, workers, entities))
}

// ---------------------------------------------------------------------------------------------
// A small HTTP/1.1 client for the demo (keep-alive, follows redirects). Use yours.
// ---------------------------------------------------------------------------------------------

struct Answer {
    status: u16,
    location: Option<String>,
    body: String,
}

#[derive(Default)]
struct Client {
    connections: HashMap<String, BufReader<TcpStream>>,
    redirects: usize,
    unavailable: usize,
}

impl Client {
    /// One request to `authority` (`host:port`), on its kept-alive connection.
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
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            (self.connections).insert(authority.to_owned(), BufReader::new(stream));
        }
        let connection = self.connections.get_mut(authority).expect("inserted");
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
        let (mut length, mut location, mut close) = (0, None, false);
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
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }

    /// `method path` on one of `entries` (`host:port`, picked at random), following redirects,
    /// retrying `503`s and broken connections (on another entry, with a backoff from 20 ms to
    /// 1 s) for up to 30 s: the same request each time, which the increment id makes safe.
    fn send(&mut self, method: &str, entries: &[String], path: &str) -> Result<Answer, String> {
        let give_up = Instant::now() + Duration::from_secs(30);
        let entry = || entries[fastrand::usize(..entries.len())].clone();
        let (mut authority, mut path) = (entry(), path.to_owned());
        let mut backoff = Duration::from_millis(20);
        loop {
            match self.once(method, &authority, &path) {
                Ok(answer) if answer.status == 307 => {
                    let location = answer.location.ok_or("a redirect without a location")?;
                    let rest = location.strip_prefix("http://").ok_or("not http")?;
                    let (to, to_path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                    (authority, path) = (to.to_owned(), to_path.to_owned());
                    self.redirects += 1;
                    continue;
                }
                Ok(answer) if answer.status == 503 => self.unavailable += 1,
                Ok(answer) => return Ok(answer),
                // A replica that has shut down: try another.
                Err(_) => authority = entry(),
            }
            if Instant::now() >= give_up {
                return Err(format!("{method} {path}: no answer within 30 s"));
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Arguments, the in-memory demo and the cluster replica.
// ---------------------------------------------------------------------------------------------

struct Args {
    config: Option<PathBuf>,
    config_key: String,
    group: String,
    shards: usize,
    node: String,
    listen: String,
    advertise: Option<String>,
    store: Option<PathBuf>,
    demo: Option<usize>,
}

const USAGE: &str = "usage: counters [--demo N] | --config FILE [--config-key KEY] [--node NAME] [--listen ADDR] [--advertise URL] [--store DIR] [--group NAME] [--shards N]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        config: None,
        config_key: "sharded".into(),
        group: "counters".into(),
        shards: 64,
        node: std::env::var("POD_NAME").unwrap_or_else(|_| {
            let host = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "host".into());
            format!("{}-{}", host.trim(), std::process::id())
        }),
        listen: "0.0.0.0:8080".into(),
        advertise: std::env::var("ACTIX_COORDINATION_ADDRESS").ok(),
        store: None,
        demo: None,
    };
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = || words.next().ok_or(format!("{word} needs a value"));
        let number = |v: String| v.parse().map_err(|e| format!("{word}: {e}"));
        match word.as_str() {
            "--config" => args.config = Some(value()?.into()),
            "--config-key" => args.config_key = value()?,
            "--group" => args.group = value()?,
            "--shards" => args.shards = number(value()?)?,
            "--node" => args.node = value()?,
            "--listen" => args.listen = value()?,
            "--advertise" => args.advertise = Some(value()?),
            "--store" => args.store = Some(value()?.into()),
            "--demo" => args.demo = Some(number(value()?)?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.config.is_some() && args.demo.is_some() {
        return Err("--demo runs in memory: give no --config".into());
    }
    Ok(args)
}

fn main() -> std::process::ExitCode {
    let run = parse_args()
        .map_err(|e| format!("{e}\n{USAGE}").into())
        .and_then(|args| {
            // In memory, the demo's own lines and the library's warnings; a replica logs more.
            let default = match args.config {
                None => "actix_coordination=warn",
                Some(_) => "actix_coordination=info",
            };
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| default.into()),
                )
                .with_ansi(false)
                .with_writer(std::io::stderr)
                .init();
            System::new().block_on(run(args))
        });
    match run {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(error) => {
            let mut message = format!("error: {error}");
            let mut source = error.source();
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("{message}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<bool, Box<dyn std::error::Error>> {
    match &args.config {
        Some(path) => {
            let mut config: CoordinationConfig = toml::from_str(&std::fs::read_to_string(path)?)?;
            if let Ok(namespace) = std::env::var("POD_NAMESPACE") {
                for lease in config.leases.values_mut() {
                    if let Some(serde_json::Value::Object(section)) =
                        lease.rest.get_mut("kubernetes")
                    {
                        section.insert("namespace".into(), namespace.clone().into());
                    }
                }
            }
            cluster_replica(&args, LeaseProvider::new(config)).await?;
            Ok(true)
        }
        None => in_memory(&args).await,
    }
}

/// One replica of a fleet on etcd or Kubernetes, until SIGTERM or ctrl-c.
async fn cluster_replica(
    args: &Args,
    provider: LeaseProvider,
) -> Result<(), Box<dyn std::error::Error>> {
    let group = Group {
        provider,
        config_key: args.config_key.clone(),
        name: args.group.clone(),
        shards: args.shards,
    };
    let store_dir = (args.store.clone()).unwrap_or_else(|| PathBuf::from("target/counters-store"));
    let store = FencedStore::open(&store_dir, &args.node)?;
    let listener = std::net::TcpListener::bind(&args.listen)?;
    // The address bound (port 0 picks one), `0.0.0.0` read as `127.0.0.1`.
    let bound = listener.local_addr()?.to_string();
    let advertise = (args.advertise.clone())
        .unwrap_or_else(|| format!("http://{}", bound.replace("0.0.0.0", "127.0.0.1")));
    let (server, workers, entities) = replica(&group, &args.node, listener, &advertise, &store)?;
    println!(
        "[{}] serving counters of group {:?} ({} shards) on {bound} as {advertise}, store {}",
        args.node,
        args.group,
        args.shards,
        store_dir.display()
    );
    // Ready once the group watch has listed the group (`/readyz` answers 200 from then on).
    let node = args.node.clone();
    actix_rt::spawn(async move {
        while !listed(&entities) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("[{node}] ready: the group watch has listed the group");
    });
    let (node, report) = (args.node.clone(), workers.clone());
    actix_rt::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(2));
        let mut last = None;
        loop {
            every.tick().await;
            let Ok(running) = report.send(GetShards).await else {
                break;
            };
            if last != Some(running.len()) {
                println!("[{node}] runs {} shard(s)", running.len());
                last = Some(running.len());
            }
        }
    });
    GracefulShutdown::new()
        .manager(args.group.clone(), workers)
        .run(server)
        .await?;
    println!("[{}] shut down", args.node);
    Ok(())
}

/// Three replicas in this process on one in-memory lease store; with `--demo N`, the demo.
async fn in_memory(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let config: CoordinationConfig = toml::from_str(&format!(
        "[leases.{}]\nbackend = \"{IN_MEMORY_BACKEND}\"\nttl = \"3s\"\nrenewal-interval = \"1s\"\n",
        args.config_key
    ))?;
    let group = Group {
        provider: LeaseProvider::new(config),
        config_key: args.config_key.clone(),
        name: args.group.clone(),
        shards: args.shards,
    };
    let (store_dir, temporary) = match &args.store {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!("counters-{}", std::process::id())),
            true,
        ),
    };
    let store = FencedStore::open(&store_dir, "")?;
    let mut replicas = Vec::new();
    for i in 1..=3 {
        let node = format!("replica-{i}");
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?.to_string();
        let (server, workers, _) = replica(
            &group,
            &node,
            listener,
            &format!("http://{address}"),
            &store,
        )?;
        println!("[{node}] serving on http://{address}");
        replicas.push((
            node,
            address,
            server.handle(),
            workers,
            actix_rt::spawn(server),
        ));
    }
    let ok = match args.demo {
        Some(n) => demo(n, args.shards, &mut replicas, &store_dir).await?,
        None => {
            println!(
                "three replicas of group {:?}: ctrl-c stops them",
                args.group
            );
            tokio::signal::ctrl_c().await?;
            true
        }
    };
    for (node, _, handle, workers, running) in replicas {
        let released = workers.send(Shutdown).await.ok().and_then(Result::ok);
        handle.stop(true).await;
        let _ = running.await;
        println!(
            "[{node}] shut down (released every lease: {})",
            released == Some(true)
        );
    }
    if temporary {
        std::fs::remove_dir_all(&store_dir)?;
    }
    Ok(ok)
}

type Served = (
    String,
    String,
    actix_web::dev::ServerHandle,
    Workers,
    actix_rt::task::JoinHandle<std::io::Result<()>>,
);

const DEMO_COUNTERS: usize = 16;
const DEMO_THREADS: usize = 4;
const DEMO_RESENT: usize = 100;

/// `n` increments from client threads while replica-2 shuts down half-way; then the checks.
async fn demo(
    n: usize,
    shards: usize,
    replicas: &mut Vec<Served>,
    store_dir: &Path,
) -> Result<bool, Box<dyn std::error::Error>> {
    let addresses: Vec<String> = replicas.iter().map(|r| r.1.clone()).collect();
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..DEMO_THREADS)
        .map(|_| {
            let (addresses, next, done) = (addresses.clone(), next.clone(), done.clone());
            std::thread::spawn(move || -> Result<Client, String> {
                let mut client = Client::default();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= n {
                        return Ok(client);
                    }
                    let path = format!("/counters/c{}/increment?increment=i{i}", i % DEMO_COUNTERS);
                    let answer = client.send("POST", &addresses, &path)?;
                    if answer.status != 200 {
                        return Err(format!("{path}: {} {}", answer.status, answer.body));
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    // Half-way: replica-2 shuts down gracefully (its counters stop, its shards are handed over),
    // then its server stops.
    while done.load(Ordering::SeqCst) < n / 2 && clients.iter().any(|c| !c.is_finished()) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (node, _, handle, workers, running) = replicas.remove(1);
    let before = workers.send(GetShards).await?.len();
    let released = workers.send(Shutdown).await??;
    handle.stop(true).await;
    running.await??;
    println!(
        "[{node}] shut down after {} increments: its {before} shard(s) handed over (released every lease: {released})",
        done.load(Ordering::SeqCst)
    );
    // Joined once finished: a blocking join would stop this thread's replicas too.
    while clients.iter().any(|c| !c.is_finished()) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut client = Client::default();
    for thread in clients {
        let thread = thread.join().map_err(|_| "a client thread panicked")??;
        client.redirects += thread.redirects;
        client.unavailable += thread.unavailable;
    }
    let elapsed = started.elapsed();
    println!(
        "demo: {n} increments of {DEMO_COUNTERS} counters sent to 3 replicas in {:.1} s ({} redirects followed, {} 503s retried)",
        elapsed.as_secs_f64(),
        client.redirects,
        client.unavailable
    );
    // The checks send requests too: from a thread of their own, as the clients did.
    let live: Vec<String> = replicas.iter().map(|r| r.1.clone()).collect();
    let mut ok = off_thread(move || check_counters(n, &live, &mut client)).await??;
    // Each shard's log: tokens never fall, and nothing was applied under a lower token.
    let (mut moved, mut falls) = (0, 0);
    for entry in std::fs::read_dir(store_dir)? {
        let path = entry?.path();
        if !path.to_string_lossy().ends_with(".log.jsonl") {
            continue;
        }
        let mut last = 0;
        for line in std::fs::read_to_string(&path)?.lines() {
            let event: serde_json::Value = serde_json::from_str(line)?;
            let token = event["token"].as_u64().unwrap_or(0);
            if event["event"] == "applied" {
                if token < last {
                    falls += 1;
                }
                if last != 0 && token > last {
                    moved += 1;
                }
                last = last.max(token);
            }
        }
    }
    println!("checked: the store's logs show each shard's fencing tokens rising only ({moved} tenure change(s) seen by the writes, {falls} write(s) under a lower token)");
    ok &= falls == 0;
    // The fence: a write under a lower token than the stored one (a replica whose tenure ended
    // while it wrote, or that was frozen past its deadline) is refused.
    let stale = FencedStore::open(store_dir, "stale-writer")?;
    let shard = shard_for("c0", shards).to_string();
    let stored = stale.locked(&shard, |record| (record.token, false, String::new()))?;
    let refused = stale.increment(&shard, stored - 1, "c0", "stale-write")?;
    println!("checked: a write to shard {shard} under token {} (the store holds {stored}) was answered {refused:?}", stored - 1);
    ok &= refused == Outcome::Fenced { stored };
    println!("the demo is over");
    Ok(ok)
}

/// Runs `f` on a thread of its own and waits for it without blocking this thread's replicas.
async fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Box<dyn std::error::Error>> {
    let thread = std::thread::spawn(f);
    while !thread.is_finished() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(thread.join().map_err(|_| "a client thread panicked")?)
}

/// Sends some increments again (each must be answered from the record) and reads every counter
/// (each must equal the increments sent to it); answers whether both held.
fn check_counters(n: usize, live: &[String], client: &mut Client) -> Result<bool, String> {
    // The same increment ids again: answered from the record.
    let mut again = 0;
    for i in (0..n).step_by((n / DEMO_RESENT).max(1)).take(DEMO_RESENT) {
        let path = format!("/counters/c{}/increment?increment=i{i}", i % DEMO_COUNTERS);
        let answer = client.send("POST", live, &path)?;
        let json: serde_json::Value =
            serde_json::from_str(&answer.body).map_err(|e| e.to_string())?;
        if json["applied"] == false {
            again += 1;
        }
    }
    let resent = n.min(DEMO_RESENT);
    println!("checked: {again} of {resent} increments sent again were answered from the record, not applied again");
    let mut ok = again == resent;
    // Every counter equals the increments sent to it.
    let mut total = 0;
    let mut wrong = Vec::new();
    for c in 0..DEMO_COUNTERS {
        let expected = (0..n).filter(|i| i % DEMO_COUNTERS == c).count() as u64;
        let answer = client.send("GET", live, &format!("/counters/c{c}"))?;
        let json: serde_json::Value =
            serde_json::from_str(&answer.body).map_err(|e| e.to_string())?;
        let count = json["count"].as_u64().unwrap_or(0);
        total += count;
        if count != expected {
            wrong.push(format!("c{c}: {count}, sent {expected}"));
        }
    }
    if wrong.is_empty() {
        println!("checked: every counter equals the increments sent to it ({total} in all): none lost, none applied twice");
    } else {
        println!("WRONG counters: {}", wrong.join(", "));
        ok = false;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(name: &str) -> (FencedStore, PathBuf) {
        let dir = std::env::temp_dir().join(format!("counters-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (FencedStore::open(&dir, "a").unwrap(), dir)
    }

    fn applied_lines(dir: &Path, increment: &str) -> usize {
        let log = std::fs::read_to_string(dir.join("shard-0.log.jsonl")).unwrap();
        log.lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .filter(|e| e["event"] == "applied" && e["increment"] == increment)
            .count()
    }

    /// A write killed after it appended its log line and before it wrote the shard's file: the
    /// next write applies the line first, so the retried increment is answered from the record
    /// (one `applied` line, the count it made), and the log and the file agree. Written the
    /// other way round (the file first, as before), the retry applied the increment twice.
    #[test]
    fn a_write_killed_between_its_log_line_and_its_file_is_applied_from_the_log() {
        let (store, dir) = store("killed");
        assert_eq!(
            store.increment("0", 1, "c", "i1").unwrap(),
            Outcome::Applied(1)
        );
        let file = dir.join("shard-0.json");
        let before = std::fs::read(&file).unwrap();
        assert_eq!(
            store.increment("0", 1, "c", "i2").unwrap(),
            Outcome::Applied(2)
        );
        // The kill: the file as it was before the write, its log line written.
        std::fs::write(&file, before).unwrap();
        assert_eq!(
            store.increment("0", 1, "c", "i2").unwrap(),
            Outcome::Duplicate(2)
        );
        assert_eq!(
            store.increment("0", 1, "c", "i3").unwrap(),
            Outcome::Applied(3)
        );
        assert_eq!(store.read("0", "c").unwrap(), 3);
        assert_eq!(applied_lines(&dir, "i2"), 1, "i2 applied once");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A line cut short by a kill while it was appended (never answered) is dropped: the next
    /// write's line starts on a line of its own, and every line of the log parses.
    #[test]
    fn a_log_line_cut_short_is_dropped() {
        let (store, dir) = store("cut");
        assert_eq!(
            store.increment("0", 1, "c", "i1").unwrap(),
            Outcome::Applied(1)
        );
        let log = dir.join("shard-0.log.jsonl");
        OpenOptions::new()
            .append(true)
            .open(&log)
            .unwrap()
            .write_all(b"{\"event\":\"applied\",\"sha")
            .unwrap();
        assert_eq!(
            store.increment("0", 1, "c", "i2").unwrap(),
            Outcome::Applied(2)
        );
        assert_eq!(applied_lines(&dir, "i2"), 1);
        assert_eq!(applied_lines(&dir, "i1"), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
