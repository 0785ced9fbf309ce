//! Routing a request to the node that runs its entity's shard: the [`ShardRouting`] middleware,
//! where the entity id comes from ([`EntityId`]), what the handler gets ([`RoutedShard`]) and
//! why a request is refused ([`ShardRoutingError`]).

use std::future::{ready, Ready};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::EitherBody;
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{FromRequest, HttpMessage, HttpRequest, HttpResponse, ResponseError};
use futures_util::future::LocalBoxFuture;

#[cfg(feature = "web-forward")]
use super::forward::{Forward, ForwardError, ForwardSettings};
use super::redirect::{self, NoRedirect, WarnOnce, X_FORWARDED_BY};
use crate::actors::{LocateError, ShardDirectory};
use crate::tenure::TenureGuard;
use crate::vocab::{BoxError, FencingToken};

/// The `Retry-After` of [`ShardRouting`]'s `503` answers unless set
/// ([`ShardRouting::retry_after`]).
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The header naming the shard a request was routed by, on every answer that knows it.
const X_SHARD: &str = "x-shard";

/// The header naming the node a request is redirected or forwarded to (its owner identity).
const X_SHARD_HOLDER: &str = "x-shard-holder";

type Extract = Arc<dyn Fn(&HttpRequest) -> Result<String, BoxError> + Send + Sync>;

/// Where [`ShardRouting`] finds a request's entity id: a segment of the matched path, a header,
/// or a function of the request.
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
#[derive(Clone)]
pub struct EntityId(Source);

#[derive(Clone)]
enum Source {
    Path(String),
    Header(HeaderName),
    Function(Extract),
}

impl std::fmt::Debug for EntityId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Source::Path(name) => f.debug_tuple("EntityId::path").field(name).finish(),
            Source::Header(name) => f.debug_tuple("EntityId::header").field(name).finish(),
            Source::Function(_) => f.write_str("EntityId::from_fn(..)"),
        }
    }
}

impl EntityId {
    /// The path segment `name` of the matched route (`{id}` in `/orders/{id}`): wrap the
    /// resource (`web::resource("/orders/{id}").wrap(…)`) or a scope whose own path names it
    /// (`web::scope("/orders/{id}")`); a scope's middleware runs before the routes under it are
    /// matched, so it does not see their segments.
    pub fn path(name: impl Into<String>) -> Self {
        Self(Source::Path(name.into()))
    }

    /// The header `name` (for example `x-entity-id`), as visible ASCII.
    ///
    /// # Errors
    ///
    /// [`ShardRoutingError::HeaderName`] when `name` is no header name.
    pub fn header(name: &str) -> Result<Self, ShardRoutingError> {
        HeaderName::from_bytes(name.as_bytes())
            .map(|name| Self(Source::Header(name)))
            .map_err(|_| ShardRoutingError::HeaderName {
                name: name.to_owned(),
            })
    }

    /// What `extract` answers for the request: an entity id, or an error when the request
    /// names none or one of an unknown format (answered `400`, the error's text in the body).
    pub fn from_fn<F, E>(extract: F) -> Self
    where
        F: Fn(&HttpRequest) -> Result<String, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        Self(Source::Function(Arc::new(move |request| {
            extract(request).map_err(Into::into)
        })))
    }

    /// The id of `request`'s entity (or shard), never empty.
    fn extract(&self, request: &HttpRequest) -> Result<String, ShardRoutingError> {
        let id = match &self.0 {
            Source::Path(name) => request
                .match_info()
                .get(name)
                .map(str::to_owned)
                .ok_or_else(|| ShardRoutingError::MissingPathSegment { name: name.clone() })?,
            Source::Header(name) => {
                let value = request.headers().get(name).ok_or_else(|| {
                    ShardRoutingError::MissingHeader {
                        name: name.as_str().to_owned(),
                    }
                })?;
                value
                    .to_str()
                    .map_err(|_| ShardRoutingError::HeaderNotText {
                        name: name.as_str().to_owned(),
                    })?
                    .to_owned()
            }
            Source::Function(extract) => {
                extract(request).map_err(|source| ShardRoutingError::Rejected { source })?
            }
        };
        if id.is_empty() {
            return Err(ShardRoutingError::EmptyId);
        }
        Ok(id)
    }
}

