//! [`LoaderBuilder`]: a [`LoaderConfig`] filled in setting by setting (or whole), plus what
//! is not data (the manifest, an in-process decoder, the allocator), validated and built.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_plan::{
    BatchPlan, EpochPlanner, LastBatch, MixBase, Mixing, Mixture, Remainder, ShufflePolicy,
};
use sluice_shard::Manifest;
use sluice_wire::{BufferPool, FieldSelection, LabelSource, UnitRunner};

use super::{checkpoint, Loader, Workers};
use crate::batch::{HeapAllocator, HostAllocator, Recycling, ShortBatch};
use crate::config::{LabelRange, LoaderConfig, Order};
use crate::error::ClientError;
use crate::same_host::{ArenaPlan, SameHost, Segments};
use crate::stats::Stats;

/// Builds a [`Loader`]; every setting has a default but the dataset and the workers.
pub struct LoaderBuilder {
    config: LoaderConfig,
    /// The dataset: one manifest, or a mixture's sources (name, manifest).
    sources: Vec<(String, Manifest)>,
    runner: Option<Arc<dyn UnitRunner>>,
    allocator: Arc<dyn HostAllocator>,
    token: Option<String>,
    /// The settings as [`Self::valid_config`] took them, validated.
    validated: Option<LoaderConfig>,
}

impl Default for LoaderBuilder {
    fn default() -> Self {
        LoaderBuilder {
            config: LoaderConfig::default(),
            sources: Vec::new(),
            runner: None,
            allocator: Arc::new(HeapAllocator),
            token: None,
            validated: None,
        }
    }
}

/// A setter of one [`LoaderConfig`] field (documented there).
macro_rules! setter {
    ($($name:ident: $t:ty),* $(,)?) => {
        $(
            #[doc = concat!("Sets [`LoaderConfig::", stringify!($name), "`].")]
            pub fn $name(mut self, $name: $t) -> Self {
                self.config.$name = $name;
                self
            }
        )*
    };
}

impl LoaderBuilder {
    setter!(
        dataset_name: String, pipeline: String, batch_size: u32, seed: u64, rank: u32,
        world_size: u32, shuffle: ShufflePolicy, remainder: Remainder, max_unit_samples: u64,
        order: Order, mixing: Mixing, lookahead: u64, hedge_after: Duration,
        labels: LabelRange, last_batch: LastBatch, short_batch: ShortBatch,
        fail_on_bad_sample: bool, fields: FieldSelection, label: LabelSource,
        max_field_bytes: u64, credits_per_worker: u32, units_per_worker: usize,
        connections_per_worker: u32, io_threads: usize, ring_batches: usize, worker_wait: Duration,
        heartbeat: Duration, silence: Duration, connect_timeout: Duration,
        max_unit_attempts: u32, client_name: String, same_host: SameHost,
        same_host_dir: PathBuf, prefetch_next_epoch: bool, weights: Vec<f64>,
        job_weight: u32, same_host_uid: Option<u32>, mixture_round_samples: u64, share: bool,
    );

    /// The training job's name on the workers (see [`LoaderConfig::job_name`]).
    pub fn job_name(mut self, name: impl Into<String>) -> Self {
        self.config.job_name = Some(name.into());
        self
    }

    /// Samples in an epoch of a mixture (default: all its sources' samples).
    pub fn epoch_samples(mut self, samples: u64) -> Self {
        self.config.epoch_samples = Some(samples);
        self
    }

    /// A mixture: several sources (a name for reports, a manifest each), drawn by
    /// [`LoaderConfig::weights`] (see `sluice_plan::mixture`).
    pub fn sources<I, S>(mut self, sources: I) -> Self
    where
        I: IntoIterator<Item = (S, Manifest)>,
        S: Into<String>,
    {
        self.sources = sources.into_iter().map(|(n, m)| (n.into(), m)).collect();
        self
    }

    /// Every setting at once (a binding's, deserialized).
    pub fn config(mut self, config: LoaderConfig) -> Self {
        self.config = config;
        self
    }

    /// Every setting at once, validated already: [`Self::build`] validates them again only
    /// if they changed since.
    pub fn valid_config(mut self, config: crate::config::ValidConfig) -> Self {
        self.config = config.into_inner();
        self.validated = Some(self.config.clone());
        self
    }

    /// The dataset's manifest (shard URLs must be absolute or resolvable by the workers).
    pub fn dataset(mut self, manifest: Manifest) -> Self {
        self.sources = vec![(self.config.dataset_name.clone(), manifest)];
        self
    }

