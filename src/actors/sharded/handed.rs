//! Shards handed to this node: by a one-write handover naming it, or by a member that left
//! handing its bound shards on to this node's member tenure ([`Lease::retire_handing`]).

use actix::prelude::*;
use tokio::time::Instant;

use super::ShardedWorkers;
use crate::group::GroupSnapshot;
use crate::lease::Lease;

impl<A: Actor<Context = Context<A>>, L: Lease> ShardedWorkers<A, L> {
    /// Whether shard `index`, not held here, was handed to this node with a tenure newer than
    /// any it had: its record names this node (a one-write handover), or the member tenure it
    /// is bound to ended handing it on to this node's member tenure, which the snapshot shows
    /// live (see [`Lease::retire_handing`]).
    pub(super) fn handed_here(&self, index: usize, snapshot: &GroupSnapshot, now: Instant) -> bool {
        let handing = self.members_handing_on(snapshot);
        self.handed_here_among(index, snapshot, now, &handing)
    }

    /// The member records of `snapshot` that list shards handed on (rarely more than one: a
    /// member that left moments ago).
    pub(super) fn members_handing_on(&self, snapshot: &GroupSnapshot) -> Vec<String> {
        snapshot
            .with_prefix(&self.member_prefix)
            .filter(|(_, record)| record.handed.is_some())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// [`handed_here`](Self::handed_here), given the member records that list shards handed on
    /// ([`members_handing_on`](Self::members_handing_on)): a look at every shard reads one record
    /// per shard, not three.
    pub(super) fn handed_here_among(
        &self,
        index: usize,
        snapshot: &GroupSnapshot,
        now: Instant,
        handing: &[String],
    ) -> bool {
        let shard = &self.shards[index];
        if shard.held() {
            return false;
        }
        let Some(record) = snapshot.get(&shard.name) else {
            return false;
        };
        if record.live_holder(now) == Some(self.node.as_str()) && record.token > shard.last_token {
            return true;
        }
        let listed = record
            .bound_to
            .as_ref()
            .is_some_and(|binding| handing.iter().any(|m| m == binding.member()));
        listed
            && snapshot
                .handed_to(&shard.name)
                .is_some_and(|(owner, _, token)| {
                    owner == self.node
                        && token > shard.last_token
                        && snapshot.live_holder(&shard.name, now) == Some(self.node.as_str())
                })
    }

    /// Starts competing at once for the shards that the member records changed since the last
    /// look hand to this node (see [`handed_here`](Self::handed_here)), before the look itself:
    /// `true` when it started any (the caller looks right after, once they had their turn).
    pub(super) fn start_handed(
        &mut self,
        snapshot: &GroupSnapshot,
        ctx: &mut Context<Self>,
    ) -> bool {
        if self.shutting_down {
            return false;
        }
        let Some(since) = self.view.seen_version() else {
            return false;
        };
        let Some(changed) = snapshot.changes_since(since) else {
            return false;
        };
        let now = Instant::now();
        let mut handed = Vec::new();
        for name in changed {
            if !name.starts_with(self.member_prefix.as_str()) {
                continue;
            }
            let Some(list) = snapshot.get(name).and_then(|record| record.handed.as_ref()) else {
                continue;
            };
            for (_, lease, owner, _) in list.entries() {
                if owner != self.node {
                    continue;
                }
                if let Some(index) = self.shard_index(lease) {
                    let shard = &self.shards[index];
                    if !shard.eligible && self.handed_here(index, snapshot, now) {
                        handed.push(index);
                    }
                }
            }
        }
        let mut started = false;
        for index in handed {
            self.handing_over.remove(&index);
            self.set_eligible(index, true, ctx);
            // (a lease that could not be built leaves the shard ineligible, for the look)
            started |= self.shards[index].eligible;
        }
        started
    }
}
