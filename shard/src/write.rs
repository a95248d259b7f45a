//! Writing shards: samples in, WebDataset tar shards and their sidecar indexes out.
//!
//! Headers are deterministic (mode 0644, uid/gid 0, no owner names, mtime 0), so the same
//! samples in the same order always give byte-identical shards, whichever machine wrote them.
//! A shard is written to a temporary name and renamed into place when complete, so a reader
//! never sees half a shard under its final name.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::error::{Result, ShardError};
use crate::index::{IndexEntry, SampleIndex};
use crate::manifest::{Checksum, Compression, ShardInfo};
use crate::tar::{header, padded, BLOCK};

/// Largest size the 11 octal digits of a ustar size field hold.
const USTAR_MAX_SIZE: u64 = (1 << 33) - 1;

/// Appends the tar entries of one sample to `out`. Pure; the unit the writer hashes for the
/// sample's checksum.
pub fn encode_sample(key: &str, fields: &[(&str, &[u8])], out: &mut Vec<u8>) -> Result<()> {
    validate_sample(key, fields)?;
    for (name, data) in fields {
        let path = format!("{key}.{name}");
        let size = data.len() as u64;
        if path.len() > 100 || size > USTAR_MAX_SIZE {
            let mut records = Vec::new();
            if path.len() > 100 {
                records.extend(header::pax_record("path", path.as_bytes()));
            }
            if size > USTAR_MAX_SIZE {
                records.extend(header::pax_record("size", size.to_string().as_bytes()));
            }
            out.extend_from_slice(&header::ustar(
                b"././@PaxHeader",
                records.len() as u64,
                b'x',
            ));
            push_padded(out, &records);
        }
        out.extend_from_slice(&header::ustar(path.as_bytes(), size, b'0'));
        push_padded(out, data);
    }
    Ok(())
}

fn push_padded(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(data);
    let pad = padded(data.len() as u64) as usize - data.len();
    out.resize(out.len() + pad, 0);
}

fn validate_sample(key: &str, fields: &[(&str, &[u8])]) -> Result<()> {
    let bad = |detail: &str| {
        Err(ShardError::InvalidSample {
            key: key.to_string(),
            detail: detail.to_string(),
        })
    };
    let last = key.rsplit('/').next().unwrap_or(key);
    if key.is_empty() || last.is_empty() {
        return bad("empty key (or key ending in '/')");
    }
    if last.contains('.') {
        return bad("the last path component of a key must not contain '.': readers split the key at the first dot");
    }
    if key.contains('\0') {
        return bad("key contains a NUL byte");
    }
    if fields.is_empty() {
        return bad("a sample needs at least one field");
    }
    for (i, (name, _)) in fields.iter().enumerate() {
        if name.is_empty() || name.contains('/') || name.contains('\0') {
            return bad(&format!(
                "field name {name:?} must be non-empty, without '/' or NUL"
            ));
        }
        if fields[..i].iter().any(|(n, _)| n == name) {
            return bad(&format!("field {name:?} appears twice"));
        }
    }
    Ok(())
}

/// Formats a printf-style shard pattern (`out/train-%06d.tar`) with a shard number.
pub fn format_pattern(pattern: &str, n: u64) -> Result<String> {
    let err = |detail: &str| ShardError::Pattern {
        pattern: pattern.to_string(),
        detail: detail.to_string(),
    };
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.char_indices().peekable();
    let mut placed = false;
    while let Some((_, c)) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = String::new();
        loop {
            match chars.next() {
                Some((_, '%')) if spec.is_empty() => {
                    out.push('%');
                    break;
                }
                Some((_, d)) if d.is_ascii_digit() => spec.push(d),
                Some((_, 'd')) => {
                    if placed {
                        return Err(err("more than one %d"));
                    }
                    let width: usize = if spec.is_empty() {
                        0
                    } else {
                        spec.parse().map_err(|_| err("bad width"))?
                    };
                    if width > 32 {
                        return Err(err("width over 32"));
                    }
                    out.push_str(&format!("{n:0width$}"));
                    placed = true;
                    break;
                }
                _ => return Err(err("'%' must be followed by %, d or 0Nd")),
            }
        }
    }
    if !placed {
        return Err(err("no %d (e.g. train-%06d.tar) for the shard number"));
    }
    Ok(out)
}

