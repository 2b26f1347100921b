//! The ParallelRaft-CE node: roles, the candidate stage and sync phase, per-entry
//! acknowledgement and commit, and the apply rule over holes.
//!
//! Words as in docs/parallel-raft.md: an entry's `term` names the block it belongs to, its
//! `date` the last leader or candidate that wrote it; `sync` is the latest term whose
//! block this node holds as handed over, and every block below it is final (committed and
//! equal on every node that synced past it); `final_end` is the last index of those final
//! blocks. Entries above `final_end` all belong to the block of `sync`.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::conflict::ConflictSet;
use crate::error::Error;
use crate::types::{NodeId, NONE};

/// No index or end from a peer may pass this: index arithmetic stays far from overflow,
/// and a peer speaking nonsense gets a clear error instead of a log of 2^64 no-ops.
const MAX_INDEX: u64 = u64::MAX / 4;

/// Which rules the node follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Rules {
    /// ParallelRaft-CE: the safe form.
    #[default]
    Ce,
    /// The paper's rules as published (seed 001 §5.3): a Raft vote check on the last
    /// entry, a merge of every uncommitted entry by highest term, no sync phase, and
    /// commit of any entry by counting. Unsafe (the ghost entry); for tests only.
    #[cfg(feature = "paper-rules")]
    Paper,
}

/// A node's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CeConfig {
    /// This node.
    pub id: NodeId,
    /// Every voter of the group, this node included (sorted, unique, no `NONE`).
    pub voters: Vec<NodeId>,
    /// N: how many earlier entries' conflict sets each entry carries (default 2).
    pub look_behind: usize,
    /// W: the leader proposes index i only if i ≤ commit floor + W, and a replica applies
    /// nothing above its watermark + W (default 256).
    pub max_outstanding: u64,
    /// Which rules to follow.
    pub rules: Rules,
}

impl CeConfig {
    /// A configuration with the default N and W, under the -CE rules.
    pub fn new(id: NodeId, voters: impl IntoIterator<Item = NodeId>) -> CeConfig {
        let mut voters: Vec<NodeId> = voters.into_iter().collect();
        voters.sort_unstable();
        voters.dedup();
        CeConfig {
            id,
            voters,
            look_behind: 2,
            max_outstanding: 256,
            rules: Rules::Ce,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        if self.id == NONE || self.voters.contains(&NONE) {
            return Err(Error::InvalidConfig("node id 0 is reserved"));
        }
        if !self.voters.windows(2).all(|w| w[0] < w[1]) {
            return Err(Error::InvalidConfig("voters must be sorted and unique"));
        }
        if self.voters.binary_search(&self.id).is_err() {
            return Err(Error::InvalidConfig("a node must be one of the voters"));
        }
        if self.max_outstanding == 0 || self.max_outstanding > 1 << 20 {
            return Err(Error::InvalidConfig(
                "max_outstanding must be between 1 and 2^20",
            ));
        }
        Ok(())
    }
}

/// One entry of a sparse log.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CeEntry {
    /// Position in the log.
    pub index: u64,
    /// The block the entry belongs to: the term of the leader that proposed it (a no-op
    /// filled in by a candidate takes the term of the block it fills).
    pub term: u64,
    /// The term of the last leader or candidate that wrote this copy.
    pub date: u64,
    /// The command, opaque to the core (empty: a no-op).
    pub data: Bytes,
    /// What the command touches.
    pub conflicts: ConflictSet,
    /// The conflict sets of the entries at `index - 1`, `index - 2`, … (at most N), as the
    /// leader that proposed this entry held them.
    pub look_behind: Vec<ConflictSet>,
}

impl CeEntry {
    fn noop(index: u64, term: u64, date: u64) -> CeEntry {
        CeEntry {
            index,
            term,
            date,
            data: Bytes::new(),
            conflicts: ConflictSet::none(),
            look_behind: Vec::new(),
        }
    }
}

/// Where a candidate fixed the end of a block: by the candidate of term `date`, at `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EndPoint {
    /// The candidate's term.
    pub date: u64,
    /// The block's last index.
    pub end: u64,
}

/// What must be durable before the messages of a ready leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CeHardState {
    /// Latest term seen.
    pub term: u64,
    /// Vote cast in `term` (`NONE` if none).
    pub vote: NodeId,
    /// Latest term whose block this node holds as handed over.
    pub sync: u64,
    /// Last index of the final blocks (those below `sync`).
    pub final_end: u64,
    /// The end of the block of `sync`, once a candidate fixed it.
    pub end_point: Option<EndPoint>,
}

/// A node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CeRole {
    /// Follows a leader, or waits for one.
    #[default]
    Follower,
    /// Asks for votes.
    Candidate,
    /// Won the vote; fixing the block of its `sync` and syncing a quorum to it.
    LeaderCandidate,
    /// Serves: appends, commits and applies entries of its term.
    Leader,
}

/// A message between nodes of one group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CeMessage {
    /// Sender.
    pub from: NodeId,
    /// Receiver.
    pub to: NodeId,
    /// The sender's term.
    pub term: u64,
    /// What it says.
    pub body: CeBody,
}

