//! The leader's view of each follower: how far its log matches, where to send next, and
//! the flow-control state (probe / replicate / snapshot) with a window of in-flight
//! appends.

use std::collections::VecDeque;

/// Flow-control state of one follower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ProgressState {
    /// Match unknown: send one append per heartbeat interval until one is accepted.
    #[default]
    Probe,
    /// Match known: stream appends optimistically, up to the in-flight window.
    Replicate,
    /// A snapshot is on its way; send nothing until it is reported.
    Snapshot,
}

/// A bounded FIFO of the last indexes of in-flight appends. Grows lazily so that idle
/// groups keep no buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Inflights {
    queue: VecDeque<u64>,
    cap: usize,
}

impl Inflights {
    /// A window of at most `cap` messages.
    pub fn new(cap: usize) -> Inflights {
        Inflights {
            queue: VecDeque::new(),
            cap,
        }
    }

    /// Whether no more appends may be sent.
    pub fn full(&self) -> bool {
        self.queue.len() >= self.cap
    }

    /// Records an append whose last entry is `last`.
    pub fn add(&mut self, last: u64) {
        debug_assert!(!self.full(), "inflight window overflow");
        self.queue.push_back(last);
    }

    /// Frees every in-flight append ending at or before `to`.
    pub fn free_to(&mut self, to: u64) {
        while self.queue.front().is_some_and(|&i| i <= to) {
            self.queue.pop_front();
        }
        if self.queue.is_empty() && self.queue.capacity() > 16 {
            self.queue = VecDeque::new();
        }
    }

    /// Frees the oldest in-flight append (its answer may have been lost).
    pub fn free_first_one(&mut self) {
        self.queue.pop_front();
    }

    /// Forgets everything.
    pub fn reset(&mut self) {
        self.queue = VecDeque::new();
    }

    /// Number of appends in flight.
    pub fn count(&self) -> usize {
        self.queue.len()
    }
}

/// Replication progress of one peer, as tracked by the leader.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Progress {
    /// Highest index known to match the leader's log.
    pub matched: u64,
    /// Next index to send.
    pub next_idx: u64,
    /// Flow-control state.
    pub state: ProgressState,
    /// Index of the snapshot in flight (state `Snapshot`).
    pub pending_snapshot: u64,
    /// Heard from since the last check-quorum round.
    pub recent_active: bool,
    /// In `Probe`: an append was sent and we wait for the answer or the next heartbeat.
    pub probe_sent: bool,
    /// Appends in flight (state `Replicate`).
    pub inflights: Inflights,
    /// Whether the peer is a learner.
    pub is_learner: bool,
    /// Answered an append since the last periodic heartbeat (`coalesce_messages`).
    pub answered_since_heartbeat: bool,
}

impl Progress {
    /// A fresh progress that will probe from `next_idx`.
    pub fn new(next_idx: u64, inflight_cap: usize, is_learner: bool) -> Progress {
        Progress {
            matched: 0,
            next_idx,
            state: ProgressState::Probe,
            pending_snapshot: 0,
            recent_active: false,
            probe_sent: false,
            inflights: Inflights::new(inflight_cap),
            is_learner,
            answered_since_heartbeat: false,
        }
    }

    fn reset_state(&mut self, state: ProgressState) {
        self.probe_sent = false;
        self.pending_snapshot = 0;
        self.state = state;
        self.inflights.reset();
    }

    /// Back to probing from just after the match (or the snapshot sent).
    pub fn become_probe(&mut self) {
        if self.state == ProgressState::Snapshot {
            let pending = self.pending_snapshot;
            self.reset_state(ProgressState::Probe);
            self.next_idx = (self.matched + 1).max(pending + 1);
        } else {
            self.reset_state(ProgressState::Probe);
            self.next_idx = self.matched + 1;
        }
    }

    /// Stream appends from just after the match.
    pub fn become_replicate(&mut self) {
        self.reset_state(ProgressState::Replicate);
        self.next_idx = self.matched + 1;
    }

    /// Wait for the snapshot at `index`.
    pub fn become_snapshot(&mut self, index: u64) {
        self.reset_state(ProgressState::Snapshot);
        self.pending_snapshot = index;
    }

    /// An append ending at `last` (with `n` entries) went out.
    pub fn sent_entries(&mut self, last: u64, n: usize) {
        match self.state {
            ProgressState::Replicate => {
                if n > 0 {
                    self.next_idx = last + 1;
                    self.inflights.add(last);
                }
            }
            ProgressState::Probe => self.probe_sent = true,
            ProgressState::Snapshot => {}
        }
    }

    /// The peer accepted up to `n`; returns whether the match advanced.
    pub fn maybe_update(&mut self, n: u64) -> bool {
        let updated = n > self.matched;
        if updated {
            self.matched = n;
            self.probe_sent = false;
        }
        self.next_idx = self.next_idx.max(n + 1);
        updated
    }

    /// The peer rejected an append at `rejected`, hinting it matches at most `hint`.
    /// Returns whether the rejection was news (not a stale duplicate).
    pub fn maybe_decr_to(&mut self, rejected: u64, hint: u64) -> bool {
        if self.state == ProgressState::Replicate {
            if rejected <= self.matched {
                return false; // stale
            }
            self.next_idx = self.matched + 1;
            return true;
        }
        if self.next_idx == 0 || self.next_idx - 1 != rejected {
            return false; // stale: not the append we are waiting for
        }
        self.next_idx = rejected.min(hint + 1).max(self.matched + 1).max(1);
        self.probe_sent = false;
        true
    }

    /// Whether sending must wait (probe outstanding, window full, snapshot in flight).
    pub fn is_paused(&self) -> bool {
        match self.state {
            ProgressState::Probe => self.probe_sent,
            ProgressState::Replicate => self.inflights.full(),
            ProgressState::Snapshot => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_rejection_moves_next_back_and_ignores_stale_ones() {
        let mut p = Progress::new(10, 4, false);
        p.sent_entries(12, 3);
        assert!(p.is_paused(), "one probe at a time");
        assert!(
            !p.maybe_decr_to(5, 3),
            "rejection of an append we are not waiting for"
        );
        assert!(p.maybe_decr_to(9, 6));
        assert_eq!(p.next_idx, 7);
        assert!(!p.is_paused());
    }

    #[test]
    fn replicate_window_pauses_and_frees() {
        let mut p = Progress::new(1, 2, false);
        p.maybe_update(0);
        p.become_replicate();
        p.sent_entries(3, 3);
        p.sent_entries(5, 2);
        assert!(p.is_paused());
        assert!(p.maybe_update(3));
        p.inflights.free_to(3);
        assert!(!p.is_paused());
        assert_eq!(p.next_idx, 6);
        assert!(!p.maybe_decr_to(2, 0), "stale rejection below the match");
        assert!(p.maybe_decr_to(5, 3));
        assert_eq!(p.next_idx, 4);
    }

    #[test]
    fn snapshot_state_resumes_after_the_snapshot() {
        let mut p = Progress::new(1, 2, false);
        p.become_snapshot(50);
        assert!(p.is_paused());
        p.become_probe();
        assert_eq!(p.next_idx, 51);
    }
}
