//! How a [`ShardedWorkers`] node leaves its group: [`Shutdown`]'s turns, each shard handed to
//! the node that targets it when its turn comes, and the shards handed to it meanwhile passed on.

use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::sync::Arc;

use actix::fut::LocalBoxActorFuture;
use actix::prelude::*;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::{LeaseError, ShardedWorkers};
use crate::actors::singleton::{
    HandOverTo, HandoverTarget, KeepLeaseOnShutdown, RetireHanding, Shutdown,
};
use crate::lease::Lease;
use crate::metrics;

/// A shutdown in progress: the shards still to hand over, the handovers in flight, the result so
/// far, and who waits for the end.
#[derive(Default)]
pub(super) struct Leaving {
    turns: VecDeque<usize>,
    in_flight: usize,
    result: Option<Result<bool, LeaseError>>,
    done: Vec<tokio::sync::oneshot::Sender<Result<bool, LeaseError>>>,
    /// The members other than this node, and the targets placed for them (computed again only
    /// when the members change: each handover moves a shard to its target, which changes no
    /// target).
    placed: Option<(Vec<String>, Vec<Option<usize>>)>,
    /// Whether the shards handed to this node while it left were passed on.
    swept: bool,
    /// Whether every shard handed to this node is passed on as soon as the group watch shows
    /// it ([`pass_on_while_leaving`]): from a bound leave's grace on, and from the member
    /// lease's retirement on in a leave that takes turns.
    ///
    /// [`pass_on_while_leaving`]: ShardedWorkers::pass_on_while_leaving
    passing_on: bool,
    /// Whether the leave takes turns (shard leases renewed on their own): what is passed on
    /// counts as in flight, and the leave ends once it is done.
    in_turns: bool,
    /// The shards being passed on past the grace (each once).
    passing: BTreeSet<usize>,
    /// The version of the group snapshot the pass-on last looked at.
    looked_at: Option<crate::group::SnapshotVersion>,
}

/// With bound shard leases, stops every worker at once and hands every shard on in the member
/// lease's retirement, or past the leave grace each shard on its own (`leave_bound`). Otherwise
/// retires the member lease first, then shuts the shards down `shutdown_handovers` (128) at a
/// time (each one's worker stops, then its lease is handed over or released: a slow worker
/// delays its own shard only; etcd writes the handovers sent together in a few transactions),
/// each to the node that targets it when its turn comes, and passes on every shard handed to
/// this node meanwhile as soon as the group watch shows it.
/// Answers `Ok(true)` when everything was released, else the first error (`Ok(false)` when a
/// lease was held by another owner), and stops. A second `Shutdown` waits for the same end.
impl<A: Actor<Context = Context<A>>, L: Lease> Handler<Shutdown> for ShardedWorkers<A, L> {
    type Result = ResponseActFuture<Self, Result<bool, LeaseError>>;

    fn handle(&mut self, _: Shutdown, _ctx: &mut Context<Self>) -> Self::Result {
        let (done, answer) = tokio::sync::oneshot::channel();
        self.leaving.done.push(done);
        let answer = actix::fut::wrap_future(answer).map(
            |answer: Result<_, _>, _act: &mut Self, ctx: &mut Context<Self>| {
                ctx.stop();
                answer.unwrap_or(Ok(true))
            },
        );
        if self.shutting_down {
            return Box::pin(answer);
        }
        self.shutting_down = true;
        (self.health.leaving).store(true, std::sync::atomic::Ordering::Release);
        let held = self.shards.iter().filter(|s| s.held()).count();
        metrics::shard_moved(&self.label, "shutdown", held as u64);
        self.report_held(0);
        self.leaving.turns = (0..self.shards.len())
            .filter(|&index| self.shards[index].manager.is_some())
            .collect();
        if self.shards.iter().any(|s| {
            s.lease
                .as_ref()
                .is_some_and(|lease| lease.bound_to().is_some())
        }) {
            return Box::pin(self.leave_bound().then(|(), _, _| answer));
        }
        let member = self.member.clone();
        let member_left = async move {
            match member {
                Some(member) => member.send(Shutdown).await.unwrap_or(Ok(true)),
                None => Ok(true),
            }
        };
        Box::pin(actix::fut::wrap_future(member_left).then(
            |result, act: &mut Self, ctx: &mut Context<Self>| {
                act.leaving.add(result);
                act.leaving.in_turns = true;
                act.leaving.passing_on = true;
                act.pass_on_while_leaving(ctx);
                act.take_turns(ctx);
                answer
            },
        ))
    }
}

