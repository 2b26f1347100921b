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
//!   nodes are alive: one group, or one per range between `--split-keys`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use phoenix_proto as proto;
use prost::Message as _;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::meta::{place, META_GROUP};
use crate::node::{ApplyResult, Event};
use crate::shared::Shared;

type PErr = proto::Error;

/// A node counts as alive if it sent a heartbeat within this.
const ALIVE_WITHIN: Duration = Duration::from_secs(5);

/// The `Meta` gRPC service.
#[derive(Clone)]
pub struct MetaService {
    /// Shared node state.
    pub shared: Arc<Shared>,
}

fn timeout_of(ms: u64) -> Result<Duration, PErr> {
    if ms == 0 {
        return Err(PErr::invalid_argument("timeout_ms is required (got 0)"));
    }
    Ok(Duration::from_millis(ms.min(proto::limits::TIMEOUT_MS_MAX)))
}

async fn connect_meta(
    addr: &str,
    timeout: Duration,
) -> Result<proto::meta_client::MetaClient<tonic::transport::Channel>, PErr> {
    let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| PErr::invalid_argument(format!("bad address {addr}: {e}")))?
        .connect_timeout(timeout.min(Duration::from_secs(2)))
        .timeout(timeout);
    let ch = ep
        .connect()
        .await
        .map_err(|e| PErr::group_unavailable(META_GROUP, format!("cannot reach {addr}: {e}")))?;
    Ok(proto::meta_client::MetaClient::new(ch))
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

    /// Where to forward a meta read: the known meta leader, else the meta members.
    fn forward_targets(&self) -> Vec<String> {
        let me = &self.shared.cfg.advertise;
        if let Some(v) = self.shared.groups.read().get(&META_GROUP) {
            // A meta member forwards only to the leader it knows (no forwarding loops).
            return self
                .shared
                .addr_of(v.leader)
                .into_iter()
                .filter(|a| a != me)
                .collect();
        }
        self.shared
            .cfg
            .meta
            .iter()
            .map(|m| m.addr.clone())
            .filter(|a| a != me)
            .collect()
    }

    async fn read_index(&self, timeout: Duration) -> Result<(), PErr> {
        let (tx, rx) = oneshot::channel();
        self.shared
            .events
            .send(Event::ReadIndex {
                group: META_GROUP,
                reply: tx,
            })
            .map_err(|_| PErr::group_unavailable(META_GROUP, "node shutting down"))?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(PErr::group_unavailable(META_GROUP, "request dropped")),
            Err(_) => Err(PErr::deadline_exceeded(timeout.as_millis() as u64)),
        }
    }

    async fn propose(
        &self,
        cmd: proto::MetaCommand,
        timeout: Duration,
    ) -> Result<ApplyResult, PErr> {
        let (tx, rx) = oneshot::channel();
        self.shared
            .events
            .send(Event::Propose {
                group: META_GROUP,
                data: Bytes::from(cmd.encode_to_vec()),
                reply: tx,
            })
            .map_err(|_| PErr::group_unavailable(META_GROUP, "node shutting down"))?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(PErr::group_unavailable(META_GROUP, "request dropped")),
            Err(_) => Err(PErr::deadline_exceeded(timeout.as_millis() as u64)),
        }
    }

    fn routes(&self) -> Vec<proto::Route> {
        let meta = self.shared.meta.read();
        let lv = self.shared.leader_view.lock();
        meta.routes
            .values()
            .map(|r| {
                let mut r = r.clone();
                for rep in r.replicas.iter_mut() {
                    if let Some(n) = meta.nodes.get(&rep.node_id) {
                        rep.addr = n.addr.clone();
                    }
                }
                if let Some(&(_, leader)) = lv.leaders.get(&r.group_id) {
                    r.leader_node_id = leader;
                    r.leader_addr = meta
                        .nodes
                        .get(&leader)
                        .map(|n| n.addr.clone())
                        .unwrap_or_default();
                }
                r
            })
            .collect()
    }

    async fn local_routes(&self, timeout: Duration) -> Result<proto::GetRoutesResponse, PErr> {
        self.read_index(timeout).await?;
        let mut routes = self.routes();
        routes.sort_by(|a, b| a.start_key.cmp(&b.start_key));
        let version = self
            .shared
            .groups
            .read()
            .get(&META_GROUP)
            .map_or(0, |v| v.applied);
        Ok(proto::GetRoutesResponse {
            error: None,
            routes,
            version,
        })
    }

    async fn local_cluster(&self, timeout: Duration) -> Result<proto::GetClusterResponse, PErr> {
        self.read_index(timeout).await?;
        let routes = self.routes();
        let meta = self.shared.meta.read().clone();
        let lv = self.shared.leader_view.lock();
        let nodes = meta
            .nodes
            .values()
            .map(|n| {
                let hb = lv.nodes.get(&n.node_id);
                let ago = hb.map_or(u64::MAX, |(t, _)| t.elapsed().as_millis() as u64);
                proto::NodeInfo {
                    node_id: n.node_id,
                    addr: n.addr.clone(),
                    last_heartbeat_ms_ago: ago,
                    alive: hb.is_some_and(|(t, _)| t.elapsed() < ALIVE_WITHIN),
                    stats: hb.map(|(_, s)| *s),
                }
            })
            .collect();
        let mut groups: Vec<proto::GroupInfo> = routes
            .into_iter()
            .map(|route| {
                let mut replicas: Vec<proto::ReplicaStats> = lv
                    .replicas
                    .iter()
                    .filter(|((g, _), _)| *g == route.group_id)
                    .map(|(_, s)| *s)
                    .collect();
                replicas.sort_by_key(|s| s.node_id);
                proto::GroupInfo {
                    route: Some(route),
                    replicas,
                }
            })
            .collect();
        groups.sort_by_key(|g| g.route.as_ref().map_or(0, |r| r.group_id));
        Ok(proto::GetClusterResponse {
            error: None,
            nodes,
            groups,
            meta_leader_node_id: self.shared.cfg.node_id,
        })
    }

    async fn heartbeat_local(
        &self,
        r: proto::HeartbeatRequest,
        timeout: Duration,
    ) -> Result<proto::HeartbeatResponse, PErr> {
        if r.node_id == 0 || r.addr.is_empty() {
            return Err(PErr::invalid_argument(
                "heartbeat without node id or address",
            ));
        }
        let known = self
            .shared
            .meta
            .read()
            .nodes
            .get(&r.node_id)
            .map(|n| n.addr.clone());
        if known.as_deref() != Some(r.addr.as_str()) {
            let cmd = proto::MetaCommand {
                cmd: Some(proto::meta_command::Cmd::RegisterNode(proto::Replica {
                    node_id: r.node_id,
                    addr: r.addr.clone(),
                })),
            };
            match self.propose(cmd, timeout).await? {
                ApplyResult::Refused(why) => {
                    return Err(PErr::invalid_argument(format!("node {}: {why}", r.node_id)))
                }
                _ => tracing::info!(node = r.node_id, addr = %r.addr, "node registered"),
            }
        }
        self.shared.addrs.write().insert(r.node_id, r.addr.clone());
        self.shared
            .leader_view
            .lock()
            .record(r.node_id, r.stats.unwrap_or_default(), &r.replicas);
        let hosted: std::collections::HashSet<u64> =
            r.replicas.iter().map(|s| s.group_id).collect();
        let commands = self
            .routes()
            .into_iter()
            .filter(|route| {
                route.replicas.iter().any(|x| x.node_id == r.node_id)
                    && !hosted.contains(&route.group_id)
            })
            .map(|route| proto::PlacementCommand {
                cmd: Some(proto::placement_command::Cmd::CreateReplica(
                    proto::CreateReplica { route: Some(route) },
                )),
            })
            .collect();
        let routes_version = self
            .shared
            .groups
            .read()
            .get(&META_GROUP)
            .map_or(0, |v| v.applied);
        Ok(proto::HeartbeatResponse {
            error: None,
            commands,
            routes_version,
        })
    }
}

