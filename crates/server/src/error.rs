//! Errors of a node (start-up and fatal failures; request errors are `proto::Error`).

/// What failed while starting or running a node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid configuration.
    #[error("configuration: {0}")]
    Config(String),
    /// The engine failed.
    #[error("engine: {0}")]
    Engine(#[from] phoenix_engine::Error),
    /// The log store failed.
    #[error("log store: {0}")]
    Log(#[from] phoenix_log::Error),
    /// The consensus core refused something.
    #[error("raft: {0}")]
    Raft(#[from] phoenix_raft::Error),
    /// Local files (replica registry, snapshots).
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// A local file is corrupt.
    #[error("corruption: {0}")]
    Corruption(String),
    /// Networking.
    #[error("transport: {0}")]
    Transport(String),
    /// A failpoint fired (tests).
    #[error("injected failure at {0}")]
    Injected(String),
    /// Something this node's own code guarantees did not hold (a bug, not bad input).
    #[error("broken invariant: {0}")]
    Invariant(String),
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An I/O error with context.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}
