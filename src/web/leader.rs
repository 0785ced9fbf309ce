//! Routing to the leader: `GET /leader` and the [`LeaderOnly`] middleware.

use std::future::{ready, Ready};
use std::rc::Rc;
use std::time::Duration;

use actix::Recipient;
use actix_web::body::EitherBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header;
use actix_web::{web, HttpResponse};
use futures_util::future::LocalBoxFuture;
use serde::Serialize;

use super::redirect::{self, NoRedirect, WarnOnce};
use crate::actors::{GetLeader, LeaderInfo};

/// The JSON of `GET /leader`.
#[derive(Serialize)]
struct LeaderJson<'a> {
    holder: &'a str,
    fencing_token: Option<u64>,
    here: bool,
    this_node: bool,
    address: Option<&'a str>,
}

/// `GET /leader`: `200` with the leader as JSON (`holder`, `fencing_token`, `here`, `this_node`,
/// `address`: see [`LeaderInfo`]; the address as the store holds it), `503` when nobody leads as
/// this node sees it (or the manager is gone).
pub(super) async fn leader(manager: web::Data<Recipient<GetLeader>>) -> HttpResponse {
    match manager.send(GetLeader).await {
        Ok(Some(info)) => HttpResponse::Ok().json(LeaderJson {
            holder: &info.holder,
            fencing_token: info.fencing_token.map(|t| t.value()),
            here: info.here,
            this_node: info.this_node,
            address: info.address.as_deref(),
        }),
        Ok(None) => HttpResponse::ServiceUnavailable()
            .insert_header((header::RETRY_AFTER, "1"))
            .body("no leader right now"),
        Err(_) => HttpResponse::ServiceUnavailable().body("the singleton manager is gone"),
    }
}

/// Middleware for leader-only routes: a request reaches the wrapped handlers only on the node
/// that leads (its singleton runs here, [`GetLeader`] says `here`); another node answers
/// `307 Temporary Redirect` to the leader's advertised address
/// ([`Candidate::address`](crate::Candidate::address), published with the manager's
/// [`candidacy`](crate::ClusterSingletonManager::candidacy)): its scheme, host and port, with the
/// request's own path and query, and the leader's owner identity in `x-leader`. `307` keeps the
/// method and the body, so a `POST` is re-sent to the leader as it was.
///
/// It answers `503 Service Unavailable` with `Retry-After: 1` instead, and never redirects to
/// itself:
/// * when nobody leads, or the leader advertises no address;
/// * when the leader named is this node but its singleton does not run (`this_node` without
///   `here`: it is starting, or stopping for a handover or a shutdown);
/// * when the leader's address is this node's own (`this_node`), or the host and port this
///   request came in on (a redirect would come straight back);
/// * when the address the store holds is not a valid one (another version, or anyone who can
///   write the candidacy leases, may have written anything): it is parsed as
///   [`Candidate::address`](crate::Candidate::address) checks it, and anything else is
///   refused, with a `warn!` naming the lease, the leader and the address (once per address and
///   worker, then at `debug`). It never answers `500` for what the store holds.
///
/// The redirect goes wherever the leader's candidacy says: whoever can write the candidacy leases
/// (on Kubernetes, `update` or `create` on Leases in the namespace; on etcd, writes under the
/// prefix) can send the leader-only requests that reach the followers, bodies included, to any
/// host they name. Grant lease writes only to the service itself (see the README's "Security").
///
/// It routes, it does not guard: who leads can change between the check and the handler, and a
/// redirect can reach a node that has just stopped leading (which redirects again). The handler
/// itself must act only under the tenure (the singleton's guard and fencing token), as every
/// leader-only step must.
///
/// ```no_run
/// # use actix::prelude::*;
/// # use actix_coordination::{ClusterSingletonManager, GetLeader, LeaderOnly};
/// # use actix_web::{web, App, HttpResponse};
/// # fn app(manager: actix::Recipient<GetLeader>) {
/// let app = App::new().service(
///     web::scope("/jobs")
///         .wrap(LeaderOnly::new(manager))
///         .route("/run", web::post().to(|| async { HttpResponse::Accepted().finish() })),
/// );
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
#[derive(Clone)]
pub struct LeaderOnly {
    manager: Recipient<GetLeader>,
}

impl std::fmt::Debug for LeaderOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderOnly").finish_non_exhaustive()
    }
}

