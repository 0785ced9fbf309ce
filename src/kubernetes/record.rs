//! The `Lease` object as this backend writes and reads it: the fields of a claim, a renewal and a
//! release, who holds it, its fencing token (`leaseTransitions`) and its duration.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;

use super::{KubernetesBackend, KubernetesError, LEASE_NAME_ANNOTATION};
use crate::binding::{Binding, HandedShards};
use crate::lease::{FencingToken, LostReason};
use crate::settings::LeaseSettings;

/// The field manager recorded in the objects' `managedFields`.
const FIELD_MANAGER: &str = "actix-coordination";

/// The annotation naming the preferred next holder of a released object (see
/// [`Lease::release_to`](crate::Lease::release_to)).
pub const PREFERRED_HOLDER_ANNOTATION: &str = "actix-coordination/preferred-holder";

/// The annotation stating the `leaseTransitions` of the release that named the preferred holder:
/// the preference holds only while the object still shows that count (a client that knows
/// nothing of preferences claims and releases without clearing the annotations, and moves the
/// count on).
pub const PREFERRED_AT_ANNOTATION: &str = "actix-coordination/preferred-at-transitions";

/// The annotation holding what the holder wrote about itself with its claim
/// ([`LeaseSettings::metadata`]); it counts only while
/// [`HOLDER_METADATA_OWNER_ANNOTATION`] names the object's holder.
pub const HOLDER_METADATA_ANNOTATION: &str = "actix-coordination/holder-metadata";

/// The annotation naming the owner that wrote [`HOLDER_METADATA_ANNOTATION`]: a client that
/// knows nothing of it (client-go) claims without removing it, and its claim names another holder.
pub const HOLDER_METADATA_OWNER_ANNOTATION: &str = "actix-coordination/holder-metadata-owner";

/// The annotation naming the owner that handed the object over to its holder.
pub const HANDED_OVER_BY_ANNOTATION: &str = "actix-coordination/handed-over-by";

/// The annotation `<object>/<resourceVersion>`: a version of a `Lease` object held by the holder
/// that the owner that handed the object over had seen before it wrote the handover (see the
/// `handover` module).
pub const HANDED_OVER_AFTER_ANNOTATION: &str = "actix-coordination/handed-over-after";

/// The annotation naming the member lease a *bound* record lives by (see
/// [`Binding`](crate::Binding)): the record is held exactly while that member lease's object
/// shows the incarnation [`BOUND_INCARNATION_ANNOTATION`] names, held by the same holder.
pub const BOUND_TO_ANNOTATION: &str = "actix-coordination/bound-to";

/// The annotation with which a writer says how long its namespace watch has run without a gap:
/// the newest `resourceVersion` of a `Lease` of the namespace that the watch had when it last
/// listed the namespace (or resumed), so that every later version reached it as a change, soon
/// after it was written; `none` while its watch is not synced. Written with every claim and
/// renewal; read by the nodes of a sharded group to place a dead member's shards on members
/// that can claim them on time (see [`GroupRecord`](crate::GroupRecord) and `ShardedWorkers`).
pub const WATCHING_SINCE_ANNOTATION: &str = "actix-coordination/watching-since";

/// The annotation of a member lease's object whose holder shuts down: the incarnation
/// (`<uid>/<leaseTransitions>`) of the tenure that leaves ([`Lease::mark_leaving`](crate::Lease::mark_leaving)).
/// Other members place nothing on it any more; it counts only while that tenure holds the object.
pub const LEAVING_ANNOTATION: &str = "actix-coordination/leaving";

/// The annotation `<uid>/<leaseTransitions>`: the incarnation (the member tenure) of the member
/// lease's object a bound record lives by.
pub const BOUND_INCARNATION_ANNOTATION: &str = "actix-coordination/bound-incarnation";

/// The annotation of a member lease's object listing the bound shards its ended tenures handed
/// on ([`Lease::retire_handing`](crate::Lease::retire_handing)): JSON, per ended incarnation
/// (`<uid>/<leaseTransitions>`), the targets with their shard leases:
/// `{"<incarnation>":[{"owner":"…","member":"…","incarnation":"…","leases":["…"]}]}`. A shard
/// record bound to a listed incarnation and listed for it is the target's alone to claim while
/// the target's member object shows that target's incarnation held (it claims it with a
/// compare-and-swap, its fencing token the record's `leaseTransitions` plus one; no tenure
/// starts before that write), and free once it does not. Kept by every write of the member object until the listed records moved on.
pub const HANDED_SHARDS_ANNOTATION: &str = "actix-coordination/handed-shards";

