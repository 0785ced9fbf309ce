//! A lease given up for good ([`Lease::retire`](crate::Lease::retire)): its object is deleted,
//! so that a name that will not be claimed again (a node's membership or candidacy under an
//! identity the next rollout replaces) leaves nothing in the namespace.
//!
//! The delete carries a precondition on the tenure's `resourceVersion`: like every write that
//! concerns ownership, it is a compare-and-swap, and it removes only the version this tenure
//! wrote. A version written since (a renewal whose answer was lost, another writer) makes the API
//! server refuse it with `409 Conflict`, and the lease is released as by `release`, which reads
//! and decides. An account that may not delete leases (the Role lacks the `delete` verb) gets a
//! plain release too, with one warning per lease naming the rule; the object then stays.

use std::sync::atomic::Ordering;

use kube::api::{DeleteParams, Preconditions};

use super::backend::KubernetesBackend;
use super::KubernetesError;
use crate::backend::ReleaseOutcome;

impl KubernetesBackend {
    /// Deletes the object at `version` (the tenure's): `Some(Released)` when it is gone,
    /// `None` when it was not deleted and the caller must release it instead.
    pub(super) async fn delete_retired(
        &self,
        version: Option<String>,
    ) -> Result<Option<ReleaseOutcome>, KubernetesError> {
        let Some(version) = version else {
            return Ok(None);
        };
        if self.delete_forbidden.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let api = self.api()?;
        self.lock().tenure_version = None;
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(version),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        self.counters.deletes.fetch_add(1, Ordering::Relaxed);
        match api.delete(&self.object, &params).await {
            Ok(_) => {
                tracing::debug!(object = %self.object, "deleted the object of a lease given up for good");
                Ok(Some(ReleaseOutcome::Released))
            }
            Err(error) => {
                let error = self.write_error("delete", error);
                match error {
                    _ if error.status_code() == Some(404) => Ok(Some(ReleaseOutcome::Released)),
                    KubernetesError::Forbidden { .. } => {
                        if !self.delete_forbidden.swap(true, Ordering::Relaxed) {
                            tracing::warn!(error = &error as &dyn std::error::Error, object = %self.object, "cannot delete the object of a lease given up for good: releasing it instead, and the object stays (grant `delete` on leases to remove it)");
                        }
                        Ok(None)
                    }
                    _ => {
                        tracing::debug!(error = &error as &dyn std::error::Error, object = %self.object, "the delete was refused: releasing instead");
                        Ok(None)
                    }
                }
            }
        }
    }
}
