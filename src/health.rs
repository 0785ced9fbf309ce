//! [`HealthCheck`]: liveness and readiness of a process that holds leases, the way client-go's
//! `HealthzAdaptor` does it.
//!
//! See [`HealthCheck`] for the semantics.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::lease::Lease;
use crate::shared::{SharedLease, WeakSharedLease};
use crate::tenure::{Stall, TenureWatch};

/// The default tolerance of [`HealthCheck`]: how far past a deadline (or a stop timeout) a check
/// waits before it reports the process unhealthy.
pub const DEFAULT_HEALTH_TOLERANCE: Duration = Duration::from_secs(2);

/// Why a process is not live (see [`HealthCheck::liveness`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unhealthy {
    /// The tenure of `lease` is still published, but its deadline passed `overdue` ago: the
    /// renewal task did not run to renew it or end it.
    #[error("lease {lease:?} is held by this process but its deadline passed {overdue:?} ago without a renewal: the renewal task is not running")]
    RenewalOverdue {
        /// The lease name.
        lease: String,
        /// How long ago the deadline passed.
        overdue: Duration,
    },
    /// The tenure of `lease` is still published, but its renewal task ended (it panicked or was
    /// aborted).
    #[error("lease {lease:?} is held by this process but its renewal task has ended")]
    RenewalTaskEnded {
        /// The lease name.
        lease: String,
    },
    /// The singleton of `lease` was told to stop `stopping_for` ago and has not stopped (or was
    /// terminated after its stop timeout and is still not gone).
    #[error("the singleton of lease {lease:?} was told to stop {stopping_for:?} ago and has not stopped (stop timeout {stop_timeout:?})")]
    SingletonNotStopped {
        /// The lease name.
        lease: String,
        /// How long ago it was told to stop.
        stopping_for: Duration,
        /// The manager's stop timeout.
        stop_timeout: Duration,
    },
}

/// Why a process is not ready (see [`HealthCheck::readiness`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotReady {
    /// The singleton manager of `lease` is not eligible.
    #[error("the singleton manager of lease {lease:?} is not eligible")]
    NotEligible {
        /// The lease name.
        lease: String,
    },
    /// The singleton manager of `lease` is shutting down (or has shut down).
    #[error("the singleton manager of lease {lease:?} is shutting down")]
    ShuttingDown {
        /// The lease name.
        lease: String,
    },
    /// The singleton manager of `lease` has a candidacy that was never published yet: the other
    /// nodes cannot see this one as a candidate, so a leader stopped now would not hand over to
    /// it.
    #[error("the candidacy for lease {lease:?} is not published yet")]
    CandidacyNotPublished {
        /// The lease name.
        lease: String,
    },
    /// The sharded workers of `group` have not listed their group yet (their group watch), so
    /// they have not joined it.
    #[error("the sharded workers of group {group:?} have not listed their group yet")]
    GroupNotListed {
        /// The group.
        group: String,
    },
    /// The sharded workers of `group` never held their member lease `member` yet: the other
    /// nodes do not count this one as a member, and place no shard on it.
    #[error("the member lease {member:?} of group {group:?} was never held yet")]
    MemberNotPublished {
        /// The group.
        group: String,
        /// The member lease's name.
        member: String,
    },
    /// The sharded workers of `group` are leaving it (a [`Shutdown`](crate::Shutdown)).
    #[error("the sharded workers of group {group:?} are leaving it")]
    Leaving {
        /// The group.
        group: String,
    },
}

/// One lease as a status page shows it (see [`HealthCheck::leases`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseReport {
    /// The lease name.
    pub name: String,
    /// This process's owner identity.
    pub owner: String,
    /// The holder as this process last saw it ([`Lease::observed_holder`]): informational.
    pub holder: Option<String>,
    /// Whether this process holds the lease (its tenure is alive) right now.
    pub held: bool,
    /// The fencing token of the tenure alive right now.
    pub fencing_token: Option<u64>,
    /// Milliseconds left to the local deadline of the tenure alive right now.
    pub deadline_in_ms: Option<u64>,
}

