//! [`CoordinatorGate`]: the lease gate of a coordinator actor.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::lease::{FencingToken, Lease};
use crate::metrics::{self, LeaseLabel};
use crate::tenure::{TenureEnd, TenureGuard};

/// The default bound of the queue of requests that wait for the lease.
pub const DEFAULT_MAX_QUEUED: usize = 1024;
/// The default longest wait of a queued request.
pub const DEFAULT_MAX_QUEUE_WAIT: Duration = Duration::from_secs(30);
/// The default longest wait of an allocation for its region's acknowledgement (see
/// [`ShardCoordinator::with_ack_timeout`](crate::ShardCoordinator::with_ack_timeout)).
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a gated request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// The coordinator does not hold its lease right now (not yet acquired, or past its deadline).
    #[error("the coordinator does not hold its lease")]
    NotHeld,
    /// The tenure the request was processed under ended (the lease was lost, expired or
    /// released) before the request completed; the coordinator competes again.
    #[error("the coordinator's tenure ended: {0}")]
    TenureEnded(TenureEnd),
    /// The coordinator stopped before answering.
    #[error("the coordinator stopped")]
    Stopped,
    /// No region is registered to take the shard.
    #[error("no region is registered")]
    NoRegions,
    /// The queue of requests waiting for the lease is full.
    #[error("{capacity} requests already wait for the coordinator's lease")]
    QueueFull {
        /// The queue's bound.
        capacity: usize,
    },
    /// The request waited for the lease longer than the gate's queue wait bound.
    #[error("waited {waited:?} for the coordinator's lease")]
    QueueTimeout {
        /// How long it waited.
        waited: Duration,
    },
    /// The region chosen for the shard did not acknowledge
    /// [`HostShard`](crate::HostShard) within the coordinator's acknowledgement timeout. The
    /// shard stays allocated to that region (its `HostShard` may still be handled; allocating it
    /// elsewhere could host it twice) until the region is gone or the tenure ends.
    #[error("the region did not acknowledge the shard within {timeout:?}")]
    AckTimeout {
        /// The acknowledgement timeout.
        timeout: Duration,
    },
}

/// Where a gate is in its life.
#[derive(Debug, Clone, PartialEq, Eq, actix::MessageResponse)]
pub enum GateState {
    /// Acquiring the lease: requests wait (in a bounded queue).
    Acquiring,
    /// The lease is held with this token: requests are processed, each after a check.
    Open(FencingToken),
    /// The coordinator stopped: requests are refused.
    Closed(GateError),
}

/// Answers one queued request.
#[derive(Debug)]
pub struct Responder<Res>(oneshot::Sender<Result<Res, GateError>>);

impl<Res> Responder<Res> {
    /// A responder and the receiver of its answer.
    pub fn new() -> (Self, oneshot::Receiver<Result<Res, GateError>>) {
        let (tx, rx) = oneshot::channel();
        (Self(tx), rx)
    }

    /// Sends the answer (ignored if the requester gave up).
    pub fn send(self, result: Result<Res, GateError>) {
        let _ = self.0.send(result);
    }
}

/// A request that waited for the lease, with the responder for its answer.
pub type Queued<Req, Res> = (Req, Responder<Res>);

/// What [`CoordinatorGate::submit`] decided.
#[derive(Debug)]
pub enum Submission<Req, Res> {
    /// The lease is alive: process `Req` now under this token.
    Admitted(Req, FencingToken),
    /// The lease is being acquired: the request is queued; await the receiver for its answer.
    Queued(oneshot::Receiver<Result<Res, GateError>>),
    /// Refused.
    Refused(GateError),
}

