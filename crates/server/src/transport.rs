//! Raft message transport between nodes.
//!
//! Outgoing: one task per peer node owns one client-streaming gRPC call
//! (`RaftTransport.Stream`) and sends batches of whatever messages (of any group) are
//! queued for that node. If the peer cannot be reached the queued messages are dropped
//! (raft retransmits), the driver is told (`report_unreachable`), and the task
//! reconnects with exponential backoff.
//!
//! Incoming: every message is validated (addressed to this node, decodable, sender
//! matches the batch) before it reaches the driver; a peer sending nonsense is logged
//! and its stream is closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;
use parking_lot::{Mutex, RwLock};
use phoenix_proto as proto;
use phoenix_proto::convert;
use phoenix_proto::security::{AuthChannel, Credentials};
use phoenix_raft::{Message, MessageType};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::node::Event;

/// Most messages in one batch.
const BATCH_MESSAGES_MAX: usize = 512;
/// Most encoded bytes in one batch (a batch is one gRPC message, refused by the peer
/// above `limits::MESSAGE_BYTES_MAX`; a batch holds at least one message). Appends to a
/// follower that fell behind are up to 1 MiB each, and many queue at once.
const BATCH_BYTES_MAX: usize = 4 << 20;
/// Most queued messages per peer; beyond, new ones are dropped (raft retransmits).
const QUEUE_MESSAGES_MAX: usize = 65_536;
/// HTTP/2 pings on every peer connection, busy or idle: a paused or cut-off peer is
/// found within interval + timeout, about an election timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_millis(500);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_millis(1000);

struct Inner {
    node_id: u64,
    /// What this node presents to its peers.
    creds: Credentials,
    addrs: Arc<RwLock<HashMap<u64, String>>>,
    links: Arc<crate::faults::Links>,
    peers: Mutex<HashMap<u64, mpsc::Sender<proto::GroupMessage>>>,
    events: Sender<Event>,
    runtime: tokio::runtime::Handle,
    closed: std::sync::atomic::AtomicBool,
    /// Messages queued for other nodes, by kind (`MessageType as usize`).
    sent: [AtomicU64; MessageType::ALL.len()],
}

/// The outgoing side (cheap to clone).
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

impl Transport {
    /// A transport for node `node_id`.
    pub fn new(
        node_id: u64,
        addrs: Arc<RwLock<HashMap<u64, String>>>,
        links: Arc<crate::faults::Links>,
        events: Sender<Event>,
        runtime: tokio::runtime::Handle,
        creds: Credentials,
    ) -> Transport {
        Transport {
            inner: Arc::new(Inner {
                node_id,
                creds,
                addrs,
                links,
                peers: Mutex::new(HashMap::new()),
                events,
                runtime,
                closed: std::sync::atomic::AtomicBool::new(false),
                sent: Default::default(),
            }),
        }
    }

    /// Messages queued for other nodes so far, by kind name.
    pub fn sent(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        // (Snapshots go on a stream of their own: `phoenix_snapshots_total`.)
        MessageType::ALL
            .iter()
            .filter(|k| **k != MessageType::Snapshot)
            .map(|k| {
                (
                    k.name(),
                    self.inner.sent[*k as usize].load(Ordering::Relaxed),
                )
            })
    }

    /// Stops every outgoing stream (node shutdown); later sends are dropped.
    pub fn close(&self) {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.inner.peers.lock().clear();
    }

