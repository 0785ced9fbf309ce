//! How the actors compete for a lease: the one "compete, then act under the tenure, then release"
//! helper that [`ClusterSingletonManager`](crate::ClusterSingletonManager) and
//! [`ShardCoordinator`](crate::ShardCoordinator) share.
//!
//! A [`Competition`] runs acquire *rounds* on their own task (not in the actor's context, so that a
//! round does not keep the actor alive once every address is gone) and delivers each round's
//! result to the actor as [`RoundDone`]:
//!
//! * a round makes one attempt first, so that an error goes straight to the backoff; only when the
//!   lease is held elsewhere does it wait, up to `2 × ttl`, on the backend's change notification
//!   ([`Lease::acquire_within`]);
//! * the next round comes after the retry delay ±20 % of jitter (nodes do not retry in lockstep),
//!   or, after errors, after an exponential backoff capped by `max_error_backoff`; a bound lease
//!   whose member tenure does not live, or ends before a claim could be answered
//!   ([`LeaseError::Unbound`], [`LeaseError::MemberEnding`]: nothing was sent), is not an error
//!   of the backoff, and competes again after the retry delay;
//! * a round that must end ([`Competition::cancel`]: shutdown, ineligible) never cuts an attempt
//!   short: a wait ends at once, an attempt in flight is finished (within the operation timeout),
//!   and the future `cancel` returns resolves when the round is over, so that the actor's
//!   `release` that follows releases whatever the round got;
//! * a round whose actor is gone releases what it got itself.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix::WeakRecipient;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;

use crate::lease::{FencingToken, Lease, LeaseError};
use crate::tenure::{TenureEnd, TenureGuard};

/// The shortest acquire round.
pub(crate) const MIN_ROUND: Duration = Duration::from_millis(10);
/// The shortest pause after an acquire error.
pub(crate) const MIN_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The result of acquire round `round`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct RoundDone {
    pub(crate) round: u64,
    pub(crate) result: Result<bool, LeaseError>,
}

/// The tenure with fencing token `token` ended.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct TenureEnded {
    pub(crate) token: FencingToken,
    pub(crate) end: TenureEnd,
}

/// Tells an actor when a tenure ends, from a task of its own (not from the actor's context, which
/// it would keep alive); aborted when dropped.
pub(crate) struct EndWatch(JoinHandle<()>);

impl EndWatch {
    pub(crate) fn start(guard: &TenureGuard, to: WeakRecipient<TenureEnded>) -> Self {
        let token = guard.token();
        let ended = guard.ended();
        Self(actix_rt::spawn(async move {
            let end = ended.await;
            if let Some(actor) = to.upgrade() {
                actor.do_send(TenureEnded { token, end });
            }
        }))
    }
}

impl Drop for EndWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the actor does after a round.
#[derive(Debug)]
pub(crate) enum Next {
    /// The lease is held: act under this guard.
    Acquired(TenureGuard),
    /// Compete again after this pause.
    Compete(Duration),
}

/// The round in flight.
struct Round {
    cancel: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// Competes for `lease` in rounds on behalf of one actor; see the module documentation.
pub(crate) struct Competition<L: Lease> {
    lease: Arc<L>,
    retry_delay: Duration,
    max_error_backoff: Duration,
    rounds: u64,
    current: Option<Round>,
    errors: u32,
    /// Bounds the first attempts in flight of the rounds of every competition sharing it.
    gate: Option<Arc<Semaphore>>,
}

impl<L: Lease> Competition<L> {
    pub(crate) fn new(lease: Arc<L>, retry_delay: Duration, max_error_backoff: Duration) -> Self {
        Self {
            lease,
            retry_delay,
            max_error_backoff,
            rounds: 0,
            current: None,
            errors: 0,
            gate: None,
        }
    }

    /// Each round's first attempt waits for a permit of `gate`, held until it answered: a
    /// node's shard managers starting together (a fleet's start, the shards of a crashed node)
    /// send at most that many claims at once, and the node's member renewal never queues behind
    /// all of them. A cancelled round stops waiting. The waits that follow the first attempt
    /// (each attempt upon a change of the lease) are not gated.
    pub(crate) fn gated(mut self, gate: Option<Arc<Semaphore>>) -> Self {
        self.gate = gate;
        self
    }

    /// Starts a round after `delay` (cancelling the one in flight); its [`RoundDone`] goes to
    /// `to`. After an error the round is a single attempt (the backoff paces them), otherwise it
    /// waits up to `max(2 × ttl, retry_delay)` on the backend's change notification.
    pub(crate) fn start(&mut self, delay: Duration, to: WeakRecipient<RoundDone>) {
        drop(self.cancel());
        self.rounds += 1;
        let round = self.rounds;
        let window = if self.errors > 0 {
            Duration::ZERO
        } else {
            (self.lease.settings().ttl().saturating_mul(2)).max(self.retry_delay.max(MIN_ROUND))
        };
        let (cancel, cancelled) = oneshot::channel();
        let task = actix_rt::spawn(run_round(
            Arc::clone(&self.lease),
            self.gate.clone(),
            delay,
            window,
            cancelled,
            round,
            to,
        ));
        self.current = Some(Round { cancel, task });
    }

