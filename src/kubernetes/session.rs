//! [`KubernetesSession`]: one kube client per API server and credentials, shared by the leases
//! of a process (what is shared and why is documented on the type).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock, Mutex, OnceLock, Weak};

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
/// sessions) means a
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
/// # Shared sessions
///
/// [`KubernetesLease::new`](super::KubernetesLease::new) (and the backend's `new`) does not build
/// a session per lease: it takes the process's shared session for its settings
/// ([`KubernetesSession::shared`]). What is shared: everything above (client, connection, token
/// and CA re-reading, namespace watch). Keyed by: the whole [`KubernetesSettings`] (namespace, API
/// URL, token or token file, CA file), so leases with settings that differ in any field never
/// share. Until when: the process holds shared sessions weakly; one ends when its last lease (or
/// clone of it) is dropped, closing its connection and stopping its watches (the sessions'
/// threads stay, for the next session), and a later call with those settings builds a fresh one
/// (`a_shared_session_ends_with_its_last_lease`). A session built with [`KubernetesSession::new`]
/// is never shared that way: it is yours, with the leases you build from it.
///
/// The [`LeaseProvider`](crate::LeaseProvider) takes the same shared sessions for its leases
/// (`provider_shares_one_session_for_equal_sections`).
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
    /// `None` for a session on a ready client, and for the sessions of tests built from a bare
    /// configuration.
    settings: Option<KubernetesSettings>,
    namespace: String,
    /// `None` for a session on a ready client (its server is not known).
    cluster_url: Option<http::Uri>,
    client: Client,
    counters: Arc<HttpCounters>,
    hub: Arc<WatchHub>,
}

/// The shared sessions ([`KubernetesSession::shared`]) by settings, held weakly. One lock for
/// looking up and building, so two callers with equal settings never build two sessions, and a
/// session whose last user is going (its `Weak` no longer upgrades) is replaced, never revived.
static SHARED: LazyLock<Mutex<HashMap<KubernetesSettings, Weak<SessionInner>>>> =
    LazyLock::new(Mutex::default);

impl Drop for SessionInner {
    /// Removes the entry of an ended shared session, so that the process does not keep its
    /// settings (a token among them) after it. Never waits for the lock: if it is taken, the
    /// next [`KubernetesSession::shared`] forgets the entry.
    fn drop(&mut self) {
        let Some(settings) = &self.settings else {
            return;
        };
        let Ok(mut sessions) = SHARED.try_lock() else {
            return;
        };
        // Only an entry that no live session uses: equal settings may already have a new one.
        if sessions
            .get(settings)
            .is_some_and(|w| w.strong_count() == 0)
        {
            sessions.remove(settings);
        }
    }
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
    ///
    /// The session is yours: it is never handed to other callers, not even for equal settings
    /// (for that, see [`KubernetesSession::shared`]).
    pub fn new(settings: KubernetesSettings) -> Result<Self, KubernetesError> {
        let config = settings.kube_config()?;
        Self::build(Some(settings), &config)
    }

    /// The process's shared session for `settings`: the one that leases built with equal
    /// settings use now, or a new one when none lives (then built as [`KubernetesSession::new`]
    /// builds it, and kept for later callers).
    ///
    /// [`KubernetesLease::new`](super::KubernetesLease::new), the backend's
    /// [`new`](super::KubernetesBackend::new) and the [`LeaseProvider`](crate::LeaseProvider) take
    /// their session from here. The process holds these sessions **weakly**, by their
    /// [`KubernetesSettings`] (namespace, API URL, token or token file, CA file: settings equal
    /// in every field): a shared session ends when the last lease (or clone) using it is dropped,
    /// its connection is closed, and the next call for those settings builds a fresh one, reading
    /// the token and CA files again
    /// (`a_shared_session_ends_with_its_last_lease` in `tests/kubernetes_scale.rs`).
    ///
    /// Each lease keeps its own state all the same (its tenure, fencing token, what it observed
    /// of its object and when): sharing changes what the leases send through, not what they
    /// decide.
    ///
    /// # Errors
    ///
    /// As [`KubernetesSession::new`], when a new session is built; none when a live one is
    /// shared (its settings were validated and its files read when it was built).
    pub fn shared(settings: KubernetesSettings) -> Result<Self, KubernetesError> {
        let mut sessions = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        // Entries of sessions that ended and could not remove themselves; forget them. No
        // session is dropped under this lock: only the session returned is upgraded.
        sessions.retain(|_, weak| weak.strong_count() > 0);
        if let Some(inner) = sessions.get(&settings).and_then(Weak::upgrade) {
            return Ok(Self { inner });
        }
        let session = Self::new(settings.clone())?;
        sessions.insert(settings, Arc::downgrade(&session.inner));
        Ok(session)
    }

