//! Kubernetes test helpers: the test cluster's environment (written by `scripts/test-cluster.sh
//! up`), kube clients for it, and private kube-apiserver processes on the cluster's etcd that
//! tests may kill and restart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use actix_coordination::{KubernetesLease, KubernetesSettings, Lease};
use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use tokio::time::{sleep, timeout, Instant};

use super::proxy::FaultProxy;

/// The test cluster, from the environment `scripts/test-cluster.sh up` writes.
pub struct TestEnv {
    /// `https://127.0.0.1:PORT` of the cluster's kube-apiserver.
    pub url: String,
    /// The same as a socket address (for proxies).
    pub upstream: SocketAddr,
    /// The API server's certificate, to trust as CA.
    pub ca: PathBuf,
    /// Bearer token of `lease-holder`, bound only to the Role of deploy/rbac.yaml.
    pub token: String,
    /// Bearer token of a `system:masters` user.
    pub admin_token: String,
    /// Bearer token of a user without any Role.
    pub norole_token: String,
    /// The namespace the Role is bound in.
    pub namespace: String,
    /// The kube-apiserver binary, to start private instances.
    pub apiserver_bin: PathBuf,
    /// Every flag of the cluster's apiserver but `--secure-port`.
    pub apiserver_args: Vec<String>,
    /// The cluster's directory.
    pub dir: PathBuf,
}

/// The test cluster's environment (read once; a missing variable fails every test that needs it
/// with the same message).
pub fn env() -> &'static TestEnv {
    static ENV: std::sync::OnceLock<TestEnv> = std::sync::OnceLock::new();
    ENV.get_or_init(read_env)
}

fn read_env() -> TestEnv {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set. The Kubernetes tests need the test cluster: run them with \
                 `scripts/test-cluster.sh run -- cargo test --all-features` \
                 (or `scripts/test-cluster.sh up` and `. target/test-cluster/env` first)"
            )
        })
    };
    let url = var("ACTIX_COORD_TEST_K8S_URL");
    let upstream = url
        .strip_prefix("https://")
        .and_then(|a| a.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("ACTIX_COORD_TEST_K8S_URL={url} is not https://IP:PORT"));
    TestEnv {
        upstream,
        url,
        ca: var("ACTIX_COORD_TEST_K8S_CA").into(),
        token: var("ACTIX_COORD_TEST_K8S_TOKEN"),
        admin_token: var("ACTIX_COORD_TEST_K8S_ADMIN_TOKEN"),
        norole_token: var("ACTIX_COORD_TEST_K8S_NOROLE_TOKEN"),
        namespace: var("ACTIX_COORD_TEST_K8S_NAMESPACE"),
        apiserver_bin: var("ACTIX_COORD_TEST_KUBE_APISERVER_BIN").into(),
        apiserver_args: var("ACTIX_COORD_TEST_KUBE_APISERVER_ARGS")
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
        dir: var("ACTIX_COORD_TEST_DIR").into(),
    }
}

