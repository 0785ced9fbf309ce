//! The short version of issue 37's simulation (`benches/simulation.rs` runs 100 nodes × 10,000
//! shards): 20 nodes × 1,000 shards of one group on one in-memory store, in one process, under
//! the paused clock. Spread ±1; once settled the store answers one write per node per renewal
//! interval (the member renewals: bound shard leases are never renewed); a join moves exactly the
//! joiner's quota, a graceful leave exactly the leaver's shards, a crash exactly the crashed
//! node's shards after its TTL; no shard's worker ever starts while another node's runs.

#[allow(unused_macros)]
#[macro_use]
mod common;
#[path = "common/fleet_sim.rs"]
mod fleet_sim;

use std::time::Duration;

use actix_coordination::member_lease_name;
use common::run_paused;
use fleet_sim::{held_by, moved, node_name, Fleet, GROUP};
use tokio::time::{sleep, sleep_until, Instant};

const NODES: usize = 20;
const SHARDS: usize = 1_000;
const TTL: Duration = Duration::from_secs(6);
const RENEWAL: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(50);
const WITHIN: Duration = Duration::from_secs(60);

#[test]
fn twenty_nodes_of_a_thousand_shards_balance_write_once_per_node_and_move_the_minimum() {
    run_paused(async {
        let mut fleet = Fleet::new(SHARDS, TTL, RENEWAL);
        fleet.start_all(NODES, Duration::ZERO).await;
        // Spread ±1: `settled` requires 50 on every node, every shard running on its holder.
        let (settled, _) = fleet.settle(WITHIN, POLL).await;

        // Steady state: a window of 5 renewal intervals, starting between two nodes' renewals
        // (node i renews at node-000's instants + i × RENEWAL / NODES).
        sleep(TTL).await;
        let member = member_lease_name(GROUP, &node_name(0));
        let renewed = fleet.store.record(&member).unwrap().expires_at.unwrap() - TTL;
        sleep_until(renewed + RENEWAL + RENEWAL / (2 * NODES as u32)).await;
        let before = fleet.store.stats();
        sleep(RENEWAL * 5).await;
        let after = fleet.store.stats();
        assert_eq!(after.acquires, before.acquires, "no attempt once settled");
        assert_eq!(after.releases, before.releases, "no release once settled");
        assert_eq!(
            after.renewals - before.renewals,
            5 * NODES as u64,
            "one write per node per renewal interval (its member lease), none per shard"
        );
        assert_eq!(fleet.settled().unwrap(), settled, "nothing moved");

        // A join moves exactly the joiner's quota, every moved shard to the joiner.
        let joiner = node_name(NODES);
        let joined_at = Instant::now();
        fleet.start(&joiner);
        let (joined, _) = fleet.settle(WITHIN, POLL).await;
        let quota = held_by(&joined, &joiner);
        assert!(
            quota.len() == SHARDS / (NODES + 1) || quota.len() == SHARDS.div_ceil(NODES + 1),
            "the joiner holds {}",
            quota.len()
        );
        assert_eq!(
            moved(&settled, &joined),
            quota,
            "a join moves the joiner's quota only"
        );
        assert!(
            joined_at.elapsed() < TTL,
            "handovers, no TTL: {:?}",
            joined_at.elapsed()
        );

        // A graceful leave moves exactly the leaver's shards, at once.
        let leaver = node_name(3);
        let theirs = held_by(&joined, &leaver);
        let signalled = Instant::now();
        fleet.leave(&leaver).await;
        let (left, _) = fleet.settle(WITHIN, POLL).await;
        assert_eq!(
            moved(&joined, &left),
            theirs,
            "a leave moves the leaver's shards only"
        );
        assert!(signalled.elapsed() < TTL / 2, "{:?}", signalled.elapsed());

        // A crash (the store never answers the node again) moves exactly its shards, once its
        // member lease has expired: within a TTL of its last renewal.
        let crashed = node_name(7);
        let theirs = held_by(&left, &crashed);
        fleet.crash(&crashed);
        let (after_crash, took) = fleet.settle(TTL * 3, POLL).await;
        assert_eq!(
            moved(&left, &after_crash),
            theirs,
            "a crash moves its shards only"
        );
        assert!(
            took > TTL - RENEWAL && took <= TTL + Duration::from_secs(1),
            "moved {took:?} after the crash (TTL {TTL:?})"
        );

        assert_eq!(
            fleet.log.borrow().overlaps,
            0,
            "no shard ever ran twice at once"
        );
    });
}
