//! Typed storage errors: every error says which operation failed on which path.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// The kind of operation that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoOp {
    /// Creating or opening a file.
    Open,
    /// Reading.
    Read,
    /// Writing or appending.
    Write,
    /// `fsync`/`fdatasync` of a file or directory.
    Sync,
    /// Preallocating space.
    Preallocate,
    /// Listing a directory.
    List,
    /// Deleting a file.
    Delete,
    /// Renaming a file.
    Rename,
    /// Creating a directory.
    CreateDir,
    /// Reading file metadata.
    Stat,
    /// Taking a lock.
    Lock,
}

impl fmt::Display for IoOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            IoOp::Open => "open",
            IoOp::Read => "read",
            IoOp::Write => "write",
            IoOp::Sync => "sync",
            IoOp::Preallocate => "preallocate",
            IoOp::List => "list",
            IoOp::Delete => "delete",
            IoOp::Rename => "rename",
            IoOp::CreateDir => "create dir",
            IoOp::Stat => "stat",
            IoOp::Lock => "lock",
        };
        f.write_str(s)
    }
}

/// An error of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: IoOp,
        /// On which file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The lock on a data directory is held by someone else.
    #[error("lock {path}: already held by another process or handle")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A file is too large to read into memory on this platform.
    #[error("{path}: file too large to read whole")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// An argument broke the trait's contract (e.g. unaligned direct I/O).
    #[error("{path}: invalid argument: {reason}")]
    InvalidArgument {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A remote store did not answer, or answered that it cannot now (a refused
    /// connection, a timeout, a 5xx once the client's own retries ran out, a deadline
    /// passed): the operation may or may not have taken effect, and the same operation
    /// may succeed later ([`Error::is_retryable`]). Local disks never fail this way.
    #[error("{op} {path}: store unavailable: {source}")]
    Unavailable {
        /// What was being done.
        op: IoOp,
        /// On which object.
        path: PathBuf,
        /// What the store's client said.
        #[source]
        source: io::Error,
    },
    /// Another writer took over the store this file belongs to (a conditional write
    /// found the object changed under it): this writer must write nothing more.
    #[error("{path}: fenced: another writer took the store over")]
    Fenced {
        /// The object whose conditional write failed.
        path: PathBuf,
    },
}

impl Error {
    /// Builds an [`Error::Io`].
    pub fn io(op: IoOp, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// The `io::ErrorKind` behind this error, if it is an I/O error.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            Error::Io { source, .. } | Error::Unavailable { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    /// Whether the same operation may succeed if tried again later: the store was
    /// unavailable ([`Error::Unavailable`]). A local disk's failure is not (after a
    /// failed `fsync` the kernel may have dropped the dirty pages, and a second `fsync`
    /// would report success over lost data): its owner starts over from what is durable.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }

    /// Whether this error means the file or directory does not exist.
    pub fn is_not_found(&self) -> bool {
        self.io_kind() == Some(io::ErrorKind::NotFound)
    }

    /// Whether another writer took the store over ([`Error::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Fenced { .. })
    }
}

/// Result of storage operations.
pub type Result<T> = std::result::Result<T, Error>;
