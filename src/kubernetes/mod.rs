//! The Kubernetes backend: leases stored as `coordination.k8s.io/v1` `Lease` objects (feature
//! `kubernetes`). Everything about its semantics is documented on [`KubernetesLease`].

mod client;
pub use client::kubernetes_client;
mod error;
mod name;
mod session;
mod settings;
mod watch;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::time::Instant;

use crate::backend::{AcquireAttempt, LeaseBackend, ReleaseOutcome, RenewOutcome};
use crate::lease::{BoxError, FencingToken, LostReason};
use crate::managed::ManagedLease;
use crate::settings::LeaseSettings;
use crate::shared::SharedLease;

pub use error::KubernetesError;
pub use name::{is_valid_object_name, object_name, LEASE_NAME_ANNOTATION};
pub use session::{KubernetesSession, KubernetesSessionStats};
pub use settings::KubernetesSettings;
pub use watch::{KubernetesWatchStats, WATCH_FLOOR};
use watch::{Subscription, View, WatchHub};

/// The name of the Kubernetes backend in a [`CoordinationConfig`](crate::CoordinationConfig).
pub const KUBERNETES_BACKEND: &str = "kubernetes";

/// The field manager recorded in the objects' `managedFields`.
const FIELD_MANAGER: &str = "actix-coordination";
/// Compare-and-swap rounds within one call before giving up with [`KubernetesError::Conflict`].
const MAX_CAS_ATTEMPTS: u32 = 4;
/// Unconfirmed renewals remembered (renewals whose answer was lost) before the oldest are forgotten.
const MAX_UNCONFIRMED: usize = 16;

/// A lease stored in a Kubernetes `coordination.k8s.io/v1` `Lease` object (feature `kubernetes`).
///
/// The backend keeps one `Lease` object per lease name in one namespace, with the same
/// fields client-go's leader election uses, so `kubectl get lease` shows the holder and a lease
/// held by a client-go program is respected (and the other way round):
///
/// | field | written as |
/// |---|---|
/// | `spec.holderIdentity` | the owner; cleared (absent) after a release |
/// | `spec.acquireTime` | when the current tenure started |
/// | `spec.renewTime` | the last renewal (informational only, see below) |
/// | `spec.leaseDurationSeconds` | the TTL, rounded **up** to whole seconds |
/// | `spec.leaseTransitions` | +1 on every new tenure: the [fencing token](crate::FencingToken) |
/// | `metadata.annotations["actix-coordination/lease-name"]` | the original lease name |
///
/// ```text
/// $ kubectl get lease -n my-app
/// NAME        HOLDER      AGE
/// singleton   web-7f9c8   3h
/// ```
///
/// # Every claiming write is a compare-and-swap
///
/// Writes are `create` or `update` (a `PUT` carrying the `resourceVersion` the backend last read);
/// the API server rejects an update whose `resourceVersion` is stale with `409 Conflict`, so two
/// owners racing for a free or expired lease produce exactly one winner. One attempt to acquire:
///
/// 1. Take the object as the namespace watch last delivered it while that view is current (see
///    the next section), else `GET` it. Missing: `create` it (a `409 AlreadyExists` means someone
///    else was faster: read again and decide).
/// 2. Held by this owner (a previous attempt whose answer was lost): take it as a new tenure with
///    an update that bumps `leaseTransitions`.
/// 3. Held by another owner whose claim has not expired (see below): `false`.
/// 4. Expired, or no holder (released): update with the observed `resourceVersion`; a `409`
///    means someone else wrote first: read again and decide.
///
/// # Expiry that clock skew cannot break
///
/// `renewTime` is written by another machine's wall clock and is never compared with this one's.
/// Instead each backend remembers the `resourceVersion` it last saw and the local *monotonic*
/// instant it first saw it; another owner's claim counts as expired only when
/// `leaseDurationSeconds` have passed on the local clock since then. Every change of the object
/// (a renewal) restarts that clock. A contender therefore waits *at least* the TTL after the
/// holder's last renewal, which the holder itself counts from the *start* of that renewal, minus
/// its clock drift margin: the holder always gives the lease up locally first. The price: a
/// contender that first sees an abandoned lease waits a full TTL from then, even if the holder
/// died long ago. An object without a holder is free at once.
///
/// # Cost
///
/// A holder sends exactly one request per renewal interval: an update with the cached
/// `resourceVersion`, without reading first. On `409` it reads once to find out why: if the object
/// still shows this owner's tenure and the `renewTime` of an earlier renewal whose answer was lost,
/// that renewal landed and is adopted; otherwise the lease was lost (taken over, or
/// [deleted](crate::LostReason::Deleted) on `404`).
///
/// # One watch per namespace
///
/// All leases of a [`KubernetesSession`] in a namespace share one watch on the namespace's `Lease`
/// objects ([`kube::runtime::watcher()`], with its backoff and relist), dispatched by object name.
/// It reports a takeover or a deletion to a holder without a request, and keeps a waiting
/// contender's view current: while the watch is listed and running, an attempt decides from what
/// it delivered, without a read, so a waiting contender sends no request at all, and a release
/// wakes it within one round trip. The view may lag the store by the watch's delay; a claim on a
/// stale view fails its compare-and-swap, and expiry is still judged from when this process first
/// received a version. A watch response that ends early is re-opened no sooner than
/// [`KUBERNETES_WATCH_FLOOR`](crate::KUBERNETES_WATCH_FLOOR) after the previous one.
///
/// # Releasing keeps the object
///
/// A release is a compare-and-swap that clears `holderIdentity`; the object stays, so
/// `leaseTransitions` never goes back. When that write meets a conflict, the release reads the
/// object once and clears it only if it still shows *this* tenure (this owner **and** the tenure's
/// `leaseTransitions`); a newer tenure, even one of the same owner identity started by another
/// instance, is left alone and the release resolves `false`.
///
/// **Never delete lease objects**: a deleted object is created anew with `leaseTransitions: 1`, so
/// fencing tokens restart and a stale holder's writes could be accepted again by a system that
/// remembers the old, higher tokens. This is why the Role in
/// `deploy/rbac.yaml` grants no `delete`.
///
/// # Names
///
/// Object names must be DNS-1123 subdomains (at most 253 of `a-z0-9-.`). A lease name that is
/// one is used as is; any other is mapped to a readable sanitized prefix plus 16 hex digits of the
/// SHA-256 of the full name (`Jobs/Leader` → `jobs-leader-<hash>`), so different lease names
/// never share an object. See [`kubernetes_object_name`](crate::kubernetes_object_name).
///
/// # Permissions
///
/// The identity needs `get`, `list`, `watch`, `create` and `update` on
/// `leases.coordination.k8s.io` in the namespace (`deploy/rbac.yaml`). A refusal makes `acquire`
/// fail at once with [`KubernetesError::Forbidden`], which names the verb, the resource and the
/// namespace; an unreachable API server makes it fail with a transient error, never resolve `false`.
///
/// # In a cluster
///
/// The defaults of [`KubernetesSettings`] are what Kubernetes gives every pod (the API server at
/// `https://kubernetes.default.svc`, the mounted service account token, re-read when the kubelet
/// rotates it, and CA bundle). Pass the pod name as the owner and the namespace with the downward
/// API, and use [`KubernetesSettings::from_env`] and [`KubernetesSettings::owner_from_env`]:
///
/// ```yaml
/// env:
///   - name: POD_NAME
///     valueFrom: { fieldRef: { fieldPath: metadata.name } }
///   - name: POD_NAMESPACE
///     valueFrom: { fieldRef: { fieldPath: metadata.namespace } }
/// ```
///
/// ```no_run
/// use actix_coordination::{KubernetesLease, KubernetesSettings, Lease, LeaseSettings};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let settings = LeaseSettings::new("singleton", KubernetesSettings::owner_from_env()?)?;
/// let lease = KubernetesLease::new(settings, KubernetesSettings::from_env()?)?;
/// if lease.acquire().await? {
///     // leader-only work, passing lease.fencing_token() along
/// }
/// # Ok(()) }
/// ```
///
/// Outside a cluster, build a [`kube::Client`] from a kubeconfig and use
/// [`KubernetesLease::with_client`].
///
/// # Many leases: one session
///
/// Leases built from one [`KubernetesSession`] ([`KubernetesSession::lease`],
/// [`KubernetesLease::with_session`]) share its kube client, and with it one HTTP/2 connection
/// to the API server, one token and CA re-reading, and one watch per namespace;
/// [`KubernetesLease::new`] builds a session of its own for each lease. Build one session per API server and credentials and all leases of
/// the process from it (the [`LeaseProvider`](crate::LeaseProvider) does so for equal
/// sections). See [`KubernetesSession`] for the connection count and its limits.
///
/// # Runtime
///
/// The connections of a session (or of [`KubernetesLease::new`]'s own one) run on a thread of
/// their own, not on the runtime of the caller. A client passed to
/// [`KubernetesLease::with_client`] runs on the runtime it was built on: use such a lease from a
/// runtime that outlives it (with actix, the system's).
pub type KubernetesLease = ManagedLease<KubernetesBackend>;

