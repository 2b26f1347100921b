//! phoenix-raft: the consensus core of PhoenixKV.
//!
//! A pure, deterministic Raft state machine in the style of etcd-raft / raft-rs: no
//! I/O, no clock, no threads, no async. The caller feeds [`RawNode::step`],
//! [`RawNode::tick`], [`RawNode::propose`] and [`RawNode::read_index`], collects a
//! numbered [`Ready`] of what to persist, send and apply, and acknowledges it. The log
//! lives behind the read-only [`Storage`] trait ([`MemStorage`] in memory).
//!
//! Design notes, the membership-change choice and the ParallelRaft plan: `docs/raft.md`.

mod error;
mod log;
pub mod parallel;
mod progress;
pub mod quorum;
mod raft;
mod raw_node;
mod read_only;
mod storage;
mod types;

pub use crate::error::{Error, StorageError};
pub use crate::log::RaftLog;
pub use crate::progress::{Inflights, Progress, ProgressState};
pub use crate::raft::{Config, Raft, SoftState};
pub use crate::raw_node::{RawNode, Ready, Status};
pub use crate::read_only::ReadOnlyOption;
pub use crate::storage::{MemStorage, RaftState, Storage};
pub use crate::types::{
    ConfChange, ConfState, Entry, EntryKind, HardState, Message, MessageType, NodeId, ReadState,
    Snapshot, SnapshotMeta, SnapshotStatus, StateRole, NONE,
};
/// Payload type of entries and contexts (re-exported so users need not depend on `bytes`).
pub use bytes::Bytes;
