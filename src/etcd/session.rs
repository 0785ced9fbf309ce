//! [`EtcdSession`]: one etcd client per cluster, with the etcd leases shared by the leases of a
//! process and their keep-alive loops.
//!
//! # Shared etcd leases ("grants")
//!
//! The session keeps at most one *current* grant per TTL (in whole seconds). Claiming a lease
//! registers a user on the current grant (granting a new etcd lease when there is none, or when
//! the current one is lost or has little validity left) before the claim's transaction; the user
//! stays registered for the whole tenure. Each grant has one task that keeps it alive:
//!
//! * **one clock per grant**: the loop sends one keep-alive per renewal interval (the shortest of
//!   its users'), one interval after the previous one was *sent*, and publishes when the next is
//!   due. Renewals never ask for a keep-alive of their own: a renewal takes the latest successful
//!   keep-alive unless one is in flight or due by the time the renewal started, and then waits
//!   for it. The renewal reports the instant that keep-alive was *sent*, and the lease plans its
//!   next renewal one interval after it (see [`ManagedLease`](crate::ManagedLease)), which is
//!   when the loop sends the next one: every lease of the grant renews on the grant's clock, and
//!   the process sends one keep-alive per renewal interval and TTL whatever the number of leases
//!   and however late their runtime is. One keep-alive stream carries them; a failure is
//!   recorded (renewals started before it wait for the retry, later ones report it) and retried
//!   with a backoff;
//! * a keep-alive answered with TTL 0, or no successful keep-alive for a whole TTL, marks the grant
//!   lost: every user's watch fires and new claims use a new grant;
//! * without users it lingers for one renewal interval (contenders retry soon, and reuse it), then
//!   leaves the session and revokes the etcd lease, unless the key of a dropped (crashed) tenure is
//!   still attached to it: that key must expire on its own, so the lease is left to expire.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, LeaseClient, LeaseKeepAliveStream, LeaseKeeper};
use tokio::runtime::Handle;
use tokio::sync::{watch, Notify, OnceCell};
use tokio::time::{sleep_until, timeout, Instant};
use tracing::Instrument;

use super::batch::{Batches, WriteSession};
use super::group::{GroupFeeds, GroupSource};
use super::watch::{WatchHandle, WatchHub};
use super::{observe, EtcdError, EtcdSettings, ETCD_BACKEND};
use crate::group::{GroupError, GroupWatch};
use crate::managed::ManagedLease;
use crate::metrics;
use crate::settings::LeaseSettings;

/// HTTP/2 pings detect a dead connection (etcd refuses pings more often than every 5 s).
const HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// First delay before retrying a failed keep-alive; doubles up to a quarter of the interval.
const KEEP_ALIVE_BACKOFF_START: Duration = Duration::from_millis(100);
/// Bound on the best-effort revocation of an unused etcd lease.
const REVOKE_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to one etcd cluster, shared by many leases; clones share it.
///
/// It owns the etcd client (connected lazily on first use, or eagerly with
/// [`EtcdSession::connect`]), the etcd leases shared by all leases of the session that have the
/// same TTL with their keep-alive loops, and one multiplexed watch stream. See the
/// [`EtcdLease`](super::EtcdLease) documentation for what is shared and why.
///
/// # Its own thread
///
/// The client's connections, the keep-alive loops, the watch stream and the clean-up of claims
/// run on a small runtime of the session's own (one thread, named `actix-coordination-etcd`),
/// started when the session is created and stopped when its last clone is dropped. They
/// therefore do not depend on the runtime or actix arbiter that happens to use the session first:
/// an arbiter (or an actix-web worker) that stops does not take the keep-alives of other
/// arbiters' leases with it. Requests themselves are sent from the caller's task.
#[derive(Clone)]
pub struct EtcdSession {
    pub(super) inner: Arc<SessionInner>,
}

pub(super) struct SessionInner {
    settings: EtcdSettings,
    client: OnceCell<Client>,
    runtime: SessionRuntime,
    hub: OnceLock<WatchHub>,
    /// One feed per group prefix, shared by every group watch of that prefix.
    groups: GroupFeeds,
    /// The current grant per TTL (in whole seconds), and one gate per TTL that lets one grant
    /// request at a time go out. Never held across an await.
    grants: Mutex<Grants>,
    next_user: AtomicU64,
    /// Keep-alive requests sent for the session's shared etcd leases.
    keep_alives: AtomicU64,
    /// Grant requests sent.
    grants_requested: AtomicU64,
    /// The test hook suspended watches before the hub started.
    suspend_on_start: std::sync::atomic::AtomicBool,
    /// The handovers waiting to be written together (see `batch.rs`).
    batches: Batches,
}

#[derive(Default)]
struct Grants {
    current: HashMap<i64, Arc<Grant>>,
    granting: HashMap<i64, Arc<tokio::sync::Mutex<()>>>,
}

