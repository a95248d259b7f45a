//! `sluice loadgen`: synthetic GPU consumers. N ranks (threads in this process), each a
//! client that takes a batch, "computes" for `--step-ms`, and takes the next; a live line per
//! rank, a final table, and the contract checked from outside the client: every planned
//! sample delivered or skipped exactly once per rank and epoch, or a non-zero exit. The
//! consumers and their audit are `sluice_testbed::consumers`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::json;
use sluice_client::{LastBatch, LoaderConfig, ShortBatch, ShufflePolicy};
use sluice_dataset::mixture::LoadedMixture;
use sluice_shard::Manifest;
use sluice_testbed::consumers::{self, ConsumerConfig, Device, Mixing, RankResult};
use sluice_testbed::host_cost::ProcessUsage;

use crate::consumers::{Bars, FirstEpochs};
use crate::daemon;

#[derive(clap::Args, Clone)]
pub struct Args {
    /// A manifest (.json path or URL), shards (paths, URLs, brace patterns) or a mixture file
    /// (.toml); given more than once, a mixture of those datasets (see --weights).
    #[arg(long, required_unless_present = "mixture")]
    dataset: Vec<String>,
    /// A mixture's weights, one per --dataset, comma-separated (`7,3`); default: in
    /// proportion to the datasets' sizes.
    #[arg(long, value_delimiter = ',')]
    weights: Vec<f64>,
    /// A mixture file (TOML or JSON: `[[sources]]` with `dataset` and `weight`, and an
    /// optional `epoch_samples`).
    #[arg(long, conflicts_with = "dataset")]
    mixture: Option<PathBuf>,
    /// Samples per epoch of a mixture (default: all its sources' samples).
    #[arg(long)]
    epoch_samples: Option<u64>,
    /// Samples each rank of a mixture plans at once: a longer epoch is read a round at a
    /// time, in memory that does not grow with --epoch-samples.
    #[arg(long, default_value_t = sluice_plan::mixture::DEFAULT_ROUND_SAMPLES)]
    mixture_round_samples: u64,
    /// CPU workers, host:port, comma-separated; `local` decodes in this process. A DNS name
    /// stands for each of its records, re-resolved while epochs run (a headless Service).
    #[arg(long, value_delimiter = ',', required_unless_present = "workers_file")]
    workers: Vec<String>,
    /// A file of CPU workers, one host:port a line, re-read while epochs run: a worker added
    /// to it gets units within --workers-refresh, one removed from it is drained.
    #[arg(long)]
    workers_file: Option<PathBuf>,
    /// Seconds between re-reads of --workers-file and re-resolutions of worker names.
    #[arg(long, default_value_t = 1.0)]
    workers_refresh: f64,
    /// Ranks to simulate (threads in this process); they form the whole world.
    #[arg(long, default_value_t = 1)]
    ranks: u32,
    #[arg(long, default_value_t = 256)]
    batch_size: u32,
    /// Simulated compute time per step, milliseconds.
    #[arg(long, default_value_t = 0.0)]
    step_ms: f64,
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// First epoch number.
    #[arg(long, default_value_t = 0)]
    first_epoch: u64,
    #[arg(long, default_value = "decode | random_resized_crop 224 | hflip 0.5")]
    pipeline: String,
    /// Non-image fields each batch carries, comma-separated (`txt,json`), or `all`; the
    /// report says how many bytes per sample they add.
    #[arg(long, value_delimiter = ',')]
    fields: Vec<String>,
    /// Where labels come from: a field (`cls`), a JSON key path (`json:category_id`), or
    /// `none` for unlabeled data. A sample whose label is missing is skipped by name.
    #[arg(long, default_value = "cls")]
    label: String,
    /// global, local, partial:Q, or none (manifest order, contiguous runs per rank: evaluation).
    #[arg(long, default_value = "global")]
    shuffle: String,
    /// Drop the last incomplete batch.
    #[arg(long)]
    drop_last: bool,
    /// Fill batches that lost samples to the decoder with copies (marked as padding).
    #[arg(long)]
    top_up: bool,
    /// File holding the cluster token (else $SLUICE_TOKEN).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// PEM with the workers' certificate (pinned) or CA.
    #[arg(long)]
    trust_cert: Option<PathBuf>,
    /// Samples each worker may have in flight per rank.
    #[arg(long, default_value_t = 128)]
    credits: u32,
    /// QUIC connections to each worker per rank (for a worker that decodes faster than one
    /// connection carries).
    #[arg(long, default_value_t = 1)]
    connections_per_worker: u32,
    /// Threads per rank that receive samples and fill batches (the loader's `io_threads`; 0:
    /// one, or one per connection with `--connections-per-worker` above one).
    #[arg(long, default_value_t = 0)]
    io_threads: usize,
    /// Decode threads for `--workers local` (0 = one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Seconds to wait for any worker before failing.
    #[arg(long, default_value_t = 30.0)]
    worker_wait: f64,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write every delivered sample as `epoch<TAB>rank<TAB>shard<TAB>key`, in delivery order,
    /// grouped by epoch and then rank.
    #[arg(long)]
    dump_ids: Option<PathBuf>,
    /// The order samples fill batches in: `plan` (the same batches for the same seed, whatever
    /// workers, failures or resumes) or `arrival` (as they come, through a shuffle buffer).
    #[arg(long, default_value = "plan")]
    order: sluice_client::Order,
    /// Work units whose samples the plan interleaves at once.
    #[arg(long, default_value_t = sluice_client::Mixing::default().window_units)]
    mix_units: u32,
    /// Samples in the shuffle buffer after the interleave (memory: this many decoded tensors).
    #[arg(long, default_value_t = sluice_client::Mixing::default().buffer_samples)]
    mix_buffer: u32,
    /// Stop every rank after this many batches of the first epoch (with --save-state, to take
    /// a checkpoint mid-epoch).
    #[arg(long)]
    stop_after_batches: Option<u64>,
    /// Write every rank's checkpoint (a JSON list) here when the ranks stop.
    #[arg(long)]
    save_state: Option<PathBuf>,
    /// Resume from checkpoints written by --save-state, with any --ranks: the rest of their
    /// epoch is split across this run's ranks; --epochs counts that epoch as the first.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Shared memory for workers on this machine: auto (when their socket is found), off,
    /// or require.
    #[arg(long, default_value = "auto")]
    same_host: sluice_client::SameHost,
    /// Where same-host workers' sockets are (default $SLUICE_SAME_HOST_DIR or /run/sluice).
    #[arg(long)]
    same_host_dir: Option<PathBuf>,
    /// The user id same-host workers run as (default: this process's); a socket of any other
    /// user but root is refused before anything is sent, and QUIC is used.
    #[arg(long)]
    same_host_uid: Option<u32>,
    /// Start each epoch only when the consumer asks for it, not while the one before drains.
    #[arg(long)]
    no_prefetch_next_epoch: bool,
    /// The job's name on the workers, which share their decode slots among jobs by name and
    /// label per-job metrics with it (default: dataset@hostname).
    #[arg(long)]
    job_name: Option<String>,
    /// The job's share of a busy worker against other jobs' (capped by the worker's
    /// limits.max_job_weight).
    #[arg(long, default_value_t = 1)]
    job_weight: u32,
    /// Decode this job's samples for it alone: no worker serves it tensors decoded for
    /// another job of its team (a sweep with the same data, pipeline and seed), nor keeps its
    /// own for them.
    #[arg(long)]
    no_share: bool,
    /// Serve the client's metrics (`sluice_client_*`) on this address at `/metrics` while
    /// the run lasts (port 0: any free port; the log says which).
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Where batches go: `cpu` (host memory), or `cuda:N` (page-locked ring, uploaded to GPU
    /// N one batch ahead; the starved figure then includes waiting for the copy).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// With `--device cuda:N`: uint8 as the workers made it, or float16/float32 normalized
    /// (ImageNet mean/std) into NCHW on the GPU, as a training step would take it.
    #[arg(long, default_value = "uint8")]
    dtype: String,
}

/// Prints each of `problems` under `label`, then fails saying how many `what`.
fn fail_on(label: &str, problems: &[&String], what: &str) -> Result<()> {
    for p in problems {
        eprintln!("{label}: {p}");
    }
    if !problems.is_empty() {
        bail!("{} {what}", problems.len());
    }
    Ok(())
}

/// The token for remote workers: `--token-file`, else `$SLUICE_TOKEN`.
fn token(args: &Args) -> Result<Option<String>> {
    Ok(sluice_wire::token::from_file_or_env(
        args.token_file.as_deref(),
    )?)
}

/// The consumers these arguments describe.
fn config(args: &Args) -> Result<ConsumerConfig> {
    let shuffle: ShufflePolicy = args
        .shuffle
        .parse()
        .map_err(|e| anyhow::anyhow!("--shuffle: {e}"))?;
    let resume = match &args.resume {
        Some(p) => Some(consumers::read_states(p)?),
        None => None,
    };
    let name = args.dataset.join("+");
    let base = ConsumerConfig::new(name, args.workers.clone());
    let loader = LoaderConfig {
        batch_size: args.batch_size,
        seed: args.seed,
        pipeline: args.pipeline.clone(),
        fields: sluice_client::FieldSelection::from_names(&args.fields)
            .map_err(|e| anyhow::anyhow!("--{e}"))?,
        label: sluice_client::LabelSource::parse(&args.label)
            .map_err(|e| anyhow::anyhow!("--{e}"))?,
        shuffle,
        last_batch: if args.drop_last {
            LastBatch::Drop
        } else {
            LastBatch::Partial
        },
        short_batch: if args.top_up {
            ShortBatch::TopUp
        } else {
            ShortBatch::Deliver
        },
        trust_cert: args.trust_cert.clone(),
        credits_per_worker: args.credits,
        connections_per_worker: args.connections_per_worker,
        io_threads: args.io_threads,
        worker_wait: Duration::from_secs_f64(args.worker_wait),
        order: args.order,
        mixing: sluice_client::Mixing {
            window_units: args.mix_units,
            buffer_samples: args.mix_buffer,
        },
        same_host: args.same_host,
        same_host_dir: args
            .same_host_dir
            .clone()
            .unwrap_or(base.loader.same_host_dir.clone()),
        same_host_uid: args.same_host_uid.or(base.loader.same_host_uid),
        prefetch_next_epoch: !args.no_prefetch_next_epoch,
        mixture_round_samples: args.mixture_round_samples,
        job_name: args.job_name.clone().or(base.loader.job_name.clone()),
        job_weight: args.job_weight,
        share: !args.no_share,
        workers_file: args.workers_file.clone(),
        workers_refresh: Duration::from_secs_f64(args.workers_refresh.max(0.0)),
        ..base.loader.clone()
    };
    Ok(ConsumerConfig {
        loader,
        ranks: args.ranks,
        step_ms: args.step_ms,
        epochs: args.epochs,
        first_epoch: args.first_epoch,
        token: token(args)?,
        threads: args.threads,
        device: Device::parse(&args.device, &args.dtype)?,
        record_ids: args.dump_ids.is_some(),
        stop_after_batches: args.stop_after_batches,
        keep_state: args.save_state.is_some(),
        resume,
        ..base
    })
}

/// The datasets the arguments name: one manifest, or a mixture's sources, weights and epoch
/// length (from --mixture, a .toml --dataset, or several --dataset).
fn datasets(args: &Args) -> Result<(Manifest, Option<LoadedMixture>)> {
    let file = args
        .mixture
        .clone()
        .or_else(|| match args.dataset.as_slice() {
            [one] if sluice_dataset::mixture::is_mixture_file(one) => Some(PathBuf::from(one)),
            _ => None,
        });
    let mixture = match (file, args.dataset.len()) {
        (Some(path), _) => {
            if !args.weights.is_empty() {
                bail!(
                    "--weights: the mixture file {} gives the weights",
                    path.display()
                );
            }
            Some(sluice_dataset::mixture::load(&path)?)
        }
        (None, 1) if args.weights.is_empty() => None,
        (None, n) => {
            if !args.weights.is_empty() && args.weights.len() != n {
                bail!(
                    "--weights: {} weights for {n} --dataset",
                    args.weights.len()
                );
            }
            let sources = args
                .dataset
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    (
                        d.clone(),
                        d.clone(),
                        args.weights.get(i).copied().unwrap_or(1.0),
                    )
                })
                .collect();
            let mut m = sluice_dataset::mixture::weighted(sources, None)?;
            if args.weights.is_empty() {
                // No weights: in proportion to the datasets' sizes.
                m.weights = m
                    .sources
                    .iter()
                    .map(|(_, s)| s.total_samples() as f64)
                    .collect();
            }
            Some(m)
        }
    };
    match mixture {
        Some(mut m) => {
            m.epoch_samples = args.epoch_samples.or(m.epoch_samples);
            let all = m
                .sources
                .iter()
                .flat_map(|(_, s)| s.shards.clone())
                .collect();
            Ok((Manifest::new(all), Some(m)))
        }
        None => {
            if args.epoch_samples.is_some() {
                bail!("--epoch-samples: is for a mixture of several datasets");
            }
            let d = &args.dataset[0];
            let manifest = sluice_dataset::locate::dataset(d)
                .with_context(|| format!("loading dataset {d}"))?;
            Ok((manifest, None))
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    daemon::init_logs();
    if let Some(addr) = args.metrics_listen {
        let bound = sluice_daemon::serve_metrics_in_background(addr)
            .with_context(|| format!("--metrics-listen {addr}"))?;
        sluice_client::metrics::register();
        tracing::info!(metrics = %bound, "loadgen serving the client's metrics at /metrics");
    }
    // Settings first (device, dtype, shuffle, checkpoints), before loading anything.
    let mut cfg = config(&args)?;
    let (manifest, mixture) = datasets(&args)?;
    if let Some(m) = mixture {
        let l = &mut cfg.loader;
        cfg.mixture = m.fill(&mut l.weights, &mut l.epoch_samples, &mut l.weight_schedule);
    }
    cfg.validate(&manifest)?;
    let bars = Bars::new(cfg.ranks, cfg.step_ms);
    let measured = Measured::new(&bars, cfg.ranks);
    let results = consumers::run_ranks_keeping_failures(&cfg, &manifest, &measured)?;
    let usage = ProcessUsage::now();
    bars.finish();
    if let Some(path) = &args.dump_ids {
        consumers::write_dump(&results, path)?;
    }
    if let Some(path) = &args.save_state {
        let n = consumers::save_states(&results, path)?;
        eprintln!(
            "saved {n} ranks' state to {} (resume with --resume, any --ranks)",
            path.display()
        );
    }
    report(&args, &results, &cfg, measured.usage(usage, &results))?;
    let failed: Vec<&String> = results.iter().filter_map(|r| r.error.as_ref()).collect();
    fail_on(
        "failed",
        &failed,
        "ranks failed (what they delivered before is in the report and the dump)",
    )?;
    let broken: Vec<&String> = results.iter().flat_map(|r| &r.broken).collect();
    fail_on(
        "contract broken",
        &broken,
        "rank-epochs broke the exactly-once contract",
    )?;
    Ok(())
}

/// The progress bars, and this process's usage once every rank has finished its first epoch:
/// what came before is the loader's start (connections, the first pages of its buffers and
/// segments), which a long training run pays once.
struct Measured<'a> {
    bars: &'a Bars,
    first: FirstEpochs,
    after_first: std::sync::OnceLock<(ProcessUsage, u64)>,
}

