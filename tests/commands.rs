//! Every command the documentation shows runs as shown (issue 36): the commands of README.md's
//! shell blocks and its inline `cargo run` spans, and those of the command blocks in the header
//! of each `examples/*.rs`, read from the documents themselves (`common::doc_commands`), so that
//! a command added to a document is run here too, or fails
//! `every_documented_command_is_run_or_excluded` until this file knows how to run it.
//!
//! Each `cargo run --example` command runs the example's binary with the arguments shown, from
//! the repository's root as the documents assume, on the shipped configuration file it names.
//! Only what a real deployment's environment gives is added to that file: the endpoints of its
//! `etcd` sections become the test cluster's etcd (the shipped `127.0.0.1:2379` is a local
//! etcd's), and its `kubernetes` sections, which rely on a pod's in-cluster API URL, token and CA,
//! get the test cluster's (`api-url`, `ca-file`, and the token of `lease-holder` as `token-file`;
//! `lease-holder` is granted the Role of `deploy/rbac.yaml` in the namespace the file names, as
//! a pod's service account would be). Nothing else changes: the config keys, backends, timing and
//! namespaces are the shipped ones. The binary is the one this test run built (every feature in
//! `scripts/test.sh`); that the command's own `--features` suffice is checked statically, against
//! the example's `required-features` and the backends of the configuration it names.
//!
//! The commands of one block that run one example on one configuration run together, as the
//! documents mean them ("start it in several terminals"). What each example must do:
//! * the in-memory demos (`failover`, `sharding`, `sharded_workers`) run to their end, exit 0 and
//!   print what the README says they show;
//! * `singleton_node`: exactly one node runs the singleton and works under its fencing token;
//!   SIGTERM to the one running it stops it, another node (if any) takes over under a higher
//!   token, and the node exits 0 after its graceful shutdown;
//! * `sharded_node`: the nodes run every shard of the group between them; on SIGTERM a node
//!   releases every lease and exits 0, and the others (if any) take its shards over;
//! * `web_service`: every replica answers `/healthz` and `/readyz`, exactly one runs the job and
//!   every replica names it on `/leader`; SIGTERM to the leader releases the lease and the
//!   process exits 0, and another replica (if any) takes the job over under a higher token.
//! * `counters`: in memory, the demo runs to its end, exits 0 and prints its checks; on etcd or
//!   Kubernetes (the store directory the commands name cleared first: tokens of another backend
//!   would fence this one's writes), the replicas run every shard between them, increments sent
//!   to one are counted once, whichever replica is asked, and on SIGTERM each replica exits 0,
//!   the others keeping every count.
//!
//! Commands the test cannot run are listed in [`NOT_RUN`] with the reason; a command neither run
//! nor listed fails the test, and so does a listed one that the documents no longer show.
//!
//! The in-memory commands run in every build that has the features they name (with no feature:
//! the three demos; a command whose features this build lacks is named in the output, and runs in
//! the build with every feature); the etcd and the Kubernetes commands need the test cluster
//! (`scripts/test-cluster.sh`), as every test of those backends does. Waits are on log lines and
//! HTTP answers, with deadlines sized for a loaded machine.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::doc_commands::{documented_commands, required_features, CargoRun, DocCommand};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The documented commands this test does not run, and why. Each must be in a document.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "scripts/test.sh",
        "runs the whole test suite, this test included: CI runs it (the last step of .ci/run)",
    ),
    (
        "docker build -f deploy/Dockerfile -t actix-coordination/web-service:0.1.0 .",
        "needs docker, which the test machine does not have",
    ),
    (
        "kubectl apply -f deploy/rbac.yaml -f deploy/web-service.yaml",
        "needs a cluster whose nodes run pods (the test cluster is an API server alone) and the \
         image built above; tests/deploy.rs submits every document of both files to the test \
         API server instead (server-side dry run)",
    ),
    (
        "kubectl -n actix-coordination-test get lease web-service-jobs -o yaml",
        "reads the Lease of the Deployment applied above, which needs a cluster that runs pods",
    ),
    (
        "kubectl -n actix-coordination-test rollout restart deployment/actix-coordination-web-service",
        "needs a cluster that runs pods and a Deployment controller; tests/rollout.rs rolls \
         example processes the way a Deployment does instead",
    ),
];

/// How long a node may take to start, claim, settle or stop (a loaded machine; a lease left by
/// an earlier run expires within the shipped TTL of 6 s).
const WITHIN: Duration = Duration::from_secs(90);
/// How long a demo may take to run to its end (about 10 s on an idle machine).
const DEMO_WITHIN: Duration = Duration::from_secs(300);

/// What the test knows of an example: how to tell that it did what its documents say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Failover,
    Sharding,
    ShardedWorkers,
    SingletonNode,
    ShardedNode,
    WebService,
    Counters,
}

impl Scenario {
    fn of(example: &str) -> Option<Self> {
        Some(match example {
            "failover" => Self::Failover,
            "sharding" => Self::Sharding,
            "sharded_workers" => Self::ShardedWorkers,
            "singleton_node" => Self::SingletonNode,
            "sharded_node" => Self::ShardedNode,
            "web_service" => Self::WebService,
            "counters" => Self::Counters,
            _ => return None,
        })
    }

