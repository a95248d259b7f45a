//! `sluice index`: reads shards (paths, `file://` or `http(s)://` URLs, brace patterns), writes
//! each shard's sample index (`.idx`) and a manifest of them all.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sluice_shard::{expand, scan_shard, Manifest, ReadOptions, SampleIndex};

use super::progress::Progress;

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

/// Where a shard comes from.
pub enum Location {
    File(PathBuf),
    Http(String),
}

impl Location {
    pub fn parse(s: &str) -> Location {
        if s.starts_with("http://") || s.starts_with("https://") {
            Location::Http(s.to_string())
        } else {
            Location::File(PathBuf::from(s.strip_prefix("file://").unwrap_or(s)))
        }
    }

    pub fn open(&self) -> Result<Box<dyn Read + Send>> {
        match self {
            Location::File(p) => {
                Ok(Box::new(std::fs::File::open(p).with_context(|| {
                    format!("opening shard {}", p.display())
                })?))
            }
            Location::Http(url) => {
                let resp = reqwest::blocking::Client::builder()
                    .timeout(None)
                    .build()?
                    .get(url)
                    .send()
                    .with_context(|| format!("fetching {url}"))?;
                if !resp.status().is_success() {
                    bail!("fetching {url}: HTTP {}", resp.status());
                }
                Ok(Box::new(resp))
            }
        }
    }

    pub fn display(&self) -> String {
        match self {
            Location::File(p) => p.display().to_string(),
            Location::Http(u) => u.clone(),
        }
    }
}

/// The URL a manifest at `manifest` uses for the local shard `shard`: relative when the shard
/// lies under the manifest's folder, absolute otherwise.
pub fn manifest_url(manifest: &Path, shard: &Path) -> Result<String> {
    let dir = manifest
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = std::fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
    let shard =
        std::fs::canonicalize(shard).with_context(|| format!("resolving {}", shard.display()))?;
    let url = match shard.strip_prefix(&dir) {
        Ok(rel) => rel.to_string_lossy().replace('\\', "/"),
        Err(_) => shard.to_string_lossy().into_owned(),
    };
    Ok(url)
}

pub fn run(args: Args) -> Result<()> {
    let mut names = Vec::new();
    for pattern in &args.shards {
        names.extend(expand(pattern)?);
    }
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
    let mut infos = Vec::with_capacity(names.len());
    for name in &names {
        let location = Location::parse(name);
        let raw = location.open()?;
        let (mut info, index) =
            scan_shard(raw, &location.display(), &ReadOptions::default(), |s| {
                progress.add(1, s.payload_bytes());
            })?;
        let index_path = match &location {
            Location::File(p) => {
                info.url = manifest_url(&args.output, p)?;
                SampleIndex::sidecar_path(p)
            }
            Location::Http(url) => {
                let file = url.rsplit('/').next().unwrap_or("shard");
                index_dir.join(format!("{file}.idx"))
            }
        };
        index
            .write_file(&index_path)
            .with_context(|| format!("writing {}", index_path.display()))?;
        infos.push(info);
    }
    progress.finish();
    let manifest = Manifest::new(infos);
    manifest.validate(&args.output.display().to_string())?;
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

/// A dataset for the client: a manifest (path or http(s) URL, ending in `.json`) or shards
/// (paths, URLs, brace patterns) described on the spot. Shard URLs come out absolute, so a
/// worker on another host can open them.
pub fn dataset(spec: &str) -> Result<Manifest> {
    const MAX_MANIFEST: u64 = 256 << 20;
    if spec.ends_with(".json") {
        let location = Location::parse(spec);
        let (mut manifest, origin) = match &location {
            Location::File(p) => {
                let m = Manifest::load(p, MAX_MANIFEST)?;
                let abs = std::fs::canonicalize(p)
                    .with_context(|| format!("resolving {}", p.display()))?;
                (m, abs.display().to_string())
            }
            Location::Http(url) => {
                let mut bytes = Vec::new();
                location
                    .open()?
                    .take(MAX_MANIFEST + 1)
                    .read_to_end(&mut bytes)
                    .with_context(|| format!("reading {url}"))?;
                if bytes.len() as u64 > MAX_MANIFEST {
                    bail!("manifest {url} is larger than {MAX_MANIFEST} bytes");
                }
                (Manifest::from_json(&bytes, url)?, url.clone())
            }
        };
        for s in &mut manifest.shards {
            s.url = sluice_shard::resolve_url(&origin, &s.url);
        }
        return Ok(manifest);
    }
    let mut infos = Vec::new();
    for name in expand(spec)? {
        let location = Location::parse(&name);
        let (mut info, _) = scan_shard(
            location.open()?,
            &location.display(),
            &ReadOptions::default(),
            |_| {},
        )?;
        info.url = match &location {
            Location::File(p) => std::fs::canonicalize(p)
                .with_context(|| format!("resolving {}", p.display()))?
                .display()
                .to_string(),
            Location::Http(u) => u.clone(),
        };
        infos.push(info);
    }
    let manifest = Manifest::new(infos);
    manifest.validate(spec)?;
    Ok(manifest)
}

/// How many `.tar` files `dir` holds.
pub fn shard_count(dir: &Path) -> Result<usize> {
    Ok(std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "tar"))
        .count())
}
