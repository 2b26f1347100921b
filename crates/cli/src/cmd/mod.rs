//! `phoenix` subcommands other than benchmarks: servers, client requests, cluster tools.

pub mod client;
pub mod cluster;
pub mod playground;
pub mod server;

/// Error of a command: a message for the user.
pub type CmdError = Box<dyn std::error::Error + Send + Sync>;
