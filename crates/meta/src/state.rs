//! The replicated meta state (raft group 0): node registry and routing table.
//!
//! [`MetaState`] is a deterministic state machine over [`MetaCommand`]s. It does no
//! I/O: [`MetaState::apply`] returns the record [`Write`]s the host must persist in the
//! same engine batch as the group's applied-index sentinel, and
//! [`MetaState::from_records`] rebuilds the state from those records and the sentinel
//! at start and after a snapshot install.
//!
//! Records (keys relative to the meta key space; the host prefixes them with
//! `0u64 BE ‖ 'd'`):
//! ```text
//! record      := node_record | route_record | state_record
//! node_record := 'n' ‖ node_id: u64 BE   → protobuf Replica (node id, address)
//! route_record:= 'r' ‖ group_id: u64 BE  → protobuf Route (range, epoch, replicas)
//! state_record:= 's' ‖ node_id: u64 BE   → protobuf NodeState (draining); protocol 2
//! plan_record := 'p' ‖ group_id: u64 BE  → protobuf SplitPlan (a split under way); protocol 3
//! ids_record  := 'i' ‖ 0: u64 BE         → u64 BE: the highest group id ever given out
//!                                          (ids are never reused); protocol 3
//! ```
//! A [`Write`] with an empty value deletes its record.
//! A binary that predates a record kind refuses the state by name (`UnknownRecord`)
//! rather than drop what it cannot read.
//! ```text
//! ```
//!
//! Invariants (checked by [`MetaState::check`] when rebuilding from records, and after
//! every apply in debug builds):
//! 1. node 0 is never registered; no two nodes share an address;
//! 2. the routing table is empty, or its ranges are contiguous, start at the empty key,
//!    end unbounded and do not overlap; group 0 (the meta group) is never in it;
//! 3. every route has epoch ≥ 1 and at least one replica, with distinct non-zero ids;
//!    its learners are among its replicas, and at least one replica is a voter.
//!
//! Replay: the state remembers the last log index it applied. An entry at or below it
//! is skipped ([`Applied::Replayed`]), so applying the same committed entry twice (a
//! host that replays its log after a restart from an older point) changes nothing.

use std::collections::{BTreeMap, HashSet};

use phoenix_proto::{
    meta_command, MergeDone, MergePhase, MergePlan, MetaCommand, NodeState, Replica, Route,
    SplitDone, SplitPlan,
};
use prost::Message;

use crate::error::{Error, Refusal, Result};

/// Group id of the meta group.
pub const META_GROUP: u64 = 0;

/// The meta commands this binary applies: 1 = `UpdateRoute` (membership changes), 2 =
/// `SetNodeState` (draining), 3 = `PlanSplit` and `FinishSplit` (and data nodes that
/// apply splits), 4 = `PlanMerge` and `FinishMerge` (and data nodes that apply merges),
/// 5 = nodes that report their meta replica and take the meta members from heartbeat
/// answers (the meta group's own membership changes), 6 = data nodes that apply
/// `KvCommand.incr` (data-group commands are gated by the lowest level of all registered
/// nodes, which heartbeat answers carry: [`PROTOCOL_INCR`]), 7 = data nodes that apply key
/// expiry ([`PROTOCOL_TTL`]). Before 1, a command kind unknown to a replica was refused
/// there and applied elsewhere: a kind is proposed only once every meta member's node
/// record says it applies it ([`MetaState::member_behind`]).
pub const PROTOCOL: u32 = 7;

/// The protocol level that brought `Incr` (one replicated increment). A node proposes
/// one only while every registered node is at this level or above; once they all are,
/// a node below it is not registered (`schedule::registration`), so the level of the
/// cluster does not fall back under the increments its logs may hold.
pub const PROTOCOL_INCR: u32 = 6;

/// The protocol level that brought key expiry (`KvCommand.expire` and `sweep_expired`,
/// puts and compare-and-swaps with an expiry, every command's `now_ms`): gated as
/// [`PROTOCOL_INCR`] is.
pub const PROTOCOL_TTL: u32 = 7;

/// The protocol level that brought the meta group's own membership changes: a node
/// below it neither reports its meta replica nor learns the members from heartbeats.
pub const PROTOCOL_META_MEMBERS: u32 = 5;

/// The protocol level whose route updates replica additions and removals rely on (the
/// level of the binaries that brought them).
pub const PROTOCOL_REPLICA_MOVES: u32 = 2;

/// The protocol level that brought splits.
pub const PROTOCOL_SPLIT: u32 = 3;

/// The protocol level that brought merges.
pub const PROTOCOL_MERGE: u32 = 4;

/// The protocol level that brought `SetNodeState`.
pub const PROTOCOL_NODE_STATE: u32 = 2;

/// Record kind byte of a node record.
const NODE_RECORD: u8 = b'n';
/// Record kind byte of a route record.
const ROUTE_RECORD: u8 = b'r';
/// Key kind of node state records.
const STATE_RECORD: u8 = b's';
/// Key kind of split plan records.
const PLAN_RECORD: u8 = b'p';
/// Key kind of merge plan records (by source group).
const MERGE_RECORD: u8 = b'm';
/// Key kind of the group id high-water record.
const IDS_RECORD: u8 = b'i';

/// One record to persist (key relative to the meta key space).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// Record key.
    pub key: Vec<u8>,
    /// Encoded record.
    pub value: Vec<u8>,
}

/// What applying one committed command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The state changed; persist these records with the applied index.
    Changed(Vec<Write>),
    /// A valid command that changes nothing (e.g. a node re-registering its address).
    Unchanged,
    /// The entry's index was applied before: skipped.
    Replayed,
}

/// The replicated meta state.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct MetaState {
    /// Registered nodes by id.
    nodes: BTreeMap<u64, Replica>,
    /// Data group routes by group id.
    routes: BTreeMap<u64, Route>,
    /// States of registered nodes (those ever set), by id.
    states: BTreeMap<u64, NodeState>,
    /// Splits planned and not finished, by the group split.
    splits: BTreeMap<u64, SplitPlan>,
    /// Merges planned and not finished, by the group that goes (the source).
    merges: BTreeMap<u64, MergePlan>,
    /// The highest group id given out by a split (0: none yet).
    max_group_id: u64,
    /// Last log index applied (0 = none).
    applied: u64,
}