/// The `leaseDurationSeconds` of a bound record: the largest the field holds (about 68 years).
/// A bound record is never renewed; its validity is its member's, which only clients of this
/// crate judge. A client that reads the record's duration (client-go 1.27 and later) therefore
/// never counts it expired while it stands; one that applies its own configured duration
/// (client-go before 1.27) would, and must not be pointed at bound records.
pub const BOUND_DURATION_SECS: i32 = i32::MAX;

/// The `spec.strategy` written with `spec.preferredHolder` (the API server accepts a preferred
/// holder only with a strategy, and this is the only one it knows).
const PREFERRED_STRATEGY: &str = "OldestEmulationVersion";

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
        let mut object = LeaseObject {
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
        };
        set_metadata(&mut object, settings);
        object
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
        clear_preference(&mut current);
        clear_handed(&mut current);
        clear_binding(&mut current);
        set_metadata(&mut current, settings);
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

/// `lease` without a holder (and without a binding).
pub(super) fn released(mut lease: LeaseObject) -> LeaseObject {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.renew_time = Some(now_micro());
    if let Some(annotations) = lease.metadata.annotations.as_mut() {
        annotations.remove(HOLDER_METADATA_ANNOTATION);
        annotations.remove(HOLDER_METADATA_OWNER_ANNOTATION);
    }
    clear_handed(&mut lease);
    clear_binding(&mut lease);
    lease
}

/// The member tenure `lease` is bound to, if it is a held, bound record: held, with the binding
/// annotations and the bound duration [`BOUND_DURATION_SECS`]. A client that knows nothing of
/// bindings (client-go) claims and renews with its own duration and keeps the annotations: its
/// tenure is an ordinary one, timed by that duration, not one that lives by our member record
/// (whose holder is not client-go's, which would count the record free at once).
pub(super) fn binding_of(lease: &LeaseObject) -> Option<Binding> {
    holder_of(lease)?;
    if lease.spec.as_ref()?.lease_duration_seconds != Some(BOUND_DURATION_SECS) {
        return None;
    }
    let annotations = lease.metadata.annotations.as_ref()?;
    let member = annotations.get(BOUND_TO_ANNOTATION)?;
    let incarnation = annotations.get(BOUND_INCARNATION_ANNOTATION)?;
    Some(Binding::new(member.clone(), incarnation.clone()))
}

/// Binds `lease` (a claim) to `binding`: the annotations, and the duration of a bound record.
pub(super) fn bind(lease: &mut LeaseObject, binding: &Binding) {
    let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(BOUND_TO_ANNOTATION.to_owned(), binding.member().to_owned());
    annotations.insert(
        BOUND_INCARNATION_ANNOTATION.to_owned(),
        binding.incarnation().to_owned(),
    );
    lease
        .spec
        .get_or_insert_with(LeaseSpec::default)
        .lease_duration_seconds = Some(BOUND_DURATION_SECS);
}

/// Removes a binding (a plain claim, a release, a handover write the object without).
pub(super) fn clear_binding(lease: &mut LeaseObject) {
    if let Some(annotations) = lease.metadata.annotations.as_mut() {
        annotations.remove(BOUND_TO_ANNOTATION);
        annotations.remove(BOUND_INCARNATION_ANNOTATION);
    }
}

/// The incarnation of `lease`'s current tenure, `<uid>/<leaseTransitions>`, while it is held:
/// what a record bound to it names. The `uid` tells a recreated object (whose transitions
/// start again) from the old one.
pub(super) fn incarnation_of(lease: &LeaseObject) -> Option<String> {
    holder_of(lease)?;
    let uid = lease.metadata.uid.as_deref()?;
    Some(format!("{uid}/{}", transitions_of(lease)))
}

/// One target of [`HANDED_SHARDS_ANNOTATION`].
#[derive(serde::Serialize, serde::Deserialize)]
struct HandedTarget {
    owner: String,
    member: String,
    incarnation: String,
    leases: Vec<String>,
}