/// The kinds of messages.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CeBody {
    /// A candidate asks for a vote.
    Vote {
        /// The candidate's `sync`.
        sync: u64,
        /// Term and index of the candidate's last entry (the paper's vote check).
        last_term: u64,
        /// See `last_term`.
        last_index: u64,
    },
    /// A voter answers; a granting voter at the candidate's `sync` sends what it holds of
    /// that block (each copy with whether the voter knows it committed) and its end point.
    VoteResponse {
        /// Whether the vote is granted.
        granted: bool,
        /// The voter's `sync`.
        sync: u64,
        /// The voter's copies of the candidate's `sync` block.
        entries: Vec<(CeEntry, bool)>,
        /// The voter's end point for that block.
        end_point: Option<EndPoint>,
    },
    /// A leader candidate or leader hands over block `sync`: every index of
    /// `base + 1 ..= end`, dense; the receiver erases everything above `end`.
    SyncBlock {
        /// The block's term (the receiver's `sync` must be the same).
        sync: u64,
        /// The end of the final blocks before it.
        base: u64,
        /// The block's last index.
        end: u64,
        /// The block.
        entries: Vec<CeEntry>,
    },
    /// The answer to `SyncBlock`, with the receiver's `sync`.
    SyncBlockResponse {
        /// Whether the block was taken.
        granted: bool,
        /// The receiver's `sync`.
        sync: u64,
    },
    /// The block the receiver holds is final; move to block `sync`.
    UpdateSync {
        /// The next block's term (the sender's term once the sender may lead).
        sync: u64,
    },
    /// The answer to `UpdateSync`, with the receiver's `sync`.
    UpdateSyncResponse {
        /// Whether the receiver moved.
        granted: bool,
        /// The receiver's `sync`.
        sync: u64,
    },
    /// Entries of the leader's term (any subset, holes allowed) and what is committed:
    /// every index up to `floor`, and `committed` above it.
    Append {
        /// Entries to store.
        entries: Vec<CeEntry>,
        /// Every index up to this one is committed.
        floor: u64,
        /// Committed indexes above `floor`.
        committed: Vec<u64>,
    },
    /// The indexes the follower holds durably, from an `Append`.
    AppendResponse {
        /// Acknowledged indexes.
        acked: Vec<u64>,
    },
}

/// What the caller does next, in this order: make `hard_state`, `erase_above` and
/// `entries` durable (erase first, then write each entry at its index); then send
/// `messages`; then apply `apply` in the order given (each entry after every entry it
/// conflicts with that comes before it in the log).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CeReady {
    /// The hard state to persist, if it changed.
    pub hard_state: Option<CeHardState>,
    /// Erase every index above this one.
    pub erase_above: Option<u64>,
    /// Entries to write, each replacing whatever is at its index.
    pub entries: Vec<CeEntry>,
    /// Messages to send once the above is durable.
    pub messages: Vec<CeMessage>,
    /// Committed entries to apply now.
    pub apply: Vec<CeEntry>,
}

impl CeReady {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.hard_state.is_none()
            && self.erase_above.is_none()
            && self.entries.is_empty()
            && self.messages.is_empty()
            && self.apply.is_empty()
    }
}

/// A voter's answer, kept by a candidate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct VoteAnswer {
    granted: bool,
    entries: Vec<(CeEntry, bool)>,
    end_point: Option<EndPoint>,
}

/// A leader candidate's or leader's view of one follower.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
struct PeerSync {
    /// The follower's `sync` as last reported.
    sync: Option<u64>,
    /// It took the block this node fixed (the block of `synced_from`).
    holds_block: bool,
    /// It is at this node's term: appends may go to it.
    synced: bool,
    /// The last block sent to it (a refusal of that same block waits for the heartbeat
    /// rather than ping-ponging).
    sent_block: Option<u64>,
    /// Indexes of the current block it acknowledged.
    acked: BTreeSet<u64>,
}

/// One replica of a ParallelRaft-CE group (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CeNode {
    cfg: CeConfig,
    hs: CeHardState,
    role: CeRole,
    leader: NodeId,
    log: BTreeMap<u64, CeEntry>,
    /// Every index up to here is committed (never below `final_end` under -CE).
    floor: u64,
    /// Committed indexes above `floor`.
    committed: BTreeSet<u64>,
    /// Watermark A: every index up to here is applied.
    applied: u64,
    /// Applied set S: indexes above `applied` applied out of order.
    applied_above: BTreeSet<u64>,
    /// Candidate: the answers so far (its own included).
    votes: BTreeMap<NodeId, VoteAnswer>,
    /// Leader candidate and leader: the block term it synced (its `sync` when it won).
    synced_from: u64,
    /// Leader candidate: `UpdateSync` went out to the holders.
    update_sent: bool,
    peers: BTreeMap<NodeId, PeerSync>,
    /// Leader: who holds each uncommitted index of its term (itself included).
    acks: BTreeMap<u64, BTreeSet<NodeId>>,
    /// Paper rules: the indexes whose copy this node acknowledged to the leader of its
    /// term. Only those take that leader's commit (a copy from an older term at a
    /// committed index is not the committed entry).
    from_leader: BTreeSet<u64>,
    hs_dirty: bool,
    pending: CeReady,
}

