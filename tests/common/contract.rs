//! The lease contract suite: one set of behavioural tests that every backend runs unchanged.
//!
//! A backend takes part by implementing [`Fixture`]: how to build a lease, and how to cut one owner
//! off the backend (calls fail: a partition) or freeze it (calls never answer: a paused process).
//! The same assertions then hold under Tokio's paused clock (in-memory) and in real time against a
//! real server. Against a real server the suite asserts only what load cannot change: the order of
//! events (no contender holds before the holder's deadline and `on_lost`), counts, and deadlines
//! for waiting on an event; how *late* an event may come is asserted under the paused clock only,
//! where timings are exact.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_coordination::{FencingToken, Lease, LeaseError, LeaseLost, LeaseSettings, LostReason};
use futures_util::future::join_all;
use tokio::sync::mpsc;
use tokio::time::{sleep, sleep_until, timeout, Instant};

/// What a backend provides to run the contract suite.
pub trait Fixture {
    /// The lease type of the backend.
    type Lease: Lease;

    /// Settings for lease `name` held by `owner`, with timing suited to the backend (short TTLs for
    /// real servers).
    fn settings(&self, name: &str, owner: &str) -> LeaseSettings;

    /// A lease with `settings`; owners created by one fixture share one backend.
    fn lease(&self, settings: LeaseSettings) -> impl Future<Output = Self::Lease>;

    /// Cuts `owner` off the backend: its calls fail (a partition, a backend that is down for it).
    fn partition(&self, owner: &str) -> impl Future<Output = ()>;

    /// Freezes `owner`'s traffic: its calls never answer (a paused process, a blackhole).
    fn pause(&self, owner: &str) -> impl Future<Output = ()>;

    /// Undoes `partition`, `pause` and `slow_answers` for `owner`.
    fn heal(&self, owner: &str) -> impl Future<Output = ()>;

    /// Delays every answer to `owner` by `delay`; its requests reach the backend at once.
    fn slow_answers(&self, owner: &str, delay: Duration) -> impl Future<Output = ()>;

    /// A counter that grows with every request `owner` sends (bytes or calls).
    fn sent_by(&self, owner: &str) -> impl Future<Output = u64>;

    /// Whether the test runs under Tokio's paused clock (timings are then exact).
    fn paused_clock(&self) -> bool;

    /// Extra time to wait for an event (a takeover after expiry, a notification) on this backend
    /// beyond the instant the contract allows it, before the wait fails. Under the paused clock
    /// (where it is zero) it is also asserted as the bound on lateness.
    fn slack(&self) -> Duration;

    /// A lease name no other test uses.
    fn unique_name(&self, base: &str) -> String;

    /// Whether the backend watches groups of records ([`LeaseBackend::watch_group`]); one that
    /// does not must say so with `GroupError::Unsupported`.
    ///
    /// [`LeaseBackend::watch_group`]: actix_coordination::LeaseBackend::watch_group
    fn watches_groups(&self) -> bool {
        true
    }

    /// Returns once every lease in `leases` decides its next attempt from the same state of their
    /// object (for backends whose leases decide from a watch-fed view, once each view has caught
    /// up with the others); at once for the others.
    fn settle(&self, leases: &[Self::Lease]) -> impl Future<Output = ()> {
        let _ = leases;
        async {}
    }
}

/// Records `on_lost` notifications with the instant they arrived.
pub struct LostProbe {
    rx: mpsc::UnboundedReceiver<(Instant, LeaseLost)>,
    _subscription: actix_coordination::LostSubscription,
}

impl LostProbe {
    pub fn new(lease: &impl Lease) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let subscription = lease.on_lost(move |lost| {
            let _ = tx.send((Instant::now(), lost.clone()));
        });
        Self {
            rx,
            _subscription: subscription,
        }
    }

    /// The next notification, within `within`.
    pub async fn next(&mut self, within: Duration) -> (Instant, LeaseLost) {
        timeout(within, self.rx.recv())
            .await
            .expect("no on_lost notification before the deadline")
            .expect("probe channel closed")
    }

    /// The next notification if one has arrived already, without waiting.
    pub fn try_next(&mut self) -> Option<(Instant, LeaseLost)> {
        self.rx.try_recv().ok()
    }

    /// Asserts that no notification arrives within `within` (checking an absence for a bounded
    /// time).
    pub async fn none(&mut self, within: Duration) {
        if let Ok(Some((_, lost))) = timeout(within, self.rx.recv()).await {
            panic!("unexpected on_lost: {lost}");
        }
    }
}

async fn lease<F: Fixture>(f: &F, name: &str, owner: &str) -> F::Lease {
    f.lease(f.settings(name, owner)).await
}

async fn lease_with<F: Fixture>(
    f: &F,
    name: &str,
    owner: &str,
    tune: impl FnOnce(
        actix_coordination::LeaseSettingsBuilder,
    ) -> actix_coordination::LeaseSettingsBuilder,
) -> F::Lease {
    let settings = tune(f.settings(name, owner).to_builder()).build().unwrap();
    f.lease(settings).await
}

/// Acquires with `lease` until it succeeds or `within` passes; returns the instants the successful
/// call started and finished.
async fn acquire_until<L: Lease>(
    lease: &L,
    within: Duration,
    poll: Duration,
) -> (Instant, Instant) {
    let give_up = Instant::now() + within;
    loop {
        let start = Instant::now();
        if let Ok(true) = lease.acquire().await {
            return (start, Instant::now());
        }
        assert!(
            Instant::now() < give_up,
            "{} never acquired {}",
            lease.owner(),
            lease.name()
        );
        sleep(poll).await;
    }
}

