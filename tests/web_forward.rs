//! `ShardRouting::forward` (feature `web-forward`, issue 38 item 3) on real sockets and a real
//! clock: nodes on one `InMemoryStore`, each serving a real `HttpServer` on 127.0.0.1 and
//! advertising its address. A request for another node's shard is sent on to that node and
//! answered by its handler (method, path, query, headers and body intact; its answer's status,
//! headers and body back, with `x-shard` and `x-shard-holder`); a forwarded request that reaches a
//! node that does not run the shard is `503`, never sent on again; a holder that refuses
//! connections or never answers is `502`, within the forward's timeout.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::convert::Infallible;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_coordination::{
    shard_for, shard_lease_name, EntityId, ForwardSettings, GetShards, InMemoryStore,
    LeaseSettings, RoutedShard, ShardInfo, ShardRouting, ShardedWorkers, SharedLease, Shutdown,
};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use common::run_real;

const GROUP: &str = "orders";
const SHARDS: usize = 8;

struct Worker;

impl Actor for Worker {
    type Context = Context<Self>;
}

type Node = Addr<ShardedWorkers<Worker, SharedLease>>;

/// A node of the group on `store`, advertising `address`, with its routing (forwarding, with
/// `timeout`).
fn start(
    store: &InMemoryStore,
    node: &str,
    address: &str,
    timeout: Duration,
) -> (Node, ShardRouting) {
    let (leases, member, owner) = (store.clone(), store.clone(), node.to_owned());
    let workers = ShardedWorkers::with_count(
        GROUP,
        SHARDS,
        move |name: &str| {
            let settings = LeaseSettings::builder(name, &owner)
                .ttl(Duration::from_secs(3))
                .renewal_interval(Duration::from_secs(1))
                .build()
                .unwrap();
            SharedLease::new(leases.lease(settings))
        },
        |_: &ShardInfo, _: &mut Context<Worker>| Worker,
    )
    .unwrap()
    .advertise(address, move |s| {
        Ok::<_, Infallible>(SharedLease::new(member.lease(s)))
    })
    .unwrap();
    let routing = ShardRouting::new(workers.directory(), EntityId::path("id"))
        .forward_with(ForwardSettings::new().timeout(timeout));
    (workers.start(), routing)
}

