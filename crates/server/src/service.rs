//! The client-facing gRPC services: `Kv` (on every node, for the groups it leads) and
//! `Meta` (answered by the meta leader; other nodes forward).
//!
//! Every request is validated before it reaches raft: deadline present and bounded,
//! group hosted here, epoch current, keys inside the group's range, sizes within the
//! limits. Too many requests in flight get `ServerBusy` instead of queueing without
//! bound. A request for a group this node follows is forwarded to the leader
//! (forward.rs) unless the client asked to be redirected instead.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use phoenix_engine::ReadOptions;
use phoenix_proto as proto;
use phoenix_proto::limits;
use prost::Message as _;
use tokio::sync::{oneshot, Semaphore};
use tonic::{Request, Response, Status};

use crate::keys;
use crate::meta::META_GROUP;
use crate::node::{ApplyResult, Event};
use crate::shared::Shared;

/// State common to the services.
#[derive(Clone)]
pub struct Services {
    /// Shared node state.
    pub shared: Arc<Shared>,
    /// Admission control.
    pub inflight: Arc<Semaphore>,
    /// Connections to the leaders requests are forwarded to.
    pub forward: Arc<crate::forward::Forwarder>,
    /// Turns true when the node stops: `Kv.Batch` streams stop taking items then.
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// Where a validated request is served.
pub(crate) enum Where {
    /// Here: this node leads the group.
    Here(Ctx),
    /// By the group's leader on another node (forwarded).
    Leader(crate::forward::Target),
}

type PErr = proto::Error;

fn in_range(route: &proto::Route, key: &[u8]) -> bool {
    key >= route.start_key.as_ref() && (route.end_key.is_empty() || key < route.end_key.as_ref())
}

/// A validated request context: group, route and deadline.
pub(crate) struct Ctx {
    pub(crate) group: u64,
    pub(crate) route: proto::Route,
    deadline: Instant,
    timeout_ms: u64,
    /// The writer's session (client id, sequence, acknowledged below), if it sent one.
    session: Option<(u64, u64, u64)>,
}

impl Services {
    fn check_timeout(timeout_ms: u64) -> Result<Duration, PErr> {
        if timeout_ms == 0 {
            return Err(PErr::invalid_argument("timeout_ms is required (got 0)"));
        }
        if timeout_ms > limits::TIMEOUT_MS_MAX {
            return Err(PErr::invalid_argument(format!(
                "timeout_ms {timeout_ms} exceeds the maximum {}",
                limits::TIMEOUT_MS_MAX
            )));
        }
        Ok(Duration::from_millis(timeout_ms))
    }

    /// Validates the header and decides where the request is served: here if this node
    /// leads the group, else by the leader it knows (forwarded), else refused with
    /// NotLeader and the leader's address if known (also when the client asked for
    /// redirects, or the request was forwarded already).
    pub(crate) fn locate(&self, h: Option<&proto::RequestHeader>) -> Result<Where, PErr> {
        let h = h.ok_or_else(|| PErr::invalid_argument("request header missing"))?;
        let timeout = Self::check_timeout(h.timeout_ms)?;
        if h.group_id == META_GROUP {
            return Err(PErr::invalid_argument(
                "group 0 is the meta group; no user keys live there",
            ));
        }
        let groups = self.shared.groups.read();
        let Some(v) = groups.get(&h.group_id) else {
            return Err(PErr::group_unavailable(
                h.group_id,
                "not hosted on this node",
            ));
        };
        if h.epoch != 0 && h.epoch < v.route.epoch {
            return Err(PErr::stale_epoch(h.group_id, h.epoch, v.route.clone()));
        }
        if v.merging_into != 0 {
            // Frozen: its data is on its way into the neighbour, whose route the client
            // finds in the routing table once the merge is done.
            return Err(PErr::group_unavailable(
                h.group_id,
                format!("frozen for a merge into group {}", v.merging_into),
            ));
        }
        if h.forwarded_by != 0 && self.shared.links.is_cut(h.forwarded_by) {
            // Partitioned from the forwarder: it cannot reach us (as raft cannot).
            return Err(PErr::group_unavailable(
                h.group_id,
                format!("link to node {} cut (fault injection)", h.forwarded_by),
            ));
        }
        if !v.is_leader {
            let me = self.shared.cfg.node_id;
            let forwardable = !h.no_forward
                && h.forwarded_by == 0
                && v.leader != 0
                && v.leader != me
                && !self.shared.links.is_cut(v.leader);
            let addr = self.shared.addr_of(v.leader).filter(|_| forwardable);
            let Some(addr) = addr else {
                return Err(PErr::not_leader(
                    h.group_id,
                    self.shared.replica_of(v.leader),
                ));
            };
            return Ok(Where::Leader(crate::forward::Target {
                group: h.group_id,
                leader: v.leader,
                addr,
                deadline: Instant::now() + timeout,
            }));
        }
        Ok(Where::Here(Ctx {
            group: h.group_id,
            route: v.route.clone(),
            deadline: Instant::now() + timeout,
            timeout_ms: h.timeout_ms,
            session: (h.client_id != 0).then_some((h.client_id, h.seq, h.acked_below)),
        }))
    }

