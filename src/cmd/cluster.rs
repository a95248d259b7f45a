//! The tiers started inside this process on loopback, over real sockets (HTTP for storage,
//! QUIC for workers): what `sluice demo` and `sluice bench` run when no daemons are given.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use sluice_cpu::config::CpuConfig;
use sluice_cpu::server::Setup;
use sluice_cpu::{CpuWorker, EngineConfig, ShardSource, SourceConfig};
use tokio_util::sync::CancellationToken;

/// Tiers running on a runtime of their own; dropping this stops them.
pub struct LocalCluster {
    pub storage_url: String,
    pub workers: Vec<SocketAddr>,
    /// Pins every worker's certificate.
    pub trust: PathBuf,
    pub token: String,
    stop: CancellationToken,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(2));
        }
    }
}

/// A random cluster token for this run.
fn token() -> String {
    let mut bytes = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Starts a storage node serving `data` (one bucket per subfolder) and `workers` CPU workers
/// of `threads` decode threads each; state (certificates) goes under `state`.
pub fn start(data: &Path, state: &Path, workers: usize, threads: usize) -> Result<LocalCluster> {
    // The storage tier's recorder becomes the process's: every tier's metrics land in it.
    let _ = sluice_storage::metrics_handle();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sluice-tiers")
        .enable_all()
        .build()?;
    let stop = CancellationToken::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let storage_url = format!("http://{}", listener.local_addr()?);
    let storage = sluice_storage::StorageConfig {
        mountpaths: vec![data.to_path_buf()],
        ..Default::default()
    };
    storage.validate()?;
    listener.set_nonblocking(true)?;
    {
        let _enter = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let stop = stop.clone();
        runtime.spawn(async move {
            if let Err(e) = sluice_storage::run(listener, storage, stop).await {
                tracing::error!("storage node: {e}");
            }
        });
    }
    let token = token();
    let mut addrs = Vec::new();
    let mut pem = String::new();
    for i in 0..workers {
        let dir = state.join(format!("worker-{i}"));
        let identity = sluice_cpu::tls::self_signed(&dir, &["localhost".into()])?;
        pem.push_str(
            &std::fs::read_to_string(&identity.cert_path)
                .with_context(|| format!("reading {}", identity.cert_path.display()))?,
        );
        let config = CpuConfig {
            state_dir: dir,
            threads,
            ..Default::default()
        };
        let engine = EngineConfig {
            threads,
            ..Default::default()
        };
        let worker = CpuWorker::new(engine, ShardSource::new(SourceConfig::default())?)?;
        let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
        addrs.push(socket.local_addr()?);
        let setup = Setup {
            config,
            identity,
            token: Some(token.clone()),
            runner: Arc::new(worker),
            same_host: None,
        };
        let stop = stop.clone();
        runtime.spawn(async move {
            if let Err(e) = sluice_cpu::server::run(socket, None, setup, stop).await {
                tracing::error!("cpu worker: {e}");
            }
        });
    }
    let trust = state.join("trust.pem");
    std::fs::write(&trust, pem)?;
    Ok(LocalCluster {
        storage_url,
        workers: addrs,
        trust,
        token,
        stop,
        runtime: Some(runtime),
    })
}

/// The sum of a counter's series in the process's Prometheus text.
pub fn counter(name: &str) -> f64 {
    sluice_storage::metrics_handle()
        .render()
        .lines()
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ' | b'{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Starts the tiers over `work/data` (whose `demo` bucket holds `train-NNNNNN.tar` shards) and
/// describes the bucket's shards, as served, in a manifest.
pub fn serve_demo_bucket(
    work: &Path,
    workers: usize,
    threads: usize,
) -> Result<(LocalCluster, sluice_shard::Manifest)> {
    let tiers = start(&work.join("data"), &work.join("state"), workers, threads)?;
    let shards = super::index::shard_count(&work.join("data").join("demo"))?;
    let manifest = super::index::dataset(&format!(
        "{}/v1/demo/train-{{000000..{:06}}}.tar",
        tiers.storage_url,
        shards.saturating_sub(1)
    ))?;
    Ok((tiers, manifest))
}