/// Waits until `lease` renews (its deadline moves forward) and returns the new deadline. Panics
/// after `within`, or if the lease is lost meanwhile.
pub async fn next_renewal<L: Lease>(lease: &L, within: Duration) -> Instant {
    let before = lease.deadline().expect("held before waiting for a renewal");
    timeout(within, async {
        loop {
            match lease.deadline() {
                Some(deadline) if deadline != before => {
                    assert!(deadline > before, "a renewal moved the deadline back");
                    return deadline;
                }
                Some(_) => sleep(Duration::from_millis(5)).await,
                None => panic!(
                    "{} lost {} waiting for a renewal",
                    lease.owner(),
                    lease.name()
                ),
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{} did not renew {} within {within:?}",
            lease.owner(),
            lease.name()
        )
    })
}

/// How long a healthy holder may take to renew: one interval, one call, the backend's slack.
fn renewal_bound<F: Fixture>(f: &F, settings: &LeaseSettings) -> Duration {
    settings.renewal_interval() + settings.operation_timeout() + f.slack()
}

/// The timing of leases that race: a race is about who wins, not about how fast, so each call
/// gets a generous bound (an operation timeout of 5 s, with the TTL and renewal interval that
/// allow it) and renewals are rare. A call that times out has an unknown outcome, and its round
/// could not be judged; with the suite's 3 s TTL the bound is 950 ms, which calls exceeded on a
/// loaded machine (load 16-22 on 2 cores).
pub fn race_timing(
    builder: actix_coordination::LeaseSettingsBuilder,
) -> actix_coordination::LeaseSettingsBuilder {
    builder
        .ttl(Duration::from_secs(30))
        .renewal_interval(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(5))
        .acquire_retries(0)
}

/// Concurrent acquires by different owners have exactly one winner, 100 rounds in a row, and the
/// race is fair: the owners start in a random order with random tiny delays, so different owners
/// win (a backend or a lease that always let the first caller win would hide a lost update).
pub async fn one_winner_per_round<F: Fixture>(f: &F) {
    const ROUNDS: usize = 100;
    let name = f.unique_name("race");
    let mut owners = Vec::new();
    for owner in ["a", "b", "c"] {
        owners.push(lease_with(f, &name, owner, race_timing).await);
    }
    // Every owner first waits a moment behind another, as the long-lived contenders of a fleet
    // have: on Kubernetes that starts each one's namespace watch (an attempt alone does not). And
    // every round starts once all owners see the same state (`settle`): a lease that decides from
    // its watch-fed view claims without a read, and the last releaser, which learns its own release
    // from the answer, would otherwise win every round against owners whose watch had not
    // delivered it yet (or that read before each attempt).
    for (i, waiter) in owners.iter().enumerate() {
        let holder = &owners[(i + 1) % owners.len()];
        // Within a while: the holder's own watch-fed view may not show the last release yet.
        let held = holder.acquire_within(Duration::from_secs(30)).await;
        assert!(matches!(held, Ok(true)), "warm-up of owner {i}: {held:?}");
        let waited = waiter.acquire_within(Duration::from_millis(50)).await;
        assert!(
            matches!(waited, Ok(false)),
            "warm-up wait of owner {i}: {waited:?}"
        );
        assert!(
            holder.release().await.unwrap(),
            "warm-up release of owner {i}"
        );
    }
    f.settle(&owners).await;
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut wins = [0usize; 3];
    let mut last_token = None;
    for round in 0..ROUNDS {
        // A fresh start order and a few yields (0 to 2) before each call: on a single-threaded
        // runtime the order in which the calls are first polled decides the race.
        let mut order: Vec<usize> = (0..owners.len()).collect();
        rng.shuffle(&mut order);
        let yields: Vec<usize> = order.iter().map(|_| rng.usize(0..=2)).collect();
        let raced = join_all(order.iter().zip(&yields).map(|(&i, &n)| {
            let lease = &owners[i];
            async move {
                for _ in 0..n {
                    tokio::task::yield_now().await;
                }
                (i, lease.acquire().await)
            }
        }))
        .await;
        let mut results: Vec<_> = (0..owners.len()).map(|_| None).collect();
        for (i, r) in raced {
            results[i] = Some(r);
        }
        let results: Vec<_> = results.into_iter().map(Option::unwrap).collect();
        let winners: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Ok(true)))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round} (seed {seed}, order {order:?}): results {results:?}"
        );
        for (i, r) in results.iter().enumerate() {
            if i != winners[0] {
                assert!(
                    matches!(r, Ok(false)),
                    "round {round} (seed {seed}): loser {i} got {r:?}"
                );
                assert!(!owners[i].check_alive());
            }
        }
        wins[winners[0]] += 1;
        let winner = &owners[winners[0]];
        assert!(winner.check_alive());
        let token = winner.fencing_token().expect("winner has a token");
        assert!(
            Some(token) > last_token,
            "round {round}: token {token} after {last_token:?}"
        );
        last_token = Some(token);
        assert!(winner.release().await.unwrap(), "round {round}: release");
        f.settle(&owners).await;
    }
    let distinct = wins.iter().filter(|&&w| w > 0).count();
    assert!(
        distinct > 1,
        "one owner won all {ROUNDS} rounds (wins a/b/c {wins:?}, seed {seed}): the race is not fair"
    );
}

