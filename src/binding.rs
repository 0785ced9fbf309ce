//! Bound tenures: leases whose tenures live and die with another lease's tenure.
//!
//! A sharded node holds one *member* lease and many *shard* leases. Renewing every shard lease
//! on its own costs one write per shard per renewal interval; on etcd the shard keys already live
//! on the session's one etcd lease, and a *binding* gives the other stores the same shape: a bound
//! shard lease is written when its ownership changes (a claim, a release, a handover) and never
//! renewed. Its record names the member lease and which *incarnation* of it (the member tenure)
//! it is bound to, and it is valid exactly as long as that member tenure is:
//!
//! * the holder's deadline for a bound tenure is its member tenure's deadline, moved by every
//!   member renewal in the same step (one renewal renews them all); `check_alive`, guards,
//!   `on_lost` and the actors behave exactly as for a renewed lease;
//! * when the member tenure ends — its deadline passes, it is lost, released, dropped, or a new
//!   tenure replaces it — every tenure bound to it ends in the same step, before anything is sent
//!   to the store (a member release is sent only after its bound tenures ended): `on_lost` fires
//!   with [`LostReason::Unbound`](crate::LostReason::Unbound) for each;
//! * a contender counts a bound record free only once it has itself observed the member record
//!   expired (the TTL passed on its own clock since it saw that version), released, removed or
//!   holding another incarnation, or the bound record released or handed over. Since the holder's
//!   member deadline passes before any contender can see the member record expired, the bound
//!   deadline (the same instant) does too: the safety of every bound lease reduces to the safety of
//!   the one member lease.
//!
//! # Handing bound shards on as the member leaves
//!
//! A node that leaves frees every shard bound to it in the one write that ends its member tenure,
//! but each shard then waits for its claimants to notice and compete (every node targets its own
//! shards, all at once: 256 claims when one of 16 nodes with 4,096 shards leaves).
//! [`Lease::retire_handing`](crate::Lease::retire_handing) names a target for each in that one
//! write instead: the write that ends the member tenure lists each bound shard with its target
//! (an owner and that owner's member tenure), and from then on
//!
//! * a record bound to the ended member tenure and listed is its target's to claim while the
//!   target's member tenure lives (the observed-time rule on the target's member record), and
//!   free for anyone once it does not;
//! * the target claims it at once, with a compare-and-swap on the record that names it, the
//!   record's fencing token plus one and its own member tenure, and acts once that write is
//!   answered: **no tenure starts without a write on its own record** (why, below);
//! * a backend must make the listing exclusive with any claim by the member's expiry: on
//!   Kubernetes a contender that finds the member expired first releases the member's object with
//!   a compare-and-swap, so that a handover sent before the member's deadline but landing late is
//!   refused (of the two writes on the member's object, only the first lands);
//! * that release may list the expired tenure's shards itself, where the contender's process
//!   planned them to go ([`Lease::plan_hand_on`](crate::Lease::plan_hand_on)): the expiry is
//!   confirmed first, so the list lands only once the dead holder's own deadline has passed, and
//!   a node that dies costs one write to name the targets, as a node that leaves does.
//!
//! Backends that do not list (etcd, in memory) retire the member plainly.
//!
//! # Why no stale write can free a record someone holds
//!
//! The rules are [`protocol`](crate::protocol)'s, one function each, and the model check
//! (`tests/protocol_model.rs`) explores every interleaving of three nodes and two shards under
//! them. The argument:
//!
//! * a holder holds from the moment its claim lands, at a version of the record that names it;
//!   every other tenure must begin with a compare-and-swap on that version or a later one;
//! * its claimant judged that version free: the holder's member incarnation is over (no
//!   contender can see it expire before the holder's own deadline), or the holder gave the record
//!   up itself (a release, or a list, each written after its local tenure ended);
//! * any write that arrives late — a claim answered after its member's deadline, a release sent
//!   just before it, a list landing after the member expired — is a compare-and-swap on the
//!   version it read: refused once anyone claimed since, and before that it frees a record that
//!   nobody holds;
//! * a holder writes a record it held only while the member tenure that record names lives by its
//!   own clock ([`protocol::may_write_own`](crate::protocol::may_write_own)): a claim answered
//!   after that, an abandoned claim and an unanswered one are left to the next claimant.
//!
//! So every tenure starts at a version of its own, with the token of the version before plus
//! one: tokens strictly rise, and two live holders would need two claims to land on one version.
//! An earlier design let a target take a listed record up *without* a write (the record kept the
//! old holder's version until the target rebound it): a late release of the old holder on that
//! version still landed, and the next claimant wrote the target's token again (two holders with
//! one token against a real API server; issue 47).
//!
//! # Races
//!
//! * A bound acquire needs a live member tenure: without one it fails with
//!   [`LeaseError::Unbound`](crate::LeaseError::Unbound) (transient: acquire the member lease
//!   first), and while that tenure ends sooner than the claim could be answered, it fails with
//!   [`LeaseError::MemberEnding`](crate::LeaseError::MemberEnding), nothing sent (a member whose
//!   renewals are late sends no claims that could only come back too late). A claim is judged by
//!   the member tenure as it is when the claim is answered: renewed
//!   meanwhile, the tenure starts with the member's deadline now; ended meanwhile, the claim
//!   (bound to an incarnation that no longer lives) is free for others already and is not
//!   written again.
//! * A bound tenure starts with the member's deadline and is attached to the member in one step
//!   that checks the member is still the same tenure: the member cannot end between the two
//!   without ending the bound tenure.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

