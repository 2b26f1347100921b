//! The meta leader's operators: changes to groups it has started and follows from
//! heartbeats until they are done or given up:
//! - leader transfers, asked for by a user (`phoenix cluster transfer-leader`) or
//!   decided by the leader balancer ([`balance_leaders`]): the heartbeat answer to the
//!   node that the view says leads the group carries a `TransferLeader` command, again
//!   at every heartbeat, until the view shows the target leading (done),
//!   [`TRANSFER_TIMEOUT`] passes (given up: the target could not catch up or win; the
//!   balancer may decide again) or the target can no longer lead (cancelled);
//! - replica additions (`phoenix cluster add-replica`), one membership change at a time
//!   (raft's single-server changes): the leader is told to add the node as a learner;
//!   the routing table takes the new membership from the leader's report
//!   ([`crate::route_updates`]), so the node is told to create its replica, which
//!   catches up from the log or a snapshot; once it reports being within
//!   [`PROMOTE_LAG_MAX`] entries of the leader's commit the leader is told to promote
//!   it; done when the routing table lists it as a voter. Each command names the
//!   membership it was decided on (its conf version), so a stale one is ignored;
//! - replica removals (`phoenix cluster remove-replica`): if the node leads the group,
//!   its leadership is moved to the most caught-up running voter first (a leader could
//!   remove itself, but the group would wait an election for a new one); then the
//!   leader is told to remove the node; done when the routing table, following the
//!   leader's report, no longer lists it. The node then drops its data when its
//!   heartbeat answer says the table left it out ([`crate::placement_commands`]). A
//!   removal goes on while the node is down: replacing a dead node's replicas is what
//!   it is for.
//!
//! One operator per group at a time.
//!
//! Soft state like [`LeaderView`]: a new meta leader starts with none. An operator lost
//! with its meta leader is a transfer that completes or not on its own; nothing waits
//! on it but the asker, who sees its request time out. Time is passed in (`now`).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use phoenix_proto::{
    placement_command, ChangePeer, ChangePeerKind, Operator, OperatorKind, OperatorOrigin,
    PlacementCommand, TransferLeader,
};

use crate::error::OperatorError;
use crate::liveness::LeaderView;
use crate::repair::ReplicaMove;
use crate::state::{MetaState, META_GROUP};

/// An operator not done within this is given up.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);

/// Leader transfers the balancer keeps under way at most: each costs its group a
/// moment without a leader, so a large imbalance is worked off in steps.
pub const BALANCE_INFLIGHT_MAX: usize = 32;

/// A replica this many entries behind its leader's commit (as last reported) is not a
/// balancing target: raft would have to catch it up first, or send it a snapshot.
pub const BALANCE_LAG_MAX: u64 = 1000;

/// After a transfer to a node is given up or cancelled, the balancer leaves that
/// (group, node) pair alone this long (it would likely fail again: an old node that
/// ignores the command, a target that cannot catch up).
pub const BALANCE_BACKOFF: Duration = Duration::from_secs(60);

/// Longest an add-replica operator runs: the learner may need a whole snapshot.
pub const ADD_TIMEOUT: Duration = Duration::from_secs(120);

/// A learner this many entries or fewer behind its leader's commit (as reported) is
/// promoted to a voter: a voter far behind would weaken the quorum until it caught up.
pub const PROMOTE_LAG_MAX: u64 = 100;

/// How long after a user's replica addition or removal ends the replica balancer leaves
/// the group alone (the next step of a `cluster move` comes within it).
pub const ASKED_GRACE: Duration = Duration::from_secs(5);

/// Longest a remove-replica operator runs.
pub const REMOVE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long after a balancer's move made its new voter the operators remember which
/// node the group's extra voter is to be trimmed from ([`Operators::trim_hint`]).
pub const TRIM_HINT_FOR: Duration = Duration::from_secs(60);

/// Where a remove-replica operator stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveStep {
    /// The node leads the group: its leadership moves to another voter first.
    MoveLeader,
    /// The leader is asked to remove the node.
    Remove,
    /// Out of the membership; the routing table is to follow.
    Route,
}

impl RemoveStep {
    fn name(self) -> &'static str {
        match self {
            RemoveStep::MoveLeader => "move leader away",
            RemoveStep::Remove => "remove",
            RemoveStep::Route => "update route",
        }
    }
}

#[derive(Debug, Clone)]
struct Remove {
    node: u64,
    started: Instant,
    step: RemoveStep,
    /// The command the group's leader gets for the step (None: it waits).
    command: Option<placement_command::Cmd>,
    origin: Origin,
}

/// Where an add-replica operator stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddStep {
    /// The leader is asked to add the node as a learner.
    AddLearner,
    /// The learner is catching up.
    CatchUp,
    /// The leader is asked to promote the learner.
    Promote,
    /// A voter in the group; the routing table is to list it.
    Route,
}

impl AddStep {
    fn name(self) -> &'static str {
        match self {
            AddStep::AddLearner => "add learner",
            AddStep::CatchUp => "catch up",
            AddStep::Promote => "promote",
            AddStep::Route => "update route",
        }
    }
}

#[derive(Debug, Clone)]
struct Add {
    to: u64,
    started: Instant,
    step: AddStep,
    origin: Origin,
    /// A move's node to trim once `to` is a voter.
    trim: Option<u64>,
}

/// Who started an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A user's request.
    Request,
    /// The leader balancer, or the replica balancer ([`crate::balance_replicas`]).
    Balance,
    /// Replica repair ([`crate::repair_replicas`]).
    Repair,
    /// The merge check bringing two neighbours onto the same voters
    /// ([`crate::merge_alignment`]).
    Merge,
}

impl Origin {
    fn wire(self) -> OperatorOrigin {
        match self {
            Origin::Request => OperatorOrigin::Request,
            Origin::Balance => OperatorOrigin::Balance,
            Origin::Repair => OperatorOrigin::Repair,
            Origin::Merge => OperatorOrigin::MergeCheck,
        }
    }
}

#[derive(Debug, Clone)]
struct Transfer {
    from: u64,
    to: u64,
    started: Instant,
    origin: Origin,
}

/// How an operator ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The view shows its target leading.
    Done,
    /// Not done within [`TRANSFER_TIMEOUT`].
    GivenUp,
    /// Its target can no longer lead (down, full, stopping, replica stopped or gone).
    Cancelled(OperatorError),
}

/// The operators under way, by group.
#[derive(Debug, Default)]
pub struct Operators {
    transfers: BTreeMap<u64, Transfer>,
    adds: BTreeMap<u64, Add>,
    removes: BTreeMap<u64, Remove>,
    /// (group, target) pairs whose transfer failed lately, with when.
    failed: HashMap<(u64, u64), Instant>,
    /// Groups whose replica addition or removal asked for by a user ended lately, with
    /// when: the balancer leaves them alone for [`ASKED_GRACE`], so a `cluster move`
    /// (an addition, then a removal) is not cut in between.
    asked: HashMap<u64, Instant>,
    /// Groups whose move made its new voter lately: the node the extra voter is to be
    /// trimmed from, and when (kept [`TRIM_HINT_FOR`]).
    trims: HashMap<u64, (u64, Instant)>,
    /// The two neighbours the merge check is bringing onto the same voters
    /// ([`crate::merge_alignment`]): the replica balancer leaves them where they are, or
    /// it would move back what the alignment moved, and neither would ever finish.
    merge_pair: Option<[u64; 2]>,
}

impl Operators {
    /// Starts moving `group`'s leadership to its replica on `to`. Returns false (and
    /// starts nothing) when `to` leads it already; asking again for a transfer under
    /// way is not an error.
    pub fn transfer_leader(
        &mut self,
        state: &MetaState,
        view: &LeaderView,
        group: u64,
        to: u64,
        now: Instant,
        origin: Origin,
    ) -> Result<bool, OperatorError> {
        placed(state, view, group, to)?;
        if let Some(t) = self.transfers.get(&group) {
            return if t.to == to {
                Ok(true)
            } else {
                Err(OperatorError::Busy { group, to: t.to })
            };
        }
        if let Some(a) = self.adds.get(&group) {
            return Err(OperatorError::Busy { group, to: a.to });
        }
        if let Some(r) = self.removes.get(&group) {
            return Err(OperatorError::Busy { group, to: r.node });
        }
        let from = view.leader(group).ok_or(OperatorError::NoLeader(group))?;
        if from == to {
            return Ok(false);
        }
        check_target(view, group, to, now)?;
        self.transfers.insert(
            group,
            Transfer {
                from,
                to,
                started: now,
                origin,
            },
        );
        Ok(true)
    }

