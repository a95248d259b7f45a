//! `sluice inspect`: lists a shard's samples and validates it end to end (every header,
//! every size, and the sidecar index when there is one); exits non-zero on a broken shard.
//! Clips listed (`mjpeg`/`mjpg` fields) get their frame counts after the listing, or the
//! reason their frame stream is broken.

use std::io::Write;

use anyhow::{bail, Context, Result};
use sluice_shard::{escaped_key, scan_shard, ReadOptions, SampleIndex};

use sluice_dataset::locate::Location;

#[derive(clap::Args)]
pub struct Args {
    /// A shard: path, file:// or http(s):// URL.
    shard: String,
    /// List at most this many samples (the whole shard is still validated).
    #[arg(long)]
    limit: Option<u64>,
    /// Print only the summary.
    #[arg(long, short)]
    quiet: bool,
}

pub fn run(args: Args) -> Result<()> {
    let location = Location::parse(&args.shard);
    let raw = location.open()?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let limit = if args.quiet {
        0
    } else {
        args.limit.unwrap_or(u64::MAX)
    };
    let mut listed = 0u64;
    let mut clips = 0u64;
    let mut write_err = None;
    if limit > 0 {
        write_err = writeln!(out, "index\tkey\tfields (name: size)").err();
    }
    let scanned = scan_shard(raw, &location.display(), &ReadOptions::default(), |s| {
        if listed < limit && write_err.is_none() {
            let fields: Vec<String> = s
                .fields
                .iter()
                .map(|(name, size)| format!("{}: {size} B", escaped_key(name)))
                .collect();
            let line = format!(
                "{}\t{}\t{}",
                s.index,
                escaped_key(&s.key),
                fields.join(", ")
            );
            if let Err(e) = writeln!(out, "{line}") {
                write_err = Some(e);
            }
            listed += 1;
            clips += u64::from(s.fields.iter().any(|(n, _)| is_clip(n)));
        }
    });
    // A reader that stopped early (`| head`) is not an error; the shard is still validated.
    let piped = |e: &std::io::Error| e.kind() == std::io::ErrorKind::BrokenPipe;
    if let Some(e) = write_err.filter(|e| !piped(e)) {
        return Err(e.into());
    }
    let (info, index) = scanned.with_context(|| format!("{} is broken", location.display()))?;
    if let Location::File(path) = &location {
        let sidecar = SampleIndex::sidecar_path(path);
        if sidecar.exists() {
            let stored = SampleIndex::read_file(&sidecar, 1 << 32)?;
            if stored != index {
                bail!(
                    "{} does not match the shard (stale index, or the shard changed): rerun `sluice index`",
                    sidecar.display()
                );
            }
        }
    }
    if clips > 0 {
        list_frames(&location, listed, &mut out)?;
    }
    let summary = writeln!(
        out,
        "{}: ok, {} samples, {} bytes, {}{}",
        location.display(),
        info.samples,
        info.size,
        info.checksum,
        if info.compression == sluice_shard::Compression::Gzip {
            ", gzip"
        } else {
            ""
        }
    )
    .and_then(|()| out.flush());
    match summary {
        Err(e) if !piped(&e) => Err(e.into()),
        _ => Ok(()),
    }
}

fn is_clip(field: &str) -> bool {
    matches!(field, "mjpeg" | "mjpg")
}

/// The frame count of each clip among the first `listed` samples (a second read of the
/// shard, which the scan has validated).
fn list_frames(location: &Location, listed: u64, out: &mut impl Write) -> Result<()> {
    let reader = sluice_shard::SampleReader::new(
        location.open()?,
        location.display(),
        &ReadOptions::default(),
    );
    writeln!(out, "index\tkey\tclip frames")?;
    let max = sluice_cpu::jpeg::DecodeLimits::default().max_clip_frames;
    for sample in reader.take(listed as usize) {
        let sample = sample.with_context(|| format!("{} is broken", location.display()))?;
        for f in sample.fields.iter().filter(|f| is_clip(&f.name)) {
            let frames = match sluice_cpu::clip::frames(&f.data, max) {
                Ok(frames) => format!("{}: {} frames", f.name, frames.len()),
                Err(e) => format!("{}: {e}", f.name),
            };
            writeln!(
                out,
                "{}\t{}\t{frames}",
                sample.index,
                escaped_key(&sample.key)
            )?;
        }
    }
    Ok(())
}
