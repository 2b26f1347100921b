//! The raft driver of a node: one thread that owns every group replica ([`Peer`]),
//! ticks them, steps incoming messages, proposes commands and runs the ready rounds.
//!
//! One round, for all groups with something to do:
//! 1. send each ready's `messages` (snapshots go to the snapshot sender);
//! 2. install snapshots, then submit every group's entries and hard state to the
//!    shared log store without waiting (the log store group-commits them: one fsync
//!    covers the readies of many groups; a hard state that only moves the commit index
//!    is not synced);
//! 3. apply committed entries (durable on a quorum already) as ONE engine batch per
//!    group carrying the group's applied-index sentinel (seed 000), answer proposals
//!    and reads;
//! 4. when the log store reports a ready durable (`Event::Persisted`, from its writer
//!    thread), `on_persist_ready` (in ready order) and send its `persisted_messages`.
//!    Meanwhile the driver keeps stepping messages and running rounds.
//!
//! Periodically each group's log is truncated to the engine's persisted applied index
//! (`get_persisted`), keeping `log_keep_entries` for lagging followers.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use phoenix_engine::{ReadOptions, WriteBatch, WriteOptions};
use phoenix_proto as proto;
use phoenix_raft::{
    ConfChange, Config as RaftConfig, EntryKind, Message, MessageType, RawNode, SnapshotStatus,
    StateRole,
};
use prost::Message as _;
use tokio::sync::oneshot;

use crate::keys;
use crate::meta::META_GROUP;
use crate::shared::{GroupView, Shared};
use crate::storage::GroupStorage;

/// What a committed command produced, for the proposer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyResult {
    /// Applied.
    Done,
    /// Compare-and-swap outcome and the value before it.
    Cas {
        /// Whether the condition held and the write happened.
        succeeded: bool,
        /// The value before, if any.
        current: Option<Vec<u8>>,
    },
    /// The state machine refused the command (meta commands).
    Refused(String),
}

/// Reply channel of a proposal.
pub type ProposeReply = oneshot::Sender<Result<ApplyResult, proto::Error>>;
/// Reply channel of a read-index request.
pub type ReadReply = oneshot::Sender<Result<(), proto::Error>>;

/// Input of the raft driver.
pub enum Event {
    /// A raft message from a peer node.
    Raft {
        /// Group.
        group: u64,
        /// The message.
        msg: Message,
    },
    /// Propose an encoded command on `group` (must be the leader).
    Propose {
        /// Group.
        group: u64,
        /// Encoded `KvCommand` or `MetaCommand`.
        data: Bytes,
        /// Where the outcome goes.
        reply: ProposeReply,
    },
    /// Confirm a linearizable read point on `group` and wait until it is applied.
    ReadIndex {
        /// Group.
        group: u64,
        /// Answered once reads may be served.
        reply: ReadReply,
    },
    /// Create a replica of the group if this node does not host it.
    CreateReplica(proto::Route),
    /// A snapshot for `group` arrived in `dir`; `msg` is its raft message.
    SnapshotReceived {
        /// Group.
        group: u64,
        /// Raft `Snapshot` message.
        msg: Message,
        /// Directory holding the SST files.
        dir: PathBuf,
        /// Route of the group (to create the replica if needed).
        route: proto::Route,
    },
    /// Outcome of sending a snapshot.
    SnapshotSent {
        /// Group.
        group: u64,
        /// Receiver node.
        to: u64,
        /// Whether it was delivered and accepted.
        ok: bool,
    },
    /// The appends of ready `number` of `group` are durable (or failed).
    Persisted {
        /// Group.
        group: u64,
        /// Ready number.
        number: u64,
        /// Outcome of the append.
        result: Result<(), String>,
    },
    /// A node could not be reached.
    Unreachable(u64),
    /// Stop the driver.
    Stop,
}

/// A ready handed out but not yet acknowledged to raft: acknowledgements go in ready
/// order, so a ready with nothing to persist still waits for the ones before it.
struct Unpersisted {
    number: u64,
    /// `persisted_messages`: sent once this ready and all before it are durable.
    msgs: Vec<Message>,
    durable: bool,
}