/// What [`HANDED_SHARDS_ANNOTATION`] of `lease` lists (`None`: no such annotation, or one that
/// does not parse, which lists nothing).
pub(super) fn handed_shards_of(lease: &LeaseObject) -> Option<HandedShards> {
    let value = lease
        .metadata
        .annotations
        .as_ref()?
        .get(HANDED_SHARDS_ANNOTATION)?;
    let parsed: BTreeMap<String, Vec<HandedTarget>> = serde_json::from_str(value).ok()?;
    let mut handed = HandedShards::default();
    for (incarnation, targets) in &parsed {
        for target in targets {
            let binding = Binding::new(target.member.clone(), target.incarnation.clone());
            for lease in &target.leases {
                handed.add_one(incarnation, lease, &target.owner, &binding);
            }
        }
    }
    (!handed.is_empty()).then_some(handed)
}

/// Writes `handed` into [`HANDED_SHARDS_ANNOTATION`] of `lease` (removes it when empty).
pub(super) fn set_handed_shards(lease: &mut LeaseObject, handed: &HandedShards) {
    if handed.is_empty() {
        if let Some(annotations) = lease.metadata.annotations.as_mut() {
            annotations.remove(HANDED_SHARDS_ANNOTATION);
        }
        return;
    }
    let mut wire: BTreeMap<&str, Vec<HandedTarget>> = BTreeMap::new();
    for (incarnation, lease, owner, binding) in handed.entries() {
        let targets = wire.entry(incarnation).or_default();
        let target = match targets.iter().position(|t| {
            t.owner == owner
                && t.member == binding.member()
                && t.incarnation == binding.incarnation()
        }) {
            Some(index) => &mut targets[index],
            None => {
                targets.push(HandedTarget {
                    owner: owner.to_owned(),
                    member: binding.member().to_owned(),
                    incarnation: binding.incarnation().to_owned(),
                    leases: Vec::new(),
                });
                targets.last_mut().expect("pushed")
            }
        };
        target.leases.push(lease.to_owned());
    }
    let value = serde_json::to_string(&wire).expect("strings serialize");
    lease
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(HANDED_SHARDS_ANNOTATION.to_owned(), value);
}

/// The `resourceVersion` of `lease` as a number (`None` when it is not one).
pub(super) fn revision_of(lease: &LeaseObject) -> Option<u64> {
    lease.metadata.resource_version.as_deref()?.parse().ok()
}

/// What [`WATCHING_SINCE_ANNOTATION`] of `lease` says: `None` without it (a writer that does not
/// say: taken as watching all along), `Some(u64::MAX)` when it is not a number (its watch was
/// not synced: it watched nothing on time).
/// Sets [`LEAVING_ANNOTATION`] of `lease` to the incarnation it is held in (nothing when it is
/// not held).
pub(super) fn set_leaving(lease: &mut LeaseObject) {
    let Some(incarnation) = incarnation_of(lease) else {
        return;
    };
    lease
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(LEAVING_ANNOTATION.to_owned(), incarnation);
}

/// Whether `lease` is held by a tenure marked leaving ([`LEAVING_ANNOTATION`] names its
/// incarnation: a mark of an earlier tenure does not count).
pub(super) fn leaving_of(lease: &LeaseObject) -> bool {
    let Some(incarnation) = incarnation_of(lease) else {
        return false;
    };
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEAVING_ANNOTATION))
        .is_some_and(|marked| *marked == incarnation)
}

pub(super) fn watching_since_of(lease: &LeaseObject) -> Option<u64> {
    let value = lease
        .metadata
        .annotations
        .as_ref()?
        .get(WATCHING_SINCE_ANNOTATION)?;
    Some(value.parse().unwrap_or(u64::MAX))
}

/// Sets [`WATCHING_SINCE_ANNOTATION`] of `lease` to `since`: `None` (no watch of the namespace
/// runs here) removes it, `Some(None)` (a watch that is not synced) writes `none`.
pub(super) fn set_watching_since(lease: &mut LeaseObject, since: Option<Option<u64>>) {
    let Some(since) = since else {
        if let Some(annotations) = lease.metadata.annotations.as_mut() {
            annotations.remove(WATCHING_SINCE_ANNOTATION);
        }
        return;
    };
    let value = since.map_or_else(|| "none".to_owned(), |v| v.to_string());
    lease
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(WATCHING_SINCE_ANNOTATION.to_owned(), value);
}

