//! Helpers shared by the integration tests: the generic lease contract suite and its fixtures.
#![allow(dead_code)]

#[cfg(all(feature = "etcd", feature = "kubernetes"))]
pub mod chaos;
pub mod contract;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "kubernetes")]
pub mod k8s;
pub mod proxy;

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
            dropped_holder_blocks_others_until_ttl
            paused_holder_loses_at_its_deadline
            partitioned_holder_is_told_before_the_contender_wins
            fencing_tokens_strictly_increase
            on_lost_fires_once_per_loss
            unsubscribe_works
            unreachable_backend_makes_acquire_fail
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

/// How `child` ended, if it has (`None` while it runs, or when there is no child).
pub fn exit_status(child: &mut Option<std::process::Child>) -> Option<std::process::ExitStatus> {
    child.as_mut().and_then(|c| c.try_wait().ok().flatten())
}

/// `N` distinct free loopback ports below the kernel's ephemeral range, so that outgoing
/// connections cannot take them while a test's server is down (between a kill and a restart).
pub fn free_loopback_ports<const N: usize>() -> [u16; N] {
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
    let mut ports = [0; N];
    let mut found = 0;
    for i in 0..span {
        if found == N {
            break;
        }
        let port = 20000 + ((seed + i * 7) % span) as u16;
        if port >= low || ports[..found].contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports[found] = port;
            found += 1;
        }
    }
    assert!(found == N, "no {N} free loopback ports below {low}");
    ports
}
