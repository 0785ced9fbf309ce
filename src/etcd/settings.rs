//! [`EtcdSettings`]: which etcd cluster to use and where the lease keys live.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::EtcdError;
use crate::redact;

/// The key prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "/actix-coordination/leases/";

/// How long connecting (and authenticating) to etcd may take when nothing is configured.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The etcd section of a lease configuration (`[leases.<key>.etcd]`), as written in files.
///
/// Field names are kebab-case, durations use [humantime](https://docs.rs/humantime) syntax, unknown
/// fields are rejected. Turn it into validated [`EtcdSettings`] with [`EtcdSettings::from_config`].
///
/// ```toml
/// [leases.jobs.etcd]
/// endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
/// prefix = "/my-app/leases/"       # default "/actix-coordination/leases/"
/// user = "my-app"                  # optional, with `password`
/// password = "secret"
/// connect-timeout = "3s"           # default 5s
/// ```
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct EtcdConfig {
    /// The client URLs of the etcd members (`http://host:port`).
    pub endpoints: Vec<String>,
    /// The key prefix; see [`EtcdSettings::prefix`].
    #[serde(default)]
    pub prefix: Option<String>,
    /// The etcd user, when etcd authentication is enabled.
    #[serde(default)]
    pub user: Option<String>,
    /// The password of `user`. Never logged: `Debug` and the errors of deserialization and
    /// validation never contain it.
    #[serde(default, deserialize_with = "deserialize_password")]
    pub password: Option<String>,
    /// See [`EtcdSettings::connect_timeout`].
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
}

fn deserialize_password<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    redact::deserialize_secret(d, "password")
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoints: Vec<_> = self
            .endpoints
            .iter()
            .map(|e| redact::redact_url(e))
            .collect();
        f.debug_struct("EtcdConfig")
            .field("endpoints", &endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user)
            .field(
                "password",
                &self.password.as_ref().map(|_| redact::REDACTED),
            )
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// Validated settings of the etcd backend: endpoints, key prefix, credentials, connect timeout.
///
/// Build them with [`EtcdSettings::builder`] or from configuration with
/// [`EtcdSettings::from_config`] / [`EtcdSettings::from_section`]. Two equal settings describe the
/// same cluster and key space (the provider shares one [`EtcdSession`](super::EtcdSession) between
/// them). `Debug` never shows the password, and no error of [`EtcdSettings::from_section`] or
/// validation contains it; endpoints with a `user:password@` part are refused (without quoting
/// them).
///
/// ```
/// use std::time::Duration;
/// use actix_coordination::EtcdSettings;
///
/// let settings = EtcdSettings::builder(["http://127.0.0.1:2379"])
///     .prefix("/my-app/leases/")
///     .connect_timeout(Duration::from_secs(2))
///     .build()?;
/// assert_eq!(settings.key("jobs"), b"/my-app/leases/jobs");
///
/// let err = EtcdSettings::builder(Vec::<String>::new()).build().unwrap_err();
/// assert!(err.to_string().contains("endpoints"));
/// # Ok::<(), actix_coordination::EtcdError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EtcdSettings {
    endpoints: Vec<String>,
    prefix: String,
    credentials: Option<(String, String)>,
    connect_timeout: Duration,
}