pub use crate::vocab::Binding;
use crate::vocab::LostReason;

/// A bound shard a leaving member hands on as its tenure ends
/// ([`Lease::retire_handing`](crate::Lease::retire_handing)): the shard lease, and the node that
/// claims it next with the member tenure it will be bound to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HandedShard {
    lease: String,
    owner: String,
    binding: Binding,
}

impl HandedShard {
    /// Shard lease `lease` handed to `owner`, whose member tenure is `binding`.
    pub fn new(lease: impl Into<String>, owner: impl Into<String>, binding: Binding) -> Self {
        Self {
            lease: lease.into(),
            owner: owner.into(),
            binding,
        }
    }

    /// The name of the shard lease.
    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// The owner that takes the shard up.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The member tenure of [`owner`](Self::owner) the shard is bound to from then on.
    pub fn binding(&self) -> &Binding {
        &self.binding
    }
}

/// The shards the ended tenures of one member lease handed on, as its record names them: per
/// ended incarnation, each shard lease with its target (an owner and that owner's member
/// tenure). A record bound to such an incarnation, listed here, is its target's to claim while
/// the target's member tenure lives, and free once it does not (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct HandedShards {
    /// Per ended incarnation: shard lease name → index into `targets`.
    by_incarnation: std::collections::BTreeMap<String, std::collections::BTreeMap<String, usize>>,
    targets: Vec<(String, Binding)>,
}

/// Two lists are equal when they list the same entries (whatever order the targets came in).
impl PartialEq for HandedShards {
    fn eq(&self, other: &Self) -> bool {
        self.entries().eq(other.entries())
    }
}

impl Eq for HandedShards {}

impl HandedShards {
    /// The target of shard lease `lease` handed on by member incarnation `incarnation`.
    pub(crate) fn target(&self, incarnation: &str, lease: &str) -> Option<(&str, &Binding)> {
        let index = *self.by_incarnation.get(incarnation)?.get(lease)?;
        let (owner, binding) = &self.targets[index];
        Some((owner, binding))
    }

    /// Adds what member incarnation `incarnation` hands on.
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub(crate) fn add(&mut self, incarnation: &str, shards: &[HandedShard]) {
        for shard in shards {
            self.add_one(incarnation, &shard.lease, &shard.owner, &shard.binding);
        }
    }

    /// Adds one entry.
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub(crate) fn add_one(
        &mut self,
        incarnation: &str,
        lease: &str,
        owner: &str,
        binding: &Binding,
    ) {
        let index = match self
            .targets
            .iter()
            .position(|(o, b)| o == owner && b == binding)
        {
            Some(index) => index,
            None => {
                self.targets.push((owner.to_owned(), binding.clone()));
                self.targets.len() - 1
            }
        };
        self.by_incarnation
            .entry(incarnation.to_owned())
            .or_default()
            .insert(lease.to_owned(), index);
    }

    /// Keeps the entries `keep` says yes to (`(incarnation, lease)`); targets no entry names any
    /// more are dropped.
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str, &str) -> bool) {
        let mut rebuilt = Self::default();
        for (incarnation, leases) in &self.by_incarnation {
            for (lease, &index) in leases {
                if keep(incarnation, lease) {
                    let (owner, binding) = &self.targets[index];
                    rebuilt.add_one(incarnation, lease, owner, binding);
                }
            }
        }
        *self = rebuilt;
    }

    /// Whether no entry is left.
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_incarnation.values().all(|leases| leases.is_empty())
    }

    /// Every entry: `(incarnation, lease, owner, target binding)`.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&str, &str, &str, &Binding)> + '_ {
        self.by_incarnation
            .iter()
            .flat_map(move |(incarnation, leases)| {
                leases.iter().map(move |(lease, &index)| {
                    let (owner, binding) = &self.targets[index];
                    (
                        incarnation.as_str(),
                        lease.as_str(),
                        owner.as_str(),
                        binding,
                    )
                })
            })
    }
}

