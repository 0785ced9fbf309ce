//! Helpers shared by the integration tests: the generic lease contract suite and its fixtures.
#![allow(dead_code)]

pub mod actors;
#[cfg(all(feature = "etcd", feature = "kubernetes"))]
pub mod chaos;
pub mod chaos_check;
#[cfg(feature = "kubernetes")]
pub mod clientgo;
pub mod clock;
pub mod contract;
pub mod doc_commands;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub mod etcd_cluster;
#[cfg(feature = "kubernetes")]
pub mod k8s;
pub mod logs;
pub mod model;
#[cfg(all(feature = "etcd", feature = "kubernetes"))]
pub mod netns;
pub mod proxy;
pub mod shard_check;
pub mod sharded_cases;

/// The example `name`, built with every feature (cheap when up to date) and copied once per test
/// process to `target/examples-bin/<pid>/`: the target directory may be shared with other
/// checkouts whose builds replace the example while a test runs it.
pub fn example_binary(name: &str) -> std::path::PathBuf {
    example_binary_built_with(name, &["--all-features"])
}

/// The example `name` built with the features of the test being run (`cargo test` has built it
/// so already, unless its `required-features` are off: then the build fails), copied like
/// [`example_binary`]: a test that runs in a build with fewer features builds nothing more.
pub fn example_binary_as_built(name: &str) -> std::path::PathBuf {
    let features = build_features();
    if features.len() == FEATURES.len() {
        example_binary_built_with(name, &["--all-features"])
    } else {
        let list = features.join(",");
        example_binary_built_with(name, &["--no-default-features", "--features", &list])
    }
}

/// Every feature of the crate (`__docs` too: `--all-features` turns it on).
pub const FEATURES: [&str; 6] = [
    "kubernetes",
    "etcd",
    "metrics",
    "web",
    "web-forward",
    "__docs",
];

/// The crate's features on in this build of the tests.
pub fn build_features() -> Vec<&'static str> {
    let on = [
        cfg!(feature = "kubernetes"),
        cfg!(feature = "etcd"),
        cfg!(feature = "metrics"),
        cfg!(feature = "web"),
        cfg!(feature = "web-forward"),
        cfg!(feature = "__docs"),
    ];
    FEATURES
        .iter()
        .zip(on)
        .filter(|(_, on)| *on)
        .map(|(f, _)| *f)
        .collect()
}

/// The example `name` built by `cargo build --example name` with `features` (the cargo flags),
/// copied once per test process and feature set to `target/examples-bin/<pid>/` (a second
/// feature set of the same example to `<pid>/1/`, …).
pub fn example_binary_built_with(name: &str, features: &[&str]) -> std::path::PathBuf {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;
    static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    let key = format!("{name} {}", features.join(" "));
    if let Some(bin) = built.get(&key) {
        return bin.clone();
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = env!("CARGO_MANIFEST_DIR");
    let status = std::process::Command::new(cargo)
        .args(["build", "--quiet", "--example", name])
        .args(features)
        .current_dir(manifest)
        .status()
        .expect("run cargo build");
    assert!(
        status.success(),
        "building the {name} example ({}) failed",
        features.join(" ")
    );
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(manifest).join("target"));
    let source = target.join("debug").join("examples").join(name);
    // One directory per feature set (the first one's is `<pid>/`), the binary's name unchanged.
    let mut dir = Path::new(manifest)
        .join("target")
        .join("examples-bin")
        .join(std::process::id().to_string());
    let sets = built
        .keys()
        .filter(|k| k.starts_with(&format!("{name} ")))
        .count();
    if sets > 0 {
        dir = dir.join(sets.to_string());
    }
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join(name);
    std::fs::copy(&source, &bin)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", source.display(), bin.display()));
    built.insert(key, bin.clone());
    bin
}

/// Expands to one `#[test]` per case of the contract suite, each building its fixture with
/// `$fixture` (a plain expression, evaluated inside the test's runtime) and running under the
/// test attribute given.
///
/// ```ignore
/// contract_suite!(fixture = InMemoryFixture::new(), test = #[tokio::test(start_paused = true)]);
/// ```
#[macro_export]
macro_rules! contract_suite {
    (fixture = $fixture:expr, test = #[$attr:meta]) => {
        $crate::contract_suite!(@cases [$fixture] [$attr]
            one_winner_per_round
            reentrant_acquire_keeps_one_tenure
            release_when_not_held_is_a_noop
            release_lets_the_next_owner_in
            retire_lets_the_next_owner_in
            dropped_holder_blocks_others_until_ttl
            paused_holder_loses_at_its_deadline
            partitioned_holder_is_told_before_the_contender_wins
            fencing_tokens_strictly_increase
            on_lost_fires_once_per_loss
            unsubscribe_works
            unreachable_backend_makes_acquire_fail
            group_watch_shows_holders_releases_and_expiries
            release_to_hands_the_lease_to_the_preferred_owner
            a_preference_nobody_takes_up_lapses_after_one_ttl
            group_watch_shows_the_holders_metadata
            hand_over_gives_the_lease_to_the_waiting_target
            a_handover_to_a_longer_ttl_never_outlives_the_record
        );
    };
    (@cases [$fixture:expr] [$attr:meta] $($case:ident)*) => {
        $(
            #[$attr]
            async fn $case() {
                let fixture = $fixture;
                $crate::common::contract::$case(&fixture).await;
            }
        )*
    };
}

/// Runs `f` inside an actix `System` whose Tokio runtime has a paused clock: time advances only
/// when every task is idle, straight to the next timer, so TTLs of seconds take no real time and
/// timings are exact.
pub fn run_paused<F: std::future::Future>(f: F) -> F::Output {
    actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("tokio runtime")
    })
    .block_on(f)
}