/// Why [`ShardRouting`] did not pass a request on, or why [`RoutedShard`] could not be extracted.
/// As an actix-web error it answers the status each variant names, with its text (and its
/// causes') as the body; a `503` carries `Retry-After`.
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardRoutingError {
    /// The name given to [`EntityId::header`] is no header name (never answered: a
    /// configuration error, returned where the source is built).
    #[error("{name:?} is not a header name")]
    HeaderName {
        /// The name, as given.
        name: String,
    },
    /// The matched path has no segment of this name (`400`): the route names no such segment,
    /// or the middleware wraps a scope whose routes name it (see [`EntityId::path`]).
    #[error("the request's path has no segment {name:?}")]
    MissingPathSegment {
        /// The segment's name.
        name: String,
    },
    /// The request has no such header (`400`).
    #[error("the request has no header {name:?}")]
    MissingHeader {
        /// The header's name.
        name: String,
    },
    /// The header's value is not visible ASCII (`400`).
    #[error("the request's header {name:?} is not visible ascii")]
    HeaderNotText {
        /// The header's name.
        name: String,
    },
    /// The id taken from the request is empty (`400`).
    #[error("the request's entity id is empty")]
    EmptyId,
    /// The function of [`EntityId::from_fn`] refused the request (`400`): it names no entity,
    /// or one of an unknown format.
    #[error("the request's entity id was refused")]
    Rejected {
        /// What the function answered.
        #[source]
        source: BoxError,
    },
    /// The shard could not be located (`400` for a shard id the group does not have, with
    /// [`ShardRouting::by_shard_id`]; `503` before the node's group watch has listed the group;
    /// `500` when the shard function answers an index out of range).
    #[error("cannot locate the request's shard")]
    Locate(#[source] LocateError),
    /// Nobody holds the shard as this node sees it (`503`): it is moving, or its holder's lease
    /// expired.
    #[error("shard {shard:?} has no live holder: it is moving")]
    Moving {
        /// The shard id.
        shard: String,
    },
    /// The shard's holder advertises no valid address to redirect to (`503`); see
    /// [`ShardedWorkers::advertise`](crate::ShardedWorkers::advertise).
    #[error("the holder {holder:?} of shard {shard:?} advertises no valid address")]
    NoAddress {
        /// The shard id.
        shard: String,
        /// The holder's owner identity.
        holder: String,
    },
    /// The shard's holder advertises this node's own address, or the host and port this request
    /// came in on (`503`): a redirect would come straight back (a previous process at this
    /// address, under another owner identity, whose claim has not expired).
    #[error("the holder {holder:?} of shard {shard:?} advertises this node's own address")]
    OwnAddress {
        /// The shard id.
        shard: String,
        /// The holder's owner identity.
        holder: String,
    },
    /// The request was forwarded here by another node (it carries
    /// `x-actix-coordination-forwarded-by`), and this node does not run its shard (`503`): it is
    /// not sent on again, nor redirected (one hop at most, never a loop); the client's retry
    /// reaches the first node again, which routes it by then.
    #[error("shard {shard:?} was forwarded here by {by:?}, but does not run here")]
    ForwardedHere {
        /// The shard id.
        shard: String,
        /// The forwarding node's owner identity, as its header names it.
        by: String,
    },
    /// Forwarding (feature `web-forward`, [`ShardRouting::forward`]) to the shard's holder failed
    /// (`502`): it could not be reached (the connection refused, or a name that does not
    /// resolve), or its answer could not be read.
    #[error("cannot forward the request for shard {shard:?} to its holder {holder:?}: {reason}")]
    ForwardFailed {
        /// The shard id.
        shard: String,
        /// The holder's owner identity.
        holder: String,
        /// What the client answered.
        reason: String,
    },
    /// Forwarding to the shard's holder took longer than the forward's timeout (`502`): no
    /// connection, or no answer's head, within
    /// [`ForwardSettings::timeout`](crate::ForwardSettings::timeout).
    #[error("the holder {holder:?} of shard {shard:?} did not answer a forwarded request within {timeout:?}")]
    ForwardTimeout {
        /// The shard id.
        shard: String,
        /// The holder's owner identity.
        holder: String,
        /// The forward's timeout.
        timeout: Duration,
    },
    /// The shard's holder advertises an `https` address, and forwarding speaks plain `http` only
    /// (`502`): the crate builds its client without TLS. Redirect such requests (leave
    /// [`ShardRouting::forward`] off), or advertise an `http` address inside the cluster.
    #[error("the holder {holder:?} of shard {shard:?} advertises an https address: forwarding speaks plain http only")]
    ForwardHttps {
        /// The shard id.
        shard: String,
        /// The holder's owner identity.
        holder: String,
    },
    /// This node's tenure of the shard ended after the request was routed here (`503`): the
    /// handler is not run, and the client's retry is routed again.
    #[error("this node's tenure of shard {shard:?} ended")]
    TenureEnded {
        /// The shard id.
        shard: String,
    },
    /// A handler asked for a [`RoutedShard`] that [`ShardRouting`] did not route (`500`): the
    /// route is not wrapped in it.
    #[error("the request was not routed by ShardRouting: wrap the route in it")]
    NotRouted,
}

impl ShardRoutingError {
    /// The answer to the request: the status, the text of the error and its causes, and
    /// `Retry-After` on a `503`.
    pub(super) fn response(&self, retry_after: Duration) -> HttpResponse {
        let mut body = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            body.push_str(": ");
            body.push_str(&cause.to_string());
            source = cause.source();
        }
        let status = self.status_code();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            return redirect::unavailable(body, retry_after);
        }
        HttpResponse::build(status).body(body)
    }
}

