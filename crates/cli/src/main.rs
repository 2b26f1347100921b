//! `phoenix`: the PhoenixKV command-line tool (servers, client commands, benchmarks).

mod bench;
mod check;
mod cmd;
mod output;

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use cmd::{CmdError, Outcome};
use output::{Format, Report, Stdout};

/// PhoenixKV: a distributed, strongly consistent key-value store.
#[derive(Debug, Parser)]
#[command(name = "phoenix", version, about, after_help = cmd::EXIT_CODES_HELP)]
struct Cli {
    /// Output format: text for people, or json (one document on stdout; see the README).
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmarks of PhoenixKV's parts and of the whole cluster.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCmd,
    },
    /// Set a key to a value.
    Put(cmd::client::PutArgs),
    /// Read a key (linearizable); exit code 1 if it is absent.
    Get(cmd::client::GetArgs),
    /// Delete a key, a prefix or a range.
    Del(cmd::client::DelArgs),
    /// List the pairs of a range or prefix.
    Scan(cmd::client::ScanArgs),
    /// Compare-and-swap one key; exit code 1 if the compare failed.
    Cas(cmd::client::CasArgs),
    /// Cluster tools (status).
    Cluster {
        #[command(subcommand)]
        which: cmd::cluster::ClusterCmd,
    },
    /// Back up every group of a running cluster to a bucket prefix on an S3 server
    /// (each group consistent at its own index; every write acknowledged before the
    /// backup started is in it).
    Backup(cmd::backup::BackupArgs),
    /// Write a backup's keys into a running (empty) cluster.
    Restore(cmd::backup::RestoreArgs),
    /// Run one PhoenixKV node (see docs/cluster.md).
    Server(Box<cmd::server::Args>),
    /// Run a compaction worker for nodes whose tables are on an S3 server (`server
    /// --compactor`).
    Compactor(cmd::compactor::Args),
    /// Check linearizability of a spawned 3-node cluster under faults (kill -9, pause,
    /// partition, disk errors, power loss); exit code 1 if the history is not
    /// linearizable or the cluster stopped serving.
    Check(check::Args),
    /// Start a meta group and three nodes on loopback under ./phoenix-data (Ctrl-C stops).
    Playground(cmd::playground::Args),
    /// Print a shell completion script (e.g. `phoenix completions bash`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn run(cli: Cli) -> Result<Outcome, CmdError> {
    let format = cli.output;
    let report = Report { format };
    let done = |r: Result<(), cmd::BoxError>| r.map(|()| Outcome::Done).map_err(CmdError::Failed);
    match cli.command {
        Command::Bench { which } => done(bench::run(which, report)),
        Command::Put(args) => cmd::client::put(args, format),
        Command::Get(args) => cmd::client::get(args, format),
        Command::Del(args) => cmd::client::del(args, format),
        Command::Scan(args) => cmd::client::scan(args, format),
        Command::Cas(args) => cmd::client::cas(args, format),
        Command::Cluster { which } => cmd::cluster::run(which, format),
        Command::Check(args) => check::run(args, format),
        Command::Backup(args) => cmd::backup::backup_cmd(args, format),
        Command::Restore(args) => cmd::backup::restore_cmd(args, format),
        Command::Playground(args) => done(cmd::playground::run(args, report)),
        Command::Server(args) => done(cmd::server::run(*args)),
        Command::Compactor(args) => done(cmd::compactor::run(args)),
        Command::Completions { shell } => completions(shell),
    }
}

/// Writes the completion script for `shell` (the same whatever `--output` says).
fn completions(shell: clap_complete::Shell) -> Result<Outcome, CmdError> {
    // Generated into memory first: the generator panics on a failed write, and a
    // closed or full stdout must end as an error message, not a panic.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "phoenix", &mut script);
    let mut out = Stdout::lock();
    out.write_all(&script)?;
    out.flush()?;
    Ok(Outcome::Done)
}

fn main() -> ExitCode {
    // Usage errors, --help and --version end here with clap's codes (2, 0, 0).
    let cli = Cli::parse();
    match run(cli) {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(err) => {
            output::note(format_args!("error: {err}"));
            ExitCode::from(err.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn output_flag_is_global() {
        let cli = Cli::try_parse_from(["phoenix", "get", "k", "--output", "json"]);
        assert!(matches!(
            cli,
            Ok(Cli {
                output: Format::Json,
                ..
            })
        ));
        let cli = Cli::try_parse_from(["phoenix", "--output", "json", "cluster", "status"]);
        assert!(matches!(
            cli,
            Ok(Cli {
                output: Format::Json,
                ..
            })
        ));
    }
}