/// Runs `f` inside an actix `System` on a real clock (for tests against real servers).
pub fn run_real<F: std::future::Future>(f: F) -> F::Output {
    actix_rt::System::new().block_on(f)
}

/// How `child` ended, if it has (`None` while it runs, or when there is no child).
pub fn exit_status(child: &mut Option<std::process::Child>) -> Option<std::process::ExitStatus> {
    child.as_mut().and_then(|c| c.try_wait().ok().flatten())
}

/// `N` distinct free loopback ports below the kernel's ephemeral range, so that outgoing
/// connections cannot take them while a test's server is down (between a kill and a restart), and
/// from 20000 up, above the ports of `scripts/test-cluster.sh` (10000–19999), whose members the
/// etcd cluster tests kill and restart.
///
/// Each port is **reserved** for the rest of the process: no later call, in this process or in
/// another test process on the machine, hands it out again, even while its server is down. A
/// port that was merely free when probed was not enough: `chaos_etcd_cluster` kills members and
/// restarts them on the same ports 1–3 s later, and a private server of another test (running
/// alongside, as `chaos_etcd` does, or in another process) that took such a port made the member
/// exit at once ("bind: address already in use": "etcd exited ... before it was ready"). The
/// reservation is an exclusive lock on a file per port under the temporary directory, held open
/// by this process (the kernel drops it when the process ends, however it ends).
pub fn free_loopback_ports<const N: usize>() -> [u16; N] {
    use std::sync::Mutex;
    static HELD: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let span = u64::from(low.saturating_sub(20000).max(1000));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        ^ u64::from(std::process::id()).wrapping_mul(7919);
    let locks = std::env::temp_dir().join("actix-coord-test-ports");
    std::fs::create_dir_all(&locks).expect("port reservation directory");
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    let mut ports = [0; N];
    let mut found = 0;
    // Step 1 (not 7, which divides the usual span of 12768 and left six ports in seven unvisited).
    for i in 0..span {
        if found == N {
            break;
        }
        let port = 20000 + ((seed + i) % span) as u16;
        if port >= low {
            continue;
        }
        // Reserved by this process or another one (a second lock from this process fails too:
        // the locks belong to open files, not to processes).
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(locks.join(port.to_string()))
        else {
            continue;
        };
        if file.try_lock().is_err() {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            held.push(file);
            ports[found] = port;
            found += 1;
        }
    }
    assert!(found == N, "no {N} free loopback ports from 20000 to {low}");
    ports
}

/// Records, for `window`, when each call to `store` was refused (the store must be failing), and
/// returns the pauses between them. Under a paused clock the times are exact to the millisecond.
pub async fn refused_attempt_gaps(
    store: &actix_coordination::InMemoryStore,
    window: std::time::Duration,
) -> Vec<std::time::Duration> {
    use tokio::time::{sleep, Instant};
    let start = Instant::now();
    let mut attempts = Vec::new();
    let mut seen = 0;
    while start.elapsed() < window {
        let refused = store.stats().refused;
        for _ in seen..refused {
            attempts.push(Instant::now());
        }
        seen = refused;
        sleep(std::time::Duration::from_millis(1)).await;
    }
    attempts.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Asserts that the pauses `gaps[from..]` form an exponential backoff up to `cap`: never longer
/// than the cap, each about double the previous one until the cap is reached (after at least
/// `min_steps` of them), and then at least five pauses at the cap (80–100 % of it, the jitter).
///
/// The cap is reached where the pauses stop doubling, not at the first pause within the cap's
/// jitter band: a doubled pause may fall in the band already (200 ms doubled three times is
/// 1.6 s, 80 % of a 2 s cap; a CI run had 1.598 s).
pub fn assert_backoff_up_to(
    gaps: &[std::time::Duration],
    from: usize,
    min_steps: usize,
    cap: std::time::Duration,
) {
    let slack = std::time::Duration::from_millis(2);
    assert!(
        gaps.iter().all(|g| *g <= cap + slack),
        "never longer than the cap: {gaps:?}"
    );
    let at_cap = (from + 1..gaps.len())
        .find(|&i| gaps[i].as_secs_f64() < 1.5 * gaps[i - 1].as_secs_f64())
        .expect("stops growing");
    assert!(
        at_cap >= from + min_steps,
        "grows over several steps: {gaps:?}"
    );
    assert!(gaps.len() - at_cap >= 5, "{gaps:?}");
    assert!(
        gaps[at_cap..]
            .iter()
            .all(|g| *g >= cap.mul_f64(0.8) - slack),
        "stays at the cap: {gaps:?}"
    );
}

/// Polls `condition` every 10 ms until it holds; panics with `what` after `within` (real time).
pub async fn eventually(
    within: std::time::Duration,
    what: &str,
    mut condition: impl FnMut() -> bool,
) {
    let give_up = std::time::Instant::now() + within;
    while !condition() {
        assert!(
            std::time::Instant::now() < give_up,
            "{what} (waited {within:?})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Settings of `owner` for `name` with this `ttl` whose waits for a held lease end only by a
/// watch event, never by the retry delay (60 s): a test that sees the lease change hand saw the
/// event do it.
pub fn event_driven_settings(
    name: &str,
    owner: &str,
    ttl: std::time::Duration,
) -> actix_coordination::LeaseSettings {
    actix_coordination::LeaseSettings::builder(name, owner)
        .ttl(ttl)
        .acquire_retry_delay(std::time::Duration::from_secs(60))
        .build()
        .unwrap()
}
