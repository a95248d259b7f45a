//! Where shards come from: paths, `file://` and `http(s)://` URLs and brace patterns, indexed
//! into a manifest (`sluice index`), or a manifest loaded for a client with its shard URLs made
//! absolute so that a worker on another host can open them.

use std::io::Read;
use std::path::{Path, PathBuf};

use sluice_shard::{expand, scan_shard, Manifest, ReadOptions, SampleIndex};

use crate::error::{DatasetError, Result};
use crate::Progress;

/// The largest manifest [`dataset`] loads.
const MAX_MANIFEST: u64 = 256 << 20;

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

    /// The shard's bytes, streamed.
    pub fn open(&self) -> Result<Box<dyn Read + Send>> {
        match self {
            Location::File(p) => Ok(Box::new(
                std::fs::File::open(p).map_err(DatasetError::io("opening shard", p))?,
            )),
            Location::Http(url) => {
                let http = |e: reqwest::Error| DatasetError::Http {
                    url: url.clone(),
                    detail: e.to_string(),
                };
                let resp = reqwest::blocking::Client::builder()
                    .timeout(None)
                    .build()
                    .map_err(http)?
                    .get(url)
                    .send()
                    .map_err(http)?;
                if !resp.status().is_success() {
                    return Err(DatasetError::Http {
                        url: url.clone(),
                        detail: format!("HTTP {}", resp.status()),
                    });
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
    let dir = std::fs::canonicalize(dir).map_err(DatasetError::io("resolving", dir))?;
    let shard = std::fs::canonicalize(shard).map_err(DatasetError::io("resolving", shard))?;
    let url = match shard.strip_prefix(&dir) {
        Ok(rel) => rel.to_string_lossy().replace('\\', "/"),
        Err(_) => shard.to_string_lossy().into_owned(),
    };
    Ok(url)
}

/// Reads every shard `patterns` name, writes each one's `.idx` (beside a local shard; in
/// `index_dir` for one fetched over HTTP) and returns their manifest, with URLs relative to
/// `manifest_path` where they can be. The manifest is validated, not saved.
pub fn index_shards(
    patterns: &[String],
    manifest_path: &Path,
    index_dir: &Path,
    progress: &mut dyn Progress,
) -> Result<Manifest> {
    let mut names = Vec::new();
    for pattern in patterns {
        names.extend(expand(pattern)?);
    }
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
                info.url = manifest_url(manifest_path, p)?;
                SampleIndex::sidecar_path(p)
            }
            Location::Http(url) => {
                let file = url.rsplit('/').next().unwrap_or("shard");
                index_dir.join(format!("{file}.idx"))
            }
        };
        index.write_file(&index_path)?;
        infos.push(info);
    }
    let manifest = Manifest::new(infos);
    manifest.validate(&manifest_path.display().to_string())?;
    Ok(manifest)
}

/// Refuses, by name, a local dataset path that is not a regular file: a device (`/dev/zero`
/// would be read for ever), a FIFO (whose open blocks until a writer comes) or a socket is
/// no manifest, shard or mixture file. `what` says which was expected.
pub fn regular_file(path: &Path, what: &str) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(DatasetError::io("reading", path))?;
    if meta.is_file() {
        return Ok(());
    }
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let kind = if t.is_dir() {
        "a directory"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(DatasetError::Input(format!(
        "{}: is {kind}, not {what}",
        path.display()
    )))
}

/// A dataset for the client: a manifest (path or http(s) URL, ending in `.json`) or shards
/// (paths, URLs, brace patterns) described on the spot. Shard URLs come out absolute, so a
/// worker on another host can open them.
pub fn dataset(spec: &str) -> Result<Manifest> {
    if spec.ends_with(".json") {
        let location = Location::parse(spec);
        let (mut manifest, origin) = match &location {
            Location::File(p) => {
                regular_file(p, "a manifest file")?;
                let m = Manifest::load(p, MAX_MANIFEST)?;
                let abs = std::fs::canonicalize(p).map_err(DatasetError::io("resolving", p))?;
                (m, abs.display().to_string())
            }
            Location::Http(url) => {
                let mut bytes = Vec::new();
                location
                    .open()?
                    .take(MAX_MANIFEST + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|e| DatasetError::Http {
                        url: url.clone(),
                        detail: e.to_string(),
                    })?;
                if bytes.len() as u64 > MAX_MANIFEST {
                    return Err(DatasetError::Http {
                        url: url.clone(),
                        detail: format!("the manifest is larger than {MAX_MANIFEST} bytes"),
                    });
                }
                (Manifest::from_json(&bytes, url)?, url.clone())
            }
        };
        for s in &mut manifest.shards {
            s.url = sluice_shard::resolve_url(&origin, &s.url);
            for r in &mut s.replicas {
                *r = sluice_shard::resolve_url(&origin, r);
            }
        }
        return Ok(manifest);
    }
    let mut infos = Vec::new();
    for name in expand(spec)? {
        let location = Location::parse(&name);
        if let Location::File(p) = &location {
            regular_file(p, "a tar shard")?;
        }
        if let Some(mut info) = from_sidecar(&location)? {
            info.url = absolute(&location)?;
            infos.push(info);
            continue;
        }
        let (mut info, _) = scan_shard(
            location.open()?,
            &location.display(),
            &ReadOptions::default(),
            |_| {},
        )?;
        info.url = absolute(&location)?;
        infos.push(info);
    }
    let manifest = Manifest::new(infos);
    manifest.validate(spec)?;
    Ok(manifest)
}

/// A shard's URL or absolute path, as a worker on another host can open it.
fn absolute(location: &Location) -> Result<String> {
    Ok(match location {
        Location::File(p) => std::fs::canonicalize(p)
            .map_err(DatasetError::io("resolving", p))?
            .display()
            .to_string(),
        Location::Http(u) => u.clone(),
    })
}

/// What the manifest says of an uncompressed shard, from its `.idx` sidecar alone (two bytes of
/// the shard tell it is not gzip): none of its samples is read. `None` when there is no
/// sidecar or the shard is gzip (its sidecar describes the tar stream, not the file), so the
/// caller scans it.
fn from_sidecar(location: &Location) -> Result<Option<sluice_shard::ShardInfo>> {
    let sidecar = Location::parse(&SampleIndex::sidecar_url(&location.display()));
    let Ok(body) = sidecar.open() else {
        return Ok(None);
    };
    let mut head = [0u8; 2];
    if location.open()?.read_exact(&mut head).is_err() || head == [0x1f, 0x8b] {
        return Ok(None);
    }
    let bytes = sluice_shard::index::read_bounded(body, MAX_MANIFEST, &sidecar.display())?;
    let index = SampleIndex::decode(&bytes, &sidecar.display())?;
    Ok(Some(sluice_shard::ShardInfo {
        url: location.display(),
        size: index.shard_size,
        samples: index.entries.len() as u64,
        checksum: index.shard_checksum,
        compression: sluice_shard::Compression::None,
        replicas: Vec::new(),
    }))
}

/// How many `.tar` files `dir` holds.
pub fn shard_count(dir: &Path) -> Result<usize> {
    Ok(std::fs::read_dir(dir)
        .map_err(DatasetError::io("listing", dir))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "tar"))
        .count())
}
