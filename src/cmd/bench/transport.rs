//! `sluice bench transport`: tensor throughput of the transports, one connection, in one run:
//! QUIC on loopback, the same-host shared-memory transport, a plain TCP stream carrying the
//! same frames, and a single-thread memcpy of the same bytes (the probes are
//! `sluice_testbed::transport`).
//!
//! The QUIC and same-host sides are the real system minus decoding: a `sluice cpu` server (in
//! this process) whose worker emits ready-made 224×224×3 tensors, and a client `Loader` that
//! grants credits, accounts for every sample and assembles batches. The TCP side writes the
//! same frames with the same codec into a socket and reads each payload into a buffer. The
//! memcpy copies each tensor once, from a pool as large as the client's slots into a batch
//! buffer: what moving the bytes costs at all on this machine.

use anyhow::Result;
use sluice_testbed::transport::{compare, TransportPath};

#[derive(clap::Args)]
pub struct TransportArgs {
    #[command(flatten)]
    probe: super::probe::ProbeArgs,
    /// Repeat each measurement this many times and keep the best.
    #[arg(long, default_value_t = 3)]
    repeat: u32,
    /// Epochs of one loader per measurement, one after the other: the first warms up what a
    /// loader keeps across epochs (tensor buffers, same-host segments) and the rest are
    /// timed, as a training run's steady state; 1 times one epoch from the loader's start.
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// Measure this path alone, to profile it: quic, same-host, tcp or memcpy (the ratios
    /// need all four).
    #[arg(long)]
    only: Option<TransportPath>,
}

pub fn run(args: TransportArgs) -> Result<()> {
    let probe = args.probe.probe();
    println!(
        "sluice bench transport: {} samples of {} bytes an epoch, {}, {} QUIC connection(s), \
         loopback, best of {}",
        probe.samples,
        u64::from(probe.side) * u64::from(probe.side) * 3,
        match args.epochs {
            0 | 1 => "one epoch from the loader's start".to_string(),
            n => format!("epochs 2..{n} of one loader (the first warms it up)"),
        },
        probe.connections,
        args.repeat
    );
    let f = compare(&probe, args.repeat, args.epochs, args.only)?;
    let line = |what: &str, v: f64| {
        if v > 0.0 {
            println!("transport\t{what}\t{:.2} GB/s", v / 1e9)
        }
    };
    line("quic (server → Loader, credits, batches)", f.quic);
    line("same-host (server → shared memory → Loader)", f.same_host);
    line("tcp (same frames, read into a buffer)", f.tcp);
    line("memcpy (one thread, each tensor once)", f.memcpy);
    if args.only.is_none() {
        println!("transport\tquic/tcp\t{:.2}", f.quic / f.tcp);
        println!("transport\tsame-host/memcpy\t{:.2}", f.same_host / f.memcpy);
        println!("transport\tsame-host/quic\t{:.2}", f.same_host / f.quic);
    }
    Ok(())
}