impl CeNode {
    /// A node from its durable state: the hard state, the entries it holds, and the
    /// application's applied watermark and applied set (persisted with the applied
    /// state, so an entry in either is never handed out again).
    pub fn restart(
        cfg: CeConfig,
        hs: CeHardState,
        entries: impl IntoIterator<Item = CeEntry>,
        applied: u64,
        applied_above: BTreeSet<u64>,
    ) -> Result<CeNode, Error> {
        cfg.validate()?;
        let mut log = BTreeMap::new();
        for e in entries {
            if e.index == 0 || e.date > hs.term || e.term > e.date {
                return Err(Error::Invariant(format!(
                    "entry at {} of term {} and date {} under hard state term {}",
                    e.index, e.term, e.date, hs.term
                )));
            }
            if cfg.rules == Rules::Ce && e.index > hs.final_end && e.term != hs.sync {
                return Err(Error::Invariant(format!(
                    "entry at {} of term {} above the final blocks (end {}) of a node at sync {}",
                    e.index, e.term, hs.final_end, hs.sync
                )));
            }
            log.insert(e.index, e);
        }
        if let Some(&i) = applied_above.iter().next() {
            if i <= applied + 1 {
                return Err(Error::Invariant(format!(
                    "applied set starts at {i}, at or below watermark {applied} + 1"
                )));
            }
        }
        let mut node = CeNode {
            cfg,
            hs,
            role: CeRole::Follower,
            leader: NONE,
            log,
            floor: hs.final_end.max(applied),
            // Applied means committed.
            committed: applied_above.clone(),
            applied,
            applied_above,
            votes: BTreeMap::new(),
            synced_from: 0,
            update_sent: false,
            peers: BTreeMap::new(),
            acks: BTreeMap::new(),
            from_leader: BTreeSet::new(),
            hs_dirty: false,
            pending: CeReady::default(),
        };
        node.advance_floor();
        Ok(node)
    }

