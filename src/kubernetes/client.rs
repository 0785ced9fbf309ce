//! The HTTP client of the Kubernetes backend: kube's default stack, but with `TCP_NODELAY` and
//! HTTP/2.
//!
//! kube's `Client::try_from(Config)` leaves Nagle's algorithm on. A `PUT` is written as a header
//! segment and a body segment; with Nagle the body waits for the ACK of the headers, which the API
//! server's kernel delays by up to 40 ms (delayed ACK). Every lease write then costs about 40 ms
//! more than its round trip, and a graceful handoff, two writes, about 80 ms more (measured on
//! loopback: 95 ms median handoff with Nagle, under 10 ms without; BENCHMARKS.md). This module
//! builds the same stack as kube (base URI, authentication with token-file refresh, connect
//! timeout, rustls with the config's CA) on a connector with `TCP_NODELAY` set.
//!
//! kube's stack also speaks HTTP/1.1 only, so every request in flight (and every open watch)
//! needs a TCP connection of its own. This one offers `h2` by ALPN, with HTTP/1.1 as the
//! fallback: against an API server (which speaks HTTP/2 over TLS) all requests and watches of a
//! client share one connection, kept alive with HTTP/2 pings
//! (`http2_is_negotiated_with_the_real_apiserver` in `tests/kubernetes.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::Client;
use tokio::runtime::Handle;
use tower::{BoxError, ServiceBuilder};

use super::KubernetesError;
use crate::metrics;

/// An HTTP/2 ping is sent on a connection after this long without a frame from the server ...
const HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// ... and the connection is closed (its requests fail, the next ones open a new one) when the
/// ping is not answered within this: a half-open shared connection would otherwise stall every
/// lease of the client until the kernel gives up on it.
const HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A kube [`Client`] for `config`, like `Client::try_from(config)` but with `TCP_NODELAY` on its
/// connections and HTTP/2 offered (ALPN `h2`, falling back to HTTP/1.1): use it for
/// [`KubernetesLease::with_client`](crate::KubernetesLease::with_client) (e.g. with a
/// kubeconfig), or every lease write waits up to 40 ms for a delayed ACK. A
/// [`KubernetesSession`](crate::KubernetesSession) builds the same stack.
///
/// Set `config.default_retry = false` first if you share the client with leases: the lease
/// decides about retries itself. `config.read_timeout` and `config.write_timeout` are not applied
/// (every lease call is bounded by the lease's operation timeout; watches have their own bound).
///
/// Call it inside a Tokio runtime: the client runs a background task (kube's request buffer)
/// and its connections on the runtime it was built on.
///
/// # Errors
///
/// [`KubernetesError::BuildClient`] when the TLS or authentication settings of `config` cannot be
/// loaded (an unreadable CA or token file, a bad certificate).
pub fn kubernetes_client(config: &kube::Config) -> Result<Client, KubernetesError> {
    let lanes = Lanes::new(config, None, Arc::default())
        .map_err(|source| KubernetesError::BuildClient { source })?;
    stack(config, lanes).map_err(|source| KubernetesError::BuildClient { source })
}

/// What a session's HTTP stack counts (see [`KubernetesSessionStats`](super::KubernetesSessionStats)).
#[derive(Default)]
pub(super) struct HttpCounters {
    pub(super) connections: AtomicU64,
    pub(super) http2_responses: AtomicU64,
    pub(super) http1_responses: AtomicU64,
}

/// A client whose connections and request futures all run on `runtime` (the sessions' own
/// thread), counting into `counters`. Built inside `runtime` (kube's request buffer spawns its
/// worker where the client is built).
pub(super) fn session_client(
    config: &kube::Config,
    runtime: &Handle,
    counters: Arc<HttpCounters>,
) -> Result<Client, KubernetesError> {
    let _entered = runtime.enter();
    let lanes = Lanes::new(config, Some(runtime.clone()), counters)
        .map_err(|source| KubernetesError::BuildClient { source })?;
    stack(config, lanes).map_err(|source| KubernetesError::BuildClient { source })
}

type HttpsConnector = hyper_rustls::HttpsConnector<Counting<HttpConnector>>;
type HyperClient = hyper_util::client::legacy::Client<HttpsConnector, kube::client::Body>;