struct PendingProposal {
    term: u64,
    reply: ProposeReply,
}

/// One group replica hosted by this node.
pub struct Peer {
    group: u64,
    raw: RawNode<GroupStorage>,
    route: proto::Route,
    proposals: BTreeMap<u64, PendingProposal>,
    /// Read-index requests waiting for their read state, by context.
    reads_waiting: HashMap<u64, ReadReply>,
    /// Confirmed reads waiting for the apply index to reach theirs.
    reads_ready: Vec<(u64, ReadReply)>,
    /// A received snapshot not yet installed: (index, dir).
    pending_snapshot: Option<(u64, PathBuf)>,
    /// Readies whose appends are in flight, oldest first.
    unpersisted: std::collections::VecDeque<Unpersisted>,
}

impl Peer {
    fn fail_all(&mut self, why: &str) {
        let leader = self.raw.raft().leader();
        for (_, p) in std::mem::take(&mut self.proposals) {
            let _ = p.reply.send(Err(proto::Error::outcome_unknown(
                self.group,
                format!("{why} before the request was applied (leader now {leader})"),
            )));
        }
        for (_, r) in std::mem::take(&mut self.reads_waiting) {
            let _ = r.send(Err(proto::Error::group_unavailable(self.group, why)));
        }
        for (_, r) in std::mem::take(&mut self.reads_ready) {
            let _ = r.send(Err(proto::Error::group_unavailable(self.group, why)));
        }
    }
}

/// The raft driver.
pub struct Driver {
    shared: Arc<Shared>,
    peers: BTreeMap<u64, Peer>,
    events: Receiver<Event>,
    next_read_ctx: u64,
    last_truncate: Instant,
}

fn raft_config(shared: &Shared, applied: u64) -> RaftConfig {
    let mut c = RaftConfig::new(shared.cfg.node_id);
    c.election_tick = shared.cfg.election_ticks;
    c.heartbeat_tick = shared.cfg.heartbeat_ticks;
    c.applied = applied;
    c.seed = rand::random();
    c
}

impl Driver {
    /// A driver for the replicas in the node's registry.
    pub fn new(
        shared: Arc<Shared>,
        events: Receiver<Event>,
        routes: Vec<proto::Route>,
    ) -> crate::Result<Driver> {
        let mut d = Driver {
            shared,
            peers: BTreeMap::new(),
            events,
            next_read_ctx: 1,
            last_truncate: Instant::now(),
        };
        for r in routes {
            d.open_peer(r)?;
        }
        Ok(d)
    }

    /// Opens a replica from its persisted state (or fresh, with the route's replicas as
    /// voters).
    fn open_peer(&mut self, route: proto::Route) -> crate::Result<()> {
        let g = route.group_id;
        let db = &self.shared.engine;
        let applied = match db.get(&ReadOptions::default(), &keys::applied_key(g))? {
            Some(v) => keys::decode_applied(&v).ok_or_else(|| {
                crate::Error::Corruption(format!("group {g}: malformed applied sentinel {v:?}"))
            })?,
            None => (0, 0),
        };
        let conf = match db.get(&ReadOptions::default(), &keys::conf_key(g))? {
            Some(v) => keys::decode_conf(&v).ok_or_else(|| {
                crate::Error::Corruption(format!("group {g}: malformed membership {v:?}"))
            })?,
            None => phoenix_raft::ConfState::with_voters(route.replicas.iter().map(|r| r.node_id)),
        };
        let storage = GroupStorage::open(Arc::clone(&self.shared.log), g, applied, conf)?;
        let raw = RawNode::new(&raft_config(&self.shared, applied.0), storage)?;
        tracing::info!(group = g, applied = applied.0, "opened replica");
        self.shared.learn_addrs(&route);
        self.shared.groups.write().insert(
            g,
            GroupView {
                route: route.clone(),
                ..GroupView::default()
            },
        );
        self.peers.insert(
            g,
            Peer {
                group: g,
                raw,
                route,
                proposals: BTreeMap::new(),
                reads_waiting: HashMap::new(),
                reads_ready: Vec::new(),
                pending_snapshot: None,
                unpersisted: std::collections::VecDeque::new(),
            },
        );
        Ok(())
    }

