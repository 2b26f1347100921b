//! `Kv.Batch`: many client calls on one long-lived stream.
//!
//! Owns the stream's plumbing only: items are read as they come, each is served by the
//! unary method it names (so admission, deadline, routing and forwarding are exactly
//! those of the unary call), and answers are sent as they complete, coalescing the ones
//! ready together into one message. A stream serves at most [`ITEMS_IN_FLIGHT_MAX`]
//! items at once (an answer counts until it is sent): past that an item is refused with
//! `ServerBusy` at once, and once as many refusals wait to be sent too (a client that
//! sends without reading), the stream stops reading, so HTTP/2 flow control holds the
//! client back instead of the server's memory growing. When the node stops, items
//! taken and not yet served are refused (`GroupUnavailable`), and the stream ends once
//! the items being served are answered.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use phoenix_proto as proto;
use proto::batch_request_item::Request as Req;
use proto::batch_response_item::Response as Resp;
use tokio::sync::{mpsc, Semaphore};
use tonic::{Request, Status, Streaming};

use crate::service::Services;

/// Unanswered items one stream may hold.
pub const ITEMS_IN_FLIGHT_MAX: usize = 4096;

/// Answers coalesced into one response message at most (also bounded by bytes).
const ANSWERS_PER_MESSAGE_MAX: usize = 512;

/// Bytes of answers coalesced into one response message at most (one answer alone may
/// exceed it, up to the message limit).
const ANSWER_BYTES_PER_MESSAGE: usize = 256 * 1024;

/// The response stream of one `Kv.Batch` call.
pub type BatchStream =
    Pin<Box<dyn futures::Stream<Item = Result<proto::BatchResponse, Status>> + Send>>;

/// Serves one `Kv.Batch` call: spawns the reader and returns the answers' stream.
pub fn serve(
    svc: Services,
    inbound: Streaming<proto::BatchRequest>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> BatchStream {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(read_items(svc, inbound, stop, tx));
    Box::pin(Answers {
        rx,
        carried: None,
        failed: None,
        ended: false,
    })
}

async fn read_items(
    svc: Services,
    mut inbound: Streaming<proto::BatchRequest>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    tx: mpsc::UnboundedSender<Result<Answer, Status>>,
) {
    let slots = Arc::new(Semaphore::new(ITEMS_IN_FLIGHT_MAX));
    // Refusals of items past the in-flight cap hold one of these until sent: a client
    // that sends without reading is stopped once both are used up.
    let refusals = Arc::new(Semaphore::new(ITEMS_IN_FLIGHT_MAX));
    loop {
        let msg = tokio::select! {
            m = inbound.message() => m,
            _ = stop.wait_for(|s| *s) => return,
        };
        let msg = match msg {
            Ok(Some(m)) => m,
            // The client ended its side: answers still owed go out, then the stream ends
            // (every clone of `tx` is gone).
            Ok(None) => return,
            Err(status) => {
                tracing::debug!(%status, "batch stream: reading requests failed");
                let _ = tx.send(Err(status));
                return;
            }
        };
        let mut items = msg.items.into_iter();
        while let Some(item) = items.next() {
            if *stop.borrow() {
                // Taken but not served: refused, so the client knows nothing applied.
                for item in std::iter::once(item).chain(items.by_ref()) {
                    let Ok(slot) = Arc::clone(&refusals).try_acquire_owned() else {
                        break;
                    };
                    let err = proto::Error::group_unavailable(group_of(&item), "node stopping");
                    let _ = tx.send(Ok((refuse(item, err), slot)));
                }
                return;
            }
            let slot = match Arc::clone(&slots).try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => match Arc::clone(&refusals).try_acquire_owned() {
                    // Past the cap: refused at once with the method's ServerBusy, as
                    // the unary call would be past the node's admission limit.
                    Ok(slot) => {
                        let err = proto::Error::server_busy(
                            "too many calls in flight on this stream; back off and retry",
                        );
                        let _ = tx.send(Ok((refuse(item, err), slot)));
                        continue;
                    }
                    // The client does not read its answers: stop reading its calls.
                    Err(_) => tokio::select! {
                        p = Arc::clone(&slots).acquire_owned() => match p {
                            Ok(p) => p,
                            Err(_) => return,
                        },
                        _ = stop.wait_for(|s| *s) => return,
                    },
                },
            };
            let svc = svc.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let answer = serve_item(&svc, item).await;
                // The slot is freed when the answer leaves in a message, so answers the
                // client does not read count against the stream too.
                let _ = tx.send(Ok((answer, slot)));
            });
        }
    }
}

