//! Merges decided by the meta leader. A merge of group S (the source) into its neighbour
//! T (the target, same replicas) goes through three phases recorded in the meta group's
//! log (`MergePlan`, record 'm'):
//!
//! 1. **prepare**: S's leader is asked to propose `PrepareMerge`; every S replica that
//!    applies it freezes (range epoch one up, every later command refused).
//! 2. **commit** ([`merge_steps`], once every S voter reports itself frozen for T at the
//!    same log index P): T's leader is asked to propose `CommitMerge`; every T replica
//!    waits until its node's S replica applied P, then takes S's range, data and
//!    sessions in one batch, and S's replica goes. From this phase on the merge never
//!    rolls back (a T replica may have taken S in).
//! 3. **done** ([`merge_steps`], once a T replica reports the wider range): `FinishMerge`
//!    widens T's route and drops S's.
//!
//! A merge still in its prepare phase may be given up (the server's scheduler decides
//! when: it took too long, e.g. an S replica is down): the plan moves to **rollback**,
//! S's leader proposes `RollbackMerge` (S thaws, or if it never froze, its epoch moves
//! on so a late `PrepareMerge` is refused), and `FinishMerge` without a route ends the
//! plan once S's leader reports it thawed. [`small_merges`] picks neighbours to merge
//! by size; [`merge_alignment`] first brings small neighbours on different voters onto
//! the same ones, a membership change at a time.

use phoenix_proto::{
    meta_command, placement_command, MergeDone, MergeGroup, MergePhase, MergePlan, MetaCommand,
    OperatorOrigin, PlacementCommand, ReplicaStats, Route,
};

use std::collections::BTreeSet;
use std::time::Instant;

use crate::liveness::LeaderView;
use crate::operator::eligible_nodes;
use crate::repair::ReplicaMove;
use crate::state::{joined_range, MetaState, PROTOCOL_MERGE};

/// Merges planned by size at most at once, over the cluster.
pub const MERGE_INFLIGHT_MAX: usize = 1;

fn phase(p: &MergePlan) -> MergePhase {
    MergePhase::try_from(p.phase).unwrap_or(MergePhase::Prepare)
}

/// Whether S's replica `rep` is frozen for plan `p`.
fn frozen_for(rep: &ReplicaStats, p: &MergePlan) -> bool {
    rep.merging_into == p.target && rep.epoch == p.source_epoch + 1 && rep.merge_index > 0
}

/// The meta commands that move the planned merges on, from what the replicas report: a
/// prepare every S voter applied becomes a commit (naming the prepare index), a commit a
/// T replica applied becomes `FinishMerge` with T's wider route, and a rollback S's
/// leader applied becomes `FinishMerge` without one.
pub fn merge_steps(state: &MetaState, view: &LeaderView) -> Vec<MetaCommand> {
    let mut out = Vec::new();
    for p in state.merges().values() {
        let (Some(src), Some(dst)) = (state.routes().get(&p.source), state.routes().get(&p.target))
        else {
            continue;
        };
        match phase(p) {
            MergePhase::Prepare => {
                let reps: Vec<&ReplicaStats> = src
                    .replicas
                    .iter()
                    .filter_map(|r| view.replica(r.node_id, p.source))
                    .collect();
                let all = reps.len() == src.replicas.len()
                    && reps.iter().all(|r| frozen_for(r, p))
                    && reps.iter().all(|r| r.merge_index == reps[0].merge_index);
                if all {
                    out.push(MetaCommand {
                        cmd: Some(meta_command::Cmd::PlanMerge(MergePlan {
                            phase: MergePhase::Commit as i32,
                            prepare_index: reps[0].merge_index,
                            ..*p
                        })),
                    });
                }
            }
            MergePhase::Commit => {
                let Some((start, end)) = joined_range(src, dst) else {
                    continue;
                };
                let merged = dst.replicas.iter().find_map(|r| {
                    let rep = view.replica(r.node_id, p.target)?;
                    (rep.epoch > p.target_epoch && rep.start_key == start && rep.end_key == end)
                        .then_some(rep)
                });
                if let Some(rep) = merged {
                    out.push(MetaCommand {
                        cmd: Some(meta_command::Cmd::FinishMerge(MergeDone {
                            source: p.source,
                            thawed_epoch: 0,
                            target: Some(Route {
                                start_key: start,
                                end_key: end,
                                epoch: rep.epoch,
                                ..dst.clone()
                            }),
                        })),
                    });
                }
            }
            MergePhase::Rollback => {
                let thawed = view
                    .leader(p.source)
                    .and_then(|l| view.replica(l, p.source))
                    .filter(|rep| rep.merging_into == 0 && rep.epoch > p.source_epoch);
                if let Some(rep) = thawed {
                    out.push(MetaCommand {
                        cmd: Some(meta_command::Cmd::FinishMerge(MergeDone {
                            source: p.source,
                            target: None,
                            thawed_epoch: rep.epoch,
                        })),
                    });
                }
            }
        }
    }
    out
}