/// Liveness, readiness and lease reports of the leases and singleton managers registered with
/// it. Cheap to clone (clones share the registrations); `Send + Sync`.
///
/// # Liveness: "I believe I lead, but cannot prove it"
///
/// A lease of this crate ends its tenure itself: its renewal task renews it, and ends it at the
/// local deadline when renewals fail. A process whose tenure is *published* (so that it acts as
/// the holder) while nothing looks after it is wedged, and a restart is the cure. So
/// [`liveness`](HealthCheck::liveness) fails when, for any lease or singleton registered with it:
///
/// * the lease's tenure is still published and its deadline passed more than the *tolerance*
///   ago: the renewal task did not get to run, to renew it or to end it (a blocked runtime, a
///   starved thread): [`Unhealthy::RenewalOverdue`];
/// * the lease's tenure is still published but its renewal task has ended (it panicked, or it was
///   aborted): [`Unhealthy::RenewalTaskEnded`];
/// * a [`ClusterSingletonManager`](crate::ClusterSingletonManager) told its singleton to stop and
///   it has not stopped within the manager's `stop_timeout` plus the tolerance, or it was
///   terminated after the stop timeout and is still not gone (its thread is blocked), so it may
///   still act without a tenure: [`Unhealthy::SingletonNotStopped`].
///
/// Every check reads shared state and the clock; none sends a message or waits, so a check
/// answers even when the runtime or the arbiter it watches is blocked (that is the point). A
/// process that does not hold anything is live: a backend that is down is not cured by a restart
/// (the lease simply ends at its deadline), so it never fails liveness by itself.
///
/// # Readiness follows eligibility
///
/// [`HealthCheck::readiness`] fails while a registered singleton manager is not eligible
/// ([`SetEligible(false)`](crate::SetEligible)) or is shutting down, so a load balancer stops
/// sending traffic to a node that withdrew. Turn that off with
/// [`HealthCheck::readiness_follows_eligibility`] when readiness means something else in your
/// service.
///
/// A manager counts for as long as it exists: once it has shut down and is gone (its actor
/// dropped), it leaves the check, like a dropped lease. So a manager replaced on a configuration
/// reload (the old one shut down, a new one registered with the same check) leaves readiness to
/// its replacement (test `readiness_follows_the_replacement_of_a_manager` in `tests/health.rs`).
/// A check never has to be told to forget a manager. A singleton the manager terminated after
/// its stop timeout keeps the registration while it is not gone, so liveness keeps failing until
/// it is, even after its manager is gone (test
/// `a_singleton_left_behind_by_a_manager_that_is_gone_fails_liveness_until_it_is_gone`).
///
/// # Readiness waits for the candidacy
///
/// A manager with a [candidacy](crate::ClusterSingletonManager::candidacy) that competes (eligible,
/// not shutting down) is not ready until its candidacy was published once
/// ([`NotReady::CandidacyNotPublished`]): in a rolling update driven by readiness, the next old
/// replica (the leader, perhaps) is stopped only once the new one is a candidate that the leader
/// sees and hands over to. Only the first publication counts: a candidacy withdrawn or lost later
/// (a backend outage) leaves readiness alone, so that an outage does not take every replica out
/// of its Service. Turn it off with [`HealthCheck::readiness_waits_for_candidacy`].
///
/// # Sharded workers: ready once they joined, not while they leave
///
/// Sharded workers registered with
/// [`ShardedWorkers::health`](crate::ShardedWorkers::health) are not ready until their group
/// watch has listed the group ([`NotReady::GroupNotListed`]) and their member lease was held once
/// ([`NotReady::MemberNotPublished`]): from then on the other nodes count this one as a member and
/// place shards on it, so in a rolling update driven by readiness the next old replica is stopped
/// only once the new one can take shards. As for a candidacy, only the first time counts (a
/// member lease lost later, in a backend outage, leaves readiness alone). Once they begin to
/// leave (a [`Shutdown`](crate::Shutdown)) they are not ready ([`NotReady::Leaving`]). The
/// first two follow [`HealthCheck::readiness_waits_for_candidacy`], the last
/// [`HealthCheck::readiness_follows_eligibility`]; the member lease counts for liveness like a
/// lease added with [`HealthCheck::add_lease`].
///
/// # Never panics
///
/// No check panics, whatever the settings (a stop timeout or a tolerance of `Duration::MAX`
/// included): every computation with them saturates.
///
/// # Reports
///
/// [`HealthCheck::leases`] lists every registered lease as a [`LeaseReport`] (name, owner, the
/// holder as last seen, whether this process holds it, its fencing token, the time left to its
/// deadline), for status pages.
///
/// # Example
///
/// Register the leases (and managers, with
/// [`ClusterSingletonManager::health`](crate::ClusterSingletonManager::health)), then serve the
/// checks, for example on `/healthz` and `/readyz` (feature `web`: `AdminRoutes` does it):
///
/// ```
/// use std::sync::Arc;
/// use actix_coordination::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let lease = Arc::new(InMemoryLease::new(LeaseSettings::new("jobs", "node-1")?, &store));
/// let health = HealthCheck::new();
/// health.add_lease(&lease);
///
/// assert!(lease.acquire().await?);
/// assert!(health.liveness().is_ok()); // the renewal task looks after the tenure
/// assert!(health.readiness().is_ok());
/// let report = &health.leases()[0];
/// assert_eq!((report.name.as_str(), report.held), ("jobs", true));
/// assert_eq!(report.holder.as_deref(), Some("node-1"));
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct HealthCheck {
    inner: Arc<Inner>,
}

