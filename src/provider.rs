//! [`LeaseProvider`]: leases loaded from configuration, like Akka's `LeaseProvider`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Deserialize;

use crate::lease::BoxError;
use crate::memory::InMemoryStore;
use crate::redact;
use crate::settings::{LeaseSettings, SettingsError, TimingConfig};
use crate::shared::{SharedLease, WeakSharedLease};

pub use crate::memory::IN_MEMORY_BACKEND;

/// Errors of [`LeaseProvider::get_lease`].
///
/// Their messages name config keys, backends and settings, never a value of a section; the
/// source of [`ProviderError::InvalidBackendConfig`] is the backend's error, and the built-in
/// backends' errors never contain a `token` or `password` (tested in `tests/secrets.rs`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// No `[leases.<key>]` table with this config key.
    #[error("no lease configuration under the config key {config_key:?} (known: {known:?})")]
    UnknownConfigKey {
        /// The config key asked for.
        config_key: String,
        /// The config keys that exist.
        known: Vec<String>,
    },
    /// The configuration names a backend nobody registered.
    #[error(
        "lease config {config_key:?} names the unknown backend {backend:?} (registered: {known:?}; \
         `kubernetes` and `etcd` need their cargo features)"
    )]
    UnknownBackend {
        /// The config key.
        config_key: String,
        /// The backend named.
        backend: String,
        /// The registered backends.
        known: Vec<String>,
    },
    /// The configuration has a key that is neither a timing setting nor the backend's section.
    #[error("lease config {config_key:?} has the unknown setting {key:?}")]
    UnknownSetting {
        /// The config key.
        config_key: String,
        /// The unknown setting.
        key: String,
    },
    /// The name, owner or timing is invalid.
    #[error("lease config {config_key:?} is invalid")]
    InvalidSettings {
        /// The config key.
        config_key: String,
        /// What is wrong.
        #[source]
        source: SettingsError,
    },
    /// The backend rejected its section of the configuration.
    #[error("lease config {config_key:?} has an invalid `{backend}` section")]
    InvalidBackendConfig {
        /// The config key.
        config_key: String,
        /// The backend.
        backend: String,
        /// What the backend said.
        #[source]
        source: BoxError,
    },
}

/// The configuration the provider reads: lease configurations by config key.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct CoordinationConfig {
    /// Lease configurations by config key.
    #[serde(default)]
    pub leases: BTreeMap<String, LeaseConfig>,
}

/// One lease configuration: a backend, timing, and the backend's own section.
///
/// # Secrets in `Debug`
///
/// `Debug` (also of [`CoordinationConfig`] and [`LeaseProvider`]) prints the backend section and
/// any other key with secrets redacted, by this rule:
///
/// * a key *names a secret* when, lowercased and with every character that is not a letter or a
///   digit removed, it contains `token`, `secret`, `password`, `passwd`, `passphrase`,
///   `credential`, `apikey` or `privatekey`, and does not end in `file`: `token`, `password`,
///   `client_secret`, `bearerToken`, `api-key` name secrets; `token-file`, `password_file` (paths)
///   and `user` do not;
/// * the value of such a key is printed as `"<redacted>"` whatever its type (a string, a number, a
///   table), at any depth of the section;
/// * in every string, a user-info part (what precedes the last `@` of the authority, as in
///   `http://user:password@host` or `user:password@host:port`) is printed as `<redacted>@` (an
///   e-mail address loses its local part).
///
/// Everything else is printed as written: a secret under a key the rule does not recognise (a
/// typo such as `pasword`) is shown. The provider's own errors ([`ProviderError`]) never contain a
/// value of the configuration, only config keys, backend and setting names.
#[derive(Clone, Deserialize)]
pub struct LeaseConfig {
    /// The backend name (`in-memory`, `kubernetes`, `etcd` or a registered one).
    pub backend: String,
    /// Timing; unset fields take the documented defaults.
    #[serde(flatten)]
    pub timing: TimingConfig,
    /// Every other key: only one named like the backend is allowed (its section).
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

impl fmt::Debug for LeaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rest: BTreeMap<&str, serde_json::Value> = self
            .rest
            .iter()
            .map(|(key, value)| (key.as_str(), redact::redact_entry(key, value)))
            .collect();
        f.debug_struct("LeaseConfig")
            .field("backend", &self.backend)
            .field("timing", &self.timing)
            .field("rest", &rest)
            .finish()
    }
}

