//! A client-go leader election program (`tests/clientgo/leaderelect/main.go`, built by
//! `scripts/test-cluster.sh install` with an old and a new client-go) as a child process, and a watch on a Lease object that
//! records every version of it, for the interop tests (tests/clientgo.rs).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::TryStreamExt;
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use kube::api::{Api, WatchEvent, WatchParams};
use tokio::sync::mpsc;
use tokio::time::{timeout_at, Instant};

use super::k8s::{client, env};

/// The environment variable the token is handed over in (never on the command line).
const TOKEN_ENV: &str = "LEADERELECT_TOKEN";

/// Which build of the client-go program to run (`scripts/test-cluster.sh install` builds both
/// from the same source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// client-go 1.20.2 (`ACTIX_COORD_TEST_CLIENTGO_BIN`): judges a Lease expired by its own
    /// configured `LeaseDuration`.
    Old,
    /// client-go 0.32.3 (`ACTIX_COORD_TEST_CLIENTGO_NEW_BIN`): judges a Lease expired by the
    /// record's `spec.leaseDurationSeconds` (client-go 1.27 and later).
    New,
}

impl Build {
    /// The environment variable naming this build's program.
    fn var(self) -> &'static str {
        match self {
            Build::Old => "ACTIX_COORD_TEST_CLIENTGO_BIN",
            Build::New => "ACTIX_COORD_TEST_CLIENTGO_NEW_BIN",
        }
    }

    /// The program, from [`Self::var`].
    pub fn bin(self) -> PathBuf {
        let var = self.var();
        std::env::var_os(var)
            .unwrap_or_else(|| {
                panic!(
                    "{var} is not set. The client-go interop tests need the test cluster and its \
                     client-go programs: run them with \
                     `scripts/test-cluster.sh run -- cargo test --all-features` (or \
                     `scripts/test-cluster.sh install && scripts/test-cluster.sh up` and \
                     `. target/test-cluster/env` first)"
                )
            })
            .into()
    }
}

/// client-go's `LeaderElectionConfig` timings.
#[derive(Debug, Clone, Copy)]
pub struct ElectionTiming {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// One client-go candidate for the Lease object `name` in the test namespace, authenticated as
/// `lease-holder` (the Role of deploy/rbac.yaml). Its stdout events are collected with the instant
/// each line arrived; its stderr (client-go's logs) goes to `DIR/clientgo-<name>-<identity>.log`.
/// Killed with SIGKILL when dropped.
pub struct ClientGo {
    identity: String,
    child: Option<Child>,
    events: mpsc::UnboundedReceiver<(Instant, String)>,
    /// Every event received so far, in order.
    seen: Vec<(Instant, String)>,
    log: PathBuf,
}

impl ClientGo {
    /// Starts the old program (client-go 1.20, [`Build::Old`]) and waits for its `ready` line
    /// (or panics after 10 s).
    pub async fn start(name: &str, identity: &str, timing: ElectionTiming) -> Self {
        Self::start_build(Build::Old, name, identity, timing).await
    }