fn record_key(kind: u8, id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(kind);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// Record key of node `id`.
pub fn node_record_key(id: u64) -> Vec<u8> {
    record_key(NODE_RECORD, id)
}

/// Record key of the state of node `id`.
pub fn state_record_key(id: u64) -> Vec<u8> {
    record_key(STATE_RECORD, id)
}

/// Record key of the route of group `id`.
pub fn route_record_key(id: u64) -> Vec<u8> {
    record_key(ROUTE_RECORD, id)
}

/// Decodes a record key into (kind, id).
fn parse_record_key(key: &[u8]) -> Option<(u8, u64)> {
    let (&kind, id) = key.split_first()?;
    let id: [u8; 8] = id.try_into().ok()?;
    Some((kind, u64::from_be_bytes(id)))
}

/// Whether `key` lies in the range of `route` ([start, end), empty end = unbounded).
pub fn route_contains(route: &Route, key: &[u8]) -> bool {
    key >= route.start_key.as_ref() && (route.end_key.is_empty() || key < route.end_key.as_ref())
}

/// The range of neighbours `a` and `b` together (start, end), or None if they are not
/// neighbours.
pub fn joined_range(a: &Route, b: &Route) -> Option<(bytes::Bytes, bytes::Bytes)> {
    if !a.end_key.is_empty() && a.end_key == b.start_key {
        Some((a.start_key.clone(), b.end_key.clone()))
    } else if !b.end_key.is_empty() && b.end_key == a.start_key {
        Some((b.start_key.clone(), a.end_key.clone()))
    } else {
        None
    }
}

/// Checks that `routes` form a whole routing table: ids distinct and not the meta
/// group's, epochs ≥ 1, replicas present with distinct non-zero ids, and ranges that,
/// sorted by start key, begin at the empty key, meet end to start, and end unbounded.
pub fn validate_table(routes: &[Route]) -> std::result::Result<(), String> {
    let mut ids = HashSet::new();
    for r in routes {
        if r.group_id == META_GROUP {
            return Err("group 0 is the meta group".into());
        }
        if !ids.insert(r.group_id) {
            return Err(format!("group {} listed twice", r.group_id));
        }
        if r.epoch == 0 {
            return Err(format!("group {} has epoch 0", r.group_id));
        }
        if r.replicas.is_empty() {
            return Err(format!("group {} has no replicas", r.group_id));
        }
        let mut reps = HashSet::new();
        if let Some(bad) = r
            .replicas
            .iter()
            .find(|x| x.node_id == 0 || !reps.insert(x.node_id))
        {
            return Err(format!(
                "group {} lists replica node {} twice or as 0",
                r.group_id, bad.node_id
            ));
        }
        if let Some(l) = r.learners.iter().find(|l| !reps.contains(*l)) {
            return Err(format!(
                "group {} names learner {l}, not one of its replicas",
                r.group_id
            ));
        }
        if r.replicas.len() <= r.learners.len() {
            return Err(format!("group {} has no voter", r.group_id));
        }
        if !r.end_key.is_empty() && r.start_key >= r.end_key {
            return Err(format!(
                "group {} has an empty range [{:?}, {:?})",
                r.group_id, r.start_key, r.end_key
            ));
        }
    }
    let mut sorted: Vec<&Route> = routes.iter().collect();
    sorted.sort_by(|a, b| a.start_key.cmp(&b.start_key));
    let mut expect_start: &[u8] = b"";
    for (i, r) in sorted.iter().enumerate() {
        if r.start_key.as_ref() != expect_start {
            return Err(format!(
                "group {} starts at {:?} but the previous range ends at {:?}",
                r.group_id, r.start_key, expect_start
            ));
        }
        let last = i + 1 == sorted.len();
        if r.end_key.is_empty() != last {
            return Err(format!(
                "group {} {} the unbounded end",
                r.group_id,
                if last { "must reach" } else { "reaches" }
            ));
        }
        expect_start = r.end_key.as_ref();
    }
    Ok(())
}

impl MetaState {
    /// Rebuilds the state from its stored records; `applied` is the log index those
    /// records reflect (the group's applied-index sentinel).
    pub fn from_records<K, V>(
        applied: u64,
        records: impl IntoIterator<Item = (K, V)>,
    ) -> Result<MetaState>
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut st = MetaState {
            applied,
            ..MetaState::default()
        };
        for (k, v) in records {
            let (k, v) = (k.as_ref(), v.as_ref());
            let mismatch = |what: String| Error::MismatchedRecord {
                key: k.to_vec(),
                what,
            };
            match parse_record_key(k) {
                Some((NODE_RECORD, id)) => {
                    let n = Replica::decode(v).map_err(|source| Error::DecodeRecord {
                        key: k.to_vec(),
                        source,
                    })?;
                    if n.node_id != id {
                        return Err(mismatch(format!("node {}", n.node_id)));
                    }
                    st.nodes.insert(id, n);
                }
                Some((ROUTE_RECORD, id)) => {
                    let r = Route::decode(v).map_err(|source| Error::DecodeRecord {
                        key: k.to_vec(),
                        source,
                    })?;
                    if r.group_id != id {
                        return Err(mismatch(format!("the route of group {}", r.group_id)));
                    }
                    st.routes.insert(id, r);
                }
                Some((STATE_RECORD, id)) => {
                    let n = NodeState::decode(v).map_err(|source| Error::DecodeRecord {
                        key: k.to_vec(),
                        source,
                    })?;
                    if n.node_id != id {
                        return Err(mismatch(format!("the state of node {}", n.node_id)));
                    }
                    st.states.insert(id, n);
                }
                Some((PLAN_RECORD, id)) => {
                    let p = SplitPlan::decode(v).map_err(|source| Error::DecodeRecord {
                        key: k.to_vec(),
                        source,
                    })?;
                    if p.group_id != id {
                        return Err(mismatch(format!("the split plan of group {}", p.group_id)));
                    }
                    st.splits.insert(id, p);
                }
                Some((MERGE_RECORD, id)) => {
                    let p = MergePlan::decode(v).map_err(|source| Error::DecodeRecord {
                        key: k.to_vec(),
                        source,
                    })?;
                    if p.source != id {
                        return Err(mismatch(format!("the merge plan of group {}", p.source)));
                    }
                    st.merges.insert(id, p);
                }
                Some((IDS_RECORD, 0)) => {
                    let b: [u8; 8] = v
                        .try_into()
                        .map_err(|_| mismatch(format!("a group id of {} bytes", v.len())))?;
                    st.max_group_id = u64::from_be_bytes(b);
                }
                _ => return Err(Error::UnknownRecord(k.to_vec())),
            }
        }
        st.check().map_err(Error::BrokenInvariant)?;
        Ok(st)
    }

    /// Every record of the state, in key order (what the host stores; a snapshot of
    /// group 0 carries exactly these).
    pub fn records(&self) -> Vec<Write> {
        let nodes = self.nodes.values().map(|n| Write {
            key: node_record_key(n.node_id),
            value: n.encode_to_vec(),
        });
        let routes = self.routes.values().map(|r| Write {
            key: route_record_key(r.group_id),
            value: r.encode_to_vec(),
        });
        let states = self.states.values().map(|n| Write {
            key: state_record_key(n.node_id),
            value: n.encode_to_vec(),
        });
        let plans = self.splits.values().map(|p| Write {
            key: record_key(PLAN_RECORD, p.group_id),
            value: p.encode_to_vec(),
        });
        let ids = (self.max_group_id != 0).then(|| Write {
            key: record_key(IDS_RECORD, 0),
            value: self.max_group_id.to_be_bytes().to_vec(),
        });
        let merges = self.merges.values().map(|p| Write {
            key: record_key(MERGE_RECORD, p.source),
            value: p.encode_to_vec(),
        });
        // (In key order: 'i' < 'm' < 'n' < 'p' < 'r' < 's'.)
        ids.into_iter()
            .chain(merges)
            .chain(nodes)
            .chain(plans)
            .chain(routes)
            .chain(states)
            .collect()
    }

    /// Decodes and applies the committed entry at log index `index` (≥ 1).
    ///
    /// `Err(Error)` means the entry is not a meta command at all (corruption: the host
    /// stops the group); `Ok(Err(refusal))` is a declined command (state unchanged).
    pub fn apply_entry(
        &mut self,
        index: u64,
        data: &[u8],
    ) -> Result<std::result::Result<Applied, Refusal>> {
        if index <= self.applied {
            // Skipped before decoding: a replayed entry was decoded the first time.
            return Ok(Ok(Applied::Replayed));
        }
        let cmd =
            MetaCommand::decode(data).map_err(|source| Error::DecodeCommand { index, source })?;
        Ok(self.apply(index, &cmd))
    }

    /// Applies the committed command at log index `index` (≥ 1).
    ///
    /// A refusal leaves the state unchanged but still consumes the index.
    pub fn apply(
        &mut self,
        index: u64,
        cmd: &MetaCommand,
    ) -> std::result::Result<Applied, Refusal> {
        if index <= self.applied {
            return Ok(Applied::Replayed);
        }
        self.applied = index;
        let out = match &cmd.cmd {
            Some(meta_command::Cmd::RegisterNode(n)) => self.register_node(n),
            Some(meta_command::Cmd::CreateGroups(cg)) => self.create_groups(&cg.routes),
            Some(meta_command::Cmd::UpdateRoute(r)) => self.update_route(r),
            Some(meta_command::Cmd::SetNodeState(n)) => self.set_node_state(n),
            Some(meta_command::Cmd::PlanSplit(p)) => self.plan_split(p),
            Some(meta_command::Cmd::FinishSplit(d)) => self.finish_split(d),
            Some(meta_command::Cmd::PlanMerge(p)) => self.plan_merge(p),
            Some(meta_command::Cmd::FinishMerge(d)) => self.finish_merge(d),
            None => Err(Refusal::EmptyCommand),
        };
        #[cfg(debug_assertions)]
        if let Err(broken) = self.check() {
            // An applied command broke an invariant: a bug in the checks above.
            panic!("meta state invariant broken at index {index}: {broken}");
        }
        out
    }

    fn register_node(&mut self, n: &Replica) -> std::result::Result<Applied, Refusal> {
        if n.node_id == 0 {
            return Err(Refusal::ReservedNodeId);
        }
        if n.addr.is_empty() {
            return Err(Refusal::NoAddress(n.node_id));
        }
        if let Some(other) = self
            .nodes
            .values()
            .find(|o| o.addr == n.addr && o.node_id != n.node_id)
        {
            return Err(Refusal::AddressTaken {
                addr: n.addr.clone(),
                owner: other.node_id,
            });
        }
        if self.nodes.get(&n.node_id) == Some(n) {
            return Ok(Applied::Unchanged);
        }
        self.nodes.insert(n.node_id, n.clone());
        Ok(Applied::Changed(vec![Write {
            key: node_record_key(n.node_id),
            value: n.encode_to_vec(),
        }]))
    }

    fn set_node_state(&mut self, n: &NodeState) -> std::result::Result<Applied, Refusal> {
        if !self.nodes.contains_key(&n.node_id) {
            return Err(Refusal::UnknownNode(n.node_id));
        }
        let was = self.states.get(&n.node_id).copied().unwrap_or(NodeState {
            node_id: n.node_id,
            draining: false,
        });
        if was == *n {
            return Ok(Applied::Unchanged);
        }
        self.states.insert(n.node_id, *n);
        Ok(Applied::Changed(vec![Write {
            key: state_record_key(n.node_id),
            value: n.encode_to_vec(),
        }]))
    }

    fn create_groups(&mut self, routes: &[Route]) -> std::result::Result<Applied, Refusal> {
        if routes.is_empty() {
            return Err(Refusal::NoGroups);
        }
        if let Some(r) = routes
            .iter()
            .find(|r| r.group_id == META_GROUP || self.routes.contains_key(&r.group_id))
        {
            return Err(Refusal::GroupExists(r.group_id));
        }
        if !self.routes.is_empty() {
            return Err(Refusal::AlreadyBootstrapped);
        }
        validate_table(routes).map_err(Refusal::InvalidRoutes)?;
        let mut writes = Vec::with_capacity(routes.len());
        for r in routes {
            writes.push(Write {
                key: route_record_key(r.group_id),
                value: r.encode_to_vec(),
            });
            self.routes.insert(r.group_id, r.clone());
        }
        Ok(Applied::Changed(writes))
    }

    /// Takes the membership of `r` (replicas, learners, conf version) for its group if
    /// it is newer than the route's: the group applied a membership change.
    fn update_route(&mut self, r: &Route) -> std::result::Result<Applied, Refusal> {
        let g = r.group_id;
        let cur = self.routes.get(&g).ok_or(Refusal::UnknownGroup(g))?;
        if r.start_key != cur.start_key || r.end_key != cur.end_key || r.epoch != cur.epoch {
            return Err(Refusal::RangeChanged(g));
        }
        if r.conf_version <= cur.conf_version {
            return Err(Refusal::StaleMembership {
                group: g,
                have: cur.conf_version,
                got: r.conf_version,
            });
        }
        let mut next = cur.clone();
        next.replicas = r.replicas.clone();
        next.learners = r.learners.clone();
        next.learners.sort_unstable();
        next.conf_version = r.conf_version;
        next.leader_node_id = 0;
        next.leader_addr = String::new();
        validate_table(std::slice::from_ref(&Route {
            // (One route alone: its range is checked as a whole table's would be.)
            start_key: Default::default(),
            end_key: Default::default(),
            ..next.clone()
        }))
        .map_err(Refusal::InvalidRoutes)?;
        let write = Write {
            key: route_record_key(g),
            value: next.encode_to_vec(),
        };
        self.routes.insert(g, next);
        Ok(Applied::Changed(vec![write]))
    }

    /// Records a split to ask for: group `p.group_id` at range epoch `p.epoch` splits at
    /// `p.split_key` (strictly inside its range), the upper part to become group
    /// `p.new_group_id`, which must be the next id ([`MetaState::next_group_id`]). One
    /// split per group at a time.
    fn plan_split(&mut self, p: &SplitPlan) -> std::result::Result<Applied, Refusal> {
        let g = p.group_id;
        let bad = |why: String| Refusal::BadSplit { group: g, why };
        let cur = self.routes.get(&g).ok_or(Refusal::UnknownGroup(g))?;
        if let Some(other) = self.splits.get(&g) {
            return Err(bad(format!(
                "a split into group {} is under way",
                other.new_group_id
            )));
        }
        if let Some(m) = self.merge_of(g) {
            return Err(bad(format!(
                "a merge of group {} into group {} is under way",
                m.source, m.target
            )));
        }
        if p.epoch != cur.epoch {
            return Err(bad(format!(
                "planned at range epoch {}, the route is at {}",
                p.epoch, cur.epoch
            )));
        }
        if !route_contains(cur, &p.split_key) || p.split_key.as_ref() == cur.start_key.as_ref() {
            return Err(bad("the split key is not strictly inside the range".into()));
        }
        if p.new_group_id != self.next_group_id() {
            return Err(bad(format!(
                "new group id {} is not the next one ({})",
                p.new_group_id,
                self.next_group_id()
            )));
        }
        self.max_group_id = p.new_group_id;
        self.splits.insert(g, p.clone());
        Ok(Applied::Changed(vec![
            Write {
                key: record_key(IDS_RECORD, 0),
                value: self.max_group_id.to_be_bytes().to_vec(),
            },
            Write {
                key: record_key(PLAN_RECORD, g),
                value: p.encode_to_vec(),
            },
        ]))
    }

    /// Takes a planned split the group applied: the parent's route narrows to
    /// `[start, split key)` at the new epoch, and the new group's route (as its parent
    /// made it: same replicas) joins the table.
    fn finish_split(&mut self, d: &SplitDone) -> std::result::Result<Applied, Refusal> {
        let (Some(parent), Some(child)) = (&d.parent, &d.child) else {
            return Err(Refusal::InvalidRoutes("a split needs both routes".into()));
        };
        let g = parent.group_id;
        let bad = |why: String| Refusal::BadSplit { group: g, why };
        let plan = self
            .splits
            .get(&g)
            .ok_or_else(|| bad("no split of it is planned".into()))?;
        let cur = self.routes.get(&g).ok_or(Refusal::UnknownGroup(g))?;
        if child.group_id != plan.new_group_id
            || parent.start_key != cur.start_key
            || parent.end_key != plan.split_key
            || child.start_key != plan.split_key
            || child.end_key != cur.end_key
            || parent.epoch != child.epoch
            || parent.epoch <= cur.epoch
        {
            return Err(bad(format!(
                "the split routes do not match the plan (into group {} at {:02x?})",
                plan.new_group_id, plan.split_key
            )));
        }
        if self.routes.contains_key(&child.group_id) || child.group_id == META_GROUP {
            return Err(Refusal::GroupExists(child.group_id));
        }
        let mut next_parent = cur.clone();
        next_parent.end_key = parent.end_key.clone();
        next_parent.epoch = parent.epoch;
        next_parent.leader_node_id = 0;
        next_parent.leader_addr = String::new();
        let mut next_child = child.clone();
        next_child.leader_node_id = 0;
        next_child.leader_addr = String::new();
        next_child.learners.sort_unstable();
        validate_table(std::slice::from_ref(&Route {
            start_key: Default::default(),
            end_key: Default::default(),
            ..next_child.clone()
        }))
        .map_err(Refusal::InvalidRoutes)?;
        self.splits.remove(&g);
        let writes = vec![
            Write {
                key: record_key(PLAN_RECORD, g),
                value: Vec::new(),
            },
            Write {
                key: route_record_key(g),
                value: next_parent.encode_to_vec(),
            },
            Write {
                key: route_record_key(next_child.group_id),
                value: next_child.encode_to_vec(),
            },
        ];
        self.routes.insert(g, next_parent);
        self.routes.insert(next_child.group_id, next_child);
        Ok(Applied::Changed(writes))
    }

    /// The merge plan group `g` is in (as its source or its target), if any.
    pub fn merge_of(&self, g: u64) -> Option<&MergePlan> {
        self.merges
            .get(&g)
            .or_else(|| self.merges.values().find(|m| m.target == g))
    }

    /// The merges planned and not finished, by the group that goes.
    pub fn merges(&self) -> &BTreeMap<u64, MergePlan> {
        &self.merges
    }

    /// Records a merge plan, or moves a recorded one on. A new plan (phase prepare):
    /// `p.source` and `p.target` are neighbours at the route epochs named, with the same
    /// voters and no learners, and neither is in a split or merge plan. A recorded plan
    /// moves from prepare to commit (naming the source's prepare index) or to rollback,
    /// and never back: once a commit may have been asked for, the source never thaws.
    fn plan_merge(&mut self, p: &MergePlan) -> std::result::Result<Applied, Refusal> {
        let (s, t) = (p.source, p.target);
        let bad = |why: String| Refusal::BadMerge {
            source_group: s,
            target: t,
            why,
        };
        let phase = MergePhase::try_from(p.phase).map_err(|_| bad("unknown phase".into()))?;
        if let Some(cur) = self.merges.get(&s) {
            if cur.target != t
                || cur.source_epoch != p.source_epoch
                || cur.target_epoch != p.target_epoch
            {
                return Err(bad(format!(
                    "another merge of it is under way (into group {})",
                    cur.target
                )));
            }
            let from = MergePhase::try_from(cur.phase).unwrap_or(MergePhase::Prepare);
            let ok = match (from, phase) {
                (MergePhase::Prepare, MergePhase::Commit) => p.prepare_index > 0,
                (MergePhase::Prepare, MergePhase::Rollback) => true,
                _ => false,
            };
            if from == phase {
                return Ok(Applied::Unchanged);
            }
            if !ok {
                return Err(bad(format!(
                    "cannot move from phase {} to {}",
                    from.as_str_name(),
                    phase.as_str_name()
                )));
            }
            let mut next = *cur;
            next.phase = p.phase;
            next.prepare_index = p.prepare_index;
            let write = Write {
                key: record_key(MERGE_RECORD, s),
                value: next.encode_to_vec(),
            };
            self.merges.insert(s, next);
            return Ok(Applied::Changed(vec![write]));
        }
        if phase != MergePhase::Prepare {
            return Err(bad("no merge of it is planned".into()));
        }
        let src = self.routes.get(&s).ok_or(Refusal::UnknownGroup(s))?;
        let dst = self.routes.get(&t).ok_or(Refusal::UnknownGroup(t))?;
        if s == t {
            return Err(bad("a group does not merge into itself".into()));
        }
        if src.epoch != p.source_epoch || dst.epoch != p.target_epoch {
            return Err(bad(format!(
                "planned at range epochs {} and {}, the routes are at {} and {}",
                p.source_epoch, p.target_epoch, src.epoch, dst.epoch
            )));
        }
        if joined_range(src, dst).is_none() {
            return Err(bad("the groups are not neighbours".into()));
        }
        let voters = |r: &Route| {
            let mut v: Vec<u64> = r.replicas.iter().map(|x| x.node_id).collect();
            v.sort_unstable();
            v
        };
        if voters(src) != voters(dst) || !src.learners.is_empty() || !dst.learners.is_empty() {
            return Err(bad(
                "the groups must have the same replicas, all voters (move one first)".into(),
            ));
        }
        for g in [s, t] {
            if self.splits.contains_key(&g) {
                return Err(bad(format!("a split of group {g} is under way")));
            }
            if let Some(m) = self.merge_of(g) {
                return Err(bad(format!(
                    "group {g} is in the merge of group {} into group {}",
                    m.source, m.target
                )));
            }
        }
        let mut plan = *p;
        plan.prepare_index = 0;
        let write = Write {
            key: record_key(MERGE_RECORD, s),
            value: plan.encode_to_vec(),
        };
        self.merges.insert(s, plan);
        Ok(Applied::Changed(vec![write]))
    }

    /// Ends a merge plan: rolled back (`d.target` unset; the plan must be in its rollback
    /// phase), or committed (its commit phase): the target's route widens over the
    /// source's at the epoch its replicas applied, and the source's route goes.
    fn finish_merge(&mut self, d: &MergeDone) -> std::result::Result<Applied, Refusal> {
        let s = d.source;
        let plan = self.merges.get(&s).ok_or_else(|| Refusal::BadMerge {
            source_group: s,
            target: 0,
            why: "no merge of it is planned".into(),
        })?;
        let t = plan.target;
        let bad = |why: String| Refusal::BadMerge {
            source_group: s,
            target: t,
            why,
        };
        let phase = MergePhase::try_from(plan.phase).unwrap_or(MergePhase::Prepare);
        let mut writes = vec![Write {
            key: record_key(MERGE_RECORD, s),
            value: Vec::new(),
        }];
        let Some(merged) = &d.target else {
            if phase != MergePhase::Rollback {
                return Err(bad("it is not being rolled back".into()));
            }
            if d.thawed_epoch <= plan.source_epoch {
                return Err(bad(format!(
                    "thawed at range epoch {}, not past the plan's {}",
                    d.thawed_epoch, plan.source_epoch
                )));
            }
            // The source's route takes the epoch its thaw moved it to (splits and merges
            // are planned at the route's epoch).
            let src = self.routes.get(&s).ok_or(Refusal::UnknownGroup(s))?;
            let mut next = src.clone();
            next.epoch = next.epoch.max(d.thawed_epoch);
            writes.push(Write {
                key: route_record_key(s),
                value: next.encode_to_vec(),
            });
            self.routes.insert(s, next);
            self.merges.remove(&s);
            return Ok(Applied::Changed(writes));
        };
        if phase != MergePhase::Commit {
            return Err(bad("it is not committed".into()));
        }
        let (Some(src), Some(dst)) = (self.routes.get(&s), self.routes.get(&t)) else {
            return Err(bad("a route of the merge is gone".into()));
        };
        let (start, end) =
            joined_range(src, dst).ok_or_else(|| bad("the groups are not neighbours".into()))?;
        if merged.group_id != t
            || merged.start_key != start
            || merged.end_key != end
            || merged.epoch <= dst.epoch
        {
            return Err(bad("the merged route does not match the plan".into()));
        }
        let mut next = dst.clone();
        next.start_key = start;
        next.end_key = end;
        next.epoch = merged.epoch;
        next.leader_node_id = 0;
        next.leader_addr = String::new();
        writes.push(Write {
            key: route_record_key(s),
            value: Vec::new(),
        });
        writes.push(Write {
            key: route_record_key(t),
            value: next.encode_to_vec(),
        });
        self.merges.remove(&s);
        self.routes.remove(&s);
        self.routes.insert(t, next);
        Ok(Applied::Changed(writes))
    }

    /// The id the next split gives its new group: past every id in use or ever given.
    pub fn next_group_id(&self) -> u64 {
        let used = self.routes.keys().next_back().copied().unwrap_or(0);
        used.max(self.max_group_id) + 1
    }

    /// The splits planned and not finished, by the group split.
    pub fn splits(&self) -> &BTreeMap<u64, SplitPlan> {
        &self.splits
    }

    /// Checks the invariants of the module doc.
    pub fn check(&self) -> std::result::Result<(), String> {
        let mut addrs = HashSet::new();
        for (id, n) in &self.nodes {
            if *id == 0 || n.node_id != *id {
                return Err(format!("node record {id} holds node {}", n.node_id));
            }
            if !addrs.insert(n.addr.as_str()) {
                return Err(format!("address {} registered twice", n.addr));
            }
        }
        for (id, r) in &self.routes {
            if r.group_id != *id {
                return Err(format!("route record {id} holds group {}", r.group_id));
            }
        }
        for (id, n) in &self.states {
            if n.node_id != *id || !self.nodes.contains_key(id) {
                return Err(format!(
                    "state record {id} of node {}, not registered",
                    n.node_id
                ));
            }
        }
        for (id, m) in &self.merges {
            if m.source != *id
                || !self.routes.contains_key(&m.source)
                || !self.routes.contains_key(&m.target)
            {
                return Err(format!(
                    "merge record {id} of group {} into group {}, not both routed",
                    m.source, m.target
                ));
            }
        }
        if self.routes.is_empty() {
            return Ok(());
        }
        let table: Vec<Route> = self.routes.values().cloned().collect();
        validate_table(&table)
    }

    /// Whether node `id` is draining (`phoenix cluster drain`).
    pub fn draining(&self, id: u64) -> bool {
        self.states.get(&id).is_some_and(|n| n.draining)
    }

    /// The draining nodes, by id.
    pub fn draining_nodes(&self) -> Vec<u64> {
        self.states
            .values()
            .filter(|n| n.draining)
            .map(|n| n.node_id)
            .collect()
    }

    /// The first of `members` whose node record does not say it applies meta commands
    /// of protocol `level` (not registered, or an older binary when it registered).
    /// Decided from replicated records, so a down member counts as what it last said.
    pub fn member_behind(&self, members: &[u64], level: u32) -> Option<u64> {
        members
            .iter()
            .copied()
            .find(|m| self.nodes.get(m).is_none_or(|n| n.protocol < level))
    }

    /// Registered nodes by id.
    pub fn nodes(&self) -> &BTreeMap<u64, Replica> {
        &self.nodes
    }

    /// Routes by group id.
    pub fn routes(&self) -> &BTreeMap<u64, Route> {
        &self.routes
    }

    /// Address of node `id`, if registered.
    pub fn addr_of(&self, id: u64) -> Option<&str> {
        self.nodes.get(&id).map(|n| n.addr.as_str())
    }

    /// Whether the data groups exist.
    pub fn is_bootstrapped(&self) -> bool {
        !self.routes.is_empty()
    }

    /// The route whose range holds user key `key`.
    pub fn route_for(&self, key: &[u8]) -> Option<&Route> {
        self.routes.values().find(|r| route_contains(r, key))
    }

    /// Last log index applied.
    pub fn applied(&self) -> u64 {
        self.applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use phoenix_proto::CreateGroups;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn register(id: u64, addr: &str) -> MetaCommand {
        MetaCommand {
            cmd: Some(meta_command::Cmd::RegisterNode(Replica {
                protocol: 0,
                node_id: id,
                addr: addr.into(),
            })),
        }
    }

    fn create(routes: Vec<Route>) -> MetaCommand {
        MetaCommand {
            cmd: Some(meta_command::Cmd::CreateGroups(CreateGroups { routes })),
        }
    }

    fn route(id: u64, start: &str, end: &str, replicas: &[u64]) -> Route {
        Route {
            group_id: id,
            start_key: Bytes::from(start.as_bytes().to_vec()),
            end_key: Bytes::from(end.as_bytes().to_vec()),
            epoch: 1,
            replicas: replicas
                .iter()
                .map(|&n| Replica {
                    protocol: 0,
                    node_id: n,
                    addr: format!("h:{n}"),
                })
                .collect(),
            leader_node_id: 0,
            leader_addr: String::new(),
            conf_version: 0,
            learners: Vec::new(),
        }
    }

    /// Applies the record writes to a map, as the host's engine batch does.
    fn persist(store: &mut BTreeMap<Vec<u8>, Vec<u8>>, applied: &Applied) {
        if let Applied::Changed(ws) = applied {
            for w in ws {
                if w.value.is_empty() {
                    store.remove(&w.key);
                } else {
                    store.insert(w.key.clone(), w.value.clone());
                }
            }
        }
    }

    #[test]
    fn register_node_new_same_moved() {
        let mut st = MetaState::default();
        let got = st.apply(1, &register(1, "a:1")).unwrap();
        let Applied::Changed(ws) = got else {
            panic!("expected a change, got {got:?}")
        };
        assert_eq!(ws.len(), 1);
        assert_eq!(ws[0].key, node_record_key(1));
        assert_eq!(
            Replica::decode(ws[0].value.as_slice()).unwrap(),
            Replica {
                protocol: 0,
                node_id: 1,
                addr: "a:1".into()
            }
        );
        assert_eq!(st.apply(2, &register(1, "a:1")), Ok(Applied::Unchanged));
        assert!(matches!(
            st.apply(3, &register(1, "a:2")),
            Ok(Applied::Changed(_))
        ));
        assert_eq!(st.addr_of(1), Some("a:2"));
        // The old address is free again.
        assert!(matches!(
            st.apply(4, &register(2, "a:1")),
            Ok(Applied::Changed(_))
        ));
        assert_eq!(st.nodes().len(), 2);
        assert_eq!(st.applied(), 4);
        st.check().unwrap();
    }

    #[test]
    fn register_node_refusals_leave_state_unchanged() {
        let mut st = MetaState::default();
        st.apply(1, &register(1, "a:1")).unwrap();
        let before = st.clone();
        assert_eq!(
            st.apply(2, &register(0, "z:0")),
            Err(Refusal::ReservedNodeId)
        );
        assert_eq!(st.apply(3, &register(5, "")), Err(Refusal::NoAddress(5)));
        assert_eq!(
            st.apply(4, &register(2, "a:1")),
            Err(Refusal::AddressTaken {
                addr: "a:1".into(),
                owner: 1
            })
        );
        assert_eq!(
            st.apply(5, &MetaCommand { cmd: None }),
            Err(Refusal::EmptyCommand)
        );
        assert_eq!(st.nodes(), before.nodes());
        assert_eq!(st.routes(), before.routes());
        // A refused entry is still applied: its index is consumed.
        assert_eq!(st.applied(), 5);
        // Texts the proposer sees.
        assert_eq!(
            Refusal::AddressTaken {
                addr: "a:1".into(),
                owner: 1
            }
            .to_string(),
            "address a:1 already belongs to node 1"
        );
    }

    #[test]
    fn create_groups_once() {
        let mut st = MetaState::default();
        let r1 = route(1, "", "", &[1, 2, 3]);
        let got = st.apply(1, &create(vec![r1.clone()])).unwrap();
        assert_eq!(
            got,
            Applied::Changed(vec![Write {
                key: route_record_key(1),
                value: r1.encode_to_vec()
            }])
        );
        assert!(st.is_bootstrapped());
        assert_eq!(
            st.apply(2, &create(vec![r1.clone()])),
            Err(Refusal::GroupExists(1))
        );
        assert_eq!(
            st.apply(3, &create(vec![route(2, "", "", &[1])])),
            Err(Refusal::AlreadyBootstrapped)
        );
        assert_eq!(st.routes().len(), 1);
        assert_eq!(st.route_for(b"anything"), Some(&r1));
    }

    #[test]
    fn update_route_takes_newer_memberships_only() {
        let mut st = MetaState::default();
        st.apply(
            1,
            &create(vec![
                route(1, "", "m", &[1, 2, 3]),
                route(2, "m", "", &[1, 2, 3]),
            ]),
        )
        .unwrap();
        let update = |r: Route| MetaCommand {
            cmd: Some(meta_command::Cmd::UpdateRoute(r)),
        };
        // Node 4 added as a learner at index 7 of the group's log.
        let mut r = route(1, "", "m", &[1, 2, 3, 4]);
        r.learners = vec![4];
        r.conf_version = 7;
        let got = st.apply(2, &update(r.clone())).unwrap();
        let mut store = BTreeMap::new();
        persist(&mut store, &got);
        assert_eq!(st.routes()[&1].learners, vec![4]);
        assert_eq!(st.routes()[&1].conf_version, 7);
        assert_eq!(st.routes()[&1].replicas.len(), 4);
        // The record holds it: a restart rebuilds the same table.
        let rec = store.get(&route_record_key(1)).unwrap();
        assert_eq!(Route::decode(rec.as_slice()).unwrap(), st.routes()[&1]);
        // Not newer, another range, or not a valid membership: refused, unchanged.
        assert_eq!(
            st.apply(3, &update(r.clone())),
            Err(Refusal::StaleMembership {
                group: 1,
                have: 7,
                got: 7
            })
        );
        let mut moved = r.clone();
        moved.conf_version = 9;
        moved.end_key = Bytes::from_static(b"n");
        assert_eq!(st.apply(4, &update(moved)), Err(Refusal::RangeChanged(1)));
        let mut stranger = r.clone();
        stranger.conf_version = 9;
        stranger.learners = vec![5];
        assert!(matches!(
            st.apply(5, &update(stranger)),
            Err(Refusal::InvalidRoutes(_))
        ));
        let mut no_voter = route(1, "", "m", &[4]);
        no_voter.learners = vec![4];
        no_voter.conf_version = 9;
        assert!(matches!(
            st.apply(6, &update(no_voter)),
            Err(Refusal::InvalidRoutes(_))
        ));
        assert_eq!(
            st.apply(7, &update(route(3, "", "", &[1]))),
            Err(Refusal::UnknownGroup(3))
        );
        assert_eq!(st.routes()[&1].conf_version, 7);
        // Promoted at index 9.
        let mut promoted = route(1, "", "m", &[1, 2, 3, 4]);
        promoted.conf_version = 9;
        st.apply(8, &update(promoted)).unwrap();
        assert!(st.routes()[&1].learners.is_empty());
    }

    #[test]
    fn create_groups_refuses_bad_tables() {
        let cases: Vec<(Vec<Route>, Refusal)> = vec![
            (vec![], Refusal::NoGroups),
            (vec![route(0, "", "", &[1])], Refusal::GroupExists(0)),
        ];
        for (routes, want) in cases {
            let mut st = MetaState::default();
            assert_eq!(st.apply(1, &create(routes)), Err(want));
            assert_eq!(
                st,
                MetaState {
                    applied: 1,
                    ..MetaState::default()
                }
            );
        }
        let mut epoch0 = route(1, "", "", &[1]);
        epoch0.epoch = 0;
        let bad: Vec<(&str, Vec<Route>)> = vec![
            (
                "gap",
                vec![route(1, "", "b", &[1]), route(2, "c", "", &[1])],
            ),
            (
                "overlap",
                vec![route(1, "", "c", &[1]), route(2, "b", "", &[1])],
            ),
            (
                "bounded end",
                vec![route(1, "", "b", &[1]), route(2, "b", "z", &[1])],
            ),
            ("not from the start", vec![route(1, "a", "", &[1])]),
            (
                "two unbounded",
                vec![route(1, "", "", &[1]), route(2, "b", "", &[1])],
            ),
            (
                "empty range",
                vec![
                    route(1, "", "b", &[1]),
                    route(2, "b", "b", &[1]),
                    route(3, "b", "", &[1]),
                ],
            ),
            (
                "duplicate id",
                vec![route(1, "", "b", &[1]), route(1, "b", "", &[1])],
            ),
            ("no replicas", vec![route(1, "", "", &[])]),
            ("replica twice", vec![route(1, "", "", &[2, 2])]),
            ("replica 0", vec![route(1, "", "", &[0, 1])]),
            ("epoch 0", vec![epoch0]),
        ];
        for (what, routes) in bad {
            let mut st = MetaState::default();
            match st.apply(1, &create(routes)) {
                Err(Refusal::InvalidRoutes(_)) => {}
                other => panic!("{what}: expected InvalidRoutes, got {other:?}"),
            }
            assert!(!st.is_bootstrapped(), "{what}");
        }
    }

    #[test]
    fn malformed_entry_is_a_typed_error() {
        let mut st = MetaState::default();
        st.apply(1, &register(1, "a:1")).unwrap();
        let before = st.clone();
        // Field 1 (length-delimited) claiming 100 bytes that are not there.
        let err = st.apply_entry(2, &[0x0a, 100, 1, 2]).unwrap_err();
        assert!(
            matches!(err, Error::DecodeCommand { index: 2, .. }),
            "{err}"
        );
        assert_eq!(st, before, "a malformed entry must not touch the state");
        // A well-formed entry decodes and applies.
        let ok = st
            .apply_entry(2, &register(2, "b:2").encode_to_vec())
            .unwrap();
        assert!(matches!(ok, Ok(Applied::Changed(_))));
    }

    #[test]
    fn records_round_trip_and_bad_records() {
        let mut st = MetaState::default();
        st.apply(1, &register(1, "a:1")).unwrap();
        st.apply(2, &register(2, "a:2")).unwrap();
        st.apply(
            3,
            &create(vec![route(1, "", "m", &[1, 2]), route(2, "m", "", &[1, 2])]),
        )
        .unwrap();
        let recs: Vec<(Vec<u8>, Vec<u8>)> =
            st.records().into_iter().map(|w| (w.key, w.value)).collect();
        assert_eq!(MetaState::from_records(3, recs.clone()).unwrap(), st);

        let node = Replica {
            protocol: 0,
            node_id: 1,
            addr: "a:1".into(),
        }
        .encode_to_vec();
        assert!(matches!(
            MetaState::from_records(0, [(b"x".to_vec(), node.clone())]),
            Err(Error::UnknownRecord(_))
        ));
        assert!(matches!(
            MetaState::from_records(0, [(b"n\0\0\0\0\0\0\0".to_vec(), node.clone())]),
            Err(Error::UnknownRecord(_))
        ));
        assert!(matches!(
            MetaState::from_records(0, [(node_record_key(1), vec![0x0a, 9])]),
            Err(Error::DecodeRecord { .. })
        ));
        assert!(matches!(
            MetaState::from_records(0, [(node_record_key(7), node.clone())]),
            Err(Error::MismatchedRecord { .. })
        ));
        // Records that decode one by one but together break an invariant.
        let node2 = Replica {
            protocol: 0,
            node_id: 2,
            addr: "a:1".into(),
        }
        .encode_to_vec();
        assert!(matches!(
            MetaState::from_records(0, [(node_record_key(1), node), (node_record_key(2), node2)]),
            Err(Error::BrokenInvariant(_))
        ));
        assert!(matches!(
            MetaState::from_records(
                0,
                [(route_record_key(1), route(1, "a", "", &[1]).encode_to_vec())]
            ),
            Err(Error::BrokenInvariant(_))
        ));
        assert!(matches!(
            MetaState::from_records(
                0,
                [(route_record_key(7), route(1, "", "", &[1]).encode_to_vec())]
            ),
            Err(Error::MismatchedRecord { .. })
        ));
    }

    #[test]
    fn replay_after_restart_changes_nothing() {
        let log = [
            register(1, "a:1"),
            register(2, "a:2"),
            register(3, "a:3"),
            create(vec![
                route(1, "", "k", &[1, 2, 3]),
                route(2, "k", "", &[1, 2, 3]),
            ]),
            register(3, "a:33"),
            register(1, "a:3"),
        ];
        let mut st = MetaState::default();
        let mut store = BTreeMap::new();
        for (i, c) in log.iter().enumerate() {
            let a = st.apply(i as u64 + 1, c).unwrap();
            persist(&mut store, &a);
        }
        // Restart from the persisted records at the last index; the host replays the
        // whole log (some of it twice).
        let mut again = MetaState::from_records(log.len() as u64, store.clone()).unwrap();
        assert_eq!(again, st);
        for (i, c) in log.iter().enumerate() {
            assert_eq!(again.apply(i as u64 + 1, c), Ok(Applied::Replayed));
        }
        assert_eq!(again, st);
    }

    /// Random commands (registrations over small id/address pools, bootstraps valid or
    /// not); restarts at random points rebuild the state from the records persisted so
    /// far and replay from a random earlier index. The state must equal the one that
    /// never restarted, and the invariants hold throughout.
    /// `PHOENIX_SEED` replays a run; `PHOENIX_META_RUNS` sets the number of runs.
    #[test]
    fn random_restarts_and_replays_match_the_model() {
        let runs: u64 = std::env::var("PHOENIX_META_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50);
        let base: u64 = std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| rand::thread_rng().gen());
        for run in 0..runs {
            let seed = base.wrapping_add(run);
            let result = std::panic::catch_unwind(|| replay_run(seed));
            if result.is_err() {
                panic!("failed with PHOENIX_SEED={seed} PHOENIX_META_RUNS=1");
            }
        }
    }

    fn random_command(rng: &mut ChaCha8Rng) -> MetaCommand {
        match rng.gen_range(0..10) {
            0 => MetaCommand { cmd: None },
            1 | 2 => {
                let n = rng.gen_range(1..4u64);
                let mut keys: Vec<String> = (0..n - 1)
                    .map(|_| format!("k{}", rng.gen_range(0..20)))
                    .collect();
                keys.sort();
                if rng.gen_bool(0.8) {
                    keys.dedup();
                }
                let starts = std::iter::once(String::new()).chain(keys.iter().cloned());
                let ends = keys.iter().cloned().chain(std::iter::once(String::new()));
                let routes = starts
                    .zip(ends)
                    .enumerate()
                    .map(|(i, (s, e))| route(i as u64 + rng.gen_range(0..2), &s, &e, &[1, 2]))
                    .collect();
                create(routes)
            }
            _ => register(rng.gen_range(0..5), &format!("h:{}", rng.gen_range(0..5))),
        }
    }

    fn replay_run(seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let log: Vec<MetaCommand> = (0..rng.gen_range(1..60))
            .map(|_| random_command(&mut rng))
            .collect();
        // The model: applied once, in order, never restarted.
        let mut model = MetaState::default();
        let outcomes: Vec<_> = log
            .iter()
            .enumerate()
            .map(|(i, c)| model.apply(i as u64 + 1, c))
            .collect();
        model.check().unwrap();

        let mut st = MetaState::default();
        let mut store = BTreeMap::new();
        let mut next = 1u64; // next index to apply
        let mut applied_persisted = 0u64;
        while next <= log.len() as u64 {
            let c = &log[next as usize - 1];
            let got = st.apply(next, c);
            if next > applied_persisted {
                assert_eq!(got, outcomes[next as usize - 1], "index {next}");
            } else {
                assert_eq!(got, Ok(Applied::Replayed), "index {next}");
            }
            if let Ok(a) = &got {
                persist(&mut store, a);
            }
            applied_persisted = applied_persisted.max(next);
            st.check().unwrap();
            next += 1;
            if rng.gen_bool(0.2) {
                // Restart: rebuild from what was persisted, replay from an earlier point.
                st = MetaState::from_records(applied_persisted, store.clone()).unwrap();
                next = rng.gen_range(1..=next);
            }
        }
        assert_eq!(st.nodes(), model.nodes());
        assert_eq!(st.routes(), model.routes());
        assert_eq!(st.applied(), model.applied());
    }

    /// A node's draining state: refused for an unregistered node, unchanged when set
    /// again, recorded, and rebuilt from the records (which an older binary refuses by
    /// name).
    #[test]
    fn node_states_are_set_recorded_and_rebuilt() {
        let mut st = MetaState::default();
        let reg = MetaCommand {
            cmd: Some(meta_command::Cmd::RegisterNode(Replica {
                protocol: PROTOCOL,
                node_id: 1,
                addr: "h:1".into(),
            })),
        };
        st.apply(1, &reg).unwrap();
        let set = |node_id, draining| MetaCommand {
            cmd: Some(meta_command::Cmd::SetNodeState(NodeState {
                node_id,
                draining,
            })),
        };
        assert_eq!(st.apply(2, &set(9, true)), Err(Refusal::UnknownNode(9)));
        assert_eq!(st.apply(3, &set(1, false)), Ok(Applied::Unchanged));
        assert!(!st.draining(1));
        match st.apply(4, &set(1, true)) {
            Ok(Applied::Changed(ws)) => assert_eq!(ws[0].key, state_record_key(1)),
            other => panic!("{other:?}"),
        }
        assert!(st.draining(1));
        assert_eq!(st.draining_nodes(), vec![1]);
        let back = MetaState::from_records(
            st.applied(),
            st.records().into_iter().map(|w| (w.key, w.value)),
        )
        .unwrap();
        assert_eq!(back, st);
        st.apply(5, &set(1, false)).unwrap();
        assert!(st.draining_nodes().is_empty());
        // A state record of a node not registered breaks an invariant.
        let orphan = NodeState {
            node_id: 2,
            draining: true,
        };
        assert!(
            MetaState::from_records(1, [(state_record_key(2), orphan.encode_to_vec())]).is_err()
        );
    }

    fn plan(group: u64, key: &str, new: u64, epoch: u64) -> MetaCommand {
        MetaCommand {
            cmd: Some(meta_command::Cmd::PlanSplit(SplitPlan {
                group_id: group,
                split_key: Bytes::from(key.as_bytes().to_vec()),
                new_group_id: new,
                epoch,
                origin: 0,
            })),
        }
    }

    fn finish(parent: Route, child: Route) -> MetaCommand {
        MetaCommand {
            cmd: Some(meta_command::Cmd::FinishSplit(SplitDone {
                parent: Some(parent),
                child: Some(child),
            })),
        }
    }

    #[test]
    fn splits_are_planned_then_finished_and_survive_a_rebuild() {
        let store = std::cell::RefCell::new(BTreeMap::new());
        let mut st = MetaState::default();
        let at = std::cell::Cell::new(0);
        let apply = |st: &mut MetaState, cmd: &MetaCommand| {
            at.set(at.get() + 1);
            let r = st.apply(at.get(), cmd);
            if let Ok(a) = &r {
                persist(&mut store.borrow_mut(), a);
            }
            (r, at.get())
        };
        apply(&mut st, &register(1, "a:1")).0.unwrap();
        apply(
            &mut st,
            &create(vec![route(1, "", "m", &[1]), route(2, "m", "", &[1])]),
        )
        .0
        .unwrap();
        assert_eq!(st.next_group_id(), 3);
        // Refused: unknown group, stale epoch, key not strictly inside, wrong id.
        for (cmd, what) in [
            (plan(9, "c", 3, 1), "unknown group"),
            (plan(1, "c", 3, 2), "another epoch"),
            (plan(1, "", 3, 1), "the range's start"),
            (plan(1, "m", 3, 1), "the range's end"),
            (plan(1, "z", 3, 1), "outside"),
            (plan(1, "c", 7, 1), "not the next id"),
            (plan(1, "c", 2, 1), "an id in use"),
        ] {
            let (r, _) = apply(&mut st, &cmd);
            assert!(r.is_err(), "{what}: {r:?}");
        }
        assert!(st.splits().is_empty());
        apply(&mut st, &plan(1, "c", 3, 1)).0.unwrap();
        assert_eq!(st.next_group_id(), 4);
        // One split of a group at a time.
        assert!(apply(&mut st, &plan(1, "e", 4, 1)).0.is_err());
        let mut left = route(1, "", "c", &[1]);
        left.epoch = 2;
        let mut right = route(3, "c", "m", &[1]);
        right.epoch = 2;
        // Refused: routes that do not match the plan.
        let mut wrong_key = right.clone();
        wrong_key.start_key = Bytes::from_static(b"d");
        let mut wrong_id = right.clone();
        wrong_id.group_id = 4;
        let mut wrong_end = right.clone();
        wrong_end.end_key = Bytes::new();
        let mut old_epoch = right.clone();
        old_epoch.epoch = 1;
        for child in [wrong_key, wrong_id, wrong_end, old_epoch] {
            let (r, _) = apply(&mut st, &finish(left.clone(), child.clone()));
            assert!(r.is_err(), "{child:?}: {r:?}");
        }
        let (r, last) = apply(&mut st, &finish(left.clone(), right.clone()));
        r.unwrap();
        assert!(st.splits().is_empty());
        assert_eq!(st.routes()[&1].end_key.as_ref(), b"c");
        assert_eq!(st.routes()[&1].epoch, 2);
        assert_eq!(st.routes()[&3].start_key.as_ref(), b"c");
        st.check().unwrap();
        // A finish with no plan (a replay of it, say) is refused.
        assert!(apply(&mut st, &finish(left, right)).0.is_err());
        // Ids are never given again, even when the highest is no longer routed.
        assert_eq!(st.next_group_id(), 4);
        let rebuilt = MetaState::from_records(last, store.borrow().clone()).unwrap();
        assert_eq!(rebuilt.routes(), st.routes());
        assert_eq!(rebuilt.next_group_id(), 4);
        // A plan under way is rebuilt too.
        apply(&mut st, &plan(2, "x", 4, 1)).0.unwrap();
        let rebuilt = MetaState::from_records(last + 1, store.borrow().clone()).unwrap();
        assert_eq!(rebuilt.splits(), st.splits());
        assert_eq!(rebuilt.next_group_id(), 5);
    }

    fn merge_plan(source: u64, target: u64, phase: MergePhase, prepare_index: u64) -> MetaCommand {
        MetaCommand {
            cmd: Some(meta_command::Cmd::PlanMerge(MergePlan {
                source,
                target,
                source_epoch: 1,
                target_epoch: 1,
                phase: phase as i32,
                prepare_index,
                origin: 0,
            })),
        }
    }

    fn merge_done(source: u64, target: Option<Route>) -> MetaCommand {
        MetaCommand {
            cmd: Some(meta_command::Cmd::FinishMerge(MergeDone {
                source,
                target,
                thawed_epoch: 0,
            })),
        }
    }

    #[test]
    fn merges_are_planned_committed_or_rolled_back_and_survive_a_rebuild() {
        let store = std::cell::RefCell::new(BTreeMap::new());
        let mut st = MetaState::default();
        let at = std::cell::Cell::new(0);
        let apply = |st: &mut MetaState, cmd: &MetaCommand| {
            at.set(at.get() + 1);
            let r = st.apply(at.get(), cmd);
            if let Ok(a) = &r {
                persist(&mut store.borrow_mut(), a);
            }
            (r, at.get())
        };
        apply(&mut st, &register(1, "a:1")).0.unwrap();
        apply(&mut st, &register(2, "a:2")).0.unwrap();
        apply(
            &mut st,
            &create(vec![
                route(1, "", "f", &[1]),
                route(2, "f", "m", &[1]),
                route(3, "m", "", &[2]),
            ]),
        )
        .0
        .unwrap();
        // Refused: not neighbours, other replicas, itself, unknown, a later phase first.
        for (cmd, what) in [
            (merge_plan(1, 3, MergePhase::Prepare, 0), "not neighbours"),
            (merge_plan(2, 3, MergePhase::Prepare, 0), "other replicas"),
            (merge_plan(2, 2, MergePhase::Prepare, 0), "itself"),
            (merge_plan(9, 2, MergePhase::Prepare, 0), "unknown"),
            (
                merge_plan(2, 1, MergePhase::Commit, 5),
                "commit before plan",
            ),
        ] {
            assert!(apply(&mut st, &cmd).0.is_err(), "{what}");
        }
        apply(&mut st, &merge_plan(2, 1, MergePhase::Prepare, 0))
            .0
            .unwrap();
        assert!(st.merge_of(1).is_some() && st.merge_of(2).is_some());
        // Either group is taken: no second merge, no split of it.
        assert!(apply(&mut st, &merge_plan(1, 2, MergePhase::Prepare, 0))
            .0
            .is_err());
        let split = MetaCommand {
            cmd: Some(meta_command::Cmd::PlanSplit(SplitPlan {
                group_id: 1,
                split_key: Bytes::from_static(b"c"),
                new_group_id: st.next_group_id(),
                epoch: 1,
                origin: 0,
            })),
        };
        assert!(apply(&mut st, &split).0.is_err());
        // A commit needs the prepare index; then no rollback.
        assert!(apply(&mut st, &merge_plan(2, 1, MergePhase::Commit, 0))
            .0
            .is_err());
        apply(&mut st, &merge_plan(2, 1, MergePhase::Commit, 7))
            .0
            .unwrap();
        assert!(apply(&mut st, &merge_plan(2, 1, MergePhase::Rollback, 0))
            .0
            .is_err());
        assert!(
            apply(&mut st, &merge_done(2, None)).0.is_err(),
            "rollback of a commit"
        );
        let rebuilt = MetaState::from_records(at.get(), store.borrow().clone()).unwrap();
        assert_eq!(rebuilt.merges(), st.merges());
        // The merged route must be the two ranges joined, at a newer epoch.
        let mut merged = route(1, "", "m", &[1]);
        merged.epoch = 1;
        assert!(apply(&mut st, &merge_done(2, Some(merged.clone())))
            .0
            .is_err());
        merged.epoch = 2;
        let mut wrong = merged.clone();
        wrong.end_key = Bytes::from_static(b"f");
        assert!(apply(&mut st, &merge_done(2, Some(wrong))).0.is_err());
        let (r, last) = apply(&mut st, &merge_done(2, Some(merged)));
        r.unwrap();
        assert!(st.merges().is_empty());
        assert!(!st.routes().contains_key(&2));
        assert_eq!(st.routes()[&1].end_key.as_ref(), b"m");
        assert_eq!(st.routes()[&1].epoch, 2);
        st.check().unwrap();
        let rebuilt = MetaState::from_records(last, store.borrow().clone()).unwrap();
        assert_eq!(rebuilt.routes(), st.routes());
        assert!(rebuilt.merges().is_empty());
        // A merge given up in its prepare phase ends with both routes kept.
        let mut m = merge_plan(1, 3, MergePhase::Prepare, 0);
        if let Some(meta_command::Cmd::PlanMerge(p)) = m.cmd.as_mut() {
            p.source_epoch = 2;
        }
        assert!(apply(&mut st, &m).0.is_err(), "other replicas");
        apply(&mut st, &register(3, "a:3")).0.unwrap();
        let routes_before = st.routes().clone();
        let split_back = MetaCommand {
            cmd: Some(meta_command::Cmd::PlanSplit(SplitPlan {
                group_id: 1,
                split_key: Bytes::from_static(b"c"),
                new_group_id: st.next_group_id(),
                epoch: 2,
                origin: 0,
            })),
        };
        apply(&mut st, &split_back).0.unwrap();
        let mut left = route(1, "", "c", &[1]);
        left.epoch = 3;
        let mut right = route(st.next_group_id() - 1, "c", "m", &[1]);
        right.epoch = 3;
        apply(&mut st, &finish(left, right.clone())).0.unwrap();
        let mut m = merge_plan(right.group_id, 1, MergePhase::Prepare, 0);
        if let Some(meta_command::Cmd::PlanMerge(p)) = m.cmd.as_mut() {
            p.source_epoch = 3;
            p.target_epoch = 3;
        }
        apply(&mut st, &m).0.unwrap();
        assert!(
            apply(&mut st, &merge_done(right.group_id, None)).0.is_err(),
            "not rolling back"
        );
        if let Some(meta_command::Cmd::PlanMerge(p)) = m.cmd.as_mut() {
            p.phase = MergePhase::Rollback as i32;
        }
        apply(&mut st, &m).0.unwrap();
        // The thawed epoch must be past the plan's; the route takes it.
        assert!(apply(&mut st, &merge_done(right.group_id, None)).0.is_err());
        let mut thawed = merge_done(right.group_id, None);
        if let Some(meta_command::Cmd::FinishMerge(d)) = thawed.cmd.as_mut() {
            d.thawed_epoch = 5;
        }
        apply(&mut st, &thawed).0.unwrap();
        assert_eq!(st.routes()[&right.group_id].epoch, 5);
        assert!(st.merges().is_empty());
        assert_ne!(st.routes(), &routes_before);
        assert!(st.routes().contains_key(&right.group_id) && st.routes().contains_key(&1));
        st.check().unwrap();
    }
}