/// Creates leases of one backend from validated settings and the backend's config section.
///
/// Closures `Fn(LeaseSettings, Option<&serde_json::Value>) -> Result<SharedLease, BoxError>`
/// implement it, so a backend module can offer a factory without importing this one.
///
/// The error becomes the source of [`ProviderError::InvalidBackendConfig`], which programs log:
/// it must not contain secret values of the section (see [`LeaseConfig`]). Note that serde's
/// "invalid type" errors print numbers and booleans (`invalid type: integer `42``).
pub trait BackendFactory: Send + Sync + 'static {
    /// A lease with `settings`; `section` is the backend's own configuration table, if any.
    ///
    /// # Errors
    ///
    /// The reason the section is invalid.
    fn create(
        &self,
        settings: LeaseSettings,
        section: Option<&serde_json::Value>,
    ) -> Result<SharedLease, BoxError>;
}

impl<F> BackendFactory for F
where
    F: Fn(LeaseSettings, Option<&serde_json::Value>) -> Result<SharedLease, BoxError>
        + Send
        + Sync
        + 'static,
{
    fn create(
        &self,
        settings: LeaseSettings,
        section: Option<&serde_json::Value>,
    ) -> Result<SharedLease, BoxError> {
        self(settings, section)
    }
}

type LeaseKey = (String, String, String);

/// The cache is pruned when it has grown past twice its size after the last pruning, and past
/// at least this many entries.
const MIN_PRUNE_AT: usize = 16;

/// The leases handed out, by triple, held weakly: a lease lives as long as its clones do.
#[derive(Default)]
struct LeaseCache {
    leases: HashMap<LeaseKey, WeakSharedLease>,
    /// Dead entries are pruned when `leases` grows past this.
    prune_at: usize,
}

impl LeaseCache {
    /// The lease of `key`, if a clone of it is alive.
    fn get(&self, key: &LeaseKey) -> Option<SharedLease> {
        self.leases.get(key)?.upgrade()
    }

    /// Records `lease` under `key`, pruning dead entries when the map has doubled since the last
    /// pruning: it holds at most `max(2 × the most leases alive at once, MIN_PRUNE_AT)` entries,
    /// at an amortized constant cost per insertion.
    fn insert(&mut self, key: LeaseKey, lease: &SharedLease) {
        self.leases.insert(key, lease.downgrade());
        if self.leases.len() > self.prune_at {
            self.leases.retain(|_, lease| lease.is_alive());
            self.prune_at = (2 * self.leases.len()).max(MIN_PRUNE_AT);
        }
    }

    fn live(&self) -> usize {
        self.leases.values().filter(|l| l.is_alive()).count()
    }
}

/// Loads leases by (name, config key, owner) from a [`CoordinationConfig`].
///
/// A lease is identified by a triple: its *name* (the same on every node), a *config key* (which
/// backend and timing to use) and this node's *owner* identity. The provider reads a
/// [`CoordinationConfig`], usually deserialised from a file with serde:
///
/// ```toml
/// [leases.singleton-lease]        # the config key
/// backend = "kubernetes"          # a built-in or registered backend name
/// ttl = "15s"                     # timing, see `TimingConfig`; unset fields use the defaults
/// renewal-interval = "5s"
///
/// [leases.singleton-lease.kubernetes]   # the backend's own section, named like the backend
/// namespace = "my-app"
/// ```
///
/// [`LeaseProvider::get_lease`] returns the same [`SharedLease`] for the same triple while any
/// clone of it is alive, so every component of a process that asks for a lease gets the one
/// instance with its one renewal loop. The provider holds leases weakly: once every clone is
/// dropped, the lease is dropped (which stops its renewal without releasing it, like a crash:
/// release it first), and the next `get_lease` for the triple creates a new instance. Entries of
/// dropped leases are pruned as the cache grows, so it stays within twice the most leases alive
/// at once, or 16 (test `provider::tests::the_cache_stays_bounded`).
///
/// Built-in backends: `in-memory` (always; one [`InMemoryStore`] per provider), `kubernetes` and
/// `etcd` with their cargo features. [`LeaseProvider::register_backend`] adds your own.
///
/// ```
/// use actix_coordination::{CoordinationConfig, Lease, LeaseProvider};
///
/// let config: CoordinationConfig = serde_json::from_str(
///     r#"{ "leases": { "dev": { "backend": "in-memory", "ttl": "10s" } } }"#,
/// )?;
/// let provider = LeaseProvider::new(config);
/// let lease = provider.get_lease("jobs", "dev", "node-1")?;
/// assert_eq!(lease.name(), "jobs");
/// assert!(lease.ptr_eq(&provider.get_lease("jobs", "dev", "node-1")?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Clones share the registered backends (and so their sessions), the cache and the in-memory
/// store: a clone is the same provider, for closures that must own one, such as a
/// [candidacy](crate::ClusterSingletonManager::candidacy)'s.
#[derive(Clone)]
pub struct LeaseProvider {
    config: CoordinationConfig,
    backends: Arc<Mutex<BTreeMap<String, Arc<dyn BackendFactory>>>>,
    leases: Arc<Mutex<LeaseCache>>,
    store: InMemoryStore,
}

