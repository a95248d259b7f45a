//! `sluice loadgen`: synthetic GPU consumers. N ranks (threads in this process), each a
//! client that takes a batch, "computes" for `--step-ms`, and takes the next; a live line per
//! rank, a final table, and the contract checked from outside the client: every planned
//! sample delivered or skipped exactly once per rank and epoch, or a non-zero exit.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::json;
use sluice_client::{LastBatch, Loader, ShortBatch, ShufflePolicy};
use sluice_shard::Manifest;

#[derive(clap::Args, Clone)]
pub struct Args {
    /// A manifest (.json path or URL) or shards (paths, URLs, brace patterns).
    #[arg(long)]
    pub(crate) dataset: String,
    /// CPU workers, host:port, comma-separated; `local` decodes in this process.
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) workers: Vec<String>,
    /// Ranks to simulate (threads in this process); they form the whole world.
    #[arg(long, default_value_t = 1)]
    pub(crate) ranks: u32,
    #[arg(long, default_value_t = 256)]
    pub(crate) batch_size: u32,
    /// Simulated compute time per step, milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) step_ms: f64,
    #[arg(long, default_value_t = 1)]
    pub(crate) epochs: u64,
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// First epoch number.
    #[arg(long, default_value_t = 0)]
    pub(crate) first_epoch: u64,
    #[arg(long, default_value = "decode | random_resized_crop 224 | hflip 0.5")]
    pub(crate) pipeline: String,
    /// global, local or partial:Q.
    #[arg(long, default_value = "global")]
    pub(crate) shuffle: String,
    /// Drop the last incomplete batch.
    #[arg(long)]
    pub(crate) drop_last: bool,
    /// Fill batches that lost samples to the decoder with copies (marked as padding).
    #[arg(long)]
    pub(crate) top_up: bool,
    /// File holding the cluster token (else $SLUICE_TOKEN).
    #[arg(long)]
    pub(crate) token_file: Option<PathBuf>,
    /// PEM with the workers' certificate (pinned) or CA.
    #[arg(long)]
    pub(crate) trust_cert: Option<PathBuf>,
    /// Samples each worker may have in flight per rank.
    #[arg(long, default_value_t = 128)]
    pub(crate) credits: u32,
    /// Decode threads for `--workers local` (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub(crate) threads: usize,
    /// Seconds to wait for any worker before failing.
    #[arg(long, default_value_t = 30.0)]
    pub(crate) worker_wait: f64,
    /// Write the results as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Write every delivered sample as `epoch<TAB>rank<TAB>shard<TAB>key`, in delivery order,
    /// grouped by epoch and then rank.
    #[arg(long)]
    pub(crate) dump_ids: Option<PathBuf>,
    /// The order samples fill batches in: `plan` (the same batches for the same seed, whatever
    /// workers, failures or resumes) or `arrival` (as they come, through a shuffle buffer).
    #[arg(long, default_value = "plan")]
    pub(crate) order: sluice_client::Order,
    /// Work units whose samples the plan interleaves at once.
    #[arg(long, default_value_t = sluice_client::Mixing::default().window_units)]
    pub(crate) mix_units: u32,
    /// Samples in the shuffle buffer after the interleave (memory: this many decoded tensors).
    #[arg(long, default_value_t = sluice_client::Mixing::default().buffer_samples)]
    pub(crate) mix_buffer: u32,
    /// Stop every rank after this many batches of the first epoch (with --save-state, to take
    /// a checkpoint mid-epoch).
    #[arg(long)]
    pub(crate) stop_after_batches: Option<u64>,
    /// Write every rank's checkpoint (a JSON list) here when the ranks stop.
    #[arg(long)]
    pub(crate) save_state: Option<PathBuf>,
    /// Resume from checkpoints written by --save-state, with any --ranks: the rest of their
    /// epoch is split across this run's ranks; --epochs counts that epoch as the first.
    #[arg(long)]
    pub(crate) resume: Option<PathBuf>,
    /// Shared memory for workers on this machine: auto (when their socket is found), off,
    /// or require.
    #[arg(long, default_value = "auto")]
    pub(crate) same_host: sluice_client::SameHost,
    /// Where same-host workers' sockets are (default $SLUICE_SAME_HOST_DIR or /run/sluice).
    #[arg(long)]
    pub(crate) same_host_dir: Option<PathBuf>,
    /// Where batches go: `cpu` (host memory), or `cuda:N` (page-locked ring, uploaded to GPU
    /// N one batch ahead; the starved figure then includes waiting for the copy).
    #[arg(long, default_value = "cpu")]
    pub(crate) device: String,
    /// With `--device cuda:N`: uint8 as the workers made it, or float16/float32 normalized
    /// (ImageNet mean/std) into NCHW on the GPU, as a training step would take it.
    #[arg(long, default_value = "uint8")]
    pub(crate) dtype: String,
}

