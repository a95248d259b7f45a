//! `sluice index`: reads shards (paths, `file://` or `http(s)://` URLs, brace patterns), writes
//! each shard's sample index (`.idx`) and a manifest of them all.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::progress::Progress;

#[derive(clap::Args)]
pub struct Args {
    /// Shards: paths, file:// or http(s):// URLs, with brace patterns ('train-{000..099}.tar').
    #[arg(required = true)]
    shards: Vec<String>,
    /// Where to write the manifest.
    #[arg(long, short)]
    output: PathBuf,
    /// Where to write the .idx of shards fetched over HTTP (default: beside the manifest).
    #[arg(long)]
    index_dir: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    if let Some(dir) = args.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let index_dir = args.index_dir.clone().unwrap_or_else(|| {
        args.output
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    });
    let mut progress = Progress::new(None, "index");
    let manifest = sluice_dataset::locate::index_shards(
        &args.shards,
        &args.output,
        &index_dir,
        &mut progress,
    )?;
    progress.finish();
    manifest.save(&args.output)?;
    println!(
        "indexed {} shards, {} samples, {:.1} MB in {:.1}s; manifest {}",
        manifest.shards.len(),
        manifest.total_samples(),
        manifest.total_bytes() as f64 / 1e6,
        progress.elapsed(),
        args.output.display()
    );
    Ok(())
}
