//! Helpers shared by the bench harnesses.
#![allow(dead_code)]

use std::time::Duration;

/// min / median / p99 / max of a sample, in milliseconds (p99 by nearest rank: with fewer than
/// 100 samples it is the maximum).
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub median: f64,
    pub p99: f64,
    pub max: f64,
}

pub fn summarize(values: &[f64]) -> Summary {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    assert!(n > 0, "no samples");
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
    Summary {
        n,
        min: v[0],
        median,
        p99: v[rank - 1],
        max: v[n - 1],
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} min={:.2} ms median={:.2} ms p99={:.2} ms max={:.2} ms",
            self.n, self.min, self.median, self.p99, self.max
        )
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Summary {
    /// The summary as a JSON object (milliseconds), for the results file.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "n": self.n,
            "min": self.min,
            "median": self.median,
            "p99": self.p99,
            "max": self.max,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Machine-readable results and targets
//
// Every bench appends one JSON line per measurement to the results file (`BENCH_RESULTS_FILE`,
// default `target/bench-results/results.jsonl` of the crate; `scripts/bench.sh` sets it), with
// the command that ran it, the git commit and the targets checked. `scripts/bench-report.py`
// turns these lines into the tables of BENCHMARKS.md. With `--check` a bench exits with status 1
// when a target was missed (after it has written its results); a documented known miss is
// reported as such and does not fail it.

/// How a measured value is compared with its target.
#[derive(Clone, Copy, Debug)]
pub enum Cmp {
    /// At most the limit.
    AtMost,
    /// Exactly the limit (counts).
    Exactly,
}

/// One target of a measurement: `id` names the target (BENCHMARKS.md's "Against the targets"
/// table has one row per id), `value` is what was measured, in `unit`.
#[derive(Clone, Debug)]
pub struct Check {
    pub id: &'static str,
    pub value: f64,
    pub cmp: Cmp,
    pub limit: f64,
    pub unit: &'static str,
    /// A documented reason this target is known to be missed: the miss is reported, not failed.
    pub known_miss: Option<&'static str>,
}

impl Check {
    pub fn at_most(id: &'static str, value: f64, limit: f64, unit: &'static str) -> Self {
        Self {
            id,
            value,
            cmp: Cmp::AtMost,
            limit,
            unit,
            known_miss: None,
        }
    }

    pub fn exactly(id: &'static str, value: f64, limit: f64, unit: &'static str) -> Self {
        Self {
            id,
            value,
            cmp: Cmp::Exactly,
            limit,
            unit,
            known_miss: None,
        }
    }

    /// Marks the target as known to be missed, for the documented `reason`.
    pub fn known_miss(mut self, reason: &'static str) -> Self {
        self.known_miss = Some(reason);
        self
    }

    pub fn met(&self) -> bool {
        match self.cmp {
            Cmp::AtMost => self.value <= self.limit,
            Cmp::Exactly => (self.value - self.limit).abs() < 1e-6,
        }
    }

    fn describe(&self) -> String {
        let op = match self.cmp {
            Cmp::AtMost => "≤",
            Cmp::Exactly => "=",
        };
        // A long unit ("leases lost") is not repeated after the limit.
        let limit_unit = if self.unit.len() <= 16 { self.unit } else { "" };
        format!(
            "{}: {} {} (target {op} {} {limit_unit})",
            self.id,
            round(self.value),
            self.unit,
            round(self.limit),
        )
        .replace(" )", ")")
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "value": self.value,
            "cmp": match self.cmp { Cmp::AtMost => "<=", Cmp::Exactly => "==" },
            "limit": self.limit,
            "unit": self.unit,
            "met": self.met(),
            "known_miss": self.known_miss,
        })
    }
}

