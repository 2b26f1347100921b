//! The meta leader's decisions: bootstrap placement, placement commands answered to
//! heartbeats, registration of new or moved nodes, and the views served by
//! `GetRoutes` / `GetCluster`.
//!
//! Everything here is a pure function of the replicated [`MetaState`] and the leader's
//! [`LeaderView`]; the host proposes the commands and sends the answers.

use std::collections::HashSet;
use std::time::Instant;

use bytes::Bytes;
use phoenix_proto::{
    meta_command, placement_command, CreateGroups, CreateReplica, GetClusterResponse, GroupInfo,
    HeartbeatRequest, MetaCommand, NodeInfo, PlacementCommand, Replica, ReplicaStats, Route,
};

use crate::error::{Error, Result};
use crate::liveness::LeaderView;
use crate::state::MetaState;

/// Chooses replicas for `groups` new groups among `nodes` (sorted ids): group i gets
/// `replication` consecutive nodes starting at i (round-robin), so leaders and data
/// spread when there are more nodes than replicas. `None` if there are too few nodes.
pub fn place(nodes: &[u64], groups: usize, replication: usize) -> Option<Vec<Vec<u64>>> {
    if nodes.len() < replication || replication == 0 {
        return None;
    }
    Some(
        (0..groups)
            .map(|g| {
                let mut r: Vec<u64> = (0..replication)
                    .filter_map(|k| nodes.get((g + k) % nodes.len()).copied())
                    .collect();
                r.sort_unstable();
                r
            })
            .collect(),
    )
}

/// The ranges `split_keys` cut the key space into: `["", k1), [k1, k2), …, [kn, "")`
/// (an empty end = unbounded). The keys must be non-empty, sorted and distinct.
pub fn split_ranges(split_keys: &[Vec<u8>]) -> Result<Vec<(Bytes, Bytes)>> {
    if split_keys.iter().any(|k| k.is_empty()) || split_keys.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Error::BadSplitKeys);
    }
    let starts = std::iter::once(Bytes::new()).chain(split_keys.iter().cloned().map(Bytes::from));
    let ends = split_keys
        .iter()
        .cloned()
        .map(Bytes::from)
        .chain(std::iter::once(Bytes::new()));
    Ok(starts.zip(ends).collect())
}

/// The bootstrap decision: once at least `replication` registered nodes are alive and
/// no data group exists, create group 1 over the whole key space, or groups 1..=n+1
/// over the ranges between the `n` split keys, at epoch 1, replicas placed by
/// [`place`]. `Ok(None)` when there is nothing to do yet.
pub fn bootstrap_plan(
    state: &MetaState,
    view: &LeaderView,
    now: Instant,
    split_keys: &[Vec<u8>],
    replication: usize,
) -> Result<Option<MetaCommand>> {
    if state.is_bootstrapped() {
        return Ok(None);
    }
    let ranges = split_ranges(split_keys)?;
    let alive = view.alive_nodes(state, now);
    let Some(placement) = place(&alive, ranges.len(), replication) else {
        return Ok(None);
    };
    let routes = ranges
        .into_iter()
        .zip(placement)
        .enumerate()
        .map(|(i, ((start_key, end_key), reps))| Route {
            group_id: i as u64 + 1,
            start_key,
            end_key,
            epoch: 1,
            replicas: reps
                .into_iter()
                .map(|id| Replica {
                    node_id: id,
                    addr: state.addr_of(id).unwrap_or_default().to_string(),
                })
                .collect(),
            leader_node_id: 0,
            leader_addr: String::new(),
        })
        .collect();
    Ok(Some(MetaCommand {
        cmd: Some(meta_command::Cmd::CreateGroups(CreateGroups { routes })),
    }))
}

/// The routes as served: replica addresses from the registry and the leader as last
/// reported, by group id.
pub fn routes_view(state: &MetaState, view: &LeaderView) -> Vec<Route> {
    state
        .routes()
        .values()
        .map(|r| {
            let mut r = r.clone();
            for rep in r.replicas.iter_mut() {
                if let Some(addr) = state.addr_of(rep.node_id) {
                    rep.addr = addr.to_string();
                }
            }
            if let Some(leader) = view.leader(r.group_id) {
                r.leader_node_id = leader;
                r.leader_addr = state.addr_of(leader).unwrap_or_default().to_string();
            }
            r
        })
        .collect()
}

/// The routing table as `GetRoutes` serves it: [`routes_view`] sorted by start key.
pub fn route_table(state: &MetaState, view: &LeaderView) -> Vec<Route> {
    let mut routes = routes_view(state, view);
    routes.sort_by(|a, b| a.start_key.cmp(&b.start_key));
    routes
}

/// The cluster as `GetClusterResponse` shows it at `now` (nodes by id, groups by id).
pub fn cluster_view(
    state: &MetaState,
    view: &LeaderView,
    now: Instant,
    meta_leader: u64,
) -> GetClusterResponse {
    let nodes = state
        .nodes()
        .values()
        .map(|n| {
            let hb = view.last_heartbeat(n.node_id);
            NodeInfo {
                node_id: n.node_id,
                addr: n.addr.clone(),
                last_heartbeat_ms_ago: hb.map_or(u64::MAX, |(t, _)| {
                    now.saturating_duration_since(t).as_millis() as u64
                }),
                alive: view.is_alive(n.node_id, now),
                stats: hb.map(|(_, s)| *s),
            }
        })
        .collect();
    let groups = routes_view(state, view)
        .into_iter()
        .map(|route| GroupInfo {
            replicas: view.replicas_of(route.group_id),
            route: Some(route),
        })
        .collect();
    GetClusterResponse {
        error: None,
        nodes,
        groups,
        meta_leader_node_id: meta_leader,
    }
}

/// Validates a heartbeat and says whether its node must be (re-)registered: the
/// `RegisterNode` command to propose when the node is new or its address changed.
pub fn registration(state: &MetaState, hb: &HeartbeatRequest) -> Result<Option<MetaCommand>> {
    if hb.node_id == 0 || hb.addr.is_empty() {
        return Err(Error::BadHeartbeat);
    }
    if state.addr_of(hb.node_id) == Some(hb.addr.as_str()) {
        return Ok(None);
    }
    Ok(Some(MetaCommand {
        cmd: Some(meta_command::Cmd::RegisterNode(Replica {
            node_id: hb.node_id,
            addr: hb.addr.clone(),
        })),
    }))
}

/// The placement commands for `node`, given the replicas it reports hosting: create
/// every replica the routing table puts on it that it does not host.
pub fn placement_commands(
    state: &MetaState,
    view: &LeaderView,
    node: u64,
    hosted: &[ReplicaStats],
) -> Vec<PlacementCommand> {
    let hosted: HashSet<u64> = hosted.iter().map(|s| s.group_id).collect();
    routes_view(state, view)
        .into_iter()
        .filter(|route| {
            route.replicas.iter().any(|x| x.node_id == node) && !hosted.contains(&route.group_id)
        })
        .map(|route| PlacementCommand {
            cmd: Some(placement_command::Cmd::CreateReplica(CreateReplica {
                route: Some(route),
            })),
        })
        .collect()
}