/// The synthetic consumers `demo` and `bench chain` run.
#[derive(clap::Args, Clone)]
pub struct Consumers {
    /// Synthetic consumers (ranks).
    #[arg(long, default_value_t = 2)]
    pub(crate) ranks: u32,
    #[arg(long, default_value_t = 3)]
    pub(crate) epochs: u64,
    #[arg(long, default_value_t = 64)]
    pub(crate) batch_size: u32,
    /// Simulated GPU step per batch, milliseconds (0: consume as fast as data comes).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) step_ms: f64,
    #[arg(long, default_value = "decode | random_resized_crop 224 | hflip 0.5")]
    pub(crate) pipeline: String,
}

impl Consumers {
    /// Samples/s the consumers ask for, when they have a step time.
    pub(crate) fn demand(&self) -> Option<f64> {
        (self.step_ms > 0.0)
            .then(|| f64::from(self.ranks) * f64::from(self.batch_size) * 1000.0 / self.step_ms)
    }

    /// loadgen's settings for these consumers on `workers`.
    pub(crate) fn loadgen(
        &self,
        dataset: &std::path::Path,
        workers: Vec<String>,
        token_file: Option<PathBuf>,
        trust_cert: Option<PathBuf>,
    ) -> Args {
        Args {
            dataset: dataset.display().to_string(),
            workers,
            ranks: self.ranks,
            batch_size: self.batch_size,
            step_ms: self.step_ms,
            epochs: self.epochs,
            seed: 0,
            first_epoch: 0,
            pipeline: self.pipeline.clone(),
            shuffle: "global".into(),
            drop_last: false,
            top_up: false,
            token_file,
            trust_cert,
            credits: 128,
            threads: 0,
            worker_wait: 30.0,
            json: None,
            dump_ids: None,
            order: sluice_client::Order::Plan,
            mix_units: sluice_client::Mixing::default().window_units,
            mix_buffer: sluice_client::Mixing::default().buffer_samples,
            stop_after_batches: None,
            save_state: None,
            resume: None,
            same_host: sluice_client::SameHost::Auto,
            same_host_dir: None,
            device: "cpu".into(),
            dtype: "uint8".into(),
        }
    }
}

/// One rank's totals over its epochs.
#[derive(Default, Clone)]
pub(crate) struct RankResult {
    pub(crate) rank: u32,
    pub(crate) epochs: u64,
    pub(crate) batches: u64,
    pub(crate) planned: u64,
    pub(crate) delivered: u64,
    pub(crate) skipped: u64,
    pub(crate) duplicates_dropped: u64,
    /// Planned samples neither delivered nor skipped, and samples delivered too often.
    pub(crate) missing: u64,
    pub(crate) repeated: u64,
    pub(crate) elapsed: Duration,
    pub(crate) starved: Duration,
    pub(crate) broken: Vec<String>,
    /// Batches with labels, distinct labels in them, and what uniform sampling would give.
    pub(crate) mixing: Mixing,
    /// The rank's checkpoint when it stopped (with --save-state).
    pub(crate) checkpoint: Option<sluice_client::Checkpoint>,
    /// Delivered samples as dump lines, in delivery order, per epoch.
    pub(crate) dump: Vec<(u64, String)>,
    /// The first skipped samples, as `epoch shard key: reason`.
    pub(crate) skips: Vec<String>,
}