impl Leaving {
    /// Adds one release's answer to the result: the first error, else whether all released.
    fn add(&mut self, answer: Result<bool, LeaseError>) {
        self.result = Some(match (self.result.take().unwrap_or(Ok(true)), answer) {
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
            (Ok(a), Ok(b)) => Ok(a && b),
        });
    }
}

impl<A: Actor<Context = Context<A>>, L: Lease> ShardedWorkers<A, L> {
    /// Leaving with bound shard leases: every worker stops first, all at once, under its tenure
    /// (its lease left held, bound to the member lease). When they all stopped within
    /// [`ShardedSettings::leave_grace`](super::ShardedSettings::leave_grace), the member lease is
    /// retired, which ends every bound tenure and hands every shard on in that one write: the
    /// other nodes claim the shards they target at once, no worker of this node runs by then,
    /// and no shard waits for a record to expire. Past the grace, the shards whose workers
    /// stopped are handed over each on its own write, and the others each by its manager as
    /// soon as its worker stops ([`past_grace`](Self::past_grace)): a slow worker keeps only its
    /// own shard. A shard lease that is not bound is released as usual.
    fn leave_bound(&mut self) -> LocalBoxActorFuture<Self, ()> {
        let turns: Vec<usize> = self.leaving.turns.drain(..).collect();
        let mut stops = FuturesUnordered::new();
        for &index in &turns {
            let shard = &self.shards[index];
            let Some(manager) = shard.manager.clone() else {
                continue;
            };
            if shard
                .lease
                .as_ref()
                .is_some_and(|lease| lease.bound_to().is_some())
            {
                manager.do_send(KeepLeaseOnShutdown(true));
            } else {
                manager.do_send(HandOverTo(None));
            }
            let stop = manager.send(Shutdown);
            stops.push(async move { (index, stop.await.unwrap_or(Ok(true))) });
        }
        let grace = self.settings.leave_grace;
        let within_grace = async move {
            let mut stopped = Vec::new();
            let mut result = Leaving::default();
            let grace = tokio::time::sleep(grace);
            tokio::pin!(grace);
            loop {
                tokio::select! {
                    biased;
                    next = stops.next() => match next {
                        Some((index, answer)) => {
                            stopped.push(index);
                            result.add(answer);
                        }
                        None => break,
                    },
                    () = &mut grace => break,
                }
            }
            (stops, stopped, result.result)
        };
        Box::pin(actix::fut::wrap_future(within_grace).then(
            move |(stops, stopped, result), act: &mut Self, ctx: &mut Context<Self>| {
                if let Some(result) = result {
                    act.leaving.add(result);
                }
                if stops.is_empty() {
                    return act.retire_member(&turns);
                }
                tracing::info!(group = %act.group, stopped = stopped.len(), stopping = stops.len(), grace = ?act.settings.leave_grace, "sharded workers leaving: some workers still stop after the grace; handing on each shard whose worker stopped");
                act.past_grace(stops, &stopped, turns, ctx)
            },
        ))
    }

