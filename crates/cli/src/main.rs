//! `phoenix`: the PhoenixKV command-line tool (servers, client commands, benchmarks).

mod bench;

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
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench { which } => bench::run(which),
    };
    if let Err(err) = result {
        eprintln!("error: {err}");
        std::process::exit(1);
    }
}
