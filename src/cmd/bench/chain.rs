//! `sluice bench chain`: each tier alone and the whole chain on the same machine, side by
//! side, the bottleneck named with the sizing rule, and a timeline (JSON and an SVG picture)
//! of each tier's throughput and the consumers' starvation.
//!
//! By default it starts the tiers in this process on a generated dataset; with `--dataset`,
//! `--workers` (and `--metrics` URLs of the running daemons' `/metrics`) it measures a
//! deployment that is already running.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::json;
use sluice_testbed::cluster;
use sluice_testbed::sizing::{self, Capacity};
use sluice_testbed::tier_cpu;

use crate::consumers::{Bars, Consumers, FirstEpochs, Paced};

#[derive(clap::Args)]
pub struct ChainArgs {
    /// A manifest (.json path or URL) of a served dataset; default: a generated one served
    /// by a storage node in this process.
    #[arg(long, requires = "workers")]
    dataset: Option<String>,
    /// Running CPU workers (host:port, comma-separated); default: workers in this process.
    #[arg(long, value_delimiter = ',')]
    workers: Vec<String>,
    /// A running storage node's base URL (its /metrics feeds the storage timeline).
    #[arg(long, requires = "dataset")]
    storage: Option<String>,
    /// Other /metrics URLs of running daemons (the workers' `metrics_listen`).
    #[arg(long, value_delimiter = ',')]
    metrics: Vec<String>,
    #[arg(long)]
    token_file: Option<PathBuf>,
    #[arg(long)]
    trust_cert: Option<PathBuf>,
    /// In-process workers to start (without --workers).
    #[arg(long, default_value_t = 2)]
    local_workers: usize,
    /// Generated images (without --dataset).
    #[arg(long, default_value_t = 1000)]
    samples: u32,
    #[command(flatten)]
    consumers: Consumers,
    /// Seconds to measure each tier alone.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// In process, run the chain over this transport only (default: QUIC, then same-host).
    #[arg(long, value_parser = ["quic", "same-host"])]
    transport: Option<String>,
    #[arg(long, default_value = "sluice-bench.json")]
    json: PathBuf,
    #[arg(long, default_value = "sluice-bench.svg")]
    svg: PathBuf,
}

