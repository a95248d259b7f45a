//! `sluice storage`: the shard server. `--config FILE` (see `configs/storage.toml`), or the
//! quick start `--data DIR --listen ADDR` (DIR is one mountpath; its subfolders are buckets).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use sluice_daemon::DaemonConfig;
use sluice_storage::StorageConfig;

use crate::daemon;

#[derive(clap::Args)]
pub struct Args {
    /// TOML config file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Quick start: serve this folder (one bucket per subfolder).
    #[arg(long, conflicts_with = "config")]
    data: Option<PathBuf>,
    /// Listen address (overrides the config's).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// This node's URL among the config's peers (overrides `advertise`; one config can then
    /// serve every node of a StatefulSet).
    #[arg(long)]
    advertise: Option<String>,
}

pub fn run(args: Args) -> Result<()> {
    daemon::init_logs();
    let mut config = match (&args.config, &args.data) {
        (Some(path), _) => StorageConfig::read(path)?,
        (None, Some(dir)) => StorageConfig {
            mountpaths: vec![dir.clone()],
            ..StorageConfig::default()
        },
        (None, None) => bail!("give --config FILE or --data DIR"),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(url) = args.advertise {
        config.advertise = Some(url);
    }
    config.validate()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sluice-storage")
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
        tracing::info!(listen = %listener.local_addr()?, mountpaths = ?config.mountpaths, "sluice storage serving");
        let shutdown = daemon::shutdown_on_signals()?;
        daemon::notify_ready(&shutdown);
        // On a worker, not in block_on's thread: each accepted connection's task then starts
        // on the accepting worker instead of waking another thread (0.2 ms per connection).
        let result = tokio::spawn(sluice_storage::run(listener, config, sluice_daemon::metrics_handle(), shutdown))
            .await
            .context("the storage server task")?;
        daemon::notify_stopping();
        result?;
        tracing::info!("stopped");
        Ok(())
    })
}