    /// Remote workers (`host:port`).
    pub fn workers<I, S>(mut self, workers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.config.workers = workers.into_iter().map(Into::into).collect();
        self
    }

    /// A file of remote workers, one `host:port` a line, re-read while epochs run: workers
    /// added to it join the pool, workers removed from it are drained (see
    /// [`LoaderConfig::workers_file`]). With [`Self::workers`] too, the pool is both.
    pub fn workers_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.config.workers_file = Some(path.into());
        self
    }

    /// How often the workers file is re-read and worker names re-resolved (default 1 s).
    pub fn workers_refresh(mut self, every: std::time::Duration) -> Self {
        self.config.workers_refresh = every;
        self
    }

    /// Decode in this process with `runner` (no daemons).
    pub fn in_process(mut self, runner: Arc<dyn UnitRunner>) -> Self {
        self.runner = Some(runner);
        self
    }

    /// How many epochs the job reads (`0..epochs`), when known: the epoch after the last is
    /// then not started early.
    pub fn epochs(mut self, epochs: u64) -> Self {
        self.config.epochs = Some(epochs);
        self
    }

    /// The cluster token the workers expect (else `token_file`'s).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A PEM file with the workers' certificates (pinned) or their CA.
    pub fn trust_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.trust_cert = Some(path.into());
        self
    }

    /// Where batch buffers come from (page-locked memory for CUDA).
    pub fn allocator(mut self, allocator: Arc<dyn HostAllocator>) -> Self {
        self.allocator = allocator;
        self
    }

    pub fn build(mut self) -> Result<Loader, ClientError> {
        if self.validated.as_ref() != Some(&self.config) {
            self.config.validate()?;
        }
        let config = Arc::new(self.config);
        if self.sources.is_empty() {
            return Err(bad("dataset", "no dataset given"));
        }
        let (manifest, mixture) = combine(self.sources, &config)?;
        let workers = match (self.runner, !config.remote()) {
            (Some(runner), true) => Workers::InProcess(runner),
            (None, false) => Workers::Remote(config.workers.clone()),
            (Some(_), false) => {
                return Err(bad(
                    "workers",
                    "give remote workers or in-process decoding, not both",
                ))
            }
            (None, true) => {
                return Err(bad(
                    "workers",
                    "give remote workers or choose in-process decoding",
                ))
            }
        };
        let token = match (self.token, &config.token_file) {
            (Some(t), _) => Some(t),
            (None, Some(path)) => Some(
                sluice_wire::token::read(path).map_err(|e| bad("token_file", &e.to_string()))?,
            ),
            (None, None) => None,
        };
        let (planner, batch_plan) = plan_world(&config, &manifest, mixture.clone())?;
        let threads = config.runtime_threads();
        tracing::debug!(threads, chosen = config.io_threads == 0, "loader runtime");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("sluice-client")
            .enable_all()
            .build()
            .map_err(|e| ClientError::Runtime(e.to_string()))?;
        let quic = match (&workers, &config.trust_cert) {
            (Workers::Remote(_), Some(trust)) => Some(quic_client(&config, trust, &runtime)?),
            _ => None,
        };
        let allocator: Arc<dyn HostAllocator> =
            Arc::new(Recycling::new(self.allocator, config.ring_batches));
        Ok(Loader {
            buffers: Arc::new(BufferPool::new(held_samples(&config, &workers))),
            segments: Arc::new(Segments::new(
                segments_kept(&workers),
                arena_plan(&config, &workers).map(|p| (p, allocator.clone())),
            )),
            last_pool: Default::default(),
            fingerprint: checkpoint::fingerprint(&manifest),
            manifest: Arc::new(manifest),
            source_names: mixture
                .as_ref()
                .map(|m| m.names.clone())
                .unwrap_or_default(),
            source_bounds: mixture
                .as_ref()
                .map(|m| shard_bounds(&m.mixture.shards))
                .unwrap_or_else(|| Arc::from([])),
            initial_planner: Arc::new(planner.clone()),
            planner: Mutex::new(Arc::new(planner)),
            batch_plan,
            workers,
            token,
            quic,
            runtime: Some(runtime),
            allocator,
            progress: Arc::new(Mutex::new(None)),
            resume: Mutex::new(None),
            loaded: Mutex::new(None),
            next: Mutex::new(None),
            last_epoch: Mutex::new(None),
            passes: AtomicU64::new(0),
            stats: Arc::new(Stats::new()),
            config,
        })
    }
}