    fn check_key(&self, c: &Ctx, key: &[u8]) -> Result<(), PErr> {
        if key.len() > limits::KEY_BYTES_MAX {
            return Err(PErr::key_too_large(key.len(), limits::KEY_BYTES_MAX));
        }
        if !in_range(&c.route, key) {
            return Err(PErr::key_not_in_group(key, c.group, Some(c.route.clone())));
        }
        // The load split's sample (split_check.rs).
        self.shared.split.record(c.group, key);
        Ok(())
    }

    fn check_value(&self, v: &[u8]) -> Result<(), PErr> {
        let max = self.shared.cfg.value_bytes_max;
        if v.len() > max {
            return Err(PErr::value_too_large(v.len(), max));
        }
        Ok(())
    }

    /// Serves a request through `serve` and records its answer in the node's metrics.
    async fn counted<R: Answer>(
        &self,
        method: &'static str,
        serve: impl std::future::Future<Output = Result<Response<R>, Status>>,
    ) -> Result<Response<R>, Status> {
        let started = Instant::now();
        let answer = serve.await;
        let result = match &answer {
            Ok(r) => crate::metrics::result_label(r.get_ref().error()),
            Err(_) => "status",
        };
        self.shared
            .metrics
            .request(method, result, started.elapsed());
        answer
    }

    fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, PErr> {
        Arc::clone(&self.inflight).try_acquire_owned().map_err(|_| {
            PErr::server_busy("too many requests in flight on this node; back off and retry")
        })
    }

    async fn wait<T>(&self, c: &Ctx, rx: oneshot::Receiver<Result<T, PErr>>) -> Result<T, PErr> {
        match tokio::time::timeout_at(c.deadline.into(), rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(PErr::group_unavailable(
                c.group,
                "the node dropped the request",
            )),
            Err(_) => Err(PErr::deadline_exceeded(c.timeout_ms)),
        }
    }

    async fn propose(&self, c: &Ctx, cmd: proto::KvCommand) -> Result<ApplyResult, PErr> {
        self.propose_at(c, cmd, now_ms()).await
    }

    /// Proposes `cmd` with time `now` (this node's clock, read before any expiry the
    /// command carries was computed from it): it decides, for every replica, session
    /// expiry and which keys have expired for this command.
    async fn propose_at(
        &self,
        c: &Ctx,
        mut cmd: proto::KvCommand,
        now: u64,
    ) -> Result<ApplyResult, PErr> {
        cmd.now_ms = now;
        if let Some((client_id, seq, acked_below)) = c.session {
            if seq == 0 || seq == u64::MAX {
                return Err(PErr::invalid_argument(format!(
                    "a write with a client id needs a sequence number from 1 to {} (got {seq})",
                    u64::MAX - 1
                )));
            }
            cmd.session = Some(proto::ClientSession {
                client_id,
                seq,
                acked_below,
                time_ms: now,
            });
        }
        // Checked again when it applies: a split in between refuses it there.
        cmd.epoch = c.route.epoch;
        let (tx, rx) = oneshot::channel();
        self.shared
            .events
            .send(Event::Propose {
                group: c.group,
                data: Bytes::from(cmd.encode_to_vec()),
                reply: tx,
            })
            .map_err(|_| PErr::group_unavailable(c.group, "node shutting down"))?;
        match self.wait(c, rx).await? {
            ApplyResult::SessionExpired { client_id, seq } => {
                Err(PErr::session_expired(c.group, client_id, seq))
            }
            ApplyResult::StaleEpoch { request_epoch } => Err(self.stale(c, request_epoch)),
            r => Ok(r),
        }
    }

    pub(crate) async fn read_index(&self, c: &Ctx) -> Result<(), PErr> {
        let (tx, rx) = oneshot::channel();
        self.shared
            .events
            .send(Event::ReadIndex {
                group: c.group,
                reply: tx,
            })
            .map_err(|_| PErr::group_unavailable(c.group, "node shutting down"))?;
        self.wait(c, rx).await
    }

    /// The refusal of a request of `c` checked at range epoch `request_epoch` that the
    /// group has moved past (a split): the group's route now, and the route of the
    /// group split off it, so the client goes on without asking the meta service.
    fn stale(&self, c: &Ctx, request_epoch: u64) -> PErr {
        let groups = self.shared.groups.read();
        let Some(v) = groups.get(&c.group) else {
            return PErr::group_unavailable(c.group, "not hosted on this node");
        };
        let mut err = PErr::stale_epoch(c.group, request_epoch, v.route.clone());
        if let (Some(proto::error::Kind::StaleEpoch(se)), Some(child)) =
            (err.kind.as_mut(), v.split_child.as_ref())
        {
            se.related.push(child.clone());
        }
        err
    }

