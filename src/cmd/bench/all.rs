//! `sluice bench all`: the performance table of issue 18 in one run. Each figure is a ratio
//! measured in this run beside its reference: the CPU engine per core against DALI (CPU, ROI
//! decode) and a bare libjpeg-turbo decode from the anchor benchmarks (on the corpus as it is,
//! and again with restart markers, as `sluice shard` writes it by default), QUIC against TCP and
//! same-host against memcpy on one connection, the client's CPU per sample on each against
//! the floor its bytes need (`bench host-cost`), and the whole chain (each transport) against
//! the CPU tier alone on the same cores.
//!
//! The anchors come from `../shared/bench/anchors/run_all.sh`: with `--anchors` it runs
//! (`QUICK=1`) when its venv exists, or `--anchors-results FILE` reads an earlier run's TSV;
//! without either, the rows that need them say so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sluice_cpu::{EngineConfig, PipelineSpec};
use sluice_testbed::consumers::{ConsumerConfig, Silent};
use sluice_testbed::sizing;
use sluice_testbed::transport::{self, TransportProbe};

#[derive(clap::Args)]
pub struct AllArgs {
    /// Run the anchor benchmarks (QUICK=1) when their venv exists ($VENV, default
    /// /tmp/venv-anchors; `bash ../shared/bench/anchors/run_all.sh` makes it, ~6.5 GB).
    #[arg(long)]
    anchors: bool,
    /// Use an earlier anchor run's results (a TSV the anchors script wrote).
    #[arg(long, conflicts_with = "anchors")]
    anchors_results: Option<PathBuf>,
    /// Seconds per CPU-engine measurement.
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
    /// Also write the table as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

const PIPELINE: &str = "decode | random_resized_crop 224 | hflip 0.5";

/// The shared folder beside the repository (the corpus and the anchor scripts).
fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared")
}

/// The anchors' results: read, run, or none (with why).
fn anchors(args: &AllArgs) -> Result<(BTreeMap<String, f64>, String)> {
    if let Some(path) = &args.anchors_results {
        return Ok((
            sizing::read_anchor_results(path)?,
            path.display().to_string(),
        ));
    }
    if !args.anchors {
        return Ok((
            BTreeMap::new(),
            "not run (--anchors or --anchors-results FILE)".into(),
        ));
    }
    let venv =
        std::env::var_os("VENV").map_or_else(|| PathBuf::from("/tmp/venv-anchors"), PathBuf::from);
    let script = shared().join("bench/anchors/run_all.sh");
    if !venv.join("bin/python").exists() || !script.exists() {
        return Ok((
            BTreeMap::new(),
            format!(
                "not run: no venv at {} (bash {} makes it, ~6.5 GB)",
                venv.display(),
                script.display()
            ),
        ));
    }
    let results = std::env::temp_dir().join(format!("sluice-anchors-{}.tsv", std::process::id()));
    eprintln!("[bench] anchors: QUICK=1 bash {} …", script.display());
    let status = std::process::Command::new("bash")
        .arg(&script)
        .env("QUICK", "1")
        .env("RESULTS", &results)
        .env("VENV", &venv)
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !status.success() {
        anyhow::bail!("{} failed ({status})", script.display());
    }
    Ok((
        sizing::read_anchor_results(&results)?,
        results.display().to_string(),
    ))
}

