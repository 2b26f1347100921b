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
//! Requests that can be items of a `Kv.Batch` stream (single-key reads and writes up to
//! [`ITEM_BYTES_MAX`]) go over one such stream per leader ([`BatchLink`]), as
//! PhoenixKV's client sends them: a unary call costs an HTTP/2 stream with headers both
//! ways on both nodes. The rest (larger ones, batch get/write, scan, delete range) go as
//! unary calls. (PhoenixKV's client, the Redis front end's included, asks not to be
//! forwarded and goes to the leader itself; forwards serve other gRPC clients and
//! clients whose leader is not known yet.) A leader whose binary predates the stream
//! answers its opening with `Unimplemented`: those requests are refused with NotLeader
//! naming it (nothing was served) and the link goes unary to it for a while.
//!
//! A forward that gives up (its deadline) cannot withdraw an item already sent: the
//! leader serves it within the item's own deadline, so a write may apply after the
//! follower answered OutcomeUnknown, as the outcome says (a resend in its session
//! applies once). [`FORWARDS_MAX`] bounds the forwards waiting here, not that work.
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
use phoenix_proto::batch_link::{BatchLink, ITEM_BYTES_MAX};
use phoenix_proto::security::Credentials;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use proto::batch_request_item::Request as Item;
use proto::batch_response_item::Response as Answer;
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

/// What a request needs of the cluster before it is served or forwarded: the feature it
/// uses and the protocol level that serves it (None: any level does). Every forwardable
/// request states it, so the version gate (`Services::gate`) cannot be forgotten for a
/// new one: a replica of an older binary would apply a command it does not know as an
/// empty one, or a write without the fields it cannot decode.
pub trait Needs {
    /// The feature and level, if any.
    fn needs(&self) -> Option<(&'static str, u32)>;
}

const EXPIRY: Option<(&str, u32)> = Some(("key expiry", phoenix_meta::PROTOCOL_TTL));

macro_rules! needs_nothing {
    ($($req:ident),*) => {$(
        impl Needs for proto::$req {
            fn needs(&self) -> Option<(&'static str, u32)> {
                None
            }
        }
    )*};
}
needs_nothing!(
    GetRequest,
    DeleteRequest,
    BatchGetRequest,
    ScanRequest,
    DeleteRangeRequest
);

impl Needs for proto::PutRequest {
    fn needs(&self) -> Option<(&'static str, u32)> {
        self.with_expiry().then_some(EXPIRY).flatten()
    }
}

impl Needs for proto::CasRequest {
    fn needs(&self) -> Option<(&'static str, u32)> {
        self.with_expiry().then_some(EXPIRY).flatten()
    }
}

impl Needs for proto::BatchWriteRequest {
    fn needs(&self) -> Option<(&'static str, u32)> {
        let with_expiry = self.mutations.iter().any(|m| m.ttl_ms != 0 || m.keep_ttl);
        with_expiry.then_some(EXPIRY).flatten()
    }
}

impl Needs for proto::IncrRequest {
    fn needs(&self) -> Option<(&'static str, u32)> {
        Some(("incr", phoenix_meta::PROTOCOL_INCR))
    }
}

impl Needs for proto::ExpireRequest {
    fn needs(&self) -> Option<(&'static str, u32)> {
        EXPIRY
    }
}

impl Needs for proto::TtlRequest {
    fn needs(&self) -> Option<(&'static str, u32)> {
        // A read, but an older leader does not know the method: refused as unsupported,
        // so the Redis front end answers as before expiries.
        EXPIRY
    }
}

/// A request that can be forwarded: its header can be rewritten.
pub trait Forwardable: Needs + prost::Message + Sized {
    /// The method's response.
    type Response;
    /// The request header.
    fn header_mut(&mut self) -> &mut Option<proto::RequestHeader>;
    /// The request as a `Kv.Batch` item, or itself if it cannot be one.
    fn into_item(self) -> Result<Item, Self> {
        Err(self)
    }
    /// The method's response out of an item's answer (None: an answer of another kind).
    fn response_of(_answer: Answer) -> Option<Self::Response> {
        None
    }
}

macro_rules! forwardable {
    ($($req:ident => $resp:ident),*) => {$(
        impl Forwardable for proto::$req {
            type Response = proto::$resp;
            fn header_mut(&mut self) -> &mut Option<proto::RequestHeader> {
                &mut self.header
            }
        }
    )*};
}
forwardable!(
    BatchGetRequest => BatchGetResponse,
    BatchWriteRequest => BatchWriteResponse,
    ScanRequest => ScanResponse,
    DeleteRangeRequest => DeleteRangeResponse
);

/// Requests that are `Kv.Batch` items: `$item` (`$item_ex` when [`with_expiry`] says
/// the request sets or keeps an expiry, so that a leader predating key expiry refuses
/// it rather than writing without it, as the unary `PutEx`/`CasEx` are for).
macro_rules! itemized {
    ($($req:ident => $resp:ident: $item:ident $(/ $item_ex:ident)?),*) => {$(
        impl Forwardable for proto::$req {
            type Response = proto::$resp;
            fn header_mut(&mut self) -> &mut Option<proto::RequestHeader> {
                &mut self.header
            }
            fn into_item(self) -> Result<Item, Self> {
                $(if self.with_expiry() {
                    return Ok(Item::$item_ex(self));
                })?
                Ok(Item::$item(self))
            }
            fn response_of(answer: Answer) -> Option<Self::Response> {
                match answer {
                    Answer::$item(r) => Some(r),
                    $(Answer::$item_ex(r) => Some(r),)?
                    _ => None,
                }
            }
        }
    )*};
}
itemized!(
    GetRequest => GetResponse: Get,
    PutRequest => PutResponse: Put / PutEx,
    DeleteRequest => DeleteResponse: Delete,
    CasRequest => CasResponse: Cas / CasEx,
    IncrRequest => IncrResponse: Incr,
    ExpireRequest => ExpireResponse: Expire,
    TtlRequest => TtlResponse: Ttl
);

/// Whether a write sets or keeps an expiry (it goes as `PutEx`/`CasEx`).
trait WithExpiry {
    fn with_expiry(&self) -> bool;
}

impl WithExpiry for proto::PutRequest {
    fn with_expiry(&self) -> bool {
        self.ttl_ms != 0 || self.keep_ttl
    }
}

impl WithExpiry for proto::CasRequest {
    fn with_expiry(&self) -> bool {
        // A swap that deletes leaves no key to expire (its expiry fields are ignored).
        !self.delete && (self.ttl_ms != 0 || self.keep_ttl)
    }
}

/// A connection to a node: unary calls and the batch stream share its channel.
#[derive(Clone)]
struct Link {
    addr: String,
    unary: KvClient,
    stream: BatchLink,
}

/// Connections to the other nodes' `Kv` services, made on first use and kept.
pub struct Forwarder {
    /// By node id: the connection (with the address it was made to).
    links: Mutex<HashMap<u64, Link>>,
    /// Forwards in flight ([`FORWARDS_MAX`]).
    slots: tokio::sync::Semaphore,
    /// What this node presents to the leaders it forwards to.
    creds: Credentials,
    /// Forwards sent, by how (`via`: stream or unary).
    sent: Family<[(&'static str, &'static str); 1], Counter>,
}

impl Forwarder {
    /// A forwarder presenting `creds` to the other nodes and counting its forwards in
    /// `sent`.
    pub fn new(
        creds: Credentials,
        sent: Family<[(&'static str, &'static str); 1], Counter>,
    ) -> Forwarder {
        Forwarder {
            links: Mutex::default(),
            slots: tokio::sync::Semaphore::new(FORWARDS_MAX),
            creds,
            sent,
        }
    }

