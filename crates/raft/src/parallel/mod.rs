//! ParallelRaft-CE: out-of-order acknowledge, commit and apply (seed 001 §5, corrected as
//! in Gu et al.'s ParallelRaft-CE). The rules, the ghost-entry scenario and why this form
//! is safe: docs/parallel-raft.md.
//!
//! [`CeNode`] is a pure, deterministic state machine like [`crate::RawNode`]: the caller
//! feeds it messages and proposals, and takes a [`CeReady`] of what to persist, then send,
//! then apply. Its log is sparse: a follower holds the entries of the current term it
//! received, holes allowed, and acknowledges each one once durable; the leader commits an
//! index as soon as a quorum holds it; an entry is applied once committed and no earlier
//! unapplied entry that could conflict with it is unknown or conflicting.
//!
//! A new leader first runs the -CE candidate stage and sync phase: it fixes the end and
//! the content of the block of its `sync` term from its vote quorum, brings a quorum to
//! that block, and only then serves. The paper's original rules (no sync; a Raft vote
//! check and a merge of every uncommitted entry by highest term) are kept behind the
//! `paper-rules` feature, for tests that show they diverge.
//!
//! Not here yet (the later steps): ticks and timeouts (the caller campaigns and
//! heartbeats), membership change, log compaction and snapshots, read index.

mod conflict;
mod node;

pub use conflict::{ConflictItem, ConflictSet};
pub use node::{
    CeBody, CeConfig, CeEntry, CeHardState, CeMessage, CeNode, CeReady, CeRole, EndPoint, Rules,
};