impl ResponseError for ShardRoutingError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::MissingPathSegment { .. }
            | Self::MissingHeader { .. }
            | Self::HeaderNotText { .. }
            | Self::EmptyId
            | Self::Rejected { .. }
            | Self::Locate(LocateError::UnknownShard { .. }) => StatusCode::BAD_REQUEST,
            Self::Locate(LocateError::NotListed { .. })
            | Self::Moving { .. }
            | Self::NoAddress { .. }
            | Self::OwnAddress { .. }
            | Self::ForwardedHere { .. }
            | Self::TenureEnded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::ForwardFailed { .. }
            | Self::ForwardTimeout { .. }
            | Self::ForwardHttps { .. } => StatusCode::BAD_GATEWAY,
            Self::HeaderName { .. }
            | Self::Locate(LocateError::ShardOutOfRange { .. } | LocateError::NoIndex { .. })
            | Self::NotRouted => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        self.response(DEFAULT_RETRY_AFTER)
    }
}

/// The shard a request was routed to, running on this node: what [`ShardRouting`] puts in the
/// request's extensions before it passes the request on. A handler takes it as an argument
/// (it is an extractor), fences its writes with [`fencing_token`](Self::fencing_token) and
/// checks [`check_alive`](Self::check_alive) before each step: the tenure can end while the
/// handler runs.
///
/// Extracting it fails, and the handler is not run, when this node's tenure of the shard ended
/// since the request was routed (`503`, [`ShardRoutingError::TenureEnded`]), or when the route
/// is not wrapped in [`ShardRouting`] (`500`, [`ShardRoutingError::NotRouted`]).
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RoutedShard {
    /// The group.
    pub group: String,
    /// The shard id.
    pub shard: String,
    /// The shard's index: its position in the group's list of shards.
    pub index: usize,
    /// This node's owner identity (the shard's holder).
    pub owner: String,
    /// The fencing token of this node's tenure of the shard: pass it with every write.
    pub fencing_token: FencingToken,
    /// The guard of that tenure (the guard the shard's worker got in its
    /// [`ShardInfo`](crate::ShardInfo) when it runs under the same tenure).
    pub guard: TenureGuard,
    /// The `Retry-After` of the middleware, for the extractor's `503`.
    retry_after: Duration,
}

impl RoutedShard {
    /// Whether this node's tenure of the shard is alive right now ([`TenureGuard::check_alive`]):
    /// check it before every step, and write with the fencing token.
    pub fn check_alive(&self) -> bool {
        self.guard.check_alive()
    }
}

impl FromRequest for RoutedShard {
    type Error = actix_web::Error;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        let routed = request.extensions().get::<RoutedShard>().cloned();
        ready(match routed {
            Some(routed) if routed.check_alive() => Ok(routed),
            Some(routed) => {
                tracing::debug!(group = %routed.group, shard = %routed.shard, "the shard's tenure ended after the request was routed here: 503");
                let error = ShardRoutingError::TenureEnded {
                    shard: routed.shard,
                };
                let response = with_shard(error.response(routed.retry_after), &error_shard(&error));
                Err(actix_web::error::InternalError::from_response(error, response).into())
            }
            None => Err(ShardRoutingError::NotRouted.into()),
        })
    }
}

