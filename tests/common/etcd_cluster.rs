//! The three-member etcd cluster that `scripts/test-cluster.sh up` starts next to the other test
//! servers, and the faults tests inject into it: SIGKILL, SIGSTOP/SIGCONT and restart of a member,
//! finding the leader.
//!
//! From the environment (`source target/test-cluster/env`):
//! * `ACTIX_COORD_TEST_ETCD_CLUSTER_ENDPOINTS`: the client URLs of members n1, n2, n3, comma-separated;
//! * `ACTIX_COORD_TEST_ETCD_CLUSTER_DIR`: per member `nK`, `nK.pid` (its current pid; a restart
//!   writes the new one), `nK.sh` (starts it again, detached, on the same data dir and flags),
//!   `nK.log` (its output, appended to by restarts).
//!
//! Tests that inject faults hold a [`Cluster`] from [`Cluster::exclusive`]: one test at a time in
//! the process, and the cluster is whole (three members running, not stopped, one leader) when it is
//! handed out and again when it is dropped, also when the test panics: dropping it continues stopped
//! members and restarts killed ones, and only then lets the next test in.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use actix_coordination::EtcdSettings;
use tokio::time::{sleep, timeout, Instant};

/// The number of members.
pub const MEMBERS: usize = 3;

/// How long the cluster may take to agree on a leader after a fault (an election takes 1–2 s;
/// generous for a loaded 2-core machine).
pub const LEADER_WITHIN: Duration = Duration::from_secs(30);

/// How long a restarted member may take to run, rejoin and answer a linearizable read.
pub const RESTART_WITHIN: Duration = Duration::from_secs(30);

/// Serialises the tests that inject faults: they share one cluster.
static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One member as `scripts/test-cluster.sh` described it.
#[derive(Debug, Clone)]
pub struct Member {
    /// `n1`, `n2`, `n3`.
    pub name: String,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    pid_file: PathBuf,
    script: PathBuf,
    log: PathBuf,
    /// The argument that identifies the member's process (`--data-dir=DIR/nK`).
    mark: String,
}

/// What the process of a member is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// Running (or sleeping): it answers.
    Running,
    /// Stopped by SIGSTOP.
    Stopped,
    /// No process (killed, exited; a zombie counts as gone).
    Gone,
}

impl Member {
    /// The pid of the member's process, if the pid file names a live process of this member (a
    /// pid file alone is not trusted: its pid may have been reused).
    pub fn pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(&self.pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        cmdline
            .split(|b| *b == 0)
            .any(|arg| arg == self.mark.as_bytes())
            .then_some(pid)
    }

    /// What its process is doing now.
    pub fn state(&self) -> ProcessState {
        let Some(pid) = self.pid() else {
            return ProcessState::Gone;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        match stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
        {
            Some('T') | Some('t') => ProcessState::Stopped,
            Some('Z') | Some('X') | None => ProcessState::Gone,
            Some(_) => ProcessState::Running,
        }
    }

    fn signal(&self, signal: &str) -> u32 {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("member {} has no process to send SIG{signal}", self.name));
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} ({})", self.name);
        pid
    }

    /// The last `lines` lines of the member's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Runs the member's restart script (which refuses a member that still runs).
    async fn start(&self) {
        let out = tokio::process::Command::new(&self.script)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .unwrap_or_else(|e| panic!("running {}: {e}", self.script.display()));
        assert!(
            out.status.success(),
            "{} failed ({}): {}",
            self.script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// One member's answer to a maintenance status request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStatus {
    /// The member's own id.
    pub id: u64,
    /// The leader it follows (0: none).
    pub leader: u64,
    /// Its raft term.
    pub term: u64,
}

/// The members, shared with the thread that restores the cluster on drop.
#[derive(Debug)]
struct Members(Vec<Member>);

/// Exclusive use of the three-member cluster for one test; restores it on drop (see the module
/// documentation).
pub struct Cluster {
    members: Arc<Members>,
    /// Released after `Drop::drop` restored the cluster (fields drop after it).
    _exclusive: tokio::sync::MutexGuard<'static, ()>,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: the cluster tests need the three-member etcd cluster of \
             scripts/test-cluster.sh. Run them with `scripts/test-cluster.sh run -- cargo test \
             --all-features --test etcd_cluster`, or `scripts/test-cluster.sh up` and \
             `source target/test-cluster/env` first"
        )
    })
}

