//! The Raft state machine of one group member: roles as step functions
//! (`step_leader`, `step_candidate`, `step_follower`), elections with pre-vote and
//! check-quorum, replication with flow control, snapshots, ReadIndex, leader transfer,
//! single-node membership changes and hibernation.
//!
//! Pure: no I/O, clock, threads or global randomness. Time enters as `tick()`, the
//! election-timeout jitter comes from a seeded generator in the state. Outputs are
//! queued in `msgs` (may be sent at once) and `msgs_after_append` (may be sent only
//! once everything handed out so far is durable); `RawNode` turns them into readies.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::error::{Error, StorageError};
use crate::log::RaftLog;
use crate::progress::{Progress, ProgressState};
use crate::quorum::{self, VoteResult};
use crate::read_only::{ReadOnly, ReadOnlyOption};
use crate::storage::Storage;
use crate::types::{
    ConfChange, ConfState, Entry, EntryKind, HardState, Message, MessageType, NodeId, ReadState,
    Snapshot, SnapshotStatus, StateRole, NONE,
};

/// Tunables of one group member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// This node's id (not 0).
    pub id: NodeId,
    /// Ticks without hearing from a leader before campaigning (randomized in
    /// `[election_tick, 2 * election_tick)`).
    pub election_tick: u32,
    /// Ticks between leader heartbeats; must be less than `election_tick`.
    pub heartbeat_tick: u32,
    /// Index the application has already applied (on restart).
    pub applied: u64,
    /// Maximum bytes of entries in one append message (at least one entry is sent).
    pub max_size_per_msg: u64,
    /// Maximum appends in flight to one follower in the replicate state.
    pub max_inflight_msgs: usize,
    /// Leader steps down if it has not heard from a quorum within an election timeout;
    /// followers ignore vote requests while they heard from a leader recently.
    pub check_quorum: bool,
    /// Campaign with a pre-vote round first, so that a partitioned node does not
    /// inflate terms.
    pub pre_vote: bool,
    /// How ReadIndex requests are confirmed.
    pub read_only_option: ReadOnlyOption,
    /// Seed for election-timeout jitter (mixed with `id`).
    pub seed: u64,
    /// Fewer messages per write, for nodes hosting many groups that each take few
    /// writes. A commit the leader learns with no new entries to send rides on the next
    /// append, heartbeat or `Hibernate` instead of an empty append of its own (etcd's
    /// leader sends one at once; a committed membership change still goes at once), and
    /// the periodic heartbeat skips a follower that answered an append since the
    /// previous one (the append reset its election timer, the answer marks it active; a
    /// follower whose answers wait on a slow disk is heartbeaten, and its heartbeat
    /// answers, which wait for nothing, keep check-quorum content). A follower's commit
    /// index then lags the leader's by at most two heartbeat intervals when writes stop,
    /// so the election timeout must exceed two heartbeat intervals; safety is unchanged
    /// (it never depended on when followers learn the commit index), and reads confirm
    /// leadership with heartbeats to every follower as before.
    pub coalesce_messages: bool,
}

impl Config {
    /// Defaults for node `id`: election 10 ticks, heartbeat 1, pre-vote and check-quorum
    /// on, 1 MiB messages, 256 in flight.
    pub fn new(id: NodeId) -> Config {
        Config {
            id,
            election_tick: 10,
            heartbeat_tick: 1,
            applied: 0,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            read_only_option: ReadOnlyOption::Safe,
            seed: 0,
            coalesce_messages: false,
        }
    }

    /// Checks the relations between the tunables.
    pub fn validate(&self) -> Result<(), Error> {
        if self.id == NONE {
            return Err(Error::InvalidConfig("node id 0 is reserved"));
        }
        if self.heartbeat_tick == 0 || self.election_tick <= self.heartbeat_tick {
            return Err(Error::InvalidConfig(
                "need 0 < heartbeat_tick < election_tick",
            ));
        }
        if self.max_inflight_msgs == 0 {
            return Err(Error::InvalidConfig("max_inflight_msgs must be positive"));
        }
        if self.coalesce_messages && self.election_tick <= 2 * self.heartbeat_tick {
            // A follower may go two heartbeat intervals without a message.
            return Err(Error::InvalidConfig(
                "coalesce_messages needs election_tick > 2 * heartbeat_tick",
            ));
        }
        if self.read_only_option == ReadOnlyOption::LeaseBased && !self.check_quorum {
            return Err(Error::InvalidConfig(
                "lease-based reads require check_quorum",
            ));
        }
        Ok(())
    }
}

/// Role and leader, for the application (changes are reported in `Ready::soft_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SoftState {
    /// Known leader of the current term, or `NONE`.
    pub leader: NodeId,
    /// This node's role.
    pub role: StateRole,
}

