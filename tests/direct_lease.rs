//! A [`Lease`] implemented directly, without [`ManagedLease`](actix_coordination::ManagedLease):
//! the tenure is published through [`TenurePublisher`] (issue 27, item 10: `Lease::tenure`
//! returns a `TenureWatch`, which only the crate could build before). The crate's readers —
//! `check_alive`, guards, [`LeaseActor`], [`HealthCheck`] — then work on it as on the crate's own
//! leases. Under Tokio's paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    CheckAlive, FencingToken, GetFencingToken, HealthCheck, Lease, LeaseActor, LeaseError,
    LeaseLost, LeaseSettings, LostHandlers, LostReason, LostSubscription, PublishedTenure,
    TenureEnd, TenurePublisher, TenureWatch, Unhealthy,
};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

/// The shared "store": who holds the lease, with which token, until when (on the store's clock,
/// which here is the same process's).
#[derive(Default)]
struct Store {
    record: Mutex<Option<(String, u64, Instant)>>,
    tokens: Mutex<u64>,
}

/// The current tenure's handle, token and renewal task.
type Renewal = (Arc<PublishedTenure>, FencingToken, JoinHandle<()>);

/// A lease over [`Store`] that publishes its tenures itself.
struct DirectLease {
    settings: LeaseSettings,
    store: Arc<Store>,
    publisher: Arc<TenurePublisher>,
    handlers: Arc<LostHandlers>,
    renewal: Mutex<Option<Renewal>>,
}

impl DirectLease {
    fn new(settings: LeaseSettings, store: &Arc<Store>) -> Self {
        Self {
            publisher: Arc::new(TenurePublisher::new(settings.name())),
            settings,
            store: Arc::clone(store),
            handlers: Arc::new(LostHandlers::new()),
            renewal: Mutex::default(),
        }
    }

    fn lost(&self, reason: LostReason, token: FencingToken) -> LeaseLost {
        LeaseLost {
            name: self.settings.name().to_owned(),
            owner: self.settings.owner().to_owned(),
            reason,
            fencing_token: Some(token),
        }
    }
}

impl Lease for DirectLease {
    fn settings(&self) -> &LeaseSettings {
        &self.settings
    }

    async fn acquire(&self) -> Result<bool, LeaseError> {
        if self.check_alive() {
            return Ok(true);
        }
        let sent = Instant::now();
        let ttl = self.settings.ttl();
        let token = {
            let mut record = self.store.record.lock().unwrap();
            match &*record {
                Some((owner, _, until)) if owner != self.settings.owner() && *until > sent => {
                    return Ok(false)
                }
                _ => {}
            }
            let mut tokens = self.store.tokens.lock().unwrap();
            *tokens += 1;
            *record = Some((self.settings.owner().to_owned(), *tokens, sent + ttl));
            *tokens
        };
        let token = FencingToken::new(token);
        let tenure = Arc::new(
            self.publisher
                .start(token, sent + self.settings.local_validity()),
        );
        // The renewal task holds the tenure's handle; it renews every interval while the record
        // is ours, and reports a takeover as a loss.
        let task = tokio::spawn({
            let (store, publisher, handlers) = (
                Arc::clone(&self.store),
                Arc::clone(&self.publisher),
                Arc::clone(&self.handlers),
            );
            let (tenure, settings) = (Arc::clone(&tenure), self.settings.clone());
            let lost = self.lost(LostReason::TakenOver { holder: None }, token);
            async move {
                loop {
                    sleep(settings.renewal_interval()).await;
                    let sent = Instant::now();
                    let mut record = store.record.lock().unwrap();
                    match &mut *record {
                        Some((owner, t, until))
                            if owner == settings.owner() && *t == token.value() =>
                        {
                            *until = sent + settings.ttl();
                            drop(record);
                            if !publisher.extend(&tenure, sent + settings.local_validity()) {
                                return;
                            }
                        }
                        _ => {
                            drop(record);
                            if let Some(end) =
                                publisher.end(&tenure, TenureEnd::Lost(lost.reason.clone()))
                            {
                                assert!(matches!(end, TenureEnd::Lost(_)));
                                handlers.notify(&lost);
                            }
                            return;
                        }
                    }
                }
            }
        });
        *self.renewal.lock().unwrap() = Some((tenure, token, task));
        Ok(true)
    }

    async fn release(&self) -> Result<bool, LeaseError> {
        let Some((tenure, token, task)) = self.renewal.lock().unwrap().take() else {
            return Ok(true);
        };
        task.abort();
        if let Some(TenureEnd::Lost(reason)) = self.publisher.end(&tenure, TenureEnd::Released) {
            // The deadline had passed: a loss, reported once.
            self.handlers.notify(&self.lost(reason, token));
        }
        let mut record = self.store.record.lock().unwrap();
        if record
            .as_ref()
            .is_some_and(|(owner, _, _)| owner == self.settings.owner())
        {
            *record = None;
        }
        Ok(true)
    }

