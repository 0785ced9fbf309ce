//! Writes sent together: every handover and every plain claim a session's leases send at about
//! the same time (a node handing its shards on as it leaves, a node claiming the shards a
//! crashed node held) go to etcd in a few transactions, not one per key.
//!
//! Each write is a compare-and-swap: a handover puts the key in the target's name, on the
//! target's etcd lease, only if its `mod_revision` is still the tenure's; a claim puts it in the
//! claimer's name, on the claimer's etcd lease, only if the key is absent. A batch is one
//! transaction with one such compare and one such put per key: all its keys are written at one
//! revision of the store, or none is. It is *group commit*: the first write starts a flush on
//! the session's runtime, which waits for more while they keep coming (1 ms without one, 5 ms
//! at most); every write that arrives while a transaction is in flight waits for the next one,
//! which takes up to [`MAX_TXN_KEYS`] of them. 256 shards handed on at once cost about three
//! transactions, and a write on its own about 1 ms more than it did alone.
//!
//! A batch whose compare failed (a key changed since its tenure began, or a key was claimed by
//! someone else first) wrote nothing. Its failure branch reads every key, so each write whose
//! compare failed learns what the key is, as its own transaction would have
//! ([`Batched::Refused`]), and the writes whose compare held go on in the next batch (once;
//! after that each is sent alone by its caller). A batch etcd refused (unreachable, an
//! etcd lease gone, too many operations) also leaves every write to be sent alone; "too many
//! operations" halves the batch size first (a cluster run with a lower `--max-txn-ops` than
//! etcd's default). A flush never outlives its session, and each transaction is bounded by the
//! session's I/O timeout; a caller that stops waiting leaves the transaction to finish (a
//! handover's compare keeps a late write harmless: it lands only on the tenure it names; a
//! claim's caller guards it as a claim whose answer never arrived).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::oneshot;
use tokio::time::{sleep, timeout, Instant};

use super::group::GroupSource;
use super::observe_txn;

/// What batching needs of its session (the session implements it).
pub(super) trait WriteSession: GroupSource {
    /// The session's writes waiting for a batch.
    fn batches(&self) -> &Batches;

    /// Runs `future` on the session's runtime; `false` (and `future` dropped) when there is
    /// none.
    fn try_spawn<F>(&self, future: F) -> bool
    where
        F: std::future::Future<Output = ()> + Send + 'static;
}

/// The most keys one batch writes: etcd's default `--max-txn-ops` (128 compares and 128 puts).
pub(super) const MAX_TXN_KEYS: usize = 128;

/// How long a flush waits for one more write before its first batch (see [`linger`]).
const LINGER_TICK: Duration = Duration::from_millis(1);
/// The longest a flush waits before its first batch.
const LINGER_MAX: Duration = Duration::from_millis(5);

/// One write waiting for its batch.
pub(super) struct Write {
    /// The key.
    pub key: Vec<u8>,
    /// What the key must be for the write to land.
    pub expect: Expect,
    /// What the key holds once written (the new holder's name).
    pub value: Vec<u8>,
    /// The new holder's etcd lease.
    pub lease_id: i64,
}

/// The compare of a [`Write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// A handover: the key's `mod_revision` is still its tenure's.
    Revision(i64),
    /// A claim: the key is absent.
    Absent,
}

impl Write {
    fn compare(&self) -> Compare {
        match self.expect {
            Expect::Revision(revision) => {
                Compare::mod_revision(self.key.clone(), CompareOp::Equal, revision)
            }
            Expect::Absent => Compare::create_revision(self.key.clone(), CompareOp::Equal, 0),
        }
    }

    /// Whether the key as read (`None`: absent) still passes the compare.
    fn holds(&self, kv: Option<&KeyValue>) -> bool {
        match (self.expect, kv) {
            (Expect::Revision(revision), Some(kv)) => kv.mod_revision() == revision,
            (Expect::Absent, None) => true,
            _ => false,
        }
    }
}

/// What became of a write sent for batching.
#[derive(Debug, Clone)]
pub(super) enum Batched {
    /// Written, in a transaction with others, at this revision of the store.
    Written { revision: i64 },
    /// Not written: its compare failed. The key as the failed transaction read it (`None`:
    /// absent), at that revision of the store: what the caller's own transaction would have
    /// answered.
    Refused {
        revision: i64,
        current: Option<KeyValue>,
    },
    /// Not written: the caller sends it alone (which also says why, where it cannot land).
    Alone,
}

struct Waiting {
    write: Write,
    answer: oneshot::Sender<Batched>,
    /// Whether it was in a batch already (a second failed batch leaves it to its caller).
    retried: bool,
}

/// The session's writes waiting for a batch, and whether a flush is under way.
#[derive(Default)]
pub(super) struct Batches {
    queue: Mutex<Queue>,
    /// The batch size in force: [`MAX_TXN_KEYS`], halved at each "too many operations".
    limit: AtomicUsize,
    /// Transactions sent by flushes (each one batch).
    sent: AtomicUsize,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiting>,
    flushing: bool,
}

impl Batches {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn limit(&self) -> usize {
        match self.limit.load(Ordering::Relaxed) {
            0 => MAX_TXN_KEYS,
            limit => limit,
        }
    }

    /// How many batch transactions this session sent.
    pub(super) fn sent(&self) -> usize {
        self.sent.load(Ordering::Relaxed)
    }
}