impl ManagedLease<KubernetesBackend> {
    /// A lease with `settings` on the API server described by `k8s`, with a
    /// [`KubernetesSession`] of its own (its own client and connection): for more than a few
    /// leases, build one session and use [`KubernetesLease::with_session`].
    ///
    /// The settings are validated and the token and CA files read once now; nothing is sent to
    /// the API server before the first `acquire`.
    ///
    /// # Errors
    ///
    /// See [`KubernetesSession::new`].
    pub fn new(settings: LeaseSettings, k8s: KubernetesSettings) -> Result<Self, KubernetesError> {
        let backend = KubernetesBackend::new(settings.name(), &k8s)?;
        Ok(ManagedLease::from_backend(settings, backend))
    }

    /// A lease with `settings` using a ready `client` (for example built from a kubeconfig), with
    /// its objects in `namespace`.
    ///
    /// # Errors
    ///
    /// [`KubernetesError::InvalidSettings`] when `namespace` is not a valid namespace name.
    pub fn with_client(
        settings: LeaseSettings,
        client: Client,
        namespace: impl Into<String>,
    ) -> Result<Self, KubernetesError> {
        let backend = KubernetesBackend::with_client(settings.name(), client, namespace)?;
        Ok(ManagedLease::from_backend(settings, backend))
    }
}

/// The factory of the `kubernetes` backend for [`LeaseProvider`](crate::LeaseProvider): a
/// closure, which is a [`BackendFactory`](crate::BackendFactory).
///
/// The backend's section (`[leases.<key>.kubernetes]`) deserializes to [`KubernetesSettings`]
/// (`namespace`, `api-url`, `token` or `token-file`, `ca-file`); without a section the settings
/// come from [`KubernetesSettings::from_env`]. Leases whose settings are equal share one
/// [`KubernetesSession`] (one client, one connection), for as long as one of them lives; the
/// factory keeps no session alive by itself.
pub fn provider_factory(
) -> impl Fn(LeaseSettings, Option<&serde_json::Value>) -> Result<SharedLease, BoxError>
       + Send
       + Sync
       + 'static {
    let sessions = SessionCache::default();
    move |settings: LeaseSettings,
          section: Option<&serde_json::Value>|
          -> Result<SharedLease, BoxError> {
        let k8s = match section {
            Some(section) => KubernetesSettings::deserialize_section(section)?,
            None => KubernetesSettings::from_env()?,
        };
        let session = sessions.get(k8s)?;
        Ok(SharedLease::new(KubernetesLease::with_session(
            settings, &session,
        )))
    }
}

/// The provider's sessions by settings, held weakly: a session lives as long as a lease uses it.
#[derive(Default)]
struct SessionCache(Mutex<HashMap<KubernetesSettings, Weak<session::SessionInner>>>);

impl SessionCache {
    fn get(&self, k8s: KubernetesSettings) -> Result<KubernetesSession, KubernetesError> {
        let mut sessions = self.0.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(|_, weak| weak.strong_count() > 0);
        if let Some(session) = sessions.get(&k8s).and_then(KubernetesSession::upgrade) {
            return Ok(session);
        }
        let session = KubernetesSession::new(k8s.clone())?;
        sessions.insert(k8s, session.downgrade());
        Ok(session)
    }
}

impl KubernetesSettings {
    fn deserialize_section(section: &serde_json::Value) -> Result<Self, BoxError> {
        let settings: KubernetesSettings = serde::Deserialize::deserialize(section)?;
        Ok(settings)
    }
}

/// Counters of the requests a [`KubernetesBackend`] sent, for tests and cost checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KubernetesStats {
    /// `get` requests.
    pub gets: u64,
    /// `create` requests.
    pub creates: u64,
    /// `update` requests (claims, renewals, releases).
    pub updates: u64,
    /// `create` and `update` requests the API server refused with `409 Conflict` (someone else
    /// wrote first: a lost compare-and-swap race); counted in `creates` and `updates` too.
    pub conflicts: u64,
}

impl KubernetesStats {
    /// Every request but watches: what a lease costs per operation.
    pub fn requests(&self) -> u64 {
        self.gets + self.creates + self.updates
    }
}

#[derive(Default)]
struct Counters {
    gets: AtomicU64,
    creates: AtomicU64,
    updates: AtomicU64,
    conflicts: AtomicU64,
}

enum ClientSource {
    Ready(Client),
    Session(KubernetesSession),
}

/// The [`LeaseBackend`] of one lease on a Kubernetes API server; see [`KubernetesLease`].
///
/// One backend serves one lease instance: it remembers what it observed of its object (the
/// `resourceVersion` and when it first saw it), which is what expiry is judged by.
pub struct KubernetesBackend {
    client: ClientSource,
    namespace: String,
    name: String,
    object: String,
    state: Mutex<State>,
    counters: Counters,
    hub: Arc<WatchHub>,
    subscription: OnceLock<Subscription>,
}

