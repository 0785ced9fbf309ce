//! What [`LeaderOnly`](super::LeaderOnly) and [`ShardRouting`](super::ShardRouting) share: one
//! validation of the address another node advertises (the one
//! [`Candidate::address`](crate::Candidate::address) and
//! [`ShardedWorkers::advertise`](crate::ShardedWorkers::advertise) apply), one redirect to it
//! with the request's own path and query, refused when it would come straight back here, and
//! one `503` answer.

use std::cell::RefCell;
use std::time::Duration;

use actix_web::dev::ServiceRequest;
use actix_web::http::header;
use actix_web::HttpResponse;

use crate::actors::candidacy::{AddressError, Origin};

/// The header a forwarded request carries (the forwarding node's owner identity): a node that
/// does not run the shard answers such a request `503`, never sends it on (one hop at most).
pub(super) const X_FORWARDED_BY: &str = "x-actix-coordination-forwarded-by";

/// Why a request is not redirected to an advertised address.
#[derive(Debug)]
pub(super) enum NoRedirect {
    /// The address is not a valid one (what the store holds may come from anyone who can write).
    Invalid(AddressError),
    /// The address is the host and port this request came in on.
    CameInOn,
    /// The address is the one this node advertises itself.
    OwnAddress,
    /// The origin and the path make no header value (unreachable: both are header values).
    Location,
}

/// `307 Temporary Redirect` to the origin of `address` with `request`'s own path and query
/// (`307` keeps the method and the body), unless `address` is invalid, or names the same place
/// as `own` (this node's own advertised address) or as the host and port `request` came in on:
/// a redirect there would come straight back.
pub(super) fn redirect(
    address: &str,
    own: Option<&str>,
    request: &ServiceRequest,
) -> Result<HttpResponse, NoRedirect> {
    let location = header::HeaderValue::from_str(&target(address, own, request)?)
        .map_err(|_| NoRedirect::Location)?;
    let mut response = HttpResponse::TemporaryRedirect().finish();
    response.headers_mut().insert(header::LOCATION, location);
    Ok(response)
}

/// The URL a request sent on to `address` goes to: its origin with `request`'s own path and
/// query, unless `address` is invalid or names the same place as `own` or as the host and port
/// `request` came in on (the same checks as [`redirect`]'s).
pub(super) fn target(
    address: &str,
    own: Option<&str>,
    request: &ServiceRequest,
) -> Result<String, NoRedirect> {
    let origin = Origin::parse(address).map_err(NoRedirect::Invalid)?;
    if own
        .and_then(|own| Origin::parse(own).ok())
        .is_some_and(|own| own.same_place(&origin))
    {
        return Err(NoRedirect::OwnAddress);
    }
    let connection = request.connection_info();
    let came_in_on = request
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| {
            request
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
        });
    if came_in_on.is_some_and(|authority| origin.is_authority(&authority, connection.scheme())) {
        return Err(NoRedirect::CameInOn);
    }
    let path = match request.uri().path_and_query() {
        Some(p) if p.as_str().starts_with('/') => p.as_str(),
        _ => "/",
    };
    Ok(format!("{origin}{path}"))
}

/// `503 Service Unavailable` with `Retry-After` (`retry_after` in whole seconds, rounded up)
/// and `why` as the body.
pub(super) fn unavailable(why: impl Into<String>, retry_after: Duration) -> HttpResponse {
    HttpResponse::ServiceUnavailable()
        .insert_header((header::RETRY_AFTER, retry_after_seconds(retry_after)))
        .body(why.into())
}

/// `retry_after` in whole seconds, rounded up (`Retry-After` has no fractions).
pub(super) fn retry_after_seconds(retry_after: Duration) -> u64 {
    retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)
}

/// The last refused address warned about, per worker: the next refusals of the same address are
/// logged at `debug`, not `warn`.
#[derive(Debug, Default)]
pub(super) struct WarnOnce(RefCell<Option<String>>);

impl WarnOnce {
    /// Whether `address` is a new one to warn about (and remembers it).
    pub(super) fn first(&self, address: &str) -> bool {
        if self.0.borrow().as_deref() == Some(address) {
            return false;
        }
        *self.0.borrow_mut() = Some(address.to_owned());
        true
    }
}
