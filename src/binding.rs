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
//! # Races
//!
//! * A bound acquire needs a live member tenure: without one it fails with
//!   [`LeaseError::Unbound`](crate::LeaseError::Unbound) (transient: acquire the member lease
//!   first). A member tenure that ends while the bound claim is in flight ends the new tenure at
//!   once; the claim (bound to an incarnation that no longer lives) is free for others already,
//!   and is released all the same.
//! * A bound tenure starts with the member's deadline and is attached to the member in one step
//!   that checks the member is still the same tenure: the member cannot end between the two
//!   without ending the bound tenure.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

use crate::tenure::TenureEnd;
use crate::vocab::LostReason;

/// What a bound claim names: the lease whose tenure it lives by, and which incarnation of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Binding {
    member: String,
    incarnation: String,
}

impl Binding {
    /// A binding to incarnation `incarnation` of lease `member` (as the member's backend names
    /// it: [`LeaseBackend::incarnation`](crate::LeaseBackend::incarnation)).
    pub fn new(member: impl Into<String>, incarnation: impl Into<String>) -> Self {
        Self {
            member: member.into(),
            incarnation: incarnation.into(),
        }
    }

    /// The name of the lease the bound claim lives by.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// The incarnation (the member tenure) the bound claim lives by, as its backend names it.
    pub fn incarnation(&self) -> &str {
        &self.incarnation
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
    state: Mutex<AnchorState>,
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
    pub(crate) fn new(name: String, store: Option<String>) -> Self {
        Self {
            name,
            store,
            state: Mutex::new(AnchorState::default()),
        }
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

    /// Member tenure `generation` ended with `end`: every tenure bound to it ends now, before
    /// this returns. A member that expired takes its bound tenures with it as expired (with its
    /// last renewal error); any other end is [`LostReason::Unbound`].
    pub(crate) fn ended(&self, generation: u64, end: &TenureEnd) {
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
        let reason = match end {
            TenureEnd::DeadlinePassed => self.expired(),
            TenureEnd::Lost(reason @ LostReason::Expired { .. }) => reason.clone(),
            _ => LostReason::Unbound {
                member: self.name.clone(),
            },
        };
        for (_, child) in orphans {
            child.ended(reason.clone());
        }
    }
}
