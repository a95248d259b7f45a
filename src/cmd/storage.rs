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
    /// A file holding an upload token (its first line); repeat for several. Else
    /// `$SLUICE_TOKEN`, and the config's `upload_token_files` and `upload_tokens`.
    #[arg(long)]
    token_file: Vec<PathBuf>,
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
    if let Some(url) = &args.advertise {
        config.advertise = Some(url.clone());
    }
    upload_tokens(&mut config, &args)?;
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

/// Settles the upload tokens kept out of the config file: each `upload_token_files` entry
/// (already the config file's, `DaemonConfig::read`) and each `--token-file` are read at
/// start and again while the node serves, each checked readable now (a bad one stops the
/// node by name); `$SLUICE_TOKEN` joins the config's own tokens.
fn upload_tokens(config: &mut StorageConfig, args: &Args) -> Result<()> {
    let files: Vec<std::path::PathBuf> = std::mem::take(&mut config.upload_token_files)
        .into_iter()
        .chain(args.token_file.iter().cloned())
        .collect();
    for path in &files {
        sluice_wire::token::read(path)
            .with_context(|| format!("upload token file {}", path.display()))?;
    }
    if let Ok(text) = std::env::var("SLUICE_TOKEN") {
        config
            .upload_tokens
            .push(sluice_wire::token::from_text(&text, "SLUICE_TOKEN")?);
    }
    config.upload_token_files = files;
    Ok(())
}