/// A kube client for `url` authenticated with `token`, trusting the test cluster's CA, without
/// retries.
pub fn client(url: &str, token: &str) -> kube::Client {
    let kubeconfig = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "test".into(),
            cluster: Some(Cluster {
                server: Some(url.to_owned()),
                certificate_authority: Some(env().ca.display().to_string()),
                ..Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "test".into(),
            auth_info: Some(AuthInfo {
                token: Some(token.to_owned().into()),
                ..AuthInfo::default()
            }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: "test".into(),
            context: Some(Context {
                cluster: "test".into(),
                user: Some("test".into()),
                namespace: Some(env().namespace.clone()),
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some("test".into()),
        ..Kubeconfig::default()
    };
    let mut config = kube::Config::try_from(kubeconfig).expect("kube config");
    config.default_retry = false;
    config.proxy_url = None;
    config.connect_timeout = Some(Duration::from_secs(5));
    actix_coordination::kubernetes_client(&config).expect("kube client")
}

/// A private kube-apiserver on the test cluster's etcd (same certificate, tokens and RBAC), on a
/// port of its own; killed with SIGKILL when dropped. Its output is appended to `log`.
pub struct ApiserverProcess {
    port: u16,
    child: Option<Child>,
    log: PathBuf,
}

impl ApiserverProcess {
    /// Starts the API server on `port` (without waiting: see [`ApiserverProcess::ready`]).
    pub fn start(port: u16, log: PathBuf) -> Self {
        let mut server = Self {
            port,
            child: None,
            log,
        };
        server.spawn();
        server
    }

    /// Starts the process (again) on the same port.
    pub fn spawn(&mut self) {
        assert!(
            self.child.is_none(),
            "the kube-apiserver is already running"
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("kube-apiserver log {}: {e}", self.log.display()));
        let child = Command::new(&env().apiserver_bin)
            .args(&env().apiserver_args)
            .arg(format!("--secure-port={}", self.port))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("kube-apiserver log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", env().apiserver_bin.display()));
        self.child = Some(child);
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the process, starts it again on the same port and waits until it is ready, or panics
    /// after `within`.
    pub async fn restart(&mut self, within: Duration) {
        self.kill();
        self.spawn();
        self.ready(Instant::now() + within).await;
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Waits until `/readyz` answers `ok`, or panics at `deadline` or when the process exits.
    pub async fn ready(&mut self, deadline: Instant) {
        let admin = client(&self.url(), &env().admin_token);
        loop {
            if let Some(status) = super::exit_status(&mut self.child) {
                panic!(
                    "the kube-apiserver on port {} exited with {status} (log: {})",
                    self.port,
                    self.log.display()
                );
            }
            let request = http::Request::get("/readyz").body(Vec::new()).unwrap();
            if let Ok(Ok(body)) = timeout(Duration::from_secs(2), admin.request_text(request)).await
            {
                if body.trim() == "ok" {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the kube-apiserver on port {} was not ready in time (log: {})",
                self.port,
                self.log.display()
            );
            sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for ApiserverProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Lease objects outlive a test run (they are never deleted), so every name carries a run id.
pub static RUN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    format!(
        "{:08x}",
        (nanos ^ u64::from(std::process::id()).rotate_left(32)) & 0xffff_ffff
    )
});

/// A lease name used by no other test of any run.
pub fn unique(base: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{base}-{}-{}",
        *RUN,
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// Settings of the test cluster's namespace, token of `lease-holder` and CA, for the API server
/// at `url` (the cluster's own, or a proxy in front of it).
pub fn settings_at(url: impl Into<String>) -> KubernetesSettings {
    KubernetesSettings::new(&env().namespace)
        .with_api_url(url.into())
        .with_token(&env().token)
        .with_ca_file(&env().ca)
}

/// Settings of leases that reach the API server through `proxy` with the test token.
pub fn through(proxy: &FaultProxy) -> KubernetesSettings {
    settings_at(format!("https://{}", proxy.addr()))
}

/// The established TCP connections to `peer` on this machine, from `/proc/self/net/tcp` and
/// `/proc/self/net/tcp6` (the kernel's table: hex `address:port` columns, state `01` =
/// ESTABLISHED). Only this test process connects to a proxy of its own, so these are its own
/// client-side connections (the proxy's accepted legs have `peer` as their *local* address).
pub fn established_connections_to(peer: SocketAddr) -> usize {
    fn parse(column: &str) -> Option<SocketAddr> {
        let (ip, port) = column.split_once(':')?;
        let port = u16::from_str_radix(port, 16).ok()?;
        // The kernel prints each 32-bit word of the address in host byte order.
        let mut bytes = Vec::new();
        for word in 0..ip.len() / 8 {
            let word = u32::from_str_radix(&ip[word * 8..word * 8 + 8], 16).ok()?;
            bytes.extend_from_slice(&word.to_ne_bytes());
        }
        let ip = match bytes.len() {
            4 => std::net::IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
            16 => {
                let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?);
                v6.to_ipv4_mapped()
                    .map(std::net::IpAddr::from)
                    .unwrap_or(v6.into())
            }
            _ => return None,
        };
        Some(SocketAddr::new(ip, port))
    }
    let mut count = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let columns: Vec<&str> = line.split_whitespace().collect();
            if columns.len() > 3 && columns[3] == "01" && parse(columns[2]) == Some(peer) {
                count += 1;
            }
        }
    }
    count
}

/// Acquires every lease at once and waits until the namespace watch of each is listed.
pub async fn acquire_all_and_watch(leases: &[KubernetesLease]) {
    let acquired = futures_util::future::join_all(leases.iter().map(|l| l.acquire())).await;
    for (lease, acquired) in leases.iter().zip(acquired) {
        assert!(acquired.unwrap(), "{} was free", lease.name());
    }
    timeout(Duration::from_secs(30), async {
        while leases.iter().any(|l| !l.backend().watching()) {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every lease watches its namespace");
}

/// Object `name` of `namespace` as the API server has it now (the admin's read); `None` when
/// there is none.
pub async fn admin_object(
    namespace: &str,
    name: &str,
) -> Option<k8s_openapi::api::coordination::v1::Lease> {
    let admin: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client(&env().url, &env().admin_token), namespace);
    admin.get_opt(name).await.expect("admin get")
}

/// The holder an object names (`None` for none or an empty one).
pub fn holder_of(lease: &k8s_openapi::api::coordination::v1::Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}
