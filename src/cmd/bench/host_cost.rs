//! `sluice bench host-cost`: what the client costs a GPU host, in CPU µs per delivered
//! sample, on each transport, beside the floor its bytes need (measured in the same run), and
//! what that comes to on an 8-GPU node (`sluice_testbed::host_cost`).
//!
//! The worker runs in a child process (this binary, `--serve`), serving ready-made tensors,
//! so the figure is the client's CPU alone, as `time` on a loadgen beside a separate `sluice
//! cpu` would measure it.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use sluice_testbed::host_cost::SyntheticWorker;
use sluice_testbed::transport::Synthetic;

use super::probe::{measure, Row};

#[derive(clap::Args)]
pub struct HostCostArgs {
    #[command(flatten)]
    probe: super::probe::ProbeArgs,
    /// Repeat each measurement this many times and keep the cheapest.
    #[arg(long, default_value_t = 3)]
    repeat: u32,
    /// Epochs of one loader per measurement, one after the other: the first warms up what a
    /// loader keeps across epochs (buffers, same-host segments) and the rest are measured; 1
    /// measures one epoch from the loader's start.
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// Measure this transport alone: quic or same-host.
    #[arg(long)]
    only: Option<String>,
    /// Samples a second per GPU and GPUs per node, for the cores line.
    #[arg(long, default_value_t = 3000.0)]
    rate: f64,
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    /// Serve synthetic tensors from this folder until stdin closes (the child process).
    #[arg(long, hide = true)]
    serve: Option<PathBuf>,
    /// With --serve: the same-host socket too.
    #[arg(long, hide = true)]
    serve_same_host: bool,
}

pub fn run(args: HostCostArgs) -> Result<()> {
    // Warnings (a worker lost mid-measurement) show; RUST_LOG says more.
    crate::daemon::init_logs_at("warn");
    let probe = args.probe.probe();
    if let Some(dir) = &args.serve {
        return serve(dir, probe.side, args.serve_same_host, probe.connections);
    }
    let bytes = u64::from(probe.side) * u64::from(probe.side) * 3;
    println!(
        "sluice bench host-cost: client CPU (user + sys of this process; the worker runs in \
         another) per delivered sample, {} samples of {bytes} bytes an epoch, {}, batch 256, \
         {} credits, {} QUIC connection(s), cheapest of {}",
        probe.samples,
        match args.epochs {
            0 | 1 => "one epoch from the loader's start".to_string(),
            n => format!("epochs 2..{n} of one loader (the first warms it up)"),
        },
        probe.credits,
        probe.connections,
        args.repeat
    );
    let only = args.only.as_deref();
    if let Some(o) = only {
        if o != "quic" && o != "same-host" {
            bail!("--only {o:?}: quic or same-host");
        }
    }
    let choice = sluice_tls::chosen()?;
    println!(
        "QUIC packet protection: {} AES-GCM ({})",
        choice.aes_gcm.name(),
        choice.why
    );
    let rows = measure(&probe, args.repeat, args.epochs, only)?;
    for row in &rows {
        print_row(row, args.rate, args.gpus);
    }
    Ok(())
}

fn print_row(row: &Row, rate: f64, gpus: u32) {
    let us = row.cost.micros_per_sample();
    let cores = |us: f64| us * rate * f64::from(gpus) / 1e6;
    println!(
        "host-cost\t{}\t{us:.1} µs/sample\tfloor {:.1} µs ({})\t{:.1}x the floor\t\
         {:.0} samples/s\tat {rate:.0}/s x {gpus} GPUs: {:.1} cores (floor {:.1})",
        row.transport,
        row.floor,
        row.floor_parts,
        us / row.floor.max(1e-9),
        row.cost.samples_per_sec(),
        cores(us),
        cores(row.floor)
    );
}

/// The child: serves until its stdin closes.
fn serve(dir: &Path, side: u32, same_host: bool, connections: u32) -> Result<()> {
    let (runner, _) = Synthetic::rgb(side);
    let worker = SyntheticWorker::start(runner, dir, same_host, connections)?;
    let mut out = std::io::stdout();
    writeln!(out, "{}", worker.addr)?;
    out.flush()?;
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    drop(worker);
    Ok(())
}
