//! Synthetic GPU consumers: one client (a [`Loader`]) per rank on its own thread, taking
//! batches at a simulated step time, with the exactly-once audit from outside: every planned
//! sample of every epoch is counted as delivered or skipped exactly once, and each rank's
//! delivery order can be dumped (`epoch rank shard key` lines) to check mixing and
//! determinism. What `sluice loadgen`, `demo` and `bench chain` run.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
#[cfg(feature = "cuda")]
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_client::{Checkpoint, EpochReport, Loader, LoaderConfig, ShufflePolicy, StatsSnapshot};
use sluice_shard::Manifest;

use crate::error::{Result, TestbedError};

/// Where batches go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// Host memory.
    #[default]
    Cpu,
    /// A page-locked ring uploaded to GPU `ordinal` one batch ahead, converted to `dtype`
    /// there (the starved figure then includes waiting for the copy).
    Cuda { ordinal: usize, dtype: DType },
}

/// What a GPU consumer converts batches to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    Uint8,
    Float16,
    Float32,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::Uint8 => "uint8",
            DType::Float16 => "float16",
            DType::Float32 => "float32",
        }
    }
}

/// Why a device name is refused.
const NO_CUDA: &str =
    "this sluice was built without CUDA support: cargo build --release --features cuda";

impl Device {
    /// `cpu` or `cuda:N`, with `uint8`, `float16` or `float32` (a conversion runs on the GPU,
    /// so anything but uint8 needs `cuda:N`). Checked before anything starts.
    pub fn parse(device: &str, dtype: &str) -> Result<Device> {
        let dtype = match dtype {
            "uint8" => DType::Uint8,
            "float16" => DType::Float16,
            "float32" => DType::Float32,
            _ => {
                return Err(TestbedError::Setup(format!(
                    "--dtype {dtype}: expected uint8, float16 or float32"
                )))
            }
        };
        let device = match device {
            "cpu" => Device::Cpu,
            d => match d.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(ordinal)) => Device::Cuda { ordinal, dtype },
                _ => {
                    return Err(TestbedError::Setup(format!(
                        "--device {d}: expected cpu or cuda:N"
                    )))
                }
            },
        };
        if device == Device::Cpu && dtype != DType::Uint8 {
            return Err(TestbedError::Setup(format!(
                "--dtype {}: the conversion runs on the GPU; it needs --device cuda:N",
                dtype.name()
            )));
        }
        if matches!(device, Device::Cuda { .. }) && !cfg!(feature = "cuda") {
            return Err(TestbedError::Setup(NO_CUDA.into()));
        }
        Ok(device)
    }
}

/// The consumers' settings: the client's (dataset, workers, batch and order settings) and the
/// run's (ranks, epochs, step time, what to record).
#[derive(Clone)]
pub struct ConsumerConfig {
    /// Every rank's loader settings (its rank, world size, epochs and workers are set per
    /// rank from the fields below).
    pub loader: LoaderConfig,
    /// Worker addresses, or `["local"]` to decode in-process.
    pub workers: Vec<String>,
    pub ranks: u32,
    /// Simulated GPU step per batch, milliseconds (0: take batches as fast as they come).
    pub step_ms: f64,
    pub epochs: u64,
    pub first_epoch: u64,
    pub token: Option<String>,
    /// Decode threads of an in-process worker (0: all cores).
    pub threads: usize,
    pub device: Device,
    /// Keep each rank's delivery order (for [`write_dump`]).
    pub record_ids: bool,
    /// Stop the first epoch after this many batches per rank (then checkpoint).
    pub stop_after_batches: Option<u64>,
    /// Keep each rank's checkpoint when it stops (for [`save_states`]).
    pub keep_state: bool,
    /// Resume from these checkpoints (any number of old ranks).
    pub resume: Option<Vec<Checkpoint>>,
    /// A mixture's sources (name, manifest), drawn by `loader.weights`; empty: the
    /// dataset the ranks are given.
    pub mixture: Vec<(String, Manifest)>,
}

