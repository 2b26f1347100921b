//! `phoenix bench ...`: benchmarks, each printing figures comparable with its peer tool.

pub mod backup;
pub mod cluster;
pub mod common;
pub mod engine;
pub mod etcd;
pub mod log;
pub mod nemesis;
pub mod raft;
pub mod rebuild;
pub mod repair;

use clap::Subcommand;

use crate::output::Report;

/// Error of a benchmark run: a message for the user.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// Which benchmark to run.
#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// The LSM engine alone, with db_bench's flags and output format.
    Engine(engine::Args),
    /// The shared log store alone: durable appends from many writers.
    Log(log::Args),
    /// The consensus core alone, in memory: proposals committed per second.
    Raft(raft::Args),
    /// A running cluster (PhoenixKV or etcd): closed-loop gets/puts, live figures.
    Cluster(cluster::Args),
    /// Seed 000's full-repair experiment: a node back from the dead takes a snapshot of
    /// every group; its peak disk use and repair time, per drop mode.
    Repair(repair::Args),
    /// Seed 004's replica rebuild on shared storage: a group of each size rebuilt on a
    /// node by copying its tables on the S3 server, and by streaming them; time, bytes
    /// through the nodes and the nodes' CPU.
    Rebuild(rebuild::Args),
    /// A backup of a 3-node cluster on an S3 server under writes, restored into a new
    /// cluster and checked: every write acknowledged before the backup began is there.
    Backup(backup::Args),
}

/// Runs the chosen benchmark. Its lines go to `report`; with `--output json` its
/// figures are printed at the end as one JSON document.
pub fn run(cmd: BenchCmd, report: Report) -> Result<(), BenchError> {
    match cmd {
        BenchCmd::Engine(args) => engine::run(args, report),
        BenchCmd::Log(args) => log::run(args, report),
        BenchCmd::Raft(args) => raft::run(args, report),
        BenchCmd::Cluster(args) => cluster::run(args, report),
        BenchCmd::Repair(args) => repair::run(args, report),
        BenchCmd::Rebuild(args) => rebuild::run(args, report),
        BenchCmd::Backup(args) => backup::run(args, report),
    }
}