pub fn run(mut args: ChainArgs) -> Result<()> {
    crate::daemon::init_logs_at("warn");
    if let Some(url) = &args.storage {
        args.metrics
            .push(format!("{}/metrics", url.trim_end_matches('/')));
    }
    // The process's recorder: the client's (and in-process tiers') counters land here.
    let _ = sluice_daemon::metrics_handle();
    let (_, sample_bytes) = sizing::tensor_size(&args.consumers.pipeline)?;
    let temp = tempfile::tempdir()?;
    let (local, manifest, workers, token, trust) = match &args.dataset {
        Some(d) => {
            let manifest = sluice_dataset::locate::dataset(d)?;
            (
                None,
                manifest,
                args.workers.clone(),
                args.token_file
                    .as_deref()
                    .map(sluice_wire::token::read)
                    .transpose()?,
                args.trust_cert.clone(),
            )
        }
        None => {
            let (tiers, manifest, what) =
                cluster::generated_chain(args.samples, args.local_workers, temp.path())?;
            eprintln!("[bench] {what}");
            let token = tiers.token.clone();
            let workers = tiers.workers.iter().map(|a| a.to_string()).collect();
            let trust = tiers.trust.clone();
            (Some(tiers), manifest, workers, Some(token), Some(trust))
        }
    };
    let manifest_path = temp.path().join("manifest.json");
    manifest.save(&manifest_path)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());

    eprintln!("[bench] each tier alone, {}s each…", args.seconds);
    let per_sample_stored = sizing::stored_bytes_per_sample(&manifest);
    let caps = sizing::measure(&sizing::Probe::chain(
        &manifest,
        &args.consumers.pipeline,
        cores,
        workers.len(),
        args.consumers.ranks,
        args.seconds,
    )?)?;

    // In process, the chain runs over QUIC and again over the same-host transport (the
    // workers share this machine); against running daemons, as the client finds them.
    let base = args.consumers.config(&manifest_path, workers, token, trust);
    let transports = match &local {
        Some(tiers) => tiers
            .over_each_transport(&base)
            .into_iter()
            .filter(|(name, _)| args.transport.as_deref().is_none_or(|t| t == *name))
            .collect(),
        None => vec![("as configured", base.clone())],
    };
    let mut runs = Vec::new();
    for (name, cfg) in &transports {
        eprintln!("[bench] the whole chain ({name})…");
        let bars = Bars::new(cfg.ranks, cfg.step_ms);
        let paced = Paced {
            bars: &bars,
            first: FirstEpochs::new(cfg.ranks),
        };
        let run = sizing::run_chain(cfg, &manifest, &args.metrics, &paced)?;
        let total = run.results.iter().map(|r| r.delivered + r.skipped).sum();
        let later = paced.first.rate_after(std::time::Instant::now(), total);
        bars.finish();
        runs.push((*name, run, later));
    }
    let in_process = local.is_some();
    drop(local);
    let cfg = &base;
    let (bottleneck, why) = sizing::conclude(&caps, cfg, per_sample_stored, sample_bytes);
    let cpu_alone = caps
        .iter()
        .find(|c| c.tier == "cpu")
        .map_or(0.0, |c| c.samples_per_s);

    println!("{:<10} {:>12} {:>22}  detail", "tier", "samples/s", "units");
    for c in &caps {
        println!(
            "{:<10} {:>12.0} {:>22}  {}",
            c.tier,
            c.samples_per_s,
            format!("{} × {:.0}/s", sizing::count(c.units, c.unit), c.per_unit()),
            c.detail
        );
    }
    let ratio = |rate: f64| rate / cpu_alone.max(1e-9);
    for (name, run, later) in &runs {
        // After the first epoch: a long run's pace, without the loader's start and a
        // plan-ordered epoch's first batches (which wait for many units).
        let steady = later.map_or(String::new(), |l| {
            format!(" ({:.0}/s, {:.2}, after the first epoch)", l, ratio(l))
        });
        println!(
            "{:<10} {:>12.0} {:>22}  {name}: {} ranks × {} epochs in {:.1}s, {:.2} of the CPU tier alone on the same cores{steady}",
            "chain",
            run.samples_per_s(),
            "",
            args.consumers.ranks,
            args.consumers.epochs,
            run.seconds,
            ratio(run.samples_per_s())
        );
    }
    for (name, run, _) in &runs {
        println!("{}", cpu_line(name, run, in_process));
    }
    for (name, run, _) in &runs {
        let (storage, cached) = run.shard_bytes();
        println!(
            "shards ({name}): {:.1} MB read from the storage tier, {:.1} MB from the workers' \
             caches ({:.0}% hits)",
            storage as f64 / 1e6,
            cached as f64 / 1e6,
            cached as f64 / (storage + cached).max(1) as f64 * 100.0
        );
    }
    for line in &why {
        println!("{line}");
    }
    if in_process {
        println!("note: the tiers shared this machine's {cores} cores");
    }
    // The first run's timeline is drawn; each run's figures are in the JSON.
    let series = sizing::timeline(&runs[0].1.readings, per_sample_stored, cfg);
    let broken: Vec<String> = runs
        .iter()
        .flat_map(|(name, run, _)| {
            run.broken()
                .into_iter()
                .map(move |b| format!("{name}: {b}"))
        })
        .collect();
    let doc = json!({
        "bench": "chain",
        "tiers": caps.iter().map(Capacity::to_json).collect::<Vec<_>>(),
        "chain_samples_per_s": runs[0].1.samples_per_s(),
        "chains": runs.iter().map(|(name, run, later)| json!({
            "transport": name,
            "samples_per_s": run.samples_per_s(),
            "seconds": run.seconds,
            "vs_cpu_alone": ratio(run.samples_per_s()),
            "samples_per_s_after_first_epoch": later,
            "vs_cpu_alone_after_first_epoch": later.map(ratio),
            "cpu_us_per_sample": cpu_per_sample(run),
            "storage_bytes": run.shard_bytes().0,
            "cached_bytes": run.shard_bytes().1,
            "timeline": sizing::timeline(&run.readings, per_sample_stored, cfg),
        })).collect::<Vec<_>>(),
        "bottleneck": bottleneck,
        "why": why,
        "timeline": series,
        "contract_broken": broken,
    });
    std::fs::write(&args.json, serde_json::to_vec_pretty(&doc)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    plot(&args.svg, &doc["timeline"], cfg.step_ms > 0.0)
        .with_context(|| format!("drawing {}", args.svg.display()))?;
    println!("wrote {} and {}", args.json.display(), args.svg.display());
    if !broken.is_empty() {
        bail!("the exactly-once contract was broken: {broken:?}");
    }
    Ok(())
}