impl fmt::Debug for LeaseProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseProvider")
            .field("config", &self.config)
            .field("backends", &lock(&self.backends).keys().collect::<Vec<_>>())
            .field("live_leases", &lock(&self.leases).live())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LeaseProvider {
    /// A provider reading `config`, with the built-in backends registered.
    pub fn new(config: CoordinationConfig) -> Self {
        let provider = Self {
            config,
            backends: Arc::new(Mutex::new(BTreeMap::new())),
            leases: Arc::new(Mutex::new(LeaseCache::default())),
            store: InMemoryStore::new(),
        };
        let store = provider.store.clone();
        provider.register_backend(
            IN_MEMORY_BACKEND,
            move |settings: LeaseSettings, section: Option<&serde_json::Value>| {
                if let Some(section) = section {
                    // The keys only: values may be secrets.
                    let keys: Vec<&String> =
                        section.as_object().map(|t| t.keys().collect()).unwrap_or_default();
                    return Err(format!(
                        "the in-memory backend takes no settings (its section has the keys {keys:?})"
                    )
                    .into());
                }
                Ok(SharedLease::new(store.lease(settings)))
            },
        );
        #[cfg(feature = "kubernetes")]
        provider.register_backend(
            crate::kubernetes::KUBERNETES_BACKEND,
            crate::kubernetes::provider_factory(),
        );
        #[cfg(feature = "etcd")]
        provider.register_backend(crate::etcd::ETCD_BACKEND, crate::etcd::provider_factory());
        provider
    }

    /// The in-memory store behind the `in-memory` backend of this provider.
    pub fn in_memory_store(&self) -> &InMemoryStore {
        &self.store
    }

    /// Registers (or replaces) the backend `name`.
    pub fn register_backend(&self, name: impl Into<String>, factory: impl BackendFactory) {
        lock(&self.backends).insert(name.into(), Arc::new(factory));
    }

    /// The lease `name` for `owner`, configured by `config_key`: the same instance for the same
    /// triple while any clone of it is alive, a new one once every clone was dropped.
    ///
    /// # Errors
    ///
    /// [`ProviderError`] when the config key, the backend or a setting is unknown, or a setting is
    /// invalid.
    pub fn get_lease(
        &self,
        name: &str,
        config_key: &str,
        owner: &str,
    ) -> Result<SharedLease, ProviderError> {
        // A lease handed out and alive is returned without resolving (and copying) the
        // configuration, as before the maker existed.
        let key = (name.to_owned(), config_key.to_owned(), owner.to_owned());
        if let Some(lease) = lock(&self.leases).get(&key) {
            return Ok(lease);
        }
        self.maker(config_key, owner)?.get(name)
    }

    /// A new lease with exactly `settings` (timing, metadata and all), on the backend
    /// `config_key` configures (its backend settings; the configuration's timing is not applied),
    /// sharing that backend's session like every lease of the provider. It is not cached: each
    /// call builds a new instance. For leases whose settings derive from another's, such as a
    /// [candidacy](crate::ClusterSingletonManager::candidacy), with a clone of the provider:
    /// `.candidacy(candidate, move |s| provider.lease_with_settings("singleton", s))`.
    ///
    /// # Errors
    ///
    /// [`ProviderError`] when the config key or the backend is unknown, or the backend's settings
    /// are invalid.
    pub fn lease_with_settings(
        &self,
        config_key: &str,
        settings: LeaseSettings,
    ) -> Result<SharedLease, ProviderError> {
        self.maker(config_key, settings.owner())?
            .create_with(settings)
    }

    /// What builds the leases of `owner` configured by `config_key`, also after the provider is
    /// gone (a sharded group builds a shard's lease only while the node needs it): it resolves the
    /// configuration and the backend once, and shares the provider's cache of leases handed out.
    pub(crate) fn maker(&self, config_key: &str, owner: &str) -> Result<LeaseMaker, ProviderError> {
        let config =
            self.config
                .leases
                .get(config_key)
                .ok_or_else(|| ProviderError::UnknownConfigKey {
                    config_key: config_key.to_owned(),
                    known: self.config.leases.keys().cloned().collect(),
                })?;
        let factory = {
            let backends = lock(&self.backends);
            backends
                .get(&config.backend)
                .cloned()
                .ok_or_else(|| ProviderError::UnknownBackend {
                    config_key: config_key.to_owned(),
                    backend: config.backend.clone(),
                    known: backends.keys().cloned().collect(),
                })?
        };
        if let Some(key) = config.rest.keys().find(|k| **k != config.backend) {
            return Err(ProviderError::UnknownSetting {
                config_key: config_key.to_owned(),
                key: key.clone(),
            });
        }
        Ok(LeaseMaker {
            config_key: config_key.to_owned(),
            owner: owner.to_owned(),
            config: config.clone(),
            factory,
            leases: Arc::clone(&self.leases),
        })
    }
}