/// What a lease hands to the leases it anchors: get it from
/// [`Lease::binding_anchor`](crate::Lease::binding_anchor) of the member lease and pass it to
/// [`Lease::bind_to`](crate::Lease::bind_to) of each lease to bind (see the module docs of
/// [`Binding`]). Clones share the anchor.
#[derive(Clone)]
pub struct BindingAnchor {
    pub(crate) inner: Arc<Anchor>,
}

impl fmt::Debug for BindingAnchor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.lock();
        f.debug_struct("BindingAnchor")
            .field("member", &self.inner.name)
            .field(
                "incarnation",
                &state.current.as_ref().map(|c| &c.incarnation),
            )
            .field("bound", &state.children.len())
            .finish()
    }
}

impl BindingAnchor {
    /// The name of the anchoring (member) lease.
    pub fn member(&self) -> &str {
        &self.inner.name
    }

    /// The store the anchoring lease writes to, as its backend names it
    /// ([`LeaseBackend::store_id`](crate::LeaseBackend::store_id)).
    pub fn store_id(&self) -> Option<&str> {
        self.inner.store.as_deref()
    }

    /// The member incarnation that lives now by this process's clock: what a claim made now
    /// would name, and the only one whose bound records this owner may still write (see
    /// [`protocol::may_write_own`](crate::protocol::may_write_own)). `None` while no member
    /// tenure lives (or its incarnation is not known yet).
    pub fn live(&self) -> Option<Binding> {
        self.current().map(|(binding, ..)| binding)
    }

    /// The binding a claim made now would name, with the member tenure's generation and
    /// deadline: `None` while no member tenure is alive (or its incarnation is not known yet).
    pub(crate) fn current(&self) -> Option<(Binding, u64, Instant)> {
        let state = self.inner.lock();
        let current = state.current.as_ref()?;
        let incarnation = current.incarnation.clone()?;
        (Instant::now() < current.deadline).then(|| {
            (
                Binding::new(self.inner.name.clone(), incarnation),
                current.generation,
                current.deadline,
            )
        })
    }

    /// What a bound claim sent now names ([`current`](Self::current)), if one may be sent: a
    /// member tenure lives ([`LeaseError::Unbound`] otherwise) and the claim can be answered
    /// before its deadline ([`protocol::may_send_bound_claim`](crate::protocol::may_send_bound_claim);
    /// [`LeaseError::MemberEnding`] otherwise). The bound on the answer is the claim's
    /// `operation_timeout`, or the member's if that is shorter: a healthy member tenure always has
    /// twice its own operation timeout left (the settings' rule), so a lease with a longer timeout
    /// than its member's is not refused forever (its late answer is judged by
    /// [`protocol::keep_bound_claim`](crate::protocol::keep_bound_claim)).
    pub(crate) fn claim_under(
        &self,
        operation_timeout: std::time::Duration,
    ) -> Result<(Binding, u64, Instant), crate::LeaseError> {
        let live = self.current().ok_or_else(|| crate::LeaseError::Unbound {
            member: self.member().to_owned(),
        })?;
        let timeout = operation_timeout.min(self.inner.operation_timeout);
        let now = Instant::now();
        if !crate::protocol::may_send_bound_claim(now, live.2, timeout) {
            return Err(crate::LeaseError::MemberEnding {
                member: self.member().to_owned(),
                left: live.2.saturating_duration_since(now),
                timeout,
            });
        }
        Ok(live)
    }

    /// Attaches `child` to member tenure `generation`: the member's deadline (the child's from now
    /// on), or `None` when that tenure is not the current one any more or its deadline passed (the
    /// child must end).
    pub(crate) fn attach(&self, generation: u64, child: Box<dyn BoundChild>) -> Option<Instant> {
        let mut state = self.inner.lock();
        let current = state.current.as_ref()?;
        if current.generation != generation || Instant::now() >= current.deadline {
            return None;
        }
        let deadline = current.deadline;
        state.children.push((generation, child));
        Some(deadline)
    }
}