impl std::fmt::Debug for KubernetesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesBackend")
            .field("namespace", &self.namespace)
            .field("object", &self.object)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    observed: Option<Observed>,
    /// What this instance knows of the object (from the namespace watch or its own requests), and
    /// the epoch of the namespace watch it learned it in (0: the watch was not synced).
    known: Option<(View, u64)>,
    /// The last delivery of the namespace watch folded in.
    folded: u64,
    /// The `acquireTime` of claims sent whose answer never arrived.
    unanswered: Vec<MicroTime>,
    /// The `resourceVersion` of this instance's latest write in the current tenure.
    tenure_version: Option<String>,
}

/// What the backend last saw of its object, and when it first saw that version.
#[derive(Debug, Clone)]
struct Observed {
    version: String,
    first_seen: Instant,
    holder: Option<String>,
    duration: Duration,
}

impl Observed {
    fn expires_at(&self) -> Instant {
        self.first_seen + self.duration
    }
}

/// What the backend remembers of a tenure it holds.
#[derive(Debug, Clone)]
pub struct KubernetesTenure {
    /// The object as this backend last wrote (or adopted) it; its `resourceVersion` is what the
    /// next write compares against.
    lease: Arc<LeaseObject>,
    transitions: i32,
    /// Renewals sent since the last confirmed one (their answer was lost or not yet received):
    /// the `renewTime` each wrote, and when the call started.
    unconfirmed: Vec<(MicroTime, Instant)>,
}

impl KubernetesTenure {
    /// The fencing token of the tenure (`leaseTransitions` after this owner's claim).
    pub fn fencing_token(&self) -> FencingToken {
        FencingToken::new(self.transitions as u64)
    }

    /// The `resourceVersion` of the object as last written by this tenure.
    pub fn resource_version(&self) -> Option<&str> {
        self.lease.metadata.resource_version.as_deref()
    }
}

impl KubernetesBackend {
    /// The backend of lease `name` on the API server described by `k8s`.
    ///
    /// # Errors
    ///
    /// See [`KubernetesLease::new`].
    pub fn new(name: &str, k8s: &KubernetesSettings) -> Result<Self, KubernetesError> {
        Ok(Self::with_session(
            name,
            &KubernetesSession::new(k8s.clone())?,
        ))
    }

    /// The backend of lease `name` on `session`, with its object in the session's namespace.
    pub fn with_session(name: &str, session: &KubernetesSession) -> Self {
        Self::build(
            name,
            ClientSource::Session(session.clone()),
            session.namespace().to_owned(),
        )
    }

    /// The session of this backend (`None` for one built from a ready client).
    pub fn session(&self) -> Option<&KubernetesSession> {
        match &self.client {
            ClientSource::Ready(_) => None,
            ClientSource::Session(session) => Some(session),
        }
    }

    /// The backend of lease `name` using `client`, with its object in `namespace`.
    ///
    /// # Errors
    ///
    /// [`KubernetesError::InvalidSettings`] when `namespace` is not a valid namespace name.
    pub fn with_client(
        name: &str,
        client: Client,
        namespace: impl Into<String>,
    ) -> Result<Self, KubernetesError> {
        let namespace = namespace.into();
        settings::check_namespace(&namespace)?;
        Ok(Self::build(name, ClientSource::Ready(client), namespace))
    }

    fn build(name: &str, client: ClientSource, namespace: String) -> Self {
        let hub = match &client {
            ClientSource::Ready(client) => Arc::new(WatchHub::new(client.clone(), None)),
            ClientSource::Session(session) => Arc::clone(session.hub()),
        };
        Self {
            hub,
            subscription: OnceLock::new(),
            client,
            namespace,
            name: name.to_owned(),
            object: object_name(name),
            state: Mutex::new(State::default()),
            counters: Counters::default(),
        }
    }

    /// The namespace of the object.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The name of the `Lease` object (the lease name, mapped if needed: see [`object_name`]).
    pub fn object_name(&self) -> &str {
        &self.object
    }

