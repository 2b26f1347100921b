//! Forwarding of key-value requests from a follower to its group's leader.
//!
//! A request for a group this node hosts but does not lead goes, once, to the leader
//! this node knows, with the remaining deadline; the leader's answer (its errors
//! included) is returned as is. Clients that follow redirects themselves say
//! `no_forward` and get NotLeader with the leader's address instead. A request is not
//! forwarded when no leader is known, when it was forwarded already (`forwarded_by`),
//! or when the link to the leader is cut (fault injection): it is refused with NotLeader
//! as before.
//!
//! When the leader cannot be asked or does not answer, a read is refused with NotLeader
//! (it had no effect) and a write gets OutcomeUnknown unless it certainly never left
//! this node (the connection to the leader could not be made): it may have reached the
//! leader. A client resending it with its session gets the first result.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use phoenix_proto as proto;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

type PErr = proto::Error;
/// A connection to another node's `Kv` service.
pub type KvClient = proto::kv_client::KvClient<Channel>;

/// Longest wait for a connection to a leader.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
/// Time kept back from the client's deadline, so that this node answers before the
/// client gives up on it (a late answer would make it take this node for a dead one).
const DEADLINE_MARGIN: Duration = Duration::from_millis(20);
/// Shortest deadline worth forwarding with.
const MIN_BUDGET: Duration = Duration::from_millis(5);

/// Where a request goes: the group's leader on another node.
#[derive(Debug, Clone)]
pub struct Target {
    /// The group.
    pub group: u64,
    /// The leader's node id and address.
    pub leader: u64,
    /// Its gRPC address.
    pub addr: String,
    /// When the client stops waiting.
    pub deadline: Instant,
}

/// A request that can be forwarded: its header can be rewritten.
pub trait Forwardable {
    /// The request header.
    fn header_mut(&mut self) -> &mut Option<proto::RequestHeader>;
}

macro_rules! forwardable {
    ($($req:ident),*) => {$(
        impl Forwardable for proto::$req {
            fn header_mut(&mut self) -> &mut Option<proto::RequestHeader> {
                &mut self.header
            }
        }
    )*};
}
forwardable!(
    GetRequest,
    PutRequest,
    DeleteRequest,
    BatchGetRequest,
    BatchWriteRequest,
    ScanRequest,
    DeleteRangeRequest,
    CasRequest
);

/// Connections to the other nodes' `Kv` services, made on first use and kept.
#[derive(Default)]
pub struct Forwarder {
    /// By node id: the address the connection was made to, and the connection.
    clients: Mutex<HashMap<u64, (String, KvClient)>>,
}

impl Forwarder {
    fn client(&self, node: u64, addr: &str) -> Result<KvClient, PErr> {
        let mut clients = self.clients.lock();
        if let Some((a, c)) = clients.get(&node) {
            if a == addr {
                return Ok(c.clone());
            }
        }
        let ep = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| PErr::internal(format!("node {node} has a bad address {addr:?}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let c = proto::kv_client::KvClient::new(ep.connect_lazy())
            .max_decoding_message_size(proto::limits::MESSAGE_BYTES_MAX);
        clients.insert(node, (addr.to_string(), c.clone()));
        Ok(c)
    }

    /// Sends `req` to `to.leader` as forwarded by node `me`, with the time left before
    /// `to.deadline` (less a margin), and returns the leader's answer. `write`: whether
    /// the request changes state (see the module doc for how failures are reported).
    pub async fn forward<Req, Resp, F, Fut>(
        &self,
        me: u64,
        to: &Target,
        mut req: Req,
        write: bool,
        call: F,
    ) -> Result<Resp, PErr>
    where
        Req: Forwardable,
        F: FnOnce(KvClient, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let refused = |why: String| {
            let mut e = PErr::not_leader(
                to.group,
                Some(proto::Replica {
                    node_id: to.leader,
                    addr: to.addr.clone(),
                }),
            );
            e.message = format!("{}; forwarding to it failed: {why}", e.message);
            e
        };
        let budget = to
            .deadline
            .saturating_duration_since(Instant::now())
            .saturating_sub(DEADLINE_MARGIN);
        if budget < MIN_BUDGET {
            return Err(PErr::deadline_exceeded(0));
        }
        let h = req.header_mut().get_or_insert_with(Default::default);
        h.forwarded_by = me;
        h.timeout_ms = (budget.as_millis() as u64).max(1);
        let client = self.client(to.leader, &to.addr)?;
        match tokio::time::timeout(budget, call(client, Request::new(req))).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) if !write || never_sent(&status) => Err(refused(status.to_string())),
            Ok(Err(status)) => Err(PErr::outcome_unknown(
                to.group,
                format!("forwarded to the leader, node {}: {status}", to.leader),
            )),
            Err(_) if !write => Err(refused(format!("no answer within {budget:?}"))),
            Err(_) => Err(PErr::outcome_unknown(
                to.group,
                format!(
                    "forwarded to the leader, node {}: no answer within {budget:?}",
                    to.leader
                ),
            )),
        }
    }
}

/// Whether a failed call certainly never reached the other node: the connection could
/// not be made (refused, or the connector gave up).
fn never_sent(s: &Status) -> bool {
    use std::error::Error as _;
    if s.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut source = s.source();
    while let Some(e) = source {
        let refused = e
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        if refused || e.to_string().contains("tcp connect error") {
            return true;
        }
        source = e.source();
    }
    false
}