    /// An engine snapshot to serve a read of `c` from, once its read index is applied:
    /// taken first, then the group's range epoch is checked to be still the request's.
    /// A split publishes its epoch before it moves the keys (node.rs), so a snapshot
    /// taken while the old epoch shows holds the keys where the request's route says.
    /// Also says whether the snapshot may hold key expiries: a write that brings the
    /// group's first is announced before it is made (node.rs `publish_expiries`), so a
    /// view read after the snapshot that says none is true of the snapshot.
    fn read_snapshot(&self, c: &Ctx) -> Result<ReadPoint, PErr> {
        let snap = self.shared.engine.snapshot();
        let view = self
            .shared
            .groups
            .read()
            .get(&c.group)
            .map(|v| (v.route.epoch, v.expiries != Some(false)));
        match view {
            Some((e, expiries)) if e == c.route.epoch => Ok(ReadPoint {
                snap,
                expiries,
                now: now_ms(),
            }),
            Some(_) => Err(self.stale(c, c.route.epoch)),
            None => Err(PErr::group_unavailable(
                c.group,
                "the replica left this node",
            )),
        }
    }

    /// The expiry of user key `key` of group `g` at read point `at` (None: it has none,
    /// or the group holds no expiries).
    fn expiry(&self, at: &ReadPoint, g: u64, key: &[u8]) -> Result<Option<u64>, PErr> {
        if !at.expiries {
            return Ok(None);
        }
        let ro = ReadOptions {
            snapshot: Some(&at.snap),
            ..ReadOptions::default()
        };
        let Some(v) = self
            .shared
            .engine
            .get(&ro, &keys::expiry_key(g, key))
            .map_err(Self::engine_err)?
        else {
            return Ok(None);
        };
        keys::decode_expiry(&v).map(Some).ok_or_else(|| {
            PErr::internal(format!(
                "group {g}: the expiry of key {key:02x?} is {} bytes, not 8",
                v.len()
            ))
        })
    }

    /// Whether user key `key` of group `g` has expired at read point `at` (its expiry
    /// is before the read's time: at the very millisecond it still lives, as in Redis).
    fn expired(&self, at: &ReadPoint, g: u64, key: &[u8]) -> Result<bool, PErr> {
        Ok(self.expiry(at, g, key)?.is_some_and(|e| e < at.now))
    }

    fn engine_err(e: phoenix_engine::Error) -> PErr {
        PErr::internal(format!("engine: {e}"))
    }
}

impl Services {
    /// The version gate: a command for `feature` is proposed only once every
    /// registered node applies it (protocol `needed`): a replica of an older binary
    /// would apply it as an empty command, and the replicas would part ways. Checked on
    /// the node a request reaches and again on the leader it is forwarded to.
    fn gate(&self, group: u64, feature: &str, needed: u32) -> Result<(), PErr> {
        let cluster = self.shared.cluster_protocol();
        if cluster == 0 {
            // Not heard yet since this node started (a heartbeat answer comes within a
            // second or so): a refusal the client retries, not a verdict.
            return Err(PErr::group_unavailable(
                group,
                format!(
                    "{feature} waits for the cluster's protocol levels, not heard from the \
                     meta leader yet since this node started"
                ),
            ));
        }
        if cluster < needed {
            return Err(PErr::unsupported(feature, needed, cluster));
        }
        Ok(())
    }

    /// The version gate for what request `r` needs (forward.rs [`Needs`]).
    fn gate_request(&self, r: &impl crate::forward::Forwardable, group: u64) -> Result<(), PErr> {
        match r.needs() {
            Some((feature, needed)) => self.gate(group, feature, needed),
            None => Ok(()),
        }
    }
}

/// Checks a write's expiry fields (`ttl_ms`, `keep_ttl`): a new expiry or the old one,
/// not both.
fn check_expiry(ttl_ms: u64, keep_ttl: bool) -> Result<(), PErr> {
    if ttl_ms != 0 && keep_ttl {
        return Err(PErr::invalid_argument(
            "a write gives a key a new expiry (ttl_ms) or keeps its own (keep_ttl), not both",
        ));
    }
    Ok(())
}

/// The group a request's header names (0: none; the header is checked later).
fn group_of(header: &Option<proto::RequestHeader>) -> u64 {
    header.as_ref().map_or(0, |h| h.group_id)
}

/// This node's clock: ms since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The time `ttl_ms` after `now` (0: no expiry).
fn expire_at(now: u64, ttl_ms: u64) -> Result<u64, PErr> {
    if ttl_ms == 0 {
        return Ok(0);
    }
    now.checked_add(ttl_ms)
        .ok_or_else(|| PErr::invalid_argument(format!("ttl_ms {ttl_ms} is out of range")))
}

fn batch(mutations: Vec<proto::Mutation>) -> proto::KvCommand {
    proto::KvCommand {
        now_ms: 0,
        epoch: 0,
        session: None,
        cmd: Some(proto::kv_command::Cmd::Batch(proto::BatchMutations {
            mutations,
        })),
    }
}

macro_rules! try_err {
    ($resp:ident, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(err) =>
            {
                #[allow(clippy::needless_update)]
                return Ok(Response::new(proto::$resp {
                    error: Some(err),
                    ..Default::default()
                }))
            }
        }
    };
}

