//! The tenure of a lease as one observable value: [`TenureWatch`], [`TenureGuard`], [`Tenure`].
//!
//! A *tenure* runs from a successful `acquire` to its end. It has a [`FencingToken`] and a local
//! *deadline* on this process's monotonic clock, which every successful renewal moves forward. A
//! tenure ends in one of these ways, and every one of them is visible to every reader at once:
//!
//! * its deadline passes without a renewal (a partition, a pause, a backend that is down): readers
//!   compare the deadline with the clock themselves, so they see the end *at the deadline*, even if
//!   the renewal task has not run yet (a busy or paused thread);
//! * the lease is lost (the backend shows another holder or a deletion): `on_lost` fires once, and
//!   the tenure ends with [`TenureEnd::Lost`];
//! * the lease is released, through *any* handle of it (a [`SharedLease`](crate::SharedLease)
//!   clone, an `Arc`, the [`LeaseActor`](crate::LeaseActor) that owns it): [`TenureEnd::Released`]
//!   (no `on_lost`: a release is not a loss);
//! * the lease instance is dropped while the tenure is alive: [`TenureEnd::Dropped`] (one
//!   dropped past its deadline had already lost it: `on_lost` fires, as above).
//!
//! The value is published the [`tokio::sync::watch`] way: one value, many readers, every change
//! observed. [`Lease::check_alive`](crate::Lease::check_alive),
//! [`Lease::fencing_token`](crate::Lease::fencing_token) and the actors of this crate all read it, so
//! they can never disagree.
//!
//! # Guards
//!
//! [`TenureWatch::guard`] binds a cheap, cloneable [`TenureGuard`] to the tenure alive right now.
//! Hand it to the code that acts under the tenure (the cluster singleton gets one in its
//! [`SingletonInfo`](crate::SingletonInfo)): [`TenureGuard::check_alive`] before every step,
//! [`TenureGuard::token`] with every write, and [`TenureGuard::ended`] to be woken at the deadline
//! or the end, whichever comes first — the way client-go's `OnStartedLeading(ctx)` hands the leader
//! a context that is cancelled on loss.
//!
//! # The races to keep in mind
//!
//! * `check_alive() == true` means alive *at the instant of the call*; a step that takes time must
//!   check again, or better, pass the token to the system it writes to, which rejects tokens lower
//!   than the highest it has seen. The guarantee is exactly: `check_alive()` turns `false` before
//!   any other owner can acquire the lease; what the holder does after its last check is only
//!   stopped by fencing.
//! * [`TenureGuard::ended`] resolves at the deadline on a timer: on a busy thread it runs when the
//!   thread gets to it. `check_alive` reads the clock and is exact.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use crate::binding::Anchor;
use crate::metrics::{self, LeaseLabel};
use crate::vocab::{FencingToken, LostReason};

/// One tenure as it stands: its fencing token and its current local deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenure {
    token: FencingToken,
    deadline: Instant,
    generation: u64,
}

impl Tenure {
    /// The fencing token of this tenure.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The local deadline as of this snapshot: the instant `check_alive` turns `false` unless a
    /// renewal succeeds first.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the deadline of this snapshot is still ahead.
    pub fn is_alive(&self) -> bool {
        Instant::now() < self.deadline
    }
}

/// How a tenure ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TenureEnd {
    /// The local deadline passed without a successful renewal (seen by the reader's own clock,
    /// before the renewal task reported the loss).
    DeadlinePassed,
    /// The lease was lost; `on_lost` fired with this reason.
    Lost(LostReason),
    /// The lease was released through one of its handles.
    Released,
    /// The lease instance was dropped without a release (its record expires after the TTL).
    Dropped,
}

impl fmt::Display for TenureEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenureEnd::DeadlinePassed => f.write_str("the local deadline passed"),
            TenureEnd::Lost(reason) => write!(f, "lost: {reason}"),
            TenureEnd::Released => f.write_str("released"),
            TenureEnd::Dropped => f.write_str("the lease was dropped"),
        }
    }
}