/// The merge steps for `node` to propose in the groups it leads: a prepare or rollback
/// in a source not yet there, a commit in a target not yet merged.
pub fn merge_commands(state: &MetaState, view: &LeaderView, node: u64) -> Vec<PlacementCommand> {
    let mut out = Vec::new();
    for p in state.merges().values() {
        let ph = phase(p);
        let g = if ph == MergePhase::Commit {
            p.target
        } else {
            p.source
        };
        let Some(rep) = view.replica(node, g) else {
            continue;
        };
        if view.leader(g) != Some(node) || !rep.is_leader {
            continue;
        }
        let due = match ph {
            MergePhase::Prepare => rep.epoch == p.source_epoch,
            MergePhase::Commit => rep.epoch == p.target_epoch,
            MergePhase::Rollback => rep.merging_into != 0 || rep.epoch == p.source_epoch,
        };
        if !due {
            continue;
        }
        let (start, end) = state
            .routes()
            .get(&p.source)
            .map(|r| (r.start_key.clone(), r.end_key.clone()))
            .unwrap_or_default();
        out.push(PlacementCommand {
            cmd: Some(placement_command::Cmd::MergeGroup(MergeGroup {
                plan: Some(*p),
                source_start: start,
                source_end: end,
            })),
        });
    }
    out
}

/// The report of `r`'s leader if its group is settled as routed: the route's range
/// epoch and membership version, no learner, running. A merge is planned only then: a
/// membership change under way could put a replica of one group where the other has
/// none.
pub fn settled_leader<'a>(view: &'a LeaderView, r: &Route) -> Option<&'a ReplicaStats> {
    let rep = view
        .leader(r.group_id)
        .and_then(|l| view.replica(l, r.group_id))?;
    (rep.epoch == r.epoch
        && rep.conf_version == r.conf_version
        && rep.learners.is_empty()
        && rep.stopped.is_empty())
    .then_some(rep)
}

/// `DestroyReplica` for the frozen sources `node` still hosts whose merge is done (their
/// route is gone, with no plan: a rolled-back merge keeps the route) and that its
/// replica of the target does not need: it has none (removed since, or one to be
/// created, which starts from a snapshot past the merge), or its reported range covers
/// the source's.
pub fn merged_leftovers(state: &MetaState, view: &LeaderView, node: u64) -> Vec<PlacementCommand> {
    view.hosted(node)
        .filter(|rep| {
            rep.merging_into != 0
                && !state.routes().contains_key(&rep.group_id)
                && !state.merges().contains_key(&rep.group_id)
        })
        .filter(|rep| {
            // (Past the source's epoch: a target route from before the split that made
            // the source covers it too. Running: a stopped target may show a range its
            // failed round never wrote.)
            view.replica(node, rep.merging_into).is_none_or(|t| {
                t.stopped.is_empty()
                    && t.epoch > rep.epoch
                    && t.start_key <= rep.start_key
                    && (t.end_key.is_empty()
                        || (!rep.end_key.is_empty() && rep.end_key <= t.end_key))
            })
        })
        .map(|rep| PlacementCommand {
            cmd: Some(placement_command::Cmd::DestroyReplica(
                phoenix_proto::DestroyReplica {
                    group_id: rep.group_id,
                    conf_version: u64::MAX,
                },
            )),
        })
        .collect()
}