/// The request's context if this node serves it; else returns the answer: the leader's
/// (forwarded; `$write`: whether the request changes state) or the refusal. The version
/// gate comes first, here and on the leader: an older leader would misapply the request.
macro_rules! here_or_forward {
    ($self:ident, $r:ident, $resp:ident, $method:ident, $write:expr, $permit:ident) => {
        match $self
            .gate_request(&$r, group_of(&$r.header))
            .and_then(|()| $self.locate($r.header.as_ref()))
        {
            Ok(Where::Here(c)) => c,
            Ok(Where::Leader(to)) => {
                // Forwards are bounded on their own (forward.rs), not by this node's
                // admission.
                drop($permit);
                let me = $self.shared.cfg.node_id;
                let answer = $self
                    .forward
                    .forward(me, &to, $r, $write, |mut k, req| async move {
                        k.$method(req).await
                    })
                    .await;
                #[allow(clippy::needless_update)]
                return Ok(Response::new(answer.unwrap_or_else(|err| proto::$resp {
                    error: Some(err),
                    ..Default::default()
                })));
            }
            Err(err) =>
            {
                #[allow(clippy::needless_update)]
                return Ok(Response::new(proto::$resp {
                    error: Some(err),
                    ..Default::default()
                }))
            }
        }
    };
}

/// A `Kv` answer: its error, if any (for the metrics).
trait Answer {
    fn error(&self) -> Option<&PErr>;
}

macro_rules! answers {
    ($($t:ident),*) => {$(
        impl Answer for proto::$t {
            fn error(&self) -> Option<&PErr> {
                self.error.as_ref()
            }
        }
    )*};
}

answers!(
    ExpireResponse,
    TtlResponse,
    GetResponse,
    PutResponse,
    DeleteResponse,
    BatchGetResponse,
    BatchWriteResponse,
    ScanResponse,
    DeleteRangeResponse,
    CasResponse,
    IncrResponse
);

#[tonic::async_trait]
impl proto::kv_server::Kv for Services {
    type BatchStream = crate::batch::BatchStream;

    async fn batch(
        &self,
        req: Request<tonic::Streaming<proto::BatchRequest>>,
    ) -> Result<Response<Self::BatchStream>, Status> {
        Ok(Response::new(crate::batch::serve(
            self.clone(),
            req.into_inner(),
            self.stop.clone(),
        )))
    }

    async fn get(
        &self,
        req: Request<proto::GetRequest>,
    ) -> Result<Response<proto::GetResponse>, Status> {
        self.counted("get", self.serve_get(req)).await
    }

    async fn put(
        &self,
        req: Request<proto::PutRequest>,
    ) -> Result<Response<proto::PutResponse>, Status> {
        self.counted("put", self.serve_put(req)).await
    }

    async fn delete(
        &self,
        req: Request<proto::DeleteRequest>,
    ) -> Result<Response<proto::DeleteResponse>, Status> {
        self.counted("delete", self.serve_delete(req)).await
    }

    async fn batch_get(
        &self,
        req: Request<proto::BatchGetRequest>,
    ) -> Result<Response<proto::BatchGetResponse>, Status> {
        self.counted("batch_get", self.serve_batch_get(req)).await
    }

    async fn batch_write(
        &self,
        req: Request<proto::BatchWriteRequest>,
    ) -> Result<Response<proto::BatchWriteResponse>, Status> {
        self.counted("batch_write", self.serve_batch_write(req))
            .await
    }

    async fn scan(
        &self,
        req: Request<proto::ScanRequest>,
    ) -> Result<Response<proto::ScanResponse>, Status> {
        self.counted("scan", self.serve_scan(req)).await
    }

    async fn delete_range(
        &self,
        req: Request<proto::DeleteRangeRequest>,
    ) -> Result<Response<proto::DeleteRangeResponse>, Status> {
        self.counted("delete_range", self.serve_delete_range(req))
            .await
    }

    async fn cas(
        &self,
        req: Request<proto::CasRequest>,
    ) -> Result<Response<proto::CasResponse>, Status> {
        self.counted("cas", self.serve_cas(req)).await
    }

    async fn incr(
        &self,
        req: Request<proto::IncrRequest>,
    ) -> Result<Response<proto::IncrResponse>, Status> {
        self.counted("incr", self.serve_incr(req)).await
    }

    async fn expire(
        &self,
        req: Request<proto::ExpireRequest>,
    ) -> Result<Response<proto::ExpireResponse>, Status> {
        self.counted("expire", self.serve_expire(req)).await
    }

    async fn ttl(
        &self,
        req: Request<proto::TtlRequest>,
    ) -> Result<Response<proto::TtlResponse>, Status> {
        self.counted("ttl", self.serve_ttl(req)).await
    }

    async fn put_ex(
        &self,
        req: Request<proto::PutRequest>,
    ) -> Result<Response<proto::PutResponse>, Status> {
        self.counted("put", self.serve_put(req)).await
    }

