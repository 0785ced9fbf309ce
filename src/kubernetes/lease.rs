//! [`KubernetesLease`]: the public entry point, whose docs teach the backend's semantics.

use kube::Client;

use super::{KubernetesBackend, KubernetesError, KubernetesSettings};
use crate::managed::ManagedLease;
use crate::settings::LeaseSettings;

#[cfg(doc)]
use super::KubernetesSession;

/// A lease stored in a Kubernetes `coordination.k8s.io/v1` `Lease` object (feature `kubernetes`).
///
/// The backend keeps one `Lease` object per lease name in one namespace, with the same
/// fields client-go's leader election uses, so `kubectl get lease` shows the holder and a lease
/// held by a client-go program is respected (and the other way round):
///
/// | field | written as |
/// |---|---|
/// | `spec.holderIdentity` | the owner; cleared (absent) after a release |
/// | `spec.acquireTime` | when the current tenure started |
/// | `spec.renewTime` | the last renewal (informational only, see below) |
/// | `spec.leaseDurationSeconds` | the TTL, rounded **up** to whole seconds |
/// | `spec.leaseTransitions` | +1 on every new tenure: the [fencing token](crate::FencingToken) |
/// | `metadata.annotations["actix-coordination/lease-name"]` | the original lease name |
/// | `metadata.annotations["actix-coordination/preferred-holder"]` | after a [`release_to`](crate::Lease::release_to): the preferred next holder; removed by the next claim |
/// | `metadata.annotations["actix-coordination/preferred-at-transitions"]` | the `leaseTransitions` of that release: the preference holds only while the free object still shows it |
/// | `metadata.annotations["actix-coordination/holder-metadata"]` | the holder's [`metadata`](crate::LeaseSettings::metadata), written with its claim, removed by a release |
/// | `metadata.annotations["actix-coordination/holder-metadata-owner"]` | the owner that wrote it: the metadata counts only while it names the holder |
/// | `spec.preferredHolder`, `spec.strategy` | the same preference (`OldestEmulationVersion`), where the API server keeps them |
/// | `metadata.annotations["actix-coordination/handed-over-by"]` | after a [`hand_over`](crate::Lease::hand_over): the owner that handed the object to its holder; removed by the holder's first renewal |
/// | `metadata.annotations["actix-coordination/handed-over-after"]` | `<object>/<resourceVersion>`: a version of an object held by the new holder that the handing owner had seen (see "Planned moves") |
///
/// ```text
/// $ kubectl get lease -n my-app
/// NAME        HOLDER      AGE
/// singleton   web-7f9c8   3h
/// ```
///
/// # Every claiming write is a compare-and-swap
///
/// Writes are `create` or `update` (a `PUT` carrying the `resourceVersion` the backend last read);
/// the API server rejects an update whose `resourceVersion` is stale with `409 Conflict`, so two
/// owners racing for a free or expired lease produce exactly one winner. One attempt to acquire:
///
/// 1. Take the object as the namespace watch last delivered it while that view is current (see
///    the next section), else `GET` it. Missing: `create` it (a `409 AlreadyExists` means someone
///    else was faster: read again and decide).
/// 2. Held by this owner (a previous attempt whose answer was lost): take it as a new tenure with
///    an update that bumps `leaseTransitions`.
/// 3. Held by another owner whose claim has not expired (see below): `false`.
/// 4. Expired, or no holder (released): update with the observed `resourceVersion`; a `409`
///    means someone else wrote first: read again and decide.
///
/// # Expiry that clock skew cannot break
///
/// `renewTime` is written by another machine's wall clock and is never compared with this one's.
/// Instead each backend remembers the `resourceVersion` it last saw and the local *monotonic*
/// instant it first saw it; another owner's claim counts as expired only when
/// `leaseDurationSeconds` have passed on the local clock since then. Every change of the object
/// (a renewal) restarts that clock. A contender therefore waits *at least* the TTL after the
/// holder's last renewal, which the holder itself counts from the *start* of that renewal, minus
/// its clock drift margin: the holder always gives the lease up locally first. The price: a
/// contender that first sees an abandoned lease waits a full TTL from then, even if the holder
/// died long ago. An object without a holder is free at once.
///
/// # Cost
///
/// A holder sends exactly one request per renewal interval: an update with the cached
/// `resourceVersion`, without reading first. On `409` it reads once to find out why: if the object
/// still shows this owner's tenure and the `renewTime` of an earlier renewal whose answer was lost,
/// that renewal landed and is adopted; otherwise the lease was lost (taken over, or
/// [deleted](crate::LostReason::Deleted) on `404`).
///
/// # One watch per namespace
///
/// All leases of a [`KubernetesSession`] in a namespace (so also all leases that
/// [`KubernetesLease::new`] built with equal settings) that wait for their object or hold it
/// share one watch on the namespace's `Lease` objects ([`kube::runtime::watcher()`], with its
/// backoff and relist), dispatched by object name. A lease's first attempt does not start it (it
/// reads the object): the watch's listing of the namespace would compete with the attempt's own
/// requests, which the operation timeout bounds. It reports a takeover or a deletion to a holder
/// without a request, and keeps a waiting contender's view current: while the watch is listed and
/// running, an attempt decides from what it delivered, without a read, so a waiting contender
/// sends no request at all, and a release wakes it within one round trip. The view may lag the store by the watch's delay; a claim on a
/// stale view fails its compare-and-swap, and expiry is still judged from when this process first
/// received a version. A watch response that ends early is re-opened no sooner than
/// [`KUBERNETES_WATCH_FLOOR`](crate::KUBERNETES_WATCH_FLOOR) after the previous one.
///
/// # Groups
///
/// [`watch_group`](crate::Lease::watch_group) serves a group of leases (every object whose
/// original lease name, the annotation
/// [`KUBERNETES_LEASE_NAME_ANNOTATION`](crate::KUBERNETES_LEASE_NAME_ANNOTATION) or the object
/// name for client-go's objects, starts with the prefix) from that same namespace watch, starting
/// it if none runs: no request of its own (`a_group_watch_adds_no_request` in
/// `tests/kubernetes_scale.rs`). For it the watch keeps a compact entry per object of the
/// namespace (lease name, version, holder, token, when this process first received the version,
/// not the object); a record's expiry is that instant plus its `leaseDurationSeconds`, as a
/// contender judges a claim. The watch runs while a group watch or a lease uses it; a group
/// watch whose namespace watch ended with its runtime ends
/// ([`GroupError::Ended`](crate::GroupError::Ended)).
///
/// # Releasing keeps the object
///
/// A release is a compare-and-swap that clears `holderIdentity`; the object stays, so
/// `leaseTransitions` never goes back. When that write meets a conflict, the release reads the
/// object once and clears it only if it still shows *this* tenure (this owner **and** the tenure's
/// `leaseTransitions`); a newer tenure, even one of the same owner identity started by another
/// instance, is left alone and the release resolves `false`.
///
/// **Never delete the object of a lease whose tokens fence anything**: a deleted object is
/// created anew with `leaseTransitions: 1`, so fencing tokens restart and a stale holder's writes
/// could be accepted again by a system that remembers the old, higher tokens. The crate deletes an
/// object only when asked to give a lease up for good ([`retire`](crate::Lease::retire)): the
/// member lease of a sharded node and the candidacy lease of a singleton manager, at shutdown,
/// whose tokens fence nothing and whose names (the node's identity) may never be claimed again.
/// The Role in `deploy/rbac.yaml` grants `delete` for that; without it those objects stay,
/// released.
///
/// # Planned moves: one write
///
/// [`hand_over`](crate::Lease::hand_over) is one compare-and-swap: the object names the target
/// as its holder, with the next `leaseTransitions`, and the newest version of an object held by
/// the target that this session's namespace watch had received. Contenders judge that record
/// like any other, from when they saw it, so the target must end its tenure no later than one
/// TTL after the record was *written*, which it can only know from a moment of its own clock
/// before the write: the send time of its own write of the version the record names (each session
/// remembers when it sent its two latest writes of each object). A target that has it takes the
/// object up without a request; one that has not (another session, a restarted process, a
/// version it no longer remembers, a record shorter than its TTL, or holder metadata to write)
/// claims it with a compare-and-swap. Either way nobody else can claim it until it expires. The
/// holder's first renewal removes the annotations; client-go sees a record held by the target.
///
/// # Names
///
/// Object names must be DNS-1123 subdomains (at most 253 of `a-z0-9-.`). A lease name that is
/// one is used as is; any other is mapped to a readable sanitized prefix plus 16 hex digits of the
/// SHA-256 of the full name (`Jobs/Leader` → `jobs-leader-<hash>`), so different lease names
/// never share an object. See [`kubernetes_object_name`](crate::kubernetes_object_name).
///
/// # Permissions
///
/// The identity needs `get`, `list`, `watch`, `create` and `update` on
/// `leases.coordination.k8s.io` in the namespace (`deploy/rbac.yaml`). A refusal makes `acquire`
/// fail at once with [`KubernetesError::Forbidden`], which names the verb, the resource and the
/// namespace; an unreachable API server makes it fail with a transient error, never resolve `false`.
///
/// # In a cluster
///
/// The defaults of [`KubernetesSettings`] are what Kubernetes gives every pod (the API server at
/// `https://kubernetes.default.svc`, the mounted service account token, re-read when the kubelet
/// rotates it, and CA bundle). Pass the pod name as the owner and the namespace with the downward
/// API, and use [`KubernetesSettings::from_env`] and [`KubernetesSettings::owner_from_env`]:
///
/// ```yaml
/// env:
///   - name: POD_NAME
///     valueFrom: { fieldRef: { fieldPath: metadata.name } }
///   - name: POD_NAMESPACE
///     valueFrom: { fieldRef: { fieldPath: metadata.namespace } }
/// ```
///
/// ```no_run
/// use actix_coordination::{KubernetesLease, KubernetesSettings, Lease, LeaseSettings};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let settings = LeaseSettings::new("singleton", KubernetesSettings::owner_from_env()?)?;
/// let lease = KubernetesLease::new(settings, KubernetesSettings::from_env()?)?;
/// if lease.acquire().await? {
///     // leader-only work, passing lease.fencing_token() along
/// }
/// # Ok(()) }
/// ```
///
/// Outside a cluster, build a [`kube::Client`] from a kubeconfig and use
/// [`KubernetesLease::with_client`].
///
/// # Many leases: one session
///
/// Leases of one [`KubernetesSession`] share its kube client, and with it one HTTP/2 connection
/// to the API server, one token and CA re-reading, and one watch per namespace. Which session a
/// lease uses:
///
/// * [`KubernetesLease::new`]: the process's **shared** session for its [`KubernetesSettings`]
///   ([`KubernetesSession::shared`]). Leases built with equal settings (every field: namespace,
///   API URL, token or token file, CA file) share it, for as long as one of them lives: the
///   process holds it weakly, it ends (its connection closed, its watches stopped) with the last
///   lease that uses it, and a later `new` builds a fresh one. 200 leases built this way keep at
///   most 2 connections and cost the heap of the session path
///   (`two_hundred_plain_leases_share_one_session` in `tests/kubernetes_scale.rs`). The
///   [`LeaseProvider`](crate::LeaseProvider) uses the same shared sessions.
/// * [`KubernetesLease::with_session`] or [`KubernetesSession::lease`]: a session you built
///   yourself with [`KubernetesSession::new`] (never shared with `new`'s leases), to choose which
///   leases share a connection.
/// * [`KubernetesLease::with_client`]: the client you pass, with a namespace watch of its own;
///   [`KubernetesSession::from_client`] shares one client's watch among the leases built from it.
///
/// Sharing changes only what the leases send their requests through: each lease keeps its own
/// tenure, fencing token and observed-time expiry clock, and every claim is still its own
/// compare-and-swap. See [`KubernetesSession`] for the connection count and its limits.
///
/// # Runtime
///
/// The connections of a session (or of [`KubernetesLease::new`]'s own one) run on a thread of
/// their own, not on the runtime of the caller. A client passed to
/// [`KubernetesLease::with_client`] runs on the runtime it was built on: use such a lease from a
/// runtime that outlives it (with actix, the system's). The namespace watch of such a lease runs
/// on the runtime that first used the lease; if that runtime shuts down, the lease no longer
/// decides from what the watch delivered (a view is current only while its watch runs): its next
/// attempt reads the object and starts a new watch on the runtime it runs on
/// (`a_with_client_watch_whose_runtime_stopped_is_not_trusted` in `tests/kubernetes.rs`).
pub type KubernetesLease = ManagedLease<KubernetesBackend>;