struct Inner {
    tolerance: Duration,
    readiness_follows_eligibility: bool,
    readiness_waits_for_candidacy: bool,
    leases: Mutex<Vec<Handle>>,
    /// Held weakly: the manager owns its state, so a manager that is gone (shut down and dropped,
    /// replaced on a configuration reload) leaves the check.
    singletons: Mutex<Vec<Weak<SingletonHealth>>>,
    /// Sharded workers' states, held weakly as the singletons' are.
    sharded: Mutex<Vec<Weak<ShardedHealth>>>,
}

impl fmt::Debug for HealthCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthCheck")
            .field("tolerance", &self.inner.tolerance)
            .field("leases", &self.leases())
            .field("liveness", &self.liveness())
            .field("readiness", &self.readiness())
            .finish()
    }
}

impl Default for HealthCheck {
    fn default() -> Self {
        Self::new()
    }
}

impl HealthCheck {
    /// A check with the [`DEFAULT_HEALTH_TOLERANCE`], whose readiness follows eligibility.
    pub fn new() -> Self {
        Self::with_tolerance(DEFAULT_HEALTH_TOLERANCE)
    }

    /// A check that tolerates a deadline (or a stop timeout) passed by up to `tolerance` before
    /// it reports the process unhealthy.
    pub fn with_tolerance(tolerance: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                tolerance,
                readiness_follows_eligibility: true,
                readiness_waits_for_candidacy: true,
                leases: Mutex::new(Vec::new()),
                singletons: Mutex::new(Vec::new()),
                sharded: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Whether [`readiness`](Self::readiness) follows the eligibility of the registered singleton
    /// managers (default `true`). Call it before cloning the check.
    pub fn readiness_follows_eligibility(mut self, follows: bool) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.readiness_follows_eligibility = follows,
            None => {
                let inner = Inner {
                    tolerance: self.inner.tolerance,
                    readiness_follows_eligibility: follows,
                    readiness_waits_for_candidacy: self.inner.readiness_waits_for_candidacy,
                    leases: Mutex::new(lock(&self.inner.leases).clone()),
                    singletons: Mutex::new(lock(&self.inner.singletons).clone()),
                    sharded: Mutex::new(lock(&self.inner.sharded).clone()),
                };
                self.inner = Arc::new(inner);
            }
        }
        self
    }

    /// Whether [`readiness`](Self::readiness) waits until the candidacy of every registered
    /// singleton manager that has one is published (default `true`; see [`HealthCheck`]). Call
    /// it before cloning the check.
    pub fn readiness_waits_for_candidacy(mut self, waits: bool) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.readiness_waits_for_candidacy = waits,
            None => {
                let inner = Inner {
                    tolerance: self.inner.tolerance,
                    readiness_follows_eligibility: self.inner.readiness_follows_eligibility,
                    readiness_waits_for_candidacy: waits,
                    leases: Mutex::new(lock(&self.inner.leases).clone()),
                    singletons: Mutex::new(lock(&self.inner.singletons).clone()),
                    sharded: Mutex::new(lock(&self.inner.sharded).clone()),
                };
                self.inner = Arc::new(inner);
            }
        }
        self
    }

    /// The tolerance of this check.
    pub fn tolerance(&self) -> Duration {
        self.inner.tolerance
    }

    /// Watches `lease` (held weakly: a dropped lease leaves the check).
    pub fn add_lease<L: Lease>(&self, lease: &Arc<L>) {
        let weak: Weak<dyn Observed> = Arc::downgrade(lease) as Weak<L>;
        let mut leases = lock(&self.inner.leases);
        leases.retain(Handle::is_alive);
        if !leases
            .iter()
            .any(|l| matches!(l, Handle::Arc(l) if Weak::ptr_eq(l, &weak)))
        {
            leases.push(Handle::Arc(weak));
        }
    }

    /// Watches a [`SharedLease`] (such as one from the
    /// [`LeaseProvider`](crate::LeaseProvider)), held weakly: once every clone of it is dropped,
    /// it leaves the check.
    pub fn add_shared_lease(&self, lease: &SharedLease) {
        let mut leases = lock(&self.inner.leases);
        leases.retain(Handle::is_alive);
        let known = leases.iter().any(|l| match l {
            Handle::Shared(weak) => weak.upgrade().is_some_and(|l| l.ptr_eq(lease)),
            Handle::Arc(_) => false,
        });
        if !known {
            leases.push(Handle::Shared(lease.downgrade()));
        }
    }

    /// Registers a singleton manager's state (see
    /// [`ClusterSingletonManager::health`](crate::ClusterSingletonManager::health)), held weakly:
    /// it leaves the check when the manager drops it.
    pub(crate) fn add_singleton(&self, singleton: &Arc<SingletonHealth>) {
        let mut singletons = lock(&self.inner.singletons);
        singletons.retain(|s| s.strong_count() > 0);
        singletons.push(Arc::downgrade(singleton));
    }

    /// Registers sharded workers' state (see
    /// [`ShardedWorkers::health`](crate::ShardedWorkers::health)), held weakly.
    pub(crate) fn add_sharded(&self, sharded: &Arc<ShardedHealth>) {
        let mut all = lock(&self.inner.sharded);
        all.retain(|s| s.strong_count() > 0);
        all.push(Arc::downgrade(sharded));
    }

    /// `Ok(())` when the process is live; else the first problem found (see [`HealthCheck`]).
    /// Never blocks.
    ///
    /// # Errors
    ///
    /// [`Unhealthy`] says which lease or singleton is not looked after.
    pub fn liveness(&self) -> Result<(), Unhealthy> {
        let tolerance = self.inner.tolerance;
        for lease in self.live_leases() {
            match lease.tenure().stall(tolerance) {
                None => {}
                Some(Stall::TaskEnded) => {
                    return Err(Unhealthy::RenewalTaskEnded {
                        lease: lease.name().to_owned(),
                    })
                }
                Some(Stall::Overdue(overdue)) => {
                    return Err(Unhealthy::RenewalOverdue {
                        lease: lease.name().to_owned(),
                        overdue,
                    })
                }
            }
        }
        for singleton in self.live_singletons() {
            singleton.check(tolerance)?;
        }
        Ok(())
    }

    /// `Ok(())` when the process is ready: every registered singleton manager is eligible and
    /// not shutting down, and no registered sharded workers are leaving their group (unless
    /// [`readiness_follows_eligibility`](Self::readiness_follows_eligibility) is off), and every
    /// manager with a candidacy that competes has published it once, and all registered sharded
    /// workers have listed their group and held their member lease once (unless
    /// [`readiness_waits_for_candidacy`](Self::readiness_waits_for_candidacy) is off). Never
    /// blocks.
    ///
    /// # Errors
    ///
    /// [`NotReady`] says which manager is not eligible, is shutting down, or has not published
    /// its candidacy yet, or which sharded workers have not joined their group yet or are
    /// leaving it.
    pub fn readiness(&self) -> Result<(), NotReady> {
        let (eligibility, candidacy) = (
            self.inner.readiness_follows_eligibility,
            self.inner.readiness_waits_for_candidacy,
        );
        let sharded: Vec<_> = (lock(&self.inner.sharded).iter())
            .filter_map(Weak::upgrade)
            .collect();
        for workers in sharded {
            workers.check(eligibility, candidacy)?;
        }
        for singleton in self.live_singletons() {
            let state = lock(&singleton.state);
            let competes = state.eligible && !state.shutting_down;
            if candidacy && competes && state.candidacy_pending {
                return Err(NotReady::CandidacyNotPublished {
                    lease: singleton.lease.clone(),
                });
            }
            if !eligibility {
                continue;
            }
            if state.shutting_down {
                return Err(NotReady::ShuttingDown {
                    lease: singleton.lease.clone(),
                });
            }
            if !state.eligible {
                return Err(NotReady::NotEligible {
                    lease: singleton.lease.clone(),
                });
            }
        }
        Ok(())
    }

    /// Every registered lease (and every singleton manager's lease) as it stands now, by name.
    pub fn leases(&self) -> Vec<LeaseReport> {
        let mut reports: Vec<LeaseReport> = self
            .live_leases()
            .iter()
            .map(|lease| {
                let tenure = lease.tenure().current();
                LeaseReport {
                    name: lease.name().to_owned(),
                    owner: lease.owner().to_owned(),
                    holder: lease.observed_holder(),
                    held: tenure.is_some(),
                    fencing_token: tenure.map(|t| t.token().value()),
                    deadline_in_ms: tenure.map(|t| {
                        let left = t.deadline().saturating_duration_since(Instant::now());
                        u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
                    }),
                }
            })
            .collect();
        reports.sort_by(|a, b| (&a.name, &a.owner).cmp(&(&b.name, &b.owner)));
        reports
    }

    fn live_leases(&self) -> Vec<Arc<dyn Observed>> {
        let mut leases: Vec<Arc<dyn Observed>> = lock(&self.inner.leases)
            .iter()
            .filter_map(Handle::upgrade)
            .collect();
        for singleton in self.live_singletons() {
            if let Some(lease) = singleton.lease_handle.as_ref().and_then(Weak::upgrade) {
                if !leases.iter().any(|l| Arc::ptr_eq(l, &lease)) {
                    leases.push(lease);
                }
            }
        }
        leases
    }

    fn live_singletons(&self) -> Vec<Arc<SingletonHealth>> {
        lock(&self.inner.singletons)
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// A lease registered with a check, held weakly.
#[derive(Clone)]
enum Handle {
    Arc(Weak<dyn Observed>),
    Shared(WeakSharedLease),
}

impl Handle {
    fn upgrade(&self) -> Option<Arc<dyn Observed>> {
        match self {
            Handle::Arc(weak) => weak.upgrade(),
            Handle::Shared(weak) => weak.upgrade().map(|l| Arc::new(l) as Arc<dyn Observed>),
        }
    }

    fn is_alive(&self) -> bool {
        match self {
            Handle::Arc(weak) => weak.strong_count() > 0,
            Handle::Shared(weak) => weak.is_alive(),
        }
    }
}

/// What a health check reads of a lease; object safe.
pub(crate) trait Observed: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn owner(&self) -> &str;
    fn tenure(&self) -> &TenureWatch;
    fn observed_holder(&self) -> Option<String>;
}

