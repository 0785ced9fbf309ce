//! Entity → shard: which shard of a group an entity belongs to, the same on every node and
//! client; see [`shard_for`].

use crate::placement::stable_hash;

/// A mapping from entity ids to the shards of a group, the same on every node and client.
///
/// Implemented for every `Fn(&str, usize) -> usize + Send + Sync`; the default is
/// [`StableShardFunction`] ([`shard_for`]).
///
/// An implementation must be deterministic (the same entity id and shard count give the same
/// index in every process, on every node and in every version of the program that routes to the
/// group) and answer an index below `shards`: a caller that gets one out of range refuses it
/// ([`LocateError::ShardOutOfRange`](crate::LocateError::ShardOutOfRange)).
pub trait ShardFunction: Send + Sync + 'static {
    /// The index, in `0..shards`, of the shard `entity_id` belongs to. `shards` is at least 1.
    fn shard_for(&self, entity_id: &str, shards: usize) -> usize;
}

impl<F> ShardFunction for F
where
    F: Fn(&str, usize) -> usize + Send + Sync + 'static,
{
    fn shard_for(&self, entity_id: &str, shards: usize) -> usize {
        self(entity_id, shards)
    }
}

/// The default [`ShardFunction`]: [`shard_for`], pinned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StableShardFunction;

impl ShardFunction for StableShardFunction {
    fn shard_for(&self, entity_id: &str, shards: usize) -> usize {
        shard_for(entity_id, shards)
    }
}

/// The stable 64-bit hash of an entity id: 64-bit FNV-1a over its UTF-8 bytes, finished with
/// SplitMix64's finaliser. The same in every process, on every platform and in every version of
/// this crate (pinned by a test).
pub fn entity_hash(entity_id: &str) -> u64 {
    stable_hash(entity_id.bytes())
}

/// The index, in `0..shards`, of the shard entity `entity_id` belongs to, the same on every node
/// and client.
///
/// A request for entity `e` must reach the node that runs `e`'s shard. That takes two answers:
/// which shard `e` belongs to (this pure function, no I/O), and which node runs that shard now
/// (the group's [`ShardDirectory`](crate::ShardDirectory), from the group watch every node
/// already has). The first must be the same everywhere and for good: two nodes, or a node and a
/// client, or two versions of this crate during a rolling update, that put an entity in
/// different shards would run it twice or route it to a node that knows nothing of it. So it is
/// pinned:
///
/// 1. the entity id's UTF-8 bytes are hashed with 64-bit FNV-1a (offset basis
///    `0xcbf29ce484222325`, prime `0x100000001b3`), finished with SplitMix64's finaliser
///    ([`entity_hash`]; the hash [`placement_score`](crate::placement_score) uses);
/// 2. the hash picks one of `shards` buckets with Lamping and Veach's *jump consistent hash*
///    ("A Fast, Minimal Memory, Consistent Hash Algorithm", 2014), as published (its linear
///    congruential step `key * 2862933555777941757 + 1`, and IEEE 754 double arithmetic, which
///    Rust computes the same on every platform).
///
/// It depends on nothing but the id's bytes and the number of shards: not on Rust's `Hash`
/// implementations nor on `RandomState`'s per-process seeds (which differ between processes by
/// design), not on the platform, and not on the crate's version: the outputs are pinned by a
/// test of fixed vectors computed by an independent implementation (`the_default_is_pinned`),
/// and a change of them is a breaking change.
///
/// Jump hashing keeps entities where they are when shards are added at the end: going from `n`
/// to `n + 1` shards moves only the entities the new shard takes (about `1 / (n + 1)` of them),
/// each to the new shard (`growing_the_group_moves_entities_only_to_the_new_shard`). A bucket is
/// the shard's *index*: its position in the list of shard ids the group was built with (`"0"` to
/// `"n - 1"` in that order with [`ShardedWorkers::with_count`](crate::ShardedWorkers::with_count)),
/// so every node must list the same shards in the same order.
///
/// Any other mapping (a tenant table, a range of ids, a hash your other services already use) is
/// a [`ShardFunction`]: implement the trait, or pass a closure `Fn(&str, usize) -> usize`, to
/// [`ShardDirectory::with_shard_function`](crate::ShardDirectory::with_shard_function). It must be
/// just as stable: the same answer on every node and client, in every process.
///
/// ```
/// use actix_coordination::shard_for;
///
/// let shard = shard_for("customer-42", 64);
/// assert!(shard < 64);
/// assert_eq!(shard, shard_for("customer-42", 64)); // everywhere, every time
/// ```
///
/// # Panics
///
/// When `shards` is 0 (a group has at least one shard).
pub fn shard_for(entity_id: &str, shards: usize) -> usize {
    assert!(shards > 0, "an entity needs at least one shard to go to");
    let buckets = u64::try_from(shards).unwrap_or(u64::MAX);
    // `jump < buckets <= usize::MAX`: the conversion back cannot fail.
    usize::try_from(jump(entity_hash(entity_id), buckets)).unwrap_or(shards - 1)
}