/// Builds the leases of one owner and config key of a [`LeaseProvider`]: the same instance for
/// the same name while any clone of it is alive (the provider's cache), a new one once every
/// clone was dropped.
pub(crate) struct LeaseMaker {
    config_key: String,
    owner: String,
    config: LeaseConfig,
    factory: Arc<dyn BackendFactory>,
    leases: Arc<Mutex<LeaseCache>>,
}

impl LeaseMaker {
    /// The lease `name`.
    pub(crate) fn get(&self, name: &str) -> Result<SharedLease, ProviderError> {
        let key = (name.to_owned(), self.config_key.clone(), self.owner.clone());
        if let Some(lease) = lock(&self.leases).get(&key) {
            return Ok(lease);
        }
        // Created unlocked: a factory may read files.
        let lease = self.create(name)?;
        let mut leases = lock(&self.leases);
        // Another thread may have created the same lease meanwhile: keep the one handed out.
        if let Some(first) = leases.get(&key) {
            return Ok(first);
        }
        leases.insert(key, &lease);
        Ok(lease)
    }

    fn create(&self, name: &str) -> Result<SharedLease, ProviderError> {
        let config = &self.config;
        let settings = LeaseSettings::builder(name, &self.owner)
            .timing(&config.timing)
            .build()
            .map_err(|source| ProviderError::InvalidSettings {
                config_key: self.config_key.clone(),
                source,
            })?;
        self.create_with(settings)
    }

