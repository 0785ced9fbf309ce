//! Secrets (the Kubernetes `token`, the etcd `password`, the user-info of URLs) never appear in
//! `Debug` or `Display` of configuration, provider, settings, sessions, leases and errors, nor in
//! the logs of a failing acquire.
//!
//! No server is needed: both backends connect lazily, and the errors that need I/O are provoked
//! against a closed port (`127.0.0.1:1`, connection refused).

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::error::Error;

use std::time::Duration;

use actix_coordination::{
    CoordinationConfig, EtcdConfig, EtcdError, EtcdLease, EtcdSession, EtcdSettings,
    KubernetesError, KubernetesLease, KubernetesSession, KubernetesSettings, Lease, LeaseProvider,
    LeaseSettings, ProviderError,
};

const TOKEN: &str = "s3cr3t-TOKEN-value";
const PASSWORD: &str = "s3cr3t-PASSWORD-value";
/// Secrets written as numbers (a wrong type): serde would print them in its error.
const TOKEN_NUMBER: &str = "918273645";
const PASSWORD_NUMBER: &str = "564738291";
/// Every secret of this file contains one of these.
const SECRETS: [&str; 3] = ["s3cr3t", TOKEN_NUMBER, PASSWORD_NUMBER];

const NAMESPACE: &str = "secrets-ns";
/// Nothing listens on port 1.
const CLOSED: &str = "http://127.0.0.1:1";

/// Asserts that `text`, a rendering of `what`, contains no secret but does contain `visible`
/// (so a `Debug` that prints nothing useful fails too).
#[track_caller]
fn assert_clean(what: &str, text: &str, visible: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} shows a secret: {text}");
    }
    assert!(text.contains(visible), "{what} lacks {visible:?}: {text}");
}

