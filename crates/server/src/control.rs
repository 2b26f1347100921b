//! The control plane inside servers: the `Meta` gRPC service, the node → meta
//! heartbeat task and the meta leader's scheduler.
//!
//! - `GetRoutes` / `GetCluster` are answered by the meta leader after a ReadIndex on
//!   group 0 (so a new leader never serves an older table); other nodes forward once to
//!   the meta leader they know (meta members) or to the meta members (other nodes).
//! - `Heartbeat` registers the node (a replicated `RegisterNode` when new or moved),
//!   records its stats and replica states (soft state) and answers with placement
//!   commands: create the replicas the routing table puts on the node that it does
//!   not report hosting.
//! - The scheduler (meta leader only) bootstraps the data groups once `replication`
//!   nodes are alive: one group, or one per range between `--split-keys`; then it
//!   balances leaders by count (`phoenix_meta::balance_leaders`).
//! - `TransferLeader` (meta leader; others forward) starts a leader transfer operator
//!   and waits for it. Operators reach the group's leader as heartbeat commands.
//!
//! The decisions (registration, placement, bootstrap plan, the served views) are
//! `phoenix_meta`'s; this module runs them on the node and carries them out.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use phoenix_meta::Origin;
use phoenix_proto as proto;
use prost::Message as _;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::config::MetaMember;
use crate::meta::META_GROUP;
use crate::node::{ApplyResult, Event};
use crate::shared::{GroupView, Shared};

type PErr = proto::Error;
type MetaClient = proto::meta_client::MetaClient<phoenix_proto::security::AuthChannel>;

/// The `Meta` gRPC service.
#[derive(Clone)]
pub struct MetaService {
    /// Shared node state.
    pub shared: Arc<Shared>,
}

/// A response message whose `error` field carries a request's failure.
pub(crate) trait ErrorReply: Default {
    /// The response that reports `err`.
    fn with_error(err: PErr) -> Self;
}

macro_rules! error_reply {
    ($($resp:ident),*) => {$(
        impl ErrorReply for proto::$resp {
            fn with_error(err: PErr) -> Self {
                proto::$resp {
                    error: Some(err),
                    ..Default::default()
                }
            }
        }
    )*};
}
error_reply!(
    GetRoutesResponse,
    GetClusterResponse,
    HeartbeatResponse,
    TransferLeaderResponse,
    AddReplicaResponse,
    RemoveReplicaResponse,
    DrainNodeResponse,
    SplitGroupResponse,
    ScrubGroupResponse,
    MergeGroupResponse
);

/// The gRPC answer to a request: its response, or one reporting its error (gRPC
/// statuses are for transport failures only).
pub(crate) fn reply<T: ErrorReply>(r: Result<T, PErr>) -> Result<Response<T>, Status> {
    Ok(Response::new(r.unwrap_or_else(T::with_error)))
}

fn timeout_of(ms: u64) -> Result<Duration, PErr> {
    if ms == 0 {
        return Err(PErr::invalid_argument("timeout_ms is required (got 0)"));
    }
    Ok(Duration::from_millis(ms.min(proto::limits::TIMEOUT_MS_MAX)))
}

async fn connect_meta(shared: &Shared, addr: &str, timeout: Duration) -> Result<MetaClient, PErr> {
    if shared.links.is_cut_addr(addr) {
        return Err(PErr::group_unavailable(
            META_GROUP,
            format!("cannot reach {addr}: link cut (fault injection)"),
        ));
    }
    let ep = shared
        .creds
        .endpoint(addr)
        .map_err(PErr::invalid_argument)?
        .connect_timeout(timeout.min(Duration::from_secs(2)))
        .timeout(timeout);
    let ch = ep
        .connect()
        .await
        .map_err(|e| PErr::group_unavailable(META_GROUP, format!("cannot reach {addr}: {e}")))?;
    Ok(MetaClient::new(shared.creds.authorize(ch)))
}

impl MetaService {
    /// Whether this node currently leads the meta group.
    fn is_meta_leader(&self) -> bool {
        self.shared
            .groups
            .read()
            .get(&META_GROUP)
            .is_some_and(|v| v.is_leader)
    }

    /// The routing table's version on this node: the index of the last meta entry
    /// applied to it (read with the table itself where both are sent, so they agree).
    fn meta_applied(&self) -> u64 {
        self.shared.meta.read().applied()
    }

    /// Where to forward a meta read: the known meta leader, else the meta members.
    fn forward_targets(&self) -> Vec<String> {
        let me = &self.shared.cfg.advertise;
        if let Some(v) = self.shared.groups.read().get(&META_GROUP) {
            // A meta member forwards only to the leader it knows (no forwarding loops:
            // members, even with a stopped replica, never ask each other at random).
            return self
                .shared
                .addr_of(v.leader)
                .into_iter()
                .filter(|a| a != me)
                .collect();
        }
        self.shared
            .meta_addrs()
            .into_iter()
            .filter(|a| a != me)
            .collect()
    }

    /// Answers a meta read here if this node leads the meta group, else forwards it
    /// once to the [`forward_targets`](Self::forward_targets) in turn, returning the
    /// first answer (its own error included) or the last failure to reach one.
    async fn leader_or_forward<T, L, F, Fut>(
        &self,
        timeout: Duration,
        local: L,
        call: F,
    ) -> Result<T, PErr>
    where
        L: Future<Output = Result<T, PErr>>,
        F: Fn(MetaClient) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        if self.is_meta_leader() {
            return local.await;
        }
        let mut last = PErr::group_unavailable(META_GROUP, "no meta leader known");
        for addr in self.forward_targets() {
            match connect_meta(&self.shared, &addr, timeout).await {
                Ok(c) => match call(c).await {
                    Ok(resp) => return Ok(resp.into_inner()),
                    // A meta leader older than this request's kind: asking again will
                    // not help.
                    Err(s) if s.code() == tonic::Code::Unimplemented => {
                        return Err(PErr::invalid_argument(format!(
                            "the meta leader at {addr} does not serve this request (an \
                             older version): {}",
                            s.message()
                        )))
                    }
                    Err(s) => last = PErr::group_unavailable(META_GROUP, format!("{addr}: {s}")),
                },
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Serves an operator request within its `timeout_ms`: here (`local`) if this node
    /// leads the meta group, else forwarded (`call`).
    async fn serve_operator<T, L, F, Fut>(
        &self,
        timeout_ms: u64,
        local: impl FnOnce(Duration) -> L,
        call: F,
    ) -> Result<Response<T>, Status>
    where
        T: ErrorReply,
        L: Future<Output = Result<T, PErr>>,
        F: Fn(MetaClient) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        reply(
            async {
                let timeout = timeout_of(timeout_ms)?;
                self.leader_or_forward(timeout, local(timeout), call).await
            }
            .await,
        )
    }

    /// Sends `event` (built around the reply channel) to the raft driver and waits for
    /// its answer within `timeout`.
    async fn ask_driver<T>(
        &self,
        timeout: Duration,
        event: impl FnOnce(oneshot::Sender<Result<T, PErr>>) -> Event,
    ) -> Result<T, PErr> {
        let (tx, rx) = oneshot::channel();
        self.shared
            .events
            .send(event(tx))
            .map_err(|_| PErr::group_unavailable(META_GROUP, "node shutting down"))?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(PErr::group_unavailable(META_GROUP, "request dropped")),
            Err(_) => Err(PErr::deadline_exceeded(timeout.as_millis() as u64)),
        }
    }

    async fn read_index(&self, timeout: Duration) -> Result<(), PErr> {
        self.ask_driver(timeout, |reply| Event::ReadIndex {
            group: META_GROUP,
            reply,
        })
        .await
    }

    async fn propose(
        &self,
        cmd: proto::MetaCommand,
        timeout: Duration,
    ) -> Result<ApplyResult, PErr> {
        self.ask_driver(timeout, |reply| Event::Propose {
            group: META_GROUP,
            data: Bytes::from(cmd.encode_to_vec()),
            reply,
        })
        .await
    }

    async fn local_routes(&self, timeout: Duration) -> Result<proto::GetRoutesResponse, PErr> {
        self.read_index(timeout).await?;
        let (routes, version) = {
            let meta = self.shared.meta.read();
            let lv = self.shared.leader_view.lock();
            (phoenix_meta::route_table(&meta, &lv), meta.applied())
        };
        Ok(proto::GetRoutesResponse {
            error: None,
            routes,
            version,
        })
    }

    /// The routing table as this meta member applied it, without asking the meta
    /// leader; leaders as this node knows them (its own groups) or as the meta leader
    /// last reported them. None if this node holds no live meta replica or no table.
    fn member_routes(&self) -> Option<proto::GetRoutesResponse> {
        {
            let groups = self.shared.groups.read();
            let v = groups.get(&META_GROUP)?;
            if v.failed.is_some() {
                return None;
            }
        }
        let (mut routes, version) = {
            let meta = self.shared.meta.read();
            let lv = self.shared.leader_view.lock();
            (phoenix_meta::route_table(&meta, &lv), meta.applied())
        };
        if version == 0 {
            return None;
        }
        if routes.is_empty() {
            return None;
        }
        let groups = self.shared.groups.read();
        for r in &mut routes {
            if let Some(v) = groups.get(&r.group_id).filter(|v| v.failed.is_none()) {
                if v.leader != 0 {
                    r.leader_node_id = v.leader;
                    r.leader_addr = self.shared.addr_of(v.leader).unwrap_or_default();
                }
            }
        }
        Some(proto::GetRoutesResponse {
            error: None,
            routes,
            version,
        })
    }

