//! Replica repair: the meta leader replaces the replicas of nodes down longer than
//! `--down-after`, as seed 000's MetaServer and TiKV's PD do, and those of draining
//! nodes (`phoenix cluster drain`) alike.
//!
//! Decisions only; the [`Operators`] carry them out. The rule is stateless, so a new
//! meta leader picks up where the last one stopped: for each group whose route lists
//! a down node (lowest group id first),
//! - a learner there is removed (it holds no vote: nothing to replace);
//! - a voter there is removed once the group has `replication` voters on other nodes;
//! - otherwise a replica is added: on a live learner of the group if it has one (left
//!   by an addition that gave up), else on the live node hosting the fewest replicas
//!   (not full, not stopping, not in the group yet); once it is a voter the next pass
//!   removes the down one. Adding first keeps the group at its number of live voters
//!   throughout, and a group with no node to add to keeps its down replica (removing
//!   it would not make the group any safer).
//!
//! The meta group is repaired alike, first, to `meta_replication` voters (the number of
//! members `--meta` listed): its route is the meta leader's own
//! ([`LeaderView::meta_route`]), and only nodes whose binary reports a meta replica take
//! one.
//!
//! A group is left alone while an operator is under way on it, or while no live node is
//! known to lead it (without a quorum no membership change can commit). At most `max`
//! moves start per pass, so repair does not take every group's leader at once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::liveness::LeaderView;
use crate::operator::{eligible_nodes, Operators};
use crate::state::{MetaState, META_GROUP};

/// Repair operators under way at most: each catches a replica up (a snapshot, often),
/// which takes disk and network from client traffic (each node's snapshot streams share
/// its `--snapshot-mb-per-sec`). As PD's default replica schedule limit.
pub const REPAIR_INFLIGHT_MAX: usize = 64;

/// A membership change repair or the replica balancer asks the operators for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaMove {
    /// Add a replica of `group` on node `to`.
    Add {
        /// Group.
        group: u64,
        /// The node to host the new replica.
        to: u64,
    },
    /// Remove the replica of `group` on `node`.
    Remove {
        /// Group.
        group: u64,
        /// The node whose replica goes.
        node: u64,
    },
    /// Move the replica of `group` on `from` to `to`: an addition on `to`, after which
    /// the group's extra voter is trimmed from `from` (the balancers' moves; the trim
    /// comes from a later pass, which the operators remind of `from`).
    Move {
        /// Group.
        group: u64,
        /// The node whose replica goes once the new one is a voter.
        from: u64,
        /// The node to host the new replica.
        to: u64,
    },
}

impl ReplicaMove {
    /// The group moved.
    pub fn group(&self) -> u64 {
        match *self {
            ReplicaMove::Add { group, .. }
            | ReplicaMove::Remove { group, .. }
            | ReplicaMove::Move { group, .. } => group,
        }
    }
}

/// The registered nodes down at `now`: not heard from for `down_after` or longer.
/// A node not heard from since this meta leader took office (`since`) counts as down
/// from then on: its last heartbeat went to an earlier leader, if anywhere.
pub fn down_nodes(
    state: &MetaState,
    view: &LeaderView,
    now: Instant,
    since: Instant,
    down_after: Duration,
) -> Vec<u64> {
    state
        .nodes()
        .keys()
        .copied()
        .filter(|&n| {
            let last = view.last_heartbeat(n).map_or(since, |(t, _)| t.max(since));
            now.saturating_duration_since(last) >= down_after
        })
        .collect()
}