/// The shard id an error names, if any (for `x-shard`).
fn error_shard(error: &ShardRoutingError) -> Option<String> {
    match error {
        ShardRoutingError::Moving { shard }
        | ShardRoutingError::NoAddress { shard, .. }
        | ShardRoutingError::OwnAddress { shard, .. }
        | ShardRoutingError::ForwardedHere { shard, .. }
        | ShardRoutingError::ForwardFailed { shard, .. }
        | ShardRoutingError::ForwardTimeout { shard, .. }
        | ShardRoutingError::ForwardHttps { shard, .. }
        | ShardRoutingError::TenureEnded { shard } => Some(shard.clone()),
        _ => None,
    }
}

/// `response` with `x-shard: shard` (left out when the id is no header value).
fn with_shard(mut response: HttpResponse, shard: &Option<String>) -> HttpResponse {
    if let Some(value) = shard.as_deref().and_then(|s| HeaderValue::from_str(s).ok()) {
        response
            .headers_mut()
            .insert(HeaderName::from_static(X_SHARD), value);
    }
    response
}

/// Middleware for routes that serve one entity: a request reaches the wrapped handlers only on
/// the node that runs its entity's shard, with the shard's [`RoutedShard`] (guard and fencing
/// token) in its extensions. The entity id comes from the request ([`EntityId`]: a path segment,
/// a header or a function); the shard is the directory's [`ShardFunction`](crate::ShardFunction)'s
/// for it ([`ShardDirectory::shard_of`]), or the id names the shard itself
/// ([`by_shard_id`](Self::by_shard_id)). The node that runs it is the [`ShardDirectory`]'s answer:
/// this node's own tenures and its group watch, no request to the store (a routed request costs
/// the backend nothing, on any node).
///
/// * **Here**: this node holds a live tenure of the shard. The tenure's guard is checked right
///   before the request is passed on, and again when the handler extracts [`RoutedShard`] (a
///   tenure that ended in between is answered `503`, the handler is not run).
/// * **Elsewhere**: `307 Temporary Redirect` to the holder's advertised address
///   ([`ShardedWorkers::advertise`](crate::ShardedWorkers::advertise), validated as
///   [`LeaderOnly`](crate::LeaderOnly) validates a leader's: the same function) with the
///   request's own path and query, and the holder's owner identity in `x-shard-holder`. `307`
///   keeps the method and the body.
/// * **Nobody**: `503 Service Unavailable` with `Retry-After` ([`retry_after`](Self::retry_after),
///   1 s unless set) while the shard has no live holder (it is moving), before the group watch
///   has listed the group, when the holder advertises no valid address, and when it advertises
///   this node's own address or the host and port the request came in on (a redirect would come
///   straight back: never a redirect loop through one node).
/// * **Bad input**: `400` for a missing or empty id, one the [`EntityId::from_fn`] function
///   refuses, or a shard id the group does not have; `500` when the shard function answers an
///   index out of range. Every refusal is a [`ShardRoutingError`], its text in the body; none
///   panics.
///
/// Every answer that knows the shard names it in `x-shard` (the handler's answers too), for
/// clients to count. Requests are not forwarded to the holder unless asked for (below): a client
/// follows the redirect.
///
/// A request that carries `x-actix-coordination-forwarded-by` (another node forwarded it here)
/// for a shard this node does not run is answered `503` with `Retry-After`
/// ([`ShardRoutingError::ForwardedHere`]): never redirected nor forwarded again.
///
/// # Forwarding
///
/// With feature `web-forward`, [`forward`](Self::forward) (or [`forward_with`](Self::forward_with)
/// and [`ForwardSettings`](crate::ForwardSettings)) turns the `307` into a forward: this node
/// sends the request (method, path and query, headers but the hop-by-hop ones and `host`, body)
/// to the holder's advertised address with actix-web's client (`awc`, one connection pool per
/// worker thread), and answers with the holder's answer (status, headers but the hop-by-hop ones,
/// body streamed on), adding `x-shard` and `x-shard-holder`.
///
/// * **One hop**: the forwarded request carries `x-actix-coordination-forwarded-by: <this
///   node's owner identity>`, and the node it reaches serves it or answers `503` (above): no
///   loop, even while the nodes' watches disagree.
/// * **Bounded**: connecting, sending and the head of the holder's answer take at most the
///   forward's timeout together (10 s unless set), and each chunk of the answer's body at most
///   the timeout again (a stalled body is cut off). A holder not reached in time is `502 Bad
///   Gateway` ([`ShardRoutingError::ForwardTimeout`]); one that refuses the connection, or
///   whose answer cannot be read, is `502` too ([`ShardRoutingError::ForwardFailed`]; the
///   client decides whether to retry, as the request may have reached the holder).
/// * **Plain http**: the client has no TLS; a holder that advertises an `https` address is
///   `502` ([`ShardRoutingError::ForwardHttps`]): redirect to such nodes instead.
/// * The `503` answers of **Nobody** stay as they are.
///
/// It routes by what this node sees, up to its watch's delay: a redirect can reach a node that
/// has just lost the shard, which redirects again (to the holder its own watch names), and two
/// nodes whose watches disagree for a moment may send a client back and forth until they agree
/// (HTTP clients cap the redirects they follow). Exclusivity is the tenure's, not the route's:
/// the handler writes with the fencing token and checks the guard.
///
/// ```
/// use actix::prelude::*;
/// use actix_coordination::prelude::*;
/// use actix_coordination::{EntityId, RoutedShard, ShardRouting};
/// use actix_web::{test, web, App, HttpResponse};
///
/// struct Partition;
/// impl Actor for Partition {
///     type Context = Context<Self>;
/// }
///
/// async fn get_order(routed: RoutedShard) -> HttpResponse {
///     // Runs only on the shard's node; write with `routed.fencing_token`.
///     HttpResponse::Ok().body(format!("shard {} token {}", routed.shard, routed.fencing_token.value()))
/// }
///
/// # #[actix::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let leases = store.clone();
/// let workers = ShardedWorkers::with_count(
///     "orders",
///     8,
///     move |name: &str| leases.lease(LeaseSettings::new(name, "node-1").unwrap()),
///     |_: &ShardInfo, _ctx| Partition,
/// )?
/// .advertise("http://10.0.0.1:8080", |s| Ok::<_, std::convert::Infallible>(store.lease(s)))?;
/// let routing = ShardRouting::new(workers.directory(), EntityId::path("id"));
/// let workers = workers.start();
/// # tokio::time::sleep(std::time::Duration::from_millis(100)).await;
/// let app = test::init_service(App::new().service(
///     web::resource("/orders/{id}").wrap(routing).route(web::get().to(get_order)),
/// ))
/// .await;
/// let request = test::TestRequest::get().uri("/orders/customer-42").to_request();
/// let response = test::call_service(&app, request).await;
/// assert_eq!(response.status(), 200); // alone: every shard runs here
/// assert!(response.headers().contains_key("x-shard"));
/// workers.send(Shutdown).await??;
/// # Ok(()) }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
#[derive(Clone, Debug)]
pub struct ShardRouting {
    directory: ShardDirectory,
    entity: EntityId,
    by_shard_id: bool,
    retry_after: Duration,
    /// Forward rather than redirect (feature `web-forward`).
    #[cfg(feature = "web-forward")]
    forward: Option<ForwardSettings>,
}