/// Waits (30 s at most) until each of `nodes` runs `each` shards.
async fn settle(nodes: &[&Node], each: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut all = true;
        for node in nodes {
            all &= node.send(GetShards).await.unwrap().len() == each;
        }
        if all {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the nodes did not settle on {each} shards each"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The routed handler: answers the method, the query, a request header, the body and who ran it
/// (as JSON), with a header of its own.
async fn order(routed: RoutedShard, request: HttpRequest, body: web::Bytes) -> HttpResponse {
    assert!(routed.check_alive());
    HttpResponse::Created()
        .insert_header(("x-served-by", routed.owner.clone()))
        .json(serde_json::json!({
            "method": request.method().as_str(),
            "query": request.query_string(),
            "x-test": request.headers().get("x-test").and_then(|v| v.to_str().ok()),
            "forwarded-by": request
                .headers()
                .get("x-actix-coordination-forwarded-by")
                .and_then(|v| v.to_str().ok()),
            "body": String::from_utf8_lossy(&body),
            "shard": routed.shard,
            "owner": routed.owner,
            "token": routed.fencing_token.value(),
        }))
}

/// A real server on `listener` with `/orders/{id}` routed by `routing` (one worker).
fn serve(listener: TcpListener, routing: ShardRouting) -> actix_web::dev::ServerHandle {
    let server = HttpServer::new(move || {
        App::new().service(
            web::resource("/orders/{id}")
                .wrap(routing.clone())
                .route(web::get().to(order))
                .route(web::post().to(order)),
        )
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    let handle = server.handle();
    actix_rt::spawn(server);
    handle
}

/// A listener on 127.0.0.1 and its address as advertised.
fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    (listener, address)
}

/// An entity of a shard that `holder` holds in `store`.
fn entity_held_by(store: &InMemoryStore, holder: &str) -> (String, String) {
    (0..)
        .map(|i| format!("customer-{i}"))
        .find_map(|entity| {
            let shard = shard_for(&entity, SHARDS).to_string();
            let record = store.record(&shard_lease_name(GROUP, &shard))?;
            (record.holder.as_deref() == Some(holder)).then_some((entity, shard))
        })
        .unwrap()
}

fn header(response: &awc::ClientResponse<impl Sized>, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

/// A request to the node that does not run the shard is forwarded once to its holder, whose
/// handler answers it (GET with its query and headers, POST with its body, sized or chunked); a
/// request that already carries the forwarded-by header and reaches a node without the shard is
/// `503`.
#[test]
fn a_request_is_forwarded_once_to_the_holder_and_answered_by_it() {
    run_real(async {
        let store = InMemoryStore::new();
        let (listener_a, address_a) = listener();
        let (listener_b, address_b) = listener();
        let timeout = Duration::from_secs(10);
        let (a, routing_a) = start(&store, "a", &address_a, timeout);
        let (b, routing_b) = start(&store, "b", &address_b, timeout);
        settle(&[&a, &b], SHARDS / 2).await;
        let (server_a, server_b) = (serve(listener_a, routing_a), serve(listener_b, routing_b));
        let client = awc::Client::builder()
            .timeout(Duration::from_secs(20))
            .disable_redirects()
            .finish();
        let (entity, shard) = entity_held_by(&store, "a");
        let token = store
            .record(&shard_lease_name(GROUP, &shard))
            .unwrap()
            .token
            .value();
        let path = format!("/orders/{entity}?x=1&note=a%20b");

        // GET to b: forwarded to a, answered by a's handler.
        let mut response = client
            .get(format!("{address_b}{path}"))
            .insert_header(("x-test", "kept"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "the holder's status");
        assert_eq!(
            header(&response, "x-shard").as_deref(),
            Some(shard.as_str())
        );
        assert_eq!(header(&response, "x-shard-holder").as_deref(), Some("a"));
        assert_eq!(
            header(&response, "x-served-by").as_deref(),
            Some("a"),
            "the holder's header"
        );
        let json: serde_json::Value = response.json().await.unwrap();
        assert_eq!(json["owner"], "a");
        assert_eq!(json["shard"], shard.as_str());
        assert_eq!(json["token"], token, "the holder's fencing token");
        assert_eq!(json["method"], "GET");
        assert_eq!(json["query"], "x=1&note=a%20b");
        assert_eq!(json["x-test"], "kept");
        assert_eq!(json["forwarded-by"], "b");
        assert_eq!(json["body"], "");

        // POST with a body to b: the body reaches a's handler intact.
        let body = "line one\nline two: ünïcode, and some more bytes ".repeat(100);
        let mut response = client
            .post(format!("{address_b}{path}"))
            .send_body(body.clone())
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(header(&response, "x-shard-holder").as_deref(), Some("a"));
        let json: serde_json::Value = response.json().await.unwrap();
        assert_eq!(json["method"], "POST");
        assert_eq!(json["owner"], "a");
        assert_eq!(json["body"], body.as_str());

        // A chunked POST body (no content-length) too.
        let chunks = ["first chunk, ", "second chunk, ", "last chunk"]
            .map(|chunk| Ok::<_, Infallible>(web::Bytes::from_static(chunk.as_bytes())));
        let mut response = client
            .post(format!("{address_b}{path}"))
            .send_stream(futures_util::stream::iter(chunks))
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let json: serde_json::Value = response.json().await.unwrap();
        assert_eq!(json["owner"], "a");
        assert_eq!(json["body"], "first chunk, second chunk, last chunk");

        // To a itself: served there, not forwarded.
        let mut response = client
            .get(format!("{address_a}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(header(&response, "x-shard-holder"), None);
        let json: serde_json::Value = response.json().await.unwrap();
        assert_eq!(json["forwarded-by"], serde_json::Value::Null);

        // A forwarded request reaching b, which does not run the shard: 503, no second hop.
        let mut response = client
            .get(format!("{address_b}{path}"))
            .insert_header(("x-actix-coordination-forwarded-by", "c"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(header(&response, "retry-after").as_deref(), Some("1"));
        assert_eq!(
            header(&response, "x-shard").as_deref(),
            Some(shard.as_str())
        );
        let text = String::from_utf8(response.body().await.unwrap().to_vec()).unwrap();
        assert_eq!(
            text,
            format!("shard {shard:?} was forwarded here by \"c\", but does not run here")
        );

        server_a.stop(false).await;
        server_b.stop(false).await;
        for node in [a, b] {
            assert!(node.send(Shutdown).await.unwrap().unwrap());
        }
    });
}

/// A holder whose address refuses connections is `502` at once; one that accepts and never
/// answers is `502` once the forward's timeout has passed, not much later; one that advertises
/// `https` is `502` (plain http only); none panics.
#[test]
fn an_unreachable_or_silent_holder_is_502_within_the_timeout() {
    run_real(async {
        let store = InMemoryStore::new();
        let (listener_b, address_b) = listener();
        // Nobody listens here: bound, then closed.
        let (closed, address_dead) = listener();
        drop(closed);
        // Listens, and never answers (the kernel accepts into its backlog).
        let (_silent, address_silent) = listener();
        let timeout = Duration::from_secs(1);
        let (b, routing_b) = start(&store, "b", &address_b, timeout);
        let (dead, _) = start(&store, "dead", &address_dead, timeout);
        let (silent, _) = start(&store, "silent", &address_silent, timeout);
        let (secure, _) = start(&store, "secure", "https://127.0.0.1:1", timeout);
        let nodes = [&b, &dead, &silent, &secure];
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut counts = Vec::new();
            for node in nodes {
                counts.push(node.send(GetShards).await.unwrap().len());
            }
            counts.sort();
            if counts == [2, 2, 2, 2] {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the nodes did not settle: {counts:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let server_b = serve(listener_b, routing_b);
        let client = awc::Client::builder()
            .timeout(Duration::from_secs(20))
            .disable_redirects()
            .finish();

        let (entity, shard) = entity_held_by(&store, "dead");
        let started = Instant::now();
        let mut response = client
            .get(format!("{address_b}/orders/{entity}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 502);
        assert!(
            started.elapsed() < timeout,
            "refused at once: {:?}",
            started.elapsed()
        );
        assert_eq!(
            header(&response, "x-shard").as_deref(),
            Some(shard.as_str())
        );
        assert_eq!(header(&response, "x-shard-holder").as_deref(), Some("dead"));
        let text = String::from_utf8(response.body().await.unwrap().to_vec()).unwrap();
        assert!(
            text.starts_with(&format!(
                "cannot forward the request for shard {shard:?} to its holder \"dead\": "
            )),
            "{text}"
        );

        let (entity, shard) = entity_held_by(&store, "silent");
        let started = Instant::now();
        let mut response = client
            .post(format!("{address_b}/orders/{entity}"))
            .send_body("a body")
            .await
            .unwrap();
        let elapsed = started.elapsed();
        assert_eq!(response.status(), 502);
        assert!(
            elapsed >= timeout && elapsed < timeout * 5,
            "answered after the timeout, not much later: {elapsed:?}"
        );
        assert_eq!(
            header(&response, "x-shard-holder").as_deref(),
            Some("silent")
        );
        let text = String::from_utf8(response.body().await.unwrap().to_vec()).unwrap();
        assert_eq!(
            text,
            format!("the holder \"silent\" of shard {shard:?} did not answer a forwarded request within 1s")
        );

        let (entity, shard) = entity_held_by(&store, "secure");
        let mut response = client
            .get(format!("{address_b}/orders/{entity}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 502);
        assert_eq!(
            header(&response, "x-shard").as_deref(),
            Some(shard.as_str())
        );
        let text = String::from_utf8(response.body().await.unwrap().to_vec()).unwrap();
        assert_eq!(
            text,
            format!("the holder \"secure\" of shard {shard:?} advertises an https address: forwarding speaks plain http only")
        );

        server_b.stop(false).await;
        for node in [b, dead, silent, secure] {
            assert!(node.send(Shutdown).await.unwrap().unwrap());
        }
    });
}