impl Members {
    fn from_env() -> Self {
        let endpoints: Vec<String> = env("ACTIX_COORD_TEST_ETCD_CLUSTER_ENDPOINTS")
            .split(',')
            .map(str::to_owned)
            .collect();
        assert_eq!(endpoints.len(), MEMBERS, "{endpoints:?}");
        let dir = PathBuf::from(env("ACTIX_COORD_TEST_ETCD_CLUSTER_DIR"));
        Self(
            endpoints
                .into_iter()
                .enumerate()
                .map(|(i, endpoint)| {
                    let name = format!("n{}", i + 1);
                    Member {
                        pid_file: dir.join(format!("{name}.pid")),
                        script: dir.join(format!("{name}.sh")),
                        log: dir.join(format!("{name}.log")),
                        mark: format!("--data-dir={}", dir.join(&name).display()),
                        name,
                        endpoint,
                    }
                })
                .collect(),
        )
    }

    /// Continues stopped members and starts gone ones, whatever stopped or killed them, then waits
    /// until the cluster is whole. Returns what it did (for the log).
    async fn heal(&self) -> Vec<String> {
        let mut done = Vec::new();
        for m in &self.0 {
            match m.state() {
                ProcessState::Running => {}
                ProcessState::Stopped => {
                    m.signal("CONT");
                    done.push(format!("SIGCONT {}", m.name));
                }
                ProcessState::Gone => {
                    m.start().await;
                    done.push(format!("restarted {}", m.name));
                }
            }
        }
        self.wait_whole(RESTART_WITHIN + LEADER_WITHIN).await;
        done
    }

