//! `phoenix`: the PhoenixKV command-line tool (servers, client commands, benchmarks).

mod bench;
mod cmd;

use clap::{Parser, Subcommand};

/// PhoenixKV: a distributed, strongly consistent key-value store.
#[derive(Debug, Parser)]
#[command(name = "phoenix", version, about)]
struct Cli {
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
    /// Read a key (linearizable).
    Get(cmd::client::GetArgs),
    /// Delete a key, a prefix or a range.
    Del(cmd::client::DelArgs),
    /// List the pairs of a range or prefix.
    Scan(cmd::client::ScanArgs),
    /// Compare-and-swap one key.
    Cas(cmd::client::CasArgs),
    /// Cluster tools (status).
    Cluster {
        #[command(subcommand)]
        which: cmd::cluster::ClusterCmd,
    },
    /// Run one PhoenixKV node (see docs/cluster.md).
    Server(cmd::server::Args),
    /// Start a meta group and three nodes on loopback under ./phoenix-data (Ctrl-C stops).
    Playground(cmd::playground::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench { which } => bench::run(which),
        Command::Put(args) => cmd::client::put(args),
        Command::Get(args) => cmd::client::get(args),
        Command::Del(args) => cmd::client::del(args),
        Command::Scan(args) => cmd::client::scan(args),
        Command::Cas(args) => cmd::client::cas(args),
        Command::Cluster { which } => cmd::cluster::run(which),
        Command::Playground(args) => cmd::playground::run(args),
        Command::Server(args) => cmd::server::run(args),
    };
    if let Err(err) = result {
        eprintln!("error: {err}");
        std::process::exit(1);
    }
}
