//! What a backend knows of its object: the version it last saw and when it first saw it (the
//! observed-time expiry clock), and the fold of the namespace watch's deliveries into that
//! knowledge (see the `watch` module for which view is current).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio::time::Instant;

use super::record::{binding_of, duration_of, holder_of, newer, older, preferred_of};
use super::watch::{self, KubernetesWatchStats, Subscription, View};
use super::{KubernetesBackend, KubernetesError};
use crate::lease::{FencingToken, LostReason};
use crate::settings::LeaseSettings;

#[derive(Default)]
pub(super) struct State {
    pub(super) observed: Option<Observed>,
    /// What this instance knows of the object (from the namespace watch or its own requests), and
    /// the epoch of the namespace watch it learned it in (0: the watch was not synced).
    pub(super) known: Option<(View, u64)>,
    /// The last delivery of the namespace watch folded in: the watch's id, and the delivery's
    /// sequence number in it.
    pub(super) folded: (u64, u64),
    /// The `acquireTime` of claims sent whose answer never arrived.
    pub(super) unanswered: Vec<MicroTime>,
    /// The `resourceVersion` of this instance's latest write in the current tenure.
    pub(super) tenure_version: Option<String>,
    /// The highest fencing token of the tenures this instance has had: a record handed over to
    /// this owner is taken up only when it is newer (see the `handover` module).
    pub(super) highest_token: Option<u64>,
    /// The member object a bound record of another holder lives by, as this instance read it:
    /// its name, `resourceVersion`, and when this instance first read that version (the
    /// member's expiry clock, when no namespace watch times it).
    pub(super) member_seen: Option<(String, String, Instant)>,
}

/// What the backend last saw of its object, and when it first saw that version.
#[derive(Debug, Clone)]
pub(super) struct Observed {
    pub(super) version: String,
    pub(super) first_seen: Instant,
    pub(super) holder: Option<String>,
    /// The preferred next holder a release named, while the object is free.
    pub(super) preferred: Option<String>,
    pub(super) duration: Duration,
    /// Whether the version is a bound record (its member record decides when it is free).
    pub(super) bound: bool,
}

impl Observed {
    pub(super) fn expires_at(&self) -> Instant {
        self.first_seen + self.duration
    }

    /// Whether `owner` must leave this version of the object to somebody else (its holder, or
    /// the preferred holder a release named) until [`expires_at`](Self::expires_at).
    pub(super) fn blocks(&self, owner: &str) -> bool {
        match (&self.holder, &self.preferred) {
            (Some(holder), _) => holder != owner,
            (None, Some(preferred)) => preferred != owner,
            (None, None) => false,
        }
    }
}

impl KubernetesBackend {
    /// Records what a request returned of the object.
    pub(super) fn observe(&self, lease: &LeaseObject) {
        self.observe_shared(Arc::new(lease.clone()));
    }

    /// Records what a request returned of the object, keeping this copy (a tenure shares it).
    pub(super) fn observe_shared(&self, lease: Arc<LeaseObject>) -> Arc<LeaseObject> {
        let epoch = self.synced_epoch();
        let now = Instant::now();
        self.learn(View::Present(Arc::clone(&lease)), now, epoch);
        if let Some(subscription) = self.subscribed() {
            subscription.publish(Arc::clone(&lease), now);
        }
        lease
    }