/// Where shards go and when a new one starts.
#[derive(Clone, Debug)]
pub struct WriterConfig {
    /// Output pattern with one `%d` / `%0Nd` for the shard number.
    pub pattern: String,
    /// Start a new shard after this many samples.
    pub max_count: Option<u64>,
    /// Start a new shard before it would grow past this many bytes (a single larger sample
    /// still gets a shard of its own).
    pub max_bytes: Option<u64>,
    /// Number of the first shard.
    pub first_shard: u64,
}

impl WriterConfig {
    pub fn new(pattern: impl Into<String>) -> Self {
        WriterConfig {
            pattern: pattern.into(),
            max_count: None,
            max_bytes: None,
            first_shard: 0,
        }
    }
}

/// A shard the writer finished: where it is and what the manifest says of it.
#[derive(Clone, Debug)]
pub struct WrittenShard {
    pub path: PathBuf,
    pub index_path: PathBuf,
    pub info: ShardInfo,
}

struct OpenShard {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
    hasher: Xxh3,
    bytes: u64,
    index: Vec<IndexEntry>,
}

/// Writes samples into a numbered series of shards with sidecar indexes.
pub struct ShardWriter {
    config: WriterConfig,
    next_shard: u64,
    current: Option<OpenShard>,
    written: Vec<WrittenShard>,
    buf: Vec<u8>,
}

impl ShardWriter {
    pub fn new(config: WriterConfig) -> Result<Self> {
        format_pattern(&config.pattern, 0)?;
        Ok(ShardWriter {
            next_shard: config.first_shard,
            config,
            current: None,
            written: Vec::new(),
            buf: Vec::new(),
        })
    }

    /// Appends a sample, starting a new shard first when a limit says so.
    pub fn write(&mut self, key: &str, fields: &[(&str, &[u8])]) -> Result<()> {
        self.buf.clear();
        encode_sample(key, fields, &mut self.buf)?;
        let len = self.buf.len() as u64;
        if let Some(cur) = &self.current {
            let full_count = self
                .config
                .max_count
                .is_some_and(|m| cur.index.len() as u64 >= m);
            let full_bytes = self
                .config
                .max_bytes
                .is_some_and(|m| cur.bytes + len + 2 * BLOCK as u64 > m);
            if full_count || full_bytes {
                self.close_current()?;
            }
        }
        if self.current.is_none() {
            self.open_next()?;
        }
        let Some(cur) = self.current.as_mut() else {
            unreachable!("a shard was just opened");
        };
        cur.out
            .write_all(&self.buf)
            .map_err(|e| io_error(&cur.path, cur.bytes, e))?;
        cur.hasher.update(&self.buf);
        cur.index.push(IndexEntry {
            offset: cur.bytes,
            len,
            checksum: xxh3_64(&self.buf),
        });
        cur.bytes += len;
        Ok(())
    }

    /// Shards finished so far.
    pub fn written(&self) -> &[WrittenShard] {
        &self.written
    }

    /// Bytes written to the shard in progress.
    pub fn current_bytes(&self) -> u64 {
        self.current.as_ref().map_or(0, |c| c.bytes)
    }

    /// Closes the last shard and returns every shard written.
    pub fn finish(mut self) -> Result<Vec<WrittenShard>> {
        self.close_current()?;
        Ok(std::mem::take(&mut self.written))
    }