    fn create_replica(&mut self, route: proto::Route) -> crate::Result<()> {
        if self.peers.contains_key(&route.group_id) {
            return Ok(());
        }
        let mut routes: Vec<proto::Route> = self.peers.values().map(|p| p.route.clone()).collect();
        routes.push(route.clone());
        crate::registry::save(&self.shared.cfg.data_dir, &routes)?;
        tracing::info!(group = route.group_id, "creating replica");
        self.open_peer(route)
    }

    /// Runs until `Event::Stop` or the channel closes.
    pub fn run(mut self) {
        let tick = self.shared.cfg.tick;
        let mut next_tick = Instant::now() + tick;
        loop {
            let timeout = next_tick.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(timeout) {
                Ok(Event::Stop) => break,
                Ok(ev) => self.handle(ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let mut n = 0;
            while let Ok(ev) = self.events.try_recv() {
                if matches!(ev, Event::Stop) {
                    return self.stop();
                }
                self.handle(ev);
                n += 1;
                if n >= 4096 {
                    break;
                }
            }
            if Instant::now() >= next_tick {
                for p in self.peers.values_mut() {
                    if let Err(e) = p.raw.tick() {
                        tracing::error!(group = p.group, "tick: {e}");
                    }
                }
                next_tick += tick;
                if next_tick < Instant::now() {
                    next_tick = Instant::now() + tick;
                }
            }
            for _ in 0..4 {
                match self.round() {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        tracing::error!("raft round failed: {e}");
                        break;
                    }
                }
            }
            // Reads confirmed in an earlier round wait for applies of later ones.
            for p in self.peers.values_mut() {
                if !p.reads_ready.is_empty() {
                    release_reads(p);
                }
            }
            if self.last_truncate.elapsed() >= self.shared.cfg.log_truncate_interval {
                self.last_truncate = Instant::now();
                self.truncate_logs();
            }
        }
        self.stop();
    }

    fn stop(&mut self) {
        for p in self.peers.values_mut() {
            p.fail_all("node shutting down");
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Raft { group, msg } => {
                let Some(p) = self.peers.get_mut(&group) else {
                    tracing::debug!(
                        group,
                        from = msg.from,
                        "message for a group not hosted here; dropped"
                    );
                    return;
                };
                if let Err(e) = p.raw.step(msg) {
                    tracing::debug!(group, "step refused: {e}");
                }
            }
            Event::Propose { group, data, reply } => {
                let Some(p) = self.peers.get_mut(&group) else {
                    let _ = reply.send(Err(proto::Error::group_unavailable(
                        group,
                        "not hosted on this node",
                    )));
                    return;
                };
                if p.raw.raft().role() != StateRole::Leader {
                    let hint = self.shared.replica_of(p.raw.raft().leader());
                    let _ = reply.send(Err(proto::Error::not_leader(group, hint)));
                    return;
                }
                let term = p.raw.raft().term();
                match p.raw.propose(data) {
                    Ok(index) => {
                        p.proposals.insert(index, PendingProposal { term, reply });
                    }
                    Err(e) => {
                        let hint = self.shared.replica_of(p.raw.raft().leader());
                        let mut err = proto::Error::not_leader(group, hint);
                        err.message = format!("group {group}: proposal refused: {e}");
                        let _ = reply.send(Err(err));
                    }
                }
            }
            Event::ReadIndex { group, reply } => {
                let Some(p) = self.peers.get_mut(&group) else {
                    let _ = reply.send(Err(proto::Error::group_unavailable(
                        group,
                        "not hosted on this node",
                    )));
                    return;
                };
                if p.raw.raft().role() != StateRole::Leader {
                    let hint = self.shared.replica_of(p.raw.raft().leader());
                    let _ = reply.send(Err(proto::Error::not_leader(group, hint)));
                    return;
                }
                let ctx = self.next_read_ctx;
                self.next_read_ctx += 1;
                match p.raw.read_index(Bytes::copy_from_slice(&ctx.to_be_bytes())) {
                    Ok(()) => {
                        p.reads_waiting.insert(ctx, reply);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(proto::Error::group_unavailable(
                            group,
                            format!("read index: {e}"),
                        )));
                    }
                }
            }
            Event::CreateReplica(route) => {
                if let Err(e) = self.create_replica(route) {
                    tracing::error!("creating replica: {e}");
                }
            }
            Event::SnapshotReceived {
                group,
                msg,
                dir,
                route,
            } => {
                if !self.peers.contains_key(&group) {
                    if let Err(e) = self.create_replica(route) {
                        tracing::error!(group, "creating replica for snapshot: {e}");
                        crate::snapshot::remove_dir(&dir);
                        return;
                    }
                }
                let Some(p) = self.peers.get_mut(&group) else {
                    return;
                };
                let index = msg.snapshot.as_ref().map_or(0, |s| s.meta.index);
                if let Some((_, old)) = p.pending_snapshot.replace((index, dir)) {
                    crate::snapshot::remove_dir(&old);
                }
                if let Err(e) = p.raw.step(msg) {
                    tracing::warn!(group, "snapshot message refused: {e}");
                }
                // A snapshot the core did not take (stale) is not installed: drop its files.
                if !p.raw.has_ready() || p.raw.raft().committed() < index {
                    if let Some((_, d)) = p.pending_snapshot.take() {
                        crate::snapshot::remove_dir(&d);
                    }
                }
            }
            Event::SnapshotSent { group, to, ok } => {
                if let Some(p) = self.peers.get_mut(&group) {
                    let st = if ok {
                        SnapshotStatus::Finish
                    } else {
                        SnapshotStatus::Failure
                    };
                    p.raw.report_snapshot(to, st);
                }
            }
            Event::Persisted {
                group,
                number,
                result,
            } => {
                let Some(p) = self.peers.get_mut(&group) else {
                    return;
                };
                if let Err(e) = result {
                    // Raft is never told: the group stops making progress on this node
                    // rather than acknowledge what is not durable.
                    tracing::error!(group, "log append failed: {e}");
                    return;
                }
                if let Some(u) = p.unpersisted.iter_mut().find(|u| u.number == number) {
                    u.durable = true;
                }
                if let Err(e) = self.acknowledge_persisted(group) {
                    tracing::error!(group, "acknowledging a durable ready: {e}");
                }
            }
            Event::Unreachable(node) => {
                for p in self.peers.values_mut() {
                    if p.raw.raft().conf_state().contains(node) {
                        p.raw.report_unreachable(node);
                    }
                }
            }
            Event::Stop => {}
        }
    }