    /// Records what is known of the object, unless it is older than what is known already; the
    /// expiry clock of a version starts when this instance first saw it (`at`).
    pub(super) fn learn(&self, view: View, at: Instant, epoch: u64) {
        // The namespace watch of this lease's hub may have received this version before this
        // lease did (a lease that never waited for its object learns it by a read): its expiry
        // clock starts when this process first received it, whichever way.
        let at = view
            .version()
            .and_then(|v| self.hub.first_seen(&self.namespace, &self.object, v))
            .map_or(at, |seen| seen.min(at));
        let mut state = self.lock();
        if let (Some(new), Some(known)) = (
            view.version(),
            state.known.as_ref().and_then(|(v, _)| v.version()),
        ) {
            if older(new, known) {
                return;
            }
        }
        if let View::Present(lease) = &view {
            if let Some(version) = lease.metadata.resource_version.as_deref() {
                if state.observed.as_ref().is_none_or(|o| o.version != version) {
                    state.observed = Some(Observed {
                        version: version.to_owned(),
                        first_seen: at,
                        holder: holder_of(lease).map(str::to_owned),
                        preferred: preferred_of(lease).map(str::to_owned),
                        duration: duration_of(lease),
                        bound: binding_of(lease).is_some(),
                    });
                }
            }
        }
        state.known = Some((view, epoch));
    }

    pub(super) fn observed(&self) -> Option<Observed> {
        self.lock().observed.clone()
    }

    /// The namespace watch subscription of this instance: made at first use, and made again
    /// when the watch it had ended (the runtime it ran on shut down), which starts a new watch
    /// on the runtime this runs on. `None` when no subscription can be made (no runtime).
    pub(super) fn subscription(&self) -> Option<Arc<Subscription>> {
        let mut slot = watch::lock(&self.subscription);
        if let Some(subscription) = slot.as_ref().filter(|s| !s.ended()) {
            return Some(Arc::clone(subscription));
        }
        match self.hub.subscribe(&self.namespace, &self.object) {
            Ok(subscription) => {
                if slot.is_some() {
                    tracing::debug!(object = %self.object, namespace = %self.namespace, "the lease's namespace watch ended with the runtime it ran on; watching the namespace again");
                }
                let subscription = Arc::new(subscription);
                *slot = Some(Arc::clone(&subscription));
                Some(subscription)
            }
            Err(error) => {
                tracing::debug!(%error, object = %self.object, "cannot watch the namespace; reading the object before each attempt");
                None
            }
        }
    }

    /// The subscription this instance has, if any, without making one (it may have ended).
    pub(super) fn subscribed(&self) -> Option<Arc<Subscription>> {
        watch::lock(&self.subscription).clone()
    }

    /// The epoch of the namespace watch if it is synced, else 0 (also when it ended).
    pub(super) fn synced_epoch(&self) -> u64 {
        self.subscribed()
            .map(|s| s.status())
            .filter(|s| s.synced)
            .map_or(0, |s| s.epoch)
    }

    /// Folds the latest delivery of `subscription`'s watch for the object into what this
    /// instance knows.
    pub(super) fn fold(&self, subscription: &Subscription) {
        let snapshot = subscription.latest();
        {
            let mut state = self.lock();
            // Sequence numbers count per watch: after subscribing again, a new watch's first
            // deliveries are folded whatever the old one's count reached.
            if snapshot.watch == state.folded.0 && snapshot.seq <= state.folded.1 {
                return;
            }
            state.folded = (snapshot.watch, snapshot.seq);
        }
        let Some(view) = snapshot.view else {
            return;
        };
        if let View::Present(lease) = &view {
            // Not this lease's object (a name collision): the next read reports it.
            if self.check_owner_name(lease).is_err() {
                return;
            }
        }
        let status = subscription.status();
        let epoch = if status.synced && status.epoch == snapshot.epoch {
            snapshot.epoch
        } else {
            0
        };
        self.learn(view, snapshot.at, epoch);
    }

