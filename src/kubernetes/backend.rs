//! [`KubernetesBackend`]: the [`LeaseBackend`] of one lease, its requests and its
//! compare-and-swap rounds (the semantics are documented on [`KubernetesLease`](super::KubernetesLease)).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::Api;
use kube::Client;
use tokio::time::Instant;

use super::bound::BoundState;
use super::observed::{Observed, State};
use super::record::{
    bind, binding_of, clear_handed, duration_secs, handed_shards_of, holder_of, incarnation_of,
    now_micro, post_params, preferred_of, released, released_to, set_leaving, set_watching_since,
    slim, transitions_of,
};
use super::watch::{Subscription, View, WatchHub};
use super::{object_name, settings, KubernetesError, KubernetesSession, KubernetesSettings};
use crate::backend::{AcquireAttempt, LeaseBackend, ReleaseOutcome, RenewOutcome};
use crate::backoff::Doubling;
use crate::binding::{Binding, BindingAnchor};
use crate::group::{GroupError, GroupWatch};
use crate::lease::{FencingToken, LostReason};
use crate::protocol::{self, RecordSeen};
use crate::settings::LeaseSettings;
use crate::vocab::BackendError;

/// Compare-and-swap rounds within one call before giving up with [`KubernetesError::Conflict`].
const MAX_CAS_ATTEMPTS: u32 = 4;
/// The pauses between the tries of a release refused for now: 25 ms, doubling up to 400 ms.
const RELEASE_RETRY: Doubling =
    Doubling::new(Duration::from_millis(25), Duration::from_millis(400));
/// Unconfirmed renewals remembered (renewals whose answer was lost) before the oldest are forgotten.
const MAX_UNCONFIRMED: usize = 16;

