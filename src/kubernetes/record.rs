//! The `Lease` object as this backend writes and reads it: the fields of a claim, a renewal and a
//! release, who holds it, its fencing token (`leaseTransitions`) and its duration.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;

use super::{KubernetesBackend, KubernetesError, LEASE_NAME_ANNOTATION};
use crate::lease::{FencingToken, LostReason};
use crate::settings::LeaseSettings;

/// The field manager recorded in the objects' `managedFields`.
const FIELD_MANAGER: &str = "actix-coordination";

impl KubernetesBackend {
    pub(super) fn check_owner_name(&self, lease: &LeaseObject) -> Result<(), KubernetesError> {
        match lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEASE_NAME_ANNOTATION))
        {
            Some(other) if *other != self.name => Err(KubernetesError::NameCollision {
                name: self.name.clone(),
                object: self.object.clone(),
                owner_name: other.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// A new object claimed by `settings.owner()`.
    pub(super) fn new_object(&self, settings: &LeaseSettings) -> LeaseObject {
        let now = now_micro();
        LeaseObject {
            metadata: ObjectMeta {
                name: Some(self.object.clone()),
                namespace: Some(self.namespace.clone()),
                annotations: Some(BTreeMap::from([(
                    LEASE_NAME_ANNOTATION.to_owned(),
                    self.name.clone(),
                )])),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_owned(),
                    FIELD_MANAGER.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(settings.owner().to_owned()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_duration_seconds: Some(duration_secs(settings.ttl())),
                lease_transitions: Some(1),
                ..LeaseSpec::default()
            }),
        }
    }

    /// `current` claimed by `settings.owner()` as a new tenure.
    pub(super) fn claimed(
        &self,
        mut current: LeaseObject,
        settings: &LeaseSettings,
    ) -> Result<LeaseObject, KubernetesError> {
        let transitions = transitions_of(&current).checked_add(1).ok_or_else(|| {
            KubernetesError::InvalidRecord {
                object: self.object.clone(),
                reason: "leaseTransitions cannot grow any more".into(),
            }
        })?;
        current
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(LEASE_NAME_ANNOTATION.to_owned(), self.name.clone());
        let now = now_micro();
        let spec = current.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(settings.owner().to_owned());
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(duration_secs(settings.ttl()));
        spec.lease_transitions = Some(transitions);
        Ok(current)
    }

    /// Why the tenure with `token` is lost according to `lease`, if it is.
    pub(super) fn loss_in(
        lease: &LeaseObject,
        owner: &str,
        token: FencingToken,
    ) -> Option<LostReason> {
        match holder_of(lease) {
            None => Some(LostReason::Inconsistent(
                "the lease object shows no holder: released by another client".into(),
            )),
            Some(holder) if holder != owner => Some(LostReason::TakenOver {
                holder: Some(holder.to_owned()),
            }),
            Some(holder) if transitions_of(lease) as u64 != token.value() => {
                Some(LostReason::TakenOver {
                    holder: Some(holder.to_owned()),
                })
            }
            Some(_) => None,
        }
    }
}

pub(super) fn post_params() -> PostParams {
    PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    }
}

/// `lease` without its `managedFields`, as it is kept: about half of the object's size, and an
/// update that omits them leaves them as they are.
pub(super) fn slim(mut lease: LeaseObject) -> LeaseObject {
    lease.metadata.managed_fields = None;
    lease
}

/// `lease` without a holder.
pub(super) fn released(mut lease: LeaseObject) -> LeaseObject {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.renew_time = Some(now_micro());
    lease
}

/// The holder, `None` when the object has none (absent or empty, as client-go writes it).
pub(super) fn holder_of(lease: &LeaseObject) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

pub(super) fn transitions_of(lease: &LeaseObject) -> i32 {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0)
        .max(0)
}

/// The claim's duration; a missing or non-positive `leaseDurationSeconds` counts as one second
/// (an object written by something else without a duration is not held for long).
pub(super) fn duration_of(lease: &LeaseObject) -> Duration {
    let secs = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .unwrap_or(1)
        .max(1);
    Duration::from_secs(secs as u64)
}

