//! The application's handle on one group member: feed it input (`step`, `tick`,
//! `propose`, `read_index`, ...), take a numbered [`Ready`], persist / send / apply what
//! it holds, then acknowledge with [`RawNode::advance`] (synchronous) or
//! [`RawNode::on_persist_ready`] + [`RawNode::advance_apply_to`] (asynchronous, e.g. one
//! fsync for the readies of many groups).

use std::collections::VecDeque;

use bytes::Bytes;

use crate::error::Error;
use crate::raft::{Config, Raft, SoftState};
use crate::storage::Storage;
use crate::types::{
    ConfChange, ConfState, Entry, EntryKind, HardState, Message, NodeId, ReadState, Snapshot,
    SnapshotStatus,
};

/// What the application must do next, in this order:
/// 1. send `messages` (may go at once, even before step 2);
/// 2. persist `snapshot`, then `entries` (replacing any stored suffix from the first
///    one's index), then `hard_state` — entries before the hard state, because the hard
///    state's commit may point into them;
/// 3. once durable, send `persisted_messages` and call `on_persist_ready(number())`
///    (or `advance`, which also covers step 4);
/// 4. apply `snapshot` (if any) and `committed_entries` to the state machine (these are
///    already durable and committed, so this may run in parallel with step 2), then
///    `advance_apply_to(last index)`; serve `read_states` once applied up to their index.
#[derive(Debug, Default)]
pub struct Ready {
    number: u64,
    /// Role/leader, when changed since the previous ready.
    pub soft_state: Option<SoftState>,
    /// Messages that may be sent at once (e.g. the leader's appends and heartbeats,
    /// which are safe before the leader's own append is durable).
    pub messages: Vec<Message>,
    /// Messages that may be sent only after this ready (and all before it) is durable:
    /// vote requests, votes and append acknowledgements.
    pub persisted_messages: Vec<Message>,
    /// Entries to append to durable storage.
    pub entries: Vec<Entry>,
    /// Hard state to persist, when changed.
    pub hard_state: Option<HardState>,
    /// Snapshot to install (persist and apply).
    pub snapshot: Option<Snapshot>,
    /// Entries committed and durable, to apply in order.
    pub committed_entries: Vec<Entry>,
    /// Linearizable read points confirmed since the previous ready.
    pub read_states: Vec<ReadState>,
}

impl Ready {
    /// The sequence number of this ready (1, 2, ...).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Whether nothing needs to be persisted for this ready.
    pub fn is_persistence_free(&self) -> bool {
        self.entries.is_empty() && self.hard_state.is_none() && self.snapshot.is_none()
    }
}

/// What a ready handed out, remembered until it is reported durable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ReadyRecord {
    number: u64,
    last_entry: Option<(u64, u64)>,
    snapshot_index: Option<u64>,
    /// Messages to self (own vote, own append ack) stepped once durable.
    self_msgs: Vec<Message>,
    committed_last: Option<u64>,
}

/// Status of a member, for monitoring and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Node id.
    pub id: NodeId,
    /// Hard state (term, vote, commit).
    pub hard_state: HardState,
    /// Role and leader.
    pub soft_state: SoftState,
    /// Applied index.
    pub applied: u64,
    /// Last log index.
    pub last_index: u64,
}

/// A group member driven by the application.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RawNode<S> {
    raft: Raft<S>,
    prev_hs: HardState,
    prev_ss: SoftState,
    next_number: u64,
    records: VecDeque<ReadyRecord>,
}

impl<S: Storage> RawNode<S> {
    /// Builds a member from `store`'s durable state.
    pub fn new(cfg: &Config, store: S) -> Result<RawNode<S>, Error> {
        let raft = Raft::new(cfg, store)?;
        let prev_hs = raft.hard_state();
        let prev_ss = raft.soft_state();
        Ok(RawNode {
            raft,
            prev_hs,
            prev_ss,
            next_number: 1,
            records: VecDeque::new(),
        })
    }