    /// Starts program `build` and waits for its `ready` line (or panics after 10 s).
    pub async fn start_build(
        build: Build,
        name: &str,
        identity: &str,
        timing: ElectionTiming,
    ) -> Self {
        let bin = build.bin();
        let log = env().dir.join(format!("clientgo-{name}-{identity}.log"));
        let stderr = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("client-go log {}: {e}", log.display()));
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut child = Command::new(&bin)
            .arg(format!("-server={}", env().url))
            .arg(format!("-ca-file={}", env().ca.display()))
            .arg(format!("-token-env={TOKEN_ENV}"))
            .arg(format!("-namespace={}", env().namespace))
            .arg(format!("-name={name}"))
            .arg(format!("-identity={identity}"))
            .arg(format!("-lease-duration={}", ms(timing.lease_duration)))
            .arg(format!("-renew-deadline={}", ms(timing.renew_deadline)))
            .arg(format!("-retry-period={}", ms(timing.retry_period)))
            .env(TOKEN_ENV, &env().token)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, events) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let at = Instant::from_std(std::time::Instant::now());
                if tx.send((at, line)).is_err() {
                    break;
                }
            }
        });
        let mut program = Self {
            identity: identity.to_owned(),
            child: Some(child),
            events,
            seen: Vec::new(),
            log,
        };
        let (_, first) = program
            .next_event(Instant::now() + Duration::from_secs(10))
            .await
            .unwrap_or_else(|| program.fail("no `ready` line within 10 s"));
        if first != "ready" {
            program.fail(&format!("the first line is {first:?}, not `ready`"));
        }
        program
    }

    /// The holder identity of this candidate.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Every event received so far.
    pub fn seen(&self) -> &[(Instant, String)] {
        &self.seen
    }

    /// The next event before `deadline`; `None` at the deadline or when stdout closed (the
    /// program exited).
    pub async fn next_event(&mut self, deadline: Instant) -> Option<(Instant, String)> {
        match timeout_at(deadline, self.events.recv()).await {
            Ok(Some(event)) => {
                self.check_event(&event.1);
                self.seen.push(event.clone());
                Some(event)
            }
            Ok(None) | Err(_) => None,
        }
    }

    fn check_event(&self, line: &str) {
        let known = matches!(line, "ready" | "started-leading" | "stopped-leading")
            || line.starts_with("new-leader ");
        assert!(
            known,
            "client-go {} printed an unexpected line on stdout: {line:?}",
            self.identity
        );
    }

    /// Waits for the line `line`, returning when it arrived; panics if it does not come within
    /// `within` (or the program exits first). Events before it are kept in [`Self::seen`].
    pub async fn wait_for(&mut self, line: &str, within: Duration) -> Instant {
        let deadline = Instant::now() + within;
        loop {
            match self.next_event(deadline).await {
                Some((at, got)) if got == line => return at,
                Some(_) => {}
                None => self.fail(&format!("no `{line}` within {within:?}")),
            }
        }
    }

    /// Like [`Self::wait_for`], but returns at once if `line` was printed already.
    pub async fn printed_within(&mut self, line: &str, within: Duration) -> Instant {
        match self.seen.iter().find(|(_, l)| l == line) {
            Some((at, _)) => *at,
            None => self.wait_for(line, within).await,
        }
    }

    /// Collects events for `window` and panics if `line` is among them (or was before).
    pub async fn assert_never(&mut self, line: &str, window: Duration) {
        let deadline = Instant::now() + window;
        while self.next_event(deadline).await.is_some() {}
        if self.seen.iter().any(|(_, l)| l == line) {
            self.fail(&format!("printed `{line}`"));
        }
        if let Some(status) = super::exit_status(&mut self.child) {
            self.fail(&format!("exited with {status}"));
        }
    }

    /// Whether `line` was printed so far.
    pub fn printed(&self, line: &str) -> bool {
        self.seen.iter().any(|(_, l)| l == line)
    }

    /// Sends SIGTERM (client-go cancels its context, releases the lease if it holds it and the
    /// program exits); returns when it was sent.
    pub fn terminate(&mut self) -> Instant {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .args(["-s", "TERM", &pid.to_string()])
            .status()
            .expect("kill -s TERM");
        assert!(status.success(), "kill -s TERM {pid}: {status}");
        Instant::now()
    }

    /// SIGKILL (nothing released); returns when it was sent, after reaping the process.
    pub fn kill(&mut self) -> Instant {
        let mut child = self.child.take().expect("running");
        child.kill().expect("SIGKILL the client-go program");
        let at = Instant::now();
        let _ = child.wait();
        at
    }

    /// Waits (up to `within`) for the program to exit after [`Self::terminate`], collecting its
    /// last events; returns its exit status.
    pub async fn exited(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        // stdout closes when the program exits.
        while self.next_event(deadline).await.is_some() {}
        loop {
            if let Some(status) = super::exit_status(&mut self.child) {
                self.child = None;
                return status;
            }
            if Instant::now() >= deadline {
                self.fail(&format!("still running {within:?} after SIGTERM"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Panics with `what`, the events so far and the tail of the program's log.
    pub fn fail(&self, what: &str) -> ! {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        let events: Vec<&str> = self.seen.iter().map(|(_, l)| l.as_str()).collect();
        panic!(
            "client-go {}: {what}; events so far: {events:?}; last lines of {}:\n{}",
            self.identity,
            self.log.display(),
            tail.join("\n")
        );
    }
}

impl Drop for ClientGo {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One version of a Lease object as a watch delivered it.
#[derive(Debug, Clone)]
pub struct Version {
    /// When the watch event arrived.
    pub at: Instant,
    pub resource_version: String,
    /// `None` when absent or empty (a release).
    pub holder: Option<String>,
    pub lease_duration_seconds: Option<i32>,
    pub lease_transitions: Option<i32>,
}

/// Records every version of one Lease object (as the admin sees it, from a watch) while it lives.
pub struct ObjectHistory {
    versions: Arc<Mutex<Vec<Version>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ObjectHistory {
    /// Watches object `name` from now on (the versions it has, if it exists, come first).
    pub async fn start(name: &str) -> Self {
        let api: Api<LeaseObject> =
            Api::namespaced(client(&env().url, &env().admin_token), &env().namespace);
        let versions = Arc::new(Mutex::new(Vec::new()));
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        // Opened before returning, so nothing written after `start` is missed.
        let stream = api.watch(&params, "0").await.expect("admin watch");
        let recorded = Arc::clone(&versions);
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Ok(Some(event)) = stream.try_next().await {
                let (WatchEvent::Added(lease) | WatchEvent::Modified(lease)) = event else {
                    continue;
                };
                let spec = lease.spec.unwrap_or_default();
                recorded.lock().unwrap().push(Version {
                    at: Instant::now(),
                    resource_version: lease.metadata.resource_version.unwrap_or_default(),
                    holder: spec.holder_identity.filter(|h| !h.is_empty()),
                    lease_duration_seconds: spec.lease_duration_seconds,
                    lease_transitions: spec.lease_transitions,
                });
            }
        });
        Self { versions, task }
    }

    /// Every version seen so far.
    pub fn versions(&self) -> Vec<Version> {
        self.versions.lock().unwrap().clone()
    }

    /// The last version written by `holder` (seen so far).
    pub fn last_of(&self, holder: &str) -> Option<Version> {
        self.versions()
            .into_iter()
            .rev()
            .find(|v| v.holder.as_deref() == Some(holder))
    }

    /// How many versions `holder` wrote between `from` and `to` (by arrival).
    pub fn writes_by(&self, holder: &str, from: Instant, to: Instant) -> usize {
        self.versions()
            .iter()
            .filter(|v| v.holder.as_deref() == Some(holder) && v.at >= from && v.at <= to)
            .count()
    }
}

impl Drop for ObjectHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}
