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
    /// Since when the node's revision has been running, in milliseconds since the Unix epoch:
    /// the earliest of its own start and the ages of the live candidates of the same revision it
    /// saw when it published its candidacy. So a replica of an old revision restarted in the
    /// middle of a rollout inherits its revision's age, and the old revision does not look newer
    /// once the replicas that started before the new revision have left. Filled in by the manager
    /// when it publishes; `None` (also in metadata written before this field existed): the
    /// node's own start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_since_ms: Option<u64>,
    /// Where other nodes reach this one (for example `http://10.1.2.3:8080`), to route
    /// leader-only work to the leader ([`LeaderInfo::address`](crate::LeaderInfo::address)): an
    /// absolute `http` or `https` URL with a host and an optional port, nothing else (see
    /// [`Candidate::address`]). Set through [`address`](Self::address) or
    /// [`from_env`](Self::from_env), it is checked at once; set directly, it is checked by
    /// [`validate`](Self::validate) and by
    /// [`ClusterSingletonManager::candidacy`](crate::ClusterSingletonManager::candidacy).
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
            revision_since_ms: None,
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
    ///
    /// # Errors
    ///
    /// [`CandidacyError::InvalidAddressVariable`] when `ACTIX_COORDINATION_ADDRESS` is set to
    /// something [`address`](Self::address) refuses. The value is never trimmed: one with a
    /// trailing newline (what a YAML block scalar `|` gives) is refused with a message saying so,
    /// rather than guessed at.
    pub fn from_env() -> Result<Self, CandidacyError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with the variables `var` gives.
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, CandidacyError> {
        let var = |name: &str| var(name).filter(|v| !v.is_empty());
        let mut candidate = Self::new();
        candidate.revision = var(REVISION_ENV).or_else(|| var(POD_TEMPLATE_HASH_ENV));
        if let Some(address) = var(ADDRESS_ENV) {
            if let Err(source) = Origin::parse(&address) {
                return Err(CandidacyError::InvalidAddressVariable {
                    variable: ADDRESS_ENV,
                    address,
                    source,
                });
            }
            candidate.address = Some(address);
        }
        Ok(candidate)
    }

    /// With this revision.
    pub fn revision(mut self, revision: impl Into<String>) -> Self {
        self.revision = Some(revision.into());
        self
    }

    /// With this advertised address: where the other nodes send leader-only requests while this
    /// node leads ([`LeaderOnly`](crate::LeaderOnly) redirects them to the address's scheme, host
    /// and port, with each request's own path and query).
    ///
    /// It must be an absolute `http` or `https` URL with a host (a DNS name, an IPv4 address or
    /// a bracketed IPv6 address) and an optional port, and nothing else: no path but an empty one
    /// or `/`, no query, no fragment, no user information, no whitespace, control or non-ASCII
    /// character anywhere (nothing is trimmed). For example `http://10.1.2.3:8080` or
    /// `https://node-1.example.com`.
    ///
    /// # Errors
    ///
    /// [`CandidacyError::InvalidAddress`] naming the address and what is wrong with it
    /// ([`AddressError`]).
    pub fn address(mut self, address: impl Into<String>) -> Result<Self, CandidacyError> {
        let address = address.into();
        if let Err(source) = Origin::parse(&address) {
            return Err(CandidacyError::InvalidAddress { address, source });
        }
        self.address = Some(address);
        Ok(self)
    }

    /// Checks the advertised address, if any (see [`address`](Self::address)): for a candidate
    /// whose `address` field was set directly.
    ///
    /// # Errors
    ///
    /// [`CandidacyError::InvalidAddress`] when the address is not one
    /// [`address`](Self::address) accepts.
    pub fn validate(&self) -> Result<(), CandidacyError> {
        match &self.address {
            Some(address) => match Origin::parse(address) {
                Ok(_) => Ok(()),
                Err(source) => Err(CandidacyError::InvalidAddress {
                    address: address.clone(),
                    source,
                }),
            },
            None => Ok(()),
        }
    }

    /// With this start time (milliseconds since the Unix epoch).
    pub fn started_ms(mut self, started_ms: u64) -> Self {
        self.started_ms = started_ms;
        self
    }

    /// Since when its revision has been running as far as the ranking goes: its
    /// [`revision_since_ms`](Self::revision_since_ms), never later than its own start.
    pub(crate) fn since_ms(&self) -> u64 {
        self.revision_since_ms
            .map_or(self.started_ms, |since| since.min(self.started_ms))
    }

    /// This candidate as it publishes itself when it sees `others` live: it inherits the age of
    /// its revision from the live candidates of the same revision (see
    /// [`revision_since_ms`](Self::revision_since_ms)).
    pub(crate) fn inheriting(&self, others: &[Candidate]) -> Candidate {
        let since = others
            .iter()
            .filter(|c| c.revision == self.revision)
            .map(Candidate::since_ms)
            .fold(self.since_ms(), u64::min);
        let mut me = self.clone();
        me.revision_since_ms = (since < self.started_ms).then_some(since);
        me
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

/// Why an advertised address was refused (see [`Candidate::address`]); positions are byte
/// offsets into the address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    /// The address is empty.
    #[error("the address is empty")]
    Empty,
    /// The address ends with a line break: what a YAML block scalar (`|`) gives. Nothing is
    /// trimmed; write the value as a plain scalar, or with `|-`.
    #[error(
        "the address ends with a newline (a YAML block scalar `|` adds one: use a plain scalar or `|-`)"
    )]
    TrailingNewline,
    /// The address has whitespace, a control character or a non-ASCII character.
    #[error(
        "the address has {character:?} at byte {at}: only visible ASCII characters are allowed"
    )]
    Character {
        /// Where.
        at: usize,
        /// The character.
        character: char,
    },
    /// The address does not start with a scheme and `://`: it is not an absolute URL.
    #[error("the address is not an absolute URL: it must start with `http://` or `https://`")]
    NotAbsolute,
    /// The scheme is neither `http` nor `https`.
    #[error("the scheme {scheme:?} is neither `http` nor `https`")]
    Scheme {
        /// The scheme.
        scheme: String,
    },
    /// The address has user information (`user:password@`).
    #[error("the address has user information (`…@`)")]
    UserInfo,
    /// The address has no host.
    #[error("the address has no host")]
    NoHost,
    /// The host is neither a DNS name, an IPv4 address nor a bracketed IPv6 address.
    #[error(
        "the host {host:?} is neither a DNS name, an IPv4 address nor a bracketed IPv6 address"
    )]
    Host {
        /// The host.
        host: String,
    },
    /// The port is not a number from 1 to 65535.
    #[error("the port {port:?} is not a number from 1 to 65535")]
    Port {
        /// The port, as written.
        port: String,
    },
    /// The address has a path other than `/` (redirects keep each request's own path).
    #[error("the address has the path {path:?}: only a host and a port, redirects keep the request's own path")]
    Path {
        /// The path.
        path: String,
    },
    /// The address has a query.
    #[error("the address has a query")]
    Query,
    /// The address has a fragment.
    #[error("the address has a fragment")]
    Fragment,
}

