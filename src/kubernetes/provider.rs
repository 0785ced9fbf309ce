//! The `kubernetes` backend of the [`LeaseProvider`](crate::LeaseProvider).

use super::{KubernetesLease, KubernetesSession, KubernetesSettings};
use crate::lease::BoxError;
use crate::settings::LeaseSettings;
use crate::shared::SharedLease;

/// The factory of the `kubernetes` backend for [`LeaseProvider`](crate::LeaseProvider): a
/// closure, which is a [`BackendFactory`](crate::BackendFactory).
///
/// The backend's section (`[leases.<key>.kubernetes]`) deserializes to [`KubernetesSettings`]
/// (`namespace`, `api-url`, `token` or `token-file`, `ca-file`); without a section the settings
/// come from [`KubernetesSettings::from_env`]. Leases whose settings are equal share one
/// [`KubernetesSession`] (one client, one connection), the process's shared session for those
/// settings ([`KubernetesSession::shared`]), for as long as one of them lives; the factory keeps
/// no session alive by itself.
pub fn provider_factory(
) -> impl Fn(LeaseSettings, Option<&serde_json::Value>) -> Result<SharedLease, BoxError>
       + Send
       + Sync
       + 'static {
    move |settings: LeaseSettings,
          section: Option<&serde_json::Value>|
          -> Result<SharedLease, BoxError> {
        let k8s = match section {
            Some(section) => KubernetesSettings::deserialize_section(section)?,
            None => KubernetesSettings::from_env()?,
        };
        let session = KubernetesSession::shared(k8s)?;
        Ok(SharedLease::new(KubernetesLease::with_session(
            settings, &session,
        )))
    }
}

impl KubernetesSettings {
    fn deserialize_section(section: &serde_json::Value) -> Result<Self, BoxError> {
        let settings: KubernetesSettings = serde::Deserialize::deserialize(section)?;
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::KubernetesError;

    #[test]
    fn the_provider_factory_reads_its_section() {
        let factory = provider_factory();
        let settings = LeaseSettings::new("n", "o").unwrap();
        let err = factory(
            settings.clone(),
            Some(&serde_json::json!({ "namespace": "ns", "token-fiel": "/x" })),
        )
        .unwrap_err();
        assert!(err.to_string().contains("token-fiel"), "{err}");
        let err = factory(
            settings.clone(),
            Some(&serde_json::json!({ "api-url": "https://h" })),
        )
        .unwrap_err();
        assert!(err.to_string().contains("namespace"), "{err}");
        // A complete section is validated (here: the token file does not exist).
        let err = factory(
            settings,
            Some(&serde_json::json!({
                "namespace": "ns", "token-file": "/nonexistent/token", "ca-file": "/nonexistent/ca"
            })),
        )
        .unwrap_err();
        let err = err.downcast_ref::<KubernetesError>().expect("typed");
        assert!(
            matches!(
                err,
                KubernetesError::ReadFile {
                    field: "token-file",
                    ..
                }
            ),
            "{err}"
        );
    }
}