    /// The leave past its grace: hands each shard in `stopped` over to its target on its own
    /// write, has every manager still in `stops` hand its shard over itself once its worker
    /// stopped, passes on the shards handed to this node meanwhile and from now on, and once
    /// every worker stopped retires the member lease (handing on, in that write, any bound shard
    /// still held).
    fn past_grace(
        &mut self,
        stops: FuturesUnordered<impl Future<Output = (usize, Result<bool, LeaseError>)> + 'static>,
        stopped: &[usize],
        turns: Vec<usize>,
        ctx: &mut Context<Self>,
    ) -> LocalBoxActorFuture<Self, ()> {
        // The member record says so at once (a renewal now): the others place nothing here any
        // more, and target what this node hands on.
        self.member_lease.mark_leaving();
        let mut gives = Vec::new();
        for &index in stopped {
            let Some(lease) = self.shards[index].lease.clone() else {
                continue;
            };
            if !lease.check_alive() {
                continue;
            }
            let target = self.target_on_leaving(index);
            gives.push((self.shards[index].name.clone(), lease, target));
        }
        let stopping: BTreeSet<usize> = {
            let stopped: BTreeSet<usize> = stopped.iter().copied().collect();
            turns
                .iter()
                .copied()
                .filter(|index| !stopped.contains(index))
                .collect()
        };
        for index in stopping {
            let Some(manager) = self.shards[index].manager.clone() else {
                continue;
            };
            let target = self.held_target(index);
            manager.do_send(HandOverTo(target));
            manager.do_send(KeepLeaseOnShutdown(false));
        }
        self.leaving.passing_on = true;
        self.pass_on_while_leaving(ctx);
        let group = self.group.clone();
        let work = async move {
            let mut result = Leaving::default();
            let handing = futures_util::future::join_all(gives.into_iter().map(
                |(name, lease, target)| {
                    let group = group.clone();
                    async move {
                        let answer = pass_on(&*lease, target).await;
                        tracing::info!(%group, lease = %name, ?answer, "handed on a shard whose worker stopped, as the node leaves");
                        answer
                    }
                },
            ));
            for answer in handing.await {
                result.add(answer);
            }
            for (_, answer) in stops.collect::<Vec<_>>().await {
                result.add(answer);
            }
            result.result
        };
        Box::pin(actix::fut::wrap_future(work).then(
            move |result, act: &mut Self, _ctx: &mut Context<Self>| {
                if let Some(result) = result {
                    act.leaving.add(result);
                }
                act.retire_member(&turns)
            },
        ))
    }

    /// Retires the member lease, handing on in that write every bound shard of `turns` still
    /// held here, then answers every [`Shutdown`].
    fn retire_member(&mut self, turns: &[usize]) -> LocalBoxActorFuture<Self, ()> {
        let handed = self.handed_on_leaving(turns);
        let member = self.member.clone();
        let retired = async move {
            match member {
                Some(member) => {
                    if !handed.is_empty() {
                        let _ = member.send(RetireHanding(handed)).await;
                    }
                    member.send(Shutdown).await.unwrap_or(Ok(true))
                }
                None => Ok(true),
            }
        };
        Box::pin(actix::fut::wrap_future(retired).map(
            |answer, act: &mut Self, _ctx: &mut Context<Self>| {
                act.leaving.add(answer);
                let result = act.leaving.result.take().unwrap_or(Ok(true));
                tracing::info!(group = %act.group, released = ?result, "sharded workers shut down: every worker stopped, then the member lease (and every shard still bound to it) given up");
                for done in act.leaving.done.drain(..) {
                    let _ = done.send(result.clone());
                }
            },
        ))
    }

    /// The bound shards of `turns` this node holds, each with the node it hands it on to as it
    /// leaves (the target of [`target_on_leaving`](Self::target_on_leaving)) and that node's
    /// member tenure as the group watch shows it now: what the member lease's retirement hands
    /// on in its one write ([`Lease::retire_handing`]). A shard with no live target is left out
    /// (freed, and claimed by whoever targets it).
    fn handed_on_leaving(&mut self, turns: &[usize]) -> Vec<crate::HandedShard> {
        let snapshot = self.watch.snapshot();
        let now = Instant::now();
        let mut handed = Vec::new();
        for &index in turns {
            let shard = &self.shards[index];
            let bound = shard
                .lease
                .as_ref()
                .is_some_and(|lease| lease.bound_to().is_some());
            if !bound || !shard.held() {
                continue;
            }
            let name = shard.name.clone();
            let Some(target) = self.target_on_leaving(index) else {
                continue;
            };
            handed.extend(self.handed_to_member(&snapshot, now, &name, target.owner()));
        }
        handed
    }

    /// Whom this node hands shard `index` over to as it leaves: the target the other members
    /// compute once they see its member lease gone (its shards still held in its name), from the
    /// group as the watch shows it *now* (a member that left since the shutdown began is no
    /// target), with the check that it is still a member right before the write.
    fn target_on_leaving(&mut self, index: usize) -> Option<HandoverTarget> {
        let snapshot = self.watch.snapshot();
        let now = Instant::now();
        let members = self.other_members(&snapshot, now, std::time::SystemTime::now());
        let fresh = self
            .leaving
            .placed
            .as_ref()
            .is_some_and(|(placed_for, _)| *placed_for == members);
        if !fresh {
            let holders = self.holders(&snapshot, now);
            // The shards this node hands over are no orphans: each is handed to its target.
            let targets = self.place(&members, &holders, &Default::default());
            self.leaving.placed = Some((members, targets));
        }
        let (members, targets) = self.leaving.placed.as_ref()?;
        let owner = &members[targets[index]?];
        Some(self.handover_target(owner))
    }