/// The session's own runtime: a thread that runs it until the session is dropped.
struct SessionRuntime {
    /// Why there is none: the thread could not be started.
    handle: Result<Handle, String>,
    /// Dropping it ends the thread (its runtime drops every task still on it).
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl SessionRuntime {
    fn start() -> Self {
        let (handle_tx, handle_rx) = std::sync::mpsc::sync_channel(1);
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("actix-coordination-etcd".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = handle_tx.send(Err(error));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(runtime.handle().clone()));
                // Runs the session's tasks until the session is dropped.
                let _ = runtime.block_on(shutdown_rx);
                runtime.shutdown_background();
            });
        let handle = spawned.map_err(|e| e.to_string()).and_then(|_| {
            handle_rx
                .recv()
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        });
        if let Err(error) = &handle {
            tracing::error!(%error, "could not start the etcd session's thread; the session cannot connect");
        }
        Self {
            handle,
            _shutdown: shutdown,
        }
    }
}

impl fmt::Debug for EtcdSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSession")
            .field("settings", &self.inner.settings)
            .field("connected", &self.inner.client.initialized())
            .finish()
    }
}

impl EtcdSession {
    /// A session for the cluster of `settings`; it connects on first use. It starts the
    /// session's own thread (see above) at once.
    pub fn new(settings: EtcdSettings) -> Self {
        Self {
            inner: Arc::new(SessionInner {
                settings,
                client: OnceCell::new(),
                runtime: SessionRuntime::start(),
                hub: OnceLock::new(),
                groups: GroupFeeds::default(),
                grants: Mutex::new(Grants::default()),
                next_user: AtomicU64::new(0),
                keep_alives: AtomicU64::new(0),
                grants_requested: AtomicU64::new(0),
                suspend_on_start: std::sync::atomic::AtomicBool::new(false),
                batches: Batches::default(),
            }),
        }
    }

    /// A session for the cluster of `settings`, connected now: it authenticates (when credentials
    /// are set) and reads the key prefix once, so that an unreachable cluster, wrong credentials or
    /// a missing permission show up here rather than at the first `acquire`.
    ///
    /// # Errors
    ///
    /// [`EtcdError`]: [`Unavailable`](EtcdError::Unavailable) or
    /// [`Timeout`](EtcdError::Timeout) when etcd cannot be reached within the connect timeout,
    /// [`Unauthenticated`](EtcdError::Unauthenticated) or
    /// [`PermissionDenied`](EtcdError::PermissionDenied) for credential problems.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is written to etcd.
    pub async fn connect(settings: EtcdSettings) -> Result<Self, EtcdError> {
        let session = Self::new(settings);
        let mut kv = session.inner.client().await?.kv_client();
        let prefix = session.inner.settings.prefix().to_owned();
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        let connect_timeout = session.inner.settings.connect_timeout();
        match timeout(connect_timeout, kv.get(prefix, Some(options))).await {
            Ok(Ok(_)) => Ok(session),
            Ok(Err(e)) => Err(EtcdError::from_client("connect", 0, e)),
            Err(_) => Err(EtcdError::Timeout {
                operation: "connect",
                timeout: connect_timeout,
            }),
        }
    }

    /// The settings of this session.
    pub fn settings(&self) -> &EtcdSettings {
        &self.inner.settings
    }

    /// A lease with `settings` on this session (same as [`EtcdLease::new`](crate::EtcdLease)).
    pub fn lease(&self, settings: LeaseSettings) -> ManagedLease<super::EtcdBackend> {
        ManagedLease::<super::EtcdBackend>::new(settings, self)
    }

    /// How many keep-alive requests the session sent so far, for all its shared etcd leases
    /// together (for cost checks and tests): about one per renewal interval per TTL in use,
    /// however many leases the session holds.
    pub fn keep_alives_sent(&self) -> u64 {
        self.inner.keep_alives.load(Ordering::Relaxed)
    }

    /// How many transactions the session sent that wrote several keys at once (handovers and
    /// claims sent together, see [`EtcdLease`](super::EtcdLease), "Writes sent together"), for
    /// cost checks and tests: a node handing `n` shards on as it leaves sends about
    /// `n / 128 + 1` of them, and no handover of its own.
    pub fn write_batches_sent(&self) -> u64 {
        self.inner.batches.sent() as u64
    }

    /// How many etcd leases the session asked etcd to grant so far (for cost checks and tests):
    /// one per TTL in use while something is held or claimed, none for contenders that only find
    /// their lease held.
    pub fn grants_requested(&self) -> u64 {
        self.inner.grants_requested.load(Ordering::Relaxed)
    }

    /// The etcd lease ids new claims of this session would use now, one per TTL in use (for
    /// diagnostics and tests); no request is sent.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn shared_lease_ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .inner
            .lock_grants()
            .current
            .values()
            .map(|g| g.id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Test hook: while `suspended`, the session's watch stream is broken and no watch can be
    /// opened, as if etcd could not be reached for watches while everything else works.
    #[doc(hidden)]
    pub fn suspend_watches_for_tests(&self, suspended: bool) {
        if let Some(hub) = self.inner.hub.get() {
            hub.suspend(suspended);
        } else if suspended {
            self.inner.suspend_on_start.store(true, Ordering::Relaxed);
        }
    }
}

impl SessionInner {
    /// The client, connecting first if needed (on the session's runtime, which then runs the
    /// client's connections).
    pub(super) async fn client(&self) -> Result<Client, EtcdError> {
        let client = self
            .client
            .get_or_try_init(|| {
                let connecting = self
                    .runtime()
                    .map(|runtime| runtime.spawn(connect_client(self.settings.clone())));
                async move {
                    connecting?.await.unwrap_or_else(|e| {
                        Err(EtcdError::SessionStopped {
                            message: e.to_string(),
                        })
                    })
                }
            })
            .await?;
        Ok(client.clone())
    }

