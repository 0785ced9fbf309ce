//! A bound claim decided from the namespace watch's index, with no read of the object: the
//! claim of a shard whose holder's member tenure ended, as every shard of a node that left or
//! died is claimed.
//!
//! A lease that has not waited for or held its object yet has no view of it of its own, and
//! would read it before its claim: when a node leaves a group of 16 × 4,096, 256 such reads
//! come at once, as many as the claims (`fleet -- kubernetes large`). The namespace watch's
//! index already has what the claim is decided from: the record's holder, fencing token and
//! binding, and its `resourceVersion`. So a bound claim of a lease without a view decides from
//! the index, and writes with a JSON merge patch that carries that `resourceVersion`: the API
//! server applies a patch naming a `resourceVersion` only to that version (`409 Conflict`
//! otherwise), the same compare-and-swap as a replace. A lagging index can only make the patch
//! fail; the claim then reads the object and decides again, as before. The patch sets every
//! field a claim writes (the `spec` of a claim, and each of this crate's annotations, or
//! removes it); the object's other fields (labels, other annotations, a preferred holder some
//! other client set) stay as they were, as a replace of the object read would leave them.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use serde_json::{Map, Value};

use super::bound::BoundState;
use super::record::{
    bind, BOUND_INCARNATION_ANNOTATION, BOUND_TO_ANNOTATION, HANDED_OVER_AFTER_ANNOTATION,
    HANDED_OVER_BY_ANNOTATION, HOLDER_METADATA_ANNOTATION, HOLDER_METADATA_OWNER_ANNOTATION,
    PREFERRED_AT_ANNOTATION, PREFERRED_HOLDER_ANNOTATION, WATCHING_SINCE_ANNOTATION,
};
use super::{KubernetesBackend, KubernetesError, KubernetesTenure, LEASE_NAME_ANNOTATION};
use crate::backend::AcquireAttempt;
use crate::binding::Binding;
use crate::settings::LeaseSettings;

/// The annotations a claim writes or removes: all of this crate's.
const CLAIM_ANNOTATIONS: [&str; 10] = [
    LEASE_NAME_ANNOTATION,
    PREFERRED_HOLDER_ANNOTATION,
    PREFERRED_AT_ANNOTATION,
    HOLDER_METADATA_ANNOTATION,
    HOLDER_METADATA_OWNER_ANNOTATION,
    HANDED_OVER_BY_ANNOTATION,
    HANDED_OVER_AFTER_ANNOTATION,
    BOUND_TO_ANNOTATION,
    BOUND_INCARNATION_ANNOTATION,
    WATCHING_SINCE_ANNOTATION,
];

