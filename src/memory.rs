//! The in-memory backend: [`InMemoryStore`] and [`InMemoryLease`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{AcquireAttempt, BackendError, LeaseBackend, ReleaseOutcome, RenewOutcome};
use crate::binding::Binding;
use crate::group::{
    group_channel, GroupError, GroupRecord, GroupSender, GroupSnapshot, GroupWatch,
};
use crate::lease::{FencingToken, LostReason};
use crate::managed::ManagedLease;
use crate::metrics;
use crate::settings::LeaseSettings;

/// The name of the built-in in-memory backend (in configuration and in metrics).
pub const IN_MEMORY_BACKEND: &str = "in-memory";

/// A lease on an [`InMemoryStore`].
pub type InMemoryLease = ManagedLease<InMemoryBackend>;

/// A fault the store applies to calls; see [`InMemoryStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InMemoryFault {
    /// Calls fail at once with [`InMemoryError::Unavailable`].
    Unavailable,
    /// Calls never answer (the lease's operation timeout ends them).
    Hang,
    /// Calls are applied after this delay.
    Delay(Duration),
    /// Calls are applied, then fail with [`InMemoryError::ResponseLost`].
    ResponseLost,
    /// Calls are applied at once, and answered after this delay (a slow way back): a caller that
    /// gives up meanwhile gave up on a call that took effect.
    SlowAnswer(Duration),
}

/// Errors of the in-memory backend; all of them come from injected faults.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InMemoryError {
    /// The store is unreachable for this owner (injected [`InMemoryFault::Unavailable`]).
    #[error("in-memory store unavailable for owner {owner:?}")]
    Unavailable {
        /// The owner whose call failed.
        owner: String,
    },
    /// The call was applied but its answer was lost (injected [`InMemoryFault::ResponseLost`]).
    #[error("in-memory store applied the call of owner {owner:?} but the response was lost")]
    ResponseLost {
        /// The owner whose call failed.
        owner: String,
    },
    /// A bound claim named a member tenure the store does not hold for its owner (lost or
    /// replaced meanwhile): nothing was written.
    #[error(
        "the member lease {member:?} is not held by {owner:?} in the incarnation the claim names"
    )]
    Unbound {
        /// The member lease.
        member: String,
        /// The owner of the claim.
        owner: String,
    },
}

impl BackendError for InMemoryError {
    fn is_transient(&self) -> bool {
        true
    }
}

/// A snapshot of a lease record in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InMemoryRecord {
    /// The holder, or `None` after a release.
    pub holder: Option<String>,
    /// When the claim expires in the store's view.
    pub expires_at: Option<Instant>,
    /// The fencing token of the latest tenure.
    pub token: FencingToken,
    /// For a bound record: the member lease it lives by, and the token of the member tenure it
    /// was claimed under (see [`Binding`]); `None` for a plain record.
    pub bound_to: Option<(String, FencingToken)>,
}

/// Counters of the calls the store answered, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InMemoryStats {
    /// Acquire attempts.
    pub acquires: u64,
    /// Renewals.
    pub renewals: u64,
    /// Releases.
    pub releases: u64,
    /// Calls refused by an injected [`InMemoryFault::Unavailable`].
    pub refused: u64,
    /// Every call the store received, whatever its fault did with it (a hung call included).
    pub calls: u64,
}

/// A process-local lease store; clones share it.
///
/// For development, tests and the examples. Owners that share one [`InMemoryStore`] (clones share
/// it) compete for leases exactly as they would on a real backend: a claim expires `ttl` after
/// the store applied its last renewal, a contender can take the lease only after that instant, every
/// write is atomic and every new tenure gets a strictly higher fencing token. Time is read from
/// [`tokio::time::Instant`], so tests can run it under Tokio's paused clock.
///
/// # Fault injection
///
/// The store can simulate what goes wrong in production, per owner or for everyone:
///
/// | fault | simulates |
/// |---|---|
/// | [`InMemoryFault::Unavailable`] | a partition or a backend that is down: calls fail at once |
/// | [`InMemoryFault::Hang`] | a paused process or a blackholed connection: calls never answer |
/// | [`InMemoryFault::Delay`] | a slow network: calls answer late |
/// | [`InMemoryFault::ResponseLost`] | the request is applied, the answer is lost (outcome unknown) |
/// | [`InMemoryFault::SlowAnswer`] | the request is applied at once, the answer comes late |
///
/// and [`InMemoryStore::force_take`] / [`InMemoryStore::delete`] simulate an operator or a buggy
/// client overwriting the record.
#[derive(Clone, Default)]
pub struct InMemoryStore {
    inner: Arc<StoreInner>,
}

