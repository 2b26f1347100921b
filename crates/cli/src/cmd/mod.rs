//! `phoenix` subcommands other than benchmarks: servers, client requests, cluster tools.

pub mod backup;
pub mod client;
pub mod cluster;
pub mod compactor;
pub mod local_tls;
pub mod minio;
pub mod playground;
pub mod server;

use phoenix_client::ClientError;

/// Error of the long-running commands (server, playground) and of the pieces the
/// benchmarks share with them: a message for the user.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The exit codes of `phoenix` (also listed in `phoenix --help` and the README).
pub mod exit {
    /// Success: the key was found, the write or the compare-and-swap was done.
    pub const OK: u8 = 0;
    /// A definite negative answer: `get` found no such key, `cas` found another value,
    /// `check` found a history that is not linearizable.
    pub const MISS: u8 = 1;
    /// The command line is wrong (clap uses 2 for its own usage errors too).
    pub const USAGE: u8 = 2;
    /// No definite answer from the cluster: unreachable, deadline passed, or a write
    /// whose outcome is unknown.
    pub const UNAVAILABLE: u8 = 3;
    /// Any other error: refused by the server, a protocol violation, a local failure.
    pub const FAILED: u8 = 4;
}

/// `phoenix --help`'s account of the exit codes.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success (key found, write or compare-and-swap done, history linearizable)
  1  key not found (get), compare failed (cas), history not linearizable or the cluster
     stopped serving (check), replicas' checksums differ (cluster scrub)
  2  usage error (bad flag or argument, malformed hex, bad endpoint, key too large)
  3  cluster unavailable: unreachable, deadline exceeded, or a write's outcome unknown
  4  any other error (refused by the server, local I/O failure, a server or benchmark failing)
Every error prints a message on standard error. A closed standard output (`| head`)
is not an error: the command ends quietly with the code of its outcome.";

/// How a command that did its work ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Found, written, swapped: exit code 0.
    Done,
    /// Not found, or the compare failed: exit code 1.
    Miss,
}

impl Outcome {
    /// The process exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Done => exit::OK,
            Outcome::Miss => exit::MISS,
        }
    }
}

/// Why a command failed; decides the exit code.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// The command line is wrong (malformed hex, a missing value).
    #[error("{0}")]
    Usage(String),
    /// No node named by `--endpoints` gave the routing table within the deadline.
    #[error("cannot reach the cluster at {endpoints}: {source}{hint}")]
    Unreachable {
        /// The endpoints tried, comma separated.
        endpoints: String,
        /// What the client ran into.
        source: ClientError,
        /// What the user may have left out (empty if nothing).
        hint: &'static str,
    },
    /// A request to the cluster failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Standard output could not be written (a closed pipe is not an error).
    #[error("write to standard output: {0}")]
    Output(#[from] std::io::Error),
    /// Any other failure: the async runtime, a server, the playground, a benchmark.
    #[error("{0}")]
    Failed(BoxError),
}

impl CmdError {
    /// The process exit code (see [`exit`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            CmdError::Usage(_) => exit::USAGE,
            CmdError::Unreachable { .. } => exit::UNAVAILABLE,
            CmdError::Client(e) => client_exit_code(e),
            CmdError::Output(_) | CmdError::Failed(_) => exit::FAILED,
        }
    }
}

/// The exit code of a failed request: the caller's mistake, no definite answer, or
/// anything else.
pub fn client_exit_code(e: &ClientError) -> u8 {
    match e {
        ClientError::KeyTooLarge { .. }
        | ClientError::ValueTooLarge { .. }
        | ClientError::InvalidArgument(_)
        | ClientError::BadEndpoint { .. }
        | ClientError::CrossGroup { .. } => exit::USAGE,
        ClientError::DeadlineExceeded { .. } | ClientError::Ambiguous { .. } => exit::UNAVAILABLE,
        ClientError::Refused { .. }
        | ClientError::Unsupported { .. }
        | ClientError::Protocol { .. }
        | ClientError::Unauthenticated { .. } => exit::FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn exit_codes_by_kind() {
        let deadline = ClientError::DeadlineExceeded {
            op: "get",
            timeout: Duration::from_secs(1),
            attempts: 1,
            last: "refused".into(),
        };
        assert_eq!(CmdError::Client(deadline).exit_code(), exit::UNAVAILABLE);
        let bad = ClientError::BadEndpoint {
            endpoint: "x".into(),
            why: "expected host:port".into(),
        };
        assert_eq!(CmdError::Client(bad).exit_code(), exit::USAGE);
        assert_eq!(CmdError::Usage("odd hex".into()).exit_code(), exit::USAGE);
        assert_eq!(CmdError::Failed("boom".into()).exit_code(), exit::FAILED);
        assert_eq!(Outcome::Miss.exit_code(), exit::MISS);
        assert_eq!(Outcome::Done.exit_code(), exit::OK);
    }
}