    async fn cas_ex(
        &self,
        req: Request<proto::CasRequest>,
    ) -> Result<Response<proto::CasResponse>, Status> {
        self.counted("cas", self.serve_cas(req)).await
    }
}

/// Expired keys (not swept yet) one scan page passes over at most before it ends.
const SCAN_EXPIRED_SKIP_MAX: usize = 4096;

/// An engine snapshot a read is served from, with what it needs to hide expired keys.
struct ReadPoint {
    snap: phoenix_engine::Snapshot,
    /// Whether the group may hold key expiries (else none is looked up).
    expiries: bool,
    /// This node's clock when the read was taken: keys expired by then are absent (the
    /// leader's clock, as the writes' expiries are; see docs/resp.md on clocks).
    now: u64,
}

/// The `Kv` methods' work (the trait's methods count each answer, then return it).
impl Services {
    async fn serve_get(
        &self,
        req: Request<proto::GetRequest>,
    ) -> Result<Response<proto::GetResponse>, Status> {
        let r = req.into_inner();
        let _permit = try_err!(GetResponse, self.admit());
        let c = here_or_forward!(self, r, GetResponse, get, false, _permit);
        try_err!(GetResponse, self.check_key(&c, &r.key));
        try_err!(GetResponse, self.read_index(&c).await);
        let at = try_err!(GetResponse, self.read_snapshot(&c));
        let ro = ReadOptions {
            snapshot: Some(&at.snap),
            ..ReadOptions::default()
        };
        let mut v = try_err!(
            GetResponse,
            self.shared
                .engine
                .get(&ro, &keys::data_key(c.group, &r.key))
                .map_err(Self::engine_err)
        );
        if v.is_some() && try_err!(GetResponse, self.expired(&at, c.group, &r.key)) {
            v = None;
        }
        Ok(Response::new(proto::GetResponse {
            error: None,
            found: v.is_some(),
            value: v.map(Bytes::from).unwrap_or_default(),
        }))
    }

    async fn serve_put(
        &self,
        req: Request<proto::PutRequest>,
    ) -> Result<Response<proto::PutResponse>, Status> {
        let r = req.into_inner();
        try_err!(PutResponse, check_expiry(r.ttl_ms, r.keep_ttl));
        let _permit = try_err!(PutResponse, self.admit());
        let c = here_or_forward!(self, r, PutResponse, put, true, _permit);
        try_err!(PutResponse, self.check_key(&c, &r.key));
        try_err!(PutResponse, self.check_value(&r.value));
        let now = now_ms();
        let cmd = batch(vec![proto::Mutation {
            op: proto::MutationOp::Put as i32,
            key: r.key,
            value: r.value,
            expire_at_ms: try_err!(PutResponse, expire_at(now, r.ttl_ms)),
            keep_ttl: r.keep_ttl,
            ..proto::Mutation::default()
        }]);
        try_err!(PutResponse, self.propose_at(&c, cmd, now).await);
        Ok(Response::new(proto::PutResponse { error: None }))
    }

    async fn serve_delete(
        &self,
        req: Request<proto::DeleteRequest>,
    ) -> Result<Response<proto::DeleteResponse>, Status> {
        let r = req.into_inner();
        let _permit = try_err!(DeleteResponse, self.admit());
        let c = here_or_forward!(self, r, DeleteResponse, delete, true, _permit);
        try_err!(DeleteResponse, self.check_key(&c, &r.key));
        let cmd = batch(vec![proto::Mutation {
            op: proto::MutationOp::Delete as i32,
            key: r.key,
            ..proto::Mutation::default()
        }]);
        try_err!(DeleteResponse, self.propose(&c, cmd).await);
        Ok(Response::new(proto::DeleteResponse { error: None }))
    }

    async fn serve_batch_get(
        &self,
        req: Request<proto::BatchGetRequest>,
    ) -> Result<Response<proto::BatchGetResponse>, Status> {
        let r = req.into_inner();
        let _permit = try_err!(BatchGetResponse, self.admit());
        let c = here_or_forward!(self, r, BatchGetResponse, batch_get, false, _permit);
        if r.keys.len() > limits::BATCH_KEYS_MAX {
            try_err!(
                BatchGetResponse,
                Err(PErr::request_too_large(
                    "keys in BatchGet",
                    r.keys.len(),
                    limits::BATCH_KEYS_MAX
                ))
            );
        }
        for k in &r.keys {
            try_err!(BatchGetResponse, self.check_key(&c, k));
        }
        try_err!(BatchGetResponse, self.read_index(&c).await);
        let at = try_err!(BatchGetResponse, self.read_snapshot(&c));
        let ro = ReadOptions {
            snapshot: Some(&at.snap),
            ..ReadOptions::default()
        };
        let ekeys: Vec<Vec<u8>> = r.keys.iter().map(|k| keys::data_key(c.group, k)).collect();
        let refs: Vec<&[u8]> = ekeys.iter().map(|k| k.as_slice()).collect();
        let mut vals = try_err!(
            BatchGetResponse,
            self.shared
                .engine
                .multi_get(&ro, &refs)
                .map_err(Self::engine_err)
        );
        for (k, v) in r.keys.iter().zip(vals.iter_mut()) {
            if v.is_some() && try_err!(BatchGetResponse, self.expired(&at, c.group, k)) {
                *v = None;
            }
        }
        let results = r
            .keys
            .into_iter()
            .zip(vals)
            .map(|(key, v)| proto::GetResult {
                key,
                found: v.is_some(),
                value: v.map(Bytes::from).unwrap_or_default(),
            })
            .collect();
        Ok(Response::new(proto::BatchGetResponse {
            error: None,
            results,
        }))
    }