impl<L: Lease> Observed for L {
    fn name(&self) -> &str {
        Lease::name(self)
    }
    fn owner(&self) -> &str {
        Lease::owner(self)
    }
    fn tenure(&self) -> &TenureWatch {
        Lease::tenure(self)
    }
    fn observed_holder(&self) -> Option<String> {
        Lease::observed_holder(self)
    }
}

/// The state of a singleton manager that its health check reads; the manager writes it.
/// What a health check reads of sharded workers (see
/// [`ShardedWorkers::health`](crate::ShardedWorkers::health)): set by the workers' actor.
#[derive(Debug)]
pub(crate) struct ShardedHealth {
    group: String,
    member: String,
    /// The group watch has listed the group (the workers joined).
    pub(crate) listed: AtomicBool,
    /// The member lease was held once.
    pub(crate) published: AtomicBool,
    /// A shutdown began.
    pub(crate) leaving: AtomicBool,
}

impl ShardedHealth {
    pub(crate) fn new(group: &str, member: &str) -> Self {
        Self {
            group: group.to_owned(),
            member: member.to_owned(),
            listed: AtomicBool::new(false),
            published: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
        }
    }

    /// Readiness, as [`HealthCheck::readiness`] describes it.
    fn check(&self, eligibility: bool, joined: bool) -> Result<(), NotReady> {
        let group = || self.group.clone();
        if eligibility && self.leaving.load(Ordering::Acquire) {
            return Err(NotReady::Leaving { group: group() });
        }
        if joined && !self.listed.load(Ordering::Acquire) {
            return Err(NotReady::GroupNotListed { group: group() });
        }
        if joined && !self.published.load(Ordering::Acquire) {
            return Err(NotReady::MemberNotPublished {
                group: group(),
                member: self.member.clone(),
            });
        }
        Ok(())
    }
}

