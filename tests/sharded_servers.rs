//! Sharded workers on the real etcd and kube-apiserver, in one process (issue 36): the cases of
//! `tests/common/sharded_cases.rs`, every node with a session of its own as a process would have
//! (what one node's session saw is not what another's saw), and what only a real store shows.
//!
//! Needs the test cluster (`scripts/test-cluster.sh`). Every test uses groups of its own.

mod common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use actix_coordination::{EtcdSession, KubernetesSession, LeaseSettings, SharedLease};
use common::run_real;
use common::sharded_cases::{self, Fleet};

/// Long enough that a shard waiting for a record's expiry misses every deadline of the cases
/// (half a TTL), short enough for the cases to end within seconds.
const TTL: Duration = Duration::from_secs(8);

/// Nodes on the real etcd, each with an [`EtcdSession`] of its own, all under one key prefix.
struct EtcdFleet {
    prefix: String,
    sessions: RefCell<HashMap<String, EtcdSession>>,
}

impl EtcdFleet {
    fn new(test: &str) -> Self {
        Self {
            prefix: common::etcd::unique_prefix(test),
            sessions: RefCell::default(),
        }
    }
}

impl Fleet for EtcdFleet {
    fn node(&self, node: &str) -> Rc<dyn Fn(LeaseSettings) -> SharedLease> {
        let session = self
            .sessions
            .borrow_mut()
            .entry(node.to_owned())
            .or_insert_with(|| {
                EtcdSession::new(common::etcd::etcd_settings(
                    &common::etcd::endpoint(),
                    &self.prefix,
                ))
            })
            .clone();
        Rc::new(move |settings| SharedLease::new(session.lease(settings)))
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    fn unique(&self, base: &str) -> String {
        base.to_owned()
    }
}

/// Nodes on the real kube-apiserver, each with a [`KubernetesSession`] of its own.
struct KubernetesFleet {
    sessions: RefCell<HashMap<String, KubernetesSession>>,
}

impl KubernetesFleet {
    fn new() -> Self {
        Self {
            sessions: RefCell::default(),
        }
    }
}

impl Fleet for KubernetesFleet {
    fn node(&self, node: &str) -> Rc<dyn Fn(LeaseSettings) -> SharedLease> {
        let session = self
            .sessions
            .borrow_mut()
            .entry(node.to_owned())
            .or_insert_with(|| {
                KubernetesSession::new(common::k8s::settings_at(&common::k8s::env().url)).unwrap()
            })
            .clone();
        Rc::new(move |settings| SharedLease::new(session.lease(settings)))
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    fn unique(&self, base: &str) -> String {
        common::k8s::unique(base)
    }
}

macro_rules! cases {
    ($($case:ident)*) => {
        mod etcd {
            use super::*;
            $(
                #[test]
                fn $case() {
                    run_real(sharded_cases::$case(&EtcdFleet::new(stringify!($case))));
                }
            )*
        }
        mod kubernetes {
            use super::*;
            $(
                #[test]
                fn $case() {
                    run_real(sharded_cases::$case(&KubernetesFleet::new()));
                }
            )*
        }
    };
}

cases!(
    a_leaving_node_hands_nothing_to_a_node_that_left_meanwhile
    a_lease_named_like_a_member_makes_no_member
    groups_whose_names_extend_each_other_share_no_lease
    a_shard_handed_to_a_leaving_node_is_passed_on
    every_node_locates_every_shard_with_its_holders_address
    a_slow_worker_keeps_only_its_own_shard
    a_shard_handed_to_a_node_leaving_slowly_is_passed_on_at_once
    a_shard_handed_to_a_node_past_its_grace_is_passed_on_at_once
);

/// Item 4: a shard whose lease could not be built (a provider's backend failing for a while: a
/// secret file being rotated, say) is tried again on a backoff, not only at the group's next
/// change. On etcd a settled group is quiet (its renewals are keep-alives, which change no key),
/// so without the retry the shard stayed unrun for good.
#[test]
fn a_shard_whose_lease_failed_to_build_runs_once_it_can_be_built_etcd() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use actix::prelude::*;
    use actix_coordination::{
        CoordinationConfig, GetShards, LeaseProvider, ShardInfo, ShardedWorkers, Shutdown,
    };
    use tokio::time::{sleep, Instant};

    struct Part;
    impl Actor for Part {
        type Context = Context<Self>;
    }

    run_real(async {
        let config: CoordinationConfig =
            toml::from_str("[leases.flaky]\nbackend = \"flaky\"\nttl = \"8s\"\n").unwrap();
        let provider = LeaseProvider::new(config);
        let session = EtcdSession::new(common::etcd::etcd_settings(
            &common::etcd::endpoint(),
            &common::etcd::unique_prefix("lease-build-retry"),
        ));
        // Shard 1's lease cannot be built until this instant, set once the group is built (its
        // construction builds every lease once, to check their names).
        let fail_until: Arc<Mutex<Option<Instant>>> = Arc::default();
        let failures = Arc::new(AtomicUsize::new(0));
        let (fail, failed) = (Arc::clone(&fail_until), Arc::clone(&failures));
        provider.register_backend(
            "flaky",
            move |settings: LeaseSettings, _: Option<&serde_json::Value>| {
                let failing = fail
                    .lock()
                    .unwrap()
                    .is_some_and(|until| Instant::now() < until);
                if failing && settings.name().ends_with(".1") {
                    failed.fetch_add(1, Ordering::Relaxed);
                    return Err("the backend's secret file is being rotated".into());
                }
                Ok(SharedLease::new(session.lease(settings)))
            },
        );
        let node = ShardedWorkers::from_provider(
            &provider,
            "flaky",
            "retry",
            ["0", "1", "2", "3"],
            "n1",
            |_: &ShardInfo, _: &mut Context<Part>| Part,
        )
        .unwrap();
        // Failing for 2 s from the start: the group's claims are over by then, and it is quiet.
        *fail_until.lock().unwrap() = Some(Instant::now() + Duration::from_secs(2));
        let node = node.start();
        let give_up = Instant::now() + TTL * 2;
        loop {
            let held = node.send(GetShards).await.unwrap();
            if held.len() == 4 {
                break;
            }
            assert!(
                Instant::now() < give_up,
                "shard 1 never ran after its lease failed to build ({} failures): {held:?}",
                failures.load(Ordering::Relaxed)
            );
            sleep(Duration::from_millis(20)).await;
        }
        assert!(
            failures.load(Ordering::Relaxed) >= 1,
            "shard 1's lease failed to build at least once"
        );
        assert!(node.send(Shutdown).await.unwrap().unwrap());
    });
}
