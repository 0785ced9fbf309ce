//! The Kubernetes backend: leases stored as `coordination.k8s.io/v1` `Lease` objects (feature
//! `kubernetes`). Everything about its semantics is documented on [`KubernetesLease`].
//!
//! The files, by job:
//!
//! * `lease.rs`: [`KubernetesLease`] and its constructors; its docs teach the semantics.
//! * `backend.rs`: [`KubernetesBackend`], the [`LeaseBackend`](crate::LeaseBackend) of one lease:
//!   its requests and compare-and-swap rounds.
//! * `record.rs`: the `Lease` object as written and read (holder, fencing token, duration).
//! * `handover.rs`: a planned move in one write (the target takes the handed object up).
//! * `indexed.rs`: a bound claim decided from the namespace watch, with no read.
//! * `observed.rs`: what a backend knows of its object, and the observed-time expiry clock.
//! * `watch.rs`: one namespace watch shared by the leases of a client.
//! * `group.rs`: the namespace watch's index of every object, and the group watches served
//!   from it ([`LeaseBackend::watch_group`](crate::LeaseBackend::watch_group)).
//! * `session.rs`: [`KubernetesSession`], one client per API server and credentials.
//! * `client.rs`: the HTTP stack of a session (HTTP/2, `TCP_NODELAY`, its own runtime).
//! * `settings.rs`, `name.rs`, `error.rs`: settings, object names, errors.
//! * `provider.rs`: the backend of the [`LeaseProvider`](crate::LeaseProvider).

mod backend;
mod bound;
mod client;
mod error;
mod group;
mod handing;
mod handover;
mod indexed;
mod lease;
mod name;
mod observed;
mod provider;
mod record;
mod retire;
mod session;
mod settings;
mod watch;

pub use backend::{KubernetesBackend, KubernetesStats, KubernetesTenure};
pub use client::kubernetes_client;
pub use error::KubernetesError;
pub use lease::KubernetesLease;
pub use name::{is_valid_object_name, object_name, LEASE_NAME_ANNOTATION};
pub use provider::provider_factory;
pub use record::{
    BOUND_DURATION_SECS, BOUND_INCARNATION_ANNOTATION, BOUND_TO_ANNOTATION,
    HANDED_OVER_AFTER_ANNOTATION, HANDED_OVER_BY_ANNOTATION, HANDED_SHARDS_ANNOTATION,
    HOLDER_METADATA_ANNOTATION, HOLDER_METADATA_OWNER_ANNOTATION, LEAVING_ANNOTATION,
    PREFERRED_AT_ANNOTATION, PREFERRED_HOLDER_ANNOTATION,
};
pub use session::{KubernetesSession, KubernetesSessionStats};
pub use settings::KubernetesSettings;
pub use watch::{KubernetesWatchStats, WATCH_FLOOR};

/// The name of the Kubernetes backend in a [`CoordinationConfig`](crate::CoordinationConfig).
pub const KUBERNETES_BACKEND: &str = "kubernetes";