    /// The config key the example uses without `--config-key` (its header says so), and whether
    /// it needs `--config` (the demos take none; `web_service` runs in memory without one).
    fn config(self) -> Option<(&'static str, bool)> {
        match self {
            Self::Failover | Self::Sharding | Self::ShardedWorkers => None,
            Self::SingletonNode => Some(("singleton", true)),
            Self::ShardedNode => Some(("sharded", true)),
            Self::WebService => Some(("singleton", false)),
            Self::Counters => Some(("sharded", false)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Backend {
    InMemory,
    Etcd,
    Kubernetes,
}

impl Backend {
    fn of(name: &str) -> Option<Self> {
        Some(match name {
            "in-memory" => Self::InMemory,
            "etcd" => Self::Etcd,
            "kubernetes" => Self::Kubernetes,
            _ => return None,
        })
    }

    /// The cargo feature the backend needs.
    fn feature(self) -> Option<&'static str> {
        match self {
            Self::InMemory => None,
            Self::Etcd => Some("etcd"),
            Self::Kubernetes => Some("kubernetes"),
        }
    }
}

/// Commands run together: one block's commands of one example on one configuration.
#[derive(Debug)]
struct Group {
    /// Where the documents show its commands (each command's places, joined).
    sources: Vec<String>,
    texts: Vec<String>,
    runs: Vec<CargoRun>,
    scenario: Scenario,
    backend: Backend,
    /// The `--config` file as shown (relative to the repository's root).
    config: Option<String>,
    /// The features the commands turn on (every one for `--all-features`).
    features: BTreeSet<String>,
}

/// Every documented command, sorted into the groups this test runs and the ones it does not,
/// with every problem found on the way (a command it cannot classify, a stale [`NOT_RUN`] entry,
/// a command whose features or configuration cannot work).
struct Plan {
    commands: Vec<DocCommand>,
    groups: Vec<Group>,
    not_run: Vec<(DocCommand, &'static str)>,
    problems: Vec<String>,
}

const CRATE_FEATURES: [&str; 5] = ["kubernetes", "etcd", "metrics", "web", "web-forward"];

fn plan() -> Plan {
    let root = Path::new(ROOT);
    let commands = documented_commands(root);
    let required = required_features(root);
    let mut problems = Vec::new();
    let mut not_run = Vec::new();
    // (block, example, config, features) -> group
    let mut groups: BTreeMap<(String, String, Option<String>, Vec<String>), Group> =
        BTreeMap::new();
    for command in &commands {
        if let Some((_, why)) = NOT_RUN.iter().find(|(text, _)| *text == command.text) {
            not_run.push((command.clone(), *why));
            continue;
        }
        let run = match CargoRun::parse(&command.text) {
            None => {
                problems.push(format!(
                    "{}: `{}`: tests/commands.rs does not know how to run it (neither a `cargo \
                     run --example` nor in NOT_RUN with a reason)",
                    command.source, command.text
                ));
                continue;
            }
            Some(Err(e)) => {
                problems.push(format!("{}: {e}", command.source));
                continue;
            }
            Some(Ok(run)) => run,
        };
        let place = format!("{}: `{}`", command.source, command.text);
        if !root
            .join("examples")
            .join(format!("{}.rs", run.example))
            .exists()
        {
            problems.push(format!("{place}: there is no example {}", run.example));
            continue;
        }
        let Some(scenario) = Scenario::of(&run.example) else {
            problems.push(format!(
                "{place}: tests/commands.rs has no scenario for the example {}: add one",
                run.example
            ));
            continue;
        };
        let features: BTreeSet<String> = CRATE_FEATURES
            .iter()
            .filter(|f| run.has_feature(f))
            .map(|f| (*f).to_owned())
            .collect();
        for feature in required.get(&run.example).into_iter().flatten() {
            if !run.has_feature(feature) {
                problems.push(format!(
                    "{place}: the example needs the feature {feature} (required-features), \
                     which the command does not turn on"
                ));
            }
        }
        let config = run.arg("--config").map(str::to_owned);
        let backend = match (scenario.config(), &config) {
            (None, None) => Backend::InMemory,
            (None, Some(_)) => {
                problems.push(format!("{place}: {} takes no --config", run.example));
                continue;
            }
            (Some((_, true)), None) => {
                problems.push(format!("{place}: {} needs --config FILE", run.example));
                continue;
            }
            (Some(_), None) => Backend::InMemory,
            (Some((default_key, _)), Some(file)) => {
                let key = run.arg("--config-key").unwrap_or(default_key);
                match config_backend(root, file, key) {
                    Ok(backend) => backend,
                    Err(e) => {
                        problems.push(format!("{place}: {e}"));
                        // Still run it: the example must fail the same way.
                        match shipped_backend_guess(root, file) {
                            Some(backend) => backend,
                            None => continue,
                        }
                    }
                }
            }
        };
        if let Some(feature) = backend.feature() {
            if !run.has_feature(feature) {
                problems.push(format!(
                    "{place}: its configuration uses the {feature} backend, whose feature the \
                     command does not turn on"
                ));
            }
        }
        let key = (
            command.block.clone(),
            run.example.clone(),
            config.clone(),
            features.iter().cloned().collect(),
        );
        let group = groups.entry(key).or_insert_with(|| Group {
            sources: Vec::new(),
            texts: Vec::new(),
            runs: Vec::new(),
            scenario,
            backend,
            config,
            features,
        });
        group.sources.push(command.source.clone());
        group.texts.push(command.text.clone());
        group.runs.push(run);
    }
    // The same commands shown in several places run once.
    let mut unique: Vec<Group> = Vec::new();
    for group in groups.into_values() {
        match unique.iter_mut().find(|g| g.texts == group.texts) {
            Some(same) => same.sources.extend(group.sources),
            None => unique.push(group),
        }
    }
    // In document order: the README first, then the examples.
    let place = |g: &Group| {
        let source = &g.sources[0];
        let (file, rest) = source.split_once(':').unwrap_or((source, ""));
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        (
            file != "README.md",
            file.to_owned(),
            rest[..digits].parse().unwrap_or(0usize),
        )
    };
    unique.sort_by_key(place);
    for (text, _) in NOT_RUN {
        if !commands.iter().any(|c| c.text == *text) {
            problems.push(format!(
                "NOT_RUN lists `{text}`, which no document shows any more: remove it"
            ));
        }
    }
    Plan {
        commands,
        groups: unique,
        not_run,
        problems,
    }
}

/// The backend of `[leases.<key>]` in the shipped `file`.
fn config_backend(root: &Path, file: &str, key: &str) -> Result<Backend, String> {
    let text = std::fs::read_to_string(root.join(file)).map_err(|e| format!("{file}: {e}"))?;
    let config: actix_coordination::CoordinationConfig =
        toml::from_str(&text).map_err(|e| format!("{file} is not a CoordinationConfig: {e}"))?;
    let Some(lease) = config.leases.get(key) else {
        return Err(format!(
            "{file} has no [leases.{key}] (the config key the command uses; it has {:?})",
            config.leases.keys().collect::<Vec<_>>()
        ));
    };
    Backend::of(&lease.backend).ok_or_else(|| {
        format!(
            "{file}: [leases.{key}] names the backend {:?}, which tests/commands.rs does not know",
            lease.backend
        )
    })
}

/// The one backend every lease configuration of `file` uses, if there is one.
fn shipped_backend_guess(root: &Path, file: &str) -> Option<Backend> {
    let text = std::fs::read_to_string(root.join(file)).ok()?;
    let config: actix_coordination::CoordinationConfig = toml::from_str(&text).ok()?;
    let backends: BTreeSet<&str> = config.leases.values().map(|l| l.backend.as_str()).collect();
    match backends.into_iter().collect::<Vec<_>>()[..] {
        [one] => Backend::of(one),
        _ => None,
    }
}

/// The documents' commands are all known: each runs in a group, or is in [`NOT_RUN`] with its
/// reason; the features each command turns on suffice for its example and its configuration,
/// and the configuration has the config key the command uses. Runs in every build (no server).
#[test]
fn every_documented_command_is_run_or_excluded() {
    let plan = plan();
    println!("{} documented commands:", plan.commands.len());
    for group in &plan.groups {
        println!(
            "  run together ({:?}, {:?}, features {:?}), shown at {}:",
            group.scenario,
            group.backend,
            group.features,
            group.sources.join(", ")
        );
        for text in &group.texts {
            println!("      {text}");
        }
    }
    for (command, why) in &plan.not_run {
        println!("  NOT RUN {}: `{}`: {why}", command.source, command.text);
    }
    assert!(
        plan.problems.is_empty(),
        "documented commands that cannot run as shown:\n  {}",
        plan.problems.join("\n  ")
    );
    // The documents this test exists for are read: a reader that found nothing would pass.
    for example in ["failover", "singleton_node", "sharded_node", "web_service"] {
        assert!(
            plan.groups
                .iter()
                .any(|g| g.runs.iter().any(|r| r.example == example)),
            "no command runs the {example} example"
        );
    }
    assert!(plan.groups.iter().any(|g| g.backend == Backend::Etcd));
    assert!(plan.groups.iter().any(|g| g.backend == Backend::Kubernetes));
}

/// The reader of the documents on made-up ones: shell and console blocks, inline spans over a
/// line break, a comment's variant; no Rust block, nothing after a header.
#[test]
fn the_reader_finds_the_commands_of_made_up_documents() {
    common::doc_commands::self_check();
}

/// The in-memory commands: the three demos (in every build) and `web_service` without
/// `--config` (in a build with `metrics` and `web`).
#[test]
fn in_memory_commands_run_as_documented() {
    run_backend(Backend::InMemory);
}

/// The commands on `examples/etcd.toml`, against the test cluster's etcd.
#[cfg(feature = "etcd")]
#[test]
fn etcd_commands_run_as_documented() {
    run_backend(Backend::Etcd);
}

/// The commands on `examples/kubernetes.toml`, against the test cluster's kube-apiserver.
#[cfg(feature = "kubernetes")]
#[test]
fn kubernetes_commands_run_as_documented() {
    run_backend(Backend::Kubernetes);
}

/// Runs every group on `backend` whose features this build has; reports every failure at the
/// end (each group's processes are killed when it fails).
fn run_backend(backend: Backend) {
    let plan = plan();
    let built: BTreeSet<String> = common::build_features()
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mut failures = Vec::new();
    let mut ran = 0;
    for group in plan.groups.iter().filter(|g| g.backend == backend) {
        let missing: Vec<&String> = group.features.difference(&built).collect();
        if !missing.is_empty() {
            println!(
                "NOT RUN IN THIS BUILD (it lacks the features {missing:?}; the build with every \
                 feature runs it): {}: {}",
                group.sources.join(", "),
                group.texts.join(" & ")
            );
            continue;
        }
        println!(
            "[{backend:?}] {}:\n   {}",
            group.sources.join(", "),
            group.texts.join("\n   ")
        );
        let started = Instant::now();
        let dir = scratch(&group.sources[0]);
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_group(group, &dir)));
        match result {
            Ok(()) => {
                // The logs of a group that failed stay (the failure names the directory).
                let _ = std::fs::remove_dir_all(&dir);
                ran += 1;
                println!(
                    "[{backend:?}] {}: ok in {:.1} s",
                    group.sources.join(", "),
                    started.elapsed().as_secs_f64()
                );
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                failures.push(format!(
                    "{}:\n  {}\n  (logs in {})\n  {message}",
                    group.sources.join(", "),
                    group.texts.join("\n  "),
                    dir.display()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} documented command group(s) on {backend:?} did not do what the documents say:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    if CRATE_FEATURES.iter().all(|f| built.contains(*f)) {
        assert!(ran > 0, "no command on {backend:?} ran");
    }
}

fn run_group(group: &Group, dir: &Path) {
    let bin = common::example_binary_as_built(&group.runs[0].example);
    let config = group
        .config
        .as_ref()
        .map(|file| test_config(Path::new(ROOT).join(file), dir));
    let args = |run: &CargoRun| -> Vec<String> {
        let mut args = run.args.clone();
        if let Some(config) = &config {
            let at = args.iter().position(|a| a == "--config").unwrap();
            args[at + 1] = config.display().to_string();
        }
        args
    };
    match group.scenario {
        Scenario::Failover | Scenario::Sharding | Scenario::ShardedWorkers => {
            assert_eq!(group.runs.len(), 1, "a demo is one process");
            demo(group.scenario, &bin, dir);
        }
        Scenario::SingletonNode => {
            let nodes = start_nodes(group, &bin, dir, args);
            singleton_nodes(nodes);
        }
        Scenario::ShardedNode => {
            let nodes = start_nodes(group, &bin, dir, args);
            sharded_nodes(nodes);
        }
        Scenario::Counters if group.backend == Backend::InMemory => {
            assert_eq!(group.runs.len(), 1, "the in-memory demo is one process");
            counters_demo(&bin, &args(&group.runs[0]), dir);
        }
        Scenario::WebService | Scenario::Counters => {
            // The documents' fixed ports (8080 …): one group at a time.
            let _ports = PORTS.lock().unwrap_or_else(|p| p.into_inner());
            let listen: Vec<String> = group
                .runs
                .iter()
                // The example's own default without `--listen`.
                .map(|r| r.arg("--listen").unwrap_or("0.0.0.0:8080").to_owned())
                .collect();
            for address in &listen {
                assert!(
                    std::net::TcpListener::bind(address.as_str()).is_ok(),
                    "{address}, where the documented command listens, is in use on this machine"
                );
            }
            if group.scenario == Scenario::Counters {
                // A fresh store: its tokens are those of one lease store only.
                for store in group.runs.iter().filter_map(|r| r.arg("--store")) {
                    let _ = std::fs::remove_dir_all(Path::new(ROOT).join(store));
                }
            }
            let nodes = start_nodes(group, &bin, dir, args);
            let replicas = nodes
                .into_iter()
                .zip(listen)
                .map(|(node, listen)| Replica {
                    address: listen.replace("0.0.0.0", "127.0.0.1"),
                    node,
                })
                .collect();
            match group.scenario {
                Scenario::Counters => counter_replicas(replicas),
                _ => web_services(replicas, group.backend),
            }
        }
    }
}

/// The documents' fixed ports: the groups that listen on them run one at a time.
static PORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn scratch(source: &str) -> PathBuf {
    let name: String = source
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let dir = Path::new(ROOT)
        .join("target")
        .join("commands")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The shipped configuration `shipped`, written to `dir` with what a deployment's environment
/// gives (see the header): the test cluster's etcd endpoints, the Kubernetes API URL, CA and
/// token. Everything else is as shipped.
fn test_config(shipped: PathBuf, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(&shipped).unwrap();
    let mut config: toml::Table = toml::from_str(&text).unwrap();
    if let Some(leases) = config.get_mut("leases").and_then(|l| l.as_table_mut()) {
        for (_, lease) in leases.iter_mut() {
            let Some(lease) = lease.as_table_mut() else {
                continue;
            };
            match lease.get("backend").and_then(|b| b.as_str()) {
                Some("etcd") => etcd_environment(lease, dir),
                Some("kubernetes") => kubernetes_environment(lease, dir),
                _ => {}
            }
        }
    }
    let path = dir.join(shipped.file_name().unwrap());
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    path
}

#[cfg(feature = "etcd")]
fn etcd_environment(lease: &mut toml::Table, _dir: &Path) {
    let section = lease
        .entry("etcd")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .unwrap();
    section.insert(
        "endpoints".into(),
        toml::Value::Array(vec![toml::Value::String(common::etcd::endpoint())]),
    );
}

#[cfg(not(feature = "etcd"))]
fn etcd_environment(_: &mut toml::Table, _: &Path) {
    unreachable!("the etcd commands run in builds with the etcd feature only")
}

#[cfg(feature = "kubernetes")]
fn kubernetes_environment(lease: &mut toml::Table, dir: &Path) {
    let env = common::k8s::env();
    let token = dir.join("lease-holder.token");
    std::fs::write(&token, &env.token).unwrap();
    let section = lease
        .entry("kubernetes")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .unwrap();
    let namespace = section
        .get("namespace")
        .and_then(|n| n.as_str())
        .expect("a kubernetes section names its namespace")
        .to_owned();
    grant_the_shipped_role(&namespace);
    for (key, value) in [
        ("api-url", env.url.clone()),
        ("ca-file", env.ca.display().to_string()),
        ("token-file", token.display().to_string()),
    ] {
        section.insert(key.into(), toml::Value::String(value));
    }
}

#[cfg(not(feature = "kubernetes"))]
fn kubernetes_environment(_: &mut toml::Table, _: &Path) {
    unreachable!("the Kubernetes commands run in builds with the kubernetes feature only")
}

/// Binds the Role of `deploy/rbac.yaml` to the test user `lease-holder` in `namespace` (as
/// `scripts/test-cluster.sh` does in the test namespace), with the admin's token: the shipped
/// configuration's namespace gets the rights a deployment would give its service account there.
#[cfg(feature = "kubernetes")]
fn grant_the_shipped_role(namespace: &str) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::{Api, Patch, PatchParams};
    let rbac = std::fs::read_to_string(Path::new(ROOT).join("deploy/rbac.yaml")).unwrap();
    let mut roles = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&rbac) {
        let mut value: serde_json::Value = serde::Deserialize::deserialize(document).unwrap();
        if value["kind"] == "Role" {
            value["metadata"]["namespace"] = namespace.into();
            roles.push(value);
        }
    }
    assert!(!roles.is_empty(), "deploy/rbac.yaml defines no Role");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let env = common::k8s::env();
        let admin = common::k8s::client(&env.url, &env.admin_token);
        let params = PatchParams::apply("actix-coordination-tests-commands").force();
        for role in roles {
            let name = role["metadata"]["name"].as_str().unwrap().to_owned();
            Api::<Role>::namespaced(admin.clone(), namespace)
                .patch(&name, &params, &Patch::Apply(&role))
                .await
                .unwrap_or_else(|e| panic!("apply Role {namespace}/{name}: {e}"));
            let binding = serde_json::json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": format!("{name}-test-user"), "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "lease-holder"}],
            });
            Api::<RoleBinding>::namespaced(admin.clone(), namespace)
                .patch(&format!("{name}-test-user"), &params, &Patch::Apply(&binding))
                .await
                .unwrap_or_else(|e| panic!("apply RoleBinding {namespace}/{name}-test-user: {e}"));
        }
    });
}