/// Sends `write` to be written in a batch with the others of `session` sent about now.
///
/// # Cancel safety
///
/// Dropping the future does not withdraw the write: it may still land (see the module docs).
pub(super) async fn write<S: WriteSession>(session: &Arc<S>, write: Write) -> Batched {
    let (answer, answered) = oneshot::channel();
    let start = {
        let mut queue = session.batches().lock();
        queue.waiting.push(Waiting {
            write,
            answer,
            retried: false,
        });
        !std::mem::replace(&mut queue.flushing, true)
    };
    if start {
        let flushing = Arc::clone(session);
        if !session.try_spawn(async move { flush(&flushing).await }) {
            // No runtime to flush on: every waiting write is sent alone.
            let mut queue = session.batches().lock();
            queue.flushing = false;
            answer_all(std::mem::take(&mut queue.waiting), Batched::Alone);
        }
    }
    answered.await.unwrap_or(Batched::Alone)
}

/// Writes the waiting writes, a batch at a time, until none waits.
async fn flush<S: WriteSession>(session: &Arc<S>) {
    let batches = session.batches();
    linger(batches).await;
    loop {
        let batch: Vec<Waiting> = {
            let mut queue = batches.lock();
            if queue.waiting.is_empty() {
                queue.flushing = false;
                return;
            }
            let take = batches.limit().min(queue.waiting.len());
            queue.waiting.drain(..take).collect()
        };
        if batch.len() == 1 {
            // Alone anyway: its caller sends it, with the outcome it needs.
            answer_all(batch, Batched::Alone);
            continue;
        }
        send(session, batch).await;
    }
}

/// Before the first batch of a flush: waits while writes keep arriving ([`LINGER_TICK`] without
/// a new one ends it), at most [`LINGER_MAX`], or until a batch is full. The workers of a
/// leaving node stop a little apart, each then handing its shard over: without it the first to
/// arrive went alone, and one more transaction followed it.
async fn linger(batches: &Batches) {
    let until = Instant::now() + LINGER_MAX;
    let mut seen = batches.lock().waiting.len();
    while seen < batches.limit() && Instant::now() < until {
        sleep(LINGER_TICK).await;
        let now = batches.lock().waiting.len();
        if now == seen {
            break;
        }
        seen = now;
    }
}

/// One batch: written, or each write requeued (its compare held) or left to its caller.
async fn send<S: WriteSession>(session: &Arc<S>, batch: Vec<Waiting>) {
    let batches = session.batches();
    let client = match session.client().await {
        Ok(client) => client,
        Err(_) => return answer_all(batch, Batched::Alone),
    };
    let mut kv = client.kv_client();
    let compares: Vec<Compare> = batch.iter().map(|w| w.write.compare()).collect();
    let puts: Vec<TxnOp> = batch
        .iter()
        .map(|w| {
            TxnOp::put(
                w.write.key.clone(),
                w.write.value.clone(),
                Some(PutOptions::new().with_lease(w.write.lease_id)),
            )
        })
        .collect();
    let reads: Vec<TxnOp> = batch
        .iter()
        .map(|w| TxnOp::get(w.write.key.clone(), None))
        .collect();
    let txn = Txn::new().when(compares).and_then(puts).or_else(reads);
    batches.sent.fetch_add(1, Ordering::Relaxed);
    let response = match timeout(session.io_timeout(), kv.txn(txn)).await {
        Ok(response) => observe_txn(response),
        Err(_) => {
            tracing::debug!(
                keys = batch.len(),
                "a batch of writes was not answered in time; each is sent alone"
            );
            return answer_all(batch, Batched::Alone);
        }
    };
    let response = match response {
        Ok(response) => response,
        Err(error) => {
            if error.to_string().contains("too many operations") {
                let halved = (batch.len() / 2).max(1);
                batches.limit.store(halved, Ordering::Relaxed);
                tracing::info!(
                    keys = batch.len(),
                    limit = halved,
                    "etcd refused a batch of writes as too large; batches are smaller from now on"
                );
                return requeue(batches, batch);
            }
            tracing::debug!(keys = batch.len(), %error, "a batch of writes failed; each is sent alone");
            return answer_all(batch, Batched::Alone);
        }
    };
    if response.succeeded() {
        let Some(revision) = response.header().map(|h| h.revision()) else {
            return answer_all(batch, Batched::Alone);
        };
        tracing::debug!(
            keys = batch.len(),
            revision,
            "wrote a batch of keys in one transaction"
        );
        return answer_all(batch, Batched::Written { revision });
    }
    // Some compare failed: each write whose compare failed learns what the key is; those whose
    // compare held go on in the next batch (once).
    let revision = response.header().map(|h| h.revision());
    let reads = response.op_responses();
    let mut again = Vec::new();
    for (index, waiting) in batch.into_iter().enumerate() {
        let Some(TxnOpResponse::Get(get)) = reads.get(index) else {
            let _ = waiting.answer.send(Batched::Alone);
            continue;
        };
        let current = get.kvs().first();
        if waiting.write.holds(current) {
            if waiting.retried {
                let _ = waiting.answer.send(Batched::Alone);
            } else {
                again.push(waiting);
            }
            continue;
        }
        let answer = match revision {
            Some(revision) => Batched::Refused {
                revision,
                current: current.cloned(),
            },
            None => Batched::Alone,
        };
        let _ = waiting.answer.send(answer);
    }
    requeue(batches, again);
}

/// Puts `batch` back at the head of the queue, each marked retried.
fn requeue(batches: &Batches, batch: Vec<Waiting>) {
    let mut queue = batches.lock();
    let rest = std::mem::take(&mut queue.waiting);
    queue.waiting = batch
        .into_iter()
        .map(|w| Waiting { retried: true, ..w })
        .chain(rest)
        .collect();
}

fn answer_all(batch: Vec<Waiting>, answer: Batched) {
    for waiting in batch {
        let _ = waiting.answer.send(answer.clone());
    }
}