impl ConsumerConfig {
    /// Plain consumers of `dataset_name` on `workers`: two ranks of batches of 64 for three
    /// epochs, the loader's defaults otherwise, host memory, nothing recorded.
    pub fn new(dataset_name: impl Into<String>, workers: Vec<String>) -> Self {
        ConsumerConfig {
            loader: LoaderConfig {
                dataset_name: dataset_name.into(),
                batch_size: 64,
                ..LoaderConfig::default()
            },
            workers,
            ranks: 2,
            step_ms: 0.0,
            epochs: 3,
            first_epoch: 0,
            token: None,
            threads: 0,
            device: Device::Cpu,
            record_ids: false,
            stop_after_batches: None,
            keep_state: false,
            resume: None,
            mixture: Vec::new(),
        }
    }

    /// Samples/s the consumers ask for, when they have a step time.
    pub fn demand(&self) -> Option<f64> {
        (self.step_ms > 0.0).then(|| {
            f64::from(self.ranks) * f64::from(self.loader.batch_size) * 1000.0 / self.step_ms
        })
    }

    /// Refuses settings no rank could run, once, before any starts: no ranks, or more ranks
    /// than the dataset can give each a sample.
    pub fn validate(&self, manifest: &Manifest) -> Result<()> {
        if self.ranks == 0 {
            return Err(TestbedError::Setup("--ranks must be at least 1".into()));
        }
        let counts: Vec<u64> = manifest.shards.iter().map(|s| s.samples).collect();
        let world =
            sluice_plan::PlanConfig::new(self.loader.seed, self.ranks, ShufflePolicy::Global);
        sluice_plan::validate(&counts, &world, 0)
            .map_err(|e| TestbedError::Setup(format!("--ranks: {e}")))
    }
}

/// What the consumers report while they run (live progress); every method may be called
/// from any rank's thread.
pub trait Observer: Sync {
    /// Rank `rank` starts `epoch`, of `batches` batches.
    fn epoch_started(&self, rank: u32, epoch: u64, batches: u64) {
        let _ = (rank, epoch, batches);
    }
    /// Rank `rank` took a batch; `stats` is its client's running view.
    fn batch(&self, rank: u32, epoch: u64, stats: &StatsSnapshot) {
        let _ = (rank, epoch, stats);
    }
    /// Rank `rank` finished `epoch` in `secs`.
    fn epoch_done(&self, rank: u32, epoch: u64, report: &EpochReport, secs: f64) {
        let _ = (rank, epoch, report, secs);
    }
}

/// An observer that shows nothing.
pub struct Silent;

impl Observer for Silent {}

/// One rank's totals over its epochs.
#[derive(Default, Clone)]
pub struct RankResult {
    pub rank: u32,
    pub epochs: u64,
    pub batches: u64,
    pub planned: u64,
    pub delivered: u64,
    pub skipped: u64,
    pub duplicates_dropped: u64,
    /// Bytes of requested fields delivered (beside the tensors).
    pub field_bytes: u64,
    /// Planned samples neither delivered nor skipped, and samples delivered too often.
    pub missing: u64,
    pub repeated: u64,
    pub elapsed: Duration,
    pub starved: Duration,
    pub broken: Vec<String>,
    /// Batches with labels, distinct labels in them, and what uniform sampling would give.
    pub mixing: Mixing,
    /// The rank's checkpoint when it stopped (with --save-state).
    pub checkpoint: Option<Checkpoint>,
    /// Delivered samples as dump lines, in delivery order, per epoch: spooled to a file as
    /// each epoch ends, so a long run holds one epoch's lines, not all of them.
    pub dump: Vec<DumpBlock>,
    /// The first skipped samples, as `epoch shard key: reason`.
    pub skips: Vec<String>,
    /// Why the rank's run ended early (an epoch that failed); what it had delivered before
    /// is still in the result, its dump included.
    pub error: Option<String>,
    /// Samples delivered from each source of a mixture (one entry for a single dataset).
    pub per_source: Vec<u64>,
    /// Bytes of shard data the workers read for this rank from the storage tier, and from
    /// their shard caches.
    pub storage_bytes: u64,
    pub cached_bytes: u64,
    /// Units run by a worker other than their shard's owner (shard affinity).
    pub elsewhere: u64,
    /// Each epoch's (epoch, storage bytes, cached bytes) of shard data the workers read.
    pub epoch_bytes: Vec<(u64, u64, u64)>,
}

