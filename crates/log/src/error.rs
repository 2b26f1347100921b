//! Typed errors of the log store: what failed, on which stream, file and offset.

use std::path::PathBuf;
use std::sync::Arc;

/// An error of the log store. `Clone` because one failed group commit fails every append
/// of its batch.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The storage layer failed.
    #[error("storage: {0}")]
    Storage(Arc<phoenix_storage::Error>),
    /// A checksum or structure check failed before the tail of the log: the data on disk
    /// is damaged. Never skipped silently.
    #[error("corruption in {path} at offset {offset}: {reason}")]
    Corruption {
        /// The segment (or other file) holding the damaged bytes.
        path: PathBuf,
        /// Byte offset of the damaged frame or entry in that file.
        offset: u64,
        /// What check failed.
        reason: String,
    },
    /// Recovery rebuilt a stream that misses entries it must have: some segment that held
    /// live entries is gone.
    #[error("stream {stream}: entries [{first}, {last}] expected but index {missing} is missing from every segment")]
    LostEntries {
        /// The stream.
        stream: u64,
        /// Its recovered first index.
        first: u64,
        /// Its recovered last index.
        last: u64,
        /// The first index not found.
        missing: u64,
    },
    /// The caller passed something the API does not accept.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An append would leave a hole in the stream.
    #[error("stream {stream}: append at index {index} leaves a gap after last index {last}")]
    Gap {
        /// The stream.
        stream: u64,
        /// First index of the rejected batch.
        index: u64,
        /// The stream's last index.
        last: u64,
    },
    /// The requested index was truncated away (it is below the stream's first index).
    #[error("stream {stream}: index {index} is compacted (first index is {first})")]
    Compacted {
        /// The stream.
        stream: u64,
        /// The requested index.
        index: u64,
        /// The stream's first index.
        first: u64,
    },
    /// The requested range goes past the stream's last index.
    #[error("stream {stream}: index {index} is unavailable (last index is {last})")]
    Unavailable {
        /// The stream.
        stream: u64,
        /// The requested index.
        index: u64,
        /// The stream's last index.
        last: u64,
    },
    /// A write or sync failed earlier; what reached the disk is unknown, so the store
    /// refuses further work until it is reopened (recovery re-reads the truth).
    #[error("log store failed earlier and must be reopened: {0}")]
    Poisoned(String),
    /// The store was closed.
    #[error("log store is closed")]
    Closed,
}

impl From<phoenix_storage::Error> for Error {
    fn from(e: phoenix_storage::Error) -> Self {
        Error::Storage(Arc::new(e))
    }
}

/// Result of log store operations.
pub type Result<T> = std::result::Result<T, Error>;
