//! The tasks that look after a tenure: the renewal loop of a renewed lease, the loop of a bound
//! one (which renews nothing: its member's renewals move its deadline), the end of a tenure
//! whose task is dropped, and the loss watch both keep.

use std::error::Error as StdError;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::{sleep_until, timeout, Instant};
use tracing::Instrument;

use super::{
    bump, current_runtime, Giving, OpsGuard, Shared, Unreleased, RENEW_BACKOFF_START,
    WATCH_BACKOFF_START,
};
use crate::backend::{BackendError, LeaseBackend, RenewOutcome};
use crate::binding::BoundChild;
use crate::lease::{FencingToken, LostReason, Operation};
use crate::metrics;
use crate::tenure::{sleep_until_precise, RenewalTask, TenureEnd};
use std::time::Duration;

pub(super) async fn renewal_loop<B: LeaseBackend>(
    shared: Arc<Shared<B>>,
    mut tenure: B::Tenure,
    generation: u64,
    token: FencingToken,
    start: Instant,
    mut stop: oneshot::Receiver<()>,
    // Whatever way this task ends, the tenure ends no later: if the task is dropped before it
    // ended the tenure itself (its runtime shut down, even before it first ran; the backend
    // panicked), the tenure is lost now. A parameter, so that it is dropped with a task that
    // never ran.
    _end: EndWithTask<B>,
) -> Option<B::Tenure> {
    let settings = &shared.settings;
    let interval = settings.renewal_interval();
    let max_backoff = (interval / 4).max(RENEW_BACKOFF_START);
    let mut backoff = RENEW_BACKOFF_START;
    let mut last_error: Option<String> = None;
    let watch = watch_loss(&shared, token);
    tokio::pin!(watch);
    // One interval after the instant the deadline counts from: the claim's start, or the earlier
    // instant the backend named (etcd: when the shared keep-alive was sent).
    let validity = settings.local_validity();
    let mut next = shared
        .tenure
        .published(generation)
        .and_then(|t| t.deadline().checked_sub(validity))
        .map_or(start, |from| from.min(start))
        + interval;
    loop {
        let Some(deadline) = shared.tenure.published(generation).map(|t| t.deadline()) else {
            return Some(tenure);
        };
        tokio::select! {
            biased;
            _ = &mut stop => return Some(tenure),
            _ = sleep_until_precise(deadline) => {
                return shared.lost_or_released(generation, LostReason::Expired { last_error }, tenure);
            }
            reason = &mut watch => {
                return shared.lost_or_released(generation, reason, tenure);
            }
            _ = sleep_until(next) => {}
            // A renewal asked for now (a mark to write: `Lease::mark_leaving`).
            () = shared.renew_now.notified() => {}
        }
        let start = Instant::now();
        let renew_span = tracing::debug_span!("lease_renew", outcome = tracing::field::Empty);
        let record = |outcome: &'static str| {
            metrics::renewal(&shared.label, outcome, start.elapsed());
            renew_span.record("outcome", outcome);
        };
        let outcome = tokio::select! {
            biased;
            _ = sleep_until_precise(deadline) => {
                return shared.lost_or_released(generation, LostReason::Expired { last_error }, tenure);
            }
            reason = &mut watch => {
                return shared.lost_or_released(generation, reason, tenure);
            }
            outcome = timeout(settings.operation_timeout(), shared.backend.renew(settings, &mut tenure))
                .instrument(renew_span.clone()) => outcome,
        };
        match outcome {
            Ok(Ok(RenewOutcome::Renewed { valid_from })) => {
                record("renewed");
                metrics::renewal_margin(
                    &shared.label,
                    deadline.saturating_duration_since(Instant::now()),
                );
                let from = valid_from.map_or(start, |v| v.min(start));
                if !shared
                    .tenure
                    .extend(generation, from + settings.local_validity())
                {
                    // Either the deadline passed while the renewal was in flight (lost), or a
                    // `release` began meanwhile: then hand the tenure back, so that the release
                    // still tells the backend (the record was just renewed).
                    return shared.lost_or_released(
                        generation,
                        LostReason::Expired { last_error },
                        tenure,
                    );
                }
                bump(&shared.counters.renewals);
                if let Some(anchor) = shared.tenure.anchor() {
                    anchor.renewal_failed(None);
                }
                tracing::trace!("lease renewed");
                last_error = None;
                backoff = RENEW_BACKOFF_START;
                // The next renewal one interval after the instant the (possibly unchanged)
                // deadline counts from, which for a backend that names an earlier instant is its
                // own clock (etcd: the next shared keep-alive); at least a quarter of an interval
                // after this one started, whatever the backend answered.
                let counts_from = shared
                    .tenure
                    .published(generation)
                    .and_then(|t| t.deadline().checked_sub(validity))
                    .unwrap_or(from);
                next = (counts_from + interval).max(start + interval / 4);
            }
            Ok(Ok(RenewOutcome::Lost(reason))) => {
                record("lost");
                return shared.lost_or_released(generation, reason, tenure);
            }
            Ok(Err(error)) => {
                record("error");
                bump(&shared.counters.renewal_errors);
                tracing::warn!(
                    error = &error as &dyn StdError,
                    transient = error.is_transient(),
                    "lease renewal failed, retrying until the deadline"
                );
                last_error = Some(error.to_string());
                if let Some(anchor) = shared.tenure.anchor() {
                    anchor.renewal_failed(last_error.clone());
                }
                next = Instant::now() + backoff;
                backoff = (backoff * 2).min(max_backoff);
            }
            Err(_) => {
                record("timeout");
                bump(&shared.counters.renewal_timeouts);
                // A whole operation timeout has passed already: retry at once.
                tracing::warn!(timeout = ?settings.operation_timeout(), "lease renewal timed out, retrying until the deadline");
                last_error = Some(format!(
                    "renewal timed out after {:?}",
                    settings.operation_timeout()
                ));
                if let Some(anchor) = shared.tenure.anchor() {
                    anchor.renewal_failed(last_error.clone());
                }
                next = Instant::now();
            }
        }
    }
}