/// `lease` handed over by `from` to `target`, after the handing holder saw version `version` of
/// object `object` held by `target`: `target` is the holder, with the next `leaseTransitions`
/// and a duration of `ttl`; no preference, no holder metadata.
pub(super) fn handed(
    mut lease: LeaseObject,
    from: &str,
    target: &str,
    (object, version): (&str, &str),
    ttl: Duration,
) -> Option<LeaseObject> {
    let transitions = transitions_of(&lease).checked_add(1)?;
    clear_preference(&mut lease);
    let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.remove(HOLDER_METADATA_ANNOTATION);
    annotations.remove(HOLDER_METADATA_OWNER_ANNOTATION);
    annotations.remove(BOUND_TO_ANNOTATION);
    annotations.remove(BOUND_INCARNATION_ANNOTATION);
    annotations.insert(HANDED_OVER_BY_ANNOTATION.to_owned(), from.to_owned());
    annotations.insert(
        HANDED_OVER_AFTER_ANNOTATION.to_owned(),
        format!("{object}/{version}"),
    );
    let now = now_micro();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(target.to_owned());
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    spec.lease_duration_seconds = Some(duration_secs(ttl));
    spec.lease_transitions = Some(transitions);
    Some(lease)
}

/// Removes the handover annotations (a claim, a renewal and a release write the object without).
pub(super) fn clear_handed(lease: &mut LeaseObject) {
    if let Some(annotations) = lease.metadata.annotations.as_mut() {
        annotations.remove(HANDED_OVER_BY_ANNOTATION);
        annotations.remove(HANDED_OVER_AFTER_ANNOTATION);
    }
}

/// The version a handover to `lease`'s holder names (`(object, resourceVersion)`), if `lease` is
/// a record handed over by another owner to its holder.
pub(super) fn handed_after(lease: &LeaseObject) -> Option<(&str, &str)> {
    let holder = holder_of(lease)?;
    let annotations = lease.metadata.annotations.as_ref()?;
    let by = annotations.get(HANDED_OVER_BY_ANNOTATION)?;
    if by == holder {
        return None;
    }
    annotations
        .get(HANDED_OVER_AFTER_ANNOTATION)?
        .split_once('/')
        .filter(|(object, version)| !object.is_empty() && !version.is_empty())
}

/// Writes the claiming owner's metadata (or removes a previous holder's).
fn set_metadata(lease: &mut LeaseObject, settings: &LeaseSettings) {
    let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match settings.metadata() {
        Some(metadata) => {
            annotations.insert(HOLDER_METADATA_ANNOTATION.to_owned(), metadata.to_owned());
            annotations.insert(
                HOLDER_METADATA_OWNER_ANNOTATION.to_owned(),
                settings.owner().to_owned(),
            );
        }
        None => {
            annotations.remove(HOLDER_METADATA_ANNOTATION);
            annotations.remove(HOLDER_METADATA_OWNER_ANNOTATION);
        }
    }
}

/// What the holder wrote about itself with its claim, if the holder wrote it.
pub(super) fn metadata_of(lease: &LeaseObject) -> Option<&str> {
    let holder = holder_of(lease)?;
    let annotations = lease.metadata.annotations.as_ref()?;
    if annotations
        .get(HOLDER_METADATA_OWNER_ANNOTATION)
        .map(String::as_str)
        != Some(holder)
    {
        return None;
    }
    annotations
        .get(HOLDER_METADATA_ANNOTATION)
        .map(String::as_str)
}

/// `lease` without a holder, naming `preferred` as the next holder: in the annotations (which
/// every API server keeps) and, when `with_spec`, in `spec.preferredHolder` too (which only API
/// servers of Kubernetes 1.31 and later with coordinated leader election keep; the others drop
/// it).
pub(super) fn released_to(lease: LeaseObject, preferred: &str, with_spec: bool) -> LeaseObject {
    let mut lease = released(lease);
    let transitions = transitions_of(&lease);
    let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(PREFERRED_HOLDER_ANNOTATION.to_owned(), preferred.to_owned());
    annotations.insert(PREFERRED_AT_ANNOTATION.to_owned(), transitions.to_string());
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if with_spec {
        spec.preferred_holder = Some(preferred.to_owned());
        spec.strategy = Some(PREFERRED_STRATEGY.to_owned());
    } else {
        spec.preferred_holder = None;
        spec.strategy = None;
    }
    lease
}

