//! [`EtcdBackend`]: the [`LeaseBackend`] of one lease in etcd.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetResponse, KeyValue, KvClient, PutOptions, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use tokio::sync::watch;
use tokio::time::{sleep, Instant};

use super::batch;
use super::claims::{remove_claim, ClaimGuard, Claims, Current, Removal, Target, Unanswered};
use super::session::{Freshness, GrantState, Registration, SessionInner};
use super::value::KeyContent;
use super::watch::HubEvent;
use super::{observe, observe_txn, token_of, EtcdError, EtcdSession};
use crate::backend::{AcquireAttempt, LeaseBackend, ReleaseOutcome, RenewOutcome};
use crate::backoff::Doubling;
use crate::group::{GroupError, GroupWatch};
use crate::lease::{FencingToken, LostReason};
use crate::settings::LeaseSettings;

mod wait;

/// How many times one acquire attempt starts over at once (a lost etcd lease, a racing change).
const CLAIM_ROUNDS: usize = 3;
/// The pauses between the attempts of a release that finds the cluster unavailable: 25 ms,
/// doubling up to 200 ms.
const RELEASE_RETRY: Doubling =
    Doubling::new(Duration::from_millis(25), Duration::from_millis(200));

/// The [`LeaseBackend`] of one lease stored in etcd; see [`EtcdLease`](super::EtcdLease).
pub struct EtcdBackend {
    session: EtcdSession,
    key: Vec<u8>,
    /// What the backend's background clean-ups share with it.
    claims: Arc<Claims>,
    /// Where another owner was last seen holding the key (for `wait_for_change`).
    observed: Mutex<Option<Observed>>,
    /// `wait_for_change` just saw the key deleted: the next attempt claims without reading first.
    seen_deleted: AtomicBool,
    /// The `mod_revision` of the last preference for another owner seen on the key (see
    /// `value.rs`), and when this instance first saw it: others may claim one window later.
    preference: Mutex<Option<(i64, Instant)>>,
    /// Until when the last attempt left the key to a preferred holder (for `wait_for_change`).
    deferred_until: Mutex<Option<Instant>>,
    /// `wait_for_change` just saw the key released to this owner, at this `mod_revision`: the
    /// next attempt claims over it at once, without reading first.
    preferred_here: Mutex<Option<i64>>,
    /// `wait_for_change` just saw the key handed to this owner (put in its name on an etcd
    /// lease) at this `mod_revision`, on this etcd lease, with this value: the next attempt
    /// takes it up without a write if that is this owner's etcd lease (see `hand_over`).
    handed_here: Mutex<Option<Handed>>,
    /// Releases that handed the key over to another owner's etcd lease.
    handed_over: AtomicU64,
    /// Keys handed to this owner that an attempt took up without a write.
    taken_up: AtomicU64,
    /// The highest revision of any tenure this backend had: a key in this owner's name at that
    /// revision or below is an old claim of its own, never taken up as a new tenure (tokens
    /// rise).
    highest_tenure: AtomicI64,
    /// Claiming transactions sent.
    claims_sent: AtomicU64,
    /// Claiming transactions whose compare failed (the key was there, or changed).
    claims_refused: AtomicU64,
    /// Attempts that found another owner holding the key (by a read or a refused claim).
    seen_held: AtomicU64,
    /// Waits for a change of the key that the session's group watch answered.
    changes_seen_in_group: AtomicU64,
    /// Loss watches that found the history compacted and watched on after reading the key.
    compacted_watch_resumes: AtomicU64,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("key", &String::from_utf8_lossy(&self.key))
            .finish_non_exhaustive()
    }
}

/// What the backend remembers of a tenure: the key's revision and the shared etcd lease it is
/// attached to.
///
/// Dropping a tenure that was not released (the lease was dropped, like a crash) leaves its key to
/// expire: `ttl` later the session deletes it if it is still this tenure's (compare-and-swap on the
/// revision, retried until it succeeds or the compare fails), even when the shared etcd lease is
/// still renewed for other leases.
pub struct EtcdTenure {
    key: Vec<u8>,
    revision: i64,
    ttl: Duration,
    operation_timeout: Duration,
    registration: Registration,
    session: Arc<SessionInner>,
    claims: Arc<Claims>,
    /// Whether this tenure's watch, started from the claim, is established and unbroken.
    watch_ok: Arc<AtomicBool>,
    settled: bool,
}

impl std::fmt::Debug for EtcdTenure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTenure")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("revision", &self.revision)
            .field("lease_id", &format_args!("{:x}", self.lease_id()))
            .finish()
    }
}

impl EtcdTenure {
    /// The revision of the claiming write (the tenure's fencing token).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The id of the (shared) etcd lease the key is attached to.
    pub fn lease_id(&self) -> i64 {
        self.registration.grant().id()
    }
}