/// Neighbours small enough to merge, as (source, target): both under `max_bytes`
/// together with their keys under `max_keys` (each as its leader reports, at the
/// route's epoch), no learners, neither in a split or merge plan, nor `busy`; the
/// smaller group is the source. In key order. Their voters may differ.
fn small_pairs<'a>(
    state: &'a MetaState,
    view: &LeaderView,
    max_bytes: u64,
    max_keys: u64,
    busy: impl Fn(u64) -> bool,
) -> Vec<(&'a Route, &'a Route)> {
    if max_bytes == 0 || state.merges().len() >= MERGE_INFLIGHT_MAX {
        return Vec::new();
    }
    let size = |r: &Route| {
        let rep = settled_leader(view, r)?;
        Some((rep.approximate_bytes, rep.approximate_keys))
    };
    let free = |r: &Route| {
        r.learners.is_empty()
            && !state.splits().contains_key(&r.group_id)
            && state.merge_of(r.group_id).is_none()
            && !busy(r.group_id)
    };
    let mut by_start: Vec<&Route> = state.routes().values().collect();
    by_start.sort_by(|a, b| a.start_key.cmp(&b.start_key));
    let mut out = Vec::new();
    for w in by_start.windows(2) {
        let (a, b) = (w[0], w[1]);
        if !free(a) || !free(b) {
            continue;
        }
        let (Some((ab, ak)), Some((bb, bk))) = (size(a), size(b)) else {
            continue;
        };
        if ab + bb >= max_bytes || ak + bk >= max_keys {
            continue;
        }
        out.push(if ab <= bb { (a, b) } else { (b, a) });
    }
    out
}

fn voter_set(r: &Route) -> BTreeSet<u64> {
    r.replicas.iter().map(|x| x.node_id).collect()
}

/// Neighbours to merge by size: a pair of [`small_pairs`] with the same voters (`busy`:
/// an operator changing the membership, or a range not settled). The smaller group
/// goes into its neighbour. At most [`MERGE_INFLIGHT_MAX`] planned at once;
/// `max_bytes` 0 turns it off.
pub fn small_merges(
    state: &MetaState,
    view: &LeaderView,
    max_bytes: u64,
    max_keys: u64,
    busy: impl Fn(u64) -> bool,
) -> Vec<MergePlan> {
    small_pairs(state, view, max_bytes, max_keys, busy)
        .into_iter()
        .find(|(s, t)| voter_set(s) == voter_set(t))
        .map(|(s, t)| MergePlan {
            source: s.group_id,
            target: t.group_id,
            source_epoch: s.epoch,
            target_epoch: t.epoch,
            phase: MergePhase::Prepare as i32,
            prepare_index: 0,
            origin: OperatorOrigin::MergeCheck as i32,
        })
        .into_iter()
        .collect()
}