/// A tenure bound to a member tenure, as the member sees it.
pub(crate) trait BoundChild: Send + Sync {
    /// The member's deadline moved to `deadline`; `false` when the bound tenure ended already
    /// (the link is then dropped).
    fn extended(&self, deadline: Instant) -> bool;
    /// The member tenure ended: the bound tenure ends now, lost for `reason`.
    fn ended(&self, reason: LostReason);
}

/// The member side of the bindings of one lease (owned by its tenure cell).
pub(crate) struct Anchor {
    name: String,
    store: Option<String>,
    /// The anchoring lease's operation timeout.
    operation_timeout: std::time::Duration,
    state: Mutex<AnchorState>,
    /// Whether the anchoring lease is bound itself (then nothing may bind to it).
    bound: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct AnchorState {
    current: Option<Current>,
    /// The error of the member's last failed renewal, until one succeeds: a bound tenure that
    /// expires with its member names it, as the member does.
    last_error: Option<String>,
    /// The bound tenures, with the member generation each is bound to.
    children: Vec<(u64, Box<dyn BoundChild>)>,
}

struct Current {
    generation: u64,
    deadline: Instant,
    incarnation: Option<String>,
}

impl Anchor {
    pub(crate) fn new(
        name: String,
        store: Option<String>,
        operation_timeout: std::time::Duration,
    ) -> Self {
        Self {
            name,
            store,
            operation_timeout,
            state: Mutex::new(AnchorState::default()),
            bound: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The anchoring lease was bound: nothing binds to it from now on.
    pub(crate) fn set_bound(&self) {
        self.bound.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether the anchoring lease is bound itself.
    pub(crate) fn is_bound(&self) -> bool {
        self.bound.load(std::sync::atomic::Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, AnchorState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Member tenure `generation` started with `deadline` (a tenure still current ended first:
    /// its bound tenures end).
    pub(crate) fn started(&self, generation: u64, deadline: Instant) {
        let orphans = {
            let mut state = self.lock();
            state.current = Some(Current {
                generation,
                deadline,
                incarnation: None,
            });
            state.last_error = None;
            std::mem::take(&mut state.children)
        };
        let reason = LostReason::Unbound {
            member: self.name.clone(),
        };
        for (_, child) in orphans {
            child.ended(reason.clone());
        }
    }

    /// A renewal of the member failed with `error` (`None`: one succeeded).
    pub(crate) fn renewal_failed(&self, error: Option<String>) {
        self.lock().last_error = error;
    }

    /// Why a tenure bound to the current member tenure expired at its deadline (the member's
    /// deadline): as the member's own loss reads, with the error of its last failed renewal.
    pub(crate) fn expired(&self) -> LostReason {
        LostReason::Expired {
            last_error: self.lock().last_error.clone(),
        }
    }

    /// The incarnation of member tenure `generation`, as its backend names it.
    pub(crate) fn set_incarnation(&self, generation: u64, incarnation: String) {
        let mut state = self.lock();
        if let Some(current) = state
            .current
            .as_mut()
            .filter(|c| c.generation == generation)
        {
            current.incarnation = Some(incarnation);
        }
    }

    /// Member tenure `generation`'s deadline moved to `deadline`: so does every bound tenure's.
    pub(crate) fn extended(&self, generation: u64, deadline: Instant) {
        let mut state = self.lock();
        match state.current.as_mut() {
            Some(current) if current.generation == generation => current.deadline = deadline,
            _ => return,
        }
        state
            .children
            .retain(|(bound_to, child)| *bound_to == generation && child.extended(deadline));
    }

    /// Why the tenures bound to a member tenure that ended other than by expiring end.
    pub(crate) fn unbound(&self) -> LostReason {
        LostReason::Unbound {
            member: self.name.clone(),
        }
    }

    /// Member tenure `generation` ended: every tenure bound to it ends now, lost for `reason`,
    /// before this returns (the tenure cell gives [`expired`](Self::expired) for a member that
    /// expired, [`unbound`](Self::unbound) for any other end).
    pub(crate) fn ended(&self, generation: u64, reason: LostReason) {
        let orphans = {
            let mut state = self.lock();
            if state
                .current
                .as_ref()
                .is_some_and(|c| c.generation == generation)
            {
                state.current = None;
            }
            let (orphans, kept) = std::mem::take(&mut state.children)
                .into_iter()
                .partition(|(bound_to, _)| *bound_to == generation);
            state.children = kept;
            orphans
        };
        for (_, child) in orphans {
            child.ended(reason.clone());
        }
    }
}