/// An advertised address that passed [`Origin::parse`]: the scheme, the host (in lower case) and
/// the port as written. `Display` writes `scheme://host[:port]`, without a trailing `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    scheme: &'static str,
    host: String,
    port: Option<u16>,
}

impl Origin {
    /// Parses an advertised address: an absolute `http` or `https` URL with a host and an
    /// optional port, nothing else (see [`Candidate::address`]).
    pub(crate) fn parse(address: &str) -> Result<Self, AddressError> {
        if address.is_empty() {
            return Err(AddressError::Empty);
        }
        if address.ends_with('\n') {
            return Err(AddressError::TrailingNewline);
        }
        if let Some((at, character)) = address.char_indices().find(|(_, c)| !c.is_ascii_graphic()) {
            return Err(AddressError::Character { at, character });
        }
        let (scheme, rest) = address.split_once("://").ok_or(AddressError::NotAbsolute)?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => "http",
            "https" => "https",
            _ if scheme.is_empty() || scheme.contains(['/', '?', '#']) => {
                return Err(AddressError::NotAbsolute)
            }
            _ => {
                return Err(AddressError::Scheme {
                    scheme: scheme.to_owned(),
                })
            }
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        if authority.contains('@') {
            return Err(AddressError::UserInfo);
        }
        let (host, port) = split_authority(authority)?;
        let (path, tail) = tail.split_at(tail.find(['?', '#']).unwrap_or(tail.len()));
        if !path.is_empty() && path != "/" {
            return Err(AddressError::Path {
                path: path.to_owned(),
            });
        }
        if tail.starts_with('?') {
            return Err(AddressError::Query);
        }
        if tail.starts_with('#') {
            return Err(AddressError::Fragment);
        }
        Ok(Self { scheme, host, port })
    }