pub fn run(args: AllArgs) -> Result<()> {
    crate::daemon::init_logs_at("warn");
    let _ = sluice_daemon::metrics_handle();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let (anchor, anchor_source) = anchors(&args)?;

    // The CPU engine alone, per core.
    let corpus = shared().join("data/imagenet-sample");
    let (samples, what) = sizing::bench_images(corpus.is_dir().then_some(corpus.as_path()))?;
    eprintln!("[bench] the CPU engine on {what}…");
    let spec: PipelineSpec = PIPELINE.parse()?;
    // The same JPEGs with restart markers (as `sluice shard` writes them), alternating.
    let mut marked = samples.clone();
    sizing::add_restart_markers(&mut marked)?;
    let (mut per_core, mut per_core_marked) = (BTreeMap::new(), BTreeMap::new());
    for threads in [1, cores.min(2)] {
        let config = EngineConfig {
            threads,
            ..EngineConfig::default()
        };
        for (images, into) in [(&samples, &mut per_core), (&marked, &mut per_core_marked)] {
            let run = sizing::engine_run(images, spec.clone(), config.clone(), args.seconds)?;
            into.insert(threads, run.images_per_s() / threads as f64);
        }
    }

    // One connection's transports.
    eprintln!("[bench] the transports…");
    let probe = TransportProbe {
        samples: 8192,
        side: 224,
        credits: 256,
        connections: 1,
        io_threads: 0,
    };
    let t = transport::compare(&probe, 3, 3, None)?;

    // What the client costs the host per sample on each, beside the floor (the worker in a
    // child process).
    eprintln!("[bench] the client's host cost…");
    let host = super::probe::measure(&probe, 3, 3, None)?;

    // The whole chain over each transport, beside the CPU tier alone on the same cores.
    eprintln!("[bench] the chain…");
    let temp = tempfile::tempdir()?;
    let (tiers, manifest, _) = sluice_testbed::cluster::generated_chain(1000, 2, temp.path())?;
    let manifest_path = temp.path().join("manifest.json");
    manifest.save(&manifest_path)?;
    let caps = sizing::measure(&sizing::Probe::chain(
        &manifest, PIPELINE, cores, 2, 2, 2.0,
    )?)?;
    let cpu_alone = caps
        .iter()
        .find(|c| c.tier == "cpu")
        .map_or(0.0, |c| c.samples_per_s);
    let mut base = ConsumerConfig::new(
        manifest_path.display().to_string(),
        tiers.workers.iter().map(|a| a.to_string()).collect(),
    );
    base.token = Some(tiers.token.clone());
    base.loader.trust_cert = Some(tiers.trust.clone());
    let mut chain = BTreeMap::new();
    for (name, cfg) in tiers.over_each_transport(&base) {
        let run = sizing::run_chain(&cfg, &manifest, &[], &Silent)?;
        if let Some(b) = run.broken().first() {
            anyhow::bail!("the exactly-once contract was broken ({name}): {b}");
        }
        chain.insert(name, run.samples_per_s());
    }
    drop(tiers);

    // The chain is also reported in samples/s: a faster engine raises the ratio's
    // denominator while everything else shares the same cores.
    let of_cpu = |name: &str| chain.get(name).map(|s| s / cpu_alone.max(1e-9));
    // The table: (figure, now, goal); None where a reference is missing.
    let vs = |ours: f64, anchor_name: &str| anchor.get(anchor_name).map(|a| ours / a);
    // The engine's three rows for one input: per core against DALI on 1 and n threads, and
    // against a bare full decode.
    let n = cores.min(2);
    let engine_rows = |what: &str, rates: &BTreeMap<usize, f64>| {
        [
            (
                format!("{what} / DALI CPU ROI decode, 1 thread"),
                vs(rates[&1], "dali_cpu_roi_decode_t1"),
                2.0,
            ),
            (
                format!("{what} / DALI CPU ROI decode, {n} threads"),
                vs(rates[&n] * n as f64, &format!("dali_cpu_roi_decode_t{n}")),
                2.0,
            ),
            (
                format!("{what} / bare libjpeg-turbo full decode, 1 thread"),
                vs(rates[&1], "simplejpeg_decode_full_w1"),
                1.2,
            ),
        ]
    };
    let mut rows: Vec<(String, Option<f64>, f64)> = Vec::new();
    rows.extend(engine_rows("bench cpu per core", &per_core));
    rows.extend(engine_rows(
        "the same JPEGs with restart markers",
        &per_core_marked,
    ));
    rows.extend([
        (
            "QUIC / TCP, one connection".into(),
            Some(t.quic / t.tcp),
            0.5,
        ),
        (
            "same-host / memcpy".into(),
            Some(t.same_host / t.memcpy),
            0.8,
        ),
        (
            "chain over QUIC / CPU tier alone".into(),
            of_cpu("quic"),
            0.9,
        ),
        (
            "chain over same-host / CPU tier alone".into(),
            of_cpu("same-host"),
            0.9,
        ),
    ]);
    // The client's CPU per sample against what its bytes need (goals: 90 µs over QUIC, 30
    // over same-host, against floors of about 55 and 20).
    for row in &host {
        let goal = match row.transport {
            "quic" => 0.6,
            _ => 0.67,
        };
        rows.push((
            format!("{} floor / client CPU per sample", row.transport),
            Some(row.floor / row.cost.micros_per_sample().max(1e-9)),
            goal,
        ));
    }
    println!("| figure | now | goal |");
    println!("|---|---|---|");
    for (figure, now, goal) in &rows {
        let now = now.map_or_else(|| "no reference".to_string(), |v| format!("{v:.2}"));
        println!("| {figure} | {now} | ≥ {goal} |");
    }
    println!(
        "\nreferences: CPU engine {:.0} images/s/core (1 thread; {:.0} with restart markers) on {what}; QUIC {:.2}, TCP {:.2}, same-host {:.2}, memcpy {:.2} GB/s; CPU tier alone {cpu_alone:.0} samples/s on {cores} cores, the chain {:.0} over QUIC and {:.0} over same-host; anchors: {anchor_source}",
        per_core[&1],
        per_core_marked[&1],
        t.quic / 1e9,
        t.tcp / 1e9,
        t.same_host / 1e9,
        t.memcpy / 1e9,
        chain.get("quic").copied().unwrap_or(0.0),
        chain.get("same-host").copied().unwrap_or(0.0),
    );
    for row in &host {
        println!(
            "host cost over {}: {:.1} µs of client CPU per sample, floor {:.1} ({})",
            row.transport,
            row.cost.micros_per_sample(),
            row.floor,
            row.floor_parts
        );
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "rows": rows.iter().map(|(f, n, g)| serde_json::json!({"figure": f, "now": n, "goal": g})).collect::<Vec<_>>(),
            "cpu_images_per_s_per_core": per_core,
            "cpu_images_per_s_per_core_restart_markers": per_core_marked,
            "transport_bytes_per_s": {"quic": t.quic, "same_host": t.same_host, "tcp": t.tcp, "memcpy": t.memcpy},
            "cpu_alone_samples_per_s": cpu_alone,
            "chain_samples_per_s": chain,
            "host_cost_us_per_sample": host.iter().map(|r| (r.transport, serde_json::json!({"client": r.cost.micros_per_sample(), "floor": r.floor}))).collect::<BTreeMap<_, _>>(),
            "anchors": anchor,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
