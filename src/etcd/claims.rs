//! The clean-up of claims nobody will release (a dropped tenure, a claim whose answer never
//! arrived), and what an [`EtcdBackend`](super::EtcdBackend) shares with it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, KvClient, Txn, TxnOp};
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::session::{Grant, SessionInner};
use super::{observe, observe_txn, token_of};
use crate::lease::FencingToken;

/// First delay before retrying a failed removal of a claim; doubles up to a quarter of the TTL.
const REMOVAL_BACKOFF_START: Duration = Duration::from_millis(100);

/// What an [`EtcdBackend`] shares with the background clean-ups of its claims.
pub(super) struct Claims {
    pub(super) key: Vec<u8>,
    /// The tenure being watched.
    pub(super) current: Mutex<Option<Current>>,
    /// Held by a claim from before it is sent until its tenure is recorded in `current`, and by
    /// a removal of an unanswered claim from its read to its delete: a removal never mistakes a
    /// fresh tenure of ours for the unanswered claim.
    pub(super) claim_lock: tokio::sync::Mutex<()>,
    /// Claims whose answer never arrived, until their removal is settled.
    pub(super) unanswered: Mutex<Vec<Arc<Unanswered>>>,
    /// Renewals that read the key because the tenure's watch was not established.
    pub(super) verified_renewals: AtomicU64,
    /// Keys removed by the clean-up of an unanswered claim or a dropped tenure.
    pub(super) claims_removed: AtomicU64,
    /// Removal attempts that failed (and were retried).
    pub(super) removals_failed: AtomicU64,
}

impl Claims {
    pub(super) fn lock_current(&self) -> MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn lock_unanswered(&self) -> MutexGuard<'_, Vec<Arc<Unanswered>>> {
        self.unanswered.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn current_token(&self) -> Option<FencingToken> {
        self.lock_current().as_ref().map(|c| c.token)
    }
}

/// The tenure being watched: its token, shared etcd lease and watch state.
pub(super) struct Current {
    pub(super) token: FencingToken,
    pub(super) grant: Arc<Grant>,
    pub(super) watch_ok: Arc<AtomicBool>,
}

/// A claim that was sent and never answered: it may have been applied.
#[derive(Debug)]
pub(super) struct Unanswered {
    /// The value the claim wrote (the owner, and its metadata).
    pub(super) value: Vec<u8>,
    pub(super) lease_id: i64,
}

/// Which claim a removal deletes.
#[derive(Debug, Clone)]
pub(super) enum Target {
    /// A dropped tenure: the key if its `mod_revision` is still the tenure's.
    Tenure { revision: i64 },
    /// An unanswered claim: the key if it holds our owner on this etcd lease and no tenure of ours
    /// uses it.
    Unanswered(Arc<Unanswered>),
}

/// The outcome of one removal attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Removed {
    /// The key was ours and is deleted.
    Deleted,
    /// The key is not (or no longer) the claim: absent, someone else's, or a live tenure of ours.
    NotThere,
}

/// The clean-up of a claim nobody will release: a dropped tenure, or a claim whose answer never
/// arrived. It runs on the session's runtime, holds no session handle, and ends when its
/// compare-and-swap delete succeeds or its compare fails, or when the etcd lease the key is
/// attached to is gone (the key went with it). Its first attempt is bounded by the lease's
/// operation timeout, each one after a timeout by twice the previous bound (up to a quarter of
/// the TTL, never below the operation timeout).
pub(super) struct Removal {
    pub(super) claims: Arc<Claims>,
    pub(super) target: Target,
    pub(super) grant: Arc<Grant>,
    /// The first attempt is not made before this instant.
    pub(super) not_before: Instant,
    pub(super) ttl: Duration,
    pub(super) operation_timeout: Duration,
}

impl Removal {
    /// Attempts until settled; an unanswered claim is checked at once, again one TTL after it
    /// was sent (`final_check`), and then once per TTL for as long as the etcd lease it names
    /// lives (see [`Removal::next_check`]), since the claim may land after any attempt looked.
    pub(super) async fn run(self, client: Client, final_check: Option<Instant>) {
        sleep_until(self.not_before).await;
        let mut final_check = final_check;
        let mut backoff = REMOVAL_BACKOFF_START;
        let mut bound = self.operation_timeout;
        loop {
            if self.grant.state().lost.is_some() {
                break;
            }
            match timeout(bound, self.attempt(&client)).await {
                Ok(Ok(Removed::Deleted)) => break,
                Ok(Ok(Removed::NotThere)) => match final_check.take() {
                    Some(at) => {
                        sleep_until(at).await;
                        continue;
                    }
                    None => match self.next_check() {
                        Some(at) => {
                            sleep_until(at).await;
                            continue;
                        }
                        None => break,
                    },
                },
                Ok(Err(error)) => {
                    tracing::debug!(%error, "removing a claim failed; retrying");
                }
                Err(_) => {
                    tracing::debug!(timeout = ?bound, "removing a claim timed out; retrying with a longer bound");
                    // The lease's operation timeout may be shorter than a round trip to etcd (the
                    // very reason a claim's answer came too late): every attempt bounded by it
                    // would be cut short, and the key, kept alive by the session's other leases,
                    // would block the lease for good (issue 36, item 9). Nobody waits on this
                    // clean-up, so each attempt that timed out doubles the bound, up to a quarter
                    // of the TTL (an attempt holds `claim_lock`, which the lease's own claims
                    // wait for); the compare-and-swap makes a slow delete as safe as a fast one.
                    bound = (bound * 2).min(self.ttl / 4).max(self.operation_timeout);
                }
            }
            self.claims.removals_failed.fetch_add(1, Ordering::Relaxed);
            sleep(backoff).await;
            backoff = (backoff * 2).min((self.ttl / 4).max(REMOVAL_BACKOFF_START));
        }
        if let Target::Unanswered(unanswered) = &self.target {
            self.claims
                .lock_unanswered()
                .retain(|u| !Arc::ptr_eq(u, unanswered));
        }
    }