/// The batch arena, when batches may live in one: same-host workers possible, and plan order
/// (a sample's place in its batch is known before it arrives). The loader's allocator must
/// also adopt it ([`HostAllocator::adopt`]: the heap's and the CUDA one do).
fn arena_plan(config: &LoaderConfig, workers: &Workers) -> Option<ArenaPlan> {
    let same_host = matches!(workers, Workers::Remote(_)) && config.same_host != SameHost::Off;
    if !same_host || config.order != Order::Plan {
        return None;
    }
    Some(ArenaPlan {
        ring: u32::try_from(config.ring_batches).ok()?,
        waiting: config.waiting_bound(),
        batch: config.batch_size,
    })
}

fn bad(key: &'static str, detail: &str) -> ClientError {
    ClientError::Config {
        key,
        detail: detail.into(),
    }
}

/// A mixture's sources as the loader keeps them.
#[derive(Clone)]
struct Sources {
    names: Vec<String>,
    mixture: Mixture,
}

/// The first shard of each source in the combined manifest, one extra at the end.
fn shard_bounds(shards: &[u32]) -> Arc<[u32]> {
    let mut out = vec![0u32];
    for &n in shards {
        out.push(out[out.len() - 1] + n);
    }
    Arc::from(out)
}

/// One manifest for the planner and the workers: a single dataset's, or a mixture's sources'
/// shards one source after another.
fn combine(
    sources: Vec<(String, Manifest)>,
    config: &LoaderConfig,
) -> Result<(Manifest, Option<Sources>), ClientError> {
    for (name, m) in &sources {
        m.validate(name)
            .map_err(|e| bad("dataset", &e.to_string()))?;
    }
    let mixed = sources.len() > 1 || !config.weights.is_empty();
    if !mixed {
        if config.epoch_samples.is_some() {
            return Err(bad("epoch_samples", "is for a mixture of several sources"));
        }
        if config.weight_schedule.is_some() {
            return Err(bad(
                "weight_schedule",
                "is for a mixture of several sources",
            ));
        }
        let (_, manifest) = sources.into_iter().next().expect("one source");
        return Ok((manifest, None));
    }
    let weights = match config.weights.is_empty() {
        true => sources
            .iter()
            .map(|(_, m)| m.total_samples() as f64)
            .collect(),
        false => config.weights.clone(),
    };
    if weights.len() != sources.len() {
        let detail = format!("{} weights for {} sources", weights.len(), sources.len());
        return Err(bad("weights", &detail));
    }
    let weights = sluice_plan::mixture::scale_weights(&weights)
        .map_err(|e| bad("weights", &e.to_string()))?;
    let shards = sources.iter().map(|(_, m)| m.shards.len() as u32).collect();
    let names = sources.iter().map(|(n, _)| n.clone()).collect();
    let manifest = Manifest::new(sources.into_iter().flat_map(|(_, m)| m.shards).collect());
    let schedule = match &config.weight_schedule {
        Some(spec) => Some(
            spec.build(Vec::len(&shards))
                .map_err(|e| bad("weight_schedule", &e.to_string()))?,
        ),
        None => None,
    };
    let mixture = Mixture {
        shards,
        // With a schedule, its first point's (what a checkpoint of step 0 records).
        weights: schedule.as_ref().map_or(weights, |s| s.at(0)),
        epoch_samples: config.epoch_samples,
        base: MixBase::default(),
        schedule,
        round_samples: config.mixture_round_samples,
    };
    Ok((manifest, Some(Sources { names, mixture })))
}