/// The published value: the tenure alive (as far as the publisher knows) and the cell its end
/// will be written to, before the value changes.
#[derive(Debug, Clone, Default)]
pub(crate) struct State {
    current: Option<Current>,
}

#[derive(Debug, Clone)]
struct Current {
    tenure: Tenure,
    end: Arc<OnceLock<TenureEnd>>,
    /// `true` while the task that renews this tenure (and ends it at its deadline) runs.
    renewing: Arc<AtomicBool>,
}

/// Held by the renewal task of a tenure; dropping it (the task returned, panicked or was
/// aborted) tells [`TenureWatch::stall`] that nothing renews or ends the tenure any more.
#[derive(Debug)]
pub(crate) struct RenewalTask(Arc<AtomicBool>);

impl Drop for RenewalTask {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Why a published tenure is not being looked after (see [`TenureWatch::stall`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stall {
    /// The renewal task ended while the tenure is still published.
    TaskEnded,
    /// The deadline passed this long ago (beyond the tolerance), and the tenure is still
    /// published: the renewal task did not run to end it.
    Overdue(Duration),
}

impl State {
    fn live(&self) -> Option<Tenure> {
        self.current
            .as_ref()
            .map(|c| c.tenure)
            .filter(Tenure::is_alive)
    }
}

/// A receiver of a lease's tenure: every start and end of a tenure, and every renewal, is
/// observed. Clones are independent receivers of the same lease.
///
/// Get one from [`Lease::tenure`](crate::Lease::tenure) (or the
/// [`GetTenure`](crate::GetTenure) message of a [`LeaseActor`](crate::LeaseActor)).
#[derive(Clone)]
pub struct TenureWatch {
    rx: watch::Receiver<State>,
}

impl fmt::Debug for TenureWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenureWatch")
            .field("current", &self.current())
            .finish()
    }
}

impl TenureWatch {
    /// The tenure alive right now: `None` when not held or past the deadline. Never blocks.
    pub fn current(&self) -> Option<Tenure> {
        self.rx.borrow().live()
    }

    /// The tenure alive at `now` (an instant this process read just before), for a reader that
    /// looks at many tenures at one instant: one clock read for all of them.
    pub(crate) fn current_at(&self, now: Instant) -> Option<Tenure> {
        let state = self.rx.borrow();
        state
            .current
            .as_ref()
            .map(|c| c.tenure)
            .filter(|t| now < t.deadline)
    }

    /// Whether a tenure is alive right now (what `Lease::check_alive` answers).
    pub fn check_alive(&self) -> bool {
        self.current().is_some()
    }

    /// A guard bound to the tenure alive right now, or `None` when there is none.
    pub fn guard(&self) -> Option<TenureGuard> {
        let state = self.rx.borrow();
        let current = state.current.as_ref().filter(|c| c.tenure.is_alive())?;
        Some(TenureGuard {
            tenure: current.tenure,
            end: Arc::clone(&current.end),
            rx: self.rx.clone(),
        })
    }

    /// Whether a tenure is published (this process still acts as its holder) while nothing looks
    /// after it: its renewal task ended, or its deadline passed more than `tolerance` ago without
    /// the task ending it. `None` when nothing is published or the tenure is looked after.
    pub(crate) fn stall(&self, tolerance: Duration) -> Option<Stall> {
        let state = self.rx.borrow();
        let current = state.current.as_ref()?;
        if !current.renewing.load(Ordering::Acquire) {
            return Some(Stall::TaskEnded);
        }
        let late = Instant::now().checked_duration_since(current.tenure.deadline)?;
        (late > tolerance).then_some(Stall::Overdue(late))
    }

    /// Waits until the tenure alive at the call ends, or a new one starts: resolves on a release,
    /// a loss, a new tenure, and *at the deadline* of the current one. Renewals alone do not wake
    /// it. Returns the tenure alive afterwards (`None` after an end).
    ///
    /// Once the lease is dropped (and its last tenure has ended), nothing changes any more, and
    /// it stays pending; [`stream`](Self::stream) ends instead.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn changed(&mut self) -> Option<Tenure> {
        let before = self.current().map(|t| t.generation);
        match self.next_change(before).await {
            Some(after) => after,
            None => std::future::pending().await,
        }
    }