    /// A session on a ready `client` (for example built from a kubeconfig with
    /// [`kubernetes_client`](crate::kubernetes_client)), with its leases' objects in `namespace`:
    /// the way to choose which leases on such a client share one watch per namespace.
    ///
    /// [`KubernetesLease::with_client`](super::KubernetesLease::with_client) cannot share: a
    /// [`kube::Client`] has no identity to compare (two clones of one client cannot be told from
    /// two clients of different servers or credentials), so each such lease has a watch of its
    /// own. Leases built from this session ([`KubernetesSession::lease`],
    /// [`KubernetesLease::with_session`](super::KubernetesLease::with_session)) share the client
    /// and one namespace watch, which ends with the last of them
    /// (`leases_of_a_client_session_share_one_watch` in `tests/kubernetes_scale.rs`).
    ///
    /// Unlike a session built from settings, it runs where `client` runs: on the runtime the
    /// client was built on, and its watches on the runtime of the lease that first needs one (use
    /// it from a runtime that outlives its leases, with actix the system's). Its
    /// [`stats`](Self::stats) count the watch's requests only (the HTTP stack is the client's),
    /// and its leases skip the duplicate-instance check (its server is not known), as
    /// `with_client` leases do.
    ///
    /// # Errors
    ///
    /// [`KubernetesError::InvalidSettings`] when `namespace` is not a valid namespace name.
    pub fn from_client(
        client: Client,
        namespace: impl Into<String>,
    ) -> Result<Self, KubernetesError> {
        let namespace = namespace.into();
        super::settings::check_namespace(&namespace)?;
        let hub = Arc::new(WatchHub::new(client.clone(), None));
        Ok(Self {
            inner: Arc::new(SessionInner {
                settings: None,
                namespace,
                cluster_url: None,
                client,
                counters: Arc::default(),
                hub,
            }),
        })
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
                cluster_url: Some(config.cluster_url.clone()),
                settings,
                client,
                counters,
                hub,
            }),
        })
    }

    /// The settings of this session (`None` for one [on a ready client](Self::from_client)).
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

    pub(super) fn cluster_url(&self) -> Option<&http::Uri> {
        self.inner.cluster_url.as_ref()
    }

    #[cfg(test)]
    pub(super) fn downgrade(&self) -> Weak<SessionInner> {
        Arc::downgrade(&self.inner)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::KubernetesBackend;

    /// Settings of a server nothing listens on, with a token file and a CA file of their own
    /// (`tag` keeps them apart from other tests' settings).
    fn settings(tag: &str) -> KubernetesSettings {
        let dir = std::env::temp_dir().join(format!(
            "actix-coordination-k8s-sessions-{tag}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (token, ca) = (dir.join("token"), dir.join("ca.crt"));
        std::fs::write(&token, "abc").unwrap();
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nTUlJQg==\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        KubernetesSettings::new("ns")
            .with_api_url("http://127.0.0.1:1")
            .with_token_file(&token)
            .with_ca_file(&ca)
    }

    fn session_of(backend: &KubernetesBackend) -> &KubernetesSession {
        backend.session().expect("built from settings")
    }

    /// Backends built with equal settings get the same session while one of them lives, a new
    /// one after the last is gone (the process keeps none alive); other settings, and explicit
    /// sessions, are never shared.
    #[test]
    fn equal_settings_share_one_session_while_it_is_used() {
        let k8s = settings("share");
        let a = KubernetesBackend::new("a", &k8s).unwrap();
        let b = KubernetesBackend::new("b", &k8s).unwrap();
        assert_eq!(session_of(&a).session_id(), session_of(&b).session_id());
        let provider = KubernetesSession::shared(k8s.clone()).unwrap();
        assert_eq!(provider.session_id(), session_of(&a).session_id());
        drop(provider);

        let other_namespace = KubernetesSettings::new("other")
            .with_api_url(k8s.api_url())
            .with_token_file(k8s.token_file().unwrap())
            .with_ca_file(k8s.ca_file());
        let other = KubernetesBackend::new("a", &other_namespace).unwrap();
        assert_ne!(session_of(&other).session_id(), session_of(&a).session_id());
        let explicit = KubernetesSession::new(k8s.clone()).unwrap();
        assert_ne!(explicit.session_id(), session_of(&a).session_id());

        let ended = session_of(&a).downgrade();
        drop((a, b));
        assert!(
            ended.upgrade().is_none(),
            "the process keeps no shared session alive"
        );
        // Nor its settings (unless another test held the lock at that moment: then the entry is
        // left to the next `shared`, and must be dead).
        assert!(
            SHARED
                .lock()
                .unwrap()
                .get(&k8s)
                .is_none_or(|w| w.strong_count() == 0),
            "nor its settings"
        );
        let again = KubernetesBackend::new("a", &k8s).unwrap();
        // `ended` still holds the old allocation, so a new session cannot have its address.
        assert_ne!(session_of(&again).session_id(), ended.as_ptr() as usize);
        let and_again = KubernetesBackend::new("b", &k8s).unwrap();
        assert_eq!(
            session_of(&again).session_id(),
            session_of(&and_again).session_id()
        );
    }

    /// Threads asking at once for equal settings get one session (one lock for looking up and
    /// building).
    #[test]
    fn concurrent_callers_get_one_session() {
        const THREADS: usize = 8;
        let k8s = settings("concurrent");
        let barrier = std::sync::Barrier::new(THREADS);
        let backends: Vec<KubernetesBackend> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|i| {
                    let (k8s, barrier) = (&k8s, &barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        KubernetesBackend::new(&format!("n{i}"), k8s).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let first = session_of(&backends[0]).session_id();
        assert!(backends.iter().all(|b| session_of(b).session_id() == first));
    }
}