/// Lamping and Veach's jump consistent hash of `key` into `buckets` (at least 1) buckets, as
/// published.
fn jump(mut key: u64, buckets: u64) -> u64 {
    let mut bucket = 0;
    let mut next = 0u64;
    while next < buckets {
        bucket = next;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        let step = f64::from(1u32 << 31) / ((key >> 33) + 1) as f64;
        // A float above `u64::MAX` saturates: the loop ends.
        next = ((bucket + 1) as f64 * step) as u64;
    }
    bucket
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The outputs are part of the wire behaviour: every node, every client and every version
    /// must put an entity in the same shard. A change here is a breaking change.
    #[test]
    fn the_default_is_pinned() {
        // Computed once by an independent implementation (Python, from the published
        // algorithms), not by this one.
        let hashes = [
            ("", 0xf52a_15e9_a9b5_e89b),
            ("a", 0x02c0_bdbf_4814_20f8),
            ("customer-42", 0xe02a_9217_8bcc_fd76),
            ("tenant/acme", 0x53ad_d6cf_4a25_f9fe),
            ("ü", 0x772d_5ffd_bcb8_f81a),
        ];
        for (id, hash) in hashes {
            assert_eq!(entity_hash(id), hash, "entity_hash({id:?})");
        }
        let shards = [
            ("", 1, 0),
            ("", 64, 27),
            ("a", 64, 57),
            ("customer-42", 64, 19),
            ("customer-42", 1000, 882),
            ("tenant/acme", 7, 2),
            ("ü", 3, 1),
            ("order-1", 65536, 31860),
        ];
        for (id, n, shard) in shards {
            assert_eq!(shard_for(id, n), shard, "shard_for({id:?}, {n})");
        }
    }

    #[test]
    fn every_index_is_in_range_and_the_spread_is_even() {
        for n in [1, 2, 3, 7, 64, 1000] {
            let mut counts = vec![0usize; n];
            let entities = 200 * n;
            for i in 0..entities {
                let shard = shard_for(&format!("entity-{i}"), n);
                assert!(shard < n);
                counts[shard] += 1;
            }
            // 200 per shard on average: no shard below half or above twice that.
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(*min > 100 && *max < 400, "{n} shards: {min}..{max}");
        }
        assert_eq!(shard_for("anything", 1), 0);
    }

    #[test]
    fn growing_the_group_moves_entities_only_to_the_new_shard() {
        for n in [1, 2, 5, 63, 64] {
            let mut moved = 0;
            for i in 0..10_000 {
                let id = format!("e{i}");
                let (before, after) = (shard_for(&id, n), shard_for(&id, n + 1));
                if before != after {
                    assert_eq!(after, n, "{id} moved from {before} to an old shard");
                    moved += 1;
                }
            }
            // About 10,000 / (n + 1).
            let expected = 10_000 / (n + 1);
            assert!(
                moved > expected / 2 && moved < expected * 2,
                "{n} → {}: {moved} moved",
                n + 1
            );
        }
    }

    #[test]
    fn a_closure_is_a_shard_function() {
        let by_prefix = |id: &str, shards: usize| usize::from(id.starts_with('b')) % shards;
        assert_eq!(by_prefix.shard_for("bob", 2), 1);
        assert_eq!(
            StableShardFunction.shard_for("bob", 64),
            shard_for("bob", 64)
        );
    }

    #[test]
    #[should_panic(expected = "at least one shard")]
    fn no_shard_panics() {
        shard_for("a", 0);
    }
}
