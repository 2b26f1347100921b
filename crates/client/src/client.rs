//! [`Client`]: routes each request to the leader of the group owning its key, and retries
//! within the request's deadline.
//!
//! One request = one deadline (`ClientOptions::timeout`, or [`Client::with_timeout`]).
//! Inside it the client loops: locate the route (refreshing the cache from any node's
//! `Meta.GetRoutes` when it misses), pick the cached leader (or the next replica), send
//! with the remaining time as the server-side deadline, and react to the answer:
//!
//! | answer | reaction |
//! |---|---|
//! | success | remember the replica as leader, return |
//! | NotLeader with a hint | switch to the hinted leader and resend at once (seed 001) |
//! | NotLeader without hint, GroupUnavailable | forget the leader, next replica, back off |
//! | StaleEpoch / KeyNotInGroup | take the route the server sent (or refresh), resend |
//! | ServerBusy, transport failure | next replica, back off |
//! | DiskFull | back off and resend for up to [`DISK_FULL_PATIENCE`] (the full leader hands its group to a node with room), then return it |
//! | DeadlineExceeded / OutcomeUnknown | reads and (with sessions) writes resend |
//! | SessionExpired | the write is ambiguous |
//! | key/value too large, invalid argument, internal | return the typed error |
//!
//! Requests say `no_forward`: a follower refuses with a redirect rather than forwarding
//! to the leader, so the client learns the leader and talks to it directly.
//!
//! Backoff is exponential with jitter ([`crate::backoff`]) and never sleeps past the
//! deadline. A write whose fate is unknown (the connection broke after sending, or the
//! server timed out) is resent with the same session sequence number (exactly-once:
//! the group applies it at most once and answers the resend with the first result),
//! compare-and-swap included. Without sessions it is resent only if it is idempotent
//! (put, delete, batch write, delete range) and `retry_ambiguous_writes` is on;
//! otherwise it fails with [`ClientError::Ambiguous`], as it does on `SessionExpired`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use phoenix_proto::error::Kind;
use phoenix_proto::kv_client::KvClient;
use phoenix_proto::limits;
use phoenix_proto::meta_client::MetaClient;
use phoenix_proto::security::{AuthChannel, Credentials};
use phoenix_proto::{self as pb, RequestHeader};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::time::Instant;

use crate::backoff::BackoffPolicy;
use crate::error::{ClientError, Result};
use crate::local::LocalNode;
use crate::routing::{NodeId, Route, RouteTable};
use phoenix_proto::batch_link::BatchLink;

/// How long a call keeps resending a write refused with `DiskFull` before it returns
/// the refusal: long enough for a full leader to hand its group to a node with room
/// (it does so every half second, and a hand-off takes an append round and an
/// election).
pub const DISK_FULL_PATIENCE: Duration = Duration::from_secs(2);

/// How the client behaves.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Deadline of each call (all its retries included).
    pub timeout: Duration,
    /// Time to establish a TCP connection to a node.
    pub connect_timeout: Duration,
    /// Longest wait for one node's answer when the request may be sent again (reads,
    /// writes in a session): a node that is paused or cut off keeps its connection open
    /// but says nothing, and the request moves on to another replica instead of spending
    /// its whole deadline there. Route look-ups are bounded by it too.
    pub attempt_timeout: Duration,
    /// Retry pacing.
    pub backoff: BackoffPolicy,
    /// Keys longer than this are refused before sending.
    pub key_bytes_max: usize,
    /// Values longer than this are refused before sending (servers may allow less).
    pub value_bytes_max: usize,
    /// Exactly-once writes: every write carries this client's session id and a sequence
    /// number that a resend keeps, and the group applies it at most once (answering a
    /// resend with the first result). Writes whose outcome is unknown are then resent,
    /// compare-and-swap included. On by default.
    pub sessions: bool,
    /// Without sessions: resend idempotent writes whose outcome is unknown
    /// (at-least-once: a resent put can apply again after another client's acknowledged
    /// write of the same key, which is not linearizable). Off by default.
    pub retry_ambiguous_writes: bool,
    /// Single-key calls (get, put, delete, compare-and-swap) of small size to one node
    /// travel as items of one long-lived `Kv.Batch` stream instead of one HTTP/2 stream
    /// each: with many calls in flight, those queued together share a message both
    /// ways. Same semantics as the unary calls (a node that predates the stream is
    /// called unary). On by default.
    pub batch_stream: bool,
    /// Seed of the backoff jitter (0 = from the OS).
    pub seed: u64,
    /// A node in this process: single-key calls to its address are served by its
    /// request layer directly, not over the network (see [`LocalNode`]).
    pub local_node: Option<Arc<dyn LocalNode>>,
    /// TLS (the cluster's CA, and a certificate if the client has one) and the token
    /// the client presents; default: plaintext, no token.
    pub credentials: Credentials,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            // A healthy node answers in milliseconds; a paused leader is replaced within
            // an election timeout (0.5–1 s by default): by then the resend should find
            // the new one.
            attempt_timeout: Duration::from_millis(500),
            backoff: BackoffPolicy::default(),
            key_bytes_max: limits::KEY_BYTES_MAX,
            value_bytes_max: limits::VALUE_BYTES_MAX,
            sessions: true,
            retry_ambiguous_writes: false,
            batch_stream: true,
            seed: 0,
            local_node: None,
            credentials: Credentials::default(),
        }
    }
}

/// One mutation of an atomic batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Set key to value.
    Put(Vec<u8>, Vec<u8>),
    /// Remove key.
    Delete(Vec<u8>),
}

impl WriteOp {
    fn key(&self) -> &[u8] {
        match self {
            WriteOp::Put(k, _) | WriteOp::Delete(k) => k,
        }
    }
}

/// Result of a compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CasOutcome {
    /// Whether the condition held and the new value was written.
    pub succeeded: bool,
    /// The value before the operation (None = absent).
    pub previous: Option<Vec<u8>>,
}

/// The expiry a write leaves its key with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Expiry {
    /// None (the one the key had is removed).
    #[default]
    Never,
    /// This long after the leader takes the write (at least 1 ms).
    After(std::time::Duration),
    /// The one the key has (Redis' KEEPTTL).
    Keep,
}

impl Expiry {
    /// (`ttl_ms`, `keep_ttl`) on the wire.
    fn wire(self) -> Result<(u64, bool)> {
        match self {
            Expiry::Never => Ok((0, false)),
            Expiry::Keep => Ok((0, true)),
            Expiry::After(d) => {
                let ms = u64::try_from(d.as_millis()).map_err(|_| {
                    ClientError::InvalidArgument(format!("expiry {d:?} is out of range"))
                })?;
                if ms == 0 {
                    return Err(ClientError::InvalidArgument(
                        "an expiry after less than 1 ms".into(),
                    ));
                }
                Ok((ms, false))
            }
        }
    }
}

/// A change of a key's expiry ([`Client::expire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpireAt {
    /// This long after the leader takes it (zero: the key is deleted).
    After(std::time::Duration),
    /// At this time, ms since the Unix epoch, by the leader's clock (past: deleted).
    UnixMs(u64),
    /// No expiry any more (Redis' PERSIST).
    Never,
}

/// A key's expiry as [`Client::ttl`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyTtl {
    /// No such key (or it has expired).
    Absent,
    /// The key does not expire.
    Never,
    /// It expires at `at_ms` (ms since the Unix epoch), `left_ms` from the read by the
    /// serving leader's clock.
    At {
        /// When.
        at_ms: u64,
        /// How long from the read.
        left_ms: u64,
    },
}

/// What an increment did: the key's new value, or why the key stayed as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncrOutcome {
    /// The value the key holds now.
    Value(i64),
    /// The key holds something other than a decimal i64 (Redis' rules:
    /// `phoenix_proto::counter::parse_i64`).
    NotAnInteger,
    /// The sum is out of i64's range.
    Overflow,
}

impl IncrOutcome {
    /// The outcome of `phoenix_proto::counter::incremented`.
    pub fn of(r: std::result::Result<i64, pb::IncrFailure>) -> IncrOutcome {
        match r {
            Ok(n) => IncrOutcome::Value(n),
            Err(pb::IncrFailure::Overflow) => IncrOutcome::Overflow,
            // (`incremented` fails with the two others only.)
            Err(pb::IncrFailure::NotAnInteger | pb::IncrFailure::None) => IncrOutcome::NotAnInteger,
        }
    }
}

/// One page of a scan.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScanPage {
    /// Pairs in key order.
    pub pairs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Where to continue (None = the range is exhausted).
    pub next: Option<Vec<u8>>,
}

/// A node as the meta group sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// Node id.
    pub node_id: NodeId,
    /// gRPC address.
    pub addr: String,
    /// Whether it heartbeats.
    pub alive: bool,
    /// Milliseconds since its last heartbeat (None = never).
    pub last_heartbeat_ms_ago: Option<u64>,
    /// Replicas hosted.
    pub groups: u64,
    /// Replicas it leads.
    pub leaders: u64,
    /// Bytes of engine files.
    pub engine_bytes: u64,
    /// Bytes of the log store.
    pub log_bytes: u64,
    /// Free bytes on its data disk (None: not reported).
    pub disk_free_bytes: Option<u64>,
    /// Whether it refuses client writes because its disk is under its reserve.
    pub disk_full: bool,
    /// Whether its replicas are being moved off (`phoenix cluster drain`).
    pub draining: bool,
}

/// A replica of a group as last reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// Hosting node.
    pub node_id: NodeId,
    /// Whether it leads.
    pub is_leader: bool,
    /// Raft term.
    pub term: u64,
    /// Commit index.
    pub commit_index: u64,
    /// Applied index.
    pub applied_index: u64,
    /// First index still in its log.
    pub log_first_index: u64,
    /// Approximate bytes of the group's data.
    pub approximate_bytes: u64,
    /// Why the replica stopped on its node (empty: running).
    pub stopped: String,
    /// Whether the group is idle and asleep on that node (no ticks, no heartbeats).
    pub hibernating: bool,
}

/// A group: its route and its replicas' states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    /// Group id.
    pub group_id: u64,
    /// Key range start (inclusive).
    pub start: Vec<u8>,
    /// Key range end (exclusive; empty = unbounded).
    pub end: Vec<u8>,
    /// Route epoch.
    pub epoch: u64,
    /// Leader as last reported.
    pub leader: Option<NodeId>,
    /// Replica nodes (voters and learners).
    pub replicas: Vec<NodeId>,
    /// The replicas that are learners (catching up; they do not vote).
    pub learners: Vec<NodeId>,
    /// Per-replica state.
    pub replica_status: Vec<ReplicaStatus>,
}