/// Removes a preference this crate wrote (the annotations, and the spec fields written with
/// them); a strategy somebody else set without our annotations is left alone.
pub(super) fn clear_preference(lease: &mut LeaseObject) {
    let ours = lease.metadata.annotations.as_mut().is_some_and(|a| {
        let ours = a.remove(PREFERRED_HOLDER_ANNOTATION).is_some();
        a.remove(PREFERRED_AT_ANNOTATION);
        ours
    });
    if ours {
        if let Some(spec) = lease.spec.as_mut() {
            spec.preferred_holder = None;
            spec.strategy = None;
        }
    }
}

/// The preferred next holder a release named, while the object is free and still shows that
/// release's `leaseTransitions`.
pub(super) fn preferred_of(lease: &LeaseObject) -> Option<&str> {
    if holder_of(lease).is_some() {
        return None;
    }
    let annotations = lease.metadata.annotations.as_ref()?;
    let at = annotations.get(PREFERRED_AT_ANNOTATION)?;
    if at.parse::<i32>().ok()? != transitions_of(lease) {
        return None;
    }
    annotations
        .get(PREFERRED_HOLDER_ANNOTATION)
        .map(String::as_str)
        .filter(|p| !p.is_empty())
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

/// When `lease`'s writer says its claim ends: its `renewTime` (else `acquireTime`) plus its
/// duration, on the writer's wall clock (`None` without either time). A hint of liveness for
/// placement only ([`GroupRecord::stale_after`](crate::GroupRecord)).
pub(super) fn stale_after(lease: &LeaseObject) -> Option<std::time::SystemTime> {
    let spec = lease.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?;
    let renewed = std::time::SystemTime::from(renewed.0);
    renewed.checked_add(duration_of(lease))
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

    #[test]
    fn the_handed_shards_annotation_reads_back_what_was_written_grouped_by_target() {
        let to_b = Binding::new("g.member.b", "uid-b/3");
        let to_c = Binding::new("g.member.c", "uid-c/1");
        let mut handed = HandedShards::default();
        handed.add(
            "uid-a/2",
            &[
                crate::HandedShard::new("g.shard.0", "b", to_b.clone()),
                crate::HandedShard::new("g.shard.1", "c", to_c.clone()),
                crate::HandedShard::new("g.shard.2", "b", to_b.clone()),
            ],
        );
        handed.add_one("uid-a/1", "g.shard.9", "c", &to_c);
        let mut lease = object(None, Some(4));
        set_handed_shards(&mut lease, &handed);
        let written = &lease.metadata.annotations.as_ref().unwrap()[HANDED_SHARDS_ANNOTATION];
        let wire: serde_json::Value = serde_json::from_str(written).unwrap();
        assert_eq!(
            wire["uid-a/2"].as_array().unwrap().len(),
            2,
            "two targets: {wire}"
        );
        assert_eq!(handed_shards_of(&lease), Some(handed.clone()));
        assert_eq!(handed.target("uid-a/2", "g.shard.2"), Some(("b", &to_b)));
        assert_eq!(handed.target("uid-a/1", "g.shard.2"), None);
        // Entries pruned to none: the annotation goes.
        handed.retain(|_, _| false);
        set_handed_shards(&mut lease, &handed);
        assert_eq!(handed_shards_of(&lease), None);
        assert!(!lease
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(HANDED_SHARDS_ANNOTATION));
        // One that does not parse lists nothing.
        lease
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(HANDED_SHARDS_ANNOTATION.into(), "not json".into());
        assert_eq!(handed_shards_of(&lease), None);
    }
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
    fn a_leaving_mark_counts_only_for_the_tenure_that_wrote_it() {
        let mut lease = object(Some("a"), Some(4));
        lease.metadata.uid = Some("u".into());
        assert!(!leaving_of(&lease), "not marked");
        set_leaving(&mut lease);
        assert!(leaving_of(&lease), "marked for u/4");
        let mut next = lease.clone();
        next.spec.as_mut().unwrap().lease_transitions = Some(5);
        assert!(!leaving_of(&next), "a later tenure is not marked");
        let mut released = lease.clone();
        released.spec.as_mut().unwrap().holder_identity = None;
        assert!(!leaving_of(&released), "a released object is not marked");
        let mut free = object(None, Some(4));
        set_leaving(&mut free);
        assert!(
            free.metadata.annotations.is_none(),
            "nothing held, nothing marked"
        );
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
    fn a_preference_holds_while_the_object_is_free_at_the_release_s_transitions() {
        let held = object(Some("a"), Some(4));
        assert_eq!(preferred_of(&held), None);
        let free = released_to(held, "b", true);
        assert_eq!(holder_of(&free), None);
        assert_eq!(preferred_of(&free), Some("b"));
        assert_eq!(spec_of(&free).preferred_holder.as_deref(), Some("b"));
        assert_eq!(spec_of(&free).strategy.as_deref(), Some(PREFERRED_STRATEGY));
        // A client that knows nothing of preferences (client-go) claims and releases: the
        // annotations stay, the transitions move on, the preference is gone.
        let mut by_client_go = free.clone();
        let spec = by_client_go.spec.as_mut().unwrap();
        spec.holder_identity = Some("go".into());
        spec.lease_transitions = Some(5);
        assert_eq!(preferred_of(&by_client_go), None, "held");
        by_client_go.spec.as_mut().unwrap().holder_identity = Some(String::new());
        assert_eq!(preferred_of(&by_client_go), None, "released by client-go");
        // Without the spec fields (a server that refuses them).
        let annotations_only = released_to(object(Some("a"), Some(4)), "b", false);
        assert_eq!(preferred_of(&annotations_only), Some("b"));
        assert_eq!(spec_of(&annotations_only).preferred_holder, None);
        assert_eq!(spec_of(&annotations_only).strategy, None);
    }

    #[test]
    fn a_claim_clears_the_preference_it_wrote_and_nothing_else() {
        let backend = KubernetesBackend::with_client_for_tests("mine");
        let settings = LeaseSettings::new("mine", "b").unwrap();
        let free = released_to(object(Some("a"), Some(4)), "b", true);
        let claimed = backend.claimed(free, &settings).unwrap();
        assert_eq!(holder_of(&claimed), Some("b"));
        let annotations = claimed.metadata.annotations.as_ref().unwrap();
        assert!(!annotations.contains_key(PREFERRED_HOLDER_ANNOTATION));
        assert!(!annotations.contains_key(PREFERRED_AT_ANNOTATION));
        assert_eq!(spec_of(&claimed).preferred_holder, None);
        assert_eq!(spec_of(&claimed).strategy, None);
        // A strategy set by somebody else, without our annotations, stays.
        let mut theirs = object(None, Some(4));
        theirs.spec.as_mut().unwrap().strategy = Some("Theirs".into());
        let claimed = backend.claimed(theirs, &settings).unwrap();
        assert_eq!(spec_of(&claimed).strategy.as_deref(), Some("Theirs"));
    }

    #[test]
    fn a_bound_record_claimed_by_client_go_is_bound_no_more() {
        let mut bound = object(Some("a"), Some(4));
        let binding = Binding::new("g.member.a", "uid/1");
        bind(&mut bound, &binding);
        assert_eq!(binding_of(&bound), Some(binding));
        // client-go (before 1.27, which applies its own duration) takes the record over: its
        // holder and duration, our annotations kept.
        let mut by_client_go = bound.clone();
        let spec = by_client_go.spec.as_mut().unwrap();
        spec.holder_identity = Some("go".into());
        spec.lease_duration_seconds = Some(2);
        spec.lease_transitions = Some(5);
        assert_eq!(binding_of(&by_client_go), None);
        assert_eq!(duration_of(&by_client_go), Duration::from_secs(2));
        // Released: no binding either.
        assert_eq!(binding_of(&released(bound)), None);
    }

    fn spec_of(lease: &LeaseObject) -> &LeaseSpec {
        lease.spec.as_ref().unwrap()
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