impl<'a> Measured<'a> {
    fn new(bars: &'a Bars, ranks: u32) -> Self {
        Measured {
            bars,
            first: FirstEpochs::new(ranks),
            after_first: std::sync::OnceLock::new(),
        }
    }

    /// The whole run's usage (`end`, read when the ranks were done) and, when there was more
    /// than one epoch, the usage after every rank's first one, each with its samples.
    fn usage(&self, end: ProcessUsage, results: &[RankResult]) -> Usage {
        let samples: u64 = results.iter().map(|r| r.delivered + r.skipped).sum();
        let later = self
            .after_first
            .get()
            .filter(|(_, before)| *before < samples)
            .map(|(at, before)| (end.since(at), samples - before));
        Usage {
            whole: (end, samples),
            later,
        }
    }
}

/// What the process used: over the whole run, and after the first epoch.
struct Usage {
    whole: (ProcessUsage, u64),
    later: Option<(ProcessUsage, u64)>,
}

impl consumers::Observer for Measured<'_> {
    fn epoch_started(&self, rank: u32, epoch: u64, batches: u64) {
        self.bars.epoch_started(rank, epoch, batches);
    }

    fn batch(&self, rank: u32, epoch: u64, stats: &sluice_client::StatsSnapshot) {
        self.bars.batch(rank, epoch, stats);
    }

    fn epoch_done(&self, rank: u32, epoch: u64, r: &sluice_client::EpochReport, secs: f64) {
        self.bars.epoch_done(rank, epoch, r, secs);
        if let Some(samples) = self.first.epoch_done(rank, r.delivered + r.skipped) {
            let _ = self.after_first.set((ProcessUsage::now(), samples));
        }
    }
}

