//! The manifests in `deploy/` against the real kube-apiserver: every document of every file is
//! submitted with a server-side dry run (server-side apply, `dryRun=All`) and must be accepted, so
//! they stay valid; the server is shown to reject a broken Deployment the same way (the dry run
//! does validate) and to persist nothing. What the API server accepted is then checked against
//! what the service needs: three replicas, probes on `/healthz` and `/readyz`, the owner and the
//! namespace from the downward API, a grace period above the release time, the least-privilege
//! Role, and a configuration the crate accepts.

mod common;

use std::path::Path;

use actix_coordination::{
    CoordinationConfig, LeaseSettings, SingletonSettings, DEFAULT_OPERATION_TIMEOUT,
};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, ApiCapabilities, ApiResource, Scope};
use serde_json::{json, Value};

use common::k8s::{client, env};

/// Every YAML document of every `deploy/*.yaml`, as JSON, with the file it came from.
fn manifests() -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut documents = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(document)
                .unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
            if !value.is_null() {
                documents.push((name.clone(), value));
            }
        }
    }
    documents
}

/// The API of `object`'s kind, in its namespace if it is namespaced.
async fn api_for(object: &Value) -> (Api<DynamicObject>, ApiResource, ApiCapabilities) {
    let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", object["apiVersion"].as_str().unwrap()),
    };
    let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap());
    let client = client(&env().url, &env().admin_token);
    let (resource, capabilities) = discovery::pinned_kind(&client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("the API server does not serve {gvk:?}: {e}"));
    let api = match capabilities.scope {
        Scope::Namespaced => {
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .expect("namespaced objects name their namespace");
            Api::namespaced_with(client, namespace, &resource)
        }
        Scope::Cluster => Api::all_with(client, &resource),
    };
    (api, resource, capabilities)
}

/// Server-side apply of `object` as a dry run: what the API server would store.
async fn dry_run(object: &Value) -> Result<Value, kube::Error> {
    let (api, _, _) = api_for(object).await;
    let name = object["metadata"]["name"].as_str().unwrap();
    let params = PatchParams::apply("actix-coordination-deploy-test")
        .dry_run()
        .force();
    let applied = api.patch(name, &params, &Patch::Apply(object)).await?;
    Ok(serde_json::to_value(applied).unwrap())
}

fn find<'a>(documents: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    documents
        .iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/"))
}

