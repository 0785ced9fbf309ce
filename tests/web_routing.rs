//! actix-web routing to a shard's owner (issue 38, item 3), in memory under a paused clock:
//! `ShardRouting` serves a request on the node that runs its entity's shard, with that shard's
//! guard and fencing token; redirects it (`307`, the same path and query) on every other node;
//! answers `503` with `Retry-After` while the shard has no live holder or when a redirect would
//! come back here; never runs the handler once the tenure ended; sends nothing to the store; and
//! refuses bad input with typed errors, never a redirect.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    shard_for, shard_lease_name, EntityId, GetShards, InMemoryStore, Lease, LeaseSettings,
    RoutedShard, ShardDirectory, ShardInfo, ShardRouting, ShardRoutingError, ShardedWorkers,
    SharedLease, Shutdown, TenureEnd,
};
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderMap, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::middleware::{from_fn, Next};
use actix_web::test as web_test;
use actix_web::{web, App, HttpMessage, HttpResponse};
use common::run_paused;

const GROUP: &str = "orders";
const SHARDS: usize = 12;
const TTL: Duration = Duration::from_secs(6);

struct Worker;

impl Actor for Worker {
    type Context = Context<Self>;
}

type Node = Addr<ShardedWorkers<Worker, SharedLease>>;

/// The leases a node built, by name (to end a tenure from the test).
type Leases = Arc<Mutex<HashMap<String, SharedLease>>>;