    fn link(&self, node: u64, addr: &str) -> Result<Link, PErr> {
        let mut links = self.links.lock();
        if let Some(l) = links.get(&node) {
            if l.addr == addr {
                return Ok(l.clone());
            }
        }
        let ep = self
            .creds
            .endpoint(addr)
            .map_err(|e| PErr::internal(format!("node {node}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            // A leader gone silent (paused, its packets dropped) breaks the stream within
            // seconds instead of holding it until TCP gives up.
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        let channel = self.creds.authorize(ep.connect_lazy());
        let l = Link {
            addr: addr.to_string(),
            unary: proto::kv_client::KvClient::new(channel.clone())
                .max_decoding_message_size(proto::limits::MESSAGE_BYTES_MAX),
            stream: BatchLink::new(channel),
        };
        links.insert(node, l.clone());
        Ok(l)
    }

    /// Sends `req` to `to.leader` as forwarded by node `me`, with the time left before
    /// `to.deadline` (less a margin), and returns the leader's answer. `write`: whether
    /// the request changes state (see the module doc for how failures are reported).
    /// `call` makes the unary call, for requests that are no batch items or a leader
    /// that does not serve the stream.
    pub async fn forward<Req, F, Fut>(
        &self,
        me: u64,
        to: &Target,
        mut req: Req,
        write: bool,
        call: F,
    ) -> Result<Req::Response, PErr>
    where
        Req: Forwardable,
        F: FnOnce(KvClient, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Req::Response>, Status>>,
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
        let link = self.link(to.leader, &to.addr)?;
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
        if link.stream.supported() && req.encoded_len() <= ITEM_BYTES_MAX {
            match req.into_item() {
                Ok(item) => {
                    self.sent.get_or_create(&[("via", "stream")]).inc();
                    return match tokio::time::timeout(budget, link.stream.call(item)).await {
                        Ok(Ok(answer)) => match (answer.error, answer.response) {
                            // Not served at all (the leader knows no such item).
                            (Some(e), _) => Err(e),
                            // (Answered: a write may have applied, whatever came back.)
                            (None, Some(a)) => Req::response_of(a)
                                .ok_or_else(|| unanswered("an answer of another kind".to_string())),
                            (None, None) => Err(unanswered("an empty answer".to_string())),
                        },
                        Ok(Err(status)) if never_sent(&status) => Err(refused(status.to_string())),
                        // The leader predates the stream (the link now goes unary to it
                        // for a while): it served nothing; the client tries the leader.
                        Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                            Err(refused(status.to_string()))
                        }
                        Ok(Err(status)) => Err(unanswered(status.to_string())),
                        Err(_) => Err(unanswered(format!("no answer within {budget:?}"))),
                    };
                }
                Err(r) => req = r,
            }
        }
        self.sent.get_or_create(&[("via", "unary")]).inc();
        match tokio::time::timeout(budget, call(link.unary, Request::new(req))).await {
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