impl Drop for EtcdTenure {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        // Not released: the key must outlive us by the TTL, so the shared etcd lease must not be
        // revoked for it, and it must go even if that etcd lease stays alive for other leases.
        self.registration.keep_key_attached(true);
        let Some(client) = self.session.connected_client() else {
            return;
        };
        let removal = Removal {
            claims: Arc::clone(&self.claims),
            target: Target::Tenure {
                revision: self.revision,
            },
            grant: Arc::clone(self.registration.grant()),
            not_before: Instant::now() + self.ttl,
            ttl: self.ttl,
            operation_timeout: self.operation_timeout,
        };
        self.session.spawn(removal.run(client, None));
    }
}

/// Where another owner was last seen holding the key: the store revision of that answer, and
/// the key's `mod_revision` then when the answer showed the key (a wait on the session's group
/// watch waits for the key's next version: `wait_for_change`).
#[derive(Debug, Clone, Copy)]
struct Observed {
    revision: i64,
    key_revision: Option<i64>,
}

enum Claim {
    Won {
        revision: i64,
    },
    Held {
        holder: Option<String>,
        revision: i64,
        /// The key's `mod_revision` as found.
        key_revision: i64,
    },
    /// Free, but left to a preferred holder until `until`.
    Deferred {
        until: Instant,
        revision: i64,
    },
    Raced,
}

impl EtcdBackend {
    /// The backend of lease `name` on `session`: key `<prefix><name>`.
    pub fn new(session: &EtcdSession, name: &str) -> Self {
        crate::metrics::backend_registered(super::ETCD_BACKEND, super::ETCD_REQUESTS);
        Self {
            key: session.settings().key(name),
            session: session.clone(),
            claims: Arc::new(Claims {
                key: session.settings().key(name),
                current: Mutex::new(None),
                claim_lock: tokio::sync::Mutex::new(()),
                unanswered: Mutex::new(Vec::new()),
                verified_renewals: AtomicU64::new(0),
                claims_removed: AtomicU64::new(0),
                removals_failed: AtomicU64::new(0),
            }),
            observed: Mutex::new(None),
            changes_seen_in_group: AtomicU64::new(0),
            seen_deleted: AtomicBool::new(false),
            preference: Mutex::new(None),
            deferred_until: Mutex::new(None),
            preferred_here: Mutex::new(None),
            handed_here: Mutex::new(None),
            handed_over: AtomicU64::new(0),
            taken_up: AtomicU64::new(0),
            highest_tenure: AtomicI64::new(0),
            claims_sent: AtomicU64::new(0),
            claims_refused: AtomicU64::new(0),
            seen_held: AtomicU64::new(0),
            compacted_watch_resumes: AtomicU64::new(0),
        }
    }

    /// The etcd key of this lease.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// How many claiming transactions (compare-and-swap writes that put the key) this backend
    /// sent, for tests and cost checks.
    pub fn claims_sent(&self) -> u64 {
        self.claims_sent.load(Ordering::Relaxed)
    }

    /// How many releases handed the key over to another owner's etcd lease
    /// ([`Lease::hand_over`](crate::Lease::hand_over)), for tests and cost checks.
    pub fn handed_over(&self) -> u64 {
        self.handed_over.load(Ordering::Relaxed)
    }

    /// How many acquire attempts took up a key handed over to this owner without writing
    /// anything, for tests and cost checks.
    pub fn taken_up(&self) -> u64 {
        self.taken_up.load(Ordering::Relaxed)
    }

    /// How many of the claiming transactions etcd refused because their compare failed: the key
    /// existed (held by someone), or changed since it was read (a lost race).
    pub fn claims_refused(&self) -> u64 {
        self.claims_refused.load(Ordering::Relaxed)
    }

    /// How many waits for the key held by another owner to change the session's group watch
    /// answered (without a watch of the key's own), for tests and cost checks.
    pub fn changes_seen_in_group(&self) -> u64 {
        self.changes_seen_in_group.load(Ordering::Relaxed)
    }

    /// How many acquire attempts found another owner holding the key, by a read before any
    /// claim (no usable etcd lease yet) or by a refused claim.
    pub fn seen_held(&self) -> u64 {
        self.seen_held.load(Ordering::Relaxed)
    }

    /// How many renewals also read the key to prove it is still this tenure's, because the
    /// tenure's watch was not established or had broken (for tests and cost checks: none while
    /// the watch works).
    pub fn verified_renewals(&self) -> u64 {
        self.claims.verified_renewals.load(Ordering::Relaxed)
    }

    /// How many keys of claims nobody held any more (a claim whose answer never arrived, a
    /// dropped tenure) this backend's clean-up deleted.
    pub fn claims_removed(&self) -> u64 {
        self.claims.claims_removed.load(Ordering::Relaxed)
    }

    /// How many attempts to remove such a key failed (unreachable etcd, a timeout) and were
    /// retried.
    pub fn claim_removals_failed(&self) -> u64 {
        self.claims.removals_failed.load(Ordering::Relaxed)
    }