fn settings(name: &str, node: &str) -> LeaseSettings {
    LeaseSettings::builder(name, node)
        .ttl(TTL)
        .renewal_interval(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn address(node: &str) -> String {
    format!("http://{node}.example:8080")
}

/// Node `node` of the group, started, advertising `address`; its directory and its leases.
fn start(store: &InMemoryStore, node: &str, address: &str) -> (Node, ShardDirectory, Leases) {
    let leases = Leases::default();
    let (built, store, owner) = (Arc::clone(&leases), store.clone(), node.to_owned());
    let member = store.clone();
    let workers = ShardedWorkers::with_count(
        GROUP,
        SHARDS,
        move |name: &str| {
            let lease = SharedLease::new(store.lease(settings(name, &owner)));
            built.lock().unwrap().insert(name.to_owned(), lease.clone());
            lease
        },
        |_: &ShardInfo, _: &mut Context<Worker>| Worker,
    )
    .unwrap()
    .advertise(address, move |s| {
        Ok::<_, Infallible>(SharedLease::new(member.lease(s)))
    })
    .unwrap();
    let directory = workers.directory();
    (workers.start(), directory, leases)
}

/// Waits until each of `nodes` runs `each` shards.
async fn settle(nodes: &[&Node], each: usize) {
    for _ in 0..600 {
        let mut all = true;
        for node in nodes {
            all &= node.send(GetShards).await.unwrap().len() == each;
        }
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the nodes did not settle on {each} shards each");
}

/// How many times the handlers ran.
#[derive(Clone, Default)]
struct Served(Arc<AtomicUsize>);

impl Served {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// The routed handler: counts itself, answers the shard, its token and this node as JSON.
async fn order(routed: RoutedShard, served: web::Data<Served>) -> HttpResponse {
    served.0.fetch_add(1, Ordering::SeqCst);
    assert!(routed.check_alive());
    assert_eq!(routed.fencing_token, routed.guard.token());
    HttpResponse::Ok().json(serde_json::json!({
        "group": routed.group,
        "shard": routed.shard,
        "index": routed.index,
        "owner": routed.owner,
        "token": routed.fencing_token.value(),
    }))
}

/// An app with `/orders/{id}` routed by `routing`, counting into `served` (a macro: the
/// service's request type is actix-http's, not named here).
macro_rules! app {
    ($routing:expr, $served:expr $(,)?) => {
        web_test::init_service(
            App::new()
                .app_data(web::Data::new($served.clone()))
                .service(
                    web::resource("/orders/{id}")
                        .wrap($routing)
                        .route(web::get().to(order)),
                ),
        )
        .await
    };
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

/// Calls `$app` with `$request` (a `TestRequest`): the [`Answer`].
macro_rules! get {
    ($app:expr, $request:expr) => {
        answer(web_test::call_service($app, $request.to_request()).await).await
    };
}

async fn answer(response: ServiceResponse<impl MessageBody>) -> Answer {
    let (status, headers) = (response.status(), response.headers().clone());
    let body = web_test::read_body(response).await;
    Answer {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

fn uri(uri: &str) -> web_test::TestRequest {
    web_test::TestRequest::get().uri(uri)
}

/// Asserts a `503` with `Retry-After: retry_after`, no redirect, and the shard in `x-shard`.
fn assert_unavailable(answer: &Answer, retry_after: &str, shard: &str, why: &str) {
    assert_eq!(answer.status, 503, "{why}: {}", answer.body);
    assert_eq!(answer.header("retry-after"), Some(retry_after), "{why}");
    assert_eq!(answer.header("location"), None, "{why}");
    assert_eq!(answer.header("x-shard"), Some(shard), "{why}");
}

/// Three nodes: each serves the entities whose shard it runs, with that shard's current token
/// (the store's), and redirects every other request to the holder's address with the same path
/// and query; a request is served by exactly one node, and routing sends nothing to the store.
#[test]
fn the_holder_serves_the_others_redirect_and_nothing_reaches_the_store() {
    run_paused(async {
        let store = InMemoryStore::new();
        let nodes: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|n| (n.to_string(), start(&store, n, &address(n))))
            .collect();
        let addrs: Vec<&Node> = nodes.iter().map(|(_, (node, _, _))| node).collect();
        settle(&addrs, SHARDS / 3).await;
        let served = Served::default();
        let mut apps = Vec::new();
        for (name, (_, directory, _)) in &nodes {
            let routing = ShardRouting::new(directory.clone(), EntityId::path("id"));
            apps.push((name.clone(), app!(routing, &served)));
        }
        let calls = store.stats().calls;
        let entities = 60;
        for i in 0..entities {
            let entity = format!("customer-{i}");
            let shard = shard_for(&entity, SHARDS).to_string();
            let record = store.record(&shard_lease_name(GROUP, &shard)).unwrap();
            let holder = record.holder.clone().unwrap();
            let path = format!("/orders/{entity}?x=1&note=a%20b");
            for (name, app) in &apps {
                let answer = get!(app, uri(&path));
                assert_eq!(answer.header("x-shard"), Some(shard.as_str()));
                if *name == holder {
                    assert_eq!(answer.status, 200, "{name}: {}", answer.body);
                    let json = answer.json();
                    assert_eq!(json["shard"], shard.as_str());
                    assert_eq!(json["index"], shard.parse::<usize>().unwrap());
                    assert_eq!(json["owner"], name.as_str());
                    assert_eq!(json["group"], GROUP);
                    assert_eq!(json["token"], record.token.value(), "the store's token");
                } else {
                    assert_eq!(answer.status, 307, "{name}: {}", answer.body);
                    assert_eq!(
                        answer.header("location"),
                        Some(format!("{}{path}", address(&holder)).as_str())
                    );
                    assert_eq!(answer.header("x-shard-holder"), Some(holder.as_str()));
                    assert_eq!(answer.body, "");
                }
            }
        }
        assert_eq!(
            served.count(),
            entities,
            "exactly one node serves each request"
        );
        assert_eq!(
            store.stats().calls - calls,
            0,
            "routing 180 requests sent calls to the store"
        );
        for node in addrs {
            assert!(node.send(Shutdown).await.unwrap().unwrap());
        }
    });
}

/// A shard nobody holds (its node stopped and released it) is answered `503` with the configured
/// `Retry-After` (1 s unless set, whole seconds rounded up), as is a holder that advertises no
/// address; the handler never runs.
#[test]
fn a_shard_without_a_live_holder_or_address_is_503_with_retry_after() {
    run_paused(async {
        let store = InMemoryStore::new();
        let (a, directory, _) = start(&store, "a", &address("a"));
        settle(&[&a], SHARDS).await;
        assert!(a.send(Shutdown).await.unwrap().unwrap());
        let served = Served::default();
        let default = app!(
            ShardRouting::new(directory.clone(), EntityId::path("id")),
            &served,
        );
        let slow = app!(
            ShardRouting::new(directory.clone(), EntityId::path("id"))
                .retry_after(Duration::from_millis(2500)),
            &served,
        );
        for i in 0..20 {
            let entity = format!("customer-{i}");
            let shard = shard_for(&entity, SHARDS).to_string();
            let path = format!("/orders/{entity}");
            let answer = get!(&default, uri(&path));
            assert_unavailable(&answer, "1", &shard, "released");
            assert!(answer.body.contains("no live holder"), "{}", answer.body);
            assert_unavailable(&get!(&slow, uri(&path)), "3", &shard, "released");
        }
        // A holder without a member record (no address): 503, never a redirect.
        store.force_take(&shard_lease_name(GROUP, "3"), "ghost", TTL);
        let by_shard = web_test::init_service(
            App::new().app_data(web::Data::new(served.clone())).service(
                web::resource("/shards/{shard}")
                    .wrap(
                        ShardRouting::new(directory.clone(), EntityId::path("shard")).by_shard_id(),
                    )
                    .route(web::get().to(order)),
            ),
        )
        .await;
        let mut answer = get!(&by_shard, uri("/shards/3"));
        for _ in 0..100 {
            if answer.body.contains("ghost") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            answer = get!(&by_shard, uri("/shards/3"));
        }
        assert_unavailable(&answer, "1", "3", "no address");
        assert!(
            answer
                .body
                .contains(r#"the holder "ghost" of shard "3" advertises no valid address"#),
            "{}",
            answer.body
        );
        assert_unavailable(&get!(&by_shard, uri("/shards/4")), "1", "4", "released");
        assert_eq!(served.count(), 0);
    });
}

/// Releases the lease of the routed request's shard before passing the request on: the tenure
/// ends after `ShardRouting` routed the request here, before the handler runs.
async fn release_first(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let shard = request
        .extensions()
        .get::<RoutedShard>()
        .unwrap()
        .shard
        .clone();
    let leases = request.app_data::<web::Data<Leases>>().unwrap().clone();
    let lease = leases.lock().unwrap()[&shard_lease_name(GROUP, &shard)].clone();
    assert!(lease.release().await.unwrap());
    next.call(request).await
}

/// A request routed here whose shard's tenure ends before the handler runs (the lease released
/// in between) is answered `503`, and the handler does not run; a handler sees the end of the
/// tenure it was routed under on the guard it got.
#[test]
fn a_request_whose_tenure_ended_after_routing_is_never_served() {
    run_paused(async {
        let store = InMemoryStore::new();
        let (a, directory, leases) = start(&store, "a", &address("a"));
        settle(&[&a], SHARDS).await;
        let served = Served::default();
        let routing = ShardRouting::new(directory.clone(), EntityId::path("id"));
        let app = web_test::init_service(
            App::new()
                .app_data(web::Data::new(served.clone()))
                .app_data(web::Data::new(Arc::clone(&leases)))
                .service(
                    web::resource("/orders/{id}")
                        .wrap(from_fn(release_first))
                        .wrap(routing.clone())
                        .route(web::get().to(order)),
                )
                .service(
                    web::resource("/check/{id}")
                        .wrap(routing)
                        .route(web::get().to(
                            |routed: RoutedShard, leases: web::Data<Leases>| async move {
                                assert!(routed.check_alive());
                                let lease = leases.lock().unwrap()
                                    [&shard_lease_name(GROUP, &routed.shard)]
                                    .clone();
                                assert!(lease.release().await.unwrap());
                                assert!(!routed.check_alive(), "the handler re-checks");
                                assert_eq!(routed.guard.end(), Some(TenureEnd::Released));
                                HttpResponse::Ok().finish()
                            },
                        )),
                ),
        )
        .await;
        let entity = "customer-1";
        let shard = shard_for(entity, SHARDS).to_string();
        let answer = get!(&app, uri(&format!("/orders/{entity}")));
        assert_unavailable(&answer, "1", &shard, "ended in flight");
        assert!(
            answer
                .body
                .contains(&format!("this node's tenure of shard \"{shard}\" ended")),
            "{}",
            answer.body
        );
        assert_eq!(served.count(), 0, "the handler ran after the tenure ended");

        // Another shard is served, and its handler sees the release on the guard it got.
        let other = (0..)
            .map(|i| format!("customer-{i}"))
            .find(|e| shard_for(e, SHARDS).to_string() != shard)
            .unwrap();
        let answer = get!(&app, uri(&format!("/check/{other}")));
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(a.send(Shutdown).await.unwrap().unwrap());
    });
}

/// A holder that advertises this node's own address (a previous process at this address under
/// another owner identity), or the host and port the request came in on, is answered `503`,
/// never a redirect that would come straight back.
#[test]
fn a_redirect_that_would_come_back_here_is_503() {
    run_paused(async {
        let store = InMemoryStore::new();
        let (a, da, _) = start(&store, "a", &address("a"));
        let (a2, da2, _) = start(&store, "a2", &format!("{}/", address("a")));
        let (b, db, _) = start(&store, "b", &address("b"));
        settle(&[&a, &a2, &b], SHARDS / 3).await;
        let served = Served::default();
        let on_a = app!(ShardRouting::new(da, EntityId::path("id")), &served);
        let on_a2 = app!(ShardRouting::new(da2, EntityId::path("id")), &served);
        let on_b = app!(ShardRouting::new(db, EntityId::path("id")), &served);
        let (mut loops, mut redirects) = (0, 0);
        for i in 0..40 {
            let entity = format!("customer-{i}");
            let shard = shard_for(&entity, SHARDS).to_string();
            let holder = store.holder(&shard_lease_name(GROUP, &shard)).unwrap();
            let path = format!("/orders/{entity}");
            let (here, there) = match holder.as_str() {
                "a" => (&on_a, &on_a2),
                "a2" => (&on_a2, &on_a),
                _ => {
                    // b's shards: redirected from a and a2 alike; from b itself, a request
                    // that came in on a's host and port still is not.
                    assert_eq!(get!(&on_a, uri(&path)).status, 307);
                    let host = uri(&path).insert_header((header::HOST, "b.example:8080"));
                    assert_unavailable(&get!(&on_a, host), "1", &shard, "came in on b");
                    redirects += 1;
                    continue;
                }
            };
            assert_eq!(get!(here, uri(&path)).status, 200);
            let answer = get!(there, uri(&path));
            assert_unavailable(&answer, "1", &shard, "own address");
            assert!(
                answer.body.contains("advertises this node's own address"),
                "{}",
                answer.body
            );
            // b redirects to a's address, whichever of a and a2 holds it.
            let answer = get!(&on_b, uri(&path));
            assert_eq!(answer.status, 307);
            assert_eq!(
                answer.header("location"),
                Some(format!("{}{path}", address("a")).as_str())
            );
            loops += 1;
        }
        assert!(loops > 0 && redirects > 0, "{loops} {redirects}");
        for node in [a, a2, b] {
            assert!(node.send(Shutdown).await.unwrap().unwrap());
        }
    });
}

/// A request another node forwarded (it carries `x-actix-coordination-forwarded-by`) for a shard
/// this node does not run is `503`, never redirected (one hop at most, in redirect mode too); on
/// the holder it is served.
#[test]
fn a_forwarded_request_for_a_shard_elsewhere_is_503_never_redirected() {
    run_paused(async {
        let store = InMemoryStore::new();
        let (a, da, _) = start(&store, "a", &address("a"));
        let (b, db, _) = start(&store, "b", &address("b"));
        settle(&[&a, &b], SHARDS / 2).await;
        let served = Served::default();
        let on_a = app!(ShardRouting::new(da, EntityId::path("id")), &served);
        let on_b = app!(ShardRouting::new(db, EntityId::path("id")), &served);
        for i in 0..20 {
            let entity = format!("customer-{i}");
            let shard = shard_for(&entity, SHARDS).to_string();
            let holder = store.holder(&shard_lease_name(GROUP, &shard)).unwrap();
            let (here, there) = if holder == "a" {
                (&on_a, &on_b)
            } else {
                (&on_b, &on_a)
            };
            let forwarded = || {
                uri(&format!("/orders/{entity}"))
                    .insert_header(("x-actix-coordination-forwarded-by", "c"))
            };
            let answer = get!(there, forwarded());
            assert_unavailable(
                &answer,
                "1",
                &shard,
                "forwarded to a node without the shard",
            );
            assert_eq!(
                answer.body,
                format!("shard {shard:?} was forwarded here by \"c\", but does not run here")
            );
            assert_eq!(get!(here, forwarded()).status, 200, "served on the holder");
        }
        assert_eq!(served.count(), 20, "only the holders served");
        for node in [a, b] {
            assert!(node.send(Shutdown).await.unwrap().unwrap());
        }
    });
}

/// Bad input is refused with a typed error and its status, never a redirect nor a panic: no id,
/// an empty one, a header that is not text, an id the function refuses (an unknown format), a
/// shard id the group does not have, a shard function out of range, a header name that is none,
/// and a handler whose route is not routed.
#[test]
fn bad_input_is_refused_with_typed_errors_never_a_redirect() {
    run_paused(async {
        let store = InMemoryStore::new();
        let (a, da, _) = start(&store, "a", &address("a"));
        let (b, _db, _) = start(&store, "b", &address("b"));
        settle(&[&a, &b], SHARDS / 2).await;
        assert!(matches!(
            EntityId::header("not a header"),
            Err(ShardRoutingError::HeaderName { name }) if name == "not a header"
        ));
        let by_format = EntityId::from_fn(|request: &actix_web::HttpRequest| {
            let id = request
                .query_string()
                .strip_prefix("customer=")
                .unwrap_or("");
            match id.strip_prefix("customer-") {
                Some(n) if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) => {
                    Ok(id.to_owned())
                }
                _ => Err(format!("unknown entity id format {id:?}")),
            }
        });
        let served = Served::default();
        let app = web_test::init_service(
            App::new()
                .app_data(web::Data::new(served.clone()))
                .service(
                    web::resource("/header")
                        .wrap(ShardRouting::new(
                            da.clone(),
                            EntityId::header("x-entity-id").unwrap(),
                        ))
                        .route(web::get().to(order)),
                )
                .service(
                    web::resource("/format")
                        .wrap(ShardRouting::new(da.clone(), by_format))
                        .route(web::get().to(order)),
                )
                .service(
                    web::resource("/shards/{shard}")
                        .wrap(ShardRouting::new(da.clone(), EntityId::path("shard")).by_shard_id())
                        .route(web::get().to(order)),
                )
                .service(
                    web::resource("/segment/{id}")
                        .wrap(ShardRouting::new(da.clone(), EntityId::path("entity")))
                        .route(web::get().to(order)),
                )
                .service(
                    web::resource("/broken/{id}")
                        .wrap(ShardRouting::new(
                            da.clone()
                                .with_shard_function(|_: &str, shards: usize| shards),
                            EntityId::path("id"),
                        ))
                        .route(web::get().to(order)),
                )
                .route("/unrouted", web::get().to(order)),
        )
        .await;
        let header = |value: HeaderValue| uri("/header").insert_header(("x-entity-id", value));
        let cases = [
            (
                uri("/header"),
                400,
                r#"the request has no header "x-entity-id""#,
            ),
            (
                header(HeaderValue::from_static("")),
                400,
                "the request's entity id is empty",
            ),
            (
                header(HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap()),
                400,
                r#"the request's header "x-entity-id" is not visible ascii"#,
            ),
            (
                uri("/format?customer=order-7"),
                400,
                r#"the request's entity id was refused: unknown entity id format "order-7""#,
            ),
            (uri("/format"), 400, "the request's entity id was refused"),
            (
                uri("/shards/12"),
                400,
                r#"cannot locate the request's shard: group "orders" has no shard "12""#,
            ),
            (
                uri("/shards/member.a"),
                400,
                r#"cannot locate the request's shard: group "orders" has no shard "member.a""#,
            ),
            (
                uri("/segment/customer-1"),
                400,
                r#"the request's path has no segment "entity""#,
            ),
            (
                uri("/broken/customer-1"),
                500,
                "cannot locate the request's shard: the shard function put entity",
            ),
            (
                uri("/unrouted"),
                500,
                "the request was not routed by ShardRouting",
            ),
        ];
        for (request, status, text) in cases {
            let answer = get!(&app, request);
            assert_eq!(answer.status, status, "{text}: {}", answer.body);
            assert!(
                answer.body.starts_with(text),
                "{text:?} in {:?}",
                answer.body
            );
            assert_eq!(answer.header("location"), None, "{text}");
        }
        assert_eq!(served.count(), 0);
        // The same sources route good input: served here or redirected to b.
        for request in [
            uri("/header").insert_header(("x-entity-id", "customer-7")),
            uri("/format?customer=customer-7"),
            uri("/shards/7"),
        ] {
            let status = get!(&app, request).status;
            assert!(status == 200 || status == 307, "{status}");
        }
        for node in [a, b] {
            assert!(node.send(Shutdown).await.unwrap().unwrap());
        }
    });
}