/// Acquiring a lease one holds resolves `true`, keeps the tenure (token) and its renewal.
pub async fn reentrant_acquire_keeps_one_tenure<F: Fixture>(f: &F) {
    let name = f.unique_name("reentrant");
    let a = lease(f, &name, "a").await;
    let b = lease_with(f, &name, "b", |b| b.acquire_retries(0)).await;
    assert!(!a.check_alive(), "not alive before acquire");
    assert_eq!(a.fencing_token(), None);
    assert!(a.acquire().await.unwrap());
    let token = a.fencing_token().unwrap();
    assert!(a.acquire().await.unwrap(), "reentrant acquire");
    assert!(a.acquire().await.unwrap(), "reentrant acquire");
    assert_eq!(a.fencing_token(), Some(token), "same tenure");
    // Held across several TTLs by the one renewal loop: after every renewal a is alive, b is kept
    // out, and the tenure is the same.
    let settings = f.settings(&name, "a");
    let until = Instant::now() + settings.ttl() * 2;
    let mut renewals = 0;
    while Instant::now() < until {
        next_renewal(&a, renewal_bound(f, &settings)).await;
        renewals += 1;
        assert!(a.check_alive());
        assert!(!b.acquire().await.unwrap(), "b must not get a held lease");
        assert_eq!(a.fencing_token(), Some(token), "renewals keep the tenure");
    }
    assert!(renewals >= 2, "{renewals} renewals in two TTLs");
    assert!(a.release().await.unwrap());
}

/// Releasing a lease one does not hold is a no-op that resolves `true` and disturbs nobody.
pub async fn release_when_not_held_is_a_noop<F: Fixture>(f: &F) {
    let name = f.unique_name("noop-release");
    let a = lease(f, &name, "a").await;
    let b = lease(f, &name, "b").await;
    let c = lease_with(f, &name, "c", |b| b.acquire_retries(0)).await;
    assert!(a.release().await.unwrap(), "never acquired");
    assert!(b.acquire().await.unwrap());
    assert!(a.release().await.unwrap(), "held by someone else, not by a");
    assert!(b.check_alive());
    assert!(
        !c.acquire().await.unwrap(),
        "b still holds it in the backend"
    );
    assert!(b.release().await.unwrap());
    assert!(b.release().await.unwrap(), "second release is a no-op");
}

/// A release stops `check_alive` at once, fires no `on_lost`, and lets the next owner in.
pub async fn release_lets_the_next_owner_in<F: Fixture>(f: &F) {
    let name = f.unique_name("release");
    let a = lease(f, &name, "a").await;
    let b = lease_with(f, &name, "b", |b| b.acquire_retries(0)).await;
    let mut probe = LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    let token_a = a.fencing_token().unwrap();
    assert!(!b.acquire().await.unwrap());
    assert!(a.release().await.unwrap());
    assert!(!a.check_alive());
    assert_eq!(a.fencing_token(), None);
    // Free at once, not after the TTL: within the slack (a backend whose contender decides from
    // its watch may report the lease held for the watch's delay, then wakes on the release).
    let asked = Instant::now();
    assert!(
        b.acquire_within(f.slack()).await.unwrap(),
        "free right after the release"
    );
    assert!(asked.elapsed() < f.settings(&name, "b").ttl());
    assert!(b.fencing_token().unwrap() > token_a);
    probe.none(f.slack()).await;
    assert!(b.release().await.unwrap());
}

/// `retire` gives the lease up like a release (where the backend removes the record, the next
/// owner's claim starts a new one): `check_alive` stops at once, no `on_lost`, the next owner,
/// waiting, gets in at once, and this owner can hold the name again later.
pub async fn retire_lets_the_next_owner_in<F: Fixture>(f: &F) {
    let name = f.unique_name("retire");
    let a = lease(f, &name, "a").await;
    let b = lease_with(f, &name, "b", |b| b.acquire_retries(0)).await;
    let mut probe = LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    assert!(!b.acquire().await.unwrap());
    assert!(a.retire().await.unwrap());
    assert!(!a.check_alive());
    assert_eq!(a.fencing_token(), None);
    let asked = Instant::now();
    assert!(
        b.acquire_within(f.slack()).await.unwrap(),
        "free right after the retire"
    );
    assert!(asked.elapsed() < f.settings(&name, "b").ttl());
    probe.none(f.slack()).await;
    assert!(b.release().await.unwrap());
    assert!(a.acquire().await.unwrap(), "the name can be held again");
    assert!(a.release().await.unwrap());
}

/// A holder dropped without release (a crash) blocks others until its TTL, and not a moment less.
pub async fn dropped_holder_blocks_others_until_ttl<F: Fixture>(f: &F) {
    let name = f.unique_name("crash");
    let a = lease(f, &name, "a").await;
    let b = lease_with(f, &name, "b", |b| b.acquire_retries(0)).await;
    assert!(a.acquire().await.unwrap());
    let settings = f.settings(&name, "a");
    let ttl = settings.ttl();
    // Let a renewal happen, then crash.
    next_renewal(&a, renewal_bound(f, &settings)).await;
    assert!(a.check_alive());
    // The start of a's last successful renewal: its deadline minus its local validity.
    let renewed_at = a.deadline().unwrap() - settings.local_validity();
    drop(a);
    let poll = if f.paused_clock() {
        Duration::from_millis(10)
    } else {
        Duration::from_millis(50)
    };
    let (_, acquired_at) = acquire_until(&b, ttl * 3, poll).await;
    assert!(
        acquired_at >= renewed_at + ttl,
        "taken over {:?} before the TTL ran out",
        (renewed_at + ttl) - acquired_at
    );
    if f.paused_clock() {
        // Exact timings: taken over within one poll of the TTL.
        let late = acquired_at - (renewed_at + ttl);
        assert!(late <= poll, "taken over {late:?} after the TTL ran out");
    }
    assert!(b.release().await.unwrap());
}

