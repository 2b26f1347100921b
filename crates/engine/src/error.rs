//! Typed engine errors: every error says what failed and where (file and offset for
//! corruption).

use std::path::PathBuf;

/// An error of the LSM engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The storage layer failed.
    #[error(transparent)]
    Storage(#[from] phoenix_storage::Error),

    /// Bytes on disk do not decode or fail their checksum.
    #[error("corruption in {file} at offset {offset}: {what}")]
    Corruption {
        /// The file holding the bad bytes.
        file: PathBuf,
        /// Byte offset of the bad record, block or field inside the file.
        offset: u64,
        /// What was wrong.
        what: String,
    },

    /// The caller passed something the engine cannot accept (oversized key, bad range,
    /// bad option, a file to ingest that overlaps in a way it cannot be placed, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The write-ahead log failed.
    #[error("write-ahead log: {0}")]
    Wal(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// A background flush or compaction failed earlier; the engine refuses writes until
    /// it is reopened, so that nothing acknowledged is lost.
    #[error("engine is read-only after a background error: {0}")]
    Background(String),

    /// A compaction worker failed or refused a job (`remote_compaction`).
    #[error("compaction worker: {0}")]
    Remote(String),

    /// The engine was closed.
    #[error("engine is closed")]
    Closed,
}

impl Error {
    /// Builds a corruption error.
    pub fn corruption(file: impl Into<PathBuf>, offset: u64, what: impl Into<String>) -> Self {
        Error::Corruption {
            file: file.into(),
            offset,
            what: what.into(),
        }
    }

    /// Whether this is a corruption error.
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corruption { .. })
    }

    /// Whether the storage found no such file.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Storage(e) if e.is_not_found())
    }

    /// Whether another writer took the table store over: this engine writes nothing
    /// more (see `object_table_store`).
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Storage(e) if e.is_fenced())
    }

    /// Whether the same work may succeed if tried again later: a remote table store was
    /// unavailable (`phoenix_storage::Error::is_retryable`). Background work failing
    /// this way backs off and tries again instead of stopping the engine.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Storage(e) if e.is_retryable())
    }
}

/// Result of engine operations.
pub type Result<T> = std::result::Result<T, Error>;
