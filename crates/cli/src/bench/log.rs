//! `phoenix bench log` (under construction).

use super::BenchError;

/// Flags of `phoenix bench log`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the benchmark.
pub fn run(_args: Args) -> Result<(), BenchError> {
    Err("phoenix bench log is not built yet".into())
}