/// The task of a bound tenure: it renews nothing (every member renewal moves its deadline, see
/// the `binding` module); it ends the tenure at its deadline, or when the store shows it lost.
pub(super) async fn bound_loop<B: LeaseBackend>(
    shared: Arc<Shared<B>>,
    tenure: B::Tenure,
    generation: u64,
    token: FencingToken,
    mut stop: oneshot::Receiver<()>,
    _end: EndWithTask<B>,
) -> Option<B::Tenure> {
    let watch = watch_loss(&shared, token);
    tokio::pin!(watch);
    let mut changes = shared.tenure.receiver();
    // How the tenure ended when it ended elsewhere: lost with its member (nothing of ours to
    // release any more), or released (the release tells the backend).
    let guard = shared.tenure.watch().guard();
    loop {
        let Some(deadline) = shared.tenure.published(generation).map(|t| t.deadline()) else {
            if guard
                .as_ref()
                .is_some_and(|g| matches!(g.end(), Some(TenureEnd::Lost(_))))
            {
                return None;
            }
            return Some(tenure);
        };
        tokio::select! {
            biased;
            _ = &mut stop => return Some(tenure),
            _ = sleep_until_precise(deadline) => {
                if shared.tenure.published(generation).is_some_and(|t| t.deadline() > deadline) {
                    continue;
                }
                // The member's deadline passed: expired as the member did.
                let reason = shared.bound.get().map_or(LostReason::Expired { last_error: None }, |anchor| anchor.inner.expired());
                return shared.lost_or_released(generation, reason, tenure);
            }
            reason = &mut watch => {
                return shared.lost_or_released(generation, reason, tenure);
            }
            // A member renewal moved the deadline (or the tenure ended): look again.
            changed = changes.changed() => if changed.is_err() {
                return Some(tenure);
            },
        }
    }
}

/// A bound tenure as its member's anchor sees it.
pub(super) struct BoundLink<B: LeaseBackend> {
    pub(super) shared: std::sync::Weak<Shared<B>>,
    pub(super) generation: u64,
}

impl<B: LeaseBackend> BoundChild for BoundLink<B> {
    fn extended(&self, deadline: Instant) -> bool {
        self.shared
            .upgrade()
            .is_some_and(|shared| shared.tenure.extend(self.generation, deadline))
    }

    fn ended(&self, reason: LostReason) {
        if let Some(shared) = self.shared.upgrade() {
            shared.lose(self.generation, reason);
        }
    }
}

/// Held by a renewal task: when the task is dropped before it ended its tenure (every normal
/// end of the task ends the tenure first), nothing will renew the tenure or end it at its
/// deadline any more, so the tenure ends now and the loss is reported
/// ([`LostReason::RenewalStopped`], or [`LostReason::Expired`] if the deadline had passed): when
/// the runtime the task ran on shuts down (an arbiter stopped, an actix-web worker restarted),
/// its tasks are dropped, and so is this.
pub(super) struct EndWithTask<B: LeaseBackend> {
    pub(super) shared: Arc<Shared<B>>,
    pub(super) generation: u64,
    /// Dropped after the tenure ended, however the task ends (see `TenureWatch::stall`).
    pub(super) _task: RenewalTask,
}