    async fn serve_batch_write(
        &self,
        req: Request<proto::BatchWriteRequest>,
    ) -> Result<Response<proto::BatchWriteResponse>, Status> {
        let r = req.into_inner();
        for m in &r.mutations {
            try_err!(BatchWriteResponse, check_expiry(m.ttl_ms, m.keep_ttl));
        }
        let _permit = try_err!(BatchWriteResponse, self.admit());
        let c = here_or_forward!(self, r, BatchWriteResponse, batch_write, true, _permit);
        if r.mutations.len() > limits::BATCH_KEYS_MAX {
            try_err!(
                BatchWriteResponse,
                Err(PErr::request_too_large(
                    "mutations in BatchWrite",
                    r.mutations.len(),
                    limits::BATCH_KEYS_MAX
                ))
            );
        }
        if r.mutations.is_empty() {
            try_err!(
                BatchWriteResponse,
                Err(PErr::invalid_argument("BatchWrite without mutations"))
            );
        }
        let mut total = 0usize;
        for m in &r.mutations {
            try_err!(BatchWriteResponse, self.check_key(&c, &m.key));
            if proto::MutationOp::try_from(m.op).is_err() {
                try_err!(
                    BatchWriteResponse,
                    Err(PErr::invalid_argument(format!(
                        "unknown mutation op {}",
                        m.op
                    )))
                );
            }
            try_err!(BatchWriteResponse, self.check_value(&m.value));
            if m.expire_at_ms != 0 {
                try_err!(
                    BatchWriteResponse,
                    Err(PErr::invalid_argument(
                        "a mutation's expire_at_ms is set by the leader: give ttl_ms",
                    ))
                );
            }
            total += m.key.len() + m.value.len();
        }
        if total > limits::MESSAGE_BYTES_MAX / 2 {
            try_err!(
                BatchWriteResponse,
                Err(PErr::request_too_large(
                    "bytes in BatchWrite",
                    total,
                    limits::MESSAGE_BYTES_MAX / 2
                ))
            );
        }
        let now = now_ms();
        let mut mutations = r.mutations;
        for m in &mut mutations {
            m.expire_at_ms = try_err!(BatchWriteResponse, expire_at(now, m.ttl_ms));
            m.ttl_ms = 0;
        }
        try_err!(
            BatchWriteResponse,
            self.propose_at(&c, batch(mutations), now).await
        );
        Ok(Response::new(proto::BatchWriteResponse { error: None }))
    }

    async fn serve_scan(
        &self,
        req: Request<proto::ScanRequest>,
    ) -> Result<Response<proto::ScanResponse>, Status> {
        let r = req.into_inner();
        let _permit = try_err!(ScanResponse, self.admit());
        let c = here_or_forward!(self, r, ScanResponse, scan, false, _permit);
        if r.start.len() > limits::KEY_BYTES_MAX || r.end.len() > limits::KEY_BYTES_MAX {
            try_err!(
                ScanResponse,
                Err(PErr::key_too_large(
                    r.start.len().max(r.end.len()),
                    limits::KEY_BYTES_MAX
                ))
            );
        }
        let limit = match r.limit {
            0 => limits::SCAN_LIMIT_DEFAULT,
            n => n.min(limits::SCAN_LIMIT_MAX),
        } as usize;
        // Clamp [start, end) to the group's range.
        let start = if r.start.as_ref() < c.route.start_key.as_ref() {
            c.route.start_key.clone()
        } else {
            r.start.clone()
        };
        let end = match (r.end.is_empty(), c.route.end_key.is_empty()) {
            (true, _) => c.route.end_key.clone(),
            (false, true) => r.end.clone(),
            (false, false) => {
                if r.end.as_ref() < c.route.end_key.as_ref() {
                    r.end.clone()
                } else {
                    c.route.end_key.clone()
                }
            }
        };
        if !in_range(&c.route, &start) {
            try_err!(
                ScanResponse,
                Err(PErr::key_not_in_group(
                    &start,
                    c.group,
                    Some(c.route.clone())
                ))
            );
        }
        self.shared.split.record(c.group, &start);
        try_err!(ScanResponse, self.read_index(&c).await);
        let at = try_err!(ScanResponse, self.read_snapshot(&c));
        let svc = self.clone();
        let g = c.group;
        let keys_only = r.keys_only;
        let res = tokio::task::spawn_blocking(
            move || -> Result<(Vec<proto::KvPair>, Option<Bytes>), PErr> {
                let ro = ReadOptions {
                    snapshot: Some(&at.snap),
                    lower_bound: Some(keys::data_key(g, &start)),
                    upper_bound: Some(if end.is_empty() {
                        keys::data_end(g)
                    } else {
                        keys::data_key(g, &end)
                    }),
                    ..ReadOptions::default()
                };
                let mut it = svc.shared.engine.iter(&ro).map_err(Services::engine_err)?;
                it.seek_to_first();
                let mut pairs = Vec::new();
                let mut bytes = 0usize;
                let mut next = None;
                // Expired keys not swept yet are passed over, but a page looks at no more
                // than this many of them: a range of them ends the page early (the client
                // goes on from `next_key`) instead of making one request walk them all.
                let mut skipped = 0usize;
                while it.valid() {
                    let user = Bytes::copy_from_slice(it.key().get(9..).unwrap_or_default());
                    if pairs.len() >= limit
                        || bytes >= limits::MESSAGE_BYTES_MAX / 2
                        || skipped >= SCAN_EXPIRED_SKIP_MAX
                    {
                        next = Some(user);
                        break;
                    }
                    if svc.expired(&at, g, &user)? {
                        skipped += 1;
                        it.next();
                        continue;
                    }
                    let value = if keys_only {
                        Bytes::new()
                    } else {
                        Bytes::copy_from_slice(it.value())
                    };
                    bytes += user.len() + value.len();
                    pairs.push(proto::KvPair { key: user, value });
                    it.next();
                }
                it.status().map_err(Services::engine_err)?;
                Ok((pairs, next))
            },
        )
        .await
        .map_err(|e| PErr::internal(format!("scan task: {e}")));
        let (pairs, next) = try_err!(ScanResponse, res.and_then(|r| r));
        Ok(Response::new(proto::ScanResponse {
            error: None,
            pairs,
            more: next.is_some(),
            next_key: next.unwrap_or_default(),
            group_end: c.route.end_key.clone(),
        }))
    }

