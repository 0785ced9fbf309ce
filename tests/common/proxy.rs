//! A TCP fault proxy on loopback, put between one client and a real server to inject network
//! faults: pass traffic, reset every connection (a partition the client notices at once),
//! blackhole it (a partition or a paused peer: requests never answer), delay the answers (the
//! server applies a request at once, its answer comes late) or delay the requests (the server
//! applies a request late, and answers it at once then).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward both ways.
    Pass,
    /// Close every connection with a reset, and reset new ones at once.
    Reset,
    /// Accept connections but forward nothing, either way; existing connections go silent.
    Blackhole,
    /// Forward both ways, each chunk from the server this long after it arrived (latency: the
    /// chunks that arrive meanwhile are not delayed further).
    SlowAnswers(Duration),
    /// Forward both ways, each chunk from the client this long after it arrived (latency, as
    /// with `SlowAnswers`): the server applies a request late. Chunks still delayed when the
    /// client's connection ends are dropped (they never reach the server).
    SlowRequests(Duration),
    /// Forward requests to the server but drop its answers (the server applies them, the client
    /// never hears back); connections are reset when the mode changes again.
    DropAnswers,
    /// Forward requests to the server and hold its answers until the mode changes, then pass
    /// them on at once, in order: answers that arrive exactly when the test says.
    HoldAnswers,
}

/// A running proxy; it stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    mode: Arc<watch::Sender<ProxyMode>>,
    bytes_up: Arc<AtomicU64>,
    connections: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST, upstream).await
    }

    /// Starts a proxy on a free port of the local address `ip` forwarding to `upstream`.
    pub async fn start_on(ip: std::net::Ipv4Addr, upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind((ip, 0)).await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(watch::Sender::new(ProxyMode::Pass));
        let mode2 = Arc::clone(&mode);
        let bytes_up = Arc::new(AtomicU64::new(0));
        let up = Arc::clone(&bytes_up);
        let connections = Arc::new(AtomicU64::new(0));
        let accepted = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                accepted.fetch_add(1, Ordering::SeqCst);
                let mode = mode2.subscribe();
                tokio::spawn(serve(client, upstream, mode, Arc::clone(&up)));
            }
        });
        FaultProxy {
            addr,
            mode,
            bytes_up,
            connections,
            task,
        }
    }

    /// How many bytes clients sent to the server through the proxy so far.
    pub fn bytes_up(&self) -> u64 {
        self.bytes_up.load(Ordering::SeqCst)
    }

    /// How many connections clients opened to the proxy so far (also ones it reset at once).
    #[allow(dead_code)]
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes what the proxy does, for existing and new connections.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        // Ends every connection task too.
        self.mode.send_replace(ProxyMode::Reset);
    }
}

fn reset(stream: TcpStream) {
    // SO_LINGER 0 turns the close into a RST.
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<ProxyMode>,
    bytes_up: Arc<AtomicU64>,
) {
    let current = *mode.borrow_and_update();
    let mut delay = None;
    match current {
        ProxyMode::Reset => return reset(client),
        ProxyMode::Blackhole => {
            // Hold the connection silently until the mode changes, then drop it: a client that
            // was stuck reconnects.
            let _ = mode.changed().await;
            return reset(client);
        }
        ProxyMode::SlowAnswers(d) => delay = Some(d),
        ProxyMode::Pass
        | ProxyMode::DropAnswers
        | ProxyMode::SlowRequests(_)
        | ProxyMode::HoldAnswers => {}
    }
    let mut hold = current == ProxyMode::HoldAnswers;
    let mut request_delay = match current {
        ProxyMode::SlowRequests(d) => Some(d),
        _ => None,
    };
    let mut drop_answers = current == ProxyMode::DropAnswers;
    let Ok(server) = TcpStream::connect(upstream).await else {
        return reset(client);
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // Every way the connection ends is a reset (SO_LINGER 0), as `reset` does.
    let _ = client.set_zero_linger();
    let (mut cr, mut cw) = client.into_split();
    // Answers go through a queue, each written when its delay is over: a delay is latency, not a
    // limit on throughput (chunks read meanwhile are delayed by the same amount, not in turn).
    // (A held answer, `None`, waits until the mode is no longer `HoldAnswers`.)
    let (answers, mut queued) =
        tokio::sync::mpsc::unbounded_channel::<(Option<tokio::time::Instant>, Vec<u8>)>();
    let mut released = mode.clone();
    let writer = tokio::spawn(async move {
        while let Some((at, chunk)) = queued.recv().await {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => {
                    let _ = released.wait_for(|m| *m != ProxyMode::HoldAnswers).await;
                }
            }
            if cw.write_all(&chunk).await.is_err() {
                break;
            }
        }
        cw
    });
    let (mut sr, mut sw) = server.into_split();
    // Requests go through a queue the same way.
    let (requests, mut queued_up) =
        tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let upstream_writer = tokio::spawn(async move {
        while let Some((at, chunk)) = queued_up.recv().await {
            tokio::time::sleep_until(at).await;
            if sw.write_all(&chunk).await.is_err() {
                break;
            }
        }
        sw
    });
    let mut cbuf = vec![0u8; 16 * 1024];
    let mut sbuf = vec![0u8; 16 * 1024];
    loop {
        let new_mode = tokio::select! {
            // A mode change is taken before any data that arrived with it: after `set_mode`
            // returns, no new chunk passes under the old mode (an etcd claim sent right after a
            // switch to `Blackhole` used to reach the server now and then).
            biased;
            changed = mode.changed() => match changed {
                Ok(()) => *mode.borrow_and_update(),
                Err(_) => break,
            },
            n = cr.read(&mut cbuf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    bytes_up.fetch_add(n as u64, Ordering::SeqCst);
                    let at = tokio::time::Instant::now() + request_delay.unwrap_or_default();
                    if requests.send((at, cbuf[..n].to_vec())).is_err() { break } else { continue }
                }
            },
            n = sr.read(&mut sbuf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if drop_answers {
                        continue;
                    }
                    let at = (!hold).then(|| tokio::time::Instant::now() + delay.unwrap_or_default());
                    if answers.send((at, sbuf[..n].to_vec())).is_err() { break } else { continue }
                }
            },
        };
        if drop_answers {
            // The client's view of the connection is broken (answers are missing): reset it.
            break;
        }
        hold = new_mode == ProxyMode::HoldAnswers;
        match new_mode {
            ProxyMode::DropAnswers => drop_answers = true,
            ProxyMode::HoldAnswers => (delay, request_delay) = (None, None),
            ProxyMode::Pass => (delay, request_delay) = (None, None),
            ProxyMode::SlowAnswers(d) => (delay, request_delay) = (Some(d), None),
            ProxyMode::SlowRequests(d) => (delay, request_delay) = (None, Some(d)),
            ProxyMode::Reset => break,
            ProxyMode::Blackhole => {
                // Go silent until the mode changes again, then drop the connection.
                let _ = mode.changed().await;
                break;
            }
        }
    }
    drop(answers);
    drop(requests);
    writer.abort();
    upstream_writer.abort();
    if let (Ok(cw), Ok(sw)) = (writer.await, upstream_writer.await) {
        if let (Ok(client), Ok(_)) = (cr.reunite(cw), sr.reunite(sw)) {
            reset(client);
        }
    }
}
