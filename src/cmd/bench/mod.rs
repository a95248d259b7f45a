//! `sluice bench`: measurements of each tier, printed as ratios a person can compare with the
//! anchors in `../shared/bench/anchors` (run on the same machine, in the same session).
//!
//! `sluice bench cpu`: decode + augment throughput of the CPU engine on real JPEGs (the
//! `../shared/data/imagenet-sample` corpus by default, else generated images), per thread
//! count, with the split between decoding and the rest (`sluice_testbed::sizing::engine_run`).

mod all;
mod chain;
mod host_cost;
mod probe;
mod transport;
mod upload;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sluice_cpu::{EngineConfig, PipelineSpec};
use sluice_testbed::sizing;

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
    /// Client CPU µs per delivered sample on each transport, beside the floor its bytes need.
    HostCost(host_cost::HostCostArgs),
    /// Every tier alone and the whole chain, the bottleneck, a JSON result and an SVG timeline.
    Chain(chain::ChainArgs),
    /// Host-to-device GB/s from the page-locked ring beside a plain pinned copy (needs a GPU
    /// and the `cuda` feature).
    Upload(upload::UploadArgs),
    /// The performance table in one run: engine per core vs the anchors, QUIC vs TCP,
    /// same-host vs memcpy, the client's host cost vs its floor, the chain vs the CPU tier
    /// alone.
    All(all::AllArgs),
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
    /// The JPEGs as they are. By default each gets restart markers first, as `sluice shard`
    /// writes them (the pixels do not change; the decoder can then start at the crop
    /// window's rows).
    #[arg(long)]
    no_restart_markers: bool,
    /// Clips: make clips of this many frames from the images (a window moving across each)
    /// and run a clip pipeline on them (`--pipeline` must take `clip N`), beside, in the same
    /// run, the same clips decoding all their frames and the frames as images of their own.
    #[arg(long, default_value_t = 0)]
    clip_frames: u32,
    /// With pixel ops in the pipeline: also measure each one alone after the geometry, and
    /// print what each adds per image beside the geometry without them.
    #[arg(long)]
    per_op: bool,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