    /// Queues a message of group `group` for its receiver.
    pub fn send(&self, group: u64, epoch: u64, m: Message) {
        let to = m.to;
        if self.inner.closed.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        if to == self.inner.node_id {
            let _ = self.inner.events.send(Event::Raft { group, msg: m });
            return;
        }
        let kind = m.kind as usize;
        let gm = proto::GroupMessage {
            group_id: group,
            epoch,
            message: Some(convert::message_to_wire(&m)),
        };
        let mut peers = self.inner.peers.lock();
        let tx = peers.entry(to).or_insert_with(|| {
            let (tx, rx) = mpsc::channel(QUEUE_MESSAGES_MAX);
            let inner = Arc::clone(&self.inner);
            self.inner.runtime.spawn(peer_loop(inner, to, rx));
            tx
        });
        if tx.try_send(gm).is_err() {
            tracing::debug!(to, group, "outgoing raft queue full; message dropped");
        } else {
            self.inner.sent[kind].fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn peer_loop(inner: Arc<Inner>, to: u64, mut rx: mpsc::Receiver<proto::GroupMessage>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let addr = inner.addrs.read().get(&to).cloned();
        let client = match addr {
            // A cut link (fault injection) fails as a partitioned peer does: no
            // connection, so the driver hears `Unreachable` at every retry.
            _ if inner.links.is_cut(to) => Err(format!("link to node {to} cut (fault injection)")),
            Some(a) => connect(&inner.creds, &a).await,
            None => Err(format!("no address known for node {to}")),
        };
        let mut client = match client {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(to, "cannot reach node: {e}");
                // Drop what was queued (raft retransmits) and tell the driver.
                while rx.try_recv().is_ok() {}
                let _ = inner.events.send(Event::Unreachable(to));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                if rx.is_closed() {
                    return;
                }
                continue;
            }
        };
        let (btx, brx) = mpsc::channel::<proto::RaftBatch>(16);
        let mut call = tokio::spawn(async move {
            client
                .stream(tokio_stream::wrappers::ReceiverStream::new(brx))
                .await
        });
        // The call ends when the connection dies (a killed peer's socket closes; a
        // paused or cut-off one misses keepalive pings), even while nothing is sent:
        // the driver must hear of it then, because groups asleep with their leader on
        // that node notice nothing else.
        let mut ended = None;
        // A message taken from the queue that did not fit the last batch.
        let mut carried: Option<proto::GroupMessage> = None;
        // A link cut while the stream is up ends it within this period, as a partition
        // would once keepalive pings go unanswered (idle or not). Only watched when
        // links can be cut at all.
        let watch_cuts = inner.links.enabled();
        let mut cut_check = tokio::time::interval(Duration::from_millis(250));
        loop {
            let first = match carried.take() {
                Some(m) => m,
                None => tokio::select! {
                    m = rx.recv() => match m {
                        Some(m) => m,
                        None => {
                            call.abort();
                            return;
                        }
                    },
                    r = &mut call => {
                        ended = Some(r);
                        break;
                    }
                    _ = cut_check.tick(), if watch_cuts => {
                        if inner.links.is_cut(to) {
                            call.abort();
                            break;
                        }
                        continue;
                    }
                },
            };
            if inner.links.is_cut(to) {
                // Lost in the partition, with whatever is queued (raft retransmits).
                call.abort();
                break;
            }
            let mut bytes = first.encoded_len();
            if bytes > proto::limits::MESSAGE_BYTES_MAX / 2 {
                // Cannot happen with raft's 1 MiB cap per append; never let it break the
                // stream for the messages behind it.
                tracing::warn!(to, bytes, "raft message too large to send; dropped");
                continue;
            }
            let mut messages = vec![first];
            while messages.len() < BATCH_MESSAGES_MAX {
                match rx.try_recv() {
                    Ok(m) => {
                        let len = m.encoded_len();
                        if bytes + len > BATCH_BYTES_MAX {
                            carried = Some(m);
                            break;
                        }
                        bytes += len;
                        messages.push(m);
                    }
                    Err(_) => break,
                }
            }
            let batch = proto::RaftBatch {
                from_node: inner.node_id,
                to_node: to,
                messages,
            };
            if btx.send(batch).await.is_err() {
                break;
            }
            backoff = Duration::from_millis(50);
        }
        drop(btx);
        let ended = match ended {
            Some(r) => r,
            None => call.await,
        };
        match ended {
            Ok(Ok(_)) => tracing::debug!(to, "raft stream closed"),
            Ok(Err(s)) => tracing::debug!(to, "raft stream failed: {s}"),
            Err(e) => tracing::debug!(to, "raft stream task: {e}"),
        }
        if inner.links.is_cut(to) {
            while rx.try_recv().is_ok() {}
        }
        let _ = inner.events.send(Event::Unreachable(to));
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn connect(
    creds: &Credentials,
    addr: &str,
) -> Result<proto::raft_transport_client::RaftTransportClient<AuthChannel>, String> {
    let ep = creds
        .endpoint(addr)?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    let ch = ep.connect().await.map_err(|e| format!("{addr}: {e}"))?;
    Ok(
        proto::raft_transport_client::RaftTransportClient::new(creds.authorize(ch))
            .max_decoding_message_size(proto::limits::MESSAGE_BYTES_MAX)
            .max_encoding_message_size(proto::limits::MESSAGE_BYTES_MAX),
    )
}

/// The incoming side: the `RaftTransport` gRPC service.
pub struct TransportService {
    /// Shared node state.
    pub shared: Arc<crate::shared::Shared>,
    /// Turns true when the node stops: incoming streams end then.
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// Validates one incoming message and turns it into a driver event.
fn decode_incoming(node_id: u64, from_node: u64, gm: proto::GroupMessage) -> Result<Event, String> {
    let wire = gm.message.ok_or("group message without a raft message")?;
    let msg = convert::message_from_wire(wire, bytes::Bytes::new()).map_err(|e| e.to_string())?;
    if msg.to != node_id {
        return Err(format!(
            "message for node {} arrived at node {node_id}",
            msg.to
        ));
    }
    if msg.from != from_node {
        return Err(format!(
            "message from node {} inside a batch of node {from_node}",
            msg.from
        ));
    }
    if msg.kind == phoenix_raft::MessageType::Snapshot {
        return Err("snapshot messages travel over SendSnapshot only".into());
    }
    Ok(Event::Raft {
        group: gm.group_id,
        msg,
    })
}

type SnapshotResult = Result<Response<proto::SnapshotDone>, Status>;

#[tonic::async_trait]
impl proto::raft_transport_server::RaftTransport for TransportService {
    async fn stream(
        &self,
        request: Request<Streaming<proto::RaftBatch>>,
    ) -> Result<Response<proto::RaftStreamDone>, Status> {
        let mut s = request.into_inner();
        let me = self.shared.cfg.node_id;
        let mut stop = self.stop.clone();
        loop {
            let batch = tokio::select! {
                b = s.next() => b,
                _ = stop.wait_for(|s| *s) => return Err(Status::unavailable("node stopping")),
            };
            let Some(batch) = batch else { break };
            let batch = batch?;
            if batch.to_node != me {
                let why = format!("batch for node {} reached node {me}", batch.to_node);
                tracing::warn!("{why}; closing the stream");
                return Err(Status::invalid_argument(why));
            }
            let from = batch.from_node;
            if self.shared.links.is_cut(from) {
                continue;
            }
            for gm in batch.messages {
                match decode_incoming(me, from, gm) {
                    Ok(ev) => {
                        if self.shared.events.send(ev).is_err() {
                            return Err(Status::unavailable("node shutting down"));
                        }
                    }
                    Err(why) => {
                        tracing::warn!(
                            from,
                            "dropping a malformed raft message and the stream: {why}"
                        );
                        return Err(Status::invalid_argument(why));
                    }
                }
            }
        }
        Ok(Response::new(proto::RaftStreamDone {
            reason: "sender closed the stream".into(),
        }))
    }

    async fn send_snapshot(
        &self,
        request: Request<Streaming<proto::SnapshotChunk>>,
    ) -> SnapshotResult {
        crate::snapshot::receive(Arc::clone(&self.shared), request.into_inner(), false).await
    }

    async fn send_snapshot_by_copy(
        &self,
        request: Request<Streaming<proto::SnapshotChunk>>,
    ) -> SnapshotResult {
        crate::snapshot::receive(Arc::clone(&self.shared), request.into_inner(), true).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A peer that counts the raft messages it receives, with the node's size limit.
    struct Sink {
        got: Arc<AtomicUsize>,
    }

    #[tonic::async_trait]
    impl proto::raft_transport_server::RaftTransport for Sink {
        async fn stream(
            &self,
            request: Request<Streaming<proto::RaftBatch>>,
        ) -> Result<Response<proto::RaftStreamDone>, Status> {
            let mut s = request.into_inner();
            // A peer slow to read (just resumed, busy): the sender's queue fills.
            tokio::time::sleep(Duration::from_millis(300)).await;
            while let Some(batch) = s.next().await {
                let batch = batch?;
                self.got.fetch_add(batch.messages.len(), Ordering::Relaxed);
            }
            Ok(Response::new(proto::RaftStreamDone {
                reason: String::new(),
            }))
        }

        async fn send_snapshot(
            &self,
            _request: Request<Streaming<proto::SnapshotChunk>>,
        ) -> Result<Response<proto::SnapshotDone>, Status> {
            Err(Status::unimplemented("not in this test"))
        }

        async fn send_snapshot_by_copy(
            &self,
            _request: Request<Streaming<proto::SnapshotChunk>>,
        ) -> Result<Response<proto::SnapshotDone>, Status> {
            Err(Status::unimplemented("not in this test"))
        }
    }

    /// Many large appends queued at once (a follower back after a pause) all arrive:
    /// batches stay under the peer's message limit. Cut by count alone, the first batch
    /// was 40 MiB, the peer refused it and the stream broke with everything queued.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_large_appends_arrives_whole() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let got = Arc::new(AtomicUsize::new(0));
        let sink = Sink {
            got: Arc::clone(&got),
        };
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(
                    proto::raft_transport_server::RaftTransportServer::new(sink)
                        .max_decoding_message_size(proto::limits::MESSAGE_BYTES_MAX),
                )
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let addrs = Arc::new(RwLock::new(HashMap::from([(2u64, addr)])));
        let (events, _rx) = crossbeam_channel::unbounded();
        let links = Arc::new(crate::faults::Links::new(Arc::clone(&addrs), false));
        let t = Transport::new(
            1,
            addrs,
            links,
            events,
            tokio::runtime::Handle::current(),
            Credentials::default(),
        );
        let n = 40;
        for i in 0..n {
            let mut m = Message::new(phoenix_raft::MessageType::Append, 1, 2, 1);
            m.index = i;
            m.entries = vec![phoenix_raft::Entry {
                term: 1,
                index: i + 1,
                kind: phoenix_raft::EntryKind::Normal,
                data: bytes::Bytes::from(vec![7u8; 1 << 20]),
                conflict_keys: None,
            }];
            t.send(7, 1, m);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while got.load(Ordering::Relaxed) < n as usize && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            got.load(Ordering::Relaxed),
            n as usize,
            "messages delivered"
        );
        t.close();
        server.abort();
    }
}