    /// The target of shard `index` as this node leaves ([`target_on_leaving`]) if this node
    /// holds it: only a shard it holds is handed over (the manager of one it was still waiting
    /// for just stops competing).
    ///
    /// [`target_on_leaving`]: Self::target_on_leaving
    fn held_target(&mut self, index: usize) -> Option<HandoverTarget> {
        if self.shards[index].held() {
            self.target_on_leaving(index)
        } else {
            None
        }
    }

    /// The shutdown's next turns: at most `shutdown_handovers` shards at a time (128 by
    /// default: each shard's worker stops and its lease is handed over as soon as it did, and
    /// etcd writes the handovers sent together in a few transactions; 1 keeps the others'
    /// workers running until their turn, each shard down for its own handover only). Each
    /// shard's target is the one of the group as it is when its turn comes (a node that left
    /// meanwhile is no target).
    fn take_turns(&mut self, ctx: &mut Context<Self>) {
        while self.leaving.in_flight < self.settings.shutdown_handovers {
            let Some(index) = self.leaving.turns.pop_front() else {
                break;
            };
            let Some(manager) = self.shards[index].manager.clone() else {
                continue;
            };
            let target = self.held_target(index);
            manager.do_send(HandOverTo(target));
            self.leaving.in_flight += 1;
            ctx.spawn(actix::fut::wrap_future(manager.send(Shutdown)).map(
                |answer, act: &mut Self, ctx: &mut Context<Self>| {
                    act.leaving.in_flight -= 1;
                    act.leaving.add(answer.unwrap_or(Ok(true)));
                    act.take_turns(ctx);
                },
            ));
        }
        if self.leaving.in_flight > 0 || !self.leaving.turns.is_empty() {
            return;
        }
        if !self.leaving.swept {
            self.leaving.swept = true;
            if self.pass_on_handed(ctx) {
                return;
            }
        }
        let result = self.leaving.result.take().unwrap_or(Ok(true));
        tracing::info!(group = %self.group, released = ?result, "sharded workers shut down");
        for done in self.leaving.done.drain(..) {
            let _ = done.send(result.clone());
        }
    }

    /// Passes on the shards handed to this node while it was leaving (by a node that had not yet
    /// seen it go): each is taken up and handed to its target, or released, so that none stays
    /// in this node's name with nothing running it (on etcd, for as long as this process's
    /// session lives). Answers whether there was any (the turns go on when they are passed on).
    fn pass_on_handed(&mut self, ctx: &mut Context<Self>) -> bool {
        let jobs: Vec<PassOn<L>> = self.handed_jobs().into_iter().map(|(_, job)| job).collect();
        if jobs.is_empty() {
            return false;
        }
        let group = self.group.clone();
        self.leaving.in_flight += 1;
        let work = async move {
            let mut result = Leaving::default();
            for (name, lease, target) in jobs {
                let answer = claim_and_pass_on(&*lease, target).await;
                tracing::info!(%group, lease = %name, ?answer, "passed on a shard handed to this node as it left");
                result.add(answer);
            }
            result.result.unwrap_or(Ok(true))
        };
        ctx.spawn(actix::fut::wrap_future(work).map(
            |answer, act: &mut Self, ctx: &mut Context<Self>| {
                act.leaving.in_flight -= 1;
                act.leaving.add(answer);
                act.take_turns(ctx);
            },
        ));
        true
    }

    /// The shards handed to this node (listed to its member tenure, or handed over to it) that
    /// it does not hold: each with its lease (built, and bound as
    /// [`start_manager`](Self::start_manager) binds, where it has none) and its target.
    fn handed_jobs(&mut self) -> Vec<(usize, PassOn<L>)> {
        self.handed_jobs_among(None)
    }