    /// Waits until the generation of the live tenure differs from `before`, and returns the
    /// tenure alive then. `None` once the publisher is gone (the lease was dropped) and nothing
    /// is alive: nothing will change any more.
    async fn next_change(&mut self, before: Option<u64>) -> Option<Option<Tenure>> {
        let mut publisher_gone = false;
        loop {
            let (now_gen, deadline) = {
                let state = self.rx.borrow_and_update();
                let live = state.live();
                (live.map(|t| t.generation), live.map(|t| t.deadline))
            };
            if now_gen != before {
                return Some(self.current());
            }
            match (deadline, publisher_gone) {
                // Gone and nothing alive: the source has ended.
                (None, true) => return None,
                // Gone with a tenure still published (nothing renews it): it ends at its
                // deadline, by this reader's clock.
                (Some(deadline), true) => {
                    sleep_until_precise(deadline).await;
                    continue;
                }
                (_, false) => {}
            }
            let sleep = async {
                match deadline {
                    Some(deadline) => sleep_until_precise(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = sleep => {}
                changed = self.rx.changed() => publisher_gone = changed.is_err(),
            }
        }
    }

    /// The tenure alive now, then every change as [`changed`](Self::changed) sees it, as a
    /// stream (for `ctx.add_stream` in an actor, whose `finished` then runs when it ends). It
    /// ends once the lease is dropped: after its last item (`None`, the tenure ended, if one was
    /// alive), so a subscriber never waits on a lease that no longer exists.
    pub fn stream(&self) -> impl Stream<Item = Option<Tenure>> + Send + Unpin + 'static {
        // The state is the generation last yielded (`None` before the first item), so that a
        // change between two polls is never missed.
        Box::pin(futures_util::stream::unfold(
            (self.clone(), None::<Option<u64>>),
            |(mut watch, last)| async move {
                let next = match last {
                    None => watch.current(),
                    Some(before) => watch.next_change(before).await?,
                };
                Some((next, (watch, Some(next.map(|t| t.generation)))))
            },
        ))
    }
}

/// A guard bound to one tenure: cheap to clone and to check, `Send + Sync`.
///
/// * [`check_alive`](Self::check_alive): `true` while this very tenure is held and its deadline has
///   not passed (a later tenure of the same lease does not count);
/// * [`token`](Self::token): its fencing token, for every write;
/// * [`ended`](Self::ended): a future that resolves at the deadline or at the end, whichever
///   comes first.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use actix_coordination::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let lease = InMemoryLease::new(LeaseSettings::new("reports", "node-a")?, &store);
/// assert!(lease.acquire().await?);
/// let guard = lease.tenure().guard().expect("held");
///
/// // Gate every step on the guard and fence every write with its token.
/// let mut written = Vec::new();
/// for batch in 0..3 {
///     if !guard.check_alive() {
///         break;
///     }
///     written.push((batch, guard.token()));
/// }
/// assert_eq!(written.len(), 3);
///
/// // Every end of the tenure reaches the guard: here a release.
/// lease.release().await?;
/// assert!(!guard.check_alive());
/// assert_eq!(guard.ended().await, TenureEnd::Released);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TenureGuard {
    tenure: Tenure,
    end: Arc<OnceLock<TenureEnd>>,
    rx: watch::Receiver<State>,
}

impl fmt::Debug for TenureGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenureGuard")
            .field("token", &self.tenure.token)
            .field("alive", &self.check_alive())
            .finish()
    }
}

/// Two guards are equal when they guard the same tenure.
impl PartialEq for TenureGuard {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.end, &other.end)
    }
}

impl Eq for TenureGuard {}

impl TenureGuard {
    /// The fencing token of the guarded tenure.
    pub fn token(&self) -> FencingToken {
        self.tenure.token
    }

    /// The current deadline of the guarded tenure (renewals move it), or `None` once it ended.
    pub fn deadline(&self) -> Option<Instant> {
        self.mine().map(|t| t.deadline)
    }