    /// Whether `done` answers the round in flight (and not one cancelled since); forgets the
    /// round if so.
    pub(crate) fn take_current(&mut self, done: &RoundDone) -> bool {
        if done.round == self.rounds && self.current.is_some() {
            self.current = None;
            true
        } else {
            false
        }
    }

    /// Ends the round in flight: a wait ends at once, an attempt in flight is finished. The
    /// returned future resolves once the round is over (at once if there is none); release the
    /// lease after it to give back whatever the round got.
    pub(crate) fn cancel(&mut self) -> impl std::future::Future<Output = ()> + 'static {
        // Signalled now, not when the returned future is first polled.
        let task = self.current.take().map(|Round { cancel, task }| {
            drop(cancel);
            task
        });
        async move {
            if let Some(task) = task {
                let _ = task.await;
            }
        }
    }

    /// What to do after `result`; logs errors and keeps the error count.
    pub(crate) fn next(&mut self, result: Result<bool, LeaseError>) -> Next {
        match result {
            Ok(true) => {
                self.recovered();
                match self.lease.tenure().guard() {
                    Some(guard) => Next::Acquired(guard),
                    // Ended again before we looked (a pause past the deadline, a release through
                    // another handle): never act on it; compete again.
                    None => {
                        tracing::warn!(lease = %self.lease.name(), owner = %self.lease.owner(), "acquired, but the tenure ended before it could be used; competing again");
                        Next::Compete(Duration::ZERO)
                    }
                }
            }
            Ok(false) => {
                // Held elsewhere for a whole round (which waited on the watch): the next round
                // after the retry delay, with jitter.
                self.recovered();
                Next::Compete(jitter(self.retry_delay.max(MIN_ROUND)))
            }
            Err(LeaseError::Busy { .. }) => {
                // Another acquire or release of the same lease (through another handle) was in
                // flight; it ends within an operation timeout: try again soon.
                tracing::debug!(lease = %self.lease.name(), owner = %self.lease.owner(), "lease busy with another operation; competing again shortly");
                Next::Compete(jitter(self.retry_delay.max(MIN_ROUND)).min(MIN_ERROR_BACKOFF))
            }
            Err(error @ (LeaseError::Unbound { .. } | LeaseError::MemberEnding { .. })) => {
                // A bound lease whose member tenure does not live (lost, not acquired yet) or
                // ends before a claim could be answered: nothing was sent, and the store is not at
                // fault. Not an error of the backoff: after one, the claims waited out a backoff
                // of up to `max_error_backoff` *after* the member was held again (a node back from
                // a pause and a partition left the shards of two nodes that had left unclaimed for
                // 20 s). Ask again after the retry delay: the member's own competition and
                // renewals pace what is sent.
                tracing::debug!(error = &error as &dyn std::error::Error, lease = %self.lease.name(), owner = %self.lease.owner(), "no live member tenure to claim under; competing again after the retry delay");
                Next::Compete(jitter(self.retry_delay.max(MIN_ROUND)))
            }
            Err(error) => {
                self.errors = self.errors.saturating_add(1);
                let delay = error_backoff(self.retry_delay, self.max_error_backoff, self.errors);
                tracing::warn!(error = &error as &dyn std::error::Error, lease = %self.lease.name(), owner = %self.lease.owner(), errors = self.errors, retry_in = ?delay, "lease acquire failed");
                Next::Compete(delay)
            }
        }
    }

    /// The backend answered: ends the error backoff.
    fn recovered(&mut self) {
        if self.errors > 0 {
            tracing::debug!(lease = %self.lease.name(), owner = %self.lease.owner(), errors = self.errors, "lease store reachable again");
            self.errors = 0;
        }
    }
}

impl<L: Lease> Drop for Competition<L> {
    fn drop(&mut self) {
        // The actor is gone: the round ends (and releases what it got itself).
        drop(self.cancel());
    }
}