impl std::fmt::Debug for InMemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryStore")
            .field("leases", &self.lock().records.len())
            .finish()
    }
}

#[derive(Default)]
struct StoreInner {
    state: Mutex<StoreState>,
}

#[derive(Default)]
struct StoreState {
    records: HashMap<String, Record>,
    /// The group watches: a prefix and the sender of its snapshots.
    groups: Vec<(String, GroupSender)>,
    fault: Option<InMemoryFault>,
    owner_faults: HashMap<String, InMemoryFault>,
    stats: InMemoryStats,
}

struct Record {
    holder: Option<String>,
    expires_at: Option<Instant>,
    token: u64,
    changed: Arc<Notify>,
    /// The preferred next holder a `release_to` named, and when its window ends.
    preferred: Option<(String, Instant)>,
    /// What the holder wrote about itself with its claim.
    metadata: Option<String>,
    /// When the record was handed over to its holder ([`Lease::hand_over`]), until the holder
    /// takes it up (or anything else changes it).
    handed_at: Option<Instant>,
    /// The member lease and the token of its tenure that a bound claim lives by (see
    /// [`Binding`]): the record is held exactly while that member tenure is, and has no expiry
    /// of its own.
    bound: Option<(String, u64)>,
    /// The token of the tenure its holder marked leaving ([`Lease::mark_leaving`]): counts
    /// while that tenure holds the record.
    leaving: Option<u64>,
}

/// The holder of `record` at `now` and until when its claim lasts as the store sees it now: its
/// own expiry, or for a bound record its member tenure's (see [`Binding`]).
fn holding<'a>(
    records: &'a HashMap<String, Record>,
    record: &'a Record,
    now: Instant,
) -> Option<(&'a str, Instant)> {
    let holder = record.holder.as_deref()?;
    match &record.bound {
        None => record
            .expires_at
            .filter(|at| now < *at)
            .map(|at| (holder, at)),
        Some((member, token)) => {
            let member = records.get(member).filter(|m| m.bound.is_none())?;
            let until = member.expires_at.filter(|at| now < *at)?;
            (member.holder.as_deref() == Some(holder) && member.token == *token)
                .then_some((holder, until))
        }
    }
}

impl StoreState {
    /// The live holder of lease `name` at `now`, and until when (see [`holding`]).
    fn holding(&self, name: &str, now: Instant) -> Option<(&str, Instant)> {
        holding(&self.records, self.records.get(name)?, now)
    }

    /// Until when `owner` cannot take lease `name`: its live holder's expiry, or the end of a
    /// preferred holder's window.
    fn blocked_until(&self, name: &str, owner: &str, now: Instant) -> Option<Instant> {
        match self.holding(name, now) {
            Some((holder, until)) if holder != owner => Some(until),
            Some(_) => None,
            None => self.records.get(name)?.deferring(owner, now),
        }
    }
}

impl Record {
    /// Until when `owner` must leave the free record to the preferred holder, if it must.
    fn deferring(&self, owner: &str, now: Instant) -> Option<Instant> {
        match &self.preferred {
            Some((preferred, until)) if preferred != owner && now < *until => Some(*until),
            _ => None,
        }
    }
}

/// What the store remembers of a tenure it granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InMemoryTenure {
    token: u64,
}

