//! The HTTP client of the Kubernetes backend: kube's default stack, but with `TCP_NODELAY`.
//!
//! kube's `Client::try_from(Config)` leaves Nagle's algorithm on. A `PUT` is written as a header
//! segment and a body segment; with Nagle the body waits for the ACK of the headers, which the API
//! server's kernel delays by up to 40 ms (delayed ACK). Every lease write then costs about 40 ms
//! more than its round trip, and a graceful handoff, two writes, about 80 ms more (measured on
//! loopback: 95 ms median handoff with Nagle, under 10 ms without; BENCHMARKS.md). This module
//! builds the same stack as kube (base URI, authentication with token-file refresh, connect
//! timeout, rustls with the config's CA) on a connector with `TCP_NODELAY` set.

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::Client;
use tower::{BoxError, ServiceBuilder};

use super::KubernetesError;

/// A kube [`Client`] for `config`, like `Client::try_from(config)` but with `TCP_NODELAY` on its
/// connections: use it for [`KubernetesLease::with_client`](crate::KubernetesLease::with_client)
/// (e.g. with a kubeconfig), or every lease write waits up to 40 ms for a delayed ACK.
///
/// Set `config.default_retry = false` first if you share the client with leases: the lease
/// decides about retries itself. `config.read_timeout` and `config.write_timeout` are not applied
/// (every lease call is bounded by the lease's operation timeout; watches have their own bound).
///
/// # Errors
///
/// [`KubernetesError::BuildClient`] when the TLS or authentication settings of `config` cannot be
/// loaded (an unreadable CA or token file, a bad certificate).
pub fn kubernetes_client(config: &kube::Config) -> Result<Client, KubernetesError> {
    build(config).map_err(|source| KubernetesError::BuildClient { source })
}

fn build(config: &kube::Config) -> Result<Client, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(client);
    Ok(Client::new(service, config.default_namespace.clone()))
}