    /// How many claims whose answer never arrived are still guarded: looked for and removed if
    /// they land, until the etcd lease they name is gone.
    pub fn unanswered_claims(&self) -> usize {
        self.claims.lock_unanswered().len()
    }

    /// How many times the loss watch of a tenure found the history since its claim compacted
    /// (after a broken watch stream), read the key, found it still its own and watched on from
    /// the current revision; for tests, which wait on it instead of for a while.
    pub fn compacted_watch_resumes(&self) -> u64 {
        self.compacted_watch_resumes.load(Ordering::Acquire)
    }

    /// Sends one claiming transaction and counts it.
    async fn claim_txn(
        &self,
        kv: &mut KvClient,
        txn: Txn,
        lease_id: i64,
    ) -> Result<TxnResponse, EtcdError> {
        self.claims_sent.fetch_add(1, Ordering::Relaxed);
        let response = observe_txn(kv.txn(txn).await)
            .map_err(|e| EtcdError::from_client("claim", lease_id, e))?;
        if !response.succeeded() {
            self.claims_refused.fetch_add(1, Ordering::Relaxed);
        }
        Ok(response)
    }

    fn inner(&self) -> &Arc<SessionInner> {
        &self.session.inner
    }

    fn key_lossy(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }

    /// One claiming transaction (and the compare-and-swap over our own old claim, if that is what
    /// it finds).
    async fn claim(
        &self,
        kv: &mut KvClient,
        owner: &str,
        value: &[u8],
        lease_id: i64,
        preferred_here: Option<i64>,
    ) -> Result<Claim, EtcdError> {
        let put = || {
            TxnOp::put(
                self.key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease_id)),
            )
        };
        let get = || TxnOp::get(self.key.clone(), None);
        // A plain claim goes in a batch with the others this session sends about now (a node
        // claiming what a crashed node held): a few transactions, not one per key.
        let batched = match preferred_here {
            None => {
                let claim = batch::Write {
                    key: self.key.clone(),
                    expect: batch::Expect::Absent,
                    value: value.to_vec(),
                    lease_id,
                };
                batch::write(self.inner(), claim).await
            }
            Some(_) => batch::Batched::Alone,
        };
        let (revision, current) = match batched {
            batch::Batched::Written { revision } => {
                self.claims_sent.fetch_add(1, Ordering::Relaxed);
                return Ok(Claim::Won { revision });
            }
            batch::Batched::Refused { revision, current } => {
                self.claims_sent.fetch_add(1, Ordering::Relaxed);
                self.claims_refused.fetch_add(1, Ordering::Relaxed);
                (revision, current)
            }
            batch::Batched::Alone => {
                // Free: the key is absent; or, when the watch just saw it released to this
                // owner, it still holds that release (one compare-and-swap, no read first).
                let free = match preferred_here {
                    None => Compare::create_revision(self.key.clone(), CompareOp::Equal, 0),
                    Some(revision) => {
                        Compare::mod_revision(self.key.clone(), CompareOp::Equal, revision)
                    }
                };
                let txn = Txn::new().when([free]).and_then([put()]).or_else([get()]);
                let response = self.claim_txn(kv, txn, lease_id).await?;
                let revision = header_revision(&response, "claim")?;
                if response.succeeded() {
                    return Ok(Claim::Won { revision });
                }
                (revision, first_kv(&response))
            }
        };
        let Some(current) = current else {
            return Ok(Claim::Raced);
        };
        match KeyContent::parse(current.value()) {
            KeyContent::Holder(holder) if holder != owner => {
                return Ok(Claim::Held {
                    holder: Some(holder),
                    revision,
                    key_revision: current.mod_revision(),
                });
            }
            KeyContent::Holder(_) => {
                if self.may_take_up(
                    current.value(),
                    current.lease(),
                    current.mod_revision(),
                    owner,
                    value,
                    lease_id,
                ) {
                    self.taken_up.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(key = %self.key_lossy(), revision = current.mod_revision(), "took up the lease key handed to this owner");
                    return Ok(Claim::Won {
                        revision: current.mod_revision(),
                    });
                }
            }
            KeyContent::Preferred { target, window } => {
                if let Some(until) =
                    self.defer_until(owner, current.mod_revision(), &target, window)
                {
                    return Ok(Claim::Deferred { until, revision });
                }
            }
        }
        // Our own claim (an answer we never got, or a tenure we could not release), or a key
        // released to a preferred holder that this owner may take now: a new tenure over it,
        // compare-and-swap on the revision we saw, so that the token moves on.
        let txn = Txn::new()
            .when([Compare::mod_revision(
                self.key.clone(),
                CompareOp::Equal,
                current.mod_revision(),
            )])
            .and_then([put()])
            .or_else([get()]);
        let response = self.claim_txn(kv, txn, lease_id).await?;
        let revision = header_revision(&response, "claim")?;
        Ok(if response.succeeded() {
            Claim::Won { revision }
        } else {
            Claim::Raced
        })
    }

    /// Whether a key with `current` value, etcd lease and revision was handed to `owner` (whose
    /// claims write `value` on etcd lease `lease_id`) and may be taken up as a new tenure
    /// without a write: in the handover's form (no claim writes it, so another owner did), on
    /// this very etcd lease, by an owner without metadata (a claim writes it; a handover carries
    /// none), newer than any tenure this backend had, and no claim of ours unanswered.
    fn may_take_up(
        &self,
        current: &[u8],
        current_lease: i64,
        revision: i64,
        owner: &str,
        value: &[u8],
        lease_id: i64,
    ) -> bool {
        KeyContent::handed_to(current).as_deref() == Some(owner)
            && value == owner.as_bytes()
            && current_lease == lease_id
            && revision > self.highest_tenure.load(Ordering::Relaxed)
            && self.claims.lock_unanswered().is_empty()
    }

    fn lock_observed(&self) -> MutexGuard<'_, Option<Observed>> {
        self.observed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers that the key was seen held by another owner (or left to a preferred holder) at
    /// store revision `revision`, with the key at `key_revision` when that is known.
    fn saw_held(&self, revision: i64, key_revision: Option<i64>) {
        *self.lock_observed() = Some(Observed {
            revision,
            key_revision,
        });
    }

    /// For a key released to `target` for `window` at `mod_revision`: until when `owner` leaves
    /// it to `target` (one window after this instance first saw that preference, on its
    /// monotonic clock), `None` when it may claim it now.
    fn defer_until(
        &self,
        owner: &str,
        mod_revision: i64,
        target: &str,
        window: Duration,
    ) -> Option<Instant> {
        if target == owner {
            return None;
        }
        let now = Instant::now();
        let first_seen = {
            let mut seen = self.preference.lock().unwrap_or_else(|p| p.into_inner());
            match *seen {
                Some((revision, at)) if revision == mod_revision => at,
                _ => {
                    *seen = Some((mod_revision, now));
                    now
                }
            }
        };
        let until = first_seen + window;
        (now < until).then_some(until)
    }

    /// The answer of an attempt that leaves the key to a preferred holder until `until`.
    fn deferred(&self, until: Instant, revision: i64) -> AcquireAttempt<EtcdTenure> {
        self.saw_held(revision, None);
        *self
            .deferred_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(until);
        self.seen_held.fetch_add(1, Ordering::Relaxed);
        AcquireAttempt::HeldByOther {
            holder: None,
            expires_at: Some(until),
        }
    }

    /// Reads the key: `Some` when another owner holds it (and remembers the revision at which
    /// it was seen, for `wait_for_change`).
    async fn held_by_other(
        &self,
        kv: &mut KvClient,
        owner: &str,
    ) -> Result<Option<AcquireAttempt<EtcdTenure>>, EtcdError> {
        let response = self.read_key(kv).await?;
        let Some(current) = response.kvs().first() else {
            return Ok(None);
        };
        let revision = response.header().map_or(0, |h| h.revision());
        let holder = match KeyContent::parse(current.value()) {
            KeyContent::Holder(holder) if holder == owner => return Ok(None),
            KeyContent::Holder(holder) => {
                self.saw_held(revision, Some(current.mod_revision()));
                holder
            }
            KeyContent::Preferred { target, window } => {
                return Ok(self
                    .defer_until(owner, current.mod_revision(), &target, window)
                    .map(|until| self.deferred(until, revision)));
            }
        };
        self.seen_held.fetch_add(1, Ordering::Relaxed);
        Ok(Some(AcquireAttempt::HeldByOther {
            holder: Some(holder),
            expires_at: None,
        }))
    }

    /// A release: the key deleted; with [`Giving::Prefer`] overwritten with that preference;
    /// with [`Giving::HandTo`] put on the target's etcd lease in its name (a plain release if
    /// etcd no longer has that lease).
    async fn release_giving(
        &self,
        settings: &LeaseSettings,
        mut tenure: EtcdTenure,
        mut giving: Giving<'_>,
    ) -> Result<ReleaseOutcome, EtcdError> {
        let mut kv = self.inner().client().await?.kv_client();
        let txn = |giving: &Giving<'_>| {
            let write = match giving {
                Giving::Delete => TxnOp::delete(self.key.clone(), None),
                Giving::Prefer(preferred) => TxnOp::put(
                    self.key.clone(),
                    KeyContent::preference(preferred, settings.ttl()),
                    Some(PutOptions::new().with_lease(tenure.lease_id())),
                ),
                Giving::HandTo { target, lease_id } => TxnOp::put(
                    self.key.clone(),
                    KeyContent::handed(target, settings.owner()),
                    Some(PutOptions::new().with_lease(*lease_id)),
                ),
            };
            Txn::new()
                .when([Compare::mod_revision(
                    self.key.clone(),
                    CompareOp::Equal,
                    tenure.revision,
                )])
                .and_then([write])
                .or_else([TxnOp::get(self.key.clone(), None)])
        };
        // With several endpoints, a request may go to a member that is down (connection refused)
        // while the others answer, several times in a row: retry an unavailable cluster until
        // the caller's operation timeout ends the call (`ManagedLease` bounds every release by
        // it; the compare makes a repeated delete harmless). Three attempts were not enough on a
        // loaded machine with a member down (`fencing_tokens_rise_across_leader_changes`). An
        // error in the end leaves the tenure unsettled: its key is removed one TTL later, as
        // after a crash.
        // A handover goes in a batch with the others this session sends about now (a node
        // leaving hands all its shards on at once): a few transactions, not one per key.
        if let Giving::HandTo { target, lease_id } = &giving {
            let handover = batch::Write {
                key: self.key.clone(),
                expect: batch::Expect::Revision(tenure.revision),
                value: KeyContent::handed(target, settings.owner()),
                lease_id: *lease_id,
            };
            if let batch::Batched::Written { .. } = batch::write(self.inner(), handover).await {
                tenure.settled = true;
                self.claims.lock_current().take();
                self.handed_over.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(key = %self.key_lossy(), %target, lease_id = %format_args!("{lease_id:x}"), "handed the lease key over, in a batch");
                return Ok(ReleaseOutcome::Released);
            }
        }
        let mut pauses = RELEASE_RETRY;
        let mut attempts = 1u32;
        let response = loop {
            match observe_txn(kv.txn(txn(&giving)).await) {
                Ok(response) => break response,
                Err(error) => {
                    let error = EtcdError::from_client("release", tenure.lease_id(), error);
                    if let (EtcdError::LeaseNotFound { .. }, Giving::HandTo { target, .. }) =
                        (&error, &giving)
                    {
                        // The target's etcd lease is gone (it stopped or lost it): nothing was
                        // written; release plainly.
                        tracing::debug!(key = %self.key_lossy(), %target, "the handover target's etcd lease is gone: releasing plainly");
                        giving = Giving::Delete;
                        continue;
                    }
                    if !matches!(error, EtcdError::Unavailable { .. }) {
                        return Err(error);
                    }
                    tracing::debug!(%error, attempt = attempts, "release failed; retrying");
                    attempts += 1;
                    sleep(pauses.next().unwrap_or_default()).await;
                }
            }
        };
        tenure.settled = true;
        self.claims.lock_current().take();
        if response.succeeded() {
            if let Giving::HandTo { target, lease_id } = &giving {
                self.handed_over.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(key = %self.key_lossy(), %target, lease_id = %format_args!("{lease_id:x}"), "handed the lease key over");
            }
            if matches!(giving, Giving::Prefer(_)) {
                // The preference lives on the tenure's etcd lease: left to expire, not revoked,
                // if this was its last user (a contender leaves it to the target for one window
                // at most in any case).
                tenure.registration.keep_key_attached(true);
            }
            return Ok(ReleaseOutcome::Released);
        }
        Ok(match first_kv(&response) {
            None => ReleaseOutcome::Released,
            Some(kv) => match KeyContent::holder(kv.value()) {
                // Released to a preferred holder by whoever held it last: not held.
                None => ReleaseOutcome::Released,
                Some(holder) => {
                    tracing::debug!(key = %self.key_lossy(), holder = %holder, owner = %settings.owner(), "release found another claim");
                    ReleaseOutcome::HeldByOther {
                        holder: Some(holder),
                    }
                }
            },
        })
    }

    /// One range request for the key.
    async fn read_key(&self, kv: &mut KvClient) -> Result<GetResponse, EtcdError> {
        observe("range", kv.get(self.key.clone(), None).await)
            .map_err(|e| EtcdError::from_client("read the lease key", 0, e))
    }

    /// Reads the key: whether it is absent (free), released to a preferred holder, handed to
    /// `owner`, or held.
    async fn key_now(&self, owner: &str) -> Result<KeyNow, EtcdError> {
        let mut kv = self.inner().client().await?.kv_client();
        let response = self.read_key(&mut kv).await?;
        Ok(match response.kvs().first() {
            None => KeyNow::Absent,
            Some(kv) => match KeyContent::holder(kv.value()) {
                None => KeyNow::Preferred,
                Some(holder) if holder == owner => KeyNow::HandedHere(Handed::of(kv)),
                Some(_) => KeyNow::Held,
            },
        })
    }

    /// Remembers that the key was seen handed to this owner, for the next attempt.
    fn seen_handed(&self, handed: Handed) {
        tracing::trace!(key = %self.key_lossy(), revision = handed.revision, "the key was handed to this owner");
        *self.handed_here.lock().unwrap_or_else(|p| p.into_inner()) = Some(handed);
    }

    /// What the key looks like now compared with tenure `token`: `None` while it is still ours.
    async fn loss_now(&self, token: FencingToken) -> Result<(Option<LostReason>, i64), EtcdError> {
        let mut kv = self.inner().client().await?.kv_client();
        let response = self.read_key(&mut kv).await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let reason = match response.kvs().first() {
            None => Some(LostReason::Deleted),
            Some(kv) if token_of(kv.mod_revision()) == token => None,
            Some(kv) => Some(LostReason::TakenOver {
                holder: KeyContent::holder(kv.value()),
            }),
        };
        Ok((reason, revision))
    }
}