/// One epoch of a rank's dump lines, in its rank's spool file.
#[derive(Clone)]
pub struct DumpBlock {
    pub epoch: u64,
    file: std::sync::Arc<std::fs::File>,
    offset: u64,
    len: usize,
}

/// Skipped samples a rank lists by name in the final summary (the rest are counted).
pub const SKIPS_LISTED: usize = 10;

/// How well batches mix classes: the mean number of distinct labels per batch beside its
/// expectation under uniform sampling without replacement from the same epoch's samples.
#[derive(Default, Clone, Copy)]
pub struct Mixing {
    pub batches: u64,
    pub distinct: f64,
    pub uniform: f64,
}

impl Mixing {
    /// Adds an epoch's batches, given as label lists (labels < 0: unlabelled, ignored).
    pub fn add_epoch(&mut self, batches: &[Vec<i64>]) {
        let mut counts: HashMap<i64, u64> = HashMap::new();
        for l in batches.iter().flatten().filter(|l| **l >= 0) {
            *counts.entry(*l).or_default() += 1;
        }
        let total: u64 = counts.values().sum();
        // The expectation depends on the batch's size alone: an epoch's batches but its last
        // have one size, so it is worked out once per size (loadgen's CPU is the client's).
        let mut uniform: HashMap<u64, f64> = HashMap::new();
        let mut distinct = std::collections::HashSet::new();
        for b in batches {
            distinct.clear();
            distinct.extend(b.iter().copied().filter(|l| *l >= 0));
            let n = b.iter().filter(|l| **l >= 0).count() as u64;
            if n == 0 {
                continue;
            }
            self.batches += 1;
            self.distinct += distinct.len() as f64;
            self.uniform += *uniform
                .entry(n)
                .or_insert_with(|| expected_distinct(&counts, total, n));
        }
    }

    pub fn merge(&mut self, other: &Mixing) {
        self.batches += other.batches;
        self.distinct += other.distinct;
        self.uniform += other.uniform;
    }

    /// (mean distinct labels per batch, its uniform expectation), when any batch had labels.
    pub fn means(&self) -> Option<(f64, f64)> {
        (self.batches > 0).then(|| {
            let n = self.batches as f64;
            (self.distinct / n, self.uniform / n)
        })
    }
}

/// Expected distinct classes in `n` draws without replacement from `total` samples with the
/// given per-class counts: Σ_k 1 − C(total − c_k, n) / C(total, n).
pub fn expected_distinct(counts: &HashMap<i64, u64>, total: u64, n: u64) -> f64 {
    counts
        .values()
        .map(|&c| {
            let mut absent = 1.0f64;
            for i in 0..n {
                if total - i == 0 || total < c + i {
                    absent = 0.0;
                    break;
                }
                absent *= (total - c - i) as f64 / (total - i) as f64;
                if absent < 1e-12 {
                    absent = 0.0;
                    break;
                }
            }
            1.0 - absent
        })
        .sum()
}

/// Where a rank's batches go, opened.
enum Sink {
    Host,
    #[cfg(feature = "cuda")]
    Cuda(sluice_client::cuda::Uploader, Arc<sluice_client::cuda::Gpu>),
}