pub(crate) struct SingletonHealth {
    lease: String,
    lease_handle: Option<Weak<dyn Observed>>,
    stop_timeout: Duration,
    state: Mutex<SingletonHealthState>,
}

#[derive(Debug, Default)]
pub(crate) struct SingletonHealthState {
    /// Whether the manager competes (eligible).
    pub(crate) eligible: bool,
    /// Whether the manager is shutting down or has shut down.
    pub(crate) shutting_down: bool,
    /// When the manager told the running singleton to stop, while it has not stopped.
    pub(crate) stopping_since: Option<Instant>,
    /// Instances terminated after the stop timeout that are not gone yet, with the instant they
    /// were told to stop.
    pub(crate) unstopped: Vec<(u64, Instant)>,
    /// The manager has a candidacy that was never published yet.
    pub(crate) candidacy_pending: bool,
}

impl SingletonHealth {
    pub(crate) fn new<L: Lease>(lease: &Arc<L>, stop_timeout: Duration, eligible: bool) -> Self {
        let handle: Weak<dyn Observed> = Arc::downgrade(lease) as Weak<L>;
        Self {
            lease: Lease::name(&**lease).to_owned(),
            lease_handle: Some(handle),
            stop_timeout,
            state: Mutex::new(SingletonHealthState {
                eligible,
                ..Default::default()
            }),
        }
    }