/// The lease gate of a coordinator actor.
///
/// During a network partition two sides of a cluster can each elect a coordinator; if both allocate
/// shards, one shard ends up hosted twice. A coordinator that holds a lease cannot have a twin:
///
/// 1. it acquires the lease before it processes allocation requests; requests that arrive meanwhile
///    wait in a bounded queue ([`with_queue_bound`](Self::with_queue_bound): at most
///    [`DEFAULT_MAX_QUEUED`] requests, each at most [`DEFAULT_MAX_QUEUE_WAIT`]; beyond that they
///    are refused with [`GateError::QueueFull`] / [`GateError::QueueTimeout`]);
/// 2. it opens the gate with the [`TenureGuard`] of the tenure it got ([`open`](Self::open)), and
///    checks it ([`admit`](Self::admit)) right before each allocation, refusing with
///    [`GateError::NotHeld`] when the tenure is not alive;
/// 3. when that tenure ends (loss, deadline, a release through any handle of the lease: await
///    [`TenureGuard::ended`]), it rejects what is in progress with [`GateError::TenureEnded`],
///    goes back to acquiring ([`tenure_ended`](Self::tenure_ended)) and competes again;
/// 4. when it stops, it refuses everything for good ([`close`](Self::close)).
///
/// [`ShardCoordinator`](crate::ShardCoordinator) is a complete coordinator built that way.
///
/// # Example
///
/// The steps in order, outside an actor (a coordinator calls them from its handlers):
///
/// ```
/// use std::sync::Arc;
/// use actix_coordination::prelude::*;
/// use actix_coordination::{CoordinatorGate, Submission};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let lease = Arc::new(InMemoryLease::new(LeaseSettings::new("coordinator", "node-1")?, &store));
/// let mut gate: CoordinatorGate<_, &str, u32> = CoordinatorGate::new(Arc::clone(&lease));
///
/// // 1. Not held yet: the request waits.
/// let Submission::Queued(answer) = gate.submit("shard-1") else { unreachable!() };
/// // 2. Held: open the gate with the tenure's guard, then check it before each step.
/// assert!(lease.acquire().await?);
/// let (token, queued) = gate.open(lease.tenure().guard().expect("held")).expect("alive");
/// for (_shard, responder) in queued {
///     gate.admit()?;
///     responder.send(Ok(7)); // allocated under `token`
/// }
/// assert_eq!(answer.await?, Ok(7));
/// // 3. The tenure ends (here a release): back to acquiring.
/// lease.release().await?;
/// assert!(gate.tenure_ended(token));
/// assert_eq!(gate.admit(), Err(GateError::NotHeld));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CoordinatorGate<L: Lease, Req, Res> {
    lease: Arc<L>,
    state: GateState,
    guard: Option<TenureGuard>,
    pending: VecDeque<(Req, Responder<Res>, Instant)>,
    max_queued: usize,
    max_wait: Duration,
    label: LeaseLabel,
}

impl GateError {
    /// Every `reason` label value of a refusal (see [`GateError::reason`]).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const REASONS: &'static [&'static str] = &[
        "not_held",
        "tenure_ended",
        "stopped",
        "no_regions",
        "queue_full",
        "queue_timeout",
        "ack_timeout",
    ];

    /// The `reason` label of a refusal.
    fn reason(&self) -> &'static str {
        match self {
            GateError::NotHeld => "not_held",
            GateError::TenureEnded(_) => "tenure_ended",
            GateError::Stopped => "stopped",
            GateError::NoRegions => "no_regions",
            GateError::QueueFull { .. } => "queue_full",
            GateError::QueueTimeout { .. } => "queue_timeout",
            GateError::AckTimeout { .. } => "ack_timeout",
        }
    }
}

impl<L: Lease, Req, Res> CoordinatorGate<L, Req, Res> {
    /// A gate on `lease`, acquiring, with the default queue bounds.
    pub fn new(lease: Arc<L>) -> Self {
        let label = LeaseLabel::new(lease.name());
        metrics::coordinator_registered(&label, GateError::REASONS);
        Self {
            label,
            lease,
            state: GateState::Acquiring,
            guard: None,
            pending: VecDeque::new(),
            max_queued: DEFAULT_MAX_QUEUED,
            max_wait: DEFAULT_MAX_QUEUE_WAIT,
        }
    }

    /// Bounds the queue of requests waiting for the lease: at most `max_queued` requests
    /// (at least 1), each waiting at most `max_wait`.
    pub fn with_queue_bound(mut self, max_queued: usize, max_wait: Duration) -> Self {
        self.max_queued = max_queued.max(1);
        self.max_wait = max_wait;
        self
    }

    /// The longest a queued request waits.
    pub fn max_queue_wait(&self) -> Duration {
        self.max_wait
    }

    /// The lease.
    pub fn lease(&self) -> &Arc<L> {
        &self.lease
    }

    /// The gate's state.
    pub fn state(&self) -> &GateState {
        &self.state
    }

    /// The guard of the tenure the gate is open under.
    pub fn guard(&self) -> Option<&TenureGuard> {
        self.guard.as_ref()
    }