fn sink(device: Device) -> Result<Sink> {
    match device {
        Device::Cpu => Ok(Sink::Host),
        Device::Cuda { ordinal, dtype } => cuda_sink(ordinal, dtype),
    }
}

#[cfg(feature = "cuda")]
fn cuda_sink(ordinal: usize, dtype: DType) -> Result<Sink> {
    use sluice_client::cuda::{Convert, Gpu, Uploader};
    let convert = Convert::to_dtype(dtype.name(), Convert::IMAGENET_MEAN, Convert::IMAGENET_STD)
        .ok_or_else(|| {
            TestbedError::Setup(format!("--dtype {}: no such conversion", dtype.name()))
        })?;
    let gpu = Gpu::open(ordinal)?;
    let uploader = Uploader::new(gpu.clone(), convert, 1)?;
    Ok(Sink::Cuda(uploader, gpu))
}

#[cfg(not(feature = "cuda"))]
fn cuda_sink(_ordinal: usize, _dtype: DType) -> Result<Sink> {
    Err(TestbedError::Setup(NO_CUDA.into()))
}

/// An epoch's batches as the sink receives them; `host` is what the contract checks.
enum Batches {
    Host(sluice_client::Epoch),
    #[cfg(feature = "cuda")]
    Cuda(sluice_client::cuda::DeviceEpoch),
}

enum Held {
    Host(sluice_client::Batch),
    #[cfg(feature = "cuda")]
    Cuda(sluice_client::cuda::DeviceBatch),
}

impl Held {
    fn host(&self) -> Option<&sluice_client::Batch> {
        match self {
            Held::Host(b) => Some(b),
            #[cfg(feature = "cuda")]
            Held::Cuda(d) => d.host(),
        }
    }
}

impl Batches {
    /// The next batch, ready for a step: on the GPU, the copy has finished.
    fn next_ready(&mut self) -> Option<Result<Held>> {
        match self {
            Batches::Host(e) => e.next().map(|b| Ok(Held::Host(b?))),
            #[cfg(feature = "cuda")]
            Batches::Cuda(e) => e.next().map(|b| {
                let d = b?;
                d.synchronize()?;
                Ok(Held::Cuda(d))
            }),
        }
    }

    /// The batches it yields: all of the epoch's, or after a resume the rest.
    fn batches_left(&self) -> u64 {
        match self {
            Batches::Host(e) => e.batches_left(),
            #[cfg(feature = "cuda")]
            Batches::Cuda(e) => e.host().batches_left(),
        }
    }

    fn per_source(&self) -> Vec<u64> {
        match self {
            Batches::Host(e) => e.per_source().to_vec(),
            #[cfg(feature = "cuda")]
            Batches::Cuda(e) => e.host().per_source().to_vec(),
        }
    }

    fn report(&self) -> sluice_client::EpochReport {
        match self {
            Batches::Host(e) => e.report(),
            #[cfg(feature = "cuda")]
            Batches::Cuda(e) => e.host().report(),
        }
    }

    fn unbatched_skips(&self) -> Vec<(sluice_client::SampleId, String)> {
        match self {
            Batches::Host(e) => e.unbatched_skips().to_vec(),
            #[cfg(feature = "cuda")]
            Batches::Cuda(e) => e.host().unbatched_skips().to_vec(),
        }
    }
}