    /// The state, for the manager to update.
    pub(crate) fn state(&self) -> MutexGuard<'_, SingletonHealthState> {
        lock(&self.state)
    }

    fn check(&self, tolerance: Duration) -> Result<(), Unhealthy> {
        let state = lock(&self.state);
        let oldest = state
            .unstopped
            .iter()
            .map(|(_, since)| *since)
            .chain(state.stopping_since)
            .min();
        let Some(since) = oldest else {
            return Ok(());
        };
        let stopping_for = Instant::now().saturating_duration_since(since);
        let terminated = !state.unstopped.is_empty();
        // Saturating: a stop timeout of any length (plain data) never makes a check panic.
        if terminated || stopping_for > self.stop_timeout.saturating_add(tolerance) {
            return Err(Unhealthy::SingletonNotStopped {
                lease: self.lease.clone(),
                stopping_for,
                stop_timeout: self.stop_timeout,
            });
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InMemoryStore, LeaseSettings};

    fn lease(store: &InMemoryStore, owner: &str) -> Arc<crate::InMemoryLease> {
        let settings = LeaseSettings::builder("health", owner)
            .ttl(Duration::from_secs(3))
            .build()
            .unwrap();
        Arc::new(store.lease(settings))
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_holder_and_a_contender_are_live_and_reported() {
        let store = InMemoryStore::new();
        let check = HealthCheck::new();
        let a = lease(&store, "a");
        let b = lease(&store, "b");
        check.add_lease(&a);
        check.add_lease(&b);
        check.add_lease(&a);
        assert!(a.acquire().await.unwrap());
        assert!(!b.acquire().await.unwrap());
        // Renewals keep it live across many TTLs.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(check.liveness(), Ok(()));
        assert_eq!(check.readiness(), Ok(()));
        let reports = check.leases();
        assert_eq!(reports.len(), 2, "{reports:?}");
        assert!(reports[0].held);
        assert_eq!(reports[0].owner, "a");
        assert_eq!(reports[0].holder.as_deref(), Some("a"));
        assert_eq!(
            reports[0].fencing_token,
            a.fencing_token().map(|t| t.value())
        );
        assert!(reports[0].deadline_in_ms.unwrap() > 0);
        assert!(!reports[1].held);
        assert_eq!(reports[1].holder.as_deref(), Some("a"), "seen by b");
        assert_eq!(reports[1].fencing_token, None);
        // A dropped lease leaves the check.
        drop(b);
        assert_eq!(check.leases().len(), 1);
        // So does a shared one, once every clone is gone.
        let shared =
            crate::SharedLease::new(store.lease(LeaseSettings::new("shared", "c").unwrap()));
        check.add_shared_lease(&shared);
        check.add_shared_lease(&shared.clone());
        assert_eq!(check.leases().len(), 2);
        assert!(shared.acquire().await.unwrap());
        assert!(check.leases().iter().any(|r| r.name == "shared" && r.held));
        drop(shared);
        assert_eq!(check.leases().len(), 1);
    }

    /// Issue 27 item 5: the longest tolerance and stop timeout saturate; no check panics.
    #[tokio::test(start_paused = true)]
    async fn the_longest_durations_never_make_a_check_panic() {
        let store = InMemoryStore::new();
        let check = HealthCheck::with_tolerance(Duration::MAX);
        let lease = lease(&store, "a");
        check.add_lease(&lease);
        assert!(lease.acquire().await.unwrap());
        let singleton = Arc::new(SingletonHealth::new(&lease, Duration::MAX, true));
        check.add_singleton(&singleton);
        singleton.state().stopping_since = Some(Instant::now());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(check.liveness(), Ok(()));
        assert_eq!(check.readiness(), Ok(()));
        assert_eq!(check.leases().len(), 1);
        assert!(format!("{check:?}").contains("liveness: Ok"));
        // A registration the manager dropped leaves the check.
        drop(singleton);
        assert!(check.live_singletons().is_empty());
    }

    /// Issue 39 item 1: a competing manager whose candidacy was never published is not ready,
    /// unless the check is told not to wait for it; an ineligible one is no candidate.
    #[tokio::test(start_paused = true)]
    async fn readiness_waits_for_a_candidacy_never_published() {
        let store = InMemoryStore::new();
        let check = HealthCheck::new();
        let lease = lease(&store, "a");
        let singleton = Arc::new(SingletonHealth::new(&lease, Duration::from_secs(10), true));
        check.add_singleton(&singleton);
        singleton.state().candidacy_pending = true;
        assert!(matches!(
            check.readiness(),
            Err(NotReady::CandidacyNotPublished { .. })
        ));
        let not_waiting = check.clone().readiness_waits_for_candidacy(false);
        assert_eq!(not_waiting.readiness(), Ok(()));
        singleton.state().eligible = false;
        assert!(matches!(
            check.readiness(),
            Err(NotReady::NotEligible { .. })
        ));
        let ignoring = check.clone().readiness_follows_eligibility(false);
        assert_eq!(
            ignoring.readiness(),
            Ok(()),
            "an ineligible node is no candidate"
        );
        singleton.state().eligible = true;
        singleton.state().candidacy_pending = false;
        assert_eq!(check.readiness(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_singleton_that_does_not_stop_is_unhealthy_after_its_stop_timeout() {
        let store = InMemoryStore::new();
        let check = HealthCheck::with_tolerance(Duration::from_secs(1));
        let lease = lease(&store, "a");
        let singleton = Arc::new(SingletonHealth::new(&lease, Duration::from_secs(10), true));
        check.add_singleton(&singleton);
        assert_eq!(check.liveness(), Ok(()));
        singleton.state().stopping_since = Some(Instant::now());
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(check.liveness(), Ok(()), "within stop timeout + tolerance");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(matches!(
            check.liveness(),
            Err(Unhealthy::SingletonNotStopped { .. })
        ));
        // Terminated but not gone: unhealthy at once, until it is gone.
        {
            let mut state = singleton.state();
            state.stopping_since = None;
            state.unstopped.push((1, Instant::now()));
        }
        assert!(check.liveness().is_err());
        singleton.state().unstopped.clear();
        assert_eq!(check.liveness(), Ok(()));
        // Readiness follows eligibility.
        singleton.state().eligible = false;
        assert!(matches!(
            check.readiness(),
            Err(NotReady::NotEligible { .. })
        ));
        let ignoring = check.clone().readiness_follows_eligibility(false);
        assert_eq!(ignoring.readiness(), Ok(()));
        assert!(check.readiness().is_err(), "the original is unchanged");
    }
}