    /// Starts adding a replica of `group` on node `to` (a learner, then a voter).
    /// Returns false (and starts nothing) when the routing table lists `to` as a voter
    /// already; asking again for an addition under way is not an error.
    #[allow(clippy::too_many_arguments)] // what, where, when and why: all needed
    pub fn add_replica(
        &mut self,
        state: &MetaState,
        view: &LeaderView,
        meta_members: &[u64],
        group: u64,
        to: u64,
        now: Instant,
        origin: Origin,
    ) -> Result<bool, OperatorError> {
        if let Some(m) = state.member_behind(meta_members, crate::state::PROTOCOL_REPLICA_MOVES) {
            return Err(OperatorError::OldMetaMember(m));
        }
        let route = route_of(state, view, group).ok_or(OperatorError::UnknownGroup(group))?;
        if !state.nodes().contains_key(&to) {
            return Err(OperatorError::UnknownNode(to));
        }
        if group == META_GROUP {
            meta_change_allowed(state, view, route, to, true, now)?;
        }
        if let Some(a) = self.adds.get(&group) {
            return if a.to == to {
                Ok(true)
            } else {
                Err(OperatorError::Busy { group, to: a.to })
            };
        }
        if let Some(t) = self.transfers.get(&group) {
            return Err(OperatorError::Busy { group, to: t.to });
        }
        if let Some(r) = self.removes.get(&group) {
            return Err(OperatorError::Busy { group, to: r.node });
        }
        merge_free(state, group)?;
        if is_voter(route, to) {
            return Ok(false);
        }
        // (A group with a split planned counts: the new replica would apply it.)
        let split = route.epoch > 1 || state.splits().contains_key(&group);
        if split && !hosts_splits(state, to) {
            return Err(OperatorError::OldNode { node: to, group });
        }
        check_node(view, to, now)?;
        view.leader(group).ok_or(OperatorError::NoLeader(group))?;
        self.adds.insert(
            group,
            Add {
                to,
                started: now,
                step: AddStep::AddLearner,
                origin,
                trim: None,
            },
        );
        Ok(true)
    }

    /// Starts moving `group`'s replica on `from` to `to`: an addition on `to` as
    /// [`add_replica`](Operators::add_replica), after which [`trim_hint`] names `from`
    /// for [`TRIM_HINT_FOR`], so the pass that trims the group's extra voter removes the
    /// one the move meant (not whichever node then looks most loaded, which could be
    /// `to` and undo the move).
    ///
    /// [`trim_hint`]: Operators::trim_hint
    #[allow(clippy::too_many_arguments)] // what, where, when and why: all needed
    pub fn move_replica(
        &mut self,
        state: &MetaState,
        view: &LeaderView,
        meta_members: &[u64],
        group: u64,
        from: u64,
        to: u64,
        now: Instant,
        origin: Origin,
    ) -> Result<bool, OperatorError> {
        let started = self.add_replica(state, view, meta_members, group, to, now, origin)?;
        if let Some(a) = self.adds.get_mut(&group).filter(|a| a.to == to) {
            a.trim = Some(from);
        }
        Ok(started)
    }

    /// Starts the operator for `m` (an addition, a removal or a move, as
    /// [`add_replica`](Operators::add_replica), [`remove_replica`](Operators::remove_replica)
    /// and [`move_replica`](Operators::move_replica) do).
    pub fn start(
        &mut self,
        state: &MetaState,
        view: &LeaderView,
        meta_members: &[u64],
        m: ReplicaMove,
        now: Instant,
        origin: Origin,
    ) -> Result<bool, OperatorError> {
        match m {
            ReplicaMove::Add { group, to } => {
                self.add_replica(state, view, meta_members, group, to, now, origin)
            }
            ReplicaMove::Remove { group, node } => {
                self.remove_replica(state, view, meta_members, group, node, now, origin)
            }
            ReplicaMove::Move { group, from, to } => {
                self.move_replica(state, view, meta_members, group, from, to, now, origin)
            }
        }
    }

    /// Names the pair of groups the merge check aligns now (None: none).
    pub fn set_merge_pair(&mut self, pair: Option<[u64; 2]>) {
        self.merge_pair = pair;
    }

    /// The pair of groups the merge check aligns now.
    pub fn merge_pair(&self) -> Option<[u64; 2]> {
        self.merge_pair
    }

    /// Whether `group` is one of the pair the merge check aligns now.
    pub fn held_for_merge(&self, group: u64) -> bool {
        self.merge_pair.is_some_and(|p| p.contains(&group))
    }

    /// Whether an addition or removal of a replica of `group` is under way (a merge is
    /// planned only between groups whose membership stays put).
    pub fn changes_membership(&self, group: u64) -> bool {
        self.adds.contains_key(&group) || self.removes.contains_key(&group)
    }

    /// The node a move of `group` that ended lately (within [`TRIM_HINT_FOR`] before
    /// `now`) meant its extra voter to be trimmed from.
    pub fn trim_hint(&self, group: u64, now: Instant) -> Option<u64> {
        self.trims
            .get(&group)
            .filter(|(_, at)| now.saturating_duration_since(*at) < TRIM_HINT_FOR)
            .map(|&(node, _)| node)
    }

    /// Starts removing the replica of `group` on `node` (voter or learner). Returns
    /// false (and starts nothing) when the routing table does not list it; asking again
    /// for a removal under way is not an error. The node need not be alive.
    #[allow(clippy::too_many_arguments)] // what, where, when and why: all needed
    pub fn remove_replica(
        &mut self,
        state: &MetaState,
        view: &LeaderView,
        meta_members: &[u64],
        group: u64,
        node: u64,
        now: Instant,
        origin: Origin,
    ) -> Result<bool, OperatorError> {
        if let Some(m) = state.member_behind(meta_members, crate::state::PROTOCOL_REPLICA_MOVES) {
            return Err(OperatorError::OldMetaMember(m));
        }
        let route = route_of(state, view, group).ok_or(OperatorError::UnknownGroup(group))?;
        if group == META_GROUP {
            meta_change_allowed(state, view, route, node, false, now)?;
        }
        if let Some(r) = self.removes.get(&group) {
            return if r.node == node {
                Ok(true)
            } else {
                Err(OperatorError::Busy { group, to: r.node })
            };
        }
        if !route.replicas.iter().any(|r| r.node_id == node) {
            return Ok(false);
        }
        merge_free(state, group)?;
        if let Some(t) = self.transfers.get(&group) {
            return Err(OperatorError::Busy { group, to: t.to });
        }
        if let Some(a) = self.adds.get(&group) {
            return Err(OperatorError::Busy { group, to: a.to });
        }
        let voters = route
            .replicas
            .iter()
            .filter(|r| is_voter(route, r.node_id))
            .count();
        if is_voter(route, node) && voters <= 1 {
            return Err(OperatorError::LastVoter { group, node });
        }
        quorum_after_removal(route, view, node, now)?;
        view.leader(group).ok_or(OperatorError::NoLeader(group))?;
        let (step, command) = remove_step(view, group, node, now);
        self.removes.insert(
            group,
            Remove {
                node,
                started: now,
                step,
                command,
                origin,
            },
        );
        Ok(true)
    }

    /// Ends the operators that are done (the view shows the target leading), out of
    /// time, or whose target can no longer lead (checked again at every call, so a
    /// target that dies or starts stopping does not keep its group's leader trying);
    /// returns them with how they ended.
    pub fn settle(
        &mut self,
        state: &MetaState,
        view: &LeaderView,
        now: Instant,
    ) -> Vec<(u64, Outcome)> {
        let mut ended = Vec::new();
        let failed = &mut self.failed;
        failed.retain(|_, at| now.saturating_duration_since(*at) < BALANCE_BACKOFF);
        self.transfers.retain(|&g, t| {
            let outcome = if view.leader(g) == Some(t.to) {
                Outcome::Done
            } else if now.saturating_duration_since(t.started) >= TRANSFER_TIMEOUT {
                Outcome::GivenUp
            } else if let Err(e) =
                placed(state, view, g, t.to).and_then(|()| check_target(view, g, t.to, now))
            {
                Outcome::Cancelled(e)
            } else {
                return true;
            };
            if outcome != Outcome::Done {
                failed.insert((g, t.to), now);
            }
            ended.push((g, outcome));
            false
        });
        let asked = &mut self.asked;
        asked.retain(|_, at| now.saturating_duration_since(*at) < ASKED_GRACE);
        let trims = &mut self.trims;
        trims.retain(|_, (_, at)| now.saturating_duration_since(*at) < TRIM_HINT_FOR);
        self.adds.retain(|&g, a| {
            let outcome = if route_of(state, view, g).is_some_and(|r| is_voter(r, a.to)) {
                Outcome::Done
            } else if now.saturating_duration_since(a.started) >= ADD_TIMEOUT {
                Outcome::GivenUp
            } else if let Err(e) = check_node(view, a.to, now) {
                // (A learner left behind does not vote: it weakens nothing.)
                Outcome::Cancelled(e)
            } else {
                if let Some((step, _)) = add_step(view, g, a.to) {
                    a.step = step;
                }
                return true;
            };
            if a.origin == Origin::Request {
                asked.insert(g, now);
            }
            if let (Outcome::Done, Some(from)) = (&outcome, a.trim) {
                trims.insert(g, (from, now));
            }
            ended.push((g, outcome));
            false
        });
        self.removes.retain(|&g, r| {
            // (A trim hint lasts until a removal is done: one given up leaves it.)
            let listed = route_of(state, view, g)
                .is_some_and(|route| route.replicas.iter().any(|x| x.node_id == r.node));
            let outcome = if !listed {
                trims.remove(&g);
                Outcome::Done
            } else if now.saturating_duration_since(r.started) >= REMOVE_TIMEOUT {
                Outcome::GivenUp
            } else {
                (r.step, r.command) = remove_step(view, g, r.node, now);
                let quorum = route_of(state, view, g)
                    .map(|route| quorum_after_removal(route, view, r.node, now));
                if matches!(quorum, Some(Err(_))) {
                    // The leader is asked no more while the rest would lack a live
                    // quorum (a change it already proposed may still commit: then the
                    // table follows and the removal is done; else it is given up).
                    r.command = None;
                }
                return true;
            };
            if r.origin == Origin::Request {
                asked.insert(g, now);
            }
            ended.push((g, outcome));
            false
        });
        ended
    }