/// A key seen handed to this owner: its `mod_revision`, etcd lease and value.
struct Handed {
    revision: i64,
    lease_id: i64,
    value: Vec<u8>,
}

impl Handed {
    fn of(kv: &KeyValue) -> Self {
        Self {
            revision: kv.mod_revision(),
            lease_id: kv.lease(),
            value: kv.value().to_vec(),
        }
    }
}

/// What a read of the key found (see `EtcdBackend::key_now`).
enum KeyNow {
    Absent,
    Preferred,
    HandedHere(Handed),
    Held,
}

/// What a release writes.
enum Giving<'a> {
    /// Deletes the key.
    Delete,
    /// Overwrites it with a preference for this owner, on the tenure's etcd lease.
    Prefer(&'a str),
    /// Puts it in `target`'s name on `target`'s etcd lease.
    HandTo { target: &'a str, lease_id: i64 },
}

fn header_revision(response: &TxnResponse, operation: &'static str) -> Result<i64, EtcdError> {
    response
        .header()
        .map(|h| h.revision())
        .filter(|r| *r > 0)
        .ok_or(EtcdError::UnexpectedResponse {
            operation,
            detail: "no revision in the response header".into(),
        })
}

fn first_kv(response: &TxnResponse) -> Option<KeyValue> {
    response.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get.kvs().first().cloned(),
        _ => None,
    })
}

