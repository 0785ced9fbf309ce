//! The etcd v3 backend (cargo feature `etcd`): [`EtcdLease`] on an [`EtcdSession`].
//!
//! The semantics, key layout and races are documented on [`EtcdLease`], the public entry point.

mod backend;
mod batch;
mod claims;
mod group;
mod session;
mod settings;
mod value;
mod watch;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

pub use backend::{EtcdBackend, EtcdTenure};
pub use session::EtcdSession;
pub use settings::{
    EtcdConfig, EtcdSettings, EtcdSettingsBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX,
};

use crate::backend::BackendError;
use crate::lease::{BoxError, FencingToken};
use crate::managed::ManagedLease;
use crate::settings::LeaseSettings;
use crate::shared::SharedLease;

/// The name of the etcd backend in configuration (`backend = "etcd"`).
pub const ETCD_BACKEND: &str = "etcd";

/// The verbs of the requests to etcd and their outcomes, for the `backend_requests` metric.
pub(crate) const ETCD_REQUESTS: crate::metrics::BackendRequests = &[
    ("range", &["ok", "error"]),
    ("txn", &["ok", "conflict", "error"]),
    ("lease_grant", &["ok", "error"]),
    ("lease_keep_alive", &["ok", "not_found", "error"]),
];

/// Counts one request to etcd in the `backend_requests` metric (`ok` or `error`).
pub(crate) fn observe<T>(
    verb: &'static str,
    result: Result<T, etcd_client::Error>,
) -> Result<T, etcd_client::Error> {
    let outcome = if result.is_ok() { "ok" } else { "error" };
    crate::metrics::backend_request(ETCD_BACKEND, verb, outcome);
    result
}

/// The fencing token of a tenure whose claim wrote the key at `revision` (its `mod_revision`).
pub(crate) fn token_of(revision: i64) -> FencingToken {
    FencingToken::new(revision.unsigned_abs())
}

/// Counts one transaction: `conflict` when its compare failed (a compare-and-swap refused).
pub(crate) fn observe_txn(
    result: Result<etcd_client::TxnResponse, etcd_client::Error>,
) -> Result<etcd_client::TxnResponse, etcd_client::Error> {
    let outcome = match &result {
        Ok(response) if response.succeeded() => "ok",
        Ok(_) => "conflict",
        Err(_) => "error",
    };
    crate::metrics::backend_request(ETCD_BACKEND, "txn", outcome);
    result
}