impl InMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A lease on this store.
    pub fn lease(&self, settings: LeaseSettings) -> InMemoryLease {
        InMemoryLease::new(settings, self)
    }

    fn lock(&self) -> MutexGuard<'_, StoreState> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `fault` to every call from `owner` (`None` heals it).
    pub fn set_owner_fault(&self, owner: &str, fault: Option<InMemoryFault>) {
        let mut state = self.lock();
        match fault {
            Some(f) => state.owner_faults.insert(owner.to_owned(), f),
            None => state.owner_faults.remove(owner),
        };
    }

    /// Applies `fault` to every call from every owner (`None` heals the store); an owner's own
    /// fault takes precedence.
    pub fn set_fault(&self, fault: Option<InMemoryFault>) {
        self.lock().fault = fault;
    }

    /// Cuts `owner` off the store: its calls fail at once.
    pub fn partition(&self, owner: &str) {
        self.set_owner_fault(owner, Some(InMemoryFault::Unavailable));
    }

    /// Freezes `owner` like a paused process: its calls never answer.
    pub fn pause(&self, owner: &str) {
        self.set_owner_fault(owner, Some(InMemoryFault::Hang));
    }

    /// Removes `owner`'s fault.
    pub fn heal(&self, owner: &str) {
        self.set_owner_fault(owner, None);
    }

    /// The record of lease `name`, if it was ever claimed.
    pub fn record(&self, name: &str) -> Option<InMemoryRecord> {
        let state = self.lock();
        let now = Instant::now();
        state.records.get(name).map(|r| InMemoryRecord {
            holder: r.holder.clone(),
            // A bound record lasts as long as its member tenure, as of now.
            expires_at: match &r.bound {
                None => r.expires_at,
                Some(_) => state.holding(name, now).map(|(_, until)| until),
            },
            token: FencingToken::new(r.token),
            bound_to: r
                .bound
                .as_ref()
                .map(|(member, token)| (member.clone(), FencingToken::new(*token))),
        })
    }

    /// The owner holding lease `name` now in the store's view (claimed and not expired).
    pub fn holder(&self, name: &str) -> Option<String> {
        let now = Instant::now();
        self.lock().holding(name, now).map(|(h, _)| h.to_owned())
    }

    /// Overwrites lease `name` with `owner` as holder for `ttl`, ignoring the current claim, like an
    /// operator or a misbehaving client would. Returns the new token.
    pub fn force_take(&self, name: &str, owner: &str, ttl: Duration) -> FencingToken {
        let mut state = self.lock();
        let record = state
            .records
            .entry(name.to_owned())
            .or_insert_with(Record::empty);
        record.token += 1;
        record.holder = Some(owner.to_owned());
        record.expires_at = Some(Instant::now() + ttl);
        record.preferred = None;
        record.metadata = None;
        record.bound = None;
        record.changed.notify_waiters();
        let token = FencingToken::new(record.token);
        state.publish(name);
        token
    }

    /// Deletes the record of lease `name` (its token history is kept, so tokens never go back).
    pub fn delete(&self, name: &str) {
        let mut state = self.lock();
        if let Some(record) = state.records.get_mut(name) {
            record.holder = None;
            record.expires_at = None;
            record.preferred = None;
            record.metadata = None;
            record.bound = None;
            record.changed.notify_waiters();
            state.publish(name);
        }
    }

    /// How many calls the store has answered.
    pub fn stats(&self) -> InMemoryStats {
        self.lock().stats
    }

    /// Applies the fault for `owner` before a call; returns what to do after applying it.
    async fn before_call(&self, owner: &str) -> Result<Option<InMemoryFault>, InMemoryError> {
        let fault = {
            let mut state = self.lock();
            state.stats.calls += 1;
            let fault = state.owner_faults.get(owner).copied().or(state.fault);
            if fault == Some(InMemoryFault::Unavailable) {
                state.stats.refused += 1;
            }
            fault
        };
        match fault {
            Some(InMemoryFault::Unavailable) => Err(InMemoryError::Unavailable {
                owner: owner.to_owned(),
            }),
            Some(InMemoryFault::Hang) => std::future::pending().await,
            Some(InMemoryFault::Delay(d)) => {
                tokio::time::sleep(d).await;
                Ok(None)
            }
            other => Ok(other),
        }
    }

    /// One request to the store, counted in the `backend_requests` metric as `verb`; `conflict`
    /// reports whether the answer refused the request because of another holder.
    async fn call<T>(
        &self,
        owner: &str,
        verb: &'static str,
        conflict: impl Fn(&T) -> bool,
        apply: impl FnOnce(&mut StoreState, Instant) -> T,
    ) -> Result<T, InMemoryError> {
        let result = self.call_inner(owner, apply).await;
        let outcome = match &result {
            Ok(answer) if conflict(answer) => "conflict",
            Ok(_) => "ok",
            Err(_) => "error",
        };
        metrics::backend_request(IN_MEMORY_BACKEND, verb, outcome);
        result
    }

    async fn call_inner<T>(
        &self,
        owner: &str,
        apply: impl FnOnce(&mut StoreState, Instant) -> T,
    ) -> Result<T, InMemoryError> {
        let after = self.before_call(owner).await?;
        let result = apply(&mut self.lock(), Instant::now());
        match after {
            Some(InMemoryFault::ResponseLost) => Err(InMemoryError::ResponseLost {
                owner: owner.to_owned(),
            }),
            Some(InMemoryFault::SlowAnswer(d)) => {
                tokio::time::sleep(d).await;
                Ok(result)
            }
            _ => Ok(result),
        }
    }
}

