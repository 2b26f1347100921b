//! Splits decided by the meta leader: which planned splits a group reports applied
//! ([`finished_splits`], recorded with `FinishSplit`), and which groups to split by size
//! ([`size_splits`]: their leaders report them over their node's split size, with the
//! key in the middle of their data). The plans themselves are in the replicated state
//! (`MetaState::splits`); `placement_commands` asks the leaders to carry them out.

use phoenix_proto::{meta_command, MetaCommand, OperatorOrigin, Route, SplitDone, SplitPlan};

use crate::liveness::LeaderView;
use crate::state::{route_contains, MetaState};

/// Splits planned by size at most at once, over the cluster.
pub const SPLIT_INFLIGHT_MAX: usize = 4;

/// The `FinishSplit` commands for the planned splits some replica reports applied: its
/// range epoch past the plan's, and the group the split made named in its report.
pub fn finished_splits(state: &MetaState, view: &LeaderView) -> Vec<MetaCommand> {
    let mut out = Vec::new();
    for plan in state.splits().values() {
        let g = plan.group_id;
        let Some(route) = state.routes().get(&g) else {
            continue;
        };
        let done = route.replicas.iter().find_map(|r| {
            let rep = view.replica(r.node_id, g)?;
            let child = rep.split_child.as_ref()?;
            (rep.epoch > plan.epoch
                && child.group_id == plan.new_group_id
                && child.epoch == plan.epoch + 1)
                .then_some((rep, child))
        });
        let Some((_, child)) = done else {
            continue;
        };
        let parent = Route {
            start_key: route.start_key.clone(),
            end_key: plan.split_key.clone(),
            epoch: child.epoch,
            ..route.clone()
        };
        out.push(MetaCommand {
            cmd: Some(meta_command::Cmd::FinishSplit(SplitDone {
                parent: Some(parent),
                child: Some(child.clone()),
            })),
        });
    }
    out
}

/// Splits to plan for groups whose leaders report them over their split size (a middle
/// key measured at the route's epoch, strictly inside its range), up to
/// [`SPLIT_INFLIGHT_MAX`] planned at once. The new groups' ids follow each other from
/// [`MetaState::next_group_id`]; the caller proposes them in order.
pub fn size_splits(state: &MetaState, view: &LeaderView) -> Vec<SplitPlan> {
    let room = SPLIT_INFLIGHT_MAX.saturating_sub(state.splits().len());
    let mut next = state.next_group_id();
    let mut out = Vec::new();
    for route in state.routes().values() {
        if out.len() >= room {
            break;
        }
        let g = route.group_id;
        if state.splits().contains_key(&g) {
            continue;
        }
        let Some(rep) = view.leader(g).and_then(|l| view.replica(l, g)) else {
            continue;
        };
        let key = rep.split_key_hint.as_ref();
        if key.is_empty()
            || rep.epoch != route.epoch
            || !route_contains(route, key)
            || key == route.start_key.as_ref()
        {
            continue;
        }
        out.push(SplitPlan {
            group_id: g,
            split_key: rep.split_key_hint.clone(),
            new_group_id: next,
            epoch: route.epoch,
            origin: OperatorOrigin::SplitCheck as i32,
        });
        next += 1;
    }
    out
}