impl LeaderOnly {
    /// Leader-only routes for the singleton of `manager` (its address, or any actor answering
    /// [`GetLeader`]).
    pub fn new(manager: impl Into<Recipient<GetLeader>>) -> Self {
        Self {
            manager: manager.into(),
        }
    }
}

impl<S, B> Transform<S, ServiceRequest> for LeaderOnly
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Transform = LeaderOnlyService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(LeaderOnlyService {
            service: Rc::new(service),
            manager: self.manager.clone(),
            warned: Rc::default(),
        }))
    }
}

/// The service [`LeaderOnly`] wraps around the routes.
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
pub struct LeaderOnlyService<S> {
    service: Rc<S>,
    manager: Recipient<GetLeader>,
    /// The last refused address warned about (the next refusals of it are logged at `debug`).
    warned: Rc<WarnOnce>,
}

impl<S> std::fmt::Debug for LeaderOnlyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderOnlyService").finish_non_exhaustive()
    }
}

impl<S, B> Service<ServiceRequest> for LeaderOnlyService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let manager = self.manager.clone();
        let warned = Rc::clone(&self.warned);
        Box::pin(async move {
            let response = match manager.send(GetLeader).await {
                Ok(Some(LeaderInfo { here: true, .. })) => {
                    return service
                        .call(request)
                        .await
                        .map(ServiceResponse::map_into_left_body);
                }
                Ok(Some(info)) => elsewhere(&info, &request, &warned),
                Ok(None) => unavailable("no leader right now"),
                Err(_) => unavailable("the singleton manager is gone"),
            };
            Ok(request.into_response(response).map_into_right_body())
        })
    }
}

/// `503` with `Retry-After: 1`.
fn unavailable(why: impl Into<String>) -> HttpResponse {
    redirect::unavailable(why, Duration::from_secs(1))
}

/// The answer to a leader-only request on a node whose singleton does not run: a redirect to
/// the leader's origin with the request's path and query, or `503` (see [`LeaderOnly`]).
fn elsewhere(info: &LeaderInfo, request: &ServiceRequest, warned: &WarnOnce) -> HttpResponse {
    let mut response = answer_elsewhere(info, request, warned);
    // A holder identity that is no header value (a foreign writer) is left out.
    if let Ok(holder) = header::HeaderValue::from_str(&info.holder) {
        response
            .headers_mut()
            .insert(header::HeaderName::from_static("x-leader"), holder);
    }
    response
}

/// [`elsewhere`] without `x-leader`.
fn answer_elsewhere(
    info: &LeaderInfo,
    request: &ServiceRequest,
    warned: &WarnOnce,
) -> HttpResponse {
    let lease = info.lease.as_deref().unwrap_or("?");
    if info.this_node {
        tracing::debug!(%lease, holder = %info.holder, "leader-only request while this node's singleton does not run: 503");
        return unavailable(
            "the leader named is this node and its singleton does not run here (starting or \
             stopping, or a previous process at this address still holds the lease)",
        );
    }
    let Some(address) = &info.address else {
        return unavailable("the leader advertises no address to redirect to");
    };
    match redirect::redirect(address, None, request) {
        Ok(response) => response,
        Err(NoRedirect::Invalid(error)) => {
            if warned.first(address) {
                tracing::warn!(%lease, holder = %info.holder, ?address, %error, "the leader's advertised address is invalid: leader-only requests get 503");
            } else {
                tracing::debug!(%lease, holder = %info.holder, ?address, %error, "the leader's advertised address is invalid: 503");
            }
            unavailable("the leader advertises an invalid address")
        }
        Err(NoRedirect::CameInOn | NoRedirect::OwnAddress) => {
            if warned.first(address) {
                tracing::warn!(%lease, holder = %info.holder, ?address, "the leader advertises the host and port this request came in on: leader-only requests get 503 rather than a redirect back here");
            }
            unavailable("the leader advertises this node's own address")
        }
        // Unreachable (the origin and the request's path are both header values), but never a
        // `500`.
        Err(NoRedirect::Location) => unavailable("cannot redirect to the leader"),
    }
}

#[cfg(test)]
mod tests {
    use actix::prelude::*;
    use actix_web::{test, App};

    use super::*;
    use crate::FencingToken;

    /// Answers `GetLeader` with what it is told.
    struct Answer(Option<LeaderInfo>);

    impl Actor for Answer {
        type Context = Context<Self>;
    }

    impl Handler<GetLeader> for Answer {
        type Result = Option<LeaderInfo>;
        fn handle(&mut self, _: GetLeader, _: &mut Context<Self>) -> Option<LeaderInfo> {
            self.0.clone()
        }
    }