    async fn serve_delete_range(
        &self,
        req: Request<proto::DeleteRangeRequest>,
    ) -> Result<Response<proto::DeleteRangeResponse>, Status> {
        let r = req.into_inner();
        let _permit = try_err!(DeleteRangeResponse, self.admit());
        let c = here_or_forward!(self, r, DeleteRangeResponse, delete_range, true, _permit);
        try_err!(DeleteRangeResponse, self.check_key(&c, &r.start));
        if !r.end.is_empty() {
            if r.end.len() > limits::KEY_BYTES_MAX {
                try_err!(
                    DeleteRangeResponse,
                    Err(PErr::key_too_large(r.end.len(), limits::KEY_BYTES_MAX))
                );
            }
            let past_end = !c.route.end_key.is_empty() && r.end.as_ref() > c.route.end_key.as_ref();
            if past_end {
                try_err!(
                    DeleteRangeResponse,
                    Err(PErr::key_not_in_group(
                        &r.end,
                        c.group,
                        Some(c.route.clone())
                    ))
                );
            }
        }
        let end = if r.end.is_empty() {
            c.route.end_key.clone()
        } else {
            r.end
        };
        let cmd = proto::KvCommand {
            now_ms: 0,
            epoch: 0,
            session: None,
            cmd: Some(proto::kv_command::Cmd::DeleteRange(proto::KeyRange {
                start: r.start,
                end,
            })),
        };
        try_err!(DeleteRangeResponse, self.propose(&c, cmd).await);
        Ok(Response::new(proto::DeleteRangeResponse { error: None }))
    }

    async fn serve_cas(
        &self,
        req: Request<proto::CasRequest>,
    ) -> Result<Response<proto::CasResponse>, Status> {
        let r = req.into_inner();
        if !r.delete {
            try_err!(CasResponse, check_expiry(r.ttl_ms, r.keep_ttl));
        }
        let _permit = try_err!(CasResponse, self.admit());
        let c = here_or_forward!(self, r, CasResponse, cas, true, _permit);
        try_err!(CasResponse, self.check_key(&c, &r.key));
        try_err!(CasResponse, self.check_value(&r.new_value));
        let now = now_ms();
        let cmd = proto::KvCommand {
            now_ms: 0,
            epoch: 0,
            session: None,
            cmd: Some(proto::kv_command::Cmd::Cas(proto::CasCommand {
                key: r.key,
                expect_exists: r.expect_exists,
                expected: r.expected,
                delete: r.delete,
                new_value: r.new_value,
                expire_at_ms: if r.delete {
                    0
                } else {
                    try_err!(CasResponse, expire_at(now, r.ttl_ms))
                },
                keep_ttl: r.keep_ttl && !r.delete,
            })),
        };
        match try_err!(CasResponse, self.propose_at(&c, cmd, now).await) {
            ApplyResult::Cas { succeeded, current } => Ok(Response::new(proto::CasResponse {
                error: None,
                succeeded,
                current_found: current.is_some(),
                current_value: current.map(Bytes::from).unwrap_or_default(),
            })),
            other => Ok(Response::new(proto::CasResponse {
                error: Some(PErr::internal(format!("unexpected apply result {other:?}"))),
                ..Default::default()
            })),
        }
    }