    /// The port, the scheme's default when none is written.
    fn effective_port(&self) -> u16 {
        self.port
            .unwrap_or(if self.scheme == "https" { 443 } else { 80 })
    }

    /// Whether both name the same place: the same scheme, host and port (a default port written
    /// or not).
    pub(crate) fn same_place(&self, other: &Origin) -> bool {
        self.scheme == other.scheme
            && self.host == other.host
            && self.effective_port() == other.effective_port()
    }

    /// Whether `authority` (a request's `host[:port]`, reached with `scheme`) is this origin's
    /// host and port; `false` for anything that does not parse.
    #[cfg_attr(not(feature = "web"), allow(dead_code))]
    pub(crate) fn is_authority(&self, authority: &str, scheme: &str) -> bool {
        let Ok((host, port)) = split_authority(authority) else {
            return false;
        };
        let default = if scheme.eq_ignore_ascii_case("https") {
            443
        } else {
            80
        };
        host == self.host && port.unwrap_or(default) == self.effective_port()
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.host)?;
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// Whether two advertised addresses name the same place (both valid, see [`Origin::same_place`]).
pub(crate) fn same_address(a: &str, b: &str) -> bool {
    match (Origin::parse(a), Origin::parse(b)) {
        (Ok(a), Ok(b)) => a.same_place(&b),
        _ => false,
    }
}

/// Splits `host[:port]` (no user information), checking both; the host in lower case.
fn split_authority(authority: &str) -> Result<(String, Option<u16>), AddressError> {
    if authority.is_empty() {
        return Err(AddressError::NoHost);
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (literal, after) = bracketed
            .split_once(']')
            .ok_or_else(|| AddressError::Host {
                host: authority.to_owned(),
            })?;
        if literal.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(AddressError::Host {
                host: format!("[{literal}]"),
            });
        }
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(|| AddressError::Host {
                host: authority.to_owned(),
            })?),
        };
        (format!("[{}]", literal.to_ascii_lowercase()), port)
    } else {
        let (host, port) = match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        };
        if host.is_empty() {
            return Err(AddressError::NoHost);
        }
        let labels: Vec<&str> = host.split('.').collect();
        let dns_name = labels.iter().all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
        let numeric = labels
            .iter()
            .all(|label| !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()));
        let valid = host.len() <= 253
            && dns_name
            && (!numeric || host.parse::<std::net::Ipv4Addr>().is_ok());
        if !valid {
            return Err(AddressError::Host {
                host: host.to_owned(),
            });
        }
        (host.to_ascii_lowercase(), port)
    };
    let port = match port {
        None => None,
        Some(written) => {
            let valid = !written.is_empty()
                && written.len() <= 5
                && written.bytes().all(|b| b.is_ascii_digit());
            match written.parse::<u16>() {
                Ok(port) if valid && port != 0 => Some(port),
                _ => {
                    return Err(AddressError::Port {
                        port: written.to_owned(),
                    })
                }
            }
        }
    };
    Ok((host, port))
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
/// publishes its candidacy once its watches of `L` and of the candidates have listed them (at
/// most one TTL after its start): a candidate is ready when it would notice a release to it at
/// once, and it publishes the age of its revision it inherits from the live candidates of that
/// revision ([`Candidate::revision_since_ms`]).
///
/// # Readiness
///
/// A rolling update is ordered by readiness: a Deployment stops the next old replica as soon as
/// the new one is ready. A manager with a candidacy that reports to a
/// [`HealthCheck`](crate::HealthCheck) ([`health`](crate::ClusterSingletonManager::health)) is not
/// ready ([`NotReady::CandidacyNotPublished`](crate::NotReady::CandidacyNotPublished)) until its
/// candidacy was published once: published means held, and listed by the node's own watch of the
/// candidates, so the leader's watch sees it too, up to its delay. Serve it as the pod's readiness
/// probe (`/readyz` of [`AdminRoutes`](crate::AdminRoutes), feature `web`), and the old leader
/// is never stopped before it can see a new candidate to hand over to.
/// [`ClusterSingletonManager::candidacy_status`](crate::ClusterSingletonManager::candidacy_status)
/// tells the same as it changes ([`CandidacyStatus`]).
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
///    SIGTERM with `handle_signals`) the manager withdraws its candidacy and stops competing. A
///    node that does not lead withdraws first, then ends its acquire round. The leader stops the
///    singleton and releases while it withdraws (only the leader hands the lease over, so it
///    cannot be handed back to it, and its successor does not wait for the withdrawal's round
///    trip). It hands the lease to the target of a [`TransferLeadership`](crate::TransferLeadership)
///    the shutdown overtook, if that can still happen, else to the best remaining candidate that
///    ranks above it; when none does, it releases plainly (naming one of its equals could name a
///    node that died less than a TTL ago and still looks live), and rule 2 leaves the lease to
///    the best live candidate.
/// 4. **A node that cannot run the singleton steps aside.** A manager that gives up on a singleton
///    that keeps stopping ([`max_restarts`](crate::SingletonSettings::max_restarts) within the
///    restart window) withdraws its candidacy for
///    [`give_up_pause`](crate::SingletonSettings::give_up_pause) as it releases the lease, so that
///    the nodes that deferred to it run the singleton meanwhile; then it publishes it again.
/// 5. **A transfer the policy would undo is refused.** [`TransferLeadership`](crate::TransferLeadership)
///    to a node that is no live candidate, or that a live candidate (the leader included) ranks
///    above, answers [`LeaseError::InvalidTransferTarget`](crate::LeaseError::InvalidTransferTarget)
///    and changes nothing: the target would defer to that candidate, or hand the lease on to it.
///
/// So in a rolling update (maxSurge 1, maxUnavailable 0, readiness as above) with
/// [`HandoverPolicy::NewestRevision`], leadership changes once: when the first replica of the new
/// revision is a candidate, the old leader hands over to it; every later step stops old replicas
/// that do not lead, and new replicas never take over from each other. An old replica restarted
/// during the rollout inherits its revision's age while another old replica is live, so the old
/// revision does not look newer once the older ones have left. A replica of the old revision
/// started when none of it is live (a rollback) is a new revision.
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
    /// when they appeared: a revision is as new as the *earliest* age among the live candidates
    /// that run it, a candidate's age being its start, or the age of its revision it inherited
    /// when it published its candidacy ([`Candidate::revision_since_ms`]: a replica of an old
    /// revision restarted while another replica of that revision was live counts as old as that
    /// one). Candidates of one revision rank equal (no handover between them); nodes without a
    /// revision count as one revision.
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
                        .map(Candidate::since_ms)
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

    /// Whether a candidate among `me` and `others` ranks above `target` (which must be one of
    /// them: a revision's age is read from them): a transfer to `target` would not last (it
    /// defers to that one, or hands the lease on to it).
    pub(crate) fn outranked(
        &self,
        target: &Candidate,
        me: &Candidate,
        others: &[Candidate],
    ) -> bool {
        let all = self.all(me, others);
        all.iter()
            .any(|c| self.compare(c, target, &all) == Ordering::Greater)
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

/// Whether a manager's candidacy is published, as it changes, from
/// [`ClusterSingletonManager::candidacy_status`](crate::ClusterSingletonManager::candidacy_status):
/// published while the node holds its candidacy lease and its own watch of the candidates lists
/// that claim (so other nodes' watches see it too, up to their delay). It turns `false` while the
/// candidacy is withdrawn (ineligible, giving up on a singleton that keeps failing, shutting
/// down) or lost. Cheap to clone; every clone sees every change.
#[derive(Debug, Clone)]
pub struct CandidacyStatus {
    rx: tokio::sync::watch::Receiver<bool>,
}

impl CandidacyStatus {
    pub(crate) fn new(rx: tokio::sync::watch::Receiver<bool>) -> Self {
        Self { rx }
    }

    /// Whether the candidacy is published now.
    pub fn is_published(&self) -> bool {
        *self.rx.borrow()
    }

    /// Waits until the candidacy is published (at once if it is). `false` when the manager is
    /// gone without publishing it.
    pub async fn published(&mut self) -> bool {
        self.rx.wait_for(|published| *published).await.is_ok()
    }

    /// Waits for the next change and answers the new state; `None` once the manager is gone.
    pub async fn changed(&mut self) -> Option<bool> {
        self.rx.changed().await.ok()?;
        Some(*self.rx.borrow_and_update())
    }
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
    /// The candidate's advertised address is not an absolute `http` or `https` URL with a host
    /// and an optional port, and nothing else (see [`Candidate::address`]).
    #[error("invalid advertised address {address:?}")]
    InvalidAddress {
        /// The address, as given.
        address: String,
        /// What is wrong with it.
        #[source]
        source: AddressError,
    },
    /// The environment variable [`Candidate::from_env`] reads the address from holds an invalid
    /// address (see [`Candidate::address`]).
    #[error("invalid advertised address {address:?} in environment variable {variable}")]
    InvalidAddressVariable {
        /// The variable ([`ADDRESS_ENV`]).
        variable: &'static str,
        /// Its value, as read.
        address: String,
        /// What is wrong with it.
        #[source]
        source: AddressError,
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
        let c = candidate("n1", "v2", 42)
            .address("http://10.0.0.1:8080")
            .unwrap();
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
    fn a_restarted_old_replica_inherits_its_revisions_age() {
        let policy = HandoverPolicy::NewestRevision;
        let o1 = candidate("o1", "v1", 1);
        let n1 = candidate("n1", "v2", 10);
        // o2 restarted at 20 while o1 was live: it publishes v1's age, 1.
        let o2 = candidate("o2", "v1", 20).inheriting(&[o1.clone(), n1.clone()]);
        assert_eq!(o2.revision_since_ms, Some(1));
        assert_eq!(o2.since_ms(), 1);
        // o1 gone: v1 is still older than v2, so n1 stays the best and o2 defers.
        assert_eq!(policy.better_than(&n1, std::slice::from_ref(&o2)), None);
        assert_eq!(
            policy
                .better_than(&o2, std::slice::from_ref(&n1))
                .map(|c| c.owner),
            Some("n1".to_owned())
        );
        // A rollback (v1 started again while no v1 replica is live) is a new revision.
        let back = candidate("b1", "v1", 30).inheriting(std::slice::from_ref(&n1));
        assert_eq!(back.revision_since_ms, None);
        assert_eq!(
            policy
                .better_than(&n1, std::slice::from_ref(&back))
                .map(|c| c.owner),
            Some("b1".to_owned())
        );
        // Metadata without the field (written before it existed) reads as the node's own start.
        let old = Candidate::from_metadata("o3", r#"{"started-ms":5}"#).unwrap();
        assert_eq!((old.revision_since_ms, old.since_ms()), (None, 5));
        let round = Candidate::from_metadata("o2", &o2.to_metadata()).unwrap();
        assert_eq!(round, o2);
        assert!(policy.outranked(&o2, &n1, std::slice::from_ref(&o2)));
        assert!(!policy.outranked(&n1, &o2, std::slice::from_ref(&n1)));
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

    /// The address a candidate advertises is checked when it gets one: absolute `http` or
    /// `https`, a host, an optional port, nothing else; each refusal says why.
    #[test]
    fn an_advertised_address_is_an_origin_and_nothing_else() {
        for (address, origin) in [
            ("http://10.1.2.3:8080", "http://10.1.2.3:8080"),
            ("http://10.1.2.3:8080/", "http://10.1.2.3:8080"),
            ("https://Node-1.Example.com", "https://node-1.example.com"),
            ("HTTP://a_b:1", "http://a_b:1"),
            ("http://[FD00::1]:8080", "http://[fd00::1]:8080"),
            ("http://[::1]", "http://[::1]"),
        ] {
            let candidate = Candidate::new().address(address).unwrap();
            assert_eq!(candidate.address.as_deref(), Some(address), "kept as given");
            assert_eq!(Origin::parse(address).unwrap().to_string(), origin);
            candidate.validate().unwrap();
        }
        use AddressError as E;
        let host = |h: &str| E::Host { host: h.into() };
        let port = |p: &str| E::Port { port: p.into() };
        for (address, why) in [
            ("", E::Empty),
            ("http://a:8080\n", E::TrailingNewline),
            ("http://a:8080\r\n", E::TrailingNewline),
            (
                " http://a:8080",
                E::Character {
                    at: 0,
                    character: ' ',
                },
            ),
            (
                "http://a:8080 ",
                E::Character {
                    at: 13,
                    character: ' ',
                },
            ),
            (
                "http://a\t:8080",
                E::Character {
                    at: 8,
                    character: '\t',
                },
            ),
            (
                "http://a:8080\r\nx: 1",
                E::Character {
                    at: 13,
                    character: '\r',
                },
            ),
            (
                "http://é:8080",
                E::Character {
                    at: 7,
                    character: 'é',
                },
            ),
            ("a:8080", E::NotAbsolute),
            ("//a:8080", E::NotAbsolute),
            ("/", E::NotAbsolute),
            ("://a", E::NotAbsolute),
            (
                "ftp://a",
                E::Scheme {
                    scheme: "ftp".into(),
                },
            ),
            ("http://user:secret@a:8080", E::UserInfo),
            ("http://", E::NoHost),
            ("http:///x", E::NoHost),
            ("http://:8080", E::NoHost),
            ("http://a..b", host("a..b")),
            ("http://-a", host("-a")),
            ("http://a:1:2", port("1:2")),
            ("http://999.1.1.1", host("999.1.1.1")),
            ("http://[fd00::g]", host("[fd00::g]")),
            ("http://[fd00::1", host("[fd00::1")),
            ("http://[fd00::1]x", host("[fd00::1]x")),
            ("http://a:", port("")),
            ("http://a:0", port("0")),
            ("http://a:65536", port("65536")),
            ("http://a:+80", port("+80")),
            (
                "http://a:8080/api",
                E::Path {
                    path: "/api".into(),
                },
            ),
            ("http://a:8080//", E::Path { path: "//".into() }),
            ("http://a:8080?x=1", E::Query),
            ("http://a:8080/?", E::Query),
            ("http://a:8080#top", E::Fragment),
        ] {
            assert_eq!(Origin::parse(address), Err(why.clone()), "{address:?}");
            match Candidate::new().address(address) {
                Err(CandidacyError::InvalidAddress {
                    address: refused,
                    source,
                }) => {
                    assert_eq!((refused.as_str(), &source), (address, &why));
                }
                other => panic!("{address:?}: {other:?}"),
            }
            let mut candidate = Candidate::new();
            candidate.address = Some(address.to_owned());
            assert!(matches!(
                candidate.validate(),
                Err(CandidacyError::InvalidAddress { .. })
            ));
        }
        // The message says what to do about a trailing newline.
        let error = Candidate::new().address("http://a:8080\n").unwrap_err();
        let source = std::error::Error::source(&error).unwrap().to_string();
        assert!(
            source.contains("newline") && source.contains("|-"),
            "{source}"
        );
        assert_eq!(
            error.to_string(),
            "invalid advertised address \"http://a:8080\\n\""
        );
    }

    /// `from_env` refuses an invalid `ACTIX_COORDINATION_ADDRESS` (naming the variable), trims
    /// nothing, and leaves an unset or empty one `None`.
    #[test]
    fn from_env_refuses_an_invalid_address_and_names_the_variable() {
        let vars = |address: Option<&'static str>| {
            move |name: &str| match name {
                ADDRESS_ENV => address.map(str::to_owned),
                POD_TEMPLATE_HASH_ENV => Some("abc123".to_owned()),
                _ => None,
            }
        };
        let ok = Candidate::from_vars(vars(Some("http://10.0.0.1:8080"))).unwrap();
        assert_eq!(ok.address.as_deref(), Some("http://10.0.0.1:8080"));
        assert_eq!(ok.revision.as_deref(), Some("abc123"));
        for unset in [None, Some("")] {
            assert_eq!(Candidate::from_vars(vars(unset)).unwrap().address, None);
        }
        match Candidate::from_vars(vars(Some("http://10.0.0.1:8080\n"))) {
            Err(
                error @ CandidacyError::InvalidAddressVariable {
                    variable: ADDRESS_ENV,
                    source: AddressError::TrailingNewline,
                    ..
                },
            ) => assert!(error.to_string().contains(ADDRESS_ENV), "{error}"),
            other => panic!("{other:?}"),
        }
    }

    struct Idle;

    impl actix::Actor for Idle {
        type Context = actix::Context<Self>;
    }

    /// A candidacy whose candidate's address was set directly is checked when it is built.
    #[actix_rt::test]
    async fn a_candidacy_with_an_invalid_address_is_refused() {
        use crate::{ClusterSingletonManager, InMemoryStore, LeaseSettings};
        let store = InMemoryStore::new();
        let build = |address: &str| {
            let mut candidate = Candidate::new();
            candidate.address = Some(address.to_owned());
            let lease = store.lease(LeaseSettings::new("jobs", "a").unwrap());
            let store = store.clone();
            ClusterSingletonManager::new(lease, |_, _| Idle).candidacy(candidate, move |s| {
                Ok::<_, std::convert::Infallible>(store.lease(s))
            })
        };
        for address in [
            "http://a:8080\n",
            "",
            "http://a:8080/api",
            "http://a:8080?x=1",
        ] {
            match build(address) {
                Err(CandidacyError::InvalidAddress { address: got, .. }) => {
                    assert_eq!(got, address)
                }
                Err(other) => panic!("{address:?}: {other}"),
                Ok(_) => panic!("{address:?} accepted"),
            }
        }
        assert!(build("http://a:8080").is_ok());
    }

    #[test]
    fn the_same_place_whatever_the_spelling() {
        assert!(same_address("http://a:80", "HTTP://A/"));
        assert!(same_address("https://a", "https://a:443"));
        assert!(!same_address("http://a:443", "https://a:443"));
        assert!(!same_address("http://a:8080", "http://b:8080"));
        assert!(!same_address("", ""));
        let origin = Origin::parse("http://a:8080").unwrap();
        assert!(origin.is_authority("A:8080", "http"));
        assert!(!origin.is_authority("a", "http"));
        assert!(Origin::parse("http://a").unwrap().is_authority("a", "http"));
        assert!(!origin.is_authority("a:8080@", "http"));
    }
}
