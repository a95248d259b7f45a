//! `sluice demo`: the whole system on this machine with one command. It makes a dataset
//! (generated JPEGs, or `--images DIR` / `--shards PATTERN`), shards and serves it from a
//! storage node, starts CPU workers and synthetic consumers in this process over real
//! loopback sockets (HTTP and QUIC), measures each tier alone, runs a few epochs, and reports
//! throughput, the bottleneck and the contract. Exits non-zero if a sample was lost or
//! repeated.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;
use sluice_cpu::PipelineSpec;

use super::cluster;
use super::sizing::{self, Capacity};

#[derive(clap::Args)]
pub struct Args {
    /// Use these JPEGs (an ImageFolder tree, or a flat folder with labels.tsv) instead of
    /// generated ones.
    #[arg(long)]
    images: Option<PathBuf>,
    /// Use these shards (paths with brace patterns) instead of making some.
    #[arg(long, conflicts_with = "images")]
    shards: Option<String>,
    /// Generated images (when neither --images nor --shards is given).
    #[arg(long, default_value_t = 1000)]
    samples: u32,
    /// CPU workers to start.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Decode threads per worker (0 = this machine's cores divided among the workers).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[command(flatten)]
    consumers: super::loadgen::Consumers,
    /// Keep the dataset and state here (default: a temporary folder, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Also write the report as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Runs this binary's own subcommand (dataset tools), quietly.
fn sluice(args: &[&str]) -> Result<()> {
    let exe = std::env::current_exe().context("locating the sluice binary")?;
    let out = Command::new(exe).args(args).output()?;
    if !out.status.success() {
        bail!(
            "sluice {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// Fills `bucket` with shards (and their .idx); returns how the dataset was made.
fn make_dataset(args: &Args, work: &Path, bucket: &Path) -> Result<String> {
    if let Some(spec) = &args.shards {
        let mut n = 0;
        for (i, name) in sluice_shard::expand(spec)?.iter().enumerate() {
            let src = PathBuf::from(name);
            let dst = bucket.join(format!("train-{i:06}.tar"));
            if std::fs::hard_link(&src, &dst).is_err() {
                std::fs::copy(&src, &dst).with_context(|| format!("copying {name}"))?;
            }
            let idx = sluice_shard::SampleIndex::sidecar_path(&src);
            if idx.exists() {
                let _ = std::fs::copy(&idx, sluice_shard::SampleIndex::sidecar_path(&dst));
            }
            n += 1;
        }
        return Ok(format!("{n} shards from {spec}"));
    }
    let (input, what) = match &args.images {
        Some(dir) => (dir.clone(), format!("JPEGs from {}", dir.display())),
        None => return generate(args.samples, work, bucket),
    };
    shard_images(&input, bucket)?;
    Ok(what)
}

/// Generates about `samples` JPEGs (10 classes) under `work` and shards them into `bucket`.
pub(crate) fn generate(samples: u32, work: &Path, bucket: &Path) -> Result<String> {
    let images = work.join("images");
    let per_class = samples.div_ceil(10).max(1);
    sluice(&[
        "synth",
        "--output",
        s(&images),
        "--classes",
        "10",
        "--per-class",
        &per_class.to_string(),
    ])?;
    shard_images(&images, bucket)?;
    Ok(format!("{} generated JPEGs", per_class * 10))
}

fn shard_images(input: &Path, bucket: &Path) -> Result<()> {
    let pattern = bucket.join("train-%06d.tar");
    let mut cmd = vec![
        "shard",
        "--input",
        s(input),
        "--output",
        s(&pattern),
        "--max-count",
        "50",
    ];
    let labels = input.join("labels.tsv");
    if labels.exists() {
        cmd.extend(["--labels", s(&labels)]);
    }
    sluice(&cmd)
}

pub fn run(args: Args) -> Result<()> {
    // The report is the output; the daemons' info logs would bury it.
    super::daemon::init_logs_at("warn");
    let started = Instant::now();
    let temp = tempfile::tempdir()?;
    let work = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    let bucket = work.join("data").join("demo");
    std::fs::create_dir_all(&bucket)?;
    let spec: PipelineSpec = args.consumers.pipeline.parse()?;
    let Some((h, w)) = spec.output_size() else {
        bail!("--pipeline must fix the output size");
    };
    let sample_bytes = (h * w * 3) as f64 * spec.dtype().size() as f64;

    eprintln!("[demo] making the dataset…");
    let what = make_dataset(&args, &work, &bucket)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = match args.threads {
        0 => (cores / args.workers.max(1)).max(1),
        n => n,
    };
    let (tiers, manifest) = cluster::serve_demo_bucket(&work, args.workers, threads)?;
    let manifest_path = work.join("manifest.json");
    manifest.save(&manifest_path)?;
    println!(
        "sluice demo: {what} in {} shards ({:.1} MB) on a storage node at {}; {} CPU workers × {threads} threads; {} consumers × {} epochs, batch {}, step {} ms",
        manifest.shards.len(),
        manifest.total_bytes() as f64 / 1e6,
        tiers.storage_url,
        args.workers,
        args.consumers.ranks,
        args.consumers.epochs,
        args.consumers.batch_size,
        args.consumers.step_ms
    );

    eprintln!("[demo] measuring each tier alone…");
    let per_sample_stored = sizing::stored_bytes_per_sample(&manifest);
    let caps = sizing::measure(&sizing::Probe {
        manifest: &manifest,
        pipeline: &args.consumers.pipeline,
        side: h.max(w),
        sample_bytes,
        cores: args.workers * threads,
        connections: (args.workers as u32 * args.consumers.ranks) as f64,
        seconds: 2.0,
    })?;

    eprintln!("[demo] running the system…");
    let token_file = work.join("state").join("token");
    std::fs::write(&token_file, format!("{}\n", tiers.token))?;
    let lg = args.consumers.loadgen(
        &manifest_path,
        tiers.workers.iter().map(|a| a.to_string()).collect(),
        Some(token_file),
        Some(tiers.trust.clone()),
    );
    let bytes_before = cluster::counter("sluice_storage_bytes_sent_total");
    let sent_before = cluster::counter("sluice_cpu_samples_sent_total");
    let chain_started = Instant::now();
    let results = super::loadgen::run_ranks(&lg, &manifest)?;
    let chain_secs = chain_started.elapsed().as_secs_f64();
    let served = cluster::counter("sluice_storage_bytes_sent_total") - bytes_before;
    let sent = cluster::counter("sluice_cpu_samples_sent_total") - sent_before;
    drop(tiers);

    let planned: u64 = results.iter().map(|r| r.planned).sum();
    let delivered: u64 = results.iter().map(|r| r.delivered).sum();
    let skipped: u64 = results.iter().map(|r| r.skipped).sum();
    let missing: u64 = results.iter().map(|r| r.missing).sum();
    let repeated: u64 = results.iter().map(|r| r.repeated).sum();
    let dups: u64 = results.iter().map(|r| r.duplicates_dropped).sum();
    let chain = (delivered + skipped) as f64 / chain_secs;
    let starved: f64 = results
        .iter()
        .map(|r| r.starved.as_secs_f64() / r.elapsed.as_secs_f64().max(1e-9))
        .sum::<f64>()
        / results.len().max(1) as f64;
    let (bottleneck, why) =
        sizing::conclude(&caps, &args.consumers, per_sample_stored, sample_bytes);

    println!("\ntiers alone (each measured by itself, on this machine):");
    for c in &caps {
        println!(
            "  {:<9} {:>8.0} samples/s   {} × {:.0}/s   {}",
            c.tier,
            c.samples_per_s,
            sizing::count(c.units, c.unit),
            c.per_unit(),
            c.detail
        );
    }
    println!(
        "whole chain: {chain:.0} samples/s over {chain_secs:.1}s; the storage node served {:.1} MB, the workers sent {sent:.0} samples",
        served / 1e6
    );
    println!(
        "consumers: starved {:.0}% of the time{}",
        starved * 100.0,
        if args.consumers.step_ms == 0.0 {
            " (step 0 ms: they take data as fast as it comes, so they always wait)"
        } else {
            ""
        }
    );
    for line in &why {
        println!("{line}");
    }
    if args.workers * threads >= cores {
        println!(
            "note: all tiers share this machine's {cores} cores, so the chain runs below the slowest tier alone"
        );
    }
    let ok = missing == 0 && repeated == 0 && delivered + skipped == planned;
    println!(
        "contract: planned {planned}, delivered {delivered}, skipped {skipped}, lost {missing}, delivered twice {repeated} (duplicates dropped by the client: {dups}) — {}",
        if ok { "kept" } else { "BROKEN" }
    );
    println!("done in {:.1}s", started.elapsed().as_secs_f64());
    if let Some(path) = &args.json {
        let doc = json!({
            "tiers": caps.iter().map(Capacity::to_json).collect::<Vec<_>>(),
            "chain_samples_per_s": chain, "bottleneck": bottleneck, "why": why,
            "starved_fraction": starved, "planned": planned, "delivered": delivered,
            "skipped": skipped, "lost": missing, "duplicated": repeated, "contract_kept": ok,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !ok {
        bail!("the exactly-once contract was broken");
    }
    Ok(())
}