    /// Waits until every member runs, answers a linearizable read, and all three follow one
    /// leader that says it leads.
    async fn wait_whole(&self, within: Duration) {
        let give_up = Instant::now() + within;
        for (i, m) in self.0.iter().enumerate() {
            loop {
                if m.state() == ProcessState::Running && self.answers_read(i).await {
                    break;
                }
                assert!(
                    Instant::now() < give_up,
                    "member {} not healthy within {within:?} (state {:?}); log:\n{}",
                    m.name,
                    m.state(),
                    m.log_tail(30)
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
        self.leader_among(
            &[0, 1, 2],
            give_up.saturating_duration_since(Instant::now()),
        )
        .await;
    }

    async fn client(&self, m: usize) -> Option<etcd_client::Client> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(1));
        timeout(
            Duration::from_millis(1500),
            etcd_client::Client::connect([self.0[m].endpoint.as_str()], Some(options)),
        )
        .await
        .ok()?
        .ok()
    }

    /// Whether member `m` answers a linearizable read (it has a leader and is caught up with it).
    async fn answers_read(&self, m: usize) -> bool {
        let read = async {
            let mut client = self.client(m).await?;
            client
                .get("/actix-coordination-test/health-probe", None)
                .await
                .ok()
        };
        matches!(timeout(Duration::from_secs(2), read).await, Ok(Some(_)))
    }

    async fn status(&self, m: usize) -> Option<MemberStatus> {
        let status = async {
            let mut client = self.client(m).await?;
            let status = client.status().await.ok()?;
            Some(MemberStatus {
                id: status.header()?.member_id(),
                leader: status.leader(),
                term: status.raft_term(),
            })
        };
        timeout(Duration::from_secs(2), status).await.ok().flatten()
    }

    /// The leader among `candidates` once every one of them that answers follows it, they are a
    /// majority of the cluster, and the leader itself says it leads (followers keep naming a dead
    /// leader until their election timeout).
    async fn leader_among(&self, candidates: &[usize], within: Duration) -> usize {
        let give_up = Instant::now() + within;
        loop {
            let answers: Vec<(usize, MemberStatus)> = futures_util::future::join_all(
                candidates
                    .iter()
                    .map(|&m| async move { (m, self.status(m).await) }),
            )
            .await
            .into_iter()
            .filter_map(|(m, s)| Some((m, s?)))
            .collect();
            if answers.len() * 2 > MEMBERS {
                let (_, first) = answers[0];
                let agreed = answers
                    .iter()
                    .all(|(_, s)| s.leader == first.leader && s.term == first.term);
                let leader = answers
                    .iter()
                    .find(|(_, s)| s.id == first.leader && s.leader == s.id);
                if let (true, Some((m, _))) = (agreed && first.leader != 0, leader) {
                    return *m;
                }
            }
            assert!(
                Instant::now() < give_up,
                "no leader among {candidates:?} within {within:?}; answers: {answers:?}"
            );
            sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Cluster {
    /// Waits until no other test of this process uses the cluster, then makes sure it is whole
    /// (continuing and restarting members a killed test run may have left behind).
    pub async fn exclusive() -> Self {
        let exclusive = EXCLUSIVE.lock().await;
        let members = Arc::new(Members::from_env());
        let healed = members.heal().await;
        if !healed.is_empty() {
            eprintln!("etcd cluster was not whole at the start of the test: {healed:?}");
        }
        Self {
            members,
            _exclusive: exclusive,
        }
    }

    /// The member `m` (0, 1 or 2).
    pub fn member(&self, m: usize) -> &Member {
        &self.members.0[m]
    }

    /// Every member's client URL, n1 to n3.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.0.iter().map(|m| m.endpoint.clone()).collect()
    }

    /// The client URL of member `m`.
    pub fn endpoint(&self, m: usize) -> &str {
        &self.members.0[m].endpoint
    }

    /// Session settings with the client URLs of `members` under `prefix`.
    pub fn settings(&self, members: &[usize], prefix: &str) -> EtcdSettings {
        EtcdSettings::builder(members.iter().map(|&m| self.endpoint(m).to_owned()))
            .prefix(prefix)
            .connect_timeout(Duration::from_secs(3))
            .build()
            .expect("valid etcd settings")
    }

    /// A client straight to member `m` (for reading the store), bounded by a 1 s timeout per call.
    pub async fn client(&self, m: usize) -> etcd_client::Client {
        self.members
            .client(m)
            .await
            .unwrap_or_else(|| panic!("cannot connect to member {}", self.member(m).name))
    }

    /// Member `m`'s status, `None` if it does not answer within 2 s.
    pub async fn status(&self, m: usize) -> Option<MemberStatus> {
        self.members.status(m).await
    }

    /// The leader: the member whose id is the leader id that every running member reports (and
    /// that says itself that it leads). Waits up to [`LEADER_WITHIN`] for one (an election).
    pub async fn leader(&self) -> usize {
        let running: Vec<usize> = (0..MEMBERS)
            .filter(|&m| self.member(m).state() == ProcessState::Running)
            .collect();
        self.members.leader_among(&running, LEADER_WITHIN).await
    }

    /// The leader once it is not `old` (after `old` was killed or stopped: an election).
    pub async fn new_leader(&self, old: usize) -> usize {
        let leader = self.leader().await;
        assert_ne!(leader, old, "a killed or stopped member cannot lead");
        leader
    }

    /// A member that is not the leader (the next one after it).
    pub async fn follower(&self) -> usize {
        (self.leader().await + 1) % MEMBERS
    }

    /// SIGKILL to member `m`; returns once its process is gone.
    pub async fn kill(&self, m: usize) {
        let member = self.member(m);
        let pid = member.signal("KILL");
        let give_up = Instant::now() + Duration::from_secs(10);
        while member.state() != ProcessState::Gone {
            assert!(
                Instant::now() < give_up,
                "member {} (pid {pid}) still there 10 s after SIGKILL",
                member.name
            );
            sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGSTOP to member `m`; returns once it is stopped (it answers nothing, its connections stay
    /// open: a partition from everyone).
    pub async fn stop(&self, m: usize) {
        let member = self.member(m);
        member.signal("STOP");
        self.wait_state(m, ProcessState::Stopped).await;
    }

    /// SIGCONT to member `m`; returns once it runs again.
    pub async fn cont(&self, m: usize) {
        let member = self.member(m);
        member.signal("CONT");
        self.wait_state(m, ProcessState::Running).await;
    }

    async fn wait_state(&self, m: usize, state: ProcessState) {
        let member = self.member(m);
        let give_up = Instant::now() + Duration::from_secs(10);
        while member.state() != state {
            assert!(
                Instant::now() < give_up,
                "member {} not {state:?} within 10 s (it is {:?})",
                member.name,
                member.state()
            );
            sleep(Duration::from_millis(5)).await;
        }
    }

    /// Starts member `m` again on its data dir (killing it first if it still runs), and waits
    /// until it answers a linearizable read and the cluster has a leader every member follows.
    pub async fn restart(&self, m: usize) {
        if self.member(m).state() != ProcessState::Gone {
            self.kill(m).await;
        }
        self.member(m).start().await;
        self.members.wait_whole(RESTART_WITHIN).await;
    }

    /// Waits until all three members run, answer and follow one leader.
    pub async fn wait_whole(&self) {
        self.members.wait_whole(RESTART_WITHIN).await;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The test's runtime may be gone or be the one this runs on: restore on a thread with a
        // runtime of its own.
        let members = Arc::clone(&self.members);
        let restored = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime")
                .block_on(members.heal())
        })
        .join();
        match restored {
            Ok(done) if !done.is_empty() => eprintln!("etcd cluster restored: {done:?}"),
            Ok(_) => {}
            Err(_) if std::thread::panicking() => {
                eprintln!("could not restore the etcd cluster after the test (see above)")
            }
            Err(_) => panic!("could not restore the etcd cluster after the test (see above)"),
        }
    }
}