/// The next membership change that brings two small neighbours onto the same voters so
/// they can merge (PD's merge checker does the same before a merge): neighbours placed
/// apart by repair or the replica balancer would otherwise never merge. None while a
/// pair could merge already, or none is small enough.
///
/// Of the [`small_pairs`] whose voters differ, all of them alive on nodes fit for
/// work (alive, not full, stopping or draining), the pair whose voters differ least
/// (a pair half aligned goes first: ties to key order) takes one step:
/// - a group with more voters than the other and than `replication` loses one the
///   other lacks (a follower first);
/// - else the source gains one of the target's voters it lacks, moved from one the
///   target lacks (a follower first; an addition alone when there is none).
///
/// The steps end: each brings the two voter sets one node closer. `held` (the pair
/// aligned last) is taken again while it has a step, whatever the others. Nodes must
/// also run a binary that merges. Returns the step and the pair (source, target).
#[allow(clippy::too_many_arguments)] // the limits of small_pairs, and the change's context
pub fn merge_alignment(
    state: &MetaState,
    view: &LeaderView,
    now: Instant,
    replication: usize,
    max_bytes: u64,
    max_keys: u64,
    busy: impl Fn(u64) -> bool,
    held: Option<[u64; 2]>,
) -> Option<(ReplicaMove, [u64; 2])> {
    let pairs = small_pairs(state, view, max_bytes, max_keys, busy);
    if pairs.iter().any(|(s, t)| voter_set(s) == voter_set(t)) {
        return None;
    }
    let draining = state.draining_nodes();
    // Fit for work, and able to take part in a merge (else the aligned pair could never
    // merge, and would hold the merge check on it).
    let fit: BTreeSet<u64> = eligible_nodes(state, view, now, |n| draining.contains(&n))
        .into_iter()
        .filter(|&n| state.member_behind(&[n], PROTOCOL_MERGE).is_none())
        .collect();
    // A follower of `g` among `nodes` if there is one, else the lowest.
    let pick = |g: u64, nodes: Vec<u64>| {
        let leader = view.leader(g);
        nodes
            .iter()
            .copied()
            .find(|&n| Some(n) != leader)
            .or_else(|| nodes.first().copied())
    };
    let step = |s: &Route, t: &Route| -> Option<ReplicaMove> {
        let (vs, vt) = (voter_set(s), voter_set(t));
        if !vs.union(&vt).all(|n| fit.contains(n)) {
            return None;
        }
        for (x, vx, vy) in [(s, &vs, &vt), (t, &vt, &vs)] {
            if vx.len() > vy.len().max(replication) {
                let node = pick(x.group_id, vx.difference(vy).copied().collect())?;
                let group = x.group_id;
                return Some(ReplicaMove::Remove { group, node });
            }
        }
        let to = vt.difference(&vs).copied().next()?;
        let group = s.group_id;
        Some(match pick(group, vs.difference(&vt).copied().collect()) {
            Some(from) => ReplicaMove::Move { group, from, to },
            None => ReplicaMove::Add { group, to },
        })
    };
    // (Pairs with no step, e.g. a target short of a voter the source has no spare for,
    // are left to repair and the balancer.)
    let candidates: Vec<(ReplicaMove, [u64; 2], usize)> = pairs
        .into_iter()
        .filter_map(|(s, t)| {
            let diff = voter_set(s).symmetric_difference(&voter_set(t)).count();
            step(s, t).map(|m| (m, [s.group_id, t.group_id], diff))
        })
        .collect();
    let same = |a: [u64; 2], b: [u64; 2]| a == b || a == [b[1], b[0]];
    // The pair aligned last goes on while it can (another pair taking its place half
    // way would leave it for the balancer to undo).
    let (m, pair, _) = held
        .and_then(|h| candidates.iter().find(|c| same(c.1, h)))
        .or_else(|| candidates.iter().min_by_key(|c| c.2))?;
    Some((*m, *pair))
}

#[cfg(test)]
mod tests {
    use super::*;
    use phoenix_proto::{meta_command, MetaCommand, NodeStats, Replica};
    use std::time::Instant;

    fn route(id: u64, start: &str, end: &str, nodes: &[u64]) -> Route {
        Route {
            group_id: id,
            start_key: start.as_bytes().to_vec().into(),
            end_key: end.as_bytes().to_vec().into(),
            epoch: 1,
            replicas: nodes
                .iter()
                .map(|&n| Replica {
                    protocol: 0,
                    node_id: n,
                    addr: format!("h:{n}"),
                })
                .collect(),
            ..Route::default()
        }
    }

    fn state(routes: Vec<Route>) -> MetaState {
        let mut st = MetaState::default();
        let mut i = 0;
        for n in 1..=4u64 {
            i += 1;
            st.apply(
                i,
                &MetaCommand {
                    cmd: Some(meta_command::Cmd::RegisterNode(Replica {
                        protocol: crate::PROTOCOL,
                        node_id: n,
                        addr: format!("h:{n}"),
                    })),
                },
            )
            .unwrap();
        }
        st.apply(
            i + 1,
            &MetaCommand {
                cmd: Some(meta_command::Cmd::CreateGroups(
                    phoenix_proto::CreateGroups { routes },
                )),
            },
        )
        .unwrap();
        st
    }

    /// Every node hosting a group of `st` reports it: node 1 leads, with `bytes`.
    fn view(st: &MetaState, bytes: &[(u64, u64)], tweak: impl Fn(&mut ReplicaStats)) -> LeaderView {
        view_with(st, bytes, tweak, |_| NodeStats::default())
    }