/// What [`ShardRouting`] does with a request it does not serve here.
enum Elsewhere {
    /// Answered here: a redirect or a refusal.
    Answer(Box<HttpResponse>),
    /// Forwarded to the shard's holder.
    #[cfg(feature = "web-forward")]
    Forward(Box<Forward>),
}

impl ShardRouting {
    /// Routes each request by the shard of the entity `entity` names, to the node that runs it
    /// as `directory` sees it (from [`ShardedWorkers::directory`](crate::ShardedWorkers::directory);
    /// a directory with its own shard function maps entities with it).
    pub fn new(directory: ShardDirectory, entity: EntityId) -> Self {
        Self {
            directory,
            entity,
            by_shard_id: false,
            retry_after: DEFAULT_RETRY_AFTER,
            #[cfg(feature = "web-forward")]
            forward: None,
        }
    }

    /// The id taken from the request is a shard id of the group (`/shards/{shard}/…`), not an
    /// entity id: no shard function; an id the group does not have is answered `400`.
    pub fn by_shard_id(mut self) -> Self {
        self.by_shard_id = true;
        self
    }

    /// The `Retry-After` of the `503` answers (whole seconds, rounded up; 1 s unless set).
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Forwards a request for a shard another node runs to that node, and answers with its
    /// answer, rather than redirecting the client there (feature `web-forward`; the timeout of
    /// [`ForwardSettings::default`], 10 s): see the rules under "Forwarding" above.
    #[cfg(feature = "web-forward")]
    #[cfg_attr(docsrs, doc(cfg(feature = "web-forward")))]
    pub fn forward(self) -> Self {
        self.forward_with(ForwardSettings::default())
    }