    async fn serve_incr(
        &self,
        req: Request<proto::IncrRequest>,
    ) -> Result<Response<proto::IncrResponse>, Status> {
        let r = req.into_inner();
        let _permit = try_err!(IncrResponse, self.admit());
        let c = here_or_forward!(self, r, IncrResponse, incr, true, _permit);
        try_err!(IncrResponse, self.check_key(&c, &r.key));
        let cmd = proto::KvCommand {
            now_ms: 0,
            epoch: 0,
            session: None,
            cmd: Some(proto::kv_command::Cmd::Incr(proto::IncrCommand {
                key: r.key,
                by: r.by,
            })),
        };
        match try_err!(IncrResponse, self.propose(&c, cmd).await) {
            ApplyResult::Incr(outcome) => Ok(Response::new(match outcome {
                Ok(value) => proto::IncrResponse {
                    error: None,
                    value,
                    failure: proto::IncrFailure::None as i32,
                },
                Err(f) => proto::IncrResponse {
                    error: None,
                    value: 0,
                    failure: f as i32,
                },
            })),
            other => Ok(Response::new(proto::IncrResponse {
                error: Some(PErr::internal(format!("unexpected apply result {other:?}"))),
                ..Default::default()
            })),
        }
    }

    async fn serve_expire(
        &self,
        req: Request<proto::ExpireRequest>,
    ) -> Result<Response<proto::ExpireResponse>, Status> {
        use proto::expire_request::When;
        let r = req.into_inner();
        let condition = try_err!(
            ExpireResponse,
            proto::ExpireCondition::try_from(r.condition).map_err(|_| {
                PErr::invalid_argument(format!("unknown expiry condition {}", r.condition))
            })
        );
        let _permit = try_err!(ExpireResponse, self.admit());
        let c = here_or_forward!(self, r, ExpireResponse, expire, true, _permit);
        try_err!(ExpireResponse, self.check_key(&c, &r.key));
        let now = now_ms();
        let at = match r.when {
            // Nothing left: now (the key is deleted, as by Redis' EXPIRE 0).
            Some(When::TtlMs(0)) => now.max(1),
            Some(When::TtlMs(ttl)) => try_err!(ExpireResponse, expire_at(now, ttl)),
            Some(When::AtMs(at)) => at.max(1),
            Some(When::Persist(true)) => {
                if condition != proto::ExpireCondition::ExpireAlways {
                    try_err!(
                        ExpireResponse,
                        Err(PErr::invalid_argument(
                            "removing an expiry takes no condition"
                        ))
                    );
                }
                0
            }
            Some(When::Persist(false)) | None => try_err!(
                ExpireResponse,
                Err(PErr::invalid_argument(
                    "an expiry change needs ttl_ms, at_ms or persist"
                ))
            ),
        };
        let cmd = proto::KvCommand {
            now_ms: 0,
            epoch: 0,
            session: None,
            cmd: Some(proto::kv_command::Cmd::Expire(proto::ExpireCommand {
                key: r.key,
                expire_at_ms: at,
                condition: condition as i32,
            })),
        };
        match try_err!(ExpireResponse, self.propose_at(&c, cmd, now).await) {
            ApplyResult::Expire(changed) => Ok(Response::new(proto::ExpireResponse {
                error: None,
                changed,
            })),
            other => Ok(Response::new(proto::ExpireResponse {
                error: Some(PErr::internal(format!("unexpected apply result {other:?}"))),
                ..Default::default()
            })),
        }
    }

    async fn serve_ttl(
        &self,
        req: Request<proto::TtlRequest>,
    ) -> Result<Response<proto::TtlResponse>, Status> {
        let r = req.into_inner();
        let _permit = try_err!(TtlResponse, self.admit());
        let c = here_or_forward!(self, r, TtlResponse, ttl, false, _permit);
        try_err!(TtlResponse, self.check_key(&c, &r.key));
        try_err!(TtlResponse, self.read_index(&c).await);
        let at = try_err!(TtlResponse, self.read_snapshot(&c));
        let ro = ReadOptions {
            snapshot: Some(&at.snap),
            ..ReadOptions::default()
        };
        let found = try_err!(
            TtlResponse,
            self.shared
                .engine
                .get(&ro, &keys::data_key(c.group, &r.key))
                .map_err(Self::engine_err)
        )
        .is_some();
        let expiry = if found {
            try_err!(TtlResponse, self.expiry(&at, c.group, &r.key))
        } else {
            None
        };
        Ok(Response::new(match expiry {
            Some(e) if e < at.now => proto::TtlResponse::default(),
            Some(e) => proto::TtlResponse {
                error: None,
                found: true,
                expire_at_ms: e,
                ttl_ms: e - at.now,
            },
            None => proto::TtlResponse {
                error: None,
                found,
                expire_at_ms: 0,
                ttl_ms: 0,
            },
        }))
    }
}