/// The whole cluster as the meta group sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// Meta group leader (None = unknown).
    pub meta_leader: Option<NodeId>,
    /// Registered nodes.
    pub nodes: Vec<NodeStatus>,
    /// Data groups.
    pub groups: Vec<GroupStatus>,
    /// The meta group (group 0): its members as the meta leader applied them, and
    /// their reports (None from a meta leader that predates it).
    pub meta_group: Option<GroupStatus>,
    /// Changes the meta leader drives now, oldest first.
    pub operators: Vec<OperatorStatus>,
    /// Groups whose replicas computed different checksums at the same scrub point.
    pub scrub_mismatches: Vec<ScrubMismatch>,
}

/// A replica's checksum of its group's data at a scrub point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubReplica {
    /// Hosting node.
    pub node_id: NodeId,
    /// The scrub point's log index.
    pub index: u64,
    /// crc32c over the group's keys and values.
    pub crc: u32,
    /// Keys counted.
    pub keys: u64,
    /// Their key and value bytes.
    pub bytes: u64,
    /// The replica could not compute its checksum: why (it counts as a mismatch).
    pub error: Option<String>,
}

/// A group scrubbed: its replicas' checksums at one scrub point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubOutcome {
    /// The scrub point's log index.
    pub index: u64,
    /// The replicas that reported it, by node id.
    pub replicas: Vec<ScrubReplica>,
    /// Every voter reported it, all alike.
    pub consistent: bool,
}

/// Replicas of a group that disagree at a scrub point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubMismatch {
    /// Group id.
    pub group_id: u64,
    /// The scrub point's log index.
    pub index: u64,
    /// What each replica there computed.
    pub replicas: Vec<ScrubReplica>,
}

fn scrub_from_wire(r: &pb::ScrubReport) -> ScrubReplica {
    ScrubReplica {
        node_id: r.node_id,
        index: r.index,
        crc: r.crc,
        keys: r.keys,
        bytes: r.bytes,
        error: (!r.error.is_empty()).then(|| r.error.clone()),
    }
}

/// A change the meta leader drives (today: a leader transfer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorStatus {
    /// The group it changes.
    pub group_id: u64,
    /// What it does (`transfer-leader`, `add-replica`).
    pub kind: String,
    /// Who started it: `request` (a user) or `balance` (the leader balancer).
    pub origin: String,
    /// Node it moves from (0: none, an addition).
    pub from: NodeId,
    /// Node it moves to.
    pub to: NodeId,
    /// Milliseconds since it started.
    pub age_ms: u64,
    /// Where it is (add-replica: "add learner", "catch up", "promote", "update route").
    pub step: String,
}

/// How an operation may be retried after an unknown outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Reads: always.
    Read,
    /// Idempotent writes: if `retry_ambiguous_writes`.
    Idempotent,
    /// Compare-and-swap: never (reports Ambiguous).
    Never,
}

/// Counters of what the client did (for tests and diagnostics).
#[derive(Debug, Default)]
pub struct ClientStats {
    /// RPCs sent to data nodes.
    pub attempts: AtomicU64,
    /// Redirects followed at once (NotLeader with a hint).
    pub redirects: AtomicU64,
    /// Backoff sleeps.
    pub backoffs: AtomicU64,
    /// Route table refreshes from meta.
    pub route_refreshes: AtomicU64,
}

struct Inner {
    opts: ClientOptions,
    seeds: Vec<String>,
    table: RwLock<RouteTable>,
    table_gen: AtomicU64,
    refresh_lock: tokio::sync::Mutex<()>,
    channels: Mutex<HashMap<String, Conn>>,
    rng: Mutex<StdRng>,
    stats: ClientStats,
    session: Session,
}

/// This client's write session (see [`ClientOptions::sessions`]).
struct Session {
    /// Random, never 0; fresh for every client (not from the jitter seed).
    client_id: u64,
    /// The next sequence and the sequences of writes not yet answered, under ONE lock:
    /// a sequence is taken and registered at once, so no `acked_below` computed
    /// meanwhile can pass a write that is about to be sent.
    seqs: Mutex<(u64, std::collections::BTreeSet<u64>)>,
}

impl Session {
    fn begin(&self) -> u64 {
        let mut g = self.seqs.lock().unwrap_or_else(|e| e.into_inner());
        let seq = g.0;
        g.0 += 1;
        g.1.insert(seq);
        seq
    }

    fn end(&self, seq: u64) {
        self.seqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .remove(&seq);
    }

    /// Every write below this has its answer.
    fn acked_below(&self) -> u64 {
        let g = self.seqs.lock().unwrap_or_else(|e| e.into_inner());
        g.1.first().copied().unwrap_or(g.0)
    }
}

/// Ends a write's sequence when its call returns, whichever way.
struct SeqGuard<'a> {
    session: &'a Session,
    seq: u64,
}

impl Drop for SeqGuard<'_> {
    fn drop(&mut self) {
        self.session.end(self.seq);
    }
}

/// How long a route look-up waits for one node before asking the next one as well.
const HEDGE_AFTER: Duration = Duration::from_millis(200);

/// A PhoenixKV client: cheap to clone, safe to share between tasks.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("seeds", &self.inner.seeds)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these short critical sections leaves consistent
    // data (each is a single map/rng operation), so poisoning is ignored.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn route_from_wire(r: &pb::Route) -> Route {
    Route {
        group_id: r.group_id,
        start: r.start_key.to_vec(),
        end: r.end_key.to_vec(),
        epoch: r.epoch,
        replicas: r.replicas.iter().map(|x| x.node_id).collect(),
        leader: (r.leader_node_id != 0).then_some(r.leader_node_id),
    }
}

/// A connection to one node: the channel for unary calls and the batch stream over it.
#[derive(Clone)]
struct Conn {
    channel: AuthChannel,
    link: BatchLink,
    /// The node behind this address runs in this process.
    local: Option<Arc<dyn LocalNode>>,
    addr: Arc<str>,
}

type Req = pb::batch_request_item::Request;
type Resp = pb::batch_response_item::Response;

/// A group's backup under way ([`Client::backup_group`]): its head, then its files'
/// chunks, as the leader sends them.
pub struct BackupStream {
    addr: String,
    stream: tonic::Streaming<pb::BackupGroupChunk>,
}

impl std::fmt::Debug for BackupStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupStream")
            .field("addr", &self.addr)
            .finish()
    }
}

impl BackupStream {
    /// The node serving it.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The next message: a head or a file chunk (`None`: the stream ended). A failure of
    /// the leader, or a message out of the protocol, is an error.
    pub async fn next(&mut self) -> Result<Option<pb::BackupGroupChunk>> {
        let broken = |why: String| ClientError::Protocol {
            addr: self.addr.clone(),
            why,
        };
        match self.stream.message().await {
            Ok(Some(pb::BackupGroupChunk { error: Some(e), .. })) => Err(ClientError::Refused {
                op: "backup_group",
                addr: self.addr.clone(),
                error: Box::new(e),
            }),
            Ok(Some(c)) if c.head.is_some() != c.file.is_some() => Ok(Some(c)),
            Ok(Some(_)) => Err(broken(
                "a backup message with neither or both of head and file".into(),
            )),
            Ok(None) => Ok(None),
            Err(s) => Err(broken(format!("backup stream failed: {}", s.message()))),
        }
    }
}

/// A node answered a call with another method's response.
fn mismatched() -> tonic::Status {
    tonic::Status::internal("the node answered with another method's response")
}

/// Encoded size past which a single-key call goes unary.
const BATCH_ITEM_BYTES_MAX: usize = phoenix_proto::batch_link::ITEM_BYTES_MAX;

fn request_len(r: &Req) -> usize {
    use prost::Message as _;
    match r {
        Req::Get(r) => r.encoded_len(),
        Req::Put(r) => r.encoded_len(),
        Req::Delete(r) => r.encoded_len(),
        Req::Cas(r) => r.encoded_len(),
        Req::Incr(r) => r.encoded_len(),
        Req::Expire(r) => r.encoded_len(),
        Req::Ttl(r) => r.encoded_len(),
        Req::PutEx(r) => r.encoded_len(),
        Req::CasEx(r) => r.encoded_len(),
    }
}

/// Whether a transport failure happened before the request could reach the server
/// (connection refused / could not connect): then even a non-idempotent write is safe
/// to resend elsewhere.
fn never_sent(status: &tonic::Status) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = src {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
            ) {
                return true;
            }
        }
        src = e.source();
    }
    let msg = status.message();
    msg.contains("error trying to connect") || msg.contains("tcp connect error")
}

/// Why a node refused this client's credentials, if it did: its gate answered
/// `Unauthenticated` (no token, a wrong one, no certificate), or the TLS handshake
/// failed (a certificate one side does not trust). Nothing was served, and asking again
/// cannot help.
fn refused_credentials(status: &tonic::Status) -> Option<String> {
    if status.code() == tonic::Code::Unauthenticated {
        return Some(status.message().to_string());
    }
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = src {
        // (Itself, or inside an I/O error.)
        let tls = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(tls) = tls {
            return Some(format!("TLS handshake failed: {tls}"));
        }
        // A client certificate the node refuses shows after the handshake (TLS 1.3),
        // as the node's alert, in text. Only the alerts of a refused certificate count:
        // another alert may end a connection whose requests were served.
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            let text = io.to_string();
            if io.kind() == std::io::ErrorKind::InvalidData
                && text.contains("received fatal alert")
                && CERTIFICATE_ALERTS.iter().any(|a| text.ends_with(a))
            {
                return Some(format!("the node ended TLS: {text}"));
            }
        }
        src = e.source();
    }
    None
}

/// The TLS alerts a node sends when it refuses the client's certificate, as rustls
/// names them.
const CERTIFICATE_ALERTS: &[&str] = &[
    "BadCertificate",
    "UnsupportedCertificate",
    "CertificateRevoked",
    "CertificateExpired",
    "CertificateUnknown",
    "UnknownCA",
    "AccessDenied",
    "CertificateRequired",
    "HandshakeFailure",
];