    /// The client if it is connected already.
    pub(super) fn connected_client(&self) -> Option<Client> {
        self.client.get().cloned()
    }

    fn lock_grants(&self) -> MutexGuard<'_, Grants> {
        self.grants.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A watch of the group of leases whose names start with `group`: a new subscriber of the
    /// session's feed of that group, or a new feed on the session's runtime (see
    /// [`super::group`]).
    pub(super) fn watch_group(self: &Arc<Self>, group: &str) -> Result<GroupWatch, GroupError> {
        let runtime = self
            .runtime()
            .map_err(|error| GroupError::Backend(Arc::new(Box::new(error))))?;
        let source: Weak<Self> = Arc::downgrade(self);
        self.groups.watch(
            runtime,
            source,
            group,
            self.settings.key(group),
            self.settings.prefix().len(),
        )
    }

    /// A wait for `key` to leave the version written at `key_revision`, on a group watch of
    /// this session that holds the key (see [`GroupFeeds::wait_for_key`]).
    pub(super) fn wait_for_key(
        &self,
        key: &[u8],
        key_revision: i64,
    ) -> Option<impl std::future::Future<Output = Option<super::group::KeyChange>> + Send + 'static>
    {
        self.groups.wait_for_key(key, key_revision)
    }

    /// The etcd lease `owner` was last seen holding a key with, by any group watch of this
    /// session (`None` when none saw it).
    pub(super) fn holder_lease(&self, owner: &str) -> Option<i64> {
        self.groups.holders().lease_of(owner)
    }

    /// The session's runtime.
    fn runtime(&self) -> Result<&Handle, EtcdError> {
        self.runtime
            .handle
            .as_ref()
            .map_err(|message| EtcdError::SessionStopped {
                message: message.clone(),
            })
    }

    /// Runs `future` on the session's runtime (it cannot be missing once connected: the client
    /// is connected on it).
    pub(super) fn spawn<F>(&self, future: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        WriteSession::try_spawn(self, future);
    }

    /// Watches `key` over the session's shared watch stream.
    pub(super) async fn watch(
        &self,
        key: Vec<u8>,
        start_revision: i64,
        deletes_only: bool,
    ) -> Result<WatchHandle, EtcdError> {
        Ok(self.hub().await?.watch(key, start_revision, deletes_only))
    }

    /// The session's watch hub, started on first use.
    async fn hub(&self) -> Result<&WatchHub, EtcdError> {
        let client = self.client().await?;
        let runtime = self.runtime()?;
        Ok(self.hub.get_or_init(|| {
            let hub = WatchHub::start(
                runtime,
                client.watch_client(),
                self.settings.connect_timeout(),
            );
            if self.suspend_on_start.load(Ordering::Relaxed) {
                hub.suspend(true);
            }
            hub
        }))
    }

    /// Whether a claim with `settings.ttl()` would find a usable etcd lease to attach to (no
    /// request is sent).
    pub(super) fn has_usable_grant(&self, settings: &LeaseSettings) -> bool {
        let ttl_secs = etcd_ttl_secs(settings.ttl());
        self.lock_grants()
            .current
            .get(&ttl_secs)
            .is_some_and(|g| g.usable(Instant::now()))
    }

