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
//! When the leader cannot be reached (no connection could be made), the request is
//! refused with NotLeader naming it. When it does not answer, a read gets
//! GroupUnavailable (it had no effect) and a write OutcomeUnknown: it may have reached
//! the leader, and a client resending it with its session gets the first result.
//!
//! Forwards have their own bound ([`FORWARDS_MAX`] at once, each at most
//! [`FORWARD_WAIT_MAX`]) and do not hold the node's admission permit: a stalled leader
//! elsewhere must not fill this node with waiting requests and starve the groups it
//! leads itself.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use phoenix_proto as proto;
use phoenix_proto::security::Credentials;
use tonic::{Request, Response, Status};

type PErr = proto::Error;
/// A connection to another node's `Kv` service.
pub type KvClient = proto::kv_client::KvClient<phoenix_proto::security::AuthChannel>;

/// Longest wait for a connection to a leader.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
/// Time kept back from the client's deadline, so that this node answers before the
/// client gives up on it (a late answer would make it take this node for a dead one).
const DEADLINE_MARGIN: Duration = Duration::from_millis(20);
/// Shortest deadline worth forwarding with.
const MIN_BUDGET: Duration = Duration::from_millis(5);
/// Forwarded requests waiting for their leaders at once; past it, requests that would be
/// forwarded are refused with NotLeader (the client goes to the leader itself).
pub const FORWARDS_MAX: usize = 256;
/// Longest wait for a leader's answer to a forwarded request.
pub const FORWARD_WAIT_MAX: Duration = Duration::from_secs(5);

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
    CasRequest,
    IncrRequest,
    ExpireRequest,
    TtlRequest
);

/// Connections to the other nodes' `Kv` services, made on first use and kept.
pub struct Forwarder {
    /// By node id: the address the connection was made to, and the connection.
    clients: Mutex<HashMap<u64, (String, KvClient)>>,
    /// Forwards in flight ([`FORWARDS_MAX`]).
    slots: tokio::sync::Semaphore,
    /// What this node presents to the leaders it forwards to.
    creds: Credentials,
}

impl Forwarder {
    /// A forwarder presenting `creds` to the other nodes.
    pub fn new(creds: Credentials) -> Forwarder {
        Forwarder {
            clients: Mutex::default(),
            slots: tokio::sync::Semaphore::new(FORWARDS_MAX),
            creds,
        }
    }

    fn client(&self, node: u64, addr: &str) -> Result<KvClient, PErr> {
        let mut clients = self.clients.lock();
        if let Some((a, c)) = clients.get(&node) {
            if a == addr {
                return Ok(c.clone());
            }
        }
        let ep = self
            .creds
            .endpoint(addr)
            .map_err(|e| PErr::internal(format!("node {node}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let c = proto::kv_client::KvClient::new(self.creds.authorize(ep.connect_lazy()))
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
                    protocol: 0,
                    node_id: to.leader,
                    addr: to.addr.clone(),
                }),
            );
            e.message = format!("{}; forwarding to it failed: {why}", e.message);
            e
        };
        let left = to.deadline.saturating_duration_since(Instant::now());
        let budget = left.saturating_sub(DEADLINE_MARGIN).min(FORWARD_WAIT_MAX);
        if budget < MIN_BUDGET {
            return Err(PErr::deadline_exceeded(left.as_millis() as u64));
        }
        let Ok(_slot) = self.slots.try_acquire() else {
            return Err(refused(format!(
                "{FORWARDS_MAX} forwarded requests already waiting on this node"
            )));
        };
        let h = req.header_mut().get_or_insert_with(Default::default);
        h.forwarded_by = me;
        h.timeout_ms = (budget.as_millis() as u64).max(1);
        let client = self.client(to.leader, &to.addr)?;
        let unanswered = |why: String| {
            if write {
                PErr::outcome_unknown(
                    to.group,
                    format!("forwarded to the leader, node {}: {why}", to.leader),
                )
            } else {
                PErr::group_unavailable(
                    to.group,
                    format!("the leader, node {}, did not answer: {why}", to.leader),
                )
            }
        };
        match tokio::time::timeout(budget, call(client, Request::new(req))).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) if never_sent(&status) => Err(refused(status.to_string())),
            // The leader's binary predates the method: it served nothing.
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                let mut e = PErr::unsupported("the request", 0, 0);
                e.message = format!(
                    "the leader, node {}, does not serve this request (an older binary): {}",
                    to.leader,
                    status.message()
                );
                Err(e)
            }
            Ok(Err(status)) => Err(unanswered(status.to_string())),
            Err(_) => Err(unanswered(format!("no answer within {budget:?}"))),
        }
    }
}

/// Whether a failed call certainly never reached the other node: the connection could
/// not be made (refused, or the connector gave up).
fn never_sent(s: &Status) -> bool {
    use std::error::Error as _;
    // The leader's gate refused this node's credentials before serving anything.
    if s.code() == tonic::Code::Unauthenticated {
        return true;
    }
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
