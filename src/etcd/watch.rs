//! The session's watch hub: every watch of a session shares one gRPC watch stream.
//!
//! etcd multiplexes watches over one bidirectional stream by watch id. The hub is a task that owns
//! that stream: it opens it on the first watch, sends a create request (with an id it chose, so
//! that answers can be routed without relying on their order) for every watch, routes responses to
//! the watchers by id, and cancels a watch when its [`WatchHandle`] is dropped. When the stream
//! breaks, every watcher gets [`HubEvent::Broken`] and is forgotten; the next watch opens a new
//! stream. Watchers re-register with the revision they need to resume from, so no event is missed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use etcd_client::{
    Event, WatchClient, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponse,
    WatchResponseStream, WatchStream,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// What a watcher receives.
#[derive(Debug)]
pub(super) enum HubEvent {
    /// etcd created the watch; `revision` is the store's revision then (a watch from "now"
    /// reports every change after it).
    Created { revision: i64 },
    /// Changes of the watched key (or keys, for a prefix), in revision order.
    Events(Vec<Event>),
    /// etcd cancelled the watch; `compact_revision > 0` when the start revision was compacted.
    Canceled {
        compact_revision: i64,
        reason: String,
    },
    /// The shared stream broke (or could not be opened); the watch is gone.
    Broken(String),
}

struct Watcher {
    key: Vec<u8>,
    /// Every key starting with `key` (a group), not `key` alone.
    prefix: bool,
    start_revision: i64,
    deletes_only: bool,
    events: mpsc::UnboundedSender<HubEvent>,
    /// Whether its create request went out on the current (or connecting) stream.
    sent: bool,
}

impl Watcher {
    fn options(&self, id: i64) -> WatchOptions {
        let options = WatchOptions::new()
            .with_watch_id(id)
            .with_start_revision(self.start_revision);
        let options = if self.prefix {
            options.with_prefix()
        } else {
            options
        };
        if self.deletes_only {
            options.with_filters([WatchFilterType::NoPut])
        } else {
            options
        }
    }
}

enum Command {
    Watch {
        id: i64,
        watcher: Watcher,
    },
    Cancel {
        id: i64,
    },
    /// Breaks the stream and refuses every watch while `true` (a test hook).
    Suspend(bool),
}

/// The handle of the hub task; dropping it (with the session) stops the task.
pub(super) struct WatchHub {
    commands: mpsc::UnboundedSender<Command>,
    next_id: AtomicI64,
}

impl WatchHub {
    /// Starts the hub task on `runtime`; `io_timeout` bounds opening the stream and each request.
    pub(super) fn start(
        runtime: &tokio::runtime::Handle,
        client: WatchClient,
        io_timeout: Duration,
    ) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        runtime.spawn(hub_task(client, receiver, io_timeout));
        Self {
            commands,
            next_id: AtomicI64::new(1),
        }
    }

    /// Watches `key` from `start_revision` (0: from now); only deletions if `deletes_only`.
    pub(super) fn watch(
        &self,
        key: Vec<u8>,
        start_revision: i64,
        deletes_only: bool,
    ) -> WatchHandle {
        self.add(key, false, start_revision, deletes_only)
    }

    /// Watches every key starting with `prefix` from `start_revision` (0: from now).
    pub(super) fn watch_prefix(&self, prefix: Vec<u8>, start_revision: i64) -> WatchHandle {
        self.add(prefix, true, start_revision, false)
    }

    fn add(
        &self,
        key: Vec<u8>,
        prefix: bool,
        start_revision: i64,
        deletes_only: bool,
    ) -> WatchHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, receiver) = mpsc::unbounded_channel();
        let watcher = Watcher {
            key,
            prefix,
            start_revision,
            deletes_only,
            events,
            sent: false,
        };
        // If the hub is gone the receiver reports the end of the watch at once.
        let _ = self.commands.send(Command::Watch { id, watcher });
        WatchHandle {
            id,
            events: receiver,
            commands: self.commands.clone(),
        }
    }
}

impl WatchHub {
    /// While `suspended`, the stream is broken and every watch ends at once with
    /// [`HubEvent::Broken`], as if etcd could not be reached for watches only.
    pub(super) fn suspend(&self, suspended: bool) {
        let _ = self.commands.send(Command::Suspend(suspended));
    }
}

/// One watch; cancelled when dropped.
pub(super) struct WatchHandle {
    id: i64,
    events: mpsc::UnboundedReceiver<HubEvent>,
    commands: mpsc::UnboundedSender<Command>,
}

impl WatchHandle {
    /// The next event; `None` when the hub stopped.
    pub(super) async fn next(&mut self) -> Option<HubEvent> {
        self.events.recv().await
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Cancel { id: self.id });
    }
}

type Connecting = JoinHandle<Result<WatchStream, String>>;

enum Step {
    Command(Option<Command>),
    Connected(Result<Result<WatchStream, String>, tokio::task::JoinError>),
    Response(Result<Option<WatchResponse>, etcd_client::Error>),
}

struct Hub {
    client: WatchClient,
    io_timeout: Duration,
    watchers: HashMap<i64, Watcher>,
    stream: Option<(WatchRequestSender, WatchResponseStream)>,
    connecting: Option<Connecting>,
    /// Watches cancelled while their create request was in flight on a connecting stream.
    cancel_on_connect: Vec<i64>,
    /// Suspended by the test hook: no stream, every watch broken at once.
    suspended: bool,
}