    /// [`view`], each node's own stats from `stats`.
    fn view_with(
        st: &MetaState,
        bytes: &[(u64, u64)],
        tweak: impl Fn(&mut ReplicaStats),
        stats: impl Fn(u64) -> NodeStats,
    ) -> LeaderView {
        let mut v = LeaderView::default();
        for n in 1..=4u64 {
            let reps: Vec<ReplicaStats> = st
                .routes()
                .values()
                .filter(|r| r.replicas.iter().any(|x| x.node_id == n))
                .map(|r| {
                    let mut rep = ReplicaStats {
                        group_id: r.group_id,
                        node_id: n,
                        is_leader: n == r.replicas[0].node_id,
                        term: 1,
                        epoch: r.epoch,
                        start_key: r.start_key.clone(),
                        end_key: r.end_key.clone(),
                        approximate_bytes: bytes
                            .iter()
                            .find(|(g, _)| *g == r.group_id)
                            .map_or(0, |(_, b)| *b),
                        ..ReplicaStats::default()
                    };
                    tweak(&mut rep);
                    rep
                })
                .collect();
            v.record(Instant::now(), n, stats(n), &reps);
        }
        v
    }

    /// Small neighbours on different voters are brought onto the same ones a step at a
    /// time, the smaller moving: a voter moved over (from a follower), then an extra
    /// voter trimmed; nothing once they could merge, nor while a node of theirs is unfit,
    /// a group busy, or merging off.
    #[test]
    fn small_neighbours_on_other_voters_are_aligned_a_step_at_a_time() {
        let now = Instant::now();
        let routes = |two: &[u64]| {
            vec![
                route(1, "", "f", &[1, 2, 3]),
                route(2, "f", "m", two),
                route(3, "m", "", &[4, 3, 2]),
            ]
        };
        let bytes = [(1, 5 << 20), (2, 3 << 20), (3, 40 << 20)];
        let align = |st: &MetaState, v: &LeaderView| {
            merge_alignment(st, v, now, 3, 20 << 20, 1000, |_| false, None).map(|(m, _)| m)
        };
        // Group 2 (node 2 leads) is the smaller of the pair it can merge with (3 is too
        // big): its replica on 4 moves to 1.
        let st = state(routes(&[2, 3, 4]));
        let v = view(&st, &bytes, |_| {});
        assert_eq!(
            align(&st, &v),
            Some(ReplicaMove::Move {
                group: 2,
                from: 4,
                to: 1
            })
        );
        // Node 1 voting in group 2 too: the extra voter on 4 goes.
        let st = state(routes(&[2, 3, 4, 1]));
        let v = view(&st, &bytes, |_| {});
        assert_eq!(
            align(&st, &v),
            Some(ReplicaMove::Remove { group: 2, node: 4 })
        );
        // The target with the extra voter: it loses it.
        let st = state(vec![
            route(1, "", "f", &[1, 2, 3, 4]),
            route(2, "f", "", &[1, 2, 3]),
        ]);
        let v = view(&st, &bytes, |_| {});
        assert_eq!(
            align(&st, &v),
            Some(ReplicaMove::Remove { group: 1, node: 4 })
        );
        // A source short of a voter gains one.
        let st = state(routes(&[2, 3]));
        let v = view(&st, &bytes, |_| {});
        assert_eq!(align(&st, &v), Some(ReplicaMove::Add { group: 2, to: 1 }));
        // On the same voters: a merge, no alignment.
        let st = state(routes(&[3, 2, 1]));
        let v = view(&st, &bytes, |_| {});
        assert_eq!(align(&st, &v), None);
        assert_eq!(small_merges(&st, &v, 20 << 20, 1000, |_| false).len(), 1);
        // A node of the pair full, a busy group, merges off: nothing.
        let st = state(routes(&[2, 3, 4]));
        let full = |n: u64| NodeStats {
            disk_full: n == 4,
            ..NodeStats::default()
        };
        let v = view_with(&st, &bytes, |_| {}, full);
        assert_eq!(align(&st, &v), None);
        let v = view(&st, &bytes, |_| {});
        let one_busy = |g: u64| g == 1;
        assert_eq!(
            merge_alignment(&st, &v, now, 3, 20 << 20, 1000, one_busy, None),
            None
        );
        assert_eq!(
            merge_alignment(&st, &v, now, 3, 0, 1000, |_| false, None),
            None
        );
        // Two pairs as far apart: the first in key order, named source first; the pair
        // aligned last is kept while it has a step.
        let st = state(vec![
            route(1, "", "f", &[1, 2, 3]),
            route(2, "f", "m", &[2, 3, 4]),
            route(3, "m", "", &[1, 2, 4]),
        ]);
        let v = view(&st, &[(1, 5 << 20), (2, 3 << 20), (3, 1 << 20)], |_| {});
        let first = merge_alignment(&st, &v, now, 3, 20 << 20, 1000, |_| false, None);
        assert_eq!(first.map(|(_, p)| p), Some([2, 1]));
        let held = merge_alignment(&st, &v, now, 3, 20 << 20, 1000, |_| false, Some([2, 3]));
        assert_eq!(
            held,
            Some((
                ReplicaMove::Move {
                    group: 3,
                    from: 1,
                    to: 3
                },
                [3, 2]
            ))
        );
        // A node too old to merge is no place to align onto.
        let mut st = st;
        st.apply(
            100,
            &MetaCommand {
                cmd: Some(meta_command::Cmd::RegisterNode(Replica {
                    protocol: PROTOCOL_MERGE - 1,
                    node_id: 4,
                    addr: "h:4".into(),
                })),
            },
        )
        .unwrap();
        assert_eq!(
            merge_alignment(&st, &v, now, 3, 20 << 20, 1000, |_| false, None),
            None
        );
    }