    /// When to look for an unanswered claim again after it was not found: a claim request held
    /// up on its way (a slow member, a stalled connection) can still land later, for as long as
    /// the etcd lease it names lives, and would then block the lease while other leases keep that
    /// etcd lease alive. So the guard holds until the etcd lease is gone (lost, or no longer kept
    /// alive by this session), looking once per TTL, or at the etcd lease's expiry if sooner.
    /// `None` once it is gone, and for every other target.
    pub(super) fn next_check(&self) -> Option<Instant> {
        if !matches!(self.target, Target::Unanswered(_)) {
            return None;
        }
        let state = self.grant.state();
        let expires = state.last_ok + self.ttl;
        let now = Instant::now();
        (state.lost.is_none() && now < expires).then(|| (now + self.ttl).min(expires))
    }

    /// One compare-and-swap delete of the claim.
    pub(super) async fn attempt(&self, client: &Client) -> Result<Removed, etcd_client::Error> {
        remove_claim(&self.claims, client, &self.target).await
    }
}

/// One compare-and-swap delete of the claim `target`.
pub(super) async fn remove_claim(
    claims: &Claims,
    client: &Client,
    target: &Target,
) -> Result<Removed, etcd_client::Error> {
    let key = claims.key.clone();
    let mut kv = client.kv_client();
    let compare = match target {
        Target::Tenure { revision } => {
            vec![Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                *revision,
            )]
        }
        Target::Unanswered(unanswered) => {
            let _claims = claims.claim_lock.lock().await;
            let response = observe("range", kv.get(key.clone(), None).await)?;
            let Some(current) = response.kvs().first() else {
                return Ok(Removed::NotThere);
            };
            let ours = current.value() == unanswered.value.as_slice()
                && current.lease() == unanswered.lease_id
                && claims.current_token() != Some(token_of(current.mod_revision()));
            if !ours {
                return Ok(Removed::NotThere);
            }
            let compare = vec![
                Compare::mod_revision(key.clone(), CompareOp::Equal, current.mod_revision()),
                Compare::value(key.clone(), CompareOp::Equal, unanswered.value.clone()),
                Compare::lease(key.clone(), CompareOp::Equal, unanswered.lease_id),
            ];
            return delete_if(&mut kv, claims, key, compare).await;
        }
    };
    delete_if(&mut kv, claims, key, compare).await
}

pub(super) async fn delete_if(
    kv: &mut KvClient,
    claims: &Claims,
    key: Vec<u8>,
    compare: Vec<Compare>,
) -> Result<Removed, etcd_client::Error> {
    let txn = Txn::new()
        .when(compare)
        .and_then([TxnOp::delete(key, None)]);
    if observe_txn(kv.txn(txn).await)?.succeeded() {
        claims.claims_removed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(key = %String::from_utf8_lossy(&claims.key), "removed a claim nobody holds");
        Ok(Removed::Deleted)
    } else {
        Ok(Removed::NotThere)
    }
}

/// Armed before a claim is sent; disarmed by its answer. Dropped armed (the claim failed with an
/// unknown outcome, timed out, or its future was dropped), it starts the claim's removal.
pub(super) struct ClaimGuard {
    pub(super) session: Arc<SessionInner>,
    pub(super) claims: Arc<Claims>,
    pub(super) client: Client,
    pub(super) grant: Arc<Grant>,
    pub(super) value: Vec<u8>,
    pub(super) sent: Instant,
    pub(super) ttl: Duration,
    pub(super) operation_timeout: Duration,
    pub(super) armed: bool,
}

impl ClaimGuard {
    pub(super) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let unanswered = Arc::new(Unanswered {
            value: self.value.clone(),
            lease_id: self.grant.id(),
        });
        self.claims.lock_unanswered().push(Arc::clone(&unanswered));
        tracing::debug!(key = %String::from_utf8_lossy(&self.claims.key), lease_id = %format_args!("{:x}", self.grant.id()), "a claim was not answered; removing it if it landed");
        let removal = Removal {
            claims: Arc::clone(&self.claims),
            target: Target::Unanswered(unanswered),
            grant: Arc::clone(&self.grant),
            not_before: Instant::now(),
            ttl: self.ttl,
            operation_timeout: self.operation_timeout,
        };
        let final_check = self.sent + self.ttl;
        self.session
            .spawn(removal.run(self.client.clone(), Some(final_check)));
    }
}