    /// One ready round over all groups. Returns whether anything was done.
    fn round(&mut self) -> crate::Result<bool> {
        let mut readies = Vec::new();
        for (g, p) in self.peers.iter_mut() {
            if p.raw.has_ready() {
                readies.push((*g, p.raw.ready()?));
            }
        }
        if readies.is_empty() {
            return Ok(false);
        }
        // 1. Messages that may leave now; role changes.
        for (g, rd) in readies.iter_mut() {
            let msgs = std::mem::take(&mut rd.messages);
            self.send_messages(*g, msgs);
            if let Some(ss) = rd.soft_state {
                if let Some(p) = self.peers.get_mut(g) {
                    if ss.role != StateRole::Leader {
                        p.fail_all("leadership lost");
                    }
                    tracing::info!(group = *g, leader = ss.leader, role = ?ss.role, "role change");
                }
            }
        }
        // 2. Persist: snapshots, then submit entries + hard state of all groups. The log
        //    store group-commits them (one fsync covers the readies of many groups) and
        //    reports each as an `Event::Persisted`: the driver keeps stepping messages
        //    (e.g. the followers' acknowledgements) meanwhile instead of waiting here.
        for (g, rd) in readies.iter_mut() {
            let Some(p) = self.peers.get_mut(g) else {
                continue;
            };
            if let Some(snap) = rd.snapshot.take() {
                install_snapshot(&self.shared, p, &snap.meta)?;
            }
            let (group, number) = (*g, rd.number());
            let events = self.shared.events.clone();
            let submitted =
                p.raw
                    .store_mut()
                    .append_then(&rd.entries, rd.hard_state, move |result| {
                        let result = result.map_err(|e| e.to_string());
                        // A closed channel means the driver stopped: nothing to tell.
                        let _ = events.send(Event::Persisted {
                            group,
                            number,
                            result,
                        });
                    });
            p.unpersisted.push_back(Unpersisted {
                number,
                msgs: std::mem::take(&mut rd.persisted_messages),
                durable: !submitted,
            });
        }
        // 3. Apply: committed entries are durable here and on a quorum already, so their
        //    proposers are answered without waiting for this round's appends.
        for (g, rd) in readies.iter_mut() {
            let Some(p) = self.peers.get_mut(g) else {
                continue;
            };
            let committed = std::mem::take(&mut rd.committed_entries);
            if let Some(last) = committed.last().map(|e| e.index) {
                apply_entries(&self.shared, p, committed)?;
                p.raw.advance_apply_to(last)?;
            }
            for rs in std::mem::take(&mut rd.read_states) {
                let ctx = rs
                    .context
                    .as_ref()
                    .try_into()
                    .map(u64::from_be_bytes)
                    .unwrap_or(0);
                if let Some(reply) = p.reads_waiting.remove(&ctx) {
                    p.reads_ready.push((rs.index, reply));
                }
            }
            release_reads(p);
            p.reads_waiting.retain(|_, r| !r.is_closed());
        }
        // 4. Readies with nothing to persist are acknowledged now (after older ones).
        for (g, _) in readies.iter() {
            self.acknowledge_persisted(*g)?;
        }
        Ok(true)
    }