/// The consensus state of one member of one group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Raft<S> {
    pub(crate) id: NodeId,
    pub(crate) term: u64,
    pub(crate) vote: NodeId,
    pub(crate) lead: NodeId,
    pub(crate) role: StateRole,
    pub(crate) log: RaftLog<S>,
    pub(crate) conf: ConfState,
    /// Per-member progress (meaningful on the leader), including this node.
    pub(crate) prs: BTreeMap<NodeId, Progress>,
    /// Votes received in the current (pre-)campaign.
    pub(crate) votes: BTreeMap<NodeId, bool>,
    /// Messages that may be sent at once.
    pub(crate) msgs: Vec<Message>,
    /// Messages that may be sent (or, to self, stepped) only after everything handed out
    /// for persistence so far is durable.
    pub(crate) msgs_after_append: Vec<Message>,
    pub(crate) read_states: Vec<ReadState>,
    pub(crate) read_only: ReadOnly,
    /// Reads that arrived before the leader committed an entry of its term.
    pub(crate) pending_reads: Vec<(Bytes, NodeId)>,
    pub(crate) election_elapsed: u32,
    pub(crate) heartbeat_elapsed: u32,
    pub(crate) randomized_election_timeout: u32,
    pub(crate) election_tick: u32,
    pub(crate) heartbeat_tick: u32,
    pub(crate) check_quorum: bool,
    pub(crate) pre_vote: bool,
    pub(crate) coalesce_messages: bool,
    pub(crate) max_inflight: usize,
    /// Index of the latest conf change the leader appended; no other until applied.
    pub(crate) pending_conf_index: u64,
    /// Target of a leader transfer in progress.
    pub(crate) lead_transferee: NodeId,
    /// Timers stopped until the next message (see `hibernate`).
    pub(crate) hibernating: bool,
    /// Entries at or below it are never sent to a follower: one that needs them gets a
    /// snapshot (`RawNode::set_append_floor`).
    pub(crate) append_floor: u64,
    rng: u64,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl<S: Storage> Raft<S> {
    /// Builds a member from its durable state.
    pub fn new(cfg: &Config, store: S) -> Result<Raft<S>, Error> {
        cfg.validate()?;
        let rs = store.initial_state()?;
        rs.conf_state.validate()?;
        let log = RaftLog::new(store, cfg.max_size_per_msg)?;
        let mut r = Raft {
            id: cfg.id,
            term: 0,
            vote: NONE,
            lead: NONE,
            role: StateRole::Follower,
            log,
            conf: ConfState::default(),
            prs: BTreeMap::new(),
            votes: BTreeMap::new(),
            msgs: Vec::new(),
            msgs_after_append: Vec::new(),
            read_states: Vec::new(),
            read_only: ReadOnly::new(cfg.read_only_option),
            pending_reads: Vec::new(),
            election_elapsed: 0,
            heartbeat_elapsed: 0,
            randomized_election_timeout: cfg.election_tick,
            election_tick: cfg.election_tick,
            heartbeat_tick: cfg.heartbeat_tick,
            check_quorum: cfg.check_quorum,
            pre_vote: cfg.pre_vote,
            coalesce_messages: cfg.coalesce_messages,
            max_inflight: cfg.max_inflight_msgs,
            pending_conf_index: 0,
            append_floor: 0,
            lead_transferee: NONE,
            hibernating: false,
            rng: cfg.seed ^ cfg.id.wrapping_mul(0x2545_F491_4F6C_DD1D),
        };
        r.set_conf(rs.conf_state);
        let hs = rs.hard_state;
        r.term = hs.term;
        r.vote = hs.vote;
        if cfg.applied > 0 {
            let applied = cfg.applied.max(r.log.applied);
            if applied > r.log.committed {
                return Err(Error::InvalidConfig(
                    "applied index beyond the stored commit index",
                ));
            }
            r.log.applying = applied;
            r.log.applied = applied;
        }
        let term = r.term;
        r.become_follower(term, NONE);
        Ok(r)
    }

    // ---------------------------------------------------------------- accessors

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Current term.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// Role.
    pub fn role(&self) -> StateRole {
        self.role
    }

    /// Known leader or `NONE`.
    pub fn leader(&self) -> NodeId {
        self.lead
    }

    /// The log.
    pub fn raft_log(&self) -> &RaftLog<S> {
        &self.log
    }

    /// Commit index.
    pub fn committed(&self) -> u64 {
        self.log.committed
    }

    /// Membership in force.
    pub fn conf_state(&self) -> &ConfState {
        &self.conf
    }

    /// Progress of `id` (leader only meaningful).
    pub fn progress(&self, id: NodeId) -> Option<&Progress> {
        self.prs.get(&id)
    }

    /// Votes received in the current (pre-)campaign.
    pub fn votes(&self) -> &BTreeMap<NodeId, bool> {
        &self.votes
    }

    /// Whether the node stopped its timers.
    pub fn is_hibernating(&self) -> bool {
        self.hibernating
    }

    /// Target of a leader transfer in progress.
    pub fn lead_transferee(&self) -> NodeId {
        self.lead_transferee
    }

    /// Term, vote and commit as they stand (durable once the next ready is persisted).
    pub fn hard_state(&self) -> HardState {
        HardState {
            term: self.term,
            vote: self.vote,
            commit: self.log.committed,
        }
    }

    pub(crate) fn soft_state(&self) -> SoftState {
        SoftState {
            leader: self.lead,
            role: self.role,
        }
    }

    fn promotable(&self) -> bool {
        self.conf.voters.binary_search(&self.id).is_ok()
    }

    fn is_member(&self) -> bool {
        self.conf.contains(self.id)
    }

    // ---------------------------------------------------------------- membership

    fn set_conf(&mut self, conf: ConfState) {
        let next = self.log.last_index().unwrap_or(0) + 1;
        self.prs.retain(|id, _| conf.contains(*id));
        for &v in &conf.voters {
            let cap = self.max_inflight;
            self.prs
                .entry(v)
                .or_insert_with(|| Progress::new(next, cap, false))
                .is_learner = false;
        }
        for &l in &conf.learners {
            let cap = self.max_inflight;
            self.prs
                .entry(l)
                .or_insert_with(|| Progress::new(next, cap, true))
                .is_learner = true;
        }
        self.conf = conf;
    }

    /// The configuration that results from applying `cc` to `conf`.
    pub fn changed_conf(conf: &ConfState, cc: ConfChange) -> ConfState {
        let mut c = conf.clone();
        let n = cc.node();
        c.voters.retain(|&v| v != n);
        c.learners.retain(|&v| v != n);
        match cc {
            ConfChange::AddVoter(_) => c.voters.push(n),
            ConfChange::AddLearner(_) => c.learners.push(n),
            ConfChange::RemoveNode(_) => {}
        }
        c.voters.sort_unstable();
        c.learners.sort_unstable();
        c
    }

    /// Applies a committed conf change; returns the new membership. Deterministic on every
    /// node: changes that make no difference leave the membership as it was.
    pub fn apply_conf_change(&mut self, cc: ConfChange) -> Result<ConfState, Error> {
        let conf = Self::changed_conf(&self.conf, cc);
        if conf.voters.is_empty() {
            // The leader refuses such proposals, so a committed one is a bug upstream;
            // keep the old membership rather than lose the group.
            return Err(Error::Invariant(format!(
                "conf change {cc:?} would remove the last voter"
            )));
        }
        self.set_conf(conf);
        if self.role == StateRole::Leader {
            if !self.promotable() {
                // A leader that is no longer a voter steps down; the remaining voters
                // elect a new leader, whose no-op commits the change if needed.
                let term = self.term;
                self.become_follower(term, NONE);
            } else {
                if self.lead_transferee != NONE && !self.conf.contains(self.lead_transferee) {
                    self.lead_transferee = NONE;
                }
                if self.maybe_commit()? {
                    self.bcast_append()?;
                } else {
                    // New members need the log.
                    let peers: Vec<NodeId> =
                        self.prs.keys().copied().filter(|&p| p != self.id).collect();
                    for p in peers {
                        self.maybe_send_append(p, false)?;
                    }
                }
            }
        } else if matches!(self.role, StateRole::Candidate | StateRole::PreCandidate)
            && !self.promotable()
        {
            let term = self.term;
            self.become_follower(term, NONE);
        }
        Ok(self.conf.clone())
    }

    // ---------------------------------------------------------------- role changes

    fn reset_randomized_timeout(&mut self) {
        let span = u64::from(self.election_tick);
        let jitter = splitmix(&mut self.rng) % span;
        self.randomized_election_timeout = self.election_tick + jitter as u32;
    }

    fn reset(&mut self, term: u64) {
        if self.term != term {
            self.term = term;
            self.vote = NONE;
        }
        self.lead = NONE;
        self.election_elapsed = 0;
        self.heartbeat_elapsed = 0;
        self.reset_randomized_timeout();
        self.lead_transferee = NONE;
        self.votes.clear();
        let next = self.log.last_index().unwrap_or(0) + 1;
        let persisted = self.log.persisted;
        let (id, cap) = (self.id, self.max_inflight);
        for (pid, pr) in self.prs.iter_mut() {
            let learner = pr.is_learner;
            *pr = Progress::new(next, cap, learner);
            if *pid == id {
                pr.matched = persisted;
            }
        }
        self.pending_conf_index = 0;
        self.read_only.reset();
        self.pending_reads.clear();
        self.hibernating = false;
    }

    pub(crate) fn become_follower(&mut self, term: u64, lead: NodeId) {
        self.reset(term);
        self.lead = lead;
        self.role = StateRole::Follower;
    }

    fn become_pre_candidate(&mut self) {
        // Pre-vote changes neither term nor vote (that is its point).
        self.votes.clear();
        self.lead = NONE;
        self.role = StateRole::PreCandidate;
        self.election_elapsed = 0;
        self.reset_randomized_timeout();
    }

    fn become_candidate(&mut self) {
        let term = self.term + 1;
        self.reset(term);
        self.vote = self.id;
        self.role = StateRole::Candidate;
    }

    fn become_leader(&mut self) -> Result<(), Error> {
        let term = self.term;
        self.reset(term);
        self.lead = self.id;
        self.role = StateRole::Leader;
        let id = self.id;
        if let Some(pr) = self.prs.get_mut(&id) {
            pr.become_replicate();
            pr.recent_active = true;
        }
        // No conf change until everything in the log at election time is applied
        // (there may be an unapplied one), and see `propose_entries` for the rest.
        self.pending_conf_index = self.log.last_index()?;
        // The no-op lets the leader commit entries of earlier terms (§5.4.2) and tells it
        // the commit index (needed for ReadIndex).
        self.append_entries(vec![Entry::default()])?;
        Ok(())
    }

    // ---------------------------------------------------------------- sending

    fn send(&mut self, m: Message) {
        if m.needs_persistence() {
            self.msgs_after_append.push(m);
        } else {
            self.msgs.push(m);
        }
    }

    fn new_msg(&self, kind: MessageType, to: NodeId) -> Message {
        Message::new(kind, self.id, to, self.term)
    }

    /// Sends an append (or a snapshot) to `to` if flow control allows; returns whether
    /// something was sent. With `send_if_empty` false, an append without entries is not
    /// sent (used for pipelining).
    pub(crate) fn maybe_send_append(
        &mut self,
        to: NodeId,
        send_if_empty: bool,
    ) -> Result<bool, Error> {
        if to == self.id {
            return Ok(false);
        }
        let Some(pr) = self.prs.get(&to) else {
            return Ok(false);
        };
        if pr.is_paused() {
            return Ok(false);
        }
        let next = pr.next_idx;
        if next <= self.append_floor {
            return self.send_snapshot(to);
        }
        let prev = next - 1;
        let last = self.log.last_index()?;
        let prev_term = self.log.term_opt(prev)?;
        let ents = match prev_term {
            Some(_) => match self.log.slice(next, last + 1, self.log.max_size) {
                Ok(e) => Some(e),
                Err(Error::Storage(StorageError::Compacted { .. })) => None,
                Err(e) => return Err(e),
            },
            None => None,
        };
        let (Some(prev_term), Some(ents)) = (prev_term, ents) else {
            return self.send_snapshot(to);
        };
        if ents.is_empty() && !send_if_empty {
            return Ok(false);
        }
        let n = ents.len();
        let last_sent = prev + n as u64;
        let mut m = self.new_msg(MessageType::Append, to);
        m.index = prev;
        m.log_term = prev_term;
        m.entries = ents;
        m.commit = self.log.committed;
        self.msgs.push(m);
        if let Some(pr) = self.prs.get_mut(&to) {
            pr.sent_entries(last_sent, n);
        }
        Ok(true)
    }

    fn send_snapshot(&mut self, to: NodeId) -> Result<bool, Error> {
        let snap = match self
            .log
            .store
            .snapshot(self.prs.get(&to).map_or(0, |p| p.next_idx))
        {
            Ok(s) => s,
            Err(StorageError::SnapshotTemporarilyUnavailable) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        if snap.meta.index == 0 {
            return Err(Error::Invariant(format!(
                "node {to} needs compacted entries but no snapshot exists"
            )));
        }
        let idx = snap.meta.index;
        let mut m = self.new_msg(MessageType::Snapshot, to);
        m.snapshot = Some(Box::new(snap));
        self.msgs.push(m);
        if let Some(pr) = self.prs.get_mut(&to) {
            pr.become_snapshot(idx);
        }
        Ok(true)
    }

    fn send_append(&mut self, to: NodeId) -> Result<(), Error> {
        self.maybe_send_append(to, true).map(|_| ())
    }

    pub(crate) fn bcast_append(&mut self) -> Result<(), Error> {
        let peers: Vec<NodeId> = self.prs.keys().copied().filter(|&p| p != self.id).collect();
        for p in peers {
            self.send_append(p)?;
        }
        Ok(())
    }

    /// Heartbeats the followers: all of them for a read index being confirmed (it needs
    /// every answer it can get), or, `periodic`, those that need one.
    fn bcast_heartbeat(&mut self, context: Bytes, periodic: bool) {
        let skip_answered = self.coalesce_messages && periodic;
        let peers: Vec<(NodeId, u64)> = self
            .prs
            .iter_mut()
            .filter(|(&p, _)| p != self.id)
            .filter_map(|(&p, pr)| {
                let answered = std::mem::take(&mut pr.answered_since_heartbeat);
                (!(skip_answered && answered)).then_some((p, pr.matched))
            })
            .collect();
        for (p, matched) in peers {
            let mut m = self.new_msg(MessageType::Heartbeat, p);
            // A follower may not have the leader's log up to its commit yet.
            m.commit = matched.min(self.log.committed);
            m.context = context.clone();
            self.msgs.push(m);
        }
    }

    // ---------------------------------------------------------------- time

    /// Advances logical time by one tick.
    pub fn tick(&mut self) -> Result<(), Error> {
        if self.hibernating {
            return Ok(());
        }
        match self.role {
            StateRole::Leader => self.tick_heartbeat(),
            _ => {
                self.election_elapsed = self.election_elapsed.saturating_add(1);
                if self.promotable() && self.election_elapsed >= self.randomized_election_timeout {
                    self.election_elapsed = 0;
                    self.hup(false)?;
                }
                Ok(())
            }
        }
    }

    fn tick_heartbeat(&mut self) -> Result<(), Error> {
        self.heartbeat_elapsed += 1;
        self.election_elapsed += 1;
        if self.election_elapsed >= self.election_tick {
            self.election_elapsed = 0;
            if self.check_quorum && !self.quorum_active() {
                let term = self.term;
                self.become_follower(term, NONE);
                return Ok(());
            }
            // A transfer that did not finish within an election timeout is abandoned.
            self.lead_transferee = NONE;
        }
        if self.heartbeat_elapsed >= self.heartbeat_tick {
            self.heartbeat_elapsed = 0;
            self.bcast_heartbeat(Bytes::new(), true);
        }
        Ok(())
    }

    /// Whether a quorum was heard from since the last check; resets the marks.
    fn quorum_active(&mut self) -> bool {
        let id = self.id;
        let active = quorum::vote_result(&self.conf.voters, |v| {
            Some(v == id || self.prs.get(&v).is_some_and(|p| p.recent_active))
        }) == VoteResult::Won;
        for (pid, pr) in self.prs.iter_mut() {
            pr.recent_active = *pid == id;
        }
        active
    }

    /// Stops this leader's heartbeats (and, through a `Hibernate` message, the followers'
    /// election timers) if the group is idle: everyone has the whole log and it is all
    /// committed. Returns whether it hibernated. Any message, proposal or read wakes it.
    pub fn hibernate(&mut self) -> Result<bool, Error> {
        if self.role != StateRole::Leader
            || self.lead_transferee != NONE
            || !self.read_only.queue.is_empty()
            || !self.pending_reads.is_empty()
        {
            return Ok(false);
        }
        let last = self.log.last_index()?;
        if self.log.committed != last || self.prs.values().any(|p| p.matched != last) {
            return Ok(false);
        }
        let peers: Vec<NodeId> = self.prs.keys().copied().filter(|&p| p != self.id).collect();
        for p in peers {
            let mut m = self.new_msg(MessageType::Hibernate, p);
            m.commit = last;
            self.msgs.push(m);
        }
        self.hibernating = true;
        Ok(true)
    }

    /// Restarts the timers of a hibernating node (the server calls this when it suspects
    /// the leader failed, e.g. the leader's node stopped heartbeating).
    pub fn wake(&mut self) {
        if !self.hibernating {
            return;
        }
        self.hibernating = false;
        self.election_elapsed = 0;
        self.heartbeat_elapsed = 0;
        if self.role == StateRole::Leader {
            // The followers were asleep, not absent: do not count the sleep against them.
            for pr in self.prs.values_mut() {
                pr.recent_active = true;
            }
        }
    }

    // ---------------------------------------------------------------- elections

    /// Starts an election now (as if the election timer fired).
    pub fn campaign(&mut self) -> Result<(), Error> {
        self.wake();
        self.hup(false)
    }

    fn has_unapplied_conf_changes(&self) -> Result<bool, Error> {
        let lo = self.log.applied + 1;
        let hi = self.log.committed + 1;
        if lo >= hi {
            return Ok(false);
        }
        let ents = self.log.slice(lo, hi, u64::MAX)?;
        Ok(ents.iter().any(|e| e.kind == EntryKind::ConfChange))
    }

    fn hup(&mut self, transfer: bool) -> Result<(), Error> {
        if self.role == StateRole::Leader || !self.promotable() {
            return Ok(());
        }
        // A node that may still apply a membership change does not know which
        // configuration it campaigns in; a pending snapshot makes its log unusable.
        if self.log.unstable.snapshot.is_some() || self.has_unapplied_conf_changes()? {
            return Ok(());
        }
        if self.pre_vote && !transfer {
            self.run_campaign(true, false)
        } else {
            self.run_campaign(false, transfer)
        }
    }

    fn run_campaign(&mut self, pre: bool, transfer: bool) -> Result<(), Error> {
        let (kind, resp_kind, term) = if pre {
            self.become_pre_candidate();
            (
                MessageType::RequestPreVote,
                MessageType::RequestPreVoteResponse,
                self.term + 1,
            )
        } else {
            self.become_candidate();
            (
                MessageType::RequestVote,
                MessageType::RequestVoteResponse,
                self.term,
            )
        };
        // Our own vote counts only once the term and vote are durable (a crash before
        // that could let us vote twice in this term).
        let mut own = Message::new(resp_kind, self.id, self.id, term);
        own.reject = false;
        self.msgs_after_append.push(own);
        let last = self.log.last_index()?;
        let last_term = self.log.last_term()?;
        let voters: Vec<NodeId> = self
            .conf
            .voters
            .iter()
            .copied()
            .filter(|&v| v != self.id)
            .collect();
        for v in voters {
            let mut m = Message::new(kind, self.id, v, term);
            m.index = last;
            m.log_term = last_term;
            m.leader_transfer = transfer;
            self.send(m);
        }
        Ok(())
    }

    fn poll(&mut self, from: NodeId, granted: bool) -> VoteResult {
        self.votes.entry(from).or_insert(granted);
        let votes = &self.votes;
        quorum::vote_result(&self.conf.voters, |v| votes.get(&v).copied())
    }

    // ---------------------------------------------------------------- stepping

    fn validate(&self, m: &Message) -> Result<(), Error> {
        if m.to != self.id {
            return Err(Error::Malformed("message addressed to another node"));
        }
        if m.from == NONE || m.from == self.id {
            return Err(Error::Malformed("message from node 0 or from this node"));
        }
        if m.term == 0 {
            return Err(Error::Malformed("message with term 0"));
        }
        // Indexes near u64::MAX cannot come from a real log; refusing them keeps all
        // index arithmetic below free of overflow.
        const INDEX_MAX: u64 = u64::MAX / 2;
        if m.index > INDEX_MAX
            || m.commit > INDEX_MAX
            || m.reject_hint > INDEX_MAX
            || m.term > INDEX_MAX
            || m.snapshot
                .as_ref()
                .is_some_and(|s| s.meta.index > INDEX_MAX)
            || m.entries.len() as u64 > INDEX_MAX - m.index.min(INDEX_MAX)
        {
            return Err(Error::Malformed("index, term or commit out of range"));
        }
        // A member refuses votes and answers from nodes outside its configuration; a
        // node outside its own (just added, not yet caught up) accepts them from anyone.
        // A leader's messages at a term not below ours are taken from anyone: a member
        // that has not applied the change adding that leader (it lags) must still hear
        // it, or it could never catch up while that node leads. Safe: one leader per
        // term, whatever the configurations (single-server changes).
        let from_leader = matches!(
            m.kind,
            MessageType::Append
                | MessageType::Heartbeat
                | MessageType::Snapshot
                | MessageType::TimeoutNow
                | MessageType::Hibernate
                | MessageType::ReadIndexResponse
        );
        if self.is_member() && !self.conf.contains(m.from) && !(from_leader && m.term >= self.term)
        {
            return Err(Error::UnknownPeer {
                kind: m.kind,
                from: m.from,
                to: self.id,
            });
        }
        match m.kind {
            MessageType::Append => {
                let mut prev_term = m.log_term;
                for (k, e) in m.entries.iter().enumerate() {
                    if m.index.checked_add(1 + k as u64) != Some(e.index) {
                        return Err(Error::Malformed(
                            "append entries are not contiguous after index",
                        ));
                    }
                    if e.term < prev_term || e.term > m.term {
                        return Err(Error::Malformed(
                            "append entry terms must rise and not exceed the message term",
                        ));
                    }
                    prev_term = e.term;
                }
                if m.index == 0 && m.log_term != 0 {
                    return Err(Error::Malformed(
                        "append at index 0 with a nonzero log term",
                    ));
                }
            }
            MessageType::Snapshot => {
                let s = m
                    .snapshot
                    .as_ref()
                    .ok_or(Error::Malformed("snapshot message without snapshot"))?;
                s.meta.conf.validate()?;
                if s.meta.index == 0 || s.meta.term == 0 || s.meta.term > m.term {
                    return Err(Error::Malformed(
                        "snapshot with index/term 0 or from a later term",
                    ));
                }
            }
            MessageType::RequestVote | MessageType::RequestPreVote if m.log_term > m.term => {
                return Err(Error::Malformed(
                    "vote request whose last log term exceeds its term",
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// Feeds a message from a peer.
    pub fn step(&mut self, m: Message) -> Result<(), Error> {
        self.validate(&m)?;
        self.step_inner(m)
    }

    /// Steps a message this node sent itself (a durable self-vote or self-append ack).
    pub(crate) fn step_local(&mut self, m: Message) -> Result<(), Error> {
        debug_assert!(m.from == self.id && m.to == self.id);
        self.step_inner(m)
    }

    fn step_inner(&mut self, m: Message) -> Result<(), Error> {
        if self.hibernating && m.kind != MessageType::Hibernate {
            self.wake();
            let campaigning = matches!(
                m.kind,
                MessageType::RequestPreVote | MessageType::RequestVote
            );
            if self.role == StateRole::Leader && campaigning {
                // A peer campaigning while the group sleeps does not know its leader (a
                // restarted node, a follower a client woke) and the lease makes the
                // others ignore it: the next tick tells every follower who leads before
                // the group sleeps again. (Not on answers to the leader's own messages:
                // each heartbeat's answers would then ask for the next.)
                self.heartbeat_elapsed = self.heartbeat_tick;
            }
        }
        if m.term > self.term {
            if matches!(
                m.kind,
                MessageType::RequestVote | MessageType::RequestPreVote
            ) {
                let in_lease = self.check_quorum
                    && self.lead != NONE
                    && self.election_elapsed < self.election_tick;
                if in_lease && !m.leader_transfer {
                    // We heard from a leader recently: a disruptive node must not depose
                    // it (thesis §4.2.3).
                    return Ok(());
                }
            }
            match m.kind {
                MessageType::RequestPreVote => {}
                MessageType::RequestPreVoteResponse if !m.reject => {}
                MessageType::Append
                | MessageType::Heartbeat
                | MessageType::Snapshot
                | MessageType::Hibernate => {
                    self.become_follower(m.term, m.from);
                }
                _ => self.become_follower(m.term, NONE),
            }
        } else if m.term < self.term {
            if (self.check_quorum || self.pre_vote)
                && matches!(
                    m.kind,
                    MessageType::Heartbeat | MessageType::Append | MessageType::Hibernate
                )
            {
                // A stale leader (e.g. after a partition) learns our term and steps down;
                // without this it could never be told, as we ignore its messages. (A
                // `Hibernate` too: a leader that puts its group to sleep while a follower
                // campaigns at a higher term would otherwise sleep on without it.)
                let r = self.new_msg(MessageType::AppendResponse, m.from);
                self.send(r);
            } else if m.kind == MessageType::RequestPreVote {
                let mut r = self.new_msg(MessageType::RequestPreVoteResponse, m.from);
                r.reject = true;
                self.send(r);
            }
            return Ok(());
        }

        match m.kind {
            MessageType::RequestVote | MessageType::RequestPreVote => {
                let pre = m.kind == MessageType::RequestPreVote;
                let can_vote = self.vote == m.from
                    || (self.vote == NONE && self.lead == NONE)
                    || (pre && m.term > self.term);
                let resp_kind = if pre {
                    MessageType::RequestPreVoteResponse
                } else {
                    MessageType::RequestVoteResponse
                };
                if can_vote && self.log.is_up_to_date(m.index, m.log_term)? {
                    // The response carries the requested term so that a pre-candidate
                    // counts it (it has not raised its own term yet).
                    let mut r = Message::new(resp_kind, self.id, m.from, m.term);
                    r.reject = false;
                    self.send(r);
                    if !pre {
                        self.election_elapsed = 0;
                        self.vote = m.from;
                    }
                } else {
                    let mut r = self.new_msg(resp_kind, m.from);
                    r.reject = true;
                    self.send(r);
                }
                Ok(())
            }
            _ => match self.role {
                StateRole::Leader => self.step_leader(m),
                StateRole::Candidate | StateRole::PreCandidate => self.step_candidate(m),
                StateRole::Follower => self.step_follower(m),
            },
        }
    }

    fn step_leader(&mut self, m: Message) -> Result<(), Error> {
        match m.kind {
            MessageType::AppendResponse => self.handle_append_response(m),
            MessageType::HeartbeatResponse => {
                let from = m.from;
                let last = self.log.last_index()?;
                let Some(pr) = self.prs.get_mut(&from) else {
                    return Ok(());
                };
                pr.recent_active = true;
                let read_ack =
                    self.read_only.option == ReadOnlyOption::Safe && !m.context.is_empty();
                // Only the periodic heartbeat's answer resumes a paused probe or frees a
                // full window: read-index heartbeats go out per read, and letting each
                // answer release an append (up to `max_size_per_msg` read from the log)
                // to a follower that lags made the leader's work grow with its reads.
                if !read_ack {
                    pr.probe_sent = false;
                    if pr.state == ProgressState::Replicate && pr.inflights.full() {
                        // Our oldest append may have been lost: free a slot so
                        // replication resumes (the follower rejects or accepts what
                        // follows).
                        pr.inflights.free_first_one();
                    }
                    if pr.matched < last {
                        self.send_append(from)?;
                    }
                }
                if read_ack {
                    self.handle_read_ack(from, &m.context)?;
                }
                Ok(())
            }
            MessageType::ReadIndex => self.handle_read_index(m.context, m.from),
            _ => Ok(()),
        }
    }

    fn handle_append_response(&mut self, m: Message) -> Result<(), Error> {
        let from = m.from;
        let last = self.log.last_index()?;
        if m.index > last && !m.reject {
            return Err(Error::Malformed(
                "append response acknowledges beyond the leader's log",
            ));
        }
        if !self.prs.contains_key(&from) {
            return Ok(());
        }
        if m.reject {
            let mut next_probe = m.reject_hint;
            if m.log_term > 0 {
                next_probe = self.log.find_conflict_by_term(m.reject_hint, m.log_term)?.0;
            }
            let Some(pr) = self.prs.get_mut(&from) else {
                return Ok(());
            };
            pr.recent_active = true;
            pr.answered_since_heartbeat = true;
            if pr.maybe_decr_to(m.index, next_probe) {
                if pr.state == ProgressState::Replicate {
                    pr.become_probe();
                }
                self.send_append(from)?;
            }
            return Ok(());
        }
        let Some(pr) = self.prs.get_mut(&from) else {
            return Ok(());
        };
        pr.recent_active = true;
        pr.answered_since_heartbeat = true;
        let was_paused = pr.is_paused();
        if !pr.maybe_update(m.index) {
            return Ok(());
        }
        match pr.state {
            ProgressState::Probe => pr.become_replicate(),
            ProgressState::Snapshot if pr.matched >= pr.pending_snapshot => {
                pr.become_probe();
                pr.become_replicate();
            }
            ProgressState::Snapshot => {}
            ProgressState::Replicate => pr.inflights.free_to(m.index),
        }
        let matched = pr.matched;
        let committed_before = self.log.committed;
        if self.maybe_commit()? {
            // A membership change that just committed is told at once: a follower it
            // removes gets no more messages from this leader.
            let conf_committed = committed_before < self.pending_conf_index
                && self.pending_conf_index <= self.log.committed;
            if self.coalesce_messages && !conf_committed {
                // The new commit index rides on the next message to each follower;
                // only entries go now.
                let peers: Vec<NodeId> =
                    self.prs.keys().copied().filter(|&p| p != self.id).collect();
                for p in peers {
                    self.maybe_send_append(p, false)?;
                }
            } else {
                self.bcast_append()?;
            }
        } else if was_paused && from != self.id {
            self.send_append(from)?;
        }
        if from != self.id {
            // Pipelining: fill the window while there is something to send.
            while self.maybe_send_append(from, false)? {}
        }
        if from == self.lead_transferee && matched == last {
            let t = self.new_msg(MessageType::TimeoutNow, from);
            self.msgs.push(t);
        }
        Ok(())
    }

    /// Commits what a quorum has, if it is of this term. Returns whether commit moved.
    pub(crate) fn maybe_commit(&mut self) -> Result<bool, Error> {
        let prs = &self.prs;
        let mci =
            quorum::committed_index(&self.conf.voters, |v| prs.get(&v).map_or(0, |p| p.matched));
        let term = self.term;
        let moved = self.log.maybe_commit(mci, term)?;
        if moved && !self.pending_reads.is_empty() {
            let reads = std::mem::take(&mut self.pending_reads);
            for (ctx, from) in reads {
                self.handle_read_index(ctx, from)?;
            }
        }
        Ok(moved)
    }

    fn step_candidate(&mut self, m: Message) -> Result<(), Error> {
        let my_resp = if self.role == StateRole::PreCandidate {
            MessageType::RequestPreVoteResponse
        } else {
            MessageType::RequestVoteResponse
        };
        match m.kind {
            MessageType::Append => {
                self.become_follower(m.term, m.from);
                self.handle_append(m)
            }
            MessageType::Heartbeat => {
                self.become_follower(m.term, m.from);
                self.handle_heartbeat(m)
            }
            MessageType::Snapshot => {
                self.become_follower(m.term, m.from);
                self.handle_snapshot(m)
            }
            // The leader of this term is alive and puts the group to sleep: follow it,
            // and sleep (a pre-candidate that ignored it would keep waking the group).
            MessageType::Hibernate => {
                self.become_follower(m.term, m.from);
                self.handle_hibernate(&m)
            }
            k if k == my_resp => {
                match self.poll(m.from, !m.reject) {
                    VoteResult::Won => {
                        if self.role == StateRole::PreCandidate {
                            self.run_campaign(false, false)?;
                        } else {
                            self.become_leader()?;
                            self.bcast_append()?;
                        }
                    }
                    VoteResult::Lost => {
                        let term = self.term;
                        self.become_follower(term, NONE);
                    }
                    VoteResult::Pending => {}
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn step_follower(&mut self, m: Message) -> Result<(), Error> {
        match m.kind {
            MessageType::Append => {
                self.election_elapsed = 0;
                self.lead = m.from;
                self.handle_append(m)
            }
            MessageType::Heartbeat => {
                self.election_elapsed = 0;
                self.lead = m.from;
                self.handle_heartbeat(m)
            }
            MessageType::Snapshot => {
                self.election_elapsed = 0;
                self.lead = m.from;
                self.handle_snapshot(m)
            }
            MessageType::Hibernate => {
                self.election_elapsed = 0;
                self.lead = m.from;
                self.handle_hibernate(&m)
            }
            MessageType::TimeoutNow => {
                if self.lead == m.from || self.lead == NONE {
                    self.hup(true)?;
                }
                Ok(())
            }
            // Reads are forwarded only by the node that took them (`read_index`); a
            // ReadIndex from a peer that took us for the leader is dropped.
            MessageType::ReadIndex => Ok(()),
            MessageType::ReadIndexResponse => {
                self.read_states.push(ReadState {
                    index: m.index,
                    context: m.context,
                });
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A follower told by its leader that the group sleeps: commit what it says, stop
    /// the timers.
    fn handle_hibernate(&mut self, m: &Message) -> Result<(), Error> {
        let last = self.log.last_index()?;
        self.log.commit_to(m.commit.min(last));
        self.hibernating = true;
        Ok(())
    }

    fn handle_append(&mut self, m: Message) -> Result<(), Error> {
        let mut r = self.new_msg(MessageType::AppendResponse, m.from);
        if m.index < self.log.committed {
            r.index = self.log.committed;
            self.send(r);
            return Ok(());
        }
        match self
            .log
            .maybe_append(m.index, m.log_term, m.commit, &m.entries)?
        {
            Some(last_new) => {
                r.index = last_new;
            }
            None => {
                let (hint_index, hint_term) =
                    self.log.find_conflict_by_term(m.index, m.log_term)?;
                r.index = m.index;
                r.reject = true;
                r.reject_hint = hint_index;
                r.log_term = hint_term;
            }
        }
        self.send(r);
        Ok(())
    }

    fn handle_heartbeat(&mut self, m: Message) -> Result<(), Error> {
        let last = self.log.last_index()?;
        self.log.commit_to(m.commit.min(last));
        let mut r = self.new_msg(MessageType::HeartbeatResponse, m.from);
        r.context = m.context;
        self.send(r);
        Ok(())
    }

    fn handle_snapshot(&mut self, m: Message) -> Result<(), Error> {
        let Some(snap) = m.snapshot else {
            return Err(Error::Malformed("snapshot message without snapshot"));
        };
        let restored = self.restore(*snap)?;
        let mut r = self.new_msg(MessageType::AppendResponse, m.from);
        r.index = if restored {
            self.log.last_index()?
        } else {
            self.log.committed
        };
        self.send(r);
        Ok(())
    }

    fn restore(&mut self, snap: Snapshot) -> Result<bool, Error> {
        if snap.meta.index <= self.log.committed || self.role != StateRole::Follower {
            return Ok(false);
        }
        if self.log.match_term(snap.meta.index, snap.meta.term)? {
            // We already have the entries it covers: just learn they are committed.
            self.log.commit_to(snap.meta.index);
            return Ok(false);
        }
        let conf = snap.meta.conf.clone();
        self.log.restore(snap);
        self.set_conf(conf);
        Ok(true)
    }

    // ---------------------------------------------------------------- proposals

    /// Appends entries on the leader (index and term are assigned here) and queues the
    /// leader's own acknowledgement for when they are durable.
    fn append_entries(&mut self, mut ents: Vec<Entry>) -> Result<u64, Error> {
        let mut idx = self.log.last_index()?;
        for e in ents.iter_mut() {
            idx += 1;
            e.term = self.term;
            e.index = idx;
        }
        let last = self.log.append(&ents)?;
        let mut ack = self.new_msg(MessageType::AppendResponse, self.id);
        ack.index = last;
        self.msgs_after_append.push(ack);
        Ok(last)
    }

    /// Proposes a batch of entries (normal or conf change) on the leader; returns the
    /// index of the last one.
    pub fn propose_entries(&mut self, ents: Vec<Entry>) -> Result<u64, Error> {
        if self.role != StateRole::Leader {
            return Err(Error::ProposalDropped {
                reason: "not the leader",
                leader: self.lead,
            });
        }
        if self.lead_transferee != NONE {
            return Err(Error::ProposalDropped {
                reason: "leader transfer in progress",
                leader: self.lead,
            });
        }
        if ents.is_empty() {
            return Err(Error::ProposalDropped {
                reason: "empty proposal",
                leader: self.lead,
            });
        }
        self.wake();
        let mut conf_changes = 0;
        for e in &ents {
            if e.kind == EntryKind::ConfChange {
                conf_changes += 1;
                let cc = ConfChange::decode(&e.data)?;
                self.check_conf_change(cc)?;
            }
        }
        if conf_changes > 1 {
            return Err(Error::ProposalDropped {
                reason: "one membership change at a time",
                leader: self.lead,
            });
        }
        let last = self.append_entries(ents)?;
        if conf_changes == 1 {
            self.pending_conf_index = last;
        }
        self.bcast_append()?;
        Ok(last)
    }

    /// The single-server change rules (thesis §4.1 and its 2015 erratum): one change
    /// at a time, and only after the leader committed an entry of its own term.
    fn check_conf_change(&self, cc: ConfChange) -> Result<(), Error> {
        let lead = self.lead;
        if self.pending_conf_index > self.log.applied {
            return Err(Error::ProposalDropped {
                reason: "a membership change is not applied yet",
                leader: lead,
            });
        }
        if self.log.term(self.log.committed)? != self.term {
            return Err(Error::ProposalDropped {
                reason: "the leader has not committed an entry of its term yet",
                leader: lead,
            });
        }
        if Self::changed_conf(&self.conf, cc).voters.is_empty() {
            return Err(Error::ProposalDropped {
                reason: "the change would leave no voter",
                leader: lead,
            });
        }
        Ok(())
    }

    // ---------------------------------------------------------------- reads

    /// Requests a linearizable read point for `context` (answered in `read_states`).
    pub fn read_index(&mut self, context: Bytes) -> Result<(), Error> {
        self.wake();
        match self.role {
            StateRole::Leader => self.handle_read_index(context, self.id),
            _ if self.lead != NONE => {
                let mut m = self.new_msg(MessageType::ReadIndex, self.lead);
                m.context = context;
                self.msgs.push(m);
                Ok(())
            }
            _ => Err(Error::ProposalDropped {
                reason: "no leader for read index",
                leader: NONE,
            }),
        }
    }

    fn handle_read_index(&mut self, context: Bytes, from: NodeId) -> Result<(), Error> {
        let committed = self.log.committed;
        if self.log.term(committed)? != self.term {
            // Until an entry of our term commits we do not know the commit index.
            self.pending_reads.push((context, from));
            return Ok(());
        }
        let single = self.conf.voters.len() == 1 && self.promotable();
        if single || self.read_only.option == ReadOnlyOption::LeaseBased {
            self.respond_read(context, from, committed);
            return Ok(());
        }
        let ctx = self.read_only.add(context, from, committed, self.id);
        self.bcast_heartbeat(ctx, false);
        Ok(())
    }

    fn handle_read_ack(&mut self, from: NodeId, ctx: &[u8]) -> Result<(), Error> {
        if self.read_only.recv_ack(from, ctx).is_none() {
            return Ok(());
        }
        let voters = &self.conf.voters;
        let done = self.read_only.advance(|acks| {
            quorum::vote_result(voters, |v| Some(acks.contains(&v))) == VoteResult::Won
        });
        for r in done {
            self.respond_read(r.context, r.from, r.index);
        }
        Ok(())
    }

    fn respond_read(&mut self, context: Bytes, from: NodeId, index: u64) {
        if from == self.id || from == NONE {
            self.read_states.push(ReadState { index, context });
        } else {
            let mut m = self.new_msg(MessageType::ReadIndexResponse, from);
            m.index = index;
            m.context = context;
            self.msgs.push(m);
        }
    }

    // ---------------------------------------------------------------- leader transfer

    /// Starts handing leadership to `target` (a voter): once its log matches, it is
    /// told to campaign at once. Proposals are refused meanwhile; the transfer is
    /// abandoned after an election timeout.
    pub fn transfer_leader(&mut self, target: NodeId) -> Result<(), Error> {
        if self.role != StateRole::Leader {
            return Err(Error::ProposalDropped {
                reason: "not the leader",
                leader: self.lead,
            });
        }
        if target == self.id || self.conf.voters.binary_search(&target).is_err() {
            return Err(Error::ProposalDropped {
                reason: "transfer target is not another voter",
                leader: self.lead,
            });
        }
        self.wake();
        if self.lead_transferee == target {
            return Ok(());
        }
        self.lead_transferee = target;
        self.election_elapsed = 0;
        let last = self.log.last_index()?;
        if self.prs.get(&target).is_some_and(|p| p.matched == last) {
            let m = self.new_msg(MessageType::TimeoutNow, target);
            self.msgs.push(m);
        } else {
            self.send_append(target)?;
        }
        Ok(())
    }

    /// The message a leader whose replica stops serving (its host's work for the group
    /// failed, so it will take no more input) leaves behind: `TimeoutNow` to the target
    /// of a transfer under way, else to the voter most likely to win at once (recently
    /// active, replicated to, longest matched log), which campaigns without waiting. Without it the followers
    /// wait an election timeout, or, if the group sleeps, wait for a client to wake them.
    /// Safe whatever the target's log: the election decides. `None` unless this node
    /// leads and has another voter.
    pub fn abdicate(&self) -> Option<Message> {
        if self.role != StateRole::Leader {
            return None;
        }
        if self.lead_transferee != NONE {
            // A transfer under way: a second target would split the vote.
            return Some(self.new_msg(MessageType::TimeoutNow, self.lead_transferee));
        }
        // Prefer a voter heard from lately and being replicated to (an unreachable one
        // would lose the hand-off), then the longest log.
        let target = self
            .conf
            .voters
            .iter()
            .copied()
            .filter(|&v| v != self.id)
            .max_by_key(|v| {
                self.prs.get(v).map_or((false, false, 0), |p| {
                    (
                        p.recent_active,
                        p.state == ProgressState::Replicate,
                        p.matched,
                    )
                })
            })?;
        Some(self.new_msg(MessageType::TimeoutNow, target))
    }

    // ---------------------------------------------------------------- reports

    /// The transport could not reach `id`: stop streaming to it until it answers.
    pub fn report_unreachable(&mut self, id: NodeId) {
        if self.role != StateRole::Leader {
            return;
        }
        if let Some(pr) = self.prs.get_mut(&id) {
            if pr.state == ProgressState::Replicate {
                pr.become_probe();
            }
        }
    }

    /// The application finished (or failed) sending the snapshot to `id`.
    pub fn report_snapshot(&mut self, id: NodeId, status: SnapshotStatus) {
        if self.role != StateRole::Leader {
            return;
        }
        if let Some(pr) = self.prs.get_mut(&id) {
            if pr.state != ProgressState::Snapshot {
                return;
            }
            if status == SnapshotStatus::Failure {
                pr.pending_snapshot = 0;
            }
            pr.become_probe();
            // Wait for the follower's answer (or the next heartbeat) before probing.
            pr.probe_sent = true;
        }
    }

    /// Checks internal invariants (cheap; the simulation calls it after every step).
    pub fn check_invariants(&self) -> Result<(), Error> {
        self.log.check_invariants()?;
        if self.role == StateRole::Leader && self.lead != self.id {
            return Err(Error::Invariant(format!(
                "leader {} believes the leader is {}",
                self.id, self.lead
            )));
        }
        if self.role == StateRole::Candidate && self.vote != self.id {
            return Err(Error::Invariant(format!(
                "candidate {} voted for {}",
                self.id, self.vote
            )));
        }
        for (id, pr) in &self.prs {
            if self.role == StateRole::Leader && pr.matched >= pr.next_idx {
                return Err(Error::Invariant(format!(
                    "progress of {id}: match {} >= next {}",
                    pr.matched, pr.next_idx
                )));
            }
        }
        Ok(())
    }
}