async fn run_round<L: Lease>(
    lease: Arc<L>,
    gate: Option<Arc<Semaphore>>,
    delay: Duration,
    window: Duration,
    mut cancelled: oneshot::Receiver<()>,
    round: u64,
    to: WeakRecipient<RoundDone>,
) {
    if !delay.is_zero() {
        tokio::select! {
            biased;
            _ = &mut cancelled => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
    if !matches!(
        cancelled.try_recv(),
        Err(oneshot::error::TryRecvError::Empty)
    ) {
        return;
    }
    let permit = match gate {
        Some(gate) => tokio::select! {
            biased;
            _ = &mut cancelled => return,
            permit = gate.acquire_owned() => permit.ok(),
        },
        None => None,
    };
    // One attempt (no retries, no wait), finished even if the round is cancelled meanwhile.
    let mut result = lease.acquire_within(Duration::ZERO).await;
    drop(permit);
    if matches!(result, Ok(false)) && !window.is_zero() {
        tokio::select! {
            biased;
            // Cancelled: the wait ends; an attempt in flight inside it is finished by the lease
            // (and what it got released), and a `release` after this round waits for that.
            _ = &mut cancelled => {}
            r = lease.acquire_within(window) => result = r,
        }
    }
    match to.upgrade() {
        Some(actor) => actor.do_send(RoundDone { round, result }),
        // The actor is gone: do not keep a lease nobody uses.
        None => {
            if matches!(result, Ok(true)) {
                let _ = lease.release().await;
            }
        }
    }
}

/// `delay` ± 20 %, so that nodes do not retry in lockstep; saturates at `Duration::MAX` (a delay
/// that long means "never"), never panics.
pub(crate) fn jitter(delay: Duration) -> Duration {
    scale(delay, 0.8 + 0.4 * fastrand::f64())
}

/// `delay × factor` (`factor >= 0`), saturating at `Duration::MAX` instead of panicking as
/// `Duration::mul_f64` does.
fn scale(delay: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(delay.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

/// The pause after the `errors`-th error in a row (`errors >= 1`): `max(base, 100 ms)` after the
/// first, doubling after every further error, up to `max(cap, 100 ms)`; each pause is 80–100 % of
/// its nominal value, so never beyond the cap.
pub(crate) fn error_backoff(base: Duration, cap: Duration, errors: u32) -> Duration {
    let base = base.max(MIN_ERROR_BACKOFF);
    let cap = cap.max(MIN_ERROR_BACKOFF);
    let doublings = errors.saturating_sub(1).min(30);
    let nominal = base.saturating_mul(1u32 << doublings).min(cap);
    scale(nominal, 0.8 + 0.2 * fastrand::f64()).min(nominal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let (base, cap) = (Duration::from_millis(500), Duration::from_secs(3));
        let nominal = [500, 1000, 2000, 3000, 3000, 3000];
        for (errors, nominal) in (1..).zip(nominal) {
            let pause = error_backoff(base, cap, errors);
            let nominal = Duration::from_millis(nominal);
            assert!(
                pause <= nominal && pause >= nominal.mul_f64(0.8),
                "{pause:?} vs {nominal:?}"
            );
        }
    }

    #[test]
    fn floors_and_never_overflows() {
        assert!(error_backoff(Duration::ZERO, Duration::ZERO, 1) >= Duration::from_millis(80));
        assert!(error_backoff(Duration::ZERO, Duration::ZERO, 1) <= Duration::from_millis(100));
        let far = error_backoff(Duration::from_secs(1), Duration::MAX, u32::MAX);
        assert!(far >= Duration::from_secs(1 << 30).mul_f64(0.8));
    }

    #[test]
    fn the_longest_durations_saturate_instead_of_panicking() {
        for _ in 0..1000 {
            assert!(jitter(Duration::MAX) >= Duration::MAX.mul_f64(0.79));
            let pause = error_backoff(Duration::MAX, Duration::MAX, u32::MAX);
            assert!(pause >= Duration::MAX.mul_f64(0.79));
        }
        assert_eq!(scale(Duration::MAX, 1.0), Duration::MAX);
        assert_eq!(scale(Duration::MAX, 2.0), Duration::MAX);
        assert_eq!(scale(Duration::from_secs(10), 0.5), Duration::from_secs(5));
    }

    /// A bound claim without a live member tenure (nothing sent) competes again after the retry
    /// delay however often it happens, and does not count towards the error backoff: a shard
    /// claim must not wait out a backoff of up to `max_error_backoff` after its member came back.
    #[test]
    fn an_unbound_claim_is_retried_after_the_retry_delay_and_is_no_error() {
        let _rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .enter();
        let lease =
            crate::InMemoryStore::new().lease(crate::LeaseSettings::new("shard", "node").unwrap());
        let retry = Duration::from_millis(500);
        let mut competition = Competition::new(Arc::new(lease), retry, Duration::from_secs(10));
        let unbound = || LeaseError::Unbound {
            member: "member".into(),
        };
        for _ in 0..20 {
            match competition.next(Err(unbound())) {
                Next::Compete(delay) => assert!(delay <= retry.mul_f64(1.2), "{delay:?}"),
                Next::Acquired(_) => panic!("not acquired"),
            }
        }
        assert_eq!(competition.errors, 0);
        let timeout = LeaseError::Timeout {
            operation: crate::Operation::Acquire,
            timeout: Duration::from_secs(1),
        };
        match competition.next(Err(timeout)) {
            // The first error of a row: `max(retry_delay, 100 ms)`.
            Next::Compete(delay) => assert!(delay <= retry, "{delay:?}"),
            Next::Acquired(_) => panic!("not acquired"),
        }
        assert_eq!(competition.errors, 1);
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        for _ in 0..1000 {
            let j = jitter(Duration::from_secs(1));
            assert!(j >= Duration::from_millis(800) && j <= Duration::from_millis(1200));
        }
    }
}
