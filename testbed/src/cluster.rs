//! The tiers started inside this process on loopback, over real sockets (HTTP for storage,
//! QUIC for workers): what `sluice demo` and `sluice bench` run when no daemons are given,
//! and what the end-to-end tests start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use sluice_cpu::config::CpuConfig;
use sluice_cpu::server::Setup;
use tokio_util::sync::CancellationToken;

use crate::error::{Result, TestbedError};

/// Tiers running on a runtime of their own; dropping this stops them.
pub struct LocalCluster {
    pub storage_url: String,
    pub workers: Vec<SocketAddr>,
    /// Pins every worker's certificate.
    pub trust: PathBuf,
    /// Where the workers' same-host sockets are: a client given this folder
    /// (`same_host_dir`) attaches shared memory instead of using QUIC.
    pub same_host_dir: PathBuf,
    pub token: String,
    stop: CancellationToken,
    runtime: Option<tokio::runtime::Runtime>,
    /// The storage node's own runtime, so its threads' CPU time is told from the workers'
    /// ([`crate::tier_cpu`]).
    storage_runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop.cancel();
        for rt in [self.runtime.take(), self.storage_runtime.take()]
            .into_iter()
            .flatten()
        {
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
/// of `threads` decode threads each; state (certificates, and a shard cache of `cache_bytes`
/// per worker when not 0) goes under `state`.
pub fn start(
    data: &Path,
    state: &Path,
    workers: usize,
    threads: usize,
    cache_bytes: u64,
) -> Result<LocalCluster> {
    // The process's recorder, installed here: every tier's metrics land in it.
    let recorder = sluice_daemon::metrics_handle();
    let runtime = |name: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(name)
            .enable_all()
            .build()
            .map_err(TestbedError::io(format!("starting the {name} runtime")))
    };
    let (runtime, storage_runtime) = (runtime("sluice-tiers")?, runtime("sluice-storage")?);
    let stop = CancellationToken::new();
    let bind = TestbedError::io("binding a loopback port");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(bind)?;
    let addr = listener
        .local_addr()
        .map_err(TestbedError::io("binding a loopback port"))?;
    let storage_url = format!("http://{addr}");
    let storage = sluice_storage::StorageConfig {
        mountpaths: vec![data.to_path_buf()],
        ..Default::default()
    };
    storage.validate()?;
    {
        let _enter = storage_runtime.enter();
        let listener = listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
            .map_err(TestbedError::io("listening on a loopback port"))?;
        let stop = stop.clone();
        storage_runtime.spawn(async move {
            if let Err(e) = sluice_storage::run(listener, storage, recorder, stop).await {
                tracing::error!("storage node: {e}");
            }
        });
    }
    let token = token();
    let mut addrs = Vec::new();
    let mut pem = String::new();
    let same_host_dir = state.join("same-host");
    std::fs::create_dir_all(&same_host_dir).map_err(TestbedError::io(format!(
        "creating {}",
        same_host_dir.display()
    )))?;
    for i in 0..workers {
        let dir = state.join(format!("worker-{i}"));
        let mut config = CpuConfig {
            listen: "127.0.0.1:0"
                .parse()
                .map_err(|_| TestbedError::Setup("loopback".into()))?,
            state_dir: dir.clone(),
            threads,
            ..Default::default()
        };
        if cache_bytes > 0 {
            config.cache.dir = Some(dir.join("cache"));
            config.cache.size_bytes = cache_bytes;
        }
        config.same_host = config.same_host_in(&same_host_dir);
        let socket = std::net::UdpSocket::bind(config.listen)
            .map_err(TestbedError::io("binding a loopback UDP port"))?;
        let addr = socket
            .local_addr()
            .map_err(TestbedError::io("binding a loopback UDP port"))?;
        addrs.push(addr);
        let setup = Setup::from_config(config, Some(token.clone()), addr.port(), runtime.handle())
            .map_err(|e| TestbedError::Setup(format!("worker {i}: {e}")))?;
        if setup.same_host.is_none() {
            return Err(TestbedError::Setup(format!(
                "worker {i}: no same-host socket in {}",
                same_host_dir.display()
            )));
        }
        let cert = &setup.identity.cert_path;
        pem.push_str(
            &std::fs::read_to_string(cert)
                .map_err(TestbedError::io(format!("reading {}", cert.display())))?,
        );
        let stop = stop.clone();
        runtime.spawn(async move {
            if let Err(e) = sluice_cpu::server::run(socket, None, setup, stop).await {
                tracing::error!("cpu worker: {e}");
            }
        });
    }
    let trust = state.join("trust.pem");
    std::fs::write(&trust, pem)
        .map_err(TestbedError::io(format!("writing {}", trust.display())))?;
    Ok(LocalCluster {
        storage_url,
        workers: addrs,
        trust,
        same_host_dir,
        token,
        stop,
        runtime: Some(runtime),
        storage_runtime: Some(storage_runtime),
    })
}

/// The sum of a counter's series in the process's Prometheus text.
pub fn counter(name: &str) -> f64 {
    crate::sizing::counter_in(&sluice_daemon::metrics_handle().render(), name)
}

/// Starts the tiers over `work/data` (whose `demo` bucket holds `train-NNNNNN.tar` shards) and
/// describes the bucket's shards, as served, in a manifest.
pub fn serve_demo_bucket(
    work: &Path,
    workers: usize,
    threads: usize,
    cache_bytes: u64,
) -> Result<(LocalCluster, sluice_shard::Manifest)> {
    let tiers = start(
        &work.join("data"),
        &work.join("state"),
        workers,
        threads,
        cache_bytes,
    )?;
    let shards = sluice_dataset::locate::shard_count(&work.join("data").join("demo"))?;
    let manifest = sluice_dataset::locate::dataset(&format!(
        "{}/v1/demo/train-{{000000..{:06}}}.tar",
        tiers.storage_url,
        shards.saturating_sub(1)
    ))?;
    Ok((tiers, manifest))
}

/// Shards per file in the buckets this module makes.
const DEMO_SHARD_SAMPLES: u64 = 50;

/// Generates about `samples` JPEGs (10 classes) under `work/images` and shards them into
/// `bucket`; returns how the dataset was made.
pub fn generate_bucket(samples: u32, work: &Path, bucket: &Path) -> Result<String> {
    let images = work.join("images");
    let per_class = samples.div_ceil(10).max(1);
    sluice_dataset::synth::generate(&images, 10, per_class, 0, 90)?;
    shard_images(&images, bucket)?;
    Ok(format!("{} generated JPEGs", per_class * 10))
}

/// Shards an ImageFolder tree, or a flat folder with a `labels.tsv`, into `bucket` as
/// `train-NNNNNN.tar` (with their `.idx`).
pub fn shard_images(input: &Path, bucket: &Path) -> Result<()> {
    let pattern = bucket.join("train-%06d.tar");
    let config = sluice_shard::WriterConfig {
        max_count: Some(DEMO_SHARD_SAMPLES),
        ..sluice_shard::WriterConfig::new(pattern.display().to_string())
    };
    let labels = input.join("labels.tsv");
    let labels = labels.exists().then_some(labels);
    sluice_dataset::write::write_folder(
        input,
        (sluice_dataset::write::Folder::Images, labels.as_deref()),
        config,
        sluice_dataset::write::Order::default(),
        None,
        &mut sluice_dataset::Quiet,
    )?;
    Ok(())
}

/// Links (or copies) the shards `spec` names into `bucket` as `train-NNNNNN.tar`, with their
/// `.idx` where they have one; returns how many.
pub fn link_shards(spec: &str, bucket: &Path) -> Result<usize> {
    let names = sluice_shard::expand(spec)?;
    for (i, name) in names.iter().enumerate() {
        let src = PathBuf::from(name);
        let dst = bucket.join(format!("train-{i:06}.tar"));
        if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst).map_err(TestbedError::io(format!("copying {name}")))?;
        }
        let idx = sluice_shard::SampleIndex::sidecar_path(&src);
        if idx.exists() {
            let _ = std::fs::copy(&idx, sluice_shard::SampleIndex::sidecar_path(&dst));
        }
    }
    Ok(names.len())
}