    async fn local_cluster(&self, timeout: Duration) -> Result<proto::GetClusterResponse, PErr> {
        self.read_index(timeout).await?;
        let now = Instant::now();
        let meta = self.shared.meta.read();
        let lv = self.shared.leader_view.lock();
        let mut view = phoenix_meta::cluster_view(&meta, &lv, now, self.shared.cfg.node_id);
        view.operators = self.shared.operators.lock().list(now);
        // Splits planned and not recorded yet (their plans are in the replicated state).
        view.operators
            .extend(meta.splits().values().map(|p| proto::Operator {
                group_id: p.group_id,
                kind: proto::OperatorKind::Split as i32,
                origin: p.origin,
                from_node: 0,
                to_node: 0,
                age_ms: 0,
                step: format!(
                    "into group {} at {}",
                    p.new_group_id,
                    p.split_key.escape_ascii()
                ),
                into_group: 0,
            }));
        view.operators
            .extend(meta.merges().values().map(|p| proto::Operator {
                group_id: p.source,
                kind: proto::OperatorKind::Merge as i32,
                origin: p.origin,
                from_node: 0,
                to_node: 0,
                age_ms: 0,
                step: format!(
                    "into group {}: {}",
                    p.target,
                    match proto::MergePhase::try_from(p.phase) {
                        Ok(proto::MergePhase::Commit) => "commit",
                        Ok(proto::MergePhase::Rollback) => "rollback",
                        _ => "prepare",
                    }
                ),
                into_group: p.target,
            }));
        Ok(view)
    }