/// The planner of this dataset under `config`, and each rank's batches. An impossible world
/// (more ranks than samples under "drop", no batch at all) is refused here, before a runtime,
/// a connection or a plan is made.
fn plan_world(
    config: &LoaderConfig,
    manifest: &Manifest,
    sources: Option<Sources>,
) -> Result<(EpochPlanner, BatchPlan), ClientError> {
    manifest
        .validate(&config.dataset_name)
        .map_err(|e| bad("dataset", &e.to_string()))?;
    let counts: Vec<u64> = manifest.shards.iter().map(|s| s.samples).collect();
    let plan_config = config.plan_config();
    let mixture = sources.map(|s| s.mixture);
    if let Some(m) = &mixture {
        m.validate(&counts, &plan_config).map_err(|e| match e {
            sluice_plan::PlanError::Policy(_) => bad("shuffle", &e.to_string()),
            _ => bad("dataset", &e.to_string()),
        })?;
    }
    sluice_plan::validate(&counts, &plan_config, config.rank)
        .map_err(|e| bad("world_size", &e.to_string()))?;
    let total = manifest.total_samples();
    let batch_size = u64::from(config.batch_size);
    let planner = EpochPlanner {
        counts,
        config: plan_config,
        mixing: config.mixing,
        batch_size,
        last_batch: config.last_batch,
        mixture,
    };
    let per_rank = planner.samples_per_rank(config.world_size);
    let batch_plan = BatchPlan::new(per_rank, batch_size, config.last_batch);
    if batch_plan.batches == 0 && total > 0 {
        let detail = format!(
            "each of the {} ranks gets {per_rank} of the dataset's {total} samples, so an \
             epoch would have no batch at all (batch_size {}, drop_last {}, remainder {:?}): \
             use fewer ranks, a smaller batch_size, or drop_last=False",
            config.world_size,
            config.batch_size,
            config.last_batch == LastBatch::Drop,
            config.remainder,
        );
        return Err(bad("drop_last", &detail));
    }
    Ok((planner, batch_plan))
}

/// Samples the client may hold between arrival and batch: the plan order's reorder bound
/// (see `crate::reorder`) and every worker's credits.
fn held_samples(config: &LoaderConfig, workers: &Workers) -> usize {
    let links = match workers {
        // A pool that changes (a workers file, DNS names) is sized for what it starts with.
        Workers::Remote(names) => {
            names.len().max(1) as u64 * u64::from(config.connections_per_worker)
        }
        Workers::InProcess(_) => 0,
    };
    let held = config.waiting_bound() + links * u64::from(config.credits_per_worker);
    held.min(1 << 16) as usize
}

/// Same-host segments kept for later connections: one per worker with one epoch started
/// early behind another.
fn segments_kept(workers: &Workers) -> usize {
    match workers {
        Workers::Remote(names) => 2 * names.len().max(1),
        Workers::InProcess(_) => 0,
    }
}

/// The QUIC endpoint and client settings for remote workers.
fn quic_client(
    config: &LoaderConfig,
    trust: &std::path::Path,
    runtime: &tokio::runtime::Runtime,
) -> Result<(crate::quic::Endpoint, quinn_proto::ClientConfig), ClientError> {
    let mut t = quinn_proto::TransportConfig::default();
    t.max_concurrent_bidi_streams(0u32.into());
    t.max_concurrent_uni_streams(0u32.into());
    let window = config.receive_window.min(u32::MAX as u64) as u32;
    t.stream_receive_window(window.into());
    t.receive_window(window.into());
    t.keep_alive_interval(Some(config.heartbeat));
    let mut mtu = quinn_proto::MtuDiscoveryConfig::default();
    mtu.upper_bound(sluice_wire::quic::MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    t.max_idle_timeout(config.silence.try_into().ok());
    let client = crate::tls::client_config(trust, t)?;
    Ok((quic_endpoint(runtime)?, client))
}

/// The client's QUIC endpoint: datagrams up to [`sluice_wire::quic::MAX_UDP_PAYLOAD`] and a
/// receive buffer that rides out a descheduled client thread (see
/// [`sluice_wire::quic::SOCKET_BUFFER_BYTES`]). A smaller buffer than asked for only costs
/// speed, so it is logged, not fatal.
fn quic_endpoint(runtime: &tokio::runtime::Runtime) -> Result<crate::quic::Endpoint, ClientError> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        ClientError::Runtime(format!("QUIC endpoint: {what}: {e}"))
    };
    // Dual-stack where the machine has IPv6 (workers may be A or AAAA records), else IPv4.
    let socket = match crate::membership::ipv6() {
        true => std::net::UdpSocket::bind(SocketAddr::from(([0u16; 8], 0)))
            .map_err(|e| failed("bind [::]:0", &e))?,
        false => std::net::UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))
            .map_err(|e| failed("bind 0.0.0.0:0", &e))?,
    };
    if let Some(why) = sluice_wire::quic::grow_buffer(&socket, sluice_wire::quic::Buffer::Receive) {
        tracing::debug!("{why}");
    }
    let mut config = quinn_proto::EndpointConfig::default();
    config
        .max_udp_payload_size(sluice_wire::quic::MAX_UDP_PAYLOAD)
        .map_err(|e| failed("datagram size", &e))?;
    // The socket is registered with, and its driver runs on, the loader's runtime.
    let _entered = runtime.enter();
    crate::quic::Endpoint::new(config, socket).map_err(|e| failed("start", &e))
}