    /// Tells raft about the readies of `g` that are durable, in order, and sends what
    /// waited for them.
    fn acknowledge_persisted(&mut self, g: u64) -> crate::Result<()> {
        let Some(p) = self.peers.get_mut(&g) else {
            return Ok(());
        };
        let mut last = None;
        let mut msgs = Vec::new();
        while p.unpersisted.front().is_some_and(|u| u.durable) {
            if let Some(u) = p.unpersisted.pop_front() {
                last = Some(u.number);
                msgs.extend(u.msgs);
            }
        }
        let Some(number) = last else {
            return Ok(());
        };
        p.raw.on_persist_ready(number)?;
        publish_view(&self.shared, p);
        self.send_messages(g, msgs);
        Ok(())
    }

    fn send_messages(&mut self, g: u64, msgs: Vec<Message>) {
        for m in msgs {
            if m.kind == MessageType::Snapshot {
                let Some(p) = self.peers.get(&g) else {
                    continue;
                };
                crate::snapshot::start_send(&self.shared, g, &p.route, m);
            } else {
                self.shared.transport.send(g, p_epoch(&self.peers, g), m);
            }
        }
    }

    fn truncate_logs(&mut self) {
        let keep = self.shared.cfg.log_keep_entries;
        for p in self.peers.values_mut() {
            let g = p.group;
            let persisted = match self.shared.engine.get_persisted(&keys::applied_key(g)) {
                Ok(Some(v)) => keys::decode_applied(&v).map_or(0, |(i, _)| i),
                Ok(None) => 0,
                Err(e) => {
                    tracing::warn!(group = g, "reading persisted applied index: {e}");
                    continue;
                }
            };
            let mut target = persisted.min(p.raw.store().applied().0);
            if p.raw.raft().role() == StateRole::Leader {
                // Keep what followers still need unless they are too far behind.
                let floor = persisted.saturating_sub(keep);
                let voters = p.raw.raft().conf_state().voters.clone();
                for v in voters {
                    if v == self.shared.cfg.node_id {
                        continue;
                    }
                    if let Some(pr) = p.raw.raft().progress(v) {
                        if pr.matched >= floor {
                            target = target.min(pr.matched);
                        }
                    }
                }
            }
            if target > p.raw.store().snap_index() {
                if let Err(e) = p.raw.store_mut().compact_to(target) {
                    tracing::warn!(group = g, "log truncation to {target}: {e}");
                } else {
                    tracing::debug!(group = g, upto = target, "log truncated");
                }
            }
        }
        // Space is reclaimed by the log store's own maintenance thread, off this one.
    }
}