impl fmt::Debug for EtcdSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSettings")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user())
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl EtcdSettings {
    /// A builder for a cluster reachable at `endpoints`; every other setting takes its default.
    pub fn builder<I, S>(endpoints: I) -> EtcdSettingsBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdSettingsBuilder {
            config: EtcdConfig {
                endpoints: endpoints.into_iter().map(Into::into).collect(),
                ..EtcdConfig::default()
            },
        }
    }

    /// Validates a configuration section.
    ///
    /// # Errors
    ///
    /// [`EtcdError::InvalidSettings`] naming the first field that is wrong.
    pub fn from_config(config: &EtcdConfig) -> Result<Self, EtcdError> {
        if config.endpoints.is_empty() {
            return Err(invalid("endpoints", "must list at least one etcd endpoint"));
        }
        for endpoint in &config.endpoints {
            check_endpoint(endpoint)?;
        }
        let prefix = config.prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
        if prefix.is_empty() {
            return Err(invalid(
                "prefix",
                "must not be empty (the lease keys would mix with other keys)",
            ));
        }
        let credentials = match (&config.user, &config.password) {
            (None, None) => None,
            (Some(user), Some(password)) => {
                if user.is_empty() {
                    return Err(invalid("user", "must not be empty"));
                }
                Some((user.clone(), password.clone()))
            }
            (Some(_), None) => return Err(invalid("password", "is required with `user`")),
            (None, Some(_)) => return Err(invalid("user", "is required with `password`")),
        };
        let connect_timeout = config.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        if connect_timeout.is_zero() {
            return Err(invalid("connect-timeout", "must be greater than zero"));
        }
        Ok(Self {
            endpoints: config.endpoints.clone(),
            prefix: prefix.to_owned(),
            credentials,
            connect_timeout,
        })
    }

    /// Parses and validates the backend's configuration section (the value the
    /// [`LeaseProvider`](crate::LeaseProvider) passes to a factory).
    ///
    /// # Errors
    ///
    /// [`EtcdError::InvalidSettings`] when the section does not parse (unknown field, wrong type,
    /// bad duration) or a value is invalid.
    pub fn from_section(section: &serde_json::Value) -> Result<Self, EtcdError> {
        let config = EtcdConfig::deserialize(section)
            .map_err(|e| invalid("etcd", format!("invalid section: {e}")))?;
        Self::from_config(&config)
    }

    /// The client URLs of the etcd members.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix: lease `name` is stored under the key `<prefix><name>` (raw bytes, no
    /// escaping). End it with a separator such as `/` so that prefixes of different applications
    /// cannot overlap.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The etcd user, if authentication is configured.
    pub fn user(&self) -> Option<&str> {
        self.credentials.as_ref().map(|(user, _)| user.as_str())
    }

    pub(super) fn credentials(&self) -> Option<(&str, &str)> {
        self.credentials
            .as_ref()
            .map(|(user, password)| (user.as_str(), password.as_str()))
    }

    /// The bound on connecting (and authenticating) to etcd, and on opening the shared watch
    /// stream.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The etcd key of lease `name`: `<prefix><name>`.
    pub fn key(&self, name: &str) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.prefix.len() + name.len());
        key.extend_from_slice(self.prefix.as_bytes());
        key.extend_from_slice(name.as_bytes());
        key
    }
}

/// Builds [`EtcdSettings`]; see [`EtcdSettings::builder`].
#[derive(Debug, Clone)]
pub struct EtcdSettingsBuilder {
    config: EtcdConfig,
}