    /// How many requests this backend sent.
    pub fn stats(&self) -> KubernetesStats {
        KubernetesStats {
            gets: self.counters.gets.load(Ordering::Relaxed),
            creates: self.counters.creates.load(Ordering::Relaxed),
            updates: self.counters.updates.load(Ordering::Relaxed),
            conflicts: self.counters.conflicts.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn api(&self) -> Result<Api<LeaseObject>, KubernetesError> {
        let client = match &self.client {
            ClientSource::Ready(client) => client.clone(),
            ClientSource::Session(session) => session.client(),
        };
        Ok(Api::namespaced(client, &self.namespace))
    }

    fn error(&self, verb: &'static str, error: kube::Error) -> KubernetesError {
        KubernetesError::from_kube(error, verb, &self.object, &self.namespace)
    }

    /// [`Self::error`] for a write, counting a refused compare-and-swap.
    fn write_error(&self, verb: &'static str, error: kube::Error) -> KubernetesError {
        let error = self.error(verb, error);
        if error.status_code() == Some(409) {
            self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        error
    }

    async fn get(&self, api: &Api<LeaseObject>) -> Result<Option<LeaseObject>, KubernetesError> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        let found = api
            .get_opt(&self.object)
            .await
            .map_err(|e| self.error("get", e))?
            .map(slim);
        if let Some(lease) = &found {
            self.check_owner_name(lease)?;
            self.observe(lease);
        }
        Ok(found)
    }

    async fn create(
        &self,
        api: &Api<LeaseObject>,
        lease: &LeaseObject,
    ) -> Result<Arc<LeaseObject>, KubernetesError> {
        self.counters.creates.fetch_add(1, Ordering::Relaxed);
        let created = api
            .create(&post_params(), lease)
            .await
            .map_err(|e| self.write_error("create", e))?;
        Ok(self.observe_shared(Arc::new(slim(created))))
    }

    async fn update(
        &self,
        api: &Api<LeaseObject>,
        lease: &LeaseObject,
    ) -> Result<Arc<LeaseObject>, KubernetesError> {
        self.counters.updates.fetch_add(1, Ordering::Relaxed);
        let updated = api
            .replace(&self.object, &post_params(), lease)
            .await
            .map_err(|e| self.write_error("update", e))?;
        Ok(self.observe_shared(Arc::new(slim(updated))))
    }

    /// Records what a request returned of the object.
    fn observe(&self, lease: &LeaseObject) {
        self.observe_shared(Arc::new(lease.clone()));
    }

    /// Records what a request returned of the object, keeping this copy (a tenure shares it).
    fn observe_shared(&self, lease: Arc<LeaseObject>) -> Arc<LeaseObject> {
        let epoch = self.synced_epoch();
        let now = Instant::now();
        self.learn(View::Present(Arc::clone(&lease)), now, epoch);
        if let Some(subscription) = self.subscription.get() {
            subscription.publish(Arc::clone(&lease), now);
        }
        lease
    }

    /// Records what is known of the object, unless it is older than what is known already; the
    /// expiry clock of a version starts when this instance first saw it (`at`).
    fn learn(&self, view: View, at: Instant, epoch: u64) {
        let mut state = self.lock();
        if let (Some(new), Some(known)) = (
            view.version(),
            state.known.as_ref().and_then(|(v, _)| v.version()),
        ) {
            if watch::older(new, known) {
                return;
            }
        }
        if let View::Present(lease) = &view {
            if let Some(version) = lease.metadata.resource_version.as_deref() {
                if state.observed.as_ref().is_none_or(|o| o.version != version) {
                    state.observed = Some(Observed {
                        version: version.to_owned(),
                        first_seen: at,
                        holder: holder_of(lease).map(str::to_owned),
                        duration: duration_of(lease),
                    });
                }
            }
        }
        state.known = Some((view, epoch));
    }

    fn observed(&self) -> Option<Observed> {
        self.lock().observed.clone()
    }

    fn check_owner_name(&self, lease: &LeaseObject) -> Result<(), KubernetesError> {
        match lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEASE_NAME_ANNOTATION))
        {
            Some(other) if *other != self.name => Err(KubernetesError::NameCollision {
                name: self.name.clone(),
                object: self.object.clone(),
                owner_name: other.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// A new object claimed by `settings.owner()`.
    fn new_object(&self, settings: &LeaseSettings) -> LeaseObject {
        let now = now_micro();
        LeaseObject {
            metadata: ObjectMeta {
                name: Some(self.object.clone()),
                namespace: Some(self.namespace.clone()),
                annotations: Some(BTreeMap::from([(
                    LEASE_NAME_ANNOTATION.to_owned(),
                    self.name.clone(),
                )])),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_owned(),
                    FIELD_MANAGER.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(settings.owner().to_owned()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_duration_seconds: Some(duration_secs(settings.ttl())),
                lease_transitions: Some(1),
                ..LeaseSpec::default()
            }),
        }
    }

    /// `current` claimed by `settings.owner()` as a new tenure.
    fn claimed(
        &self,
        mut current: LeaseObject,
        settings: &LeaseSettings,
    ) -> Result<LeaseObject, KubernetesError> {
        let transitions = transitions_of(&current).checked_add(1).ok_or_else(|| {
            KubernetesError::InvalidRecord {
                object: self.object.clone(),
                reason: "leaseTransitions cannot grow any more".into(),
            }
        })?;
        current
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(LEASE_NAME_ANNOTATION.to_owned(), self.name.clone());
        let now = now_micro();
        let spec = current.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(settings.owner().to_owned());
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(duration_secs(settings.ttl()));
        spec.lease_transitions = Some(transitions);
        Ok(current)
    }

    /// Records a claim about to be sent (by its `acquireTime`, which only this instance writes),
    /// until its answer arrives: if it never does, the store may hold it, and a `release` without
    /// a tenure removes it ([`LeaseBackend::release_unanswered`]).
    fn claim_sent(&self, claim: &LeaseObject) -> Option<MicroTime> {
        let acquired_at = claim.spec.as_ref()?.acquire_time.clone()?;
        self.lock().unanswered.push(acquired_at.clone());
        Some(acquired_at)
    }

    /// The claim `sent` got `result`: forgotten if the API server answered (whatever it said).
    fn answered<T>(
        &self,
        sent: Option<MicroTime>,
        result: Result<T, KubernetesError>,
    ) -> Result<T, KubernetesError> {
        let answered = match &result {
            Ok(_) => true,
            Err(error) => error.status_code().is_some(),
        };
        if let (true, Some(sent)) = (answered, sent) {
            self.lock().unanswered.retain(|t| *t != sent);
        }
        result
    }

    fn acquired(&self, lease: Arc<LeaseObject>) -> AcquireAttempt<KubernetesTenure> {
        let transitions = transitions_of(&lease);
        {
            let mut state = self.lock();
            state.tenure_version = lease.metadata.resource_version.clone();
            // Whatever an earlier claim left in the store, this tenure supersedes it.
            state.unanswered.clear();
        }
        AcquireAttempt::Acquired {
            token: FencingToken::new(transitions as u64),
            tenure: KubernetesTenure {
                lease,
                transitions,
                unconfirmed: Vec::new(),
            },
            valid_from: None,
        }
    }

    fn adopt(&self, tenure: &mut KubernetesTenure, lease: Arc<LeaseObject>) {
        self.lock().tenure_version = lease.metadata.resource_version.clone();
        tenure.lease = lease;
    }

    /// Why the tenure with `token` is lost according to `lease`, if it is.
    fn loss_in(lease: &LeaseObject, owner: &str, token: FencingToken) -> Option<LostReason> {
        match holder_of(lease) {
            None => Some(LostReason::Inconsistent(
                "the lease object shows no holder: released by another client".into(),
            )),
            Some(holder) if holder != owner => Some(LostReason::TakenOver {
                holder: Some(holder.to_owned()),
            }),
            Some(holder) if transitions_of(lease) as u64 != token.value() => {
                Some(LostReason::TakenOver {
                    holder: Some(holder.to_owned()),
                })
            }
            Some(_) => None,
        }
    }

    /// `future`, a request with `verb`, bounded by `limit` ([`KubernetesError::Timeout`]).
    async fn bounded<T>(
        &self,
        verb: &'static str,
        limit: Duration,
        future: impl std::future::Future<Output = Result<T, KubernetesError>>,
    ) -> Result<T, KubernetesError> {
        tokio::time::timeout(limit, future)
            .await
            .map_err(|_| KubernetesError::Timeout {
                verb,
                object: self.object.clone(),
                timeout: limit,
            })?
    }

    /// The object now, bounded by the operation timeout: `Ok(Ok(version))` to watch on from while
    /// the tenure with `token` holds, `Ok(Err(reason))` when it is lost.
    async fn tenure_check(
        &self,
        api: &Api<LeaseObject>,
        settings: &LeaseSettings,
        token: FencingToken,
    ) -> Result<Result<String, LostReason>, KubernetesError> {
        let current = self
            .bounded("get", settings.operation_timeout(), self.get(api))
            .await?;
        Ok(match current {
            None => Err(LostReason::Deleted),
            Some(current) => match Self::loss_in(&current, settings.owner(), token) {
                Some(reason) => Err(reason),
                None => Ok(current.metadata.resource_version.unwrap_or_default()),
            },
        })
    }

    /// The namespace watch subscription of this instance, made at first use.
    fn subscription(&self) -> Option<&Subscription> {
        if let Some(subscription) = self.subscription.get() {
            return Some(subscription);
        }
        match self.hub.subscribe(&self.namespace, &self.object) {
            Ok(subscription) => Some(self.subscription.get_or_init(|| subscription)),
            Err(error) => {
                tracing::debug!(%error, object = %self.object, "cannot watch the namespace; reading the object before each attempt");
                None
            }
        }
    }

    /// The epoch of the namespace watch if it is synced, else 0.
    fn synced_epoch(&self) -> u64 {
        self.subscription
            .get()
            .map(Subscription::status)
            .filter(|s| s.synced)
            .map_or(0, |s| s.epoch)
    }

    /// Folds the namespace watch's latest delivery for the object into what this instance knows.
    fn fold(&self) {
        let Some(subscription) = self.subscription() else {
            return;
        };
        let snapshot = subscription.latest();
        {
            let mut state = self.lock();
            if snapshot.seq <= state.folded {
                return;
            }
            state.folded = snapshot.seq;
        }
        let Some(view) = snapshot.view else {
            return;
        };
        if let View::Present(lease) = &view {
            // Not this lease's object (a name collision): the next read reports it.
            if self.check_owner_name(lease).is_err() {
                return;
            }
        }
        let status = subscription.status();
        let epoch = if status.synced && status.epoch == snapshot.epoch {
            snapshot.epoch
        } else {
            0
        };
        self.learn(view, snapshot.at, epoch);
    }

    /// What this instance knows of the object, if it is current: learned in the epoch of the
    /// namespace watch that still runs, synced (see the `watch` module).
    fn current_view(&self) -> Option<View> {
        self.fold();
        let status = self.subscription.get()?.status();
        if !status.synced {
            return None;
        }
        match &self.lock().known {
            Some((view, epoch)) if *epoch == status.epoch && *epoch > 0 => Some(view.clone()),
            _ => None,
        }
    }

    /// Whether `view`, a delivery of the namespace watch, shows the tenure with `token` lost. A
    /// view that shows a loss but may be older than the tenure's last write (versions that are not
    /// numbers, a listing) is confirmed by a read; one older than that write is ignored.
    async fn judge(
        &self,
        view: &View,
        settings: &LeaseSettings,
        token: FencingToken,
    ) -> Result<Option<LostReason>, KubernetesError> {
        let reason = match view {
            View::Present(lease) => match Self::loss_in(lease, settings.owner(), token) {
                None => return Ok(None),
                Some(reason) => reason,
            },
            View::Absent { .. } => LostReason::Deleted,
        };
        let ours = self.lock().tenure_version.clone();
        if let (Some(seen), Some(ours)) = (view.version(), ours.as_deref()) {
            if watch::newer(seen, ours) {
                return Ok(Some(reason));
            }
            if seen == ours || watch::older(seen, ours) {
                return Ok(None);
            }
        }
        let api = self.api()?;
        Ok(self.tenure_check(&api, settings, token).await?.err())
    }

    /// Whether the namespace watch this lease learns from is listed and running; until it is, a
    /// waiting attempt reads the object first.
    pub fn watching(&self) -> bool {
        self.synced_epoch() > 0
    }

    /// The requests of the namespace watch this lease uses (shared with every lease of its
    /// session in the namespace).
    pub fn watch_stats(&self) -> KubernetesWatchStats {
        self.hub.counters.stats()
    }
}

impl KubernetesBackend {
    async fn try_acquire_inner(
        &self,
        settings: &LeaseSettings,
    ) -> Result<AcquireAttempt<KubernetesTenure>, KubernetesError> {
        let api = self.api()?;
        let owner = settings.owner();
        // While the namespace watch is synced, what it delivered is the object now (up to its
        // delay): decide from it without a read. A claim on a stale view fails its
        // compare-and-swap, and the next round reads.
        let mut cached = self.current_view();
        for _ in 0..MAX_CAS_ATTEMPTS {
            let current = match cached.take() {
                Some(View::Present(lease)) => Some((*lease).clone()),
                Some(View::Absent { .. }) => None,
                None => self.get(&api).await?,
            };
            let Some(current) = current else {
                let claim = self.new_object(settings);
                let sent = self.claim_sent(&claim);
                match self.answered(sent, self.create(&api, &claim).await) {
                    Ok(created) => return Ok(self.acquired(created)),
                    Err(e) if e.status_code() == Some(409) => continue,
                    Err(e) => return Err(e),
                }
            };
            let holder = holder_of(&current).map(str::to_owned);
            let free = match holder.as_deref() {
                None => true,
                Some(h) if h == owner => true,
                Some(_) => {
                    let observed = self.observed();
                    observed.is_some_and(|o| {
                        Some(&o.version) == current.metadata.resource_version.as_ref()
                            && Instant::now() >= o.expires_at()
                    })
                }
            };
            if !free {
                let expires_at = self.observed().map(|o| o.expires_at());
                return Ok(AcquireAttempt::HeldByOther { holder, expires_at });
            }
            let claim = self.claimed(current, settings)?;
            let sent = self.claim_sent(&claim);
            match self.answered(sent, self.update(&api, &claim).await) {
                Ok(updated) => return Ok(self.acquired(updated)),
                // 409: someone wrote first; 404: deleted meanwhile. Read again and decide.
                Err(e) if matches!(e.status_code(), Some(409) | Some(404)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(KubernetesError::Conflict {
            object: self.object.clone(),
            attempts: MAX_CAS_ATTEMPTS,
        })
    }

    async fn renew_inner(
        &self,
        settings: &LeaseSettings,
        tenure: &mut KubernetesTenure,
    ) -> Result<RenewOutcome, KubernetesError> {
        let api = self.api()?;
        let start = Instant::now();
        let renew_time = now_micro();
        let mut next = (*tenure.lease).clone();
        let spec = next.spec.get_or_insert_with(LeaseSpec::default);
        spec.renew_time = Some(renew_time.clone());
        spec.lease_duration_seconds = Some(duration_secs(settings.ttl()));
        if tenure.unconfirmed.len() >= MAX_UNCONFIRMED {
            tenure.unconfirmed.remove(0);
        }
        // Remembered before sending: if the answer is lost (the call is cancelled by its timeout),
        // a later renewal can still recognise this write in the object.
        tenure.unconfirmed.push((renew_time, start));
        match self.update(&api, &next).await {
            Ok(updated) => {
                self.adopt(tenure, updated);
                tenure.unconfirmed.clear();
                return Ok(RenewOutcome::Renewed { valid_from: None });
            }
            Err(e) if e.status_code() == Some(404) => {
                return Ok(RenewOutcome::Lost(LostReason::Deleted))
            }
            Err(e) if e.status_code() == Some(409) => {
                // This write did not land; find out why.
                tenure.unconfirmed.pop();
            }
            Err(e) => return Err(e),
        }
        let Some(current) = self.get(&api).await? else {
            return Ok(RenewOutcome::Lost(LostReason::Deleted));
        };
        let token = FencingToken::new(tenure.transitions as u64);
        if let Some(reason) = Self::loss_in(&current, settings.owner(), token) {
            return Ok(RenewOutcome::Lost(reason));
        }
        // Still our tenure. If the object carries the renewTime of an earlier renewal whose answer
        // was lost, that renewal landed: its validity counts from the start of its call.
        let landed = current
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .and_then(|t| tenure.unconfirmed.iter().find(|(sent, _)| sent == t))
            .map(|(_, started)| *started);
        self.adopt(tenure, Arc::new(current));
        match landed {
            Some(started) => {
                tenure.unconfirmed.clear();
                tracing::debug!(object = %self.object, "an earlier renewal whose answer was lost had landed");
                Ok(RenewOutcome::Renewed {
                    valid_from: Some(started),
                })
            }
            // Someone else changed the object (an annotation, a label) without taking it: nothing
            // of ours renewed it. Retry with the new resourceVersion.
            None => Err(KubernetesError::Conflict {
                object: self.object.clone(),
                attempts: 1,
            }),
        }
    }

    async fn release_inner(
        &self,
        settings: &LeaseSettings,
        tenure: KubernetesTenure,
    ) -> Result<ReleaseOutcome, KubernetesError> {
        let api = self.api()?;
        let owner = settings.owner();
        self.lock().tenure_version = None;
        let mut next = released((*tenure.lease).clone());
        for _ in 0..MAX_CAS_ATTEMPTS {
            match self.update(&api, &next).await {
                Ok(_) => return Ok(ReleaseOutcome::Released),
                Err(e) if e.status_code() == Some(404) => return Ok(ReleaseOutcome::Released),
                Err(e) if e.status_code() == Some(409) => {}
                Err(e) => return Err(e),
            }
            let Some(current) = self.get(&api).await? else {
                return Ok(ReleaseOutcome::Released);
            };
            match holder_of(&current) {
                None => return Ok(ReleaseOutcome::Released),
                // Still this tenure (the conflict was one of our own renewals whose answer was
                // lost, or an edit that did not take the lease): release it over that version.
                // The same owner with other `leaseTransitions` is a newer tenure, started by
                // another instance with this owner identity: not ours to clear.
                Some(holder)
                    if holder == owner && transitions_of(&current) == tenure.transitions =>
                {
                    next = released(current)
                }
                Some(holder) => {
                    return Ok(ReleaseOutcome::HeldByOther {
                        holder: Some(holder.to_owned()),
                    })
                }
            }
        }
        Err(KubernetesError::Conflict {
            object: self.object.clone(),
            attempts: MAX_CAS_ATTEMPTS,
        })
    }
}

impl LeaseBackend for KubernetesBackend {
    type Tenure = KubernetesTenure;
    type Error = KubernetesError;

    /// The API server and namespace, for a lease built from [`KubernetesSettings`]; `None` (no
    /// duplicate check) for one built with a ready client, whose server is not known.
    fn store_id(&self) -> Option<String> {
        match &self.client {
            ClientSource::Session(session) => Some(format!(
                "kubernetes:{}/{}",
                session.cluster_url(),
                self.namespace
            )),
            ClientSource::Ready(_) => None,
        }
    }

    // The calls are boxed: their futures (kube's request futures inside) are a few KB, and a
    // task that awaits one (a lease's renewal task) would carry that size for its whole life.
    async fn try_acquire(
        &self,
        settings: &LeaseSettings,
    ) -> Result<AcquireAttempt<KubernetesTenure>, KubernetesError> {
        Box::pin(self.try_acquire_inner(settings)).await
    }

    async fn renew(
        &self,
        settings: &LeaseSettings,
        tenure: &mut KubernetesTenure,
    ) -> Result<RenewOutcome, KubernetesError> {
        Box::pin(self.renew_inner(settings, tenure)).await
    }

    async fn release(
        &self,
        settings: &LeaseSettings,
        tenure: KubernetesTenure,
    ) -> Result<ReleaseOutcome, KubernetesError> {
        Box::pin(self.release_inner(settings, tenure)).await
    }

    /// Releases a claim of this instance whose answer never arrived, if the object still shows
    /// it (this owner, and the claim's own `acquireTime`), with a compare-and-swap on what was
    /// read; costs one read, and only after such a claim.
    async fn release_unanswered(&self, settings: &LeaseSettings) -> Result<(), KubernetesError> {
        let pending = self.lock().unanswered.clone();
        if pending.is_empty() {
            return Ok(());
        }
        let api = self.api()?;
        for _ in 0..MAX_CAS_ATTEMPTS {
            let current = self.get(&api).await?;
            let ours = current.as_ref().is_some_and(|lease| {
                holder_of(lease) == Some(settings.owner())
                    && lease
                        .spec
                        .as_ref()
                        .and_then(|s| s.acquire_time.as_ref())
                        .is_some_and(|t| pending.contains(t))
            });
            let Some(current) = current.filter(|_| ours) else {
                self.lock().unanswered.clear();
                return Ok(());
            };
            match self.update(&api, &released(current)).await {
                Ok(_) => {
                    tracing::debug!(object = %self.object, "released a claim whose answer had been lost");
                    self.lock().unanswered.clear();
                    return Ok(());
                }
                Err(e) if e.status_code() == Some(404) => {
                    self.lock().unanswered.clear();
                    return Ok(());
                }
                Err(e) if e.status_code() == Some(409) => {}
                Err(e) => return Err(e),
            }
        }
        Err(KubernetesError::Conflict {
            object: self.object.clone(),
            attempts: MAX_CAS_ATTEMPTS,
        })
    }

    async fn watch_lost(
        &self,
        settings: &LeaseSettings,
        token: FencingToken,
    ) -> Result<LostReason, KubernetesError> {
        let Some(subscription) = self.subscription() else {
            return Err(KubernetesError::Runtime {
                reason: "the lease's namespace watch needs a Tokio runtime".into(),
            });
        };
        let mut changes = subscription.changes();
        loop {
            self.fold();
            if let Some(view) = subscription.latest().view {
                if let Some(reason) = Box::pin(self.judge(&view, settings, token)).await? {
                    return Ok(reason);
                }
            }
            if !changes.next().await {
                return Err(KubernetesError::Runtime {
                    reason: "the lease's namespace watch ended with its runtime".into(),
                });
            }
        }
    }

    fn notifies_changes(&self) -> bool {
        true
    }

    async fn wait_for_change(&self, settings: &LeaseSettings, not_after: Instant) {
        let owner = settings.owner();
        // When to give up waiting: `not_after`, or when the observed claim expires; `None` when
        // the lease is free for this owner already.
        let wake_at = |observed: &Observed| match observed.holder.as_deref() {
            None => None,
            Some(holder) if holder == owner => None,
            Some(_) => Some(observed.expires_at().min(not_after)),
        };
        let retry_delay = settings.acquire_retry_delay();
        let Some(subscription) = self.subscription() else {
            tokio::time::sleep_until(not_after.min(Instant::now() + retry_delay)).await;
            return;
        };
        let mut changes = subscription.changes();
        // Without a synced watch, or a current view of the object, the caller's next attempt
        // reads the object: no later than the retry delay after that was seen (the caller may
        // have passed its whole deadline as `not_after`).
        let mut unsynced_since: Option<Instant> = None;
        loop {
            self.fold();
            if matches!(self.lock().known, Some((View::Absent { .. }, _))) {
                return;
            }
            let mut wake = match self.observed() {
                None => not_after.min(Instant::now() + retry_delay),
                Some(observed) => match wake_at(&observed) {
                    None => return,
                    Some(wake) => wake,
                },
            };
            if subscription.status().synced && self.current_view().is_some() {
                unsynced_since = None;
            } else {
                wake = wake.min(*unsynced_since.get_or_insert_with(Instant::now) + retry_delay);
            }
            if wake <= Instant::now() {
                return;
            }
            tokio::select! {
                running = changes.next() => if !running {
                    tokio::time::sleep_until(wake.min(Instant::now() + retry_delay)).await;
                    return;
                },
                () = tokio::time::sleep_until(wake) => return,
            }
        }
    }
}

fn post_params() -> PostParams {
    PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    }
}

/// `lease` without its `managedFields`, as it is kept: about half of the object's size, and an
/// update that omits them leaves them as they are.
pub(super) fn slim(mut lease: LeaseObject) -> LeaseObject {
    lease.metadata.managed_fields = None;
    lease
}

/// `lease` without a holder.
fn released(mut lease: LeaseObject) -> LeaseObject {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.renew_time = Some(now_micro());
    lease
}

/// The holder, `None` when the object has none (absent or empty, as client-go writes it).
fn holder_of(lease: &LeaseObject) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

fn transitions_of(lease: &LeaseObject) -> i32 {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0)
        .max(0)
}

/// The claim's duration; a missing or non-positive `leaseDurationSeconds` counts as one second
/// (an object written by something else without a duration is not held for long).
fn duration_of(lease: &LeaseObject) -> Duration {
    let secs = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .unwrap_or(1)
        .max(1);
    Duration::from_secs(secs as u64)
}

/// The TTL in whole seconds, rounded up (a contender must never wait less than the TTL).
fn duration_secs(ttl: Duration) -> i32 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

/// Now, at the microsecond precision the API server stores (so that a written value compares
/// equal to what is read back).
fn now_micro() -> MicroTime {
    let now = k8s_openapi::jiff::Timestamp::now();
    let micros = now.as_microsecond();
    MicroTime(k8s_openapi::jiff::Timestamp::from_microsecond(micros).unwrap_or(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_rounded_up_to_whole_seconds() {
        assert_eq!(duration_secs(Duration::from_secs(3)), 3);
        assert_eq!(duration_secs(Duration::from_millis(3001)), 4);
        assert_eq!(duration_secs(Duration::from_millis(200)), 1);
        assert_eq!(duration_secs(Duration::from_secs(u64::MAX / 2)), i32::MAX);
    }

    fn object(holder: Option<&str>, transitions: Option<i32>) -> LeaseObject {
        LeaseObject {
            metadata: ObjectMeta {
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_transitions: transitions,
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn empty_holders_are_no_holders() {
        assert_eq!(holder_of(&object(Some(""), None)), None);
        assert_eq!(holder_of(&object(None, None)), None);
        assert_eq!(holder_of(&object(Some("a"), None)), Some("a"));
        assert_eq!(transitions_of(&object(None, None)), 0);
        assert_eq!(transitions_of(&object(None, Some(-3))), 0);
    }

    #[test]
    fn losses_are_recognised() {
        let token = FencingToken::new(4);
        assert_eq!(
            KubernetesBackend::loss_in(&object(Some("a"), Some(4)), "a", token),
            None
        );
        assert_eq!(
            KubernetesBackend::loss_in(&object(Some("b"), Some(5)), "a", token),
            Some(LostReason::TakenOver {
                holder: Some("b".into())
            })
        );
        assert_eq!(
            KubernetesBackend::loss_in(&object(Some("a"), Some(5)), "a", token),
            Some(LostReason::TakenOver {
                holder: Some("a".into())
            }),
            "a newer tenure of the same owner identity is not ours"
        );
        assert!(matches!(
            KubernetesBackend::loss_in(&object(None, Some(4)), "a", token),
            Some(LostReason::Inconsistent(_))
        ));
    }

    #[test]
    fn micro_time_round_trips_exactly() {
        let t = now_micro();
        let json = serde_json::to_string(&t).unwrap();
        let back: MicroTime = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t, "{json}");
    }

    #[tokio::test]
    async fn observation_clock_restarts_only_on_a_new_version() {
        let backend = KubernetesBackend::with_client_for_tests("n");
        let mut lease = object(Some("b"), Some(1));
        lease.spec.as_mut().unwrap().lease_duration_seconds = Some(3);
        backend.observe(&lease);
        let first = backend.observed().unwrap();
        assert_eq!(first.duration, Duration::from_secs(3));
        tokio::time::sleep(Duration::from_millis(20)).await;
        backend.observe(&lease);
        assert_eq!(
            backend.observed().unwrap().first_seen,
            first.first_seen,
            "same version"
        );
        lease.metadata.resource_version = Some("8".into());
        backend.observe(&lease);
        assert!(
            backend.observed().unwrap().first_seen > first.first_seen,
            "new version"
        );
    }

    impl KubernetesBackend {
        /// A backend whose client is never built (for tests that send nothing).
        fn with_client_for_tests(name: &str) -> Self {
            let mut config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
            config.default_namespace = "ns".into();
            let session = KubernetesSession::from_config(&config).unwrap();
            Self::with_session(name, &session)
        }
    }

    /// How a fake API server answers watch requests.
    #[derive(Clone, Copy)]
    enum WatchAnswer {
        /// The headers of a watch, then nothing on that connection (as a half-open one would).
        Silent,
        /// An empty watch stream, ended after this long (a proxy that cuts long responses).
        EndAfter(Duration),
    }

    /// The body of a fake answer: `data`, then the end after `end` (never: `forever`).
    struct FakeBody {
        data: Option<bytes::Bytes>,
        end: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
        forever: bool,
    }

    impl http_body::Body for FakeBody {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            use std::future::Future;
            if let Some(data) = self.data.take() {
                return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data))));
            }
            if self.forever {
                return std::task::Poll::Pending;
            }
            match self.end.as_mut() {
                None => std::task::Poll::Ready(None),
                Some(sleep) => sleep.as_mut().poll(cx).map(|()| None),
            }
        }
    }

    /// A backend of lease `n` in namespace `ns` of a fake API server (a service, no sockets, so
    /// that the paused clock rules everything): it answers a list of leases with lease `n` held
    /// by `a` (token 1) at version 41, and a watch as `answer` says; it reports each request line
    /// with the instant it arrived.
    fn fake_backend(
        answer: WatchAnswer,
    ) -> (
        KubernetesBackend,
        tokio::sync::mpsc::UnboundedReceiver<(Instant, String)>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let line = format!("{} {}", request.method(), request.uri());
            let _ = tx.send((Instant::now(), line.clone()));
            async move {
                let body = if line.contains("watch=true") {
                    FakeBody {
                        data: None,
                        forever: matches!(answer, WatchAnswer::Silent),
                        end: match answer {
                            WatchAnswer::Silent => None,
                            WatchAnswer::EndAfter(after) => {
                                Some(Box::pin(tokio::time::sleep(after)))
                            }
                        },
                    }
                } else {
                    FakeBody {
                        forever: false,
                        end: None,
                        data: Some(bytes::Bytes::from_static(br#"{"kind":"LeaseList","apiVersion":"coordination.k8s.io/v1","metadata":{"resourceVersion":"41"},"items":[{"metadata":{"name":"n","namespace":"ns","resourceVersion":"41"},"spec":{"holderIdentity":"a","leaseDurationSeconds":15,"leaseTransitions":1}}]}"#)),
                    }
                };
                Ok::<_, std::convert::Infallible>(http::Response::new(body))
            }
        });
        let client = Client::new(service, "ns");
        let backend = KubernetesBackend::with_client("n", client, "ns").unwrap();
        (backend, rx)
    }

    /// The watch requests among `requests` received within `within`.
    async fn watch_requests(
        requests: &mut tokio::sync::mpsc::UnboundedReceiver<(Instant, String)>,
        count: usize,
        within: Duration,
    ) -> Vec<(Instant, String)> {
        let mut seen = Vec::new();
        tokio::time::timeout(within, async {
            while seen.len() < count {
                let request = requests.recv().await.unwrap();
                if request.1.contains("watch=true") {
                    seen.push(request);
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{count} watch requests within {within:?}: {seen:?}"));
        seen
    }

    /// The namespace watch on a connection that went half-open (headers, then nothing, and no
    /// read timeout in the client) does not hang forever: it is replaced once the server should
    /// have ended it, from the same version, and the tenure is still watched.
    #[tokio::test(start_paused = true)]
    async fn a_silent_watch_is_replaced_after_its_server_side_timeout() {
        let (backend, mut requests) = fake_backend(WatchAnswer::Silent);
        backend.lock().tenure_version = Some("41".into());
        let settings = LeaseSettings::new("n", "a").unwrap();
        let watch = backend.watch_lost(&settings, FencingToken::new(1));
        let mut watch = std::pin::pin!(watch);
        let server_timeout = Duration::from_secs(u64::from(watch::WATCH_TIMEOUT_SECS));
        let seen = tokio::select! {
            done = &mut watch => panic!("the watch ended: {done:?}"),
            seen = watch_requests(&mut requests, 3, server_timeout * 3) => seen,
        };
        for (_, line) in &seen {
            assert!(line.starts_with("GET "), "{line}");
            assert!(line.contains("watch=true"), "{line}");
            assert!(line.contains("resourceVersion=41"), "{line}");
        }
        for pair in seen.windows(2) {
            let gap = pair[1].0 - pair[0].0;
            assert!(
                gap >= server_timeout,
                "re-opened after {gap:?}, before the server could have ended it"
            );
            assert!(gap <= server_timeout + Duration::from_secs(6), "{gap:?}");
        }
        assert!(backend.watch_stats().watch_requests >= 3);
        assert_eq!(backend.watch_stats().listings, 1, "no relist");
    }

    /// A watch stream that the server (or a proxy) ends every 100 ms is re-opened at most once
    /// per floor delay, not in a tight loop; the watch stays synced meanwhile.
    #[tokio::test(start_paused = true)]
    async fn a_watch_ended_early_is_reopened_after_the_floor_delay() {
        let (backend, mut requests) =
            fake_backend(WatchAnswer::EndAfter(Duration::from_millis(100)));
        backend.lock().tenure_version = Some("41".into());
        let settings = LeaseSettings::new("n", "a").unwrap();
        let watch = backend.watch_lost(&settings, FencingToken::new(1));
        let mut watch = std::pin::pin!(watch);
        const REOPENS: usize = 10;
        let seen = tokio::select! {
            done = &mut watch => panic!("the watch ended: {done:?}"),
            seen = watch_requests(&mut requests, REOPENS + 1, WATCH_FLOOR * (REOPENS as u32 + 5)) => seen,
        };
        for pair in seen.windows(2) {
            let gap = pair[1].0 - pair[0].0;
            assert!(
                gap >= WATCH_FLOOR,
                "re-opened {gap:?} after the previous one"
            );
        }
        let stats = backend.watch_stats();
        assert!(stats.floored >= REOPENS as u64, "{stats:?}");
        assert_eq!(stats.listings, 1, "no relist: {stats:?}");
        assert!(backend.watching(), "an early end is not a failure");
    }

    #[test]
    fn an_object_of_another_lease_name_is_refused() {
        let backend = KubernetesBackend::with_client_for_tests("mine");
        let mut lease = object(Some("a"), Some(1));
        assert!(
            backend.check_owner_name(&lease).is_ok(),
            "no annotation (client-go)"
        );
        lease.metadata.annotations = Some(BTreeMap::from([(
            LEASE_NAME_ANNOTATION.to_owned(),
            "theirs".to_owned(),
        )]));
        let err = backend.check_owner_name(&lease).unwrap_err();
        assert!(
            matches!(err, KubernetesError::NameCollision { .. }),
            "{err}"
        );
    }

    #[test]
    fn the_provider_factory_reads_its_section() {
        let factory = provider_factory();
        let settings = LeaseSettings::new("n", "o").unwrap();
        let err = factory(
            settings.clone(),
            Some(&serde_json::json!({ "namespace": "ns", "token-fiel": "/x" })),
        )
        .unwrap_err();
        assert!(err.to_string().contains("token-fiel"), "{err}");
        let err = factory(
            settings.clone(),
            Some(&serde_json::json!({ "api-url": "https://h" })),
        )
        .unwrap_err();
        assert!(err.to_string().contains("namespace"), "{err}");
        // A complete section is validated (here: the token file does not exist).
        let err = factory(
            settings,
            Some(&serde_json::json!({
                "namespace": "ns", "token-file": "/nonexistent/token", "ca-file": "/nonexistent/ca"
            })),
        )
        .unwrap_err();
        let err = err.downcast_ref::<KubernetesError>().expect("typed");
        assert!(
            matches!(
                err,
                KubernetesError::ReadFile {
                    field: "token-file",
                    ..
                }
            ),
            "{err}"
        );
    }

    /// The provider's cache: equal settings get the same session while one of its users lives,
    /// a new one after the last is gone (the cache holds none alive), other settings another one.
    #[test]
    fn equal_sections_share_one_session_while_it_is_used() {
        let dir = std::env::temp_dir().join(format!(
            "actix-coordination-k8s-sessions-{}",
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
        let k8s = || {
            KubernetesSettings::new("ns")
                .with_api_url("http://127.0.0.1:1")
                .with_token_file(&token)
                .with_ca_file(&ca)
        };
        let cache = SessionCache::default();
        let a = cache.get(k8s()).unwrap();
        let b = cache.get(k8s()).unwrap();
        assert_eq!(a.session_id(), b.session_id());
        let lease = KubernetesBackend::with_session("n", &b);
        assert_eq!(lease.session().unwrap().session_id(), a.session_id());
        let other = cache.get(k8s().with_token("t")).unwrap();
        assert_ne!(other.session_id(), a.session_id());
        let first = a.session_id();
        drop((a, b, lease));
        assert!(
            cache.0.lock().unwrap()[&k8s()].upgrade().is_none(),
            "the cache keeps no session alive"
        );
        let again = cache.get(k8s()).unwrap();
        assert_eq!(cache.0.lock().unwrap().len(), 2);
        drop((again, first, other));
    }

    #[test]
    fn settings_and_owner_come_from_the_downward_api_variables() {
        // The only test of this crate that touches these variables.
        let saved: Vec<_> = [NAMESPACE_ENV_NAME, OWNER_ENV_NAME]
            .iter()
            .map(|v| (*v, std::env::var_os(v)))
            .collect();
        std::env::set_var(NAMESPACE_ENV_NAME, "from-env");
        std::env::set_var(OWNER_ENV_NAME, "pod-7f9c8");
        let settings = KubernetesSettings::from_env().unwrap();
        let owner = KubernetesSettings::owner_from_env().unwrap();
        for (var, value) in saved {
            match value {
                Some(value) => std::env::set_var(var, value),
                None => std::env::remove_var(var),
            }
        }
        assert_eq!(settings.namespace(), "from-env");
        assert_eq!(owner, "pod-7f9c8");
    }

    const NAMESPACE_ENV_NAME: &str = "POD_NAMESPACE";
    const OWNER_ENV_NAME: &str = "POD_NAME";
}