/// Answers the confirmed reads whose read index is applied.
fn release_reads(p: &mut Peer) {
    let applied = p.raw.store().applied().0;
    let mut i = 0;
    while i < p.reads_ready.len() {
        if p.reads_ready[i].0 <= applied {
            let (_, r) = p.reads_ready.swap_remove(i);
            let _ = r.send(Ok(()));
        } else {
            i += 1;
        }
    }
}

fn p_epoch(peers: &BTreeMap<u64, Peer>, g: u64) -> u64 {
    peers.get(&g).map_or(0, |p| p.route.epoch)
}

fn publish_view(shared: &Shared, p: &Peer) {
    let r = p.raw.raft();
    let mut groups = shared.groups.write();
    let v = groups.entry(p.group).or_default();
    v.route = p.route.clone();
    v.leader = r.leader();
    v.is_leader = r.role() == StateRole::Leader;
    v.term = r.term();
    v.commit = r.committed();
    v.applied = p.raw.store().applied().0;
    v.log_first = p.raw.store().snap_index() + 1;
}

/// Installs a received snapshot: replace the group's engine data with the snapshot's
/// files, then restart the group's log after the snapshot index.
fn install_snapshot(
    shared: &Shared,
    p: &mut Peer,
    meta: &phoenix_raft::SnapshotMeta,
) -> crate::Result<()> {
    let g = p.group;
    let dir = match p.pending_snapshot.take() {
        Some((idx, dir)) if idx == meta.index => dir,
        other => {
            return Err(crate::Error::Corruption(format!(
                "group {g}: raft installs snapshot {} but the received files are for {:?}",
                meta.index,
                other.map(|(i, _)| i)
            )))
        }
    };
    let files = crate::snapshot::files_in(&dir)?;
    shared.engine.drop_group(g)?;
    shared.engine.ingest(&files)?;
    let got = shared
        .engine
        .get(&ReadOptions::default(), &keys::applied_key(g))?
        .and_then(|v| keys::decode_applied(&v));
    if got != Some((meta.index, meta.term)) {
        return Err(crate::Error::Corruption(format!(
            "group {g}: snapshot data says applied {got:?}, message says ({}, {})",
            meta.index, meta.term
        )));
    }
    p.raw
        .store_mut()
        .apply_snapshot(meta)
        .map_err(|e| crate::Error::Raft(e.into()))?;
    crate::snapshot::remove_dir(&dir);
    if g == META_GROUP {
        *shared.meta.write() = crate::meta::load(&shared.engine)?;
    }
    tracing::info!(group = g, index = meta.index, "snapshot installed");
    Ok(())
}

