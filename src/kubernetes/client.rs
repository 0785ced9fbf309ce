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
use std::sync::atomic::{AtomicU64, Ordering};
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
    let http =
        hyper_client(config, None).map_err(|source| KubernetesError::BuildClient { source })?;
    stack(config, http).map_err(|source| KubernetesError::BuildClient { source })
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
    let http = hyper_client(config, Some(Arc::clone(&counters)))
        .map_err(|source| KubernetesError::BuildClient { source })?;
    let on_runtime = OnRuntime {
        inner: http,
        runtime: runtime.clone(),
        counters,
        gate: Arc::default(),
    };
    stack(config, on_runtime).map_err(|source| KubernetesError::BuildClient { source })
}

type HttpsConnector = hyper_rustls::HttpsConnector<Counting<HttpConnector>>;
type HyperClient = hyper_util::client::legacy::Client<HttpsConnector, kube::client::Body>;

/// hyper's client on a `TCP_NODELAY` connector with rustls offering `h2` and `http/1.1`.
fn hyper_client(
    config: &kube::Config,
    counters: Option<Arc<HttpCounters>>,
) -> Result<HyperClient, kube::Error> {
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
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    Ok(
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(HTTP2_KEEP_ALIVE_INTERVAL)
            .http2_keep_alive_timeout(HTTP2_KEEP_ALIVE_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(https),
    )
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
    counters: Option<Arc<HttpCounters>>,
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
            if let Some(counters) = counters {
                counters.connections.fetch_add(1, Ordering::Relaxed);
            }
            Ok(connected)
        })
    }
}

/// Runs every request of `inner` (its connect, TLS handshake and the connection's task) on
/// `runtime`, whichever runtime the caller is on: a session's connections then do not depend on
/// the runtime or actix arbiter that happened to use the session first. The response body is
/// read by the caller, from the connection task through a channel.
///
/// While the session has no working connection (at first, and after a request failed), requests
/// go out one at a time until one is answered. hyper learns that a server speaks HTTP/2 only
/// once a connection is up, so 200 leases acquiring at once would otherwise open 200 connections
/// (and TLS handshakes) and keep one.
#[derive(Clone)]
struct OnRuntime {
    inner: HyperClient,
    runtime: Handle,
    counters: Arc<HttpCounters>,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    /// A request was answered since the last failure.
    warm: std::sync::atomic::AtomicBool,
    /// Held by the one request in flight while the session is not warm.
    cold: tokio::sync::Mutex<()>,
}

impl tower::Service<http::Request<kube::client::Body>> for OnRuntime {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // hyper's legacy client is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let inner = self.inner.clone();
        let runtime = self.runtime.clone();
        let counters = Arc::clone(&self.counters);
        let gate = Arc::clone(&self.gate);
        Box::pin(async move {
            let _cold = if gate.warm.load(Ordering::Acquire) {
                None
            } else {
                let guard = gate.cold.lock().await;
                // Answered while this one waited: go on without the gate.
                (!gate.warm.load(Ordering::Acquire)).then_some(guard)
            };
            let sent = runtime.spawn(inner.request(request));
            // A caller that gives up (an operation timeout) cancels the request with it.
            let _abort = AbortOnDrop(sent.abort_handle());
            let response = match sent.await.map_err(BoxError::from) {
                Ok(Ok(response)) => response,
                Ok(Err(error)) => {
                    gate.warm.store(false, Ordering::Release);
                    return Err(error.into());
                }
                Err(error) => {
                    gate.warm.store(false, Ordering::Release);
                    return Err(error);
                }
            };
            gate.warm.store(true, Ordering::Release);
            let counter = if response.version() == http::Version::HTTP_2 {
                &counters.http2_responses
            } else {
                &counters.http1_responses
            };
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(response)
        })
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
