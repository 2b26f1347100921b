//! ReadIndex bookkeeping on the leader: each linearizable read waits until a quorum
//! acknowledges a heartbeat sent after the read arrived (Raft thesis §6.4), which proves
//! the leader was still leader when it recorded the read's commit index.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::types::NodeId;

/// How the leader answers ReadIndex requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReadOnlyOption {
    /// Confirm leadership with a quorum round of heartbeats (always safe).
    #[default]
    Safe,
    /// Trust the leader lease: answer at once. Safe only with check-quorum and bounded
    /// clock drift (a deposed leader may answer until its lease would have expired).
    LeaseBased,
}

/// One read waiting for its quorum.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PendingRead {
    /// Sequence number, sent as the heartbeat context.
    pub seq: u64,
    /// The caller's context.
    pub context: Bytes,
    /// Who asked (this node or a follower that forwarded the read).
    pub from: NodeId,
    /// The commit index when the read arrived.
    pub index: u64,
    /// Voters that acknowledged a heartbeat carrying `seq` or a later sequence.
    pub acks: Vec<NodeId>,
}

/// The queue of reads awaiting confirmation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct ReadOnly {
    pub option: ReadOnlyOption,
    pub queue: VecDeque<PendingRead>,
    pub next_seq: u64,
}

impl ReadOnly {
    pub(crate) fn new(option: ReadOnlyOption) -> ReadOnly {
        ReadOnly {
            option,
            queue: VecDeque::new(),
            next_seq: 1,
        }
    }

    /// Registers a read; returns the heartbeat context to broadcast.
    pub(crate) fn add(
        &mut self,
        context: Bytes,
        from: NodeId,
        index: u64,
        self_id: NodeId,
    ) -> Bytes {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queue.push_back(PendingRead {
            seq,
            context,
            from,
            index,
            acks: vec![self_id],
        });
        Bytes::copy_from_slice(&seq.to_be_bytes())
    }

    /// Records that `from` acknowledged heartbeat context `ctx`: it confirms every read
    /// registered up to that sequence. Returns the acks of the read `ctx` names, if any.
    pub(crate) fn recv_ack(&mut self, from: NodeId, ctx: &[u8]) -> Option<u64> {
        let seq = u64::from_be_bytes(ctx.try_into().ok()?);
        for r in self.queue.iter_mut().take_while(|r| r.seq <= seq) {
            if !r.acks.contains(&from) {
                r.acks.push(from);
            }
        }
        Some(seq)
    }

    /// Removes and returns every read up to and including the newest one whose acks
    /// satisfy `confirmed`.
    pub(crate) fn advance(&mut self, confirmed: impl Fn(&[NodeId]) -> bool) -> Vec<PendingRead> {
        let Some(pos) = self.queue.iter().rposition(|r| confirmed(&r.acks)) else {
            return Vec::new();
        };
        self.queue.drain(..=pos).collect()
    }

    pub(crate) fn reset(&mut self) {
        self.queue.clear();
    }
}