    /// Registers a user on the current grant for `settings.ttl()`, granting a new etcd lease if
    /// there is no usable one.
    ///
    /// No request is sent while the session's map of grants is locked: one grant request per TTL
    /// is in flight at a time (behind a gate of that TTL), and registrations on usable grants of
    /// any TTL never wait for it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an etcd lease granted for a cancelled call has no key and expires by its TTL.
    pub(super) async fn register(
        self: &Arc<Self>,
        client: &Client,
        settings: &LeaseSettings,
    ) -> Result<Registration, EtcdError> {
        let ttl_secs = etcd_ttl_secs(settings.ttl());
        let timing = Timing {
            interval: settings.renewal_interval(),
            timeout: settings.operation_timeout(),
        };
        let user = self.next_user.fetch_add(1, Ordering::Relaxed);
        if let Some(registration) = self.register_on_usable(ttl_secs, user, timing) {
            return Ok(registration);
        }
        let gate = Arc::clone(self.lock_grants().granting.entry(ttl_secs).or_default());
        let _one_grant_at_a_time = gate.lock().await;
        // Someone else may have granted while this call waited at the gate.
        if let Some(registration) = self.register_on_usable(ttl_secs, user, timing) {
            return Ok(registration);
        }
        let mut lease_client = client.lease_client();
        let sent = Instant::now();
        self.grants_requested.fetch_add(1, Ordering::Relaxed);
        let response = observe("lease_grant", lease_client.grant(ttl_secs, None).await)
            .map_err(|e| EtcdError::from_client("grant an etcd lease", 0, e))?;
        let id = response.id();
        if response.ttl() < ttl_secs {
            let _ = timeout(REVOKE_TIMEOUT, lease_client.revoke(id)).await;
            return Err(EtcdError::UnexpectedResponse {
                operation: "grant an etcd lease",
                detail: format!(
                    "asked for a ttl of {ttl_secs} s, etcd granted {} s",
                    response.ttl()
                ),
            });
        }
        if response.ttl() > ttl_secs {
            tracing::warn!(lease_id = %format_args!("{id:x}"), requested = ttl_secs, granted = response.ttl(), "etcd granted a longer ttl than requested (its minimum ttl): contenders wait longer");
        }
        let ttl = Duration::from_secs(response.ttl().unsigned_abs());
        let grant = Arc::new(Grant::new(id, ttl, sent));
        let registration = {
            let mut grants = self.lock_grants();
            // A lost or stale grant keeps its remaining users; new claims use this one.
            let registration = Grant::register(&grant, user, timing);
            grants.current.insert(ttl_secs, Arc::clone(&grant));
            registration
        };
        tracing::debug!(lease_id = %format_args!("{id:x}"), ttl_secs, "granted a shared etcd lease");
        let span = tracing::debug_span!("etcd_keep_alive", lease_id = %format_args!("{id:x}"));
        self.spawn(
            keep_alive_loop(Arc::downgrade(self), grant, ttl_secs, lease_client).instrument(span),
        );
        Ok(registration)
    }

    /// Registers `user` on the current grant of `ttl_secs` if it is usable.
    fn register_on_usable(&self, ttl_secs: i64, user: u64, timing: Timing) -> Option<Registration> {
        // Registration happens under the map lock: `close_if_unused` relies on it.
        let grants = self.lock_grants();
        let grant = grants.current.get(&ttl_secs)?;
        grant
            .usable(Instant::now())
            .then(|| Grant::register(grant, user, timing))
    }
}

impl WriteSession for SessionInner {
    fn batches(&self) -> &Batches {
        &self.batches
    }

    fn try_spawn<F>(&self, future: F) -> bool
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        match self.runtime() {
            Ok(runtime) => {
                runtime.spawn(future);
                true
            }
            Err(_) => false,
        }
    }
}

impl GroupSource for SessionInner {
    async fn client(&self) -> Result<Client, EtcdError> {
        SessionInner::client(self).await
    }

    fn io_timeout(&self) -> Duration {
        self.settings.connect_timeout()
    }

    async fn watch_prefix(
        &self,
        prefix: Vec<u8>,
        start_revision: i64,
    ) -> Result<WatchHandle, EtcdError> {
        Ok(self.hub().await?.watch_prefix(prefix, start_revision))
    }
}

async fn connect_client(settings: EtcdSettings) -> Result<Client, EtcdError> {
    let connect_timeout = settings.connect_timeout();
    let mut options = ConnectOptions::new()
        .with_connect_timeout(connect_timeout)
        .with_keep_alive(HTTP2_KEEP_ALIVE_INTERVAL, HTTP2_KEEP_ALIVE_TIMEOUT)
        .with_keep_alive_while_idle(false)
        .with_require_leader(true);
    if let Some((user, password)) = settings.credentials() {
        options = options
            .with_user(user, password)
            .with_auto_token_refresh(true);
    }
    match timeout(
        connect_timeout,
        Client::connect(settings.endpoints(), Some(options)),
    )
    .await
    {
        Ok(Ok(client)) => {
            tracing::debug!(endpoints = ?settings.endpoints(), user = ?settings.user(), "etcd client created");
            Ok(client)
        }
        Ok(Err(e)) => Err(EtcdError::from_client("connect", 0, e)),
        Err(_) => Err(EtcdError::Timeout {
            operation: "connect",
            timeout: connect_timeout,
        }),
    }
}

/// etcd counts TTLs in whole seconds: round up, at least 1.
pub(super) fn etcd_ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// The renewal timing one user needs from the keep-alive loop.
#[derive(Debug, Clone, Copy)]
struct Timing {
    interval: Duration,
    timeout: Duration,
}

/// What the users of a grant read; published by its keep-alive loop.
#[derive(Debug, Clone)]
pub(super) struct GrantState {
    /// When the latest successful keep-alive (or the grant request) was sent.
    pub(super) last_ok: Instant,
    /// When the latest keep-alive attempt that failed was sent, and its error, if the latest
    /// attempt failed.
    pub(super) failure: Option<(Instant, String)>,
    /// Why the grant is lost, once it is.
    pub(super) lost: Option<String>,
    /// When the keep-alive in flight (sent, not answered yet) was sent.
    pub(super) in_flight: Option<Instant>,
    /// When the loop sends the next keep-alive (one renewal interval after the latest one was
    /// sent, or the retry after a failure).
    pub(super) next_due: Instant,
}

/// The answer to a renewal's request for a fresh keep-alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Freshness {
    /// A keep-alive sent at this instant succeeded.
    Renewed(Instant),
    /// The keep-alive sent for this renewal failed.
    Failed(String),
    /// The etcd lease is gone.
    Lost(String),
}

