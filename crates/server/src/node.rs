//! The raft driver of a node: one thread that owns every group replica ([`Peer`]),
//! ticks them, steps incoming messages, proposes commands and runs the ready rounds.
//!
//! One round, for all groups with something to do:
//! 1. send each ready's `messages` (snapshots go to the snapshot sender);
//! 2. install snapshots, then submit every group's entries and hard state to the
//!    shared log store without waiting (the log store group-commits them: one fsync
//!    covers the readies of many groups; a hard state that only moves the commit index
//!    is not synced);
//! 3. apply committed entries (durable on a quorum already) as one engine batch per
//!    group carrying the group's applied-index sentinel (seed 000; a scrub point cuts
//!    the round in two batches, each with its sentinel, and a merge's commit whose
//!    source here is behind holds the rest of the round), answer proposals and reads;
//! 4. when the log store reports a ready durable (`Event::Persisted`, from its writer
//!    thread), `on_persist_ready` (in ready order) and send its `persisted_messages`.
//!    Meanwhile the driver keeps stepping messages and running rounds.
//!
//! Periodically each group's log is truncated to the engine's persisted applied index
//! (`get_persisted`), keeping `log_keep_entries` for lagging followers.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use phoenix_engine::ReadOptions;
use phoenix_proto as proto;
use phoenix_raft::{
    ConfChange, Config as RaftConfig, EntryKind, Message, MessageType, RawNode, SnapshotStatus,
    StateRole,
};
use tokio::sync::oneshot;

use crate::keys;
use crate::meta::META_GROUP;
use crate::shared::{GroupView, Shared};
use crate::storage::GroupStorage;

pub use crate::apply::ApplyResult;

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
        dir: crate::snapshot::Staged,
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
        /// The replica's incarnation ([`Peer`] `incarnation`).
        incarnation: u64,
        /// Ready number.
        number: u64,
        /// Outcome of the append.
        result: Result<(), String>,
    },
    /// A node could not be reached.
    Unreachable(u64),
    /// The meta leader asks to move the leadership of `group` (if led here) to its
    /// replica on node `to` (raft's leader transfer; ignored while a transfer of the
    /// group is under way, when `to` is not a voter heard from lately, or while this
    /// node stops).
    TransferLeader {
        /// Group.
        group: u64,
        /// Node of the replica to lead it.
        to: u64,
    },
    /// The meta leader asks to change the membership of `group` (if led here and its
    /// applied membership is still `conf_version`): add `node` as a learner, as a voter
    /// (promote it), or remove it.
    ChangePeer {
        /// Group.
        group: u64,
        /// The node added or removed.
        node: u64,
        /// The change.
        change: PeerChange,
        /// The membership version the change was decided on.
        conf_version: u64,
    },
    /// The meta leader's routing table leaves this node out of `group` at membership
    /// version `conf_version`: drop the replica (unless its own membership is newer).
    DestroyReplica {
        /// Group.
        group: u64,
        /// The table's membership version.
        conf_version: u64,
    },
    /// The meta leader asks to split `group` (if led here and still at range epoch
    /// `epoch`) at `split_key`, the upper part becoming group `new_group_id`.
    Split {
        /// Group.
        group: u64,
        /// First key of the new group.
        split_key: Vec<u8>,
        /// The new group's id (reserved by the meta group).
        new_group_id: u64,
        /// The range epoch the split was planned at.
        epoch: u64,
    },
    /// The meta leader asks for a merge step in a group led here (merge.rs in the meta
    /// crate: a prepare or rollback in the source, a commit in the target).
    Merge(proto::MergeGroup),
    /// The engine flush after `group` took merges in is done (or failed): the sources'
    /// replicas here may go.
    MergeDurable {
        /// The target.
        group: u64,
        /// The groups merged into it.
        sources: Vec<u64>,
        /// Outcome of the flush.
        result: Result<(), String>,
    },
    /// The engine flush after `group` applied a merge's prepare at `index` is done (or
    /// failed): the freeze may be reported.
    PrepareDurable {
        /// The source.
        group: u64,
        /// The prepare's log index.
        index: u64,
        /// Outcome of the flush.
        result: Result<(), String>,
    },
    /// The meta leader asks for a scrub point in `group` (if led here).
    Scrub {
        /// Group.
        group: u64,
    },
    /// The engine flush after `group`'s split is done (or failed): the replicas of the
    /// groups it split off may open.
    SplitDurable {
        /// The group split.
        group: u64,
        /// The routes of the groups split off it.
        children: Vec<proto::Route>,
        /// Outcome of the flush.
        result: Result<(), String>,
    },
    /// The dropper finished dropping the data of `groups` (or failed).
    Dropped {
        /// Groups.
        groups: Vec<u64>,
        /// Outcome.
        result: Result<(), String>,
    },
    /// The node is stopping: hand every group it leads to a follower, then answer
    /// (when none is led here any more, or after [`HAND_OFF_MAX`]).
    HandOff(tokio::sync::oneshot::Sender<()>),
    /// Stop the driver.
    Stop,
}

/// A membership change the meta leader asks a group's leader for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerChange {
    /// Add the node as a learner.
    AddLearner,
    /// Add the node as a voter (promote a learner).
    AddVoter,
    /// Remove the node's replica.
    Remove,
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
    /// Which of the group's replicas on this node, in this process, this is: ready
    /// numbers start over in a replica created again (removed, then added back), so an
    /// append completion of the old one must not be taken for the new one's.
    incarnation: u64,
    raw: RawNode<GroupStorage>,
    route: proto::Route,
    proposals: BTreeMap<u64, PendingProposal>,
    /// Reads that arrived since the last read index was asked for: the next one
    /// ([`Driver::issue_reads`]) covers them all, so a burst of reads costs one quorum
    /// round, not one each.
    reads_queued: Vec<ReadReply>,
    /// Read-index requests waiting for their read state, by context.
    reads_waiting: HashMap<u64, Vec<ReadReply>>,
    /// Confirmed reads waiting for the apply index to reach theirs.
    reads_ready: Vec<(u64, ReadReply)>,
    /// Received snapshots not yet installed, by index: only the one raft holds as its
    /// pending snapshot is kept.
    pending_snapshots: BTreeMap<u64, crate::snapshot::Staged>,
    /// Why the replica stopped: set when a step of its work failed. A stopped replica
    /// takes no input and hands raft nothing more, so raft never gets ahead of what was
    /// really done; restarting the node reopens it from its durable state.
    failed: Option<String>,
    /// Readies whose appends are in flight, oldest first.
    unpersisted: std::collections::VecDeque<Unpersisted>,
    /// Ticks since the last request (leader): at `hibernate_ticks` the group sleeps.
    idle_ticks: u32,
    /// Decoded client session records of the group as applied (apply.rs).
    sessions: crate::apply::SessionCache,
    /// What the request path last saw of this replica ([`publish_view`]).
    published: Prompt,
    /// When the view was last published, and whether its statistics (commit, applied,
    /// log start) changed since.
    published_at: Instant,
    stats_stale: bool,
    /// In the driver's `dirty` list (checked for a ready in the next round).
    dirty: bool,
    /// In the driver's `awake` set (ticked).
    ticked: bool,
    /// Created empty for a group whose route says it began past index 0 (made by a
    /// split, or split since): it has no state to replay from and must get one (a
    /// snapshot, or the split applied by its parent here) before it may campaign, so it
    /// is not ticked until then. Two such replicas electing each other would lead an
    /// empty group.
    uninitialized: bool,
    /// The route of the group the last split of this one made (reported to meta).
    split_child: Option<proto::Route>,
    /// Groups split off in the last apply round, to open once the round is written.
    new_children: Vec<proto::Route>,
    /// Frozen for a merge: (target, prepare index).
    merging: Option<(u64, u64)>,
    /// The freeze is in the engine's files (flushed after the round that applied the
    /// prepare): only then is it reported, since the meta leader's commit counts on it
    /// surviving a crash (a restarted replica could not learn again that the prepare
    /// was committed once the other replicas merged and left).
    merge_durable: bool,
    /// A prepare was applied in the last round: flush, then report it.
    flush_prepare: bool,
    /// Committed entries raft handed out but not applied yet, from a merge's commit
    /// whose source here has not reached its prepare (`merge_waiting_for`): applied
    /// first when it has, before anything newer.
    held: Vec<phoenix_raft::Entry>,
    /// The source the held entries wait for (0: none).
    held_for: u64,
    /// Groups merged into this one in the last apply round, to drop once the round is
    /// durable.
    merged_sources: Vec<u64>,
}

/// The part of a replica's published view that requests depend on: published at once
/// when it changes. The rest (commit, applied, log start) feeds status and heartbeats
/// and is published at most every [`STATS_PUBLISH_INTERVAL`] while it changes (every
/// durable ready would take the node-wide view lock per write).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Prompt {
    leader: u64,
    is_leader: bool,
    term: u64,
    epoch: u64,
    failed: bool,
    hibernating: bool,
    merging: bool,
    held_for: u64,
}

impl Prompt {
    fn of(p: &Peer) -> Prompt {
        let r = p.raw.raft();
        Prompt {
            leader: r.leader(),
            is_leader: r.role() == StateRole::Leader,
            term: r.term(),
            epoch: p.route.epoch,
            failed: p.failed.is_some(),
            hibernating: r.is_hibernating(),
            merging: p.merging.is_some(),
            held_for: p.held_for,
        }
    }
}

/// How stale a busy replica's published statistics may be.
const STATS_PUBLISH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

