//! `sluice loadgen`: synthetic GPU consumers. N ranks (threads in this process), each a
//! client that takes a batch, "computes" for `--step-ms`, and takes the next; a live line per
//! rank, a final table, and the contract checked from outside the client: every planned
//! sample delivered or skipped exactly once per rank and epoch, or a non-zero exit.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
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
    /// Write every delivered sample as `epoch<TAB>rank<TAB>shard<TAB>key`.
    #[arg(long)]
    pub(crate) dump_ids: Option<PathBuf>,
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
}

pub fn run(args: Args) -> Result<()> {
    super::daemon::init_logs();
    if args.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    device_ordinal(&args.device, &args.dtype)?;
    let manifest = super::index::dataset(&args.dataset)
        .with_context(|| format!("loading dataset {}", args.dataset))?;
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
    let bars = MultiProgress::new();
    let dump = match &args.dump_ids {
        Some(p) => Some(Arc::new(Mutex::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )))),
        None => None,
    };
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
                let dump = dump.clone();
                scope.spawn(move || run_rank(args, manifest, rank, &bar, dump.as_deref()))
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
    if let Some(d) = dump {
        d.lock()
            .map_err(|_| anyhow::anyhow!("dump file lock"))?
            .flush()?;
    }
    Ok(results)
}

fn run_rank(
    args: &Args,
    manifest: &Manifest,
    rank: u32,
    bar: &ProgressBar,
    dump: Option<&Mutex<std::io::BufWriter<std::fs::File>>>,
) -> Result<RankResult> {
    let sink = sink(&args.device, &args.dtype)?;
    let loader = loader(args, manifest, rank, &sink)?;
    let mut result = RankResult {
        rank,
        ..RankResult::default()
    };
    let step = Duration::from_secs_f64(args.step_ms.max(0.0) / 1000.0);
    let started = Instant::now();
    for epoch in args.first_epoch..args.first_epoch + args.epochs {
        let mut planned: HashMap<(u32, u64), i64> = HashMap::new();
        for u in loader.plan(epoch)? {
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
        let mut gpu_wait = Duration::ZERO;
        loop {
            let waited = Instant::now();
            let Some(held) = batches.next_ready() else {
                break;
            };
            gpu_wait += waited.elapsed();
            let held = held.with_context(|| format!("rank {rank}, epoch {epoch}"))?;
            let Some(batch) = held.host() else {
                bail!("rank {rank}, epoch {epoch}: a device batch without its host side");
            };
            let real = batch
                .ids()
                .iter()
                .zip(batch.keys())
                .zip(batch.padding())
                .filter(|(_, pad)| !**pad);
            for ((id, key), _) in real {
                *planned.entry((id.shard, id.index)).or_default() -= 1;
                if dump.is_some() {
                    let shard = manifest
                        .shards
                        .get(id.shard as usize)
                        .map_or("?", |s| s.name());
                    lines.push_str(&format!("{epoch}\t{rank}\t{shard}\t{key}\n"));
                }
            }
            for (id, _) in batch.skipped() {
                *planned.entry((id.shard, id.index)).or_default() -= 1;
            }
            drop(held);
            if !step.is_zero() {
                std::thread::sleep(step);
            }
            bar.inc(1);
            let s = loader.stats();
            bar.set_message(format!(
                "epoch {epoch}, {:.0} samples/s, starved {:.0}%",
                s.samples_per_s(),
                s.starved_fraction() * 100.0
            ));
        }
        if let Some(d) = dump {
            d.lock()
                .map_err(|_| anyhow::anyhow!("dump file lock"))?
                .write_all(lines.as_bytes())?;
        }
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
                 {:.0} samples/s, starved {:.0}%",
                r.batches,
                r.delivered,
                r.skipped,
                (r.delivered + r.skipped) as f64 / secs,
                r.starved.as_secs_f64() / secs * 100.0
            );
        }
        let missing: i64 = planned.values().filter(|v| **v > 0).sum();
        let repeated: i64 = -planned.values().filter(|v| **v < 0).sum::<i64>();
        result.epochs += 1;
        result.batches += r.batches;
        result.planned += planned_total as u64;
        result.delivered += r.delivered;
        result.skipped += r.skipped;
        result.duplicates_dropped += r.duplicates_dropped;
        result.missing += missing as u64;
        result.repeated += repeated as u64;
        result.starved += r.starved;
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
    result.elapsed = started.elapsed();
    bar.finish();
    Ok(result)
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
        println!(
            "{:>4} {:>6} {:>8} {:>9} {:>9} {:>7} {:>6} {:>10.1} {:>8.1}%",
            r.rank,
            r.epochs,
            r.batches,
            r.planned,
            r.delivered,
            r.skipped,
            r.duplicates_dropped,
            rate,
            starved * 100.0
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
    if let Some(path) = &args.json {
        let doc = json!({ "ranks": ranks, "samples_per_s": total });
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