/// `Display` and `Debug` of `error` and of every error in its `source()` chain, asserted clean;
/// returns them all, joined, for further checks. The top-level `Display` must contain `visible`.
#[track_caller]
fn assert_error_clean(what: &str, error: &(dyn Error + 'static), visible: &str) -> String {
    let mut all = Vec::new();
    assert_clean(&format!("{what} (Display)"), &error.to_string(), visible);
    let mut current = Some(error);
    let mut depth = 0;
    while let Some(e) = current {
        let display = e.to_string();
        let debug = format!("{e:?}");
        assert_clean(&format!("{what} (source {depth}, Display)"), &display, "");
        assert_clean(&format!("{what} (source {depth}, Debug)"), &debug, "");
        all.push(display);
        all.push(debug);
        current = e.source();
        depth += 1;
    }
    all.join("\n")
}

/// Configuration whose `Debug` is checked: every secret is under a key that names one (see the
/// redaction rule on `LeaseConfig`), including the wrong-typed ones that fail in `get_lease`.
const CONFIG: &str = r#"
[leases.k]
backend = "kubernetes"
ttl = "15s"
acquire-retries = 0

[leases.k.kubernetes]
namespace = "secrets-ns"
api-url = "http://127.0.0.1:1"
token = "s3cr3t-TOKEN-value"

[leases.e]
backend = "etcd"
ttl = "15s"
acquire-retries = 0

[leases.e.etcd]
endpoints = ["http://127.0.0.1:1"]
user = "app"
password = "s3cr3t-PASSWORD-value"
connect-timeout = "1s"

[leases.k-number.kubernetes]
namespace = "secrets-ns"
token = 918273645
[leases.k-number]
backend = "kubernetes"

[leases.k-list]
backend = "kubernetes"
kubernetes = { namespace = "secrets-ns", token = ["s3cr3t-TOKEN-value"] }

[leases.k-table]
backend = "kubernetes"
kubernetes = { namespace = "secrets-ns", token = { value = "s3cr3t-TOKEN-value" } }

[leases.k-both]
backend = "kubernetes"
kubernetes = { namespace = "secrets-ns", token = "s3cr3t-TOKEN-value", token-file = "/var/token" }

[leases.k-empty-token]
backend = "kubernetes"
kubernetes = { namespace = "secrets-ns", api-url = "http://127.0.0.1:1", token = " " }

[leases.k-bad-namespace]
backend = "kubernetes"
kubernetes = { namespace = "Not_A_Label", token = "s3cr3t-TOKEN-value" }

[leases.k-url-credentials]
backend = "kubernetes"
kubernetes = { namespace = "secrets-ns", api-url = "http://admin:s3cr3t-PASSWORD-value@127.0.0.1:1", token = "s3cr3t-TOKEN-value" }

[leases.k-nested]
backend = "kubernetes"
kubernetes = { namespace = "secrets-ns", extra = { client-secret = "s3cr3t-TOKEN-value", tokens = ["s3cr3t-TOKEN-value"] } }

[leases.e-number]
backend = "etcd"
etcd = { endpoints = ["http://127.0.0.1:1"], user = "app", password = 564738291 }

[leases.e-no-user]
backend = "etcd"
etcd = { endpoints = ["http://127.0.0.1:1"], password = "s3cr3t-PASSWORD-value" }

[leases.e-empty-user]
backend = "etcd"
etcd = { endpoints = ["http://127.0.0.1:1"], user = "", password = "s3cr3t-PASSWORD-value" }

[leases.e-url-credentials]
backend = "etcd"
etcd = { endpoints = ["http://root:s3cr3t-PASSWORD-value@127.0.0.1:1"] }

[leases.e-schemeless-credentials]
backend = "etcd"
etcd = { endpoints = ["root:s3cr3t-PASSWORD-value@127.0.0.1:1"] }

[leases.lease-level-password]
backend = "in-memory"
password = "s3cr3t-PASSWORD-value"

[leases.in-memory-token]
backend = "in-memory"
in-memory = { token = "s3cr3t-TOKEN-value" }
"#;

/// Secrets under keys the rule does not recognise (typos): shown by `Debug` of the configuration,
/// but never by an error.
const TYPOS: &str = r#"
[leases.e-typo]
backend = "etcd"
etcd = { endpoints = ["http://127.0.0.1:1"], user = "app", pasword = "s3cr3t-PASSWORD-value" }

[leases.k-typo]
backend = "kubernetes"
kubernetes = { namespace = "secrets-ns", bearer = "s3cr3t-TOKEN-value" }

[leases.lease-level-typo]
backend = "in-memory"
pw = "s3cr3t-PASSWORD-value"
"#;

fn config() -> CoordinationConfig {
    toml::from_str(CONFIG).expect("the configuration parses")
}

#[test]
fn configuration_debug_redacts_every_secret() {
    let config = config();
    let debug = format!("{config:?}");
    assert_clean("CoordinationConfig", &debug, NAMESPACE);
    assert_clean("CoordinationConfig", &debug, "127.0.0.1:1");
    assert_clean("CoordinationConfig", &debug, "<redacted>");
    // Paths and users are not secrets.
    assert_clean("CoordinationConfig", &debug, "/var/token");
    assert_clean("CoordinationConfig", &debug, "\"app\"");
    // The URL keeps its host, loses its user-info.
    assert_clean(
        "CoordinationConfig",
        &debug,
        "http://<redacted>@127.0.0.1:1",
    );
    assert_clean("CoordinationConfig", &debug, "<redacted>@127.0.0.1:1");
    // The pretty form too.
    assert_clean("CoordinationConfig", &format!("{config:#?}"), NAMESPACE);

    for (key, visible) in [
        ("k", NAMESPACE),
        ("e", "127.0.0.1:1"),
        ("k-number", NAMESPACE),
        ("k-list", NAMESPACE),
        ("k-table", NAMESPACE),
        ("k-nested", "extra"),
        ("e-number", "\"app\""),
        ("lease-level-password", "in-memory"),
        ("in-memory-token", "in-memory"),
    ] {
        let lease_config = &config.leases[key];
        assert_clean(
            &format!("LeaseConfig {key}"),
            &format!("{lease_config:?}"),
            visible,
        );
        assert_clean(
            &format!("LeaseConfig {key}"),
            &format!("{lease_config:?}"),
            "<redacted>",
        );
    }
    // The same configuration read from JSON.
    let json: CoordinationConfig = serde_json::from_value(serde_json::json!({ "leases": {
        "k": { "backend": "kubernetes", "kubernetes": { "namespace": NAMESPACE, "token": TOKEN } },
        "e": { "backend": "etcd", "etcd": { "endpoints": [CLOSED], "user": "app", "password": PASSWORD } },
    }}))
    .unwrap();
    assert_clean("CoordinationConfig (JSON)", &format!("{json:?}"), NAMESPACE);
}

#[tokio::test]
async fn provider_and_its_leases_never_show_a_secret() {
    let provider = LeaseProvider::new(config());
    assert_clean("LeaseProvider", &format!("{provider:?}"), NAMESPACE);
    let k8s = provider.get_lease("jobs", "k", "node-1").unwrap();
    let etcd = provider.get_lease("billing", "e", "node-1").unwrap();
    assert_clean("SharedLease (kubernetes)", &format!("{k8s:?}"), "jobs");
    assert_clean("SharedLease (etcd)", &format!("{etcd:?}"), "billing");
    assert_clean(
        "LeaseProvider after get_lease",
        &format!("{provider:?}"),
        NAMESPACE,
    );
    assert_clean(
        "LeaseProvider after get_lease",
        &format!("{provider:#?}"),
        "127.0.0.1:1",
    );
}

/// Every error `get_lease` gives for the configurations above: the top-level message names the
/// config key, the chain says what is wrong, nothing shows a secret.
#[test]
fn provider_errors_never_show_a_secret() {
    let provider = LeaseProvider::new(config());
    let cases: &[(&str, &str)] = &[
        ("k-number", "`token` must be a string, not a number"),
        ("k-list", "`token` must be a string, not a list"),
        ("k-table", "`token` must be a string, not a table"),
        ("k-both", "set either `token` or `token-file`"),
        ("k-empty-token", "`token`: is empty"),
        ("k-bad-namespace", "Not_A_Label"),
        ("k-url-credentials", "must not contain credentials"),
        ("k-nested", "unknown field `extra`"),
        ("e-number", "`password` must be a string, not a number"),
        ("e-no-user", "`user`: is required with `password`"),
        ("e-empty-user", "`user`: must not be empty"),
        ("e-url-credentials", "must not contain credentials"),
        ("e-schemeless-credentials", "must not contain credentials"),
        ("lease-level-password", "unknown setting \"password\""),
        ("in-memory-token", "takes no settings"),
    ];
    for (key, expected) in cases {
        let error = provider.get_lease("jobs", key, "node-1").unwrap_err();
        let texts = assert_error_clean(key, &error, &format!("{key:?}"));
        assert!(texts.contains(expected), "{key}: {texts}");
        assert!(
            matches!(
                error,
                ProviderError::InvalidBackendConfig { .. } | ProviderError::UnknownSetting { .. }
            ),
            "{key}: {error:?}"
        );
    }
    // The limit of the rule: `Debug` shows a secret under a key it does not recognise...
    let typos_config: CoordinationConfig = toml::from_str(TYPOS).unwrap();
    assert!(format!("{typos_config:?}").contains(PASSWORD));
    assert!(format!("{typos_config:?}").contains(TOKEN));
    // ... but the errors rejecting such keys do not.
    let typos = LeaseProvider::new(typos_config);
    for (key, expected) in [
        ("e-typo", "unknown field `pasword`"),
        ("k-typo", "unknown field `bearer`"),
        ("lease-level-typo", "unknown setting \"pw\""),
    ] {
        let error = typos.get_lease("jobs", key, "node-1").unwrap_err();
        let texts = assert_error_clean(key, &error, &format!("{key:?}"));
        assert!(texts.contains(expected), "{key}: {texts}");
    }
}

#[test]
fn kubernetes_settings_session_and_lease_never_show_the_token() {
    let settings = KubernetesSettings::new(NAMESPACE)
        .with_api_url(CLOSED)
        .with_token(TOKEN);
    assert_clean("KubernetesSettings", &format!("{settings:?}"), NAMESPACE);
    assert_clean("KubernetesSettings", &format!("{settings:?}"), "<redacted>");
    let parsed: KubernetesSettings = serde_json::from_value(serde_json::json!({
        "namespace": NAMESPACE,
        "api-url": format!("http://admin:{PASSWORD}@127.0.0.1:1"),
        "token": TOKEN,
    }))
    .unwrap();
    assert_clean(
        "KubernetesSettings (deserialized)",
        &format!("{parsed:?}"),
        "http://<redacted>@127.0.0.1:1",
    );
    let error = parsed.validate().unwrap_err();
    assert_error_clean("KubernetesSettings::validate", &error, "api-url");
    let error = serde_json::from_value::<KubernetesSettings>(serde_json::json!({
        "namespace": NAMESPACE, "token": 918273645_u64,
    }))
    .unwrap_err();
    assert_error_clean("KubernetesSettings from a number", &error, "`token`");

    let session = KubernetesSession::new(settings.clone()).expect("valid settings, nothing read");
    assert_clean("KubernetesSession", &format!("{session:?}"), "<redacted>");
    let from_session = session.lease(LeaseSettings::new("jobs", "node-1").unwrap());
    assert_clean(
        "KubernetesLease (session)",
        &format!("{:?}", from_session.backend()),
        NAMESPACE,
    );
    let error = KubernetesSession::new(KubernetesSettings::new(NAMESPACE).with_token(TOKEN))
        .expect_err("the default CA file does not exist here");
    assert_error_clean("KubernetesSession::new", &error, "ca-file");
    let lease = KubernetesLease::new(LeaseSettings::new("jobs", "node-1").unwrap(), settings)
        .expect("valid settings, nothing read");
    assert_clean("KubernetesLease", &format!("{lease:?}"), "jobs");
    assert_clean(
        "KubernetesBackend",
        &format!("{:?}", lease.backend()),
        NAMESPACE,
    );
    let error = KubernetesLease::new(
        LeaseSettings::new("jobs", "node-1").unwrap(),
        KubernetesSettings::new(NAMESPACE).with_token(TOKEN),
    )
    .expect_err("the default CA file does not exist here");
    assert!(matches!(error, KubernetesError::ReadFile { .. }), "{error}");
    assert_error_clean("KubernetesLease::new", &error, "ca-file");
}

#[tokio::test]
async fn etcd_config_settings_session_and_lease_never_show_the_password() {
    let config = EtcdConfig {
        endpoints: vec![CLOSED.into(), format!("http://root:{PASSWORD}@127.0.0.1:2")],
        user: Some("app".into()),
        password: Some(PASSWORD.into()),
        ..EtcdConfig::default()
    };
    assert_clean("EtcdConfig", &format!("{config:?}"), "127.0.0.1:1");
    assert_clean(
        "EtcdConfig",
        &format!("{config:?}"),
        "<redacted>@127.0.0.1:2",
    );
    let error = EtcdSettings::from_config(&config).unwrap_err();
    assert_error_clean("EtcdSettings::from_config", &error, "endpoints");
    let parsed: EtcdConfig = toml::from_str(&format!(
        "endpoints = [\"{CLOSED}\"]\nuser = \"app\"\npassword = \"{PASSWORD}\"\n"
    ))
    .unwrap();
    assert_clean("EtcdConfig (TOML)", &format!("{parsed:?}"), "127.0.0.1:1");
    let error = EtcdSettings::from_section(&serde_json::json!({
        "endpoints": [CLOSED], "user": "app", "password": 564738291_u64,
    }))
    .unwrap_err();
    assert!(
        matches!(error, EtcdError::InvalidSettings { .. }),
        "{error}"
    );
    assert_error_clean("EtcdSettings::from_section", &error, "`password`");

    let builder = EtcdSettings::builder([CLOSED]).credentials("app", PASSWORD);
    assert_clean(
        "EtcdSettingsBuilder",
        &format!("{builder:?}"),
        "127.0.0.1:1",
    );
    let settings = builder.build().unwrap();
    assert_clean("EtcdSettings", &format!("{settings:?}"), "127.0.0.1:1");
    assert_clean("EtcdSettings", &format!("{settings:?}"), "\"app\"");
    let session = EtcdSession::new(settings);
    assert_clean("EtcdSession", &format!("{session:?}"), "127.0.0.1:1");
    let lease = EtcdLease::new(LeaseSettings::new("billing", "node-1").unwrap(), &session);
    assert_clean("EtcdLease", &format!("{lease:?}"), "billing");
    assert_clean(
        "EtcdBackend",
        &format!("{:?}", lease.backend()),
        "/actix-coordination/leases/billing",
    );
}

/// Acquiring against a closed port: the errors (with their whole chain) and every log line at
/// `trace` level, of this crate and of the clients, are free of secrets.
#[tokio::test]
async fn failing_acquires_neither_return_nor_log_a_secret() {
    let (logs, _guard) = common::logs::CapturedLogs::install();

    let provider = LeaseProvider::new(config());
    for (key, name) in [("k", "jobs"), ("e", "billing")] {
        let lease = provider.get_lease(name, key, "node-1").unwrap();
        let error = tokio::time::timeout(Duration::from_secs(30), lease.acquire())
            .await
            .expect("a closed port answers at once")
            .expect_err("nothing listens");
        assert_error_clean(&format!("acquire of {key}"), &error, "acquire");
        assert_clean(&format!("{key} after acquire"), &format!("{lease:?}"), name);
    }
    let logs = logs.text();
    assert_clean("logs", &logs, "acquire attempt failed");
    assert_clean("logs", &logs, "jobs");
    assert_clean("logs", &logs, "billing");
}