    /// The consensus state (read-only).
    pub fn raft(&self) -> &Raft<S> {
        &self.raft
    }

    /// The storage (read-only).
    pub fn store(&self) -> &S {
        &self.raft.log.store
    }

    /// The storage, for the application to persist readies into. Write only what
    /// readies hand out, in order.
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.raft.log.store
    }

    /// Advances logical time by one tick.
    pub fn tick(&mut self) -> Result<(), Error> {
        self.raft.tick()
    }

    /// Entries at or below `index` are no longer sent to followers: a follower that
    /// needs one gets a snapshot instead. For a log whose older entries describe a state
    /// a fresh replica cannot replay from scratch (e.g. a range the group no longer
    /// has); only raised.
    pub fn set_append_floor(&mut self, index: u64) {
        self.raft.append_floor = self.raft.append_floor.max(index);
    }

    /// The append floor ([`RawNode::set_append_floor`]).
    pub fn append_floor(&self) -> u64 {
        self.raft.append_floor
    }

    /// Starts an election now.
    pub fn campaign(&mut self) -> Result<(), Error> {
        self.raft.campaign()
    }

    /// Feeds a message from a peer. Malformed input and messages from unknown peers are
    /// refused with an error and change nothing.
    pub fn step(&mut self, m: Message) -> Result<(), Error> {
        self.raft.step(m)
    }

    /// Proposes one command; returns the index it got.
    pub fn propose(&mut self, data: impl Into<Bytes>) -> Result<u64, Error> {
        self.raft.propose_entries(vec![Entry::normal(data)])
    }

    /// Proposes many commands as one batch (one append per follower); returns the index
    /// of the last.
    pub fn propose_batch(&mut self, data: impl IntoIterator<Item = Bytes>) -> Result<u64, Error> {
        self.raft
            .propose_entries(data.into_iter().map(Entry::normal).collect())
    }

    /// Proposes prepared entries (e.g. carrying `conflict_keys`); returns the last index.
    pub fn propose_entries(&mut self, ents: Vec<Entry>) -> Result<u64, Error> {
        self.raft.propose_entries(ents)
    }

    /// Proposes a membership change; returns its index.
    pub fn propose_conf_change(&mut self, cc: ConfChange) -> Result<u64, Error> {
        let e = Entry {
            kind: EntryKind::ConfChange,
            data: cc.encode(),
            ..Entry::default()
        };
        self.raft.propose_entries(vec![e])
    }

    /// Applies a committed membership change (call when applying its entry).
    pub fn apply_conf_change(&mut self, cc: ConfChange) -> Result<ConfState, Error> {
        self.raft.apply_conf_change(cc)
    }

    /// Requests a linearizable read point (answered in a later ready's `read_states`).
    pub fn read_index(&mut self, context: impl Into<Bytes>) -> Result<(), Error> {
        self.raft.read_index(context.into())
    }

    /// Hands leadership to `target`.
    pub fn transfer_leader(&mut self, target: NodeId) -> Result<(), Error> {
        self.raft.transfer_leader(target)
    }

    /// The `TimeoutNow` a leader that stops serving sends its most caught-up follower;
    /// see `Raft::abdicate`.
    pub fn abdicate(&self) -> Option<Message> {
        self.raft.abdicate()
    }

    /// Reports that `id` could not be reached.
    pub fn report_unreachable(&mut self, id: NodeId) {
        self.raft.report_unreachable(id)
    }

    /// Reports the outcome of sending a snapshot to `id`.
    pub fn report_snapshot(&mut self, id: NodeId, status: SnapshotStatus) {
        self.raft.report_snapshot(id, status)
    }

    /// Puts an idle group to sleep (leader only); see `Raft::hibernate`.
    pub fn hibernate(&mut self) -> Result<bool, Error> {
        self.raft.hibernate()
    }

    /// Restarts the timers of a hibernating member.
    pub fn wake(&mut self) {
        self.raft.wake()
    }

    /// Monitoring snapshot of the member.
    pub fn status(&self) -> Result<Status, Error> {
        Ok(Status {
            id: self.raft.id,
            hard_state: self.raft.hard_state(),
            soft_state: self.raft.soft_state(),
            applied: self.raft.log.applied,
            last_index: self.raft.log.last_index()?,
        })
    }

    /// Whether a ready has something to do.
    pub fn has_ready(&self) -> bool {
        let r = &self.raft;
        !r.msgs.is_empty()
            || !r.msgs_after_append.is_empty()
            || !r.read_states.is_empty()
            || !r.log.next_unstable_entries().is_empty()
            || r.log.has_next_unstable_snapshot()
            || r.hard_state() != self.prev_hs
            || r.soft_state() != self.prev_ss
            || r.log.has_next_committed_entries()
    }

    /// Collects what to persist, send and apply. Every ready must later be reported
    /// durable (`advance` or `on_persist_ready`), in number order.
    pub fn ready(&mut self) -> Result<Ready, Error> {
        let number = self.next_number;
        self.next_number += 1;
        let r = &mut self.raft;
        let entries = r.log.next_unstable_entries().to_vec();
        let snapshot = if r.log.has_next_unstable_snapshot() {
            r.log.unstable.snapshot.clone()
        } else {
            None
        };
        let hs = r.hard_state();
        let hard_state = (hs != self.prev_hs).then_some(hs);
        self.prev_hs = hs;
        let ss = r.soft_state();
        let soft_state = (ss != self.prev_ss).then_some(ss);
        self.prev_ss = ss;
        let committed_entries = r.log.next_committed_entries()?;
        let committed_last = committed_entries.last().map(|e| e.index);
        if let Some(i) = committed_last {
            r.log.applying_to(i);
        }
        let messages = std::mem::take(&mut r.msgs);
        let id = r.id;
        let (self_msgs, persisted_messages): (Vec<Message>, Vec<Message>) =
            std::mem::take(&mut r.msgs_after_append)
                .into_iter()
                .partition(|m| m.to == id);
        let read_states = std::mem::take(&mut r.read_states);
        r.log.accept_unstable();
        self.records.push_back(ReadyRecord {
            number,
            last_entry: entries.last().map(|e| (e.index, e.term)),
            snapshot_index: snapshot.as_ref().map(|s| s.meta.index),
            self_msgs,
            committed_last,
        });
        Ok(Ready {
            number,
            soft_state,
            messages,
            persisted_messages,
            entries,
            hard_state,
            snapshot,
            committed_entries,
            read_states,
        })
    }

    /// Everything handed out in readies up to `number` is durable.
    pub fn on_persist_ready(&mut self, number: u64) -> Result<(), Error> {
        if number >= self.next_number {
            return Err(Error::Misuse("on_persist_ready for a ready not handed out"));
        }
        while self.records.front().is_some_and(|r| r.number <= number) {
            let Some(rec) = self.records.pop_front() else {
                break;
            };
            if let Some(idx) = rec.snapshot_index {
                self.raft.log.stable_snap_to(idx);
            }
            if let Some((idx, term)) = rec.last_entry {
                self.raft.log.stable_to(idx, term);
            }
            for m in rec.self_msgs {
                self.raft.step_local(m)?;
            }
        }
        Ok(())
    }

    /// The application applied everything up to `index`.
    pub fn advance_apply_to(&mut self, index: u64) -> Result<(), Error> {
        self.raft.log.applied_to(index)
    }

    /// Synchronous path: `rd` is durable and its committed entries are applied.
    pub fn advance(&mut self, rd: Ready) -> Result<(), Error> {
        let committed_last = self
            .records
            .iter()
            .find(|r| r.number == rd.number)
            .and_then(|r| r.committed_last);
        self.on_persist_ready(rd.number)?;
        if let Some(i) = committed_last {
            self.advance_apply_to(i)?;
        }
        Ok(())
    }

    /// Checks internal invariants.
    pub fn check_invariants(&self) -> Result<(), Error> {
        self.raft.check_invariants()
    }
}