    /// Small neighbours with the same replicas merge, the smaller into the other; not
    /// those with other replicas, over the limits, busy, or unsettled.
    #[test]
    fn small_neighbours_with_the_same_replicas_merge() {
        let st = state(vec![
            route(1, "", "f", &[1, 2, 3]),
            route(2, "f", "m", &[1, 2, 3]),
            route(3, "m", "t", &[2, 3, 4]),
            route(4, "t", "", &[2, 3, 4]),
        ]);
        let v = view(&st, &[(1, 5 << 20), (2, 3 << 20), (3, 1), (4, 1)], |_| {});
        let plans = small_merges(&st, &v, 20 << 20, 1000, |_| false);
        assert_eq!(plans.len(), 1);
        assert_eq!((plans[0].source, plans[0].target), (2, 1));
        // Over the byte limit together: the next pair (other replicas than 2's) is taken.
        let plans = small_merges(&st, &v, 8 << 20, 1000, |_| false);
        assert_eq!((plans[0].source, plans[0].target), (3, 4));
        // Busy groups, or none small enough, or turned off: nothing.
        assert!(small_merges(&st, &v, 8 << 20, 1000, |g| g == 4).is_empty());
        assert!(small_merges(&st, &v, 1, 1000, |_| false).is_empty());
        assert!(small_merges(&st, &v, 0, 1000, |_| false).is_empty());
        // A leader that reports a learner (a membership change under way): not settled.
        let v = view(&st, &[(1, 1), (2, 1), (3, 1), (4, 1)], |r| {
            if r.group_id <= 2 || r.group_id == 4 {
                r.learners = vec![9];
            }
        });
        assert!(small_merges(&st, &v, 20 << 20, 1000, |_| false).is_empty());
    }