    /// How many requests wait for the lease.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Checks the tenure right before an allocation: the token to fence it with, or why not.
    /// Each check counts in the `coordinator_admitted` or `coordinator_refused` metric.
    pub fn admit(&self) -> Result<FencingToken, GateError> {
        let admitted = match (&self.state, &self.guard) {
            (GateState::Open(_), Some(guard)) if guard.check_alive() => Ok(guard.token()),
            (GateState::Closed(error), _) => Err(error.clone()),
            _ => Err(GateError::NotHeld),
        };
        match &admitted {
            Ok(_) => metrics::coordinator_admitted(&self.label),
            Err(error) => metrics::coordinator_refused(&self.label, error.reason()),
        }
        admitted
    }

    fn refuse(&self, error: GateError) -> GateError {
        metrics::coordinator_refused(&self.label, error.reason());
        error
    }

    /// Admits `request` now, queues it while acquiring (or refuses it when the queue is full), or
    /// refuses it.
    pub fn submit(&mut self, request: Req) -> Submission<Req, Res> {
        match &self.state {
            GateState::Acquiring => {
                if self.pending.len() >= self.max_queued {
                    return Submission::Refused(self.refuse(GateError::QueueFull {
                        capacity: self.max_queued,
                    }));
                }
                let (responder, rx) = Responder::new();
                self.pending.push_back((request, responder, Instant::now()));
                Submission::Queued(rx)
            }
            GateState::Open(_) => match self.admit() {
                Ok(token) => Submission::Admitted(request, token),
                Err(error) => Submission::Refused(error),
            },
            GateState::Closed(error) => Submission::Refused(self.refuse(error.clone())),
        }
    }

    /// Refuses the queued requests that waited as long as the bound; returns how many. Call it at
    /// [`next_expiry`](Self::next_expiry) (the reference coordinator does).
    pub fn expire(&mut self) -> usize {
        let now = Instant::now();
        let mut expired = 0;
        while let Some((_, _, since)) = self.pending.front() {
            let waited = now.duration_since(*since);
            if waited < self.max_wait {
                break;
            }
            if let Some((_, responder, _)) = self.pending.pop_front() {
                responder.send(Err(self.refuse(GateError::QueueTimeout { waited })));
                expired += 1;
            }
        }
        expired
    }

    /// When the oldest queued request will have waited [`max_queue_wait`](Self::max_queue_wait).
    pub fn next_expiry(&self) -> Option<Instant> {
        self.pending
            .front()
            .map(|(_, _, since)| *since + self.max_wait)
    }

    /// The lease was acquired under `guard`: opens the gate and hands back the queued requests to
    /// process (each still goes through [`admit`](Self::admit) first). `None`, and the gate stays
    /// as it is, if the tenure is not alive any more or the gate is closed.
    pub fn open(&mut self, guard: TenureGuard) -> Option<(FencingToken, Vec<Queued<Req, Res>>)> {
        if matches!(self.state, GateState::Closed(_)) || !guard.check_alive() {
            return None;
        }
        let token = guard.token();
        self.state = GateState::Open(token);
        self.guard = Some(guard);
        Some((
            token,
            self.pending.drain(..).map(|(r, tx, _)| (r, tx)).collect(),
        ))
    }

    /// The tenure the gate is open under ended: back to acquiring (requests queue again).
    /// Returns `false` if the gate was not open under a tenure with this token.
    pub fn tenure_ended(&mut self, token: FencingToken) -> bool {
        if self.state != GateState::Open(token) {
            return false;
        }
        self.state = GateState::Acquiring;
        self.guard = None;
        true
    }

    /// Closes the gate for good and rejects every queued request with `error`. Returns how many
    /// were rejected.
    pub fn close(&mut self, error: GateError) -> usize {
        self.state = GateState::Closed(error.clone());
        self.guard = None;
        let n = self.pending.len();
        for (_, responder, _) in std::mem::take(&mut self.pending) {
            responder.send(Err(self.refuse(error.clone())));
        }
        n
    }

    /// Reopens a closed gate for acquiring (a supervised coordinator that restarts).
    pub fn reset(&mut self) {
        if matches!(self.state, GateState::Closed(_)) {
            self.state = GateState::Acquiring;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every refusal reason is among the series recorded at registration.
    #[test]
    fn every_reason_is_registered() {
        let errors = [
            GateError::NotHeld,
            GateError::TenureEnded(crate::TenureEnd::Released),
            GateError::Stopped,
            GateError::NoRegions,
            GateError::QueueFull { capacity: 1 },
            GateError::QueueTimeout {
                waited: Duration::ZERO,
            },
            GateError::AckTimeout {
                timeout: Duration::ZERO,
            },
        ];
        for error in &errors {
            assert!(GateError::REASONS.contains(&error.reason()), "{error:?}");
        }
        assert_eq!(GateError::REASONS.len(), errors.len());
    }
}
