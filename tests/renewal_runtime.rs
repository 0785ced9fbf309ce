//! A tenure whose renewal task goes away with its runtime is reported lost at once (issue 27,
//! item 2): the runtime of whoever called `acquire` runs the renewal task, and when that runtime
//! shuts down (an arbiter stopped, an actix-web worker restarted) the task is dropped. Nothing
//! would renew the tenure or end it at its deadline any more, so the tenure ends right then:
//! `on_lost` fires once with [`LostReason::RenewalStopped`], subscribed actors get `LeaseLost`,
//! `check_alive` turns `false`, and the lease can be acquired again from another runtime.
//!
//! The TTLs are long (60 s), so that a loss reported at the deadline instead would fail the
//! tests' waits. On the real servers the same happens (the backends' sessions run on threads of
//! their own and outlive the runtime).

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    InMemoryLease, InMemoryStore, Lease, LeaseActor, LeaseLost, LeaseSettings, LostReason,
    SubscribeLeaseLost, TenureEnd,
};

const TTL: Duration = Duration::from_secs(60);
/// How long the tests wait for a notification that should come at once.
const WAIT: Duration = Duration::from_secs(20);

fn settings(name: &str, owner: &str) -> LeaseSettings {
    LeaseSettings::builder(name, owner)
        .ttl(TTL)
        .build()
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Acquires `lease` on a runtime of its own, shuts that runtime down, and checks that the loss is
/// reported once, at once; then acquires and releases it from another runtime, with no second
/// report.
fn the_loss_is_reported_when_the_acquiring_runtime_shuts_down<L: Lease>(lease: Arc<L>) {
    let (tx, losses) = mpsc::channel::<LeaseLost>();
    let _subscription = lease.on_lost(move |lost| {
        let _ = tx.send(lost.clone());
    });
    let first = runtime();
    assert!(first.block_on(lease.acquire()).expect("acquire"));
    let token = lease.fencing_token().expect("a token while held");
    let guard = lease.tenure().guard().expect("held");
    assert!(lease.check_alive());

    drop(first);
    let lost = losses
        .recv_timeout(WAIT)
        .expect("on_lost fires when the runtime that renewed the lease is gone");
    assert_eq!(lost.reason, LostReason::RenewalStopped);
    assert_eq!(lost.fencing_token, Some(token));
    assert!(!lease.check_alive());
    assert!(!guard.check_alive());
    let second = runtime();
    assert_eq!(
        second.block_on(guard.ended()),
        TenureEnd::Lost(LostReason::RenewalStopped)
    );

    // The lease is usable again from another runtime; the loss was reported once.
    assert!(second.block_on(lease.acquire()).expect("acquire again"));
    assert!(lease.fencing_token().expect("held again") > token);
    assert!(second.block_on(lease.release()).expect("release"));
    drop(second);
    assert!(
        losses.try_recv().is_err(),
        "one loss, reported once (a release is not a loss)"
    );
}

#[test]
fn in_memory_the_loss_is_reported_when_the_acquiring_runtime_shuts_down() {
    let store = InMemoryStore::new();
    let lease = Arc::new(InMemoryLease::new(settings("runtime-gone", "a"), &store));
    the_loss_is_reported_when_the_acquiring_runtime_shuts_down(lease);
}

/// Forwards every `LeaseLost` it receives.
struct Subscriber(tokio::sync::mpsc::UnboundedSender<LeaseLost>);

impl Actor for Subscriber {
    type Context = Context<Self>;
}

impl Handler<LeaseLost> for Subscriber {
    type Result = ();

    fn handle(&mut self, lost: LeaseLost, _: &mut Context<Self>) {
        let _ = self.0.send(lost);
    }
}

/// The actix shape of the same: a lease shared with a [`LeaseActor`] on the system's arbiter is
/// acquired from a task on another arbiter, which then stops: the actor's subscribers get
/// `LeaseLost` at once.
#[test]
fn an_arbiter_that_stops_takes_its_tenure_with_it_and_subscribers_are_told() {
    actix_rt::System::new().block_on(async {
        let store = InMemoryStore::new();
        let lease = Arc::new(InMemoryLease::new(settings("arbiter-gone", "a"), &store));
        let actor = LeaseActor::from_arc(Arc::clone(&lease)).start();
        let (tx, mut received) = tokio::sync::mpsc::unbounded_channel();
        let subscriber = Subscriber(tx).start();
        actor
            .send(SubscribeLeaseLost(subscriber.recipient()))
            .await
            .unwrap();

        let worker = Arbiter::new();
        let (acquired_tx, acquired) = tokio::sync::oneshot::channel();
        let acquiring = Arc::clone(&lease);
        assert!(worker.spawn(async move {
            let _ = acquired_tx.send(acquiring.acquire().await);
        }));
        assert!(acquired.await.unwrap().unwrap(), "acquired on the worker");
        let token = lease.fencing_token().unwrap();

        assert!(worker.stop());
        tokio::task::spawn_blocking(move || worker.join())
            .await
            .unwrap()
            .unwrap();
        let lost = tokio::time::timeout(WAIT, received.recv())
            .await
            .expect("LeaseLost reaches the subscriber when the arbiter that renewed stops")
            .unwrap();
        assert_eq!(lost.reason, LostReason::RenewalStopped);
        assert_eq!(lost.fencing_token, Some(token));
        assert!(!lease.check_alive());

        // The actor's lease is usable again from the arbiter that is left.
        assert!(actor
            .send(actix_coordination::Acquire)
            .await
            .unwrap()
            .unwrap());
        assert!(actor
            .send(actix_coordination::Release)
            .await
            .unwrap()
            .unwrap());
    });
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_the_loss_is_reported_when_the_acquiring_runtime_shuts_down() {
    use actix_coordination::EtcdSession;
    use common::etcd::{endpoint, etcd_settings, unique_prefix};

    let session = EtcdSession::new(etcd_settings(&endpoint(), &unique_prefix("runtime-gone")));
    let lease = Arc::new(session.lease(settings("runtime-gone", "a")));
    the_loss_is_reported_when_the_acquiring_runtime_shuts_down(lease);
}

#[cfg(feature = "kubernetes")]
#[test]
fn kubernetes_the_loss_is_reported_when_the_acquiring_runtime_shuts_down() {
    use actix_coordination::KubernetesLease;
    use common::k8s::{env, settings_at, unique};

    let lease = KubernetesLease::new(
        settings(&unique("runtime-gone"), "a"),
        settings_at(&env().url),
    )
    .expect("valid kubernetes settings");
    the_loss_is_reported_when_the_acquiring_runtime_shuts_down(Arc::new(lease));
}