    fn tenure(&self) -> &TenureWatch {
        self.publisher.watch()
    }

    fn on_lost(&self, handler: impl Fn(&LeaseLost) + Send + Sync + 'static) -> LostSubscription {
        self.handlers.subscribe(handler)
    }
}

fn settings(owner: &str) -> LeaseSettings {
    LeaseSettings::builder("direct", owner)
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The tenure a direct implementation publishes is what every reader sees: start, renewals past
/// the first TTL, a takeover reported once, and a release.
#[tokio::test(start_paused = true)]
async fn a_lease_implemented_directly_publishes_its_tenures_to_every_reader() {
    let store = Arc::new(Store::default());
    let a = DirectLease::new(settings("a"), &store);
    let losses = Arc::new(Mutex::new(Vec::new()));
    let _subscription = a.on_lost({
        let losses = Arc::clone(&losses);
        move |lost| losses.lock().unwrap().push(lost.reason.clone())
    });
    assert!(!a.check_alive());
    assert!(a.acquire().await.unwrap());
    let guard = a.tenure().guard().expect("held");
    assert_eq!(a.fencing_token(), Some(FencingToken::new(1)));
    // Renewed well past the first TTL.
    sleep(Duration::from_secs(25)).await;
    assert!(guard.check_alive());
    assert!(a.deadline().unwrap() > Instant::now());

    // Another owner overwrites the record: the renewal task reports the loss once.
    *store.record.lock().unwrap() = Some(("b".into(), 2, Instant::now() + Duration::from_secs(10)));
    assert_eq!(
        guard.ended().await,
        TenureEnd::Lost(LostReason::TakenOver { holder: None })
    );
    assert!(!a.check_alive());
    assert_eq!(
        *losses.lock().unwrap(),
        vec![LostReason::TakenOver { holder: None }]
    );

    // A new tenure, released: no loss.
    *store.record.lock().unwrap() = None;
    assert!(a.acquire().await.unwrap());
    let guard = a.tenure().guard().expect("held again");
    assert!(a.release().await.unwrap());
    assert_eq!(guard.ended().await, TenureEnd::Released);
    assert_eq!(losses.lock().unwrap().len(), 1);
}

/// A release that comes after the deadline (the renewal task did not run) ends the tenure as
/// lost, decided in the same update that ends it: the implementation reports it.
#[tokio::test(start_paused = true)]
async fn a_release_after_the_deadline_is_published_as_a_loss() {
    let publisher = TenurePublisher::new("late");
    let tenure = publisher.start(
        FencingToken::new(3),
        Instant::now() + Duration::from_secs(1),
    );
    let guard = publisher.watch().guard().expect("alive");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        publisher.end(&tenure, TenureEnd::Released),
        Some(TenureEnd::Lost(LostReason::Expired { last_error: None }))
    );
    assert_eq!(
        guard.ended().await,
        TenureEnd::Lost(LostReason::Expired { last_error: None })
    );
    assert_eq!(
        publisher.end(&tenure, TenureEnd::Released),
        None,
        "ended once"
    );
}

/// The actor layer and the health check take a directly implemented lease as they take the
/// crate's own.
#[actix_rt::test]
async fn the_actors_and_the_health_check_work_on_a_lease_implemented_directly() {
    let store = Arc::new(Store::default());
    let lease = Arc::new(DirectLease::new(settings("a"), &store));
    let check = HealthCheck::new();
    check.add_lease(&lease);
    let actor = LeaseActor::from_arc(Arc::clone(&lease)).start();
    assert!(actor
        .send(actix_coordination::Acquire)
        .await
        .unwrap()
        .unwrap());
    assert!(actor.send(CheckAlive).await.unwrap());
    assert_eq!(
        actor.send(GetFencingToken).await.unwrap(),
        Some(FencingToken::new(1))
    );
    assert_eq!(check.liveness(), Ok(()));
    assert!(check.leases()[0].held);

    // Its renewal task gone without ending the tenure (a bug of the implementation): liveness
    // says so at once, long before the deadline.
    let (tenure, _, task) = lease.renewal.lock().unwrap().take().unwrap();
    task.abort();
    let _ = task.await;
    drop(tenure);
    assert!(lease.check_alive());
    assert_eq!(
        check.liveness(),
        Err(Unhealthy::RenewalTaskEnded {
            lease: "direct".into()
        })
    );
}
