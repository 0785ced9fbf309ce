//! [`KubernetesSettings`]: where the API server is and how to authenticate to it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use serde::Deserialize;

use super::error::KubernetesError;
use crate::redact;

/// The API server of a pod's own cluster.
pub(crate) const DEFAULT_API_URL: &str = "https://kubernetes.default.svc";
/// Where Kubernetes mounts a pod's service account token (rotated in place by the kubelet).
pub(crate) const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// Where Kubernetes mounts the cluster's CA bundle.
pub(crate) const DEFAULT_CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
/// Where Kubernetes mounts the namespace of a pod's service account.
pub(crate) const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// The environment variable [`KubernetesSettings::from_env`] reads the namespace from (set it with
/// the downward API, see [`KubernetesLease`](crate::KubernetesLease)).
pub(crate) const NAMESPACE_ENV: &str = "POD_NAMESPACE";
/// The environment variable [`KubernetesSettings::owner_from_env`] reads the owner identity from (the pod name, set with
/// the downward API).
pub(crate) const OWNER_ENV: &str = "POD_NAME";

/// How long the client waits for a TCP + TLS connection to the API server.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the client waits for a request to be written.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the API server is and how to authenticate to it.
///
/// Every field but the namespace defaults to what Kubernetes gives a pod, so in a cluster
/// `KubernetesSettings::new("my-namespace")` (or [`KubernetesSettings::from_env`]) is enough.
/// For a kubeconfig (a developer machine, a CI job), build a [`kube::Client`] yourself and use
/// [`KubernetesLease::with_client`](crate::KubernetesLease::with_client).
///
/// As a configuration section (`[leases.<key>.kubernetes]`) the fields are `namespace`,
/// `api-url`, `token` or `token-file`, and `ca-file`:
///
/// ```
/// # use actix_coordination::KubernetesSettings;
/// let settings: KubernetesSettings = serde_json::from_value(serde_json::json!({
///     "namespace": "my-app",
///     "api-url": "https://10.0.0.1:6443",
///     "token-file": "/etc/lease/token",
///     "ca-file": "/etc/lease/ca.crt",
/// }))?;
/// assert_eq!(settings.namespace(), "my-app");
/// // The token never appears in logs.
/// let with_token = settings.clone().with_token("s3cr3t");
/// assert!(!format!("{with_token:?}").contains("s3cr3t"));
/// # Ok::<(), serde_json::Error>(())
/// ```
///
/// The bearer token is read from `token-file` (default: the pod's service account token) and
/// re-read about once a minute, so a rotated token is picked up; `token` gives it inline instead
/// (it is then never re-read).
///
/// The token is never logged: `Debug` prints it as `"<redacted>"` (and the `user:password@` part
/// of an `api-url`, which validation refuses), and no error of deserialization or validation
/// contains it (a `token` that is not a string is refused without quoting it).
#[derive(Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct KubernetesSettings {
    namespace: String,
    #[serde(default = "default_api_url")]
    api_url: String,
    #[serde(default, deserialize_with = "deserialize_token")]
    token: Option<String>,
    #[serde(default)]
    token_file: Option<PathBuf>,
    #[serde(default = "default_ca_file")]
    ca_file: PathBuf,
}

fn default_api_url() -> String {
    DEFAULT_API_URL.to_owned()
}

fn deserialize_token<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    redact::deserialize_secret(d, "token")
}

fn default_ca_file() -> PathBuf {
    PathBuf::from(DEFAULT_CA_FILE)
}