/// The next repair moves (at most `max`) for the groups with a replica on a node of
/// `down` or on a draining node, as the module doc says. Ties go to the lowest ids: the same view gives the
/// same moves.
#[allow(clippy::too_many_arguments)] // what is known, what is down, what is wanted
pub fn repair_replicas(
    state: &MetaState,
    view: &LeaderView,
    ops: &Operators,
    now: Instant,
    down: &[u64],
    replication: usize,
    meta_replication: usize,
    max: usize,
) -> Vec<ReplicaMove> {
    // Replicas on draining nodes are replaced like those on down nodes (their leaders
    // may stay where they are: a removal moves the leadership off first).
    let draining = state.draining_nodes();
    if (down.is_empty() && draining.is_empty()) || max == 0 {
        return Vec::new();
    }
    let is_down = |n: u64| down.contains(&n);
    let leaving = |n: u64| is_down(n) || draining.contains(&n);
    // Nodes that may take a replica, with how many they host (or are being given).
    let mut load: BTreeMap<u64, usize> = eligible_nodes(state, view, now, leaving)
        .into_iter()
        .map(|n| (n, 0))
        .collect();
    // The meta group first: every other repair needs it.
    let groups: Vec<(u64, &phoenix_proto::Route, usize)> = view
        .meta_route()
        .map(|r| (META_GROUP, r, meta_replication))
        .into_iter()
        .chain(state.routes().iter().map(|(&g, r)| (g, r, replication)))
        .collect();
    for &(g, route, _) in &groups {
        for r in &route.replicas {
            if let Some(c) = load.get_mut(&r.node_id) {
                *c += 1;
            }
        }
        // (An addition under way counts once: the table lists its learner early.)
        let pending = ops
            .add_target(g)
            .filter(|to| !route.replicas.iter().any(|r| r.node_id == *to));
        if let Some(c) = pending.and_then(|to| load.get_mut(&to)) {
            *c += 1;
        }
    }
    let mut moves = Vec::new();
    for &(g, route, replication) in &groups {
        if moves.len() >= max {
            break;
        }
        let Some(dead) = route
            .replicas
            .iter()
            .map(|r| r.node_id)
            .filter(|&n| leaving(n))
            // A learner first: it goes without anything to replace.
            .min_by_key(|&n| (!route.learners.contains(&n), n))
        else {
            continue;
        };
        if ops.busy(g) || view.leader(g).is_none_or(&is_down) {
            continue;
        }
        let voters_elsewhere = route
            .replicas
            .iter()
            .filter(|r| !leaving(r.node_id) && !route.learners.contains(&r.node_id))
            .count();
        if route.learners.contains(&dead) || voters_elsewhere >= replication {
            moves.push(ReplicaMove::Remove {
                group: g,
                node: dead,
            });
            continue;
        }
        // A learner left by an addition that gave up (e.g. a snapshot longer than its
        // time) is promoted rather than left to hold a copy while another node gets one.
        let learner = route
            .learners
            .iter()
            .copied()
            .filter(|n| load.contains_key(n))
            .min();
        let target = learner.or_else(|| {
            load.iter()
                .filter(|(&n, _)| !route.replicas.iter().any(|r| r.node_id == n))
                .filter(|(&n, _)| g != META_GROUP || reports_meta(state, n))
                .min_by_key(|(&n, &c)| (c, n))
                .map(|(&n, _)| n)
        });
        if let Some(to) = target {
            moves.push(ReplicaMove::Add { group: g, to });
            if let Some(c) = load.get_mut(&to) {
                *c += 1;
            }
        }
    }
    moves
}

