//! [`EtcdBackend`]: the [`LeaseBackend`] of one lease in etcd.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, KeyValue, KvClient, PutOptions, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::session::{Freshness, Grant, GrantState, Registration, SessionInner};
use super::watch::HubEvent;
use super::{EtcdError, EtcdSession};
use crate::backend::{AcquireAttempt, LeaseBackend, ReleaseOutcome, RenewOutcome};
use crate::lease::{FencingToken, LostReason};
use crate::settings::LeaseSettings;

/// How many times one acquire attempt starts over at once (a lost etcd lease, a racing change).
const CLAIM_ROUNDS: usize = 3;

/// The [`LeaseBackend`] of one lease stored in etcd; see [`EtcdLease`](super::EtcdLease).
pub struct EtcdBackend {
    session: EtcdSession,
    key: Vec<u8>,
    /// The tenure being watched: its token and shared etcd lease.
    current: Mutex<Option<(FencingToken, Arc<Grant>)>>,
    /// The store revision at which another owner was last seen holding the key.
    observed: Mutex<Option<i64>>,
    /// Claiming transactions sent.
    claims_sent: AtomicU64,
    /// Claiming transactions whose compare failed (the key was there, or changed).
    claims_refused: AtomicU64,
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
/// revision), even when the shared etcd lease is still renewed for other leases.
pub struct EtcdTenure {
    key: Vec<u8>,
    revision: i64,
    ttl: Duration,
    registration: Registration,
    session: Arc<SessionInner>,
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
        let (key, revision, ttl) = (self.key.clone(), self.revision, self.ttl);
        self.session.spawn(async move {
            sleep(ttl).await;
            let txn = Txn::new()
                .when([Compare::mod_revision(key.clone(), CompareOp::Equal, revision)])
                .and_then([TxnOp::delete(key, None)]);
            match timeout(ttl, client.kv_client().txn(txn)).await {
                Ok(Ok(response)) if response.succeeded() => {
                    tracing::debug!(revision, "deleted the key of a dropped lease after its ttl");
                }
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::debug!(%error, "deleting the key of a dropped lease failed; its etcd lease expires it"),
                Err(_) => tracing::debug!("deleting the key of a dropped lease timed out; its etcd lease expires it"),
            }
        });
    }
}

enum Claim {
    Won {
        revision: i64,
    },
    Held {
        holder: Option<String>,
        revision: i64,
    },
    Raced,
}