fn report(args: &Args, results: &[RankResult], cfg: &ConsumerConfig, usage: Usage) -> Result<()> {
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
            "field_bytes": r.field_bytes,
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
    // The client's cost to its host (its decoding is the workers'), as `bench host-cost`
    // measures it, from outside.
    let (whole, samples) = usage.whole;
    match &usage.later {
        Some((later, n)) => println!(
            "client process: {}; after the first epoch: {}",
            whole.per_sample(samples),
            later.per_sample(*n)
        ),
        None => println!("client process: {}", whole.per_sample(samples)),
    }
    let usage_json = |(u, n): (ProcessUsage, u64)| {
        json!({
            "samples": n, "user_secs": u.user_secs, "sys_secs": u.sys_secs,
            "page_faults": u.minor_faults + u.major_faults, "context_switches": u.switches,
        })
    };
    let delivered: u64 = results.iter().map(|r| r.delivered).sum();
    let field_bytes: u64 = results.iter().map(|r| r.field_bytes).sum();
    let fields_per_sample = field_bytes as f64 / delivered.max(1) as f64;
    if !args.fields.is_empty() {
        println!(
            "fields ({}): {fields_per_sample:.0} bytes per sample beside the tensor",
            args.fields.join(",")
        );
    }
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
    let storage: u64 = results.iter().map(|r| r.storage_bytes).sum();
    let cached: u64 = results.iter().map(|r| r.cached_bytes).sum();
    let elsewhere: u64 = results.iter().map(|r| r.elsewhere).sum();
    let cache_json = (cached > 0).then(|| {
        let ratio = cached as f64 / (storage + cached) as f64;
        println!(
            "worker caches: {:.1}% of shard bytes ({:.1} MB from the caches, {:.1} MB from \
             storage); {elsewhere} units ran on a worker other than their shard's owner",
            ratio * 100.0,
            cached as f64 / 1e6,
            storage as f64 / 1e6
        );
        json!({
            "hit_ratio": ratio,
            "cached_bytes": cached,
            "storage_bytes": storage,
            "units_elsewhere": elsewhere,
        })
    });
    let mut sources_json = Vec::new();
    if !cfg.mixture.is_empty() {
        let mut per_source = vec![0u64; cfg.mixture.len()];
        for r in results {
            for (t, n) in per_source.iter_mut().zip(&r.per_source) {
                *t += n;
            }
        }
        let all: u64 = per_source.iter().sum();
        let weight_sum: f64 = cfg.loader.weights.iter().sum();
        println!("sources: delivered (share; weight's share)");
        for (i, ((name, _), n)) in cfg.mixture.iter().zip(&per_source).enumerate() {
            let share = *n as f64 / all.max(1) as f64;
            let target = cfg
                .loader
                .weights
                .get(i)
                .map_or(0.0, |w| w / weight_sum.max(1e-12));
            println!(
                "  {name}: {n} ({:.1}%; {:.1}%)",
                share * 100.0,
                target * 100.0
            );
            sources_json
                .push(json!({"source": name, "delivered": n, "share": share, "target": target}));
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
            "field_bytes_per_sample": fields_per_sample,
            "mixing": mixing_json,
            "sources": sources_json,
            "worker_cache": cache_json,
            "process": usage_json(usage.whole),
            "process_after_first_epoch": usage.later.map(usage_json),
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
