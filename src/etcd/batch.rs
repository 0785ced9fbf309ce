//! Handovers written together: every handover a session's leases send at about the same time
//! (a node handing its shards on as it leaves) goes to etcd in a few transactions, not one per
//! key.
//!
//! A handover is a compare-and-swap: the key is put in the target's name, on the target's etcd
//! lease, only if its `mod_revision` is still the tenure's. A batch is one transaction with one
//! such compare and one such put per key: all its keys move at one revision, or none does. It is
//! *group commit*: the first handover starts a flush on the session's runtime, which waits for
//! more while they keep coming (1 ms without one, 5 ms at most); every handover that arrives
//! while a transaction is in flight waits for the next one, which takes up to [`MAX_TXN_KEYS`]
//! of them. 256 shards handed on at once cost about three transactions, and a handover on its
//! own about 1 ms more than it did alone.
//!
//! A batch whose compare failed (a key changed since its tenure began: lost, taken over) wrote
//! nothing. Its failure branch reads every key, so the keys whose compare held go on in the next
//! batch (once), and each other key's handover is written alone by its caller, which then learns
//! why ([`Batched::Alone`]). A batch etcd refused (unreachable, a target's etcd lease gone, too
//! many operations) also leaves every handover to be written alone; "too many operations"
//! halves the batch size first (a cluster run with a lower `--max-txn-ops` than etcd's
//! default). A flush never outlives its session, and each transaction is bounded by the
//! session's I/O timeout; a caller that stops waiting leaves the transaction to finish (the
//! compare keeps a late write harmless: it lands only on the tenure it names).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::oneshot;
use tokio::time::timeout;

use super::group::GroupSource;
use super::observe_txn;
use super::session::SessionInner;

/// The most keys one batch writes: etcd's default `--max-txn-ops` (128 compares and 128 puts).
pub(super) const MAX_TXN_KEYS: usize = 128;

/// How long a flush waits for one more handover before its first batch (see [`linger`]).
const LINGER_TICK: std::time::Duration = std::time::Duration::from_millis(1);
/// The longest a flush waits before its first batch.
const LINGER_MAX: std::time::Duration = std::time::Duration::from_millis(5);

/// One handover waiting for its batch.
pub(super) struct Handover {
    /// The key.
    pub key: Vec<u8>,
    /// The tenure's revision: the key is written only while its `mod_revision` is this.
    pub revision: i64,
    /// What the key holds once handed over (the target's name).
    pub value: Vec<u8>,
    /// The target's etcd lease.
    pub lease_id: i64,
}

/// What became of a handover sent for batching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Batched {
    /// Written, in a transaction with others.
    Written,
    /// Not written: the caller writes it alone (which also says why, where it cannot be).
    Alone,
}

struct Waiting {
    handover: Handover,
    answer: oneshot::Sender<Batched>,
    /// Whether it was in a batch already (a second failed batch leaves it to its caller).
    retried: bool,
}

/// The session's handovers waiting for a batch, and whether a flush is under way.
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

/// Sends `handover` to be written in a batch with the others of `session` sent about now.
///
/// # Cancel safety
///
/// Dropping the future does not withdraw the handover: it may still be written (the compare
/// keeps that harmless).
pub(super) async fn hand_over(session: &Arc<SessionInner>, handover: Handover) -> Batched {
    let (answer, answered) = oneshot::channel();
    let start = {
        let mut queue = session.batches().lock();
        queue.waiting.push(Waiting {
            handover,
            answer,
            retried: false,
        });
        !std::mem::replace(&mut queue.flushing, true)
    };
    if start {
        let flushing = Arc::clone(session);
        if !session.try_spawn(async move { flush(&flushing).await }) {
            // No runtime to flush on: every waiting handover is written alone.
            let mut queue = session.batches().lock();
            queue.flushing = false;
            answer_all(std::mem::take(&mut queue.waiting), Batched::Alone);
        }
    }
    answered.await.unwrap_or(Batched::Alone)
}