    /// Whether the guarded tenure is held and before its deadline, right now. Never blocks.
    pub fn check_alive(&self) -> bool {
        self.mine().is_some_and(|t| t.is_alive())
    }

    /// How the tenure ended, once it did (`None` while alive).
    pub fn end(&self) -> Option<TenureEnd> {
        match self.mine() {
            Some(t) if t.is_alive() => None,
            Some(_) => Some(TenureEnd::DeadlinePassed),
            None => Some(self.recorded_end()),
        }
    }

    /// Resolves when the guarded tenure ends: at its deadline (by this process's clock, not when
    /// the renewal task gets to report the loss), or at a loss, a release through any handle, or
    /// the drop of the lease, whichever comes first. Resolves at once if it already ended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub fn ended(&self) -> impl Future<Output = TenureEnd> + Send + 'static {
        let guard = self.clone();
        async move {
            let mut rx = guard.rx.clone();
            loop {
                let deadline = {
                    let state = rx.borrow_and_update();
                    match mine(&state, guard.tenure.generation) {
                        Some(t) if t.is_alive() => t.deadline,
                        Some(_) => return TenureEnd::DeadlinePassed,
                        None => return guard.recorded_end(),
                    }
                };
                tokio::select! {
                    biased;
                    () = sleep_until_precise(deadline) => {}
                    changed = rx.changed() => {
                        if changed.is_err() {
                            // The publisher is gone without ending the tenure: nothing renews it.
                            sleep_until(deadline).await;
                            return TenureEnd::DeadlinePassed;
                        }
                    }
                }
            }
        }
    }

    fn mine(&self) -> Option<Tenure> {
        mine(&self.rx.borrow(), self.tenure.generation)
    }

    fn recorded_end(&self) -> TenureEnd {
        // The end is written before the value changes, so it is there once the tenure is gone.
        self.end.get().cloned().unwrap_or(TenureEnd::DeadlinePassed)
    }
}

/// How much earlier than a deadline [`sleep_until_precise`] wakes from tokio's timer.
const EARLY: Duration = Duration::from_millis(2);
/// The longest [`sleep_until_precise`] yields (in real time) before it falls back to the timer.
const YIELD_BOUND: Duration = Duration::from_millis(4);

/// Sleeps until `deadline`, resolving within a fraction of a millisecond after it on a real
/// clock. Tokio's timer counts whole milliseconds and rounds deadlines up, so on a runtime that
/// parks it fires up to about 2 ms late; this wakes `EARLY` before the deadline on the timer, then
/// yields until the deadline has passed (at the end of a tenure only: a renewal moves the
/// deadline long before). Under a paused test clock, where time moves only while every task is
/// idle, yielding would never see the deadline: after `YIELD_BOUND` of real time it falls back to
/// the timer.
pub(crate) async fn sleep_until_precise(deadline: Instant) {
    if let Some(early) = deadline.checked_sub(EARLY) {
        sleep_until(early).await;
    }
    let yielding_since = std::time::Instant::now();
    while Instant::now() < deadline {
        if yielding_since.elapsed() > YIELD_BOUND {
            return sleep_until(deadline).await;
        }
        tokio::task::yield_now().await;
    }
}

fn mine(state: &State, generation: u64) -> Option<Tenure> {
    state
        .current
        .as_ref()
        .map(|c| c.tenure)
        .filter(|t| t.generation == generation)
}

/// The publishing side, owned by the lease.
pub(crate) struct TenureCell {
    tx: watch::Sender<State>,
    watch: TenureWatch,
    generations: std::sync::atomic::AtomicU64,
    label: LeaseLabel,
    /// The tenures bound to this cell's tenures, when it anchors any (see the `binding` module).
    anchor: OnceLock<Arc<Anchor>>,
}

impl fmt::Debug for TenureCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.watch.fmt(f)
    }
}

impl Default for TenureCell {
    fn default() -> Self {
        Self::new(LeaseLabel::new(""))
    }
}