impl fmt::Debug for KubernetesSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubernetesSettings")
            .field("namespace", &self.namespace)
            .field("api_url", &redact::redact_url(&self.api_url))
            .field("token", &self.token.as_ref().map(|_| redact::REDACTED))
            .field("token_file", &self.token_file)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl KubernetesSettings {
    /// Settings for leases in `namespace`, with the in-cluster defaults for everything else.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            api_url: default_api_url(),
            token: None,
            token_file: None,
            ca_file: default_ca_file(),
        }
    }

    /// In-cluster settings with the namespace from the `POD_NAMESPACE` environment variable, or
    /// else from the pod's service account (`/var/run/secrets/kubernetes.io/serviceaccount/namespace`).
    ///
    /// # Errors
    ///
    /// [`KubernetesError::MissingEnvironment`] when neither is available.
    pub fn from_env() -> Result<Self, KubernetesError> {
        if let Some(namespace) = non_empty_env(NAMESPACE_ENV) {
            return Ok(Self::new(namespace));
        }
        match std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE) {
            Ok(namespace) if !namespace.trim().is_empty() => Ok(Self::new(namespace.trim())),
            _ => Err(KubernetesError::MissingEnvironment {
                variable: NAMESPACE_ENV,
                fallback: Some(SERVICE_ACCOUNT_NAMESPACE_FILE),
            }),
        }
    }

    /// The owner identity from the `POD_NAME` environment variable (set with the downward API), or
    /// else from `HOSTNAME` (which Kubernetes sets to the pod name).
    ///
    /// # Errors
    ///
    /// [`KubernetesError::MissingEnvironment`] when neither is set.
    pub fn owner_from_env() -> Result<String, KubernetesError> {
        non_empty_env(OWNER_ENV)
            .or_else(|| non_empty_env("HOSTNAME"))
            .ok_or(KubernetesError::MissingEnvironment {
                variable: OWNER_ENV,
                fallback: None,
            })
    }

    /// Replaces the API server URL (default `https://kubernetes.default.svc`).
    #[must_use]
    pub fn with_api_url(mut self, url: impl Into<String>) -> Self {
        self.api_url = url.into();
        self
    }

    /// Uses this bearer token instead of a token file. It is never re-read, so prefer
    /// [`KubernetesSettings::with_token_file`] for tokens that rotate.
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self.token_file = None;
        self
    }

    /// Reads the bearer token from this file (default `/var/run/secrets/kubernetes.io/serviceaccount/token`), again about once a
    /// minute.
    #[must_use]
    pub fn with_token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self.token = None;
        self
    }

    /// Trusts the CA certificates (PEM) in this file (default `/var/run/secrets/kubernetes.io/serviceaccount/ca.crt`); re-read about
    /// once a minute.
    #[must_use]
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = path.into();
        self
    }

    /// The namespace of the `Lease` objects.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The API server URL.
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The token file, unless an inline token is set.
    pub fn token_file(&self) -> Option<&Path> {
        match (&self.token, &self.token_file) {
            (Some(_), _) => None,
            (None, Some(path)) => Some(path),
            (None, None) => Some(Path::new(DEFAULT_TOKEN_FILE)),
        }
    }

    /// The CA file.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// Checks every field and reads the token and CA files once.
    ///
    /// # Errors
    ///
    /// [`KubernetesError::InvalidSettings`] naming the field, [`KubernetesError::ReadFile`] when
    /// the token or CA file cannot be read.
    pub fn validate(&self) -> Result<(), KubernetesError> {
        self.kube_config().map(drop)
    }

    /// The validated kube client configuration.
    pub(crate) fn kube_config(&self) -> Result<kube::Config, KubernetesError> {
        check_namespace(&self.namespace)?;
        let https = check_api_url(&self.api_url)?;
        let mut auth_info = AuthInfo::default();
        match (&self.token, &self.token_file) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "token",
                    "set either `token` or `token-file`, not both",
                ))
            }
            (Some(token), None) => {
                let token = token.trim();
                if token.is_empty() {
                    return Err(invalid("token", "is empty"));
                }
                auth_info.token = Some(token.to_owned().into());
            }
            (None, file) => {
                let path = file.as_deref().unwrap_or(Path::new(DEFAULT_TOKEN_FILE));
                let raw = read_file("token-file", path)?;
                let trimmed = raw.trim();
                if trimmed.is_empty() {
                    return Err(invalid(
                        "token-file",
                        format!("{} is empty", path.display()),
                    ));
                }
                if trimmed.len() == raw.len() {
                    auth_info.token_file = Some(path.display().to_string());
                } else {
                    // kube sends a token file verbatim, and whitespace makes an invalid header.
                    tracing::warn!(path = %path.display(), "the token file has surrounding whitespace; using its trimmed content, which is not re-read on rotation");
                    auth_info.token = Some(trimmed.to_owned().into());
                }
            }
        }
        let ca_file = if https {
            let pem = read_file("ca-file", &self.ca_file)?;
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(invalid(
                    "ca-file",
                    format!("{} holds no PEM certificate", self.ca_file.display()),
                ));
            }
            Some(self.ca_file.display().to_string())
        } else {
            None
        };
        let kubeconfig = Kubeconfig {
            clusters: vec![NamedCluster {
                name: "lease".into(),
                cluster: Some(Cluster {
                    server: Some(self.api_url.clone()),
                    certificate_authority: ca_file.clone(),
                    ..Cluster::default()
                }),
                ..NamedCluster::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: "lease".into(),
                auth_info: Some(auth_info),
                ..NamedAuthInfo::default()
            }],
            contexts: vec![NamedContext {
                name: "lease".into(),
                context: Some(Context {
                    cluster: "lease".into(),
                    user: Some("lease".into()),
                    namespace: Some(self.namespace.clone()),
                    ..Context::default()
                }),
                ..NamedContext::default()
            }],
            current_context: Some("lease".into()),
            ..Kubeconfig::default()
        };
        let mut config = kube::Config::try_from(kubeconfig)
            .map_err(|source| KubernetesError::Config { source })?;
        // Re-read the CA bundle about once a minute (CA rotation), like kube's in-cluster config.
        config.root_cert_file = ca_file.map(PathBuf::from);
        config.connect_timeout = Some(CONNECT_TIMEOUT);
        config.write_timeout = Some(WRITE_TIMEOUT);
        // No read timeout: every request of a lease is bounded by its operation timeout, and the
        // watches are long-lived by design (a read timeout would cut idle watches).
        config.read_timeout = None;
        // ManagedLease decides about retries (and counts them against the TTL); a hidden retry
        // layer would also break "one request per renewal".
        config.default_retry = false;
        // Leases talk to one API server directly; kube would pick HTTPS_PROXY up from the
        // environment, and proxies need features this crate does not enable.
        config.proxy_url = None;
        Ok(config)
    }
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