/// Skipped samples a rank lists by name in the final summary (the rest are counted).
const SKIPS_LISTED: usize = 10;

/// How well batches mix classes: the mean number of distinct labels per batch beside its
/// expectation under uniform sampling without replacement from the same epoch's samples.
#[derive(Default, Clone, Copy)]
pub(crate) struct Mixing {
    pub(crate) batches: u64,
    pub(crate) distinct: f64,
    pub(crate) uniform: f64,
}

impl Mixing {
    /// Adds an epoch's batches, given as label lists (labels < 0: unlabelled, ignored).
    fn add_epoch(&mut self, batches: &[Vec<i64>]) {
        let mut counts: HashMap<i64, u64> = HashMap::new();
        for l in batches.iter().flatten().filter(|l| **l >= 0) {
            *counts.entry(*l).or_default() += 1;
        }
        let total: u64 = counts.values().sum();
        for b in batches {
            let labels: Vec<i64> = b.iter().copied().filter(|l| *l >= 0).collect();
            if labels.is_empty() {
                continue;
            }
            let distinct: std::collections::HashSet<i64> = labels.iter().copied().collect();
            self.batches += 1;
            self.distinct += distinct.len() as f64;
            self.uniform += expected_distinct(&counts, total, labels.len() as u64);
        }
    }

    fn merge(&mut self, other: &Mixing) {
        self.batches += other.batches;
        self.distinct += other.distinct;
        self.uniform += other.uniform;
    }

    /// (mean distinct labels per batch, its uniform expectation), when any batch had labels.
    fn means(&self) -> Option<(f64, f64)> {
        (self.batches > 0).then(|| {
            let n = self.batches as f64;
            (self.distinct / n, self.uniform / n)
        })
    }
}

/// Expected distinct classes in `n` draws without replacement from `total` samples with the
/// given per-class counts: Σ_k 1 − C(total − c_k, n) / C(total, n).
pub(crate) fn expected_distinct(counts: &HashMap<i64, u64>, total: u64, n: u64) -> f64 {
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

pub fn run(args: Args) -> Result<()> {
    super::daemon::init_logs();
    if args.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    device_ordinal(&args.device, &args.dtype)?;
    let manifest = super::index::dataset(&args.dataset)
        .with_context(|| format!("loading dataset {}", args.dataset))?;
    // Every rank would refuse an impossible world; say so once, before starting any.
    let counts: Vec<u64> = manifest.shards.iter().map(|s| s.samples).collect();
    let world = sluice_plan::PlanConfig::new(args.seed, args.ranks, ShufflePolicy::Global);
    sluice_plan::validate(&counts, &world, 0).map_err(|e| anyhow::anyhow!("--ranks: {e}"))?;
    let results = run_ranks(&args, &manifest)?;
    report(&args, &results)?;
    let broken: Vec<&String> = results.iter().flat_map(|r| &r.broken).collect();
    if !broken.is_empty() {
        for b in &broken {
            eprintln!("contract broken: {b}");
        }
        bail!(
            "{} rank-epochs broke the exactly-once contract",
            broken.len()
        );
    }
    Ok(())
}

fn token(args: &Args) -> Result<Option<String>> {
    match &args.token_file {
        Some(p) => Ok(Some(super::cpu::read_token(p)?)),
        None => Ok(std::env::var("SLUICE_TOKEN")
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())),
    }
}

/// Where a rank's batches go.
enum Sink {
    Host,
    #[cfg(feature = "cuda")]
    Cuda(sluice_client::cuda::Uploader, Arc<sluice_client::cuda::Gpu>),
}