/// Why a route refresh found no table.
#[derive(Debug)]
enum Refresh {
    /// No node gave it in time; the last failure.
    Failed(String),
    /// The deadline passed before any node answered, even with a failure.
    NoAnswer,
    /// A node refused this client's credentials.
    Refused {
        /// The node.
        addr: String,
        /// What it said.
        why: String,
    },
}

impl std::fmt::Display for Refresh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refresh::Failed(s) => f.write_str(s),
            Refresh::NoAnswer => f.write_str("no node answered before the deadline"),
            Refresh::Refused { addr, why } => write!(f, "{addr} refused the credentials: {why}"),
        }
    }
}

impl Refresh {
    /// The error a call returns for it, if it ends the call.
    fn fatal(self) -> std::result::Result<String, ClientError> {
        match self {
            Refresh::Failed(s) => Ok(s),
            Refresh::NoAnswer => Ok(Refresh::NoAnswer.to_string()),
            Refresh::Refused { addr, why } => Err(ClientError::Unauthenticated { addr, why }),
        }
    }
}

/// Smallest key greater than every key starting with `prefix` (empty = unbounded).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    Vec::new()
}

impl Client {
    /// A client over the nodes at `endpoints` (`host:port`), which fetches the routing
    /// table now and fails if no node can give it within the timeout.
    pub async fn connect(endpoints: Vec<String>, opts: ClientOptions) -> Result<Client> {
        let client = Client::new_lazy(endpoints, opts)?;
        let deadline = Instant::now() + client.timeout;
        // Every node may refuse for a moment (the meta group electing a leader): ask
        // again until the deadline, as any request would.
        let mut attempts = 0u32;
        let mut backoffs = 0u32;
        // The last failure a node answered with: a last attempt cut short by the
        // deadline says less.
        let mut last: Option<String> = None;
        loop {
            attempts += 1;
            match client.refresh_routes(deadline).await {
                Ok(()) => return Ok(client),
                Err(Refresh::Failed(why)) => last = Some(why),
                Err(Refresh::NoAnswer) => {}
                Err(refused) => refused.fatal().map(drop)?,
            }
            if Instant::now() >= deadline {
                return Err(ClientError::DeadlineExceeded {
                    op: "connect",
                    timeout: client.timeout,
                    attempts,
                    last: last.unwrap_or_else(|| Refresh::NoAnswer.to_string()),
                });
            }
            client.backoff(&mut backoffs, deadline).await;
        }
    }

    /// A client that contacts the cluster only on its first call.
    pub fn new_lazy(endpoints: Vec<String>, opts: ClientOptions) -> Result<Client> {
        let mut seeds = Vec::new();
        for e in endpoints {
            let e = e.trim().trim_start_matches("http://").to_string();
            if e.is_empty() {
                continue;
            }
            if !e.contains(':') {
                return Err(ClientError::BadEndpoint {
                    endpoint: e,
                    why: "expected host:port".into(),
                });
            }
            if !seeds.contains(&e) {
                seeds.push(e);
            }
        }
        if seeds.is_empty() {
            return Err(ClientError::InvalidArgument("no endpoint given".into()));
        }
        let rng = if opts.seed == 0 {
            StdRng::from_entropy()
        } else {
            StdRng::seed_from_u64(opts.seed)
        };
        let timeout = opts.timeout;
        let client = Client {
            inner: Arc::new(Inner {
                opts,
                seeds: seeds.clone(),
                table: RwLock::new(RouteTable::new()),
                table_gen: AtomicU64::new(0),
                refresh_lock: tokio::sync::Mutex::new(()),
                channels: Mutex::new(HashMap::new()),
                rng: Mutex::new(rng),
                stats: ClientStats::default(),
                session: Session {
                    client_id: rand::random::<u64>().max(1),
                    seqs: Mutex::new((1, std::collections::BTreeSet::new())),
                },
            }),
            timeout,
        };
        // Validate every endpoint up front so a typo fails now, not at the first call.
        for s in &seeds {
            client.channel(s)?;
        }
        Ok(client)
    }

    /// The same client with another per-call deadline.
    pub fn with_timeout(&self, timeout: Duration) -> Client {
        Client {
            inner: self.inner.clone(),
            timeout,
        }
    }

    /// What the client did so far.
    pub fn stats(&self) -> &ClientStats {
        &self.inner.stats
    }

    /// A copy of the cached routes.
    pub fn cached_routes(&self) -> Vec<Route> {
        self.read_table().routes().cloned().collect()
    }

    fn read_table(&self) -> std::sync::RwLockReadGuard<'_, RouteTable> {
        self.inner
            .table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write_table(&self) -> std::sync::RwLockWriteGuard<'_, RouteTable> {
        self.inner
            .table
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn channel(&self, addr: &str) -> Result<AuthChannel> {
        Ok(self.conn(addr)?.channel)
    }