/// The answer to an item refused without serving it: the method's response with `err`.
fn refuse(item: proto::BatchRequestItem, err: proto::Error) -> proto::BatchResponseItem {
    let Some(request) = item.request else {
        return not_served(item.id);
    };
    proto::BatchResponseItem {
        id: item.id,
        error: None,
        response: Some(refusal(&request, err)),
    }
}

/// The response of `request`'s method carrying `err`.
pub(crate) fn refusal(request: &Req, err: proto::Error) -> Resp {
    match request {
        Req::Get(_) => Resp::Get(proto::GetResponse {
            error: Some(err),
            ..Default::default()
        }),
        Req::Put(_) => Resp::Put(proto::PutResponse { error: Some(err) }),
        Req::Delete(_) => Resp::Delete(proto::DeleteResponse { error: Some(err) }),
        Req::Cas(_) => Resp::Cas(proto::CasResponse {
            error: Some(err),
            ..Default::default()
        }),
        Req::Incr(_) => Resp::Incr(proto::IncrResponse {
            error: Some(err),
            ..Default::default()
        }),
        Req::Expire(_) => Resp::Expire(proto::ExpireResponse {
            error: Some(err),
            ..Default::default()
        }),
        Req::Ttl(_) => Resp::Ttl(proto::TtlResponse {
            error: Some(err),
            ..Default::default()
        }),
        Req::PutEx(_) => Resp::PutEx(proto::PutResponse { error: Some(err) }),
        Req::CasEx(_) => Resp::CasEx(proto::CasResponse {
            error: Some(err),
            ..Default::default()
        }),
    }
}

/// The group an item names (0 if none).
fn group_of(item: &proto::BatchRequestItem) -> u64 {
    item.request.as_ref().map_or(0, group_of_request)
}

/// The group a request names (0 if none).
pub(crate) fn group_of_request(request: &Req) -> u64 {
    let header = match request {
        Req::Get(r) => r.header.as_ref(),
        Req::Put(r) => r.header.as_ref(),
        Req::Delete(r) => r.header.as_ref(),
        Req::Cas(r) => r.header.as_ref(),
        Req::Incr(r) => r.header.as_ref(),
        Req::Expire(r) => r.header.as_ref(),
        Req::Ttl(r) => r.header.as_ref(),
        Req::PutEx(r) => r.header.as_ref(),
        Req::CasEx(r) => r.header.as_ref(),
    };
    header.map_or(0, |h| h.group_id)
}

/// The answer to an item that names no request this server knows.
fn not_served(id: u64) -> proto::BatchResponseItem {
    proto::BatchResponseItem {
        id,
        error: Some(proto::Error::invalid_argument(
            "batch item carries no request (or one this server does not know)",
        )),
        response: None,
    }
}

/// Serves one item with the unary method it names. `error` is set only when the item
/// was not served at all; every other failure is inside the method's response.
async fn serve_item(svc: &Services, item: proto::BatchRequestItem) -> proto::BatchResponseItem {
    let Some(request) = item.request else {
        return not_served(item.id);
    };
    proto::BatchResponseItem {
        id: item.id,
        error: None,
        response: Some(serve_request(svc, request).await),
    }
}