impl TenureCell {
    /// A cell whose tenures count in the `lease_held` gauge of `label`.
    pub(crate) fn new(label: LeaseLabel) -> Self {
        let (tx, rx) = watch::channel(State::default());
        Self {
            tx,
            watch: TenureWatch { rx },
            generations: Default::default(),
            label,
            anchor: OnceLock::new(),
        }
    }
}

impl TenureCell {
    pub(crate) fn watch(&self) -> &TenureWatch {
        &self.watch
    }

    /// Makes this cell an anchor of bound tenures (before its first tenure): every start,
    /// renewal and end of a tenure of this cell reaches them in the same step.
    pub(crate) fn set_anchor(&self, anchor: Arc<Anchor>) {
        let _ = self.anchor.set(anchor);
    }

    /// The anchor of the tenures bound to this cell's tenures, if it is one.
    pub(crate) fn anchor(&self) -> Option<&Arc<Anchor>> {
        self.anchor.get()
    }

    /// A receiver of every change of the published value (renewals included).
    pub(crate) fn receiver(&self) -> watch::Receiver<State> {
        self.tx.subscribe()
    }

    /// Starts a tenure and returns its generation, and the handle its renewal task holds. A
    /// tenure still published is ended first (as expired), so readers never see two.
    pub(crate) fn start(&self, token: FencingToken, deadline: Instant) -> (u64, RenewalTask) {
        let generation = 1 + self
            .generations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let renewing = Arc::new(AtomicBool::new(true));
        let mut replaced = false;
        self.tx.send_modify(|state| {
            if let Some(old) = state.current.take() {
                let _ = old.end.set(TenureEnd::DeadlinePassed);
                replaced = true;
            }
            state.current = Some(Current {
                tenure: Tenure {
                    token,
                    deadline,
                    generation,
                },
                end: Arc::new(OnceLock::new()),
                renewing: Arc::clone(&renewing),
            });
        });
        if !replaced {
            metrics::held(&self.label, 1.0);
        }
        if let Some(anchor) = self.anchor.get() {
            anchor.started(generation, deadline);
        }
        (generation, RenewalTask(renewing))
    }

    /// Moves the deadline of tenure `generation` to `deadline` (never backwards), if it is still
    /// the current tenure and its deadline has not passed. Returns whether it is still alive.
    pub(crate) fn extend(&self, generation: u64, deadline: Instant) -> bool {
        let mut alive = false;
        self.tx.send_if_modified(|state| match &mut state.current {
            Some(c) if c.tenure.generation == generation && c.tenure.is_alive() => {
                alive = true;
                if deadline > c.tenure.deadline {
                    c.tenure.deadline = deadline;
                    true
                } else {
                    false
                }
            }
            _ => false,
        });
        if alive {
            if let (Some(anchor), Some(tenure)) = (self.anchor.get(), self.published(generation)) {
                anchor.extended(generation, tenure.deadline);
            }
        }
        alive
    }

    /// Ends tenure `generation` with `end`; returns it if it was the current one (`None`: it had
    /// ended already).
    pub(crate) fn end(&self, generation: u64, end: TenureEnd) -> Option<Tenure> {
        self.end_with(generation, |_| end).map(|(tenure, _)| tenure)
    }

    /// Ends tenure `generation` by the owner's own act (`end`: released, dropped) if it is still
    /// alive, or as lost with `lost` if its deadline has passed; the choice is made inside the
    /// one update that ends it, so a tenure whose deadline passes meanwhile cannot end by choice.
    /// Returns the tenure and whether it ended as lost (`None`: it had ended already).
    pub(crate) fn end_by_choice(
        &self,
        generation: u64,
        end: TenureEnd,
        lost: LostReason,
    ) -> Option<(Tenure, bool)> {
        self.end_with(generation, |tenure| {
            if tenure.is_alive() {
                end
            } else {
                TenureEnd::Lost(lost)
            }
        })
        .map(|(tenure, end)| (tenure, matches!(end, TenureEnd::Lost(_))))
    }

