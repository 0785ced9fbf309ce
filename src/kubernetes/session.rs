//! [`KubernetesSession`]: one kube client per API server and credentials, shared by the leases
//! of a process (what is shared and why is documented on the type).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use kube::Client;
use tokio::runtime::Handle;

use super::client::{session_client, HttpCounters};
use super::watch::{KubernetesWatchStats, WatchHub};
use super::{KubernetesBackend, KubernetesError, KubernetesLease, KubernetesSettings};
use crate::managed::ManagedLease;
use crate::settings::LeaseSettings;

/// A kube client for one API server and one set of credentials, shared by many leases; clones
/// share it.
///
/// # What is shared, and why
///
/// A client per lease (what every [`KubernetesLease`](super::KubernetesLease) had before
/// sessions, and what [`KubernetesLease::new`](super::KubernetesLease::new) still builds) means a
/// connection pool, TLS configuration and token and CA re-reading per lease, and, over HTTP/1.1, a
/// TCP connection for every request in flight and every open watch. A process holding N leases then
/// kept more than N connections to the API server (400 for 200 leases, measured once with
/// `one_session_keeps_two_connections_for_200_leases` in `tests/kubernetes.rs` on a client per
/// lease) and each connection its TLS state (BENCHMARKS.md measured 56–67 KB per lease).
///
/// A session owns **one** client for one API server and one set of credentials (token or token
/// file, CA file); every lease built from it ([`KubernetesSession::lease`],
/// [`KubernetesLease::with_session`](super::KubernetesLease::with_session)) and every clone of
/// it uses that client. What comes with it:
///
/// * **One connection.** The client offers HTTP/2 (ALPN `h2`, HTTP/1.1 as the fallback), which the
///   API server speaks over TLS, so all requests and watches of the session are streams of one TCP
///   connection (with `TCP_NODELAY`, kept alive with HTTP/2 pings): a session holding 200 leases
///   keeps at most 2 connections to the API server
///   (`one_session_keeps_two_connections_for_200_leases`), and
///   [`KubernetesSessionStats::http2_responses`] shows the protocol in use
///   (`http2_is_negotiated_with_the_real_apiserver`).
/// * **One token and CA re-reading.** A token file is re-read about once a minute and the CA file
///   about once a minute, once per session rather than once per lease
///   (`rotated_token_and_ca_files_are_picked_up`).
/// * **Its own threads.** The client's connections, its request buffer, its namespace watches and
///   every request run on a small runtime shared by all Kubernetes sessions of the process (two
///   worker threads, named `actix-coordination-kubernetes`, started with the first session: TLS
///   and decoding for thousands of leases are not confined to one core), so they do not depend on
///   the runtime or actix arbiter that happens to use the session first: an arbiter that stops
///   does not take the connection of other arbiters' leases with it. A session can be created
///   outside any runtime (`the_session_outlives_the_runtime_that_used_it_first`).
/// * **One watch per namespace.** Every lease of the session in a namespace learns of its object
///   from one watch on the namespace's `Lease` objects (see [`KubernetesLease`](super::KubernetesLease),
///   "One watch per namespace"); [`KubernetesSessionStats::watch`] counts its requests.
///
/// Each lease keeps its own state (what it observed of its object, its tenure).
///
/// **HTTP/2's stream limit.** An API server accepts a bounded number of concurrent streams per
/// connection (250 by default in kube-apiserver); requests beyond it would wait for a stream, a
/// renewal stuck behind others. The client puts at most 200 requests (an open watch counts for
/// its whole life) on one connection and opens another for the next 200 (`a_connection_carries_at_most_200_requests` in
/// `src/kubernetes/client.rs`). A request that fails or is given up (an operation timeout) moves
/// later requests to a new connection, as HTTP/1.1 did: on a shared connection a lost answer
/// usually means the connection is bad.
///
/// The [`LeaseProvider`](crate::LeaseProvider) shares one session among the leases whose
/// `kubernetes` sections are equal (`provider_shares_one_session_for_equal_sections`), for as
/// long as one of them lives.
///
/// # Example
///
/// ```no_run
/// use actix_coordination::{KubernetesSession, KubernetesSettings, Lease, LeaseSettings};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let session = KubernetesSession::new(KubernetesSettings::from_env()?)?;
/// let owner = KubernetesSettings::owner_from_env()?;
/// let mut leases = Vec::new();
/// for shard in 0..100 {
///     let lease = session.lease(LeaseSettings::new(format!("shard-{shard}"), owner.as_str())?);
///     lease.acquire().await?; // all over one HTTP/2 connection
///     leases.push(lease);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct KubernetesSession {
    inner: Arc<SessionInner>,
}

pub(super) struct SessionInner {
    /// `None` for the sessions of tests built from a bare configuration.
    settings: Option<KubernetesSettings>,
    namespace: String,
    cluster_url: http::Uri,
    client: Client,
    counters: Arc<HttpCounters>,
    hub: Arc<WatchHub>,
}

/// What a [`KubernetesSession`]'s HTTP stack counted so far (for cost checks and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KubernetesSessionStats {
    /// TCP connections opened to the API server (one while the connection stays up, against an
    /// API server that speaks HTTP/2).
    pub connections: u64,
    /// Responses received over HTTP/2.
    pub http2_responses: u64,
    /// Responses received over HTTP/1.x (an API server or proxy that refused `h2`).
    pub http1_responses: u64,
    /// The requests of the session's namespace watch (one for all its leases).
    pub watch: KubernetesWatchStats,
}