impl StoreState {
    /// Sends a new snapshot to every group watch whose prefix `name` starts with (and forgets
    /// the watches nobody reads any more).
    fn publish(&mut self, name: &str) {
        self.groups.retain(|(_, sender)| !sender.is_closed());
        let Some(record) = self.records.get(name).map(Self::group_record) else {
            return;
        };
        for (prefix, sender) in &self.groups {
            if name.starts_with(prefix.as_str()) {
                // In place (O(log n)) unless a reader still holds the previous snapshot.
                sender.send_modify(|snapshot| {
                    Arc::make_mut(snapshot).insert(name.to_owned(), record.clone());
                });
            }
        }
    }

    fn group_record(r: &Record) -> GroupRecord {
        let token = (r.token > 0).then(|| FencingToken::new(r.token));
        GroupRecord::new(r.holder.clone(), token, r.expires_at)
            .with_metadata(r.holder.as_ref().and(r.metadata.clone()))
            .with_incarnation(r.holder.as_ref().map(|_| r.token.to_string()))
            .with_binding(
                r.bound
                    .as_ref()
                    .map(|(member, token)| Binding::new(member.clone(), token.to_string())),
            )
            .with_leaving(r.holder.is_some() && r.leaving == Some(r.token))
    }

    fn snapshot(records: &HashMap<String, Record>, prefix: &str) -> GroupSnapshot {
        let records = records
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(name, r)| (name.clone(), Self::group_record(r)))
            .collect();
        GroupSnapshot::new(records, true)
    }
}

impl Record {
    fn empty() -> Self {
        Record {
            holder: None,
            expires_at: None,
            token: 0,
            changed: Arc::new(Notify::new()),
            preferred: None,
            metadata: None,
            handed_at: None,
            bound: None,
            leaving: None,
        }
    }
}