    /// Ends tenure `generation`, if it is the current one, with the end `decide` gives for it,
    /// decided inside the update; returns the tenure and its end.
    fn end_with(
        &self,
        generation: u64,
        decide: impl FnOnce(&Tenure) -> TenureEnd,
    ) -> Option<(Tenure, TenureEnd)> {
        let mut decide = Some(decide);
        let mut ended = None;
        self.tx.send_if_modified(|state| match &state.current {
            Some(c) if c.tenure.generation == generation => {
                let end = (decide.take().expect("decided once"))(&c.tenure);
                let _ = c.end.set(end.clone());
                ended = Some((c.tenure, end));
                state.current = None;
                true
            }
            _ => false,
        });
        if ended.is_some() {
            metrics::held(&self.label, -1.0);
            // Every tenure bound to this one ends before the caller goes on (a release is sent
            // only after this returns).
            // A member that expired takes its bound tenures with it as expired (with its last
            // renewal error); any other end unbinds them.
            if let (Some(anchor), Some((_, end))) = (self.anchor.get(), &ended) {
                let reason = match end {
                    TenureEnd::DeadlinePassed => anchor.expired(),
                    TenureEnd::Lost(reason @ LostReason::Expired { .. }) => reason.clone(),
                    _ => anchor.unbound(),
                };
                anchor.ended(generation, reason);
            }
        }
        ended
    }

    /// Tenure `generation` as published, even past its deadline (`None` once it ended).
    pub(crate) fn published(&self, generation: u64) -> Option<Tenure> {
        mine(&self.watch.rx.borrow(), generation)
    }

    /// The generation of the published tenure, if any, alive or past its deadline.
    pub(crate) fn published_generation(&self) -> Option<u64> {
        self.watch
            .rx
            .borrow()
            .current
            .as_ref()
            .map(|c| c.tenure.generation)
    }
}

/// The publishing side of a [`TenureWatch`], for a type that implements
/// [`Lease`](crate::Lease) itself instead of building on [`ManagedLease`](crate::ManagedLease)
/// (which publishes its tenures for you).
///
/// A `Lease` implementation owns one publisher, returns [`TenurePublisher::watch`] from
/// [`Lease::tenure`](crate::Lease::tenure), and calls [`start`](TenurePublisher::start) when an
/// `acquire` succeeds, [`extend`](TenurePublisher::extend) after every successful renewal and
/// [`end`](TenurePublisher::end) when the tenure ends. The readers (`check_alive`, guards, the
/// actors, [`HealthCheck`](crate::HealthCheck)) then behave exactly as with the crate's own
/// leases. The rules the implementation keeps:
///
/// * the deadline is on this process's monotonic clock, counted from the *start* of the backend
///   call that claimed or renewed the lease (never from its answer), minus a clock drift margin;
/// * the [`PublishedTenure`] handle is held by whatever renews the tenure (its renewal task):
///   dropping it tells [`HealthCheck::liveness`](crate::HealthCheck::liveness) that nothing looks
///   after the tenure any more;
/// * an involuntary end ([`TenureEnd::Lost`]) is reported by the implementation to its `on_lost`
///   handlers (a [`LostHandlers`](crate::LostHandlers) does that), once; so is a release or a drop
///   that [`end`](TenurePublisher::end) turned into a loss because the deadline had passed.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use actix_coordination::{FencingToken, TenureEnd, TenurePublisher};
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let publisher = TenurePublisher::new("orders-leader");
/// let watch = publisher.watch().clone();
/// assert!(!watch.check_alive());
///
/// // `acquire` succeeded: the claim was sent at `sent`.
/// let sent = Instant::now();
/// let tenure = publisher.start(FencingToken::new(7), sent + Duration::from_secs(10));
/// assert!(watch.check_alive());
/// let guard = watch.guard().expect("alive");
/// assert_eq!(guard.token(), FencingToken::new(7));
///
/// // A renewal sent now succeeded.
/// assert!(publisher.extend(&tenure, Instant::now() + Duration::from_secs(10)));
///
/// // `release`: the tenure ends by choice (it was alive, so no loss to report).
/// assert_eq!(publisher.end(&tenure, TenureEnd::Released), Some(TenureEnd::Released));
/// assert!(!guard.check_alive());
/// assert_eq!(guard.ended().await, TenureEnd::Released);
/// # }
/// ```
pub struct TenurePublisher {
    cell: TenureCell,
}

