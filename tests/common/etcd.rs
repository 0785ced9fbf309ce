//! etcd test helpers: the contract fixture (one fault proxy and one session per owner), a direct
//! admin client, and private etcd processes that tests may stop, kill and restart.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_coordination::{EtcdLease, EtcdSession, EtcdSettings, LeaseSettings};
use tokio::time::{sleep, Instant};

use super::contract::Fixture;
use super::proxy::{FaultProxy, ProxyMode};

/// The etcd the tests use, from `ACTIX_COORD_TEST_ETCD_ENDPOINT`; panics with instructions if unset.
pub fn endpoint() -> String {
    std::env::var("ACTIX_COORD_TEST_ETCD_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "ACTIX_COORD_TEST_ETCD_ENDPOINT is not set: the etcd tests need a real etcd. Run them \
             with `scripts/test-cluster.sh run -- cargo test --features etcd --test etcd`, or \
             `scripts/test-cluster.sh up` and `source target/test-cluster/env` first"
        )
    })
}

/// The etcd binary for private instances, from `ACTIX_COORD_TEST_ETCD_BIN`.
pub fn etcd_bin() -> String {
    std::env::var("ACTIX_COORD_TEST_ETCD_BIN").unwrap_or_else(|_| {
        panic!(
            "ACTIX_COORD_TEST_ETCD_BIN is not set (the etcd binary, e.g. /usr/bin/etcd): run the \
             tests through scripts/test-cluster.sh, or source target/test-cluster/env"
        )
    })
}

/// `host:port` of an `http://host:port` endpoint.
pub fn socket_addr(endpoint: &str) -> SocketAddr {
    let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
    authority
        .parse()
        .unwrap_or_else(|e| panic!("etcd endpoint {endpoint:?} is not http://ip:port: {e}"))
}

/// A key prefix no other test run uses.
pub fn unique_prefix(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "/actix-coordination-test/{test}/{}-{nanos}-{}/",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A client straight to `endpoint` (no proxy), for inspecting and meddling with the store.
pub async fn admin_client(endpoint: &str) -> etcd_client::Client {
    etcd_client::Client::connect(
        [endpoint],
        Some(etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(5))),
    )
    .await
    .expect("admin etcd client")
}

/// The keep-alive messages etcd at `endpoint` received so far, on every lease keep-alive stream
/// of every client: `grpc_server_msg_received_total{grpc_method="LeaseKeepAlive"}` from its
/// `/metrics` (served on the client URL; plain HTTP/1.0, no client library needed).
pub async fn keep_alives_received(endpoint: &str) -> u64 {
    messages_received(endpoint, "LeaseKeepAlive").await
}

/// The gRPC messages of `method` (`Txn`, `Range`, `Put`, `LeaseKeepAlive`, ...) etcd at
/// `endpoint` received so far, from every client: `grpc_server_msg_received_total` from its
/// `/metrics`.
pub async fn messages_received(endpoint: &str, method: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(authority).await?;
        stream
            .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes())
            .await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        Ok::<_, std::io::Error>(body)
    };
    let body = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .unwrap_or_else(|_| panic!("GET {endpoint}/metrics timed out"))
        .unwrap_or_else(|e| panic!("GET {endpoint}/metrics: {e}"));
    let method = format!("grpc_method=\"{method}\"");
    let total: f64 = body
        .lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        .filter(|l| l.contains(method.as_str()))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .sum();
    assert!(
        body.contains("grpc_server_msg_received_total"),
        "etcd's /metrics has no grpc_server_msg_received_total: {}",
        &body[..body.len().min(500)]
    );
    total as u64
}

/// Session settings for `endpoint` under `prefix`.
pub fn etcd_settings(endpoint: &str, prefix: &str) -> EtcdSettings {
    EtcdSettings::builder([endpoint])
        .prefix(prefix)
        .connect_timeout(Duration::from_secs(3))
        .build()
        .expect("valid etcd settings")
}

/// The TTL of the contract suite's leases.
pub const CONTRACT_TTL: Duration = Duration::from_secs(3);

struct Owner {
    proxy: FaultProxy,
    session: EtcdSession,
}

