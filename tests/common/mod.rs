//! Helpers shared by the integration tests: the generic lease contract suite and its fixtures.
#![allow(dead_code)]

#[cfg(feature = "etcd")]
pub mod chaos;
pub mod contract;
#[cfg(feature = "etcd")]
pub mod etcd;
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
