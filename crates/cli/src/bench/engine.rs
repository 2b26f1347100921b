//! `phoenix bench engine` (under construction).

use super::BenchError;

/// Flags of `phoenix bench engine`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the benchmark.
pub fn run(_args: Args) -> Result<(), BenchError> {
    Err("phoenix bench engine is not built yet".into())
}