/// A `TCP_NODELAY` connector with rustls offering `h2` and `http/1.1`, counting its connections.
fn connector(
    config: &kube::Config,
    counters: Arc<HttpCounters>,
) -> Result<HttpsConnector, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let http = Counting {
        inner: http,
        counters,
    };
    // kube's own connector builder enables HTTP/1.1 only; build it from kube's TLS configuration
    // (the CA, re-read about once a minute when it is a file) with both protocols instead.
    let tls = config.rustls_client_config()?;
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http))
}

/// hyper's client (one connection pool) on `connector`, with HTTP/2 keep-alive pings.
fn hyper_client(connector: HttpsConnector) -> HyperClient {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(HTTP2_KEEP_ALIVE_INTERVAL)
        .http2_keep_alive_timeout(HTTP2_KEEP_ALIVE_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector)
}

/// kube's layers (base URI, authentication with token-file refresh, extra headers) on `http`.
fn stack<S, B>(config: &kube::Config, http: S) -> Result<Client, kube::Error>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(|error: S::Error| -> BoxError { error.into() })
        .service(http);
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// The TCP connector, counting the connections it opened.
#[derive(Clone)]
struct Counting<C> {
    inner: C,
    counters: Arc<HttpCounters>,
}

impl<C> tower::Service<http::Uri> for Counting<C>
where
    C: tower::Service<http::Uri>,
    C::Future: Send + 'static,
    C::Response: 'static,
    C::Error: 'static,
{
    type Response = C::Response;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, C::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let counters = self.counters.clone();
        Box::pin(async move {
            let connected = connecting.await?;
            counters.connections.fetch_add(1, Ordering::Relaxed);
            Ok(connected)
        })
    }
}

/// Requests one connection carries at once: below kube-apiserver's default limit of 250
/// concurrent HTTP/2 streams per connection, beyond which a request waits for a stream (a renewal
/// stuck behind others, for example a burst of claims). A client with more requests in flight
/// opens another connection per 200 (`a_connection_carries_at_most_200_requests`).
pub(super) const STREAMS_PER_CONNECTION: usize = 200;

/// The connections one client keeps open at most (besides ones retired after a failure, which
/// close once their requests are done): with more than `2 × STREAMS_PER_CONNECTION` requests in
/// flight, a request waits for a stream on the least busy one.
pub(super) const MAX_CONNECTIONS: usize = 2;

/// The HTTP service under kube's layers: requests go to the first *lane* (a hyper client, with
/// its own pool: one connection over HTTP/2) that carries fewer than [`STREAMS_PER_CONNECTION`]
/// requests (a request counts until its response body is dropped, so an open watch counts for
/// its whole life); a new lane is added when all are full.
///
/// With a `runtime` (a session), every request (its connect, TLS handshake and the connection's
/// task) runs on it, whichever runtime the caller is on: a session's connections then do not
/// depend on the runtime or actix arbiter that happened to use the session first. The response
/// body is read by the caller, from the connection task through a channel.
///
/// A request that fails, or that its caller gives up before the answer (an operation timeout;
/// not a watch, whose caller may simply have lost interest), retires its lane: later requests go to a new lane, on a new connection, and the old one closes
/// once its last request is done. That is what HTTP/1.1 did for a connection whose answer was
/// lost; on a shared HTTP/2 connection, a lost answer usually means the connection is bad, and
/// its half-read state must not be reused (`backend_steps_handle_lost_answers_and_conflicts`).
///
/// Until a lane's first answer, its requests go out one at a time: hyper learns that a server
/// speaks HTTP/2 only once a connection is up, so 200 leases acquiring at once would otherwise
/// open 200 connections (and TLS handshakes) and keep one.
#[derive(Clone)]
struct Lanes {
    shared: Arc<LanesShared>,
}

struct LanesShared {
    connector: HttpsConnector,
    runtime: Option<Handle>,
    counters: Arc<HttpCounters>,
    lanes: std::sync::Mutex<Vec<Arc<Lane>>>,
}

struct Lane {
    client: HyperClient,
    /// Requests sent on this lane whose response (body) is still alive.
    in_flight: AtomicUsize,
    /// A request was answered on this lane.
    warm: std::sync::atomic::AtomicBool,
    /// Held by the one request in flight while the lane is not warm.
    cold: tokio::sync::Mutex<()>,
    /// A request failed or was given up: no new request goes to this lane.
    retired: std::sync::atomic::AtomicBool,
}

/// Retires its lane when dropped before [`Unanswered::answered`].
struct Unanswered<'a>(Option<&'a Lane>);

