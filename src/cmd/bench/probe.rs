//! What several benches share: the arguments of a transport probe (`bench transport`,
//! `bench host-cost`) and the host-cost measurement (`bench host-cost`, `bench all`), with
//! its worker in a child process (this binary, `bench host-cost --serve`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use sluice_testbed::host_cost::{self, HostCost};
use sluice_testbed::transport::TransportProbe;

/// What a transport probe sends.
#[derive(clap::Args)]
pub struct ProbeArgs {
    /// Samples to send each way.
    #[arg(long, default_value_t = 8192)]
    pub samples: u64,
    /// Tensor side (side × side × 3 bytes per sample).
    #[arg(long, default_value_t = 224)]
    pub side: u32,
    /// Credits (samples in flight) the client grants.
    #[arg(long, default_value_t = 256)]
    pub credits: u32,
    /// QUIC connections to the worker (the loader's `connections_per_worker`).
    #[arg(long, default_value_t = 1)]
    pub connections: u32,
    /// The client's runtime threads (the loader's `io_threads`; 0: the loader's default).
    #[arg(long, default_value_t = 0)]
    pub io_threads: usize,
}

impl ProbeArgs {
    pub fn probe(&self) -> TransportProbe {
        TransportProbe {
            samples: self.samples,
            side: self.side,
            credits: self.credits,
            connections: self.connections,
            io_threads: self.io_threads,
        }
    }
}

/// One transport's figures.
pub struct Row {
    pub transport: &'static str,
    pub cost: HostCost,
    /// The floor, µs per sample.
    pub floor: f64,
    pub floor_parts: String,
}

/// Each transport's cost and floor (or `only` one).
pub fn measure(
    probe: &TransportProbe,
    repeat: u32,
    epochs: u64,
    only: Option<&str>,
) -> Result<Vec<Row>> {
    let bytes = (u64::from(probe.side) * u64::from(probe.side) * 3) as usize;
    let floor = host_cost::floor(bytes, probe.samples, probe.credits as usize)?;
    let mut rows = Vec::new();
    for (transport, same_host) in [("quic", false), ("same-host", true)] {
        if only.is_some_and(|o| o != transport) {
            continue;
        }
        let mut best: Option<HostCost> = None;
        for _ in 0..repeat.max(1) {
            let cost = once(probe, same_host, epochs)?;
            if best.is_none_or(|b| cost.micros_per_sample() < b.micros_per_sample()) {
                best = Some(cost);
            }
        }
        let cost = best.context("no measurement")?;
        let (floor_us, parts) = match same_host {
            false => (
                floor.kernel_us + floor.decrypt_us + floor.copy_us,
                format!(
                    "kernel receive {:.1} + {} AES-256-GCM in {}-byte packets {:.1} + copy {:.1}",
                    floor.kernel_us,
                    floor.aes_gcm.name(),
                    floor.packet,
                    floor.decrypt_us,
                    floor.copy_us
                ),
            ),
            true => (floor.copy_us, format!("copy {:.1}", floor.copy_us)),
        };
        rows.push(Row {
            transport,
            cost,
            floor: floor_us,
            floor_parts: parts,
        });
    }
    Ok(rows)
}

/// One epoch against a worker in a child process.
fn once(probe: &TransportProbe, same_host: bool, epochs: u64) -> Result<HostCost> {
    let dir = tempfile::tempdir().context("a temporary folder")?;
    let (mut child, addr) = spawn_worker(dir.path(), probe, same_host)?;
    let cost = host_cost::client_cost(probe, addr, dir.path(), same_host, epochs);
    // Closing its stdin stops the worker.
    drop(child.stdin.take());
    let _ = child.wait();
    Ok(cost?)
}

/// Starts this binary as the worker (`--serve`); its address once it listens.
fn spawn_worker(
    dir: &Path,
    probe: &TransportProbe,
    same_host: bool,
) -> Result<(Child, std::net::SocketAddr)> {
    let exe = std::env::current_exe().context("finding this binary to start the worker")?;
    let mut command = Command::new(exe);
    command
        .args(["bench", "host-cost", "--serve"])
        .arg(dir)
        .args([
            "--side",
            &probe.side.to_string(),
            "--connections",
            &probe.connections.to_string(),
        ]);
    if same_host {
        command.arg("--serve-same-host");
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the worker process")?;
    let stdout = child.stdout.take().context("the worker's stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .context("reading the worker's address")?;
    let addr = line
        .trim()
        .parse()
        .with_context(|| format!("the worker said {line:?}, not its address"))?;
    Ok((child, addr))
}
