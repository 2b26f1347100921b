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
//! by size.

use phoenix_proto::{
    meta_command, placement_command, MergeDone, MergeGroup, MergePhase, MergePlan, MetaCommand,
    OperatorOrigin, PlacementCommand, ReplicaStats, Route,
};

use crate::liveness::LeaderView;
use crate::state::{joined_range, MetaState};

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
                    .is_some_and(|rep| rep.merging_into == 0 && rep.epoch > p.source_epoch);
                if thawed {
                    out.push(MetaCommand {
                        cmd: Some(meta_command::Cmd::FinishMerge(MergeDone {
                            source: p.source,
                            target: None,
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

/// Neighbours to merge by size: both under `max_bytes` together with their keys under
/// `max_keys` (each as its leader reports, at the route's epoch), the same voters and no
/// learners, neither in a split or merge plan, nor `busy` (an operator changing its
/// membership). The smaller group goes into its neighbour. At most
/// [`MERGE_INFLIGHT_MAX`] planned at once; `max_bytes` 0 turns it off.
pub fn small_merges(
    state: &MetaState,
    view: &LeaderView,
    max_bytes: u64,
    max_keys: u64,
    busy: impl Fn(u64) -> bool,
) -> Vec<MergePlan> {
    if max_bytes == 0 || state.merges().len() >= MERGE_INFLIGHT_MAX {
        return Vec::new();
    }
    let size = |r: &Route| {
        let rep = view
            .leader(r.group_id)
            .and_then(|l| view.replica(l, r.group_id))?;
        (rep.epoch == r.epoch && rep.stopped.is_empty())
            .then_some((rep.approximate_bytes, rep.approximate_keys))
    };
    let free = |r: &Route| {
        r.learners.is_empty()
            && !state.splits().contains_key(&r.group_id)
            && state.merge_of(r.group_id).is_none()
            && !busy(r.group_id)
    };
    let voters = |r: &Route| {
        let mut v: Vec<u64> = r.replicas.iter().map(|x| x.node_id).collect();
        v.sort_unstable();
        v
    };
    let mut by_start: Vec<&Route> = state.routes().values().collect();
    by_start.sort_by(|a, b| a.start_key.cmp(&b.start_key));
    for w in by_start.windows(2) {
        let (a, b) = (w[0], w[1]);
        if !free(a) || !free(b) || voters(a) != voters(b) {
            continue;
        }
        let (Some((ab, ak)), Some((bb, bk))) = (size(a), size(b)) else {
            continue;
        };
        if ab + bb >= max_bytes || ak + bk >= max_keys {
            continue;
        }
        let (s, t) = if ab <= bb { (a, b) } else { (b, a) };
        return vec![MergePlan {
            source: s.group_id,
            target: t.group_id,
            source_epoch: s.epoch,
            target_epoch: t.epoch,
            phase: MergePhase::Prepare as i32,
            prepare_index: 0,
            origin: OperatorOrigin::MergeCheck as i32,
        }];
    }
    Vec::new()
}