    /// [`handed_jobs`](Self::handed_jobs) among the shards `among` (every shard: `None`).
    fn handed_jobs_among(&mut self, among: Option<Vec<usize>>) -> Vec<(usize, PassOn<L>)> {
        let snapshot = self.watch.snapshot();
        let now = Instant::now();
        let handing = self.members_handing_on(&snapshot);
        let among = among.unwrap_or_else(|| (0..self.shards.len()).collect());
        let handed: Vec<usize> = among
            .into_iter()
            .filter(|&index| self.handed_here_among(index, &snapshot, now, &handing))
            .collect();
        let mut jobs = Vec::with_capacity(handed.len());
        for index in handed {
            let name = self.shards[index].name.clone();
            let lease = match &self.shards[index].lease {
                Some(lease) => Arc::clone(lease),
                None => match self.build_lease(index) {
                    Ok(lease) => Arc::new(lease),
                    Err(error) => {
                        tracing::warn!(group = %self.group, lease = %name, error = &error as &dyn std::error::Error, "cannot build the lease of a shard handed to this node as it left: it stays in this node's name until it expires");
                        continue;
                    }
                },
            };
            let target = self.target_on_leaving(index);
            jobs.push((index, (name, lease, target)));
        }
        jobs
    }

    /// A leave past a bound leave's grace, or one taking turns: passes on each shard handed to
    /// this node that is not being passed on already (claimed, then handed to its target), each
    /// on its own. Called then and at every change of the group while the leave goes on, so
    /// that a shard handed or listed here by a node that had not yet seen this one leave (a
    /// dead member's list, written a moment before the mark reached it) waits for no worker.
    ///
    /// It looks at the shards whose records changed since its last look (every shard when the
    /// snapshot cannot tell, or a member record changed: a member's list), not at every shard on
    /// every call: a node leaving with 256 of 4,096 shards is called at every end of its own
    /// tenures, and a look at every shard each time cost it most of a second.
    pub(super) fn pass_on_while_leaving(&mut self, ctx: &mut Context<Self>) {
        if !self.leaving.passing_on {
            return;
        }
        let snapshot = self.watch.snapshot();
        let version = snapshot.version();
        if self.leaving.looked_at == Some(version) {
            return;
        }
        let among = self.leaving.looked_at.and_then(|since| {
            let mut among = Vec::new();
            for name in snapshot.changes_since(since)? {
                if name.starts_with(&self.member_prefix) {
                    return None;
                }
                among.extend(self.shard_index(name));
            }
            Some(among)
        });
        self.leaving.looked_at = Some(version);
        for (index, (name, lease, target)) in self.handed_jobs_among(among) {
            if !self.leaving.passing.insert(index) {
                continue;
            }
            if self.leaving.in_turns {
                self.leaving.in_flight += 1;
            }
            let group = self.group.clone();
            let work = async move {
                let answer = claim_and_pass_on(&*lease, target).await;
                tracing::info!(%group, lease = %name, ?answer, "passed on a shard handed to this node as it left");
                answer
            };
            ctx.spawn(actix::fut::wrap_future(work).map(
                move |answer, act: &mut Self, ctx: &mut Context<Self>| {
                    act.leaving.passing.remove(&index);
                    if !matches!(answer, Ok(true)) {
                        // Not passed on (an error): the next look is at every shard again.
                        act.leaving.looked_at = None;
                    }
                    act.leaving.add(answer);
                    if act.leaving.in_turns {
                        act.leaving.in_flight -= 1;
                        act.take_turns(ctx);
                    }
                },
            ));
        }
    }
}

/// A shard to pass on as the node leaves: its lease name, its lease, and its target.
type PassOn<L> = (String, Arc<L>, Option<HandoverTarget>);

/// Claims `lease` (handed to this node) and passes it on ([`pass_on`]); nothing to do when it is
/// not (or no longer) in this node's name.
async fn claim_and_pass_on(
    lease: &impl Lease,
    target: Option<HandoverTarget>,
) -> Result<bool, LeaseError> {
    match lease.acquire().await {
        Ok(true) => pass_on(lease, target).await,
        Ok(false) => Ok(true),
        Err(error) => Err(error),
    }
}

/// Gives `lease` (held) up: handed over to `target` while it counts, else released.
async fn pass_on(lease: &impl Lease, target: Option<HandoverTarget>) -> Result<bool, LeaseError> {
    match target.filter(HandoverTarget::counts) {
        Some(target) => lease.hand_over(target.owner()).await,
        None => lease.release().await,
    }
}