    /// Folds the latest delivery of `subscription`, then brings what this instance knows of the
    /// object up to date with the synced namespace watch where it can without a request; whether
    /// the watch received a change this instance missed (its next attempt must read the object).
    ///
    /// What it knows is not current when it came from one of its own requests outside the watch's
    /// epoch, typically the read of an attempt made before it first waited (and subscribed): the
    /// watch delivers to a subscription only what it receives after the subscription was made, so
    /// a change in between (the holder's release, just before the contender starts waiting)
    /// reached this instance no other way, and its wait slept until the retry delay (issue 24).
    /// The version the watch received last of the object (its index keeps it) tells:
    ///
    /// * the same version: nothing changed since, and the subscription gets any later change:
    ///   what this instance knows is current, in the watch's epoch;
    /// * a newer one: a change this instance missed (`true`);
    /// * none, or an older one: the watch has not received this version yet, and delivers it
    ///   (or a later one) when it does.
    pub(super) fn catch_up(&self, subscription: &Subscription) -> bool {
        self.fold(subscription);
        let Some((epoch, seen)) = subscription.seen_version() else {
            return false;
        };
        let mut state = self.lock();
        let Some((view, known_epoch)) = state.known.as_mut() else {
            return false;
        };
        if *known_epoch == epoch {
            return false;
        }
        let (Some(known), Some(seen)) = (view.version(), seen.as_deref()) else {
            return false;
        };
        if known == seen {
            if matches!(view, View::Present(_)) {
                *known_epoch = epoch;
            }
            return false;
        }
        newer(seen, known)
    }

    /// What this instance knows of the object, if it is current: learned in the epoch of the
    /// namespace watch that still runs, synced (see the `watch` module). Never subscribes: an
    /// attempt does not start a watch (its listing would compete with the attempt's own bounded
    /// requests); waiting and holding do.
    pub(super) fn current_view(&self) -> Option<View> {
        let subscription = self.subscribed()?;
        self.fold(&subscription);
        let status = subscription.status();
        if !status.synced {
            return None;
        }
        match &self.lock().known {
            Some((view, epoch)) if *epoch == status.epoch && *epoch > 0 => Some(view.clone()),
            _ => None,
        }
    }

    /// Whether `view`, a delivery of the namespace watch, shows the tenure with `token` lost. A
    /// view that shows a loss but may be older than the tenure's last write (versions that are not
    /// numbers, a listing) is confirmed by a read; one older than that write is ignored.
    pub(super) async fn judge(
        &self,
        view: &View,
        settings: &LeaseSettings,
        token: FencingToken,
    ) -> Result<Option<LostReason>, KubernetesError> {
        let reason = match view {
            View::Present(lease) => match Self::loss_in(lease, settings.owner(), token) {
                None => return Ok(None),
                Some(reason) => reason,
            },
            View::Absent { .. } => LostReason::Deleted,
        };
        let ours = self.lock().tenure_version.clone();
        if let (Some(seen), Some(ours)) = (view.version(), ours.as_deref()) {
            if newer(seen, ours) {
                return Ok(Some(reason));
            }
            if seen == ours || older(seen, ours) {
                return Ok(None);
            }
        }
        let api = self.api()?;
        Ok(self.tenure_check(&api, settings, token).await?.err())
    }

    /// Whether the namespace watch this lease learns from is listed and running; until it is, a
    /// waiting attempt reads the object first.
    pub fn watching(&self) -> bool {
        self.synced_epoch() > 0
    }

    /// The `resourceVersion` of the object in the view this lease decides its next attempt from
    /// without a read: what its running, listed namespace watch delivered (or a later answer to
    /// one of its own requests). `None` when it has no such view (no watch yet, not listed, or the
    /// watch ended): the next attempt reads the object. Leases of one object whose versions differ
    /// see different states of it (one of them has not received the latest change yet).
    pub fn current_version(&self) -> Option<String> {
        self.current_view()
            .and_then(|view| view.version().map(str::to_owned))
    }