/// A tenure started by [`TenurePublisher::start`]; held by whatever renews it (see
/// [`TenurePublisher`]).
#[derive(Debug)]
pub struct PublishedTenure {
    generation: u64,
    _task: RenewalTask,
}

impl fmt::Debug for TenurePublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenurePublisher")
            .field("watch", self.cell.watch())
            .finish()
    }
}

impl TenurePublisher {
    /// A publisher for the lease `name` (the `lease` label of its `lease_held` gauge, with the
    /// `metrics` feature).
    pub fn new(name: &str) -> Self {
        let label = LeaseLabel::new(name);
        metrics::publisher_registered(&label);
        Self {
            cell: TenureCell::new(label),
        }
    }

    /// The receiving side: what [`Lease::tenure`](crate::Lease::tenure) returns.
    pub fn watch(&self) -> &TenureWatch {
        self.cell.watch()
    }

    /// Publishes a new tenure with `token`, alive until `deadline`. A tenure still published is
    /// ended first, as [`TenureEnd::DeadlinePassed`], so that readers never see two.
    pub fn start(&self, token: FencingToken, deadline: Instant) -> PublishedTenure {
        let (generation, task) = self.cell.start(token, deadline);
        PublishedTenure {
            generation,
            _task: task,
        }
    }

    /// Moves the deadline of `tenure` to `deadline` (never backwards), if it is still the
    /// current tenure and its deadline has not passed. Returns whether it is still alive: `false`
    /// means it ended (or its deadline passed) and the renewal came too late for it.
    pub fn extend(&self, tenure: &PublishedTenure, deadline: Instant) -> bool {
        self.cell.extend(tenure.generation, deadline)
    }