/// Whether a tenure's watch is established; reset when the watch ends.
struct WatchOk(Option<Arc<AtomicBool>>);

impl WatchOk {
    fn set(&self, ok: bool) {
        if let Some(flag) = &self.0 {
            flag.store(ok, Ordering::Release);
        }
    }
}

impl Drop for WatchOk {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Resolves with the grant's loss reason once it is lost; never without a grant.
async fn grant_lost(state: &mut Option<watch::Receiver<GrantState>>) -> String {
    if let Some(receiver) = state.as_mut() {
        if let Ok(state) = receiver.wait_for(|s| s.lost.is_some()).await {
            return state.lost.clone().unwrap_or_default();
        }
    }
    std::future::pending().await
}

impl LeaseBackend for EtcdBackend {
    type Tenure = EtcdTenure;
    type Error = EtcdError;

    /// The cluster (its endpoints, sorted) and the key prefix.
    fn store_id(&self) -> Option<String> {
        let settings = self.session.settings();
        let mut endpoints = settings.endpoints().to_vec();
        endpoints.sort();
        Some(format!(
            "etcd:{}:{}",
            endpoints.join(","),
            settings.prefix()
        ))
    }

    async fn try_acquire(
        &self,
        settings: &LeaseSettings,
    ) -> Result<AcquireAttempt<EtcdTenure>, EtcdError> {
        let inner = self.inner();
        let client = inner.client().await?;
        let mut kv = client.kv_client();
        let owner = settings.owner();
        let value = KeyContent::held_by(owner, settings.metadata());
        for _ in 0..CLAIM_ROUNDS {
            let preferred_here = self
                .preferred_here
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let handed = self
                .handed_here
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let just_freed = self.seen_deleted.swap(false, Ordering::Relaxed)
                || preferred_here.is_some()
                || handed.is_some();
            if !just_freed && !inner.has_usable_grant(settings) {
                // Read before granting: a contender that finds the lease held needs no etcd lease.
                // (Skipped right after the watch saw the key deleted: it is most likely free.)
                if let Some(held) = self.held_by_other(&mut kv, owner).await? {
                    return Ok(held);
                }
            }
            let registration = inner.register(&client, settings).await?;
            let grant = Arc::clone(registration.grant());
            // From before the claim is sent until its tenure is recorded: see `Claims`.
            let _claiming = self.claims.claim_lock.lock().await;
            let guard = ClaimGuard {
                session: Arc::clone(inner),
                claims: Arc::clone(&self.claims),
                client: client.clone(),
                grant: Arc::clone(&grant),
                value: value.clone(),
                sent: Instant::now(),
                ttl: settings.ttl(),
                operation_timeout: settings.operation_timeout(),
                armed: true,
            };
            // A key handed to this owner on this very etcd lease is taken up without a write, at
            // the handover's revision: it lives as long as this etcd lease (so its validity is
            // the lease's, like a claim's), and any later change to it is seen by the tenure's
            // watch, which starts after that revision. Otherwise (another etcd lease, metadata
            // to write) a compare-and-swap over the key makes it a claim of ours.
            let take_up = handed.filter(|h| {
                self.may_take_up(&h.value, h.lease_id, h.revision, owner, &value, grant.id())
            });
            let claim = match take_up {
                Some(handed) => {
                    self.taken_up.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(key = %self.key_lossy(), revision = handed.revision, "took up the lease key handed to this owner");
                    Ok(Claim::Won {
                        revision: handed.revision,
                    })
                }
                None => {
                    self.claim(&mut kv, owner, &value, grant.id(), preferred_here)
                        .await
                }
            };
            let answered = match &claim {
                Ok(_) => true,
                Err(error) => matches!(
                    error,
                    EtcdError::LeaseNotFound { .. }
                        | EtcdError::Rejected { .. }
                        | EtcdError::PermissionDenied { .. }
                        | EtcdError::Unauthenticated { .. }
                ),
            };
            if answered {
                // Applied, refused or rejected: nothing unknown is left in the store.
                guard.disarm();
            }
            match claim {
                Ok(Claim::Won { revision }) => {
                    self.highest_tenure.fetch_max(revision, Ordering::Relaxed);
                    let token = token_of(revision);
                    let watch_ok = Arc::new(AtomicBool::new(false));
                    *self.claims.lock_current() = Some(Current {
                        token,
                        grant: Arc::clone(&grant),
                        watch_ok: Arc::clone(&watch_ok),
                    });
                    tracing::debug!(key = %self.key_lossy(), revision, lease_id = %format_args!("{:x}", grant.id()), "claimed the lease key");
                    return Ok(AcquireAttempt::Acquired {
                        tenure: EtcdTenure {
                            key: self.key.clone(),
                            revision,
                            ttl: settings.ttl(),
                            operation_timeout: settings.operation_timeout(),
                            registration,
                            session: Arc::clone(inner),
                            claims: Arc::clone(&self.claims),
                            watch_ok,
                            settled: false,
                        },
                        token,
                        // The key lives as long as the shared etcd lease, which etcd keeps at
                        // least `ttl` after receiving its latest keep-alive.
                        valid_from: Some(grant.state().last_ok),
                    });
                }
                Ok(Claim::Held {
                    holder,
                    revision,
                    key_revision,
                }) => {
                    tracing::trace!(key = %self.key_lossy(), ?holder, revision, "the claim found the key held");
                    self.saw_held(revision, Some(key_revision));
                    self.seen_held.fetch_add(1, Ordering::Relaxed);
                    return Ok(AcquireAttempt::HeldByOther {
                        holder,
                        expires_at: None,
                    });
                }
                Ok(Claim::Deferred { until, revision }) => {
                    tracing::trace!(key = %self.key_lossy(), revision, "the claim found the key left to a preferred holder");
                    return Ok(self.deferred(until, revision));
                }
                Ok(Claim::Raced) => {}
                Err(EtcdError::LeaseNotFound { lease_id }) => {
                    grant.lose(format!("etcd lease {lease_id:x} not found by a claim"));
                }
                Err(error) => return Err(error),
            }
        }
        Err(EtcdError::Conflict {
            key: self.key_lossy(),
        })
    }