    type Answered = (
        actix_web::http::StatusCode,
        actix_web::http::header::HeaderMap,
        actix_web::web::Bytes,
    );

    async fn call(answer: Option<LeaderInfo>, uri: &str) -> Answered {
        call_manager(Answer(answer).start().recipient(), uri).await
    }

    /// `uri` on an app with `/leader` and the leader-only `/jobs/run` of `manager`.
    async fn call_manager(manager: Recipient<GetLeader>, uri: &str) -> Answered {
        let app = test::init_service(
            App::new()
                .app_data(web::Data::new(manager.clone()))
                .route("/leader", web::get().to(leader))
                .service(web::scope("/jobs").wrap(LeaderOnly::new(manager)).route(
                    "/run",
                    web::post().to(|| async { HttpResponse::Accepted().finish() }),
                )),
        )
        .await;
        let request = if uri == "/leader" {
            test::TestRequest::get()
        } else {
            test::TestRequest::post()
        };
        let response = test::call_service(&app, request.uri(uri).to_request()).await;
        let (status, headers) = (response.status(), response.headers().clone());
        (status, headers, test::read_body(response).await)
    }

    #[actix_rt::test]
    async fn the_leader_serves_the_others_redirect_and_nobody_means_503() {
        let token = Some(FencingToken::new(7));
        let here = LeaderInfo::new("a", token, true, Some("http://a:8080".into()));
        assert_eq!(call(Some(here), "/jobs/run?x=1").await.0, 202);

        let there = LeaderInfo::new("b", token, false, Some("http://b:8080/".into()));
        let (status, headers, _) = call(Some(there.clone()), "/jobs/run?x=1").await;
        assert_eq!(status, 307);
        assert_eq!(
            headers.get(header::LOCATION).unwrap(),
            "http://b:8080/jobs/run?x=1"
        );
        assert_eq!(headers.get("x-leader").unwrap(), "b");

        let silent = LeaderInfo::new("c", token, false, None);
        assert_eq!(call(Some(silent), "/jobs/run").await.0, 503);
        let (status, headers, _) = call(None, "/jobs/run").await;
        assert_eq!(status, 503);
        assert_eq!(headers.get(header::RETRY_AFTER).unwrap(), "1");

        let (status, _, body) = call(Some(there), "/leader").await;
        assert_eq!(status, 200);
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["holder"], "b");
        assert_eq!(json["fencing_token"], 7);
        assert_eq!(json["here"], false);
        assert_eq!(json["address"], "http://b:8080/");
        assert_eq!(call(None, "/leader").await.0, 503);
    }

    fn elsewhere(address: &str) -> LeaderInfo {
        LeaderInfo::new("b", Some(FencingToken::new(7)), false, Some(address.into()))
    }

    /// Asserts a `503` with `Retry-After` (never a `500`, never a redirect).
    async fn assert_unavailable(info: LeaderInfo, why: &str) {
        let (status, headers, body) = call(Some(info), "/jobs/run?x=1").await;
        assert_eq!(status, 503, "{why}: {headers:?} {body:?}");
        assert_eq!(headers.get(header::RETRY_AFTER).unwrap(), "1", "{why}");
        assert!(headers.get(header::LOCATION).is_none(), "{why}");
    }

    /// Whatever the store says, `LeaderOnly` answers a redirect to the leader's origin or a
    /// `503`: an address with a trailing newline (a YAML block scalar), an empty one (a relative
    /// redirect: to this very node), one with a path, a query, a fragment, user information,
    /// another scheme, no scheme, surrounding space or a control character.
    #[actix_rt::test]
    async fn an_invalid_advertised_address_means_503_never_500_nor_a_redirect() {
        for address in [
            "http://b:8080\n",
            "http://b:8080/\n",
            "",
            " ",
            "/",
            "http://b:8080/api",
            "http://b:8080/api/",
            "http://b:8080?x=1",
            "http://b:8080/?x=1",
            "http://b:8080#top",
            "http://user:secret@b:8080",
            "ftp://b:8080",
            "b:8080",
            "//b:8080",
            "http://",
            "http://:8080",
            "http://b:",
            "http://b:99999",
            " http://b:8080",
            "http://b\t:8080",
            "http://b:8080\r\nx-injected: 1",
            "http://bé:8080",
        ] {
            assert_unavailable(elsewhere(address), &format!("{address:?}")).await;
        }
    }

    /// A valid address elsewhere: `307` to its scheme, host and port, with the request's own path
    /// and query (the address's `/` is not doubled).
    #[actix_rt::test]
    async fn a_valid_leader_elsewhere_gets_a_redirect_to_its_origin_and_the_requests_path() {
        for (address, location) in [
            ("http://b:8080", "http://b:8080/jobs/run?x=1"),
            ("http://b:8080/", "http://b:8080/jobs/run?x=1"),
            (
                "https://b.example.com",
                "https://b.example.com/jobs/run?x=1",
            ),
            ("http://10.1.2.3:8080", "http://10.1.2.3:8080/jobs/run?x=1"),
            (
                "http://[fd00::1]:8080",
                "http://[fd00::1]:8080/jobs/run?x=1",
            ),
        ] {
            let (status, headers, _) = call(Some(elsewhere(address)), "/jobs/run?x=1").await;
            assert_eq!(status, 307, "{address}");
            assert_eq!(headers.get(header::LOCATION).unwrap(), location);
            assert_eq!(headers.get("x-leader").unwrap(), "b");
        }
    }

    /// The leader named is this node but its singleton does not run: `503`, never a redirect
    /// to this node's own address; `GET /leader` says so.
    #[actix_rt::test]
    async fn this_node_named_without_its_singleton_running_means_503() {
        let info = LeaderInfo::new("a", None, false, Some("http://a:8080".into()))
            .with_this_node(true)
            .with_lease("jobs");
        assert_unavailable(info.clone(), "this node").await;
        let (status, _, body) = call(Some(info), "/leader").await;
        assert_eq!(status, 200);
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (&json["here"], &json["this_node"]),
            (&false.into(), &true.into())
        );
    }

    /// A leader that advertises the host and port the request came in on: a redirect would come
    /// straight back, so `503`.
    #[actix_rt::test]
    async fn a_leader_advertising_the_requests_own_host_means_503() {
        let manager = Answer(Some(elsewhere("http://10.0.0.1:8080")))
            .start()
            .recipient();
        let app = test::init_service(App::new().service(
            web::scope("/jobs").wrap(LeaderOnly::new(manager)).route(
                "/run",
                web::post().to(|| async { HttpResponse::Accepted().finish() }),
            ),
        ))
        .await;
        for (host, status) in [
            ("10.0.0.1:8080", 503),
            ("10.0.0.2:8080", 307),
            ("10.0.0.1", 307),
        ] {
            let request = test::TestRequest::post()
                .uri("/jobs/run")
                .insert_header((header::HOST, host))
                .to_request();
            let response = test::call_service(&app, request).await;
            assert_eq!(response.status(), status, "{host}");
        }
    }

    /// A holder identity that cannot be a header value (a foreign writer) is left out of
    /// `x-leader`: the answer is still a redirect, not a `500`.
    #[actix_rt::test]
    async fn a_holder_that_is_no_header_value_is_left_out_of_x_leader() {
        let info = LeaderInfo::new("b\nc", None, false, Some("http://b:8080".into()));
        let (status, headers, _) = call(Some(info), "/jobs/run").await;
        assert_eq!(status, 307);
        assert!(headers.get("x-leader").is_none());
        let info = LeaderInfo::new("b\nc", None, false, None);
        assert_eq!(call(Some(info), "/jobs/run").await.0, 503);
    }

    /// A singleton that does not stop when told (its manager terminates it after the stop
    /// timeout), and says when it started and when it was told to stop.
    struct Lingering {
        started: Signal,
        stopping: Signal,
    }

    type Signal = std::rc::Rc<std::cell::RefCell<Option<tokio::sync::oneshot::Sender<()>>>>;

    impl Actor for Lingering {
        type Context = Context<Self>;

        fn started(&mut self, _: &mut Context<Self>) {
            if let Some(tx) = self.started.borrow_mut().take() {
                let _ = tx.send(());
            }
        }

        fn stopping(&mut self, _: &mut Context<Self>) -> Running {
            if let Some(tx) = self.stopping.borrow_mut().take() {
                let _ = tx.send(());
            }
            Running::Continue
        }
    }

    type Node = Addr<crate::ClusterSingletonManager<Lingering, crate::InMemoryLease>>;

    /// A manager of lease `jobs` for `owner` on `store`, with a candidacy advertising `address`,
    /// whose singleton lingers; the receivers say when its singleton started and was told to stop.
    fn node(
        store: &crate::InMemoryStore,
        owner: &str,
        address: &str,
    ) -> (
        Node,
        tokio::sync::oneshot::Receiver<()>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (stopping_tx, stopping) = tokio::sync::oneshot::channel();
        let (started_tx, stopping_tx): (Signal, Signal) = (
            std::rc::Rc::new(std::cell::RefCell::new(Some(started_tx))),
            std::rc::Rc::new(std::cell::RefCell::new(Some(stopping_tx))),
        );
        let settings = crate::LeaseSettings::new("jobs", owner).unwrap();
        let candidate = crate::Candidate::new().address(address).unwrap();
        let candidacies = store.clone();
        let manager =
            crate::ClusterSingletonManager::new(store.lease(settings), move |_, _| Lingering {
                started: started_tx.clone(),
                stopping: stopping_tx.clone(),
            })
            .settings(crate::SingletonSettings {
                stop_timeout: std::time::Duration::from_secs(600),
                ..Default::default()
            })
            .candidacy(candidate, move |s| {
                Ok::<_, std::convert::Infallible>(candidacies.lease(s))
            })
            .unwrap()
            .start();
        (manager, started, stopping)
    }

    /// Polls `manager`'s `GetLeader` until `until` holds (the watches of the store deliver
    /// asynchronously), for at most 10 s.
    async fn leader_until(manager: &Node, until: impl Fn(&LeaderInfo) -> bool) -> LeaderInfo {
        let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(info) = manager.send(GetLeader).await.unwrap() {
                if until(&info) {
                    return info;
                }
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "GetLeader never held"
            );
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// The leader whose singleton is stopping (a shutdown in a rolling update) still holds the
    /// lease and names itself: it answers `503` with `Retry-After`, never a redirect to its own
    /// address; `GET /leader` still names it.
    #[actix_rt::test]
    async fn a_leader_whose_singleton_is_stopping_never_redirects_to_itself() {
        let store = crate::InMemoryStore::new();
        let (a, started, stopping) = node(&store, "a", "http://a:8080");
        started.await.unwrap();
        let (status, _, _) = call_manager(a.clone().recipient(), "/jobs/run").await;
        assert_eq!(status, 202, "the leader serves");
        a.do_send(crate::Shutdown);
        stopping.await.unwrap();
        assert_eq!(store.holder("jobs").as_deref(), Some("a"), "still held");
        let (status, headers, body) = call_manager(a.clone().recipient(), "/jobs/run?x=1").await;
        assert_eq!(status, 503, "{headers:?} {body:?}");
        assert_eq!(headers.get(header::RETRY_AFTER).unwrap(), "1");
        assert!(headers.get(header::LOCATION).is_none());
        let (status, _, body) = call_manager(a.clone().recipient(), "/leader").await;
        assert_eq!(status, 200);
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["holder"], "a", "{json}");
        assert_eq!(json["here"], false, "{json}");
        assert_eq!(json["this_node"], true, "{json}");
        let info = a.send(GetLeader).await.unwrap().unwrap();
        assert_eq!(info.lease.as_deref(), Some("jobs"));
        assert_eq!(info.address.as_deref(), Some("http://a:8080"));
    }

    /// A leader that advertises this node's own address (a previous process on this address,
    /// under another owner identity, whose claim has not expired): `503`, never a redirect here.
    #[actix_rt::test]
    async fn a_leader_advertising_this_nodes_own_address_is_not_redirected_to() {
        let store = crate::InMemoryStore::new();
        let (a, started, _) = node(&store, "a", "http://10.0.0.1:8080");
        started.await.unwrap();
        let (b, _, _) = node(&store, "b", "http://10.0.0.1:8080/");
        let (c, _, _) = node(&store, "c", "http://10.0.0.3:8080");
        for follower in [&b, &c] {
            leader_until(follower, |l| l.holder == "a" && l.address.is_some()).await;
        }
        let (status, headers, _) = call_manager(c.recipient(), "/jobs/run").await;
        assert_eq!(status, 307);
        assert_eq!(
            headers.get(header::LOCATION).unwrap(),
            "http://10.0.0.1:8080/jobs/run"
        );
        let info = b.send(GetLeader).await.unwrap().unwrap();
        assert!(!info.here && info.this_node, "{info:?}");
        let (status, headers, body) = call_manager(b.recipient(), "/jobs/run").await;
        assert_eq!(status, 503, "{headers:?} {body:?}");
        assert_eq!(headers.get(header::RETRY_AFTER).unwrap(), "1");
        drop(a);
    }
}
