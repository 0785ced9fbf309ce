//! Candidates for a singleton's lease and the handover policy: who should lead during a rolling
//! update (the model: [`HandoverPolicy`]).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::group::GroupSnapshot;
use crate::vocab::BoxError;

/// The environment variable [`Candidate::from_env`] reads the revision from first.
pub const REVISION_ENV: &str = "ACTIX_COORDINATION_REVISION";
/// The environment variable [`Candidate::from_env`] reads the revision from when
/// [`REVISION_ENV`] is unset: the pod template hash, exposed with the downward API.
pub const POD_TEMPLATE_HASH_ENV: &str = "POD_TEMPLATE_HASH";
/// The environment variable [`Candidate::from_env`] reads the advertised address from.
pub const ADDRESS_ENV: &str = "ACTIX_COORDINATION_ADDRESS";

/// What a node says about itself as a candidate for a singleton's lease (see
/// [`HandoverPolicy`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub struct Candidate {
    /// The node's owner identity (filled in from the lease; not part of the metadata).
    #[serde(skip)]
    pub owner: String,
    /// The revision the node runs (an app version, a pod template hash); `None` when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// When the node started, in milliseconds since the Unix epoch, from its wall clock (only
    /// ever used to order revisions, never to judge a lease).
    pub started_ms: u64,
    /// Where other nodes reach this one (for example `http://10.1.2.3:8080`), to route
    /// leader-only work to the leader ([`LeaderInfo::address`](crate::LeaderInfo::address)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

impl Candidate {
    /// A candidate that started now, with no revision and no address.
    pub fn new() -> Self {
        let started_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Self {
            owner: String::new(),
            revision: None,
            started_ms,
            address: None,
        }
    }

    /// A candidate that started now, with its revision from `ACTIX_COORDINATION_REVISION`, else
    /// `POD_TEMPLATE_HASH`, and its address from `ACTIX_COORDINATION_ADDRESS` (each unset or
    /// empty variable leaves its field `None`). On Kubernetes, expose the pod template hash with
    /// the downward API:
    ///
    /// ```yaml
    /// env:
    ///   - name: POD_TEMPLATE_HASH
    ///     valueFrom:
    ///       fieldRef:
    ///         fieldPath: metadata.labels['pod-template-hash']
    /// ```
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut candidate = Self::new();
        candidate.revision = var(REVISION_ENV).or_else(|| var(POD_TEMPLATE_HASH_ENV));
        candidate.address = var(ADDRESS_ENV);
        candidate
    }

    /// With this revision.
    pub fn revision(mut self, revision: impl Into<String>) -> Self {
        self.revision = Some(revision.into());
        self
    }

    /// With this advertised address.
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }

    /// With this start time (milliseconds since the Unix epoch).
    pub fn started_ms(mut self, started_ms: u64) -> Self {
        self.started_ms = started_ms;
        self
    }

    /// The metadata its candidacy lease carries (JSON).
    pub(crate) fn to_metadata(&self) -> String {
        serde_json::to_string(self).expect("a candidate serializes")
    }

    /// The candidate a candidacy record's holder and metadata describe; `None` for a record this
    /// crate did not write.
    pub(crate) fn from_metadata(owner: &str, metadata: &str) -> Option<Self> {
        let mut candidate: Candidate = serde_json::from_str(metadata).ok()?;
        candidate.owner = owner.to_owned();
        Some(candidate)
    }
}

impl Default for Candidate {
    fn default() -> Self {
        Self::new()
    }
}

/// A user's ranking of two candidates: `Greater` when the first should lead rather than the
/// second.
pub type RankCandidates = dyn Fn(&Candidate, &Candidate) -> Ordering + Send + Sync;