/// CPU microseconds per delivered sample by tier ([`sluice_testbed::tier_cpu`]), and the
/// work that is not decoding (storage, the workers' transport, the client) as a share of the
/// decoders'.
fn cpu_per_sample(run: &sizing::ChainRun) -> serde_json::Value {
    let samples: u64 = run.results.iter().map(|r| r.delivered + r.skipped).sum();
    let us = |secs: f64| secs * 1e6 / samples.max(1) as f64;
    let mut out: serde_json::Map<String, serde_json::Value> = run
        .cpu
        .iter()
        .map(|(tier, secs)| (tier.to_string(), us(*secs).into()))
        .collect();
    let decode = run.cpu.get(tier_cpu::DECODE).copied().unwrap_or(0.0);
    let other: f64 = tier_cpu::NOT_DECODING
        .iter()
        .filter_map(|t| run.cpu.get(t))
        .sum();
    out.insert(
        "non_decode_of_decode".into(),
        (other / decode.max(1e-9)).into(),
    );
    out.into()
}

/// The CPU line of one chain run: every tier's CPU per sample when they ran in this
/// process, the client's alone otherwise.
fn cpu_line(name: &str, run: &sizing::ChainRun, in_process: bool) -> String {
    let per = cpu_per_sample(run);
    let us = |tier: &str| per[tier].as_f64().unwrap_or(0.0);
    if !in_process {
        return format!(
            "cpu ({name}): client {:.1} µs/sample, consumers {:.1} (the tiers run elsewhere: \
             their CPU is on their hosts)",
            us("client"),
            us("consumers")
        );
    }
    let tiers: Vec<String> = tier_cpu::TIERS
        .iter()
        .map(|t| format!("{t} {:.1}", us(t)))
        .collect();
    format!(
        "cpu ({name}): µs/sample {}; not decoding ({}): {:.1}% of the decoders'",
        tiers.join(", "),
        tier_cpu::NOT_DECODING.join(", "),
        per["non_decode_of_decode"].as_f64().unwrap_or(0.0) * 100.0
    )
}

/// Throughput of each tier over time (top) and the consumers' starvation (bottom).
fn plot(path: &std::path::Path, timeline: &serde_json::Value, starvation: bool) -> Result<()> {
    use plotters::prelude::*;
    let points = timeline.as_array().cloned().unwrap_or_default();
    let series = |key: &str| -> Vec<(f64, f64)> {
        points
            .iter()
            .filter_map(|p| Some((p["t"].as_f64()?, p[key].as_f64()?)))
            .collect()
    };
    let t_max = points
        .last()
        .and_then(|p| p["t"].as_f64())
        .unwrap_or(1.0)
        .max(0.1);
    let lines = [
        ("storage (samples/s)", series("storage_samples_per_s"), BLUE),
        ("cpu workers (samples/s)", series("cpu_samples_per_s"), RED),
        (
            "consumers (samples/s)",
            series("consumer_samples_per_s"),
            GREEN,
        ),
    ];
    let y_max = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.1))
        .fold(1.0f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);
    let mut chart = ChartBuilder::on(&top)
        .caption("sluice bench chain: throughput by tier", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("samples/s")
        .draw()?;
    for (name, data, color) in lines {
        chart
            .draw_series(LineSeries::new(data, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    let mut starve = ChartBuilder::on(&bottom)
        .caption(
            if starvation {
                "consumers starved (fraction of time waiting for data)"
            } else {
                "consumers starved: not measured (--step-ms 0 takes data as fast as it comes)"
            },
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max, 0.0..1.05)?;
    starve.configure_mesh().x_desc("seconds").draw()?;
    starve.draw_series(LineSeries::new(
        series("starved_fraction"),
        BLACK.stroke_width(2),
    ))?;
    root.present()?;
    Ok(())
}
