//! The harness of the property-based models (`tests/model.rs`, `tests/binding_model.rs`): the
//! in-memory backend with a deliberate bug to switch on, the owners' lease settings and faults,
//! the seed that replays a run, and the runner of seeded schedules.

use std::sync::Arc;
use std::time::Duration;

use actix_coordination::{
    AcquireAttempt, Binding, FencingToken, InMemoryBackend, InMemoryError, InMemoryFault,
    InMemoryStore, InMemoryTenure, LeaseBackend, LeaseSettings, LostReason, ManagedLease,
    ReleaseOutcome, RenewOutcome,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use tokio::time::Instant;

/// The TTL of every lease of the schedules.
pub const TTL: Duration = Duration::from_secs(3);

/// A bug the model backend can be built with, which the model must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// A renewal that the store did not answer is reported as a success.
    RenewalWithoutAnswer,
    /// A bound claim is written as a plain claim (a record with a TTL of its own, never renewed).
    BoundClaimAsPlain,
}

/// The in-memory backend, with `bug` if any.
pub struct ModelBackend {
    inner: InMemoryBackend,
    bug: Option<Bug>,
}

impl ModelBackend {
    pub fn new(store: &InMemoryStore, bug: Option<Bug>) -> Self {
        Self {
            inner: InMemoryBackend::new(store),
            bug,
        }
    }
}

impl LeaseBackend for ModelBackend {
    type Tenure = InMemoryTenure;
    type Error = InMemoryError;

    async fn try_acquire(
        &self,
        settings: &LeaseSettings,
    ) -> Result<AcquireAttempt<InMemoryTenure>, InMemoryError> {
        self.inner.try_acquire(settings).await
    }

    fn binds(&self) -> bool {
        self.inner.binds()
    }

    fn incarnation(&self, tenure: &InMemoryTenure) -> Option<String> {
        self.inner.incarnation(tenure)
    }

    async fn try_acquire_bound(
        &self,
        settings: &LeaseSettings,
        binding: &Binding,
    ) -> Result<AcquireAttempt<InMemoryTenure>, InMemoryError> {
        if self.bug == Some(Bug::BoundClaimAsPlain) {
            self.inner.try_acquire(settings).await
        } else {
            self.inner.try_acquire_bound(settings, binding).await
        }
    }

    async fn renew(
        &self,
        settings: &LeaseSettings,
        tenure: &mut InMemoryTenure,
    ) -> Result<RenewOutcome, InMemoryError> {
        match self.inner.renew(settings, tenure).await {
            Err(_) if self.bug == Some(Bug::RenewalWithoutAnswer) => {
                Ok(RenewOutcome::Renewed { valid_from: None })
            }
            other => other,
        }
    }

    async fn release(
        &self,
        settings: &LeaseSettings,
        tenure: InMemoryTenure,
    ) -> Result<ReleaseOutcome, InMemoryError> {
        self.inner.release(settings, tenure).await
    }

    async fn watch_lost(
        &self,
        settings: &LeaseSettings,
        token: FencingToken,
    ) -> Result<LostReason, InMemoryError> {
        self.inner.watch_lost(settings, token).await
    }

    fn store_id(&self) -> Option<String> {
        self.inner.store_id()
    }

    fn notifies_changes(&self) -> bool {
        self.inner.notifies_changes()
    }

    async fn wait_for_change(&self, settings: &LeaseSettings, not_after: Instant) {
        self.inner.wait_for_change(settings, not_after).await
    }
}

pub type ModelLease = Arc<ManagedLease<ModelBackend>>;

/// The name of owner `i`.
pub fn owner(i: usize) -> String {
    format!("owner-{i}")
}

/// Lease `name` of owner `i` on `store`, with `bug` if any: a TTL of [`TTL`], renewed every
/// second, one retry of an acquire.
pub fn lease(store: &InMemoryStore, name: &str, i: usize, bug: Option<Bug>) -> ModelLease {
    let settings = LeaseSettings::builder(name, owner(i))
        .ttl(TTL)
        .renewal_interval(Duration::from_secs(1))
        .operation_timeout(Duration::from_millis(800))
        .acquire_retries(1)
        .acquire_retry_delay(Duration::from_millis(100))
        .build()
        .unwrap();
    Arc::new(ManagedLease::from_backend(
        settings,
        ModelBackend::new(store, bug),
    ))
}

/// A fault of an owner's connection to the store.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    Partition,
    Pause,
    ResponseLost,
    SlowAnswer(u64),
    Delay(u64),
}

impl Fault {
    pub fn in_memory(self) -> InMemoryFault {
        match self {
            Fault::Partition => InMemoryFault::Unavailable,
            Fault::Pause => InMemoryFault::Hang,
            Fault::ResponseLost => InMemoryFault::ResponseLost,
            Fault::SlowAnswer(ms) => InMemoryFault::SlowAnswer(Duration::from_millis(ms)),
            Fault::Delay(ms) => InMemoryFault::Delay(Duration::from_millis(ms)),
        }
    }
}

/// Heals owners `0..owners` and lets two TTLs pass, so that every tenure has renewed or ended
/// and each involuntary end has been reported.
pub async fn heal_and_settle(store: &InMemoryStore, owners: usize) {
    for i in 0..owners {
        store.heal(&owner(i));
    }
    tokio::time::sleep(TTL * 2).await;
}

/// A current-thread runtime with a paused clock, for one schedule.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// The number of schedules: the environment variable `var`, or `default`.
pub fn cases(var: &str, default: u32) -> u32 {
    std::env::var(var)
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default)
}

/// The seed of a run: `MODEL_SEED` (64 hex digits) replays one, else a random one.
pub fn seed() -> [u8; 32] {
    match std::env::var("MODEL_SEED") {
        Ok(hex) => {
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("MODEL_SEED: hex"))
                .collect();
            bytes.try_into().expect("MODEL_SEED: 64 hex digits")
        }
        Err(_) => std::array::from_fn(|_| fastrand::u8(..)),
    }
}

/// `seed` as `MODEL_SEED` takes it.
pub fn hex(seed: &[u8; 32]) -> String {
    seed.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `cases` schedules of steps drawn from `step` (up to `max_len` each) from `seed`
/// through `schedule`; the failure (shrunk to a minimal schedule) as text.
pub fn run_schedules<S: Strategy>(
    step: S,
    max_len: usize,
    cases: u32,
    seed: [u8; 32],
    schedule: impl Fn(&[S::Value]) -> Result<(), TestCaseError>,
) -> Result<(), String>
where
    S::Value: std::fmt::Debug,
{
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    runner
        .run(&proptest::collection::vec(step, 1..max_len), |ops| {
            schedule(&ops)
        })
        .map_err(|e| e.to_string())
}
