//! The meta leader's decisions: bootstrap placement, placement commands answered to
//! heartbeats, registration of new or moved nodes, and the views served by
//! `GetRoutes` / `GetCluster`.
//!
//! Everything here is a pure function of the replicated [`MetaState`] and the leader's
//! [`LeaderView`]; the host proposes the commands and sends the answers.

use std::time::Instant;

use bytes::Bytes;
use phoenix_proto::{
    meta_command, placement_command, CreateGroups, CreateReplica, DestroyReplica,
    GetClusterResponse, GroupInfo, HeartbeatRequest, MetaCommand, NodeInfo, PlacementCommand,
    Replica, Route, SplitGroup,
};

use crate::error::{Error, Result};
use crate::liveness::LeaderView;
use crate::state::{MetaState, META_GROUP};

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

/// Most groups [`even_split_keys`] cuts the key space into.
pub const INITIAL_GROUPS_MAX: usize = 1 << 20;

/// The `n - 1` split keys that cut the key space into `n` ranges of equal width over
/// its first four bytes (each key is four bytes, big-endian `i * 2^32 / n`): keys
/// spread over the binary space (e.g. hashed) fall evenly into the groups.
pub fn even_split_keys(n: usize) -> Result<Vec<Vec<u8>>> {
    if n == 0 || n > INITIAL_GROUPS_MAX {
        return Err(Error::BadSplitKeys);
    }
    Ok((1..n as u128)
        .map(|i| (((i << 32) / n as u128) as u32).to_be_bytes().to_vec())
        .collect())
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
                    protocol: 0,
                    node_id: id,
                    addr: state.addr_of(id).unwrap_or_default().to_string(),
                })
                .collect(),
            leader_node_id: 0,
            leader_addr: String::new(),
            conf_version: 0,
            learners: Vec::new(),
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
        .map(|r| route_view(state, view, r))
        .collect()
}

/// One route as served (see [`routes_view`]).
fn route_view(state: &MetaState, view: &LeaderView, r: &Route) -> Route {
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
                draining: state.draining(n.node_id),
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
        // (The host adds its operators: they are not the meta state's.)
        operators: Vec::new(),
        scrub_mismatches: crate::scrub::scrub_mismatches(view),
        meta_group: view.meta_route().map(|r| GroupInfo {
            route: Some(r.clone()),
            replicas: view.replicas_of(META_GROUP),
        }),
    }
}

/// Whether `addr` is something other nodes and clients can dial: `host:port`, the host
/// a name or an IP address (IPv6 in brackets), no scheme, no spaces, at most 255 bytes.
/// Checked on every heartbeat, and by a node on its own addresses at start.
pub fn check_addr(addr: &str) -> std::result::Result<(), &'static str> {
    if addr.is_empty() {
        return Err("is empty");
    }
    if addr.len() > 255 {
        return Err("is longer than 255 bytes");
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err("is not host:port");
    };
    if !port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u16>().is_err() {
        return Err("has no port number");
    }
    let bracketed = host.starts_with('[') && host.ends_with(']') && host.len() > 2;
    let plain = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    if !(plain
        || bracketed
            && host[1..host.len() - 1]
                .parse::<std::net::Ipv6Addr>()
                .is_ok())
    {
        return Err("has no host name or IP address before the port");
    }
    Ok(())
}

/// Validates a heartbeat and says whether its node must be (re-)registered: the
/// `RegisterNode` command to propose when the node is new, its address changed or it
/// applies other meta commands than its record says (its `protocol` changed).
pub fn registration(state: &MetaState, hb: &HeartbeatRequest) -> Result<Option<MetaCommand>> {
    if hb.node_id == 0 {
        return Err(Error::BadHeartbeat("node id 0".into()));
    }
    check_addr(&hb.addr).map_err(|why| {
        Error::BadHeartbeat(format!("node {}: address {:?} {why}", hb.node_id, hb.addr))
    })?;
    let protocol = hb.stats.as_ref().map_or(0, |s| s.protocol);
    // Once every other registered node applies a gated command kind (increments at 6,
    // key expiry at 7), data groups may hold it: a new node whose binary would take it
    // for an empty command must not join and host replicas. While some node is older,
    // none was proposed. (A registered node keeps its record: one not upgraded yet is
    // heard as before, and one downgraded has its fall recorded, which closes the gate
    // at once — although what the logs already hold it cannot apply: docs/resp.md.)
    let floor = state
        .nodes()
        .values()
        .filter(|n| n.node_id != hb.node_id)
        .map(|n| n.protocol)
        .min();
    if let Some(floor) = floor {
        if floor >= crate::state::PROTOCOL_INCR
            && protocol < floor
            && !state.nodes().contains_key(&hb.node_id)
        {
            return Err(Error::BadHeartbeat(format!(
                "node {}: its binary is at protocol level {protocol}, and every other node \
                 at {floor} or above (their groups may hold commands it cannot apply): \
                 upgrade it",
                hb.node_id
            )));
        }
    }
    if let Some(n) = state.nodes().get(&hb.node_id) {
        // (A level that fell is a downgraded binary: recorded too, so that no command
        // kind it cannot apply is proposed once it is heard from.)
        if n.addr == hb.addr && n.protocol == protocol {
            return Ok(None);
        }
    }
    Ok(Some(MetaCommand {
        cmd: Some(meta_command::Cmd::RegisterNode(Replica {
            node_id: hb.node_id,
            addr: hb.addr.clone(),
            protocol,
        })),
    }))
}