#[derive(Default)]
struct Users {
    active: HashMap<u64, Timing>,
    /// A dropped tenure's key is attached: never revoke, let the etcd lease expire.
    keep_keys: bool,
}

/// One shared etcd lease.
pub(super) struct Grant {
    id: i64,
    ttl: Duration,
    state: watch::Sender<GrantState>,
    users: Mutex<Users>,
    users_changed: Notify,
}

impl Grant {
    fn new(id: i64, ttl: Duration, sent: Instant) -> Self {
        Self {
            id,
            ttl,
            state: watch::Sender::new(GrantState {
                last_ok: sent,
                failure: None,
                lost: None,
                in_flight: None,
                // Unknown until the loop publishes its schedule: renewals wait for it.
                next_due: sent,
            }),
            users: Mutex::new(Users::default()),
            users_changed: Notify::new(),
        }
    }

    /// The etcd lease id.
    pub(super) fn id(&self) -> i64 {
        self.id
    }

    pub(super) fn state(&self) -> GrantState {
        self.state.borrow().clone()
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<GrantState> {
        self.state.subscribe()
    }

    fn lock_users(&self) -> MutexGuard<'_, Users> {
        self.users.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether new claims may use it: not lost, and at least half its TTL of validity left.
    fn usable(&self, now: Instant) -> bool {
        let state = self.state.borrow();
        state.lost.is_none() && now + self.ttl / 2 < state.last_ok + self.ttl
    }

    fn register(this: &Arc<Self>, user: u64, timing: Timing) -> Registration {
        this.lock_users().active.insert(user, timing);
        this.users_changed.notify_one();
        Registration {
            grant: Arc::clone(this),
            user,
            keep_key: false,
        }
    }

    /// Marks the grant lost (once) and wakes every user's watch.
    pub(super) fn lose(&self, reason: String) {
        self.state.send_if_modified(|state| {
            if state.lost.is_some() {
                return false;
            }
            tracing::warn!(lease_id = %format_args!("{:x}", self.id), %reason, "shared etcd lease lost");
            state.lost = Some(reason);
            true
        });
    }

    /// A keep-alive sent at `sent` is in flight. Waiting renewals are not woken: they wait for
    /// its outcome anyway (with many leases, one wake-up per keep-alive is enough).
    fn sending(&self, sent: Instant) {
        self.state.send_if_modified(|state| {
            state.in_flight = Some(sent);
            false
        });
    }

    /// The keep-alive sent at `sent` succeeded; the next one is due at `next_due`.
    fn succeeded(&self, sent: Instant, next_due: Instant) {
        self.state.send_modify(|state| {
            state.last_ok = state.last_ok.max(sent);
            state.failure = None;
            state.in_flight = None;
            state.next_due = next_due;
        });
    }

    /// The keep-alive sent at `sent` failed with `error`; it is retried at `retry_at`.
    fn failed(&self, sent: Instant, error: String, retry_at: Instant) {
        tracing::debug!(%error, "keep-alive of a shared etcd lease failed");
        self.state.send_modify(|state| {
            state.failure = Some((sent, error));
            state.in_flight = None;
            state.next_due = retry_at;
        });
    }

    /// The loop's next keep-alive is due at `next_due` (published only when it changed).
    fn schedule(&self, next_due: Instant) {
        self.state.send_if_modified(|state| {
            let changed = state.next_due != next_due;
            state.next_due = next_due;
            changed
        });
    }

    /// The keep-alive a renewal that started at `start` relies on: the latest successful one,
    /// unless a keep-alive is in flight or due by `start` (then that one, once answered). A
    /// renewal never asks for a keep-alive of its own: the loop sends one per renewal interval,
    /// and leases plan their renewals one interval after the keep-alive they relied on, which is
    /// when the loop sends the next. A failure of an attempt sent at or after `start` is
    /// reported; one sent before it is not this renewal's: it waits for the retry.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub(super) async fn fresh_keep_alive(&self, start: Instant) -> Freshness {
        let mut state = self.state.subscribe();
        loop {
            {
                let current = state.borrow_and_update();
                if let Some(reason) = &current.lost {
                    return Freshness::Lost(reason.clone());
                }
                let pending = current.in_flight.is_some() || current.next_due <= start;
                if !pending {
                    match &current.failure {
                        None => return Freshness::Renewed(current.last_ok),
                        // The attempt made for this renewal (or a later one) failed.
                        Some((sent, error)) if *sent >= start => {
                            return Freshness::Failed(error.clone())
                        }
                        // An earlier attempt failed: wait for its retry.
                        Some(_) => {}
                    }
                }
            }
            // The sender lives in `self`: waiting cannot fail.
            if state.changed().await.is_err() {
                return Freshness::Failed("the keep-alive loop stopped".into());
            }
        }
    }

    /// `(the timing the users need, whether a dropped tenure's key is attached)`; no timing
    /// without users.
    fn users_snapshot(&self) -> (Option<Timing>, bool) {
        let users = self.lock_users();
        let timing = users.active.values().copied().reduce(|a, b| Timing {
            interval: a.interval.min(b.interval),
            timeout: a.timeout.min(b.timeout),
        });
        (timing, users.keep_keys)
    }
}

