//! [`BatchLink`]: one `Kv.Batch` stream to one node, shared by every call sent there
//! (a client's calls, or a node's requests forwarded to a group leader).
//!
//! A unary gRPC call costs an HTTP/2 stream (headers both ways, trailers) on both
//! sides; with many calls in flight to one node that cost dominates small requests.
//! The link sends calls as items of a long-lived stream instead: the items queued
//! together leave in one message, the answers ready together come back in one, and a
//! call's answer is paired to it by id.
//!
//! The link owns the stream and the calls waiting on it. The stream is opened when a
//! call comes and none is open; when it fails, every call waiting on it fails with the
//! reason, and the next call opens a new one. What a caller may conclude from a failure
//! is the same as for a unary call: a stream that could not be opened because the
//! connection could not be made carries the connect error (the items were never sent),
//! anything else is an unknown outcome. A node that does not know `Kv.Batch` answers
//! `Unimplemented`; the link remembers it and the caller goes unary to that node.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate as pb;
use crate::kv_client::KvClient;
use crate::limits;
use crate::security::AuthChannel;
use pb::batch_request_item::Request as Req;
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};

/// Encoded size past which a call should go unary rather than on the stream: a large
/// value would hold the shared stream's flow-control window from the small calls behind
/// it (and many of them could make one message too large).
pub const ITEM_BYTES_MAX: usize = 64 * 1024;

/// Items sent in one request message at most (also bounded by bytes).
const ITEMS_PER_MESSAGE_MAX: usize = 512;

/// Bytes of items put into one request message at most (one item alone may exceed it,
/// up to the message limit).
const ITEM_BYTES_PER_MESSAGE: usize = 256 * 1024;

/// Request messages queued for the stream at most.
const OUTGOING_MESSAGES: usize = 2;

/// How long a node that answered `Unimplemented` is called unary before the stream is
/// tried again (it may have been upgraded).
const UNSUPPORTED_RECHECK: Duration = Duration::from_secs(60);

/// Waiting calls past which answered or abandoned (timed out) ones are swept.
const SWEEP_AT_LEAST: usize = 1024;

type Reply = oneshot::Sender<Result<pb::BatchResponseItem, Status>>;

struct Queued {
    request: Req,
    reply: Reply,
}

/// A handle on one node's batch stream; clones share it.
#[derive(Clone)]
pub struct BatchLink {
    inner: Arc<LinkInner>,
}

struct LinkInner {
    channel: AuthChannel,
    /// Queue of the stream's task; None until the first call (a task needs a runtime,
    /// and an idle client holds no stream), replaced when the task has ended.
    queue: std::sync::Mutex<Option<mpsc::UnboundedSender<Queued>>>,
    /// When the node answered `Unimplemented` (it predates `Kv.Batch`).
    unsupported_since: std::sync::Mutex<Option<Instant>>,
}

impl LinkInner {
    fn mark_unsupported(&self) {
        *self
            .unsupported_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
    }
}

impl BatchLink {
    /// A link over `channel`; the stream opens with the first call.
    pub fn new(channel: AuthChannel) -> BatchLink {
        BatchLink {
            inner: Arc::new(LinkInner {
                channel,
                queue: std::sync::Mutex::new(None),
                unsupported_since: std::sync::Mutex::new(None),
            }),
        }
    }

    /// False for a while after the node said it does not serve `Kv.Batch`.
    pub fn supported(&self) -> bool {
        let since = *self
            .inner
            .unsupported_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        since.is_none_or(|t| t.elapsed() >= UNSUPPORTED_RECHECK)
    }

    /// Sends one call on the stream and waits for its answer. `Err` is a transport
    /// failure, as a unary call's would be (`Unimplemented`: use the unary method).
    pub async fn call(&self, request: Req) -> Result<pb::BatchResponseItem, Status> {
        let (reply, rx) = oneshot::channel();
        self.enqueue(Queued { request, reply })?;
        rx.await
            .map_err(|_| Status::unavailable("batch stream task ended"))?
    }

    fn enqueue(&self, q: Queued) -> Result<(), Status> {
        let mut queue = self
            .inner
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let q = match queue.as_ref() {
            Some(tx) => match tx.send(q) {
                Ok(()) => return Ok(()),
                // The task ended (it panicked or its runtime went away): start another.
                Err(mpsc::error::SendError(q)) => q,
            },
            None => q,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Status::internal("a batch link used outside a Tokio runtime"))?;
        handle.spawn(run(Arc::downgrade(&self.inner), rx));
        tx.send(q)
            .map_err(|_| Status::internal("batch stream task refused the first call"))?;
        *queue = Some(tx);
        Ok(())
    }
}