impl EtcdSettingsBuilder {
    /// The key prefix (default [`DEFAULT_PREFIX`]).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = Some(prefix.into());
        self
    }

    /// Authenticates as `user` with `password`.
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.config.user = Some(user.into());
        self.config.password = Some(password.into());
        self
    }

    /// The connect timeout (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = Some(timeout);
        self
    }

    /// Validates and builds the settings.
    ///
    /// # Errors
    ///
    /// [`EtcdError::InvalidSettings`] naming the first field that is wrong.
    pub fn build(self) -> Result<EtcdSettings, EtcdError> {
        EtcdSettings::from_config(&self.config)
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> EtcdError {
    EtcdError::InvalidSettings {
        field,
        reason: reason.into(),
    }
}

/// Accepts `http://host:port` and `host:port`; refuses what the client cannot use.
fn check_endpoint(endpoint: &str) -> Result<(), EtcdError> {
    // Before any message that quotes the endpoint.
    if redact::userinfo_range(endpoint).is_some() {
        return Err(invalid(
            "endpoints",
            "must not contain credentials (`user:password@`); use `user` and `password`",
        ));
    }
    if endpoint.is_empty()
        || endpoint
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(invalid(
            "endpoints",
            format!("{endpoint:?} is not an endpoint URL"),
        ));
    }
    let rest = if let Some(rest) = endpoint.strip_prefix("http://") {
        rest
    } else if endpoint.starts_with("https://") {
        return Err(invalid(
            "endpoints",
            format!("{endpoint:?}: https endpoints are not supported by this build (no TLS)"),
        ));
    } else if endpoint.contains("://") {
        return Err(invalid(
            "endpoints",
            format!("{endpoint:?}: only http:// endpoints are supported"),
        ));
    } else {
        endpoint
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let path = &rest[authority.len()..];
    if authority.is_empty() || !(path.is_empty() || path == "/") {
        return Err(invalid(
            "endpoints",
            format!("{endpoint:?} must have the form http://host:port"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(result: Result<EtcdSettings, EtcdError>) -> &'static str {
        match result.unwrap_err() {
            EtcdError::InvalidSettings { field, .. } => field,
            other => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn defaults_and_key_layout() {
        let s = EtcdSettings::builder(["http://127.0.0.1:2379"])
            .build()
            .unwrap();
        assert_eq!(s.prefix(), DEFAULT_PREFIX);
        assert_eq!(s.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(s.user(), None);
        assert_eq!(s.key("a/b c"), b"/actix-coordination/leases/a/b c".to_vec());
    }

    #[test]
    fn every_invalid_field_is_named() {
        assert_eq!(
            field(EtcdSettings::builder(Vec::<String>::new()).build()),
            "endpoints"
        );
        for bad in [
            "",
            "https://h:1",
            "unix:///tmp/s",
            "http://",
            "http://h:1/path",
            "h 1",
        ] {
            assert_eq!(
                field(EtcdSettings::builder([bad]).build()),
                "endpoints",
                "{bad}"
            );
        }
        let ok = || EtcdSettings::builder(["127.0.0.1:2379"]);
        assert_eq!(field(ok().prefix("").build()), "prefix");
        assert_eq!(field(ok().credentials("", "p").build()), "user");
        assert_eq!(
            field(ok().connect_timeout(Duration::ZERO).build()),
            "connect-timeout"
        );
        let half = EtcdConfig {
            endpoints: vec!["http://h:1".into()],
            user: Some("u".into()),
            ..EtcdConfig::default()
        };
        assert_eq!(field(EtcdSettings::from_config(&half)), "password");
    }

    #[test]
    fn sections_parse_with_kebab_case_and_humantime() {
        let s = EtcdSettings::from_section(&serde_json::json!({
            "endpoints": ["http://10.0.0.1:2379", "10.0.0.2:2379"],
            "prefix": "/app/",
            "user": "app",
            "password": "hunter2",
            "connect-timeout": "1500ms",
        }))
        .unwrap();
        assert_eq!(s.endpoints().len(), 2);
        assert_eq!(s.prefix(), "/app/");
        assert_eq!(s.user(), Some("app"));
        assert_eq!(s.connect_timeout(), Duration::from_millis(1500));
        let debug = format!("{s:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        let e =
            EtcdSettings::from_section(&serde_json::json!({"endpoints": ["h:1"], "prefx": "/"}))
                .unwrap_err();
        assert!(e.to_string().contains("prefx"), "{e}");
        let e = EtcdSettings::from_section(&serde_json::json!({"prefix": "/"})).unwrap_err();
        assert!(e.to_string().contains("endpoints"), "{e}");
        let config: EtcdConfig =
            serde_json::from_value(serde_json::json!({"endpoints": ["h:1"], "password": "pw"}))
                .unwrap();
        assert!(!format!("{config:?}").contains("pw\""));
    }
}