impl KubernetesBackend {
    /// A claim of this lease bound to `binding`, decided from the namespace watch's index
    /// without a read: `None` when the index cannot decide it (not current, the object of
    /// another lease, a record that is not another holder's bound one) or the write lost its
    /// compare-and-swap: the caller reads the object and decides again.
    ///
    /// Decided here: no object (a create, which fails if one exists meanwhile), and a record
    /// another holder holds bound to its member tenure: held while that tenure lives (as
    /// [`bound_until`](Self::bound_until) judges it, as for a record read), else claimed.
    pub(super) async fn claim_from_index(
        &self,
        api: &Api<LeaseObject>,
        settings: &LeaseSettings,
        binding: &Binding,
    ) -> Result<Option<AcquireAttempt<KubernetesTenure>>, KubernetesError> {
        if self.patch_forbidden.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let Some(known) = self
            .hub
            .claimable(&self.namespace, &self.object, &self.name)
        else {
            return Ok(None);
        };
        let Some((record, version)) = known else {
            let mut claim = self.new_object(settings);
            bind(&mut claim, binding);
            let sent = self.claim_sent(&claim);
            return match self.answered(sent, self.create(api, &claim).await) {
                Ok(created) => Ok(Some(self.acquired(created))),
                Err(e) if e.status_code() == Some(409) => Ok(None),
                Err(e) => Err(e),
            };
        };
        let (Some(holder), Some(bound)) = (record.holder.as_deref(), record.bound_to.as_ref())
        else {
            return Ok(None);
        };
        if holder == settings.owner() {
            return Ok(None);
        }
        let me = Some((settings.owner(), binding));
        if let BoundState::Held { holder, until } = self.bound_state(api, bound, holder, me).await?
        {
            return Ok(Some(AcquireAttempt::HeldByOther {
                holder: Some(holder),
                expires_at: until,
            }));
        }
        let Ok(transitions) = i32::try_from(record.token.map_or(0, |t| t.value())) else {
            return Ok(None);
        };
        let known = LeaseObject {
            metadata: ObjectMeta {
                name: Some(self.object.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version: Some(version),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            }),
        };
        let mut claim = self.claimed(known, settings)?;
        bind(&mut claim, binding);
        let sent = self.claim_sent(&claim);
        tracing::debug!(object = %self.object, "sending the claim, decided from the watch");
        match self.answered(sent, self.patch_claim(api, &claim).await) {
            Ok(updated) => Ok(Some(self.acquired(updated))),
            Err(e) if matches!(e.status_code(), Some(409) | Some(404)) => Ok(None),
            // A Role without `patch` (the one this crate asked for before): read and replace.
            Err(error @ KubernetesError::Forbidden { .. }) => {
                if !self.patch_forbidden.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        %error,
                        object = %self.object,
                        "the role has no `patch` on leases: bound claims read the object first \
                         (one more request each; see deploy/rbac.yaml)"
                    );
                }
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// The JSON merge patch that writes `claim` (a claim built on the record as the index knows it)
/// over the object: only if the object is still at `claim`'s `resourceVersion`, its claim's
/// `spec` fields, and each of [`CLAIM_ANNOTATIONS`] as `claim` has it (or removed).
pub(super) fn claim_patch(claim: &LeaseObject) -> Result<Value, serde_json::Error> {
    let empty = BTreeMap::new();
    let annotations = claim.metadata.annotations.as_ref().unwrap_or(&empty);
    let annotations: Map<String, Value> = CLAIM_ANNOTATIONS
        .iter()
        .map(|key| {
            let value = annotations
                .get(*key)
                .map_or(Value::Null, |v| Value::String(v.clone()));
            ((*key).to_owned(), value)
        })
        .collect();
    Ok(serde_json::json!({
        "metadata": {
            "resourceVersion": claim.metadata.resource_version,
            "annotations": annotations,
        },
        "spec": serde_json::to_value(&claim.spec)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_patch_names_its_version_and_sets_or_removes_every_annotation_of_ours() {
        let claim = LeaseObject {
            metadata: ObjectMeta {
                resource_version: Some("42".into()),
                annotations: Some(BTreeMap::from([
                    (LEASE_NAME_ANNOTATION.to_owned(), "group.shard".to_owned()),
                    (BOUND_TO_ANNOTATION.to_owned(), "group.member.b".to_owned()),
                    ("someone/else".to_owned(), "kept".to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("b".into()),
                lease_transitions: Some(8),
                ..LeaseSpec::default()
            }),
        };
        let patch = claim_patch(&claim).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        let annotations = patch["metadata"]["annotations"].as_object().unwrap();
        assert_eq!(annotations.len(), CLAIM_ANNOTATIONS.len());
        assert_eq!(annotations[LEASE_NAME_ANNOTATION], "group.shard");
        assert_eq!(annotations[BOUND_TO_ANNOTATION], "group.member.b");
        assert_eq!(annotations[HANDED_OVER_BY_ANNOTATION], Value::Null);
        assert_eq!(annotations[PREFERRED_HOLDER_ANNOTATION], Value::Null);
        assert!(
            !annotations.contains_key("someone/else"),
            "another writer's annotation is left as it is"
        );
        assert_eq!(patch["spec"]["holderIdentity"], "b");
        assert_eq!(patch["spec"]["leaseTransitions"], 8);
        assert!(
            patch["spec"].get("preferredHolder").is_none(),
            "a field the claim does not write is left as it is"
        );
    }
}