impl fmt::Debug for KubernetesSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The settings redact the token; the client is not printed (it holds the credentials).
        f.debug_struct("KubernetesSession")
            .field("settings", &self.inner.settings)
            .field("namespace", &self.inner.namespace)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl KubernetesSession {
    /// A session on the API server described by `settings`, with leases in its namespace.
    ///
    /// The settings are validated, the token and CA files read once, and the client built now
    /// (on the sessions' own thread, so no runtime is needed); nothing is sent to the API server
    /// before the first lease request, and the connection is opened then.
    ///
    /// # Errors
    ///
    /// [`KubernetesError::InvalidSettings`], [`KubernetesError::ReadFile`] or
    /// [`KubernetesError::Config`] when `settings` are unusable,
    /// [`KubernetesError::BuildClient`] when the TLS configuration cannot be built, and
    /// [`KubernetesError::Runtime`] when the sessions' thread cannot be started.
    pub fn new(settings: KubernetesSettings) -> Result<Self, KubernetesError> {
        let config = settings.kube_config()?;
        Self::build(Some(settings), &config)
    }

    /// A session on a ready kube configuration (tests of this crate).
    #[cfg(test)]
    pub(super) fn from_config(config: &kube::Config) -> Result<Self, KubernetesError> {
        Self::build(None, config)
    }

    fn build(
        settings: Option<KubernetesSettings>,
        config: &kube::Config,
    ) -> Result<Self, KubernetesError> {
        let runtime = runtime()?;
        let counters = Arc::new(HttpCounters::default());
        let client = session_client(config, runtime, Arc::clone(&counters))?;
        let hub = Arc::new(WatchHub::new(client.clone(), Some(runtime.clone())));
        Ok(Self {
            inner: Arc::new(SessionInner {
                namespace: config.default_namespace.clone(),
                cluster_url: config.cluster_url.clone(),
                settings,
                client,
                counters,
                hub,
            }),
        })
    }

    /// The settings of this session (`None` only for sessions of this crate's own tests).
    pub fn settings(&self) -> Option<&KubernetesSettings> {
        self.inner.settings.as_ref()
    }

    /// The namespace of the `Lease` objects of this session's leases.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// A lease with `settings` on this session (same as
    /// [`KubernetesLease::with_session`](super::KubernetesLease::with_session)). Nothing is sent
    /// before the first `acquire`.
    pub fn lease(&self, settings: LeaseSettings) -> KubernetesLease {
        KubernetesLease::with_session(settings, self)
    }

    /// The session's kube client (clones share its connection), for requests of your own.
    pub fn client(&self) -> Client {
        self.inner.client.clone()
    }

    /// What the session's HTTP stack counted so far.
    pub fn stats(&self) -> KubernetesSessionStats {
        let c = &self.inner.counters;
        KubernetesSessionStats {
            connections: c.connections.load(Ordering::Relaxed),
            http2_responses: c.http2_responses.load(Ordering::Relaxed),
            http1_responses: c.http1_responses.load(Ordering::Relaxed),
            watch: self.inner.hub.counters.stats(),
        }
    }

    /// An identity of the shared session: equal for clones, different for two sessions (for
    /// tests of the provider's sharing).
    #[doc(hidden)]
    pub fn session_id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    pub(super) fn hub(&self) -> &Arc<WatchHub> {
        &self.inner.hub
    }

    pub(super) fn cluster_url(&self) -> &http::Uri {
        &self.inner.cluster_url
    }

    pub(super) fn downgrade(&self) -> std::sync::Weak<SessionInner> {
        Arc::downgrade(&self.inner)
    }

    pub(super) fn upgrade(weak: &std::sync::Weak<SessionInner>) -> Option<Self> {
        weak.upgrade().map(|inner| Self { inner })
    }
}

impl ManagedLease<KubernetesBackend> {
    /// A lease with `settings` on `session`: it uses the session's client (and connection), with
    /// its object in the session's namespace. Nothing is sent before the first `acquire`.
    pub fn with_session(settings: LeaseSettings, session: &KubernetesSession) -> Self {
        let backend = KubernetesBackend::with_session(settings.name(), session);
        ManagedLease::from_backend(settings, backend)
    }
}

/// The runtime of every Kubernetes session of the process: two worker threads, started with the
/// first session, running for as long as the process.
fn runtime() -> Result<&'static Handle, KubernetesError> {
    static RUNTIME: OnceLock<Result<Handle, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let (handle_tx, handle_rx) = std::sync::mpsc::sync_channel(1);
            std::thread::Builder::new()
                .name("actix-coordination-kubernetes".into())
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .thread_name("actix-coordination-kubernetes")
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(error) => {
                            let _ = handle_tx.send(Err(error.to_string()));
                            return;
                        }
                    };
                    let _ = handle_tx.send(Ok(runtime.handle().clone()));
                    // Runs the sessions' tasks for as long as the process.
                    runtime.block_on(std::future::pending::<()>());
                })
                .map_err(|e| e.to_string())
                .and_then(|_| handle_rx.recv().map_err(|e| e.to_string())?)
        })
        .as_ref()
        .map_err(|reason| KubernetesError::Runtime {
            reason: reason.clone(),
        })
}