/// Writes the waiting handovers, a batch at a time, until none waits.
async fn flush(session: &Arc<SessionInner>) {
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
            // Alone anyway: its caller writes it, with the outcome it needs.
            answer_all(batch, Batched::Alone);
            continue;
        }
        write(session, batch).await;
    }
}

/// Before the first batch of a flush: waits while handovers keep arriving ([`LINGER_TICK`]
/// without a new one ends it), at most [`LINGER_MAX`], or until a batch is full. The workers of
/// a leaving node stop a little apart, each then handing its shard over: without it the first
/// to arrive went alone, and one more transaction followed it.
async fn linger(batches: &Batches) {
    let until = tokio::time::Instant::now() + LINGER_MAX;
    let mut seen = batches.lock().waiting.len();
    while seen < batches.limit() && tokio::time::Instant::now() < until {
        tokio::time::sleep(LINGER_TICK).await;
        let now = batches.lock().waiting.len();
        if now == seen {
            break;
        }
        seen = now;
    }
}

/// One batch: written, or each handover requeued (its compare held) or left to its caller.
async fn write(session: &Arc<SessionInner>, batch: Vec<Waiting>) {
    let batches = session.batches();
    let client = match session.client().await {
        Ok(client) => client,
        Err(_) => return answer_all(batch, Batched::Alone),
    };
    let mut kv = client.kv_client();
    let compares: Vec<Compare> = batch
        .iter()
        .map(|w| {
            Compare::mod_revision(
                w.handover.key.clone(),
                CompareOp::Equal,
                w.handover.revision,
            )
        })
        .collect();
    let puts: Vec<TxnOp> = batch
        .iter()
        .map(|w| {
            TxnOp::put(
                w.handover.key.clone(),
                w.handover.value.clone(),
                Some(PutOptions::new().with_lease(w.handover.lease_id)),
            )
        })
        .collect();
    let reads: Vec<TxnOp> = batch
        .iter()
        .map(|w| TxnOp::get(w.handover.key.clone(), None))
        .collect();
    let txn = Txn::new().when(compares).and_then(puts).or_else(reads);
    batches.sent.fetch_add(1, Ordering::Relaxed);
    let response = match timeout(session.io_timeout(), kv.txn(txn)).await {
        Ok(response) => observe_txn(response),
        Err(_) => {
            tracing::debug!(
                keys = batch.len(),
                "a batch of handovers was not answered in time; each is written alone"
            );
            return answer_all(batch, Batched::Alone);
        }
    };
    let response = match response {
        Ok(response) => response,
        Err(error) => {
            let message = error.to_string();
            if message.contains("too many operations") {
                let halved = (batch.len() / 2).max(1);
                batches.limit.store(halved, Ordering::Relaxed);
                tracing::info!(keys = batch.len(), limit = halved, "etcd refused a batch of handovers as too large; batches are smaller from now on");
                return requeue(batches, batch);
            }
            tracing::debug!(keys = batch.len(), %error, "a batch of handovers failed; each is written alone");
            return answer_all(batch, Batched::Alone);
        }
    };
    if response.succeeded() {
        tracing::debug!(
            keys = batch.len(),
            "handed over a batch of keys in one transaction"
        );
        return answer_all(batch, Batched::Written);
    }
    // Some compare failed: the keys whose compare held go on in the next batch (once).
    let mut again = Vec::new();
    for (waiting, read) in batch.into_iter().zip(
        response
            .op_responses()
            .into_iter()
            .map(Some)
            .chain(std::iter::repeat_with(|| None)),
    ) {
        let unchanged = match read {
            Some(TxnOpResponse::Get(get)) => get
                .kvs()
                .first()
                .is_some_and(|kv| kv.mod_revision() == waiting.handover.revision),
            _ => false,
        };
        if unchanged && !waiting.retried {
            again.push(waiting);
        } else {
            let _ = waiting.answer.send(Batched::Alone);
        }
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
        let _ = waiting.answer.send(answer);
    }
}
