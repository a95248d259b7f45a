//! `sluice demo`: the whole system on this machine with one command. It makes a dataset
//! (generated JPEGs, or `--images DIR` / `--shards PATTERN`), shards and serves it from a
//! storage node, starts CPU workers and synthetic consumers in this process over real
//! loopback sockets (HTTP and QUIC), measures each tier alone, runs a few epochs, and reports
//! throughput, the bottleneck and the contract. Exits non-zero if a sample was lost or
//! repeated.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;
use sluice_testbed::sizing::{self, Capacity};
use sluice_testbed::{cluster, consumers};

use crate::consumers::{Bars, Consumers};

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
    /// Each worker's shard cache (`0`: none): epochs after the first read their shards from
    /// the workers' local disks, not the storage node.
    #[arg(long, default_value = "1G", value_parser = crate::args::parse_bytes)]
    cache_size: u64,
    #[command(flatten)]
    consumers: Consumers,
    /// Keep the dataset and state here (default: a temporary folder, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Also write the report as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Fills `bucket` with shards (and their .idx); returns how the dataset was made.
fn make_dataset(args: &Args, work: &Path, bucket: &Path) -> Result<String> {
    if let Some(spec) = &args.shards {
        let n = cluster::link_shards(spec, bucket)?;
        return Ok(format!("{n} shards from {spec}"));
    }
    match &args.images {
        Some(dir) => {
            cluster::shard_images(dir, bucket)?;
            Ok(format!("JPEGs from {}", dir.display()))
        }
        None => Ok(cluster::generate_bucket(args.samples, work, bucket)?),
    }
}

pub fn run(args: Args) -> Result<()> {
    // The report is the output; the daemons' info logs would bury it.
    crate::daemon::init_logs_at("warn");
    let started = Instant::now();
    let temp = tempfile::tempdir()?;
    let work = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    let bucket = work.join("data").join("demo");
    std::fs::create_dir_all(&bucket)?;
    let (_, sample_bytes) = sizing::tensor_size(&args.consumers.pipeline)?;

    eprintln!("[demo] making the dataset…");
    let what = make_dataset(&args, &work, &bucket)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = match args.threads {
        0 => (cores / args.workers.max(1)).max(1),
        n => n,
    };
    let (tiers, manifest) =
        cluster::serve_demo_bucket(&work, args.workers, threads, args.cache_size)?;
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
    let caps = sizing::measure(&sizing::Probe::chain(
        &manifest,
        &args.consumers.pipeline,
        args.workers * threads,
        args.workers,
        args.consumers.ranks,
        2.0,
    )?)?;

    eprintln!("[demo] running the system…");
    let cfg = args.consumers.config(
        &manifest_path,
        tiers.workers.iter().map(|a| a.to_string()).collect(),
        Some(tiers.token.clone()),
        Some(tiers.trust.clone()),
    );
    let bytes_before = cluster::counter("sluice_storage_bytes_sent_total");
    let sent_before = cluster::counter("sluice_cpu_samples_sent_total");
    let chain_started = Instant::now();
    let bars = Bars::new(cfg.ranks, cfg.step_ms);
    let results = consumers::run_ranks(&cfg, &manifest, &bars)?;
    bars.finish();
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
    let (bottleneck, why) = sizing::conclude(&caps, &cfg, per_sample_stored, sample_bytes);

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
    // Per epoch, where the shards came from: the storage node, or the workers' caches.
    let mut by_epoch: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
    for r in &results {
        for &(epoch, storage, cached) in &r.epoch_bytes {
            let e = by_epoch.entry(epoch).or_default();
            (e.0, e.1) = (e.0 + storage, e.1 + cached);
        }
    }
    for (epoch, (storage, cached)) in &by_epoch {
        let ratio = *cached as f64 / (storage + cached).max(1) as f64;
        println!(
            "epoch {epoch}: {:.1} MB of shards from the storage node, {:.1} MB from the workers' \
             caches ({:.0}%)",
            *storage as f64 / 1e6,
            *cached as f64 / 1e6,
            ratio * 100.0
        );
    }
    // With no step time the consumers take data as fast as it comes, so they always wait:
    // a starved figure would mean nothing there (the JSON keeps the measured fraction).
    if cfg.step_ms > 0.0 {
        println!("consumers: starved {:.0}% of the time", starved * 100.0);
    } else {
        println!(
            "consumers: step 0 ms, so they take data as fast as it comes (give --step-ms for a starvation figure)"
        );
    }
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
            "epochs": by_epoch.iter().map(|(e, (s, c))| json!({
                "epoch": e, "storage_bytes": s, "cached_bytes": c,
            })).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !ok {
        bail!("the exactly-once contract was broken");
    }
    Ok(())
}