const NO_CUDA: &str =
    "this sluice was built without CUDA support: cargo build --release --features cuda";

/// The GPU `--device` names (`None` for `cpu`), after checking it and `--dtype` together.
fn device_ordinal(device: &str, dtype: &str) -> Result<Option<usize>> {
    if !matches!(dtype, "uint8" | "float16" | "float32") {
        bail!("--dtype {dtype}: expected uint8, float16 or float32");
    }
    let ordinal = match device {
        "cpu" => None,
        d => match d.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Some(n),
            _ => bail!("--device {d}: expected cpu or cuda:N"),
        },
    };
    if ordinal.is_none() && dtype != "uint8" {
        bail!("--dtype {dtype}: the conversion runs on the GPU; it needs --device cuda:N");
    }
    if ordinal.is_some() && !cfg!(feature = "cuda") {
        bail!(NO_CUDA);
    }
    Ok(ordinal)
}

fn sink(device: &str, dtype: &str) -> Result<Sink> {
    match device_ordinal(device, dtype)? {
        None => Ok(Sink::Host),
        Some(n) => cuda_sink(n, dtype),
    }
}

#[cfg(feature = "cuda")]
fn cuda_sink(ordinal: usize, dtype: &str) -> Result<Sink> {
    use sluice_client::cuda::{Convert, Gpu, Uploader};
    let convert = Convert::to_dtype(dtype, Convert::IMAGENET_MEAN, Convert::IMAGENET_STD)
        .ok_or_else(|| anyhow::anyhow!("--dtype {dtype}: expected uint8, float16 or float32"))?;
    let gpu = Gpu::open(ordinal)?;
    let uploader = Uploader::new(gpu.clone(), convert, 1)?;
    Ok(Sink::Cuda(uploader, gpu))
}

#[cfg(not(feature = "cuda"))]
fn cuda_sink(_ordinal: usize, _dtype: &str) -> Result<Sink> {
    bail!(NO_CUDA)
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

    fn batches(&self) -> u64 {
        match self {
            Batches::Host(e) => e.batches(),
            #[cfg(feature = "cuda")]
            Batches::Cuda(e) => e.host().batches(),
        }
    }

    fn report(&self) -> sluice_client::EpochReport {
        match self {
            Batches::Host(e) => e.report(),
            #[cfg(feature = "cuda")]
            Batches::Cuda(e) => e.host().report(),
        }
    }
}

fn loader(args: &Args, manifest: &Manifest, rank: u32, sink: &Sink) -> Result<Loader> {
    let shuffle: ShufflePolicy = args
        .shuffle
        .parse()
        .map_err(|e| anyhow::anyhow!("--shuffle: {e}"))?;
    let mut b = Loader::builder()
        .dataset(manifest.clone())
        .dataset_name(args.dataset.clone())
        .pipeline(args.pipeline.clone())
        .batch_size(args.batch_size)
        .seed(args.seed)
        .rank(rank)
        .world_size(args.ranks)
        .shuffle(shuffle)
        .credits_per_worker(args.credits)
        .order(args.order)
        .mixing(sluice_client::Mixing {
            window_units: args.mix_units,
            buffer_samples: args.mix_buffer,
        })
        .worker_wait(Duration::from_secs_f64(args.worker_wait))
        .last_batch(if args.drop_last {
            LastBatch::Drop
        } else {
            LastBatch::Partial
        })
        .short_batch(if args.top_up {
            ShortBatch::TopUp
        } else {
            ShortBatch::Deliver
        });
    #[cfg(feature = "cuda")]
    if let Sink::Cuda(_, gpu) = sink {
        b = b.allocator(Arc::new(sluice_client::cuda::PinnedAllocator::new(
            gpu.clone(),
        )));
    }
    #[cfg(not(feature = "cuda"))]
    let Sink::Host = sink;
    if args.workers.len() == 1 && args.workers[0] == "local" {
        let engine = sluice_cpu::EngineConfig {
            threads: args.threads,
            ..Default::default()
        };
        let source = sluice_cpu::ShardSource::new(sluice_cpu::SourceConfig::default())?;
        b = b.in_process(Arc::new(sluice_cpu::CpuWorker::new(engine, source)?));
    } else {
        b = b.workers(args.workers.clone());
        if let Some(t) = token(args)? {
            b = b.token(t);
        }
        if let Some(c) = &args.trust_cert {
            b = b.trust_cert(c.clone());
        }
        b = b.same_host(args.same_host);
        if let Some(d) = &args.same_host_dir {
            b = b.same_host_dir(d.clone());
        }
    }
    Ok(b.build()?)
}