/// What a release does with the record.
#[derive(Clone, Copy)]
enum Giving<'a> {
    /// Frees it.
    Release,
    /// Frees it, preferring this owner (`release_to`).
    Prefer(&'a str),
    /// Hands it to this owner (`hand_over`).
    HandTo(&'a str),
}

/// The [`LeaseBackend`] of one lease on an [`InMemoryStore`].
#[derive(Debug, Clone)]
pub struct InMemoryBackend {
    store: InMemoryStore,
    /// The tokens of this lease's claims whose release was sent but not answered (it failed, or
    /// its future was dropped): the store may still hold them
    /// ([`LeaseBackend::release_unanswered`] removes them).
    unreleased: Arc<Mutex<Vec<u64>>>,
    /// Whether renewals mark the tenure leaving ([`LeaseBackend::mark_leaving`]).
    leaving: Arc<std::sync::atomic::AtomicBool>,
}

/// The verbs of the in-memory store's requests and their outcomes, for the `backend_requests`
/// metric.
const IN_MEMORY_REQUESTS: metrics::BackendRequests = &[
    ("acquire", &["ok", "conflict", "error"]),
    ("renew", &["ok", "conflict", "error"]),
    ("release", &["ok", "conflict", "error"]),
];

impl InMemoryBackend {
    /// The backend for leases on `store`.
    pub fn new(store: &InMemoryStore) -> Self {
        metrics::backend_registered(IN_MEMORY_BACKEND, IN_MEMORY_REQUESTS);
        Self {
            store: store.clone(),
            unreleased: Arc::default(),
            leaving: Arc::default(),
        }
    }
}

impl ManagedLease<InMemoryBackend> {
    /// A lease with `settings` on `store`.
    pub fn new(settings: LeaseSettings, store: &InMemoryStore) -> Self {
        ManagedLease::from_backend(settings, InMemoryBackend::new(store))
    }
}

impl LeaseBackend for InMemoryBackend {
    type Tenure = InMemoryTenure;
    type Error = InMemoryError;

    async fn try_acquire(
        &self,
        settings: &LeaseSettings,
    ) -> Result<AcquireAttempt<InMemoryTenure>, InMemoryError> {
        self.claim(settings, None).await
    }

    /// A bound claim: the record names the member lease and its tenure's token, has no expiry of
    /// its own and is never renewed; it is held exactly while that member tenure is (see
    /// [`Binding`]). A record handed over to this owner is claimed anew (bound), not taken up.
    async fn try_acquire_bound(
        &self,
        settings: &LeaseSettings,
        binding: &Binding,
    ) -> Result<AcquireAttempt<InMemoryTenure>, InMemoryError> {
        self.claim(settings, Some(binding)).await
    }

    fn binds(&self) -> bool {
        true
    }

    /// The renewals mark the record with the tenure's token.
    fn mark_leaving(&self) {
        self.leaving
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The tenure's fencing token: the store keeps every record's token history (a deleted
    /// record's too), so no other tenure of the lease ever has it.
    fn incarnation(&self, tenure: &InMemoryTenure) -> Option<String> {
        Some(tenure.token.to_string())
    }

    async fn renew(
        &self,
        settings: &LeaseSettings,
        tenure: &mut InMemoryTenure,
    ) -> Result<RenewOutcome, InMemoryError> {
        let (name, owner, ttl) = (settings.name(), settings.owner(), settings.ttl());
        let lost = |r: &RenewOutcome| matches!(r, RenewOutcome::Lost(_));
        let leaving = self.leaving.load(std::sync::atomic::Ordering::Relaxed);
        self.store
            .call(owner, "renew", lost, |state, now| {
                state.stats.renewals += 1;
                let Some(record) = state.records.get_mut(name) else {
                    return RenewOutcome::Lost(LostReason::Deleted);
                };
                if record.token != tenure.token {
                    return RenewOutcome::Lost(LostReason::TakenOver {
                        holder: record.holder.clone(),
                    });
                }
                if record.bound.is_some() {
                    // Bound records are never renewed (their tenures live by the member's).
                    return RenewOutcome::Lost(LostReason::Inconsistent(
                        "a bound record cannot be renewed".into(),
                    ));
                }
                match (&record.holder, record.expires_at) {
                    (None, _) => RenewOutcome::Lost(LostReason::Deleted),
                    (Some(h), Some(exp)) if h == owner && now < exp => {
                        record.expires_at = Some(now + ttl);
                        if leaving {
                            record.leaving = Some(record.token);
                        }
                        state.publish(name);
                        RenewOutcome::Renewed { valid_from: None }
                    }
                    _ => RenewOutcome::Lost(LostReason::Expired { last_error: None }),
                }
            })
            .await
    }

    async fn release(
        &self,
        settings: &LeaseSettings,
        tenure: InMemoryTenure,
    ) -> Result<ReleaseOutcome, InMemoryError> {
        self.release_giving(settings, tenure, Giving::Release).await
    }

    fn records_preference(&self) -> bool {
        true
    }

    async fn release_to(
        &self,
        settings: &LeaseSettings,
        tenure: InMemoryTenure,
        preferred: &str,
    ) -> Result<ReleaseOutcome, InMemoryError> {
        self.release_giving(settings, tenure, Giving::Prefer(preferred))
            .await
    }

    /// The record goes to `target` in the same step: held by it for one TTL from now, with a new
    /// token, until `target` takes it up (its next attempt, woken by the change) and renews it.
    async fn hand_over(
        &self,
        settings: &LeaseSettings,
        tenure: InMemoryTenure,
        target: &str,
    ) -> Result<ReleaseOutcome, InMemoryError> {
        self.release_giving(settings, tenure, Giving::HandTo(target))
            .await
    }

    async fn watch_lost(
        &self,
        settings: &LeaseSettings,
        token: FencingToken,
    ) -> Result<LostReason, InMemoryError> {
        let (name, owner) = (settings.name(), settings.owner());
        loop {
            let _ = self.store.before_call(owner).await?;
            let changed = {
                let state = self.store.lock();
                let Some(record) = state.records.get(name) else {
                    return Ok(LostReason::Deleted);
                };
                if record.token != token.value() {
                    return Ok(LostReason::TakenOver {
                        holder: record.holder.clone(),
                    });
                }
                if record.holder.is_none() {
                    return Ok(LostReason::Deleted);
                }
                Arc::clone(&record.changed)
            };
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Check again now that we are registered, so that no change slips between the two.
            if self.changed_since(name, token) {
                continue;
            }
            notified.await;
        }
    }

    fn store_id(&self) -> Option<String> {
        Some(format!("in-memory:{:p}", Arc::as_ptr(&self.store.inner)))
    }

    /// Frees the records of this lease's claims whose release was not answered, if the store
    /// still shows them held by this owner under their token.
    async fn release_unanswered(&self, settings: &LeaseSettings) -> Result<(), InMemoryError> {
        let pending = self
            .unreleased
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if pending.is_empty() {
            return Ok(());
        }
        let (name, owner) = (settings.name(), settings.owner());
        self.store
            .call(
                owner,
                "release",
                |_| false,
                |state, _| {
                    state.stats.releases += 1;
                    let Some(record) = state.records.get_mut(name) else {
                        return;
                    };
                    if record.holder.as_deref() == Some(owner) && pending.contains(&record.token) {
                        record.holder = None;
                        record.expires_at = None;
                        record.handed_at = None;
                        record.metadata = None;
                        record.bound = None;
                        record.changed.notify_waiters();
                        state.publish(name);
                    }
                },
            )
            .await?;
        self.unreleased
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|t| !pending.contains(t));
        Ok(())
    }

    /// The store itself: every change of a record of the group sends a snapshot at once (no
    /// task, no runtime needed); an expiry sends none (see [`GroupSnapshot::next_expiry`]).
    fn watch_group(&self, prefix: &str) -> Result<GroupWatch, GroupError> {
        let (sender, receiver) = group_channel();
        let mut state = self.store.lock();
        sender.send_replace(Arc::new(StoreState::snapshot(&state.records, prefix)));
        state.groups.retain(|(_, sender)| !sender.is_closed());
        state.groups.push((prefix.to_owned(), sender));
        Ok(GroupWatch::new(receiver, ()))
    }

    fn notifies_changes(&self) -> bool {
        true
    }

    async fn wait_for_change(&self, settings: &LeaseSettings, not_after: Instant) {
        let name = settings.name();
        let owner = settings.owner();
        let (changed, member_changed, blocked_until) = {
            let state = self.store.lock();
            match state.records.get(name) {
                Some(record) => (
                    Arc::clone(&record.changed),
                    // A bound record is freed by a change of its member record too.
                    record
                        .bound
                        .as_ref()
                        .and_then(|(member, _)| state.records.get(member))
                        .map(|m| Arc::clone(&m.changed)),
                    state.blocked_until(name, owner, Instant::now()),
                ),
                None => return,
            }
        };
        let wake_at = blocked_until.map_or(not_after, |e| e.min(not_after));
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let member_notified = member_changed.as_ref().map(|m| m.notified());
        let mut member_notified = std::pin::pin!(member_notified);
        if let Some(n) = member_notified.as_mut().as_pin_mut() {
            n.enable();
        }
        // Registered: now a change cannot slip by. Is the lease free already?
        {
            let now = Instant::now();
            let state = self.store.lock();
            if state.blocked_until(name, owner, now).is_none() {
                return;
            }
        }
        let member = async {
            match member_notified.as_pin_mut() {
                Some(n) => n.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = notified => {}
            _ = member => {}
            _ = tokio::time::sleep_until(wake_at) => {}
        }
    }
}

impl InMemoryBackend {
    /// A release, recording `preferred` as the next holder for one TTL when given.
    /// A release: the record freed, with a preference for [`Giving::Prefer`], or handed to the
    /// target ([`Giving::HandTo`]).
    async fn release_giving(
        &self,
        settings: &LeaseSettings,
        tenure: InMemoryTenure,
        giving: Giving<'_>,
    ) -> Result<ReleaseOutcome, InMemoryError> {
        let token = tenure.token;
        self.unreleased
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(token);
        let result = self.release_once(settings, tenure, giving).await;
        if result.is_ok() {
            self.unreleased
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|t| *t != token);
        }
        result
    }

    async fn release_once(
        &self,
        settings: &LeaseSettings,
        tenure: InMemoryTenure,
        giving: Giving<'_>,
    ) -> Result<ReleaseOutcome, InMemoryError> {
        let (name, owner, ttl) = (settings.name(), settings.owner(), settings.ttl());
        let held = |r: &ReleaseOutcome| matches!(r, ReleaseOutcome::HeldByOther { .. });
        self.store
            .call(owner, "release", held, |state, now| {
                state.stats.releases += 1;
                let Some(record) = state.records.get_mut(name) else {
                    return ReleaseOutcome::Released;
                };
                if record.token == tenure.token && record.holder.as_deref() == Some(owner) {
                    record.metadata = None;
                    record.bound = None;
                    match giving {
                        Giving::Release | Giving::Prefer(_) => {
                            record.holder = None;
                            record.expires_at = None;
                            record.handed_at = None;
                            record.preferred = match giving {
                                Giving::Prefer(p) => Some((p.to_owned(), now + ttl)),
                                _ => None,
                            };
                        }
                        Giving::HandTo(target) => {
                            record.holder = Some(target.to_owned());
                            record.token += 1;
                            record.expires_at = Some(now + ttl);
                            record.preferred = None;
                            record.handed_at = Some(now);
                        }
                    }
                    record.changed.notify_waiters();
                    state.publish(name);
                    return ReleaseOutcome::Released;
                }
                let token = record.token;
                match state.holding(name, now) {
                    Some((h, _)) if h != owner || token != tenure.token => {
                        ReleaseOutcome::HeldByOther {
                            holder: Some(h.to_owned()),
                        }
                    }
                    _ => ReleaseOutcome::Released,
                }
            })
            .await
    }

    /// One claim of the lease for `settings.owner()`, bound to `binding` when given.
    async fn claim(
        &self,
        settings: &LeaseSettings,
        binding: Option<&Binding>,
    ) -> Result<AcquireAttempt<InMemoryTenure>, InMemoryError> {
        let (name, owner, ttl) = (settings.name(), settings.owner(), settings.ttl());
        let held = |a: &Result<AcquireAttempt<InMemoryTenure>, InMemoryError>| {
            matches!(a, Ok(AcquireAttempt::HeldByOther { .. }))
        };
        self.store
            .call(owner, "acquire", held, |state, now| {
                state.stats.acquires += 1;
                // A bound claim names a member tenure the store must hold for this owner: one it
                // does not hold would make the claim free for everyone at once.
                let bound = match binding {
                    None => None,
                    Some(binding) => {
                        // The member record must be a plain claim: `holding` never counts a
                        // record bound to a bound record as held, so a claim bound to one (a
                        // lease bound to a bound lease) would be free for every contender while
                        // its holder's tenure is alive.
                        let live = state
                            .holding(binding.member(), now)
                            .is_some_and(|(holder, _)| holder == owner)
                            && state.records.get(binding.member()).is_some_and(|m| {
                                m.bound.is_none() && m.token.to_string() == binding.incarnation()
                            });
                        if !live {
                            return Err(InMemoryError::Unbound {
                                member: binding.member().to_owned(),
                                owner: owner.to_owned(),
                            });
                        }
                        let token = state.records[binding.member()].token;
                        Some((binding.member().to_owned(), token))
                    }
                };
                let live = state
                    .holding(name, now)
                    .map(|(holder, until)| (holder.to_owned(), until));
                let deferring = state
                    .records
                    .get(name)
                    .and_then(|r| r.deferring(owner, now));
                let record = state
                    .records
                    .entry(name.to_owned())
                    .or_insert_with(Record::empty);
                match live {
                    Some((holder, until)) if holder != owner => {
                        return Ok(AcquireAttempt::HeldByOther {
                            holder: Some(holder),
                            expires_at: Some(until),
                        })
                    }
                    // Handed over to this owner: taken up as it is, valid from the handover
                    // (the store's clock is everyone's). The handover wrote the record for the
                    // *giver's* TTL; the tenure lasts this owner's, counted from the handover:
                    // when that is longer, the take-up extends the record to it, so that the
                    // tenure never outlives the record (a contender would take the lease while
                    // this owner still passed `check_alive`). A bound claim claims it anew.
                    Some(_)
                        if record.handed_at.is_some()
                            && settings.metadata().is_none()
                            && bound.is_none() =>
                    {
                        let handed_at = record.handed_at.take();
                        let until = handed_at.map(|at| at + ttl);
                        let extend = until.is_some_and(|u| record.expires_at.is_none_or(|e| e < u));
                        if extend {
                            record.expires_at = until;
                        }
                        let token = record.token;
                        if extend {
                            state.publish(name);
                        }
                        return Ok(AcquireAttempt::Acquired {
                            tenure: InMemoryTenure { token },
                            token: FencingToken::new(token),
                            valid_from: handed_at,
                        });
                    }
                    None if deferring.is_some() => {
                        return Ok(AcquireAttempt::HeldByOther {
                            holder: None,
                            expires_at: deferring,
                        })
                    }
                    _ => {}
                }
                record.preferred = None;
                record.handed_at = None;
                record.token += 1;
                record.holder = Some(owner.to_owned());
                record.expires_at = bound.is_none().then_some(now + ttl);
                record.bound = bound;
                record.metadata = settings.metadata().map(str::to_owned);
                record.changed.notify_waiters();
                let token = record.token;
                state.publish(name);
                Ok(AcquireAttempt::Acquired {
                    tenure: InMemoryTenure { token },
                    token: FencingToken::new(token),
                    valid_from: None,
                })
            })
            .await?
    }

    fn changed_since(&self, name: &str, token: FencingToken) -> bool {
        let state = self.store.lock();
        state
            .records
            .get(name)
            .is_none_or(|r| r.token != token.value() || r.holder.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Lease;

    fn settings(owner: &str) -> LeaseSettings {
        LeaseSettings::builder("lease", owner)
            .ttl(Duration::from_secs(9))
            .build()
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn response_lost_on_acquire_is_an_error_but_the_claim_is_reused() {
        let store = InMemoryStore::new();
        let a = store.lease(settings("a"));
        store.set_owner_fault("a", Some(InMemoryFault::ResponseLost));
        let err = a.acquire().await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(err.backend_error::<InMemoryError>().is_some());
        assert_eq!(store.holder("lease").as_deref(), Some("a"));
        assert!(!a.check_alive());
        store.heal("a");
        assert!(a.acquire().await.unwrap());
        let token = a.fencing_token().unwrap();
        assert!(
            token
                > store
                    .record("lease")
                    .map(|r| FencingToken::new(r.token.value() - 1))
                    .unwrap()
        );
    }

    /// A handover puts the record in the target's name in the same step, and the target takes
    /// it up as it is: the handover's token (a claim would raise it again), valid from the
    /// handover (so its deadline is the record's expiry); others find it held meanwhile.
    #[tokio::test(start_paused = true)]
    async fn a_handed_over_record_is_taken_up_as_it_is() {
        let store = InMemoryStore::new();
        let a = store.lease(settings("a"));
        assert!(a.acquire().await.unwrap());
        let token_a = a.fencing_token().unwrap();
        assert!(a.hand_over("b").await.unwrap());
        let handed_at = Instant::now();
        assert_eq!(store.holder("lease").as_deref(), Some("b"));
        let c = InMemoryBackend::new(&store);
        assert!(matches!(
            c.try_acquire(&settings("c")).await.unwrap(),
            AcquireAttempt::HeldByOther { .. }
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let b = InMemoryBackend::new(&store);
        let AcquireAttempt::Acquired {
            token, valid_from, ..
        } = b.try_acquire(&settings("b")).await.unwrap()
        else {
            panic!("b takes the record handed to it up")
        };
        assert_eq!(token.value(), token_a.value() + 1, "the handover's token");
        assert_eq!(valid_from, Some(handed_at), "valid from the handover");
    }

    #[tokio::test(start_paused = true)]
    async fn store_down_makes_acquire_fail_not_false() {
        let store = InMemoryStore::new();
        let a = store.lease(settings("a"));
        store.set_fault(Some(InMemoryFault::Unavailable));
        assert!(a.acquire().await.is_err());
        store.set_fault(Some(InMemoryFault::Hang));
        let err = a.acquire().await.unwrap_err();
        assert!(matches!(err, crate::LeaseError::Timeout { .. }), "{err}");
        store.set_fault(None);
        assert!(a.acquire().await.unwrap());
        assert_eq!(
            store.stats().acquires,
            1,
            "failed and hung attempts never reached the store"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_store_still_works() {
        let store = InMemoryStore::new();
        store.set_fault(Some(InMemoryFault::Delay(Duration::from_millis(300))));
        let a = store.lease(settings("a"));
        let t0 = Instant::now();
        assert!(a.acquire().await.unwrap());
        assert_eq!(t0.elapsed(), Duration::from_millis(300));
        // The deadline counts from the start of the call, not from when the store applied it.
        assert_eq!(a.deadline().unwrap(), t0 + a.settings().local_validity());
    }

    #[tokio::test(start_paused = true)]
    async fn force_take_fires_on_lost_at_once_through_the_watch() {
        let store = InMemoryStore::new();
        let a = store.lease(settings("a"));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _sub = a.on_lost(move |l| {
            let _ = tx.send(l.clone());
        });
        assert!(a.acquire().await.unwrap());
        let t0 = Instant::now();
        let token = store.force_take("lease", "intruder", Duration::from_secs(9));
        let lost = rx.recv().await.unwrap();
        assert_eq!(
            t0.elapsed(),
            Duration::ZERO,
            "the watch reports the takeover at once"
        );
        assert_eq!(
            lost.reason,
            LostReason::TakenOver {
                holder: Some("intruder".into())
            }
        );
        assert!(token > lost.fencing_token.unwrap());
        assert!(!a.check_alive());
    }
}