    /// Ends `tenure` with `end`, and returns the end every reader sees, or `None` if it had
    /// ended already. A tenure ended by choice ([`TenureEnd::Released`], [`TenureEnd::Dropped`])
    /// after its deadline passed ends as lost instead
    /// (`TenureEnd::Lost(LostReason::Expired { .. })`), decided in the same update: report that
    /// loss to the `on_lost` handlers.
    pub fn end(&self, tenure: &PublishedTenure, end: TenureEnd) -> Option<TenureEnd> {
        match end {
            TenureEnd::Released | TenureEnd::Dropped => {
                let lost = LostReason::Expired { last_error: None };
                let (_, dead) =
                    self.cell
                        .end_by_choice(tenure.generation, end.clone(), lost.clone())?;
                Some(if dead { TenureEnd::Lost(lost) } else { end })
            }
            end => self.cell.end(tenure.generation, end.clone()).map(|_| end),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use futures_util::StreamExt;

    const TOKEN: FencingToken = FencingToken::new(7);

    #[tokio::test(start_paused = true)]
    async fn a_published_tenure_nobody_looks_after_is_a_stall() {
        let cell = TenureCell::default();
        let tolerance = Duration::from_secs(1);
        assert_eq!(cell.watch().stall(tolerance), None, "nothing published");
        let deadline = Instant::now() + Duration::from_secs(3);
        let (generation, task) = cell.start(TOKEN, deadline);
        assert_eq!(cell.watch().stall(tolerance), None, "looked after");
        // Past the deadline, but within the tolerance: the task may just not have run yet.
        tokio::time::sleep_until(deadline + tolerance).await;
        assert_eq!(cell.watch().stall(tolerance), None);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            cell.watch().stall(tolerance),
            Some(Stall::Overdue(tolerance + Duration::from_millis(500)))
        );
        // A task that ended (returned, panicked, was aborted) while its tenure is published.
        let (generation2, task2) = cell.start(TOKEN, Instant::now() + Duration::from_secs(3));
        assert_ne!(generation, generation2);
        drop(task);
        assert_eq!(
            cell.watch().stall(tolerance),
            None,
            "the old task is not this tenure's"
        );
        drop(task2);
        assert_eq!(cell.watch().stall(tolerance), Some(Stall::TaskEnded));
        // An ended tenure is nobody's concern.
        assert!(cell.end(generation2, TenureEnd::Released).is_some());
        assert_eq!(cell.watch().stall(tolerance), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_guard_sees_the_deadline_by_its_own_clock() {
        let cell = TenureCell::default();
        let deadline = Instant::now() + Duration::from_secs(3);
        let (generation, _task) = cell.start(TOKEN, deadline);
        let guard = cell.watch().guard().expect("alive");
        assert_eq!(guard.token(), TOKEN);
        assert!(guard.check_alive());
        let ended = tokio::spawn(guard.ended());
        tokio::time::sleep_until(deadline).await;
        // Nobody ended the tenure: the readers see the deadline themselves.
        assert!(!guard.check_alive());
        assert!(!cell.watch().check_alive());
        assert_eq!(cell.watch().current(), None);
        assert_eq!(guard.end(), Some(TenureEnd::DeadlinePassed));
        assert_eq!(ended.await.unwrap(), TenureEnd::DeadlinePassed);
        assert_eq!(Instant::now(), deadline, "resolved at the deadline");
        assert_eq!(
            cell.published(generation).map(|t| t.deadline()),
            Some(deadline)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_move_the_deadline_and_an_end_wakes_at_once() {
        let cell = TenureCell::default();
        let start = Instant::now();
        let (generation, _task) = cell.start(TOKEN, start + Duration::from_secs(3));
        let guard = cell.watch().guard().unwrap();
        let ended = tokio::spawn(guard.ended());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(cell.extend(generation, start + Duration::from_secs(5)));
        assert!(
            cell.extend(generation, start + Duration::from_secs(4)),
            "alive"
        );
        assert_eq!(
            guard.deadline(),
            Some(start + Duration::from_secs(5)),
            "never back"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(guard.check_alive(), "renewed");
        assert!(cell.end(generation, TenureEnd::Released).is_some());
        assert!(cell.end(generation, TenureEnd::Released).is_none(), "once");
        assert_eq!(ended.await.unwrap(), TenureEnd::Released);
        assert_eq!(start.elapsed(), Duration::from_secs(4));
        assert!(!guard.check_alive());
        assert_eq!(guard.deadline(), None);
        assert_eq!(guard.end(), Some(TenureEnd::Released));
        // A later tenure does not revive the old guard.
        let _task = cell.start(
            FencingToken::new(8),
            Instant::now() + Duration::from_secs(3),
        );
        assert!(!guard.check_alive());
        assert!(cell.watch().check_alive());
        assert_ne!(cell.watch().guard().unwrap(), guard);
    }

    #[tokio::test(start_paused = true)]
    async fn changed_wakes_on_every_end_but_not_on_renewals() {
        let cell = TenureCell::default();
        let watch = cell.watch().clone();
        let mut stream = cell.watch().stream();
        assert_eq!(stream.next().await, Some(None));
        let start_waiter = tokio::spawn({
            let mut watch = watch.clone();
            async move { watch.changed().await }
        });
        tokio::task::yield_now().await;
        let start = Instant::now();
        let (generation, _task) = cell.start(TOKEN, start + Duration::from_secs(3));
        let started = start_waiter.await.unwrap().expect("a tenure started");
        assert_eq!(started.token(), TOKEN);
        assert_eq!(stream.next().await, Some(Some(started)));
        let waiter = tokio::spawn({
            let mut watch = watch.clone();
            async move { (watch.changed().await, Instant::now()) }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        cell.extend(generation, start + Duration::from_secs(4));
        let (after, at) = waiter.await.unwrap();
        assert_eq!(after, None);
        assert_eq!(
            at,
            start + Duration::from_secs(4),
            "at the renewed deadline"
        );
        assert_eq!(stream.next().await, Some(None));
    }
}