/// How a [`ClusterSingletonManager`](crate::ClusterSingletonManager) with a candidacy ranks the
/// live candidates, and what the managers do with the ranking.
///
/// # Candidacy
///
/// A [`ClusterSingletonManager`](crate::ClusterSingletonManager) given a
/// [`candidacy`](crate::ClusterSingletonManager::candidacy) publishes that its node is a candidate
/// for the singleton's lease `L`, through the store every node shares, the same way a sharded
/// node publishes its membership: it holds a lease of its own, `L-candidate-<owner>`, whose claim
/// carries the node's [`Candidate`] as [metadata](crate::LeaseSettings::metadata) (its revision,
/// when it started, its advertised address). Every manager of `L` reads the candidates from one
/// group watch of the prefix `L-candidate-` (no request per candidate per interval). A candidate
/// is live while its candidacy lease is held and its claim has not expired as the reader observed
/// it; a node that crashes drops out at its candidacy's expiry; a node that shuts down, or is made
/// ineligible, *withdraws* first (it releases its candidacy lease before anything else; at
/// shutdown for good, [`Lease::retire`](crate::Lease::retire): on Kubernetes its object is
/// deleted, so that identities that change on every rollout leave no objects behind). A node
/// publishes its candidacy once its watch of `L` has listed it (at most one TTL after its
/// start): a candidate is ready when it would notice a release to it at once.
///
/// # The handover policy
///
/// The policy ranks the live candidates. With any policy but [`HandoverPolicy::Off`]:
///
/// 1. **The leader hands over once to a better candidate.** When a live candidate ranks above the
///    leader, the leader stops the singleton and releases the lease *to* the best candidate
///    ([`Lease::release_to`](crate::Lease::release_to)): that one takes it within milliseconds,
///    every other node leaves it to it for one TTL.
/// 2. **A worse candidate never takes over while a better one is live.** A node that ranks below a
///    live candidate does not compete (an acquire round in flight is ended, and anything it got
///    released); it competes again as soon as no live candidate ranks above it (the better one
///    withdrew, or its candidacy expired after a crash).
/// 3. **A node on its way out never receives leadership.** On [`Shutdown`](crate::Shutdown) (and
///    SIGTERM with `handle_signals`) the manager withdraws its candidacy first and stops
///    competing. If it leads, it hands the lease to the best remaining candidate that ranks above
///    it; when none does, it releases plainly (naming one of its equals could name a node that
///    died less than a TTL ago and still looks live), and rule 2 leaves the lease to the best
///    live candidate.
///
/// So in a rolling update (maxSurge 1, maxUnavailable 0) with
/// [`HandoverPolicy::NewestRevision`], leadership changes once: when the first replica of the new
/// revision is up, the old leader hands over to it; every later step stops old replicas that do not
/// lead, and new replicas never take over from each other.
///
/// # Races
///
/// The candidates a node sees are what its watch delivered, up to the watch's delay; two nodes can
/// briefly rank differently. The policy decides who *should* lead; the lease alone decides who
/// *may*: a wrong ranking costs one extra handover or one TTL without a leader (a transfer to a
/// candidate that is already gone lapses after one TTL), never two singletons.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum HandoverPolicy {
    /// No ranking: no handover on purpose, no deferring; a shutdown releases plainly (the
    /// candidacy still tells [`GetLeader`](crate::GetLeader) the leader's address).
    Off,
    /// The rolling-update default: a candidate of a newer revision ranks above one of an older
    /// revision. Revisions are strings (a pod template hash has no order), so they are ordered by
    /// when they appeared: a revision is as new as the *earliest* start time among the live
    /// candidates that run it. Candidates of one revision rank equal (no handover between them);
    /// nodes without a revision count as one revision.
    #[default]
    NewestRevision,
    /// A user's ranking (see [`HandoverPolicy::ranked`]).
    Ranked(Arc<RankCandidates>),
}

impl fmt::Debug for HandoverPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandoverPolicy::Off => f.write_str("Off"),
            HandoverPolicy::NewestRevision => f.write_str("NewestRevision"),
            HandoverPolicy::Ranked(_) => f.write_str("Ranked(..)"),
        }
    }
}

impl HandoverPolicy {
    /// A policy from a ranking function (`Greater`: the first candidate should lead rather than
    /// the second).
    ///
    /// The function must be a total order that gives every node the same answer for the same two
    /// candidates (compute it from the candidates alone, not from the node it runs on): with an
    /// order that is not, two nodes can each find the other better, and leadership moves back and
    /// forth between them (safely, one holder at a time, but for nothing).
    pub fn ranked(
        rank: impl Fn(&Candidate, &Candidate) -> Ordering + Send + Sync + 'static,
    ) -> Self {
        HandoverPolicy::Ranked(Arc::new(rank))
    }

    /// Compares `a` with `b` among `all` (the live candidates and this node).
    fn compare(&self, a: &Candidate, b: &Candidate, all: &[Candidate]) -> Ordering {
        match self {
            HandoverPolicy::Off => Ordering::Equal,
            HandoverPolicy::Ranked(rank) => rank(a, b),
            HandoverPolicy::NewestRevision => {
                let appeared = |revision: &Option<String>| {
                    all.iter()
                        .filter(|c| &c.revision == revision)
                        .map(|c| c.started_ms)
                        .min()
                        .unwrap_or(u64::MAX)
                };
                appeared(&a.revision).cmp(&appeared(&b.revision))
            }
        }
    }

    /// The best of `others` that ranks above `me`, if any (ties between the best: the earliest
    /// started, then the smallest owner identity, so that every node picks the same one).
    pub(crate) fn better_than(&self, me: &Candidate, others: &[Candidate]) -> Option<Candidate> {
        self.best(me, others)
            .filter(|best| self.compare(best, me, &self.all(me, others)) == Ordering::Greater)
    }