async fn hub_task(
    client: WatchClient,
    mut commands: mpsc::UnboundedReceiver<Command>,
    io_timeout: Duration,
) {
    let mut hub = Hub {
        client,
        io_timeout,
        watchers: HashMap::new(),
        stream: None,
        connecting: None,
        cancel_on_connect: Vec::new(),
        suspended: false,
    };
    loop {
        let step = {
            let connecting = hub.connecting.as_mut();
            let stream = hub.stream.as_mut();
            tokio::select! {
                command = commands.recv() => Step::Command(command),
                joined = async { connecting.expect("guarded").await }, if connecting.is_some() => {
                    Step::Connected(joined)
                }
                response = async { stream.expect("guarded").1.message().await }, if stream.is_some() => {
                    Step::Response(response)
                }
            }
        };
        match step {
            Step::Command(None) => return,
            Step::Command(Some(Command::Watch { id, watcher })) => hub.add(id, watcher).await,
            Step::Command(Some(Command::Cancel { id })) => hub.cancel(id).await,
            Step::Command(Some(Command::Suspend(suspended))) => {
                hub.suspended = suspended;
                if suspended {
                    hub.broken("watches suspended");
                }
            }
            Step::Connected(joined) => {
                hub.connecting = None;
                match joined {
                    Ok(Ok(stream)) => hub.connected(stream).await,
                    Ok(Err(message)) => hub.broken(&message),
                    Err(join_error) => hub.broken(&join_error.to_string()),
                }
            }
            Step::Response(Ok(Some(response))) => hub.route(response),
            Step::Response(Ok(None)) => hub.broken("the watch stream was closed by etcd"),
            Step::Response(Err(error)) => hub.broken(&error.to_string()),
        }
    }
}

impl Hub {
    async fn add(&mut self, id: i64, mut watcher: Watcher) {
        if self.suspended {
            let _ = watcher
                .events
                .send(HubEvent::Broken("watches suspended".into()));
            return;
        }
        if let Some((sender, _)) = self.stream.as_mut() {
            watcher.sent = true;
            let options = watcher.options(id);
            let key = watcher.key.clone();
            self.watchers.insert(id, watcher);
            if !send_ok(timeout(self.io_timeout, sender.watch(key, Some(options))).await) {
                self.broken("sending a watch request failed");
            }
        } else if self.connecting.is_none() {
            watcher.sent = true;
            let mut client = self.client.clone();
            let (key, options) = (watcher.key.clone(), watcher.options(id));
            let io_timeout = self.io_timeout;
            self.connecting = Some(tokio::spawn(async move {
                match timeout(io_timeout, client.watch(key, Some(options))).await {
                    Ok(Ok(stream)) => Ok(stream),
                    Ok(Err(error)) => Err(format!("opening the watch stream failed: {error}")),
                    Err(_) => Err(format!(
                        "opening the watch stream timed out after {io_timeout:?}"
                    )),
                }
            }));
            self.watchers.insert(id, watcher);
        } else {
            // Sent once the connecting stream is up.
            self.watchers.insert(id, watcher);
        }
    }

    async fn cancel(&mut self, id: i64) {
        let Some(watcher) = self.watchers.remove(&id) else {
            return;
        };
        if !watcher.sent {
            return;
        }
        if let Some((sender, _)) = self.stream.as_mut() {
            if !send_ok(timeout(self.io_timeout, sender.cancel(id)).await) {
                self.broken("sending a watch cancel request failed");
            }
        } else if self.connecting.is_some() {
            self.cancel_on_connect.push(id);
        }
    }

    async fn connected(&mut self, stream: WatchStream) {
        let (mut sender, responses) = stream.split();
        let mut ok = true;
        for id in std::mem::take(&mut self.cancel_on_connect) {
            ok = ok && send_ok(timeout(self.io_timeout, sender.cancel(id)).await);
        }
        for (id, watcher) in self.watchers.iter_mut().filter(|(_, w)| !w.sent) {
            if !ok {
                break;
            }
            watcher.sent = true;
            let request = sender.watch(watcher.key.clone(), Some(watcher.options(*id)));
            ok = send_ok(timeout(self.io_timeout, request).await);
        }
        if ok {
            self.stream = Some((sender, responses));
        } else {
            self.broken("sending a watch request failed");
        }
    }

    fn route(&mut self, response: WatchResponse) {
        let id = response.watch_id();
        let Some(watcher) = self.watchers.get(&id) else {
            if response.canceled() && !response.cancel_reason().is_empty() {
                tracing::debug!(
                    watch_id = id,
                    reason = response.cancel_reason(),
                    "etcd cancelled an unknown watch"
                );
            }
            return;
        };
        // A watcher whose handle is gone is removed by its cancel command.
        if response.created() {
            let revision = response.header().map_or(0, |h| h.revision());
            let _ = watcher.events.send(HubEvent::Created { revision });
        }
        if !response.events().is_empty() {
            let _ = watcher
                .events
                .send(HubEvent::Events(response.events().to_vec()));
        }
        if response.canceled() {
            let _ = watcher.events.send(HubEvent::Canceled {
                compact_revision: response.compact_revision(),
                reason: response.cancel_reason().to_owned(),
            });
            self.watchers.remove(&id);
        }
    }

    /// The stream is unusable: every watch ends, the next one opens a new stream.
    fn broken(&mut self, message: &str) {
        if !self.watchers.is_empty() {
            tracing::debug!(
                error = message,
                watches = self.watchers.len(),
                "etcd watch stream broke"
            );
        }
        for (_, watcher) in self.watchers.drain() {
            let _ = watcher.events.send(HubEvent::Broken(message.to_owned()));
        }
        self.stream = None;
        if let Some(connecting) = self.connecting.take() {
            connecting.abort();
        }
        self.cancel_on_connect.clear();
    }
}

fn send_ok(result: Result<Result<(), etcd_client::Error>, tokio::time::error::Elapsed>) -> bool {
    matches!(result, Ok(Ok(())))
}