    /// A new node with an empty log.
    pub fn new(cfg: CeConfig) -> Result<CeNode, Error> {
        CeNode::restart(cfg, CeHardState::default(), [], 0, BTreeSet::new())
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    /// The current role.
    pub fn role(&self) -> CeRole {
        self.role
    }

    /// The leader (or leader candidate) of the current term, if known.
    pub fn leader(&self) -> NodeId {
        self.leader
    }

    /// The hard state as it stands (persisted once the pending ready is).
    pub fn hard_state(&self) -> CeHardState {
        self.hs
    }

    /// The entries held.
    pub fn log(&self) -> &BTreeMap<u64, CeEntry> {
        &self.log
    }

    /// The applied watermark and the applied set above it.
    pub fn applied(&self) -> (u64, &BTreeSet<u64>) {
        (self.applied, &self.applied_above)
    }

    /// Whether index `i` is known committed here.
    pub fn is_committed(&self, i: u64) -> bool {
        i <= self.floor || self.committed.contains(&i)
    }

    /// Takes what is to be done (see [`CeReady`]).
    pub fn ready(&mut self) -> CeReady {
        let mut rd = std::mem::take(&mut self.pending);
        if std::mem::take(&mut self.hs_dirty) {
            rd.hard_state = Some(self.hs);
        }
        rd
    }

    /// Starts an election in the next term.
    pub fn campaign(&mut self) {
        self.hs.term += 1;
        self.hs.vote = self.cfg.id;
        self.hs_dirty = true;
        self.from_leader.clear();
        self.role = CeRole::Candidate;
        self.leader = NONE;
        self.reset_leader_state();
        let own = VoteAnswer {
            granted: true,
            entries: self.gather(self.hs.sync),
            end_point: self.hs.end_point,
        };
        self.votes.insert(self.cfg.id, own);
        let (last_term, last_index) = self.last();
        for to in self.others() {
            self.send(
                to,
                CeBody::Vote {
                    sync: self.hs.sync,
                    last_term,
                    last_index,
                },
            );
        }
        self.maybe_win();
        self.maybe_apply();
    }

    /// Resends what may have been lost: votes not yet answered, blocks and syncs not yet
    /// taken, entries not yet acknowledged, and the commit. Called on each heartbeat tick.
    pub fn heartbeat(&mut self) {
        match self.role {
            CeRole::Follower => {}
            CeRole::Candidate => {
                let (last_term, last_index) = self.last();
                for to in self.others() {
                    if !self.votes.contains_key(&to) {
                        self.send(
                            to,
                            CeBody::Vote {
                                sync: self.hs.sync,
                                last_term,
                                last_index,
                            },
                        );
                    }
                }
            }
            CeRole::LeaderCandidate | CeRole::Leader => {
                for to in self.others() {
                    let Some(p) = self.peers.get(&to).cloned() else {
                        continue;
                    };
                    if p.synced && self.role == CeRole::Leader {
                        self.send_commit(to);
                        let missing: Vec<CeEntry> = self
                            .log
                            .range(self.current_block_start()..)
                            .filter(|(i, _)| !p.acked.contains(i))
                            .map(|(_, e)| e.clone())
                            .collect();
                        for e in missing {
                            self.send_entries(to, vec![e]);
                        }
                    } else if p.synced {
                        // At our term already: nothing to send until we lead.
                    } else if p.holds_block && (self.role == CeRole::Leader || self.update_sent) {
                        self.send(to, CeBody::UpdateSync { sync: self.hs.term });
                    } else {
                        let r = p.sync.unwrap_or(self.synced_from).min(self.synced_from);
                        self.send_block(to, r);
                    }
                }
            }
        }
        self.maybe_apply();
    }

    /// Proposes a command with its conflict set; returns its index.
    pub fn propose(&mut self, data: Bytes, conflicts: ConflictSet) -> Result<u64, Error> {
        if self.role != CeRole::Leader {
            return Err(Error::ProposalDropped {
                reason: "not the leader",
                leader: self.leader,
            });
        }
        let index = self.last_index() + 1;
        if index > self.floor + self.cfg.max_outstanding {
            return Err(Error::ProposalDropped {
                reason: "too many entries outstanding",
                leader: self.cfg.id,
            });
        }
        let mut look_behind = Vec::with_capacity(self.cfg.look_behind);
        for k in 1..=self.cfg.look_behind as u64 {
            let Some(j) = index.checked_sub(k).filter(|&j| j > 0) else {
                break;
            };
            // The leader holds every index of its log; a missing one was compacted away,
            // so it is applied everywhere that matters, but say "everything" to be safe.
            look_behind.push(
                self.log
                    .get(&j)
                    .map_or(ConflictSet::All, |e| e.conflicts.clone()),
            );
        }
        let t = self.hs.term;
        let e = CeEntry {
            index,
            term: t,
            date: t,
            data,
            conflicts,
            look_behind,
        };
        self.write(e.clone());
        self.acks.insert(index, BTreeSet::from([self.cfg.id]));
        for to in self.others() {
            if self.peers.get(&to).is_some_and(|p| p.synced) {
                self.send_entries(to, vec![e.clone()]);
            }
        }
        self.maybe_commit();
        self.maybe_apply();
        Ok(index)
    }

    /// Handles a message from a peer.
    pub fn step(&mut self, m: CeMessage) -> Result<(), Error> {
        if m.to != self.cfg.id {
            return Err(Error::Malformed("message addressed to another node"));
        }
        if m.from == self.cfg.id || self.cfg.voters.binary_search(&m.from).is_err() {
            return Err(Error::Malformed("message from a node outside the group"));
        }
        if m.term > self.hs.term {
            let leader = match m.body {
                CeBody::SyncBlock { .. } | CeBody::UpdateSync { .. } | CeBody::Append { .. } => {
                    m.from
                }
                _ => NONE,
            };
            self.become_follower(m.term, leader);
        }
        if m.term < self.hs.term {
            // A stale sender learns the term from our next message to it.
            return Ok(());
        }
        let from = m.from;
        match m.body {
            CeBody::Vote {
                sync,
                last_term,
                last_index,
            } => self.on_vote(from, sync, last_term, last_index),
            CeBody::VoteResponse {
                granted,
                sync,
                entries,
                end_point,
            } => {
                if entries
                    .iter()
                    .any(|(e, _)| e.index == 0 || e.index > MAX_INDEX)
                    || end_point.is_some_and(|ep| ep.end > MAX_INDEX)
                {
                    return Err(Error::Malformed("vote answer with an index out of range"));
                }
                // A voter synced past our block must not count (it holds nothing of it).
                let granted = granted && (self.cfg.rules != Rules::Ce || sync <= self.hs.sync);
                if self.role == CeRole::Candidate && !self.votes.contains_key(&from) {
                    self.votes.insert(
                        from,
                        VoteAnswer {
                            granted,
                            entries,
                            end_point,
                        },
                    );
                    self.maybe_win();
                }
            }
            CeBody::SyncBlock {
                sync,
                base,
                end,
                entries,
            } => {
                self.follow(from)?;
                self.on_sync_block(from, m.term, sync, base, end, entries)?;
            }
            CeBody::SyncBlockResponse { granted, sync } => {
                self.on_sync_block_response(from, granted, sync)
            }
            CeBody::UpdateSync { sync } => {
                self.follow(from)?;
                self.on_update_sync(from, m.term, sync);
            }
            CeBody::UpdateSyncResponse { granted, sync } => {
                self.on_update_sync_response(from, granted, sync)
            }
            CeBody::Append {
                entries,
                floor,
                committed,
            } => {
                self.follow(from)?;
                self.on_append(from, m.term, entries, floor, committed)?;
            }
            CeBody::AppendResponse { acked } => self.on_append_response(from, acked),
        }
        self.maybe_apply();
        Ok(())
    }

    // ---- elections -------------------------------------------------------------------

    fn on_vote(&mut self, from: NodeId, sync: u64, last_term: u64, last_index: u64) {
        let free = self.hs.vote == NONE || self.hs.vote == from;
        // (The candidate's last entry matters only to the paper's vote check.)
        let candidate_last = (last_term, last_index);
        let up_to_date = match self.cfg.rules {
            Rules::Ce => sync >= self.hs.sync,
            #[cfg(feature = "paper-rules")]
            Rules::Paper => candidate_last >= self.last(),
        };
        #[cfg(not(feature = "paper-rules"))]
        let _ = candidate_last;
        let granted = free && up_to_date && self.role == CeRole::Follower;
        if granted && self.hs.vote != from {
            self.hs.vote = from;
            self.hs_dirty = true;
        }
        let (entries, end_point) = if granted {
            let ep = match self.cfg.rules {
                Rules::Ce => self.hs.end_point.filter(|_| self.hs.sync == sync),
                #[cfg(feature = "paper-rules")]
                Rules::Paper => None,
            };
            (self.gather(sync), ep)
        } else {
            (Vec::new(), None)
        };
        self.send(
            from,
            CeBody::VoteResponse {
                granted,
                sync: self.hs.sync,
                entries,
                end_point,
            },
        );
    }

    /// What a voter hands a candidate at `sync`: under -CE its copies of block `sync`
    /// (nothing if it is at another sync: blocks below its own are final, and a voter
    /// never holds entries of a later block); under the paper's rules every entry it
    /// holds.
    fn gather(&self, sync: u64) -> Vec<(CeEntry, bool)> {
        let from = match self.cfg.rules {
            Rules::Ce if self.hs.sync != sync => return Vec::new(),
            Rules::Ce => self.hs.final_end,
            // Everything: the candidate may know less committed than this voter does.
            #[cfg(feature = "paper-rules")]
            Rules::Paper => 0,
        };
        self.log
            .range(from + 1..)
            .map(|(&i, e)| (e.clone(), self.is_committed(i)))
            .collect()
    }

    fn maybe_win(&mut self) {
        if self.role != CeRole::Candidate {
            return;
        }
        let granted = self.votes.values().filter(|a| a.granted).count();
        if granted < self.quorum() {
            return;
        }
        match self.cfg.rules {
            Rules::Ce => self.candidate_stage(),
            #[cfg(feature = "paper-rules")]
            Rules::Paper => self.paper_merge(),
        }
    }

    /// -CE: fix the end and content of block `sync` from the vote quorum, then start the
    /// sync phase.
    fn candidate_stage(&mut self) {
        let t = self.hs.term;
        let s = self.hs.sync;
        let base = self.hs.final_end;
        let answers: Vec<VoteAnswer> = std::mem::take(&mut self.votes)
            .into_values()
            .filter(|a| a.granted)
            .collect();
        let end = answers
            .iter()
            .filter_map(|a| a.end_point)
            .max_by_key(|ep| ep.date)
            .map(|ep| ep.end)
            .or_else(|| {
                answers
                    .iter()
                    .flat_map(|a| a.entries.iter())
                    .filter(|(e, _)| e.term == s)
                    .map(|(e, _)| e.index)
                    .max()
            })
            .unwrap_or(base)
            .max(base);
        // Per index: a copy some voter knows committed, else the latest date, else a no-op.
        let mut chosen = best_copies(
            &answers,
            |e| e.term == s && e.index > base && e.index <= end,
            |e| e.date,
        );
        self.erase_above(end);
        for i in base + 1..=end {
            if self.is_committed(i) && self.log.contains_key(&i) {
                continue;
            }
            let mut e = chosen
                .remove(&i)
                .map_or_else(|| CeEntry::noop(i, s, t), |(_, e)| e);
            e.date = t;
            self.write(e);
        }
        self.hs.end_point = Some(EndPoint { date: t, end });
        self.hs_dirty = true;
        self.role = CeRole::LeaderCandidate;
        self.leader = self.cfg.id;
        self.synced_from = s;
        self.update_sent = false;
        self.peers = self
            .others()
            .into_iter()
            .map(|p| (p, PeerSync::default()))
            .collect();
        for to in self.others() {
            self.send_block(to, s);
        }
        self.maybe_update_sync();
    }

    /// The paper's merge: every index above the commit floor up to the highest seen gets
    /// a committed copy, else the copy of the highest term, else a no-op; the node leads
    /// at once.
    #[cfg(feature = "paper-rules")]
    fn paper_merge(&mut self) {
        let t = self.hs.term;
        let answers: Vec<VoteAnswer> = std::mem::take(&mut self.votes)
            .into_values()
            .filter(|a| a.granted)
            .collect();
        let floor = self.floor;
        let mut chosen = best_copies(&answers, |e| e.index > floor, |e| e.term);
        let top = chosen.keys().next_back().copied().unwrap_or(self.floor);
        for i in self.floor + 1..=top {
            let e = chosen
                .remove(&i)
                .map_or_else(|| CeEntry::noop(i, t, t), |(_, e)| e);
            if self.log.get(&i) != Some(&e) {
                self.write(e);
            }
        }
        self.role = CeRole::Leader;
        self.leader = self.cfg.id;
        self.acks = (self.floor + 1..=top)
            .filter(|i| !self.committed.contains(i))
            .map(|i| (i, BTreeSet::from([self.cfg.id])))
            .collect();
        self.peers = self
            .others()
            .into_iter()
            .map(|p| {
                (
                    p,
                    PeerSync {
                        synced: true,
                        ..PeerSync::default()
                    },
                )
            })
            .collect();
        for to in self.others() {
            let ents: Vec<CeEntry> = self
                .log
                .range(self.floor + 1..)
                .map(|(_, e)| e.clone())
                .collect();
            self.send_entries(to, ents);
        }
    }

    // ---- the sync phase --------------------------------------------------------------

    /// Sends block `r` of this node's log to `to`.
    fn send_block(&mut self, to: NodeId, r: u64) {
        if let Some(p) = self.peers.get_mut(&to) {
            p.sent_block = Some(r);
        }
        let (base, end) = self.block_bounds(r);
        let entries: Vec<CeEntry> = if end > base {
            self.log
                .range(base + 1..=end)
                .map(|(_, e)| e.clone())
                .collect()
        } else {
            Vec::new()
        };
        self.send(
            to,
            CeBody::SyncBlock {
                sync: r,
                base,
                end,
                entries,
            },
        );
    }

    /// Where block `r` lies in this node's log: `(base, end]`. Blocks are dense and in
    /// term order, so block r starts after the last entry of an earlier term.
    fn block_bounds(&self, r: u64) -> (u64, u64) {
        if r == self.synced_from && self.role == CeRole::LeaderCandidate {
            let end = self.hs.end_point.map_or(self.hs.final_end, |ep| ep.end);
            return (self.hs.final_end, end);
        }
        let mut base = 0;
        let mut end = None;
        for (&i, e) in &self.log {
            if e.term < r {
                base = i;
            } else if e.term == r {
                end = Some(i);
            } else {
                break;
            }
        }
        (base, end.unwrap_or(base))
    }

    /// The term of the next block after `r` (a term that has entries), or `synced_from`.
    fn next_block_term(&self, r: u64) -> u64 {
        self.log
            .values()
            .map(|e| e.term)
            .find(|&k| k > r)
            .map_or(self.synced_from, |k| k.min(self.synced_from))
    }

    fn on_sync_block(
        &mut self,
        from: NodeId,
        term: u64,
        sync: u64,
        base: u64,
        end: u64,
        entries: Vec<CeEntry>,
    ) -> Result<(), Error> {
        if self.cfg.rules != Rules::Ce {
            return Err(Error::Malformed("sync block under the paper's rules"));
        }
        let dense = end >= base
            && end <= MAX_INDEX
            && entries.len() as u64 == end - base
            && entries
                .iter()
                .zip(base + 1..)
                .all(|(e, i)| e.index == i && e.term == sync && e.date <= term);
        if !dense {
            return Err(Error::Malformed("sync block not dense over its range"));
        }
        let granted = sync == self.hs.sync && base == self.hs.final_end;
        if granted {
            // Commit knowledge holds only for copies the block leaves unchanged (it
            // replaces nothing committed unless a candidate erred; then say nothing).
            let kept: BTreeSet<u64> = self
                .committed
                .iter()
                .copied()
                .filter(|i| {
                    let new = i
                        .checked_sub(base + 1)
                        .and_then(|k| entries.get(k as usize));
                    match (self.log.get(i), new) {
                        (Some(old), Some(new)) => old.term == new.term && old.data == new.data,
                        _ => false,
                    }
                })
                .collect();
            self.committed = kept;
            self.erase_above(base);
            for e in entries {
                self.write(e);
            }
            self.hs.end_point = Some(EndPoint { date: term, end });
            self.hs_dirty = true;
        }
        self.send(
            from,
            CeBody::SyncBlockResponse {
                granted,
                sync: self.hs.sync,
            },
        );
        Ok(())
    }

    fn on_sync_block_response(&mut self, from: NodeId, granted: bool, x: u64) {
        if !matches!(self.role, CeRole::LeaderCandidate | CeRole::Leader) {
            return;
        }
        let s = self.synced_from;
        let t = self.hs.term;
        let leading = self.role == CeRole::Leader;
        let Some(p) = self.peers.get_mut(&from) else {
            return;
        };
        p.sync = Some(x);
        if x == t {
            p.synced = true;
            return;
        }
        if x > s {
            // Between our block and our term: nothing of its block exists, but it cannot
            // take ours either; it syncs with a later leader.
            return;
        }
        if !granted {
            if p.sent_block != Some(x) {
                self.send_block(from, x);
            }
        } else if x < s {
            let next = self.next_block_term(x);
            self.send(from, CeBody::UpdateSync { sync: next });
        } else {
            p.holds_block = true;
            if leading || self.update_sent {
                self.send(from, CeBody::UpdateSync { sync: t });
            } else {
                self.maybe_update_sync();
            }
        }
    }

    /// Leader candidate: once a quorum holds the block, tell the holders it is final.
    fn maybe_update_sync(&mut self) {
        if self.role != CeRole::LeaderCandidate || self.update_sent {
            return;
        }
        let holders = 1 + self.peers.values().filter(|p| p.holds_block).count();
        if holders < self.quorum() {
            return;
        }
        self.update_sent = true;
        let to: Vec<NodeId> = self
            .peers
            .iter()
            .filter(|(_, p)| p.holds_block)
            .map(|(&id, _)| id)
            .collect();
        for id in to {
            self.send(id, CeBody::UpdateSync { sync: self.hs.term });
        }
        self.maybe_lead();
    }

    fn on_update_sync(&mut self, from: NodeId, term: u64, sync: u64) {
        let granted = sync > self.hs.sync
            && sync <= term
            && self.hs.end_point.is_some_and(|ep| ep.date == term);
        if granted {
            if let Some(ep) = self.hs.end_point {
                // The block we hold is final: committed up to its end.
                self.hs.final_end = ep.end;
                self.floor = self.floor.max(ep.end);
                self.advance_floor();
            }
            self.hs.sync = sync;
            self.hs.end_point = None;
            self.hs_dirty = true;
        }
        self.send(
            from,
            CeBody::UpdateSyncResponse {
                granted,
                sync: self.hs.sync,
            },
        );
    }

    fn on_update_sync_response(&mut self, from: NodeId, granted: bool, y: u64) {
        if !matches!(self.role, CeRole::LeaderCandidate | CeRole::Leader) {
            return;
        }
        let t = self.hs.term;
        let s = self.synced_from;
        let Some(p) = self.peers.get_mut(&from) else {
            return;
        };
        p.sync = Some(y);
        if y == t {
            if !p.synced {
                p.synced = true;
                if self.role == CeRole::Leader {
                    // Everything of our block, and the commit.
                    let ents: Vec<CeEntry> = self
                        .log
                        .range(self.current_block_start()..)
                        .map(|(_, e)| e.clone())
                        .collect();
                    self.send_entries(from, ents);
                }
            }
            self.maybe_lead();
        } else if y <= s && (granted || !p.holds_block) {
            self.send_block(from, y);
        }
    }

    /// Leader candidate: once a quorum is at this term, lead.
    fn maybe_lead(&mut self) {
        if self.role != CeRole::LeaderCandidate || !self.update_sent {
            return;
        }
        let synced = 1 + self.peers.values().filter(|p| p.synced).count();
        if synced < self.quorum() {
            return;
        }
        let end = self.hs.end_point.map_or(self.hs.final_end, |ep| ep.end);
        self.hs.final_end = end;
        self.hs.sync = self.hs.term;
        self.hs.end_point = None;
        self.hs_dirty = true;
        self.floor = self.floor.max(end);
        self.advance_floor();
        self.role = CeRole::Leader;
    }

    // ---- the current term ------------------------------------------------------------

    fn on_append(
        &mut self,
        from: NodeId,
        term: u64,
        entries: Vec<CeEntry>,
        floor: u64,
        committed: Vec<u64>,
    ) -> Result<(), Error> {
        if floor > MAX_INDEX || committed.iter().any(|&i| i > MAX_INDEX) {
            return Err(Error::Malformed("append with a commit index out of range"));
        }
        if self.cfg.rules == Rules::Ce && self.hs.sync != term {
            // Not synced to this leader's term yet: it syncs us first.
            return Ok(());
        }
        let mut acked = Vec::new();
        for e in entries {
            let fits = match self.cfg.rules {
                Rules::Ce => e.term == term && e.date == term && e.index > self.hs.final_end,
                #[cfg(feature = "paper-rules")]
                Rules::Paper => e.term <= term && e.index > 0,
            };
            if !fits || e.index > MAX_INDEX {
                return Err(Error::Malformed(
                    "append of an entry outside the leader's block",
                ));
            }
            let i = e.index;
            if !(self.is_committed(i) && self.log.contains_key(&i)) && self.log.get(&i) != Some(&e)
            {
                self.write(e);
            }
            acked.push(i);
        }
        match self.cfg.rules {
            Rules::Ce => {
                // Synced to this term: every copy above the final blocks is the leader's.
                if floor > self.floor {
                    self.floor = floor;
                    self.committed.retain(|&i| i > floor);
                }
                self.committed
                    .extend(committed.into_iter().filter(|&i| i > self.floor));
            }
            #[cfg(feature = "paper-rules")]
            Rules::Paper => {
                self.from_leader.extend(acked.iter().copied());
                let mine: Vec<u64> = (self.floor + 1..=floor)
                    .chain(committed)
                    .filter(|i| self.from_leader.contains(i))
                    .collect();
                self.committed.extend(mine);
            }
        }
        self.advance_floor();
        if !acked.is_empty() {
            self.send(from, CeBody::AppendResponse { acked });
        }
        Ok(())
    }

    fn on_append_response(&mut self, from: NodeId, acked: Vec<u64>) {
        if self.role != CeRole::Leader {
            return;
        }
        if let Some(p) = self.peers.get_mut(&from) {
            p.acked.extend(acked.iter().copied());
        }
        for i in acked {
            if let Some(a) = self.acks.get_mut(&i) {
                a.insert(from);
            }
        }
        self.maybe_commit();
    }

    /// Leader: an index commits once a quorum holds it. Under -CE only entries of this
    /// term are counted (earlier blocks were committed by the sync phase).
    fn maybe_commit(&mut self) {
        let q = self.quorum();
        let done: Vec<u64> = self
            .acks
            .iter()
            .filter(|(i, a)| {
                a.len() >= q
                    && match self.cfg.rules {
                        Rules::Ce => self.log.get(i).is_some_and(|e| e.term == self.hs.term),
                        #[cfg(feature = "paper-rules")]
                        Rules::Paper => true,
                    }
            })
            .map(|(&i, _)| i)
            .collect();
        for i in done {
            self.acks.remove(&i);
            if i > self.floor {
                self.committed.insert(i);
            }
        }
        self.advance_floor();
    }

    fn advance_floor(&mut self) {
        while self.committed.remove(&(self.floor + 1)) {
            self.floor += 1;
        }
        self.committed.retain(|&i| i > self.floor);
    }

    // ---- apply -----------------------------------------------------------------------

    /// Hands out every committed entry that may be applied now: each j below it not yet
    /// applied is known (present, or in the look-behind of a present entry after it) and
    /// does not conflict with it.
    fn maybe_apply(&mut self) {
        let limit = self.applied + self.cfg.max_outstanding;
        let mut candidates: Vec<u64> = (self.applied + 1..=self.floor.min(limit)).collect();
        if limit > self.floor {
            candidates.extend(self.committed.range(self.floor + 1..=limit));
        }
        let mut out = Vec::new();
        let mut blocked = false;
        for i in candidates {
            if self.applied_above.contains(&i) {
                continue;
            }
            let Some(entry) = self.log.get(&i) else {
                // A committed hole: later entries must know what it touches.
                continue;
            };
            let mut ok = true;
            for j in self.applied + 1..i {
                if self.applied_above.contains(&j) {
                    continue;
                }
                match self.known_conflicts(j) {
                    Some(c) if !c.conflicts(&entry.conflicts) => {}
                    Some(_) => {
                        ok = false;
                        break;
                    }
                    None => {
                        ok = false;
                        blocked = true;
                        break;
                    }
                }
            }
            if blocked {
                break;
            }
            if ok {
                out.push(entry.clone());
                self.applied_above.insert(i);
            }
        }
        while self.applied_above.remove(&(self.applied + 1)) {
            self.applied += 1;
        }
        self.pending.apply.extend(out);
    }

    /// What index `j` touches, if this node knows: its own copy, or the look-behind of a
    /// copy at most N after it.
    fn known_conflicts(&self, j: u64) -> Option<&ConflictSet> {
        // Every copy at an index of block s is the command its leader proposed there or a
        // candidate's no-op filler, so a command's own set covers whatever commits there.
        // A filler does not: a later candidate may put the command back (it found a copy
        // this node's candidate did not). Trust a filler only once committed.
        if let Some(e) = self.log.get(&j) {
            let filler = e.data.is_empty() && e.date != e.term;
            if !filler || self.is_committed(j) {
                return Some(&e.conflicts);
            }
        }
        let n = self.cfg.look_behind as u64;
        if n == 0 {
            return None;
        }
        self.log
            .range(j + 1..=j.saturating_add(n))
            .find_map(|(&k, e)| e.look_behind.get((k - j - 1) as usize))
    }

    // ---- helpers ---------------------------------------------------------------------

    fn become_follower(&mut self, term: u64, leader: NodeId) {
        if term > self.hs.term {
            self.hs.term = term;
            self.hs.vote = NONE;
            self.hs_dirty = true;
            self.from_leader.clear();
        }
        self.role = CeRole::Follower;
        self.leader = leader;
        self.reset_leader_state();
    }

    /// A message only the leader (candidate) of our term sends arrived.
    fn follow(&mut self, from: NodeId) -> Result<(), Error> {
        match self.role {
            CeRole::LeaderCandidate | CeRole::Leader => {
                Err(Error::Malformed("two leaders claim one term"))
            }
            CeRole::Candidate => {
                self.become_follower(self.hs.term, from);
                Ok(())
            }
            CeRole::Follower => {
                self.leader = from;
                Ok(())
            }
        }
    }

    fn reset_leader_state(&mut self) {
        self.votes.clear();
        self.peers.clear();
        self.acks.clear();
        self.update_sent = false;
    }

    fn quorum(&self) -> usize {
        self.cfg.voters.len() / 2 + 1
    }

    fn others(&self) -> Vec<NodeId> {
        self.cfg
            .voters
            .iter()
            .copied()
            .filter(|&v| v != self.cfg.id)
            .collect()
    }

    fn last_index(&self) -> u64 {
        self.log
            .keys()
            .next_back()
            .copied()
            .unwrap_or(0)
            .max(self.hs.final_end)
    }

    fn last(&self) -> (u64, u64) {
        self.log
            .values()
            .next_back()
            .map_or((0, 0), |e| (e.term, e.index))
    }

    /// First index of the block of the current term (leader).
    fn current_block_start(&self) -> u64 {
        match self.cfg.rules {
            Rules::Ce => self.hs.final_end + 1,
            #[cfg(feature = "paper-rules")]
            Rules::Paper => self.floor + 1,
        }
    }

    fn write(&mut self, e: CeEntry) {
        self.pending.entries.push(e.clone());
        self.log.insert(e.index, e);
    }

    fn erase_above(&mut self, end: u64) {
        if self.log.range(end + 1..).next().is_none() {
            return;
        }
        self.log.split_off(&(end + 1));
        self.pending.entries.retain(|e| e.index <= end);
        self.pending.erase_above = Some(self.pending.erase_above.map_or(end, |x| x.min(end)));
        self.acks.retain(|&i, _| i <= end);
    }

    fn send(&mut self, to: NodeId, body: CeBody) {
        self.pending.messages.push(CeMessage {
            from: self.cfg.id,
            to,
            term: self.hs.term,
            body,
        });
    }

    fn send_entries(&mut self, to: NodeId, entries: Vec<CeEntry>) {
        let committed = self.committed.iter().copied().collect();
        self.send(
            to,
            CeBody::Append {
                entries,
                floor: self.floor,
                committed,
            },
        );
    }

    fn send_commit(&mut self, to: NodeId) {
        self.send_entries(to, Vec::new());
    }
}

/// Per index among the voters' copies that `keep` accepts: a copy some voter knows
/// committed, else the one `rank` puts highest. The bool says "known committed".
fn best_copies(
    answers: &[VoteAnswer],
    keep: impl Fn(&CeEntry) -> bool,
    rank: impl Fn(&CeEntry) -> u64,
) -> BTreeMap<u64, (bool, CeEntry)> {
    let mut chosen: BTreeMap<u64, (bool, CeEntry)> = BTreeMap::new();
    for (e, committed) in answers.iter().flat_map(|a| a.entries.iter()) {
        if !keep(e) {
            continue;
        }
        let better = match chosen.get(&e.index) {
            None => true,
            Some((c, old)) => !*c && (*committed || rank(e) > rank(old)),
        };
        if better {
            chosen.insert(e.index, (*committed, e.clone()));
        }
    }
    chosen
}