/// The loader of `rank`, which reads epochs up to `epochs_end` (not included).
fn loader(
    cfg: &ConsumerConfig,
    manifest: &Manifest,
    rank: u32,
    sink: &Sink,
    epochs_end: u64,
) -> Result<Loader> {
    let local = cfg.workers.len() == 1 && cfg.workers[0] == "local";
    let b = match cfg.mixture.is_empty() {
        true => Loader::builder().dataset(manifest.clone()),
        false => Loader::builder().sources(cfg.mixture.clone()),
    };
    let mut b = b.config(LoaderConfig {
        rank,
        world_size: cfg.ranks,
        epochs: Some(epochs_end),
        workers: if local {
            Vec::new()
        } else {
            cfg.workers.clone()
        },
        ..cfg.loader.clone()
    });
    #[cfg(feature = "cuda")]
    if let Sink::Cuda(_, gpu) = sink {
        b = b.allocator(Arc::new(sluice_client::cuda::PinnedAllocator::new(
            gpu.clone(),
        )));
    }
    #[cfg(not(feature = "cuda"))]
    let Sink::Host = sink;
    if local {
        let engine = sluice_cpu::EngineConfig {
            threads: cfg.threads,
            ..Default::default()
        };
        let source = sluice_cpu::ShardSource::new(sluice_cpu::SourceConfig::default())?;
        b = b.in_process(std::sync::Arc::new(sluice_cpu::CpuWorker::new(
            engine, source,
        )?));
    } else if let Some(t) = &cfg.token {
        b = b.token(t.clone());
    }
    Ok(b.build()?)
}

/// Runs every rank on its own thread and returns each one's totals and audit.
pub fn run_ranks(
    cfg: &ConsumerConfig,
    manifest: &Manifest,
    observer: &dyn Observer,
) -> Result<Vec<RankResult>> {
    let results = run_ranks_keeping_failures(cfg, manifest, observer)?;
    match results.iter().find_map(|r| r.error.clone()) {
        Some(e) => Err(TestbedError::Setup(e)),
        None => Ok(results),
    }
}

/// [`run_ranks`], but a rank whose epoch failed still gives what it delivered before, with
/// the failure in [`RankResult::error`] (so `loadgen` can write its dump and report first).
pub fn run_ranks_keeping_failures(
    cfg: &ConsumerConfig,
    manifest: &Manifest,
    observer: &dyn Observer,
) -> Result<Vec<RankResult>> {
    std::thread::scope(|scope| {
        // Named, so the CPU they spend is told from the client's ([`crate::tier_cpu`]).
        let handles: Vec<_> = (0..cfg.ranks)
            .map(|rank| {
                std::thread::Builder::new()
                    .name(format!("sluice-rank-{rank}"))
                    .spawn_scoped(scope, move || run_rank(cfg, manifest, rank, observer))
                    .map_err(TestbedError::io(format!("starting rank {rank}'s thread")))
            })
            .collect::<Result<_>>()?;
        // A rank that could not even start is a failed rank beside the others, whose
        // deliveries are still reported and dumped.
        let results = handles
            .into_iter()
            .zip(0..)
            .map(|(h, rank)| {
                let run = h
                    .join()
                    .unwrap_or_else(|_| Err(TestbedError::Setup("a rank panicked".into())));
                run.unwrap_or_else(|e| RankResult {
                    rank,
                    error: Some(format!("rank {rank}: {e}")),
                    ..RankResult::default()
                })
            })
            .collect();
        Ok(results)
    })
}

/// Writes the delivered samples as `epoch rank shard key` lines: epoch by epoch, rank by rank,
/// each in delivery order, so the same run gives the same file whichever rank finished first.
pub fn write_dump(results: &[RankResult], path: &Path) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut blocks: Vec<(u32, &DumpBlock)> = results
        .iter()
        .flat_map(|r| r.dump.iter().map(move |b| (r.rank, b)))
        .collect();
    blocks.sort_by_key(|(r, b)| (b.epoch, *r));
    let io = || TestbedError::io(format!("writing {}", path.display()));
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io())?);
    let mut lines = Vec::new();
    for (_, block) in blocks {
        lines.resize(block.len, 0);
        block
            .file
            .read_exact_at(&mut lines, block.offset)
            .map_err(TestbedError::io("reading back the spooled dump"))?;
        f.write_all(&lines).map_err(io())?;
    }
    f.flush().map_err(io())
}