    async fn renew(
        &self,
        _settings: &LeaseSettings,
        tenure: &mut EtcdTenure,
    ) -> Result<RenewOutcome, EtcdError> {
        // No I/O of its own while the tenure's watch is established: the shared etcd lease's
        // periodic keep-alive (the latest, or the one due now) extends this key too, and the
        // watch proves the key is still ours. The renewal is valid from when that keep-alive was
        // sent, and the next one is planned one interval later: when the next keep-alive is due.
        let grant = Arc::clone(tenure.registration.grant());
        let start = Instant::now();
        let keep_alive = grant.fresh_keep_alive(start);
        let freshness = if tenure.watch_ok.load(Ordering::Acquire) {
            keep_alive.await
        } else {
            // The watch is not established (or broke): the renewal proves ownership itself, with
            // a read of the key in the same round as the keep-alive.
            self.claims
                .verified_renewals
                .fetch_add(1, Ordering::Relaxed);
            let token = token_of(tenure.revision);
            let (freshness, key) = tokio::join!(keep_alive, self.loss_now(token));
            if let Some(reason) = key?.0 {
                return Ok(RenewOutcome::Lost(reason));
            }
            freshness
        };
        match freshness {
            Freshness::Renewed(sent) => Ok(RenewOutcome::Renewed {
                valid_from: Some(sent),
            }),
            Freshness::Failed(message) => Err(EtcdError::KeepAliveFailing {
                lease_id: grant.id(),
                message,
            }),
            Freshness::Lost(reason) => Ok(RenewOutcome::Lost(LostReason::Expired {
                last_error: Some(reason),
            })),
        }
    }