macro_rules! or_err {
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

#[tonic::async_trait]
impl proto::meta_server::Meta for MetaService {
    async fn get_routes(
        &self,
        req: Request<proto::GetRoutesRequest>,
    ) -> Result<Response<proto::GetRoutesResponse>, Status> {
        let r = req.into_inner();
        let timeout = or_err!(GetRoutesResponse, timeout_of(r.timeout_ms));
        if self.is_meta_leader() {
            return Ok(Response::new(or_err!(
                GetRoutesResponse,
                self.local_routes(timeout).await
            )));
        }
        let mut last = PErr::group_unavailable(META_GROUP, "no meta leader known");
        for addr in self.forward_targets() {
            match connect_meta(&addr, timeout).await {
                Ok(mut c) => match c.get_routes(r).await {
                    Ok(resp) => return Ok(resp),
                    Err(s) => last = PErr::group_unavailable(META_GROUP, format!("{addr}: {s}")),
                },
                Err(e) => last = e,
            }
        }
        Ok(Response::new(proto::GetRoutesResponse {
            error: Some(last),
            ..Default::default()
        }))
    }

    async fn get_cluster(
        &self,
        req: Request<proto::GetClusterRequest>,
    ) -> Result<Response<proto::GetClusterResponse>, Status> {
        let r = req.into_inner();
        let timeout = or_err!(GetClusterResponse, timeout_of(r.timeout_ms));
        if self.is_meta_leader() {
            return Ok(Response::new(or_err!(
                GetClusterResponse,
                self.local_cluster(timeout).await
            )));
        }
        let mut last = PErr::group_unavailable(META_GROUP, "no meta leader known");
        for addr in self.forward_targets() {
            match connect_meta(&addr, timeout).await {
                Ok(mut c) => match c.get_cluster(r).await {
                    Ok(resp) => return Ok(resp),
                    Err(s) => last = PErr::group_unavailable(META_GROUP, format!("{addr}: {s}")),
                },
                Err(e) => last = e,
            }
        }
        Ok(Response::new(proto::GetClusterResponse {
            error: Some(last),
            ..Default::default()
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<proto::HeartbeatRequest>,
    ) -> Result<Response<proto::HeartbeatResponse>, Status> {
        let r = req.into_inner();
        let timeout = or_err!(HeartbeatResponse, timeout_of(r.timeout_ms));
        if !self.is_meta_leader() {
            let leader = self
                .shared
                .groups
                .read()
                .get(&META_GROUP)
                .map_or(0, |v| v.leader);
            return Ok(Response::new(proto::HeartbeatResponse {
                error: Some(PErr::not_leader(META_GROUP, self.shared.replica_of(leader))),
                ..Default::default()
            }));
        }
        Ok(Response::new(or_err!(
            HeartbeatResponse,
            self.heartbeat_local(r, timeout).await
        )))
    }
}

/// This node's stats for a heartbeat.
fn node_stats(shared: &Shared) -> (proto::NodeStats, Vec<proto::ReplicaStats>) {
    let groups = shared.groups.read();
    let replicas: Vec<proto::ReplicaStats> = groups
        .iter()
        .filter(|(g, _)| **g != META_GROUP)
        .map(|(g, v)| proto::ReplicaStats {
            group_id: *g,
            node_id: shared.cfg.node_id,
            is_leader: v.is_leader,
            term: v.term,
            commit_index: v.commit,
            applied_index: v.applied,
            log_first_index: v.log_first,
            approximate_bytes: 0,
            epoch: v.route.epoch,
        })
        .collect();
    let es = shared.engine.stats();
    let stats = proto::NodeStats {
        groups: replicas.len() as u64,
        leaders: replicas.iter().filter(|r| r.is_leader).count() as u64,
        engine_bytes: es.levels.iter().map(|l| l.bytes).sum::<u64>() + es.memtable_bytes as u64,
        log_bytes: shared.log.stats().total_bytes,
        uptime_ms: shared.started.elapsed().as_millis() as u64,
    };
    (stats, replicas)
}

/// Sends heartbeats to the meta leader forever, carrying out the placement commands.
pub async fn heartbeat_loop(shared: Arc<Shared>) {
    let mut target: Option<String> = None;
    let mut next_member = 0usize;
    let interval = shared.cfg.heartbeat_interval;
    loop {
        let addr = match target.clone() {
            Some(a) => a,
            None => {
                let m = &shared.cfg.meta[next_member % shared.cfg.meta.len()];
                next_member += 1;
                m.addr.clone()
            }
        };
        let (stats, replicas) = node_stats(&shared);
        let req = proto::HeartbeatRequest {
            node_id: shared.cfg.node_id,
            addr: shared.cfg.advertise.clone(),
            stats: Some(stats),
            replicas,
            timeout_ms: 3000,
        };
        let resp = match connect_meta(&addr, Duration::from_secs(3)).await {
            Ok(mut c) => c
                .heartbeat(req)
                .await
                .map(|r| r.into_inner())
                .map_err(|s| s.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let mut fast_retry = false;
        match resp {
            Ok(r) => match r.error {
                None => {
                    for c in r.commands {
                        if let Some(proto::placement_command::Cmd::CreateReplica(cr)) = c.cmd {
                            if let Some(route) = cr.route {
                                shared.learn_addrs(&route);
                                let _ = shared.events.send(Event::CreateReplica(route));
                            }
                        }
                    }
                    target = Some(addr);
                }
                Some(e) => {
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
        tokio::time::sleep(if fast_retry {
            Duration::from_millis(50)
        } else {
            interval
        })
        .await;
    }
}

/// The meta leader's scheduler: bootstraps the data groups when enough nodes are alive.
pub async fn scheduler_loop(shared: Arc<Shared>) {
    let svc = MetaService {
        shared: Arc::clone(&shared),
    };
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !svc.is_meta_leader() || !shared.meta.read().routes.is_empty() {
            continue;
        }
        let alive: Vec<u64> = {
            let meta = shared.meta.read();
            let lv = shared.leader_view.lock();
            meta.nodes
                .keys()
                .copied()
                .filter(|id| {
                    lv.nodes
                        .get(id)
                        .is_some_and(|(t, _)| t.elapsed() < ALIVE_WITHIN)
                })
                .collect()
        };
        let splits = &shared.cfg.split_keys;
        let Some(placement) = place(&alive, splits.len() + 1, shared.cfg.replication) else {
            continue;
        };
        let nodes = shared.meta.read().nodes.clone();
        let routes: Vec<proto::Route> = placement
            .into_iter()
            .enumerate()
            .map(|(i, reps)| proto::Route {
                group_id: i as u64 + 1,
                start_key: if i == 0 {
                    Bytes::new()
                } else {
                    Bytes::from(splits[i - 1].clone())
                },
                end_key: splits.get(i).cloned().map(Bytes::from).unwrap_or_default(),
                epoch: 1,
                replicas: reps
                    .into_iter()
                    .map(|id| proto::Replica {
                        node_id: id,
                        addr: nodes.get(&id).map(|n| n.addr.clone()).unwrap_or_default(),
                    })
                    .collect(),
                leader_node_id: 0,
                leader_addr: String::new(),
            })
            .collect();
        let n = routes.len();
        let cmd = proto::MetaCommand {
            cmd: Some(proto::meta_command::Cmd::CreateGroups(
                proto::CreateGroups { routes },
            )),
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
}
