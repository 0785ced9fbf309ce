//! Network namespaces for the chaos harness, so that a partition is made by the kernel and not
//! only by a proxy. Each node process runs in a namespace of its own, joined to the harness's
//! namespace (where the servers and the nodes' fault proxies listen) by a veth pair with a /30 of
//! `10.213.0.0/16`; an nftables table in the node's namespace drops the packets of a partition:
//! both ways, or one way only (asymmetric).
//!
//! Everything made here is removed again: by `Drop` (also while a failed run unwinds), and, for
//! what a killed test process left behind, by [`sweep_stale`] at the next start (and by
//! `scripts/test-cluster.sh down`). A namespace is named `actix-chaos-<pid>-<n>`, and its subnet is
//! claimed by a file `/run/actix-coordination-chaos/net-<k>` holding the owner's pid and the
//! namespace's name, so that concurrent test processes never share a subnet and a dead owner's
//! leftovers are recognised.
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables; `scripts/test-cluster.sh install` installs it).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The prefix of every namespace this module makes.
pub const PREFIX: &str = "actix-chaos";
/// Where subnets are claimed.
const STATE_DIR: &str = "/run/actix-coordination-chaos";
/// /30 subnets in 10.213.0.0/16.
const SUBNETS: usize = 16_384;

/// Which packets a partition drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Everything between the node and the servers.
    Both,
    /// The node's packets (its requests, and its acknowledgements): the servers hear nothing.
    FromNode,
    /// The packets to the node (the servers' answers): the node's writes arrive, but it never
    /// hears back.
    ToNode,
}