/// The `UpdateRoute` commands that bring the routing table up to the memberships the
/// groups' leaders report applying: one per group whose leader (as last heard) reports a
/// newer conf version than its route's. A membership naming a node not registered is
/// left for later (its address is not known).
pub fn route_updates(state: &MetaState, view: &LeaderView) -> Vec<MetaCommand> {
    route_updates_memo(state, view, &mut None)
}

/// [`route_updates`], skipping its walk over every route while neither the table nor
/// the recorded replicas changed since it last found nothing: at 10,000 idle groups
/// the walk costs the meta leader a tenth of its time for nothing.
pub fn route_updates_quiet(state: &MetaState, view: &mut LeaderView) -> Vec<MetaCommand> {
    let mut quiet = view.quiet_routes.take();
    let cmds = route_updates_memo(state, view, &mut quiet);
    view.quiet_routes = quiet;
    cmds
}

/// [`route_updates`] with its memo: `quiet` is the (table applied index, view changes)
/// at which the walk last found nothing, updated here.
fn route_updates_memo(
    state: &MetaState,
    view: &LeaderView,
    quiet: &mut Option<(u64, u64)>,
) -> Vec<MetaCommand> {
    let key = (state.applied(), view.changes());
    if *quiet == Some(key) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for route in state.routes().values() {
        let g = route.group_id;
        let Some(rep) = view.leader(g).and_then(|l| view.replica(l, g)) else {
            continue;
        };
        if rep.conf_version <= route.conf_version || rep.voters.is_empty() {
            continue;
        }
        let replicas: Option<Vec<Replica>> = rep
            .voters
            .iter()
            .chain(&rep.learners)
            .map(|id| {
                state.nodes().get(id).map(|n| Replica {
                    node_id: n.node_id,
                    addr: n.addr.clone(),
                    // (A route's replicas name nodes; the level is the node record's.)
                    protocol: 0,
                })
            })
            .collect();
        let Some(replicas) = replicas else { continue };
        out.push(MetaCommand {
            cmd: Some(meta_command::Cmd::UpdateRoute(Route {
                replicas,
                learners: rep.learners.clone(),
                conf_version: rep.conf_version,
                leader_node_id: 0,
                leader_addr: String::new(),
                ..route.clone()
            })),
        });
    }
    *quiet = out.is_empty().then_some(key);
    out
}

/// The placement commands for `node`, given the replicas its reports (recorded in
/// `view`) say it hosts: create every replica the routing table puts on it that it does
/// not host, and destroy every replica it hosts that the table's membership leaves out
/// (`DestroyReplica`, naming the table's membership version: a replica whose own
/// membership is newer, e.g. added back since, is not destroyed). A replica reporting
/// a newer membership than the table's is left alone too: the table follows.
pub fn placement_commands(
    state: &MetaState,
    view: &LeaderView,
    node: u64,
) -> Vec<PlacementCommand> {
    placement_commands_memo(state, view, node, &mut None)
}

/// [`placement_commands`], skipping its walks over every route and every replica
/// `node` hosts (replicas to create, to destroy, merged leftovers) while neither the
/// table nor the node's reports changed since they last found nothing: a node
/// hosting 10,000 idle groups asks every heartbeat.
pub fn placement_commands_quiet(
    state: &MetaState,
    view: &mut LeaderView,
    node: u64,
) -> Vec<PlacementCommand> {
    let mut quiet = view.quiet_placement.get(&node).copied();
    let cmds = placement_commands_memo(state, view, node, &mut quiet);
    match quiet {
        Some(k) => view.quiet_placement.insert(node, k),
        None => view.quiet_placement.remove(&node),
    };
    cmds
}

