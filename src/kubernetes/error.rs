//! [`KubernetesError`], the one error type of the Kubernetes backend.

use std::path::PathBuf;

use crate::backend::BackendError;

/// The resource every request of the backend is about.
pub(crate) const LEASE_RESOURCE: &str = "leases.coordination.k8s.io";

/// Errors of the Kubernetes backend.
///
/// [`BackendError::is_transient`] tells `ManagedLease` whether trying again may help: unreachable
/// servers, timeouts, `5xx`, `429` and lost compare-and-swap races are transient; a refused
/// permission (`401`/`403`), a missing namespace or invalid settings are not, so `acquire` fails
/// at once with an error that says what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubernetesError {
    /// A setting is invalid.
    #[error("invalid kubernetes lease setting `{field}`: {reason}")]
    InvalidSettings {
        /// The setting, as spelled in a configuration file (`namespace`, `api-url`, ...).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The token or CA file could not be read.
    #[error("cannot read the `{field}` {path:?}")]
    ReadFile {
        /// The setting naming the file (`token-file`, `ca-file`).
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// An environment variable needed by [`KubernetesSettings::from_env`](super::KubernetesSettings::from_env)
    /// or [`KubernetesSettings::owner_from_env`](super::KubernetesSettings::owner_from_env) is not set.
    #[error("environment variable {variable} is not set{}", fallback.map(|f| format!(" and {f} is not readable")).unwrap_or_default())]
    MissingEnvironment {
        /// The variable.
        variable: &'static str,
        /// The file that was tried instead, if any.
        fallback: Option<&'static str>,
    },
    /// kube rejected the client configuration built from the settings (`api-url`, `ca-file`).
    #[error("invalid kubernetes client configuration (check `api-url` and `ca-file`)")]
    Config {
        /// kube's reason.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The kube client could not be built from the configuration (token file, TLS setup).
    #[error("cannot build the kubernetes client (check `token-file` and `ca-file`)")]
    BuildClient {
        /// kube's reason.
        #[source]
        source: kube::Error,
    },
    /// The thread that runs the connections of every [`KubernetesSession`](crate::KubernetesSession)
    /// could not be started.
    #[error("cannot start the thread of the kubernetes sessions: {reason}")]
    Runtime {
        /// Why.
        reason: String,
    },
    /// The API server refused the request for lack of permission (HTTP 403): RBAC does not grant
    /// `verb` on `resource` in `namespace` to the identity of the token.
    #[error("forbidden: RBAC does not allow `{verb}` on {resource} in namespace {namespace:?} (grant it with a Role, see deploy/rbac.yaml): {user_message}")]
    Forbidden {
        /// The verb refused (`get`, `create`, `update`, `watch`).
        verb: &'static str,
        /// The resource, `leases.coordination.k8s.io`.
        resource: &'static str,
        /// The namespace.
        namespace: String,
        /// The API server's message (it names the user).
        user_message: String,
    },
    /// The API server did not accept the credentials (HTTP 401): the token is wrong or expired.
    #[error("unauthorized: the API server rejected the token for `{verb}` on {resource} in namespace {namespace:?}: {user_message}")]
    Unauthorized {
        /// The verb of the request.
        verb: &'static str,
        /// The resource, `leases.coordination.k8s.io`.
        resource: &'static str,
        /// The namespace.
        namespace: String,
        /// The API server's message.
        user_message: String,
    },
    /// The API server answered with an error status the backend does not handle itself.
    #[error("`{verb}` of lease object {object:?} in namespace {namespace:?} failed with HTTP {code} {reason}: {message}")]
    Api {
        /// The verb of the request.
        verb: &'static str,
        /// The `Lease` object's name.
        object: String,
        /// The namespace.
        namespace: String,
        /// The HTTP status code.
        code: u16,
        /// The machine-readable reason (`NotFound`, `InternalError`, ...).
        reason: String,
        /// The API server's message.
        message: String,
    },
    /// The request did not get an answer: connection refused or reset, TLS or HTTP failure.
    #[error("`{verb}` of lease object {object:?} did not reach the API server")]
    Request {
        /// The verb of the request.
        verb: &'static str,
        /// The `Lease` object's name.
        object: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// The API server's answer or the client failed in a way a retry will not fix (an answer that
    /// does not decode, a request that cannot be built, failing authentication plugins).
    #[error("`{verb}` of lease object {object:?} failed in the client")]
    Client {
        /// The verb of the request.
        verb: &'static str,
        /// The `Lease` object's name.
        object: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// A request the backend bounds itself (opening or reading a watch, the read before it) got
    /// no answer in time: the API server or the network went away without closing the connection.
    #[error("`{verb}` of lease object {object:?} got no answer within {timeout:?}")]
    Timeout {
        /// The verb of the request.
        verb: &'static str,
        /// The `Lease` object's name.
        object: String,
        /// The bound in force.
        timeout: std::time::Duration,
    },
    /// Compare-and-swap writes kept losing against concurrent writers within one call.
    #[error(
        "lease object {object:?} changed under every one of {attempts} compare-and-swap attempts"
    )]
    Conflict {
        /// The `Lease` object's name.
        object: String,
        /// How many writes were tried.
        attempts: u32,
    },
    /// The object the lease name maps to belongs to another lease name (see
    /// [`object_name`](super::object_name)).
    #[error("lease object {object:?} belongs to the lease {owner_name:?}, not to {name:?}")]
    NameCollision {
        /// The lease name.
        name: String,
        /// The `Lease` object's name.
        object: String,
        /// The lease name in the object's annotation.
        owner_name: String,
    },
    /// The object holds something this backend cannot work with.
    #[error("lease object {object:?} is unusable: {reason}")]
    InvalidRecord {
        /// The `Lease` object's name.
        object: String,
        /// What is wrong.
        reason: String,
    },
}

impl BackendError for KubernetesError {
    fn is_transient(&self) -> bool {
        match self {
            KubernetesError::Api { code, .. } => *code >= 500 || *code == 429 || *code == 409,
            KubernetesError::Request { .. }
            | KubernetesError::Timeout { .. }
            | KubernetesError::Conflict { .. } => true,
            KubernetesError::InvalidSettings { .. }
            | KubernetesError::ReadFile { .. }
            | KubernetesError::MissingEnvironment { .. }
            | KubernetesError::Config { .. }
            | KubernetesError::BuildClient { .. }
            | KubernetesError::Runtime { .. }
            | KubernetesError::Client { .. }
            | KubernetesError::Forbidden { .. }
            | KubernetesError::Unauthorized { .. }
            | KubernetesError::NameCollision { .. }
            | KubernetesError::InvalidRecord { .. } => false,
        }
    }
}

impl KubernetesError {
    /// Classifies an error of a request with `verb` on lease object `object` in `namespace`.
    pub(crate) fn from_kube(
        error: kube::Error,
        verb: &'static str,
        object: &str,
        namespace: &str,
    ) -> Self {
        match error {
            kube::Error::Api(status) => match status.code {
                403 => KubernetesError::Forbidden {
                    verb,
                    resource: LEASE_RESOURCE,
                    namespace: namespace.to_owned(),
                    user_message: status.message,
                },
                401 => KubernetesError::Unauthorized {
                    verb,
                    resource: LEASE_RESOURCE,
                    namespace: namespace.to_owned(),
                    user_message: status.message,
                },
                code => KubernetesError::Api {
                    verb,
                    object: object.to_owned(),
                    namespace: namespace.to_owned(),
                    code,
                    reason: status.reason,
                    message: status.message,
                },
            },
            error @ (kube::Error::HyperError(_)
            | kube::Error::Service(_)
            | kube::Error::ReadEvents(_)
            | kube::Error::HttpError(_)) => KubernetesError::Request {
                verb,
                object: object.to_owned(),
                source: error,
            },
            other => KubernetesError::Client {
                verb,
                object: object.to_owned(),
                source: other,
            },
        }
    }

    /// The HTTP status code, when the API server answered with an error status.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            KubernetesError::Api { code, .. } => Some(*code),
            KubernetesError::Forbidden { .. } => Some(403),
            KubernetesError::Unauthorized { .. } => Some(401),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("the message", reason).with_code(code),
        ))
    }

    #[test]
    fn forbidden_names_verb_resource_and_namespace_and_is_permanent() {
        let err = KubernetesError::from_kube(api(403, "Forbidden"), "get", "obj", "ns");
        assert!(matches!(
            &err,
            KubernetesError::Forbidden { verb: "get", resource: LEASE_RESOURCE, namespace, .. } if namespace == "ns"
        ));
        let text = err.to_string();
        for part in ["get", LEASE_RESOURCE, "\"ns\"", "the message"] {
            assert!(text.contains(part), "{text}");
        }
        assert!(!err.is_transient());
        let err = KubernetesError::from_kube(api(401, "Unauthorized"), "update", "obj", "ns");
        assert!(matches!(
            err,
            KubernetesError::Unauthorized { verb: "update", .. }
        ));
        assert!(!err.is_transient());
    }

    #[test]
    fn server_trouble_is_transient_client_mistakes_are_not() {
        for (code, transient) in [
            (500, true),
            (503, true),
            (504, true),
            (429, true),
            (409, true),
            (404, false),
            (422, false),
            (400, false),
        ] {
            let err = KubernetesError::from_kube(api(code, "X"), "get", "obj", "ns");
            assert_eq!(err.is_transient(), transient, "{code}: {err}");
            assert_eq!(err.status_code(), Some(code));
        }
        let refused: Box<dyn std::error::Error + Send + Sync> =
            Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let err = KubernetesError::from_kube(kube::Error::Service(refused), "get", "obj", "ns");
        assert!(err.is_transient(), "no answer: {err}");
        assert_eq!(err.status_code(), None);
        let err = KubernetesError::from_kube(
            kube::Error::LinesCodecMaxLineLengthExceeded,
            "watch",
            "obj",
            "ns",
        );
        assert!(!err.is_transient(), "{err}");
    }
}