#[tokio::test]
async fn every_manifest_passes_a_server_side_dry_run_and_nothing_is_stored() {
    let documents = manifests();
    let kinds: Vec<&str> = documents
        .iter()
        .map(|(_, d)| d["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in deploy/: {kinds:?}");
    }
    let mut accepted = Vec::new();
    for (file, object) in &documents {
        let applied = dry_run(object).await.unwrap_or_else(|e| {
            panic!(
                "{file}: the API server refused {} {}: {e}",
                object["kind"], object["metadata"]["name"]
            )
        });
        assert_eq!(applied["kind"], object["kind"]);
        assert_eq!(applied["metadata"]["name"], object["metadata"]["name"]);
        accepted.push(applied);
    }

    // A dry run stores nothing: the Deployment and its ConfigMap do not exist afterwards.
    for kind in ["Deployment", "ConfigMap", "Service"] {
        let object = find(&documents, kind, "actix-coordination-web-service");
        let (api, _, _) = api_for(object).await;
        assert!(
            api.get_opt("actix-coordination-web-service")
                .await
                .unwrap()
                .is_none(),
            "a dry run stored the {kind}"
        );
    }

    // The dry run validates: the same Deployment with an invalid container name and a negative
    // replica count is refused as invalid (422), naming the fields.
    let mut broken = find(&documents, "Deployment", "actix-coordination-web-service").clone();
    broken["spec"]["replicas"] = json!(-1);
    broken["spec"]["template"]["spec"]["containers"][0]["name"] = json!("Web_Service");
    match dry_run(&broken).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(status.message.contains("replicas"), "{status:?}");
            assert!(status.message.contains("name"), "{status:?}");
        }
        other => panic!("a broken Deployment was not refused: {other:?}"),
    }

    // What the API server accepted for the Deployment is what the service needs.
    let deployment = accepted.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 3);
    // The rollout the handover policy needs, as the API server stored it.
    assert_the_rollout_surges(deployment);
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "actix-coordination");
    let container = &pod["containers"][0];
    assert_eq!(container["ports"][0]["containerPort"], 8080);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "http", "{probe}");
    }
    let env_var = |name: &str| {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {container}"))
            .clone()
    };
    assert_eq!(
        env_var("POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(
        env_var("POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(
        env_var("ACTIX_COORD_CONFIG")["value"],
        "/etc/actix-coordination/config.toml"
    );
    // The candidacy: the revision and the advertised address (`Candidate::from_env`).
    assert_eq!(
        env_var(actix_coordination::CANDIDATE_POD_TEMPLATE_HASH_ENV)["valueFrom"]["fieldRef"]
            ["fieldPath"],
        "metadata.labels['pod-template-hash']"
    );
    assert_eq!(
        env_var(actix_coordination::CANDIDATE_ADDRESS_ENV)["value"],
        "http://$(POD_IP):8080"
    );
    assert_eq!(
        env_var("POD_IP")["valueFrom"]["fieldRef"]["fieldPath"],
        "status.podIP"
    );
    // SIGTERM stops the job (at most the stop timeout), then releases (at most the operation
    // timeout): the kubelet must wait longer than both before its SIGKILL.
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let release_time = SingletonSettings::default().stop_timeout + DEFAULT_OPERATION_TIMEOUT;
    assert!(
        grace > release_time.as_secs(),
        "terminationGracePeriodSeconds {grace} ≤ {release_time:?}"
    );

    // The ConfigMap's configuration is one the crate accepts, on the Kubernetes backend, and the
    // mount puts it where ACTIX_COORD_CONFIG points.
    let config_map = find(&documents, "ConfigMap", "actix-coordination-web-service");
    let config: CoordinationConfig =
        toml::from_str(config_map["data"]["config.toml"].as_str().unwrap()).unwrap();
    let lease = &config.leases["singleton"];
    assert_eq!(lease.backend, "kubernetes");
    LeaseSettings::builder("web-service-jobs", "pod-0")
        .timing(&lease.timing)
        .build()
        .expect("valid timing");
    assert_eq!(
        container["volumeMounts"][0]["mountPath"],
        "/etc/actix-coordination"
    );

    // The Role stays least-privilege: leases only; `patch` only for a bound claim decided from
    // the watch (a merge patch on the version it judged), `delete` only for `Lease::retire` (a
    // leaving node's member and candidacy objects).
    let role = find(&documents, "Role", "actix-coordination-lease");
    let rules = role["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(rules[0]["apiGroups"], json!(["coordination.k8s.io"]));
    assert_eq!(rules[0]["resources"], json!(["leases"]));
    assert_eq!(
        rules[0]["verbs"],
        json!(["get", "list", "watch", "create", "update", "patch", "delete"])
    );
}

/// The rollout the handover policy promises one leadership change for: a replica of the new
/// revision is started, and is ready, before any old replica stops (maxSurge ≥ 1, maxUnavailable
/// 0), so the leader, when its turn comes, has a new-revision candidate to hand over to. With
/// maxSurge 0 / maxUnavailable 1 an old replica stops first, and when it leads, leadership goes to
/// another old replica, then again to the new revision: two changes.
fn assert_the_rollout_surges(deployment: &Value) {
    let strategy = &deployment["spec"]["strategy"];
    assert_eq!(strategy["type"], "RollingUpdate", "{strategy}");
    let rolling = &strategy["rollingUpdate"];
    assert!(
        rolling["maxSurge"].as_u64().is_some_and(|n| n >= 1),
        "maxSurge must be at least 1 (a new candidate before an old replica stops): {strategy}"
    );
    assert_eq!(
        rolling["maxUnavailable"], 0,
        "maxUnavailable must be 0 (no old replica stops first): {strategy}"
    );
    assert!(
        deployment["spec"]["minReadySeconds"]
            .as_u64()
            .is_some_and(|s| s >= 1),
        "minReadySeconds gives the new candidate time to be seen: {}",
        deployment["spec"]
    );
}

/// The manifests as written promise what the crate does: a rollout that surges (see
/// [`assert_the_rollout_surges`]), and words about `delete` that match the Role (it grants
/// `delete` because member and candidacy leases are retired at shutdown): neither `rbac.yaml` nor
/// the README says the backend never deletes a Lease or that the Role has no `delete`.
#[test]
fn the_manifests_roll_with_a_surge_and_say_why_the_role_may_delete() {
    let documents = manifests();
    assert_the_rollout_surges(find(
        &documents,
        "Deployment",
        "actix-coordination-web-service",
    ));
    let role = find(&documents, "Role", "actix-coordination-lease");
    assert!(
        role["rules"][0]["verbs"]
            .as_array()
            .unwrap()
            .contains(&json!("delete")),
        "{role}"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rbac = std::fs::read_to_string(root.join("deploy/rbac.yaml")).unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    // Words as read: comment markers and line breaks left out.
    let flat = |text: &str| {
        text.lines()
            .map(|line| line.trim_start().trim_start_matches('#'))
            .flat_map(str::split_whitespace)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (rbac_flat, readme_flat) = (flat(&rbac), flat(&readme));
    for (file, text) in [
        ("deploy/rbac.yaml", &rbac_flat),
        ("README.md", &readme_flat),
    ] {
        let lower = text.to_lowercase();
        for claim in [
            "never deletes a lease",
            "no delete",
            "no `delete`",
            "maxsurge: 0",
            "`maxsurge: 0`",
        ] {
            assert!(!lower.contains(claim), "{file} still says {claim:?}");
        }
    }
    assert!(
        rbac_flat.contains("retire"),
        "rbac.yaml says why the Role grants delete"
    );
}

/// Whether `.dockerignore`'s `patterns` leave `path` (relative to the repository) out of the
/// build context; the forms it uses: `name` or `name/` at the root (and everything under it),
/// `**/name/` at any depth, `*.ext` for files at the root.
fn docker_ignores(patterns: &[String], path: &str) -> bool {
    let components: Vec<&str> = path.split('/').collect();
    patterns.iter().any(|pattern| {
        let pattern = pattern.trim_end_matches('/');
        if let Some(name) = pattern.strip_prefix("**/") {
            components.contains(&name)
        } else if let Some(extension) = pattern.strip_prefix("*.") {
            components.len() == 1 && path.ends_with(&format!(".{extension}"))
        } else {
            components[0] == pattern
        }
    })
}

/// `docker build -f deploy/Dockerfile .` sends neither build output nor history (`.dockerignore`),
/// and still every file `cargo build --example web_service` needs: the manifest, the lock file,
/// the library and every target the manifest declares (Cargo refuses a manifest whose declared
/// tests or benches are missing).
#[test]
fn the_docker_build_context_has_the_sources_and_leaves_out_target_and_git() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let patterns: Vec<String> = std::fs::read_to_string(root.join(".dockerignore"))
        .expect("a .dockerignore beside Cargo.toml")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    for left_out in [
        "target",
        "target/debug/deps",
        ".git",
        "docs/chaos",
        ".ci/dependent/target",
    ] {
        assert!(
            docker_ignores(&patterns, left_out),
            "{left_out} is sent: {patterns:?}"
        );
    }
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let mut needed = vec![
        "Cargo.toml".to_owned(),
        "Cargo.lock".to_owned(),
        "README.md".to_owned(),
        "src/lib.rs".to_owned(),
    ];
    for (section, dir) in [
        ("test", "tests"),
        ("bench", "benches"),
        ("example", "examples"),
    ] {
        for target in manifest[section].as_array().unwrap() {
            needed.push(format!("{dir}/{}.rs", target["name"].as_str().unwrap()));
        }
    }
    assert!(needed.contains(&"examples/web_service.rs".to_owned()));
    for path in &needed {
        assert!(root.join(path).exists(), "{path} is declared but missing");
        assert!(
            !docker_ignores(&patterns, path),
            "{path} is left out: {patterns:?}"
        );
    }
}