/// Saves the ranks' checkpoints as one JSON list; returns how many.
pub fn save_states(results: &[RankResult], path: &Path) -> Result<usize> {
    let states: Vec<&Checkpoint> = results
        .iter()
        .filter_map(|r| r.checkpoint.as_ref())
        .collect();
    let json = serde_json::to_vec_pretty(&states)
        .map_err(|e| TestbedError::Setup(format!("encoding checkpoints: {e}")))?;
    std::fs::write(path, json).map_err(TestbedError::io(format!(
        "writing --save-state {}",
        path.display()
    )))?;
    Ok(states.len())
}

/// The checkpoints `--save-state` wrote.
pub fn read_states(path: &Path) -> Result<Vec<Checkpoint>> {
    let bytes = std::fs::read(path).map_err(TestbedError::io(format!(
        "reading --resume {}",
        path.display()
    )))?;
    let values: Vec<serde_json::Value> = serde_json::from_slice(&bytes).map_err(|e| {
        TestbedError::Setup(format!(
            "--resume {}: not a JSON list of checkpoints: {e}",
            path.display()
        ))
    })?;
    let states = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            Checkpoint::from_bytes(v.to_string().as_bytes()).map_err(|e| {
                TestbedError::Setup(format!("--resume {}: checkpoint #{i}: {e}", path.display()))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if states.is_empty() {
        return Err(TestbedError::Setup(format!(
            "--resume {}: holds no checkpoint",
            path.display()
        )));
    }
    Ok(states)
}

fn run_rank(
    cfg: &ConsumerConfig,
    manifest: &Manifest,
    rank: u32,
    observer: &dyn Observer,
) -> Result<RankResult> {
    let sink = sink(cfg.device)?;
    // Dump lines go to an unnamed file epoch by epoch (the run's memory stays flat).
    let spool = match cfg.record_ids {
        true => Some(std::sync::Arc::new(
            tempfile::tempfile().map_err(TestbedError::io("creating the dump's spool file"))?,
        )),
        false => None,
    };
    let mut spooled = 0u64;
    let first_epoch = match &cfg.resume {
        Some(states) => states.first().map_or(cfg.first_epoch, |s| s.epoch),
        None => cfg.first_epoch,
    };
    let loader = loader(cfg, manifest, rank, &sink, first_epoch + cfg.epochs)?;
    if let Some(states) = &cfg.resume {
        loader
            .load_state_dicts(states)
            .map_err(|e| TestbedError::Setup(format!("rank {rank}: --resume: {e}")))?;
    }
    let mut result = RankResult {
        rank,
        ..RankResult::default()
    };
    let step = Duration::from_secs_f64(cfg.step_ms.max(0.0) / 1000.0);
    let started = Instant::now();
    // A mixture's dump lines name each sample's source.
    let names = loader.source_names().to_vec();
    result.per_source = vec![0; names.len().max(1)];
    for epoch in first_epoch..first_epoch + cfg.epochs {
        let mut planned: HashMap<(u32, u64), i64> = HashMap::new();
        // Padding units repeat samples to even out ranks: their rows are marked padding and
        // are no sample of the plan's own.
        // An epoch that cannot start fails the rank; what it delivered before is reported.
        // One stopped early is not audited (the rest is its checkpoint's): its plan, which
        // may be an epoch of 10^9 samples, is not listed.
        let stopping = cfg.stop_after_batches.is_some() && epoch == first_epoch;
        let pending = match stopping {
            true => Ok(Vec::new()),
            false => loader.pending(epoch),
        };
        let pending = match pending {
            Ok(p) => p,
            Err(e) => {
                result.error = Some(format!("rank {rank}, epoch {epoch}: {e}"));
                break;
            }
        };
        for u in pending.into_iter().filter(|u| !u.padding) {
            for i in u.start..u.end {
                *planned.entry((u.shard, i)).or_default() += 1;
            }
        }
        let planned_total: i64 = planned.values().sum();
        let epoch_started = Instant::now();
        let host = match loader.epoch(epoch) {
            Ok(h) => h,
            Err(e) => {
                result.error = Some(format!("rank {rank}, epoch {epoch}: {e}"));
                break;
            }
        };
        observer.epoch_started(rank, epoch, host.batches());
        let mut batches = match &sink {
            Sink::Host => Batches::Host(host),
            #[cfg(feature = "cuda")]
            Sink::Cuda(uploader, _) => Batches::Cuda(uploader.epoch(host)),
        };
        let mut lines = String::new();
        let mut labels: Vec<Vec<i64>> = Vec::new();
        let mut gpu_wait = Duration::ZERO;
        let mut taken = 0u64;
        let stop = cfg.stop_after_batches.filter(|_| epoch == first_epoch);
        loop {
            if stop.is_some_and(|n| taken >= n) {
                break;
            }
            let waited = Instant::now();
            let Some(held) = batches.next_ready() else {
                break;
            };
            gpu_wait += waited.elapsed();
            taken += 1;
            let held = match held {
                Ok(held) => held,
                Err(e) => {
                    result.error = Some(format!("rank {rank}, epoch {epoch}: {e}"));
                    break;
                }
            };
            let Some(batch) = held.host() else {
                return Err(TestbedError::Setup(format!(
                    "rank {rank}, epoch {epoch}: a device batch without its host side"
                )));
            };
            let real = batch
                .ids()
                .iter()
                .zip(batch.keys())
                .zip(batch.labels())
                .zip(batch.fields())
                .zip(batch.padding())
                .filter(|(_, pad)| !**pad);
            let mut batch_labels = Vec::with_capacity(batch.len());
            for ((((id, key), label), fields), _) in real {
                result.field_bytes += fields.byte_len() as u64;
                *planned.entry((id.shard, id.index)).or_default() -= 1;
                batch_labels.push(*label);
                if cfg.record_ids {
                    let shard = loader
                        .manifest()
                        .shards
                        .get(id.shard as usize)
                        .map_or("?", |s| s.name());
                    let key = sluice_shard::escaped_key(key);
                    lines.push_str(&format!("{epoch}\t{rank}\t{shard}\t{key}"));
                    if let Some(source) = names.get(loader.source_of(id.shard) as usize) {
                        lines.push('\t');
                        lines.push_str(source);
                    }
                    lines.push('\n');
                }
            }
            labels.push(batch_labels);
            for (id, reason) in batch.skipped() {
                *planned.entry((id.shard, id.index)).or_default() -= 1;
                if result.skips.len() < SKIPS_LISTED {
                    let shard = loader
                        .manifest()
                        .shards
                        .get(id.shard as usize)
                        .map_or("?", |s| s.name());
                    result
                        .skips
                        .push(format!("epoch {epoch}, shard {shard}, {reason}"));
                }
            }
            drop(held);
            if !step.is_zero() {
                std::thread::sleep(step);
            }
            observer.batch(rank, epoch, &loader.stats());
        }
        if let Some(file) = &spool {
            use std::os::unix::fs::FileExt;
            file.write_all_at(lines.as_bytes(), spooled)
                .map_err(TestbedError::io("spooling the dump"))?;
            result.dump.push(DumpBlock {
                epoch,
                file: file.clone(),
                offset: spooled,
                len: lines.len(),
            });
            spooled += lines.len() as u64;
        }
        if result.error.is_some() {
            // What it delivered is in the dump; the audit of a failed epoch would only say
            // that it failed.
            break;
        }
        // The epoch's last batches, if every sample of them was skipped, were not handed out.
        for (id, _) in batches.unbatched_skips() {
            *planned.entry((id.shard, id.index)).or_default() -= 1;
        }
        result.mixing.add_epoch(&labels);
        for (total, n) in result.per_source.iter_mut().zip(batches.per_source()) {
            *total += n;
        }
        let mut r = batches.report();
        // With a GPU sink the consumer also waits for copies: count from its side.
        if !matches!(batches, Batches::Host(_)) {
            r.starved = gpu_wait;
        }
        observer.epoch_done(rank, epoch, &r, epoch_started.elapsed().as_secs_f64());
        result.epochs += 1;
        result.batches += r.batches;
        result.delivered += r.delivered;
        result.skipped += r.skipped;
        result.duplicates_dropped += r.duplicates_dropped;
        result.elsewhere += r.elsewhere;
        result
            .epoch_bytes
            .push((epoch, r.storage_bytes, r.cached_bytes));
        result.starved += r.starved;
        if stop.is_some() {
            // Stopped on purpose mid-epoch: the rest is the checkpoint's, not missing.
            result.planned += r.delivered + r.skipped;
            break;
        }
        let missing: i64 = planned.values().filter(|v| **v > 0).sum();
        let repeated: i64 = -planned.values().filter(|v| **v < 0).sum::<i64>();
        result.planned += planned_total as u64;
        result.missing += missing as u64;
        result.repeated += repeated as u64;
        if missing != 0 || repeated != 0 || r.delivered + r.skipped != planned_total as u64 {
            result.broken.push(format!(
                "rank {rank} epoch {epoch}: planned {planned_total}, delivered {}, skipped {}, \
                 missing {missing}, delivered twice {repeated}",
                r.delivered, r.skipped
            ));
        }
        if r.batches != batches.batches_left() {
            result.broken.push(format!(
                "rank {rank} epoch {epoch}: {} batches, planned {}",
                r.batches,
                batches.batches_left()
            ));
        }
    }
    if cfg.keep_state {
        result.checkpoint = loader.state_dict();
    }
    let stats = loader.stats();
    (result.storage_bytes, result.cached_bytes) = (stats.storage_bytes, stats.cached_bytes);
    result.elapsed = started.elapsed();
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_and_dtype_are_checked_before_anything_starts() {
        assert_eq!(Device::parse("cpu", "uint8").unwrap(), Device::Cpu);
        let err = |d: &str, t: &str| Device::parse(d, t).unwrap_err().to_string();
        assert!(err("gpu:0", "uint8").contains("expected cpu or cuda:N"));
        assert!(err("cuda:x", "uint8").contains("expected cpu or cuda:N"));
        assert!(err("cpu", "float16").contains("needs --device cuda:N"));
        assert!(err("cuda:0", "int4").contains("expected uint8, float16 or float32"));
        match Device::parse("cuda:1", "float16") {
            Ok(d) => assert!(
                cfg!(feature = "cuda")
                    && d == Device::Cuda {
                        ordinal: 1,
                        dtype: DType::Float16
                    }
            ),
            Err(e) => assert!(!cfg!(feature = "cuda") && e.to_string().contains("--features cuda")),
        }
    }

    #[test]
    fn uniform_expectation_of_distinct_labels() {
        // Two classes of 50: one draw shows one class; a draw of all 100 shows both.
        let counts: HashMap<i64, u64> = [(0, 50), (1, 50)].into_iter().collect();
        assert!((expected_distinct(&counts, 100, 1) - 1.0).abs() < 1e-9);
        assert!((expected_distinct(&counts, 100, 100) - 2.0).abs() < 1e-9);
        // Two draws: both the same class with probability 2 × (50/100 × 49/99).
        let two = 2.0 - 2.0 * (50.0 / 100.0 * 49.0 / 99.0);
        assert!((expected_distinct(&counts, 100, 2) - two).abs() < 1e-9);
        let mut m = Mixing::default();
        m.add_epoch(&[vec![0, 0], vec![0, 1], vec![-1]]);
        assert_eq!(m.batches, 2, "a batch of unlabelled samples is not counted");
        assert_eq!(m.means().map(|(d, _)| d), Some(1.5));
    }
}