    /// Forwards as [`forward`](Self::forward) does, with `settings` (its timeout).
    #[cfg(feature = "web-forward")]
    #[cfg_attr(docsrs, doc(cfg(feature = "web-forward")))]
    pub fn forward_with(mut self, settings: ForwardSettings) -> Self {
        self.forward = Some(settings);
        self
    }

    /// Where `request` goes: served here under the shard's tenure, or answered, or forwarded
    /// (with this worker's `client`, when forwarding is on).
    fn decide(
        &self,
        request: &ServiceRequest,
        warned: &WarnOnce,
        #[cfg(feature = "web-forward")] client: Option<&awc::Client>,
    ) -> Result<RoutedShard, Elsewhere> {
        let refuse = |error: ShardRoutingError| {
            let shard = error_shard(&error);
            Elsewhere::Answer(Box::new(with_shard(
                error.response(self.retry_after),
                &shard,
            )))
        };
        let directory = &self.directory;
        let id = self.entity.extract(request.request()).map_err(refuse)?;
        let index = if self.by_shard_id {
            directory
                .index_of(&id)
                .ok_or_else(|| LocateError::UnknownShard {
                    group: directory.group().to_owned(),
                    shard: id,
                })
        } else {
            directory.shard_of(&id)
        };
        let route = index
            .and_then(|index| directory.route(index))
            .map_err(|error| {
                tracing::debug!(group = %directory.group(), error = &error as &dyn std::error::Error, "cannot locate a request's shard");
                refuse(ShardRoutingError::Locate(error))
            })?;
        let location = route.location;
        let shard = location.shard;
        if let Some(guard) = route.guard {
            return Ok(RoutedShard {
                group: directory.group().to_owned(),
                shard,
                index: location.index,
                owner: directory.node().to_owned(),
                fencing_token: guard.token(),
                guard,
                retry_after: self.retry_after,
            });
        }
        let group = directory.group();
        if let Some(by) = request.headers().get(X_FORWARDED_BY) {
            let by = String::from_utf8_lossy(by.as_bytes()).into_owned();
            tracing::debug!(%group, %shard, %by, "a forwarded request for a shard that does not run here: 503");
            return Err(refuse(ShardRoutingError::ForwardedHere { shard, by }));
        }
        let Some(holder) = location.holder else {
            tracing::debug!(%group, %shard, "request for a shard without a live holder: 503");
            return Err(refuse(ShardRoutingError::Moving { shard }));
        };
        let Some(address) = location.address else {
            tracing::debug!(%group, %shard, %holder, "the shard's holder advertises no address: 503");
            return Err(refuse(ShardRoutingError::NoAddress { shard, holder }));
        };
        let own = directory.own_address();
        let redirected = |mut response: HttpResponse| {
            let headers = response.headers_mut();
            // A holder identity that is no header value (a foreign writer) is left out.
            if let Ok(value) = HeaderValue::from_str(&holder) {
                headers.insert(HeaderName::from_static(X_SHARD_HOLDER), value);
            }
            Elsewhere::Answer(Box::new(with_shard(response, &Some(shard.clone()))))
        };
        #[cfg(feature = "web-forward")]
        let sent = match (&self.forward, client) {
            (Some(settings), Some(client)) => {
                redirect::target(&address, own.as_deref(), request).map(|url| {
                    if url.starts_with("https://") {
                        tracing::debug!(%group, %shard, %holder, ?address, "the shard's holder advertises an https address: cannot forward");
                        return refuse(ShardRoutingError::ForwardHttps {
                            shard: shard.clone(),
                            holder: holder.clone(),
                        });
                    }
                    Elsewhere::Forward(Box::new(Forward {
                        client: client.clone(),
                        timeout: settings.timeout,
                        url,
                        node: directory.node().to_owned(),
                        shard: shard.clone(),
                        holder: holder.clone(),
                    }))
                })
            }
            _ => redirect::redirect(&address, own.as_deref(), request).map(redirected),
        };
        #[cfg(not(feature = "web-forward"))]
        let sent = redirect::redirect(&address, own.as_deref(), request).map(redirected);
        match sent {
            Ok(decision) => Err(decision),
            Err(NoRedirect::CameInOn | NoRedirect::OwnAddress) => {
                if warned.first(&address) {
                    tracing::warn!(%group, %shard, %holder, ?address, "the shard's holder advertises this node's own address: its requests get 503 rather than a redirect back here");
                } else {
                    tracing::debug!(%group, %shard, %holder, ?address, "the shard's holder advertises this node's own address: 503");
                }
                Err(refuse(ShardRoutingError::OwnAddress { shard, holder }))
            }
            // The directory passes on valid addresses only (checked by the same function).
            Err(NoRedirect::Invalid(_) | NoRedirect::Location) => {
                Err(refuse(ShardRoutingError::NoAddress { shard, holder }))
            }
        }
    }
}

