//! Typed errors of the consensus core and of its storage boundary.

use crate::types::{MessageType, NodeId};

/// Errors from the log storage behind [`crate::Storage`].
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The requested index is at or before the first index kept (compacted into a
    /// snapshot).
    #[error("index {index} is compacted (first index kept is {first_index})")]
    Compacted {
        /// Requested index.
        index: u64,
        /// First index still in the log.
        first_index: u64,
    },
    /// The requested index is after the last index stored.
    #[error("index {index} is unavailable (last index is {last_index})")]
    Unavailable {
        /// Requested index.
        index: u64,
        /// Last index stored.
        last_index: u64,
    },
    /// A snapshot is being produced; ask again later.
    #[error("snapshot temporarily unavailable")]
    SnapshotTemporarilyUnavailable,
    /// Any other failure of the storage implementation (I/O, corruption).
    #[error("storage failure: {0}")]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

/// Errors of the consensus core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The log storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A proposal was refused; `leader` is who to ask instead, if known.
    #[error("proposal dropped: {reason} (leader: {leader})")]
    ProposalDropped {
        /// Why.
        reason: &'static str,
        /// Known leader, or 0.
        leader: NodeId,
    },
    /// A message came from a node outside this node's configuration.
    #[error("message {kind:?} from node {from}, which is not in the configuration of node {to}")]
    UnknownPeer {
        /// Kind of the refused message.
        kind: MessageType,
        /// Sender.
        from: NodeId,
        /// This node.
        to: NodeId,
    },
    /// A message that cannot come from a correct peer (or is addressed elsewhere).
    #[error("malformed message: {0}")]
    Malformed(&'static str),
    /// Invalid configuration given by the caller.
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// The caller broke the API's protocol (e.g. persisted readies out of order).
    #[error("api misuse: {0}")]
    Misuse(&'static str),
    /// An internal invariant failed: a bug, reported rather than acted upon.
    #[error("invariant violated: {0}")]
    Invariant(String),
}