fn invalid(field: &'static str, reason: impl Into<String>) -> KubernetesError {
    KubernetesError::InvalidSettings {
        field,
        reason: reason.into(),
    }
}

fn read_file(field: &'static str, path: &Path) -> Result<String, KubernetesError> {
    std::fs::read_to_string(path).map_err(|source| KubernetesError::ReadFile {
        field,
        path: path.to_owned(),
        source,
    })
}

/// A namespace is a DNS-1123 label: at most 63 of `a-z0-9-`, starting and ending alphanumeric.
pub(crate) fn check_namespace(namespace: &str) -> Result<(), KubernetesError> {
    let b = namespace.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "namespace",
            format!("{namespace:?} is not a DNS-1123 label (1-63 of a-z, 0-9, '-')"),
        ))
    }
}

/// Returns whether the URL is `https`.
fn check_api_url(url: &str) -> Result<bool, KubernetesError> {
    // Before any message that quotes the URL.
    if redact::userinfo_range(url).is_some() {
        return Err(invalid(
            "api-url",
            "must not contain credentials (`user:password@`); use `token` or `token-file`",
        ));
    }
    let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(invalid(
            "api-url",
            format!("{url:?} must start with https:// (or http://)"),
        ));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || authority.contains(char::is_whitespace) {
        return Err(invalid("api-url", format!("{url:?} has no host")));
    }
    Ok(https)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, content: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "actix-coordination-k8s-settings-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    // Well-formed PEM (kube only base64-decodes it when building the configuration).
    const PEM: &str = "-----BEGIN CERTIFICATE-----\nTUlJQg==\n-----END CERTIFICATE-----\n";

    #[test]
    fn debug_redacts_the_token() {
        let s = KubernetesSettings::new("ns").with_token("very-secret-token");
        let debug = format!("{s:?}");
        assert!(!debug.contains("very-secret-token"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
        assert!(debug.contains("ns"));
    }

    #[test]
    fn defaults_are_the_in_cluster_ones() {
        let s = KubernetesSettings::new("ns");
        assert_eq!(s.api_url(), DEFAULT_API_URL);
        assert_eq!(s.token_file(), Some(Path::new(DEFAULT_TOKEN_FILE)));
        assert_eq!(s.ca_file(), Path::new(DEFAULT_CA_FILE));
        let parsed: KubernetesSettings =
            serde_json::from_value(serde_json::json!({ "namespace": "ns" })).unwrap();
        assert_eq!(parsed, s);
    }

    #[test]
    fn the_section_rejects_unknown_fields_and_needs_a_namespace() {
        let err = serde_json::from_value::<KubernetesSettings>(
            serde_json::json!({ "namespace": "ns", "api-uri": "x" }),
        )
        .unwrap_err();
        assert!(err.to_string().contains("api-uri"), "{err}");
        let err = serde_json::from_value::<KubernetesSettings>(serde_json::json!({})).unwrap_err();
        assert!(err.to_string().contains("namespace"), "{err}");
    }

    #[test]
    fn every_invalid_field_is_named() {
        let ca = temp_file("ca.crt", PEM);
        let token = temp_file("token", "abc");
        let ok = || {
            KubernetesSettings::new("ns")
                .with_api_url("https://127.0.0.1:6443")
                .with_token_file(&token)
                .with_ca_file(&ca)
        };
        ok().validate().unwrap();
        let both: KubernetesSettings = serde_json::from_value(serde_json::json!({
            "namespace": "ns", "token": "t", "token-file": token,
            "ca-file": ca, "api-url": "https://h"
        }))
        .unwrap();
        let empty = temp_file("empty", " \n");
        let not_pem = temp_file("not-pem", "hello");
        let cases: Vec<(KubernetesSettings, &str)> = vec![
            (ok().with_api_url("127.0.0.1:6443"), "api-url"),
            (ok().with_api_url("https:///x"), "api-url"),
            (
                KubernetesSettings {
                    namespace: String::new(),
                    ..ok()
                },
                "namespace",
            ),
            (
                KubernetesSettings {
                    namespace: "Upper".into(),
                    ..ok()
                },
                "namespace",
            ),
            (
                KubernetesSettings {
                    namespace: "a".repeat(64),
                    ..ok()
                },
                "namespace",
            ),
            (both, "token"),
            (ok().with_token("  "), "token"),
            (ok().with_token_file(&empty), "token-file"),
            (ok().with_token_file("/nonexistent/token"), "token-file"),
            (ok().with_ca_file("/nonexistent/ca.crt"), "ca-file"),
            (ok().with_ca_file(&not_pem), "ca-file"),
        ];
        for (settings, field) in cases {
            let err = settings.validate().expect_err(field);
            assert!(err.to_string().contains(field), "{field}: {err}");
            assert!(!crate::BackendError::is_transient(&err), "{err}");
        }
    }

    #[test]
    fn a_token_file_with_a_trailing_newline_still_works() {
        let ca = temp_file("ca2.crt", PEM);
        let token = temp_file("token-nl", "abc\n");
        let config = KubernetesSettings::new("ns")
            .with_api_url("https://127.0.0.1:6443")
            .with_token_file(&token)
            .with_ca_file(&ca)
            .kube_config()
            .unwrap();
        assert!(config.auth_info.token_file.is_none());
        assert!(config.auth_info.token.is_some());
        assert!(!config.default_retry);
        assert_eq!(config.connect_timeout, Some(CONNECT_TIMEOUT));
        assert_eq!(config.default_namespace, "ns");
    }

    #[test]
    fn http_needs_no_ca() {
        let token = temp_file("token-http", "abc");
        KubernetesSettings::new("ns")
            .with_api_url("http://127.0.0.1:8001")
            .with_token_file(&token)
            .with_ca_file("/nonexistent")
            .validate()
            .unwrap();
    }

    #[test]
    fn settings_and_owner_come_from_the_downward_api_variables() {
        // The only test of this crate that touches these variables.
        let saved: Vec<_> = [NAMESPACE_ENV_NAME, OWNER_ENV_NAME]
            .iter()
            .map(|v| (*v, std::env::var_os(v)))
            .collect();
        std::env::set_var(NAMESPACE_ENV_NAME, "from-env");
        std::env::set_var(OWNER_ENV_NAME, "pod-7f9c8");
        let settings = KubernetesSettings::from_env().unwrap();
        let owner = KubernetesSettings::owner_from_env().unwrap();
        for (var, value) in saved {
            match value {
                Some(value) => std::env::set_var(var, value),
                None => std::env::remove_var(var),
            }
        }
        assert_eq!(settings.namespace(), "from-env");
        assert_eq!(owner, "pod-7f9c8");
    }

    const NAMESPACE_ENV_NAME: &str = "POD_NAMESPACE";
    const OWNER_ENV_NAME: &str = "POD_NAME";
}