/// A node's network namespace and its veth pair.
#[derive(Debug)]
pub struct NodeNet {
    name: String,
    host_if: String,
    node_if: String,
    /// The harness's end of the pair: the node's proxies listen here.
    host_ip: Ipv4Addr,
    claim: PathBuf,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(program: &str, args: &[&str]) {
    if let Err(e) = run(program, args) {
        panic!(
            "{e}\n(the chaos harness runs its nodes in network namespaces: it needs root, iproute2 \
             and nftables; `scripts/test-cluster.sh install` installs them)"
        );
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid in a name `actix-chaos-<pid>-<n>`.
fn owner_pid(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?
        .strip_prefix('-')?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// The namespaces of this module that exist now.
pub fn namespaces() -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .map(str::to_owned)
        .collect()
}

/// Deletes the namespace's links first (deleting one end of a veth pair deletes both at once;
/// deleting only the namespace leaves the pair to the kernel's asynchronous cleanup), then the
/// namespace (with its rules) and its hosts file.
fn remove_namespace(name: &str) {
    let out = Command::new("ip")
        .args(["-n", name, "-o", "link", "show"])
        .output();
    if let Ok(out) = out {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // "12: acx0n@if13: <BROADCAST,...> ..."
            let Some(link) = line.split(": ").nth(1) else {
                continue;
            };
            let link = link.split('@').next().unwrap_or(link);
            if link != "lo" {
                let _ = run("ip", &["-n", name, "link", "del", "dev", link]);
            }
        }
    }
    let _ = run("ip", &["netns", "del", name]);
    let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(name));
}

/// Removes what processes that no longer run left behind: their namespaces (with their veth
/// pairs and rules), hosts files and subnet claims. Returns the namespaces it removed.
pub fn sweep_stale() -> Vec<String> {
    let mut removed = Vec::new();
    for name in namespaces() {
        if owner_pid(&name).is_some_and(|pid| !alive(pid)) {
            remove_namespace(&name);
            removed.push(name);
        }
    }
    if let Ok(dir) = std::fs::read_dir(STATE_DIR) {
        for entry in dir.flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let mut parts = text.split_whitespace();
            let pid = parts.next().and_then(|p| p.parse::<u32>().ok());
            // A claim with no pid yet may be one another process is writing right now.
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default().as_secs() > 60);
            if pid.map_or(old, |pid| !alive(pid)) {
                if let Some(name) = parts.next() {
                    remove_namespace(name);
                }
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    removed
}

/// Whether a network interface of this name exists in the harness's namespace.
pub fn link_exists(name: &str) -> bool {
    run("ip", &["link", "show", "dev", name]).is_ok()
}

/// The directory of the subnet claims.
pub fn claims_dir() -> &'static Path {
    Path::new(STATE_DIR)
}

/// Claims a free /30: the first `net-<k>` file this process could create.
fn claim_subnet(name: &str) -> (usize, PathBuf) {
    std::fs::create_dir_all(STATE_DIR).expect("create the subnet claims' directory");
    for k in 0..SUBNETS {
        let path = Path::new(STATE_DIR).join(format!("net-{k}"));
        if let Ok(mut file) = OpenOptions::new().write(true).create_new(true).open(&path) {
            writeln!(file, "{} {name}", std::process::id()).expect("write the subnet claim");
            return (k, path);
        }
    }
    panic!("no free subnet in 10.213.0.0/16 ({STATE_DIR} is full)");
}

impl NodeNet {
    /// A new namespace joined to this one, with an empty nftables table (nothing dropped). Its
    /// `/etc/hosts` (bind-mounted by `ip netns exec`) names the harness's end
    /// `kubernetes.default.svc`, a name the test apiserver's certificate carries.
    pub fn create() -> NodeNet {
        let name = format!(
            "{PREFIX}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let (k, claim) = claim_subnet(&name);
        let base = u32::from(Ipv4Addr::new(10, 213, 0, 0)) + 4 * k as u32;
        let (host_ip, node_ip) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
        let (host_if, node_if) = (format!("acx{k}h"), format!("acx{k}n"));
        // From here on `Drop` removes whatever was made, also if a step below panics.
        let net = NodeNet {
            name,
            host_if,
            node_if,
            host_ip,
            claim,
        };
        let name = net.name.as_str();
        must("ip", &["netns", "add", name]);
        must(
            "ip",
            &[
                "link",
                "add",
                &net.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &net.node_if,
                "netns",
                name,
            ],
        );
        must(
            "ip",
            &["addr", "add", &format!("{host_ip}/30"), "dev", &net.host_if],
        );
        must("ip", &["link", "set", &net.host_if, "up"]);
        let node_addr = format!("{node_ip}/30");
        must(
            "ip",
            &["-n", name, "addr", "add", &node_addr, "dev", &net.node_if],
        );
        must("ip", &["-n", name, "link", "set", &net.node_if, "up"]);
        must("ip", &["-n", name, "link", "set", "lo", "up"]);
        must(
            "ip",
            &[
                "netns",
                "exec",
                name,
                "nft",
                "add table inet chaos; \
                 add chain inet chaos input { type filter hook input priority 0; policy accept; }; \
                 add chain inet chaos output { type filter hook output priority 0; policy accept; }",
            ],
        );
        let etc = Path::new("/etc/netns").join(name);
        std::fs::create_dir_all(&etc).expect("create /etc/netns/<name>");
        std::fs::write(
            etc.join("hosts"),
            format!("127.0.0.1 localhost\n{host_ip} kubernetes.default.svc\n"),
        )
        .expect("write the namespace's hosts file");
        net
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name of the harness's end of the veth pair.
    pub fn host_if(&self) -> &str {
        &self.host_if
    }

    /// The harness's end of the veth pair, where the node's proxies listen.
    pub fn host_ip(&self) -> Ipv4Addr {
        self.host_ip
    }

    /// `ip netns exec <name> <program>`: a command that runs `program` in the namespace (as the
    /// same process: signals sent to the child reach `program`).
    pub fn command(&self, program: &Path) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// Starts dropping packets between the node and the servers.
    pub fn partition(&self, direction: Direction) {
        let rules = match direction {
            Direction::Both => format!(
                "add rule inet chaos input iifname {0} drop; add rule inet chaos output oifname {0} drop",
                self.node_if
            ),
            Direction::FromNode => {
                format!("add rule inet chaos output oifname {} drop", self.node_if)
            }
            Direction::ToNode => format!("add rule inet chaos input iifname {} drop", self.node_if),
        };
        must("ip", &["netns", "exec", &self.name, "nft", &rules]);
    }

    /// Drops nothing any more.
    pub fn heal(&self) {
        must(
            "ip",
            &[
                "netns",
                "exec",
                &self.name,
                "nft",
                "flush chain inet chaos input; flush chain inet chaos output",
            ],
        );
    }

    /// The rules in force (for tests).
    pub fn rules(&self) -> String {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.name, "nft", "list", "table", "inet", "chaos",
            ])
            .output()
            .expect("nft list");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for NodeNet {
    /// Deleting the namespace deletes its end of the veth pair (and so both ends) and its rules.
    /// A process still running in it keeps it alive until it exits: the harness kills its nodes
    /// first.
    fn drop(&mut self) {
        remove_namespace(&self.name);
        let _ = std::fs::remove_file(&self.claim);
    }
}
