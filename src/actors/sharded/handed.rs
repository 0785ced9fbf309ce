//! Shards handed to this node: by a one-write handover naming it, or by a member that left
//! handing its bound shards on to this node's member tenure ([`Lease::retire_handing`]).

use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use super::ShardedWorkers;
use crate::binding::{Binding, HandedShard};
use crate::group::GroupSnapshot;
use crate::lease::Lease;

/// How long the fold of a change waits at most for the shards it handed here to be taken up
/// (claimed: one compare-and-swap each, with no wait for any expiry).
///
/// When a member leaves, every node folds the same change at the same moment, and at
/// 16 × 4,096 on 2 cores the folds of the others (several ms each) held a take-up back by up
/// to 110 ms when the fold came one timer's turn after the take-ups started
/// (`fleet -- kubernetes large`). The fold does not move a shard the leaving member's list
/// named: waiting for it delays only what it would start or hand over besides.
const TAKE_UP_BOUND: Duration = Duration::from_millis(250);

/// Once every shard handed here is taken up, the fold still waits this long: a timer's turn, so
/// that their managers start their workers first.
const TAKE_UP_TURN: Duration = Duration::from_millis(1);

/// The shards handed here that are being taken up, and until when the fold waits for them.
#[derive(Debug, Default)]
pub(super) struct TakingUp {
    shards: Vec<usize>,
    until: Option<Instant>,
}

impl<A: Actor<Context = Context<A>>, L: Lease> ShardedWorkers<A, L> {
    /// Whether the fold of the group's change waits, for the shards [`start_handed`] started:
    /// until each is held here (then one timer's turn more), no longer competed for, or
    /// [`TAKE_UP_BOUND`] has passed since the first. A wait plans the reconcile that ends it.
    ///
    /// [`start_handed`]: Self::start_handed
    pub(super) fn fold_waits_for_handed(&mut self, ctx: &mut Context<Self>) -> bool {
        let Some(until) = self.taking_up.until else {
            return false;
        };
        let shards = &self.shards;
        self.taking_up.shards.retain(|&index| {
            let shard = &shards[index];
            shard.eligible && shard.manager.is_some() && !shard.held()
        });
        let now = Instant::now();
        let until = if self.taking_up.shards.is_empty() {
            until.min(now + TAKE_UP_TURN)
        } else {
            until
        };
        if now >= until {
            self.taking_up = TakingUp::default();
            return false;
        }
        self.taking_up.until = Some(until);
        if let Some(handle) = self.wake.take() {
            ctx.cancel_future(handle);
        }
        self.wake = Some(ctx.run_later(until - now, |act, ctx| {
            act.wake = None;
            act.reconcile(ctx);
        }));
        true
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

    /// Whether shard `index`, not held here, was handed to this node with a tenure newer than
    /// any it had: its record names this node (a one-write handover), or the member tenure it
    /// is bound to ended handing it on to this node's member tenure, which the snapshot shows
    /// live (see [`Lease::retire_handing`]). `handing` is the member records that list shards
    /// handed on ([`members_handing_on`](Self::members_handing_on)): a look at every shard reads
    /// one record per shard, not three.
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

    /// Plans, for every member tenure that `snapshot` shows expired but not yet ended in its
    /// record, where its bound shards go: each to the target this fold placed it on, with that
    /// target's member tenure ([`Lease::plan_hand_on`]). The first claim of this process that
    /// finds the member expired then ends its record listing them, and the targets claim them at
    /// once, as from a member that left: no other node competes for them. Once per member
    /// tenure.
    pub(super) fn plan_hand_on_expired(&mut self, snapshot: &GroupSnapshot, now: Instant) {
        if self.view.me.is_none() || self.shutting_down {
            return;
        }
        let expired: Vec<(String, String)> = snapshot
            .with_prefix(&self.member_prefix)
            .filter(|(_, record)| {
                record.holder.is_some()
                    && record.bound_to.is_none()
                    && record.live_holder(now).is_none()
            })
            .filter_map(|(name, record)| Some((name.clone(), record.incarnation.clone()?)))
            .filter(|(name, incarnation)| self.hand_on_planned.get(name) != Some(incarnation))
            .collect();
        for (member, incarnation) in expired {
            if self.hand_on_planned.len() >= 1024 {
                self.hand_on_planned.clear();
            }
            self.hand_on_planned
                .insert(member.clone(), incarnation.clone());
            let ended = Binding::new(member, incarnation);
            let handed: Vec<HandedShard> = (0..self.shards.len())
                .filter(|&index| {
                    snapshot
                        .get(&self.shards[index].name)
                        .is_some_and(|record| record.bound_to.as_ref() == Some(&ended))
                })
                .filter_map(|index| {
                    let owner = &self.view.members[self.view.targets[index]?];
                    self.handed_to_member(snapshot, now, &self.shards[index].name, owner)
                })
                .collect();
            if !handed.is_empty() {
                tracing::debug!(group = %self.group, member = %ended.member(), shards = handed.len(), "a member expired: planned where its shards go");
                self.member_lease.plan_hand_on(&ended, handed);
            }
        }
    }

    /// Shard lease `shard` handed to `owner` under the member tenure `snapshot` shows live for it
    /// at `now`; `None` when its member record shows none.
    pub(super) fn handed_to_member(
        &self,
        snapshot: &GroupSnapshot,
        now: Instant,
        shard: &str,
        owner: &str,
    ) -> Option<HandedShard> {
        let member = format!("{}{owner}", self.member_prefix);
        let record = snapshot.get(&member)?;
        if record.live_holder(now) != Some(owner) {
            return None;
        }
        let incarnation = record.incarnation.clone()?;
        Some(HandedShard::new(
            shard.to_owned(),
            owner,
            Binding::new(member, incarnation),
        ))
    }

    /// Starts competing at once for the shards that the member records changed since the last
    /// look hand to this node (see [`handed_here_among`](Self::handed_here_among)), before the look itself,
    /// which waits for them ([`fold_waits_for_handed`](Self::fold_waits_for_handed)).
    ///
    /// `handing` is [`members_handing_on`](Self::members_handing_on) of `snapshot`: rarely does a
    /// member record list shards handed on (a member that left moments ago), and then no member
    /// record that changed (a renewal each) is looked up.
    pub(super) fn start_handed(
        &mut self,
        snapshot: &GroupSnapshot,
        handing: &[String],
        ctx: &mut Context<Self>,
    ) {
        if self.shutting_down || handing.is_empty() {
            return;
        }
        let Some(since) = self.view.seen_version() else {
            return;
        };
        let Some(changed) = snapshot.changes_since(since) else {
            return;
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
                    if !shard.eligible && self.handed_here_among(index, snapshot, now, handing) {
                        handed.push(index);
                    }
                }
            }
        }
        for index in handed {
            self.handing_over.remove(&index);
            self.set_eligible(index, true, ctx);
            // (a lease that could not be built leaves the shard ineligible, for the look)
            if self.shards[index].eligible {
                self.taking_up.shards.push(index);
                self.taking_up.until.get_or_insert(now + TAKE_UP_BOUND);
            }
        }
    }
}