impl<S, B> Transform<S, ServiceRequest> for ShardRouting
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Transform = ShardRoutingService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(ShardRoutingService {
            service: Rc::new(service),
            routing: self.clone(),
            warned: WarnOnce::default(),
            #[cfg(feature = "web-forward")]
            client: self.forward.as_ref().map(ForwardSettings::client),
        }))
    }
}

/// The service [`ShardRouting`] wraps around the routes.
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
pub struct ShardRoutingService<S> {
    service: Rc<S>,
    routing: ShardRouting,
    /// The last address refused as this node's own (the next refusals are logged at `debug`).
    warned: WarnOnce,
    /// This worker's HTTP client, when forwarding is on (its own connection pool).
    #[cfg(feature = "web-forward")]
    client: Option<awc::Client>,
}

impl<S> std::fmt::Debug for ShardRoutingService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardRoutingService")
            .field("routing", &self.routing)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<ServiceRequest> for ShardRoutingService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let decision = self.routing.decide(
            &request,
            &self.warned,
            #[cfg(feature = "web-forward")]
            self.client.as_ref(),
        );
        let routed = match decision {
            Ok(routed) => routed,
            Err(Elsewhere::Answer(response)) => {
                return Box::pin(ready(Ok(request
                    .into_response(*response)
                    .map_into_right_body())))
            }
            #[cfg(feature = "web-forward")]
            Err(Elsewhere::Forward(forward)) => {
                let retry_after = self.routing.retry_after;
                return Box::pin(async move {
                    let mut request = request;
                    let (shard, holder) = (forward.shard.clone(), forward.holder.clone());
                    let timeout = forward.timeout;
                    let mut response = match forward.send(&mut request).await {
                        Ok(response) => response,
                        Err(error) => {
                            let (shard, holder) = (shard.clone(), holder.clone());
                            let error = match error {
                                ForwardError::Timeout => ShardRoutingError::ForwardTimeout {
                                    shard,
                                    holder,
                                    timeout,
                                },
                                ForwardError::Failed(reason) => ShardRoutingError::ForwardFailed {
                                    shard,
                                    holder,
                                    reason,
                                },
                            };
                            tracing::debug!(
                                error = &error as &dyn std::error::Error,
                                "cannot forward a request to its shard's holder"
                            );
                            error.response(retry_after)
                        }
                    };
                    // A holder identity that is no header value (a foreign writer) is left out.
                    if let Ok(value) = HeaderValue::from_str(&holder) {
                        response
                            .headers_mut()
                            .insert(HeaderName::from_static(X_SHARD_HOLDER), value);
                    }
                    Ok(request
                        .into_response(with_shard(response, &Some(shard)))
                        .map_into_right_body())
                });
            }
        };
        // The tenure may have ended since it was read: checked right before the request is
        // passed on (and again by the `RoutedShard` extractor).
        if !routed.check_alive() {
            tracing::debug!(group = %routed.group, shard = %routed.shard, "the shard's tenure ended while the request was routed: 503");
            let error = ShardRoutingError::TenureEnded {
                shard: routed.shard,
            };
            let response = with_shard(
                error.response(self.routing.retry_after),
                &error_shard(&error),
            );
            return Box::pin(ready(Ok(request
                .into_response(response)
                .map_into_right_body())));
        }
        let shard = HeaderValue::from_str(&routed.shard).ok();
        request.extensions_mut().insert(routed);
        let response = self.service.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            if let Some(shard) = shard {
                response
                    .headers_mut()
                    .insert(HeaderName::from_static(X_SHARD), shard);
            }
            Ok(response.map_into_left_body())
        })
    }
}