fn round(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Collects a bench's results and checks; see the section comment.
pub struct Report {
    bench: &'static str,
    check: bool,
    file: std::path::PathBuf,
    command: String,
    commit: String,
    failed: Vec<String>,
    known: Vec<String>,
}

impl Report {
    /// `bench` is the bench target's name; `--check` is read from the arguments.
    pub fn new(bench: &'static str) -> Self {
        let file = std::env::var_os("BENCH_RESULTS_FILE")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("target/bench-results/results.jsonl")
            });
        Self {
            bench,
            check: std::env::args().any(|a| a == "--check"),
            file,
            command: command(bench),
            commit: commit(),
            failed: Vec::new(),
            known: Vec::new(),
        }
    }

    /// Whether `--check` was given.
    pub fn checking(&self) -> bool {
        self.check
    }

    /// Prints the checks, and appends one line to the results file: `data` (an object: `stats`,
    /// `values`, `reference`, ...) with the identity of the measurement, the checks and where it
    /// comes from.
    pub fn record(
        &mut self,
        measurement: &str,
        backend: &str,
        variant: Option<&str>,
        data: serde_json::Value,
        checks: &[Check],
    ) {
        for c in checks {
            let verdict = match (c.met(), c.known_miss) {
                (true, _) => "met".to_owned(),
                (false, Some(reason)) => {
                    self.known.push(c.describe());
                    format!("MISSED (known: {reason})")
                }
                (false, None) => {
                    self.failed.push(format!("{backend}: {}", c.describe()));
                    "MISSED".to_owned()
                }
            };
            println!("target {backend}: {} -> {verdict}", c.describe());
        }
        let mut line = serde_json::json!({
            "bench": self.bench,
            "measurement": measurement,
            "backend": backend,
            "variant": variant,
            "checks": checks.iter().map(Check::json).collect::<Vec<_>>(),
            "command": self.command,
            "commit": self.commit,
            "date": utc_now(),
            "load": load_average(),
            "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        });
        if let (Some(line), serde_json::Value::Object(data)) = (line.as_object_mut(), data) {
            line.extend(data);
        }
        if let Some(dir) = self.file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.file)
            .unwrap_or_else(|e| panic!("open {}: {e}", self.file.display()));
        writeln!(file, "{line}").expect("write the results file");
    }

    /// Prints the verdict; with `--check`, exits with status 1 when a target was missed (known
    /// misses excepted).
    pub fn finish(self) {
        println!("results appended to {}", self.file.display());
        if !self.known.is_empty() {
            println!("known misses (documented, not failed): {:?}", self.known);
        }
        if self.failed.is_empty() {
            return;
        }
        eprintln!("targets missed: {:?}", self.failed);
        if self.check {
            std::process::exit(1);
        }
    }
}

/// The command that ran this bench, as far as the process can tell: the environment variables
/// that tune the benches, `cargo bench` with `--all-features` when a backend feature is on, and
/// the arguments (cargo's own `--bench` left out).
fn command(bench: &str) -> String {
    let mut env: Vec<String> = std::env::vars()
        .filter(|(k, _)| {
            (k.starts_with("BENCH_") && k != "BENCH_RESULTS_FILE")
                || k.starts_with("SCALE_")
                || k.starts_with("SIM_")
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.sort();
    let features = if cfg!(feature = "kubernetes") || cfg!(feature = "etcd") {
        " --all-features".to_owned()
    } else {
        let on: Vec<&str> = [
            ("metrics", cfg!(feature = "metrics")),
            ("web", cfg!(feature = "web")),
        ]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect();
        if on.is_empty() {
            String::new()
        } else {
            format!(" --features {}", on.join(","))
        }
    };
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut command = env;
    command.push(format!("cargo bench{features} --bench {bench}"));
    if !args.is_empty() {
        command.push(format!("-- {}", args.join(" ")));
    }
    command.join(" ")
}

/// The git commit of the crate's checkout (`-dirty` with uncommitted changes to tracked files).
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let Some(head) = git(&["rev-parse", "--short=7", "HEAD"]) else {
        return "unknown".into();
    };
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) if s.is_empty() => head,
        _ => format!("{head}-dirty"),
    }
}

/// Now, UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Where criterion writes its estimates, chosen here (as criterion would choose it) so that they
/// can be read back: `$CRITERION_HOME`, else `$CARGO_TARGET_DIR/criterion`, else the crate's
/// `target/criterion`.
pub fn criterion_dir() -> std::path::PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("criterion")
}

/// Criterion's typical estimate (the slope, else the mean) of benchmark `id`, if this run
/// (started at `started`) wrote one: `None` when it was filtered out or run with `--test`.
pub fn criterion_estimate(id: &str, started: std::time::SystemTime) -> Option<serde_json::Value> {
    let estimates = criterion_estimates(id, started)?;
    Some(if estimates["slope"].is_object() {
        estimates["slope"].clone()
    } else {
        estimates["mean"].clone()
    })
}

/// Every estimate criterion wrote for benchmark `id` in this run (started at `started`): its
/// `estimates.json` (`mean`, `median`, `slope`, ..., each with `point_estimate` and
/// `confidence_interval`), `None` when it was filtered out or run with `--test`.
pub fn criterion_estimates(id: &str, started: std::time::SystemTime) -> Option<serde_json::Value> {
    // Criterion's directory name for a benchmark id.
    let dir: String = id
        .chars()
        .map(|c| if "?\"/\\*<>:|^".contains(c) { '_' } else { c })
        .collect();
    let path = criterion_dir().join(dir).join("new").join("estimates.json");
    let fresh = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .is_ok_and(|m| m >= started);
    if !fresh {
        return None;
    }
    Some(
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read estimates"))
            .expect("criterion's estimates.json"),
    )
}