/// Serves a single-key request with the unary method of its kind.
pub(crate) async fn serve_request(svc: &Services, request: Req) -> Resp {
    use proto::kv_server::Kv;
    // The unary methods answer every failure inside their response; a `Status` from
    // one would be a bug, answered as an internal error of the method (after a
    // propose, perhaps: never as "not served").
    let internal = |s: Status| {
        Some(proto::Error::internal(format!(
            "batch item: {}",
            s.message()
        )))
    };
    match request {
        Req::Get(r) => Resp::Get(match svc.get(Request::new(r)).await {
            Ok(r) => r.into_inner(),
            Err(s) => proto::GetResponse {
                error: internal(s),
                ..Default::default()
            },
        }),
        Req::Put(r) => Resp::Put(match svc.put(Request::new(r)).await {
            Ok(r) => r.into_inner(),
            Err(s) => proto::PutResponse { error: internal(s) },
        }),
        Req::Delete(r) => Resp::Delete(match svc.delete(Request::new(r)).await {
            Ok(r) => r.into_inner(),
            Err(s) => proto::DeleteResponse { error: internal(s) },
        }),
        Req::Cas(r) => Resp::Cas(match svc.cas(Request::new(r)).await {
            Ok(r) => r.into_inner(),
            Err(s) => proto::CasResponse {
                error: internal(s),
                ..Default::default()
            },
        }),
        Req::Incr(r) => Resp::Incr(match svc.incr(Request::new(r)).await {
            Ok(r) => r.into_inner(),
            Err(s) => proto::IncrResponse {
                error: internal(s),
                ..Default::default()
            },
        }),
        Req::Expire(r) => Resp::Expire(match svc.expire(Request::new(r)).await {
            Ok(r) => r.into_inner(),
            Err(s) => proto::ExpireResponse {
                error: internal(s),
                ..Default::default()
            },
        }),
        Req::Ttl(r) => Resp::Ttl(match svc.ttl(Request::new(r)).await {
            Ok(r) => r.into_inner(),
            Err(s) => proto::TtlResponse {
                error: internal(s),
                ..Default::default()
            },
        }),
        Req::PutEx(r) => Resp::PutEx(match svc.put_ex(Request::new(r)).await {
            Ok(r) => r.into_inner(),
            Err(s) => proto::PutResponse { error: internal(s) },
        }),
        Req::CasEx(r) => Resp::CasEx(match svc.cas_ex(Request::new(r)).await {
            Ok(r) => r.into_inner(),
            Err(s) => proto::CasResponse {
                error: internal(s),
                ..Default::default()
            },
        }),
    }
}

/// An answer with the stream slot its item holds.
type Answer = (proto::BatchResponseItem, tokio::sync::OwnedSemaphorePermit);

/// The answers' stream: whatever answers are ready when it is polled go out as one
/// message.
struct Answers {
    rx: mpsc::UnboundedReceiver<Result<Answer, Status>>,
    /// An answer taken that did not fit the previous message.
    carried: Option<proto::BatchResponseItem>,
    /// A read error met while coalescing: sent after the answers taken with it.
    failed: Option<Status>,
    ended: bool,
}

impl futures::Stream for Answers {
    type Item = Result<proto::BatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        use prost::Message as _;
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(status) = self.failed.take() {
            self.ended = true;
            return Poll::Ready(Some(Err(status)));
        }
        let first = match self.carried.take() {
            Some(a) => a,
            None => match self.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(status))) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Ready(Some(Ok((a, _slot)))) => a,
            },
        };
        let mut bytes = first.encoded_len();
        let mut items = vec![first];
        while items.len() < ANSWERS_PER_MESSAGE_MAX && bytes < ANSWER_BYTES_PER_MESSAGE {
            match self.rx.try_recv() {
                Ok(Ok((a, _slot))) => {
                    let len = a.encoded_len();
                    if bytes + len > ANSWER_BYTES_PER_MESSAGE {
                        self.carried = Some(a);
                        break;
                    }
                    bytes += len;
                    items.push(a);
                }
                Ok(Err(status)) => {
                    // Reading failed: the answers taken go out first, then the error.
                    self.failed = Some(status);
                    break;
                }
                Err(_) => break,
            }
        }
        Poll::Ready(Some(Ok(proto::BatchResponse { items })))
    }
}