/// Applies committed entries of one group as one engine batch (more only when a
/// compare-and-swap must read past a range deletion of the same round).
fn apply_entries(
    shared: &Shared,
    p: &mut Peer,
    entries: Vec<phoenix_raft::Entry>,
) -> crate::Result<()> {
    let g = p.group;
    let wo = WriteOptions {
        sync: false,
        disable_wal: !shared.cfg.engine_wal,
    };
    let mut wb = WriteBatch::new();
    // Writes of this batch not yet in the engine, for compare-and-swap reads.
    let mut overlay: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
    let mut has_range_delete = false;
    let mut replies: Vec<(ProposeReply, Result<ApplyResult, proto::Error>)> = Vec::new();
    let mut last = (0u64, 0u64);
    for e in entries {
        last = (e.index, e.term);
        let result = match e.kind {
            EntryKind::ConfChange => match ConfChange::decode(&e.data) {
                Ok(cc) => match p.raw.apply_conf_change(cc) {
                    Ok(cs) => {
                        wb.put(&keys::conf_key(g), &keys::encode_conf(&cs));
                        p.raw.store_mut().set_conf(cs);
                        ApplyResult::Done
                    }
                    Err(err) => ApplyResult::Refused(format!("conf change: {err}")),
                },
                Err(err) => ApplyResult::Refused(format!("conf change: {err}")),
            },
            EntryKind::Normal if e.data.is_empty() => ApplyResult::Done,
            EntryKind::Normal if g == META_GROUP => {
                crate::meta::apply_entry(&mut shared.meta.write(), e.index, &e.data, &mut wb)?
            }
            EntryKind::Normal => {
                let cmd = proto::KvCommand::decode(e.data.as_ref()).map_err(|err| {
                    crate::Error::Corruption(format!(
                        "group {g} entry {}: undecodable command: {err}",
                        e.index
                    ))
                })?;
                match cmd.cmd {
                    Some(proto::kv_command::Cmd::Batch(b)) => {
                        for m in b.mutations {
                            let k = keys::data_key(g, &m.key);
                            if m.op == proto::MutationOp::Delete as i32 {
                                wb.delete(&k);
                                overlay.insert(k, None);
                            } else {
                                wb.put(&k, &m.value);
                                overlay.insert(k, Some(m.value.to_vec()));
                            }
                        }
                        ApplyResult::Done
                    }
                    Some(proto::kv_command::Cmd::DeleteRange(r)) => {
                        let start = keys::data_key(g, &r.start);
                        let end = if r.end.is_empty() {
                            keys::data_end(g)
                        } else {
                            keys::data_key(g, &r.end)
                        };
                        if start < end {
                            wb.delete_range(&start, &end);
                            overlay.retain(|k, _| *k < start || *k >= end);
                            has_range_delete = true;
                        }
                        ApplyResult::Done
                    }
                    Some(proto::kv_command::Cmd::Cas(c)) => {
                        let k = keys::data_key(g, &c.key);
                        if has_range_delete && !overlay.contains_key(&k) {
                            // The engine must see the range deletion before we read.
                            wb.put(&keys::applied_key(g), &keys::encode_applied(last.0, last.1));
                            shared.engine.write(&wo, std::mem::take(&mut wb))?;
                            overlay.clear();
                            has_range_delete = false;
                        }
                        let current = match overlay.get(&k) {
                            Some(v) => v.clone(),
                            None => shared.engine.get(&ReadOptions::default(), &k)?,
                        };
                        let holds = match (&current, c.expect_exists) {
                            (Some(v), true) => v.as_slice() == c.expected.as_ref(),
                            (None, false) => true,
                            _ => false,
                        };
                        if holds {
                            if c.delete {
                                wb.delete(&k);
                                overlay.insert(k, None);
                            } else {
                                wb.put(&k, &c.new_value);
                                overlay.insert(k, Some(c.new_value.to_vec()));
                            }
                        }
                        ApplyResult::Cas {
                            succeeded: holds,
                            current,
                        }
                    }
                    None => ApplyResult::Refused("empty command".into()),
                }
            }
        };
        if let Some(pp) = p.proposals.remove(&e.index) {
            if pp.term == e.term {
                replies.push((pp.reply, Ok(result)));
            } else {
                let _ = pp.reply.send(Err(proto::Error::not_leader(g, None)));
            }
        }
        // Older proposals that never reached the log (overwritten) are failed.
        while let Some((&idx, _)) = p.proposals.first_key_value() {
            if idx > e.index {
                break;
            }
            if let Some((_, pp)) = p.proposals.pop_first() {
                let _ = pp.reply.send(Err(proto::Error::not_leader(g, None)));
            }
        }
    }
    wb.put(&keys::applied_key(g), &keys::encode_applied(last.0, last.1));
    shared.engine.write(&wo, wb)?;
    p.raw.store_mut().set_applied(last.0, last.1);
    for (reply, r) in replies {
        let _ = reply.send(r);
    }
    Ok(())
}