/// A lease stored in etcd (cargo feature `etcd`), on an [`EtcdSession`].
///
/// # Key layout
///
/// Lease `name` is the etcd key `<prefix><name>` ([`EtcdSettings::prefix`], default
/// `/actix-coordination/leases/`); etcd keys are arbitrary bytes, so names are used as they are.
/// While held, the key's value is the holder's owner string (UTF-8) and the key is attached to an
/// etcd lease of the holding process, so it disappears when that process stops renewing. A free
/// lease has no key. `etcdctl get --prefix /actix-coordination/leases/ -w json` shows who holds
/// what; deleting a key takes the lease away from its holder (it is told through `on_lost`).
///
/// # Acquire
///
/// One transaction claims the key only if it does not exist (`create_revision == 0`) and puts
/// `value = owner` with the process's etcd lease attached; otherwise it reads the key. A key that
/// holds our own owner string (an earlier claim whose answer was lost, or the tenure before a
/// release that failed) is claimed again by a second transaction guarded on its `mod_revision`; any
/// other value means another owner holds it. Every claiming write is therefore a compare-and-swap,
/// and two racing owners produce one winner.
///
/// A session that has no usable etcd lease for the TTL yet **reads the key first**: a contender
/// that finds the lease held asks etcd for nothing else (no etcd lease is granted for it; waiting
/// contenders never grant, [`EtcdSession::grants_requested`] counts grants). Grant requests are
/// sent outside the session's locks, one per TTL at a time.
///
/// ## Claims whose answer never arrives
///
/// A claim can land in etcd while its answer is lost (the operation timeout, a broken
/// connection, an acquire whose caller gave up). Such a key would block the lease for as long as
/// the session keeps its shared etcd lease alive for *other* leases. So a guard exists before
/// every claim is sent: when no answer arrives, the key is removed by a compare-and-swap delete
/// (value = this owner, etcd lease = this session's, and no tenure of this lease uses it) at once,
/// again one TTL after the claim was sent, and then once per TTL for as long as the etcd lease the
/// claim names lives (a claim held up on its way can land at any time before that etcd lease is
/// gone), retried with a backoff until it succeeds or the compare fails. `release()` after such an acquire removes the claim before it answers
/// `Ok(true)`. A dropped (unreleased) tenure's key is removed the same way one TTL after the drop.
/// [`EtcdBackend::claims_removed`], [`EtcdBackend::claim_removals_failed`] and
/// [`EtcdBackend::unanswered_claims`] count what happens.
///
/// # Fencing tokens
///
/// The token of a tenure is the etcd revision of its claiming write. Revisions are global to the
/// etcd cluster and strictly increase with every write, so tokens strictly increase across owners,
/// lease names and restarts of etcd (revisions are persisted).
///
/// # Renewal: one etcd lease and one keep-alive stream per TTL
///
/// A process may hold thousands of leases. All leases of an [`EtcdSession`] with the same TTL
/// (rounded up to whole seconds, which is what etcd counts in) share **one** etcd lease and **one**
/// keep-alive stream, like etcd's own `concurrency.Session`. The session sends **one keep-alive per
/// renewal interval** for them, on its own clock (one interval after the previous keep-alive was
/// sent). A renewal does no I/O of its own: it relies on the latest successful keep-alive, or waits
/// for the one in flight or due, and reports the instant that keep-alive was **sent**; the lease
/// then plans its next renewal one interval after that instant, which is when the next keep-alive
/// is due ([`ManagedLease`](crate::ManagedLease) renews one interval after the instant its deadline
/// counts from). Every lease of the session thus renews on the session's keep-alive clock, and
/// etcd receives one keep-alive per renewal interval per TTL, whatever the number of leases and
/// however late the runtime that runs their renewals is (`tests/etcd_keepalive.rs` counts them on
/// etcd's own `/metrics` for 200 leases, also with a busy runtime; `benches/scale.rs` for 1,000 and
/// 10,000; [`EtcdSession::keep_alives_sent`] counts what the session sent). etcd extends the lease
/// when it *receives* the request, so the holder's deadline (`sent + ttl - margin`, see
/// [`ManagedLease`](crate::ManagedLease)) passes before etcd can expire the key.
///
/// * A keep-alive that fails or stays unanswered does not extend anything; once the deadline
///   passes every lease on that etcd lease is lost ([`LostReason::Expired`](crate::LostReason),
///   naming the keep-alive error).
/// * A keep-alive answered with TTL 0 means the etcd lease is gone (expired, or revoked by
///   someone): every lease on it is lost at once.
/// * The key of every held lease is watched, over one multiplexed watch stream per session: a
///   deletion or a write by anyone else fires `on_lost` at once, without waiting for the deadline.
/// * **A renewal proves ownership.** Keep-alives prove that the process's etcd lease lives, not
///   that the key is still this tenure's. A renewal counts on the keep-alive alone only while the
///   tenure's watch is established (created from the claim's revision, so it has seen every change
///   since the claim) and unbroken; otherwise the renewal also reads the key in the same round and
///   reports the loss if its `mod_revision` is not the tenure's. Cost per renewal: nothing of its
///   own while the watch works (the common case: about one keep-alive per process per renewal
///   interval), one read per lease while it does not ([`EtcdBackend::verified_renewals`] counts
///   them).
/// * A contender that finds the lease held waits for the key's deletion on that same watch stream
///   instead of polling, and tries again at once when it sees it.
///
/// Releasing deletes the key if it is still ours (compare on its `mod_revision`); the shared etcd
/// lease is revoked once no lease of the session uses it any more. Dropping an [`EtcdLease`]
/// without releasing it behaves like a crash: its key stays until its TTL has passed, even though
/// the shared etcd lease keeps being renewed for the other leases (the session then deletes the
/// key, still with a compare-and-swap, `ttl` after the drop).
///
/// # Writes sent together
///
/// A claim of a free key and a handover ([`Lease::hand_over`](crate::Lease::hand_over)) that a
/// session's leases send at about the same time are written together: one transaction of up to
/// 128 keys (etcd's default `--max-txn-ops`), each key with its own compare (absent for a
/// claim, its tenure's revision for a handover) and its own put, all landing at one revision or
/// none. A node leaving with its shards hands them all on in a few transactions, and a node
/// claiming what a crashed node held claims them in a few, not one per key. A flush waits for
/// more writes while they keep coming (1 ms without one, 5 ms at most), so a write on its own
/// costs about a millisecond more. When one key's compare fails, that key's caller learns what
/// the key is from the batch's own read (a claim then answers `false` with no request of its
/// own), and the others go on in the next batch. [`EtcdSession::write_batches_sent`] counts the
/// transactions.
///
/// # Group watches
///
/// [`Lease::watch_group`](crate::Lease::watch_group) with prefix `g` (see
/// [`GroupWatch`](crate::GroupWatch)) watches every key starting with `<prefix>g`: **one range**
/// lists them and **one watch** on the key prefix follows them from the range's revision on (so
/// nothing written in between is missed), on the session's multiplexed watch stream. Nothing is
/// sent per record or per interval afterwards (`tests/etcd_keepalive.rs` counts the requests on
/// etcd's own `/metrics` for a group of 50 held leases). Every group watch of the same prefix on
/// the session shares that watch; the last one dropped cancels it. It runs on the session's own
/// thread, so it needs no runtime of the caller's.
///
/// A record is the key as the lease writes it: the holder is the key's value, the fencing token
/// its `mod_revision`, and a released lease has no key, hence no record. Records state no expiry
/// ([`GroupRecord::expires_at`](crate::GroupRecord) is `None`): the key of a holder that stops
/// renewing is deleted by etcd with the holder's etcd lease, and the record goes with it (the
/// TTL, rounded up to whole seconds, after the holder's last keep-alive, plus up to 500 ms of
/// etcd's expiry check). A lease dropped without a release in a process that keeps running keeps
/// its record until the session deletes its key one TTL later (see below). When the watch breaks
/// or its history was compacted, the snapshot keeps its records marked not synced until the group
/// is listed and watched again (after a pause of 100 ms doubling to 2 s while etcd fails).
///
/// # Races and limits
///
/// * etcd counts TTLs in whole seconds and enforces a minimum (about 2 s with default election
///   settings). A TTL of 2.5 s is granted as 3 s: contenders may wait up to that much longer, the
///   holder still gives the lease up after its own 2.5 s.
/// * While the watch stream is broken, a write by someone else is found by the next renewal (at
///   most one renewal interval later, see above) or by the watch when it is back (it resumes from
///   the claim's revision and replays what it missed; if that history was compacted, the key
///   itself is read).
/// * The session's connections and background tasks (keep-alives, the watch stream, removals of
///   claims) run on the session's own thread ([`EtcdSession`]), not on the runtime or actix
///   arbiter that used it first.
/// * **What etcd itself can do against the guarantee.** (1) Restoring a backup moves the store's
///   revisions back: fencing tokens handed out after the backup can be handed out again, and keys
///   of old tenures reappear (held until their TTL). Restore with etcd's options that move the
///   revision forward and mark it compacted (`etcdutl snapshot restore --bump-revision ...
///   --mark-compacted`, in recent releases), or make the resources you fence remember the highest
///   token seen and start the new cluster above it. (2) An old leader stuck on a slow disk or
///   CPU can revoke etcd leases early, before their TTL, when leadership changes
///   ([etcd-io/etcd#15247](https://github.com/etcd-io/etcd/issues/15247); fixed in later 3.4
///   and 3.5 releases, "ignore old leader's lease revoking requests"): the key disappears before
///   the holder's deadline, its watch reports the loss at once, but a contender may claim a few
///   milliseconds before the holder hears of it. Run an etcd release with the fix, and fence side
///   effects with the token. (3) etcd extends every lease by its TTL on a leader change; that only
///   delays contenders.
/// * Only `http://` endpoints are supported (no TLS in this build); etcd 3.4 or newer is required
///   (client-chosen watch ids).
///
/// ```no_run
/// use std::time::Duration;
/// use actix_coordination::{EtcdLease, EtcdSession, EtcdSettings, Lease, LeaseSettings};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let session = EtcdSession::connect(EtcdSettings::builder(["http://127.0.0.1:2379"]).build()?).await?;
/// let settings = LeaseSettings::builder("billing-singleton", "node-1")
///     .ttl(Duration::from_secs(15))
///     .build()?;
/// let lease = EtcdLease::new(settings, &session);
/// if lease.acquire().await? {
///     let token = lease.fencing_token().expect("held");
///     // ... leader-only work, passing `token` along ...
///     # let _ = token;
///     lease.release().await?;
/// }
/// # Ok(()) }
/// ```
pub type EtcdLease = ManagedLease<EtcdBackend>;

