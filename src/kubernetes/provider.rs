//! The `kubernetes` backend of the [`LeaseProvider`](crate::LeaseProvider).

use std::collections::HashMap;
use std::sync::{Mutex, Weak};

use super::session::SessionInner;
use super::{KubernetesError, KubernetesLease, KubernetesSession, KubernetesSettings};
use crate::lease::BoxError;
use crate::settings::LeaseSettings;
use crate::shared::SharedLease;

/// The factory of the `kubernetes` backend for [`LeaseProvider`](crate::LeaseProvider): a
/// closure, which is a [`BackendFactory`](crate::BackendFactory).
///
/// The backend's section (`[leases.<key>.kubernetes]`) deserializes to [`KubernetesSettings`]
/// (`namespace`, `api-url`, `token` or `token-file`, `ca-file`); without a section the settings
/// come from [`KubernetesSettings::from_env`]. Leases whose settings are equal share one
/// [`KubernetesSession`] (one client, one connection), for as long as one of them lives; the
/// factory keeps no session alive by itself.
pub fn provider_factory(
) -> impl Fn(LeaseSettings, Option<&serde_json::Value>) -> Result<SharedLease, BoxError>
       + Send
       + Sync
       + 'static {
    let sessions = SessionCache::default();
    move |settings: LeaseSettings,
          section: Option<&serde_json::Value>|
          -> Result<SharedLease, BoxError> {
        let k8s = match section {
            Some(section) => KubernetesSettings::deserialize_section(section)?,
            None => KubernetesSettings::from_env()?,
        };
        let session = sessions.get(k8s)?;
        Ok(SharedLease::new(KubernetesLease::with_session(
            settings, &session,
        )))
    }
}

/// The provider's sessions by settings, held weakly: a session lives as long as a lease uses it.
#[derive(Default)]
struct SessionCache(Mutex<HashMap<KubernetesSettings, Weak<SessionInner>>>);

impl SessionCache {
    fn get(&self, k8s: KubernetesSettings) -> Result<KubernetesSession, KubernetesError> {
        let mut sessions = self.0.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(|_, weak| weak.strong_count() > 0);
        if let Some(session) = sessions.get(&k8s).and_then(KubernetesSession::upgrade) {
            return Ok(session);
        }
        let session = KubernetesSession::new(k8s.clone())?;
        sessions.insert(k8s, session.downgrade());
        Ok(session)
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
    use crate::kubernetes::KubernetesBackend;

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

    /// The provider's cache: equal settings get the same session while one of its users lives,
    /// a new one after the last is gone (the cache holds none alive), other settings another one.
    #[test]
    fn equal_sections_share_one_session_while_it_is_used() {
        let dir = std::env::temp_dir().join(format!(
            "actix-coordination-k8s-sessions-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (token, ca) = (dir.join("token"), dir.join("ca.crt"));
        std::fs::write(&token, "abc").unwrap();
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nTUlJQg==\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let k8s = || {
            KubernetesSettings::new("ns")
                .with_api_url("http://127.0.0.1:1")
                .with_token_file(&token)
                .with_ca_file(&ca)
        };
        let cache = SessionCache::default();
        let a = cache.get(k8s()).unwrap();
        let b = cache.get(k8s()).unwrap();
        assert_eq!(a.session_id(), b.session_id());
        let lease = KubernetesBackend::with_session("n", &b);
        assert_eq!(lease.session().unwrap().session_id(), a.session_id());
        let other = cache.get(k8s().with_token("t")).unwrap();
        assert_ne!(other.session_id(), a.session_id());
        let first = a.session_id();
        drop((a, b, lease));
        assert!(
            cache.0.lock().unwrap()[&k8s()].upgrade().is_none(),
            "the cache keeps no session alive"
        );
        let again = cache.get(k8s()).unwrap();
        assert_eq!(cache.0.lock().unwrap().len(), 2);
        drop((again, first, other));
    }
}