/// The change that brings the meta group back to `meta_replication` voters when nothing
/// is down or draining in it (those are [`repair_replicas`]'s): data groups get the same
/// from the replica balancer, which leaves the meta group alone.
/// - A learner left by an addition that gave up is promoted if the group lacks a voter
///   and its node is fit for work, else removed.
/// - Too few voters (a user's removal, or a trim that cut a user's move in two when the
///   meta leadership moved): a replica is added on the fit node hosting the fewest
///   replicas whose binary reports a meta replica (none in a cluster with no such node).
/// - More than `max(meta_replication, 3)` voters (a replacement made a voter, then the
///   member it replaced came back before its removal): the voter, not the meta leader,
///   on a node not fit for work first, else on the node hosting the most replicas
///   (ties: the highest id), if the rest keep a live quorum. Never below 3: a meta
///   leader started with a shorter `--meta` must not trim the group to no fault
///   tolerance.
///
/// None while an operator is under way on the meta group, a user's addition or
/// removal on it ended lately ([`Operators::asked_lately`]: a `cluster move`'s removal
/// comes next), or this meta leader has been in office (since `since`) for less than
/// `ASKED_GRACE` (a user's move under the last leader may be between its steps).
#[allow(clippy::too_many_arguments)] // what is known, since when, what is wanted
pub fn resize_meta(
    state: &MetaState,
    view: &LeaderView,
    ops: &Operators,
    now: Instant,
    since: Instant,
    down: &[u64],
    meta_replication: usize,
) -> Option<ReplicaMove> {
    let route = view.meta_route()?;
    let leader = view.leader(META_GROUP)?;
    let voters: Vec<u64> = crate::operator::voters_of(route);
    let draining = state.draining_nodes();
    let leaving = |n: &u64| down.contains(n) || draining.contains(n);
    if ops.busy(META_GROUP)
        || ops.asked_lately(META_GROUP, now)
        || now.saturating_duration_since(since) < crate::operator::ASKED_GRACE
        || route.replicas.iter().any(|r| leaving(&r.node_id))
    {
        return None;
    }
    let fit = eligible_nodes(state, view, now, |_| false);
    let want = meta_replication.max(1);
    if let Some(&learner) = route.learners.iter().min() {
        let promote = voters.len() < want && fit.contains(&learner);
        return Some(if promote {
            ReplicaMove::Add {
                group: META_GROUP,
                to: learner,
            }
        } else {
            ReplicaMove::Remove {
                group: META_GROUP,
                node: learner,
            }
        });
    }
    let hosted = |n: u64| {
        state
            .routes()
            .values()
            .filter(|r| r.replicas.iter().any(|x| x.node_id == n))
            .count()
    };
    if voters.len() < want {
        let to = fit
            .iter()
            .copied()
            .filter(|n| !voters.contains(n) && reports_meta(state, *n))
            .min_by_key(|&n| (hosted(n), n))?;
        return Some(ReplicaMove::Add {
            group: META_GROUP,
            to,
        });
    }
    if voters.len() <= want.max(3) {
        return None;
    }
    let node = voters
        .iter()
        .copied()
        .filter(|&n| n != leader)
        .max_by_key(|&n| (!fit.contains(&n), hosted(n), n))?;
    // (The operator checks the quorum again when it starts.)
    let live = voters
        .iter()
        .filter(|&&n| n != node && view.is_alive(n, now))
        .count();
    (live > (voters.len() - 1) / 2).then_some(ReplicaMove::Remove {
        group: META_GROUP,
        node,
    })
}