/// How a tenure is given up.
#[derive(Clone, Copy)]
enum Giving<'a> {
    /// A plain release.
    Release,
    /// A release naming a preferred next holder.
    Prefer(&'a str),
    /// A handover to a target (a plain release where it cannot be written).
    HandTo(&'a str),
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
    /// `create`, `update` and `delete` requests the API server refused with `409 Conflict`
    /// (someone else wrote first: a lost compare-and-swap race); counted in `creates`, `updates`
    /// and `deletes` too.
    pub conflicts: u64,
    /// Tenures given up with a handover to a named target ([`Lease::hand_over`](crate::Lease::hand_over)),
    /// in one update (counted in `updates` too).
    pub handed_over: u64,
    /// Tenures taken up without a write: records handed over to this owner (see
    /// [`HANDED_OVER_AFTER_ANNOTATION`](super::HANDED_OVER_AFTER_ANNOTATION)).
    pub taken_up: u64,
    /// `delete` requests: objects of leases given up for good ([`Lease::retire`](crate::Lease::retire)).
    pub deletes: u64,
}

impl KubernetesStats {
    /// Every request but watches: what a lease costs per operation.
    pub fn requests(&self) -> u64 {
        self.gets + self.creates + self.updates + self.deletes
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) gets: AtomicU64,
    creates: AtomicU64,
    pub(super) updates: AtomicU64,
    conflicts: AtomicU64,
    pub(super) handed_over: AtomicU64,
    pub(super) taken_up: AtomicU64,
    pub(super) deletes: AtomicU64,
}

pub(super) enum ClientSource {
    Ready(Client),
    Session(KubernetesSession),
}

/// The [`LeaseBackend`] of one lease on a Kubernetes API server; see [`KubernetesLease`](super::KubernetesLease).
///
/// One backend serves one lease instance: it remembers what it observed of its object (the
/// `resourceVersion` and when it first saw it), which is what expiry is judged by.
pub struct KubernetesBackend {
    pub(super) client: ClientSource,
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) object: String,
    pub(super) state: Mutex<State>,
    pub(super) counters: Counters,
    pub(super) hub: Arc<WatchHub>,
    /// The namespace watch subscription, made at first use and again when its watch ended.
    pub(super) subscription: Mutex<Option<Arc<Subscription>>>,
    /// Whether the API server refused to delete the object (RBAC): `retire` then releases.
    pub(super) delete_forbidden: AtomicBool,
    /// Whether the API server refused to patch the object (RBAC, a Role from before `patch`
    /// was asked for): claims then read and replace, as they did.
    pub(super) patch_forbidden: AtomicBool,
    /// The member lease this lease's tenures are bound to ([`LeaseBackend::bound_to`]): asked
    /// before each write of a bound record this owner held.
    pub(super) anchor: std::sync::OnceLock<BindingAnchor>,
    /// Whether renewals mark the tenure leaving ([`LeaseBackend::mark_leaving`]).
    pub(super) leaving: AtomicBool,
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

/// What the backend remembers of a tenure it holds.
#[derive(Debug, Clone)]
pub struct KubernetesTenure {
    /// The object as this backend last wrote (or adopted) it; its `resourceVersion` is what the
    /// next write compares against.
    pub(super) lease: Arc<LeaseObject>,
    pub(super) transitions: i32,
    /// Renewals sent since the last confirmed one (their answer was lost or not yet received):
    /// the `renewTime` each wrote, and when the call started.
    pub(super) unconfirmed: Vec<(MicroTime, Instant)>,
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
    /// The backend of lease `name` on the API server described by `k8s`, on the process's shared
    /// session for `k8s` ([`KubernetesSession::shared`]).
    ///
    /// # Errors
    ///
    /// See [`KubernetesLease::new`](super::KubernetesLease::new).
    pub fn new(name: &str, k8s: &KubernetesSettings) -> Result<Self, KubernetesError> {
        Ok(Self::with_session(
            name,
            &KubernetesSession::shared(k8s.clone())?,
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

    pub(super) fn build(name: &str, client: ClientSource, namespace: String) -> Self {
        crate::metrics::backend_registered(
            super::KUBERNETES_BACKEND,
            super::client::KUBERNETES_REQUESTS,
        );
        let hub = match &client {
            ClientSource::Ready(client) => Arc::new(WatchHub::new(client.clone(), None)),
            ClientSource::Session(session) => Arc::clone(session.hub()),
        };
        Self {
            hub,
            subscription: Mutex::new(None),
            client,
            namespace,
            name: name.to_owned(),
            object: object_name(name),
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            delete_forbidden: AtomicBool::new(false),
            patch_forbidden: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            anchor: std::sync::OnceLock::new(),
        }
    }

    /// Whether this owner may write `record` (a release, or another way of giving it up), a
    /// record of its tenure with fencing token `token`, as it stands now: the one door of every
    /// such write ([`protocol::may_write_own`]; a bound record only while the member tenure it
    /// names lives by this process's clock).
    pub(super) fn may_write_own(&self, record: &LeaseObject, owner: &str, token: i32) -> bool {
        let binding = binding_of(record);
        let live = self.anchor.get().and_then(BindingAnchor::live);
        protocol::may_write_own(
            RecordSeen {
                holder: holder_of(record),
                token: transitions_of(record).max(0) as u64,
                binding: binding.as_ref(),
            },
            owner,
            token.max(0) as u64,
            live.as_ref(),
        )
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
            handed_over: self.counters.handed_over.load(Ordering::Relaxed),
            taken_up: self.counters.taken_up.load(Ordering::Relaxed),
            deletes: self.counters.deletes.load(Ordering::Relaxed),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn api(&self) -> Result<Api<LeaseObject>, KubernetesError> {
        let client = match &self.client {
            ClientSource::Ready(client) => client.clone(),
            ClientSource::Session(session) => session.client(),
        };
        Ok(Api::namespaced(client, &self.namespace))
    }

    pub(super) fn error(&self, verb: &'static str, error: kube::Error) -> KubernetesError {
        KubernetesError::from_kube(error, verb, &self.object, &self.namespace)
    }

    /// [`Self::error`] for a write, counting a refused compare-and-swap.
    pub(super) fn write_error(&self, verb: &'static str, error: kube::Error) -> KubernetesError {
        let error = self.error(verb, error);
        if error.status_code() == Some(409) {
            self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        error
    }

    pub(super) async fn get(
        &self,
        api: &Api<LeaseObject>,
    ) -> Result<Option<LeaseObject>, KubernetesError> {
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

    pub(super) async fn create(
        &self,
        api: &Api<LeaseObject>,
        lease: &LeaseObject,
    ) -> Result<Arc<LeaseObject>, KubernetesError> {
        self.counters.creates.fetch_add(1, Ordering::Relaxed);
        let lease = &self.with_watching_since(lease);
        let sent = Instant::now();
        let created = api
            .create(&post_params(), lease)
            .await
            .map_err(|e| self.write_error("create", e))?;
        Ok(self.wrote(self.observe_shared(Arc::new(slim(created))), sent))
    }

    pub(super) async fn update(
        &self,
        api: &Api<LeaseObject>,
        lease: &LeaseObject,
    ) -> Result<Arc<LeaseObject>, KubernetesError> {
        self.counters.updates.fetch_add(1, Ordering::Relaxed);
        let lease = &self.with_watching_since(lease);
        let sent = Instant::now();
        let updated = api
            .replace(&self.object, &post_params(), lease)
            .await
            .map_err(|e| self.write_error("update", e))?;
        Ok(self.wrote(self.observe_shared(Arc::new(slim(updated))), sent))
    }

    /// Writes `claim` as a JSON merge patch (see the `indexed` module): applied only while the
    /// object is at `claim`'s `resourceVersion`, counted as an update.
    pub(super) async fn patch_claim(
        &self,
        api: &Api<LeaseObject>,
        claim: &LeaseObject,
    ) -> Result<Arc<LeaseObject>, KubernetesError> {
        self.counters.updates.fetch_add(1, Ordering::Relaxed);
        let claim = &self.with_watching_since(claim);
        let patch =
            super::indexed::claim_patch(claim).map_err(|e| KubernetesError::InvalidRecord {
                object: self.object.clone(),
                reason: format!("the claim does not serialize: {e}"),
            })?;
        let params = kube::api::PatchParams {
            field_manager: post_params().field_manager,
            ..kube::api::PatchParams::default()
        };
        let sent = Instant::now();
        let patched = api
            .patch(&self.object, &params, &kube::api::Patch::Merge(&patch))
            .await
            .map_err(|e| self.write_error("patch", e))?;
        Ok(self.wrote(self.observe_shared(Arc::new(slim(patched))), sent))
    }

    /// `lease` as written: with how long this process's watch of the namespace has run without
    /// a gap ([`WATCHING_SINCE_ANNOTATION`](super::record::WATCHING_SINCE_ANNOTATION)), so that
    /// the nodes of a group can tell which members judge a record's expiry on time.
    fn with_watching_since(&self, lease: &LeaseObject) -> LeaseObject {
        let mut lease = lease.clone();
        set_watching_since(&mut lease, self.hub.watching_since(&self.namespace));
        lease
    }

    /// Logs that the write sent at `sent` produced `written` (see the `handover` module).
    fn wrote(&self, written: Arc<LeaseObject>, sent: Instant) -> Arc<LeaseObject> {
        if let Some(version) = written.metadata.resource_version.as_deref() {
            self.hub.wrote(&self.object, version, sent);
        }
        written
    }

    /// Records a claim about to be sent (by its `acquireTime`, which only this instance writes),
    /// until its answer arrives: if it never does, the store may hold it, and a `release` without
    /// a tenure removes it ([`LeaseBackend::release_unanswered`]).
    pub(super) fn claim_sent(&self, claim: &LeaseObject) -> Option<MicroTime> {
        let acquired_at = claim.spec.as_ref()?.acquire_time.clone()?;
        self.lock().unanswered.push(acquired_at.clone());
        Some(acquired_at)
    }

    /// The claim `sent` got `result`: forgotten if the API server answered (whatever it said).
    pub(super) fn answered<T>(
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

    pub(super) fn acquired(&self, lease: Arc<LeaseObject>) -> AcquireAttempt<KubernetesTenure> {
        self.tenure_of(lease, None)
    }

    /// The tenure of `lease`, valid from `valid_from` (`None`: from the start of the attempt).
    pub(super) fn tenure_of(
        &self,
        lease: Arc<LeaseObject>,
        valid_from: Option<Instant>,
    ) -> AcquireAttempt<KubernetesTenure> {
        let transitions = transitions_of(&lease);
        {
            let mut state = self.lock();
            state.tenure_version = lease.metadata.resource_version.clone();
            // Whatever an earlier claim left in the store, this tenure supersedes it.
            state.unanswered.clear();
            let token = transitions.max(0) as u64;
            state.highest_token = Some(state.highest_token.map_or(token, |h| h.max(token)));
        }
        AcquireAttempt::Acquired {
            token: FencingToken::new(transitions as u64),
            tenure: KubernetesTenure {
                lease,
                transitions,
                unconfirmed: Vec::new(),
            },
            valid_from,
        }
    }

    pub(super) fn adopt(&self, tenure: &mut KubernetesTenure, lease: Arc<LeaseObject>) {
        self.lock().tenure_version = lease.metadata.resource_version.clone();
        tenure.lease = lease;
    }

    /// `future`, a request with `verb`, bounded by `limit` ([`KubernetesError::Timeout`]).
    pub(super) async fn bounded<T>(
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
    pub(super) async fn tenure_check(
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
}

impl KubernetesBackend {
    /// Deletes the object with a precondition on the tenure's version, or releases it where it
    /// cannot be deleted, or where it lists shards handed on whose records have not moved on
    /// (see the `handing` module).
    pub(super) async fn retire_plainly(
        &self,
        settings: &LeaseSettings,
        tenure: KubernetesTenure,
    ) -> Result<ReleaseOutcome, KubernetesError> {
        let pending = handed_shards_of(&tenure.lease).is_some_and(|handed| {
            handed
                .entries()
                .any(|(incarnation, lease, _, _)| self.still_bound(lease, incarnation))
        });
        if !pending {
            let version = tenure.lease.metadata.resource_version.clone();
            let acquired = self.remember_release(&tenure);
            let deleted = self.delete_retired(version).await;
            self.forget_release(acquired, &deleted);
            if let Some(outcome) = deleted? {
                return Ok(outcome);
            }
        }
        self.release_inner(settings, tenure, Giving::Release).await
    }

    async fn try_acquire_inner(
        &self,
        settings: &LeaseSettings,
        binding: Option<&Binding>,
    ) -> Result<AcquireAttempt<KubernetesTenure>, KubernetesError> {
        let api = self.api()?;
        let owner = settings.owner();
        // While the namespace watch is synced, what it delivered is the object now (up to its
        // delay): decide from it without a read. A claim on a stale view fails its
        // compare-and-swap, and the next round reads.
        let mut cached = self.current_view();
        // No view of its own yet (a shard this node has not waited for): a bound claim is
        // decided from the namespace watch's index instead of a read where it can be.
        if let (None, Some(binding)) = (&cached, binding) {
            if let Some(attempt) = self.claim_from_index(&api, settings, binding).await? {
                return Ok(attempt);
            }
        }
        for _ in 0..MAX_CAS_ATTEMPTS {
            let current = match cached.take() {
                Some(View::Present(lease)) => Some((*lease).clone()),
                Some(View::Absent { .. }) => None,
                None => self.get(&api).await?,
            };
            let Some(current) = current else {
                let mut claim = self.new_object(settings);
                if let Some(binding) = binding {
                    bind(&mut claim, binding);
                }
                let sent = self.claim_sent(&claim);
                match self.answered(sent, self.create(&api, &claim).await) {
                    Ok(created) => return Ok(self.acquired(created)),
                    Err(e) if e.status_code() == Some(409) => continue,
                    Err(e) => return Err(e),
                }
            };
            // A record another holder handed over to this owner: taken up without a write when
            // this instance can tell from its own clock how long it is valid (a bound claim
            // writes its binding instead).
            if let Some(valid_from) = self
                .may_take_up(&current, settings)
                .filter(|_| binding.is_none())
            {
                let mut taken = current;
                clear_handed(&mut taken);
                self.counters.taken_up.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(object = %self.object, "took up a lease handed over to this owner");
                return Ok(self.tenure_of(Arc::new(taken), Some(valid_from)));
            }
            let holder = holder_of(&current).map(str::to_owned);
            // Another holder, or a release that named another preferred holder: free only once
            // its duration has passed since this version was first observed.
            let blocked = match holder.as_deref() {
                Some(h) => h != owner,
                None => preferred_of(&current).is_some_and(|p| p != owner),
            };
            // A bound record of another holder lives by its member record, or by the target's
            // it was listed to (see the `bound` module). So does one of this owner bound to
            // another member tenure than the one it claims under: that tenure ended, and may
            // have listed the record to a target that has not claimed it yet.
            let bound = binding_of(&current);
            let ours_ended =
                holder.as_deref() == Some(owner) && bound.is_some() && bound.as_ref() != binding;
            if let (true, Some(bound), Some(h)) = (blocked || ours_ended, bound, holder.as_deref())
            {
                // Listed to this owner under the member tenure it claims with, or free: claimed
                // with a compare-and-swap (never taken up without a write: see `protocol`).
                let me = binding.map(|b| (owner, b));
                if let BoundState::Held { holder, until } =
                    self.bound_state(&api, &bound, h, me).await?
                {
                    return Ok(AcquireAttempt::HeldByOther {
                        holder: Some(holder),
                        expires_at: until,
                    });
                }
            } else {
                let free = !blocked || {
                    let observed = self.observed();
                    observed.is_some_and(|o| {
                        Some(&o.version) == current.metadata.resource_version.as_ref()
                            && Instant::now() >= o.expires_at()
                    })
                };
                if !free {
                    let expires_at = self.observed().map(|o| o.expires_at());
                    return Ok(AcquireAttempt::HeldByOther { holder, expires_at });
                }
            }
            let mut claim = self.claimed(current, settings)?;
            if let Some(binding) = binding {
                bind(&mut claim, binding);
            }
            let sent = self.claim_sent(&claim);
            tracing::debug!(object = %self.object, "sending the claim");
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
        clear_handed(&mut next);
        if self.leaving.load(Ordering::Relaxed) {
            set_leaving(&mut next);
        }
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

    /// Gives `tenure` up as `giving` says. Until the API server answers, the tenure's claim counts
    /// as one whose outcome is unknown (by its `acquireTime`, as a claim whose answer was lost):
    /// if the release fails or its future is dropped, the claim may still be held, and
    /// [`release_unanswered`](LeaseBackend::release_unanswered) removes it once the API server
    /// answers again (a bound record would otherwise stay held for as long as its member lives).
    async fn release_inner(
        &self,
        settings: &LeaseSettings,
        tenure: KubernetesTenure,
        giving: Giving<'_>,
    ) -> Result<ReleaseOutcome, KubernetesError> {
        let acquired = self.remember_release(&tenure);
        let result = self.release_giving(settings, tenure, giving).await;
        self.forget_release(acquired, &result);
        result
    }

    /// Remembers `tenure`'s claim as possibly held until its release is answered.
    fn remember_release(&self, tenure: &KubernetesTenure) -> Option<MicroTime> {
        let acquired = tenure.lease.spec.as_ref()?.acquire_time.clone()?;
        self.lock().unanswered.push(acquired.clone());
        Some(acquired)
    }

    /// Forgets the claim `acquired` once its release was answered (`result` is `Ok`).
    fn forget_release<T>(&self, acquired: Option<MicroTime>, result: &Result<T, KubernetesError>) {
        if let (Some(acquired), Ok(_)) = (acquired, result) {
            self.lock().unanswered.retain(|t| *t != acquired);
        }
    }

    async fn release_giving(
        &self,
        settings: &LeaseSettings,
        tenure: KubernetesTenure,
        giving: Giving<'_>,
    ) -> Result<ReleaseOutcome, KubernetesError> {
        let api = self.api()?;
        let owner = settings.owner();
        self.lock().tenure_version = None;
        // `spec.preferredHolder` (with its strategy) is written too until an API server refuses
        // it (one that has the fields but not coordinated leader election enabled may): then
        // the annotations alone.
        let mut with_spec = true;
        // The object given up, and whether it is handed over (else released).
        let release = |lease: LeaseObject, with_spec: bool| match giving {
            Giving::Release => Ok((released(lease), false)),
            Giving::Prefer(preferred) => {
                let mut next = released_to(lease, preferred, with_spec);
                // The preference window is one TTL of the released record (not a bound one's).
                next.spec
                    .get_or_insert_with(LeaseSpec::default)
                    .lease_duration_seconds = Some(duration_secs(settings.ttl()));
                Ok((next, false))
            }
            Giving::HandTo(target) => {
                Ok(match self.handed_to(lease.clone(), settings, target)? {
                    Some(handed) => (handed, true),
                    None => (released(lease), false),
                })
            }
        };
        // A bound record is written only while the member tenure it names lives (a record of
        // an ended one is free already, and may be listed to a target: see `protocol`).
        if !self.may_write_own(&tenure.lease, owner, tenure.transitions) {
            tracing::debug!(object = %self.object, "not releasing a bound record whose member tenure ended: it is free by the binding rule");
            return Ok(ReleaseOutcome::Released);
        }
        let (mut next, mut handing) = release((*tenure.lease).clone(), with_spec)?;
        let started = Instant::now();
        tracing::debug!(object = %self.object, handing, "sending the release");
        let mut pauses = RELEASE_RETRY;
        let mut conflicts = 0;
        loop {
            match self.update(&api, &next).await {
                Ok(_) => {
                    if handing {
                        self.counters.handed_over.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(ReleaseOutcome::Released);
                }
                Err(e) if e.status_code() == Some(404) => return Ok(ReleaseOutcome::Released),
                Err(e) if e.status_code() == Some(409) => conflicts += 1,
                Err(e)
                    if e.status_code() == Some(422)
                        && matches!(giving, Giving::Prefer(_))
                        && with_spec =>
                {
                    tracing::debug!(error = %e, "the API server refused spec.preferredHolder; naming the preferred holder in the annotations only");
                    with_spec = false;
                    (next, handing) = release((*tenure.lease).clone(), with_spec)?;
                    continue;
                }
                Err(e)
                    if e.is_transient()
                        && started.elapsed() + pauses.peek() < settings.operation_timeout() / 2 =>
                {
                    let pause = pauses.next().unwrap_or_default();
                    tracing::debug!(error = %e, retry_in = ?pause, "release refused for now; retrying");
                    tokio::time::sleep(pause).await;
                    continue;
                }
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
                    if !self.may_write_own(&current, owner, tenure.transitions) {
                        return Ok(ReleaseOutcome::Released);
                    }
                    (next, handing) = release(current, with_spec)?
                }
                Some(holder) => {
                    return Ok(ReleaseOutcome::HeldByOther {
                        holder: Some(holder.to_owned()),
                    })
                }
            }
            if conflicts >= MAX_CAS_ATTEMPTS {
                return Err(KubernetesError::Conflict {
                    object: self.object.clone(),
                    attempts: MAX_CAS_ATTEMPTS,
                });
            }
        }
    }
}

impl LeaseBackend for KubernetesBackend {
    type Tenure = KubernetesTenure;
    type Error = KubernetesError;

    /// The API server and namespace, for a lease built from [`KubernetesSettings`]; `None` (no
    /// duplicate check) for one built with a ready client, whose server is not known.
    fn store_id(&self) -> Option<String> {
        match &self.client {
            ClientSource::Session(session) => session
                .cluster_url()
                .map(|url| format!("kubernetes:{url}/{}", self.namespace)),
            ClientSource::Ready(_) => None,
        }
    }

    // The calls are boxed: their futures (kube's request futures inside) are a few KB, and a
    // task that awaits one (a lease's renewal task) would carry that size for its whole life.
    async fn try_acquire(
        &self,
        settings: &LeaseSettings,
    ) -> Result<AcquireAttempt<KubernetesTenure>, KubernetesError> {
        Box::pin(self.try_acquire_inner(settings, None)).await
    }

    fn binds(&self) -> bool {
        true
    }

    /// Kept: every write of a bound record this owner held asks it first (see
    /// [`protocol::may_write_own`](crate::protocol::may_write_own)).
    fn bound_to(&self, anchor: &BindingAnchor) {
        let _ = self.anchor.set(anchor.clone());
    }

    /// `<uid>/<leaseTransitions>` of the tenure's object.
    fn incarnation(&self, tenure: &KubernetesTenure) -> Option<String> {
        incarnation_of(&tenure.lease)
    }

    /// The claim names the member lease and its incarnation in the annotations
    /// [`BOUND_TO_ANNOTATION`](super::BOUND_TO_ANNOTATION) and
    /// [`BOUND_INCARNATION_ANNOTATION`](super::BOUND_INCARNATION_ANNOTATION), with
    /// `leaseDurationSeconds` [`BOUND_DURATION_SECS`](super::BOUND_DURATION_SECS); it is written
    /// once and never renewed. A record handed over to this owner is claimed with a write (the
    /// binding), not taken up.
    async fn try_acquire_bound(
        &self,
        settings: &LeaseSettings,
        binding: &Binding,
    ) -> Result<AcquireAttempt<KubernetesTenure>, KubernetesError> {
        Box::pin(self.try_acquire_inner(settings, Some(binding))).await
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
        Box::pin(self.release_inner(settings, tenure, Giving::Release)).await
    }

    /// Deletes the object, with a precondition on the tenure's `resourceVersion` (one request);
    /// a plain release where the API server refuses the delete (see the `retire` module).
    async fn retire(
        &self,
        settings: &LeaseSettings,
        tenure: KubernetesTenure,
    ) -> Result<ReleaseOutcome, KubernetesError> {
        Box::pin(self.retire_plainly(settings, tenure)).await
    }

    /// Releases the member object in one compare-and-swap that lists the shards handed on (the
    /// annotation [`HANDED_SHARDS_ANNOTATION`](super::HANDED_SHARDS_ANNOTATION)), then deletes it
    /// once every listed record moved on (see the `handing` module).
    async fn retire_handing(
        &self,
        settings: &LeaseSettings,
        tenure: KubernetesTenure,
        handed: &[crate::HandedShard],
    ) -> Result<ReleaseOutcome, KubernetesError> {
        Box::pin(self.retire_handing_inner(settings, tenure, handed)).await
    }

    /// Kept by the session, for the release of that member's object as expired (see the `bound`
    /// module).
    /// The renewals write [`LEAVING_ANNOTATION`](super::LEAVING_ANNOTATION) naming the tenure's
    /// incarnation.
    fn mark_leaving(&self) {
        self.leaving.store(true, Ordering::Relaxed);
    }

    fn plan_hand_on(&self, ended: &crate::Binding, handed: Vec<crate::HandedShard>) {
        self.hub.ended.plan(
            &self.namespace,
            &object_name(ended.member()),
            ended.incarnation(),
            handed,
        );
    }

    /// The preferred holder goes in the annotations `actix-coordination/preferred-holder` and
    /// `actix-coordination/preferred-at-transitions` (kept by every API server, and valid only
    /// while the object is free with the same `leaseTransitions`), and in `spec.preferredHolder`
    /// with `spec.strategy` where the API server keeps them (Kubernetes 1.31 and later with
    /// coordinated leader election; others drop them, and one that refuses them gets the
    /// annotations alone). client-go sees an ordinary released Lease.
    fn records_preference(&self) -> bool {
        true
    }

    async fn release_to(
        &self,
        settings: &LeaseSettings,
        tenure: KubernetesTenure,
        preferred: &str,
    ) -> Result<ReleaseOutcome, KubernetesError> {
        Box::pin(self.release_inner(settings, tenure, Giving::Prefer(preferred))).await
    }

    /// The object is handed over in one compare-and-swap on the tenure's `resourceVersion`:
    /// `target` becomes its holder, with the next `leaseTransitions` and this lease's duration,
    /// and the annotations [`HANDED_OVER_BY_ANNOTATION`](super::HANDED_OVER_BY_ANNOTATION) and
    /// [`HANDED_OVER_AFTER_ANNOTATION`](super::HANDED_OVER_AFTER_ANNOTATION), the newest version
    /// of an object held by `target` that this session's namespace watch received: `target`
    /// takes it up without a write when that version is one its own session wrote (it then knows
    /// from its own clock a moment before the handover); otherwise it claims it with a
    /// compare-and-swap. Contenders see a record held by `target` and wait for its expiry. With
    /// no object of `target` known to this session (its watch not synced, or `target` holding
    /// nothing), it is a plain release.
    async fn hand_over(
        &self,
        settings: &LeaseSettings,
        tenure: KubernetesTenure,
        target: &str,
    ) -> Result<ReleaseOutcome, KubernetesError> {
        Box::pin(self.release_inner(settings, tenure, Giving::HandTo(target))).await
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
            // A bound claim only while the member tenure it names lives by this process's
            // clock: one of an ended tenure is free by the binding rule already, and may be
            // listed to a target (see `protocol`).
            let writable = |lease: &LeaseObject| {
                self.may_write_own(lease, settings.owner(), transitions_of(lease))
            };
            let Some(current) = current.filter(|lease| ours && writable(lease)) else {
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
            self.fold(&subscription);
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

    /// A filter over the namespace watch this backend's leases share (started if none runs):
    /// no request of its own. See [`KubernetesLease`](super::KubernetesLease), "Groups".
    fn watch_group(&self, prefix: &str) -> Result<GroupWatch, GroupError> {
        self.hub
            .watch_group(&self.namespace, prefix)
            .map_err(|error| match error {
                KubernetesError::Runtime { .. } => GroupError::NoRuntime,
                other => GroupError::Backend(Arc::new(Box::new(other))),
            })
    }

    fn notifies_changes(&self) -> bool {
        true
    }

    async fn wait_for_change(&self, settings: &LeaseSettings, not_after: Instant) {
        let owner = settings.owner();
        let retry_delay = settings.acquire_retry_delay();
        // When to give up waiting: `not_after`, or when the observed claim expires; `None` when
        // the lease is free for this owner already.
        // A bound record is freed by its member record, whose changes this wait does not
        // follow: the next attempt judges it no later than the retry delay.
        let wake_at = |observed: &Observed| {
            observed.blocks(owner).then(|| {
                if observed.bound {
                    not_after.min(Instant::now() + retry_delay)
                } else {
                    observed.expires_at().min(not_after)
                }
            })
        };
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
            // A change the watch received before this instance subscribed (the release of the
            // holder this attempt's read saw) is delivered no more: the next attempt reads.
            if self.catch_up(&subscription) {
                tracing::debug!(object = %self.object, "the namespace watch received a change of the object before this lease waited; reading it again");
                return;
            }
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
                // The watch ended with the runtime it ran on: what it delivered is not current
                // any more. The caller's next attempt subscribes again (a new watch, on the
                // runtime that runs now) and reads the object.
                running = changes.next() => if !running {
                    return;
                },
                () = tokio::time::sleep_until(wake) => return,
            }
        }
    }
}

#[cfg(test)]
impl KubernetesBackend {
    /// A backend whose client is never built (for tests that send nothing).
    pub(super) fn with_client_for_tests(name: &str) -> Self {
        let mut config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        config.default_namespace = "ns".into();
        let session = KubernetesSession::from_config(&config).unwrap();
        Self::with_session(name, &session)
    }
}

#[cfg(test)]
mod tests;