/// A frozen holder reads `check_alive() == false` at its deadline and gets `on_lost` (expired).
pub async fn paused_holder_loses_at_its_deadline<F: Fixture>(f: &F) {
    let name = f.unique_name("pause");
    let a = lease(f, &name, "a").await;
    let b = lease_with(f, &name, "b", |b| b.acquire_retries(0)).await;
    let mut probe = LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    let token = a.fencing_token().unwrap();
    f.pause("a").await;
    let deadline = a.deadline().unwrap();
    if f.paused_clock() {
        sleep_until(deadline - Duration::from_millis(1)).await;
        assert!(a.check_alive(), "alive until the deadline");
    }
    sleep_until(deadline).await;
    assert!(
        !a.check_alive(),
        "not alive at the deadline, whatever the renewal task does"
    );
    let (lost_at, lost) = probe.next(f.slack() + Duration::from_secs(1)).await;
    assert!(lost_at >= deadline);
    if f.paused_clock() {
        assert_eq!(lost_at, deadline, "on_lost at the deadline");
    }
    assert!(matches!(lost.reason, LostReason::Expired { .. }), "{lost}");
    assert_eq!(lost.fencing_token, Some(token));
    assert_eq!(lost.name, name);
    assert_eq!(lost.owner, "a");
    assert_eq!(a.fencing_token(), None);
    // The contender gets it only after the holder was told.
    let ttl = f.settings(&name, "b").ttl();
    let (_, acquired_at) = acquire_until(&b, ttl * 3, Duration::from_millis(50)).await;
    assert!(acquired_at > lost_at);
    f.heal("a").await;
    assert!(!a.check_alive(), "a resumed holder must acquire again");
    assert!(!a.acquire().await.unwrap(), "b holds it now");
    assert!(b.release().await.unwrap());
}

/// A partitioned holder is told it lost the lease before the contender can hold it.
pub async fn partitioned_holder_is_told_before_the_contender_wins<F: Fixture>(f: &F) {
    let name = f.unique_name("partition");
    let a = lease(f, &name, "a").await;
    let b = lease_with(f, &name, "b", |b| b.acquire_retries(0)).await;
    let mut probe = LostProbe::new(&a);
    assert!(a.acquire().await.unwrap());
    let settings = f.settings(&name, "a");
    // Renewing works before the partition.
    next_renewal(&a, renewal_bound(f, &settings)).await;
    f.partition("a").await;
    let deadline = a.deadline().unwrap();
    // Watch a's view while b tries: they must never both claim the lease.
    let overlap = Arc::new(Mutex::new(None::<Instant>));
    let (_, b_holds_at) = {
        let acquire = acquire_until(&b, settings.ttl() * 3, Duration::from_millis(20));
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                done = &mut acquire => break done,
                _ = sleep(Duration::from_millis(5)) => {
                    if a.check_alive() && b.check_alive() {
                        *overlap.lock().unwrap() = Some(Instant::now());
                    }
                }
            }
        }
    };
    assert_eq!(*overlap.lock().unwrap(), None, "a and b both alive");
    let (lost_at, lost) = probe.next(settings.ttl()).await;
    assert!(
        lost_at <= b_holds_at,
        "on_lost came {:?} after b held the lease",
        lost_at - b_holds_at
    );
    assert!(
        deadline + settings.clock_drift_margin() <= b_holds_at,
        "b held the lease within the holder's margin"
    );
    assert!(matches!(lost.reason, LostReason::Expired { .. }), "{lost}");
    if let LostReason::Expired { last_error } = &lost.reason {
        assert!(last_error.is_some(), "the failing renewal is named");
    }
    f.heal("a").await;
    assert!(b.release().await.unwrap());
}

/// Every ownership transition yields a strictly greater token, across owners and causes.
pub async fn fencing_tokens_strictly_increase<F: Fixture>(f: &F) {
    let name = f.unique_name("tokens");
    let a = lease(f, &name, "a").await;
    let b = lease(f, &name, "b").await;
    let mut tokens: Vec<FencingToken> = Vec::new();
    for _ in 0..3 {
        for l in [&a, &b] {
            assert!(l.acquire().await.unwrap());
            tokens.push(l.fencing_token().unwrap());
            assert!(l.release().await.unwrap());
        }
    }
    // The same owner again, after a release: a new tenure, a new token.
    assert!(a.acquire().await.unwrap());
    tokens.push(a.fencing_token().unwrap());
    // Takeover after a crash.
    drop(a);
    let ttl = f.settings(&name, "b").ttl();
    acquire_until(&b, ttl * 3, Duration::from_millis(50)).await;
    tokens.push(b.fencing_token().unwrap());
    for pair in tokens.windows(2) {
        assert!(pair[0] < pair[1], "tokens {tokens:?}");
    }
    assert!(b.release().await.unwrap());
}

