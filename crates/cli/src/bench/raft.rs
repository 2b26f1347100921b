//! `phoenix bench raft` (under construction).

use super::BenchError;

/// Flags of `phoenix bench raft`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the benchmark.
pub fn run(_args: Args) -> Result<(), BenchError> {
    Err("phoenix bench raft is not built yet".into())
}