    /// Whether a transfer of `group` to `to` failed within [`BALANCE_BACKOFF`].
    fn failed_lately(&self, group: u64, to: u64) -> bool {
        self.failed.contains_key(&(group, to))
    }

    /// The commands for `node`'s heartbeat answer: the transfers and membership changes
    /// of the groups the view says it leads.
    pub fn commands_for(&self, view: &LeaderView, node: u64) -> Vec<PlacementCommand> {
        let transfers = self
            .transfers
            .iter()
            .filter(|(&g, _)| view.leader(g) == Some(node))
            .map(|(&g, t)| {
                placement_command::Cmd::TransferLeader(TransferLeader {
                    group_id: g,
                    to_node: t.to,
                })
            });
        let changes = self
            .adds
            .iter()
            .filter(|(&g, _)| view.leader(g) == Some(node))
            .filter_map(|(&g, a)| add_step(view, g, a.to)?.1)
            .map(placement_command::Cmd::ChangePeer);
        let removals = self
            .removes
            .iter()
            .filter(|(&g, _)| view.leader(g) == Some(node))
            .filter_map(|(_, r)| r.command.clone());
        transfers
            .chain(changes)
            .chain(removals)
            .map(|cmd| PlacementCommand { cmd: Some(cmd) })
            .collect()
    }

    /// The target of the transfer under way on `group`, if any.
    pub fn transfer_target(&self, group: u64) -> Option<u64> {
        self.transfers.get(&group).map(|t| t.to)
    }

    /// Whether an operator is under way on `group`.
    pub fn busy(&self, group: u64) -> bool {
        self.transfers.contains_key(&group)
            || self.adds.contains_key(&group)
            || self.removes.contains_key(&group)
    }

    /// Whether a replica addition or removal a user asked for on `group` ended within
    /// [`ASKED_GRACE`] before `now`.
    pub fn asked_lately(&self, group: u64, now: Instant) -> bool {
        self.asked
            .get(&group)
            .is_some_and(|&at| now.saturating_duration_since(at) < ASKED_GRACE)
    }

    /// The step of the replica removal under way on `group`, if any.
    pub fn remove_step(&self, group: u64) -> Option<RemoveStep> {
        self.removes.get(&group).map(|r| r.step)
    }

    /// The step of the replica addition under way on `group`, if any.
    pub fn add_step(&self, group: u64) -> Option<AddStep> {
        self.adds.get(&group).map(|a| a.step)
    }

    /// Replica additions and removals under way that `origin` started (repair, the
    /// replica balancer).
    pub fn changing(&self, origin: Origin) -> usize {
        let adds = self.adds.values().filter(|a| a.origin == origin);
        let removes = self.removes.values().filter(|r| r.origin == origin);
        adds.count() + removes.count()
    }

    /// The node a move under way on `group` leaves (its addition's trim), if any.
    pub fn move_source(&self, group: u64) -> Option<u64> {
        self.adds.get(&group).and_then(|a| a.trim)
    }

    /// The node a replica addition under way on `group` adds, if any.
    pub fn add_target(&self, group: u64) -> Option<u64> {
        self.adds.get(&group).map(|a| a.to)
    }

    /// Whether no operator is under way (no transfer, addition or removal).
    pub fn is_idle(&self) -> bool {
        self.transfers.is_empty() && self.adds.is_empty() && self.removes.is_empty()
    }

    /// Transfers under way that the leader balancer started.
    pub fn balancing(&self) -> usize {
        self.transfers
            .values()
            .filter(|t| t.origin == Origin::Balance)
            .count()
    }

    /// The operators under way as the cluster status shows them, oldest first.
    pub fn list(&self, now: Instant) -> Vec<Operator> {
        let mut v: Vec<(Instant, Operator)> = self
            .transfers
            .iter()
            .map(|(&g, t)| {
                (
                    t.started,
                    Operator {
                        group_id: g,
                        kind: OperatorKind::TransferLeader as i32,
                        origin: t.origin.wire() as i32,
                        from_node: t.from,
                        to_node: t.to,
                        age_ms: now.saturating_duration_since(t.started).as_millis() as u64,
                        step: String::new(),
                        into_group: 0,
                    },
                )
            })
            .collect();
        v.extend(self.adds.iter().map(|(&g, a)| {
            (
                a.started,
                Operator {
                    group_id: g,
                    kind: OperatorKind::AddReplica as i32,
                    origin: a.origin.wire() as i32,
                    from_node: a.trim.unwrap_or(0),
                    to_node: a.to,
                    age_ms: now.saturating_duration_since(a.started).as_millis() as u64,
                    step: a.step.name().to_string(),
                    into_group: 0,
                },
            )
        }));
        v.extend(self.removes.iter().map(|(&g, r)| {
            (
                r.started,
                Operator {
                    group_id: g,
                    kind: OperatorKind::RemoveReplica as i32,
                    origin: r.origin.wire() as i32,
                    from_node: r.node,
                    to_node: 0,
                    age_ms: now.saturating_duration_since(r.started).as_millis() as u64,
                    step: r.step.name().to_string(),
                    into_group: 0,
                },
            )
        }));
        v.sort_by_key(|(t, o)| (*t, o.group_id));
        v.into_iter().map(|(_, o)| o).collect()
    }
}

/// The route of `group`: the routing table's, or for the meta group (which holds no
/// keys, so the table leaves it out) the meta leader's own replica's membership.
pub fn route_of<'a>(
    state: &'a MetaState,
    view: &'a LeaderView,
    group: u64,
) -> Option<&'a phoenix_proto::Route> {
    if group == META_GROUP {
        view.meta_route()
    } else {
        state.routes().get(&group)
    }
}

/// Refuses a membership change of the meta group while the node added (`added`), or a
/// live member that stays, runs a binary that does not report its meta replica: the
/// operator would never see it catch up, nor the change done. The member removed, and
/// a member down, are not asked (a member that died before its upgrade must still be
/// replaceable).
fn meta_change_allowed(
    state: &MetaState,
    view: &LeaderView,
    route: &phoenix_proto::Route,
    node: u64,
    added: bool,
    now: Instant,
) -> Result<(), OperatorError> {
    let staying = route
        .replicas
        .iter()
        .map(|r| r.node_id)
        .filter(|&n| n != node && view.is_alive(n, now));
    let nodes = staying.chain(added.then_some(node));
    for n in nodes {
        if state
            .nodes()
            .get(&n)
            .is_some_and(|r| r.protocol < crate::state::PROTOCOL_META_MEMBERS)
        {
            return Err(OperatorError::OldMetaNode(n));
        }
    }
    Ok(())
}

/// The voters `route` lists (its replicas but the learners), in its order.
pub(crate) fn voters_of(route: &phoenix_proto::Route) -> Vec<u64> {
    route
        .replicas
        .iter()
        .map(|r| r.node_id)
        .filter(|n| !route.learners.contains(n))
        .collect()
}

/// Whether `route` lists `node` as a voter.
fn is_voter(route: &phoenix_proto::Route, node: u64) -> bool {
    route.replicas.iter().any(|r| r.node_id == node) && !route.learners.contains(&node)
}

/// Whether the routing table places a voter of `group` on `node` (one that may lead).
fn placed(
    state: &MetaState,
    view: &LeaderView,
    group: u64,
    node: u64,
) -> Result<(), OperatorError> {
    let route = route_of(state, view, group).ok_or(OperatorError::UnknownGroup(group))?;
    if !route.replicas.iter().any(|r| r.node_id == node) {
        Err(OperatorError::NotAReplica { group, node })
    } else if route.learners.contains(&node) {
        Err(OperatorError::Learner { group, node })
    } else {
        Ok(())
    }
}

/// Whether the voters of `route` but `node` would have a quorum alive: a removal
/// that left fewer could commit (the old membership's quorum may include `node`) and
/// then leave the group unable to commit anything until they return.
fn quorum_after_removal(
    route: &phoenix_proto::Route,
    view: &LeaderView,
    node: u64,
    now: Instant,
) -> Result<(), OperatorError> {
    if !is_voter(route, node) {
        return Ok(());
    }
    let rest: Vec<u64> = route
        .replicas
        .iter()
        .map(|r| r.node_id)
        .filter(|&n| n != node && is_voter(route, n))
        .collect();
    let live = rest.iter().filter(|&&n| view.is_alive(n, now)).count();
    if live < rest.len() / 2 + 1 {
        return Err(OperatorError::NoQuorumAfter {
            group: route.group_id,
            node,
            live,
            voters: rest.len(),
        });
    }
    Ok(())
}