    fn create_with(&self, settings: LeaseSettings) -> Result<SharedLease, ProviderError> {
        let config = &self.config;
        self.factory
            .create(settings, config.rest.get(&config.backend))
            .map_err(|source| ProviderError::InvalidBackendConfig {
                config_key: self.config_key.clone(),
                backend: config.backend.clone(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Lease;
    use std::time::Duration;

    fn provider(json: &str) -> LeaseProvider {
        LeaseProvider::new(serde_json::from_str(json).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn same_triple_same_instance_and_shared_store() {
        let p = provider(r#"{"leases":{"a":{"backend":"in-memory","ttl":"9s"}}}"#);
        let x1 = p.get_lease("L", "a", "x").unwrap();
        let x2 = p.get_lease("L", "a", "x").unwrap();
        let y = p.get_lease("L", "a", "y").unwrap();
        let other = p.get_lease("M", "a", "x").unwrap();
        assert!(x1.ptr_eq(&x2));
        assert!(!x1.ptr_eq(&y));
        assert!(!x1.ptr_eq(&other));
        assert!(x1.acquire().await.unwrap());
        assert!(x2.check_alive(), "clones share one lease");
        assert!(
            !y.acquire().await.unwrap(),
            "owners of one provider share a store"
        );
        assert_eq!(p.in_memory_store().holder("L").as_deref(), Some("x"));
    }

    /// The cache holds no strong reference: a lease lives as long as the clones handed out.
    #[tokio::test(start_paused = true)]
    async fn leases_live_as_long_as_their_clones() {
        let p = provider(r#"{"leases":{"a":{"backend":"in-memory","ttl":"9s"}}}"#);
        let lease = p.get_lease("L", "a", "x").unwrap();
        let clone = lease.clone();
        let weak = lease.downgrade();
        assert!(lease.acquire().await.unwrap());
        drop(lease);
        assert!(
            p.get_lease("L", "a", "x").unwrap().ptr_eq(&clone),
            "the same instance while a clone is alive"
        );
        assert_eq!(lock(&p.leases).live(), 1);

        drop(clone);
        assert!(weak.upgrade().is_none(), "the provider kept it alive");
        assert_eq!(lock(&p.leases).live(), 0);
        // Dropped, not released: its renewal stopped, so the claim runs out after the TTL.
        assert_eq!(p.in_memory_store().holder("L").as_deref(), Some("x"));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(p.in_memory_store().holder("L"), None, "no renewal any more");

        // The next call creates a new instance, with no tenure of the old one.
        let again = p.get_lease("L", "a", "x").unwrap();
        assert!(weak.upgrade().is_none());
        assert!(!again.check_alive());
        assert!(again.ptr_eq(&p.get_lease("L", "a", "x").unwrap()));
        assert!(again.acquire().await.unwrap());
    }

    /// Dead entries are pruned: the map holds at most max(2 × the most leases alive at once, 16)
    /// entries (the bound documented on `LeaseProvider` and in the README).
    #[test]
    fn the_cache_stays_bounded() {
        let p = provider(r#"{"leases":{"a":{"backend":"in-memory"}}}"#);
        let kept: Vec<SharedLease> = (0..10)
            .map(|i| p.get_lease(&format!("kept-{i}"), "a", "x").unwrap())
            .collect();
        // At most 11 alive at once: 10 kept and the one of the loop.
        for i in 0..1000 {
            drop(p.get_lease(&format!("L{i}"), "a", "x").unwrap());
            let size = lock(&p.leases).leases.len();
            assert!(size <= 22, "{size} entries after {i}");
        }
        assert_eq!(lock(&p.leases).live(), 10);
        for (i, lease) in kept.iter().enumerate() {
            let again = p.get_lease(&format!("kept-{i}"), "a", "x").unwrap();
            assert!(again.ptr_eq(lease), "live leases are never pruned");
        }
        drop(kept);
        for i in 0..1000 {
            drop(p.get_lease(&format!("M{i}"), "a", "x").unwrap());
            let size = lock(&p.leases).leases.len();
            assert!(size <= 22, "{size} entries after {i}");
        }
        assert_eq!(lock(&p.leases).live(), 0);

        // Never more than one alive at once: at most 16 entries.
        let p = provider(r#"{"leases":{"a":{"backend":"in-memory"}}}"#);
        for i in 0..1000 {
            drop(p.get_lease(&format!("L{i}"), "a", "x").unwrap());
            let size = lock(&p.leases).leases.len();
            assert!(size <= 16, "{size} entries after {i}");
        }
    }

    /// Threads racing for one triple all get the instance that was handed out first.
    #[test]
    fn racing_threads_get_one_instance() {
        let p = provider(r#"{"leases":{"a":{"backend":"in-memory"}}}"#);
        for round in 0..20 {
            let name = format!("L{round}");
            let leases: Vec<SharedLease> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..8)
                    .map(|_| scope.spawn(|| p.get_lease(&name, "a", "x").unwrap()))
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(leases.iter().all(|l| l.ptr_eq(&leases[0])), "round {round}");
            assert!(leases[0].ptr_eq(&p.get_lease(&name, "a", "x").unwrap()));
        }
    }

    #[test]
    fn timing_comes_from_the_config() {
        let p = provider(
            r#"{"leases":{
                "a":{"backend":"in-memory","ttl":"12s","acquire-retries":7,
                     "acquire-retry-delay":"250ms","clock-drift-margin":"300ms"},
                "defaults":{"backend":"in-memory"}
            }}"#,
        );
        // The settings of the lease the provider built, not a rebuild of the config.
        let lease = p.get_lease("n", "a", "o").unwrap();
        let s = lease.settings();
        assert_eq!((s.name(), s.owner()), ("n", "o"));
        assert_eq!(s.ttl(), Duration::from_secs(12));
        assert_eq!(s.renewal_interval(), Duration::from_secs(4), "ttl / 3");
        assert_eq!(
            s.operation_timeout(),
            Duration::from_millis(3850),
            "(12 s - 300 ms - 4 s) / 2"
        );
        assert_eq!(s.acquire_retries(), 7);
        assert_eq!(s.acquire_retry_delay(), Duration::from_millis(250));
        assert_eq!(s.clock_drift_margin(), Duration::from_millis(300));
        // A config key without timing gets the documented defaults.
        let lease = p.get_lease("n", "defaults", "o").unwrap();
        assert_eq!(
            lease.settings(),
            &LeaseSettings::new("n", "o").unwrap(),
            "defaults"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn toml_configuration_is_read() {
        let config: CoordinationConfig = toml::from_str(
            r#"
            [leases.singleton]
            backend = "in-memory"
            ttl = "15s"
            renewal-interval = "5s"
            operation-timeout = "1500ms"
            acquire-retries = 2
            acquire-retry-delay = "1m 30s"
            clock-drift-margin = "200ms"

            [leases.custom]
            backend = "mine"

            [leases.custom.mine]
            flavour = "strict"
            replicas = 3
            "#,
        )
        .unwrap();
        assert_eq!(
            config.leases.keys().collect::<Vec<_>>(),
            ["custom", "singleton"]
        );
        let p = LeaseProvider::new(config);
        let seen = Arc::new(Mutex::new(None));
        let seen2 = seen.clone();
        let store = p.in_memory_store().clone();
        p.register_backend(
            "mine",
            move |s: LeaseSettings, section: Option<&serde_json::Value>| {
                *lock(&seen2) = section.cloned();
                Ok(SharedLease::new(store.lease(s)))
            },
        );
        let lease = p.get_lease("jobs", "singleton", "node-1").unwrap();
        let s = lease.settings();
        assert_eq!(s.ttl(), Duration::from_secs(15));
        assert_eq!(s.renewal_interval(), Duration::from_secs(5));
        assert_eq!(s.operation_timeout(), Duration::from_millis(1500));
        assert_eq!(s.acquire_retries(), 2);
        assert_eq!(s.acquire_retry_delay(), Duration::from_secs(90));
        assert_eq!(s.clock_drift_margin(), Duration::from_millis(200));
        assert!(lease.acquire().await.unwrap());
        assert_eq!(
            p.in_memory_store().holder("jobs").as_deref(),
            Some("node-1")
        );
        p.get_lease("other", "custom", "node-1").unwrap();
        assert_eq!(
            lock(&seen).clone(),
            Some(serde_json::json!({"flavour": "strict", "replicas": 3})),
            "the backend's own table"
        );
        // Mistakes in a TOML file are reported, not ignored.
        let err = toml::from_str::<CoordinationConfig>("[lease.a]\nbackend = \"in-memory\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("lease"), "{err}");
        let err = toml::from_str::<CoordinationConfig>(
            "[leases.a]\nbackend = \"in-memory\"\nttl = \"soon\"\n",
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("soon") || err.to_string().contains("ttl"),
            "{err}"
        );
        let p = LeaseProvider::new(
            toml::from_str("[leases.a]\nbackend = \"in-memory\"\nttl = \"2days\"\n").unwrap(),
        );
        let e = p.get_lease("n", "a", "o").unwrap_err();
        assert!(
            matches!(&e, ProviderError::InvalidSettings { source, .. } if source.field() == "ttl"),
            "{e}"
        );
    }

    /// Environment-driven layers (the `config` crate, `APP_LEASES__A__ACQUIRE_RETRIES=7`) hand
    /// every value over as a string, numbers included.
    #[test]
    fn environment_style_string_values_are_read() {
        let p = provider(
            r#"{"leases":{"a":{"backend":"in-memory","ttl":"12s","renewal-interval":"3s",
                "acquire-retries":"7","acquire-retry-delay":"250ms"}}}"#,
        );
        let lease = p.get_lease("n", "a", "o").unwrap();
        let s = lease.settings();
        assert_eq!(s.ttl(), Duration::from_secs(12));
        assert_eq!(s.renewal_interval(), Duration::from_secs(3));
        assert_eq!(s.acquire_retries(), 7);
        assert_eq!(s.acquire_retry_delay(), Duration::from_millis(250));
        for bad in [r#""seven""#, r#""-1""#, r#""4294967296""#, "-1", "1.5"] {
            let json = format!(
                r#"{{"leases":{{"a":{{"backend":"in-memory","acquire-retries":{bad}}}}}}}"#
            );
            let err = serde_json::from_str::<CoordinationConfig>(&json).unwrap_err();
            assert!(
                err.to_string().contains("non-negative integer"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn errors_are_typed_and_clear() {
        let p = provider(
            r#"{"leases":{
                "bad-backend":{"backend":"zookeeper"},
                "bad-key":{"backend":"in-memory","tll":"3s"},
                "bad-ttl":{"backend":"in-memory","ttl":"10s","renewal-interval":"6s"},
                "bad-section":{"backend":"in-memory","in-memory":{"x":1}}
            }}"#,
        );
        let e = p.get_lease("n", "missing", "o").unwrap_err();
        assert!(matches!(e, ProviderError::UnknownConfigKey { .. }), "{e}");
        let e = p.get_lease("n", "bad-backend", "o").unwrap_err();
        assert!(
            matches!(&e, ProviderError::UnknownBackend { backend, known, .. }
            if backend == "zookeeper" && known.contains(&"in-memory".to_owned())),
            "{e}"
        );
        let e = p.get_lease("n", "bad-key", "o").unwrap_err();
        assert!(
            matches!(&e, ProviderError::UnknownSetting { key, .. } if key == "tll"),
            "{e}"
        );
        let e = p.get_lease("n", "bad-ttl", "o").unwrap_err();
        assert!(
            matches!(&e, ProviderError::InvalidSettings { source, .. }
            if source.field() == "renewal-interval"),
            "{e}"
        );
        let e = p.get_lease("", "bad-ttl", "o").unwrap_err();
        assert!(
            matches!(&e, ProviderError::InvalidSettings { source, .. } if source.field() == "name"),
            "{e}"
        );
        let e = p.get_lease("n", "bad-section", "o").unwrap_err();
        assert!(
            matches!(e, ProviderError::InvalidBackendConfig { .. }),
            "{e}"
        );
        let err = serde_json::from_str::<CoordinationConfig>(r#"{"leases":{"a":{"ttl":"1s"}}}"#)
            .unwrap_err();
        assert!(err.to_string().contains("backend"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn custom_backends_can_be_registered() {
        let p = provider(r#"{"leases":{"c":{"backend":"mine","mine":{"flavour":"strict"}}}}"#);
        let store = InMemoryStore::new();
        let seen = Arc::new(Mutex::new(None));
        let seen2 = seen.clone();
        let store2 = store.clone();
        p.register_backend(
            "mine",
            move |s: LeaseSettings, section: Option<&serde_json::Value>| {
                *lock(&seen2) = section.cloned();
                Ok(SharedLease::new(store2.lease(s)))
            },
        );
        let lease = p.get_lease("n", "c", "o").unwrap();
        assert!(lease.acquire().await.unwrap());
        assert_eq!(store.holder("n").as_deref(), Some("o"));
        assert_eq!(
            lock(&seen).clone(),
            Some(serde_json::json!({"flavour":"strict"}))
        );
    }
}