impl Peer {
    fn fail_all(&mut self, why: &str) {
        let leader = self.raw.raft().leader();
        for (_, p) in std::mem::take(&mut self.proposals) {
            let _ = p.reply.send(Err(proto::Error::outcome_unknown(
                self.group,
                format!("{why} before the request was applied (leader now {leader})"),
            )));
        }
        let waiting = std::mem::take(&mut self.reads_waiting)
            .into_values()
            .flatten();
        for r in std::mem::take(&mut self.reads_queued)
            .into_iter()
            .chain(waiting)
        {
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
    /// Boxed: a lookup (several per message) touches a small table, not one of whole
    /// replicas; at 10,000 groups the ordered map's searches were 10% of the driver.
    peers: HashMap<u64, Box<Peer>>,
    events: Receiver<Event>,
    next_read_ctx: u64,
    last_truncate: Instant,
    /// Replicas in the registry that could not be opened, with the cause: stopped from
    /// the start, the node's other replicas serve.
    unopened: BTreeMap<u64, String>,
    /// Groups touched since their last ready round: only they are checked for work
    /// (each once: `Peer::dirty`).
    dirty: Vec<u64>,
    /// Groups whose raft timers run: only they are ticked. A hibernating group leaves
    /// the set and comes back when a message, request or suspicion wakes it
    /// (`Peer::ticked` mirrors membership).
    awake: HashSet<u64>,
    /// Groups with reads queued for the next read index.
    reads_queued: BTreeSet<u64>,
    /// Replicas the meta service asked for since the last loop: created together, with
    /// one registry write (a bootstrap of N groups asks for N at once).
    to_create: Vec<proto::Route>,
    /// The registry of the replicas this node hosts (the file's one writer).
    registry: crate::registry::Registry,
    /// Replicas whose creation failed to open them, tried again every heartbeat
    /// interval: their failure is reported (stopped, with the cause), so the meta
    /// service sees them hosted here and does not ask again.
    create_failed: BTreeMap<u64, proto::Route>,
    last_create_retry: Instant,
    /// Frozen sources whose target here took them in (by its log or a snapshot), being
    /// flushed before their drop, and when the driver last looked for more.
    merged_dropping: HashSet<u64>,
    last_merged_check: Instant,
    /// When leaderships were last handed off a full disk (`shed_leaders`).
    last_shed: Instant,
    /// Splits proposed lately, by group: the range epoch and raft term, and when. The
    /// meta leader asks again with every heartbeat until the split is applied (a large
    /// group's copy takes a while): the same split is not proposed again in the same
    /// term within [`SPLIT_REPROPOSE_AFTER`] (a new term may have dropped the entry).
    splits_proposed: HashMap<u64, ((u64, u64), Instant)>,
    /// A stop under way: the groups handed off, until when to wait for them, and whom
    /// to tell (`Event::HandOff`).
    handing_off: Option<HandOff>,
    /// The node is stopping (a hand-off began): it takes no leadership any more.
    stopping: bool,
    /// Memory of the session records cached by every replica (apply.rs
    /// `SessionCache`): past [`SESSION_CACHE_BYTES_MAX`] every cache starts over.
    session_records: Arc<std::sync::atomic::AtomicUsize>,
    /// Drops removed replicas' data off this thread.
    dropper: crate::dropper::Dropper,
    /// The next replica opened gets this incarnation.
    next_incarnation: u64,
    /// Removed replicas whose drop failed, tried again every heartbeat interval.
    drop_failed: BTreeSet<u64>,
    last_drop_retry: Instant,
    /// Groups split off here whose first state is being flushed: no replica of them is
    /// created meanwhile (`make_children_durable`).
    pending_children: HashSet<u64>,
    /// Groups whose applying is held at a merge's commit (`Peer::held`): tried again
    /// every loop.
    held: BTreeSet<u64>,
}

/// A stop's hand-off under way: group → the followers tried, until when to wait, and
/// whom to tell when done.
type HandOff = (
    HashMap<u64, Vec<u64>>,
    Instant,
    tokio::sync::oneshot::Sender<()>,
);

/// Longest a stopping node waits for its leaderships to move.
pub const HAND_OFF_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// How often a node whose disk is full hands its leaderships away (a transfer takes an
/// append round and an election; one under way is not restarted).
const SHED_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// A split proposed here is proposed again (the meta leader still asking) only after
/// this: its entry may have been lost to a leader change and this node lead again.
const SPLIT_REPROPOSE_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Memory the node gives to decoded client session records, over all its groups (a
/// record of a client that acknowledges its answers is about 150 bytes: every client of
/// several hundred busy groups).
const SESSION_CACHE_BYTES_MAX: usize = 64 << 20;

fn raft_config(shared: &Shared, applied: u64) -> RaftConfig {
    let mut c = RaftConfig::new(shared.cfg.node_id);
    c.election_tick = shared.cfg.election_ticks;
    c.heartbeat_tick = shared.cfg.heartbeat_ticks;
    c.applied = applied;
    c.seed = rand::random();
    // Many groups, few writes each: no empty append per commit, no heartbeat to a
    // follower that was just sent an append.
    c.coalesce_messages = true;
    c
}

impl Driver {
    /// A driver for the replicas in the node's registry.
    pub fn new(
        shared: Arc<Shared>,
        events: Receiver<Event>,
        registry: crate::registry::Registry,
    ) -> crate::Result<Driver> {
        let routes: Vec<proto::Route> = registry.routes().cloned().collect();
        let mut d = Driver {
            shared: Arc::clone(&shared),
            peers: HashMap::new(),
            events,
            next_read_ctx: 1,
            last_truncate: Instant::now(),
            unopened: BTreeMap::new(),
            dirty: Vec::new(),
            awake: HashSet::new(),
            reads_queued: BTreeSet::new(),
            to_create: Vec::new(),
            registry,
            create_failed: BTreeMap::new(),
            last_create_retry: Instant::now(),
            merged_dropping: HashSet::new(),
            last_merged_check: Instant::now(),
            last_shed: Instant::now(),
            splits_proposed: HashMap::new(),
            held: BTreeSet::new(),
            handing_off: None,
            stopping: false,
            session_records: Arc::default(),
            dropper: crate::dropper::Dropper::start(Arc::clone(&shared))?,
            next_incarnation: 1,
            drop_failed: BTreeSet::new(),
            last_drop_retry: Instant::now(),
            pending_children: HashSet::new(),
        };
        // Drops a crash (or an error) cut short are finished first.
        let dropping = d.registry.dropping();
        if !dropping.is_empty() {
            tracing::info!(groups = ?dropping, "finishing the drop of removed replicas");
            d.dropper.drop_groups(dropping);
        }
        for r in routes {
            if let Err(e) = d.open_peer(r.clone()) {
                d.mark_unopened(r, format!("opening the replica: {e}"));
            }
        }
        Ok(d)
    }

    /// Records a replica of this node's registry that could not be opened: stopped
    /// (visibly, with the cause) until the node restarts; the other replicas serve.
    fn mark_unopened(&mut self, r: proto::Route, why: String) {
        let g = r.group_id;
        tracing::error!(group = g, "replica stopped: {why}");
        self.shared.learn_addrs(&r);
        self.shared.groups.write().insert(
            g,
            GroupView {
                route: r,
                failed: Some(why.clone()),
                ..GroupView::default()
            },
        );
        self.unopened.insert(g, why);
    }

    /// The refusal of a request for group `g`, which has no open replica here.
    fn not_open(&self, g: u64) -> proto::Error {
        match self.unopened.get(&g) {
            Some(why) => stopped_error(g, why),
            None if self.create_failed.contains_key(&g) => {
                stopped_error(g, "its creation failed (retried every heartbeat interval)")
            }
            None => proto::Error::group_unavailable(g, "not hosted on this node"),
        }
    }

    /// Opens a replica from its persisted state (or fresh, with the route's replicas as
    /// voters).
    fn open_peer(&mut self, route: proto::Route) -> crate::Result<()> {
        let g = route.group_id;
        crate::failpoint::check_group(
            crate::failpoint::names::OPEN_REPLICA,
            self.shared.cfg.node_id,
            g,
        )?;
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
            // Fresh: the route's membership (a new group's, or the one a replica added
            // to a group is created with, at the route's version: `apply_round` skips
            // the changes at or below it).
            None => phoenix_raft::ConfState {
                voters: route
                    .replicas
                    .iter()
                    .map(|r| r.node_id)
                    .filter(|id| !route.learners.contains(id))
                    .collect(),
                learners: route.learners.clone(),
            },
        };
        let conf_version = conf_version(db, g)?.unwrap_or(route.conf_version);
        let mut route = route_with_conf(&self.shared, route, &conf, conf_version);
        // The range the group applied (a split's) wins over the one it was created with.
        let mut merging = None;
        let split_index = match group_range(db, g)? {
            Some(r) if r.merged_into != 0 => {
                // Merged into its neighbour before the node stopped, and not dropped yet
                // (the merge's batch is durable: this record is in it).
                tracing::info!(group = g, into = r.merged_into, "merged; dropping it");
                self.destroy_replica(g, u64::MAX);
                return Ok(());
            }
            Some(r) => {
                route.start_key = r.start_key;
                route.end_key = r.end_key;
                route.epoch = r.epoch;
                if r.merging_into != 0 {
                    merging = Some((r.merging_into, r.merge_index));
                }
                r.split_index
            }
            None => 0,
        };
        let split_child = split_child(db, g)?;
        let uninitialized = applied == (0, 0) && route.epoch > 1;
        if let Some(t) = self.registry.tombstone(g) {
            // Hosted here before: this replica starts from the old one's term and vote,
            // durably, or it could vote a second time in a term the old one voted in.
            let hs = self.shared.log.hard_state(g).unwrap_or_default();
            if hs.term < t.term {
                let seed = phoenix_log::HardState {
                    term: t.term,
                    vote: t.vote,
                    commit: hs.commit,
                };
                self.shared
                    .log
                    .append_durable(g, Vec::new(), Some(seed), true)
                    .wait()?;
            }
        }
        let storage = GroupStorage::open(Arc::clone(&self.shared.log), g, applied, conf)?;
        let mut raw = RawNode::new(&raft_config(&self.shared, applied.0), storage)?;
        // Entries up to the last split describe the group's wider range: a replica that
        // needs them gets a snapshot instead.
        raw.set_append_floor(split_index);
        let incarnation = self.next_incarnation;
        self.next_incarnation += 1;
        tracing::info!(
            group = g,
            applied = applied.0,
            uninitialized,
            "opened replica"
        );
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
            Box::new(Peer {
                group: g,
                incarnation,
                raw,
                route,
                proposals: BTreeMap::new(),
                reads_queued: Vec::new(),
                reads_waiting: HashMap::new(),
                reads_ready: Vec::new(),
                pending_snapshots: BTreeMap::new(),
                failed: None,
                unpersisted: std::collections::VecDeque::new(),
                idle_ticks: 0,
                sessions: crate::apply::SessionCache::new(Arc::clone(&self.session_records)),
                published: Prompt::default(),
                published_at: Instant::now(),
                stats_stale: true,
                dirty: false,
                ticked: false,
                uninitialized,
                split_child,
                new_children: Vec::new(),
                merge_durable: merging.is_some(),
                flush_prepare: false,
                merging,
                held: Vec::new(),
                held_for: 0,
                merged_sources: Vec::new(),
            }),
        );
        self.touch(g);
        Ok(())
    }

    /// Creates the replicas of `routes` this node does not host yet: the registry first
    /// (one durable write for them all), then each is opened. A crash in between leaves
    /// them in the registry, and the next start opens them (fresh, as here). A replica
    /// that fails to open is reported stopped with the cause (cluster status shows it),
    /// stays in the registry, and is created again every heartbeat interval
    /// (`create_failed`): a transient error, e.g. out of file handles, heals by itself.
    fn create_replicas(&mut self, routes: Vec<proto::Route>) -> crate::Result<()> {
        let mut seen = std::collections::HashSet::new();
        let mut new: Vec<proto::Route> = Vec::new();
        for r in routes {
            let g = r.group_id;
            let known = self.peers.contains_key(&g) || self.unopened.contains_key(&g);
            if !known && seen.insert(g) {
                new.push(r);
            }
        }
        if new.is_empty() {
            return Ok(());
        }
        // A retry of failed creations only: the registry names them already.
        let retry_only = new
            .iter()
            .all(|r| self.create_failed.contains_key(&r.group_id));
        if !retry_only {
            // Every replica named before stays named: opened, unopened, failed, or
            // cut short after an earlier write.
            self.registry.add(&new)?;
            crate::failpoint::check(
                crate::failpoint::names::CREATE_AFTER_REGISTRY,
                self.shared.cfg.node_id,
            )?;
        }
        tracing::info!(
            count = new.len(),
            first = new[0].group_id,
            "creating replicas"
        );
        for r in new {
            let g = r.group_id;
            self.create_failed.remove(&g);
            if let Err(e) = self.open_peer(r.clone()) {
                let why = format!("creating the replica: {e}; retried when asked again");
                tracing::error!(group = g, "{why}");
                self.shared.learn_addrs(&r);
                self.shared.groups.write().insert(
                    g,
                    GroupView {
                        route: r.clone(),
                        failed: Some(why),
                        ..GroupView::default()
                    },
                );
                if self.create_failed.is_empty() {
                    // The first retry comes a whole interval after the failure.
                    self.last_create_retry = Instant::now();
                }
                self.create_failed.insert(g, r);
            }
        }
        Ok(())
    }

    /// Whether a replica may be created from `route`, with the group's state at
    /// `version` (a route's membership version, or a snapshot's index), as far as the
    /// group's tombstone says: not while the old replica's data is being dropped, and
    /// only from a state past the removal that lists this node again (a stale request or
    /// snapshot does not bring a removed replica back).
    fn creatable(&self, route: &proto::Route, version: u64) -> bool {
        let g = route.group_id;
        let Some(t) = self.registry.tombstone(g) else {
            return true;
        };
        let me = self.shared.cfg.node_id;
        let listed = route.replicas.iter().any(|r| r.node_id == me);
        if t.dropping || version <= t.conf_version || !listed {
            tracing::debug!(
                group = g,
                version,
                removed_at = t.conf_version,
                dropping = t.dropping,
                listed,
                "not created: removed from this node"
            );
            return false;
        }
        true
    }

    /// Drops this node's replica of `g`: the routing table left it out at membership
    /// version `conf_version`. Skipped if the replica's own membership is newer (added
    /// back since) or it is being dropped already. The tombstone goes to the registry
    /// first (durably; on an error nothing is dropped and the meta leader asks again),
    /// then the replica closes (its waiting requests fail) and the dropper deletes its
    /// data and log stream; a crash after the tombstone is written redoes the drop at
    /// the next start.
    fn destroy_replica(&mut self, g: u64, conf_version: u64) {
        let old = self.registry.tombstone(g).cloned();
        if old.as_ref().is_some_and(|t| t.dropping) {
            return;
        }
        let (local, hs) = match self.peers.get(&g) {
            Some(p) => (p.route.conf_version, p.raw.raft().hard_state()),
            None => {
                let Some(route) = self.registry.routes().find(|r| r.group_id == g) else {
                    return;
                };
                // Not open (it failed to): its membership is what its engine applied,
                // which may be newer than the route it was created with.
                let local = match self::conf_version(&self.shared.engine, g) {
                    Ok(v) => v.unwrap_or(route.conf_version),
                    Err(e) => {
                        tracing::warn!(group = g, "not destroyed: reading its membership: {e}");
                        return;
                    }
                };
                let hs = self.shared.log.hard_state(g).unwrap_or_default();
                let hs = phoenix_raft::HardState {
                    term: hs.term,
                    vote: hs.vote,
                    commit: hs.commit,
                };
                (local, hs)
            }
        };
        if local > conf_version {
            tracing::debug!(
                group = g,
                local,
                conf_version,
                "not destroyed: its membership is newer than the table's"
            );
            return;
        }
        let (old_version, old_term, old_vote) =
            old.map_or((0, 0, 0), |t| (t.conf_version, t.term, t.vote));
        let (term, vote) = if hs.term >= old_term {
            (hs.term, hs.vote)
        } else {
            (old_term, old_vote)
        };
        let tomb = proto::ReplicaTombstone {
            group_id: g,
            conf_version: conf_version.max(old_version),
            term,
            vote,
            dropping: true,
        };
        if let Err(e) = self.registry.remove(tomb) {
            // The file may say either: the replica stops here (no vote past the term
            // the tombstone may hold); the meta leader asks again. (Logged here too:
            // `fail_group` says nothing of a replica that is not open.)
            tracing::error!(group = g, "removing the replica from the registry: {e}");
            self.fail_group(g, format!("removing the replica from the registry: {e}"));
            return;
        }
        if let Some(mut p) = self.peers.remove(&g) {
            p.fail_all("replica removed from this node");
            p.pending_snapshots.clear();
        }
        self.awake.remove(&g);
        self.reads_queued.remove(&g);
        self.unopened.remove(&g);
        self.create_failed.remove(&g);
        self.shared.groups.write().remove(&g);
        self.shared.scrubs.forget(g);
        if g == META_GROUP {
            // No longer a meta member: nothing here may answer from the old table.
            *self.shared.meta.write() = crate::meta::MetaState::default();
        }
        self.shared.report_soon.notify_one();
        tracing::info!(
            group = g,
            conf_version,
            "replica removed; dropping its data"
        );
        self.dropper.drop_groups(vec![g]);
    }

    /// Records the end of a drop, or queues a retry of a failed one.
    fn dropped(&mut self, groups: Vec<u64>, result: Result<(), String>) {
        match result {
            Ok(()) => {
                for g in &groups {
                    self.drop_failed.remove(g);
                }
                if let Err(e) = self.registry.dropped(&groups) {
                    // The file still says dropping: the next start drops them again.
                    tracing::warn!(groups = ?groups, "recording dropped replicas: {e}");
                }
            }
            Err(_) => {
                if self.drop_failed.is_empty() {
                    self.last_drop_retry = Instant::now();
                }
                self.drop_failed.extend(groups);
            }
        }
    }

    /// Creates the replicas asked for since the last loop, and once per heartbeat
    /// interval those whose creation failed.
    fn create_pending(&mut self) {
        if self.last_merged_check.elapsed() >= self.shared.cfg.heartbeat_interval {
            self.last_merged_check = Instant::now();
            self.drop_covered_sources();
        }
        if !self.create_failed.is_empty()
            && self.last_create_retry.elapsed() >= self.shared.cfg.heartbeat_interval
        {
            self.last_create_retry = Instant::now();
            self.to_create.extend(self.create_failed.values().cloned());
        }
        if !self.drop_failed.is_empty()
            && self.last_drop_retry.elapsed() >= self.shared.cfg.heartbeat_interval
        {
            self.last_drop_retry = Instant::now();
            let groups: Vec<u64> = std::mem::take(&mut self.drop_failed).into_iter().collect();
            self.dropper.drop_groups(groups);
        }
        let mut routes = std::mem::take(&mut self.to_create);
        routes.retain(|r| {
            !self.pending_children.contains(&r.group_id) && self.creatable(r, r.conf_version)
        });
        if routes.is_empty() {
            return;
        }
        let n = routes.len();
        if let Err(e) = self.create_replicas(routes) {
            // Nothing was opened; the meta service asks again with the next heartbeat.
            tracing::error!("creating {n} replicas: {e}");
        }
    }

    /// Runs until `Event::Stop` or the channel closes.
    pub fn run(mut self) {
        let tick = self.shared.cfg.tick;
        let mut next_tick = Instant::now() + tick;
        loop {
            // Groups left with work after the last rounds go on at once.
            let timeout = if self.dirty.is_empty() {
                next_tick.saturating_duration_since(Instant::now())
            } else {
                std::time::Duration::ZERO
            };
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
            self.create_pending();
            if Instant::now() >= next_tick {
                self.tick();
                if !self.held.is_empty() {
                    self.retry_held();
                }
                next_tick += tick;
                if next_tick < Instant::now() {
                    next_tick = Instant::now() + tick;
                }
            }
            self.issue_reads();
            for _ in 0..4 {
                if !self.round() {
                    break;
                }
            }
            if self.last_truncate.elapsed() >= self.shared.cfg.log_truncate_interval {
                self.last_truncate = Instant::now();
                self.truncate_logs();
            }
            if self.shared.disk.is_full() && self.last_shed.elapsed() >= SHED_INTERVAL {
                self.last_shed = Instant::now();
                self.shed_leaders();
            }
            self.check_hand_off();
        }
        self.stop();
    }

    /// Hands every group this node leads (the meta group too) to its most caught-up
    /// follower heard from lately — one with disk room first, as the meta service's
    /// recent list says — so a stop costs the clients a leader transfer (a round trip),
    /// not an election timeout. Returns each group led here with the target tried (none
    /// when no follower qualifies).
    fn hand_off_leaders(&mut self) -> HashMap<u64, Vec<u64>> {
        let leading: Vec<u64> = self
            .peers
            .iter()
            .filter(|(_, p)| p.failed.is_none() && p.raw.raft().role() == StateRole::Leader)
            .map(|(&g, _)| g)
            .collect();
        let mut tried = HashMap::new();
        for g in leading {
            let first = self.hand_off_group(g, &[]);
            tried.insert(g, first.into_iter().collect());
        }
        tried
    }

    /// Starts handing group `g` to a follower not in `tried` (one with disk room if
    /// there is one); returns the target.
    fn hand_off_group(&mut self, g: u64, tried: &[u64]) -> Option<u64> {
        let me = self.shared.cfg.node_id;
        let shared = Arc::clone(&self.shared);
        self.transfer_group(g, |v| {
            !tried.contains(&v) && !shared.disk.is_node_full(v, me)
        })
        .or_else(|| self.transfer_group(g, |v| !tried.contains(&v)))
    }

    /// Starts handing group `g` to the follower `transfer_target` picks among the
    /// voters `eligible` accepts; returns it.
    fn transfer_group(&mut self, g: u64, eligible: impl Fn(u64) -> bool) -> Option<u64> {
        let target = self.transfer_target(g, eligible)?;
        match self.peers.get_mut(&g)?.raw.transfer_leader(target) {
            Ok(()) => {}
            // (It reads the log to catch the target up: a failure there stops the group.)
            Err(e) if is_storage(&e) => {
                self.fail_group(g, format!("handing leadership to node {target}: {e}"));
                return None;
            }
            Err(_) => return None,
        }
        self.touch(g);
        Some(target)
    }

    /// The follower of group `g` (led here, no transfer under way) to hand it to: the
    /// most caught-up voter heard from lately among those `eligible` accepts.
    fn transfer_target(&self, g: u64, eligible: impl Fn(u64) -> bool) -> Option<u64> {
        let me = self.shared.cfg.node_id;
        let p = self.peers.get(&g)?;
        let r = p.raw.raft();
        if p.failed.is_some() || r.role() != StateRole::Leader || r.lead_transferee() != 0 {
            return None;
        }
        r.conf_state()
            .voters
            .iter()
            .copied()
            .filter(|&v| v != me && eligible(v))
            .filter_map(|v| {
                r.progress(v)
                    // (An asleep group's followers were idle, not absent.)
                    .filter(|pr| pr.recent_active || r.is_hibernating())
                    .map(|pr| (pr.matched, v))
            })
            .max()
            .map(|(_, v)| v)
    }

    /// Hands each data group this node leads to the follower `transfer_target` picks
    /// among the voters `eligible` accepts. Returns the groups handed off.
    fn transfer_leaderships(&mut self, eligible: impl Fn(u64) -> bool) -> Vec<u64> {
        let groups: Vec<u64> = self
            .peers
            .keys()
            .copied()
            .filter(|&g| g != META_GROUP)
            .collect();
        groups
            .into_iter()
            .filter(|&g| self.transfer_group(g, &eligible).is_some())
            .collect()
    }

    /// Drives a hand-off: a group whose transfer raft abandoned (target dead or slow) is
    /// handed to the next follower; once none is led here with a transfer under way, or
    /// at the deadline, each group still led here is left to the follower most likely
    /// to win at once (`abdicate`: it campaigns without waiting for a timeout), and the
    /// stop goes on.
    fn check_hand_off(&mut self) {
        // (Taken out while the groups are driven, put back if still waiting.)
        let Some((mut groups, deadline, done)) = self.handing_off.take() else {
            return;
        };
        let before_deadline = Instant::now() < deadline;
        // A group won since the hand-off began (an election, or a transfer to this node
        // that arrived before the stop) is handed off too.
        let won: Vec<u64> = self
            .peers
            .iter()
            .filter(|(g, p)| {
                !groups.contains_key(g)
                    && p.failed.is_none()
                    && p.raw.raft().role() == StateRole::Leader
            })
            .map(|(&g, _)| g)
            .collect();
        for g in won {
            groups.insert(g, Vec::new());
        }
        let mut waiting = false;
        for (g, tried) in groups.iter_mut() {
            let Some(p) = self.peers.get(g) else { continue };
            let r = p.raw.raft();
            if p.failed.is_some() || r.role() != StateRole::Leader {
                continue;
            }
            if r.lead_transferee() != 0 {
                waiting = true;
            } else if before_deadline {
                if let Some(t) = self.hand_off_group(*g, tried) {
                    tried.push(t);
                    waiting = true;
                }
            }
        }
        if waiting && before_deadline {
            self.handing_off = Some((groups, deadline, done));
            return;
        }
        let mut kept = 0;
        for g in groups.keys() {
            let Some(p) = self.peers.get(g) else { continue };
            if p.failed.is_some() || p.raw.raft().role() != StateRole::Leader {
                continue;
            }
            kept += 1;
            if let Some(m) = p.raw.abdicate() {
                self.shared.transport.send(*g, p.route.epoch, m);
            }
        }
        tracing::info!(
            groups = groups.len(),
            kept,
            "stopping: leaderships handed off"
        );
        let _ = done.send(());
    }

    /// While this node's disk is under its reserve (it refuses client writes), hands
    /// each data group it leads to a follower whose node has room, as the meta service
    /// last reported (so leadership does not bounce between full nodes): the one heard
    /// from lately with the longest log. The group's writes then go on there. A group
    /// with no such follower stays here, refusing writes until the space returns.
    fn shed_leaders(&mut self) {
        let me = self.shared.cfg.node_id;
        // Without a recent list, full nodes would hand groups to each other.
        if !self.shared.disk.knows_peers() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let moved = self.transfer_leaderships(|v| !shared.disk.is_node_full(v, me));
        if !moved.is_empty() {
            tracing::warn!(
                groups = moved.len(),
                first = moved[0],
                "disk full: handing leaderships to followers with room"
            );
        }
    }

    /// Proposes `change` of `node` in group `g` if this node leads it, its membership
    /// is still at `conf_version` and does not have the change yet. Raft refuses it
    /// while another change is not applied, and a removal of the last voter; the meta
    /// leader asks again.
    fn change_peer(&mut self, g: u64, node: u64, change: PeerChange, conf_version: u64) {
        let Some(p) = self.peers.get_mut(&g) else {
            return;
        };
        if p.failed.is_some()
            || p.raw.raft().role() != StateRole::Leader
            || p.route.conf_version != conf_version
        {
            return;
        }
        let conf = p.raw.raft().conf_state();
        let done = match change {
            PeerChange::AddVoter => conf.voters.contains(&node),
            PeerChange::AddLearner => conf.contains(node),
            PeerChange::Remove => !conf.contains(node),
        };
        if done {
            return;
        }
        let cc = match change {
            PeerChange::AddVoter => ConfChange::AddVoter(node),
            PeerChange::AddLearner => ConfChange::AddLearner(node),
            PeerChange::Remove => ConfChange::RemoveNode(node),
        };
        match p.raw.propose_conf_change(cc) {
            Ok(index) => tracing::info!(group = g, index, "proposed {cc:?} (meta's request)"),
            Err(e) if is_storage(&e) => {
                return self.fail_group(g, format!("proposing {cc:?}: {e}"));
            }
            Err(e) => tracing::debug!(group = g, "{cc:?} not proposed: {e}"),
        }
        self.touch(g);
    }

    /// Proposes the split the meta leader asked for, if this node leads the group and
    /// its range is still at `epoch` (a split already applied has moved it on; the apply
    /// refuses a second one proposed meanwhile, as it checks the epoch again).
    fn propose_split(&mut self, g: u64, split_key: Vec<u8>, new_group_id: u64, epoch: u64) {
        let Some(p) = self.peers.get_mut(&g) else {
            return;
        };
        if g == META_GROUP
            || p.failed.is_some()
            || p.raw.raft().role() != StateRole::Leader
            || p.route.epoch != epoch
        {
            return;
        }
        let now = Instant::now();
        let key = (epoch, p.raw.raft().term());
        self.splits_proposed
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < SPLIT_REPROPOSE_AFTER);
        if self.splits_proposed.get(&g).is_some_and(|(k, _)| *k == key) {
            return;
        }
        let cmd = proto::KvCommand {
            now_ms: 0,
            cmd: Some(proto::kv_command::Cmd::Split(proto::SplitCommand {
                split_key: split_key.into(),
                new_group_id,
                epoch,
            })),
            session: None,
            epoch,
        };
        let data = Bytes::from(prost::Message::encode_to_vec(&cmd));
        match p.raw.propose(data) {
            Ok(index) => {
                self.splits_proposed.insert(g, (key, now));
                tracing::info!(
                    group = g,
                    index,
                    new_group_id,
                    "proposed a split (meta's request)"
                )
            }
            Err(e) if is_storage(&e) => {
                return self.fail_group(g, format!("proposing a split: {e}"));
            }
            Err(e) => tracing::debug!(group = g, "split not proposed: {e}"),
        }
        self.touch(g);
    }