    fn open_next(&mut self) -> Result<()> {
        let path = PathBuf::from(format_pattern(&self.config.pattern, self.next_shard)?);
        self.next_shard += 1;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io_error(&path, 0, e))?;
        }
        let tmp = sibling(&path, ".partial");
        let file = File::create(&tmp).map_err(|e| io_error(&tmp, 0, e))?;
        self.current = Some(OpenShard {
            path,
            tmp,
            out: BufWriter::with_capacity(1 << 20, file),
            hasher: Xxh3::new(),
            bytes: 0,
            index: Vec::new(),
        });
        Ok(())
    }

    fn close_current(&mut self) -> Result<()> {
        let Some(mut cur) = self.current.take() else {
            return Ok(());
        };
        let trailer = [0u8; 2 * BLOCK];
        cur.out
            .write_all(&trailer)
            .map_err(|e| io_error(&cur.path, cur.bytes, e))?;
        cur.hasher.update(&trailer);
        cur.bytes += trailer.len() as u64;
        let file = cur
            .out
            .into_inner()
            .map_err(|e| io_error(&cur.path, cur.bytes, e.into_error()))?;
        file.sync_all()
            .map_err(|e| io_error(&cur.path, cur.bytes, e))?;
        drop(file);
        std::fs::rename(&cur.tmp, &cur.path).map_err(|e| io_error(&cur.path, cur.bytes, e))?;

        let checksum = Checksum(cur.hasher.digest());
        let samples = cur.index.len() as u64;
        let index = SampleIndex {
            shard_size: cur.bytes,
            shard_checksum: checksum,
            entries: cur.index,
        };
        let index_path = SampleIndex::sidecar_path(&cur.path);
        index.write_file(&index_path)?;
        let name = cur
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.written.push(WrittenShard {
            info: ShardInfo {
                url: name,
                size: cur.bytes,
                samples,
                checksum,
                compression: Compression::None,
                replicas: Vec::new(),
            },
            path: cur.path,
            index_path,
        });
        Ok(())
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        // A writer dropped without `finish` (an error upstream) leaves no partial shard behind.
        if let Some(cur) = self.current.take() {
            drop(cur.out);
            let _ = std::fs::remove_file(&cur.tmp);
        }
    }
}

/// Writes `bytes` to `path` atomically: a sibling `.partial` file, then a rename over it.
pub(crate) fn replace(path: &Path, bytes: &[u8]) -> crate::Result<()> {
    let tmp = sibling(path, ".partial");
    std::fs::write(&tmp, bytes).map_err(|e| io_error(path, 0, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_error(path, 0, e))
}

/// `dir/name.tar` + `suffix` → `dir/name.tar<suffix>`.
pub(crate) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn io_error(path: &Path, offset: u64, source: std::io::Error) -> ShardError {
    ShardError::Io {
        shard: path.display().to_string(),
        offset,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_format_shard_numbers() {
        assert_eq!(
            format_pattern("out/train-%06d.tar", 7).unwrap(),
            "out/train-000007.tar"
        );
        assert_eq!(format_pattern("s%d.tar", 12).unwrap(), "s12.tar");
        assert_eq!(format_pattern("100%%-%03d.tar", 1).unwrap(), "100%-001.tar");
        assert!(format_pattern("no-number.tar", 0).is_err());
        assert!(format_pattern("%d-%d.tar", 0).is_err());
        assert!(format_pattern("%s.tar", 0).is_err());
    }

    #[test]
    fn invalid_samples_are_refused_with_the_key() {
        let mut out = Vec::new();
        let err = encode_sample("a.b", &[("jpg", b"x")], &mut out).unwrap_err();
        assert!(err.to_string().contains("\"a.b\""), "{err}");
        assert!(encode_sample("k", &[], &mut out).is_err());
        assert!(encode_sample("k", &[("jpg", b"1"), ("jpg", b"2")], &mut out).is_err());
        assert!(encode_sample("k", &[("a/b", b"1")], &mut out).is_err());
        assert!(encode_sample("dir/", &[("a", b"1")], &mut out).is_err());
    }
}