impl CpuArgs {
    fn engine(&self, threads: usize) -> EngineConfig {
        EngineConfig {
            threads,
            dct_scaling: !self.no_dct,
            roi_decode: !self.no_roi,
            ..EngineConfig::default()
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    match args.what {
        What::Cpu(a) => cpu(a),
        What::Transport(a) => transport::run(a),
        What::Chain(a) => chain::run(a),
        What::HostCost(a) => host_cost::run(a),
        What::Upload(a) => upload::run(a),
        What::All(a) => all::run(a),
    }
}

fn cpu(args: CpuArgs) -> Result<()> {
    let spec: PipelineSpec = args.pipeline.parse()?;
    let default = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/imagenet-sample");
    let dir = args.images.clone().or(default.is_dir().then_some(default));
    let (mut samples, what) = sizing::bench_images(dir.as_deref())?;
    if args.clip_frames > 0 || spec.clip.is_some() {
        return clips(&args, spec, &samples, &what);
    }
    let restart_markers = !args.no_restart_markers;
    // The JPEGs as they came, for the entropy floor without markers beside the one with.
    let unmarked = restart_markers.then(|| samples.clone());
    if restart_markers {
        let (before, after) = sizing::add_restart_markers(&mut samples)?;
        println!(
            "restart markers: {before} → {after} bytes ({:+.1}%)",
            (after as f64 / before.max(1) as f64 - 1.0) * 100.0
        );
    }
    println!(
        "sluice bench cpu: {what}; pipeline: {spec}; dct_scaling={} roi_decode={} restart_markers={}",
        !args.no_dct, !args.no_roi, restart_markers
    );
    let mut results = Vec::new();
    for &threads in &args.threads {
        let config = args.engine(threads);
        let run = sizing::engine_run(&samples, spec.clone(), config, args.seconds)?;
        // CPU, not wall time: what an image costs whatever else shares the cores.
        let cpu_ms = run.cpu_secs * 1e3 / run.images.max(1) as f64;
        if let Some(first) = run.skipped.first() {
            eprintln!(
                "note: {} images were skipped as undecodable, e.g. {first}",
                run.skipped.len()
            );
        }
        let rate = run.images_per_s();
        println!(
            "cpu\tthreads={threads}\t{rate:.0} images/s\t{:.0} images/s/thread\tdecode {:.0}% / resize+flip {:.0}%\t{:.3} ms/image/thread\t{cpu_ms:.3} CPU-ms/image",
            rate / threads as f64,
            run.decode_share * 100.0,
            (1.0 - run.decode_share) * 100.0,
            threads as f64 * 1000.0 / rate
        );
        // The floor on the same images and threads: entropy decoding alone.
        let floor = sizing::entropy_rate(&samples, threads, args.seconds, true)?;
        println!(
            "floor\tthreads={threads}\t{floor:.0} images/s\tentropy decoding alone (libjpeg-turbo reading the coefficients: no IDCT, no resize)\tthe engine runs at {:.2} of it",
            rate / floor.max(1e-9)
        );
        let mut result = serde_json::json!({
            "threads": threads, "images_per_s": rate, "images": run.images,
            "seconds": run.seconds, "decode_share": run.decode_share, "cpu_ms_per_image": cpu_ms,
            "entropy_decode_images_per_s": floor, "of_floor": rate / floor.max(1e-9),
        });
        if let Some(unmarked) = &unmarked {
            result["entropy_markers"] = marker_floors(unmarked, &samples, threads, &args, floor)?;
        }
        if let Some(plain) = without_pixel_ops(&spec) {
            let config = args.engine(threads);
            let base = sizing::engine_run(&samples, plain.clone(), config, args.seconds)?;
            let base_rate = base.images_per_s();
            println!(
                "plain\tthreads={threads}\t{base_rate:.0} images/s\t{plain}\tthe recipe runs at {:.2} of it ({:+.3} ms/image/thread)",
                rate / base_rate.max(1e-9),
                threads as f64 * 1000.0 * (1.0 / rate.max(1e-9) - 1.0 / base_rate.max(1e-9))
            );
            result["plain_images_per_s"] = base_rate.into();
            result["of_plain"] = (rate / base_rate.max(1e-9)).into();
            if args.per_op {
                let mut ops = serde_json::Map::new();
                for (name, one) in each_pixel_op(&spec, &plain) {
                    let config = args.engine(threads);
                    let r = sizing::engine_run(&samples, one, config, args.seconds)?.images_per_s();
                    let added =
                        threads as f64 * 1000.0 * (1.0 / r.max(1e-9) - 1.0 / base_rate.max(1e-9));
                    println!("op\tthreads={threads}\t{r:.0} images/s\t{added:+.3} ms/image/thread\t{name}");
                    ops.insert(
                        name.to_string(),
                        serde_json::json!({"images_per_s": r, "added_ms": added}),
                    );
                }
                result["per_op"] = ops.into();
            }
        }
        results.push(result);
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({"bench": "cpu", "corpus": what, "pipeline": spec.to_string(), "results": results});
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// What restart markers cost the entropy floor: the marked JPEGs' `floor` (read with the
/// vendored decoder's fast Huffman path across intervals) beside the same JPEGs without
/// markers and the marked ones as upstream libjpeg-turbo reads them (its slow path
/// throughout), measured one after the other on the same threads.
fn marker_floors(
    unmarked: &[sluice_shard::Sample],
    marked: &[sluice_shard::Sample],
    threads: usize,
    args: &CpuArgs,
    floor: f64,
) -> Result<serde_json::Value> {
    let plain = sizing::entropy_rate(unmarked, threads, args.seconds, true)?;
    let upstream = sizing::entropy_rate(marked, threads, args.seconds, false)?;
    println!(
        "markers\tthreads={threads}\tentropy floor with markers {floor:.0}, without {plain:.0}, with markers as upstream reads them {upstream:.0} images/s\tmarked at {:.3} of unmarked (upstream {:.3})",
        floor / plain.max(1e-9),
        upstream / plain.max(1e-9)
    );
    Ok(serde_json::json!({
        "marked_images_per_s": floor, "unmarked_images_per_s": plain,
        "marked_upstream_images_per_s": upstream, "marked_of_unmarked": floor / plain.max(1e-9),
        "upstream_marked_of_unmarked": upstream / plain.max(1e-9),
    }))
}

/// `spec` without its pixel ops (a late `hflip` back in the geometry), when it has any.
fn without_pixel_ops(spec: &PipelineSpec) -> Option<PipelineSpec> {
    (!spec.pixels.is_empty() || spec.erasing.is_some()).then(|| PipelineSpec {
        pixels: Vec::new(),
        flip_after: None,
        erasing: None,
        ..spec.clone()
    })
}

/// `plain` with each of `spec`'s pixel ops alone (a late `hflip` is geometry here), named.
fn each_pixel_op(spec: &PipelineSpec, plain: &PipelineSpec) -> Vec<(String, PipelineSpec)> {
    let mut out: Vec<(String, PipelineSpec)> = spec
        .pixels
        .iter()
        .map(|op| {
            let one = PipelineSpec {
                pixels: vec![*op],
                ..plain.clone()
            };
            (op.to_string(), one)
        })
        .collect();
    if let Some(e) = spec.erasing {
        let one = PipelineSpec {
            erasing: Some(e),
            ..plain.clone()
        };
        out.push((format!("{e} (after normalize)"), one));
    }
    out
}

/// `bench cpu` on clips: frames/s per core of the clip pipeline, and in the same run the same
/// clips with every frame decoded (the saving of decoding only the window's frames, as a
/// ratio) and the frames as images of their own (a frame's cost beside an image's).
fn clips(
    args: &CpuArgs,
    spec: PipelineSpec,
    images: &[sluice_shard::Sample],
    what: &str,
) -> Result<()> {
    let Some(clip) = spec.clip else {
        anyhow::bail!("--clip-frames needs a clip pipeline, e.g. \"decode | clip 8 stride=2 | random_resized_crop 112 | hflip 0.5\"");
    };
    let frames = match args.clip_frames {
        0 => 32,
        n => n,
    };
    let (clips, singles) = sluice_testbed::sizing::bench_clips(images, 40, frames)?;
    let all = PipelineSpec {
        clip: Some(sluice_wire::spec::Clip {
            frames,
            stride: 1,
            ..clip
        }),
        ..spec.clone()
    };
    let image = PipelineSpec {
        clip: None,
        field: None,
        ..spec.clone()
    };
    println!(
        "sluice bench cpu, clips: {} clips of {frames} frames from {what}; pipeline: {spec}",
        clips.len()
    );
    let mut results = Vec::new();
    for &threads in &args.threads {
        let config = args.engine(threads);
        let window = sizing::engine_run(&clips, spec.clone(), config.clone(), args.seconds)?;
        let every = sizing::engine_run(&clips, all.clone(), config.clone(), args.seconds)?;
        let single = sizing::engine_run(&singles, image.clone(), config, args.seconds)?;
        let per_core = |frames_per_s: f64| frames_per_s / threads as f64;
        let taken = window.images_per_s() * f64::from(clip.frames);
        let decoded_all = every.images_per_s() * f64::from(frames);
        let single_rate = single.images_per_s();
        println!(
            "clips\tthreads={threads}\t{:.1} clips/s\t{:.0} frames/s/core ({} of {frames} frames each)\tall {frames} frames: {:.1} clips/s, {:.0} frames/s/core\tonly the window: {:.2}x the clips/s",
            window.images_per_s(),
            per_core(taken),
            clip.frames,
            every.images_per_s(),
            per_core(decoded_all),
            window.images_per_s() / every.images_per_s().max(1e-9)
        );
        println!(
            "frames\tthreads={threads}\tthe same frames as images: {:.0} images/s/core\ta clip's frame runs at {:.2} of an image's rate",
            per_core(single_rate),
            taken / single_rate.max(1e-9)
        );
        results.push(serde_json::json!({
            "threads": threads, "clips_per_s": window.images_per_s(),
            "frames_per_s": taken, "all_frames_clips_per_s": every.images_per_s(),
            "all_frames_per_s": decoded_all, "images_per_s": single_rate,
        }));
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({"bench": "cpu-clips", "corpus": what, "frames": frames, "pipeline": spec.to_string(), "results": results});
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