/// A process of a documented command; killed if the test fails while it runs.
struct Node {
    label: String,
    child: Child,
    log: PathBuf,
    status: Option<ExitStatus>,
}

impl Node {
    fn start(bin: &Path, args: &[String], dir: &Path, label: &str) -> Self {
        let log = dir.join(format!("{label}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(bin);
        command
            .args(args)
            .current_dir(ROOT)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        // As a user's shell runs it: none of the variables the examples read (the test's own
        // environment may have some).
        for variable in [
            "RUST_LOG",
            "POD_NAME",
            "POD_NAMESPACE",
            "POD_TEMPLATE_HASH",
            "ACTIX_COORD_CONFIG",
            "ACTIX_COORDINATION_REVISION",
            "ACTIX_COORDINATION_ADDRESS",
        ] {
            command.env_remove(variable);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        Node {
            label: label.to_owned(),
            child,
            log,
            status: None,
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().unwrap();
        }
        self.status
    }

    fn terminate(&mut self) {
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0, "SIGTERM to {}", self.label);
    }

    /// Waits for the process to end by itself (within `within`); answers how it ended.
    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let give_up = Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                Instant::now() < give_up,
                "{} did not exit within {within:?}:\n{}",
                self.label,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then a successful exit within [`WITHIN`] whose output has every line of `says`.
    fn stops_gracefully(&mut self, says: &[&str]) {
        self.terminate();
        let status = self.wait_exit(WITHIN);
        let output = self.output();
        assert!(
            status.success(),
            "{} exited with {status} after SIGTERM:\n{output}",
            self.label
        );
        for line in says {
            assert!(
                output.contains(line),
                "{} did not say {line:?} when stopped:\n{output}",
                self.label
            );
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What [`wait_until`] watches: a [`Node`], or something that has one.
trait Process {
    fn node(&mut self) -> &mut Node;
}

impl Process for Node {
    fn node(&mut self) -> &mut Node {
        self
    }
}

/// Polls `condition` every 20 ms until it holds, for at most `within`; fails at once, with its
/// output, when a process has exited, and with every process's output on the deadline.
fn wait_until<P: Process>(
    processes: &mut [P],
    within: Duration,
    what: &str,
    mut condition: impl FnMut(&mut [P]) -> bool,
) {
    let give_up = Instant::now() + within;
    loop {
        if condition(processes) {
            return;
        }
        for process in processes.iter_mut() {
            let node = process.node();
            if let Some(status) = node.exited() {
                panic!(
                    "{} exited ({status}) while the test waited for {what}:\n{}",
                    node.label,
                    node.output()
                );
            }
        }
        if Instant::now() >= give_up {
            let outputs: Vec<String> = processes
                .iter_mut()
                .map(|p| {
                    let node = p.node();
                    format!("--- {}:\n{}", node.label, node.output())
                })
                .collect();
            panic!("{what}: not within {within:?}\n{}", outputs.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start_nodes(
    group: &Group,
    bin: &Path,
    dir: &Path,
    args: impl Fn(&CargoRun) -> Vec<String>,
) -> Vec<Node> {
    group
        .runs
        .iter()
        .enumerate()
        .map(|(i, run)| {
            let label = run
                .arg("--owner")
                .map_or_else(|| format!("process-{}", i + 1), str::to_owned);
            Node::start(bin, &args(run), dir, &label)
        })
        .collect()
}

/// A demo runs to its end, exits 0, and shows what the README says it shows.
fn demo(scenario: Scenario, bin: &Path, dir: &Path) {
    let mut node = Node::start(bin, &[], dir, "demo");
    let status = node.wait_exit(DEMO_WITHIN);
    let output = node.output();
    assert!(status.success(), "exited with {status}:\n{output}");
    let says = |line: &str| {
        assert!(output.contains(line), "no {line:?} in:\n{output}");
    };
    match scenario {
        Scenario::Failover => {
            // A freeze taken over after the TTL, a graceful stop handed over at once, the
            // nodes left shut down one after the other, and the example's own checks.
            says("FREEZES");
            says("took over");
            says("after the freeze");
            says("after the graceful stop began");
            says("every node is down: the demo is over");
            says("checked: never two singletons at once, fencing tokens strictly rising");
        }
        Scenario::Sharding => {
            // The active coordinator cut off: its pending allocations rejected at its deadline,
            // the standby serving under a higher token.
            says("holds the lease\n");
            says("pending allocation rejected: tenure ended");
            says("holds the lease now");
            says("(token 2)");
            says("the demo is over");
        }
        Scenario::ShardedWorkers => {
            // "three nodes take 8 of 24 shards each, a fourth joins and takes exactly 6, a node
            // shuts down and exactly its shards move, a frozen node's shards move after its TTL,
            // and a rolling update replaces the nodes one at a time" (README).
            let steps = demo_steps(&output);
            let step = |title: &str| {
                steps
                    .iter()
                    .find(|s| s.title.starts_with(title))
                    .unwrap_or_else(|| panic!("no step {title:?} in:\n{output}"))
            };
            let started = step("1. three nodes start");
            assert_eq!(
                started.shards,
                [("node-1", 8), ("node-2", 8), ("node-3", 8)].map(own)
            );
            let joined = step("2. node-4 joins");
            assert_eq!(joined.moved, 6, "{output}");
            assert!(joined.shards.contains(&own(("node-4", 6))), "{output}");
            let left = step("3. node-2 shut down");
            assert_eq!(left.moved, 6, "exactly node-2's 6 shards move:\n{output}");
            let frozen = step("4. node-3 froze");
            assert_eq!(frozen.moved, 8, "exactly node-3's 8 shards move:\n{output}");
            assert!(
                steps
                    .iter()
                    .any(|s| s.title == "5. rolling update: node-4 shut down"),
                "{output}"
            );
            says("node-5: released everything: true");
            says("node-6: released everything: true");
        }
        _ => unreachable!(),
    }
}

fn own((node, shards): (&str, usize)) -> (String, usize) {
    (node.to_owned(), shards)
}

/// A step of the `sharded_workers` demo: its title, how many shards moved, who runs how many.
struct DemoStep {
    title: String,
    moved: usize,
    shards: Vec<(String, usize)>,
}

fn demo_steps(output: &str) -> Vec<DemoStep> {
    let mut steps = Vec::new();
    for paragraph in output.split("\n\n") {
        let mut lines = paragraph.lines();
        let (Some(title), Some(settled)) = (lines.next(), lines.next()) else {
            continue;
        };
        let Some(moved) = settled
            .split_once("; ")
            .and_then(|(_, m)| m.strip_suffix(" shard(s) moved"))
            .and_then(|m| m.parse().ok())
        else {
            continue;
        };
        let shards = lines
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                let node = words.next()?;
                let count = words.next()?.parse().ok()?;
                Some((node.to_owned(), count))
            })
            .collect();
        steps.push(DemoStep {
            title: title.to_owned(),
            moved,
            shards,
        });
    }
    steps
}

/// The fencing tokens a `singleton_node` started its singleton with, and whether it runs one now.
fn singleton_state(output: &str) -> (Vec<u64>, bool) {
    let mut tokens = Vec::new();
    let mut running = false;
    for line in output.lines() {
        if let Some((_, token)) = line.split_once("singleton STARTED with fencing token ") {
            tokens.push(token.trim().parse().unwrap());
            running = true;
        } else if line.contains("singleton STOPPED") {
            running = false;
        }
    }
    (tokens, running)
}

/// `singleton_node` processes: exactly one runs the singleton at a time; SIGTERM to it moves the
/// singleton to another node under a higher token, until every node has stopped gracefully.
fn singleton_nodes(mut nodes: Vec<Node>) {
    wait_until(&mut nodes, WITHIN, "every node competes", |nodes| {
        nodes
            .iter()
            .all(|n| n.output().contains("] competing for lease"))
    });
    let mut last_token = 0;
    while !nodes.is_empty() {
        let mut leader = 0;
        wait_until(
            &mut nodes,
            WITHIN,
            &format!("one node running the singleton under a token above {last_token}"),
            |nodes| {
                let running: Vec<usize> = (0..nodes.len())
                    .filter(|&i| singleton_state(&nodes[i].output()).1)
                    .collect();
                assert!(running.len() <= 1, "two singletons at once");
                match running[..] {
                    [one] => {
                        leader = one;
                        true
                    }
                    _ => false,
                }
            },
        );
        let token = *singleton_state(&nodes[leader].output()).0.last().unwrap();
        assert!(
            token > last_token,
            "fencing token {token} after {last_token}"
        );
        let working = format!("working with fencing token {token} (step");
        wait_until(
            &mut nodes,
            WITHIN,
            &format!("the singleton working under token {token}"),
            |nodes| nodes[leader].output().contains(&working),
        );
        let mut stopped = nodes.remove(leader);
        stopped.stops_gracefully(&["singleton STOPPED", "] shut down"]);
        last_token = token;
    }
}

/// The number of shards a `sharded_node` runs, from its last report.
fn shards_running(output: &str) -> Option<usize> {
    output.lines().rev().find_map(|line| {
        let (_, rest) = line.split_once("] runs ")?;
        rest.strip_suffix(" shard(s)")?.parse().ok()
    })
}

/// `sharded_node` processes: between them they run every shard of the group; each stops
/// gracefully on SIGTERM, releasing every lease, and the others take its shards over.
fn sharded_nodes(mut nodes: Vec<Node>) {
    let mut shards = 0;
    wait_until(&mut nodes, WITHIN, "every node started", |nodes| {
        let totals: BTreeSet<usize> = nodes
            .iter()
            .filter_map(|n| {
                let output = n.output();
                let (_, rest) = output.split_once("] running up to ")?;
                rest.split_whitespace().next()?.parse().ok()
            })
            .collect();
        match totals.into_iter().collect::<Vec<_>>()[..] {
            [n] if nodes
                .iter()
                .all(|node| node.output().contains("] running up to ")) =>
            {
                shards = n;
                true
            }
            _ => false,
        }
    });
    assert!(shards > 0);
    while !nodes.is_empty() {
        wait_until(
            &mut nodes,
            WITHIN,
            &format!("the nodes running all {shards} shards between them"),
            |nodes| {
                let counts: Vec<Option<usize>> =
                    nodes.iter().map(|n| shards_running(&n.output())).collect();
                counts
                    .iter()
                    .all(|c| c.is_some_and(|c| c > 0 || shards < nodes.len()))
                    && counts.iter().flatten().sum::<usize>() == shards
            },
        );
        let mut stopped = nodes.remove(0);
        stopped.stops_gracefully(&[
            "shutting down: handing every shard over",
            "released every lease",
            "] shut down",
        ]);
    }
}

/// A `web_service` process and the address it listens on.
struct Replica {
    node: Node,
    address: String,
}

impl Process for Replica {
    fn node(&mut self) -> &mut Node {
        &mut self.node
    }
}

impl Replica {
    /// `GET path`: status and body; `None` when nothing answers.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = std::net::TcpStream::connect(&self.address).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.address
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    }

    fn answers(&self, path: &str, status: u16) -> bool {
        self.get(path).is_some_and(|(s, _)| s == status)
    }

    /// The JSON of a `200` answer to `GET path`.
    fn json(&self, path: &str) -> Option<serde_json::Value> {
        match self.get(path)? {
            (200, body) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }
}

/// `web_service` replicas: every one healthy and ready, exactly one running the job and named
/// leader by every replica; SIGTERM to the leader releases the lease before it exits 0, and the
/// job moves to another replica under a higher token, until every replica has stopped.
fn web_services(mut replicas: Vec<Replica>, backend: Backend) {
    wait_until(
        &mut replicas,
        WITHIN,
        "every replica answering /healthz and /readyz",
        |replicas| {
            replicas
                .iter()
                .all(|r| r.answers("/healthz", 200) && r.answers("/readyz", 200))
        },
    );
    if backend == Backend::InMemory {
        for replica in &replicas {
            let output = replica.node.output();
            assert!(
                output.contains("the lease store is in memory"),
                "{} did not warn that its store is its own:\n{output}",
                replica.node.label
            );
        }
    }
    let mut last_token = 0;
    while !replicas.is_empty() {
        let (mut leader, mut token) = (0, 0);
        wait_until(
            &mut replicas,
            WITHIN,
            &format!(
                "one replica running the job under a token above {last_token}, named leader by \
                 every replica"
            ),
            |replicas| {
                let running: Vec<(usize, u64)> = replicas
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| {
                        let job = r.json("/singleton")?;
                        let token = job["fencing_token"].as_u64()?;
                        (job["running"] == true).then_some((i, token))
                    })
                    .collect();
                let [(one, t)] = running[..] else {
                    return false;
                };
                let Some(named) = replicas[one].json("/leader") else {
                    return false;
                };
                let agreed = replicas.iter().enumerate().all(|(i, r)| {
                    r.json("/leader")
                        .is_some_and(|l| l["holder"] == named["holder"] && l["here"] == (i == one))
                });
                if agreed && t > last_token {
                    (leader, token) = (one, t);
                }
                agreed && t > last_token
            },
        );
        let mut stopped = replicas.remove(leader);
        stopped.node.stops_gracefully(&[
            "job started",
            "termination requested: stopping the singletons and releasing the leases",
            "shutdown: lease released",
            "job stopped",
        ]);
        let output = stopped.node.output();
        assert!(
            output.contains("released=true"),
            "{} did not release its lease:\n{output}",
            stopped.node.label
        );
        last_token = token;
    }
}

/// The in-memory `counters` demo runs to its end, exits 0, and prints its checks.
fn counters_demo(bin: &Path, args: &[String], dir: &Path) {
    let mut node = Node::start(bin, args, dir, "demo");
    let status = node.wait_exit(DEMO_WITHIN);
    let output = node.output();
    assert!(status.success(), "exited with {status}:\n{output}");
    for line in [
        "[replica-2] shut down after",
        "handed over (released every lease: true)",
        "were answered from the record, not applied again",
        "checked: every counter equals the increments sent to it",
        "0 write(s) under a lower token",
        "was answered Fenced { stored: ",
        "the demo is over",
    ] {
        assert!(output.contains(line), "no {line:?} in:\n{output}");
    }
}

impl Replica {
    /// `method path` (no body): status, `Location` and body; `None` when nothing answers.
    fn request(address: &str, method: &str, path: &str) -> Option<(u16, Option<String>, String)> {
        let mut stream = std::net::TcpStream::connect(address).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        let location = head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("location")
                .then(|| value.trim().to_owned())
        });
        Some((status, location, body.to_owned()))
    }

    /// The JSON of the `200` answer to `method path`, following redirects, retrying `503`s and
    /// silences (within [`WITHIN`]).
    fn follow(&self, method: &str, path: &str) -> serde_json::Value {
        let give_up = Instant::now() + WITHIN;
        let (mut address, mut path) = (self.address.clone(), path.to_owned());
        loop {
            match Self::request(&address, method, &path) {
                Some((307, Some(location), _)) => {
                    let rest = location.strip_prefix("http://").expect("an http location");
                    let at = rest.find('/').unwrap_or(rest.len());
                    (address, path) = (rest[..at].to_owned(), rest[at..].to_owned());
                    continue;
                }
                Some((200, _, body)) => return serde_json::from_str(&body).unwrap(),
                Some((503, _, _)) | None => {}
                Some((status, _, body)) => panic!("{method} {path}: {status} {body}"),
            }
            assert!(
                Instant::now() < give_up,
                "{method} {path}: no answer within {WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
            address = self.address.clone();
        }
    }
}

/// `counters` replicas: between them they run every shard; increments sent to the first are
/// counted once (each sent twice with the same increment id), whichever replica is asked; each
/// replica stops gracefully on SIGTERM, and the others keep every count.
fn counter_replicas(mut replicas: Vec<Replica>) {
    let shards = |r: &Replica| -> Option<usize> {
        let (status, _, body) = Replica::request(&r.address, "GET", "/shards")?;
        let json: serde_json::Value = serde_json::from_str(&body).ok()?;
        (status == 200).then(|| json["shards"].as_object().map_or(0, |s| s.len()))
    };
    let run = std::process::id();
    let mut sent: BTreeMap<String, u64> = BTreeMap::new();
    while !replicas.is_empty() {
        wait_until(
            &mut replicas,
            WITHIN,
            "the replicas running all 64 shards between them",
            |replicas| {
                let counts: Vec<Option<usize>> = replicas.iter().map(shards).collect();
                counts.iter().all(|c| c.is_some_and(|c| c > 0))
                    && counts.iter().flatten().sum::<usize>() == 64
            },
        );
        for k in 0..10 {
            let counter = format!("doc-{run}-{}", k % 4);
            let path = format!(
                "/counters/{counter}/increment?increment={run}-{}-{k}",
                replicas.len()
            );
            let first = replicas[0].follow("POST", &path);
            assert_eq!(first["applied"], true, "{path}: {first}");
            let again = replicas[0].follow("POST", &path);
            assert_eq!(again["applied"], false, "{path} sent again: {again}");
            assert_eq!(again["count"], first["count"], "{path} sent again");
            *sent.entry(counter).or_default() += 1;
        }
        for replica in &replicas {
            for (counter, count) in &sent {
                let read = replica.follow("GET", &format!("/counters/{counter}"));
                assert_eq!(
                    read["count"].as_u64(),
                    Some(*count),
                    "{counter} on {}",
                    replica.node.label
                );
            }
        }
        let mut stopped = replicas.remove(0);
        stopped
            .node
            .stops_gracefully(&["] serving counters of group", "] shut down"]);
    }
}