impl Unanswered<'_> {
    fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(lane) = self.0 {
            lane.retired.store(true, Ordering::Release);
        }
    }
}

/// A request counted on its lane until dropped.
struct InFlight(Arc<Lane>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Lanes {
    fn new(
        config: &kube::Config,
        runtime: Option<Handle>,
        counters: Arc<HttpCounters>,
    ) -> Result<Self, kube::Error> {
        Ok(Self {
            shared: Arc::new(LanesShared {
                connector: connector(config, Arc::clone(&counters))?,
                runtime,
                counters,
                lanes: std::sync::Mutex::default(),
            }),
        })
    }

    /// The first lane with room, counting the request on it.
    fn pick(&self) -> InFlight {
        let mut lanes = self.shared.lanes.lock().unwrap_or_else(|p| p.into_inner());
        lanes.retain(|l| !l.retired.load(Ordering::Acquire));
        let lane = match lanes
            .iter()
            .find(|l| l.in_flight.load(Ordering::Acquire) < STREAMS_PER_CONNECTION)
        {
            Some(lane) => Arc::clone(lane),
            // Every connection is full and there are as many as a client keeps: the least busy
            // one takes the request, which waits there for a stream (HTTP/2 queues it).
            None if lanes.len() >= MAX_CONNECTIONS => Arc::clone(
                lanes
                    .iter()
                    .min_by_key(|l| l.in_flight.load(Ordering::Acquire))
                    .expect("MAX_CONNECTIONS > 0"),
            ),
            None => {
                let lane = Arc::new(Lane {
                    client: hyper_client(self.shared.connector.clone()),
                    in_flight: AtomicUsize::new(0),
                    warm: std::sync::atomic::AtomicBool::new(false),
                    cold: tokio::sync::Mutex::new(()),
                    retired: std::sync::atomic::AtomicBool::new(false),
                });
                lanes.push(Arc::clone(&lane));
                lane
            }
        };
        lane.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(lane)
    }
}

impl tower::Service<http::Request<kube::client::Body>> for Lanes {
    type Response = http::Response<Tracked>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // hyper's legacy client is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let in_flight = self.pick();
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let lane = Arc::clone(&in_flight.0);
            let _cold = if lane.warm.load(Ordering::Acquire) {
                None
            } else {
                let guard = lane.cold.lock().await;
                // Answered while this one waited: go on without the gate.
                (!lane.warm.load(Ordering::Acquire)).then_some(guard)
            };
            // A watch given up before its answer is a caller no longer interested (a tenure that
            // ended while its watch was being opened), not a sign of a bad connection.
            let is_watch = request
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|p| p == "watch=true"));
            let verb = verb(request.method(), request.uri(), is_watch);
            let unanswered = Unanswered((!is_watch).then_some(&*lane));
            let sending = lane.client.request(request);
            let sent = match &shared.runtime {
                None => sending.await.map_err(BoxError::from),
                Some(runtime) => {
                    let task = runtime.spawn(sending);
                    // A caller that gives up (an operation timeout) cancels the request with it.
                    let _abort = AbortOnDrop(task.abort_handle());
                    match task.await {
                        Ok(sent) => sent.map_err(BoxError::from),
                        Err(error) => Err(BoxError::from(error)),
                    }
                }
            };
            let response = match sent {
                Ok(response) => response,
                Err(error) => {
                    lane.retired.store(true, Ordering::Release);
                    metrics::backend_request(super::KUBERNETES_BACKEND, verb, "error");
                    return Err(error);
                }
            };
            let outcome = match response.status().as_u16() {
                200..=299 => "ok",
                409 => "conflict",
                404 => "not_found",
                _ => "error",
            };
            metrics::backend_request(super::KUBERNETES_BACKEND, verb, outcome);
            unanswered.answered();
            lane.warm.store(true, Ordering::Release);
            let counter = if response.version() == http::Version::HTTP_2 {
                &shared.counters.http2_responses
            } else {
                &shared.counters.http1_responses
            };
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(response.map(|inner| Tracked {
                inner,
                _in_flight: in_flight,
            }))
        })
    }
}