    /// Proposes the merge step the meta leader asked for (a prepare or rollback in the
    /// source, a commit in the target), if this node leads that group and its range is
    /// still at the plan's epoch; once per (epoch, term) within
    /// [`SPLIT_REPROPOSE_AFTER`], as splits.
    fn propose_merge(&mut self, m: proto::MergeGroup) {
        use proto::kv_command::Cmd;
        let Some(plan) = m.plan else {
            return;
        };
        let phase = proto::MergePhase::try_from(plan.phase).unwrap_or(proto::MergePhase::Prepare);
        let (g, epoch, cmd) = match phase {
            proto::MergePhase::Prepare => (
                plan.source,
                plan.source_epoch,
                Cmd::PrepareMerge(proto::PrepareMergeCommand {
                    target: plan.target,
                    epoch: plan.source_epoch,
                }),
            ),
            proto::MergePhase::Commit => (
                plan.target,
                plan.target_epoch,
                Cmd::CommitMerge(proto::CommitMergeCommand {
                    source: plan.source,
                    source_epoch: plan.source_epoch + 1,
                    prepare_index: plan.prepare_index,
                    source_start: m.source_start,
                    source_end: m.source_end,
                    target_epoch: plan.target_epoch,
                }),
            ),
            proto::MergePhase::Rollback => (
                plan.source,
                0,
                Cmd::RollbackMerge(proto::RollbackMergeCommand {
                    target: plan.target,
                    epoch: plan.source_epoch,
                }),
            ),
        };
        let Some(p) = self.peers.get_mut(&g) else {
            return;
        };
        if g == META_GROUP
            || p.failed.is_some()
            || p.raw.raft().role() != StateRole::Leader
            || (epoch != 0 && p.route.epoch != epoch)
        {
            return;
        }
        let now = Instant::now();
        let key = (p.route.epoch, p.raw.raft().term());
        self.splits_proposed
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < SPLIT_REPROPOSE_AFTER);
        if self.splits_proposed.get(&g).is_some_and(|(k, _)| *k == key) {
            return;
        }
        let what = phase.as_str_name();
        let cmd = proto::KvCommand {
            now_ms: 0,
            cmd: Some(cmd),
            session: None,
            epoch: 0,
        };
        let data = Bytes::from(prost::Message::encode_to_vec(&cmd));
        match p.raw.propose(data) {
            Ok(index) => {
                self.splits_proposed.insert(g, (key, now));
                tracing::info!(
                    group = g,
                    index,
                    source = plan.source,
                    target = plan.target,
                    step = what,
                    "proposed a merge step (meta's request)"
                )
            }
            Err(e) if is_storage(&e) => {
                return self.fail_group(g, format!("proposing a merge step: {e}"));
            }
            Err(e) => tracing::debug!(group = g, "merge step not proposed: {e}"),
        }
        self.touch(g);
    }

    /// The meta leader's `DestroyReplica`. A source frozen for a merge whose target
    /// replica is here goes only once that target took it in, and after a flush (the
    /// target's round may be in memory only: a crash would replay the merge, which needs
    /// the source); while the target has not, the request is ignored (asked again).
    fn destroy_asked(&mut self, g: u64, conf_version: u64) {
        let target = self
            .peers
            .get(&g)
            .and_then(|p| p.merging)
            .map(|(t, _)| t)
            .filter(|t| self.peers.contains_key(t));
        let Some(t) = target else {
            return self.destroy_replica(g, conf_version);
        };
        if self.merged_dropping.contains(&g) {
            return;
        }
        if frozen_sources_covered(&self.peers, t).contains(&g) {
            self.make_merges_durable(t, vec![g]);
        } else {
            tracing::debug!(
                group = g,
                into = t,
                "not destroyed: its target here has not taken it in"
            );
        }
    }

    /// Drops the frozen sources whose target here covers their range (it took them in,
    /// by its log or a snapshot, and a crash or a failure came before the source went):
    /// once the target's state is flushed, as after a merge's round.
    fn drop_covered_sources(&mut self) {
        let frozen: Vec<(u64, u64)> = self
            .peers
            .values()
            .filter_map(|p| p.merging.map(|(t, _)| (p.group, t)))
            .filter(|(s, _)| !self.merged_dropping.contains(s))
            .collect();
        for (s, t) in frozen {
            let target_ok = self.peers.get(&t).is_some_and(|p| p.failed.is_none());
            if target_ok && frozen_sources_covered(&self.peers, t).contains(&s) {
                tracing::info!(
                    group = s,
                    into = t,
                    "frozen source taken in by its target here"
                );
                self.make_merges_durable(t, vec![s]);
            }
        }
    }

    /// Tries again the groups whose applying is held at a merge's commit: those whose
    /// source here has reached its prepare apply their held entries.
    fn retry_held(&mut self) {
        for g in std::mem::take(&mut self.held) {
            let shared = Arc::clone(&self.shared);
            let Some(p) = self.peers.get_mut(&g) else {
                continue;
            };
            if p.failed.is_some() || p.held.is_empty() {
                continue;
            }
            let entries = std::mem::take(&mut p.held);
            let applied = apply_entries(&shared, p, entries, &mut self.registry);
            let r = applied.and_then(|last| match last {
                Some(i) => p.raw.advance_apply_to(i).map_err(crate::Error::from),
                None => Ok(()),
            });
            match r {
                Ok(()) => {
                    if !p.held.is_empty() {
                        self.held.insert(g);
                    }
                    release_reads(p);
                    publish_changes(&shared, p);
                    self.make_children_durable(g);
                    self.touch(g);
                }
                Err(e) => {
                    self.fail_group(g, e.to_string());
                    self.make_children_durable(g);
                }
            }
        }
    }

    /// Drops the replicas of groups merged into `g` once the round that took them in is
    /// durable (a crash before leaves them whole, and `g` replays the merge from its
    /// log). A failed flush stops them: a restart finishes it.
    fn drop_merged(&mut self, g: u64, sources: Vec<u64>, result: Result<(), String>) {
        for s in sources {
            self.merged_dropping.remove(&s);
            let result = result.clone().and_then(|()| {
                crate::failpoint::check_group(
                    crate::failpoint::names::MERGE_BEFORE_DROP,
                    self.shared.cfg.node_id,
                    s,
                )
                .map_err(|e| e.to_string())
            });
            match &result {
                Ok(()) => {
                    tracing::info!(group = s, into = g, "merged; dropping its replica");
                    self.destroy_replica(s, u64::MAX);
                }
                Err(e) => self.fail_group(s, format!("flushing its merge into group {g}: {e}")),
            }
        }
    }

    /// Proposes a scrub point in group `g` if this node leads it (scrub.rs).
    fn propose_scrub(&mut self, g: u64) {
        let Some(p) = self.peers.get_mut(&g) else {
            return;
        };
        if g == META_GROUP || p.failed.is_some() || p.raw.raft().role() != StateRole::Leader {
            return;
        }
        let cmd = proto::KvCommand {
            now_ms: 0,
            cmd: Some(proto::kv_command::Cmd::Scrub(proto::ScrubCommand {})),
            session: None,
            epoch: 0,
        };
        let data = Bytes::from(prost::Message::encode_to_vec(&cmd));
        match p.raw.propose(data) {
            Ok(index) => tracing::info!(group = g, index, "proposed a scrub point"),
            Err(e) if is_storage(&e) => {
                return self.fail_group(g, format!("proposing a scrub point: {e}"));
            }
            Err(e) => tracing::debug!(group = g, "scrub point not proposed: {e}"),
        }
        self.touch(g);
    }

    /// One tick of the awake groups. A leader idle for `hibernate_ticks` puts its group
    /// to sleep (raft sends the followers a `Hibernate`); asleep, a group costs nothing
    /// until a message, a request or a suspicion about its leader wakes it.
    fn tick(&mut self) {
        if self
            .session_records
            .load(std::sync::atomic::Ordering::Relaxed)
            > SESSION_CACHE_BYTES_MAX
        {
            for p in self.peers.values_mut() {
                p.sessions.shed();
            }
        }
        let hibernate_ticks = self.shared.cfg.hibernate_ticks;
        let awake: Vec<u64> = self.awake.iter().copied().collect();
        let mut failed = Vec::new();
        for g in awake {
            let Some(p) = self.peers.get_mut(&g) else {
                self.awake.remove(&g);
                continue;
            };
            if p.failed.is_some() {
                p.ticked = false;
                self.awake.remove(&g);
                continue;
            }
            // Sleep first: a group that goes to sleep at this tick sends no heartbeat.
            let mut asleep = false;
            if hibernate_ticks > 0 && p.raw.raft().role() == StateRole::Leader {
                p.idle_ticks = p.idle_ticks.saturating_add(1);
                if p.idle_ticks >= hibernate_ticks {
                    match p.raw.hibernate() {
                        Ok(slept) => asleep = slept,
                        Err(e) => {
                            failed.push((g, format!("hibernate: {e}")));
                            continue;
                        }
                    }
                }
            }
            if !asleep {
                if let Err(e) = p.raw.tick() {
                    failed.push((g, format!("tick: {e}")));
                    continue;
                }
            }
            if p.stats_stale && p.published_at.elapsed() >= STATS_PUBLISH_INTERVAL {
                publish_view(&self.shared, p);
            }
            self.touch(g);
        }
        for (g, why) in failed {
            self.fail_group(g, why);
        }
    }

    /// Asks each group with queued reads for one read index covering them all (reads
    /// that arrived before it is asked are linearizable at the index it confirms).
    fn issue_reads(&mut self) {
        for g in std::mem::take(&mut self.reads_queued) {
            let Some(p) = self.peers.get_mut(&g) else {
                continue;
            };
            let replies = std::mem::take(&mut p.reads_queued);
            if replies.is_empty() || p.failed.is_some() {
                // A stopped replica answered them when it stopped.
                continue;
            }
            let ctx = self.next_read_ctx;
            self.next_read_ctx += 1;
            match p.raw.read_index(Bytes::copy_from_slice(&ctx.to_be_bytes())) {
                Ok(()) => {
                    p.reads_waiting.insert(ctx, replies);
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(proto::Error::group_unavailable(
                            g,
                            format!("read index: {e}"),
                        )));
                    }
                    // A leader whose log cannot be read must stop (and hand the group
                    // over), not go on leading and refusing every read.
                    if is_storage(&e) {
                        self.fail_group(g, format!("read index: {e}"));
                        continue;
                    }
                }
            }
            self.touch(g);
        }
    }

    /// Notes that replica `g` was handed something: it is checked for a ready in the
    /// next round, and joins or leaves the ticked set as its raft sleeps or wakes.
    fn touch(&mut self, g: u64) {
        let Some(p) = self.peers.get_mut(&g) else {
            return;
        };
        mark_dirty(&mut self.dirty, p);
        let awake = p.failed.is_none() && !p.raw.raft().is_hibernating() && !p.uninitialized;
        let changed = awake != p.ticked;
        if changed {
            p.ticked = awake;
            if awake {
                self.awake.insert(g);
            } else {
                self.awake.remove(&g);
            }
        }
        // A sleeping group is not ticked: what it left stale is published now.
        if changed || (!awake && p.stats_stale) {
            publish_view(&self.shared, p);
        }
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
                if p.failed.is_some() {
                    return;
                }
                // An empty replica of a split group takes no entries from index 1: they
                // would come from a leader that has not applied the split yet (and could
                // not be replayed against the narrowed range). It waits for a snapshot.
                if p.uninitialized && msg.kind == MessageType::Append && msg.index == 0 {
                    tracing::debug!(
                        group,
                        from = msg.from,
                        "append from the log's start dropped"
                    );
                    return;
                }
                // A stopping node takes no leadership: a transfer to it (the balancer's,
                // decided before it heard of the stop) would leave the group leaderless
                // when it goes. The sender gives the transfer up after a timeout.
                if self.stopping && msg.kind == MessageType::TimeoutNow {
                    tracing::debug!(group, from = msg.from, "stopping: leader transfer refused");
                    return;
                }
                // On a disk under its reserve a follower takes no new data entries for
                // data groups, so replication cannot eat the reserve; the leader resends
                // once the space is back (raft treats the drop as a lost message). An
                // append of empty entries (a new leader's first) is taken: without it
                // the leader could not commit in its term, nor serve reads.
                if group != META_GROUP
                    && self.shared.disk.is_full()
                    && msg.kind == MessageType::Append
                    && msg.entries.iter().any(|e| !e.data.is_empty())
                {
                    return;
                }
                if let Err(e) = p.raw.step(msg) {
                    if is_storage(&e) {
                        return self.fail_group(group, format!("stepping a message: {e}"));
                    }
                    tracing::debug!(group, "step refused: {e}");
                }
                self.touch(group);
            }
            Event::Propose { group, data, reply } => {
                if !self.peers.contains_key(&group) {
                    let _ = reply.send(Err(self.not_open(group)));
                    return;
                }
                let Some(p) = self.peers.get_mut(&group) else {
                    return;
                };
                if let Some(why) = &p.failed {
                    let _ = reply.send(Err(stopped_error(group, why)));
                    return;
                }
                if p.raw.raft().role() != StateRole::Leader {
                    let hint = self.shared.replica_of(p.raw.raft().leader());
                    let _ = reply.send(Err(proto::Error::not_leader(group, hint)));
                    wake_asked_follower(p);
                    self.touch(group);
                    return;
                }
                // A leader on a disk short of space, or whose group lacks a quorum of
                // replicas with room, takes no client write (disk.rs); the meta group's
                // own small proposals go on within the reserve.
                if group != META_GROUP {
                    let refused = self.shared.disk.refusal(
                        group,
                        self.shared.cfg.node_id,
                        &p.raw.raft().conf_state().voters,
                    );
                    if let Some(e) = refused {
                        let _ = reply.send(Err(e));
                        return;
                    }
                }
                p.idle_ticks = 0;
                let term = p.raw.raft().term();
                match p.raw.propose(data) {
                    Ok(index) => {
                        self.shared.metrics.proposals.inc();
                        p.proposals.insert(index, PendingProposal { term, reply });
                    }
                    Err(e) if is_storage(&e) => {
                        // Nothing of this ready leaves a stopped replica: not applied.
                        let why = format!("proposing: {e}");
                        let _ = reply.send(Err(stopped_error(group, &why)));
                        return self.fail_group(group, why);
                    }
                    Err(e) => {
                        let hint = self.shared.replica_of(p.raw.raft().leader());
                        let mut err = proto::Error::not_leader(group, hint);
                        err.message = format!("group {group}: proposal refused: {e}");
                        let _ = reply.send(Err(err));
                    }
                }
                self.touch(group);
            }
            Event::ReadIndex { group, reply } => {
                if !self.peers.contains_key(&group) {
                    let _ = reply.send(Err(self.not_open(group)));
                    return;
                }
                let Some(p) = self.peers.get_mut(&group) else {
                    return;
                };
                if let Some(why) = &p.failed {
                    let _ = reply.send(Err(stopped_error(group, why)));
                    return;
                }
                if p.raw.raft().role() != StateRole::Leader {
                    let hint = self.shared.replica_of(p.raw.raft().leader());
                    let _ = reply.send(Err(proto::Error::not_leader(group, hint)));
                    wake_asked_follower(p);
                    self.touch(group);
                    return;
                }
                p.idle_ticks = 0;
                p.reads_queued.push(reply);
                self.reads_queued.insert(group);
                self.touch(group);
            }
            Event::CreateReplica(route) => self.to_create.push(route),
            Event::SnapshotReceived {
                group,
                msg,
                dir,
                route,
            } => {
                // (The route's membership version is unknown until the files are read:
                // the snapshot's index stands for the state it carries.)
                let version = msg.snapshot.as_ref().map_or(0, |s| s.meta.index);
                let pending = self.pending_children.contains(&group);
                if pending || !self.peers.contains_key(&group) && !self.creatable(&route, version) {
                    drop(dir);
                    return;
                }
                if !self.peers.contains_key(&group) {
                    if let Err(e) = self.create_replicas(vec![route]) {
                        tracing::error!(group, "creating replica for snapshot: {e}");
                        drop(dir);
                        return;
                    }
                }
                let Some(p) = self.peers.get_mut(&group) else {
                    // Stopped here (it could not be opened): the files are not needed.
                    drop(dir);
                    return;
                };
                if p.failed.is_some() {
                    drop(dir);
                    return;
                }
                if p.uninitialized {
                    // An empty replica of a split group takes only a state from after its
                    // group's last split: an older one (from a leader that has not applied
                    // the split yet) would be replayed against the narrowed range.
                    match snapshot_epoch(dir.path(), group) {
                        Ok(e) if e >= p.route.epoch => {}
                        got => {
                            tracing::info!(
                                group,
                                epoch = p.route.epoch,
                                snapshot = ?got,
                                "snapshot older than the group's range epoch refused"
                            );
                            drop(dir);
                            return;
                        }
                    }
                }
                self.shared.metrics.snapshot("received", true);
                let index = msg.snapshot.as_ref().map_or(0, |s| s.meta.index);
                // (A snapshot it replaces is dropped, its files with it.)
                p.pending_snapshots.insert(index, dir);
                if let Err(e) = p.raw.step(msg) {
                    if is_storage(&e) {
                        // (Its files go with the replica's pending snapshots.)
                        return self.fail_group(group, format!("stepping a snapshot: {e}"));
                    }
                    tracing::warn!(group, "snapshot message refused: {e}");
                }
                mark_dirty(&mut self.dirty, p);
                // Keep only the files of the snapshot raft will hand back to install (a
                // stale one, one superseded by this, or a second copy of one being
                // installed is not installed: kept, it would hold its staging room).
                let wanted = p.raw.raft().raft_log().snapshot_to_hand_out();
                p.pending_snapshots.retain(|i, _| Some(*i) == wanted);
            }
            Event::SnapshotSent { group, to, ok } => {
                self.shared.metrics.snapshot("sent", ok);
                if let Some(p) = self.peers.get_mut(&group) {
                    let st = if ok {
                        SnapshotStatus::Finish
                    } else {
                        SnapshotStatus::Failure
                    };
                    p.raw.report_snapshot(to, st);
                    self.touch(group);
                }
            }
            Event::Persisted {
                group,
                incarnation,
                number,
                result,
            } => {
                let Some(p) = self.peers.get_mut(&group) else {
                    return;
                };
                if p.failed.is_some() || p.incarnation != incarnation {
                    return;
                }
                if let Err(e) = result {
                    // Raft is never told: the replica stops rather than acknowledge what
                    // is not durable.
                    self.fail_group(group, format!("log append failed: {e}"));
                    return;
                }
                if let Some(u) = p.unpersisted.iter_mut().find(|u| u.number == number) {
                    u.durable = true;
                }
                if let Err(e) = self.acknowledge_persisted(group) {
                    self.fail_group(group, format!("acknowledging a durable ready: {e}"));
                }
                self.touch(group);
            }
            Event::Unreachable(node) => {
                // The groups it leads may be asleep: nobody would notice its death
                // otherwise. Woken, their followers' election timers run again.
                let mut touched = Vec::new();
                for p in self.peers.values_mut().filter(|p| p.failed.is_none()) {
                    let r = p.raw.raft();
                    if !r.conf_state().contains(node) {
                        continue;
                    }
                    if r.is_hibernating() && r.leader() == node {
                        p.raw.wake();
                        touched.push(p.group);
                    }
                    if p.raw.raft().role() == StateRole::Leader {
                        p.raw.report_unreachable(node);
                        touched.push(p.group);
                    }
                }
                for g in touched {
                    self.touch(g);
                }
            }
            Event::TransferLeader { group, to } => {
                if self.stopping || to == self.shared.cfg.node_id {
                    return;
                }
                if let Some(t) = self.transfer_group(group, |v| v == to) {
                    tracing::info!(group, to = t, "handing leadership over (meta's request)");
                }
            }
            Event::ChangePeer {
                group,
                node,
                change,
                conf_version,
            } => self.change_peer(group, node, change, conf_version),
            Event::DestroyReplica {
                group,
                conf_version,
            } => self.destroy_asked(group, conf_version),
            Event::Dropped { groups, result } => self.dropped(groups, result),
            Event::Split {
                group,
                split_key,
                new_group_id,
                epoch,
            } => self.propose_split(group, split_key, new_group_id, epoch),
            Event::Scrub { group } => self.propose_scrub(group),
            Event::Merge(m) => self.propose_merge(m),
            Event::PrepareDurable {
                group,
                index,
                result,
            } => self.prepare_durable(group, index, result),
            Event::MergeDurable {
                group,
                sources,
                result,
            } => self.drop_merged(group, sources, result),
            Event::SplitDurable {
                group,
                children,
                result,
            } => self.open_children(group, children, result),
            Event::HandOff(done) => {
                self.stopping = true;
                let groups = self.hand_off_leaders();
                self.handing_off = Some((groups, Instant::now() + HAND_OFF_MAX, done));
            }
            Event::Stop => {}
        }
    }

    /// One ready round over the groups with work. Returns whether anything was done. A
    /// group whose work fails is stopped ([`Driver::fail_group`]); the others go on.
    fn round(&mut self) -> bool {
        let mut did = false;
        for g in std::mem::take(&mut self.dirty) {
            let ready = self.peers.get_mut(&g).is_some_and(|p| {
                p.dirty = false;
                p.failed.is_none() && p.raw.has_ready()
            });
            if !ready {
                continue;
            }
            did = true;
            match self.handle_ready(g) {
                // Handling a ready may leave more (e.g. entries an ack committed).
                Ok(()) => {
                    self.make_children_durable(g);
                    self.touch(g);
                }
                Err(e) => {
                    self.fail_group(g, e.to_string());
                    // A split applied before the failure still gets its flush, and its
                    // new replicas open if their state is on disk (else they are shown
                    // unopened; the parent replays the split at the next start).
                    self.make_children_durable(g);
                }
            }
        }
        did
    }

    /// Takes one ready of group `g` and does its work: send what may leave now, install
    /// a snapshot, submit entries and hard state to the log store (the log store
    /// group-commits the submissions of many groups: one fsync; each completes as an
    /// `Event::Persisted`, meanwhile the driver goes on stepping, e.g. the followers'
    /// acknowledgements), apply committed entries (durable on a quorum already, so their
    /// proposers are answered without waiting for this node's append), release reads.
    /// On an error the caller stops the group: what raft handed out and was not done is
    /// never acknowledged to it.
    fn handle_ready(&mut self, g: u64) -> crate::Result<()> {
        let shared = Arc::clone(&self.shared);
        let Some(p) = self.peers.get_mut(&g) else {
            return Ok(());
        };
        let mut rd = p.raw.ready()?;
        crate::failpoint::check_group(
            crate::failpoint::names::READY_BEFORE_SEND,
            shared.cfg.node_id,
            g,
        )?;
        if let Some(ss) = rd.soft_state {
            if ss.role != StateRole::Leader {
                p.fail_all("leadership lost");
            } else {
                shared.metrics.leader_changes.inc();
            }
            tracing::info!(group = g, leader = ss.leader, role = ?ss.role, "role change");
        }
        let msgs = std::mem::take(&mut rd.messages);
        self.send_messages(g, msgs);
        let Some(p) = self.peers.get_mut(&g) else {
            return Ok(());
        };
        if let Some(snap) = rd.snapshot.take() {
            // Entries held at a merge's commit are below the snapshot (raft hands out
            // what follows it again).
            p.held.clear();
            p.held_for = 0;
            let installed = install_snapshot(&shared, p, &snap.meta);
            shared.metrics.snapshot("installed", installed.is_ok());
            installed?;
            // A snapshot from past a merge's commit: the sources frozen for it here are
            // in the group now (dropped once the install is durable).
            let covered = frozen_sources_covered(&self.peers, g);
            if let Some(p) = self.peers.get_mut(&g) {
                p.merged_sources.extend(covered);
            }
        }
        let Some(p) = self.peers.get_mut(&g) else {
            return Ok(());
        };
        if !p.pending_snapshots.is_empty() {
            // Files of a snapshot raft no longer holds (it moved past it) would keep
            // their room among the node's staged snapshots for good.
            let wanted = p.raw.raft().raft_log().snapshot_to_hand_out();
            p.pending_snapshots.retain(|i, _| Some(*i) == wanted);
        }
        let number = rd.number();
        let incarnation = p.incarnation;
        let events = shared.events.clone();
        let submitted = p
            .raw
            .store_mut()
            .append_then(&rd.entries, rd.hard_state, move |result| {
                let result = result.map_err(|e| e.to_string());
                // A closed channel means the driver stopped: nothing to tell.
                let _ = events.send(Event::Persisted {
                    group: g,
                    incarnation,
                    number,
                    result,
                });
            });
        p.unpersisted.push_back(Unpersisted {
            number,
            msgs: std::mem::take(&mut rd.persisted_messages),
            durable: !submitted,
        });
        let committed = std::mem::take(&mut rd.committed_entries);
        if !committed.is_empty() || !p.held.is_empty() {
            // Entries held at a merge's commit go first.
            let mut entries = std::mem::take(&mut p.held);
            entries.extend(committed);
            let applied = apply_entries(&shared, p, entries, &mut self.registry)?;
            if let Some(last) = applied {
                p.raw.advance_apply_to(last)?;
            }
            if !p.held.is_empty() {
                self.held.insert(g);
            }
        }
        for rs in std::mem::take(&mut rd.read_states) {
            let ctx = rs
                .context
                .as_ref()
                .try_into()
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            for reply in p.reads_waiting.remove(&ctx).unwrap_or_default() {
                p.reads_ready.push((rs.index, reply));
            }
        }
        release_reads(p);
        p.reads_waiting.retain(|_, rs| {
            rs.retain(|r| !r.is_closed());
            !rs.is_empty()
        });
        // A ready with nothing to persist is acknowledged now (after older ones).
        self.acknowledge_persisted(g)
    }

    /// Flushes the engine off this thread once `g`'s last apply round split groups off
    /// it, then opens their replicas (`Event::SplitDurable`). The new groups' first
    /// state lives only in that round's batch, and the engine's WAL is off: were a new
    /// replica to take entries of its own before that state is on disk, a crash that also
    /// took the parent's replica from this node (removed meanwhile: it never replays the
    /// split) would leave it a log it cannot apply. Until then the new group has no
    /// replica here (its messages are dropped, as before the split).
    fn make_children_durable(&mut self, g: u64) {
        let Some(p) = self.peers.get_mut(&g) else {
            return;
        };
        let sources = std::mem::take(&mut p.merged_sources);
        let prepared = std::mem::take(&mut p.flush_prepare)
            .then_some(p.merging)
            .flatten()
            .filter(|_| p.failed.is_none());
        // A target that stopped may not have written the round that took the sources
        // in: they stay (frozen) until a restart replays the merge or finds it done.
        if !sources.is_empty() && p.failed.is_none() {
            self.make_merges_durable(g, sources);
        }
        if let Some((_, index)) = prepared {
            self.make_prepare_durable(g, index);
        }
        let Some(p) = self.peers.get_mut(&g) else {
            return;
        };
        let children = std::mem::take(&mut p.new_children);
        if children.is_empty() {
            return;
        }
        self.pending_children
            .extend(children.iter().map(|c| c.group_id));
        let children_of_failed_spawn = children.clone();
        let spawned = self.flush_then(move |result| Event::SplitDurable {
            group: g,
            children,
            result,
        });
        if let Err(e) = spawned {
            // The registry names them: the next start opens them.
            tracing::error!(group = g, "starting the split's flush: {e}");
            for c in children_of_failed_spawn {
                self.pending_children.remove(&c.group_id);
                self.mark_unopened(c, format!("starting the split's flush: {e}"));
            }
        }
    }

    /// Flushes the engine off this thread once `g`'s last apply round took merges in,
    /// then drops the sources' replicas here (`Event::MergeDurable`): until the merge's
    /// batch is durable, a crash replays it from `g`'s log, which needs the sources'
    /// data where it was.
    fn make_merges_durable(&mut self, g: u64, sources: Vec<u64>) {
        self.merged_dropping.extend(sources.iter().copied());
        let failed_spawn = sources.clone();
        let spawned = self.flush_then(move |result| Event::MergeDurable {
            group: g,
            sources,
            result,
        });
        if let Err(e) = spawned {
            // Left frozen: the next start drops them (their records say merged).
            self.drop_merged(g, failed_spawn, Err(format!("starting the flush: {e}")));
        }
    }

    /// Flushes the engine off this thread once `g` applied a merge's prepare at `index`,
    /// then reports the freeze (`Event::PrepareDurable`).
    fn make_prepare_durable(&mut self, g: u64, index: u64) {
        let spawned = self.flush_then(move |result| Event::PrepareDurable {
            group: g,
            index,
            result,
        });
        if let Err(e) = spawned {
            self.fail_group(g, format!("starting the flush of a merge's prepare: {e}"));
        }
    }

    /// Flushes the engine on a thread of its own, then sends the driver the event
    /// `done` makes of the outcome.
    fn flush_then(
        &self,
        done: impl FnOnce(Result<(), String>) -> Event + Send + 'static,
    ) -> std::io::Result<()> {
        let shared = Arc::clone(&self.shared);
        std::thread::Builder::new()
            .name("phoenix-flush".into())
            .spawn(move || {
                let result = shared.engine.flush().map_err(|e| e.to_string());
                let _ = shared.events.send(done(result));
            })
            .map(drop)
    }

    /// The flush after `g` applied a merge's prepare at `index` is done (or failed).
    fn prepare_durable(&mut self, g: u64, index: u64, result: Result<(), String>) {
        if let Err(e) = result {
            return self.fail_group(g, format!("flushing a merge's prepare: {e}"));
        }
        let shared = Arc::clone(&self.shared);
        let Some(p) = self.peers.get_mut(&g) else {
            return;
        };
        if p.merging.is_some_and(|(_, i)| i == index) {
            p.merge_durable = true;
            publish_view(&shared, p);
            shared.report_soon.notify_one();
        }
    }

    /// Opens the replicas of the groups `g` split off (their state is durable, or
    /// `result` says why not). An empty replica of one, created before from the routing
    /// table or a route, is replaced: it keeps its log stream (term and vote), and
    /// starts from the state the split wrote. If `g` is led here, the new group
    /// campaigns at once rather than wait an election timeout.
    fn open_children(&mut self, g: u64, children: Vec<proto::Route>, result: Result<(), String>) {
        for c in &children {
            self.pending_children.remove(&c.group_id);
        }
        // A new replica removed from this node meanwhile (its tombstone written, its drop
        // under way) is not opened.
        let children: Vec<proto::Route> = children
            .into_iter()
            .filter(|c| {
                self.registry.contains(c.group_id) && self.registry.tombstone(c.group_id).is_none()
            })
            .collect();
        let leads = !self.stopping
            && self
                .peers
                .get(&g)
                .is_some_and(|p| p.failed.is_none() && p.raw.raft().role() == StateRole::Leader);
        let checked = result
            .map_err(|e| format!("flushing the split's state: {e}"))
            .and_then(|()| {
                crate::failpoint::check(
                    crate::failpoint::names::SPLIT_BEFORE_OPEN,
                    self.shared.cfg.node_id,
                )
                .map_err(|e| e.to_string())
            });
        if let Err(e) = checked {
            // As a crash here: the registry lists them; the next start opens them.
            for c in children {
                if self.peers.contains_key(&c.group_id) {
                    continue;
                }
                self.mark_unopened(c, format!("opening the group split off {g}: {e}"));
            }
            return;
        }
        for child in children {
            let c = child.group_id;
            match self.peers.get(&c) {
                Some(old) if !old.uninitialized => continue,
                Some(_) => {
                    if let Some(mut old) = self.peers.remove(&c) {
                        old.fail_all("replaced by the replica its parent's split made");
                        old.pending_snapshots.clear();
                    }
                    self.awake.remove(&c);
                    self.reads_queued.remove(&c);
                }
                None => {}
            }
            self.unopened.remove(&c);
            self.create_failed.remove(&c);
            // The invariant the flush is for: the state it opens from is on disk.
            match self.shared.engine.get_persisted(&keys::applied_key(c)) {
                Ok(Some(_)) => {}
                other => {
                    let why = format!(
                        "opening the group split off {g}: its state is not on disk ({other:?})"
                    );
                    self.mark_unopened(child, why);
                    continue;
                }
            }
            if let Err(e) = self.open_peer(child.clone()) {
                self.mark_unopened(child, format!("opening the group split off {g}: {e}"));
                continue;
            }
            if leads {
                if let Some(p) = self.peers.get_mut(&c) {
                    if let Err(e) = p.raw.campaign() {
                        tracing::debug!(group = c, "campaign after the split: {e}");
                    }
                }
                self.touch(c);
            }
        }
    }

    /// Stops replica `g` after a failure in its work: it takes no more input, its
    /// waiting requests fail, the cause is logged and published (cluster status). The
    /// other replicas go on.
    fn fail_group(&mut self, g: u64, why: String) {
        let Some(p) = self.peers.get_mut(&g) else {
            return;
        };
        if p.failed.is_some() {
            return;
        }
        tracing::error!(group = g, "replica stopped: {why}");
        p.fail_all(&format!("replica stopped ({why})"));
        p.sessions.clear();
        // A leader that stops sends nothing more: its followers would wait an election
        // timeout, or sleep on if the group hibernates. The most caught-up one campaigns
        // at once instead.
        let handoff = p.raw.abdicate();
        let epoch = p.route.epoch;
        p.pending_snapshots.clear();
        p.failed = Some(why);
        publish_view(&self.shared, p);
        // (Left in `dirty`: the round skips a stopped replica.)
        p.ticked = false;
        self.awake.remove(&g);
        if let Some(m) = handoff {
            self.shared.transport.send(g, epoch, m);
        }
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
        publish_changes(&self.shared, p);
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
        for p in self.peers.values_mut().filter(|p| p.failed.is_none()) {
            let g = p.group;
            if p.raw.store().snap_index() >= p.raw.store().applied().0 {
                // Truncated up to what is applied: nothing more can go (an idle group).
                continue;
            }
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
                let fp = crate::failpoint::check(
                    crate::failpoint::names::TRUNCATE_BEFORE,
                    self.shared.cfg.node_id,
                );
                if let Err(e) = fp.map_err(|e| e.to_string()).and_then(|()| {
                    p.raw
                        .store_mut()
                        .compact_to(target)
                        .map_err(|e| e.to_string())
                }) {
                    tracing::warn!(group = g, "log truncation to {target}: {e}");
                } else {
                    tracing::debug!(group = g, upto = target, "log truncated");
                    // A sleeping group publishes nothing else: its status would keep
                    // showing the old log start.
                    publish_view(&self.shared, p);
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

fn p_epoch(peers: &HashMap<u64, Box<Peer>>, g: u64) -> u64 {
    peers.get(&g).map_or(0, |p| p.route.epoch)
}

/// Puts `p` on the driver's list of groups to check for a ready, once.
fn mark_dirty(dirty: &mut Vec<u64>, p: &mut Peer) {
    if !p.dirty {
        p.dirty = true;
        dirty.push(p.group);
    }
}

/// Publishes replica `p`'s view for the services and status (see [`Prompt`]).
fn publish_view(shared: &Shared, p: &mut Peer) {
    let r = p.raw.raft();
    let mut groups = shared.groups.write();
    let v = groups.entry(p.group).or_default();
    let was_leader = v.is_leader;
    let mut changed = false;
    // A replica's route changes with its epoch or membership version: compare those
    // (a full comparison of replica lists was 6% of the driver at 10,000 groups).
    // (Replaying older changes keeps the version but changes the members: every change
    // changes the count of replicas or the learners.)
    if v.route.group_id != p.route.group_id
        || v.route.epoch != p.route.epoch
        || v.route.conf_version != p.route.conf_version
        || v.route.replicas.len() != p.route.replicas.len()
        || v.route.learners != p.route.learners
    {
        v.route.clone_from(&p.route);
        v.split_child.clone_from(&p.split_child);
        changed = true;
    }
    v.leader = r.leader();
    v.is_leader = r.role() == StateRole::Leader;
    v.term = r.term();
    v.commit = r.committed();
    v.applied = p.raw.store().applied().0;
    v.log_first = p.raw.store().snap_index() + 1;
    v.failed.clone_from(&p.failed);
    v.hibernating = r.is_hibernating();
    let (into, index) = p.merging.unwrap_or((0, 0));
    v.merging_into = into;
    v.merge_index = if p.merge_durable { index } else { 0 };
    v.merge_waiting_for = p.held_for;
    if p.failed.is_some() {
        // A stopped replica leads nothing, whatever its raft state still says.
        v.is_leader = false;
        v.leader = 0;
    }
    changed |= v.is_leader != was_leader;
    drop(groups);
    if changed {
        shared.report_soon.notify_one();
    }
    p.published = Prompt::of(p);
    p.published_at = Instant::now();
    p.stats_stale = false;
}

/// After a durable ready: publishes at once if what requests depend on changed, else
/// notes the statistics as stale and publishes them at most every
/// [`STATS_PUBLISH_INTERVAL`] (the driver's tick publishes what is left stale).
fn publish_changes(shared: &Shared, p: &mut Peer) {
    if p.published != Prompt::of(p) || p.published_at.elapsed() >= STATS_PUBLISH_INTERVAL {
        publish_view(shared, p);
    } else {
        p.stats_stale = true;
    }
}

/// A hibernating follower asked for a request only a leader serves: the client could
/// not reach the leader it knew, so the leader may be gone. Woken, its election timer
/// runs; if the leader lives, the pre-vote wakes it and its heartbeats resume.
fn wake_asked_follower(p: &mut Peer) {
    if p.raw.raft().is_hibernating() {
        p.raw.wake();
    }
}

/// Whether a raft error means the replica must stop: its storage failed (I/O,
/// corruption; a compacted or not yet written index is raft's normal business) or raft
/// found an invariant broken (its state may be half-updated). Anything else refuses the
/// one request or message. A stopped replica stays stopped until the node restarts (by
/// hand, or by itself once a failed log store or engine can be reopened: disk.rs): what
/// a failed read or sync left behind is unknown.
fn is_storage(e: &phoenix_raft::Error) -> bool {
    matches!(
        e,
        phoenix_raft::Error::Storage(phoenix_raft::StorageError::Other(_))
            | phoenix_raft::Error::Invariant(_)
    )
}

/// The error a request to a stopped replica gets.
fn stopped_error(g: u64, why: &str) -> proto::Error {
    proto::Error::group_unavailable(g, format!("replica stopped on this node: {why}"))
}

/// Installs a received snapshot, crash-atomically: the engine swaps the group's data for
/// the snapshot's files in one manifest edit (the sentinel inside names the snapshot's
/// index and term), then the log is reset to start after the snapshot — suffix first,
/// so a crash in between leaves no divergent entry above the snapshot that a restart
/// could take for the log's continuation (`GroupStorage::open` checks the term at the
/// applied index and drops such a suffix).
fn install_snapshot(
    shared: &Shared,
    p: &mut Peer,
    meta: &phoenix_raft::SnapshotMeta,
) -> crate::Result<()> {
    let g = p.group;
    let Some(mut dir) = p.pending_snapshots.remove(&meta.index) else {
        return Err(crate::Error::Corruption(format!(
            "group {g}: raft installs snapshot {} but no files were received for it (have {:?})",
            meta.index,
            p.pending_snapshots.keys().collect::<Vec<_>>()
        )));
    };
    // The group's data is replaced whatever happens next (or the replica stops): its
    // cached session records no longer describe it, nor what readers know of its
    // expiries.
    p.sessions.clear();
    publish_expiries(shared, g, None);
    let copies = dir.take_copies();
    let installed = install_files(shared, p, meta, dir.path(), copies);
    // Installed or not, the received files are not needed again: a retry gets a new copy.
    drop(dir);
    installed?;
    if g == META_GROUP {
        *shared.meta.write() = crate::meta::load(&shared.engine)?;
    }
    tracing::info!(group = g, index = meta.index, "snapshot installed");
    Ok(())
}

/// The steps of [`install_snapshot`] once the files of `dir` are found.
fn install_files(
    shared: &Shared,
    p: &mut Peer,
    meta: &phoenix_raft::SnapshotMeta,
    dir: &std::path::Path,
    copies: Option<phoenix_engine::CopiedTables>,
) -> crate::Result<()> {
    use crate::failpoint::{check, names};
    let g = p.group;
    let node = shared.cfg.node_id;
    let files = crate::snapshot::files_in(dir)?;
    // The files must hold the snapshot's sentinel before they replace the group's data:
    // the switch cannot be undone.
    let sentinel = crate::snapshot::sentinel_in(&files, g)?;
    if sentinel != Some((meta.index, meta.term)) {
        return Err(crate::Error::Corruption(format!(
            "group {g}: snapshot files say applied {sentinel:?}, the message says ({}, {}); \
             not installed",
            meta.index, meta.term
        )));
    }
    check(names::INSTALL_BEFORE_REPLACE, node)?;
    match (copies, shared.cfg.drop_mode) {
        // (A snapshot by copy: the files are the rest, above the copied tables. Taken
        // only where groups are replaced by files: `snapshot::cannot_copy`.)
        (Some(copies), _) => shared.engine.replace_group_with_copies(g, copies, &files)?,
        (None, crate::config::DropMode::Files) => shared.engine.replace_group(g, &files)?,
        (None, crate::config::DropMode::RangeDelete) => {
            shared.engine.replace_group_by_tombstone(g, &files)?
        }
    }
    let got = shared
        .engine
        .get(&ReadOptions::default(), &keys::applied_key(g))?
        .and_then(|v| keys::decode_applied(&v));
    if got != Some((meta.index, meta.term)) {
        return Err(crate::Error::Corruption(format!(
            "group {g}: after the install the engine says applied {got:?}, the snapshot is \
             ({}, {})",
            meta.index, meta.term
        )));
    }
    check(names::INSTALL_AFTER_REPLACE, node)?;
    p.raw
        .store_mut()
        .apply_snapshot(meta, || {
            check(names::INSTALL_AFTER_SUFFIX, node).map_err(|e| e.to_string())
        })
        .map_err(|e| crate::Error::Raft(e.into()))?;
    // The membership is the snapshot's now, at the version its files carry (none: its
    // sender applied no change either; the version stays, as a restart would read it
    // from the registry's route).
    let version = conf_version(&shared.engine, g)?.unwrap_or(p.route.conf_version);
    let route = std::mem::take(&mut p.route);
    p.route = route_with_conf(shared, route, &meta.conf, version);
    // So is the range, if the group split before it (the files carry its record).
    if let Some(r) = group_range(&shared.engine, g)? {
        p.route.start_key = r.start_key;
        p.route.end_key = r.end_key;
        p.route.epoch = r.epoch;
        p.raw.set_append_floor(r.split_index);
        p.merging = (r.merging_into != 0).then_some((r.merging_into, r.merge_index));
        // (The install replaced the group's files: durable.)
        p.merge_durable = p.merging.is_some();
    }
    p.split_child = split_child(&shared.engine, g)?;
    p.uninitialized = false;
    Ok(())
}

/// The membership version group `g` persisted (None: it applied no change yet).
fn conf_version(db: &phoenix_engine::Db, g: u64) -> crate::Result<Option<u64>> {
    match db.get(&ReadOptions::default(), &keys::conf_version_key(g))? {
        None => Ok(None),
        Some(v) => keys::decode_conf_version(&v).map(Some).ok_or_else(|| {
            crate::Error::Corruption(format!("group {g}: malformed membership version {v:?}"))
        }),
    }
}

/// The range epoch of group `g` in the snapshot files of `dir` (1: they hold no range
/// record, the group never split).
fn snapshot_epoch(dir: &std::path::Path, g: u64) -> crate::Result<u64> {
    use prost::Message as _;
    let files = crate::snapshot::files_in(dir)?;
    match crate::snapshot::value_in(&files, &keys::range_key(g))? {
        Some(v) => Ok(proto::GroupRange::decode(v.as_slice())
            .map_err(|e| {
                crate::Error::Corruption(format!("group {g}: undecodable range record: {e}"))
            })?
            .epoch),
        None => Ok(1),
    }
}

/// The range group `g` applied (None: it never split; its route's stands).
fn group_range(db: &phoenix_engine::Db, g: u64) -> crate::Result<Option<proto::GroupRange>> {
    use prost::Message as _;
    let Some(v) = db.get(&ReadOptions::default(), &keys::range_key(g))? else {
        return Ok(None);
    };
    let r = proto::GroupRange::decode(v.as_slice()).map_err(|e| {
        crate::Error::Corruption(format!("group {g}: undecodable range record: {e}"))
    })?;
    if r.format > keys::RANGE_FORMAT_MERGE {
        return Err(crate::Error::Corruption(format!(
            "group {g}: range record format {} is newer than this binary's {}; \
             upgrade the binary",
            r.format,
            keys::RANGE_FORMAT_MERGE
        )));
    }
    Ok(Some(r))
}

/// The route of the group the last split of `g` made, if any.
fn split_child(db: &phoenix_engine::Db, g: u64) -> crate::Result<Option<proto::Route>> {
    use prost::Message as _;
    let Some(v) = db.get(&ReadOptions::default(), &keys::split_child_key(g))? else {
        return Ok(None);
    };
    proto::Route::decode(v.as_slice())
        .map(Some)
        .map_err(|e| crate::Error::Corruption(format!("group {g}: undecodable split record: {e}")))
}

/// `route` with the membership `conf` at `version`: voters then learners, each with the
/// address this node knows for it (else the one the route had).
fn route_with_conf(
    shared: &Shared,
    mut route: proto::Route,
    conf: &phoenix_raft::ConfState,
    version: u64,
) -> proto::Route {
    let addrs = shared.addrs.read();
    let old: HashMap<u64, String> = route
        .replicas
        .iter()
        .map(|r| (r.node_id, r.addr.clone()))
        .collect();
    route.replicas = conf
        .voters
        .iter()
        .chain(&conf.learners)
        .map(|&id| proto::Replica {
            protocol: 0,
            node_id: id,
            addr: addrs
                .get(&id)
                .or_else(|| old.get(&id))
                .cloned()
                .unwrap_or_default(),
        })
        .collect();
    route.learners = conf.learners.clone();
    route.conf_version = version;
    route
}

/// Applies split `sp` (entry `index`) of the group routed by `route` into round `a`:
/// decides whether the new group's state is written here, records its replica in the
/// registry first (durably: a crash after the round's batch finds it listed, and one
/// before finds it listed without a state and waiting, while the parent replays the
/// split), and narrows `route`. Returns the new group's route and whether its replica
/// is to be opened here (not if it has one with a state already, or was removed from
/// this node), or the refusal. The registry write failing stops the group (the entry is applied again
/// after a restart).
fn apply_split(
    shared: &Shared,
    registry: &mut crate::registry::Registry,
    a: &mut crate::apply::Applier<'_>,
    route: &mut proto::Route,
    conf: &phoenix_raft::ConfState,
    index: u64,
    sp: &proto::SplitCommand,
) -> crate::Result<Result<(proto::Route, bool), String>> {
    let g = route.group_id;
    let c = sp.new_group_id;
    if g == META_GROUP {
        return Ok(Err("the meta group does not split".into()));
    }
    // A replica of the new group with a state of its own (a snapshot came first), or
    // one removed from this node since, is left as it is.
    let tombstoned = registry.tombstone(c).is_some();
    let has_state = shared
        .engine
        .get(&ReadOptions::default(), &keys::applied_key(c))?
        .is_some();
    let done = match a.split(index, sp, conf, tombstoned || has_state)? {
        Ok(d) => d,
        Err(why) => return Ok(Err(why)),
    };
    let child = route_with_conf(
        shared,
        proto::Route {
            group_id: c,
            start_key: done.start.clone().into(),
            end_key: done.end.clone().into(),
            epoch: done.epoch,
            replicas: route.replicas.clone(),
            ..proto::Route::default()
        },
        conf,
        keys::SPLIT_INIT_INDEX,
    );
    a.batch_mut().put(
        &keys::split_child_key(g),
        &prost::Message::encode_to_vec(&child),
    );
    route.end_key = done.start.into();
    route.epoch = done.epoch;
    tracing::info!(
        group = g,
        new_group = c,
        index,
        epoch = done.epoch,
        "split applied"
    );
    if tombstoned || has_state {
        return Ok(Ok((child, false)));
    }
    // (Replaces the route of an empty replica created from the routing table: its
    // membership version there may name changes the new group made since, which this
    // state has not applied.)
    registry.add(std::slice::from_ref(&child))?;
    crate::failpoint::check(
        crate::failpoint::names::SPLIT_AFTER_REGISTRY,
        shared.cfg.node_id,
    )?;
    Ok(Ok((child, true)))
}

/// Before an apply round's batch is written: a split in it publishes its new range epoch
/// first (a read that took its engine snapshot and then still sees the old epoch,
/// service.rs, read from before the move).
fn before_write(
    shared: &Shared,
    g: u64,
    route: &proto::Route,
    split_child: &Option<proto::Route>,
    merging: Option<(u64, u64)>,
    split: bool,
) -> crate::Result<()> {
    if split {
        {
            let mut groups = shared.groups.write();
            let v = groups.entry(g).or_default();
            v.route.clone_from(route);
            v.split_child.clone_from(split_child);
            // (The prepare index is reported once the freeze is durable: publish_view.)
            v.merging_into = merging.map_or(0, |(into, _)| into);
        }
        crate::failpoint::check(
            crate::failpoint::names::SPLIT_BEFORE_WRITE,
            shared.cfg.node_id,
        )?;
    }
    crate::failpoint::check(
        crate::failpoint::names::APPLY_BEFORE_WRITE,
        shared.cfg.node_id,
    )
}

/// Tells readers whether group `g` may hold key expiries (see `GroupView::expiries`).
fn publish_expiries(shared: &Shared, g: u64, expiries: Option<bool>) {
    if shared.groups.read().get(&g).map(|v| v.expiries) == Some(expiries) {
        return;
    }
    if let Some(v) = shared.groups.write().get_mut(&g) {
        v.expiries = expiries;
    }
}

/// After an apply round's batch is written (`applied`: the last entry it covers).
fn after_write(shared: &Shared, p: &mut Peer, applied: Option<(u64, u64)>, split: bool) {
    if let Some((index, term)) = applied {
        p.raw.store_mut().set_applied(index, term);
        p.uninitialized = false;
    }
    if split {
        publish_view(shared, p);
    }
}

/// Applies committed entries of one group as one engine batch carrying the group's
/// applied-index sentinel (apply.rs; a scrub point cuts it in two, each with its
/// sentinel), then answers their proposers. Entries from a merge's commit whose source
/// here has not reached its prepare on are left in `p.held`. Returns the last entry
/// applied (None: none).
fn apply_entries(
    shared: &Shared,
    p: &mut Peer,
    entries: Vec<phoenix_raft::Entry>,
    registry: &mut crate::registry::Registry,
) -> crate::Result<Option<u64>> {
    let g = p.group;
    let engine = crate::apply::EngineState {
        db: &shared.engine,
        wal: shared.cfg.engine_wal,
    };
    let mut replies: Vec<(ProposeReply, Result<ApplyResult, proto::Error>)> = Vec::new();
    let applied = apply_round(shared, p, &engine, entries, &mut replies, registry);
    if let Err(e) = &applied {
        // These entries are committed: the other replicas apply them. Their proposers
        // must not take this failure for "not applied" (and retry a CAS).
        for (reply, _) in replies.drain(..) {
            let _ = reply.send(Err(proto::Error::outcome_unknown(
                g,
                format!("replica stopped while applying: {e}"),
            )));
        }
    }
    let applied = applied?;
    for (reply, r) in replies {
        let _ = reply.send(r);
    }
    Ok(applied)
}

/// The body of [`apply_entries`]: takes every entry into one apply round and writes it;
/// the proposers' answers go to `replies` (sent by the caller). Returns the last entry
/// applied.
fn apply_round(
    shared: &Shared,
    p: &mut Peer,
    engine: &crate::apply::EngineState<'_>,
    entries: Vec<phoenix_raft::Entry>,
    replies: &mut Vec<(ProposeReply, Result<ApplyResult, proto::Error>)>,
    registry: &mut crate::registry::Registry,
) -> crate::Result<Option<u64>> {
    let g = p.group;
    let mut a = crate::apply::Applier::new(g, engine, &mut p.sessions);
    a.set_range(&p.route.start_key, &p.route.end_key, p.route.epoch);
    let floor = p.raw.append_floor();
    a.set_merge_state(p.merging, floor);
    let mut conf = None;
    // The range, epoch or merge state changed: published before the batch is written.
    let mut split = false;
    let mut last_applied = None;
    p.held_for = 0;
    let mut entries = entries.into_iter();
    while let Some(e) = entries.next() {
        if let EntryKind::Normal = e.kind {
            if let Some(source) = a.merge_waits_for(&e.data)? {
                // A merge's commit whose source here has not reached its prepare: the
                // round ends before it, and it and what follows wait (`retry_held`).
                p.held = std::iter::once(e).chain(entries).collect();
                p.held_for = source;
                tracing::debug!(group = g, source, "applying held at a merge's commit");
                break;
            }
        }
        a.entry(e.index, e.term);
        let mut scrub = false;
        let result = match e.kind {
            // A change at or below the membership version is in the membership already:
            // a replica created with a route's membership (version V) that is fed the
            // log from further back skips the older changes instead of replaying them
            // onto a newer membership. (A replica that applied a change persisted its
            // version with it, so it never sees that entry again.)
            EntryKind::ConfChange if e.index <= p.route.conf_version => ApplyResult::Done,
            EntryKind::ConfChange => match ConfChange::decode(&e.data) {
                Ok(cc) => match p.raw.apply_conf_change(cc) {
                    Ok(cs) => {
                        a.batch_mut()
                            .put(&keys::conf_key(g), &keys::encode_conf(&cs));
                        a.batch_mut()
                            .put(&keys::conf_version_key(g), &e.index.to_be_bytes());
                        conf = Some((cs, e.index));
                        ApplyResult::Done
                    }
                    // Raft may have taken the new membership in memory before failing
                    // (reading its log to reach the new member): the group stops, and
                    // the entry is applied again after a restart. (Removing the last
                    // voter fails the same way on every replica; leaders never propose
                    // it.)
                    Err(err) if is_storage(&err) => {
                        return Err(crate::Error::Raft(err));
                    }
                    Err(err) => ApplyResult::Refused(format!("conf change: {err}")),
                },
                Err(err) => ApplyResult::Refused(format!("conf change: {err}")),
            },
            EntryKind::Normal if e.data.is_empty() => ApplyResult::Done,
            EntryKind::Normal if g == META_GROUP => {
                crate::meta::apply_entry(&mut shared.meta.write(), e.index, &e.data, a.batch_mut())?
            }
            EntryKind::Normal => match a.kv(e.index, &e.data)? {
                ApplyResult::Split(sp) => {
                    // The membership as of this entry: raft took every change before it
                    // (the route follows at the end of the round).
                    let conf = p.raw.raft().conf_state().clone();
                    let r =
                        apply_split(shared, registry, &mut a, &mut p.route, &conf, e.index, &sp)?;
                    if let Ok((child, open)) = &r {
                        if *open {
                            p.new_children.push(child.clone());
                        }
                        p.split_child = Some(child.clone());
                    }
                    if r.is_ok() {
                        p.raw.set_append_floor(e.index);
                        split = true;
                    }
                    match r {
                        Ok(_) => ApplyResult::Done,
                        Err(why) => ApplyResult::Refused(why),
                    }
                }
                ApplyResult::Scrub => {
                    scrub = true;
                    ApplyResult::Done
                }
                ApplyResult::PrepareMerge(m) => match a.prepare_merge(e.index, &m) {
                    Ok(epoch) => {
                        tracing::info!(
                            group = g,
                            into = m.target,
                            index = e.index,
                            epoch,
                            "frozen for a merge"
                        );
                        p.route.epoch = epoch;
                        p.merging = Some((m.target, e.index));
                        p.merge_durable = false;
                        p.flush_prepare = true;
                        split = true;
                        ApplyResult::Done
                    }
                    Err(why) => ApplyResult::Refused(why),
                },
                ApplyResult::RollbackMerge(m) => match a.rollback_merge(&m) {
                    Ok(epoch) => {
                        tracing::info!(group = g, into = m.target, epoch, "merge rolled back");
                        p.route.epoch = epoch;
                        p.merging = None;
                        split = true;
                        ApplyResult::Done
                    }
                    Err(why) => ApplyResult::Refused(why),
                },
                ApplyResult::CommitMerge(m) => match a.commit_merge(e.index, &m)? {
                    Ok(done) => {
                        tracing::info!(
                            group = g,
                            source = m.source,
                            index = e.index,
                            epoch = done.epoch,
                            "merge applied"
                        );
                        p.route.start_key = done.start.into();
                        p.route.end_key = done.end.into();
                        p.route.epoch = done.epoch;
                        // Entries up to it were checked against the narrower range.
                        p.raw.set_append_floor(e.index);
                        p.merged_sources.push(m.source);
                        split = true;
                        crate::failpoint::check_group(
                            crate::failpoint::names::MERGE_BEFORE_WRITE,
                            shared.cfg.node_id,
                            g,
                        )?;
                        ApplyResult::Done
                    }
                    Err(why) => ApplyResult::Refused(why),
                },
                r => r,
            },
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
        if scrub {
            // The engine must hold the state as of this entry exactly: the round so far
            // is written, the snapshot taken, and the rest of the round goes on in a
            // batch of its own.
            if a.holds_expiries() {
                publish_expiries(shared, g, Some(true));
            }
            before_write(shared, g, &p.route, &p.split_child, p.merging, split)?;
            let applied = a.finish(engine)?;
            if p.sessions.expiring() == Some(false) {
                publish_expiries(shared, g, Some(false));
            }
            last_applied = applied.map(|(i, _)| i).or(last_applied);
            // Under way before the view says the point is applied: a heartbeat never
            // shows it applied with no checksum, neither computed nor being computed
            // (the meta leader would take the point for missed).
            let snap = shared.engine.snapshot();
            shared.scrubs.start(&shared.engine, g, e.index, snap);
            after_write(shared, p, applied, split);
            split = false;
            crate::failpoint::check_group(
                crate::failpoint::names::SCRUB_AFTER_FIRST_BATCH,
                shared.cfg.node_id,
                g,
            )?;
            a = crate::apply::Applier::new(g, engine, &mut p.sessions);
            a.set_range(&p.route.start_key, &p.route.end_key, p.route.epoch);
            a.set_merge_state(p.merging, p.raw.append_floor());
        }
    }
    if a.holds_expiries() {
        publish_expiries(shared, g, Some(true));
    }
    before_write(shared, g, &p.route, &p.split_child, p.merging, split)?;
    let applied = a.finish(engine)?;
    if p.sessions.expiring() == Some(false) {
        publish_expiries(shared, g, Some(false));
    }
    last_applied = applied.map(|(i, _)| i).or(last_applied);
    after_write(shared, p, applied, split);
    if let Some((cs, version)) = conf {
        let route = std::mem::take(&mut p.route);
        p.route = route_with_conf(shared, route, &cs, version);
        p.raw.store_mut().set_conf(cs);
        tracing::info!(
            group = g,
            version,
            voters = ?p.route.replicas.iter().map(|r| r.node_id).filter(|id| !p.route.learners.contains(id)).collect::<Vec<_>>(),
            learners = ?p.route.learners,
            "membership changed"
        );
        publish_view(shared, p);
    }
    Ok(last_applied)
}

/// The replicas here frozen for a merge into `g` that `g`'s replica here, running, took
/// in (by its log or a snapshot from past the merge's commit): its range covers theirs at
/// a range epoch past theirs (the commit moves it past both; a route from before the
/// split that made the source would cover it too, at an older epoch).
fn frozen_sources_covered(peers: &HashMap<u64, Box<Peer>>, g: u64) -> Vec<u64> {
    let Some(t) = peers.get(&g).filter(|t| t.failed.is_none()) else {
        return Vec::new();
    };
    let covers = |r: &proto::Route| {
        t.route.epoch > r.epoch
            && r.start_key >= t.route.start_key
            && (t.route.end_key.is_empty()
                || (!r.end_key.is_empty() && r.end_key <= t.route.end_key))
    };
    peers
        .values()
        .filter(|p| p.merging.is_some_and(|(into, _)| into == g) && covers(&p.route))
        .map(|p| p.group)
        .collect()
}