/// The stream's task: runs until every handle on the link is gone.
async fn run(link: std::sync::Weak<LinkInner>, mut rx: mpsc::UnboundedReceiver<Queued>) {
    loop {
        // An idle link holds no stream: wait for a call first.
        let Some(first) = rx.recv().await else {
            return;
        };
        let Some(inner) = link.upgrade() else {
            return;
        };
        let mut kv = KvClient::new(inner.channel.clone())
            .max_decoding_message_size(limits::MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::MESSAGE_BYTES_MAX);
        drop(inner);
        let mut waiting: HashMap<u64, Reply> = HashMap::new();
        let mut next_id = 1u64;
        let mut sweep_at = SWEEP_AT_LEAST;
        // Bounded: a message is taken from the queue only when the stream can take it,
        // so calls wait in the queue (where a call that gave up is dropped unsent)
        // rather than in a buffer nobody can withdraw from.
        let (out_tx, out_rx) = mpsc::channel::<pb::BatchRequest>(OUTGOING_MESSAGES);
        let Some(msg) = take(first, &mut rx, &mut waiting, &mut next_id) else {
            continue;
        };
        // Cannot fail: the channel is empty and its receiver alive.
        let _ = out_tx.try_send(msg);
        let opened = kv
            .batch(tokio_stream::wrappers::ReceiverStream::new(out_rx))
            .await;
        let mut inbound = match opened {
            Ok(r) => r.into_inner(),
            Err(status) => {
                if status.code() == Code::Unimplemented {
                    if let Some(inner) = link.upgrade() {
                        inner.mark_unsupported();
                    }
                }
                // The opening error as it is: a connect error says "never sent".
                for (_, reply) in waiting.drain() {
                    let _ = reply.send(Err(status.clone()));
                }
                continue;
            }
        };
        let why = loop {
            let room = out_tx.capacity() > 0;
            tokio::select! {
                q = rx.recv(), if room => {
                    let Some(q) = q else {
                        // Every handle is gone: nobody waits for answers.
                        return;
                    };
                    let Some(msg) = take(q, &mut rx, &mut waiting, &mut next_id) else {
                        continue;
                    };
                    // Cannot be full (only this task sends, and there was room).
                    if out_tx.try_send(msg).is_err() {
                        break "the request stream closed".to_string();
                    }
                    if waiting.len() >= sweep_at {
                        // Calls that timed out dropped their receivers.
                        waiting.retain(|_, r| !r.is_closed());
                        sweep_at = (waiting.len() * 2).max(SWEEP_AT_LEAST);
                    }
                }
                // Wakes when the stream took a message (the slot is given back at once).
                r = out_tx.reserve(), if !room => {
                    if r.is_err() {
                        break "the request stream closed".to_string();
                    }
                }
                m = inbound.message() => match m {
                    Ok(Some(resp)) => {
                        for item in resp.items {
                            if let Some(reply) = waiting.remove(&item.id) {
                                let _ = reply.send(Ok(item));
                            }
                        }
                    }
                    Ok(None) => break "the node ended the stream".to_string(),
                    // The code only: the node's text must not look like a local
                    // connect error to `never_sent`.
                    Err(status) => {
                        tracing::debug!(%status, "batch stream failed");
                        break format!("the stream failed ({:?})", status.code());
                    }
                },
            }
        };
        tracing::debug!(waiting = waiting.len(), why, "batch stream ended");
        // Sent, maybe served: the outcome of each waiting call is unknown. Calls still
        // queued were never sent and go on the next stream.
        for (_, reply) in waiting.drain() {
            let _ = reply.send(Err(Status::unavailable(format!(
                "batch stream broke before the answer came: {why}"
            ))));
        }
    }
}

/// One request message: `first` and whatever else is queued, within the caps; calls
/// whose caller gave up are dropped unsent. None if every call taken had given up.
fn take(
    first: Queued,
    rx: &mut mpsc::UnboundedReceiver<Queued>,
    waiting: &mut HashMap<u64, Reply>,
    next_id: &mut u64,
) -> Option<pb::BatchRequest> {
    let mut items = Vec::new();
    let mut bytes = 0usize;
    let mut next = Some(first);
    while let Some(q) = next.take() {
        if q.reply.is_closed() {
            next = rx.try_recv().ok();
            continue;
        }
        let id = *next_id;
        *next_id += 1;
        let item = pb::BatchRequestItem {
            id,
            request: Some(q.request),
        };
        bytes += item.encoded_len();
        items.push(item);
        waiting.insert(id, q.reply);
        if items.len() >= ITEMS_PER_MESSAGE_MAX || bytes >= ITEM_BYTES_PER_MESSAGE {
            break;
        }
        next = rx.try_recv().ok();
    }
    (!items.is_empty()).then_some(pb::BatchRequest { items })
}