pub(crate) fn run_ranks(args: &Args, manifest: &Manifest) -> Result<Vec<RankResult>> {
    let resume = match &args.resume {
        Some(p) => Some(read_states(p)?),
        None => None,
    };
    let bars = MultiProgress::new();
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..args.ranks)
            .map(|rank| {
                let bar = bars.add(ProgressBar::new(0));
                if let Ok(style) = ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} batches {msg}",
                ) {
                    bar.set_style(style);
                }
                bar.set_prefix(format!("rank {rank}"));
                let resume = resume.as_deref();
                scope.spawn(move || run_rank(args, manifest, rank, &bar, resume))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    if let Some(path) = &args.dump_ids {
        // Epoch by epoch, rank by rank, each in delivery order: the same run gives the same
        // file whichever rank finished first.
        let mut blocks: Vec<(u64, u32, &str)> = results
            .iter()
            .flat_map(|r| {
                r.dump
                    .iter()
                    .map(move |(e, lines)| (*e, r.rank, lines.as_str()))
            })
            .collect();
        blocks.sort_by_key(|(e, r, _)| (*e, *r));
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        );
        for (_, _, lines) in blocks {
            f.write_all(lines.as_bytes())?;
        }
        f.flush()
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.save_state {
        let states: Vec<&sluice_client::Checkpoint> = results
            .iter()
            .filter_map(|r| r.checkpoint.as_ref())
            .collect();
        std::fs::write(path, serde_json::to_vec_pretty(&states)?)
            .with_context(|| format!("writing --save-state {}", path.display()))?;
        eprintln!(
            "saved {} ranks' state to {} (resume with --resume, any --ranks)",
            states.len(),
            path.display()
        );
    }
    Ok(results)
}