    async fn release(
        &self,
        settings: &LeaseSettings,
        tenure: EtcdTenure,
    ) -> Result<ReleaseOutcome, EtcdError> {
        self.release_giving(settings, tenure, Giving::Delete).await
    }

    /// The key is not deleted but overwritten with the preference (see `value.rs`), on the
    /// tenure's own etcd lease and in the same compare-and-swap on the tenure's revision; the
    /// window is the releasing owner's TTL.
    fn records_preference(&self) -> bool {
        true
    }

    async fn release_to(
        &self,
        settings: &LeaseSettings,
        tenure: EtcdTenure,
        preferred: &str,
    ) -> Result<ReleaseOutcome, EtcdError> {
        self.release_giving(settings, tenure, Giving::Prefer(preferred))
            .await
    }

    /// The key is put in `target`'s name on `target`'s own etcd lease (the one a group watch of
    /// this session last saw it hold a key with), in the same compare-and-swap on the tenure's
    /// revision: etcd deletes it when `target` stops renewing, and `target` takes it up without
    /// a write when its watch shows it (see `wait_for_change`). With no etcd lease known for
    /// `target`, or one etcd no longer has, it is a plain release.
    async fn hand_over(
        &self,
        settings: &LeaseSettings,
        tenure: EtcdTenure,
        target: &str,
    ) -> Result<ReleaseOutcome, EtcdError> {
        let giving = match self.inner().holder_lease(target) {
            Some(lease_id) => Giving::HandTo { target, lease_id },
            None => Giving::Delete,
        };
        self.release_giving(settings, tenure, giving).await
    }