    /// The connection to the node at `addr` (made lazily, kept for the client's life).
    fn conn(&self, addr: &str) -> Result<Conn> {
        let mut map = lock(&self.inner.channels);
        if let Some(c) = map.get(addr) {
            return Ok(c.clone());
        }
        let bad = |why: String| ClientError::BadEndpoint {
            endpoint: addr.to_string(),
            why,
        };
        let creds = &self.inner.opts.credentials;
        let endpoint = creds
            .endpoint(addr)
            .map_err(bad)?
            .connect_timeout(self.inner.opts.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        let channel = creds.authorize(endpoint.connect_lazy());
        let local = self
            .inner
            .opts
            .local_node
            .as_ref()
            .filter(|l| l.addr() == addr)
            .cloned();
        let conn = Conn {
            link: BatchLink::new(channel.clone()),
            channel,
            local,
            addr: addr.into(),
        };
        map.insert(addr.to_string(), conn.clone());
        Ok(conn)
    }

    /// Runs a single-key call in this process when the node is [local](LocalNode), on
    /// the node's batch stream when allowed (small enough, the option on, the node
    /// serving it), else as the unary call.
    async fn single(&self, conn: Conn, request: Req) -> std::result::Result<Resp, tonic::Status> {
        if let Some(local) = conn.local.as_ref().filter(|l| l.ready()) {
            return Ok(local.call(request).await);
        }
        let small = request_len(&request) <= BATCH_ITEM_BYTES_MAX;
        if self.inner.opts.batch_stream && small && conn.link.supported() {
            match conn.link.call(request.clone()).await {
                Ok(pb::BatchResponseItem {
                    error: None,
                    response: Some(r),
                    ..
                }) => return Ok(r),
                // Not served: a node that predates the stream (`Unimplemented`) or the
                // item's kind (InvalidArgument and no response). The unary call is next.
                Err(s) if s.code() == tonic::Code::Unimplemented => {}
                Ok(pb::BatchResponseItem {
                    error:
                        Some(pb::Error {
                            kind: Some(Kind::InvalidArgument(why)),
                            ..
                        }),
                    response: None,
                    ..
                }) => {
                    tracing::debug!(?why, "batch item not served; going unary");
                }
                // Anything else may have been served: its outcome is unknown.
                Ok(item) => {
                    tracing::debug!(?item, "malformed batch answer");
                    return Err(tonic::Status::unknown(
                        "malformed batch answer from the node",
                    ));
                }
                Err(s) => return Err(s),
            }
        }
        let mut kv = self.kv(conn.channel);
        Ok(match request {
            Req::Get(r) => Resp::Get(kv.get(r).await?.into_inner()),
            Req::Put(r) => Resp::Put(kv.put(r).await?.into_inner()),
            Req::Delete(r) => Resp::Delete(kv.delete(r).await?.into_inner()),
            Req::Cas(r) => Resp::Cas(kv.cas(r).await?.into_inner()),
            Req::Incr(r) => Resp::Incr(kv.incr(r).await?.into_inner()),
            Req::Expire(r) => Resp::Expire(kv.expire(r).await?.into_inner()),
            Req::Ttl(r) => Resp::Ttl(kv.ttl(r).await?.into_inner()),
            Req::PutEx(r) => Resp::PutEx(kv.put_ex(r).await?.into_inner()),
            Req::CasEx(r) => Resp::CasEx(kv.cas_ex(r).await?.into_inner()),
        })
    }

    fn kv(&self, channel: AuthChannel) -> KvClient<AuthChannel> {
        KvClient::new(channel)
            .max_decoding_message_size(limits::MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::MESSAGE_BYTES_MAX)
    }

    fn meta(&self, channel: AuthChannel) -> MetaClient<AuthChannel> {
        MetaClient::new(channel)
            .max_decoding_message_size(limits::MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::MESSAGE_BYTES_MAX)
    }

    /// Addresses to ask meta questions: known nodes (in a random rotation) then seeds.
    fn meta_candidates(&self) -> Vec<String> {
        let mut addrs: Vec<String> = self
            .read_table()
            .node_addrs()
            .map(|(_, a)| a.clone())
            .collect();
        addrs.sort();
        if !addrs.is_empty() {
            let r = rand::Rng::gen_range(&mut *lock(&self.inner.rng), 0..addrs.len());
            addrs.rotate_left(r);
        }
        for s in &self.inner.seeds {
            if !addrs.contains(s) {
                addrs.push(s.clone());
            }
        }
        addrs
    }

    /// Reloads the routing table from the first node that answers. Concurrent callers
    /// share one refresh. Errs with the last failure if no node answered in time.
    async fn refresh_routes(&self, deadline: Instant) -> std::result::Result<(), Refresh> {
        let gen_before = self.inner.table_gen.load(Ordering::Acquire);
        let _guard = match tokio::time::timeout_at(deadline, self.inner.refresh_lock.lock()).await {
            Ok(g) => g,
            Err(_) => {
                return Err(Refresh::Failed(
                    "timed out waiting for a route refresh".into(),
                ))
            }
        };
        if self.inner.table_gen.load(Ordering::Acquire) != gen_before {
            return Ok(()); // another task refreshed while we waited
        }
        self.inner
            .stats
            .route_refreshes
            .fetch_add(1, Ordering::Relaxed);
        // Hedged: the next node is asked too if the first has not answered within
        // HEDGE_AFTER (a paused node holds its connection open and says nothing), and
        // at once when one fails; the first table wins.
        let mut candidates = self.meta_candidates().into_iter();
        let mut asking = tokio::task::JoinSet::new();
        let mut last: Option<String> = None;
        loop {
            if asking.is_empty() {
                match candidates.next() {
                    Some(addr) => self.ask_routes(&mut asking, addr, deadline),
                    None => return Err(last.map_or(Refresh::NoAnswer, Refresh::Failed)),
                }
            }
            let more = candidates.len() > 0;
            tokio::select! {
                joined = asking.join_next() => match joined {
                    Some(Ok(Ok(routes))) => {
                        self.install_routes(&routes);
                        return Ok(());
                    }
                    Some(Ok(Err(Refresh::Failed(e)))) => last = Some(e),
                    Some(Ok(Err(Refresh::NoAnswer))) => {}
                    Some(Ok(Err(refused))) => return Err(refused),
                    Some(Err(e)) => last = Some(format!("route look-up task: {e}")),
                    None => {}
                },
                () = tokio::time::sleep(HEDGE_AFTER), if more => {
                    if let Some(addr) = candidates.next() {
                        self.ask_routes(&mut asking, addr, deadline);
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(match last {
                        Some(last) => Refresh::Failed(format!(
                            "no node gave the routes in time (last: {last})"
                        )),
                        None => Refresh::NoAnswer,
                    });
                }
            }
        }
    }

    /// Starts asking `addr` for the routing table (one attempt, bounded by the attempt
    /// timeout).
    fn ask_routes(
        &self,
        asking: &mut tokio::task::JoinSet<std::result::Result<Vec<pb::Route>, Refresh>>,
        addr: String,
        deadline: Instant,
    ) {
        let client = self.clone();
        asking.spawn(async move {
            let per_try = deadline
                .saturating_duration_since(Instant::now())
                .min(client.inner.opts.attempt_timeout);
            let channel = client
                .channel(&addr)
                .map_err(|e| Refresh::Failed(e.to_string()))?;
            let req = pb::GetRoutesRequest {
                timeout_ms: per_try.as_millis().max(1) as u64,
            };
            let mut meta = client.meta(channel);
            match tokio::time::timeout(per_try, meta.get_routes(req)).await {
                Err(_) => Err(Refresh::Failed(format!("{addr}: GetRoutes timed out"))),
                Ok(Err(status)) => Err(match refused_credentials(&status) {
                    Some(why) => Refresh::Refused { addr, why },
                    None => Refresh::Failed(format!("{addr}: {}", status.message())),
                }),
                Ok(Ok(resp)) => {
                    let resp = resp.into_inner();
                    if let Some(err) = resp.error {
                        return Err(Refresh::Failed(format!("{addr}: {err}")));
                    }
                    if resp.routes.is_empty() {
                        return Err(Refresh::Failed(format!(
                            "{addr}: the cluster has no routes yet (bootstrapping?)"
                        )));
                    }
                    Ok(resp.routes)
                }
            }
        });
    }

    fn install_routes(&self, wire: &[pb::Route]) {
        let mut table = self.write_table();
        let mut nodes: HashMap<NodeId, String> =
            table.node_addrs().map(|(k, v)| (*k, v.clone())).collect();
        for r in wire {
            for rep in &r.replicas {
                if rep.node_id != 0 && !rep.addr.is_empty() {
                    nodes.insert(rep.node_id, rep.addr.clone());
                }
            }
            if r.leader_node_id != 0 && !r.leader_addr.is_empty() {
                nodes.insert(r.leader_node_id, r.leader_addr.clone());
            }
        }
        table.replace_all(wire.iter().map(route_from_wire).collect(), nodes);
        self.inner.table_gen.fetch_add(1, Ordering::AcqRel);
    }

    fn take_route(&self, r: &pb::Route) {
        let mut table = self.write_table();
        for rep in &r.replicas {
            if rep.node_id != 0 && !rep.addr.is_empty() {
                table.set_node(rep.node_id, rep.addr.clone());
            }
        }
        table.update(route_from_wire(r));
    }

    async fn backoff(&self, n: &mut u32, deadline: Instant) {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let delay = {
            let mut rng = lock(&self.inner.rng);
            self.inner.opts.backoff.delay(*n, remaining, &mut *rng)
        };
        *n = n.saturating_add(1);
        if let Some(d) = delay {
            self.inner.stats.backoffs.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(d).await;
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.is_empty() {
            return Err(ClientError::InvalidArgument("empty key".into()));
        }
        if key.len() > self.inner.opts.key_bytes_max {
            return Err(ClientError::KeyTooLarge {
                size: key.len(),
                limit: self.inner.opts.key_bytes_max,
            });
        }
        Ok(())
    }

    fn check_value(&self, value: &[u8]) -> Result<()> {
        if value.len() > self.inner.opts.value_bytes_max {
            return Err(ClientError::ValueTooLarge {
                size: value.len(),
                limit: self.inner.opts.value_bytes_max,
            });
        }
        Ok(())
    }

    /// Runs one group-scoped RPC with routing and retries. `call` gets a channel to the
    /// chosen node and the request header and returns the response's typed error (if
    /// any) with the payload. `route_key` picks the group; `same_group` (for batches)
    /// re-checks after a route change that all keys still belong to one group.
    async fn execute<T, F, Fut>(
        &self,
        op: &'static str,
        retry: Retry,
        route_key: &[u8],
        same_group: &[&[u8]],
        deadline: Instant,
        mut call: F,
    ) -> Result<T>
    where
        F: FnMut(Conn, RequestHeader) -> Fut,
        Fut: Future<Output = std::result::Result<(Option<pb::Error>, T), tonic::Status>>,
    {
        let mut attempts = 0u32;
        let mut backoffs = 0u32;
        let mut rotate = 0usize;
        let mut redirects_in_row = 0u32;
        let mut last = String::from("no attempt made");
        let sessions = self.inner.opts.sessions && retry != Retry::Read;
        let retry_ambiguous = match retry {
            Retry::Read => true,
            _ if sessions => true,
            Retry::Idempotent => self.inner.opts.retry_ambiguous_writes,
            Retry::Never => false,
        };
        // One sequence number for the write, kept by every resend of it.
        let session = &self.inner.session;
        let seq_guard = sessions.then(|| SeqGuard {
            session,
            seq: session.begin(),
        });
        // Set once an attempt of a write may have been applied: whatever ends the call
        // after that, the caller must hear "ambiguous", not a definite failure.
        let mut maybe_applied = false;
        // When the first DiskFull refusal of this call came, and the last answer if it
        // was one (at the deadline the typed refusal is returned, not a timeout).
        let mut disk_full_since: Option<Instant> = None;
        let mut last_disk_full: Option<(String, pb::Error)> = None;
        // Replicas whose attempt timed out in this call, and when.
        let mut silent: HashMap<NodeId, Instant> = HashMap::new();
        let attempt_timeout = self.inner.opts.attempt_timeout;
        let is_silent = |silent: &HashMap<NodeId, Instant>, n: NodeId| {
            silent
                .get(&n)
                .is_some_and(|t| t.elapsed() < attempt_timeout)
        };
        let result: Result<T> = async {
        loop {
            let now = Instant::now();
            if now >= deadline {
                if let Some((addr, error)) = last_disk_full.take() {
                    return Err(ClientError::Refused {
                        op,
                        addr,
                        error: Box::new(error),
                    });
                }
                return Err(ClientError::DeadlineExceeded {
                    op,
                    timeout: self.timeout,
                    attempts,
                    last,
                });
            }
            let remaining = deadline - now;
            let route = self.read_table().locate(route_key).cloned();
            let route = match route {
                Some(r) => r,
                None => {
                    if let Err(e) = self.refresh_routes(deadline).await {
                        last = format!("no route for the key: {}", e.fatal()?);
                        self.backoff(&mut backoffs, deadline).await;
                        continue;
                    }
                    let found = self.read_table().locate(route_key).cloned();
                    match found {
                        Some(r) => r,
                        None => {
                            last = "no route covers the key".into();
                            self.backoff(&mut backoffs, deadline).await;
                            continue;
                        }
                    }
                }
            };
            if !same_group.is_empty() {
                let table = self.read_table();
                let mut groups: Vec<u64> = same_group
                    .iter()
                    .filter_map(|k| table.locate(k).map(|r| r.group_id))
                    .collect();
                groups.sort_unstable();
                groups.dedup();
                if groups.len() > 1 {
                    return Err(ClientError::CrossGroup { groups });
                }
            }
            let candidates = RouteTable::candidates(&route, rotate);
            // A replica that just let an attempt time out is tried last.
            let first = candidates
                .iter()
                .copied()
                .find(|n| !is_silent(&silent, *n))
                .or_else(|| candidates.first().copied());
            let Some(node) = first else {
                last = format!(
                    "group {} has no replicas in the cached route",
                    route.group_id
                );
                let _ = self.refresh_routes(deadline).await;
                self.backoff(&mut backoffs, deadline).await;
                continue;
            };
            let addr = self.read_table().node_addr(node).map(str::to_string);
            let Some(addr) = addr else {
                last = format!("address of node {node} unknown");
                let _ = self.refresh_routes(deadline).await;
                rotate += 1;
                self.write_table().set_leader(route.group_id, None);
                self.backoff(&mut backoffs, deadline).await;
                continue;
            };
            let conn = self.conn(&addr)?;
            attempts += 1;
            self.inner.stats.attempts.fetch_add(1, Ordering::Relaxed);
            // An attempt that may be repeated gets a bounded share of the deadline; one
            // that may not (a write outside a session) keeps all of it.
            let budget = if retry_ambiguous {
                remaining.min(self.inner.opts.attempt_timeout)
            } else {
                remaining
            };
            let header = RequestHeader {
                group_id: route.group_id,
                epoch: route.epoch,
                timeout_ms: (budget.as_millis() as u64).clamp(1, limits::TIMEOUT_MS_MAX),
                client_id: seq_guard.as_ref().map_or(0, |_| session.client_id),
                seq: seq_guard.as_ref().map_or(0, |g| g.seq),
                acked_below: seq_guard.as_ref().map_or(0, |_| session.acked_below()),
                // This client follows redirects and remembers the leader: a follower
                // that forwarded would make it take the follower for the leader.
                forwarded_by: 0,
                no_forward: true,
            };
            let answer = tokio::time::timeout(budget, call(conn, header)).await;
            let group = route.group_id;
            last_disk_full = None;
            match answer {
                Err(_) if retry_ambiguous && Instant::now() < deadline => {
                    // Silent within the attempt's budget (paused, cut off, overloaded):
                    // resend elsewhere (only reads and session writes get here) and
                    // learn the leader anew.
                    last = format!("node {node} at {addr} did not answer within {budget:?}");
                    tracing::debug!(op, group, node, %addr, "attempt timed out");
                    maybe_applied = true;
                    silent.insert(node, Instant::now());
                    {
                        let mut t = self.write_table();
                        if t.by_group(group).and_then(|r| r.leader) == Some(node) {
                            t.set_leader(group, None);
                        }
                    }
                    rotate += 1;
                    redirects_in_row = 0;
                }
                Err(_) => {
                    // The deadline often falls inside an attempt; keep what the
                    // cluster said before it, which is usually the real cause.
                    last = if attempts <= 1 {
                        format!("node {node} at {addr} did not answer before the deadline")
                    } else {
                        format!(
                            "node {node} at {addr} did not answer before the deadline \
                             (before that: {last})"
                        )
                    };
                    maybe_applied = true;
                    if !retry_ambiguous && retry != Retry::Read {
                        return Err(ClientError::Ambiguous { op, why: last });
                    }
                }
                Ok(Err(status)) => {
                    if let Some(why) = refused_credentials(&status) {
                        // Refused before anything was served: nothing was applied.
                        return Err(ClientError::Unauthenticated { addr, why });
                    }
                    if matches!(op, "incr" | "expire" | "ttl" | "put_ex" | "cas_ex")
                        && status.code() == tonic::Code::Unimplemented
                    {
                        // A node whose binary predates the method: nothing was served.
                        // (Other methods are as old as the service: an `Unimplemented`
                        // there comes from something else on the way, as a transport
                        // failure.)
                        return Err(ClientError::Unsupported {
                            op,
                            addr,
                            why: status.message().to_string(),
                        });
                    }
                    last = format!("node {node} at {addr}: {}", status.message());
                    tracing::debug!(op, group, node, %addr, %status, "transport failure");
                    if !never_sent(&status) {
                        maybe_applied = true;
                        if !retry_ambiguous {
                            return Err(ClientError::Ambiguous { op, why: last });
                        }
                    }
                    // The node may be down: try another replica, and learn the leader anew.
                    {
                        let mut t = self.write_table();
                        if t.by_group(group).and_then(|r| r.leader) == Some(node) {
                            t.set_leader(group, None);
                        }
                    }
                    rotate += 1;
                    redirects_in_row = 0;
                    self.backoff(&mut backoffs, deadline).await;
                }
                Ok(Ok((None, value))) => {
                    let mut t = self.write_table();
                    if t.by_group(group).and_then(|r| r.leader) != Some(node) {
                        t.set_leader(group, Some(node));
                    }
                    return Ok(value);
                }
                Ok(Ok((Some(err), _))) => {
                    last = format!("node {node} at {addr}: {err}");
                    tracing::debug!(op, group, node, %addr, error = %err, "request refused; retrying if allowed");
                    match &err.kind {
                        Some(Kind::NotLeader(nl)) => {
                            match nl.leader.as_ref().filter(|l| l.node_id != 0) {
                                // Until an election moves on, the other replicas keep naming
                                // a leader that is paused or cut off: going back to it would
                                // cost another attempt timeout.
                                Some(hint)
                                    if hint.node_id != node
                                        && !is_silent(&silent, hint.node_id) =>
                                {
                                    {
                                        let mut t = self.write_table();
                                        if !hint.addr.is_empty() {
                                            t.set_node(hint.node_id, hint.addr.clone());
                                        }
                                        t.set_leader(group, Some(hint.node_id));
                                    }
                                    self.inner.stats.redirects.fetch_add(1, Ordering::Relaxed);
                                    redirects_in_row += 1;
                                    // Follow a hint at once, but not forever: replicas that
                                    // disagree about the leader (an election in progress) get
                                    // backoff after a few hops.
                                    if redirects_in_row > 2 {
                                        self.backoff(&mut backoffs, deadline).await;
                                    }
                                }
                                _ => {
                                    self.write_table().set_leader(group, None);
                                    rotate += 1;
                                    redirects_in_row = 0;
                                    self.backoff(&mut backoffs, deadline).await;
                                }
                            }
                        }
                        Some(Kind::StaleEpoch(se)) => match se.current.as_ref() {
                            Some(cur) if cur.epoch > route.epoch => {
                                self.take_route(cur);
                                // The groups split off it: where the rest of its old
                                // range went.
                                for r in &se.related {
                                    self.take_route(r);
                                }
                            }
                            _ => {
                                let _ = self.refresh_routes(deadline).await;
                                self.backoff(&mut backoffs, deadline).await;
                            }
                        },
                        Some(Kind::KeyNotInGroup(k)) => {
                            if let Some(cur) = k.current.as_ref() {
                                self.take_route(cur);
                            }
                            let _ = self.refresh_routes(deadline).await;
                            self.backoff(&mut backoffs, deadline).await;
                        }
                        Some(Kind::GroupUnavailable(_)) => {
                            // No leader there (election, or the replica is not created yet).
                            self.write_table().set_leader(group, None);
                            rotate += 1;
                            redirects_in_row = 0;
                            if backoffs % 4 == 3 {
                                let _ = self.refresh_routes(deadline).await;
                            }
                            self.backoff(&mut backoffs, deadline).await;
                        }
                        Some(Kind::ServerBusy(_)) => self.backoff(&mut backoffs, deadline).await,
                        Some(Kind::DiskFull(_)) => {
                            // This attempt was not proposed (an earlier one that went
                            // unanswered may have been: `maybe_applied` says so). A
                            // full leader hands its group to a node with room within
                            // about a second; past that the cluster is out of space,
                            // and waiting out the deadline would only hide it.
                            let since = *disk_full_since.get_or_insert_with(Instant::now);
                            if since.elapsed() >= DISK_FULL_PATIENCE {
                                return Err(ClientError::Refused {
                                    op,
                                    addr,
                                    error: Box::new(err),
                                });
                            }
                            last_disk_full = Some((addr, err));
                            self.backoff(&mut backoffs, deadline).await;
                        }
                        Some(Kind::DeadlineExceeded(_) | Kind::OutcomeUnknown(_)) => {
                            maybe_applied = true;
                            if !retry_ambiguous {
                                return Err(ClientError::Ambiguous { op, why: last });
                            }
                            self.backoff(&mut backoffs, deadline).await;
                        }
                        Some(Kind::Unsupported(_)) => {
                            // Refused before proposing: nothing was applied by this one.
                            return Err(ClientError::Unsupported {
                                op,
                                addr,
                                why: err.message,
                            });
                        }
                        Some(Kind::SessionExpired(_)) => {
                            // The group forgot this write's result: it may have applied.
                            return Err(ClientError::Ambiguous { op, why: last });
                        }
                        Some(Kind::KeyTooLarge(k)) => {
                            return Err(ClientError::KeyTooLarge {
                                size: k.size as usize,
                                limit: k.limit as usize,
                            })
                        }
                        Some(Kind::ValueTooLarge(v)) => {
                            return Err(ClientError::ValueTooLarge {
                                size: v.size as usize,
                                limit: v.limit as usize,
                            })
                        }
                        _ => {
                            return Err(ClientError::Refused {
                                op,
                                addr,
                                error: Box::new(err),
                            })
                        }
                    }
                }
            }
        }
        }
        .await;
        match result {
            Err(e)
                if maybe_applied
                    && retry != Retry::Read
                    && !matches!(e, ClientError::Ambiguous { .. }) =>
            {
                Err(ClientError::Ambiguous {
                    op,
                    why: format!("{e} (after an attempt whose outcome is unknown)"),
                })
            }
            r => r,
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Reads `key` (linearizable). None = absent.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_key(key)?;
        let k = Bytes::copy_from_slice(key);
        self.execute(
            "get",
            Retry::Read,
            key,
            &[],
            self.deadline(),
            |conn, header| {
                let req = pb::GetRequest {
                    header: Some(header),
                    key: k.clone(),
                };
                async move {
                    let Resp::Get(r) = self.single(conn, Req::Get(req)).await? else {
                        return Err(mismatched());
                    };
                    Ok((r.error, r.found.then(|| r.value.to_vec())))
                }
            },
        )
        .await
    }

    /// Sets `key` to `value` (with no expiry).
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_with(key, value, Expiry::Never).await
    }

    /// Sets `key` to `value` with the expiry `expiry`. One other than
    /// [`Expiry::Never`] is [`ClientError::Unsupported`] while a node of the cluster runs a
    /// binary that predates key expiry; nothing was applied then.
    pub async fn put_with(&self, key: &[u8], value: &[u8], expiry: Expiry) -> Result<()> {
        self.check_key(key)?;
        self.check_value(value)?;
        let (ttl_ms, keep_ttl) = expiry.wire()?;
        // With an expiry: under a name an older server refuses (it would drop the fields).
        let ex = expiry != Expiry::Never;
        let k = Bytes::copy_from_slice(key);
        let v = Bytes::copy_from_slice(value);
        self.execute(
            if ex { "put_ex" } else { "put" },
            Retry::Idempotent,
            key,
            &[],
            self.deadline(),
            |conn, header| {
                let req = pb::PutRequest {
                    header: Some(header),
                    key: k.clone(),
                    value: v.clone(),
                    ttl_ms,
                    keep_ttl,
                };
                async move {
                    let r = if ex {
                        let Resp::PutEx(r) = self.single(conn, Req::PutEx(req)).await? else {
                            return Err(mismatched());
                        };
                        r
                    } else {
                        let Resp::Put(r) = self.single(conn, Req::Put(req)).await? else {
                            return Err(mismatched());
                        };
                        r
                    };
                    Ok((r.error, ()))
                }
            },
        )
        .await
    }

    /// Removes `key` (no error if absent).
    pub async fn delete(&self, key: &[u8]) -> Result<()> {
        self.check_key(key)?;
        let k = Bytes::copy_from_slice(key);
        self.execute(
            "delete",
            Retry::Idempotent,
            key,
            &[],
            self.deadline(),
            |conn, header| {
                let req = pb::DeleteRequest {
                    header: Some(header),
                    key: k.clone(),
                };
                async move {
                    let Resp::Delete(r) = self.single(conn, Req::Delete(req)).await? else {
                        return Err(mismatched());
                    };
                    Ok((r.error, ()))
                }
            },
        )
        .await
    }

    /// Compare-and-swap on one key: if the key holds `expected` (None = absent), set it
    /// to `new` (None = delete). Never retried once its outcome is unknown.
    pub async fn cas(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<CasOutcome> {
        self.cas_with(key, expected, new, Expiry::Never).await
    }

    /// [`Client::cas`] whose write leaves the key with `expiry` (as
    /// [`Client::put_with`]; ignored for a delete).
    pub async fn cas_with(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
        expiry: Expiry,
    ) -> Result<CasOutcome> {
        self.check_key(key)?;
        let (ttl_ms, keep_ttl) = if new.is_some() {
            expiry.wire()?
        } else {
            (0, false)
        };
        if let Some(v) = expected {
            self.check_value(v)?;
        }
        if let Some(v) = new {
            self.check_value(v)?;
        }
        let ex = (ttl_ms, keep_ttl) != (0, false);
        let k = Bytes::copy_from_slice(key);
        let exp = expected.map(Bytes::copy_from_slice);
        let nv = new.map(Bytes::copy_from_slice);
        self.execute(
            if ex { "cas_ex" } else { "cas" },
            Retry::Never,
            key,
            &[],
            self.deadline(),
            |conn, header| {
                let req = pb::CasRequest {
                    header: Some(header),
                    key: k.clone(),
                    expect_exists: exp.is_some(),
                    expected: exp.clone().unwrap_or_default(),
                    delete: nv.is_none(),
                    new_value: nv.clone().unwrap_or_default(),
                    ttl_ms,
                    keep_ttl,
                };
                async move {
                    let r = if ex {
                        let Resp::CasEx(r) = self.single(conn, Req::CasEx(req)).await? else {
                            return Err(mismatched());
                        };
                        r
                    } else {
                        let Resp::Cas(r) = self.single(conn, Req::Cas(req)).await? else {
                            return Err(mismatched());
                        };
                        r
                    };
                    let out = CasOutcome {
                        succeeded: r.succeeded,
                        previous: r.current_found.then(|| r.current_value.to_vec()),
                    };
                    Ok((r.error, out))
                }
            },
        )
        .await
    }

    /// Adds `by` to the decimal i64 `key` holds (absent: 0) as one replicated command
    /// (Redis' INCRBY), at most once however often it is resent (client sessions).
    /// [`ClientError::Unsupported`] while a node of the cluster runs a binary that
    /// predates it; nothing was applied then.
    pub async fn incr(&self, key: &[u8], by: i64) -> Result<IncrOutcome> {
        self.check_key(key)?;
        let k = Bytes::copy_from_slice(key);
        self.execute(
            "incr",
            Retry::Never,
            key,
            &[],
            self.deadline(),
            |conn, header| {
                let req = pb::IncrRequest {
                    header: Some(header),
                    key: k.clone(),
                    by,
                };
                async move {
                    let Resp::Incr(r) = self.single(conn, Req::Incr(req)).await? else {
                        return Err(mismatched());
                    };
                    let out = match pb::IncrFailure::try_from(r.failure) {
                        Ok(pb::IncrFailure::None) => IncrOutcome::Value(r.value),
                        Ok(pb::IncrFailure::NotAnInteger) => IncrOutcome::NotAnInteger,
                        Ok(pb::IncrFailure::Overflow) => IncrOutcome::Overflow,
                        Err(_) => {
                            return Err(tonic::Status::internal(format!(
                                "unknown increment failure {}",
                                r.failure
                            )))
                        }
                    };
                    Ok((r.error, out))
                }
            },
        )
        .await
    }

    /// Sets, changes or removes `key`'s expiry if `condition` holds (Redis' EXPIRE,
    /// PEXPIREAT, PERSIST with NX/XX/GT/LT). Returns whether it changed the key: false if
    /// the key is absent, the condition did not hold or (removing) it had none. An expiry
    /// already past deletes the key. [`ClientError::Unsupported`] while a node of the
    /// cluster runs a binary that predates key expiry. Resent after an unknown outcome
    /// only with the client's session (it is answered with its first result).
    pub async fn expire(
        &self,
        key: &[u8],
        at: ExpireAt,
        condition: pb::ExpireCondition,
    ) -> Result<bool> {
        use pb::expire_request::When;
        self.check_key(key)?;
        let when = match at {
            ExpireAt::After(d) => When::TtlMs(u64::try_from(d.as_millis()).map_err(|_| {
                ClientError::InvalidArgument(format!("expiry {d:?} is out of range"))
            })?),
            ExpireAt::UnixMs(ms) => When::AtMs(ms),
            ExpireAt::Never => When::Persist(true),
        };
        let k = Bytes::copy_from_slice(key);
        self.execute(
            "expire",
            Retry::Never,
            key,
            &[],
            self.deadline(),
            |conn, header| {
                let req = pb::ExpireRequest {
                    header: Some(header),
                    key: k.clone(),
                    when: Some(when),
                    condition: condition as i32,
                };
                async move {
                    let Resp::Expire(r) = self.single(conn, Req::Expire(req)).await? else {
                        return Err(mismatched());
                    };
                    Ok((r.error, r.changed))
                }
            },
        )
        .await
    }

    /// `key`'s expiry (Redis' PTTL and PEXPIRETIME).
    pub async fn ttl(&self, key: &[u8]) -> Result<KeyTtl> {
        self.check_key(key)?;
        let k = Bytes::copy_from_slice(key);
        self.execute(
            "ttl",
            Retry::Read,
            key,
            &[],
            self.deadline(),
            |conn, header| {
                let req = pb::TtlRequest {
                    header: Some(header),
                    key: k.clone(),
                };
                async move {
                    let Resp::Ttl(r) = self.single(conn, Req::Ttl(req)).await? else {
                        return Err(mismatched());
                    };
                    let out = match (r.found, r.expire_at_ms) {
                        (false, _) => KeyTtl::Absent,
                        (true, 0) => KeyTtl::Never,
                        (true, at_ms) => KeyTtl::At {
                            at_ms,
                            left_ms: r.ttl_ms,
                        },
                    };
                    Ok((r.error, out))
                }
            },
        )
        .await
    }

    /// Reads several keys; each group's keys are read at one point in time.
    pub async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        for k in keys {
            self.check_key(k)?;
        }
        let deadline = self.deadline();
        let mut out: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        while let Some(&first) = pending.first() {
            // The keys in the same group as the first pending one, as the cache sees it
            // now; a route change under us (CrossGroup) just re-splits.
            let batch: Vec<usize> = {
                let table = self.read_table();
                let g = table.locate(&keys[first]).map(|r| r.group_id);
                pending
                    .iter()
                    .copied()
                    .filter(|&i| {
                        i == first
                            || (g.is_some() && table.locate(&keys[i]).map(|r| r.group_id) == g)
                    })
                    .take(limits::BATCH_KEYS_MAX)
                    .collect()
            };
            let wire: Vec<Bytes> = batch
                .iter()
                .map(|&i| Bytes::copy_from_slice(&keys[i]))
                .collect();
            let check: Vec<&[u8]> = batch.iter().map(|&i| keys[i].as_slice()).collect();
            let res = self
                .execute(
                    "batch_get",
                    Retry::Read,
                    &keys[first],
                    &check,
                    deadline,
                    |conn, header| {
                        let mut kv = self.kv(conn.channel);
                        let req = pb::BatchGetRequest {
                            header: Some(header),
                            keys: wire.clone(),
                        };
                        async move {
                            let r = kv.batch_get(req).await?.into_inner();
                            Ok((r.error, r.results))
                        }
                    },
                )
                .await;
            match res {
                Ok(results) => {
                    if results.len() != batch.len() {
                        return Err(ClientError::Protocol {
                            addr: "?".into(),
                            why: format!(
                                "BatchGet answered {} results for {} keys",
                                results.len(),
                                batch.len()
                            ),
                        });
                    }
                    for (&i, r) in batch.iter().zip(results) {
                        out[i] = r.found.then(|| r.value.to_vec());
                    }
                    pending.retain(|i| !batch.contains(i));
                }
                Err(ClientError::CrossGroup { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Applies `ops` atomically; all keys must belong to one group.
    pub async fn batch_write(&self, ops: &[WriteOp]) -> Result<()> {
        let Some(first) = ops.first() else {
            return Ok(());
        };
        if ops.len() > limits::BATCH_KEYS_MAX {
            return Err(ClientError::InvalidArgument(format!(
                "{} mutations exceed the batch limit of {}",
                ops.len(),
                limits::BATCH_KEYS_MAX
            )));
        }
        for op in ops {
            self.check_key(op.key())?;
            if let WriteOp::Put(_, v) = op {
                self.check_value(v)?;
            }
        }
        let wire: Vec<pb::Mutation> = ops
            .iter()
            .map(|op| match op {
                WriteOp::Put(k, v) => pb::Mutation {
                    op: pb::MutationOp::Put as i32,
                    key: Bytes::copy_from_slice(k),
                    value: Bytes::copy_from_slice(v),
                    ..pb::Mutation::default()
                },
                WriteOp::Delete(k) => pb::Mutation {
                    op: pb::MutationOp::Delete as i32,
                    key: Bytes::copy_from_slice(k),
                    ..pb::Mutation::default()
                },
            })
            .collect();
        let check: Vec<&[u8]> = ops.iter().map(WriteOp::key).collect();
        self.execute(
            "batch_write",
            Retry::Idempotent,
            first.key(),
            &check,
            self.deadline(),
            |conn, header| {
                let mut kv = self.kv(conn.channel);
                let req = pb::BatchWriteRequest {
                    header: Some(header),
                    mutations: wire.clone(),
                };
                async move {
                    let r = kv.batch_write(req).await?.into_inner();
                    Ok((r.error, ()))
                }
            },
        )
        .await
    }

    /// One page of `[start, end)` (empty end = unbounded), at most `limit` pairs (0 =
    /// the server's default page). Continue with `page.next` as the new start.
    pub async fn scan_page(&self, start: &[u8], end: &[u8], limit: u32) -> Result<ScanPage> {
        self.scan_page_until(start, end, limit, self.deadline())
            .await
    }

    async fn scan_page_until(
        &self,
        start: &[u8],
        end: &[u8],
        limit: u32,
        deadline: Instant,
    ) -> Result<ScanPage> {
        if !end.is_empty() && start >= end {
            return Ok(ScanPage::default());
        }
        if start.len() > self.inner.opts.key_bytes_max || end.len() > self.inner.opts.key_bytes_max
        {
            return Err(ClientError::KeyTooLarge {
                size: start.len().max(end.len()),
                limit: self.inner.opts.key_bytes_max,
            });
        }
        let s = Bytes::copy_from_slice(start);
        let e = Bytes::copy_from_slice(end);
        let limit = limit.min(limits::SCAN_LIMIT_MAX);
        let resp = self
            .execute("scan", Retry::Read, start, &[], deadline, |conn, header| {
                let mut kv = self.kv(conn.channel);
                let req = pb::ScanRequest {
                    header: Some(header),
                    start: s.clone(),
                    end: e.clone(),
                    limit,
                    keys_only: false,
                };
                async move {
                    let r = kv.scan(req).await?.into_inner();
                    Ok((r.error.clone(), r))
                }
            })
            .await?;
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = resp
            .pairs
            .iter()
            .map(|p| (p.key.to_vec(), p.value.to_vec()))
            .collect();
        let next = if resp.more {
            let next = resp.next_key.to_vec();
            if next.as_slice() <= start {
                return Err(ClientError::Protocol {
                    addr: "?".into(),
                    why: "scan did not advance".into(),
                });
            }
            Some(next)
        } else if resp.group_end.is_empty() || (!end.is_empty() && resp.group_end.as_ref() >= end) {
            None
        } else {
            if resp.group_end.as_ref() <= start {
                return Err(ClientError::Protocol {
                    addr: "?".into(),
                    why: "scan's group end is not past its start".into(),
                });
            }
            Some(resp.group_end.to_vec())
        };
        Ok(ScanPage { pairs, next })
    }

    /// All pairs in `[start, end)` (empty end = unbounded), across groups, at most
    /// `limit` (0 = no limit), within one deadline.
    pub async fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let deadline = self.deadline();
        let mut out = Vec::new();
        let mut cursor = start.to_vec();
        loop {
            let want = if limit == 0 {
                limits::SCAN_LIMIT_MAX
            } else {
                (limit - out.len()).min(limits::SCAN_LIMIT_MAX as usize) as u32
            };
            let page = self.scan_page_until(&cursor, end, want, deadline).await?;
            out.extend(page.pairs);
            match page.next {
                Some(n) if limit == 0 || out.len() < limit => cursor = n,
                _ => break,
            }
        }
        if limit != 0 {
            out.truncate(limit);
        }
        Ok(out)
    }

    /// All pairs whose key starts with `prefix`, at most `limit` (0 = no limit).
    pub async fn scan_prefix(
        &self,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.scan(prefix, &prefix_end(prefix), limit).await
    }

    /// Deletes every key in `[start, end)` (empty end = unbounded). Atomic per group,
    /// not across groups.
    pub async fn delete_range(&self, start: &[u8], end: &[u8]) -> Result<()> {
        let deadline = self.deadline();
        let mut cursor = start.to_vec();
        loop {
            if !end.is_empty() && cursor.as_slice() >= end {
                return Ok(());
            }
            let s = Bytes::copy_from_slice(&cursor);
            let e = Bytes::copy_from_slice(end);
            // The group's range end tells where to continue.
            let group_end = self
                .execute(
                    "delete_range",
                    Retry::Idempotent,
                    &cursor,
                    &[],
                    deadline,
                    |conn, header| {
                        let mut kv = self.kv(conn.channel);
                        let gid = header.group_id;
                        let req = pb::DeleteRangeRequest {
                            header: Some(header),
                            start: s.clone(),
                            end: e.clone(),
                        };
                        let end_now = self.read_table().by_group(gid).map(|r| r.end.clone());
                        async move {
                            let r = kv.delete_range(req).await?.into_inner();
                            Ok((r.error, end_now))
                        }
                    },
                )
                .await?;
            match group_end {
                Some(ge)
                    if !ge.is_empty() && (end.is_empty() || ge.as_slice() < end) && ge > cursor =>
                {
                    cursor = ge
                }
                _ => return Ok(()),
            }
        }
    }

    /// Cluster membership, groups, leaders, sizes and operators, from the meta group.
    pub async fn cluster_status(&self) -> Result<ClusterStatus> {
        let r = self
            .meta_call(
                "cluster_status",
                Duration::from_secs(2),
                |mut meta, t| async move {
                    let req = pb::GetClusterRequest { timeout_ms: t };
                    let mut r = meta.get_cluster(req).await?.into_inner();
                    Ok((r.error.take(), r))
                },
            )
            .await?;
        Ok(status_from_wire(r))
    }

    /// Moves the leadership of `group` to its replica on node `to` (the meta leader has
    /// the group's leader hand it over) and waits until the meta leader hears that it
    /// moved. Returns the leader then (`to`).
    pub async fn transfer_leader(&self, group: u64, to: NodeId) -> Result<NodeId> {
        // The meta leader waits for the transfer: one try may take most of the time (a
        // quarter is left for another node, should the first not answer).
        let r = self
            .meta_call(
                "transfer_leader",
                self.timeout * 3 / 4,
                |mut meta, t| async move {
                    let req = pb::TransferLeaderRequest {
                        group_id: group,
                        to_node: to,
                        timeout_ms: t,
                    };
                    let mut r = meta.transfer_leader(req).await?.into_inner();
                    Ok((r.error.take(), r))
                },
            )
            .await?;
        Ok(r.leader_node_id)
    }

    /// Marks node `node` draining (its replicas are then moved to other nodes, and it
    /// takes no new ones), or no longer with `cancel`. Returns how many replicas the
    /// routing table still places on it.
    pub async fn drain_node(&self, node: NodeId, cancel: bool) -> Result<u64> {
        let r = self
            .meta_call(
                "drain_node",
                self.timeout * 3 / 4,
                |mut meta, t| async move {
                    let req = pb::DrainNodeRequest {
                        node_id: node,
                        cancel,
                        timeout_ms: t,
                    };
                    let mut r = meta.drain_node(req).await?.into_inner();
                    Ok((r.error.take(), r))
                },
            )
            .await?;
        Ok(r.replicas)
    }

    /// Splits `group` at `key` (strictly inside its range): the keys at or above it move
    /// to a new group with the same replicas. Waits until the routing table holds both
    /// and returns their ids and ranges: (left, right).
    pub async fn split_group(&self, group: u64, key: &[u8]) -> Result<(Route, Route)> {
        if key.len() > limits::KEY_BYTES_MAX {
            return Err(ClientError::KeyTooLarge {
                size: key.len(),
                limit: limits::KEY_BYTES_MAX,
            });
        }
        let key = bytes::Bytes::copy_from_slice(key);
        let r = self
            .meta_call("split_group", self.timeout * 3 / 4, |mut meta, t| {
                let key = key.clone();
                async move {
                    let req = pb::SplitGroupRequest {
                        group_id: group,
                        split_key: key,
                        timeout_ms: t,
                    };
                    let mut r = meta.split_group(req).await?.into_inner();
                    Ok((r.error.take(), r))
                }
            })
            .await?;
        let (Some(left), Some(right)) = (r.left, r.right) else {
            return Err(ClientError::Protocol {
                addr: "the meta leader".into(),
                why: "a split answered without the two routes".into(),
            });
        };
        self.take_route(&left);
        self.take_route(&right);
        Ok((route_from_wire(&left), route_from_wire(&right)))
    }

    /// Merges `source` into its neighbour `target` (the same replicas): the source
    /// freezes, the target takes its range, data and client sessions, and the source
    /// goes. Waits until the routing table holds the merged group; returns its route.
    pub async fn merge_group(&self, source: u64, target: u64) -> Result<Route> {
        let r = self
            .meta_call(
                "merge_group",
                self.timeout * 3 / 4,
                |mut meta, t| async move {
                    let req = pb::MergeGroupRequest {
                        source,
                        target,
                        timeout_ms: t,
                    };
                    let mut r = meta.merge_group(req).await?.into_inner();
                    Ok((r.error.take(), r))
                },
            )
            .await?;
        let Some(route) = r.route else {
            return Err(ClientError::Protocol {
                addr: "the meta leader".into(),
                why: "a merge answered without the merged route".into(),
            });
        };
        self.take_route(&route);
        Ok(route_from_wire(&route))
    }

    /// Scrubs `group`: its leader proposes a scrub point, every replica checksums the
    /// group's data there, and the meta leader compares them. Waits until every voter
    /// reported it. A mismatch is an answer (`consistent` false), not an error.
    pub async fn scrub_group(&self, group: u64) -> Result<ScrubOutcome> {
        let r = self
            .meta_call(
                "scrub_group",
                self.timeout * 3 / 4,
                |mut meta, t| async move {
                    let req = pb::ScrubGroupRequest {
                        group_id: group,
                        timeout_ms: t,
                    };
                    let mut r = meta.scrub_group(req).await?.into_inner();
                    Ok((r.error.take(), r))
                },
            )
            .await?;
        Ok(ScrubOutcome {
            index: r.index,
            replicas: r.replicas.iter().map(scrub_from_wire).collect(),
            consistent: r.consistent,
        })
    }

    /// Starts the backup of the group that holds `key` (`Backup.BackupGroup` on its
    /// leader, which passes a read barrier first: every write acknowledged before this
    /// call is in the backup). Tables the leader's store can copy to `copy_store` go to
    /// `copy_prefix(group)` there. Returns once the leader accepted; the head and the
    /// files follow on the returned stream ([`BackupStream`]), as the leader builds them.
    pub async fn backup_group(
        &self,
        key: &[u8],
        copy_store: &str,
        copy_prefix: impl Fn(u64) -> String,
    ) -> Result<BackupStream> {
        // (The empty key is the first group's start.)
        if key.len() > limits::KEY_BYTES_MAX {
            return Err(ClientError::KeyTooLarge {
                size: key.len(),
                limit: limits::KEY_BYTES_MAX,
            });
        }
        let (store, copy_prefix) = (copy_store.to_string(), &copy_prefix);
        self.execute(
            "backup_group",
            Retry::Read,
            key,
            &[],
            self.deadline(),
            |conn, header| {
                let addr = conn.addr.to_string();
                let req = pb::BackupGroupRequest {
                    copy_store: store.clone(),
                    copy_prefix: copy_prefix(header.group_id),
                    header: Some(header),
                };
                async move {
                    let mut rpc = pb::backup_client::BackupClient::new(conn.channel)
                        .max_decoding_message_size(limits::MESSAGE_BYTES_MAX);
                    let mut stream = rpc.backup_group(req).await?.into_inner();
                    match stream.message().await? {
                        Some(pb::BackupGroupChunk { error: Some(e), .. }) => Ok((Some(e), None)),
                        Some(pb::BackupGroupChunk { accepted: true, .. }) => {
                            Ok((None, Some(BackupStream { addr, stream })))
                        }
                        _ => Err(tonic::Status::unknown(
                            "the node's backup stream did not start with its acceptance",
                        )),
                    }
                }
            },
        )
        .await?
        .ok_or_else(|| ClientError::InvalidArgument("no backup stream".into()))
    }

    /// Adds a replica of `group` on node `node` (a learner that catches up, then a
    /// voter) and waits until the routing table lists it as a voter. Returns the
    /// group's voters then.
    pub async fn add_replica(&self, group: u64, node: NodeId) -> Result<Vec<NodeId>> {
        let r = self
            .meta_call(
                "add_replica",
                self.timeout * 3 / 4,
                |mut meta, t| async move {
                    let req = pb::AddReplicaRequest {
                        group_id: group,
                        node_id: node,
                        timeout_ms: t,
                    };
                    let mut r = meta.add_replica(req).await?.into_inner();
                    Ok((r.error.take(), r))
                },
            )
            .await?;
        Ok(voters_of(r.route.unwrap_or_default()))
    }

    /// Removes the replica of `group` on node `node` (its leadership is moved to
    /// another voter first; the node may be down) and waits until the routing table no
    /// longer lists it; the node then drops the replica's data. Returns the group's
    /// voters then. The group's last voter cannot be removed.
    pub async fn remove_replica(&self, group: u64, node: NodeId) -> Result<Vec<NodeId>> {
        let r = self
            .meta_call(
                "remove_replica",
                self.timeout * 3 / 4,
                |mut meta, t| async move {
                    let req = pb::RemoveReplicaRequest {
                        group_id: group,
                        node_id: node,
                        timeout_ms: t,
                    };
                    let mut r = meta.remove_replica(req).await?.into_inner();
                    Ok((r.error.take(), r))
                },
            )
            .await?;
        Ok(voters_of(r.route.unwrap_or_default()))
    }

    /// Moves the replica of `group` on node `from` to node `to`: adds `to` (a learner
    /// that catches up, then a voter), then removes `from`: one membership change at a
    /// time, so the group keeps a quorum throughout. Each step has the client's
    /// timeout. If the removal fails, `to` stays a voter (the group has one replica
    /// more); asking again finishes the move. Returns the group's voters.
    pub async fn move_replica(&self, group: u64, from: NodeId, to: NodeId) -> Result<Vec<NodeId>> {
        if from == to {
            return Err(ClientError::InvalidArgument(format!(
                "move of group {group}: the replica is on node {to} already"
            )));
        }
        self.add_replica(group, to).await?;
        self.remove_replica(group, from).await
    }

    /// Asks the meta service through the known nodes in turn (each forwards to the
    /// meta leader), each try bounded by `per_try_max` and the deadline, until one
    /// answers without a retryable error; backs off between rounds.
    async fn meta_call<T, F, Fut>(
        &self,
        op: &'static str,
        per_try_max: Duration,
        call: F,
    ) -> Result<T>
    where
        F: Fn(MetaClient<AuthChannel>, u64) -> Fut,
        Fut: std::future::Future<
            Output = std::result::Result<(Option<pb::Error>, T), tonic::Status>,
        >,
    {
        let deadline = self.deadline();
        let mut last = String::from("no node asked");
        let mut attempts = 0;
        let mut backoffs = 0;
        while Instant::now() < deadline {
            for addr in self.meta_candidates() {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                let per_try = (deadline - now).min(per_try_max);
                let meta = self.meta(self.channel(&addr)?);
                attempts += 1;
                let timeout_ms = per_try.as_millis().max(1) as u64;
                match tokio::time::timeout(per_try, call(meta, timeout_ms)).await {
                    Err(_) => last = format!("{addr}: {op} timed out"),
                    // A node older than this request's kind: asking again will not help.
                    Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                        return Err(ClientError::Refused {
                            op,
                            addr: addr.clone(),
                            error: Box::new(pb::Error::invalid_argument(format!(
                                "{addr} does not serve {op} (an older version): {}",
                                status.message()
                            ))),
                        })
                    }
                    Ok(Err(status)) => {
                        if let Some(why) = refused_credentials(&status) {
                            return Err(ClientError::Unauthenticated { addr, why });
                        }
                        last = format!("{addr}: {}", status.message());
                    }
                    Ok(Ok((Some(e), _))) if e.is_retryable() => last = format!("{addr}: {e}"),
                    Ok(Ok((Some(e), _))) => {
                        return Err(ClientError::Refused {
                            op,
                            addr,
                            error: Box::new(e),
                        })
                    }
                    Ok(Ok((None, r))) => return Ok(r),
                }
            }
            self.backoff(&mut backoffs, deadline).await;
        }
        Err(ClientError::DeadlineExceeded {
            op,
            timeout: self.timeout,
            attempts,
            last,
        })
    }

    /// Succeeds when routes are known and every group's leader serves a read: the
    /// cluster is ready for clients.
    pub async fn ready_probe(&self) -> Result<()> {
        let deadline = self.deadline();
        if let Err(last) = self.refresh_routes(deadline).await {
            let last = last.fatal()?;
            return Err(ClientError::DeadlineExceeded {
                op: "ready_probe",
                timeout: self.timeout,
                attempts: 1,
                last,
            });
        }
        let starts: Vec<Vec<u8>> = self
            .cached_routes()
            .into_iter()
            .map(|r| if r.start.is_empty() { vec![0] } else { r.start })
            .collect();
        for key in starts {
            self.get(&key).await?;
        }
        Ok(())
    }
}

fn status_from_wire(r: pb::GetClusterResponse) -> ClusterStatus {
    let nodes = r
        .nodes
        .into_iter()
        .map(|n| {
            let stats = n.stats.unwrap_or_default();
            NodeStatus {
                node_id: n.node_id,
                addr: n.addr,
                alive: n.alive,
                last_heartbeat_ms_ago: (n.last_heartbeat_ms_ago != u64::MAX)
                    .then_some(n.last_heartbeat_ms_ago),
                groups: stats.groups,
                leaders: stats.leaders,
                engine_bytes: stats.engine_bytes,
                log_bytes: stats.log_bytes,
                disk_free_bytes: stats.available_bytes,
                disk_full: stats.disk_full,
                draining: n.draining,
            }
        })
        .collect();
    let groups = r.groups.into_iter().filter_map(group_from_wire).collect();
    let operators = r
        .operators
        .into_iter()
        .map(|o| OperatorStatus {
            group_id: o.group_id,
            kind: match pb::OperatorKind::try_from(o.kind) {
                Ok(pb::OperatorKind::TransferLeader) => "transfer-leader".to_string(),
                Ok(pb::OperatorKind::AddReplica) => "add-replica".to_string(),
                Ok(pb::OperatorKind::RemoveReplica) => "remove-replica".to_string(),
                Ok(pb::OperatorKind::Split) => "split".to_string(),
                Ok(pb::OperatorKind::Merge) => "merge".to_string(),
                _ => format!("unknown ({})", o.kind),
            },
            origin: match pb::OperatorOrigin::try_from(o.origin) {
                Ok(pb::OperatorOrigin::Request) => "request".to_string(),
                Ok(pb::OperatorOrigin::Balance) => "balance".to_string(),
                Ok(pb::OperatorOrigin::Repair) => "repair".to_string(),
                Ok(pb::OperatorOrigin::SplitCheck) => "split-check".to_string(),
                Ok(pb::OperatorOrigin::MergeCheck) => "merge-check".to_string(),
                _ => format!("unknown ({})", o.origin),
            },
            from: o.from_node,
            to: o.to_node,
            age_ms: o.age_ms,
            step: o.step,
        })
        .collect();
    ClusterStatus {
        meta_leader: (r.meta_leader_node_id != 0).then_some(r.meta_leader_node_id),
        nodes,
        groups,
        meta_group: r.meta_group.and_then(group_from_wire),
        operators,
        scrub_mismatches: r
            .scrub_mismatches
            .iter()
            .map(|m| ScrubMismatch {
                group_id: m.group_id,
                index: m.index,
                replicas: m.replicas.iter().map(scrub_from_wire).collect(),
            })
            .collect(),
    }
}

/// A group's status from its wire form (None without a route).
fn group_from_wire(g: pb::GroupInfo) -> Option<GroupStatus> {
    let route = g.route?;
    let replica_status = g
        .replicas
        .into_iter()
        .map(|s| ReplicaStatus {
            node_id: s.node_id,
            is_leader: s.is_leader,
            term: s.term,
            commit_index: s.commit_index,
            applied_index: s.applied_index,
            log_first_index: s.log_first_index,
            approximate_bytes: s.approximate_bytes,
            stopped: s.stopped.clone(),
            hibernating: s.hibernating,
        })
        .collect();
    Some(GroupStatus {
        group_id: route.group_id,
        start: route.start_key.to_vec(),
        end: route.end_key.to_vec(),
        epoch: route.epoch,
        leader: (route.leader_node_id != 0).then_some(route.leader_node_id),
        replicas: route.replicas.iter().map(|x| x.node_id).collect(),
        learners: route.learners.clone(),
        replica_status,
    })
}

/// The voters of `route` (its replicas but the learners).
fn voters_of(route: pb::Route) -> Vec<NodeId> {
    route
        .replicas
        .iter()
        .map(|x| x.node_id)
        .filter(|id| !route.learners.contains(id))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write's `acked_below` never passes a write still unanswered, however the
    /// threads interleave (the sequence is taken and registered under one lock).
    #[test]
    fn acked_below_never_passes_an_unanswered_write() {
        let session = Arc::new(Session {
            client_id: 1,
            seqs: Mutex::new((1, std::collections::BTreeSet::new())),
        });
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let session = Arc::clone(&session);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let seq = session.begin();
                        let acked = session.acked_below();
                        assert!(acked <= seq, "acked_below {acked} passes unanswered {seq}");
                        session.end(seq);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join()
                .map_err(|_| "a thread panicked")
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn prefix_end_cases() {
        assert_eq!(prefix_end(b"ab"), b"ac".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), Vec::<u8>::new());
        assert_eq!(prefix_end(b""), Vec::<u8>::new());
    }

    #[test]
    fn connect_refused_is_never_sent() {
        let s = tonic::Status::unavailable(
            "error trying to connect: tcp connect error: Connection refused",
        );
        assert!(never_sent(&s));
        assert!(!never_sent(&tonic::Status::unavailable("connection reset")));
    }
}