    /// The best of `others` (see [`better_than`](Self::better_than) for ties), whatever `me`.
    pub(crate) fn best(&self, me: &Candidate, others: &[Candidate]) -> Option<Candidate> {
        let all = self.all(me, others);
        others
            .iter()
            .max_by(|a, b| {
                self.compare(a, b, &all)
                    .then_with(|| b.started_ms.cmp(&a.started_ms))
                    .then_with(|| b.owner.cmp(&a.owner))
            })
            .cloned()
    }

    fn all(&self, me: &Candidate, others: &[Candidate]) -> Vec<Candidate> {
        let mut all = others.to_vec();
        all.push(me.clone());
        all
    }
}

/// The live candidates of a snapshot of the candidacy group `prefix` at `now`, other than
/// `me` (by owner identity), by owner.
pub(crate) fn live_candidates(
    snapshot: &GroupSnapshot,
    prefix: &str,
    me: &str,
    now: tokio::time::Instant,
) -> BTreeMap<String, Candidate> {
    snapshot
        .with_prefix(prefix)
        .filter_map(|(_, record)| {
            let holder = record.live_holder(now)?;
            let candidate = Candidate::from_metadata(holder, record.metadata.as_deref()?)?;
            Some((holder.to_owned(), candidate))
        })
        .filter(|(owner, _)| owner != me)
        .collect()
}

/// Errors of [`ClusterSingletonManager::candidacy`](crate::ClusterSingletonManager::candidacy).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CandidacyError {
    /// The candidacy lease's settings could not be made (its name is too long, or the candidate's
    /// metadata is).
    #[error("cannot make the settings of candidacy lease {name:?}")]
    Settings {
        /// The candidacy lease's name.
        name: String,
        /// Why.
        #[source]
        source: crate::settings::SettingsError,
    },
    /// The function given could not build the candidacy lease.
    #[error("cannot build candidacy lease {name:?}")]
    Build {
        /// The candidacy lease's name.
        name: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The lease built has another name or owner than the settings asked for.
    #[error(
        "the candidacy lease built is {got_name:?} of {got_owner:?}, not {name:?} of {owner:?}"
    )]
    WrongLease {
        /// The name asked for.
        name: String,
        /// The owner asked for.
        owner: String,
        /// The name of the lease built.
        got_name: String,
        /// The owner of the lease built.
        got_owner: String,
    },
    /// The backend cannot watch the candidates (candidacy needs a group watch).
    #[error("cannot watch the candidates of lease {lease:?}")]
    Watch {
        /// The singleton's lease name.
        lease: String,
        /// Why.
        #[source]
        source: crate::group::GroupError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(owner: &str, revision: &str, started_ms: u64) -> Candidate {
        let mut c = Candidate::new().revision(revision).started_ms(started_ms);
        c.owner = owner.to_owned();
        c
    }

    #[test]
    fn metadata_round_trips_without_the_owner() {
        let c = candidate("n1", "v2", 42).address("http://10.0.0.1:8080");
        let metadata = c.to_metadata();
        assert!(!metadata.contains("n1"), "{metadata}");
        assert_eq!(Candidate::from_metadata("n1", &metadata), Some(c));
        assert_eq!(Candidate::from_metadata("n1", "not json"), None);
    }

    #[test]
    fn the_newest_revision_is_the_one_that_appeared_last() {
        let policy = HandoverPolicy::NewestRevision;
        // Old replicas started at 1, 2, 3 (v1); the first new one at 10 (v2).
        let old_leader = candidate("o1", "v1", 1);
        let others = [
            candidate("o2", "v1", 2),
            candidate("o3", "v1", 3),
            candidate("n1", "v2", 10),
        ];
        assert_eq!(
            policy.better_than(&old_leader, &others).map(|c| c.owner),
            Some("n1".to_owned())
        );
        // An old replica restarted after the new one does not make v1 newer: v1 appeared at 1.
        let restarted = candidate("o3", "v1", 20);
        assert_eq!(
            policy
                .better_than(&restarted, &[old_leader.clone(), others[2].clone()])
                .map(|c| c.owner),
            Some("n1".to_owned())
        );
        // Same revision: nobody is better; the best of several new ones is the earliest started.
        let new_leader = candidate("n1", "v2", 10);
        let news = [candidate("n2", "v2", 12), candidate("n3", "v2", 11)];
        assert_eq!(policy.better_than(&new_leader, &news), None);
        assert_eq!(
            policy.best(&old_leader, &news).map(|c| c.owner),
            Some("n3".to_owned())
        );
        assert_eq!(HandoverPolicy::Off.better_than(&old_leader, &others), None);
    }

    #[test]
    fn a_ranking_function_decides() {
        let policy = HandoverPolicy::ranked(|a, b| a.owner.cmp(&b.owner));
        let me = candidate("b", "v1", 1);
        let others = [candidate("a", "v1", 1), candidate("c", "v1", 1)];
        assert_eq!(
            policy.better_than(&me, &others).map(|c| c.owner),
            Some("c".to_owned())
        );
        assert_eq!(policy.better_than(&candidate("d", "v", 0), &others), None);
    }
}