/// The TTL in whole seconds, rounded up (a contender must never wait less than the TTL).
pub(super) fn duration_secs(ttl: Duration) -> i32 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

/// Whether `a` is an older `resourceVersion` than `b`. Versions are opaque to clients, but every
/// API server backed by etcd writes etcd revisions; when either is not a number this says `false`
/// (nothing is dropped, and a compare-and-swap catches a stale view).
pub(super) fn older(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a < b,
        _ => false,
    }
}

/// Whether `a` is a newer `resourceVersion` than `b`, when both are numbers.
pub(super) fn newer(a: &str, b: &str) -> bool {
    older(b, a)
}

/// Now, at the microsecond precision the API server stores (so that a written value compares
/// equal to what is read back).
pub(super) fn now_micro() -> MicroTime {
    let now = k8s_openapi::jiff::Timestamp::now();
    let micros = now.as_microsecond();
    MicroTime(k8s_openapi::jiff::Timestamp::from_microsecond(micros).unwrap_or(now))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn ttl_is_rounded_up_to_whole_seconds() {
        assert_eq!(duration_secs(Duration::from_secs(3)), 3);
        assert_eq!(duration_secs(Duration::from_millis(3001)), 4);
        assert_eq!(duration_secs(Duration::from_millis(200)), 1);
        assert_eq!(duration_secs(Duration::from_secs(u64::MAX / 2)), i32::MAX);
    }

    pub(in crate::kubernetes) fn object(
        holder: Option<&str>,
        transitions: Option<i32>,
    ) -> LeaseObject {
        LeaseObject {
            metadata: ObjectMeta {
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_transitions: transitions,
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn versions_compare_only_as_numbers() {
        assert!(older("9", "10"));
        assert!(!older("10", "9"));
        assert!(!older("10", "10"));
        assert!(!older("x", "10"));
        assert!(newer("11", "10"));
        assert!(!newer("a", "b"));
    }

    #[test]
    fn empty_holders_are_no_holders() {
        assert_eq!(holder_of(&object(Some(""), None)), None);
        assert_eq!(holder_of(&object(None, None)), None);
        assert_eq!(holder_of(&object(Some("a"), None)), Some("a"));
        assert_eq!(transitions_of(&object(None, None)), 0);
        assert_eq!(transitions_of(&object(None, Some(-3))), 0);
    }

    #[test]
    fn losses_are_recognised() {
        let token = FencingToken::new(4);
        assert_eq!(
            KubernetesBackend::loss_in(&object(Some("a"), Some(4)), "a", token),
            None
        );
        assert_eq!(
            KubernetesBackend::loss_in(&object(Some("b"), Some(5)), "a", token),
            Some(LostReason::TakenOver {
                holder: Some("b".into())
            })
        );
        assert_eq!(
            KubernetesBackend::loss_in(&object(Some("a"), Some(5)), "a", token),
            Some(LostReason::TakenOver {
                holder: Some("a".into())
            }),
            "a newer tenure of the same owner identity is not ours"
        );
        assert!(matches!(
            KubernetesBackend::loss_in(&object(None, Some(4)), "a", token),
            Some(LostReason::Inconsistent(_))
        ));
    }

    #[test]
    fn micro_time_round_trips_exactly() {
        let t = now_micro();
        let json = serde_json::to_string(&t).unwrap();
        let back: MicroTime = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t, "{json}");
    }

    #[test]
    fn an_object_of_another_lease_name_is_refused() {
        let backend = KubernetesBackend::with_client_for_tests("mine");
        let mut lease = object(Some("a"), Some(1));
        assert!(
            backend.check_owner_name(&lease).is_ok(),
            "no annotation (client-go)"
        );
        lease.metadata.annotations = Some(BTreeMap::from([(
            LEASE_NAME_ANNOTATION.to_owned(),
            "theirs".to_owned(),
        )]));
        let err = backend.check_owner_name(&lease).unwrap_err();
        assert!(
            matches!(err, KubernetesError::NameCollision { .. }),
            "{err}"
        );
    }
}