/// Whether `node` may take on work: alive, with disk room, not stopping.
fn check_node(view: &LeaderView, node: u64, now: Instant) -> Result<(), OperatorError> {
    if !view.is_alive(node, now) {
        return Err(OperatorError::NodeDown(node));
    }
    if let Some((_, stats)) = view.last_heartbeat(node) {
        if stats.disk_full {
            return Err(OperatorError::DiskFull(node));
        }
        if stats.stopping {
            return Err(OperatorError::NodeStopping(node));
        }
    }
    Ok(())
}

/// Where adding `to` to `group` stands by its leader's last report, with the command
/// the leader needs for the next step (None when it waits).
fn add_step(view: &LeaderView, group: u64, to: u64) -> Option<(AddStep, Option<ChangePeer>)> {
    let rep = view.leader(group).and_then(|l| view.replica(l, group))?;
    if rep.voters.contains(&to) {
        return Some((AddStep::Route, None));
    }
    let change = |kind: ChangePeerKind| ChangePeer {
        group_id: group,
        node_id: to,
        kind: kind as i32,
        conf_version: rep.conf_version,
    };
    if !rep.learners.contains(&to) {
        return Some((
            AddStep::AddLearner,
            Some(change(ChangePeerKind::AddLearner)),
        ));
    }
    // Caught up by its own report: it applied its own addition (its report is not older
    // than it) and is close to the leader's commit. (Its node is alive: `settle`
    // cancels the addition otherwise.)
    let caught_up = view.replica(to, group).is_some_and(|r| {
        r.stopped.is_empty()
            && r.conf_version >= rep.conf_version
            && r.applied_index >= rep.conf_version
            && r.applied_index + PROMOTE_LAG_MAX >= rep.commit_index
    });
    Some(if caught_up {
        (AddStep::Promote, Some(change(ChangePeerKind::AddVoter)))
    } else {
        (AddStep::CatchUp, None)
    })
}

/// Where removing `node` from `group` stands by its leader's last report, with the
/// command the leader needs for the next step (None when it waits: no leader known, or
/// no voter able to take the leadership over).
fn remove_step(
    view: &LeaderView,
    group: u64,
    node: u64,
    now: Instant,
) -> (RemoveStep, Option<placement_command::Cmd>) {
    let Some((leader, rep)) = view
        .leader(group)
        .and_then(|l| Some((l, view.replica(l, group)?)))
    else {
        return (RemoveStep::Remove, None);
    };
    if !rep.voters.contains(&node) && !rep.learners.contains(&node) {
        return (RemoveStep::Route, None);
    }
    if leader == node {
        // The running voter closest to the commit takes over (ties: lowest id).
        let to = rep
            .voters
            .iter()
            .filter(|&&v| v != node && check_target(view, group, v, now).is_ok())
            .filter_map(|&v| Some((view.replica(v, group)?.applied_index, v)))
            .filter(|&(applied, _)| applied + BALANCE_LAG_MAX >= rep.commit_index)
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        return (
            RemoveStep::MoveLeader,
            to.map(|(_, to)| {
                placement_command::Cmd::TransferLeader(TransferLeader {
                    group_id: group,
                    to_node: to,
                })
            }),
        );
    }
    (
        RemoveStep::Remove,
        Some(placement_command::Cmd::ChangePeer(ChangePeer {
            group_id: group,
            node_id: node,
            kind: ChangePeerKind::Remove as i32,
            conf_version: rep.conf_version,
        })),
    )
}

/// Whether `node` may take the leadership of `group`: alive, with disk room, not
/// stopping, hosting a running replica of it.
fn check_target(
    view: &LeaderView,
    group: u64,
    node: u64,
    now: Instant,
) -> Result<(), OperatorError> {
    check_node(view, node, now)?;
    match view.replica(node, group) {
        None => Err(OperatorError::ReplicaNotReported { group, node }),
        Some(r) if !r.stopped.is_empty() => Err(OperatorError::ReplicaStopped {
            group,
            node,
            why: r.stopped.clone(),
        }),
        Some(_) => Ok(()),
    }
}

/// Whether node `n`'s binary applies splits (a replica of a group that split must not
/// go to one that would apply its commands without their range epochs).
pub(crate) fn hosts_splits(state: &MetaState, n: u64) -> bool {
    state
        .nodes()
        .get(&n)
        .is_some_and(|r| r.protocol >= crate::state::PROTOCOL_SPLIT)
}

/// Nodes that may take on work at `now`: registered, alive, with disk room, not
/// stopping, and not `excluded` (draining, or down for repair). Once any group has
/// split or has a split planned, only nodes whose binary applies splits.
pub(crate) fn eligible_nodes(
    state: &MetaState,
    view: &LeaderView,
    now: Instant,
    excluded: impl Fn(u64) -> bool,
) -> Vec<u64> {
    let split = !state.splits().is_empty() || state.routes().values().any(|r| r.epoch > 1);
    view.alive_nodes(state, now)
        .into_iter()
        .filter(|&n| !excluded(n))
        .filter(|&n| !split || hosts_splits(state, n))
        .filter(|&n| {
            view.last_heartbeat(n)
                .is_some_and(|(_, s)| !s.disk_full && !s.stopping)
        })
        .collect()
}

/// Whether every count is within `max(10% of the mean, 1)` of the mean (the
/// balancers' band; empty counts are balanced).
pub(crate) fn within_band(count: &BTreeMap<u64, usize>) -> bool {
    let (Some(&most), Some(&fewest)) = (count.values().max(), count.values().min()) else {
        return true;
    };
    let mean = count.values().sum::<usize>() as f64 / count.len() as f64;
    let slack = (mean / 10.0).max(1.0);
    most as f64 <= mean + slack && fewest as f64 >= mean - slack
}

/// The (giver, receiver) pairs a balancer tries, in order: givers from the most loaded,
/// each with the receivers holding at least two fewer from the least loaded (ties to the
/// lowest ids). A move along any of them narrows the spread, so a balancing loop ends.
pub(crate) fn move_pairs(count: &BTreeMap<u64, usize>) -> Vec<(u64, u64)> {
    let mut receivers: Vec<(usize, u64)> = count.iter().map(|(&n, &c)| (c, n)).collect();
    receivers.sort_unstable();
    let mut givers = receivers.clone();
    givers.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    givers
        .iter()
        .flat_map(|&(from_count, from)| {
            receivers
                .iter()
                .filter(move |&&(c, to)| to != from && c + 2 <= from_count)
                .map(move |&(_, to)| (from, to))
        })
        .collect()
}

/// The leader balancer's next moves: up to `max` (group, target) transfers that bring
/// every eligible node's count of led groups within `max(10% of the mean, 1)` of the
/// mean, as far as the placement allows. Eligible nodes are alive, not full, not
/// stopping and not draining; a group with an operator under way counts for its target and is not moved
/// again, nor to a node its transfer failed to lately ([`BALANCE_BACKOFF`]). Each move
/// goes from the most loaded node that can give a group away to the least loaded one
/// that hosts a running replica of it no more than [`BALANCE_LAG_MAX`] entries behind,
/// and only between nodes that differ by at least two (so a move never just swaps which
/// node is over). Ties go to the lowest node and group ids: the same view gives the
/// same moves.
pub fn balance_leaders(
    state: &MetaState,
    view: &LeaderView,
    ops: &Operators,
    now: Instant,
    max: usize,
) -> Vec<(u64, u64)> {
    let eligible = eligible_nodes(state, view, now, |n| state.draining(n));
    if eligible.len() < 2 || max == 0 {
        return Vec::new();
    }
    // Groups each eligible node leads (and may give away), and how many it leads.
    let mut movable: HashMap<u64, Vec<u64>> = eligible.iter().map(|&n| (n, Vec::new())).collect();
    let mut count: BTreeMap<u64, usize> = eligible.iter().map(|&n| (n, 0)).collect();
    for &g in state.routes().keys() {
        let (leader, busy) = match ops.transfer_target(g) {
            Some(to) => (Some(to), true),
            None => (view.leader(g), ops.busy(g)),
        };
        let Some(leader) = leader else { continue };
        let Some(c) = count.get_mut(&leader) else {
            continue;
        };
        *c += 1;
        if !busy {
            if let Some(v) = movable.get_mut(&leader) {
                v.push(g);
            }
        }
    }
    let mut moves = Vec::new();
    while moves.len() < max && !within_band(&count) {
        let found = move_pairs(&count).into_iter().find_map(|(from, to)| {
            let groups = movable.get(&from)?;
            groups
                .iter()
                .position(|&g| !ops.failed_lately(g, to) && can_lead(state, view, g, from, to))
                .map(|i| (from, i, to))
        });
        let Some((from, i, to)) = found else { break };
        let Some(g) = movable.get_mut(&from).map(|v| v.remove(i)) else {
            break;
        };
        moves.push((g, to));
        if let Some(c) = count.get_mut(&from) {
            *c -= 1;
        }
        if let Some(c) = count.get_mut(&to) {
            *c += 1;
        }
    }
    moves
}