impl<B: LeaseBackend> Drop for EndWithTask<B> {
    fn drop(&mut self) {
        let reason = match self.shared.tenure.published(self.generation) {
            None => return,
            Some(tenure) if !tenure.is_alive() => LostReason::Expired { last_error: None },
            Some(_) => LostReason::RenewalStopped,
        };
        self.shared.lose(self.generation, reason);
    }
}

/// Resolves with the reason when the backend's watch reports a loss; re-establishes a broken watch
/// with a backoff.
async fn watch_loss<B: LeaseBackend>(shared: &Shared<B>, token: FencingToken) -> LostReason {
    let settings = &shared.settings;
    let max_backoff = settings.renewal_interval();
    let mut backoff = WATCH_BACKOFF_START;
    loop {
        let started = Instant::now();
        bump(&shared.counters.watch_starts);
        match shared.backend.watch_lost(settings, token).await {
            Ok(reason) => return reason,
            Err(error) => {
                bump(&shared.counters.watch_breaks);
                // A watch that worked for a while before breaking starts the backoff over.
                if started.elapsed() >= max_backoff {
                    backoff = WATCH_BACKOFF_START;
                }
                tracing::debug!(error = &error as &dyn StdError, retry_in = ?backoff, "lease watch broke, re-establishing");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(max_backoff);
            }
        }
    }
}

/// The first pause before asking the backend again to remove a claim whose release failed;
/// doubles up to the renewal interval.
const RELEASE_RETRY_START: Duration = Duration::from_millis(100);

/// After a release that failed (its outcome unknown: the record may still be held by this
/// owner), asks the backend to remove the claim once the store answers again
/// ([`LeaseBackend::release_unanswered`]), with a backoff, until it did, a new tenure started,
/// or the claim has surely ended without it: past its TTL, or for a bound lease once no member
/// tenure lives (a bound record would otherwise stay held for as long as its member does). So
/// a release that timed out costs the lease no TTL once the store answers.
pub(super) fn spawn_release_retry<B: LeaseBackend>(
    runtime: &tokio::runtime::Handle,
    shared: Arc<Shared<B>>,
) {
    let most = shared.settings.renewal_interval().max(RELEASE_RETRY_START);
    runtime.spawn(async move {
        let mut pause = RELEASE_RETRY_START;
        loop {
            tokio::time::sleep(pause).await;
            let mut ops = Arc::clone(&shared.ops).lock_owned().await;
            if ops.renewal.is_some() {
                return;
            }
            let bound_alive = shared
                .bound
                .get()
                .is_some_and(|anchor| anchor.current().is_some());
            match &ops.unreleased {
                None => return,
                Some(unreleased) if unreleased.pending().is_none() && !bound_alive => return,
                Some(_) => {}
            }
            let settings = &shared.settings;
            match timeout(
                settings.operation_timeout(),
                shared.backend.release_unanswered(settings),
            )
            .await
            {
                Ok(Ok(())) => {
                    ops.unreleased = None;
                    tracing::info!(lease = %settings.name(), owner = %settings.owner(), "the claim whose release had failed is released");
                    return;
                }
                Ok(Err(error)) => {
                    tracing::debug!(lease = %settings.name(), owner = %settings.owner(), error = &error as &dyn StdError, retry_in = ?pause, "releasing the claim whose release had failed failed again");
                }
                Err(_) => {
                    tracing::debug!(lease = %settings.name(), owner = %settings.owner(), retry_in = ?pause, "releasing the claim whose release had failed timed out");
                }
            }
            drop(ops);
            pause = (pause * 2).min(most);
        }
    });
}

/// Releases a claim nobody will use, holding the `ops` lock; a failure is reported by every
/// `release` until the claim has surely expired. (A bound claim whose member tenure ended is not
/// written: the backend judges every write, see `protocol::may_write_own`.)
pub(super) fn spawn_release_abandoned<B: LeaseBackend>(
    runtime: &tokio::runtime::Handle,
    shared: Arc<Shared<B>>,
    mut ops: OpsGuard<B::Tenure>,
    tenure: B::Tenure,
) {
    runtime.spawn(async move {
        match shared.release_tenure(tenure, &Giving::Release).await {
            Ok(_) => ops.unreleased = None,
            Err(error) => {
                tracing::warn!(lease = %shared.settings.name(), owner = %shared.settings.owner(), error = &error as &dyn StdError, "releasing an abandoned claim failed; it is released once the store answers again (or ends by itself)");
                ops.unreleased = Some(Unreleased::now(error, &shared.settings));
                drop(ops);
                if let Ok(runtime) = current_runtime(Operation::Release) {
                    spawn_release_retry(&runtime, shared);
                }
            }
        }
    });
}