/// A user of a grant, for the duration of one claim attempt or tenure.
pub(super) struct Registration {
    grant: Arc<Grant>,
    user: u64,
    keep_key: bool,
}

impl Registration {
    pub(super) fn grant(&self) -> &Arc<Grant> {
        &self.grant
    }

    /// The user's key stays attached after this registration ends (a dropped tenure): the etcd
    /// lease must then expire rather than be revoked.
    pub(super) fn keep_key_attached(&mut self, keep: bool) {
        self.keep_key = keep;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut users = self.grant.lock_users();
        users.active.remove(&self.user);
        users.keep_keys |= self.keep_key;
        drop(users);
        self.grant.users_changed.notify_one();
    }
}

enum Wake {
    Expired,
    UsersChanged,
    Unsolicited(Result<Option<etcd_client::LeaseKeepAliveResponse>, etcd_client::Error>),
    Due,
}

type KeepAliveStream = (LeaseKeeper, LeaseKeepAliveStream);

/// Keeps `grant` alive for its users; see the module documentation.
async fn keep_alive_loop(
    session: Weak<SessionInner>,
    grant: Arc<Grant>,
    ttl_secs: i64,
    mut client: LeaseClient,
) {
    let mut stream: Option<KeepAliveStream> = None;
    let mut backoff = KEEP_ALIVE_BACKOFF_START;
    // When the latest keep-alive was sent (the grant request counts: etcd started the TTL when it
    // received it), and when a failed one is retried.
    let mut last_sent = grant.state().last_ok;
    let mut retry_at: Option<Instant> = None;
    let mut idle_since: Option<Instant> = None;
    let mut linger = Duration::from_secs(1);
    loop {
        let (timing, _) = grant.users_snapshot();
        let state = grant.state();
        if state.lost.is_some() {
            retire(&session, &grant, ttl_secs);
            return;
        }
        let expires = state.last_ok + grant.ttl;
        let Some(timing) = timing else {
            // No users: linger a little for the next claim, then leave.
            let since = *idle_since.get_or_insert_with(Instant::now);
            tokio::select! {
                _ = grant.users_changed.notified() => continue,
                _ = sleep_until((since + linger).min(expires)) => {}
            }
            if let Some(keep) = close_if_unused(&session, &grant, ttl_secs) {
                if !keep && Instant::now() < expires {
                    match timeout(REVOKE_TIMEOUT, client.revoke(grant.id)).await {
                        Ok(Ok(_)) => tracing::debug!("revoked the unused shared etcd lease"),
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "revoking an unused etcd lease failed; it expires on its own")
                        }
                        Err(_) => tracing::debug!(
                            "revoking an unused etcd lease timed out; it expires on its own"
                        ),
                    }
                } else {
                    tracing::debug!(keep_keys = keep, "unused shared etcd lease left to expire");
                }
                return;
            }
            continue;
        };
        idle_since = None;
        linger = timing.interval;
        // The grant's clock: one keep-alive per renewal interval, counted from when the latest
        // one was sent (the users plan their renewals from the same instant), or the retry.
        let due = retry_at.unwrap_or(last_sent + timing.interval);
        grant.schedule(due);
        let wake = {
            let unsolicited = stream.as_mut();
            tokio::select! {
                biased;
                _ = sleep_until(expires) => Wake::Expired,
                _ = grant.users_changed.notified() => Wake::UsersChanged,
                _ = sleep_until(due) => Wake::Due,
                message = async { unsolicited.expect("guarded").1.message().await }, if unsolicited.is_some() => {
                    Wake::Unsolicited(message)
                }
            }
        };
        let (sent, failure) = match wake {
            Wake::Expired => {
                grant.lose(format!(
                    "no successful keep-alive of etcd lease {:x} within its ttl of {:?}{}",
                    grant.id,
                    grant.ttl,
                    state
                        .failure
                        .as_ref()
                        .map(|(_, e)| format!(" (last error: {e})"))
                        .unwrap_or_default()
                ));
                continue;
            }
            Wake::UsersChanged => continue,
            Wake::Unsolicited(Ok(Some(response))) if response.ttl() <= 0 => {
                grant.lose(ttl_zero(grant.id));
                continue;
            }
            // A late answer: nothing to learn from it.
            Wake::Unsolicited(Ok(Some(_))) => continue,
            // The stream ended between keep-alives: the next one opens a new stream (and finds
            // out whether etcd answers); nothing was sent, so nothing failed.
            Wake::Unsolicited(Ok(None)) => {
                tracing::debug!("the keep-alive stream was closed by etcd; reopening it for the next keep-alive");
                stream = None;
                continue;
            }
            Wake::Unsolicited(Err(error)) => {
                tracing::debug!(%error, "the keep-alive stream broke; reopening it for the next keep-alive");
                stream = None;
                continue;
            }
            Wake::Due => {
                if let Some(session) = session.upgrade() {
                    session.keep_alives.fetch_add(1, Ordering::Relaxed);
                }
                let sent = Instant::now();
                last_sent = sent;
                retry_at = None;
                grant.sending(sent);
                match timeout(
                    timing.timeout,
                    keep_alive_once(&mut client, &mut stream, grant.id),
                )
                .await
                {
                    Ok(Ok(true)) => {
                        metrics::backend_request(ETCD_BACKEND, "lease_keep_alive", "ok");
                        grant.succeeded(sent, sent + timing.interval);
                        backoff = KEEP_ALIVE_BACKOFF_START;
                        continue;
                    }
                    Ok(Ok(false)) => {
                        metrics::backend_request(ETCD_BACKEND, "lease_keep_alive", "not_found");
                        grant.lose(ttl_zero(grant.id));
                        continue;
                    }
                    Ok(Err(error)) => {
                        metrics::backend_request(ETCD_BACKEND, "lease_keep_alive", "error");
                        (sent, format!("keep-alive failed: {error}"))
                    }
                    Err(_) => {
                        metrics::backend_request(ETCD_BACKEND, "lease_keep_alive", "error");
                        (
                            sent,
                            format!("keep-alive unanswered after {:?}", timing.timeout),
                        )
                    }
                }
            }
        };
        // Start over on a new stream: an answer on the old one could be mistaken for the next.
        stream = None;
        let retry = Instant::now() + backoff;
        retry_at = Some(retry);
        grant.failed(sent, failure, retry);
        backoff = (backoff * 2).min((timing.interval / 4).max(KEEP_ALIVE_BACKOFF_START));
    }
}