/// A generated dataset of about `samples` JPEGs served by tiers started in this process
/// (`workers` CPU workers sharing this machine's cores) under `work`: the tiers, the
/// manifest of their shards, and a line saying what runs.
pub fn generated_chain(
    samples: u32,
    workers: usize,
    work: &Path,
) -> Result<(LocalCluster, sluice_shard::Manifest, String)> {
    let bucket = work.join("data").join("demo");
    std::fs::create_dir_all(&bucket)
        .map_err(TestbedError::io(format!("creating {}", bucket.display())))?;
    let what = generate_bucket(samples, work, &bucket)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = (cores / workers.max(1)).max(1);
    let (tiers, manifest) = serve_demo_bucket(work, workers, threads, 0)?;
    Ok((
        tiers,
        manifest,
        format!("{what}, {workers} workers × {threads} threads in this process"),
    ))
}

impl LocalCluster {
    /// `base` consumers of these tiers over each transport: QUIC, then the same-host one.
    pub fn over_each_transport(
        &self,
        base: &crate::consumers::ConsumerConfig,
    ) -> Vec<(&'static str, crate::consumers::ConsumerConfig)> {
        vec![
            (
                "quic",
                crate::consumers::ConsumerConfig {
                    loader: sluice_client::LoaderConfig {
                        same_host: sluice_client::SameHost::Off,
                        ..base.loader.clone()
                    },
                    ..base.clone()
                },
            ),
            (
                "same-host",
                crate::consumers::ConsumerConfig {
                    loader: sluice_client::LoaderConfig {
                        same_host: sluice_client::SameHost::Require,
                        same_host_dir: self.same_host_dir.clone(),
                        ..base.loader.clone()
                    },
                    ..base.clone()
                },
            ),
        ]
    }
}
