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

    /// Whether the same start may succeed later: the disk or the network failed. A
    /// corrupt file, a bad configuration or a broken invariant would be found again.
    pub fn is_transient(&self) -> bool {
        match self {
            // (The engine's own WAL, when on, fails as `Wal`.) A fenced engine's store
            // was taken over by another node: opening it again would take it back.
            Error::Engine(e) => {
                !e.is_fenced()
                    && matches!(
                        e,
                        phoenix_engine::Error::Storage(_) | phoenix_engine::Error::Wal(_)
                    )
            }
            Error::Log(e) => matches!(e, phoenix_log::Error::Storage(_)),
            Error::Io { .. } | Error::Transport(_) => true,
            Error::Config(_)
            | Error::Raft(_)
            | Error::Corruption(_)
            | Error::Injected(_)
            | Error::Invariant(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_disk_and_the_network_are_tried_again() {
        let disk = phoenix_storage::Error::Io {
            op: phoenix_storage::IoOp::Sync,
            path: "/d/log/1.seg".into(),
            source: std::io::Error::other("EIO"),
        };
        assert!(Error::Engine(phoenix_engine::Error::Storage(disk)).is_transient());
        assert!(Error::io("reading", std::io::Error::other("EIO")).is_transient());
        assert!(Error::Transport("bind".into()).is_transient());
        let damaged = phoenix_log::Error::Corruption {
            path: "/d/log/1.seg".into(),
            offset: 4096,
            reason: "checksum".into(),
        };
        assert!(!Error::Log(damaged).is_transient());
        assert!(!Error::Corruption("replica registry".into()).is_transient());
        assert!(!Error::Config("--listen".into()).is_transient());
        let fenced = phoenix_storage::Error::Fenced {
            path: "s3://b/p/CURRENT".into(),
        };
        assert!(!Error::Engine(phoenix_engine::Error::Storage(fenced)).is_transient());
    }
}
