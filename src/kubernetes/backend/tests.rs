//! Unit tests of the Kubernetes backend with a fake API server.

use std::sync::atomic::AtomicUsize;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

/// A lease object as the API server answers it.
fn object(name: &str, holder: Option<&str>, version: &str) -> LeaseObject {
    LeaseObject {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(15),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        }),
    }
}

/// An API server that answers the first `refusals` writes with `429 Too Many Requests` and
/// then takes them; counts the writes.
fn busy_server(refusals: usize, writes: Arc<AtomicUsize>) -> Client {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let n = writes.fetch_add(1, Ordering::SeqCst);
        async move {
            assert_eq!(request.method(), http::Method::PUT, "a release only writes");
            let (status, body) = if n < refusals {
                let status = serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "message": "Too many requests, please try again later.",
                    "reason": "TooManyRequests", "code": 429
                });
                (429, serde_json::to_vec(&status).unwrap())
            } else {
                let released = object("held", None, "2");
                (200, serde_json::to_vec(&released).unwrap())
            };
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body))
                    .unwrap(),
            )
        }
    });
    Client::new(service, "ns")
}

/// An API server with one Lease object that applies every write whose `resourceVersion`
/// matches; the answer to the first write comes only after `late` (the client has given up
/// by then); counts the writes.
fn late_server(late: Duration, writes: Arc<AtomicUsize>) -> Client {
    let stored = Arc::new(std::sync::Mutex::new(object("held", None, "5")));
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (stored, writes) = (Arc::clone(&stored), Arc::clone(&writes));
        async move {
            let method = request.method().clone();
            let body = request.into_body().collect_bytes().await.unwrap();
            let (status, answer, delay) = if method == http::Method::PUT {
                let n = writes.fetch_add(1, Ordering::SeqCst);
                let mut written: LeaseObject = serde_json::from_slice(&body).unwrap();
                let mut stored = stored.lock().unwrap();
                let current = stored.metadata.resource_version.clone().unwrap();
                if written.metadata.resource_version.as_deref() == Some(current.as_str()) {
                    let next = current.parse::<u64>().unwrap() + 1;
                    written.metadata.resource_version = Some(next.to_string());
                    *stored = written;
                    let delay = if n == 0 { late } else { Duration::ZERO };
                    (200, serde_json::to_vec(&*stored).unwrap(), delay)
                } else {
                    let conflict = serde_json::json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "message": "conflict", "reason": "Conflict",
                        "code": 409
                    });
                    (409, serde_json::to_vec(&conflict).unwrap(), Duration::ZERO)
                }
            } else {
                let stored = stored.lock().unwrap();
                (200, serde_json::to_vec(&*stored).unwrap(), Duration::ZERO)
            };
            tokio::time::sleep(delay).await;
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(answer))
                    .unwrap(),
            )
        }
    });
    Client::new(service, "ns")
}

/// A claim the API server applied but whose answer came too late (the attempt was given up
/// at its bound, as a loaded API server made 39 claims of 4 nodes starting at once do) costs
/// no TTL: the record names this owner, so the next attempt claims it at once, under the
/// next token, instead of waiting for the record it wrote itself to expire.
#[tokio::test(start_paused = true)]
async fn a_claim_whose_answer_came_too_late_is_claimed_again_at_once() {
    let writes = Arc::new(AtomicUsize::new(0));
    let server = late_server(Duration::from_secs(10), Arc::clone(&writes));
    let backend = KubernetesBackend::with_client("held", server, "ns").unwrap();
    let settings = LeaseSettings::new("held", "a").unwrap();
    let first = tokio::time::timeout(Duration::from_secs(1), backend.try_acquire(&settings));
    assert!(first.await.is_err(), "the first claim's answer is late");
    assert_eq!(writes.load(Ordering::SeqCst), 1, "the claim was applied");
    let started = Instant::now();
    match backend.try_acquire(&settings).await.unwrap() {
        AcquireAttempt::Acquired { token, .. } => {
            assert_eq!(token, FencingToken::new(5), "the lost claim's 4, then 5")
        }
        other => panic!("the record the lost claim wrote blocked the next one: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(writes.load(Ordering::SeqCst), 2);
}

fn tenure() -> KubernetesTenure {
    KubernetesTenure {
        lease: Arc::new(object("held", Some("a"), "1")),
        transitions: 3,
        unconfirmed: Vec::new(),
    }
}

/// A release the API server refuses for now (`429`, as 8 nodes claiming 1,024 shards at once
/// met 43 times) is tried again after a pause, not given up on (which left the shard running
/// nowhere until its TTL).
#[tokio::test(start_paused = true)]
async fn a_release_refused_with_429_is_tried_again() {
    let writes = Arc::new(AtomicUsize::new(0));
    let backend =
        KubernetesBackend::with_client("held", busy_server(3, Arc::clone(&writes)), "ns").unwrap();
    let settings = LeaseSettings::new("held", "a").unwrap();
    let outcome = backend
        .release_inner(&settings, tenure(), Giving::Release)
        .await
        .unwrap();
    assert_eq!(outcome, ReleaseOutcome::Released);
    assert_eq!(
        writes.load(Ordering::SeqCst),
        4,
        "three refusals, then the release"
    );
}

/// The tries stop while they leave half the operation timeout: a server that keeps refusing
/// gets a bounded number of writes, and the release reports the refusal.
#[tokio::test(start_paused = true)]
async fn a_release_refused_for_good_reports_the_refusal() {
    let writes = Arc::new(AtomicUsize::new(0));
    let backend =
        KubernetesBackend::with_client("held", busy_server(usize::MAX, Arc::clone(&writes)), "ns")
            .unwrap();
    let settings = LeaseSettings::builder("held", "a")
        .operation_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let started = Instant::now();
    let error = backend
        .release_inner(&settings, tenure(), Giving::Release)
        .await
        .unwrap_err();
    assert_eq!(error.status_code(), Some(429), "{error}");
    assert!(started.elapsed() < Duration::from_secs(1));
    // 25 + 50 + 100 + 200 + 400 ms of pauses fit in 1 s: six writes.
    assert_eq!(writes.load(Ordering::SeqCst), 6);
}