    /// Starts an operator here (the meta leader) with `start` and waits until it is
    /// done, within `timeout`: `start` returns false once there is nothing left to do
    /// (asking again for an operator under way is not an error). Errors that time
    /// mends (no leader yet, another operator on the group; a node not heard from or an
    /// unreported replica while this meta leader is new) are waited out; the others
    /// are refusals. `late` says where it stands when the time is up.
    async fn run_operator<T>(
        &self,
        group: u64,
        timeout: Duration,
        start: impl Fn(
            &phoenix_meta::MetaState,
            &phoenix_meta::LeaderView,
            &mut phoenix_meta::Operators,
        ) -> Result<bool, phoenix_meta::OperatorError>,
        done: impl Fn(&phoenix_meta::MetaState, &phoenix_meta::LeaderView) -> T,
        late: impl Fn(&Shared) -> String,
    ) -> Result<T, PErr> {
        use phoenix_meta::OperatorError as E;
        // The answer must leave time to travel back through a forwarding node.
        let deadline = tokio::time::Instant::now() + timeout * 4 / 5;
        self.read_index(timeout).await?;
        loop {
            if !self.is_meta_leader() {
                return Err(PErr::group_unavailable(
                    META_GROUP,
                    "no longer the meta leader (ask again)",
                ));
            }
            // (A meta leader new in office knows its own membership before any heartbeat.)
            self.refresh_meta_view();
            let started = {
                let meta = self.shared.meta.read();
                let lv = self.shared.leader_view.lock();
                let mut ops = self.shared.operators.lock();
                match start(&meta, &lv, &mut ops) {
                    Ok(false) => return Ok(done(&meta, &lv)),
                    other => other,
                }
            };
            // A meta leader new in office hears every node within ALIVE_WITHIN: until
            // then a node looks down and a replica unreported for want of a heartbeat.
            let young = self
                .shared
                .meta_leader_since
                .lock()
                .is_none_or(|t| t.elapsed() < phoenix_meta::ALIVE_WITHIN);
            let in_time = tokio::time::Instant::now() < deadline;
            match started {
                Ok(_) => {}
                Err(e @ (E::NoLeader(_) | E::Busy { .. })) if in_time => {
                    tracing::debug!(group, "operator waits: {e}");
                }
                Err(
                    e @ (E::NodeDown(_)
                    | E::ReplicaNotReported { .. }
                    | E::OldMetaMember(_)
                    | E::NoQuorumAfter { .. }),
                ) if young && in_time => {
                    tracing::debug!(group, "operator waits for heartbeats: {e}");
                }
                Err(e @ (E::NoLeader(_) | E::Busy { .. })) => {
                    return Err(PErr::group_unavailable(group, e))
                }
                Err(e) => return Err(PErr::invalid_argument(e.to_string())),
            }
            if !in_time {
                return Err(PErr::group_unavailable(
                    group,
                    format!("{} within {} ms", late(&self.shared), timeout.as_millis()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Adds a replica of `group` on node `to` ([`run_operator`](Self::run_operator)):
    /// done when the routing table lists it as a voter.
    async fn local_add_replica(
        &self,
        group: u64,
        to: u64,
        timeout: Duration,
    ) -> Result<proto::AddReplicaResponse, PErr> {
        let members: Vec<u64> = self.shared.meta_member_ids();
        operator_target("add-replica", to)?;
        self.run_operator(
            group,
            timeout,
            |meta, lv, ops| {
                ops.add_replica(
                    meta,
                    lv,
                    &members,
                    group,
                    to,
                    Instant::now(),
                    Origin::Request,
                )
            },
            |meta, lv| proto::AddReplicaResponse {
                error: None,
                route: phoenix_meta::route_of(meta, lv, group).cloned(),
            },
            |shared| {
                let step = shared
                    .operators
                    .lock()
                    .add_step(group)
                    .map_or("ended".to_string(), |s| format!("{s:?}"));
                format!("replica on node {to} not a voter (still under way: {step})")
            },
        )
        .await
    }

    /// Removes the replica of `group` on `node` ([`run_operator`](Self::run_operator)):
    /// done when the routing table no longer lists it.
    async fn local_remove_replica(
        &self,
        group: u64,
        node: u64,
        timeout: Duration,
    ) -> Result<proto::RemoveReplicaResponse, PErr> {
        let members: Vec<u64> = self.shared.meta_member_ids();
        operator_target("remove-replica", node)?;
        self.run_operator(
            group,
            timeout,
            |meta, lv, ops| {
                let now = Instant::now();
                ops.remove_replica(meta, lv, &members, group, node, now, Origin::Request)
            },
            |meta, lv| proto::RemoveReplicaResponse {
                error: None,
                route: phoenix_meta::route_of(meta, lv, group).cloned(),
            },
            |shared| {
                let step = shared
                    .operators
                    .lock()
                    .remove_step(group)
                    .map_or("ended".to_string(), |s| format!("{s:?}"));
                format!("replica on node {node} still in the group (under way: {step})")
            },
        )
        .await
    }

    /// Marks node `node` draining (or not, with `cancel`) in the meta group's log: repair
    /// then moves its replicas off ([`phoenix_meta::repair_replicas`]).
    async fn local_drain_node(
        &self,
        node: u64,
        cancel: bool,
        timeout: Duration,
    ) -> Result<proto::DrainNodeResponse, PErr> {
        if node == 0 {
            return Err(PErr::invalid_argument("drain needs a node id (not 0)"));
        }
        let members: Vec<u64> = self.shared.meta_member_ids();
        {
            let meta = self.shared.meta.read();
            if !meta.nodes().contains_key(&node) {
                return Err(PErr::invalid_argument(format!(
                    "node {node} is not registered"
                )));
            }
            if let Some(m) = meta.member_behind(&members, phoenix_meta::PROTOCOL_NODE_STATE) {
                return Err(PErr::invalid_argument(format!(
                    "meta member {m} runs an older binary that cannot record a drain: \
                     upgrade it first"
                )));
            }
        }
        let cmd = proto::MetaCommand {
            cmd: Some(proto::meta_command::Cmd::SetNodeState(proto::NodeState {
                node_id: node,
                draining: !cancel,
            })),
        };
        match self.propose(cmd, timeout).await? {
            ApplyResult::Done => {}
            ApplyResult::Refused(why) => return Err(PErr::invalid_argument(why)),
            other => {
                return Err(PErr::internal(format!(
                    "unexpected answer to a node state: {other:?}"
                )))
            }
        }
        tracing::info!(node, draining = !cancel, "node state set");
        let meta = self.shared.meta.read();
        let lv = self.shared.leader_view.lock();
        // (Its meta replica counts: repair replaces it too.)
        let replicas = meta
            .routes()
            .values()
            .chain(lv.meta_route())
            .filter(|r| r.replicas.iter().any(|x| x.node_id == node))
            .count() as u64;
        Ok(proto::DrainNodeResponse {
            error: None,
            replicas,
        })
    }

    /// Moves `group`'s leadership to `to` ([`run_operator`](Self::run_operator)): done
    /// when the view shows `to` leading, as soon as the target's node reports it.
    async fn local_transfer_leader(
        &self,
        group: u64,
        to: u64,
        timeout: Duration,
    ) -> Result<proto::TransferLeaderResponse, PErr> {
        operator_target("transfer-leader", to)?;
        self.run_operator(
            group,
            timeout,
            |meta, lv, ops| {
                ops.transfer_leader(meta, lv, group, to, Instant::now(), Origin::Request)
            },
            |_, _| proto::TransferLeaderResponse {
                error: None,
                leader_node_id: to,
            },
            |shared| {
                let leader = shared.leader_view.lock().leader(group).unwrap_or(0);
                format!("leadership not on node {to} (leader: node {leader})")
            },
        )
        .await
    }

    /// Splits `group` at `key`: plans it in the meta group's log (reserving the new
    /// group's id), then waits until the group applied it and the routing table holds
    /// both routes. The group's leader is asked with its heartbeats.
    async fn local_split_group(
        &self,
        group: u64,
        key: Vec<u8>,
        timeout: Duration,
    ) -> Result<proto::SplitGroupResponse, PErr> {
        let deadline = tokio::time::Instant::now() + timeout * 4 / 5;
        if group == META_GROUP {
            return Err(PErr::invalid_argument("the meta group does not split"));
        }
        if key.len() > phoenix_proto::limits::KEY_BYTES_MAX {
            return Err(PErr::key_too_large(
                key.len(),
                phoenix_proto::limits::KEY_BYTES_MAX,
            ));
        }
        self.read_index(timeout).await?;
        // Another split planned meanwhile (a user's, the split check's) may take the new
        // group id this plan names: then it is planned again with the next one, until
        // the request's time is up.
        let new_group = loop {
            let plan = {
                let meta = self.shared.meta.read();
                let route = meta.routes().get(&group).ok_or_else(|| {
                    PErr::invalid_argument(format!("group {group} is not in the routing table"))
                })?;
                // Asked again after it was done (an answer lost on the way): done. (The
                // right group starts at the key and came from the same split: same epoch.)
                if route.epoch > 1 && !key.is_empty() && route.end_key.as_ref() == key.as_slice() {
                    if let Some(right) = meta
                        .routes()
                        .values()
                        .find(|r| r.start_key.as_ref() == key.as_slice() && r.epoch == route.epoch)
                    {
                        return Ok(proto::SplitGroupResponse {
                            error: None,
                            left: Some(route.clone()),
                            right: Some(right.clone()),
                        });
                    }
                }
                // The meta replicas record the plan; the group's replicas apply the split.
                let mut nodes: Vec<u64> = self.shared.meta_member_ids();
                nodes.extend(route.replicas.iter().map(|r| r.node_id));
                // (So do replicas being added: a learner not yet in the route.)
                nodes.extend(self.shared.operators.lock().add_target(group));
                if let Some(m) = meta.member_behind(&nodes, phoenix_meta::PROTOCOL_SPLIT) {
                    return Err(PErr::invalid_argument(format!(
                        "node {m} runs an older binary that cannot split groups: upgrade it first"
                    )));
                }
                match meta.splits().get(&group) {
                    Some(p) if p.split_key.as_ref() == key.as_slice() => None,
                    Some(p) => {
                        return Err(PErr::group_unavailable(
                            group,
                            format!(
                                "a split of it at {:02x?} into group {} is under way",
                                p.split_key, p.new_group_id
                            ),
                        ))
                    }
                    None => Some(proto::SplitPlan {
                        group_id: group,
                        split_key: key.clone().into(),
                        new_group_id: meta.next_group_id(),
                        epoch: route.epoch,
                        origin: proto::OperatorOrigin::Request as i32,
                    }),
                }
            };
            break match plan {
                Some(plan) => {
                    let id = plan.new_group_id;
                    let cmd = proto::MetaCommand {
                        cmd: Some(proto::meta_command::Cmd::PlanSplit(plan)),
                    };
                    match self.propose(cmd, timeout).await? {
                        ApplyResult::Done => {}
                        ApplyResult::Refused(why) => {
                            let taken = self.shared.meta.read().next_group_id() > id;
                            if taken && tokio::time::Instant::now() < deadline {
                                tracing::debug!(
                                    group,
                                    id,
                                    "split plan's new group id taken; again"
                                );
                                continue;
                            }
                            return Err(PErr::invalid_argument(why));
                        }
                        other => {
                            return Err(PErr::internal(format!(
                                "unexpected answer to a split plan: {other:?}"
                            )))
                        }
                    }
                    tracing::info!(group, new_group = id, "split planned");
                    self.shared.report_soon.notify_one();
                    id
                }
                None => self
                    .shared
                    .meta
                    .read()
                    .splits()
                    .get(&group)
                    .map_or(0, |p| p.new_group_id),
            };
        };
        loop {
            {
                let meta = self.shared.meta.read();
                if let (Some(left), Some(right)) =
                    (meta.routes().get(&group), meta.routes().get(&new_group))
                {
                    return Ok(proto::SplitGroupResponse {
                        error: None,
                        left: Some(left.clone()),
                        right: Some(right.clone()),
                    });
                }
            }
            if !self.is_meta_leader() {
                return Err(PErr::group_unavailable(
                    META_GROUP,
                    "no longer the meta leader (the split goes on; ask again to wait)",
                ));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(PErr::group_unavailable(
                    group,
                    format!(
                        "split into group {new_group} planned, not applied within {} ms \
                         (it goes on; ask again to wait)",
                        timeout.as_millis()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Merges group `source` into its neighbour `target` (the meta leader's half:
    /// `phoenix_meta::merge`): records the plan, then waits until the routing table
    /// holds the merged group (the scheduler moves the plan through its phases).
    async fn local_merge_group(
        &self,
        source: u64,
        target: u64,
        timeout: Duration,
    ) -> Result<proto::MergeGroupResponse, PErr> {
        let deadline = tokio::time::Instant::now() + timeout * 4 / 5;
        if source == META_GROUP || target == META_GROUP {
            return Err(PErr::invalid_argument("the meta group does not merge"));
        }
        self.read_index(timeout).await?;
        let plan = {
            let meta = self.shared.meta.read();
            let routes = meta.routes();
            match meta.merges().get(&source) {
                Some(p) if p.target == target => None,
                Some(p) => {
                    return Err(PErr::group_unavailable(
                        source,
                        format!("a merge of it into group {} is under way", p.target),
                    ))
                }
                // Asked again after it was done (an answer lost on the way): done.
                None if !routes.contains_key(&source) && routes.contains_key(&target) => {
                    return Ok(proto::MergeGroupResponse {
                        error: None,
                        route: routes.get(&target).cloned(),
                    });
                }
                None => {
                    let (Some(s), Some(t)) = (routes.get(&source), routes.get(&target)) else {
                        return Err(PErr::invalid_argument(format!(
                            "group {} is not in the routing table",
                            if routes.contains_key(&source) {
                                target
                            } else {
                                source
                            }
                        )));
                    };
                    let mut nodes: Vec<u64> = self.shared.meta_member_ids();
                    nodes.extend(s.replicas.iter().map(|r| r.node_id));
                    if let Some(m) = meta.member_behind(&nodes, phoenix_meta::PROTOCOL_MERGE) {
                        return Err(PErr::invalid_argument(format!(
                            "node {m} runs an older binary that cannot merge groups: upgrade it first"
                        )));
                    }
                    let lv = self.shared.leader_view.lock();
                    if let Some(r) = [s, t]
                        .into_iter()
                        .find(|r| phoenix_meta::settled_leader(&lv, r).is_none())
                    {
                        return Err(PErr::group_unavailable(
                            r.group_id,
                            "its leader has not reported it as routed (no leader, a \
                             membership change or a split under way): merge when it has",
                        ));
                    }
                    // The merged group would be split again at once, and the copy of the
                    // source runs on every replica's raft thread.
                    let limit = self.shared.cfg.group_split_bytes;
                    let bytes = [s, t]
                        .into_iter()
                        .filter_map(|r| phoenix_meta::settled_leader(&lv, r))
                        .map(|rep| rep.approximate_bytes)
                        .sum::<u64>();
                    if limit > 0 && bytes >= limit {
                        return Err(PErr::invalid_argument(format!(
                            "the two groups hold about {} MiB together, over the split size \
                             ({} MiB): the merged group would split again",
                            bytes >> 20,
                            limit >> 20
                        )));
                    }
                    let ops = self.shared.operators.lock();
                    if let Some(g) = [source, target]
                        .into_iter()
                        .find(|g| ops.changes_membership(*g))
                    {
                        return Err(PErr::group_unavailable(
                            g,
                            "a replica of it is being added or removed: merge when that is done",
                        ));
                    }
                    Some(proto::MergePlan {
                        source,
                        target,
                        source_epoch: s.epoch,
                        target_epoch: t.epoch,
                        phase: proto::MergePhase::Prepare as i32,
                        prepare_index: 0,
                        origin: proto::OperatorOrigin::Request as i32,
                    })
                }
            }
        };
        if let Some(plan) = plan {
            let cmd = proto::MetaCommand {
                cmd: Some(proto::meta_command::Cmd::PlanMerge(plan)),
            };
            match self.propose(cmd, timeout).await? {
                ApplyResult::Done => {}
                ApplyResult::Refused(why) => return Err(PErr::invalid_argument(why)),
                other => {
                    return Err(PErr::internal(format!(
                        "unexpected answer to a merge plan: {other:?}"
                    )))
                }
            }
            tracing::info!(source, target, "merge planned");
            self.shared.report_soon.notify_one();
        }
        loop {
            {
                let meta = self.shared.meta.read();
                match meta.merges().get(&source) {
                    None if !meta.routes().contains_key(&source) => {
                        return Ok(proto::MergeGroupResponse {
                            error: None,
                            route: meta.routes().get(&target).cloned(),
                        });
                    }
                    None => {
                        return Err(PErr::group_unavailable(
                            source,
                            "the merge was rolled back (a replica did not freeze in time)",
                        ))
                    }
                    Some(p) if p.phase == proto::MergePhase::Rollback as i32 => {
                        return Err(PErr::group_unavailable(
                            source,
                            "the merge is being rolled back (a replica did not freeze in time)",
                        ))
                    }
                    Some(_) => {}
                }
            }
            if !self.is_meta_leader() {
                return Err(PErr::group_unavailable(
                    META_GROUP,
                    "no longer the meta leader (the merge goes on; ask again to wait)",
                ));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(PErr::group_unavailable(
                    source,
                    format!(
                        "merge into group {target} planned, not done within {} ms \
                         (it goes on; ask again to wait)",
                        timeout.as_millis()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Scrubs `group` (the meta leader's half: `phoenix_meta::Scrubs`): asks its leader
    /// for a scrub point and waits until every voter reported the same one.
    async fn local_scrub_group(
        &self,
        group: u64,
        timeout: Duration,
    ) -> Result<proto::ScrubGroupResponse, PErr> {
        let deadline = tokio::time::Instant::now() + timeout * 4 / 5;
        if group == META_GROUP {
            return Err(PErr::invalid_argument(
                "the meta group is not scrubbed (its replicas hold no user data)",
            ));
        }
        self.read_index(timeout).await?;
        let mut before = None;
        loop {
            {
                let meta = self.shared.meta.read();
                if !meta.routes().contains_key(&group) {
                    return Err(PErr::invalid_argument(format!(
                        "group {group} is not in the routing table"
                    )));
                }
                let lv = self.shared.leader_view.lock();
                let now = Instant::now();
                match before {
                    // (Asked once every replica on a live node has reported the group.)
                    None => {
                        before = self
                            .shared
                            .scrub_schedule
                            .lock()
                            .ask(&meta, &lv, group, now);
                        if before.is_some() {
                            tracing::info!(group, "scrub asked for");
                        }
                    }
                    Some(b) => {
                        let r = self
                            .shared
                            .scrub_schedule
                            .lock()
                            .outcome(&meta, &lv, group, b, now);
                        if let Some(r) = r {
                            return Ok(r);
                        }
                    }
                }
            }
            if !self.is_meta_leader() {
                return Err(PErr::group_unavailable(
                    META_GROUP,
                    "no longer the meta leader (ask again)",
                ));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(PErr::group_unavailable(
                    group,
                    match before {
                        None => format!(
                            "scrub not asked within {} ms: a replica on a live node has not \
                             reported the group yet",
                            timeout.as_millis()
                        ),
                        Some(_) => format!(
                            "scrub asked for, not reported by every replica within {} ms (a \
                             replica behind, or one that took a snapshot past the point)",
                            timeout.as_millis()
                        ),
                    },
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn heartbeat_local(
        &self,
        r: proto::HeartbeatRequest,
        timeout: Duration,
    ) -> Result<proto::HeartbeatResponse, PErr> {
        let register = phoenix_meta::registration(&self.shared.meta.read(), &r)
            .map_err(|e| PErr::invalid_argument(e.to_string()))?;
        if let Some(cmd) = register {
            match self.propose(cmd, timeout).await? {
                ApplyResult::Refused(why) => {
                    return Err(PErr::invalid_argument(format!("node {}: {why}", r.node_id)))
                }
                _ => tracing::info!(node = r.node_id, addr = %r.addr, "node registered"),
            }
            // Deposed while the registration committed: the view below would be an
            // old leader's (its membership could tell a re-added member to drop).
            if !self.is_meta_leader() {
                return Err(PErr::group_unavailable(
                    META_GROUP,
                    "no longer the meta leader (ask again)",
                ));
            }
        }
        self.shared.addrs.write().insert(r.node_id, r.addr.clone());
        let report = phoenix_meta::Report {
            seq: r.report_seq,
            base: (r.report_base != 0).then_some(r.report_base),
            removed: r.removed_groups,
        };
        let meta_route = self.refresh_meta_view();
        let (held, commands, disk_full_nodes, nodes) = {
            let meta = self.shared.meta.read();
            let mut lv = self.shared.leader_view.lock();
            if r.node_id != self.shared.cfg.node_id {
                // (This node's own is fresher: `refresh_meta_view`.)
                lv.record_meta_replica(r.node_id, r.meta_replica);
            }
            let held = lv.record_report(
                Instant::now(),
                r.node_id,
                r.stats.unwrap_or_default(),
                &r.replicas,
                &report,
            );
            // Placement waits for a whole view of the node (the next report): from a
            // partial one, every replica it did not name would look missing.
            let mut commands = if held {
                phoenix_meta::placement_commands_quiet(&meta, &mut lv, r.node_id)
            } else {
                Vec::new()
            };
            let mut ops = self.shared.operators.lock();
            settle_operators(&mut ops, &meta, &lv);
            commands.extend(ops.commands_for(&lv, r.node_id));
            let mut scrubs = self.shared.scrub_schedule.lock();
            commands.extend(scrubs.take_commands(&lv, r.node_id, Instant::now()));
            let nodes: Vec<proto::Replica> = meta.nodes().values().cloned().collect();
            (held, commands, lv.disk_full_nodes(), nodes)
        };
        Ok(proto::HeartbeatResponse {
            error: None,
            commands,
            routes_version: self.meta_applied(),
            report_held: held,
            disk_full_nodes,
            nodes,
            meta_members: meta_route.map(|r| r.replicas).unwrap_or_default(),
        })
    }

    /// Puts the meta group's membership and this node's meta replica, as they stand
    /// now, in the meta leader's view (the operators' steps on the meta group follow
    /// them at once, not at the next heartbeat); returns the membership.
    fn refresh_meta_view(&self) -> Option<proto::Route> {
        let (route, term) = self.meta_route()?;
        let mine = {
            let groups = self.shared.groups.read();
            groups
                .get(&META_GROUP)
                .map(|v| replica_stats(&self.shared, META_GROUP, v))
        };
        let mut lv = self.shared.leader_view.lock();
        lv.set_meta_route(route.clone(), term);
        lv.record_meta_replica(self.shared.cfg.node_id, mine);
        Some(route)
    }

    /// The meta group's membership as this node's meta replica applied it, with the
    /// addresses filled in and this node as leader, and its term; None if it hosts no
    /// running one.
    fn meta_route(&self) -> Option<(proto::Route, u64)> {
        let (mut route, term) = {
            let groups = self.shared.groups.read();
            let v = groups.get(&META_GROUP).filter(|v| v.failed.is_none())?;
            (v.route.clone(), v.term)
        };
        for r in &mut route.replicas {
            if r.addr.is_empty() {
                r.addr = self.shared.addr_of(r.node_id).unwrap_or_default();
            }
        }
        route.group_id = META_GROUP;
        route.leader_node_id = self.shared.cfg.node_id;
        route.leader_addr = self.shared.cfg.advertise.clone();
        Some((route, term))
    }
}

#[tonic::async_trait]
impl proto::meta_server::Meta for MetaService {
    async fn get_routes(
        &self,
        req: Request<proto::GetRoutesRequest>,
    ) -> Result<Response<proto::GetRoutesResponse>, Status> {
        let r = req.into_inner();
        reply(
            async {
                let timeout = timeout_of(r.timeout_ms)?;
                // Half the time for the meta leader, the rest for the fallback below.
                let forwarded = proto::GetRoutesRequest {
                    timeout_ms: (r.timeout_ms / 2).max(1),
                };
                let asked = self.leader_or_forward(
                    timeout / 2,
                    self.local_routes(timeout),
                    |mut c| async move { c.get_routes(forwarded).await },
                );
                if self.is_meta_leader() {
                    return asked.await;
                }
                // A meta member answers from its own applied table when the meta leader
                // cannot answer in time (it is being elected, paused, cut off): routes
                // are hints, every data node checks a request's epoch and range.
                match tokio::time::timeout(timeout / 2, asked).await {
                    Ok(Ok(resp)) => Ok(resp),
                    failed => match self.member_routes() {
                        Some(resp) => Ok(resp),
                        None => match failed {
                            Ok(Err(e)) => Err(e),
                            _ => Err(PErr::deadline_exceeded(timeout.as_millis() as u64)),
                        },
                    },
                }
            }
            .await,
        )
    }

    async fn get_cluster(
        &self,
        req: Request<proto::GetClusterRequest>,
    ) -> Result<Response<proto::GetClusterResponse>, Status> {
        let r = req.into_inner();
        reply(
            async {
                let timeout = timeout_of(r.timeout_ms)?;
                self.leader_or_forward(timeout, self.local_cluster(timeout), |mut c| async move {
                    c.get_cluster(r).await
                })
                .await
            }
            .await,
        )
    }

    async fn transfer_leader(
        &self,
        req: Request<proto::TransferLeaderRequest>,
    ) -> Result<Response<proto::TransferLeaderResponse>, Status> {
        let r = req.into_inner();
        self.serve_operator(
            r.timeout_ms,
            |timeout| self.local_transfer_leader(r.group_id, r.to_node, timeout),
            |mut c| async move { c.transfer_leader(r).await },
        )
        .await
    }

    async fn add_replica(
        &self,
        req: Request<proto::AddReplicaRequest>,
    ) -> Result<Response<proto::AddReplicaResponse>, Status> {
        let r = req.into_inner();
        self.serve_operator(
            r.timeout_ms,
            |timeout| self.local_add_replica(r.group_id, r.node_id, timeout),
            |mut c| async move { c.add_replica(r).await },
        )
        .await
    }

    async fn remove_replica(
        &self,
        req: Request<proto::RemoveReplicaRequest>,
    ) -> Result<Response<proto::RemoveReplicaResponse>, Status> {
        let r = req.into_inner();
        self.serve_operator(
            r.timeout_ms,
            |timeout| self.local_remove_replica(r.group_id, r.node_id, timeout),
            |mut c| async move { c.remove_replica(r).await },
        )
        .await
    }

    async fn drain_node(
        &self,
        req: Request<proto::DrainNodeRequest>,
    ) -> Result<Response<proto::DrainNodeResponse>, Status> {
        let r = req.into_inner();
        self.serve_operator(
            r.timeout_ms,
            |timeout| self.local_drain_node(r.node_id, r.cancel, timeout),
            |mut c| async move { c.drain_node(r).await },
        )
        .await
    }

    async fn scrub_group(
        &self,
        req: Request<proto::ScrubGroupRequest>,
    ) -> Result<Response<proto::ScrubGroupResponse>, Status> {
        let r = req.into_inner();
        let (group, timeout_ms) = (r.group_id, r.timeout_ms);
        self.serve_operator(
            timeout_ms,
            |timeout| self.local_scrub_group(group, timeout),
            move |mut c| async move { c.scrub_group(r).await },
        )
        .await
    }

    async fn merge_group(
        &self,
        req: Request<proto::MergeGroupRequest>,
    ) -> Result<Response<proto::MergeGroupResponse>, Status> {
        let r = req.into_inner();
        let (source, target, timeout_ms) = (r.source, r.target, r.timeout_ms);
        self.serve_operator(
            timeout_ms,
            |timeout| self.local_merge_group(source, target, timeout),
            move |mut c| async move { c.merge_group(r).await },
        )
        .await
    }

    async fn split_group(
        &self,
        req: Request<proto::SplitGroupRequest>,
    ) -> Result<Response<proto::SplitGroupResponse>, Status> {
        let r = req.into_inner();
        let (group, key, timeout_ms) = (r.group_id, r.split_key.to_vec(), r.timeout_ms);
        self.serve_operator(
            timeout_ms,
            |timeout| self.local_split_group(group, key, timeout),
            move |mut c| {
                let r = r.clone();
                async move { c.split_group(r).await }
            },
        )
        .await
    }

    async fn heartbeat(
        &self,
        req: Request<proto::HeartbeatRequest>,
    ) -> Result<Response<proto::HeartbeatResponse>, Status> {
        // Only nodes report, with what they present to each other: a client's token must
        // not register a node (it would be given replicas, and its protocol level gates
        // the commands every group may be sent).
        self.shared.cfg.security.gate().for_peers().check(&req)?;
        let r = req.into_inner();
        reply(
            async {
                let timeout = timeout_of(r.timeout_ms)?;
                if self.shared.links.is_cut(r.node_id) {
                    // Lost in the partition (fault injection).
                    return Err(PErr::group_unavailable(
                        META_GROUP,
                        format!("link to node {} cut (fault injection)", r.node_id),
                    ));
                }
                if !self.is_meta_leader() {
                    let leader = self
                        .shared
                        .groups
                        .read()
                        .get(&META_GROUP)
                        .map_or(0, |v| v.leader);
                    return Err(PErr::not_leader(META_GROUP, self.shared.replica_of(leader)));
                }
                self.heartbeat_local(r, timeout).await
            }
            .await,
        )
    }
}

/// This node's stats for a heartbeat: the node's, its data replicas', and its meta
/// replica's if it hosts one.
fn node_stats(
    shared: &Shared,
) -> (
    proto::NodeStats,
    Vec<proto::ReplicaStats>,
    Option<proto::ReplicaStats>,
) {
    let groups = shared.groups.read();
    let meta_replica = groups
        .get(&META_GROUP)
        .map(|v| replica_stats(shared, META_GROUP, v));
    let replicas: Vec<proto::ReplicaStats> = groups
        .iter()
        .filter(|(g, _)| **g != META_GROUP)
        .map(|(g, v)| replica_stats(shared, *g, v))
        .collect();
    let es = shared.engine.stats();
    let stats = proto::NodeStats {
        groups: replicas.len() as u64,
        leaders: replicas.iter().filter(|r| r.is_leader).count() as u64,
        engine_bytes: es.levels.iter().map(|l| l.bytes).sum::<u64>() + es.memtable_bytes as u64,
        log_bytes: shared.log.stats().total_bytes,
        uptime_ms: shared.started.elapsed().as_millis() as u64,
        available_bytes: Some(shared.disk.available()).filter(|a| *a != u64::MAX),
        disk_full: shared.disk.is_full(),
        stopping: shared.stopping.load(std::sync::atomic::Ordering::Relaxed),
        protocol: phoenix_meta::PROTOCOL,
    };
    (stats, replicas, meta_replica)
}

/// The stats of this node's replica of `g` (published view `v`) for a heartbeat.
fn replica_stats(shared: &Shared, g: u64, v: &GroupView) -> proto::ReplicaStats {
    let size = shared.split.size(g);
    let (scrub, running) = shared.scrubs.latest(g);
    proto::ReplicaStats {
        group_id: g,
        node_id: shared.cfg.node_id,
        is_leader: v.is_leader,
        term: v.term,
        commit_index: v.commit,
        applied_index: v.applied,
        log_first_index: v.log_first,
        approximate_bytes: size.bytes,
        approximate_keys: size.entries,
        split_key_hint: if v.is_leader {
            shared
                .split
                .hint(g, v.route.epoch)
                .map(Into::into)
                .unwrap_or_default()
        } else {
            Default::default()
        },
        epoch: v.route.epoch,
        stopped: v.failed.clone().unwrap_or_default(),
        hibernating: v.hibernating,
        conf_version: v.route.conf_version,
        voters: v
            .route
            .replicas
            .iter()
            .map(|r| r.node_id)
            .filter(|id| !v.route.learners.contains(id))
            .collect(),
        learners: v.route.learners.clone(),
        start_key: v.route.start_key.clone(),
        end_key: v.route.end_key.clone(),
        split_child: v.split_child.clone(),
        scrub_index: scrub.as_ref().map_or(0, |s| s.index),
        scrub_crc: scrub.as_ref().map_or(0, |s| s.crc),
        scrub_keys: scrub.as_ref().map_or(0, |s| s.keys),
        scrub_bytes: scrub.as_ref().map_or(0, |s| s.bytes),
        scrub_age_ms: scrub
            .as_ref()
            .map_or(0, |s| s.at.elapsed().as_millis() as u64),
        scrub_error: scrub.and_then(|s| s.error).unwrap_or_default(),
        scrub_running_index: running,
        merging_into: v.merging_into,
        merge_index: v.merge_index,
        merge_waiting_for: v.merge_waiting_for,
    }
}

/// How far the scrub age of a replica the meta leader holds may lag before the replica
/// is reported again for that alone. Ages move at every report: reporting each scrubbed
/// replica for it would list every replica in every report once each group has scrubbed
/// (10,000 records a heartbeat at 10,000 groups). The age only seeds the scrub schedule
/// of a group a meta leader sees for the first time: a new meta leader gets fresh ages
/// from the whole reports it starts with, and a new group has not scrubbed yet. (The
/// meta leader does not count an age that moved alone as a change: `LeaderView`.)
const SCRUB_AGE_LAG_MS: u64 = 10 * 60 * 1000;

/// What a partial report lists against `prev`, the report the meta leader holds: the
/// replicas of `current` that changed and the groups gone. A replica whose scrub age
/// alone moved, by less than [`SCRUB_AGE_LAG_MS`], is unchanged: `current` keeps the
/// held age for it, so that the next report compares with what the leader holds.
fn report_changes(
    prev: &HashMap<u64, proto::ReplicaStats>,
    current: &mut HashMap<u64, proto::ReplicaStats>,
) -> (Vec<proto::ReplicaStats>, Vec<u64>) {
    let mut changed = Vec::new();
    for r in current.values_mut() {
        let Some(p) = prev.get(&r.group_id) else {
            changed.push(r.clone());
            continue;
        };
        let age = r.scrub_age_ms;
        if age.abs_diff(p.scrub_age_ms) < SCRUB_AGE_LAG_MS {
            r.scrub_age_ms = p.scrub_age_ms;
        }
        if r != p {
            r.scrub_age_ms = age;
            changed.push(r.clone());
        }
    }
    let removed = prev
        .keys()
        .filter(|g| !current.contains_key(g))
        .copied()
        .collect();
    (changed, removed)
}

/// Takes the meta members a heartbeat answer names (none from a meta leader that
/// predates them: what is known stands); returns whether they changed.
fn learn_meta_members(shared: &Shared, members: &[proto::Replica]) -> bool {
    let learned: Vec<MetaMember> = members
        .iter()
        .filter(|m| m.node_id != 0 && !m.addr.is_empty())
        .map(|m| MetaMember {
            id: m.node_id,
            addr: m.addr.clone(),
        })
        .collect();
    if learned.is_empty() {
        return false;
    }
    let mut known = shared.learned_meta.write();
    if *known == learned {
        return false;
    }
    tracing::info!(
        members = ?learned.iter().map(|m| m.id).collect::<Vec<_>>(),
        "meta members named by the meta leader"
    );
    *known = learned;
    true
}

/// Keeps the learned meta members for the next start (`known_meta`); false if that
/// failed (the next heartbeat tries again; the members in memory serve meanwhile).
async fn save_meta_members(shared: &Arc<Shared>) -> bool {
    let members = shared.learned_meta.read().clone();
    let dir = shared.cfg.data_dir.clone();
    let saved = tokio::task::spawn_blocking(move || crate::known_meta::save(&dir, &members)).await;
    match saved {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!("keeping the meta members for the next start: {e}");
            false
        }
        Err(e) => {
            tracing::warn!("keeping the meta members for the next start: {e}");
            false
        }
    }
}

/// Sends heartbeats to the meta leader forever, carrying out the placement commands.
pub async fn heartbeat_loop(shared: Arc<Shared>) {
    let mut target: Option<String> = None;
    let mut next_member = 0usize;
    // Whether the learned meta members are on disk as they are in memory.
    let mut meta_saved = true;
    let interval = shared.cfg.heartbeat_interval;
    // Reports are numbered from a random start (a restarted node must not reuse a number
    // a meta leader holds); `held` is the report the meta leader last said it holds
    // whole, with its replica stats: the next report lists only the changes since.
    let mut report_seq: u64 = rand::random::<u64>() >> 1;
    let mut held: Option<(u64, HashMap<u64, proto::ReplicaStats>)> = None;
    loop {
        let addr = match target.clone() {
            Some(a) => a,
            None => {
                let addrs = shared.meta_addrs();
                next_member += 1;
                match addrs.get(next_member % addrs.len().max(1)) {
                    Some(a) => a.clone(),
                    None => {
                        tracing::warn!("no meta member known to send heartbeats to");
                        tokio::time::sleep(interval).await;
                        continue;
                    }
                }
            }
        };
        let (stats, replicas, meta_replica) = node_stats(&shared);
        report_seq += 1;
        let mut current: HashMap<u64, proto::ReplicaStats> =
            replicas.into_iter().map(|r| (r.group_id, r)).collect();
        let (replicas, report_base, removed_groups) = match &held {
            Some((base, prev)) => {
                let (changed, removed) = report_changes(prev, &mut current);
                (changed, *base, removed)
            }
            None => (current.values().cloned().collect(), 0, Vec::new()),
        };
        let req = proto::HeartbeatRequest {
            node_id: shared.cfg.node_id,
            addr: shared.cfg.advertise.clone(),
            stats: Some(stats),
            replicas,
            report_seq,
            report_base,
            removed_groups,
            timeout_ms: 3000,
            meta_replica,
        };
        let resp = match connect_meta(&shared, &addr, Duration::from_secs(3)).await {
            Ok(mut c) => c
                .heartbeat(req)
                .await
                .map(|r| r.into_inner())
                .map_err(|s| s.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let mut fast_retry = false;
        // Without an answer the meta leader may or may not hold this report: the next
        // one is whole.
        held = match &resp {
            Ok(r) if r.error.is_none() && r.report_held => Some((report_seq, current)),
            _ => None,
        };
        match resp {
            Ok(r) => match r.error {
                None => {
                    shared.disk.set_full_nodes(r.disk_full_nodes);
                    if learn_meta_members(&shared, &r.meta_members) || !meta_saved {
                        meta_saved = save_meta_members(&shared).await;
                    }
                    if !r.nodes.is_empty() {
                        let mut a = shared.addrs.write();
                        for n in &r.nodes {
                            if n.node_id != 0 && !n.addr.is_empty() {
                                a.insert(n.node_id, n.addr.clone());
                            }
                        }
                        let lowest = r.nodes.iter().map(|n| n.protocol).min().unwrap_or(0);
                        shared
                            .cluster_protocol
                            .store(lowest, std::sync::atomic::Ordering::Release);
                    }
                    for c in r.commands {
                        use proto::placement_command::Cmd;
                        let event = match c.cmd {
                            Some(Cmd::CreateReplica(cr)) => cr.route.map(|route| {
                                shared.learn_addrs(&route);
                                Event::CreateReplica(route)
                            }),
                            Some(Cmd::TransferLeader(t)) => Some(Event::TransferLeader {
                                group: t.group_id,
                                to: t.to_node,
                            }),
                            Some(Cmd::ChangePeer(c)) => {
                                use crate::node::PeerChange;
                                let change = match proto::ChangePeerKind::try_from(c.kind) {
                                    Ok(proto::ChangePeerKind::AddLearner) => {
                                        Some(PeerChange::AddLearner)
                                    }
                                    Ok(proto::ChangePeerKind::AddVoter) => {
                                        Some(PeerChange::AddVoter)
                                    }
                                    Ok(proto::ChangePeerKind::Remove) => Some(PeerChange::Remove),
                                    // A kind this node predates.
                                    _ => None,
                                };
                                change.map(|change| Event::ChangePeer {
                                    group: c.group_id,
                                    node: c.node_id,
                                    change,
                                    conf_version: c.conf_version,
                                })
                            }
                            Some(Cmd::DestroyReplica(d)) => Some(Event::DestroyReplica {
                                group: d.group_id,
                                conf_version: d.conf_version,
                            }),
                            Some(Cmd::SplitGroup(sg)) => Some(Event::Split {
                                group: sg.group_id,
                                split_key: sg.split_key.to_vec(),
                                new_group_id: sg.new_group_id,
                                epoch: sg.epoch,
                            }),
                            Some(Cmd::ScrubGroup(s)) => Some(Event::Scrub { group: s.group_id }),
                            Some(Cmd::MergeGroup(m)) => Some(Event::Merge(m)),
                            // A command this node predates.
                            None => None,
                        };
                        if let Some(ev) = event {
                            let _ = shared.events.send(ev);
                        }
                    }
                    target = Some(addr);
                }
                Some(e) => {
                    if matches!(e.kind, Some(proto::error::Kind::InvalidArgument(_))) {
                        // (Refused for what it says, not for where it went: asking again
                        // will not help until the node is restarted right.)
                        tracing::warn!("heartbeat refused by {addr}: {e}");
                    }
                    let hint = match &e.kind {
                        Some(proto::error::Kind::NotLeader(nl)) => nl
                            .leader
                            .as_ref()
                            .map(|l| l.addr.clone())
                            .filter(|a| !a.is_empty()),
                        _ => None,
                    };
                    tracing::debug!("heartbeat to {addr}: {e}");
                    fast_retry = hint.is_some();
                    target = hint;
                }
            },
            Err(e) => {
                tracing::debug!("heartbeat to {addr}: {e}");
                target = None;
            }
        }
        let wait = if fast_retry {
            Duration::from_millis(50)
        } else {
            interval
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shared.report_soon.notified() => {
                // A burst of changes (a leader applying many groups' changes, the
                // elections after a node's death) makes one report, not one each.
                tokio::time::sleep(REPORT_SOON_GAP.min(interval)).await;
            }
        }
    }
}

/// Least time between a report and the next one it hastens ([`Shared::report_soon`]).
const REPORT_SOON_GAP: Duration = Duration::from_millis(100);

/// Refuses an operator request `what` on the meta group or node 0.
fn operator_target(what: &str, node: u64) -> Result<(), PErr> {
    if node == 0 {
        return Err(PErr::invalid_argument(format!(
            "{what} needs a node id (not 0)"
        )));
    }
    Ok(())
}

/// Ends the operators that are done, out of time or impossible now, saying so.
fn settle_operators(
    ops: &mut phoenix_meta::Operators,
    meta: &phoenix_meta::MetaState,
    lv: &phoenix_meta::LeaderView,
) {
    for (group, outcome) in ops.settle(meta, lv, Instant::now()) {
        match outcome {
            phoenix_meta::Outcome::Done => tracing::debug!(group, "operator done"),
            phoenix_meta::Outcome::GivenUp => {
                tracing::info!(group, "operator given up (not done in time)")
            }
            phoenix_meta::Outcome::Cancelled(why) => {
                tracing::info!(group, "operator cancelled: {why}")
            }
        }
    }
}

/// The meta leader's scheduler, every 500 ms: bootstraps the data groups when enough
/// nodes are alive (the decision is [`phoenix_meta::bootstrap_plan`]), then balances
/// leaders ([`phoenix_meta::balance_leaders`]) unless switched off.
pub async fn scheduler_loop(shared: Arc<Shared>) {
    let svc = MetaService {
        shared: Arc::clone(&shared),
    };
    let mut tick: u64 = 0;
    let mut last_busy: u64 = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        tick += 1;
        if !svc.is_meta_leader() {
            // Operators are the meta leader's: a deposed one drops them.
            *shared.operators.lock() = phoenix_meta::Operators::default();
            *shared.scrub_schedule.lock() = phoenix_meta::Scrubs::default();
            *shared.merge_clocks.lock() = crate::shared::MergeClocks::default();
            *shared.meta_leader_since.lock() = None;
            continue;
        }
        {
            let mut since = shared.meta_leader_since.lock();
            if since.is_none() {
                // New in office (perhaps again): what it heard in an earlier term is
                // stale (a node that died meanwhile would look alive); it learns
                // everything anew from the next heartbeats.
                *shared.leader_view.lock() = phoenix_meta::LeaderView::default();
                *shared.operators.lock() = phoenix_meta::Operators::default();
                *since = Some(Instant::now());
            }
        }
        svc.refresh_meta_view();
        bootstrap(&svc).await;
        update_routes(&svc).await;
        let full = full_pass(&shared, tick, &mut last_busy);
        if full {
            plan_size_splits(&svc).await;
        }
        step_merges(&svc, full).await;
        {
            let meta = shared.meta.read();
            let lv = shared.leader_view.lock();
            settle_operators(&mut shared.operators.lock(), &meta, &lv);
        }
        move_replicas(&shared, full);
        if full {
            if shared.cfg.balance_leaders {
                balance(&shared);
            }
            scrub(&shared);
        }
    }
}

/// Groups the planners that walk every group (replica and leader balance, splits by
/// size, merges, scrub scheduling) may walk per scheduler tick while no operator is under way.
const QUIET_GROUPS_PER_TICK: usize = 1000;
/// Most scheduler ticks between two such walks (5 s).
const QUIET_TICKS_MAX: u64 = 10;

/// Whether this scheduler tick runs the planners that walk every group: always while an
/// operator or a merge is under way and for [`QUIET_TICKS_MAX`] ticks after the last one
/// ended (a balancing run or a row of merges, batch after batch, goes on at full speed),
/// else once every `groups / QUIET_GROUPS_PER_TICK` ticks (at most
/// [`QUIET_TICKS_MAX`]), so an idle cluster of many groups does not keep its meta leader
/// walking them all twice a second (at 10,000 groups that took 4% of a core).
/// `last_busy`: the last tick an operator or a merge was under way. Route updates,
/// repairs of down nodes, the steps of planned merges and the operators' own steps run
/// every tick.
fn full_pass(shared: &Shared, tick: u64, last_busy: &mut u64) -> bool {
    if !shared.operators.lock().is_idle() || !shared.meta.read().merges().is_empty() {
        *last_busy = tick;
    }
    if tick.saturating_sub(*last_busy) <= QUIET_TICKS_MAX {
        return true;
    }
    let groups = shared.meta.read().routes().len();
    let every = (groups / QUIET_GROUPS_PER_TICK).clamp(1, QUIET_TICKS_MAX as usize) as u64;
    tick.is_multiple_of(every)
}

/// Ends the scrubs that are done, starts the scheduled ones, and reports every new
/// mismatch (phoenix_meta::Scrubs).
fn scrub(shared: &Shared) {
    let now = Instant::now();
    let meta = shared.meta.read();
    let lv = shared.leader_view.lock();
    let mut s = shared.scrub_schedule.lock();
    for (group, done) in s.settle(&meta, &lv, now) {
        if !done {
            tracing::warn!(group, "scrub not reported by every replica in time");
        }
    }
    let started = s.schedule(&meta, &lv, now, shared.cfg.scrub_interval);
    if !started.is_empty() {
        tracing::info!(groups = ?started, "scrubbing");
    }
    for m in s.new_mismatches(&lv) {
        let replicas: Vec<String> = m
            .replicas
            .iter()
            .map(|r| {
                format!(
                    "node {}: crc {:08x}, {} keys, {} bytes",
                    r.node_id, r.crc, r.keys, r.bytes
                )
            })
            .collect();
        tracing::error!(
            group = m.group_id,
            index = m.index,
            ?replicas,
            "scrub mismatch: the group's replicas hold different data"
        );
    }
}

/// Plans the splits of groups their leaders report over their split size
/// (`phoenix_meta::size_splits`), once every meta member and every replica of the
/// group applies splits.
async fn plan_size_splits(svc: &MetaService) {
    let plans = {
        let members: Vec<u64> = svc.shared.meta_member_ids();
        let meta = svc.shared.meta.read();
        let lv = svc.shared.leader_view.lock();
        if meta
            .member_behind(&members, phoenix_meta::PROTOCOL_SPLIT)
            .is_some()
        {
            return;
        }
        let mut plans = phoenix_meta::size_splits(&meta, &lv);
        plans.retain(|p| {
            meta.routes().get(&p.group_id).is_some_and(|r| {
                let nodes: Vec<u64> = r.replicas.iter().map(|x| x.node_id).collect();
                meta.member_behind(&nodes, phoenix_meta::PROTOCOL_SPLIT)
                    .is_none()
            })
        });
        plans
    };
    for plan in plans {
        let (g, new_group) = (plan.group_id, plan.new_group_id);
        let key = plan.split_key.clone();
        let cmd = proto::MetaCommand {
            cmd: Some(proto::meta_command::Cmd::PlanSplit(plan)),
        };
        match svc.propose(cmd, Duration::from_secs(5)).await {
            Ok(ApplyResult::Done) => tracing::info!(
                group = g,
                new_group,
                key = %key.escape_ascii(),
                "split planned: the group is over its split size"
            ),
            // (A plan proposed meanwhile took the id or the group: asked again later.)
            Ok(other) => {
                tracing::debug!(group = g, "split plan refused: {other:?}");
                break;
            }
            Err(e) => {
                tracing::warn!(group = g, "split plan failed: {e}");
                break;
            }
        }
    }
}

/// A merge still in its prepare phase this long (as this meta leader saw it) is given up:
/// a source replica did not freeze (down, or far behind), and the source refuses
/// requests meanwhile.
pub const MERGE_PREPARE_MAX: Duration = Duration::from_secs(20);

/// Moves the planned merges on (`phoenix_meta::merge_steps`), gives up those stuck in
/// their prepare phase past [`MERGE_PREPARE_MAX`], and plans merges of small neighbours
/// (`phoenix_meta::small_merges`) whose ranges stayed put for `merge_after` on a `full`
/// pass ([`full_pass`]).
async fn step_merges(svc: &MetaService, full: bool) {
    let shared = &svc.shared;
    let now = Instant::now();
    let cmds = 'cmds: {
        let members: Vec<u64> = shared.meta_member_ids();
        let meta = shared.meta.read();
        let lv = shared.leader_view.lock();
        let mut ops = shared.operators.lock();
        let mut clocks = shared.merge_clocks.lock();
        if meta
            .member_behind(&members, phoenix_meta::PROTOCOL_MERGE)
            .is_some()
        {
            return;
        }
        let mut cmds = phoenix_meta::merge_steps(&meta, &lv);
        let preparing: Vec<&proto::MergePlan> = meta
            .merges()
            .values()
            .filter(|p| p.phase == proto::MergePhase::Prepare as i32)
            .collect();
        clocks
            .preparing
            .retain(|s, _| preparing.iter().any(|p| p.source == *s));
        for p in preparing {
            let since = *clocks.preparing.entry(p.source).or_insert(now);
            let moving = cmds.iter().any(|c| {
                matches!(&c.cmd, Some(proto::meta_command::Cmd::PlanMerge(m)) if m.source == p.source)
            });
            if !moving && now.saturating_duration_since(since) >= MERGE_PREPARE_MAX {
                tracing::warn!(
                    source = p.source,
                    target = p.target,
                    "merge not prepared by every replica in time; rolling it back"
                );
                cmds.push(proto::MetaCommand {
                    cmd: Some(proto::meta_command::Cmd::PlanMerge(proto::MergePlan {
                        phase: proto::MergePhase::Rollback as i32,
                        ..*p
                    })),
                });
            }
        }
        if !full {
            // (Planning merges walks every group: a full pass's work.)
            break 'cmds cmds;
        }
        clocks.epochs.retain(|g, _| meta.routes().contains_key(g));
        for r in meta.routes().values() {
            let e = clocks.epochs.entry(r.group_id).or_insert((r.epoch, now));
            if e.0 != r.epoch {
                *e = (r.epoch, now);
            }
        }
        let settled = |g: u64| {
            clocks.epochs.get(&g).is_some_and(|(_, since)| {
                now.saturating_duration_since(*since) >= shared.cfg.merge_after
            })
        };
        // (Not a group a user changed lately: the second half of a `cluster move` comes
        // next. Nor one with a replica on a node that cannot merge: its plan would be
        // dropped below at every pass, and hold up every other.)
        let old_replica = |g: u64| {
            meta.routes().get(&g).is_some_and(|r| {
                let nodes: Vec<u64> = r.replicas.iter().map(|x| x.node_id).collect();
                meta.member_behind(&nodes, phoenix_meta::PROTOCOL_MERGE)
                    .is_some()
            })
        };
        let busy = |g: u64| {
            ops.changes_membership(g) || ops.asked_lately(g, now) || !settled(g) || old_replica(g)
        };
        let plans = phoenix_meta::small_merges(
            &meta,
            &lv,
            shared.cfg.group_merge_bytes,
            shared.cfg.group_merge_keys,
            busy,
        );
        // None to merge yet: bring a small pair onto the same voters, a change at a time.
        // Alignment is the last of the replica changes: it waits for repair and the
        // replica balancer to have none under way (a merge can wait; it only adds
        // changes to a cluster already changing). While a step is under way the pair
        // stays named: the replica balancer leaves it alone.
        let calm = ops.changing(Origin::Repair) == 0 && ops.changing(Origin::Balance) == 0;
        let align = if plans.is_empty() && ops.changing(Origin::Merge) == 0 && calm {
            phoenix_meta::merge_alignment(
                &meta,
                &lv,
                now,
                shared.cfg.replication,
                shared.cfg.group_merge_bytes,
                shared.cfg.group_merge_keys,
                busy,
                ops.merge_pair(),
            )
        } else {
            None
        };
        if plans.is_empty() && ops.changing(Origin::Merge) == 0 && calm {
            ops.set_merge_pair(align.map(|(_, pair)| pair));
        }
        if let Some((m, _)) = align {
            match ops.start(&meta, &lv, &members, m, now, Origin::Merge) {
                Ok(_) => tracing::info!(?m, "aligning replicas for a merge"),
                Err(e) => tracing::debug!(?m, "not aligning replicas for a merge: {e}"),
            }
        }
        // (`busy` kept out every group with a replica on a node too old to merge.)
        cmds.extend(plans.into_iter().map(|plan| {
            debug_assert!(!old_replica(plan.source) && !old_replica(plan.target));
            proto::MetaCommand {
                cmd: Some(proto::meta_command::Cmd::PlanMerge(plan)),
            }
        }));
        cmds
    };
    for cmd in cmds {
        let what = match &cmd.cmd {
            Some(proto::meta_command::Cmd::PlanMerge(p)) => format!(
                "merge of group {} into group {}: {}",
                p.source,
                p.target,
                proto::MergePhase::try_from(p.phase).map_or("?", |ph| ph.as_str_name())
            ),
            Some(proto::meta_command::Cmd::FinishMerge(d)) => format!(
                "merge of group {} {}",
                d.source,
                if d.target.is_some() {
                    "recorded in the routing table"
                } else {
                    "rolled back"
                }
            ),
            _ => "merge step".to_string(),
        };
        match svc.propose(cmd, Duration::from_secs(5)).await {
            Ok(ApplyResult::Done) => {
                tracing::info!("{what}");
                shared.report_soon.notify_one();
            }
            Ok(other) => tracing::debug!("{what}: refused: {other:?}"),
            Err(e) => {
                tracing::warn!("{what}: {e}");
                break;
            }
        }
    }
}

/// Proposes the route updates that bring the routing table up to the memberships the
/// groups' leaders report (`phoenix_meta::route_updates`).
async fn update_routes(svc: &MetaService) {
    let cmds = {
        let members: Vec<u64> = svc.shared.meta_member_ids();
        let meta = svc.shared.meta.read();
        let mut lv = svc.shared.leader_view.lock();
        // Every meta replica must apply the command the same way.
        if meta
            .member_behind(&members, phoenix_meta::PROTOCOL_REPLICA_MOVES)
            .is_some()
        {
            return;
        }
        let mut cmds = phoenix_meta::route_updates_quiet(&meta, &mut lv);
        if meta
            .member_behind(&members, phoenix_meta::PROTOCOL_SPLIT)
            .is_none()
        {
            cmds.extend(phoenix_meta::finished_splits(&meta, &lv));
        }
        cmds
    };
    for cmd in cmds {
        let (g, what) = match &cmd.cmd {
            Some(proto::meta_command::Cmd::UpdateRoute(r)) => {
                (r.group_id, "route membership updated")
            }
            Some(proto::meta_command::Cmd::FinishSplit(d)) => (
                d.parent.as_ref().map_or(0, |r| r.group_id),
                "split recorded in the routing table",
            ),
            _ => (0, "route updated"),
        };
        match svc.propose(cmd, Duration::from_secs(5)).await {
            Ok(ApplyResult::Done) => tracing::info!(group = g, "{what}"),
            // (Another update of the same membership got there first.)
            Ok(other) => tracing::debug!(group = g, "route update refused: {other:?}"),
            Err(e) => tracing::warn!(group = g, "route update failed: {e}"),
        }
    }
}

/// Starts the leader transfers the balancer decides, up to its in-flight limit.
fn balance(shared: &Shared) {
    let now = Instant::now();
    let meta = shared.meta.read();
    let lv = shared.leader_view.lock();
    let mut ops = shared.operators.lock();
    let room = phoenix_meta::BALANCE_INFLIGHT_MAX.saturating_sub(ops.balancing());
    let moves = phoenix_meta::balance_leaders(&meta, &lv, &ops, now, room);
    let mut started = 0;
    for (group, to) in moves {
        match ops.transfer_leader(&meta, &lv, group, to, now, Origin::Balance) {
            Ok(_) => started += 1,
            Err(e) => tracing::debug!(group, to, "balancer: {e}"),
        }
    }
    if started > 0 {
        tracing::info!(transfers = started, "balancing leaders");
    }
}

/// Starts the replica repairs (`phoenix_meta::repair_replicas`) for the nodes down for
/// `--down-after` and the draining ones, then, if `balance` (a full pass: see
/// [`full_pass`]), the replica balancer's moves (`phoenix_meta::balance_replicas`, which
/// waits while repair has work), each up to its in-flight limit.
fn move_replicas(shared: &Shared, balance: bool) {
    let now = Instant::now();
    let Some(since) = *shared.meta_leader_since.lock() else {
        return;
    };
    let cfg = &shared.cfg;
    let members: Vec<u64> = shared.meta_member_ids();
    let meta = shared.meta.read();
    let lv = shared.leader_view.lock();
    let mut ops = shared.operators.lock();
    let down = if cfg.down_after.is_zero() {
        Vec::new()
    } else {
        phoenix_meta::down_nodes(&meta, &lv, now, since, cfg.down_after)
    };
    let mut moves = Vec::new();
    if !down.is_empty() || !meta.draining_nodes().is_empty() {
        let room = phoenix_meta::REPAIR_INFLIGHT_MAX.saturating_sub(ops.changing(Origin::Repair));
        let repairs = phoenix_meta::repair_replicas(
            &meta,
            &lv,
            &ops,
            now,
            &down,
            cfg.replication,
            cfg.meta.len(),
            room,
        );
        moves.extend(repairs.into_iter().map(|m| (m, Origin::Repair)));
    }
    // The meta group kept at its size (not left to the optional balancer).
    let resize = phoenix_meta::resize_meta(&meta, &lv, &ops, now, since, &down, cfg.meta.len());
    if let Some(m) = resize {
        moves.push((m, Origin::Repair));
    }
    if cfg.balance_replicas && balance {
        let room = phoenix_meta::REPLICA_BALANCE_INFLIGHT_MAX
            .saturating_sub(ops.changing(Origin::Balance));
        let balance =
            phoenix_meta::balance_replicas(&meta, &lv, &ops, now, &down, cfg.replication, room);
        moves.extend(balance.into_iter().map(|m| (m, Origin::Balance)));
    }
    for (m, origin) in moves {
        match ops.start(&meta, &lv, &members, m, now, origin) {
            Ok(_) => tracing::info!(?m, ?origin, down = ?down, "moving a replica"),
            Err(e) => tracing::debug!(?m, ?origin, "not moving a replica: {e}"),
        }
    }
}

/// Whether a meta group already runs elsewhere without this node: the members it last
/// learned (`learned`, kept across restarts) leave it out, or else it asks the other
/// `--meta` members and the learned ones for the cluster, all at once, within a
/// second and a half. Some(why) if one answers with a meta membership that leaves
/// this node out (a member replaced while it was away, its disk since wiped: starting a
/// replica of the first membership would start a second meta group). None if none
/// answers (the cluster's first start) or the membership lists it (a member that
/// starts late joins the group it is part of).
pub(crate) async fn meta_group_without_me(
    cfg: &crate::Config,
    creds: &phoenix_proto::security::Credentials,
    learned: &[MetaMember],
) -> Option<String> {
    let me = cfg.node_id;
    if !learned.is_empty() && !learned.iter().any(|m| m.id == me) {
        let ids: Vec<u64> = learned.iter().map(|m| m.id).collect();
        return Some(format!("the meta members it last learned are {ids:?}"));
    }
    let mut addrs: Vec<String> = Vec::new();
    for m in learned.iter().chain(&cfg.meta) {
        if m.id != me && !addrs.contains(&m.addr) {
            addrs.push(m.addr.clone());
        }
    }
    let probes = addrs.into_iter().map(|addr| async move {
        let ep = creds
            .endpoint(&addr)
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(1));
        let mut c = MetaClient::new(creds.authorize(ep.connect().await.ok()?));
        let r = match c
            .get_cluster(proto::GetClusterRequest { timeout_ms: 800 })
            .await
        {
            Ok(r) => r.into_inner(),
            // (A member that refuses this node must not count as "nobody answered":
            // this node would start a meta group of its own.)
            Err(s) if s.code() == tonic::Code::Unauthenticated => {
                return Some(format!(
                    "{addr} refused this node's credentials ({})",
                    s.message()
                ))
            }
            Err(_) => return None,
        };
        let route = r.meta_group?.route?;
        let listed = route.replicas.iter().any(|x| x.node_id == me);
        (!listed).then(|| {
            let ids: Vec<u64> = route.replicas.iter().map(|x| x.node_id).collect();
            format!("{addr} answers with meta members {ids:?}")
        })
    });
    // The first answer that leaves this node out decides; the deadline only ends the
    // wait for the others.
    let mut pending: futures::stream::FuturesUnordered<_> = probes.collect();
    let first = async {
        use futures::StreamExt as _;
        while let Some(found) = pending.next().await {
            if found.is_some() {
                return found;
            }
        }
        None
    };
    tokio::time::timeout(Duration::from_millis(1500), first)
        .await
        .ok()
        .flatten()
}

/// Proposes the bootstrap of the data groups once its plan says so.
async fn bootstrap(svc: &MetaService) {
    let shared = &svc.shared;
    let plan = {
        let meta = shared.meta.read();
        let lv = shared.leader_view.lock();
        phoenix_meta::bootstrap_plan(
            &meta,
            &lv,
            Instant::now(),
            &shared.cfg.split_keys,
            shared.cfg.replication,
        )
    };
    let cmd = match plan {
        Ok(Some(cmd)) => cmd,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!("cannot bootstrap: {e}");
            return;
        }
    };
    let n = match &cmd.cmd {
        Some(proto::meta_command::Cmd::CreateGroups(cg)) => cg.routes.len(),
        _ => 0,
    };
    let started = Instant::now();
    match svc.propose(cmd, Duration::from_secs(5)).await {
        Ok(ApplyResult::Done) => tracing::info!(
            groups = n,
            ms = started.elapsed().as_millis() as u64,
            "cluster bootstrapped"
        ),
        Ok(other) => tracing::warn!("bootstrap refused: {other:?}"),
        Err(e) => tracing::warn!("bootstrap proposal failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrubbed(g: u64, age_ms: u64) -> proto::ReplicaStats {
        proto::ReplicaStats {
            group_id: g,
            scrub_index: 7,
            scrub_age_ms: age_ms,
            ..proto::ReplicaStats::default()
        }
    }

    /// A scrubbed replica is not reported again for its age alone until the age the
    /// meta leader holds lags by the allowed amount; with any other change it is, with
    /// its age as it is.
    #[test]
    fn a_scrub_age_moving_alone_does_not_make_a_report_whole() {
        let prev: HashMap<u64, proto::ReplicaStats> = [
            (1, scrubbed(1, 1_000)),
            (2, scrubbed(2, 1_000)),
            (3, scrubbed(3, 1_000)),
        ]
        .into_iter()
        .collect();
        let mut current: HashMap<u64, proto::ReplicaStats> = [
            (1, scrubbed(1, 6_000)),
            (2, scrubbed(2, 1_000 + SCRUB_AGE_LAG_MS)),
            (
                3,
                proto::ReplicaStats {
                    applied_index: 9,
                    ..scrubbed(3, 6_000)
                },
            ),
            (4, scrubbed(4, 0)),
        ]
        .into_iter()
        .collect();
        let (mut changed, removed) = report_changes(&prev, &mut current);
        changed.sort_by_key(|r| r.group_id);
        assert_eq!(
            changed
                .iter()
                .map(|r| (r.group_id, r.scrub_age_ms))
                .collect::<Vec<_>>(),
            vec![(2, 1_000 + SCRUB_AGE_LAG_MS), (3, 6_000), (4, 0)]
        );
        assert!(removed.is_empty());
        // What the leader holds now: group 1 at the age it had.
        assert_eq!(current[&1].scrub_age_ms, 1_000);
        let next: HashMap<u64, proto::ReplicaStats> = current.clone();
        let mut later: HashMap<u64, proto::ReplicaStats> =
            [(1, scrubbed(1, 9_000))].into_iter().collect();
        let (changed, mut removed) = report_changes(&next, &mut later);
        removed.sort_unstable();
        assert!(changed.is_empty());
        assert_eq!(removed, vec![2, 3, 4]);
    }
}
