//! `sluice bench chain`: each tier alone and the whole chain on the same machine, side by
//! side, the bottleneck named with the sizing rule, and a timeline (JSON and an SVG picture)
//! of each tier's throughput and the consumers' starvation.
//!
//! By default it starts the tiers in this process on a generated dataset; with `--dataset`,
//! `--workers` (and `--metrics` URLs of the running daemons' `/metrics`) it measures a
//! deployment that is already running.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;
use sluice_cpu::PipelineSpec;

use super::cluster;
use super::sizing::{self, Capacity};

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
    consumers: super::loadgen::Consumers,
    /// Seconds to measure each tier alone.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    #[arg(long, default_value = "sluice-bench.json")]
    json: PathBuf,
    #[arg(long, default_value = "sluice-bench.svg")]
    svg: PathBuf,
}

/// Counters read at one instant.
#[derive(Clone, Copy, Default)]
struct Reading {
    t: f64,
    storage_bytes: f64,
    worker_samples: f64,
    client_samples: f64,
    client_wait: f64,
}

fn read(metrics: &[String], started: Instant) -> Reading {
    let text = if metrics.is_empty() {
        sluice_storage::metrics_handle().render()
    } else {
        let mut all = sluice_storage::metrics_handle().render();
        for url in metrics {
            if let Ok(body) = reqwest::blocking::get(url).and_then(|r| r.text()) {
                all.push_str(&body);
            }
        }
        all
    };
    let sum = |name: &str| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ' | b'{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Reading {
        t: started.elapsed().as_secs_f64(),
        storage_bytes: sum("sluice_storage_bytes_sent_total"),
        worker_samples: sum("sluice_cpu_samples_sent_total"),
        client_samples: sum("sluice_client_samples_total"),
        client_wait: sum("sluice_client_wait_seconds_sum"),
    }
}

pub fn run(mut args: ChainArgs) -> Result<()> {
    super::daemon::init_logs_at("warn");
    if let Some(url) = &args.storage {
        args.metrics
            .push(format!("{}/metrics", url.trim_end_matches('/')));
    }
    // The process's recorder: the client's (and in-process tiers') counters land here.
    let _ = sluice_storage::metrics_handle();
    let spec: PipelineSpec = args.consumers.pipeline.parse()?;
    let Some((h, w)) = spec.output_size() else {
        bail!("--pipeline must fix the output size");
    };
    let sample_bytes = (h * w * 3) as f64 * spec.dtype().size() as f64;
    let temp = tempfile::tempdir()?;
    let (local, manifest, workers, token_file, trust) = match &args.dataset {
        Some(d) => {
            let manifest = super::index::dataset(d)?;
            (
                None,
                manifest,
                args.workers.clone(),
                args.token_file.clone(),
                args.trust_cert.clone(),
            )
        }
        None => {
            let bucket = temp.path().join("data").join("demo");
            std::fs::create_dir_all(&bucket)?;
            let what = super::demo::generate(args.samples, temp.path(), &bucket)?;
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            let threads = (cores / args.local_workers.max(1)).max(1);
            let (tiers, manifest) =
                cluster::serve_demo_bucket(temp.path(), args.local_workers, threads)?;
            eprintln!(
                "[bench] {what}, {} workers × {threads} threads in this process",
                args.local_workers
            );
            let token = temp.path().join("token");
            std::fs::write(&token, format!("{}\n", tiers.token))?;
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
    let caps = sizing::measure(&sizing::Probe {
        manifest: &manifest,
        pipeline: &args.consumers.pipeline,
        side: h.max(w),
        sample_bytes,
        cores,
        connections: (workers.len() as u32 * args.consumers.ranks) as f64,
        seconds: args.seconds,
    })?;

    eprintln!("[bench] the whole chain…");
    let lg = args
        .consumers
        .loadgen(&manifest_path, workers, token_file, trust);
    let started = Instant::now();
    let done = AtomicBool::new(false);
    let readings = Mutex::new(vec![read(&args.metrics, started)]);
    let results = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(250));
                if let Ok(mut r) = readings.lock() {
                    r.push(read(&args.metrics, started));
                }
            }
        });
        let r = super::loadgen::run_ranks(&lg, &manifest);
        done.store(true, Ordering::Relaxed);
        r
    })?;
    let secs = started.elapsed().as_secs_f64();
    let in_process = local.is_some();
    drop(local);
    let readings = readings.into_inner().unwrap_or_default();
    let delivered: u64 = results.iter().map(|r| r.delivered + r.skipped).sum();
    let chain = delivered as f64 / secs;
    let broken: Vec<&String> = results.iter().flat_map(|r| &r.broken).collect();
    let (bottleneck, why) =
        sizing::conclude(&caps, &args.consumers, per_sample_stored, sample_bytes);

    // Per interval: each tier's samples/s and the consumers' starved fraction.
    let series: Vec<serde_json::Value> = readings
        .windows(2)
        .map(|p| {
            let dt = (p[1].t - p[0].t).max(1e-9);
            json!({
                "t": p[1].t,
                "storage_samples_per_s": (p[1].storage_bytes - p[0].storage_bytes) / per_sample_stored / dt,
                "cpu_samples_per_s": (p[1].worker_samples - p[0].worker_samples) / dt,
                "consumer_samples_per_s": (p[1].client_samples - p[0].client_samples) / dt,
                "starved_fraction": ((p[1].client_wait - p[0].client_wait) / dt / f64::from(args.consumers.ranks)).clamp(0.0, 1.0),
            })
        })
        .collect();

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
    println!(
        "{:<10} {:>12.0} {:>22}  {} ranks × {} epochs, {:.1}s",
        "chain", chain, "", args.consumers.ranks, args.consumers.epochs, secs
    );
    for line in &why {
        println!("{line}");
    }
    if in_process {
        println!("note: the tiers shared this machine's {cores} cores");
    }
    let doc = json!({
        "bench": "chain",
        "tiers": caps.iter().map(Capacity::to_json).collect::<Vec<_>>(),
        "chain_samples_per_s": chain,
        "bottleneck": bottleneck,
        "why": why,
        "timeline": series,
        "contract_broken": broken,
    });
    std::fs::write(&args.json, serde_json::to_vec_pretty(&doc)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    plot(&args.svg, &doc["timeline"]).with_context(|| format!("drawing {}", args.svg.display()))?;
    println!("wrote {} and {}", args.json.display(), args.svg.display());
    if !broken.is_empty() {
        bail!("the exactly-once contract was broken: {broken:?}");
    }
    Ok(())
}

/// Throughput of each tier over time (top) and the consumers' starvation (bottom).
fn plot(path: &std::path::Path, timeline: &serde_json::Value) -> Result<()> {
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
            "consumers starved (fraction of time waiting for data)",
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
