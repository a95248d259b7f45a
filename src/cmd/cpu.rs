//! `sluice cpu`: the CPU worker daemon. `--config FILE` (see `configs/cpu.toml`), or the quick
//! start `--listen ADDR`. The cluster token comes from `--token-file`, the config's
//! `token_file` or `SLUICE_TOKEN`; without one the worker refuses to start unless `--no-auth`
//! (then loopback only).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use sluice_cpu::admission::{describe, AdmissionSource};
use sluice_cpu::config::CpuConfig;
use sluice_cpu::server::{self, Setup};
use sluice_daemon::DaemonConfig;

use crate::daemon;

#[derive(clap::Args)]
pub struct Args {
    /// TOML config file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// QUIC (UDP) address to listen on (overrides the config's).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// TCP address for /metrics and /healthz (overrides the config's).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// File holding the cluster token (else the config's token_file, else $SLUICE_TOKEN).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Accept clients without a token; only on a loopback address.
    #[arg(long)]
    no_auth: bool,
    /// Teams sharing this worker, each with its own token (`[[tenant]]` tables with name,
    /// token_file, max_weight, max_credits): their jobs run as `<tenant>/<name>`, capped by
    /// their tenant's limits, and only their tokens are accepted (`docs/operations.md`).
    #[arg(long, conflicts_with_all = ["token_file", "no_auth"])]
    tenants: Option<PathBuf>,
    /// Where the self-signed certificate is kept (cert.pem, key.pem) when none is configured.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// TLS certificate chain (PEM); with --key.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// Decode threads (0 = one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Directory of the same-host socket (`cpu-<port>.sock`) that training processes on this
    /// machine attach shared memory through (overrides the config's `same_host.socket_dir`).
    #[arg(long)]
    same_host_dir: Option<PathBuf>,
    /// Serve QUIC only, no same-host socket.
    #[arg(long, conflicts_with = "same_host_dir")]
    no_same_host: bool,
    /// Keep the shard ranges read on local disk here, for later epochs (the config's
    /// `cache.dir`); needs --cache-size.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// The most the cache holds: bytes, or with a K, M, G or T suffix (powers of 1024).
    #[arg(long, value_parser = crate::args::parse_bytes)]
    cache_size: Option<u64>,
}

/// The state directory when neither the config nor `--state-dir` names one: systemd's
/// `$STATE_DIRECTORY`, else `~/.local/state/sluice`.
fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("STATE_DIRECTORY") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".local/state/sluice")
}

pub fn run(args: Args) -> Result<()> {
    daemon::init_logs();
    let mut config = match &args.config {
        Some(path) => CpuConfig::read(path)?,
        None => CpuConfig {
            state_dir: default_state_dir(),
            ..CpuConfig::default()
        },
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(m) = args.metrics_listen {
        config.metrics_listen = Some(m);
    }
    if let Some(t) = args.token_file.clone() {
        config.token_file = Some(t);
    }
    if args.no_auth {
        config.no_auth = true;
    }
    if let Some(t) = args.tenants.clone() {
        config.tenants_file = Some(t);
    }
    if let Some(d) = args.state_dir.clone() {
        config.state_dir = d;
    }
    if let (Some(c), Some(k)) = (args.cert.clone(), args.key.clone()) {
        config.cert = Some(c);
        config.key = Some(k);
    }
    if let Some(t) = args.threads {
        config.threads = t;
    }
    if let Some(d) = args.cache_dir.clone() {
        config.cache.dir = Some(d);
    }
    if let Some(n) = args.cache_size {
        config.cache.size_bytes = n;
    }
    if let Some(d) = args.same_host_dir.clone() {
        config.same_host.socket_dir = d;
        config.same_host.enabled = true;
    }
    if args.no_same_host {
        config.same_host.enabled = false;
    }
    let env_token = std::env::var("SLUICE_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty());
    if config.no_auth && env_token.is_some() && config.token_file.is_none() {
        bail!("--no-auth contradicts SLUICE_TOKEN; unset one");
    }
    config.validate()?;
    if config.has_tenants() && env_token.is_some() {
        tracing::warn!("SLUICE_TOKEN is ignored: with tenants only their tokens are accepted");
    }
    let source = AdmissionSource::from_config(&config, env_token);
    let admission = source.read()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .thread_name("sluice-cpu")
        .build()?;
    let socket = std::net::UdpSocket::bind(config.listen)
        .with_context(|| format!("binding UDP {}", config.listen))?;
    let listen = socket.local_addr()?;
    let metrics_listen = config.metrics_listen;
    // This process's recorder: the tiers record into it, /metrics renders it.
    let recorder = sluice_daemon::metrics_handle();
    let mut setup = Setup::from_config(config, admission, listen.port(), runtime.handle())?;
    // Tenants and tokens are read again while the worker serves (`sluice_cpu::admission`).
    setup.reload = Some(source);
    runtime.block_on(async move {
        let metrics = match metrics_listen {
            Some(addr) => Some((
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding metrics address {addr}"))?,
                recorder,
            )),
            None => None,
        };
        let metrics_addr = metrics.as_ref().and_then(|(m, _)| m.local_addr().ok());
        tracing::info!(%listen, metrics = ?metrics_addr, threads = setup.runner.threads(),
            admission = describe(&setup.admission), "sluice cpu serving");
        let shutdown = daemon::shutdown_on_signals()?;
        daemon::notify_ready(&shutdown);
        let result = server::run(socket, metrics, setup, shutdown).await;
        daemon::notify_stopping();
        result?;
        tracing::info!("stopped");
        Ok(())
    })
}