fn ttl_zero(id: i64) -> String {
    format!("etcd lease {id:x} expired or was revoked (keep-alive answered ttl 0)")
}

/// One keep-alive round trip; `Ok(false)` when etcd says the lease does not exist.
async fn keep_alive_once(
    client: &mut LeaseClient,
    stream: &mut Option<KeepAliveStream>,
    id: i64,
) -> Result<bool, etcd_client::Error> {
    if let Some((keeper, responses)) = stream.as_mut() {
        keeper.keep_alive().await?;
        return match responses.message().await? {
            Some(response) => Ok(response.ttl() > 0),
            None => Err(etcd_client::Error::LeaseKeepAliveError(
                "the keep-alive stream was closed by etcd".into(),
            )),
        };
    }
    // Opening the stream sends the first keep-alive and waits for its answer.
    match client.keep_alive(id).await {
        Ok(opened) => {
            *stream = Some(opened);
            Ok(true)
        }
        // etcd-client reports a first answer with ttl 0 this way.
        Err(etcd_client::Error::LeaseKeepAliveError(message)) if message == "lease not found" => {
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

/// Removes `grant` from the session if it is unused; returns whether a dropped tenure's key is
/// attached, or `None` if it got a user meanwhile.
fn close_if_unused(
    session: &Weak<SessionInner>,
    grant: &Arc<Grant>,
    ttl_secs: i64,
) -> Option<bool> {
    let session = session.upgrade();
    // Registration happens under the map lock: holding it, an unused grant stays unused.
    let mut grants = session.as_ref().map(|s| s.lock_grants());
    let users = grant.lock_users();
    if !users.active.is_empty() {
        return None;
    }
    if let Some(grants) = grants.as_mut() {
        if grants
            .current
            .get(&ttl_secs)
            .is_some_and(|g| Arc::ptr_eq(g, grant))
        {
            grants.current.remove(&ttl_secs);
        }
    }
    Some(users.keep_keys)
}

/// Removes a lost grant from the session.
fn retire(session: &Weak<SessionInner>, grant: &Arc<Grant>, ttl_secs: i64) {
    if let Some(session) = session.upgrade() {
        let mut grants = session.lock_grants();
        if grants
            .current
            .get(&ttl_secs)
            .is_some_and(|g| Arc::ptr_eq(g, grant))
        {
            grants.current.remove(&ttl_secs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(etcd_ttl_secs(Duration::from_secs(3)), 3);
        assert_eq!(etcd_ttl_secs(Duration::from_millis(2500)), 3);
        assert_eq!(etcd_ttl_secs(Duration::from_millis(10)), 1);
        assert_eq!(etcd_ttl_secs(Duration::from_secs(30)), 30);
    }

    #[tokio::test(start_paused = true)]
    async fn grants_are_usable_while_half_their_ttl_is_left_and_not_lost() {
        let t0 = Instant::now();
        let grant = Arc::new(Grant::new(1, Duration::from_secs(10), t0));
        assert!(grant.usable(t0));
        assert!(grant.usable(t0 + Duration::from_millis(4999)));
        assert!(!grant.usable(t0 + Duration::from_secs(5)));
        grant.succeeded(t0 + Duration::from_secs(4), t0 + Duration::from_secs(7));
        assert!(grant.usable(t0 + Duration::from_secs(8)));
        // An older success never moves the instant back.
        grant.succeeded(t0, t0 + Duration::from_secs(3));
        assert_eq!(grant.state().last_ok, t0 + Duration::from_secs(4));
        grant.lose("gone".into());
        assert!(!grant.usable(t0 + Duration::from_secs(4)));
        grant.lose("again".into());
        assert_eq!(grant.state().lost.as_deref(), Some("gone"));
    }

    #[tokio::test(start_paused = true)]
    async fn users_set_the_keep_alive_timing_and_dropped_tenures_keep_their_key() {
        let grant = Arc::new(Grant::new(1, Duration::from_secs(9), Instant::now()));
        let slow = Timing {
            interval: Duration::from_secs(3),
            timeout: Duration::from_secs(2),
        };
        let fast = Timing {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(3),
        };
        let a = Grant::register(&grant, 1, slow);
        let mut b = Grant::register(&grant, 2, fast);
        let (timing, keep) = grant.users_snapshot();
        let timing = timing.unwrap();
        assert_eq!(timing.interval, Duration::from_secs(1));
        assert_eq!(timing.timeout, Duration::from_secs(2));
        assert!(!keep);
        drop(a);
        b.keep_key_attached(true);
        drop(b);
        let (timing, keep) = grant.users_snapshot();
        assert!(timing.is_none());
        assert!(keep, "a dropped tenure's key stays attached");
    }

    /// Whether `renewal` is still waiting, after letting it run.
    async fn waiting(renewal: &tokio::task::JoinHandle<Freshness>) -> bool {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        !renewal.is_finished()
    }

    fn renewal(grant: &Arc<Grant>, start: Instant) -> tokio::task::JoinHandle<Freshness> {
        let grant = Arc::clone(grant);
        tokio::spawn(async move { grant.fresh_keep_alive(start).await })
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_take_the_loops_latest_keep_alive_or_wait_for_the_one_due() {
        let interval = Duration::from_secs(1);
        let t0 = Instant::now();
        let grant = Arc::new(Grant::new(7, Duration::from_secs(3), t0));
        // Before the loop published its schedule, a renewal waits for it.
        let early = renewal(&grant, t0);
        assert!(waiting(&early).await);
        grant.schedule(t0 + interval);
        assert_eq!(early.await.unwrap(), Freshness::Renewed(t0));

        // Between two keep-alives: the latest one, at once, without asking for anything.
        tokio::time::advance(Duration::from_millis(600)).await;
        assert_eq!(
            grant.fresh_keep_alive(Instant::now()).await,
            Freshness::Renewed(t0)
        );

        // A renewal that starts when the next keep-alive is due waits for it (however late the
        // loop sends it), and relies on it.
        tokio::time::advance(Duration::from_millis(400)).await;
        let due = renewal(&grant, Instant::now());
        assert!(
            waiting(&due).await,
            "the keep-alive due now is not sent yet"
        );
        tokio::time::advance(Duration::from_millis(30)).await;
        let sent = Instant::now();
        grant.sending(sent);
        assert!(waiting(&due).await, "in flight");
        tokio::time::advance(Duration::from_millis(5)).await;
        grant.succeeded(sent, sent + interval);
        assert_eq!(due.await.unwrap(), Freshness::Renewed(sent));

        // A renewal that starts while a keep-alive is in flight waits for its answer, even one
        // sent before it started (a late runtime): one keep-alive serves every lease.
        tokio::time::advance(interval).await;
        let in_flight = Instant::now();
        grant.sending(in_flight);
        tokio::time::advance(Duration::from_millis(200)).await;
        let late = renewal(&grant, Instant::now());
        assert!(waiting(&late).await);
        grant.succeeded(in_flight, in_flight + interval);
        assert_eq!(late.await.unwrap(), Freshness::Renewed(in_flight));

        // The attempt made for a renewal (sent after it started) fails: reported as such.
        tokio::time::advance(Duration::from_millis(800)).await;
        let start = Instant::now();
        let failing = renewal(&grant, start);
        assert!(waiting(&failing).await);
        tokio::time::advance(Duration::from_millis(1)).await;
        let attempt = Instant::now();
        grant.sending(attempt);
        grant.failed(
            attempt,
            "connection reset".into(),
            attempt + Duration::from_millis(100),
        );
        assert_eq!(
            failing.await.unwrap(),
            Freshness::Failed("connection reset".into())
        );

        // A renewal that starts after that failure, before its retry, waits for the retry.
        tokio::time::advance(Duration::from_millis(50)).await;
        let retried = renewal(&grant, Instant::now());
        assert!(
            waiting(&retried).await,
            "an earlier failure is not this renewal's"
        );
        tokio::time::advance(Duration::from_millis(50)).await;
        let retry = Instant::now();
        grant.sending(retry);
        grant.succeeded(retry, retry + interval);
        assert_eq!(retried.await.unwrap(), Freshness::Renewed(retry));

        // A lost grant answers at once, and wakes waiting renewals.
        tokio::time::advance(interval).await;
        let waiting_one = renewal(&grant, Instant::now());
        assert!(waiting(&waiting_one).await);
        grant.lose("ttl 0".into());
        assert_eq!(waiting_one.await.unwrap(), Freshness::Lost("ttl 0".into()));
        assert_eq!(
            grant.fresh_keep_alive(Instant::now()).await,
            Freshness::Lost("ttl 0".into())
        );
    }
}
