//! The client's typed errors.

use std::time::Duration;

/// What went wrong with a client call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The key is over the size limit (checked before sending, and by the server).
    #[error("key of {size} bytes exceeds the limit of {limit} bytes")]
    KeyTooLarge {
        /// Key length.
        size: usize,
        /// Allowed length.
        limit: usize,
    },
    /// The value is over the size limit.
    #[error("value of {size} bytes exceeds the limit of {limit} bytes")]
    ValueTooLarge {
        /// Value length.
        size: usize,
        /// Allowed length.
        limit: usize,
    },
    /// The request's deadline passed before any attempt succeeded.
    #[error(
        "{op}: deadline of {timeout:?} exceeded after {attempts} attempt(s); last error: {last}"
    )]
    DeadlineExceeded {
        /// The operation.
        op: &'static str,
        /// The deadline the call had.
        timeout: Duration,
        /// Attempts made.
        attempts: u32,
        /// What the last attempt ran into.
        last: String,
    },
    /// A write whose outcome is unknown (the connection broke or the server timed out
    /// after the request may have been proposed) and that is not safe to retry blindly
    /// (compare-and-swap, or any write when `retry_ambiguous_writes` is off).
    #[error("{op}: outcome unknown (the write may or may not have been applied): {why}")]
    Ambiguous {
        /// The operation.
        op: &'static str,
        /// What happened.
        why: String,
    },
    /// An atomic batch names keys of more than one group.
    #[error("atomic batch spans groups {groups:?}; its keys must lie in one group")]
    CrossGroup {
        /// The groups the keys fall in.
        groups: Vec<u64>,
    },
    /// The server refused the request for a reason a retry cannot fix.
    #[error("{op}: refused by node {addr}: {error}")]
    Refused {
        /// The operation.
        op: &'static str,
        /// The node that answered.
        addr: String,
        /// The server's typed error.
        error: Box<phoenix_proto::Error>,
    },
    /// The request is malformed (caught by the client before sending).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No endpoint could be used at all (bad address).
    #[error("bad endpoint {endpoint:?}: {why}")]
    BadEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it is unusable.
        why: String,
    },
    /// A node refused this client's credentials (a missing or wrong token, no
    /// certificate), or the client refused the node's certificate: nothing was served.
    #[error("authentication with node {addr} failed: {why}")]
    Unauthenticated {
        /// The node.
        addr: String,
        /// What it said.
        why: String,
    },
    /// The cluster does not serve this operation yet: a node runs a binary that predates
    /// it (the node refused it before proposing anything, or did not know the method).
    /// Callers fall back to what older nodes serve.
    #[error("{op}: not served by this cluster yet (node {addr}): {why}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The node that answered.
        addr: String,
        /// What it said.
        why: String,
    },
    /// A server answered something that breaks the protocol.
    #[error("protocol violation by node {addr}: {why}")]
    Protocol {
        /// The node.
        addr: String,
        /// What was wrong.
        why: String,
    },
}

/// Result of client calls.
pub type Result<T> = std::result::Result<T, ClientError>;