/// Whether node `n`'s binary reports a meta replica (one that does not cannot be
/// followed as it catches up).
fn reports_meta(state: &MetaState, n: u64) -> bool {
    state
        .nodes()
        .get(&n)
        .is_some_and(|r| r.protocol >= crate::state::PROTOCOL_META_MEMBERS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::tests::{cluster, register, report, set_route, view};
    use crate::operator::Origin;
    use phoenix_proto::NodeStats;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const DOWN_AFTER: Duration = Duration::from_secs(30);

    /// Every node but `down` reports at `now` (leaders from `leader_of`); the down ones
    /// last reported `DOWN_AFTER` earlier.
    fn view_with_down(
        st: &MetaState,
        now: Instant,
        down: &[u64],
        leader_of: impl Fn(u64) -> u64,
    ) -> LeaderView {
        let mut v = view(st, now - DOWN_AFTER, &leader_of);
        for &id in st.nodes().keys().filter(|n| !down.contains(n)) {
            v.record(now, id, NodeStats::default(), &report(st, id, &leader_of));
        }
        v
    }

    #[test]
    fn nodes_not_heard_from_long_enough_are_down() {
        let t0 = Instant::now();
        let st = cluster(4, 1, |_| vec![1, 2, 3]);
        let mut v = LeaderView::default();
        v.record(t0, 1, NodeStats::default(), &[]);
        v.record(t0 + Duration::from_secs(20), 2, NodeStats::default(), &[]);
        // Node 3 last heard before this meta leader took office (t0); node 4 never.
        let now = t0 + DOWN_AFTER;
        assert_eq!(down_nodes(&st, &v, now, t0, DOWN_AFTER), vec![1, 3, 4]);
        // A meta leader in office for less than `down_after` finds nobody down for want
        // of heartbeats.
        let since = t0 + Duration::from_secs(10);
        assert_eq!(
            down_nodes(&st, &v, now, since, DOWN_AFTER),
            Vec::<u64>::new()
        );
    }

    /// A group with a voter on a down node gets a replica on the least loaded live node
    /// first, then loses the down one; a learner there goes at once.
    #[test]
    fn a_down_voter_is_replaced_before_it_is_removed() {
        let now = Instant::now();
        // Groups 1-3 on nodes 1, 2, 3; group 4 on 1, 2, 5: node 5 hosts more than 4.
        let mut st = cluster(5, 4, |g| if g == 4 { vec![1, 2, 5] } else { vec![1, 2, 3] });
        let ops = Operators::default();
        let v = view_with_down(&st, now, &[3], |_| 1);
        let down = down_nodes(&st, &v, now, now - DOWN_AFTER * 2, DOWN_AFTER);
        assert_eq!(down, vec![3]);
        let moves = repair_replicas(&st, &v, &ops, now, &down, 3, 3, 10);
        // Node 4 hosts nothing: it takes group 1, then group 2 (level with node 5, the
        // lower id); group 3 goes to node 5.
        assert_eq!(
            moves,
            vec![
                ReplicaMove::Add { group: 1, to: 4 },
                ReplicaMove::Add { group: 2, to: 4 },
                ReplicaMove::Add { group: 3, to: 5 },
            ]
        );
        assert_eq!(
            repair_replicas(&st, &v, &ops, now, &down, 3, 3, 2),
            moves[..2]
        );
        // Once node 4 is a voter of group 1, node 3 goes from it.
        set_route(&mut st, 1, &[1, 2, 3, 4], &[]);
        let v = view_with_down(&st, now, &[3], |_| 1);
        let moves = repair_replicas(&st, &v, &ops, now, &down, 3, 3, 1);
        assert_eq!(moves, vec![ReplicaMove::Remove { group: 1, node: 3 }]);
        // A learner on the down node goes without a replacement.
        set_route(&mut st, 2, &[1, 2, 4], &[3]);
        let v = view_with_down(&st, now, &[3], |_| 1);
        let moves = repair_replicas(&st, &v, &ops, now, &down, 3, 3, 10);
        assert_eq!(moves[1], ReplicaMove::Remove { group: 2, node: 3 });
        // A live learner left by an addition that gave up is promoted, not passed over
        // for another node.
        set_route(&mut st, 3, &[1, 2, 3], &[5]);
        let v = view_with_down(&st, now, &[3], |_| 1);
        let moves = repair_replicas(&st, &v, &ops, now, &down, 3, 3, 10);
        assert_eq!(moves[2], ReplicaMove::Add { group: 3, to: 5 });
    }

    /// The meta group's membership as the meta leader's replica holds it.
    fn meta_route(voters: &[u64], learners: &[u64], conf_version: u64) -> phoenix_proto::Route {
        phoenix_proto::Route {
            group_id: META_GROUP,
            epoch: 1,
            replicas: voters
                .iter()
                .chain(learners)
                .map(|&id| phoenix_proto::Replica {
                    protocol: 0,
                    node_id: id,
                    addr: format!("h:{id}"),
                })
                .collect(),
            learners: learners.to_vec(),
            conf_version,
            leader_node_id: 1,
            ..phoenix_proto::Route::default()
        }
    }

    /// `node`'s report of its meta replica, as the meta leader's route has it.
    fn meta_report(
        route: &phoenix_proto::Route,
        node: u64,
        applied: u64,
    ) -> phoenix_proto::ReplicaStats {
        phoenix_proto::ReplicaStats {
            group_id: META_GROUP,
            node_id: node,
            is_leader: node == route.leader_node_id,
            term: 1,
            commit_index: 500,
            applied_index: applied,
            conf_version: route.conf_version,
            voters: route
                .replicas
                .iter()
                .map(|r| r.node_id)
                .filter(|n| !route.learners.contains(n))
                .collect(),
            learners: route.learners.clone(),
            ..phoenix_proto::ReplicaStats::default()
        }
    }

    /// The commands for `node`'s heartbeat answer.
    fn commands(
        st: &MetaState,
        v: &LeaderView,
        ops: &Operators,
        node: u64,
    ) -> Vec<phoenix_proto::placement_command::Cmd> {
        crate::placement_commands(st, v, node)
            .into_iter()
            .chain(ops.commands_for(v, node))
            .filter_map(|c| c.cmd)
            .collect()
    }

    /// A meta member on a node down for good is replaced as a data group's replica is:
    /// a learner on a live node (told to create its replica from the meta leader's
    /// membership), promoted once caught up, then the down member removed and, when it
    /// comes back, told to drop its replica. A node whose binary does not report a
    /// meta replica takes none.
    #[test]
    fn a_down_meta_member_is_replaced() {
        use phoenix_proto::{placement_command::Cmd, ChangePeerKind};
        let now = Instant::now();
        let mut st = cluster(5, 1, |_| vec![1, 2, 5]);
        // Nodes 1-4 run this binary; node 5 an older one.
        for id in 1..=4u64 {
            register(&mut st, id, crate::PROTOCOL);
        }
        let mut ops = Operators::default();
        let view_of = |route: &phoenix_proto::Route, reporting: &[(u64, u64)]| {
            let mut v = view_with_down(&st, now, &[3], |_| 1);
            v.set_meta_route(route.clone(), 1);
            for &(n, applied) in reporting {
                v.record_meta_replica(n, Some(meta_report(route, n, applied)));
            }
            v
        };
        let route = meta_route(&[1, 2, 3], &[], 10);
        let v = view_of(&route, &[(1, 500), (2, 500)]);
        let moves = repair_replicas(&st, &v, &ops, now, &[3], 3, 3, 10);
        // Node 4 gets it (node 5, which hosts less, is too old); group 1, on live
        // nodes only, needs nothing.
        assert_eq!(
            moves,
            vec![ReplicaMove::Add {
                group: META_GROUP,
                to: 4
            }]
        );
        let members = [1, 2, 3];
        assert!(ops
            .add_replica(&st, &v, &members, META_GROUP, 4, now, Origin::Repair)
            .unwrap());
        assert_eq!(
            Operators::default().add_replica(&st, &v, &members, META_GROUP, 5, now, Origin::Repair),
            Err(crate::OperatorError::OldMetaNode(5))
        );
        // The meta leader (node 1) is told to add node 4 as a learner.
        let add_learner = |c: &Cmd, kind: ChangePeerKind| {
            matches!(c, Cmd::ChangePeer(cp) if cp.group_id == META_GROUP && cp.node_id == 4
                && cp.kind == kind as i32)
        };
        assert!(commands(&st, &v, &ops, 1)
            .iter()
            .any(|c| add_learner(c, ChangePeerKind::AddLearner)));
        // Once the membership lists the learner, node 4 is told to create its replica.
        let route = meta_route(&[1, 2, 3], &[4], 11);
        let v = view_of(&route, &[(1, 500), (2, 500)]);
        ops.settle(&st, &v, now);
        assert!(commands(&st, &v, &ops, 4)
            .iter()
            .any(|c| matches!(c, Cmd::CreateReplica(cr) if cr.route.as_ref() == Some(&route))));
        // Caught up, it is promoted.
        let v = view_of(&route, &[(1, 500), (2, 500), (4, 450)]);
        ops.settle(&st, &v, now);
        assert!(commands(&st, &v, &ops, 4).is_empty());
        assert!(commands(&st, &v, &ops, 1)
            .iter()
            .any(|c| add_learner(c, ChangePeerKind::AddVoter)));
        // A voter: the addition is done, and the next pass removes node 3.
        let route = meta_route(&[1, 2, 3, 4], &[], 12);
        let v = view_of(&route, &[(1, 500), (2, 500), (4, 500)]);
        let ended = ops.settle(&st, &v, now);
        assert!(ended.contains(&(META_GROUP, crate::Outcome::Done)));
        // Had node 3 come back before its removal, the meta group would hold a voter
        // too many: the trim takes it from a non-leader on a node unfit for work first
        // (node 3, down, here), else on the node hosting the most replicas (group 1 is
        // on nodes 1, 2 and 5: node 2); at the wanted size, from none.
        let long_ago = now - Duration::from_secs(60);
        let trim = |v: &LeaderView, want| resize_meta(&st, v, &ops, now, long_ago, &[], want);
        let remove = |node| {
            Some(ReplicaMove::Remove {
                group: META_GROUP,
                node,
            })
        };
        assert_eq!(trim(&v, 3), remove(3));
        let mut back = view_with_down(&st, now, &[], |_| 1);
        back.set_meta_route(route.clone(), 1);
        for n in [1, 2, 3, 4] {
            back.record_meta_replica(n, Some(meta_report(&route, n, 500)));
        }
        assert_eq!(trim(&back, 3), remove(2));
        assert_eq!(trim(&back, 4), None);
        // Not while a member is down (repair's), nor for a meta leader new in office.
        assert_eq!(resize_meta(&st, &v, &ops, now, long_ago, &[3], 3), None);
        assert_eq!(resize_meta(&st, &back, &ops, now, now, &[], 3), None);
        // Too few voters (a move cut in two by a trim): grown back on the fit node
        // hosting the fewest replicas that reports a meta replica (node 5 hosts least
        // but runs an older binary): node 3.
        let add = |to| {
            Some(ReplicaMove::Add {
                group: META_GROUP,
                to,
            })
        };
        let two = meta_route(&[1, 2], &[], 14);
        let mut short = view_with_down(&st, now, &[], |_| 1);
        short.set_meta_route(two, 1);
        assert_eq!(trim(&short, 3), add(3));
        assert_eq!(trim(&short, 2), None);
        // A learner left by an addition that gave up: promoted if a voter is missing,
        // else removed.
        short.set_meta_route(meta_route(&[1, 2], &[4], 15), 1);
        assert_eq!(trim(&short, 3), add(4));
        short.set_meta_route(meta_route(&[1, 2, 3], &[4], 16), 1);
        assert_eq!(trim(&short, 3), remove(4));
        let moves = repair_replicas(&st, &v, &ops, now, &[3], 3, 3, 10);
        assert_eq!(
            moves[0],
            ReplicaMove::Remove {
                group: META_GROUP,
                node: 3
            }
        );
        assert!(ops
            .remove_replica(&st, &v, &members, META_GROUP, 3, now, Origin::Repair)
            .unwrap());
        assert!(commands(&st, &v, &ops, 1).iter().any(|c| matches!(c,
            Cmd::ChangePeer(cp) if cp.group_id == META_GROUP && cp.node_id == 3
                && cp.kind == ChangePeerKind::Remove as i32)));
        // Out of the membership: done; node 3, back with its old replica, drops it.
        let route = meta_route(&[1, 2, 4], &[], 13);
        let mut v = view_of(&route, &[(1, 500), (2, 500), (4, 500)]);
        let ended = ops.settle(&st, &v, now);
        assert!(ended.contains(&(META_GROUP, crate::Outcome::Done)));
        v.record_meta_replica(
            3,
            Some(meta_report(&meta_route(&[1, 2, 3], &[], 10), 3, 300)),
        );
        assert!(commands(&st, &v, &ops, 3).iter().any(|c| matches!(c,
            Cmd::DestroyReplica(d) if d.group_id == META_GROUP && d.conf_version == 13)));
        // A replica at a newer membership than the leader applied is left alone.
        v.record_meta_replica(
            3,
            Some(meta_report(&meta_route(&[1, 2, 4], &[3], 14), 3, 300)),
        );
        assert!(!commands(&st, &v, &ops, 3)
            .iter()
            .any(|c| matches!(c, Cmd::DestroyReplica(_))));
        // Healthy again: nothing to repair.
        assert_eq!(repair_replicas(&st, &v, &ops, now, &[3], 3, 3, 10), vec![]);
    }

    /// A meta member that died before its node was upgraded is still replaced: the
    /// binary of a member removed, or down, is not asked; a live member's is.
    #[test]
    fn a_dead_member_on_an_older_binary_is_still_replaced() {
        let now = Instant::now();
        let mut st = cluster(4, 1, |_| vec![1, 2, 4]);
        // Node 3 died on the binary before this one.
        for (id, protocol) in [(1u64, 5), (2, 5), (3, 4), (4, 5)] {
            register(&mut st, id, protocol);
        }
        let route = meta_route(&[1, 2, 3], &[], 10);
        let mut v = view_with_down(&st, now, &[3], |_| 1);
        v.set_meta_route(route.clone(), 1);
        let mut ops = Operators::default();
        let members = [1, 2, 3];
        assert_eq!(
            ops.add_replica(&st, &v, &members, META_GROUP, 4, now, Origin::Repair),
            Ok(true)
        );
        let route = meta_route(&[1, 2, 3, 4], &[], 12);
        v.set_meta_route(route.clone(), 1);
        ops.settle(&st, &v, now);
        assert_eq!(
            ops.remove_replica(&st, &v, &members, META_GROUP, 3, now, Origin::Repair),
            Ok(true)
        );
        // Alive, the same node would be asked (it would never report its meta replica).
        let alive = view_with_down(&st, now, &[], |_| 1);
        let mut alive = alive;
        alive.set_meta_route(route, 1);
        assert_eq!(
            Operators::default().remove_replica(
                &st,
                &alive,
                &members,
                META_GROUP,
                2,
                now,
                Origin::Repair
            ),
            Err(crate::OperatorError::OldMetaNode(3))
        );
    }

    /// A draining node's replicas are replaced as a down node's are, though it leads:
    /// it takes no new replica, and its groups may keep their leader there meanwhile.
    #[test]
    fn a_draining_node_is_emptied() {
        let now = Instant::now();
        let mut st = cluster(4, 2, |_| vec![1, 2, 3]);
        let cmd = phoenix_proto::MetaCommand {
            cmd: Some(phoenix_proto::meta_command::Cmd::SetNodeState(
                phoenix_proto::NodeState {
                    node_id: 3,
                    draining: true,
                },
            )),
        };
        st.apply(st.applied() + 1, &cmd).unwrap();
        let v = view_with_down(&st, now, &[], |_| 3);
        let ops = Operators::default();
        assert_eq!(
            repair_replicas(&st, &v, &ops, now, &[], 3, 3, 10),
            vec![
                ReplicaMove::Add { group: 1, to: 4 },
                ReplicaMove::Add { group: 2, to: 4 },
            ]
        );
        set_route(&mut st, 1, &[1, 2, 3, 4], &[]);
        let v = view_with_down(&st, now, &[], |_| 3);
        assert_eq!(
            repair_replicas(&st, &v, &ops, now, &[], 3, 3, 1),
            vec![ReplicaMove::Remove { group: 1, node: 3 }]
        );
        // Node 4, the only other one, drains too: nowhere to go.
        let cmd = phoenix_proto::MetaCommand {
            cmd: Some(phoenix_proto::meta_command::Cmd::SetNodeState(
                phoenix_proto::NodeState {
                    node_id: 4,
                    draining: true,
                },
            )),
        };
        st.apply(st.applied() + 1, &cmd).unwrap();
        let v = view_with_down(&st, now, &[], |_| 1);
        let moves = repair_replicas(&st, &v, &ops, now, &[], 3, 3, 10);
        assert!(
            moves.iter().all(|m| !matches!(m, ReplicaMove::Add { .. })),
            "{moves:?}"
        );
    }

    /// Groups under an operator, led by nobody live, or with no node to take a replica
    /// are left alone; nothing is done with no node down.
    #[test]
    fn repair_waits_when_it_cannot_help() {
        let now = Instant::now();
        let st = cluster(4, 3, |g| if g == 3 { vec![2, 3, 4] } else { vec![1, 2, 3] });
        // Group 2's leader is the down node.
        let v = view_with_down(&st, now, &[3], |g| if g == 2 { 3 } else { 2 });
        let mut ops = Operators::default();
        assert_eq!(repair_replicas(&st, &v, &ops, now, &[], 3, 3, 10), vec![]);
        let moves = repair_replicas(&st, &v, &ops, now, &[3], 3, 3, 10);
        assert_eq!(
            moves,
            vec![
                ReplicaMove::Add { group: 1, to: 4 },
                ReplicaMove::Add { group: 3, to: 1 },
            ]
        );
        assert_eq!(
            ops.add_replica(&st, &v, &[], 1, 4, now, Origin::Repair),
            Ok(true)
        );
        assert_eq!(ops.changing(Origin::Repair), 1);
        assert_eq!(
            repair_replicas(&st, &v, &ops, now, &[3], 3, 3, 10),
            vec![ReplicaMove::Add { group: 3, to: 1 }]
        );
        // Three nodes, one down: nowhere to put a third replica, and the down one stays.
        let st = cluster(3, 2, |_| vec![1, 2, 3]);
        let v = view_with_down(&st, now, &[3], |_| 1);
        let ops = Operators::default();
        assert_eq!(repair_replicas(&st, &v, &ops, now, &[3], 3, 3, 10), vec![]);
    }

    /// Random clusters with random down nodes, repaired step by step as the operators
    /// would (each move applied to the routing table): every group whose leader is live
    /// and that has somewhere to go ends with `replication` voters, none on a down node,
    /// and no live node gets more than one replica of a group. `PHOENIX_SEED` replays a
    /// run.
    #[test]
    fn random_repairs_end_with_full_groups_on_live_nodes() {
        let seed = std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| rand::thread_rng().gen());
        eprintln!("PHOENIX_SEED={seed}");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let now = Instant::now();
        for round in 0..100 {
            let n = rng.gen_range(3..=8u64);
            let groups = rng.gen_range(1..=30u64);
            let placements: Vec<Vec<u64>> = (0..groups)
                .map(|_| {
                    let mut nodes: Vec<u64> = (1..=n).collect();
                    for i in (1..nodes.len()).rev() {
                        nodes.swap(i, rng.gen_range(0..=i));
                    }
                    nodes.truncate(3);
                    nodes
                })
                .collect();
            let mut st = cluster(n, groups, |g| placements[g as usize - 1].clone());
            let down: Vec<u64> = (1..=n).filter(|_| rng.gen_bool(0.25)).collect();
            // A group's leader: its first replica on a live node, if any.
            let leader = |st: &MetaState, g: u64| {
                st.routes()[&g]
                    .replicas
                    .iter()
                    .map(|r| r.node_id)
                    .find(|n| !down.contains(n))
                    .unwrap_or(0)
            };
            let live = n as usize - down.len();
            for step in 0.. {
                assert!(
                    step < 1000,
                    "seed {seed} round {round}: repair does not end"
                );
                let v = view_with_down(&st, now, &down, |g| leader(&st, g));
                let moves = repair_replicas(
                    &st,
                    &v,
                    &Operators::default(),
                    now,
                    &down,
                    3,
                    3,
                    1 + step % 4,
                );
                if moves.is_empty() {
                    break;
                }
                for m in moves {
                    let route = st.routes()[&m.group()].clone();
                    let mut voters: Vec<u64> = route.replicas.iter().map(|r| r.node_id).collect();
                    match m {
                        ReplicaMove::Add { group, to } => {
                            assert!(!down.contains(&to) && !voters.contains(&to));
                            voters.push(to);
                            set_route(&mut st, group, &voters, &[]);
                        }
                        ReplicaMove::Remove { group, node } => {
                            assert!(down.contains(&node));
                            voters.retain(|&x| x != node);
                            set_route(&mut st, group, &voters, &[]);
                        }
                        ReplicaMove::Move { .. } => panic!("repair moved a replica: {m:?}"),
                    }
                }
            }
            for (g, route) in st.routes() {
                let on: Vec<u64> = route.replicas.iter().map(|r| r.node_id).collect();
                let led = on.iter().any(|n| !down.contains(n));
                if led && live >= 3 {
                    assert_eq!(on.len(), 3, "seed {seed} round {round} group {g}: {on:?}");
                    assert!(
                        on.iter().all(|n| !down.contains(n)),
                        "seed {seed} round {round} group {g}: {on:?} (down {down:?})"
                    );
                }
            }
        }
    }
}
