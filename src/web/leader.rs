//! Routing to the leader: `GET /leader` and the [`LeaderOnly`] middleware.

use std::future::{ready, Ready};
use std::rc::Rc;

use actix::Recipient;
use actix_web::body::EitherBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header;
use actix_web::{web, HttpResponse};
use futures_util::future::LocalBoxFuture;
use serde::Serialize;

use crate::actors::{GetLeader, LeaderInfo};

/// The JSON of `GET /leader`.
#[derive(Serialize)]
struct LeaderJson<'a> {
    holder: &'a str,
    fencing_token: Option<u64>,
    here: bool,
    address: Option<&'a str>,
}

/// `GET /leader`: `200` with the leader as JSON (`holder`, `fencing_token`, `here`, `address`),
/// `503` when nobody leads as this node sees it (or the manager is gone).
pub(super) async fn leader(manager: web::Data<Recipient<GetLeader>>) -> HttpResponse {
    match manager.send(GetLeader).await {
        Ok(Some(info)) => HttpResponse::Ok().json(LeaderJson {
            holder: &info.holder,
            fencing_token: info.fencing_token.map(|t| t.value()),
            here: info.here,
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
/// `307 Temporary Redirect` to the same path and query on the leader's advertised address
/// ([`Candidate::address`](crate::Candidate::address), published with the manager's
/// [`candidacy`](crate::ClusterSingletonManager::candidacy)), with the leader's owner identity in
/// `x-leader`. `307` keeps the method and the body, so a `POST` is re-sent to the leader as it
/// was. When nobody leads, or the leader advertises no address, it answers `503` with
/// `Retry-After: 1`.
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
        }))
    }
}

/// The service [`LeaderOnly`] wraps around the routes.
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
pub struct LeaderOnlyService<S> {
    service: Rc<S>,
    manager: Recipient<GetLeader>,
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
        Box::pin(async move {
            let response = match manager.send(GetLeader).await {
                Ok(Some(LeaderInfo { here: true, .. })) => {
                    return service
                        .call(request)
                        .await
                        .map(ServiceResponse::map_into_left_body);
                }
                Ok(Some(info)) => match &info.address {
                    Some(address) => {
                        let path = request
                            .uri()
                            .path_and_query()
                            .map_or("/", |p| p.as_str())
                            .to_owned();
                        HttpResponse::TemporaryRedirect()
                            .insert_header((
                                header::LOCATION,
                                format!("{}{path}", address.trim_end_matches('/')),
                            ))
                            .insert_header(("x-leader", info.holder.clone()))
                            .finish()
                    }
                    None => HttpResponse::ServiceUnavailable()
                        .insert_header((header::RETRY_AFTER, "1"))
                        .insert_header(("x-leader", info.holder.clone()))
                        .body(format!(
                            "{} leads and advertises no address to redirect to",
                            info.holder
                        )),
                },
                Ok(None) => HttpResponse::ServiceUnavailable()
                    .insert_header((header::RETRY_AFTER, "1"))
                    .body("no leader right now"),
                Err(_) => HttpResponse::ServiceUnavailable().body("the singleton manager is gone"),
            };
            Ok(request.into_response(response).map_into_right_body())
        })
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

    async fn call(
        answer: Option<LeaderInfo>,
        uri: &str,
    ) -> (
        actix_web::http::StatusCode,
        actix_web::http::header::HeaderMap,
        actix_web::web::Bytes,
    ) {
        let manager = Answer(answer).start().recipient();
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
}