    /// A prepare becomes a commit once every source voter reports itself frozen at the
    /// same index, a commit ends once a target replica reports the joined range, and a
    /// rollback once the source's leader reports it thawed.
    #[test]
    fn merge_phases_follow_the_reports() {
        let mut st = state(vec![
            route(1, "", "m", &[1, 2, 3]),
            route(2, "m", "", &[1, 2, 3]),
        ]);
        let plan = MergePlan {
            source: 2,
            target: 1,
            source_epoch: 1,
            target_epoch: 1,
            phase: MergePhase::Prepare as i32,
            prepare_index: 0,
            origin: 0,
        };
        let mut at = 100;
        let mut apply = |st: &mut MetaState, cmd: MetaCommand| {
            at += 1;
            st.apply(at, &cmd).unwrap();
        };
        apply(
            &mut st,
            MetaCommand {
                cmd: Some(meta_command::Cmd::PlanMerge(plan)),
            },
        );
        // The leader of the source is asked to prepare; nothing moves yet.
        let v = view(&st, &[], |_| {});
        assert!(merge_steps(&st, &v).is_empty());
        assert_eq!(merge_commands(&st, &v, 1).len(), 1);
        assert!(merge_commands(&st, &v, 2).is_empty(), "not the leader");
        // Frozen on two of three: not yet; on all three, but one at another index: not yet.
        let frozen = |r: &mut ReplicaStats, n_max: u64, odd: bool| {
            if r.group_id == 2 && r.node_id <= n_max {
                r.merging_into = 1;
                r.merge_index = if odd && r.node_id == 3 { 8 } else { 7 };
                r.epoch = 2;
            }
        };
        assert!(merge_steps(&st, &view(&st, &[], |r| frozen(r, 2, false))).is_empty());
        assert!(merge_steps(&st, &view(&st, &[], |r| frozen(r, 3, true))).is_empty());
        let steps = merge_steps(&st, &view(&st, &[], |r| frozen(r, 3, false)));
        let Some(meta_command::Cmd::PlanMerge(commit)) = &steps[0].cmd else {
            panic!("{steps:?}")
        };
        assert_eq!(
            (commit.phase, commit.prepare_index),
            (MergePhase::Commit as i32, 7)
        );
        apply(&mut st, steps[0].clone());
        // The target's leader is asked to commit, naming the source's range.
        let v = view(&st, &[], |r| frozen(r, 3, false));
        let cmds = merge_commands(&st, &v, 1);
        let Some(placement_command::Cmd::MergeGroup(mg)) = &cmds[0].cmd else {
            panic!("{cmds:?}")
        };
        assert_eq!(
            (mg.source_start.as_ref(), mg.source_end.as_ref()),
            (&b"m"[..], &b""[..])
        );
        assert!(merge_steps(&st, &v).is_empty());
        // A target replica with the joined range: done.
        let v = view(&st, &[], |r| {
            if r.group_id == 1 && r.node_id == 2 {
                r.epoch = 3;
                r.end_key = Default::default();
            }
        });
        let steps = merge_steps(&st, &v);
        apply(&mut st, steps[0].clone());
        assert!(st.merges().is_empty() && !st.routes().contains_key(&2));
        assert_eq!(st.routes()[&1].epoch, 3);
        st.check().unwrap();
    }

    /// A frozen source left on a node after its merge is done is destroyed there unless
    /// the node's target replica has not taken it in yet.
    #[test]
    fn a_frozen_source_left_after_its_merge_goes_unless_its_target_needs_it() {
        let st = state(vec![route(1, "", "", &[1, 2, 3])]);
        let source = ReplicaStats {
            group_id: 2,
            node_id: 3,
            merging_into: 1,
            merge_index: 7,
            epoch: 2,
            start_key: b"m".to_vec().into(),
            ..ReplicaStats::default()
        };
        let target = |end: &str| ReplicaStats {
            group_id: 1,
            node_id: 3,
            epoch: 3,
            end_key: end.as_bytes().to_vec().into(),
            ..ReplicaStats::default()
        };
        let at = |reps: &[ReplicaStats]| {
            let mut v = LeaderView::default();
            v.record(Instant::now(), 3, NodeStats::default(), reps);
            merged_leftovers(&st, &v, 3)
        };
        // Its target here is held before the commit (old range): kept.
        assert!(at(&[source.clone(), target("m")]).is_empty());
        // A target that covers it at an older epoch (before the split that made the
        // source), or stopped: kept.
        let old = ReplicaStats {
            epoch: 1,
            ..target("")
        };
        assert!(at(&[source.clone(), old]).is_empty());
        let stopped = ReplicaStats {
            stopped: "apply: injected".into(),
            ..target("")
        };
        assert!(at(&[source.clone(), stopped]).is_empty());
        // Its target here took it in, or there is none: destroyed.
        assert_eq!(at(&[source.clone(), target("")]).len(), 1);
        assert_eq!(at(std::slice::from_ref(&source)).len(), 1);
        // Still routed (a rollback keeps the route), or not frozen: kept.
        let routed = state(vec![
            route(1, "", "m", &[1, 2, 3]),
            route(2, "m", "", &[1, 2, 3]),
        ]);
        let mut v = LeaderView::default();
        v.record(
            Instant::now(),
            3,
            NodeStats::default(),
            std::slice::from_ref(&source),
        );
        assert!(merged_leftovers(&routed, &v, 3).is_empty());
        let thawed = ReplicaStats {
            merging_into: 0,
            ..source
        };
        assert!(at(&[thawed]).is_empty());
    }
}
