//! The fault proxy the real-server tests rely on behaves as documented.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::time::Duration;

use common::proxy::{FaultProxy, ProxyMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

async fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

async fn round_trip(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    s.write_all(b"ping").await?;
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await?;
    Ok(buf.to_vec())
}

#[tokio::test]
async fn pass_reset_and_blackhole() {
    let proxy = FaultProxy::start(echo_server().await).await;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut s).await.unwrap(), b"ping");

    proxy.set_mode(ProxyMode::Blackhole);
    // No answer comes (checked for a bounded time, on an existing and on a new connection).
    let stuck = timeout(Duration::from_millis(300), round_trip(&mut s)).await;
    assert!(stuck.is_err(), "blackholed connection must not answer");
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(timeout(Duration::from_millis(300), round_trip(&mut fresh))
        .await
        .is_err());

    proxy.set_mode(ProxyMode::Reset);
    let mut r = TcpStream::connect(proxy.addr()).await.unwrap();
    // It fails rather than hanging (the deadline only ends the wait).
    let failed = timeout(Duration::from_secs(5), round_trip(&mut r))
        .await
        .expect("a reset connection fails, it does not hang");
    assert!(failed.is_err(), "reset connection must fail");

    proxy.set_mode(ProxyMode::Pass);
    let mut healed = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut healed).await.unwrap(), b"ping");
}

/// `SlowRequests` delays what the client sends (the server gets it late), `SlowAnswers` what the
/// server sends (the server got it at once): measured at the server, whose arrival times are the
/// difference.
#[tokio::test]
async fn slow_requests_reach_the_server_late_and_slow_answers_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    let (arrivals, mut arrived) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let arrivals = arrivals.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    let _ = arrivals.send(tokio::time::Instant::now());
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let delay = Duration::from_millis(500);
    let proxy = FaultProxy::start(server).await;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut s).await.unwrap(), b"ping");
    let _ = arrived.recv().await;

    proxy.set_mode(ProxyMode::SlowRequests(delay));
    let sent = tokio::time::Instant::now();
    assert_eq!(round_trip(&mut s).await.unwrap(), b"ping");
    let at_server = arrived.recv().await.unwrap();
    assert!(at_server - sent >= delay, "{:?}", at_server - sent);

    proxy.set_mode(ProxyMode::SlowAnswers(delay));
    let sent = tokio::time::Instant::now();
    assert_eq!(round_trip(&mut s).await.unwrap(), b"ping");
    let answered = sent.elapsed();
    let at_server = arrived.recv().await.unwrap();
    assert!(answered >= delay, "{answered:?}");
    // Arrived before the answer was let through, whatever the load.
    assert!(at_server - sent < answered, "{:?}", at_server - sent);
}