/// The `verb` label of a request to the API server, as Kubernetes' audit log names them: `watch`,
/// `list` (a collection), `get` (an object), `create`, `update`, `patch`, `delete`.
/// The verbs of the requests this crate sends to the API server and their outcomes, for the
/// `backend_requests` metric (`conflict`: a 409, on the writes).
pub(super) const KUBERNETES_REQUESTS: metrics::BackendRequests = &[
    ("get", &["ok", "not_found", "error"]),
    ("list", &["ok", "not_found", "error"]),
    ("watch", &["ok", "not_found", "error"]),
    ("create", &["ok", "conflict", "not_found", "error"]),
    ("update", &["ok", "conflict", "not_found", "error"]),
    ("patch", &["ok", "conflict", "not_found", "error"]),
];

fn verb(method: &http::Method, uri: &http::Uri, is_watch: bool) -> &'static str {
    match *method {
        _ if is_watch => "watch",
        http::Method::GET => {
            // `.../namespaces/NS/RESOURCE` is a collection, `.../namespaces/NS/RESOURCE/NAME` an
            // object.
            let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
            match segments.iter().position(|s| *s == "namespaces") {
                Some(at) if segments.len() == at + 3 => "list",
                _ => "get",
            }
        }
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

/// A response body that keeps its request counted on its lane until it is dropped.
pub(super) struct Tracked {
    inner: hyper::body::Incoming,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, hyper::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_named_by_their_audit_verb() {
        let verb = |method: &str, uri: &str| {
            let uri: http::Uri = uri.parse().unwrap();
            let watch = uri.query().is_some_and(|q| q.contains("watch=true"));
            super::verb(&method.parse().unwrap(), &uri, watch)
        };
        let leases = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";
        assert_eq!(verb("GET", leases), "list");
        assert_eq!(
            verb("GET", &format!("{leases}?watch=true&resourceVersion=1")),
            "watch"
        );
        assert_eq!(verb("GET", &format!("{leases}/a")), "get");
        assert_eq!(verb("POST", leases), "create");
        assert_eq!(verb("PUT", &format!("{leases}/a")), "update");
        assert_eq!(verb("PATCH", &format!("{leases}/a")), "patch");
        assert_eq!(verb("DELETE", &format!("{leases}/a")), "delete");
        assert_eq!(verb("GET", "/version"), "get");
    }

    /// Lanes of a client for a server that is never reached (the tests only pick lanes).
    fn unconnected_lanes() -> Lanes {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        Lanes::new(&config, None, Arc::default()).unwrap()
    }

    /// A lane takes [`STREAMS_PER_CONNECTION`] requests; the next goes to a new lane (a new
    /// connection), a finished request makes room again, and a retired lane takes none.
    #[tokio::test]
    async fn a_connection_carries_at_most_200_requests() {
        let lanes = unconnected_lanes();
        let mut first: Vec<InFlight> = (0..STREAMS_PER_CONNECTION).map(|_| lanes.pick()).collect();
        assert_eq!(STREAMS_PER_CONNECTION, 200);
        assert!(first.iter().all(|f| Arc::ptr_eq(&f.0, &first[0].0)));
        let second = lanes.pick();
        assert!(!Arc::ptr_eq(&second.0, &first[0].0), "a second lane");
        first.pop();
        let again = lanes.pick();
        assert!(Arc::ptr_eq(&again.0, &first[0].0), "room on the first lane");
        first[0].0.retired.store(true, Ordering::Release);
        drop(again);
        let after = lanes.pick();
        assert!(
            !Arc::ptr_eq(&after.0, &first[0].0),
            "the retired lane takes none"
        );
        assert_eq!(lanes.shared.lanes.lock().unwrap().len(), 1);
    }

    /// With every connection full, a client opens no third one: the next request goes to the
    /// least busy connection and waits there for a stream.
    #[tokio::test]
    async fn a_client_keeps_at_most_two_connections() {
        let lanes = unconnected_lanes();
        let held: Vec<InFlight> = (0..2 * STREAMS_PER_CONNECTION)
            .map(|_| lanes.pick())
            .collect();
        assert_eq!(lanes.shared.lanes.lock().unwrap().len(), MAX_CONNECTIONS);
        let extra = lanes.pick();
        assert_eq!(
            lanes.shared.lanes.lock().unwrap().len(),
            MAX_CONNECTIONS,
            "no third connection"
        );
        assert!(held.iter().any(|f| Arc::ptr_eq(&f.0, &extra.0)));
        assert!(extra.0.in_flight.load(Ordering::Acquire) > STREAMS_PER_CONNECTION);
    }
}