impl ManagedLease<KubernetesBackend> {
    /// A lease with `settings` on the API server described by `k8s`, on the process's shared
    /// session for `k8s` ([`KubernetesSession::shared`]): every lease built with equal `k8s`
    /// while one of them lives shares one client, one connection and one namespace watch, so a
    /// process may build hundreds of leases this way (see "Many leases: one session" above).
    ///
    /// When no live session has these settings, the settings are validated and the token and CA
    /// files read now, and a session is built; nothing is sent to the API server before the
    /// first `acquire`.
    ///
    /// # Errors
    ///
    /// See [`KubernetesSession::shared`].
    pub fn new(settings: LeaseSettings, k8s: KubernetesSettings) -> Result<Self, KubernetesError> {
        let backend = KubernetesBackend::new(settings.name(), &k8s)?;
        Ok(ManagedLease::from_backend(settings, backend))
    }

    /// A lease with `settings` using a ready `client` (for example built from a kubeconfig), with
    /// its objects in `namespace`.
    ///
    /// Such a lease has a namespace watch of its own: a [`kube::Client`] has no identity to
    /// share by (clones of one client cannot be told from clients of other servers or
    /// credentials). For many leases on one client, build one
    /// [`KubernetesSession::from_client`] and the leases from it: they share one watch per
    /// namespace.
    ///
    /// # Errors
    ///
    /// [`KubernetesError::InvalidSettings`] when `namespace` is not a valid namespace name.
    pub fn with_client(
        settings: LeaseSettings,
        client: Client,
        namespace: impl Into<String>,
    ) -> Result<Self, KubernetesError> {
        let backend = KubernetesBackend::with_client(settings.name(), client, namespace)?;
        Ok(ManagedLease::from_backend(settings, backend))
    }
}