/// [`placement_commands`] with its memo: `quiet` is the (table applied index, node's
/// report changes) at which the walks last found nothing, updated here.
fn placement_commands_memo(
    state: &MetaState,
    view: &LeaderView,
    node: u64,
    quiet: &mut Option<(u64, u64)>,
) -> Vec<PlacementCommand> {
    let key = (state.applied(), view.node_changes(node));
    // (Skipped: the walks below found nothing at this table and these reports.)
    let walk = *quiet != Some(key);
    // Only the missing routes are copied: a node hosting all of 10,000 groups asks
    // every heartbeat.
    let create: Vec<PlacementCommand> = if walk {
        state
            .routes()
            .values()
            .filter(|route| {
                route.replicas.iter().any(|x| x.node_id == node)
                    && !view.hosts(node, route.group_id)
            })
            .map(|route| PlacementCommand {
                cmd: Some(placement_command::Cmd::CreateReplica(CreateReplica {
                    route: Some(route_view(state, view, route)),
                })),
            })
            .collect()
    } else {
        Vec::new()
    };
    let destroy: Vec<PlacementCommand> = if walk {
        view.hosted(node)
            .filter_map(|rep| {
                let route = state.routes().get(&rep.group_id)?;
                let listed = route.replicas.iter().any(|x| x.node_id == node);
                (!listed && rep.conf_version <= route.conf_version).then(|| PlacementCommand {
                    cmd: Some(placement_command::Cmd::DestroyReplica(DestroyReplica {
                        group_id: route.group_id,
                        conf_version: route.conf_version,
                    })),
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    // A planned split goes to the group's leader, as long as its report shows the
    // range epoch the split was planned at (past it, the split is applied).
    let split = state.splits().values().filter_map(|plan| {
        let g = plan.group_id;
        let rep = view.replica(node, g)?;
        (view.leader(g) == Some(node) && rep.is_leader && rep.epoch == plan.epoch).then(|| {
            PlacementCommand {
                cmd: Some(placement_command::Cmd::SplitGroup(SplitGroup {
                    group_id: g,
                    split_key: plan.split_key.clone(),
                    new_group_id: plan.new_group_id,
                    epoch: plan.epoch,
                })),
            }
        })
    });
    let merge = crate::merge::merge_commands(state, view, node);
    let merged = if walk {
        crate::merge::merged_leftovers(state, view, node)
    } else {
        Vec::new()
    };
    *quiet = (create.is_empty() && destroy.is_empty() && merged.is_empty()).then_some(key);
    create
        .into_iter()
        .chain(meta_placement(state, view, node))
        .chain(destroy)
        .chain(split)
        .chain(merge)
        .chain(merged)
        .collect()
}

/// The placement command for `node`'s meta replica, by the meta group's membership
/// (the meta leader's own, [`LeaderView::meta_route`]) as for a data group: create it
/// on a node the membership lists that does not report one, destroy it on a node that
/// reports one the membership leaves out at a membership version not newer than the
/// leader's. Only for nodes whose binary reports its meta replica (an older one would
/// be told to create what it hosts unreported).
fn meta_placement(state: &MetaState, view: &LeaderView, node: u64) -> Option<PlacementCommand> {
    let route = view.meta_route()?;
    let reports = state
        .nodes()
        .get(&node)
        .is_some_and(|r| r.protocol >= crate::state::PROTOCOL_META_MEMBERS);
    if !reports {
        return None;
    }
    let listed = route.replicas.iter().any(|x| x.node_id == node);
    let cmd = match view.replica(node, META_GROUP) {
        None if listed => placement_command::Cmd::CreateReplica(CreateReplica {
            route: Some(route.clone()),
        }),
        Some(rep) if !listed && rep.conf_version <= route.conf_version => {
            placement_command::Cmd::DestroyReplica(DestroyReplica {
                group_id: META_GROUP,
                conf_version: route.conf_version,
            })
        }
        _ => return None,
    };
    Some(PlacementCommand { cmd: Some(cmd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::liveness::Report;
    use crate::state::{route_contains, validate_table, Applied};
    use phoenix_proto::{NodeStats, ReplicaStats};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::time::Duration;

    fn registered(ids: &[u64]) -> MetaState {
        let mut st = MetaState::default();
        for (i, id) in ids.iter().enumerate() {
            let cmd = MetaCommand {
                cmd: Some(meta_command::Cmd::RegisterNode(Replica {
                    protocol: 0,
                    node_id: *id,
                    addr: format!("h:{id}"),
                })),
            };
            st.apply(i as u64 + 1, &cmd).unwrap();
        }
        st
    }

    fn heard(ids: &[u64], at: Instant) -> LeaderView {
        let mut v = LeaderView::default();
        for id in ids {
            v.record(at, *id, NodeStats::default(), &[]);
        }
        v
    }

    fn routes_of(cmd: &MetaCommand) -> Vec<Route> {
        match &cmd.cmd {
            Some(meta_command::Cmd::CreateGroups(cg)) => cg.routes.clone(),
            other => panic!("expected CreateGroups, got {other:?}"),
        }
    }

    /// A node is told to destroy a replica the table's membership leaves out, unless
    /// its replica's own membership is newer than the table's.
    #[test]
    fn replicas_left_out_of_the_table_are_destroyed() {
        let now = Instant::now();
        let mut st = registered(&[1, 2, 3, 4]);
        let route = |g: u64, nodes: &[u64], version: u64| Route {
            group_id: g,
            start_key: Bytes::from(if g == 1 { vec![] } else { vec![b'a' + g as u8] }),
            end_key: Bytes::from(if g == 1 { vec![b'c'] } else { vec![] }),
            epoch: 1,
            replicas: nodes
                .iter()
                .map(|&id| Replica {
                    protocol: 0,
                    node_id: id,
                    addr: format!("h:{id}"),
                })
                .collect(),
            conf_version: version,
            ..Route::default()
        };
        let cmd = MetaCommand {
            cmd: Some(meta_command::Cmd::CreateGroups(CreateGroups {
                routes: vec![route(1, &[1, 2, 3], 0), route(2, &[1, 2, 3], 0)],
            })),
        };
        st.apply(st.applied() + 1, &cmd).unwrap();
        // Node 3 left group 1 at 30, group 2 at 40.
        for (g, v) in [(1, 30), (2, 40)] {
            let cmd = MetaCommand {
                cmd: Some(meta_command::Cmd::UpdateRoute(route(g, &[1, 2], v))),
            };
            st.apply(st.applied() + 1, &cmd).unwrap();
        }
        let rep = |g: u64, version: u64| ReplicaStats {
            group_id: g,
            node_id: 3,
            conf_version: version,
            ..ReplicaStats::default()
        };
        let mut v = LeaderView::default();
        // Group 1's replica is behind the table (it never applied its removal); group
        // 2's was added back at 50, which the table has not heard of yet.
        v.record(now, 3, NodeStats::default(), &[rep(1, 0), rep(2, 50)]);
        let cmds = placement_commands(&st, &v, 3);
        assert_eq!(
            cmds,
            vec![PlacementCommand {
                cmd: Some(placement_command::Cmd::DestroyReplica(DestroyReplica {
                    group_id: 1,
                    conf_version: 30,
                })),
            }]
        );
        // Nodes the table lists are told nothing of the kind.
        v.record(
            now,
            1,
            NodeStats::default(),
            &[ReplicaStats {
                group_id: 1,
                node_id: 1,
                ..ReplicaStats::default()
            }],
        );
        assert!(placement_commands(&st, &v, 1)
            .iter()
            .all(|c| !matches!(c.cmd, Some(placement_command::Cmd::DestroyReplica(_)))));
    }

    /// The walks skipped while nothing they read changed find what a fresh walk finds:
    /// after every step of random reports (whole, partial, repeated, with removals) and
    /// table changes, the quiet placement commands and route updates equal the ones
    /// computed afresh, and some steps were answered from the memo.
    #[test]
    fn quiet_walks_find_what_a_fresh_walk_finds() {
        use std::collections::HashMap;
        let nodes = [1u64, 2, 3, 4];
        let (mut skipped, mut routes_skipped, mut leftovers) = (0, 0, 0);
        for seed in 0..300u64 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let now = Instant::now();
            let mut st = registered(&nodes);
            let members = |rng: &mut ChaCha8Rng| -> Vec<u64> {
                let mut m: Vec<u64> = nodes
                    .iter()
                    .copied()
                    .filter(|_| rng.gen_bool(0.7))
                    .collect();
                if m.is_empty() {
                    m.push(nodes[rng.gen_range(0..nodes.len())]);
                }
                m
            };
            let replicas = |ids: &[u64]| -> Vec<Replica> {
                ids.iter()
                    .map(|&id| Replica {
                        protocol: 0,
                        node_id: id,
                        addr: format!("h:{id}"),
                    })
                    .collect()
            };
            let bounds = ["", "d", "h", "p", ""];
            let routes: Vec<Route> = (1..=4u64)
                .map(|g| Route {
                    group_id: g,
                    start_key: Bytes::from(bounds[g as usize - 1]),
                    end_key: Bytes::from(bounds[g as usize]),
                    epoch: 1,
                    replicas: replicas(&members(&mut rng)),
                    ..Route::default()
                })
                .collect();
            let cmd = MetaCommand {
                cmd: Some(meta_command::Cmd::CreateGroups(CreateGroups { routes })),
            };
            st.apply(st.applied() + 1, &cmd).unwrap();
            let mut v = LeaderView::default();
            let mut seqs: HashMap<u64, u64> = HashMap::new();
            for step in 0..60 {
                let n = nodes[rng.gen_range(0..nodes.len())];
                // Group 5 is in no route: a merged source left over when it names a
                // merge target.
                let stats = |rng: &mut ChaCha8Rng, g: u64| ReplicaStats {
                    group_id: g,
                    node_id: n,
                    is_leader: rng.gen_bool(0.3),
                    term: rng.gen_range(1..4),
                    applied_index: rng.gen_range(0..3),
                    conf_version: rng.gen_range(0..4),
                    voters: members(rng),
                    epoch: if g == 5 { 0 } else { 1 },
                    start_key: Bytes::from(if g == 5 { "e" } else { "" }),
                    end_key: Bytes::from(if g == 5 { "f" } else { "" }),
                    merging_into: if g == 5 { rng.gen_range(0..2) } else { 0 },
                    scrub_age_ms: rng.gen_range(0..2),
                    ..ReplicaStats::default()
                };
                match rng.gen_range(0..6) {
                    0 => {
                        let mut reps = Vec::new();
                        for g in 1..=5 {
                            if rng.gen_bool(0.6) {
                                reps.push(stats(&mut rng, g));
                            }
                        }
                        let seq = seqs.get(&n).map_or(1, |s| s + 1);
                        v.record_report(now, n, NodeStats::default(), &reps, &Report::full(seq));
                        seqs.insert(n, seq);
                    }
                    1..=3 => {
                        let Some(&base) = seqs.get(&n) else { continue };
                        // Changed replicas, some repeated as held or with only their scrub
                        // age moved, some removed; now and then on a base the view does
                        // not hold (taken as nothing).
                        let mut reps = Vec::new();
                        let mut removed = Vec::new();
                        for g in 1..=5 {
                            match rng.gen_range(0..5) {
                                0 => reps.push(stats(&mut rng, g)),
                                1 => reps.extend(v.replica(n, g).cloned()),
                                2 => reps.extend(v.replica(n, g).map(|r| ReplicaStats {
                                    scrub_age_ms: r.scrub_age_ms + 1,
                                    ..r.clone()
                                })),
                                3 if rng.gen_bool(0.3) => removed.push(g),
                                _ => {}
                            }
                        }
                        let held = rng.gen_bool(0.9);
                        let report = Report {
                            seq: base + 1,
                            base: Some(if held { base } else { base + 7 }),
                            removed,
                        };
                        let taken = v.record_report(now, n, NodeStats::default(), &reps, &report);
                        assert_eq!(taken, held);
                        if taken {
                            seqs.insert(n, base + 1);
                        } else {
                            seqs.remove(&n);
                        }
                    }
                    4 => {
                        // The table follows the leaders, or changes by itself.
                        let mut cmds = route_updates(&st, &v);
                        if cmds.is_empty() || rng.gen_bool(0.3) {
                            let g = rng.gen_range(1..=4u64);
                            let cur = st.routes()[&g].clone();
                            cmds.push(MetaCommand {
                                cmd: Some(meta_command::Cmd::UpdateRoute(Route {
                                    replicas: replicas(&members(&mut rng)),
                                    conf_version: cur.conf_version + rng.gen_range(1..3),
                                    ..cur
                                })),
                            });
                        }
                        for cmd in cmds {
                            let _ = st.apply(st.applied() + 1, &cmd);
                        }
                    }
                    _ => {}
                }
                for n in nodes {
                    let before = v.quiet_placement.get(&n).copied();
                    let fresh = placement_commands(&st, &v, n);
                    let quiet = placement_commands_quiet(&st, &mut v, n);
                    assert_eq!(quiet, fresh, "seed {seed} step {step}: node {n}");
                    if before.is_some() && before == v.quiet_placement.get(&n).copied() {
                        skipped += 1;
                    }
                }
                let before = v.quiet_routes;
                let fresh = route_updates(&st, &v);
                assert_eq!(
                    route_updates_quiet(&st, &mut v),
                    fresh,
                    "seed {seed} step {step}: route updates"
                );
                if before.is_some() && before == v.quiet_routes {
                    routes_skipped += 1;
                }
                leftovers += placement_commands(&st, &v, n)
                    .iter()
                    .filter(|c| {
                        matches!(&c.cmd, Some(placement_command::Cmd::DestroyReplica(d)) if d.group_id == 5)
                    })
                    .count();
            }
        }
        assert!(skipped > 1000, "the memo answered only {skipped} times");
        assert!(
            routes_skipped > 1000,
            "route updates skipped only {routes_skipped} times"
        );
        assert!(
            leftovers > 100,
            "merged leftovers found only {leftovers} times"
        );
    }

    #[test]
    fn placement_round_robin() {
        assert_eq!(place(&[1, 2], 1, 3), None);
        assert_eq!(place(&[1, 2, 3], 1, 0), None);
        assert_eq!(
            place(&[1, 2, 3], 2, 3),
            Some(vec![vec![1, 2, 3], vec![1, 2, 3]])
        );
        assert_eq!(
            place(&[1, 2, 3, 4], 2, 3),
            Some(vec![vec![1, 2, 3], vec![2, 3, 4]])
        );
        assert_eq!(
            place(&[1, 2, 3, 4], 3, 1),
            Some(vec![vec![1], vec![2], vec![3]])
        );
    }

    #[test]
    fn split_ranges_cover_the_key_space() {
        assert_eq!(
            split_ranges(&[]).unwrap(),
            vec![(Bytes::new(), Bytes::new())]
        );
        let r = split_ranges(&[b"b".to_vec(), b"d".to_vec()]).unwrap();
        assert_eq!(
            r,
            vec![
                (Bytes::new(), Bytes::from_static(b"b")),
                (Bytes::from_static(b"b"), Bytes::from_static(b"d")),
                (Bytes::from_static(b"d"), Bytes::new()),
            ]
        );
        for bad in [
            vec![b"d".to_vec(), b"b".to_vec()],
            vec![b"b".to_vec(), b"b".to_vec()],
            vec![Vec::new()],
        ] {
            assert!(
                matches!(split_ranges(&bad), Err(Error::BadSplitKeys)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bootstrap_waits_for_enough_live_nodes() {
        let st = registered(&[1, 2, 3]);
        let t0 = Instant::now();
        // Only two heard from.
        let v = heard(&[1, 2], t0);
        assert!(bootstrap_plan(&st, &v, t0, &[], 3).unwrap().is_none());
        // Three heard from, but one too long ago.
        let mut v = heard(&[1, 2], t0 + Duration::from_secs(10));
        v.record(t0, 3, NodeStats::default(), &[]);
        assert!(
            bootstrap_plan(&st, &v, t0 + Duration::from_secs(10), &[], 3)
                .unwrap()
                .is_none()
        );
        // Bad split keys are an error, not a plan.
        let v = heard(&[1, 2, 3], t0);
        assert!(matches!(
            bootstrap_plan(&st, &v, t0, &[b"b".to_vec(), b"a".to_vec()], 3),
            Err(Error::BadSplitKeys)
        ));
        // One group over everything, epoch 1, addresses from the registry.
        let cmd = bootstrap_plan(&st, &v, t0, &[], 3).unwrap().unwrap();
        let routes = routes_of(&cmd);
        assert_eq!(routes.len(), 1);
        let r = &routes[0];
        assert_eq!((r.group_id, r.epoch), (1, 1));
        assert!(r.start_key.is_empty() && r.end_key.is_empty());
        let reps: Vec<(u64, &str)> = r
            .replicas
            .iter()
            .map(|x| (x.node_id, x.addr.as_str()))
            .collect();
        assert_eq!(reps, vec![(1, "h:1"), (2, "h:2"), (3, "h:3")]);
        // Once applied, nothing more to do.
        let mut st = st;
        assert!(matches!(st.apply(10, &cmd), Ok(Applied::Changed(_))));
        assert!(bootstrap_plan(&st, &v, t0, &[], 3).unwrap().is_none());
    }

    /// Random split keys and node counts: the plan is a valid routing table (contiguous,
    /// covering, no overlap), every key falls in exactly one route, the state accepts it.
    /// `PHOENIX_SEED` replays a run.
    #[test]
    fn even_split_keys_cut_equal_ranges() {
        assert_eq!(even_split_keys(1).unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(
            even_split_keys(4).unwrap(),
            vec![
                vec![0x40, 0, 0, 0],
                vec![0x80, 0, 0, 0],
                vec![0xc0, 0, 0, 0]
            ]
        );
        for n in [2, 3, 7, 1000, 10_000] {
            let keys = even_split_keys(n).unwrap();
            assert_eq!(keys.len(), n - 1);
            // Valid split keys (sorted, distinct, non-empty), ranges within one of n.
            let ranges = split_ranges(&keys).unwrap();
            assert_eq!(ranges.len(), n);
            let width = |k: &[u8]| u32::from_be_bytes(k.try_into().unwrap()) as u64;
            for w in keys.windows(2) {
                let d = width(&w[1]) - width(&w[0]);
                let ideal = (1u64 << 32) / n as u64;
                assert!(d.abs_diff(ideal) <= 1, "n {n}: width {d} vs {ideal}");
            }
        }
        assert!(even_split_keys(0).is_err());
        assert!(even_split_keys(INITIAL_GROUPS_MAX + 1).is_err());
    }

    #[test]
    fn bootstrap_with_split_keys_is_a_whole_table() {
        let seed: u64 = std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| rand::thread_rng().gen());
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..200 {
            let nodes: Vec<u64> = (1..=rng.gen_range(3..7u64)).collect();
            let mut keys: Vec<Vec<u8>> = (0..rng.gen_range(0..8))
                .map(|_| {
                    (0..rng.gen_range(1..4))
                        .map(|_| rng.gen_range(0..4u8))
                        .collect()
                })
                .collect();
            keys.sort();
            keys.dedup();
            let st = registered(&nodes);
            let t = Instant::now();
            let v = heard(&nodes, t);
            let cmd = bootstrap_plan(&st, &v, t, &keys, 3)
                .unwrap()
                .unwrap_or_else(|| panic!("seed {seed}: no plan"));
            let routes = routes_of(&cmd);
            assert_eq!(routes.len(), keys.len() + 1, "seed {seed}");
            validate_table(&routes).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            for r in &routes {
                assert_eq!(r.replicas.len(), 3, "seed {seed}");
            }
            for _ in 0..20 {
                let k: Vec<u8> = (0..rng.gen_range(0..5))
                    .map(|_| rng.gen_range(0..5u8))
                    .collect();
                let n = routes.iter().filter(|r| route_contains(r, &k)).count();
                assert_eq!(n, 1, "seed {seed}: key {k:?} in {n} routes");
            }
            let mut st = st;
            assert!(
                matches!(st.apply(100, &cmd), Ok(Applied::Changed(_))),
                "seed {seed}"
            );
            st.check().unwrap();
        }
    }

    #[test]
    fn registration_of_new_and_moved_nodes() {
        let st = registered(&[1]);
        let hb = |id: u64, addr: &str| HeartbeatRequest {
            node_id: id,
            addr: addr.into(),
            ..HeartbeatRequest::default()
        };
        assert!(matches!(
            registration(&st, &hb(0, "h:0")),
            Err(Error::BadHeartbeat(_))
        ));
        // An address no one could dial is refused, saying why; it is not registered.
        for bad in [
            "",
            "h",
            "h:",
            "h:port",
            "h:70000",
            ":7001",
            "http://h:7001",
            "h h:7001",
            "h/x:7001",
            "[nope]:7001",
        ] {
            let e = registration(&st, &hb(4, bad)).unwrap_err();
            assert!(
                matches!(&e, Error::BadHeartbeat(why) if why.contains("address")),
                "{bad:?}: {e}"
            );
        }
        for good in [
            "10.0.0.1:7001",
            "node-4.example:7001",
            "[::1]:7001",
            "localhost:1",
        ] {
            assert!(registration(&st, &hb(4, good)).unwrap().is_some(), "{good}");
        }
        assert!(registration(&st, &hb(1, "h:1")).unwrap().is_none());
        for (id, addr) in [(1, "moved:1"), (2, "h:2")] {
            let cmd = registration(&st, &hb(id, addr)).unwrap().unwrap();
            assert_eq!(
                cmd.cmd,
                Some(meta_command::Cmd::RegisterNode(Replica {
                    protocol: 0,
                    node_id: id,
                    addr: addr.into()
                }))
            );
        }
    }

    #[test]
    fn older_binaries_stay_out_once_every_node_applies_increments() {
        let hb = |id: u64, protocol: u32| HeartbeatRequest {
            node_id: id,
            addr: format!("h:{id}"),
            stats: Some(NodeStats {
                protocol,
                ..NodeStats::default()
            }),
            ..HeartbeatRequest::default()
        };
        let register = |st: &mut MetaState, index: u64, id: u64, protocol: u32| {
            let cmd = registration(st, &hb(id, protocol)).unwrap().unwrap();
            st.apply(index, &cmd).unwrap();
        };
        let mut st = MetaState::default();
        // The first node of a cluster is welcome at any level; so is any node while
        // some other is older than increments (none can have been proposed).
        register(&mut st, 1, 1, crate::PROTOCOL_INCR - 1);
        register(&mut st, 2, 2, crate::PROTOCOL_INCR);
        register(&mut st, 3, 3, crate::PROTOCOL_INCR - 1);
        register(&mut st, 4, 1, crate::PROTOCOL_INCR);
        // Node 3 is the last one not upgraded: it is heard as before (no new record,
        // and not refused, which would make it look dead).
        assert_eq!(
            registration(&st, &hb(3, crate::PROTOCOL_INCR - 1)).unwrap(),
            None
        );
        register(&mut st, 5, 3, crate::PROTOCOL_INCR);
        // Every node applies increments now: a new node below that is refused...
        for (id, protocol) in [(4, 0), (4, crate::PROTOCOL_INCR - 1)] {
            let e = registration(&st, &hb(id, protocol)).unwrap_err();
            assert!(
                matches!(&e, Error::BadHeartbeat(why) if why.contains("upgrade")),
                "node {id} at {protocol}: {e}"
            );
        }
        assert!(registration(&st, &hb(4, crate::PROTOCOL))
            .unwrap()
            .is_some());
        assert!(registration(&st, &hb(2, crate::PROTOCOL_INCR))
            .unwrap()
            .is_none());
        // ...and a registered one downgraded has its fall recorded: the lowest level
        // falls, and the nodes stop proposing increments.
        register(&mut st, 6, 2, crate::PROTOCOL_INCR - 1);
        assert_eq!(
            st.nodes().values().map(|n| n.protocol).min(),
            Some(crate::PROTOCOL_INCR - 1)
        );
    }

    #[test]
    fn placement_creates_missing_replicas_and_views_fill_in() {
        let mut st = registered(&[1, 2, 3, 4]);
        let t = Instant::now();
        let mut v = heard(&[1, 2, 3, 4], t);
        let cmd = bootstrap_plan(&st, &v, t, &[b"m".to_vec()], 3)
            .unwrap()
            .unwrap();
        st.apply(10, &cmd).unwrap();
        // Group 1 on 1,2,3; group 2 on 2,3,4. Node 3 moves: views use the registry.
        st.apply(
            11,
            &MetaCommand {
                cmd: Some(meta_command::Cmd::RegisterNode(Replica {
                    protocol: 0,
                    node_id: 3,
                    addr: "new:3".into(),
                })),
            },
        )
        .unwrap();
        let hosting = |g: u64, leader: bool| ReplicaStats {
            group_id: g,
            is_leader: leader,
            term: 1,
            ..ReplicaStats::default()
        };
        v.record(
            t,
            2,
            NodeStats::default(),
            &[hosting(1, false), hosting(2, true)],
        );

        let groups_of = |cmds: Vec<PlacementCommand>| -> Vec<(u64, Vec<String>)> {
            cmds.into_iter()
                .map(|c| match c.cmd {
                    Some(placement_command::Cmd::CreateReplica(cr)) => {
                        let r = cr.route.unwrap();
                        (r.group_id, r.replicas.into_iter().map(|x| x.addr).collect())
                    }
                    other => panic!("expected CreateReplica, got {other:?}"),
                })
                .collect()
        };
        assert_eq!(
            groups_of(placement_commands(&st, &v, 1)),
            vec![(1, vec!["h:1".into(), "h:2".into(), "new:3".into()])]
        );
        v.record(t, 3, NodeStats::default(), &[hosting(1, false)]);
        assert_eq!(
            groups_of(placement_commands(&st, &v, 3)),
            vec![(2, vec!["h:2".into(), "new:3".into(), "h:4".into()])]
        );
        assert!(placement_commands(&st, &v, 2).is_empty());
        assert!(placement_commands(&st, &v, 9).is_empty());

        let table = route_table(&st, &v);
        let ids: Vec<u64> = table.iter().map(|r| r.group_id).collect();
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(table[1].leader_node_id, 2);
        assert_eq!(table[1].leader_addr, "h:2");
        assert_eq!(table[0].leader_node_id, 0);

        let later = t + Duration::from_millis(1500);
        let c = cluster_view(&st, &v, later, 7);
        assert_eq!(c.meta_leader_node_id, 7);
        let nodes: Vec<(u64, bool, u64)> = c
            .nodes
            .iter()
            .map(|n| (n.node_id, n.alive, n.last_heartbeat_ms_ago))
            .collect();
        assert_eq!(
            nodes,
            vec![
                (1, true, 1500),
                (2, true, 1500),
                (3, true, 1500),
                (4, true, 1500)
            ]
        );
        let c = cluster_view(&st, &LeaderView::default(), later, 7);
        assert!(c
            .nodes
            .iter()
            .all(|n| !n.alive && n.last_heartbeat_ms_ago == u64::MAX));
        let c = cluster_view(&st, &v, later, 7);
        assert_eq!(c.groups.len(), 2);
        assert_eq!(c.groups[1].replicas.len(), 1);
        assert_eq!(c.groups[1].replicas[0].node_id, 2);
    }
}
