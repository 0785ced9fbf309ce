//! [`ShardRouting::forward`](super::ShardRouting::forward) (feature `web-forward`): a request
//! for a shard another node runs is sent on to that node with actix-web's client (`awc`, plain
//! http), and the holder's answer is returned, one hop at most, every wait bounded.

use std::time::Duration;

use actix_web::body::SizedStream;
use actix_web::dev::ServiceRequest;
use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::web::Bytes;
use actix_web::{HttpMessage, HttpResponse};
use futures_util::StreamExt;

use super::redirect::X_FORWARDED_BY;

/// The default of [`ForwardSettings::timeout`].
const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// How [`ShardRouting::forward_with`](super::ShardRouting::forward_with) forwards a request to
/// the node that runs its shard.
#[cfg_attr(docsrs, doc(cfg(feature = "web-forward")))]
#[derive(Debug, Clone)]
pub struct ForwardSettings {
    pub(super) timeout: Duration,
}

impl Default for ForwardSettings {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_FORWARD_TIMEOUT,
        }
    }
}

impl ForwardSettings {
    /// The defaults: a timeout of 10 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// The bound of each wait of a forward (10 s unless set): connecting to the holder, sending
    /// the request and receiving the head of its answer, together; then each chunk of the
    /// answer's body. A forward that does not get the holder's answer in time is answered `502`
    /// ([`ForwardTimeout`](crate::ShardRoutingError::ForwardTimeout)); a body that stalls
    /// longer mid-way is cut off.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The client of one worker thread (its own connection pool): no redirects followed, no
    /// default headers (the request's own `user-agent` goes through), no decompression.
    pub(super) fn client(&self) -> awc::Client {
        awc::Client::builder()
            .connector(awc::Connector::new().timeout(self.timeout))
            .disable_timeout()
            .disable_redirects()
            .no_default_headers()
            .finish()
    }
}

/// Why a forward got no answer from the holder (made a
/// [`ShardRoutingError`](super::ShardRoutingError) by the middleware).
#[derive(Debug)]
pub(super) enum ForwardError {
    /// No connection, or no answer's head, within the timeout.
    Timeout,
    /// The client failed: what it answered.
    Failed(String),
}

/// A forward [`ShardRouting`](super::ShardRouting) decided on: where, and for which shard.
pub(super) struct Forward {
    /// The client of this worker.
    pub(super) client: awc::Client,
    /// The bound of each wait.
    pub(super) timeout: Duration,
    /// The holder's origin with the request's own path and query.
    pub(super) url: String,
    /// This node's owner identity, for `x-actix-coordination-forwarded-by`.
    pub(super) node: String,
    /// The shard id.
    pub(super) shard: String,
    /// The holder's owner identity.
    pub(super) holder: String,
}

/// The headers of one connection, never forwarded (RFC 9110, 7.6.1), with those the
/// `connection` header names.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether `name` is a hop-by-hop header of a message with `headers`, or one of `also`.
fn skipped(name: &HeaderName, headers: &HeaderMap, also: &[HeaderName]) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
        || also.contains(name)
        || headers
            .get_all(header::CONNECTION)
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
}

/// The length a request's headers declare for its body: `None` for a chunked body (or one whose
/// length does not parse), `Some(0)` when it declares none (a request then has no body).
fn body_length(headers: &HeaderMap) -> Option<u64> {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return None;
    }
    match headers.get(header::CONTENT_LENGTH) {
        None => Some(0),
        Some(value) => value.to_str().ok().and_then(|v| v.trim().parse().ok()),
    }
}

impl Forward {
    /// Sends `request` (method, path and query, headers but the hop-by-hop ones, and body) to the
    /// holder and answers with its answer (status, headers but the hop-by-hop ones, and the body
    /// streamed on), or the error that prevented it.
    pub(super) async fn send(
        self,
        request: &mut ServiceRequest,
    ) -> Result<HttpResponse, ForwardError> {
        let Self {
            client,
            timeout,
            url,
            node,
            ..
        } = self;
        let forwarded_by = HeaderName::from_static(X_FORWARDED_BY);
        let mut outgoing = client.request(request.method().clone(), url.as_str());
        let headers = request.headers();
        let also = [header::HOST, header::CONTENT_LENGTH, forwarded_by.clone()];
        for (name, value) in headers.iter() {
            if !skipped(name, headers, &also) {
                outgoing.headers_mut().append(name.clone(), value.clone());
            }
        }
        // An owner identity that is no header value (a foreign writer) is sent as `-`.
        let by = HeaderValue::from_str(&node).unwrap_or_else(|_| HeaderValue::from_static("-"));
        outgoing.headers_mut().insert(forwarded_by, by);
        let length = body_length(headers);
        let payload = request.take_payload();
        let sending = match length {
            Some(0) => outgoing.send(),
            Some(length) => outgoing.send_body(SizedStream::new(length, payload)),
            None => outgoing.send_stream(payload),
        };
        let answer = match tokio::time::timeout(timeout, sending).await {
            Err(_)
            | Ok(Err(awc::error::SendRequestError::Timeout))
            | Ok(Err(awc::error::SendRequestError::Connect(awc::error::ConnectError::Timeout))) => {
                return Err(ForwardError::Timeout)
            }
            Ok(Err(error)) => return Err(ForwardError::Failed(error.to_string())),
            Ok(Ok(answer)) => answer,
        };
        let mut response = HttpResponse::build(answer.status());
        let headers = answer.headers();
        let also = [header::CONTENT_LENGTH];
        for (name, value) in headers.iter() {
            if !skipped(name, headers, &also) {
                response.append_header((name.clone(), value.clone()));
            }
        }
        // A length the holder declares is kept; any other body (chunked, or up to the end of the
        // connection) is streamed on chunked.
        let length = if headers.contains_key(header::TRANSFER_ENCODING) {
            None
        } else {
            headers
                .get(header::CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<u64>().ok())
        };
        let body = chunks(answer, timeout);
        Ok(match length {
            Some(length) => response.body(SizedStream::new(length, body)),
            None => response.streaming(body),
        })
    }
}

/// The body of the holder's answer, each chunk waited for `timeout` at most (then an error,
/// which cuts the answer off, and the end).
fn chunks<S, E>(
    body: S,
    timeout: Duration,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + 'static
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + 'static,
    E: std::fmt::Display,
{
    futures_util::stream::unfold(Some(Box::pin(body)), move |body| async move {
        let mut body = body?;
        match tokio::time::timeout(timeout, body.next()).await {
            Ok(Some(Ok(chunk))) => Some((Ok(chunk), Some(body))),
            Ok(None) => None,
            Ok(Some(Err(error))) => Some((Err(std::io::Error::other(error.to_string())), None)),
            Err(_) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the holder's answer stalled",
                )),
                None,
            )),
        }
    })
}
