//! `sluice shard`: writes WebDataset shards (and their `.idx` sidecars; the work is
//! `sluice_dataset::write`) from
//! - an ImageFolder tree (one subfolder per class; `.cls` = the class's index in sorted
//!   class-name order; keys are `class/stem`),
//! - a flat folder plus a labels TSV (header row naming `file` and `class_index`), or
//! - a tar stream on stdin (`--input -`), whose samples are re-sharded as they are.
//!
//! Files sharing a stem become one sample (`a.jpg` + `a.json` → fields `jpg`, `json`); field
//! names are lower-cased and `jpeg` is written `jpg`, as WebDataset readers expect.
//!
//! Samples are written in a seeded random order (`--seed`), since datasets usually arrive
//! sorted by class and a shard of one class makes batches of one class: a folder is shuffled
//! whole, a tar stream through a bounded shuffle buffer (`--shuffle-buffer` samples held in
//! memory). The same input and seed give byte-identical shards; `--no-shuffle` keeps the
//! input order.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sluice_dataset::write::{self, Order};
use sluice_shard::WriterConfig;

use crate::progress::Progress;

#[derive(clap::Args)]
pub struct Args {
    /// Input: a folder, or `-` for a tar stream on stdin.
    #[arg(long)]
    input: String,
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
    let written = if args.input == "-" {
        if args.labels.is_some() {
            bail!("--labels applies to a folder input, not to a tar stream on stdin");
        }
        let mut progress = Progress::new(None, "shard");
        let w = write::write_stdin(config, order, &mut progress).context("--output")?;
        progress.finish();
        (w, progress.elapsed())
    } else {
        let mut progress = Progress::new(None, "shard");
        let w = write::write_folder(
            Path::new(&args.input),
            args.labels.as_deref(),
            config,
            order,
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
    if let Some(path) = &args.manifest {
        write::write_manifest(&written.shards, path)
            .with_context(|| format!("writing manifest {}", path.display()))?;
        println!("manifest: {}", path.display());
    }
    Ok(())
}
