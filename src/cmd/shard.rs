//! `sluice shard`: writes WebDataset shards (and their `.idx` sidecars; the work is
//! `sluice_dataset::write`) from
//! - an ImageFolder tree (one subfolder per class; `.cls` = the class's index in sorted
//!   class-name order; keys are `class/stem`),
//! - a flat folder plus a labels TSV (header row naming `file` and `class_index`), or
//! - a tar stream on stdin (`--input -`), whose samples are re-sharded as they are, or
//! - a folder of clips (`--clips DIR`): each clip a folder of JPEG frames, sorted by name,
//!   written as one sample's `.mjpeg` (the frames back to back), in class folders or with
//!   `--labels` as for images.
//!
//! Files sharing a stem become one sample (`a.jpg` + `a.json` → fields `jpg`, `json`); field
//! names are lower-cased and `jpeg` is written `jpg`, as WebDataset readers expect.
//!
//! Samples are written in a seeded random order (`--seed`), since datasets usually arrive
//! sorted by class and a shard of one class makes batches of one class: a folder is shuffled
//! whole, a tar stream through a bounded shuffle buffer (`--shuffle-buffer` samples held in
//! memory). The same input and seed give byte-identical shards; `--no-shuffle` keeps the
//! input order.
//!
//! Each JPEG gets a restart marker at every MCU (up to 32 a row), losslessly (the same
//! coefficients and pixels, about 3% more bytes): the CPU tier can then decode only the intervals a crop
//! window touches instead of Huffman-decoding every row above it and the columns beside it
//! (`sluice_cpu::restart`), which is what lets it outrun a decoder that reads the whole image. A JPEG that cannot be transformed is
//! written as it is and named; `--no-restart-markers` keeps every JPEG's bytes. The transform
//! runs on every core (about 300 ImageNet JPEGs/s each); the shards are the same bytes
//! whatever the core count.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};
use sluice_dataset::write::{self, Order};
use sluice_shard::WriterConfig;

use crate::progress::Progress;

#[derive(clap::Args)]
pub struct Args {
    /// Input: a folder, or `-` for a tar stream on stdin.
    #[arg(long, required_unless_present = "clips", conflicts_with = "clips")]
    input: Option<String>,
    /// Input: a folder of clips, each a folder of JPEG frames (in class folders, or listed
    /// in `--labels`), written as one sample's `.mjpeg` each.
    #[arg(long, value_name = "DIR")]
    clips: Option<PathBuf>,
    /// Output pattern with a shard number, e.g. 'out/train-%06d.tar'.
    #[arg(long)]
    output: String,
    /// Samples per shard at most.
    #[arg(long)]
    max_count: Option<u64>,
    /// Bytes per shard at most (a larger single sample gets a shard of its own).
    #[arg(long)]
    max_size: Option<u64>,
    /// Labels for a flat folder: a TSV with a header row naming `file` and `class_index`.
    #[arg(long)]
    labels: Option<PathBuf>,
    /// Also write a manifest of the new shards here.
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Seed of the sample order (the same input and seed give byte-identical shards).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep the input order (sorted keys for a folder, stream order for stdin).
    #[arg(long)]
    no_shuffle: bool,
    /// With `--input -`: samples held in memory to shuffle the stream (memory: this many
    /// whole samples, e.g. about 1.1 GB for 10,000 ImageNet JPEGs).
    #[arg(long, default_value_t = 10_000)]
    shuffle_buffer: usize,
    /// Keep every JPEG's bytes as they are. By default each gets a restart marker at every
    /// MCU, up to 32 a row (lossless: the same pixels; about 3% more bytes), so workers decode
    /// only the part a random crop needs (about 27% more images/s per core on ImageNet).
    #[arg(long)]
    no_restart_markers: bool,
    /// The default since restart markers became it; kept for scripts that pass it.
    #[arg(long, hide = true, conflicts_with = "no_restart_markers")]
    restart_markers: bool,
}

pub fn run(args: Args) -> Result<()> {
    let config = WriterConfig {
        max_count: args.max_count,
        max_bytes: args.max_size,
        ..WriterConfig::new(args.output.clone())
    };
    if args.max_count == Some(0) || args.max_size == Some(0) {
        bail!("--max-count and --max-size must be at least 1");
    }
    let order = Order {
        shuffle: !args.no_shuffle,
        seed: args.seed,
        stream_buffer: args.shuffle_buffer,
    };
    let (marked, kept) = (AtomicU64::new(0), AtomicU64::new(0));
    let add_markers = |key: &str, field: &str, data: &[u8]| -> Option<Vec<u8>> {
        if !matches!(field, "jpg" | "jpeg") {
            return None;
        }
        match sluice_cpu::jpeg::with_restart_markers(data, Default::default()) {
            Ok(Some(new)) => {
                marked.fetch_add(1, Ordering::Relaxed);
                Some(new)
            }
            Ok(None) => None,
            Err(e) => {
                kept.fetch_add(1, Ordering::Relaxed);
                eprintln!("note: sample {key:?}: {field} kept as it is (no restart markers): {e}");
                None
            }
        }
    };
    let markers = !args.no_restart_markers;
    let rewrite: Option<write::Rewrite> = markers.then_some(&add_markers);
    let written = if let Some(dir) = &args.clips {
        let mut progress = Progress::new(None, "shard");
        let labels = args.labels.as_deref();
        let folder = (write::Folder::Clips, labels);
        let w = write::write_folder(dir, folder, config, order, rewrite, &mut progress)?;
        progress.finish();
        (w, progress.elapsed())
    } else if args.input.as_deref() == Some("-") {
        if args.labels.is_some() {
            bail!("--labels applies to a folder input, not to a tar stream on stdin");
        }
        let mut progress = Progress::new(None, "shard");
        let w = write::write_stdin(config, order, rewrite, &mut progress).context("--output")?;
        progress.finish();
        (w, progress.elapsed())
    } else {
        let mut progress = Progress::new(None, "shard");
        let w = write::write_folder(
            Path::new(args.input.as_deref().unwrap_or_default()),
            (write::Folder::Images, args.labels.as_deref()),
            config,
            order,
            rewrite,
            &mut progress,
        )?;
        progress.finish();
        (w, progress.elapsed())
    };
    let (written, secs) = written;
    println!(
        "wrote {} shards, {} samples, {:.1} MB in {secs:.1}s ({:.0} samples/s, {:.1} MB/s), pattern {}",
        written.shards.len(),
        written.samples,
        written.bytes as f64 / 1e6,
        written.samples as f64 / secs.max(1e-9),
        written.bytes as f64 / secs.max(1e-9) / 1e6,
        args.output
    );
    if markers {
        println!(
            "restart markers: {} JPEGs given them, {} kept as they were (unreadable; named above)",
            marked.load(Ordering::Relaxed),
            kept.load(Ordering::Relaxed)
        );
    }
    if let Some(path) = &args.manifest {
        write::write_manifest(&written.shards, path)
            .with_context(|| format!("writing manifest {}", path.display()))?;
        println!("manifest: {}", path.display());
    }
    Ok(())
}