impl EtcdBackend {
    /// The backend of lease `name` on `session`: key `<prefix><name>`.
    pub fn new(session: &EtcdSession, name: &str) -> Self {
        Self {
            key: session.settings().key(name),
            session: session.clone(),
            current: Mutex::new(None),
            observed: Mutex::new(None),
            claims_sent: AtomicU64::new(0),
            claims_refused: AtomicU64::new(0),
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

    /// How many of the claiming transactions etcd refused because their compare failed: the key
    /// existed (held by someone), or changed since it was read (a lost race).
    pub fn claims_refused(&self) -> u64 {
        self.claims_refused.load(Ordering::Relaxed)
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
        let response = kv
            .txn(txn)
            .await
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
        lease_id: i64,
    ) -> Result<Claim, EtcdError> {
        let put = || {
            TxnOp::put(
                self.key.clone(),
                owner,
                Some(PutOptions::new().with_lease(lease_id)),
            )
        };
        let get = || TxnOp::get(self.key.clone(), None);
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([put()])
            .or_else([get()]);
        let response = self.claim_txn(kv, txn, lease_id).await?;
        let revision = header_revision(&response, "claim")?;
        if response.succeeded() {
            return Ok(Claim::Won { revision });
        }
        let Some(current) = first_kv(&response) else {
            return Ok(Claim::Raced);
        };
        if current.value() != owner.as_bytes() {
            return Ok(Claim::Held {
                holder: Some(String::from_utf8_lossy(current.value()).into_owned()),
                revision,
            });
        }
        // Our own claim (an answer we never got, or a tenure we could not release): a new tenure
        // over it, compare-and-swap on the revision we saw, so that the token moves on.
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

    fn lock_current(&self) -> MutexGuard<'_, Option<(FencingToken, Arc<Grant>)>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_observed(&self) -> MutexGuard<'_, Option<i64>> {
        self.observed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the key looks like now compared with tenure `token`: `None` while it is still ours.
    async fn loss_now(&self, token: FencingToken) -> Result<(Option<LostReason>, i64), EtcdError> {
        let mut kv = self.inner().client().await?.kv_client();
        let response = kv
            .get(self.key.clone(), None)
            .await
            .map_err(|e| EtcdError::from_client("read the lease key", 0, e))?;
        let revision = response.header().map_or(0, |h| h.revision());
        let reason = match response.kvs().first() {
            None => Some(LostReason::Deleted),
            Some(kv) if token_of(kv.mod_revision()) == token => None,
            Some(kv) => Some(LostReason::TakenOver {
                holder: Some(String::from_utf8_lossy(kv.value()).into_owned()),
            }),
        };
        Ok((reason, revision))
    }
}

fn token_of(revision: i64) -> FencingToken {
    FencingToken::new(revision.unsigned_abs())
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
        for _ in 0..CLAIM_ROUNDS {
            let registration = inner.register(&client, settings).await?;
            let grant = Arc::clone(registration.grant());
            match self.claim(&mut kv, owner, grant.id()).await {
                Ok(Claim::Won { revision }) => {
                    let token = token_of(revision);
                    *self.lock_current() = Some((token, Arc::clone(&grant)));
                    tracing::debug!(key = %self.key_lossy(), revision, lease_id = %format_args!("{:x}", grant.id()), "claimed the lease key");
                    return Ok(AcquireAttempt::Acquired {
                        tenure: EtcdTenure {
                            key: self.key.clone(),
                            revision,
                            ttl: settings.ttl(),
                            registration,
                            session: Arc::clone(inner),
                            settled: false,
                        },
                        token,
                        // The key lives as long as the shared etcd lease, which etcd keeps at
                        // least `ttl` after receiving its latest keep-alive.
                        valid_from: Some(grant.state().last_ok),
                    });
                }
                Ok(Claim::Held { holder, revision }) => {
                    *self.lock_observed() = Some(revision);
                    return Ok(AcquireAttempt::HeldByOther {
                        holder,
                        expires_at: None,
                    });
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
        settings: &LeaseSettings,
        tenure: &mut EtcdTenure,
    ) -> Result<RenewOutcome, EtcdError> {
        // No I/O of its own: the shared etcd lease's keep-alive (sent after this call started, or
        // shared with another lease that renewed a moment ago) extends this key too.
        let grant = tenure.registration.grant();
        let start = Instant::now();
        match grant
            .fresh_keep_alive(start, settings.renewal_interval() / 2)
            .await
        {
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
        mut tenure: EtcdTenure,
    ) -> Result<ReleaseOutcome, EtcdError> {
        let mut kv = self.inner().client().await?.kv_client();
        let txn = Txn::new()
            .when([Compare::mod_revision(
                self.key.clone(),
                CompareOp::Equal,
                tenure.revision,
            )])
            .and_then([TxnOp::delete(self.key.clone(), None)])
            .or_else([TxnOp::get(self.key.clone(), None)]);
        // An error leaves the tenure unsettled: its key expires as after a crash.
        let response = kv
            .txn(txn)
            .await
            .map_err(|e| EtcdError::from_client("release", tenure.lease_id(), e))?;
        tenure.settled = true;
        self.lock_current().take();
        if response.succeeded() {
            return Ok(ReleaseOutcome::Released);
        }
        Ok(match first_kv(&response) {
            None => ReleaseOutcome::Released,
            Some(kv) => {
                let holder = String::from_utf8_lossy(kv.value()).into_owned();
                tracing::debug!(key = %self.key_lossy(), holder = %holder, owner = %settings.owner(), "release found another claim");
                ReleaseOutcome::HeldByOther {
                    holder: Some(holder),
                }
            }
        })
    }

    async fn watch_lost(
        &self,
        _settings: &LeaseSettings,
        token: FencingToken,
    ) -> Result<LostReason, EtcdError> {
        let grant = self
            .lock_current()
            .as_ref()
            .filter(|(t, _)| *t == token)
            .map(|(_, g)| Arc::clone(g));
        let mut grant_state = grant.as_ref().map(|g| g.subscribe());
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
                Some(HubEvent::Created) => {}
                Some(HubEvent::Events(events)) => {
                    // Every write after our claim is someone else's: the tenure never writes.
                    if let Some(event) = events.first() {
                        return Ok(match event.event_type() {
                            EventType::Delete => LostReason::Deleted,
                            EventType::Put => LostReason::TakenOver {
                                holder: event
                                    .kv()
                                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
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

    fn notifies_changes(&self) -> bool {
        true
    }

    async fn wait_for_change(&self, settings: &LeaseSettings, not_after: Instant) {
        // Without a working watch, try again after the retry delay, not only at `not_after`
        // (which is the caller's whole deadline when it relies on the notification).
        let retry_at = not_after.min(Instant::now() + settings.acquire_retry_delay());
        // Resume from the revision at which the key was seen held, so that a deletion between
        // that attempt and this watch is not missed.
        let Some(seen) = self.lock_observed().take() else {
            return sleep_until(retry_at).await;
        };
        let wait = async {
            let Ok(mut watch) = self
                .inner()
                .watch(self.key.clone(), seen.saturating_add(1), true)
                .await
            else {
                return sleep_until(retry_at).await;
            };
            loop {
                match watch.next().await {
                    Some(HubEvent::Created) => {}
                    // Deleted (released, expired): try again now. A compacted history also
                    // means "look again".
                    Some(HubEvent::Events(_)) => return,
                    Some(HubEvent::Canceled {
                        compact_revision, ..
                    }) if compact_revision > 0 => return,
                    Some(HubEvent::Canceled { .. } | HubEvent::Broken(_)) | None => {
                        return sleep_until(retry_at).await
                    }
                }
            }
        };
        tokio::select! {
            _ = wait => {}
            _ = sleep_until(not_after) => {}
        }
    }
}
