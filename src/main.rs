//! `sluice`: one binary for every Sluice daemon and tool. Each subcommand is a page of
//! argument parsing that calls into the library crates; errors get their context here, at
//! the edge, with `anyhow`.

mod args;
mod cmd;
mod consumers;
mod daemon;
mod progress;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Feeds training data to GPUs at cluster scale"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The whole system on this machine: a dataset, a storage node, CPU workers and
    /// consumers over loopback, a report of each tier and the bottleneck.
    Demo(cmd::demo::Args),
    /// Write WebDataset shards from an image folder, a labelled flat folder, or a tar stream.
    Shard(cmd::shard::Args),
    /// Describe shards in a manifest and write each shard's sample index (.idx).
    Index(cmd::index::Args),
    /// List a shard's samples and validate it; exits non-zero on a broken shard.
    Inspect(cmd::inspect::Args),
    /// Generate a synthetic ImageFolder dataset of JPEGs (for demos and load tests).
    Synth(cmd::synth::Args),
    /// Measure a tier (or the whole chain) and compare.
    Bench(cmd::bench::Args),
    /// Serve shards from local disks over HTTP (the storage tier).
    Storage(cmd::storage::Args),
    /// Upload shards (and their .idx) to a storage node.
    Put(cmd::put::Args),
    /// Decode and augment samples for GPU clients over QUIC (the CPU tier).
    Cpu(cmd::cpu::Args),
    /// Make a CA for a pool of workers and issue their certificates.
    Cert(cmd::cert::Args),
    /// Synthetic GPU consumers: load-test workers and check the exactly-once contract.
    Loadgen(Box<cmd::loadgen::Args>),
}

/// The error and its causes, each said once: library errors often name their cause in their
/// own message, which `{:#}` would print a second time.
fn message(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => cmd::demo::run(args),
        Command::Shard(args) => cmd::shard::run(args),
        Command::Index(args) => cmd::index::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Synth(args) => cmd::synth::run(args),
        Command::Cert(args) => cmd::cert::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Storage(args) => cmd::storage::run(args),
        Command::Put(args) => cmd::put::run(args),
        Command::Cpu(args) => cmd::cpu::run(args),
        Command::Loadgen(args) => cmd::loadgen::run(*args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", message(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
