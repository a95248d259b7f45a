//! `sluice bench`: measurements of each tier, printed as ratios a person can compare with the
//! anchors in `../shared/bench/anchors` (run on the same machine, in the same session).
//!
//! `sluice bench cpu`: decode + augment throughput of the CPU engine on real JPEGs (the
//! `../shared/data/imagenet-sample` corpus by default, else generated images), per thread
//! count, with the split between decoding and the rest.

mod chain;
mod transport;
mod upload;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use sluice_cpu::{Engine, EngineConfig, Outcome, PipelineSpec, SampleContext};
use sluice_shard::{Field, Sample};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// CPU engine throughput (images/s per thread count).
    Cpu(CpuArgs),
    /// QUIC tensor throughput on loopback beside a plain TCP stream of the same frames.
    Transport(transport::TransportArgs),
    /// Every tier alone and the whole chain, the bottleneck, a JSON result and an SVG timeline.
    Chain(chain::ChainArgs),
    /// Host-to-device GB/s from the page-locked ring beside a plain pinned copy (needs a GPU
    /// and the `cuda` feature).
    Upload(upload::UploadArgs),
}

#[derive(clap::Args)]
pub struct CpuArgs {
    /// Folder of JPEGs (searched recursively). Default: ../shared/data/imagenet-sample when
    /// present, else 300 generated images.
    #[arg(long)]
    images: Option<PathBuf>,
    /// Thread counts to measure, comma-separated.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Seconds to measure each thread count (after one warm-up pass).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// The pipeline.
    #[arg(long, default_value = "decode | random_resized_crop 224 | hflip 0.5")]
    pipeline: String,
    /// Decode at full size (no DCT scaling).
    #[arg(long)]
    no_dct: bool,
    /// Decode the whole image, not only the crop window.
    #[arg(long)]
    no_roi: bool,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    match args.what {
        What::Cpu(a) => cpu(a),
        What::Transport(a) => transport::run(a),
        What::Chain(a) => chain::run(a),
        What::Upload(a) => upload::run(a),
    }
}

fn load_images(dir: Option<&Path>) -> Result<(Vec<Sample>, String)> {
    let default = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/imagenet-sample");
    let dir = match dir {
        Some(d) => Some(d.to_path_buf()),
        None => default.is_dir().then_some(default),
    };
    let Some(dir) = dir else {
        let samples = (0..300u32)
            .map(|i| {
                let (w, h, px) = sluice_dataset::synth::render(u64::from(i) * 7919, i % 10, 10);
                let jpeg = sluice_dataset::synth::encode_jpeg(w, h, &px, 90)?;
                Ok(sample(i as u64, jpeg))
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok((samples, "300 generated JPEGs".into()));
    };
    let mut files = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| {
                matches!(x.to_string_lossy().to_lowercase().as_str(), "jpg" | "jpeg")
            }) {
                files.push(p);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        bail!("no JPEGs under {}", dir.display());
    }
    let samples = files
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Ok(sample(
                i as u64,
                std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((
        samples,
        format!("{} JPEGs from {}", files.len(), dir.display()),
    ))
}

fn sample(index: u64, jpeg: Vec<u8>) -> Sample {
    Sample {
        shard: "bench".into(),
        key: format!("{index:06}"),
        index,
        start: 0,
        end: 0,
        fields: vec![Field {
            name: "jpg".into(),
            data: jpeg,
        }],
    }
}

fn cpu(args: CpuArgs) -> Result<()> {
    let spec: PipelineSpec = args.pipeline.parse()?;
    let (samples, what) = load_images(args.images.as_deref())?;
    println!(
        "sluice bench cpu: {what}; pipeline: {spec}; dct_scaling={} roi_decode={}",
        !args.no_dct, !args.no_roi
    );
    let mut results = Vec::new();
    for &threads in &args.threads {
        let config = EngineConfig {
            threads,
            dct_scaling: !args.no_dct,
            roi_decode: !args.no_roi,
            ..EngineConfig::default()
        };
        let engine = Engine::new(spec.clone(), config)?;
        // Each pass is a new epoch, so every pass draws new crops.
        let ctx = |epoch| SampleContext {
            seed: 0,
            epoch,
            shard: 0,
        };
        let mut epoch = 0;
        let skipped: Vec<_> = engine
            .process_all(&samples, &ctx(epoch))
            .into_iter()
            .filter_map(|o| match o {
                Outcome::Skipped(e) => Some(e),
                Outcome::Done(_) => None,
            })
            .collect();
        if let Some(first) = skipped.first() {
            eprintln!(
                "note: {} images were skipped as undecodable, e.g. {first}",
                skipped.len()
            );
        }
        let t0 = engine.times();
        let (d0, x0) = (
            t0.decode_ns.load(Ordering::Relaxed),
            t0.transform_ns.load(Ordering::Relaxed),
        );
        let started = Instant::now();
        let mut images = 0u64;
        while started.elapsed().as_secs_f64() < args.seconds {
            epoch += 1;
            images += engine.process_all(&samples, &ctx(epoch)).len() as u64;
        }
        let secs = started.elapsed().as_secs_f64();
        let t = engine.times();
        let decode = (t.decode_ns.load(Ordering::Relaxed) - d0) as f64;
        let transform = (t.transform_ns.load(Ordering::Relaxed) - x0) as f64;
        let rate = images as f64 / secs;
        let decode_share = decode / (decode + transform).max(1.0);
        println!(
            "cpu\tthreads={threads}\t{rate:.0} images/s\t{:.0} images/s/thread\tdecode {:.0}% / resize+flip {:.0}%\t{:.3} ms/image/thread",
            rate / threads as f64,
            decode_share * 100.0,
            (1.0 - decode_share) * 100.0,
            threads as f64 * 1000.0 / rate
        );
        results.push(serde_json::json!({
            "threads": threads, "images_per_s": rate, "images": images, "seconds": secs,
            "decode_share": decode_share,
        }));
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({"bench": "cpu", "corpus": what, "pipeline": spec.to_string(), "results": results});
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