/// `on_lost` fires exactly once per loss, for every handler, and not on release.
pub async fn on_lost_fires_once_per_loss<F: Fixture>(f: &F) {
    let name = f.unique_name("once");
    let a = lease(f, &name, "a").await;
    let calls = Arc::new(AtomicUsize::new(0));
    let subs: Vec<_> = (0..2)
        .map(|_| {
            let calls = calls.clone();
            a.on_lost(move |_| {
                calls.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    let mut probe = LostProbe::new(&a);
    let ttl = f.settings(&name, "a").ttl();
    assert!(a.acquire().await.unwrap());
    f.partition("a").await;
    probe.next(ttl * 2).await;
    probe.none(ttl).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2, "once per handler");
    f.heal("a").await;
    assert!(a.acquire().await.unwrap(), "a new acquire after the loss");
    assert!(a.check_alive());
    f.pause("a").await;
    probe.next(ttl * 2).await;
    probe.none(ttl).await;
    assert_eq!(calls.load(Ordering::SeqCst), 4, "once per handler per loss");
    f.heal("a").await;
    assert!(a.acquire().await.unwrap());
    assert!(a.release().await.unwrap());
    probe.none(f.slack()).await;
    assert_eq!(calls.load(Ordering::SeqCst), 4, "a release is not a loss");
    drop(subs);
}

/// Unsubscribed handlers (explicitly or by drop) are not called; detached and kept ones are.
pub async fn unsubscribe_works<F: Fixture>(f: &F) {
    let name = f.unique_name("unsubscribe");
    let a = lease(f, &name, "a").await;
    let counter = |n: &Arc<AtomicUsize>| {
        let n = n.clone();
        move |_: &LeaseLost| {
            n.fetch_add(1, Ordering::SeqCst);
        }
    };
    let (gone, dropped, kept, detached) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let s1 = a.on_lost(counter(&gone));
    let s2 = a.on_lost(counter(&dropped));
    let _s3 = a.on_lost(counter(&kept));
    a.on_lost(counter(&detached)).detach();
    let mut probe = LostProbe::new(&a);
    s1.unsubscribe();
    drop(s2);
    assert!(a.acquire().await.unwrap());
    f.partition("a").await;
    probe.next(f.settings(&name, "a").ttl() * 2).await;
    assert_eq!(gone.load(Ordering::SeqCst), 0);
    assert_eq!(dropped.load(Ordering::SeqCst), 0);
    assert_eq!(kept.load(Ordering::SeqCst), 1);
    assert_eq!(detached.load(Ordering::SeqCst), 1);
    f.heal("a").await;
}

/// An unreachable backend makes `acquire` fail (outcome unknown), never resolve `false`.
pub async fn unreachable_backend_makes_acquire_fail<F: Fixture>(f: &F) {
    let name = f.unique_name("unreachable");
    let a = lease_with(f, &name, "a", |b| b.acquire_retries(1)).await;
    f.partition("a").await;
    let result = a.acquire().await;
    assert!(result.is_err(), "got {result:?}");
    assert!(result.unwrap_err().is_transient());
    assert!(!a.check_alive());
    f.pause("a").await;
    let result = a.acquire().await;
    assert!(
        matches!(result, Err(actix_coordination::LeaseError::Timeout { .. })),
        "got {result:?}"
    );
    f.heal("a").await;
    assert!(a.acquire().await.unwrap(), "works again once healed");
    assert!(a.release().await.unwrap());
}

/// Waits until `check` holds for the group's latest snapshot (at the instant it is checked), on
/// the watch's changes and the snapshot's own expiries, for `within` at most.
pub async fn group_until(
    watch: &mut actix_coordination::GroupWatch,
    within: Duration,
    what: &str,
    check: impl Fn(&actix_coordination::GroupSnapshot, Instant) -> bool,
) -> Arc<actix_coordination::GroupSnapshot> {
    let deadline = Instant::now() + within;
    loop {
        let snapshot = watch.snapshot_and_mark();
        let now = Instant::now();
        if check(&snapshot, now) {
            return snapshot;
        }
        assert!(
            now < deadline,
            "{what}: not within {within:?}: {snapshot:?}"
        );
        let wake = snapshot.next_expiry(now).unwrap_or(deadline).min(deadline);
        tokio::select! {
            changed = watch.changed() => changed.expect("the group watch runs"),
            _ = sleep_until(wake) => {}
        }
    }
}

/// A group watch shows every record whose name has the group's prefix (and no other): who holds
/// it with which token, a release, and a holder that stopped renewing, which drops out at its
/// expiry as the watching process judges it (no later than TTL after the last renewal it saw,
/// plus the backend's slack).
pub async fn group_watch_shows_holders_releases_and_expiries<F: Fixture>(f: &F) {
    let group = f.unique_name("group");
    let prefix = format!("{group}-");
    let (first, second) = (format!("{prefix}0"), format!("{prefix}1"));
    let a = lease(f, &first, "a").await;
    let b = lease(f, &second, "b").await;
    // Same start, not in the group: `<group>x-0` does not start with `<group>-`.
    let outsider = lease(f, &format!("{group}x-0"), "c").await;
    if !f.watches_groups() {
        let refused = a.watch_group(&prefix);
        assert!(
            matches!(
                refused,
                Err(actix_coordination::GroupError::Unsupported { .. })
            ),
            "a backend without group watches says so: {refused:?}"
        );
        return;
    }
    let mut watch = a.watch_group(&prefix).expect("the backend watches groups");
    let within = f.settings(&first, "a").ttl() * 4 + f.slack() + Duration::from_secs(10);
    group_until(&mut watch, within, "synced", |s, _| s.is_synced()).await;

    assert!(a.acquire().await.unwrap());
    assert!(b.acquire().await.unwrap());
    assert!(outsider.acquire().await.unwrap());
    let (token_a, token_b) = (a.fencing_token().unwrap(), b.fencing_token().unwrap());
    let seen = group_until(&mut watch, within, "both holders", |s, now| {
        s.live_holder(&first, now) == Some("a") && s.live_holder(&second, now) == Some("b")
    })
    .await;
    assert_eq!(seen.get(&first).unwrap().token, Some(token_a), "{seen:?}");
    assert_eq!(seen.get(&second).unwrap().token, Some(token_b), "{seen:?}");
    assert!(
        seen.records().keys().all(|name| name.starts_with(&prefix)),
        "only the group's records: {seen:?}"
    );

    // A release shows at once (no expiry involved).
    assert!(a.release().await.unwrap());
    group_until(&mut watch, within, "a's release", |s, now| {
        s.live_holder(&first, now).is_none() && s.live_holder(&second, now) == Some("b")
    })
    .await;

    // b stops renewing (cut off): the watch stops showing it once its claim has expired.
    let settings = f.settings(&second, "b");
    f.partition("b").await;
    let cut = Instant::now();
    let gone = group_until(&mut watch, within, "b's expiry", |s, now| {
        s.live_holder(&second, now).is_none()
    })
    .await;
    let took = cut.elapsed();
    assert!(
        took <= settings.ttl() + settings.renewal_interval() + f.slack() * 2,
        "b shown alive {took:?} after it stopped renewing: {gone:?}"
    );
    f.heal("b").await;
    assert!(outsider.release().await.unwrap());
}

/// `release_to` hands the lease to the preferred owner: it takes it at once, while another
/// contender is left out until that owner's tenure ends; a plain release after it leaves the
/// lease free for anyone. Invalid targets, and backends that cannot record a preference, are
/// refused with nothing changed.
pub async fn release_to_hands_the_lease_to_the_preferred_owner<F: Fixture>(f: &F) {
    let name = f.unique_name("transfer");
    let a = lease(f, &name, "a").await;
    let b = lease_with(f, &name, "b", |b| b.acquire_retries(0)).await;
    let c = lease_with(f, &name, "c", |b| b.acquire_retries(0)).await;
    assert!(a.acquire().await.unwrap());
    let token_a = a.fencing_token().unwrap();
    if !a.records_preference() {
        let error = a.release_to("b").await.unwrap_err();
        assert!(matches!(error, LeaseError::Unsupported { .. }), "{error}");
        assert!(!error.is_transient());
        assert_eq!(a.fencing_token(), Some(token_a), "nothing changed");
        assert!(a.release().await.unwrap());
        return;
    }
    for bad in ["", "a", "line\nbreak"] {
        let error = a.release_to(bad).await.unwrap_err();
        assert!(
            matches!(error, LeaseError::InvalidTransferTarget { .. }),
            "{bad:?}: {error}"
        );
        assert_eq!(a.fencing_token(), Some(token_a), "nothing changed");
    }
    assert!(a.release_to("b").await.unwrap());
    assert!(!a.check_alive());
    assert_eq!(a.fencing_token(), None);
    // Neither another contender nor the old holder may take it while it is left to b.
    assert!(!c.acquire().await.unwrap(), "c took a lease left to b");
    assert!(
        !a.acquire_within(Duration::ZERO).await.unwrap(),
        "a took it back"
    );
    // b takes it at once (within the slack: a contender that decides from its watch wakes on the
    // release).
    assert!(
        b.acquire_within(f.slack()).await.unwrap(),
        "the preferred owner could not take the lease"
    );
    assert!(b.fencing_token().unwrap() > token_a);
    assert!(!c.acquire().await.unwrap(), "held by b");
    // A plain release clears the preference: free for anyone.
    assert!(b.release().await.unwrap());
    assert!(
        c.acquire_within(f.slack()).await.unwrap(),
        "free for anyone after a plain release"
    );
    assert!(c.release().await.unwrap());
    assert!(
        !a.release_to("b").await.unwrap(),
        "nothing to hand over when not held"
    );
}

/// A lease released to an owner that never claims it (dead, partitioned, not contending) is left
/// to it for one TTL after the release, and not a moment less; then anyone may take it, and a
/// waiting contender does, woken by the window's end.
pub async fn a_preference_nobody_takes_up_lapses_after_one_ttl<F: Fixture>(f: &F) {
    let name = f.unique_name("transfer-lapse");
    let a = lease(f, &name, "a").await;
    if !a.records_preference() {
        return;
    }
    let c = lease_with(f, &name, "c", |b| b.acquire_retries(0)).await;
    let ttl = f.settings(&name, "a").ttl();
    assert!(a.acquire().await.unwrap());
    let token_a = a.fencing_token().unwrap();
    let released_from = Instant::now();
    assert!(a.release_to("absent").await.unwrap());
    let released_by = Instant::now();
    assert!(!c.acquire().await.unwrap(), "left to the preferred owner");
    // A contender waiting for it wakes when the window ends (not only at its own deadline).
    assert!(
        c.acquire_within(ttl * 2 + f.slack()).await.unwrap(),
        "the lease stayed left to an absent owner"
    );
    let acquired_at = Instant::now();
    assert!(
        acquired_at >= released_from + ttl,
        "taken {:?} before the window of one TTL ended",
        (released_from + ttl) - acquired_at
    );
    if f.paused_clock() {
        // Exact timings: at the window's end.
        assert!(
            acquired_at <= released_by + ttl + Duration::from_millis(10),
            "taken {:?} after the window ended",
            acquired_at - (released_by + ttl)
        );
    }
    assert!(c.fencing_token().unwrap() > token_a);
    assert!(c.release().await.unwrap());
}

/// A holder's metadata ([`LeaseSettings::metadata`]) shows in every group watch of the lease for
/// as long as it holds it: gone with a release, and never carried over to a next holder that
/// wrote none.
///
/// [`LeaseSettings::metadata`]: actix_coordination::LeaseSettings::metadata
pub async fn group_watch_shows_the_holders_metadata<F: Fixture>(f: &F) {
    if !f.watches_groups() {
        return; // the case above checks that such a backend says so
    }
    let group = f.unique_name("meta");
    let name = format!("{group}-0");
    let a = lease_with(f, &name, "a", |b| b.metadata(r#"{"revision":"v2"}"#)).await;
    let b = lease(f, &name, "b").await;
    let mut watch = a.watch_group(&format!("{group}-")).expect("group watch");
    let within = f.settings(&name, "a").ttl() * 4 + f.slack() + Duration::from_secs(10);
    group_until(&mut watch, within, "synced", |s, _| s.is_synced()).await;
    let metadata =
        |s: &actix_coordination::GroupSnapshot| s.get(&name).and_then(|r| r.metadata.clone());

    assert!(a.acquire().await.unwrap());
    let seen = group_until(&mut watch, within, "a with its metadata", |s, now| {
        s.live_holder(&name, now) == Some("a")
    })
    .await;
    assert_eq!(metadata(&seen).as_deref(), Some(r#"{"revision":"v2"}"#));

    assert!(a.release().await.unwrap());
    let seen = group_until(&mut watch, within, "a's release", |s, now| {
        s.live_holder(&name, now).is_none()
    })
    .await;
    assert_eq!(metadata(&seen), None, "released: no metadata: {seen:?}");

    assert!(b.acquire().await.unwrap());
    let seen = group_until(&mut watch, within, "b", |s, now| {
        s.live_holder(&name, now) == Some("b")
    })
    .await;
    assert_eq!(metadata(&seen), None, "b wrote none: {seen:?}");
    assert!(b.release().await.unwrap());
}

/// `hand_over` gives the lease up to the named owner: the tenure ends as with a release, and the
/// target holds it next with a higher token, while others still find it held.
/// (On etcd, when the holder's session has seen the target's etcd lease, and in memory, the target
/// takes up the record written in its name; elsewhere it claims the released lease.) Invalid
/// targets are refused with nothing changed; with nothing held it is a release.
pub async fn hand_over_gives_the_lease_to_the_waiting_target<F: Fixture>(f: &F) {
    let name = f.unique_name("hand-over");
    let a = lease(f, &name, "a").await;
    let b = lease_with(f, &name, "b", |b| b.acquire_retries(0)).await;
    let c = lease_with(f, &name, "c", |b| b.acquire_retries(0)).await;
    assert!(a.acquire().await.unwrap());
    let token_a = a.fencing_token().unwrap();
    for bad in ["", "a", "line\nbreak"] {
        let error = a.hand_over(bad).await.unwrap_err();
        assert!(
            matches!(error, LeaseError::InvalidTransferTarget { .. }),
            "{bad:?}: {error}"
        );
        assert_eq!(a.fencing_token(), Some(token_a), "nothing changed");
    }
    assert!(
        !b.acquire_within(Duration::ZERO).await.unwrap(),
        "held by a"
    );
    assert!(a.hand_over("b").await.unwrap(), "a held the lease");
    assert!(!a.check_alive());
    assert!(
        b.acquire_within(f.slack()).await.unwrap(),
        "the target holds the lease after the handover"
    );
    assert!(b.fencing_token().unwrap() > token_a);
    assert!(!c.acquire().await.unwrap(), "held by b");
    assert!(b.release().await.unwrap());
    assert!(
        c.acquire_within(f.slack()).await.unwrap(),
        "free for anyone after b's release"
    );
    assert!(c.release().await.unwrap());
    assert!(
        a.hand_over("b").await.unwrap(),
        "with nothing held, a release"
    );
}

/// A handover between owners with different TTLs (a rollout that changes the TTL, or one lease
/// name built with two settings): the target's tenure never outlives the record. The giver's
/// handover writes the record for the giver's TTL; a target with a ten times longer TTL, and a
/// first renewal only after the giver's TTL has passed, still holds it past that instant (the
/// backend extended the record, claimed it for its own TTL, or bound it to its own lease), and no
/// third owner takes the lease while the target passes `check_alive`.
pub async fn a_handover_to_a_longer_ttl_never_outlives_the_record<F: Fixture>(f: &F) {
    let name = f.unique_name("hand-over-ttls");
    let short = f.settings(&name, "a").ttl();
    let a = lease(f, &name, "a").await;
    let b = lease_with(f, &name, "b", |b| {
        b.ttl(short * 10)
            .renewal_interval(short * 3)
            .acquire_retries(0)
    })
    .await;
    let c = lease_with(f, &name, "c", |b| b.acquire_retries(0)).await;
    assert!(a.acquire().await.unwrap());
    assert!(a.hand_over("b").await.unwrap(), "a held the lease");
    assert!(
        b.acquire_within(f.slack()).await.unwrap(),
        "the target holds the lease after the handover"
    );
    // Past the giver's TTL (twice over), before the target's first renewal: the target is alive
    // all along, and the third owner never gets in.
    let until = Instant::now() + short * 2;
    while Instant::now() < until {
        let got = c.acquire_within(Duration::ZERO).await.unwrap();
        let b_alive = b.check_alive();
        assert!(
            !got || !b_alive,
            "c acquired the lease while b still passed check_alive (b's deadline {:?} from now)",
            b.deadline()
                .map(|d| d.saturating_duration_since(Instant::now()))
        );
        assert!(
            !got,
            "c acquired the lease {:?} after the handover; b's tenure ended before its own TTL",
            short * 2 - until.saturating_duration_since(Instant::now())
        );
        assert!(b_alive, "b lost its tenure before its deadline");
        sleep(short / 10).await;
    }
    assert!(b.release().await.unwrap());
}

/// The contract suite on *bound* leases (see `actix_coordination::Binding`): every lease the
/// fixture builds is bound to a member lease of its own owner (named `<lease>.member.<owner>`),
/// which it holds for as long as the lease lives — the way a sharded node holds its member lease
/// and binds its shard leases to it. Dropping the lease drops the member too (a crash of the
/// node), so every case of the suite holds for bound leases unchanged.
pub struct Bound<F>(pub F);

/// A lease bound to a member lease it owns (see [`Bound`]).
pub struct BoundLease<L> {
    lease: L,
    member: L,
}

impl<L: Lease> BoundLease<L> {
    /// The member lease the lease is bound to.
    pub fn member(&self) -> &L {
        &self.member
    }

    /// The member held, acquired first when it is not.
    async fn member_held(&self) -> Result<(), LeaseError> {
        if !self.member.check_alive() && !self.member.acquire().await? {
            return Err(LeaseError::Unbound {
                member: self.member.name().to_owned(),
            });
        }
        Ok(())
    }
}

impl<L: Lease> Lease for BoundLease<L> {
    fn settings(&self) -> &LeaseSettings {
        self.lease.settings()
    }
    async fn acquire(&self) -> Result<bool, LeaseError> {
        self.member_held().await?;
        self.lease.acquire().await
    }
    async fn acquire_within(&self, timeout: Duration) -> Result<bool, LeaseError> {
        self.member_held().await?;
        self.lease.acquire_within(timeout).await
    }
    fn release(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        self.lease.release()
    }
    fn release_to(&self, target: &str) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        self.lease.release_to(target)
    }
    fn hand_over(&self, target: &str) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        self.lease.hand_over(target)
    }
    fn retire(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        self.lease.retire()
    }
    fn records_preference(&self) -> bool {
        self.lease.records_preference()
    }
    fn tenure(&self) -> &actix_coordination::TenureWatch {
        self.lease.tenure()
    }
    fn on_lost(
        &self,
        handler: impl Fn(&LeaseLost) + Send + Sync + 'static,
    ) -> actix_coordination::LostSubscription {
        self.lease.on_lost(handler)
    }
    fn observed_holder(&self) -> Option<String> {
        self.lease.observed_holder()
    }
    fn watch_group(
        &self,
        prefix: &str,
    ) -> Result<actix_coordination::GroupWatch, actix_coordination::GroupError> {
        self.lease.watch_group(prefix)
    }
    fn bound_to(&self) -> Option<String> {
        self.lease.bound_to()
    }
}

impl<F: Fixture> Fixture for Bound<F> {
    type Lease = BoundLease<F::Lease>;

    fn settings(&self, name: &str, owner: &str) -> LeaseSettings {
        self.0.settings(name, owner)
    }

    async fn lease(&self, settings: LeaseSettings) -> BoundLease<F::Lease> {
        let member_settings = settings
            .to_builder()
            .name(format!("{}.member.{}", settings.name(), settings.owner()))
            .build()
            .unwrap();
        let member = self.0.lease(member_settings).await;
        let lease = self.0.lease(settings).await;
        let anchor = member.binding_anchor().expect("the backend binds");
        lease.bind_to(&anchor).expect("bound");
        BoundLease { lease, member }
    }

    async fn partition(&self, owner: &str) {
        self.0.partition(owner).await
    }

    async fn pause(&self, owner: &str) {
        self.0.pause(owner).await
    }

    async fn heal(&self, owner: &str) {
        self.0.heal(owner).await
    }

    async fn slow_answers(&self, owner: &str, delay: Duration) {
        self.0.slow_answers(owner, delay).await
    }

    async fn sent_by(&self, owner: &str) -> u64 {
        self.0.sent_by(owner).await
    }

    fn paused_clock(&self) -> bool {
        self.0.paused_clock()
    }

    fn slack(&self) -> Duration {
        self.0.slack()
    }

    fn unique_name(&self, base: &str) -> String {
        self.0.unique_name(base)
    }

    fn watches_groups(&self) -> bool {
        self.0.watches_groups()
    }

    async fn settle(&self, leases: &[Self::Lease]) {
        // The bound leases' own views; their members are each owner's own.
        let _ = leases;
    }
}