    /// The requests of the namespace watch this lease uses (shared with every lease of its
    /// session in the namespace).
    pub fn watch_stats(&self) -> KubernetesWatchStats {
        self.hub.counters.stats()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::Client;

    use super::*;
    use crate::backend::{AcquireAttempt, LeaseBackend};
    use crate::kubernetes::record::tests::object;
    use crate::kubernetes::WATCH_FLOOR;
    use std::sync::atomic::Ordering;

    #[tokio::test]
    async fn observation_clock_restarts_only_on_a_new_version() {
        let backend = KubernetesBackend::with_client_for_tests("n");
        let mut lease = object(Some("b"), Some(1));
        lease.spec.as_mut().unwrap().lease_duration_seconds = Some(3);
        backend.observe(&lease);
        let first = backend.observed().unwrap();
        assert_eq!(first.duration, Duration::from_secs(3));
        tokio::time::sleep(Duration::from_millis(20)).await;
        backend.observe(&lease);
        assert_eq!(
            backend.observed().unwrap().first_seen,
            first.first_seen,
            "same version"
        );
        lease.metadata.resource_version = Some("8".into());
        backend.observe(&lease);
        assert!(
            backend.observed().unwrap().first_seen > first.first_seen,
            "new version"
        );
    }

    /// How a fake API server answers watch requests.
    #[derive(Clone, Copy)]
    enum WatchAnswer {
        /// The headers of a watch, then nothing on that connection (as a half-open one would).
        Silent,
        /// An empty watch stream, ended after this long (a proxy that cuts long responses).
        EndAfter(Duration),
    }

    /// The body of a fake answer: `data`, then the end after `end` (never: `forever`).
    struct FakeBody {
        data: Option<bytes::Bytes>,
        end: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
        forever: bool,
    }

    impl http_body::Body for FakeBody {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            use std::future::Future;
            if let Some(data) = self.data.take() {
                return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data))));
            }
            if self.forever {
                return std::task::Poll::Pending;
            }
            match self.end.as_mut() {
                None => std::task::Poll::Ready(None),
                Some(sleep) => sleep.as_mut().poll(cx).map(|()| None),
            }
        }
    }

    /// A backend of lease `n` in namespace `ns` of a fake API server (a service, no sockets, so
    /// that the paused clock rules everything): it answers a list of leases with lease `n` held
    /// by `a` (token 1) at version 41, and a watch as `answer` says; it reports each request line
    /// with the instant it arrived.
    fn fake_backend(
        answer: WatchAnswer,
    ) -> (
        KubernetesBackend,
        tokio::sync::mpsc::UnboundedReceiver<(Instant, String)>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let line = format!("{} {}", request.method(), request.uri());
            let _ = tx.send((Instant::now(), line.clone()));
            async move {
                let body = if line.contains("watch=true") {
                    FakeBody {
                        data: None,
                        forever: matches!(answer, WatchAnswer::Silent),
                        end: match answer {
                            WatchAnswer::Silent => None,
                            WatchAnswer::EndAfter(after) => {
                                Some(Box::pin(tokio::time::sleep(after)))
                            }
                        },
                    }
                } else {
                    FakeBody {
                        forever: false,
                        end: None,
                        data: Some(bytes::Bytes::from_static(br#"{"kind":"LeaseList","apiVersion":"coordination.k8s.io/v1","metadata":{"resourceVersion":"41"},"items":[{"metadata":{"name":"n","namespace":"ns","resourceVersion":"41"},"spec":{"holderIdentity":"a","leaseDurationSeconds":15,"leaseTransitions":1}}]}"#)),
                    }
                };
                Ok::<_, std::convert::Infallible>(http::Response::new(body))
            }
        });
        let client = Client::new(service, "ns");
        let backend = KubernetesBackend::with_client("n", client, "ns").unwrap();
        (backend, rx)
    }

    /// The watch requests among `requests` received within `within`.
    async fn watch_requests(
        requests: &mut tokio::sync::mpsc::UnboundedReceiver<(Instant, String)>,
        count: usize,
        within: Duration,
    ) -> Vec<(Instant, String)> {
        let mut seen = Vec::new();
        tokio::time::timeout(within, async {
            while seen.len() < count {
                let request = requests.recv().await.unwrap();
                if request.1.contains("watch=true") {
                    seen.push(request);
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{count} watch requests within {within:?}: {seen:?}"));
        seen
    }

    /// The namespace watch on a connection that went half-open (headers, then nothing, and no
    /// read timeout in the client) does not hang forever: it is replaced once the server should
    /// have ended it, from the same version, and the tenure is still watched.
    #[tokio::test(start_paused = true)]
    async fn a_silent_watch_is_replaced_after_its_server_side_timeout() {
        let (backend, mut requests) = fake_backend(WatchAnswer::Silent);
        backend.lock().tenure_version = Some("41".into());
        let settings = LeaseSettings::new("n", "a").unwrap();
        let watch = backend.watch_lost(&settings, FencingToken::new(1));
        let mut watch = std::pin::pin!(watch);
        let server_timeout = Duration::from_secs(u64::from(watch::WATCH_TIMEOUT_SECS));
        let seen = tokio::select! {
            done = &mut watch => panic!("the watch ended: {done:?}"),
            seen = watch_requests(&mut requests, 3, server_timeout * 3) => seen,
        };
        for (_, line) in &seen {
            assert!(line.starts_with("GET "), "{line}");
            assert!(line.contains("watch=true"), "{line}");
            assert!(line.contains("resourceVersion=41"), "{line}");
        }
        for pair in seen.windows(2) {
            let gap = pair[1].0 - pair[0].0;
            assert!(
                gap >= server_timeout,
                "re-opened after {gap:?}, before the server could have ended it"
            );
            assert!(gap <= server_timeout + Duration::from_secs(6), "{gap:?}");
        }
        assert!(backend.watch_stats().watch_requests >= 3);
        assert_eq!(backend.watch_stats().listings, 1, "no relist");
    }

    /// A contender whose namespace watch lags (here: its listing shows the member object at an
    /// older incarnation, as a watch that resumed after a break shows it until the changes it
    /// missed arrive) must not count a bound shard free: the member object as it is now (a read)
    /// holds the incarnation the shard is bound to, so the shard is held, and no claim is sent.
    /// (The chaos run that found it: a node resumed from a blackhole claimed three shards of a
    /// live node.)
    #[tokio::test(start_paused = true)]
    async fn a_bound_record_is_not_freed_by_a_lagging_view_of_its_member() {
        let claims = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (claims2, reads2) = (Arc::clone(&claims), Arc::clone(&reads));
        let max = i32::MAX;
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let line = format!("{} {}", request.method(), request.uri());
            let (claims, reads) = (Arc::clone(&claims2), Arc::clone(&reads2));
            async move {
                let body = |json: String| FakeBody {
                    data: Some(bytes::Bytes::from(json)),
                    forever: false,
                    end: None,
                };
                let answer = if line.contains("watch=true") {
                    FakeBody {
                        data: None,
                        forever: true,
                        end: None,
                    }
                } else if line.starts_with("GET ") && line.contains("/leases/g.member.a") {
                    // The member as it is now: its fourth tenure, the one the shard is bound to.
                    reads.fetch_add(1, Ordering::SeqCst);
                    body(r#"{"metadata":{"name":"g.member.a","namespace":"ns","uid":"u1","resourceVersion":"60"},"spec":{"holderIdentity":"a","leaseDurationSeconds":15,"leaseTransitions":4}}"#.to_owned())
                } else if line.starts_with("GET ") {
                    // The listing: the shard bound to the member's fourth tenure, and the member
                    // as the lagging watch has it, at its third.
                    body(format!(
                        r#"{{"kind":"LeaseList","apiVersion":"coordination.k8s.io/v1","metadata":{{"resourceVersion":"61"}},"items":[{{"metadata":{{"name":"g.0","namespace":"ns","resourceVersion":"61","annotations":{{"actix-coordination/bound-to":"g.member.a","actix-coordination/bound-incarnation":"u1/4"}}}},"spec":{{"holderIdentity":"a","leaseDurationSeconds":{max},"leaseTransitions":7}}}},{{"metadata":{{"name":"g.member.a","namespace":"ns","uid":"u1","resourceVersion":"40"}},"spec":{{"holderIdentity":"a","leaseDurationSeconds":15,"leaseTransitions":3}}}}]}}"#
                    ))
                } else {
                    claims.fetch_add(1, Ordering::SeqCst);
                    body(
                        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":500}"#
                            .to_owned(),
                    )
                };
                Ok::<_, std::convert::Infallible>(http::Response::new(answer))
            }
        });
        let client = Client::new(service, "ns");
        let backend = KubernetesBackend::with_client("g.0", client, "ns").unwrap();
        listed(&backend).await;
        let settings = LeaseSettings::new("g.0", "b").unwrap();
        let attempt = backend.try_acquire(&settings).await.unwrap();
        assert!(
            matches!(&attempt, AcquireAttempt::HeldByOther { holder: Some(h), .. } if h == "a"),
            "{attempt:?}"
        );
        assert_eq!(claims.load(Ordering::SeqCst), 0, "no claim was sent");
        assert_eq!(reads.load(Ordering::SeqCst), 1, "the member was read");
    }

    /// Subscribes (on the runtime this runs on, when the backend's watch ended or there is
    /// none) and waits until the backend's namespace watch is listed.
    async fn listed(backend: &KubernetesBackend) {
        backend.subscription().expect("a runtime");
        tokio::time::timeout(Duration::from_secs(30), async {
            while !backend.watching() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the namespace watch was listed");
    }

    /// A namespace watch whose runtime shut down is not current any more, from that moment on:
    /// the lease's view of the object is no longer taken for the object now, and its next use
    /// subscribes again, to a new watch on the runtime that uses it.
    #[tokio::test]
    async fn a_watch_whose_runtime_stopped_is_not_current() {
        let (backend, _requests) = fake_backend(WatchAnswer::Silent);
        // Used first on a runtime of its own (the fake client's requests run on this one).
        let backend = tokio::task::spawn_blocking(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(listed(&backend));
            assert!(backend.current_view().is_some(), "listed: current");
            drop(runtime);
            backend
        })
        .await
        .unwrap();
        let backend = &backend;
        assert!(!backend.watching(), "the watch ended with its runtime");
        let ended = backend.subscribed().expect("the old subscription");
        assert!(ended.ended());
        // Judged without subscribing again: nothing the ended watch delivered is current.
        assert_eq!(backend.synced_epoch(), 0);
        listed(backend).await;
        let again = backend.subscribed().unwrap();
        assert!(!Arc::ptr_eq(&ended, &again), "a new subscription");
        assert!(backend.current_view().is_some(), "the new watch's view");
        assert_eq!(backend.watch_stats().listings, 2);
    }

    /// A watch stream that the server (or a proxy) ends every 100 ms is re-opened at most once
    /// per floor delay, not in a tight loop; the watch stays synced meanwhile.
    #[tokio::test(start_paused = true)]
    async fn a_watch_ended_early_is_reopened_after_the_floor_delay() {
        let (backend, mut requests) =
            fake_backend(WatchAnswer::EndAfter(Duration::from_millis(100)));
        backend.lock().tenure_version = Some("41".into());
        let settings = LeaseSettings::new("n", "a").unwrap();
        let watch = backend.watch_lost(&settings, FencingToken::new(1));
        let mut watch = std::pin::pin!(watch);
        const REOPENS: usize = 10;
        let seen = tokio::select! {
            done = &mut watch => panic!("the watch ended: {done:?}"),
            seen = watch_requests(&mut requests, REOPENS + 1, WATCH_FLOOR * (REOPENS as u32 + 5)) => seen,
        };
        for pair in seen.windows(2) {
            let gap = pair[1].0 - pair[0].0;
            assert!(
                gap >= WATCH_FLOOR,
                "re-opened {gap:?} after the previous one"
            );
        }
        let stats = backend.watch_stats();
        assert!(stats.floored >= REOPENS as u64, "{stats:?}");
        assert_eq!(stats.listings, 1, "no relist: {stats:?}");
        assert!(backend.watching(), "an early end is not a failure");
    }
}