    async fn watch_lost(
        &self,
        _settings: &LeaseSettings,
        token: FencingToken,
    ) -> Result<LostReason, EtcdError> {
        let (grant, watch_ok) = self
            .claims
            .lock_current()
            .as_ref()
            .filter(|c| c.token == token)
            .map(|c| (Arc::clone(&c.grant), Arc::clone(&c.watch_ok)))
            .unzip();
        let mut grant_state = grant.as_ref().map(|g| g.subscribe());
        // Established from the claim's revision on, until this call ends.
        let watch_ok = WatchOk(watch_ok);
        let revision = i64::try_from(token.value()).unwrap_or(i64::MAX);
        let mut watch = self
            .inner()
            .watch(self.key.clone(), revision.saturating_add(1), false)
            .await?;
        loop {
            let event = tokio::select! {
                reason = grant_lost(&mut grant_state) => {
                    return Ok(LostReason::Expired { last_error: Some(reason) });
                }
                event = watch.next() => event,
            };
            match event {
                Some(HubEvent::Created { .. }) => watch_ok.set(true),
                Some(HubEvent::Events(events)) => {
                    // Every write after our claim is someone else's: the tenure never writes.
                    if let Some(event) = events.first() {
                        return Ok(match event.event_type() {
                            EventType::Delete => LostReason::Deleted,
                            EventType::Put => LostReason::TakenOver {
                                holder: event.kv().and_then(|kv| KeyContent::holder(kv.value())),
                            },
                        });
                    }
                }
                Some(HubEvent::Canceled {
                    compact_revision,
                    reason,
                }) => {
                    if compact_revision <= 0 {
                        return Err(EtcdError::Watch {
                            message: format!("etcd cancelled the watch: {reason}"),
                        });
                    }
                    // History before `compact_revision` is gone: look at the key itself, and
                    // watch on from there if it is still ours.
                    watch_ok.set(false);
                    let (lost, now) = self.loss_now(token).await?;
                    if let Some(reason) = lost {
                        return Ok(reason);
                    }
                    watch = self
                        .inner()
                        .watch(self.key.clone(), now.saturating_add(1), false)
                        .await?;
                    self.compacted_watch_resumes.fetch_add(1, Ordering::Release);
                }
                Some(HubEvent::Broken(message)) => return Err(EtcdError::Watch { message }),
                None => {
                    return Err(EtcdError::Watch {
                        message: "the session's watch stream stopped".into(),
                    })
                }
            }
        }
    }

    async fn release_unanswered(&self, _settings: &LeaseSettings) -> Result<(), EtcdError> {
        let pending: Vec<Arc<Unanswered>> = self.claims.lock_unanswered().clone();
        if pending.is_empty() {
            return Ok(());
        }
        let client = self.inner().client().await?;
        for unanswered in pending {
            // The background removal goes on too: it checks again one TTL after the claim.
            remove_claim(&self.claims, &client, &Target::Unanswered(unanswered))
                .await
                .map_err(|e| EtcdError::from_client("remove an unanswered claim", 0, e))?;
        }
        Ok(())
    }

    /// One range and one watch on the key prefix `<session prefix><prefix>`, shared by every
    /// group watch of that prefix on the session and run on the session's own thread (so it
    /// needs no runtime of the caller's); see [`EtcdLease`](super::EtcdLease), "Group watches".
    fn watch_group(&self, prefix: &str) -> Result<GroupWatch, GroupError> {
        self.inner().watch_group(prefix)
    }

    fn notifies_changes(&self) -> bool {
        true
    }

    async fn wait_for_change(&self, settings: &LeaseSettings, not_after: Instant) {
        self.wait_for_key_change(settings, not_after).await;
    }
}