impl ManagedLease<EtcdBackend> {
    /// A lease with `settings` in the etcd cluster of `session`. Nothing is sent until `acquire`.
    pub fn new(settings: LeaseSettings, session: &EtcdSession) -> Self {
        let backend = EtcdBackend::new(session, settings.name());
        ManagedLease::from_backend(settings, backend)
    }
}

/// Errors of the etcd backend.
///
/// [`BackendError::is_transient`] is `true` for what a retry may fix (unreachable cluster,
/// timeouts, a lost etcd lease, a race) and `false` for authentication, permission and invalid
/// requests or settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// A setting of the backend is invalid.
    #[error("invalid etcd setting `{field}`: {reason}")]
    InvalidSettings {
        /// The setting at fault, as written in configuration.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// etcd could not be reached or failed to answer (connection refused or reset, no leader,
    /// server overloaded).
    #[error("etcd unavailable during {operation}")]
    Unavailable {
        /// What the backend was doing.
        operation: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// etcd rejected the credentials (or the request carried none while auth is enabled).
    #[error("etcd authentication failed during {operation}")]
    Unauthenticated {
        /// What the backend was doing.
        operation: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// The etcd user lacks a permission on the lease keys (it needs read and write on the prefix).
    #[error("etcd permission denied during {operation}")]
    PermissionDenied {
        /// What the backend was doing.
        operation: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// etcd refused the request as invalid (or the endpoint configuration is unusable).
    #[error("etcd rejected the request during {operation}")]
    Rejected {
        /// What the backend was doing.
        operation: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// A step the backend bounds itself (connecting, opening a stream) took too long.
    #[error("etcd {operation} timed out after {timeout:?}")]
    Timeout {
        /// What timed out.
        operation: &'static str,
        /// The bound in force.
        timeout: Duration,
    },
    /// The shared etcd lease does not exist any more (it expired or was revoked).
    #[error("etcd lease {lease_id:x} not found (expired or revoked)")]
    LeaseNotFound {
        /// The etcd lease id.
        lease_id: i64,
    },
    /// The latest keep-alive of the shared etcd lease failed; the holder cannot extend its
    /// deadline until one succeeds.
    #[error("keep-alive of etcd lease {lease_id:x} failing: {message}")]
    KeepAliveFailing {
        /// The etcd lease id.
        lease_id: i64,
        /// The error of the latest attempt.
        message: String,
    },
    /// The shared watch stream broke or refused the watch; it is re-established.
    #[error("etcd watch failed: {message}")]
    Watch {
        /// What happened.
        message: String,
    },
    /// The key changed under every compare-and-swap attempt in a row.
    #[error("the etcd key {key:?} kept changing during the claim")]
    Conflict {
        /// The lease key (lossy UTF-8).
        key: String,
    },
    /// The session's own thread (which runs its connections) is not running: it could not be
    /// started, or it stopped.
    #[error("the etcd session's thread is not running: {message}")]
    SessionStopped {
        /// What happened.
        message: String,
    },
    /// etcd answered something the backend cannot interpret.
    #[error("unexpected etcd response to {operation}: {detail}")]
    UnexpectedResponse {
        /// What the backend was doing.
        operation: &'static str,
        /// What was wrong with it.
        detail: String,
    },
}

/// gRPC status codes (see `tonic::Code`), as numbers so that no gRPC crate is needed here.
mod grpc_code {
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const NOT_FOUND: i32 = 5;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNIMPLEMENTED: i32 = 12;
    pub const UNAUTHENTICATED: i32 = 16;
}

/// What a gRPC status from etcd means for the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusClass {
    Unauthenticated,
    PermissionDenied,
    Rejected,
    LeaseNotFound,
    Unavailable,
}

fn classify_status(code: i32, message: &str) -> StatusClass {
    match code {
        grpc_code::UNAUTHENTICATED => StatusClass::Unauthenticated,
        // etcd answers a wrong user or password with InvalidArgument.
        grpc_code::INVALID_ARGUMENT if message.contains("authentication failed") => {
            StatusClass::Unauthenticated
        }
        grpc_code::PERMISSION_DENIED => StatusClass::PermissionDenied,
        grpc_code::INVALID_ARGUMENT
        | grpc_code::FAILED_PRECONDITION
        | grpc_code::OUT_OF_RANGE
        | grpc_code::UNIMPLEMENTED => StatusClass::Rejected,
        grpc_code::NOT_FOUND if message.contains("lease not found") => StatusClass::LeaseNotFound,
        _ => StatusClass::Unavailable,
    }
}

impl EtcdError {
    /// Classifies an error of the etcd client by what a retry can do about it; `lease_id` is the
    /// etcd lease the request used, if any.
    pub(crate) fn from_client(
        operation: &'static str,
        lease_id: i64,
        source: etcd_client::Error,
    ) -> Self {
        use etcd_client::Error as E;
        let class = match &source {
            E::GRpcStatus(status) => classify_status(status.code() as i32, status.message()),
            E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) | E::Utf8Error(_) => {
                StatusClass::Rejected
            }
            _ => StatusClass::Unavailable,
        };
        match class {
            StatusClass::Unauthenticated => EtcdError::Unauthenticated { operation, source },
            StatusClass::PermissionDenied => EtcdError::PermissionDenied { operation, source },
            StatusClass::Rejected => EtcdError::Rejected { operation, source },
            StatusClass::LeaseNotFound => EtcdError::LeaseNotFound { lease_id },
            StatusClass::Unavailable => EtcdError::Unavailable { operation, source },
        }
    }
}

impl BackendError for EtcdError {
    fn is_transient(&self) -> bool {
        match self {
            EtcdError::Unavailable { .. }
            | EtcdError::Timeout { .. }
            | EtcdError::LeaseNotFound { .. }
            | EtcdError::KeepAliveFailing { .. }
            | EtcdError::Watch { .. }
            | EtcdError::Conflict { .. }
            | EtcdError::UnexpectedResponse { .. } => true,
            EtcdError::InvalidSettings { .. }
            | EtcdError::Unauthenticated { .. }
            | EtcdError::PermissionDenied { .. }
            | EtcdError::Rejected { .. }
            | EtcdError::SessionStopped { .. } => false,
        }
    }
}

/// The factory the [`LeaseProvider`](crate::LeaseProvider) registers as [`ETCD_BACKEND`]: a
/// closure, which is a [`BackendFactory`](crate::BackendFactory).
///
/// The lease configuration must have an `etcd` section ([`EtcdConfig`]). Leases whose sections are
/// equal share one lazily connected [`EtcdSession`] (one connection, one keep-alive per TTL, one
/// watch stream).
///
/// ```
/// use actix_coordination::{CoordinationConfig, Lease, LeaseProvider};
///
/// let config: CoordinationConfig = serde_json::from_str(r#"{ "leases": { "jobs": {
///     "backend": "etcd", "ttl": "15s",
///     "etcd": { "endpoints": ["http://127.0.0.1:2379"], "prefix": "/my-app/leases/" }
/// } } }"#)?;
/// let provider = LeaseProvider::new(config);
/// let lease = provider.get_lease("billing", "jobs", "node-1")?; // connects on first use
/// assert_eq!(lease.name(), "billing");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn provider_factory(
) -> impl Fn(LeaseSettings, Option<&serde_json::Value>) -> Result<SharedLease, BoxError>
       + Send
       + Sync
       + 'static {
    let sessions: Mutex<HashMap<EtcdSettings, EtcdSession>> = Mutex::new(HashMap::new());
    move |settings: LeaseSettings,
          section: Option<&serde_json::Value>|
          -> Result<SharedLease, BoxError> {
        let section = section.ok_or(EtcdError::InvalidSettings {
            field: "etcd",
            reason: "the etcd backend needs an `etcd` section with at least `endpoints`".into(),
        })?;
        let etcd = EtcdSettings::from_section(section)?;
        let session = sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(etcd)
            .or_insert_with_key(|etcd| EtcdSession::new(etcd.clone()))
            .clone();
        Ok(SharedLease::new(EtcdLease::new(settings, &session)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_statuses_are_classified_by_what_a_retry_can_do() {
        assert_eq!(
            classify_status(14, "etcdserver: no leader"),
            StatusClass::Unavailable
        );
        assert_eq!(
            classify_status(4, "deadline exceeded"),
            StatusClass::Unavailable
        );
        assert_eq!(
            classify_status(16, "etcdserver: invalid auth token"),
            StatusClass::Unauthenticated
        );
        assert_eq!(
            classify_status(7, "etcdserver: permission denied"),
            StatusClass::PermissionDenied
        );
        assert_eq!(
            classify_status(3, "etcdserver: key is not provided"),
            StatusClass::Rejected
        );
        assert_eq!(
            classify_status(
                3,
                "etcdserver: authentication failed, invalid user ID or password"
            ),
            StatusClass::Unauthenticated
        );
        assert_eq!(
            classify_status(5, "etcdserver: requested lease not found"),
            StatusClass::LeaseNotFound
        );
        assert_eq!(
            classify_status(5, "something else"),
            StatusClass::Unavailable
        );
    }

    #[test]
    fn client_errors_map_to_transient_or_not() {
        let e = EtcdError::from_client("t", 7, etcd_client::Error::InvalidArgs("x".into()));
        assert!(matches!(e, EtcdError::Rejected { .. }) && !e.is_transient());
        let e = EtcdError::from_client("t", 7, etcd_client::Error::WatchError("closed".into()));
        assert!(matches!(e, EtcdError::Unavailable { .. }) && e.is_transient());
        assert!(EtcdError::LeaseNotFound { lease_id: 7 }.is_transient());
        assert!(EtcdError::Timeout {
            operation: "connect",
            timeout: Duration::from_secs(1)
        }
        .is_transient());
        let e = EtcdError::InvalidSettings {
            field: "endpoints",
            reason: "x".into(),
        };
        assert!(!e.is_transient());
    }
}