/// Whether the balancer may move `group`'s leadership from `from` to `to`: the route
/// places a voter on `to`, which reported it running and close to the leader's commit.
fn can_lead(state: &MetaState, view: &LeaderView, group: u64, from: u64, to: u64) -> bool {
    let placed = placed(state, view, group, to).is_ok();
    let (Some(target), Some(leader)) = (view.replica(to, group), view.replica(from, group)) else {
        return false;
    };
    placed
        && target.stopped.is_empty()
        && target.applied_index + BALANCE_LAG_MAX >= leader.commit_index
}

/// Refuses a membership change of a group in a merge plan: a merge takes groups with
/// the same replicas, and keeps them so until it ends.
fn merge_free(state: &MetaState, group: u64) -> Result<(), OperatorError> {
    match state.merge_of(group) {
        Some(m) => Err(OperatorError::Merging {
            group,
            source_group: m.source,
            target: m.target,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use phoenix_proto::{
        meta_command, CreateGroups, MetaCommand, NodeStats, Replica, ReplicaStats, Route,
    };
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A meta state with nodes 1..=n and `groups` routes, each on the nodes `place` gives.
    /// Registers node `id` (again: a new record) with the binary level `protocol`.
    pub(crate) fn register(st: &mut MetaState, id: u64, protocol: u32) {
        let cmd = MetaCommand {
            cmd: Some(meta_command::Cmd::RegisterNode(Replica {
                protocol,
                node_id: id,
                addr: format!("h:{id}"),
            })),
        };
        st.apply(st.applied() + 1, &cmd).unwrap();
    }

    pub(crate) fn cluster(n: u64, groups: u64, place: impl Fn(u64) -> Vec<u64>) -> MetaState {
        let mut st = MetaState::default();
        for id in 1..=n {
            register(&mut st, id, 0);
        }
        let index = st.applied();
        let routes = (0..groups)
            .map(|i| Route {
                group_id: i + 1,
                start_key: if i == 0 {
                    Vec::new()
                } else {
                    (i as u32).to_be_bytes().to_vec()
                }
                .into(),
                end_key: if i + 1 == groups {
                    Vec::new()
                } else {
                    ((i + 1) as u32).to_be_bytes().to_vec()
                }
                .into(),
                epoch: 1,
                replicas: place(i + 1)
                    .into_iter()
                    .map(|id| Replica {
                        protocol: 0,
                        node_id: id,
                        addr: format!("h:{id}"),
                    })
                    .collect(),
                ..Route::default()
            })
            .collect();
        let cmd = MetaCommand {
            cmd: Some(meta_command::Cmd::CreateGroups(CreateGroups { routes })),
        };
        st.apply(index + 1, &cmd).unwrap();
        st
    }

    /// The state with `g`'s route replaced by one placing `voters` and `learners`.
    pub(crate) fn set_route(st: &mut MetaState, g: u64, voters: &[u64], learners: &[u64]) {
        let old = st.routes()[&g].clone();
        let all: Vec<u64> = voters.iter().chain(learners).copied().collect();
        let route = Route {
            replicas: all
                .iter()
                .map(|&id| phoenix_proto::Replica {
                    protocol: 0,
                    node_id: id,
                    addr: format!("h:{id}"),
                })
                .collect(),
            learners: learners.to_vec(),
            conf_version: old.conf_version + 1,
            ..old
        };
        let cmd = MetaCommand {
            cmd: Some(meta_command::Cmd::UpdateRoute(route)),
        };
        st.apply(st.applied() + 1, &cmd).unwrap();
    }

    /// Node `id`'s report of every replica the state places on it, with `leader_of(g)`
    /// leading (term 1) and all caught up.
    pub(crate) fn report(
        st: &MetaState,
        id: u64,
        leader_of: &impl Fn(u64) -> u64,
    ) -> Vec<ReplicaStats> {
        st.routes()
            .values()
            .filter(|r| r.replicas.iter().any(|x| x.node_id == id))
            .map(|r| ReplicaStats {
                group_id: r.group_id,
                node_id: id,
                is_leader: leader_of(r.group_id) == id,
                term: 1,
                commit_index: 10,
                applied_index: 10,
                ..ReplicaStats::default()
            })
            .collect()
    }

    /// Every node's [`report`] at `now`.
    pub(crate) fn view(st: &MetaState, now: Instant, leader_of: impl Fn(u64) -> u64) -> LeaderView {
        let mut v = LeaderView::default();
        for &id in st.nodes().keys() {
            v.record(now, id, NodeStats::default(), &report(st, id, &leader_of));
        }
        v
    }

    fn counts(st: &MetaState, v: &LeaderView, moves: &[(u64, u64)]) -> BTreeMap<u64, usize> {
        let moved: HashMap<u64, u64> = moves.iter().copied().collect();
        let mut c: BTreeMap<u64, usize> = st.nodes().keys().map(|&n| (n, 0)).collect();
        for &g in st.routes().keys() {
            if let Some(l) = moved.get(&g).copied().or(v.leader(g)) {
                *c.entry(l).or_default() += 1;
            }
        }
        c
    }

    #[test]
    fn all_leaders_on_one_node_are_spread_within_the_band() {
        let now = Instant::now();
        let st = cluster(3, 30, |_| vec![1, 2, 3]);
        let v = view(&st, now, |_| 1);
        let ops = Operators::default();
        let moves = balance_leaders(&st, &v, &ops, now, 100);
        assert_eq!(
            counts(&st, &v, &moves).into_values().collect::<Vec<_>>(),
            vec![11, 10, 9]
        );
        // The same view gives the same moves; a cap is honoured.
        assert_eq!(balance_leaders(&st, &v, &ops, now, 100), moves);
        assert_eq!(balance_leaders(&st, &v, &ops, now, 4), moves[..4].to_vec());
    }

    #[test]
    fn a_balanced_cluster_and_small_differences_are_left_alone() {
        let now = Instant::now();
        let st = cluster(3, 4, |_| vec![1, 2, 3]);
        // 2, 1, 1: within one of the mean.
        let v = view(&st, now, |g| [1, 1, 2, 3][g as usize - 1]);
        assert!(balance_leaders(&st, &v, &Operators::default(), now, 100).is_empty());
        // 3, 1, 0 is not: one move, to the node leading none.
        let v = view(&st, now, |g| [1, 1, 1, 2][g as usize - 1]);
        let moves = balance_leaders(&st, &v, &Operators::default(), now, 100);
        assert_eq!(moves.len(), 1);
        assert_eq!(moves[0].1, 3);
    }

    #[test]
    fn only_running_caught_up_replicas_on_live_roomy_nodes_take_leaderships() {
        let now = Instant::now();
        let st = cluster(3, 12, |_| vec![1, 2, 3]);
        let v0 = view(&st, now, |_| 1);
        // Node 3 is full: leaderships go to node 2 only, until 7/5 (the mean 6, ± 1).
        let mut v = v0.clone();
        v.record(
            now,
            3,
            NodeStats {
                disk_full: true,
                ..NodeStats::default()
            },
            &[],
        );
        let moves = balance_leaders(&st, &v, &Operators::default(), now, 100);
        assert!(moves.iter().all(|&(_, to)| to == 2), "{moves:?}");
        assert_eq!(moves.len(), 5);
        // Node 3 stopping: the same.
        let mut v = v0.clone();
        v.record(
            now,
            3,
            NodeStats {
                stopping: true,
                ..NodeStats::default()
            },
            &[],
        );
        assert!(balance_leaders(&st, &v, &Operators::default(), now, 100)
            .iter()
            .all(|&(_, to)| to == 2));
        // Node 3 not heard from lately.
        let later = now + crate::ALIVE_WITHIN;
        let mut v = v0.clone();
        for id in [1, 2] {
            v.record(later, id, NodeStats::default(), &report(&st, id, &|_| 1));
        }
        let moves = balance_leaders(&st, &v, &Operators::default(), later, 100);
        assert!(moves.iter().all(|&(_, to)| to == 2), "{moves:?}");
        assert_eq!(moves.len(), 5);
        // Node 3's replicas stopped or lagging: none moves there; node 2's all stopped:
        // nothing moves at all.
        let mut v = v0.clone();
        let reps: Vec<ReplicaStats> = (1..=12)
            .map(|g| ReplicaStats {
                group_id: g,
                term: 1,
                commit_index: 10,
                applied_index: if g % 2 == 0 { 10 } else { 0 },
                stopped: if g % 2 == 0 {
                    "disk error".into()
                } else {
                    String::new()
                },
                ..ReplicaStats::default()
            })
            .collect();
        v.record(now, 3, NodeStats::default(), &reps);
        // (applied 0 is within BALANCE_LAG_MAX of 10: lag the leader's commit instead.)
        let lagging: Vec<ReplicaStats> = (1..=12)
            .map(|g| ReplicaStats {
                group_id: g,
                is_leader: true,
                term: 1,
                commit_index: 10 + BALANCE_LAG_MAX + if g % 2 == 0 { 0 } else { 1 },
                ..ReplicaStats::default()
            })
            .collect();
        v.record(now, 1, NodeStats::default(), &lagging);
        // Node 2 is 1000 behind on the odd groups' commits, so only even ones move, all
        // to node 2: the six of them (node 3, leading none, can take none: 6/6/0).
        let moves = balance_leaders(&st, &v, &Operators::default(), now, 100);
        assert!(
            moves.iter().all(|&(g, to)| to == 2 && g % 2 == 0),
            "{moves:?}"
        );
        assert_eq!(moves.len(), 6);
        let mut stopped = v.clone();
        let reps: Vec<ReplicaStats> = (1..=12)
            .map(|g| ReplicaStats {
                group_id: g,
                term: 1,
                stopped: "bad".into(),
                ..ReplicaStats::default()
            })
            .collect();
        stopped.record(now, 2, NodeStats::default(), &reps);
        assert!(balance_leaders(&st, &stopped, &Operators::default(), now, 100).is_empty());
    }

    #[test]
    fn a_transfer_runs_until_the_target_leads_or_time_is_up() {
        let now = Instant::now();
        let st = cluster(4, 2, |g| if g == 1 { vec![1, 2, 3] } else { vec![2, 3, 4] });
        let v = view(&st, now, |g| if g == 1 { 1 } else { 2 });
        let mut ops = Operators::default();
        let t =
            |ops: &mut Operators, g, to| ops.transfer_leader(&st, &v, g, to, now, Origin::Request);
        assert_eq!(t(&mut ops, 9, 2), Err(OperatorError::UnknownGroup(9)));
        assert_eq!(
            t(&mut ops, 1, 4),
            Err(OperatorError::NotAReplica { group: 1, node: 4 })
        );
        assert_eq!(t(&mut ops, 1, 1), Ok(false));
        assert_eq!(t(&mut ops, 1, 2), Ok(true));
        assert_eq!(t(&mut ops, 1, 2), Ok(true));
        assert_eq!(
            t(&mut ops, 1, 3),
            Err(OperatorError::Busy { group: 1, to: 2 })
        );
        // The leader's node is told, at every heartbeat; the others are not.
        let cmds = ops.commands_for(&v, 1);
        assert_eq!(cmds.len(), 1);
        assert!(ops.commands_for(&v, 2).is_empty());
        assert_eq!(ops.list(now).len(), 1);
        assert_eq!(ops.settle(&st, &v, now + Duration::from_secs(1)), vec![]);
        // The target reports leading at a higher term: done.
        let mut v2 = v.clone();
        v2.record(
            now,
            2,
            NodeStats::default(),
            &[ReplicaStats {
                group_id: 1,
                is_leader: true,
                term: 2,
                ..ReplicaStats::default()
            }],
        );
        assert_eq!(ops.settle(&st, &v2, now), vec![(1, Outcome::Done)]);
        assert!(ops.list(now).is_empty());
        // Never done: given up after the timeout.
        assert_eq!(t(&mut ops, 2, 3), Ok(true));
        assert_eq!(
            ops.settle(&st, &v, now + TRANSFER_TIMEOUT),
            vec![(2, Outcome::GivenUp)]
        );
    }

    #[test]
    fn a_transfer_whose_target_cannot_lead_is_cancelled_and_not_retried_soon() {
        let now = Instant::now();
        let st = cluster(3, 6, |_| vec![1, 2, 3]);
        let v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        assert_eq!(
            ops.transfer_leader(&st, &v, 1, 3, now, Origin::Balance),
            Ok(true)
        );
        // Node 3 starts stopping: the transfer ends at once, not after the timeout.
        let mut v2 = v.clone();
        v2.record(
            now,
            3,
            NodeStats {
                stopping: true,
                ..NodeStats::default()
            },
            &report(&st, 3, &|_| 1),
        );
        assert_eq!(
            ops.settle(&st, &v2, now),
            vec![(1, Outcome::Cancelled(OperatorError::NodeStopping(3)))]
        );
        // Back to normal, the balancer leaves (group 1, node 3) alone for a while.
        let soon = balance_leaders(&st, &v, &ops, now, 100);
        assert!(!soon.contains(&(1, 3)), "{soon:?}");
        assert!(soon.iter().any(|&(_, to)| to == 3), "{soon:?}");
        // With node 2 full only node 3 receives: group 1 is skipped while the failure
        // is recent, and first again once it is old.
        let only_3 = |at: Instant| {
            let mut v3 = v.clone();
            for id in [1, 3] {
                v3.record(at, id, NodeStats::default(), &report(&st, id, &|_| 1));
            }
            let full = NodeStats {
                disk_full: true,
                ..NodeStats::default()
            };
            v3.record(at, 2, full, &report(&st, 2, &|_| 1));
            v3
        };
        assert_eq!(
            balance_leaders(&st, &only_3(now), &ops, now, 1),
            vec![(2, 3)]
        );
        let later = now + BALANCE_BACKOFF;
        ops.settle(&st, &only_3(later), later);
        assert_eq!(
            balance_leaders(&st, &only_3(later), &ops, later, 1),
            vec![(1, 3)]
        );
    }

    /// Five nodes, each group on three: the most loaded node cannot give to the least
    /// loaded one, the next one can.
    #[test]
    fn a_giver_is_found_past_the_most_loaded_node() {
        let now = Instant::now();
        // Groups 1-6 on 1,2,3 led by 1; groups 7-12 on 3,4,5 led by 3 (5 of them) and 4.
        let st = cluster(
            5,
            12,
            |g| if g <= 6 { vec![1, 2, 3] } else { vec![3, 4, 5] },
        );
        let v = view(&st, now, |g| match g {
            1..=6 => 1,
            7..=11 => 3,
            _ => 4,
        });
        let moves = balance_leaders(&st, &v, &Operators::default(), now, 100);
        let c = counts(&st, &v, &moves);
        // The mean is 2.4 (± 1): node 5 gets leaders from node 3, node 2 from node 1.
        assert!(
            c.values().all(|&n| (2..=3).contains(&n)),
            "{c:?} after {moves:?}"
        );
    }

    /// An addition walks its steps from the leader's reports: add a learner (at the
    /// reported membership version), wait for it to catch up, promote it, wait for the
    /// routing table; a stale report asks for nothing new.
    #[test]
    fn a_replica_is_added_as_a_learner_then_promoted() {
        let now = Instant::now();
        let mut st = cluster(4, 1, |_| vec![1, 2, 3]);
        let v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        assert_eq!(
            ops.add_replica(&st, &v, &[], 1, 2, now, Origin::Request),
            Ok(false),
            "a voter already"
        );
        assert_eq!(
            ops.add_replica(&st, &v, &[], 1, 9, now, Origin::Request),
            Err(OperatorError::UnknownNode(9))
        );
        assert_eq!(
            ops.add_replica(&st, &v, &[], 1, 4, now, Origin::Request),
            Ok(true)
        );
        assert_eq!(
            ops.add_replica(&st, &v, &[], 1, 4, now, Origin::Request),
            Ok(true)
        );
        assert_eq!(
            ops.transfer_leader(&st, &v, 1, 2, now, Origin::Request),
            Err(OperatorError::Busy { group: 1, to: 4 })
        );
        let change = |ops: &Operators, v: &LeaderView| -> Vec<ChangePeer> {
            ops.commands_for(v, 1)
                .into_iter()
                .filter_map(|c| match c.cmd {
                    Some(placement_command::Cmd::ChangePeer(c)) => Some(c),
                    _ => None,
                })
                .collect()
        };
        let leader_reports =
            |v: &mut LeaderView, version: u64, voters: &[u64], learners: &[u64]| {
                v.record(
                    now,
                    1,
                    NodeStats::default(),
                    &[ReplicaStats {
                        group_id: 1,
                        is_leader: true,
                        term: 1,
                        commit_index: 500,
                        applied_index: 500,
                        conf_version: version,
                        voters: voters.to_vec(),
                        learners: learners.to_vec(),
                        ..ReplicaStats::default()
                    }],
                );
            };
        let mut v = v.clone();
        leader_reports(&mut v, 0, &[1, 2, 3], &[]);
        let c = change(&ops, &v);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].kind, ChangePeerKind::AddLearner as i32);
        assert_eq!((c[0].node_id, c[0].conf_version), (4, 0));
        assert!(
            ops.commands_for(&v, 2).is_empty(),
            "only the leader is told"
        );
        // Learner added at index 40; node 4 has not reported its replica: wait.
        leader_reports(&mut v, 40, &[1, 2, 3], &[4]);
        assert!(change(&ops, &v).is_empty());
        ops.settle(&st, &v, now);
        assert_eq!(ops.add_step(1), Some(AddStep::CatchUp));
        // Far behind (a snapshot on its way): wait; close: promote.
        let learner = |applied, version| ReplicaStats {
            group_id: 1,
            term: 1,
            applied_index: applied,
            conf_version: version,
            ..ReplicaStats::default()
        };
        v.record(now, 4, NodeStats::default(), &[learner(10, 40)]);
        assert!(change(&ops, &v).is_empty());
        // Close to the commit, but its report predates its addition: wait.
        let close = 500 - PROMOTE_LAG_MAX;
        v.record(now, 4, NodeStats::default(), &[learner(close, 0)]);
        assert!(change(&ops, &v).is_empty());
        v.record(now, 4, NodeStats::default(), &[learner(close, 40)]);
        let c = change(&ops, &v);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].kind, ChangePeerKind::AddVoter as i32);
        assert_eq!(c[0].conf_version, 40);
        // A stale leader report (from before the learner was added) asks to add it
        // again at the old version, which the leader ignores (its membership is newer).
        let mut stale = v.clone();
        leader_reports(&mut stale, 0, &[1, 2, 3], &[]);
        let c0 = change(&ops, &stale);
        assert_eq!(
            (c0[0].kind, c0[0].conf_version),
            (ChangePeerKind::AddLearner as i32, 0)
        );
        // Promoted at 41: nothing more to ask; done once the table lists it as a voter.
        leader_reports(&mut v, 41, &[1, 2, 3, 4], &[]);
        assert!(change(&ops, &v).is_empty());
        assert_eq!(ops.settle(&st, &v, now), vec![]);
        assert_eq!(ops.add_step(1), Some(AddStep::Route));
        for cmd in crate::route_updates(&st, &v) {
            st.apply(st.applied() + 1, &cmd).unwrap();
        }
        assert_eq!(st.routes()[&1].conf_version, 41);
        assert_eq!(ops.settle(&st, &v, now), vec![(1, Outcome::Done)]);
        assert_eq!(ops.list(now), vec![]);
    }

    #[test]
    fn an_addition_waits_for_every_meta_member_to_apply_route_updates() {
        let now = Instant::now();
        // (`cluster` registers nodes at protocol 0: binaries that predate it.)
        let mut st = cluster(4, 1, |_| vec![1, 2, 3]);
        let v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        assert_eq!(
            ops.add_replica(&st, &v, &[1, 2, 3], 1, 4, now, Origin::Request),
            Err(OperatorError::OldMetaMember(1))
        );
        // Members 1 and 2 upgraded and say so in a heartbeat: re-registered.
        for id in [1, 2] {
            let hb = phoenix_proto::HeartbeatRequest {
                node_id: id,
                addr: format!("h:{id}"),
                stats: Some(NodeStats {
                    protocol: crate::PROTOCOL,
                    ..NodeStats::default()
                }),
                ..Default::default()
            };
            let cmd = crate::registration(&st, &hb).unwrap().unwrap();
            st.apply(st.applied() + 1, &cmd).unwrap();
            assert_eq!(crate::registration(&st, &hb).unwrap(), None);
        }
        // Member 3 still runs the old binary (down or not: its record says so).
        assert_eq!(
            ops.add_replica(&st, &v, &[1, 2, 3], 1, 4, now, Origin::Request),
            Err(OperatorError::OldMetaMember(3))
        );
        assert_eq!(
            ops.add_replica(&st, &v, &[1, 2], 1, 4, now, Origin::Request),
            Ok(true)
        );
    }

    /// Re-registers `ids` as running this binary (as their heartbeats would).
    fn upgrade(st: &mut MetaState, ids: &[u64]) {
        for &id in ids {
            let hb = phoenix_proto::HeartbeatRequest {
                node_id: id,
                addr: format!("h:{id}"),
                stats: Some(NodeStats {
                    protocol: crate::PROTOCOL,
                    ..NodeStats::default()
                }),
                ..Default::default()
            };
            if let Some(cmd) = crate::registration(st, &hb).unwrap() {
                st.apply(st.applied() + 1, &cmd).unwrap();
            }
        }
    }

    #[test]
    fn a_group_that_split_gets_no_replica_on_an_old_binary() {
        let now = Instant::now();
        let mut st = cluster(4, 1, |_| vec![1, 2, 3]);
        upgrade(&mut st, &[1, 2, 3]);
        let plan = phoenix_proto::SplitPlan {
            group_id: 1,
            split_key: vec![0x80].into(),
            new_group_id: 2,
            epoch: 1,
            origin: 0,
        };
        let cmd = MetaCommand {
            cmd: Some(meta_command::Cmd::PlanSplit(plan)),
        };
        st.apply(st.applied() + 1, &cmd).unwrap();
        // Planned and not finished counts already: a replica added now would apply it.
        let v = view(&st, now, |_| 1);
        assert_eq!(
            Operators::default().add_replica(&st, &v, &[1, 2, 3], 1, 4, now, Origin::Request),
            Err(OperatorError::OldNode { node: 4, group: 1 })
        );
        assert!(!eligible_nodes(&st, &v, now, |_| false).contains(&4));
        let parent = Route {
            end_key: vec![0x80].into(),
            epoch: 2,
            ..st.routes()[&1].clone()
        };
        let child = Route {
            group_id: 2,
            start_key: vec![0x80].into(),
            end_key: Vec::new().into(),
            ..parent.clone()
        };
        let cmd = MetaCommand {
            cmd: Some(meta_command::Cmd::FinishSplit(phoenix_proto::SplitDone {
                parent: Some(parent),
                child: Some(child),
            })),
        };
        st.apply(st.applied() + 1, &cmd).unwrap();
        let v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        assert_eq!(
            ops.add_replica(&st, &v, &[1, 2, 3], 2, 4, now, Origin::Request),
            Err(OperatorError::OldNode { node: 4, group: 2 })
        );
        assert!(!eligible_nodes(&st, &v, now, |_| false).contains(&4));
        upgrade(&mut st, &[4]);
        assert!(eligible_nodes(&st, &v, now, |_| false).contains(&4));
        assert_eq!(
            ops.add_replica(&st, &v, &[1, 2, 3], 2, 4, now, Origin::Request),
            Ok(true)
        );
    }

    #[test]
    fn an_addition_to_a_node_gone_down_is_cancelled() {
        let now = Instant::now();
        let st = cluster(4, 1, |_| vec![1, 2, 3]);
        let v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        assert_eq!(
            ops.add_replica(&st, &v, &[], 1, 4, now, Origin::Request),
            Ok(true)
        );
        let later = now + crate::ALIVE_WITHIN;
        let mut v2 = v.clone();
        for id in 1..=3 {
            v2.record(later, id, NodeStats::default(), &report(&st, id, &|_| 1));
        }
        assert_eq!(
            ops.settle(&st, &v2, later),
            vec![(1, Outcome::Cancelled(OperatorError::NodeDown(4)))]
        );
    }

    #[test]
    fn an_addition_not_done_in_time_is_given_up() {
        let now = Instant::now();
        let st = cluster(4, 1, |_| vec![1, 2, 3]);
        let v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        assert_eq!(
            ops.add_replica(&st, &v, &[], 1, 4, now, Origin::Request),
            Ok(true)
        );
        assert_eq!(ops.list(now)[0].step, "add learner");
        assert_eq!(
            ops.settle(&st, &v, now + ADD_TIMEOUT),
            vec![(1, Outcome::GivenUp)]
        );
    }

    /// A removal moves the leadership off the node first (to the most caught-up
    /// running voter), then has the leader remove it, and is done once the routing
    /// table leaves it out; a removal of the last voter is refused, and a node not in
    /// the table is nothing to do.
    #[test]
    fn a_leader_is_removed_after_its_leadership_moves_away() {
        let now = Instant::now();
        let mut st = cluster(4, 1, |_| vec![1, 2, 3]);
        let mut v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        assert_eq!(
            ops.remove_replica(&st, &v, &[], 1, 4, now, Origin::Request),
            Ok(false)
        );
        assert_eq!(
            ops.remove_replica(&st, &v, &[], 7, 1, now, Origin::Request),
            Err(OperatorError::UnknownGroup(7))
        );
        assert_eq!(
            ops.remove_replica(&st, &v, &[], 1, 1, now, Origin::Request),
            Ok(true)
        );
        assert_eq!(
            ops.remove_replica(&st, &v, &[], 1, 1, now, Origin::Request),
            Ok(true)
        );
        assert_eq!(
            ops.remove_replica(&st, &v, &[], 1, 2, now, Origin::Request),
            Err(OperatorError::Busy { group: 1, to: 1 })
        );
        assert_eq!(
            ops.add_replica(&st, &v, &[], 1, 4, now, Origin::Request),
            Err(OperatorError::Busy { group: 1, to: 1 })
        );
        let leader = |v: &mut LeaderView, node: u64, version: u64, voters: &[u64]| {
            v.record(
                now,
                node,
                NodeStats::default(),
                &[ReplicaStats {
                    group_id: 1,
                    node_id: node,
                    is_leader: true,
                    term: 2,
                    commit_index: 500,
                    applied_index: 500,
                    conf_version: version,
                    voters: voters.to_vec(),
                    ..ReplicaStats::default()
                }],
            );
        };
        let follower = |v: &mut LeaderView, node: u64, applied: u64| {
            v.record(
                now,
                node,
                NodeStats::default(),
                &[ReplicaStats {
                    group_id: 1,
                    node_id: node,
                    term: 2,
                    applied_index: applied,
                    ..ReplicaStats::default()
                }],
            );
        };
        leader(&mut v, 1, 0, &[1, 2, 3]);
        follower(&mut v, 2, 490);
        follower(&mut v, 3, 499);
        ops.settle(&st, &v, now);
        assert_eq!(ops.remove_step(1), Some(RemoveStep::MoveLeader));
        let cmds = ops.commands_for(&v, 1);
        assert_eq!(
            cmds,
            vec![PlacementCommand {
                cmd: Some(placement_command::Cmd::TransferLeader(TransferLeader {
                    group_id: 1,
                    to_node: 3,
                })),
            }],
            "the most caught-up voter takes over"
        );
        // Node 3 stopped its replica: node 2 then.
        v.record(
            now,
            3,
            NodeStats::default(),
            &[ReplicaStats {
                group_id: 1,
                node_id: 3,
                applied_index: 499,
                stopped: "disk".into(),
                ..ReplicaStats::default()
            }],
        );
        ops.settle(&st, &v, now);
        match &ops.commands_for(&v, 1)[0].cmd {
            Some(placement_command::Cmd::TransferLeader(t)) => assert_eq!(t.to_node, 2),
            other => panic!("expected a transfer, got {other:?}"),
        }
        // Node 2 leads now: it is told to remove node 1, at its membership version.
        leader(&mut v, 2, 0, &[1, 2, 3]);
        ops.settle(&st, &v, now);
        assert_eq!(ops.remove_step(1), Some(RemoveStep::Remove));
        assert!(
            ops.commands_for(&v, 1).is_empty(),
            "only the leader is told"
        );
        let cmds = ops.commands_for(&v, 2);
        assert_eq!(
            cmds,
            vec![PlacementCommand {
                cmd: Some(placement_command::Cmd::ChangePeer(ChangePeer {
                    group_id: 1,
                    node_id: 1,
                    kind: ChangePeerKind::Remove as i32,
                    conf_version: 0,
                })),
            }]
        );
        assert_eq!(ops.list(now)[0].step, "remove");
        // Removed at 60: the table follows, and the removal is done.
        leader(&mut v, 2, 60, &[2, 3]);
        assert_eq!(ops.settle(&st, &v, now), vec![]);
        assert_eq!(ops.remove_step(1), Some(RemoveStep::Route));
        assert!(ops.commands_for(&v, 2).is_empty());
        for cmd in crate::route_updates(&st, &v) {
            st.apply(st.applied() + 1, &cmd).unwrap();
        }
        assert_eq!(st.routes()[&1].conf_version, 60);
        assert_eq!(ops.settle(&st, &v, now), vec![(1, Outcome::Done)]);
        // Two voters left: each may go, not both.
        assert_eq!(
            ops.remove_replica(&st, &v, &[], 1, 3, now, Origin::Request),
            Ok(true)
        );
        leader(&mut v, 2, 61, &[2]);
        for cmd in crate::route_updates(&st, &v) {
            st.apply(st.applied() + 1, &cmd).unwrap();
        }
        assert_eq!(ops.settle(&st, &v, now), vec![(1, Outcome::Done)]);
        assert_eq!(
            ops.remove_replica(&st, &v, &[], 1, 2, now, Origin::Request),
            Err(OperatorError::LastVoter { group: 1, node: 2 })
        );
    }

    /// A removal under way whose remaining voters lose their live quorum is not
    /// cancelled (its change may be in the leader's log already): the leader is asked
    /// no more, and the removal is done if the table follows after all.
    #[test]
    fn a_removal_that_would_lose_the_quorum_waits() {
        let now = Instant::now();
        let mut st = cluster(3, 1, |_| vec![1, 2, 3]);
        // Node 1 leads, its report listing the voters.
        let heard = |st: &MetaState, v: &mut LeaderView, id: u64, at: Instant| {
            let mut r = report(st, id, &|_| 1);
            r[0].voters = vec![1, 2, 3];
            v.record(at, id, NodeStats::default(), &r);
        };
        let mut v = view(&st, now, |_| 1);
        heard(&st, &mut v, 1, now);
        let mut ops = Operators::default();
        assert_eq!(
            ops.remove_replica(&st, &v, &[], 1, 3, now, Origin::Request),
            Ok(true)
        );
        ops.settle(&st, &v, now);
        assert_eq!(ops.commands_for(&v, 1).len(), 1);
        // Node 2 falls silent: nodes 1 and 2 would be left, one alive.
        let later = now + crate::ALIVE_WITHIN;
        let mut v2 = v.clone();
        for id in [1, 3] {
            heard(&st, &mut v2, id, later);
        }
        assert_eq!(ops.settle(&st, &v2, later), vec![]);
        assert!(
            ops.commands_for(&v2, 1).is_empty(),
            "the leader is asked no more"
        );
        set_route(&mut st, 1, &[1, 2], &[]);
        assert_eq!(ops.settle(&st, &v2, later), vec![(1, Outcome::Done)]);
    }

    /// A removal goes on while the node is down (that is what repair needs), and is
    /// given up after its timeout.
    #[test]
    fn a_removal_of_a_down_node_goes_on_until_its_timeout() {
        let now = Instant::now();
        let st = cluster(3, 1, |_| vec![1, 2, 3]);
        let v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        let later = now + crate::ALIVE_WITHIN * 2;
        let mut v2 = v.clone();
        for id in 1..=2 {
            let mut r = report(&st, id, &|_| 1);
            r[0].voters = vec![1, 2, 3];
            v2.record(later, id, NodeStats::default(), &r);
        }
        assert!(!v2.is_alive(3, later));
        // Node 2 may not go: nodes 1 and 3 would be left, and only one is alive.
        assert_eq!(
            ops.remove_replica(&st, &v2, &[], 1, 2, later, Origin::Request),
            Err(OperatorError::NoQuorumAfter {
                group: 1,
                node: 2,
                live: 1,
                voters: 2
            })
        );
        assert_eq!(
            ops.remove_replica(&st, &v2, &[], 1, 3, later, Origin::Request),
            Ok(true)
        );
        assert_eq!(ops.settle(&st, &v2, later), vec![]);
        assert_eq!(ops.remove_step(1), Some(RemoveStep::Remove));
        assert_eq!(
            ops.settle(&st, &v2, later + REMOVE_TIMEOUT),
            vec![(1, Outcome::GivenUp)]
        );
    }

    #[test]
    fn groups_under_transfer_count_for_their_target_and_stay_put() {
        let now = Instant::now();
        let st = cluster(3, 9, |_| vec![1, 2, 3]);
        let v = view(&st, now, |_| 1);
        let mut ops = Operators::default();
        for g in 1..=3 {
            ops.transfer_leader(&st, &v, g, 3, now, Origin::Balance)
                .unwrap();
        }
        assert_eq!(ops.balancing(), 3);
        let moves = balance_leaders(&st, &v, &ops, now, 100);
        assert!(moves.iter().all(|&(g, _)| g > 3), "{moves:?}");
        // 6 on node 1, 0 on node 2, 3 (under way) on node 3: two go to node 2 (4/2/3 is
        // within the mean 3 ± 1).
        assert_eq!(moves.len(), 2);
        assert!(moves.iter().all(|&(_, to)| to == 2));
    }

    /// Random leader layouts over random placements: the moves never move a group twice
    /// nor target a node without a replica, and with every group on every node they
    /// always reach the band. `PHOENIX_SEED` replays a run.
    #[test]
    fn random_layouts_end_within_the_band() {
        let seed = std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| rand::thread_rng().gen());
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for round in 0..200 {
            let n = rng.gen_range(2..=6u64);
            let groups = rng.gen_range(1..=60u64);
            let placements: Vec<Vec<u64>> = (0..groups)
                .map(|_| {
                    let mut nodes: Vec<u64> = (1..=n).collect();
                    for i in (1..nodes.len()).rev() {
                        nodes.swap(i, rng.gen_range(0..=i));
                    }
                    nodes.truncate(n.min(3) as usize);
                    nodes
                })
                .collect();
            let leaders: Vec<u64> = placements
                .iter()
                .map(|p| p[rng.gen_range(0..p.len())])
                .collect();
            let st = cluster(n, groups, |g| placements[g as usize - 1].clone());
            let now = Instant::now();
            let v = view(&st, now, |g| leaders[g as usize - 1]);
            let moves = balance_leaders(&st, &v, &Operators::default(), now, usize::MAX);
            let ctx = format!("seed {seed} round {round}: n {n}, {groups} groups, moves {moves:?}");
            let mut seen = std::collections::HashSet::new();
            for &(g, to) in &moves {
                assert!(seen.insert(g), "{ctx}: group {g} moved twice");
                assert!(
                    placements[g as usize - 1].contains(&to),
                    "{ctx}: no replica on {to}"
                );
                assert_ne!(
                    leaders[g as usize - 1],
                    to,
                    "{ctx}: moved to its own leader"
                );
            }
            // With every group on every node, the band is always reached.
            if n <= 3 {
                let c = counts(&st, &v, &moves);
                let mean = groups as f64 / n as f64;
                let slack = (mean / 10.0).max(1.0);
                let (lo, hi) = (
                    *c.values().min().unwrap() as f64,
                    *c.values().max().unwrap() as f64,
                );
                assert!(
                    (hi <= mean + slack && lo >= mean - slack) || hi - lo < 2.0,
                    "{ctx}: counts {c:?}"
                );
            }
        }
    }
}
