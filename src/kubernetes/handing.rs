//! A leaving member that hands its bound shards on in one write
//! ([`Lease::retire_handing`](crate::Lease::retire_handing)), and the targets that claim them at
//! once (see the `bound` module and [`protocol`](crate::protocol) for the rules).
//!
//! # The leaving member
//!
//! Its bound tenures have ended (every worker stopped before). It releases its object with one
//! compare-and-swap on its tenure's `resourceVersion` that adds, under its incarnation, each
//! listed shard whose record its namespace watch shows held by it and bound to this incarnation
//! ([`protocol::listable`](crate::protocol::listable)), with the target (entries of earlier
//! incarnations whose records are still bound to them are kept). From that write on, each
//! listed shard is its target's to claim: no other contender claims it while the target's
//! member tenure lives. The member then waits, within half its operation timeout, until its
//! watch shows every listed record moved on (claimed by its target, or by another contender
//! after the target died), and deletes its object with a precondition on the released version;
//! if they do not, the object stays released with its list (a later tenure of the same member
//! keeps the entries that are still needed).
//!
//! # The target
//!
//! A bound claim that finds a record bound to a member incarnation that listed it to this owner
//! under the member tenure the claim binds to claims it at once, without waiting for any expiry:
//! a compare-and-swap on the version listed (a JSON merge patch naming it) that writes this
//! owner, the record's fencing token plus one and the binding. The tenure starts when that write
//! is answered. It is never taken up without a write: a write on the version listed that nobody
//! foresaw (a release of the old holder that lands late, a claim answered after its member's
//! deadline) would otherwise land on the very version the target acts under, and the next
//! claimant would write the target's token again. With the write first, such a write either
//! lands before the target's claim (which then fails, and the target judges the record again)
//! or is refused.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::record::{handed_shards_of, incarnation_of, released, set_handed_shards};
use super::{object_name, KubernetesBackend, KubernetesError, KubernetesTenure};
use crate::backend::ReleaseOutcome;
use crate::binding::{Binding, HandedShard};
use crate::settings::LeaseSettings;

/// How often a leaving member looks whether the records it handed on moved on.
const MOVED_ON_POLL: Duration = Duration::from_millis(50);

impl KubernetesBackend {
    /// Releases the member object of `tenure` handing `handed` on (see the module docs).
    pub(super) async fn retire_handing_inner(
        &self,
        settings: &LeaseSettings,
        tenure: KubernetesTenure,
        handed: &[HandedShard],
    ) -> Result<ReleaseOutcome, KubernetesError> {
        let started = Instant::now();
        let Some(incarnation) = incarnation_of(&tenure.lease) else {
            return self.retire_plainly(settings, tenure).await;
        };
        let owner = settings.owner();
        // Only records bound to this incarnation are listed (one the watch does not show so yet
        // is freed and claimed, as by `retire`).
        let bound_here = |lease: &str, incarnation: &str| {
            self.listable(lease, owner, &Binding::new(self.name.clone(), incarnation))
        };
        let listed: Vec<HandedShard> = handed
            .iter()
            .filter(|shard| bound_here(shard.lease(), &incarnation))
            .cloned()
            .collect();
        let mut entries = handed_shards_of(&tenure.lease).unwrap_or_default();
        entries.retain(|earlier, lease| earlier != incarnation && bound_here(lease, earlier));
        if listed.is_empty() && entries.is_empty() {
            return self.retire_plainly(settings, tenure).await;
        }
        entries.add(&incarnation, &listed);
        let mut next = released((*tenure.lease).clone());
        set_handed_shards(&mut next, &entries);
        let api = self.api()?;
        self.lock().tenure_version = None;
        tracing::debug!(object = %self.object, handed = listed.len(), "releasing the member object, handing its shards on");
        let written = match self.update(&api, &next).await {
            Ok(written) => written,
            Err(e) if e.status_code() == Some(404) => return Ok(ReleaseOutcome::Released),
            // Another version stands (a contender released it as expired, or a renewal whose
            // answer was lost): decide by a plain release, which reads; nothing is handed on.
            Err(e) if e.status_code() == Some(409) => {
                return self.retire_plainly(settings, tenure).await;
            }
            Err(e) => return Err(e),
        };
        self.counters
            .handed_over
            .fetch_add(listed.len() as u64, Ordering::Relaxed);
        // Wait until every listed record moved on, then delete the object: at most half the
        // operation timeout in all (the call is bounded by it, and the handover has landed).
        let until = started + settings.operation_timeout() / 2;
        loop {
            let pending = entries
                .entries()
                .any(|(incarnation, lease, _, _)| self.still_bound(lease, incarnation));
            if !pending {
                break;
            }
            if Instant::now() >= until {
                tracing::debug!(object = %self.object, "the shards handed on were not all rebound in time: the member object stays released, with its list");
                return Ok(ReleaseOutcome::Released);
            }
            tokio::time::sleep(MOVED_ON_POLL).await;
        }
        // Deleted at the released version, as `retire` deletes (a Role without `delete` is
        // warned about once there); an object not deleted stays released, with its list.
        match self
            .delete_retired(written.metadata.resource_version.clone())
            .await
        {
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::debug!(object = %self.object, "the released member object was not deleted: it stays");
            }
            Err(error) => {
                tracing::debug!(error = &error as &dyn std::error::Error, object = %self.object, "the released member object was not deleted: it stays");
            }
        }
        Ok(ReleaseOutcome::Released)
    }

    /// Whether the namespace watch still shows (or cannot tell whether) the record of `lease`
    /// bound to incarnation `incarnation` of this lease.
    pub(super) fn still_bound(&self, lease: &str, incarnation: &str) -> bool {
        match self.hub.record_of(&self.namespace, &object_name(lease)) {
            None => true,
            Some(None) => false,
            Some(Some((record, _))) => record
                .bound_to
                .as_ref()
                .is_some_and(|b| b.member() == self.name && b.incarnation() == incarnation),
        }
    }
}