/// The checkpoints `--save-state` wrote.
fn read_states(path: &std::path::Path) -> Result<Vec<sluice_client::Checkpoint>> {
    let bytes =
        std::fs::read(path).with_context(|| format!("reading --resume {}", path.display()))?;
    let values: Vec<serde_json::Value> = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "--resume {}: not a JSON list of checkpoints",
            path.display()
        )
    })?;
    let states = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            sluice_client::Checkpoint::from_bytes(v.to_string().as_bytes())
                .with_context(|| format!("--resume {}: checkpoint #{i}", path.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    if states.is_empty() {
        bail!("--resume {}: holds no checkpoint", path.display());
    }
    Ok(states)
}

fn run_rank(
    args: &Args,
    manifest: &Manifest,
    rank: u32,
    bar: &ProgressBar,
    resume: Option<&[sluice_client::Checkpoint]>,
) -> Result<RankResult> {
    let sink = sink(&args.device, &args.dtype)?;
    let loader = loader(args, manifest, rank, &sink)?;
    let mut first_epoch = args.first_epoch;
    if let Some(states) = resume {
        loader
            .load_state_dicts(states)
            .with_context(|| format!("rank {rank}: --resume"))?;
        first_epoch = states[0].epoch;
    }
    let mut result = RankResult {
        rank,
        ..RankResult::default()
    };
    let step = Duration::from_secs_f64(args.step_ms.max(0.0) / 1000.0);
    let started = Instant::now();
    for epoch in first_epoch..first_epoch + args.epochs {
        let mut planned: HashMap<(u32, u64), i64> = HashMap::new();
        for u in loader.pending(epoch)? {
            for i in u.start..u.end {
                *planned.entry((u.shard, i)).or_default() += 1;
            }
        }
        let planned_total: i64 = planned.values().sum();
        let epoch_started = Instant::now();
        let host = loader.epoch(epoch)?;
        bar.set_length(host.batches());
        bar.set_position(0);
        let mut batches = match &sink {
            Sink::Host => Batches::Host(host),
            #[cfg(feature = "cuda")]
            Sink::Cuda(uploader, _) => Batches::Cuda(uploader.epoch(host)),
        };
        let mut lines = String::new();
        let mut labels: Vec<Vec<i64>> = Vec::new();
        let mut gpu_wait = Duration::ZERO;
        let mut taken = 0u64;
        let stop = args.stop_after_batches.filter(|_| epoch == first_epoch);
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
            let held = held.with_context(|| format!("rank {rank}, epoch {epoch}"))?;
            let Some(batch) = held.host() else {
                bail!("rank {rank}, epoch {epoch}: a device batch without its host side");
            };
            let real = batch
                .ids()
                .iter()
                .zip(batch.keys())
                .zip(batch.labels())
                .zip(batch.padding())
                .filter(|(_, pad)| !**pad);
            let mut batch_labels = Vec::with_capacity(batch.len());
            for (((id, key), label), _) in real {
                *planned.entry((id.shard, id.index)).or_default() -= 1;
                batch_labels.push(*label);
                if args.dump_ids.is_some() {
                    let shard = manifest
                        .shards
                        .get(id.shard as usize)
                        .map_or("?", |s| s.name());
                    lines.push_str(&format!("{epoch}\t{rank}\t{shard}\t{key}\n"));
                }
            }
            labels.push(batch_labels);
            for (id, reason) in batch.skipped() {
                *planned.entry((id.shard, id.index)).or_default() -= 1;
                if result.skips.len() < SKIPS_LISTED {
                    let shard = manifest
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
            bar.inc(1);
            let s = loader.stats();
            bar.set_message(format!(
                "epoch {epoch}, {:.0} samples/s{}",
                s.samples_per_s(),
                starved_note(&args.step_ms, s.starved_fraction())
            ));
        }
        result.dump.push((epoch, lines));
        result.mixing.add_epoch(&labels);
        let mut r = batches.report();
        // With a GPU sink the consumer also waits for copies: count from its side.
        if !matches!(batches, Batches::Host(_)) {
            r.starved = gpu_wait;
        }
        if bar.is_hidden() {
            // No terminal (CI, a pipe): one line per rank and epoch instead of a live bar.
            let secs = epoch_started.elapsed().as_secs_f64().max(1e-9);
            eprintln!(
                "rank {rank} epoch {epoch}: {} batches, {} samples ({} skipped) in {secs:.1}s, \
                 {:.0} samples/s{}",
                r.batches,
                r.delivered,
                r.skipped,
                (r.delivered + r.skipped) as f64 / secs,
                starved_note(&args.step_ms, r.starved.as_secs_f64() / secs)
            );
        }
        result.epochs += 1;
        result.batches += r.batches;
        result.delivered += r.delivered;
        result.skipped += r.skipped;
        result.duplicates_dropped += r.duplicates_dropped;
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
        if r.batches != batches.batches() {
            result.broken.push(format!(
                "rank {rank} epoch {epoch}: {} batches, planned {}",
                r.batches,
                batches.batches()
            ));
        }
    }
    if args.save_state.is_some() {
        result.checkpoint = loader.state_dict();
    }
    result.elapsed = started.elapsed();
    bar.finish();
    Ok(result)
}

/// ", starved N%" when consumers have a step time; with `--step-ms 0` they take batches as
/// fast as they come, so they are always waiting and the figure would mean nothing.
fn starved_note(step_ms: &f64, fraction: f64) -> String {
    if *step_ms > 0.0 {
        format!(", starved {:.0}%", fraction * 100.0)
    } else {
        String::new()
    }
}

pub(crate) fn report(args: &Args, results: &[RankResult]) -> Result<()> {
    println!(
        "{:>4} {:>6} {:>8} {:>9} {:>9} {:>7} {:>6} {:>10} {:>9}",
        "rank",
        "epochs",
        "batches",
        "planned",
        "delivered",
        "skipped",
        "dups",
        "samples/s",
        "starved"
    );
    let mut ranks = Vec::new();
    for r in results {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        let rate = (r.delivered + r.skipped) as f64 / secs;
        let starved = r.starved.as_secs_f64() / secs;
        let starved_cell = if args.step_ms > 0.0 {
            format!("{:.1}%", starved * 100.0)
        } else {
            "-".to_string() // no step time: always waiting by design
        };
        println!(
            "{:>4} {:>6} {:>8} {:>9} {:>9} {:>7} {:>6} {:>10.1} {:>9}",
            r.rank,
            r.epochs,
            r.batches,
            r.planned,
            r.delivered,
            r.skipped,
            r.duplicates_dropped,
            rate,
            starved_cell
        );
        ranks.push(json!({
            "rank": r.rank,
            "epochs": r.epochs,
            "batches": r.batches,
            "planned": r.planned,
            "delivered": r.delivered,
            "duplicates_dropped": r.duplicates_dropped,
            "skipped": r.skipped,
            "missing": r.missing,
            "delivered_twice": r.repeated,
            "samples_per_s": rate,
            "starved_fraction": starved,
            "seconds": secs,
        }));
    }
    let total: f64 = ranks
        .iter()
        .filter_map(|r| r["samples_per_s"].as_f64())
        .sum();
    println!("all ranks: {total:.1} samples/s");
    let skipped: u64 = results.iter().map(|r| r.skipped).sum();
    if skipped > 0 {
        // What was skipped and why: the run went on, but no sample is dropped unsaid.
        println!("skipped {skipped} samples (delivered in no batch); the first of each rank:");
        for r in results {
            for line in &r.skips {
                println!("  rank {}: {line}", r.rank);
            }
        }
    }
    let mut mixing = Mixing::default();
    for r in results {
        mixing.merge(&r.mixing);
    }
    let mixing_json = mixing.means().map(|(distinct, uniform)| {
        println!(
            "mixing: {distinct:.2} distinct labels per batch, {uniform:.2} under uniform sampling \
             ({:.0}%), {} order",
            distinct / uniform.max(1e-9) * 100.0,
            args.order
        );
        json!({ "distinct_labels_per_batch": distinct, "uniform_expectation": uniform })
    });
    if let Some(path) = &args.json {
        let doc = json!({
            "ranks": ranks,
            "samples_per_s": total,
            "order": args.order.to_string(),
            "mixing": mixing_json,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::device_ordinal;

    #[test]
    fn device_and_dtype_are_checked_before_anything_starts() {
        assert_eq!(device_ordinal("cpu", "uint8").unwrap(), None);
        let err = |d: &str, t: &str| device_ordinal(d, t).unwrap_err().to_string();
        assert!(err("gpu:0", "uint8").contains("expected cpu or cuda:N"));
        assert!(err("cuda:x", "uint8").contains("expected cpu or cuda:N"));
        assert!(err("cpu", "float16").contains("needs --device cuda:N"));
        assert!(err("cuda:0", "int4").contains("expected uint8, float16 or float32"));
        match device_ordinal("cuda:1", "float16") {
            Ok(n) => assert!(cfg!(feature = "cuda") && n == Some(1)),
            Err(e) => assert!(!cfg!(feature = "cuda") && e.to_string().contains("--features cuda")),
        }
    }
}