/// The contract fixture: every owner reaches etcd through its own [`FaultProxy`] with its own
/// [`EtcdSession`]; all share one key prefix unique to the fixture.
pub struct EtcdFixture {
    upstream: SocketAddr,
    prefix: String,
    owners: tokio::sync::Mutex<HashMap<String, Arc<Owner>>>,
}

impl EtcdFixture {
    pub fn new() -> Self {
        Self {
            upstream: socket_addr(&endpoint()),
            prefix: unique_prefix("contract"),
            owners: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    async fn owner(&self, owner: &str) -> Arc<Owner> {
        let mut owners = self.owners.lock().await;
        if let Some(o) = owners.get(owner) {
            return Arc::clone(o);
        }
        let proxy = FaultProxy::start(self.upstream).await;
        let session = EtcdSession::new(etcd_settings(
            &format!("http://{}", proxy.addr()),
            &self.prefix,
        ));
        let o = Arc::new(Owner { proxy, session });
        owners.insert(owner.to_owned(), Arc::clone(&o));
        o
    }
}

impl Default for EtcdFixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture for EtcdFixture {
    type Lease = EtcdLease;

    fn settings(&self, name: &str, owner: &str) -> LeaseSettings {
        LeaseSettings::builder(name, owner)
            .ttl(CONTRACT_TTL)
            .build()
            .unwrap()
    }

    async fn lease(&self, settings: LeaseSettings) -> EtcdLease {
        let owner = self.owner(settings.owner()).await;
        EtcdLease::new(settings, &owner.session)
    }

    async fn partition(&self, owner: &str) {
        self.owner(owner).await.proxy.set_mode(ProxyMode::Reset);
    }

    async fn pause(&self, owner: &str) {
        self.owner(owner).await.proxy.set_mode(ProxyMode::Blackhole);
    }

    async fn heal(&self, owner: &str) {
        self.owner(owner).await.proxy.set_mode(ProxyMode::Pass);
    }

    async fn slow_answers(&self, owner: &str, delay: Duration) {
        self.owner(owner)
            .await
            .proxy
            .set_mode(ProxyMode::SlowAnswers(delay));
    }

    async fn sent_by(&self, owner: &str) -> u64 {
        self.owner(owner).await.proxy.bytes_up()
    }

    fn paused_clock(&self) -> bool {
        false
    }

    fn slack(&self) -> Duration {
        // etcd revokes expired leases every 500 ms; a loaded 2-core machine adds scheduling delay.
        Duration::from_millis(1500)
    }

    fn unique_name(&self, base: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        format!("{base}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A private etcd process on free loopback ports with its own data directory; killed on drop.
pub struct EtcdProcess {
    bin: String,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    /// `--name` and `--initial-cluster` (a member of a private cluster, or alone).
    name: String,
    initial_cluster: String,
    child: Option<Child>,
}

impl EtcdProcess {
    /// Starts etcd and waits until it answers (within 30 s). Its ports are reserved for the
    /// process ([`free_loopback_ports`](super::free_loopback_ports)); should a process that does
    /// not reserve its ports take one first anyway (etcd exits: "address already in use"), it
    /// starts again on other ports, twice at most.
    pub async fn start(test: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let bin = etcd_bin();
        let dir = std::env::temp_dir().join(format!(
            "actix-coord-etcd-{test}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create etcd dir");
        let [client_port, peer_port] = super::free_loopback_ports();
        let mut etcd = Self {
            bin,
            dir,
            client_port,
            peer_port,
            name: "test".into(),
            initial_cluster: format!("test=http://127.0.0.1:{peer_port}"),
            child: None,
        };
        for attempt in 1.. {
            etcd.spawn();
            match etcd.ready_or_exited(Duration::from_secs(30)).await {
                Ok(()) => break,
                Err(exited) if attempt < 3 && exited.contains("address already in use") => {
                    let [client_port, peer_port] = super::free_loopback_ports();
                    etcd.client_port = client_port;
                    etcd.peer_port = peer_port;
                    etcd.initial_cluster = format!("test=http://127.0.0.1:{peer_port}");
                    let _ = std::fs::remove_dir_all(etcd.dir.join("data"));
                }
                Err(exited) => panic!("{exited}"),
            }
        }
        etcd
    }

    /// Starts a private cluster of `n` members (`m0`, `m1`, ...) and waits until every member
    /// answers (which needs an elected leader), within 60 s.
    pub async fn cluster(test: &str, n: usize) -> Vec<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let bin = etcd_bin();
        let base = std::env::temp_dir().join(format!(
            "actix-coord-etcd-cluster-{test}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&base);
        let ports: Vec<[u16; 2]> = (0..n).map(|_| super::free_loopback_ports()).collect();
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, [_, peer])| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<Self> = ports
            .iter()
            .enumerate()
            .map(|(i, &[client_port, peer_port])| {
                let dir = base.join(format!("m{i}"));
                std::fs::create_dir_all(&dir).expect("create etcd dir");
                Self {
                    bin: bin.clone(),
                    dir,
                    client_port,
                    peer_port,
                    name: format!("m{i}"),
                    initial_cluster: initial_cluster.clone(),
                    child: None,
                }
            })
            .collect();
        for member in &mut members {
            member.spawn();
        }
        for member in &mut members {
            member.wait_ready(Duration::from_secs(60)).await;
        }
        members
    }

    /// The index of the current leader among `members`: asks each running member once for its
    /// own id and the leader it follows, and returns the member whose id is named as leader.
    pub async fn leader(members: &[Self]) -> Option<usize> {
        let mut ids = Vec::new();
        let mut named = None;
        for (i, member) in members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.child.is_some())
        {
            let status = async {
                let mut client = etcd_client::Client::connect([member.endpoint()], None)
                    .await
                    .ok()?;
                client.status().await.ok()
            };
            if let Ok(Some(status)) = tokio::time::timeout(Duration::from_secs(2), status).await {
                ids.push((i, status.header().map(|h| h.member_id())));
                if status.leader() != 0 {
                    named = Some(status.leader());
                }
            }
        }
        let leader = named?;
        ids.into_iter()
            .find(|(_, id)| *id == Some(leader))
            .map(|(i, _)| i)
    }

    /// Whether the process runs (not killed).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Resumes a frozen etcd (SIGCONT).
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    /// Starts a killed etcd again (same ports, data directory and flags) and waits until it
    /// answers.
    pub async fn start_again(&mut self) {
        self.spawn();
        self.wait_ready(Duration::from_secs(60)).await;
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .expect("etcd log");
        let child = Command::new(&self.bin)
            .arg(format!("--name={}", self.name))
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!("--listen-client-urls={}", self.endpoint()))
            .arg(format!("--advertise-client-urls={}", self.endpoint()))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin));
        self.child = Some(child);
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("etcd running").id()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// Freezes etcd (SIGSTOP): connections stay open, nothing answers.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// Kills etcd (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data directory, and waits until it answers.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn();
        self.wait_ready(Duration::from_secs(30)).await;
    }

    async fn wait_ready(&mut self, within: Duration) {
        if let Err(exited) = self.ready_or_exited(within).await {
            panic!("{exited}");
        }
    }

    /// Waits until etcd answers; `Err` (with its log) if it exits first. Panics if it neither
    /// answers nor exits `within`.
    async fn ready_or_exited(&mut self, within: Duration) -> Result<(), String> {
        let give_up = Instant::now() + within;
        loop {
            if let Some(status) = super::exit_status(&mut self.child) {
                self.child = None;
                return Err(format!(
                    "etcd at {} exited with {status} before it was ready; log: {}",
                    self.endpoint(),
                    self.log_tail()
                ));
            }
            let ready = async {
                let mut client = etcd_client::Client::connect([self.endpoint()], None)
                    .await
                    .ok()?;
                client.get("ready-probe", None).await.ok()
            };
            if tokio::time::timeout(Duration::from_secs(2), ready)
                .await
                .ok()
                .flatten()
                .is_some()
            {
                return Ok(());
            }
            assert!(
                Instant::now() < give_up,
                "etcd at {} not ready within {within:?}; log: {}",
                self.endpoint(),
                self.log_tail()
            );
            sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_ref() {
            // A frozen process must be thawed to die promptly on some kernels; SIGKILL works anyway.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
