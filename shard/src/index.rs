//! The per-shard sidecar index (`train-000123.tar.idx`): the byte range and checksum of every
//! sample, so a work unit that is a sample range can be fetched with one HTTP Range request
//! and checked on arrival (a whole-shard hash cannot check a range), while the manifest stays
//! around 100 bytes per shard.
//!
//! Binary, little-endian, 24 bytes a sample:
//!
//! ```text
//! magic "SLUICEIX" | version u32 = 1 | flags u32 = 0 | samples u64 | shard_size u64 | shard_checksum u64
//! samples × (offset u64, len u64, xxh3 u64 of the sample's tar bytes)
//! xxh3 u64 of everything before it
//! ```
//!
//! Offsets are in the tar stream (for a gzip shard, the decompressed one).

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::error::{Result, ShardError};
use crate::manifest::{Checksum, Compression, ShardInfo};
use crate::read::{decompressed, ReadOptions, TarReader};
use crate::sample::{continues_sample, split_key};

const MAGIC: &[u8; 8] = b"SLUICEIX";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 40;
const RECORD_LEN: usize = 24;

/// Where one sample lies in its shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub offset: u64,
    pub len: u64,
    /// xxh3-64 of the sample's bytes `[offset, offset + len)`.
    pub checksum: u64,
}

/// Bytes of the fixed header at the start of every index.
pub const INDEX_HEADER_LEN: usize = HEADER_LEN;

/// The fixed header of an index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexHeader {
    pub samples: u64,
    pub shard_size: u64,
    pub shard_checksum: Checksum,
}

/// Parses and checks (magic, version) the fixed header; the one place that knows its layout.
fn parse_header(bytes: &[u8]) -> std::result::Result<IndexHeader, String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!(
            "{} bytes is too short for an index header",
            bytes.len()
        ));
    }
    if &bytes[..8] != MAGIC {
        return Err("not a sluice sample index (bad magic)".into());
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != VERSION {
        return Err(format!(
            "index version {version}, this build reads {VERSION}"
        ));
    }
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
    Ok(IndexHeader {
        samples: word(16),
        shard_size: word(24),
        shard_checksum: Checksum(word(32)),
    })
}

/// The sidecar index of one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleIndex {
    /// Size of the tar stream.
    pub shard_size: u64,
    /// The manifest's checksum of the shard file this index describes.
    pub shard_checksum: Checksum,
    pub entries: Vec<IndexEntry>,
}

impl SampleIndex {
    /// `train-000123.tar` → `train-000123.tar.idx`.
    pub fn sidecar_path(shard: &Path) -> PathBuf {
        crate::write::sibling(shard, ".idx")
    }

    /// The sidecar's URL or path for a shard URL or path.
    pub fn sidecar_url(shard_url: &str) -> String {
        format!("{shard_url}.idx")
    }

    /// The byte range `(offset, len)` holding samples `start..end`, or `None` when the range
    /// is empty or out of bounds.
    pub fn byte_range(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        if start >= end {
            return None;
        }
        let first = self.entries.get(usize::try_from(start).ok()?)?;
        let last = self.entries.get(usize::try_from(end - 1).ok()?)?;
        Some((first.offset, last.offset + last.len - first.offset))
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.entries.len() * RECORD_LEN + 8);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.shard_size.to_le_bytes());
        out.extend_from_slice(&self.shard_checksum.0.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.offset.to_le_bytes());
            out.extend_from_slice(&e.len.to_le_bytes());
            out.extend_from_slice(&e.checksum.to_le_bytes());
        }
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes and validates an index; `path` names it in errors.
    pub fn decode(bytes: &[u8], path: &str) -> Result<Self> {
        let err = |detail: String| ShardError::Index {
            path: path.to_string(),
            detail,
        };
        if bytes.len() < HEADER_LEN + 8 {
            return Err(err(format!(
                "{} bytes is too short for an index",
                bytes.len()
            )));
        }
        let header = parse_header(bytes).map_err(err)?;
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        let count = header.samples;
        let expected = count
            .checked_mul(RECORD_LEN as u64)
            .and_then(|n| n.checked_add((HEADER_LEN + 8) as u64));
        if expected != Some(bytes.len() as u64) {
            return Err(err(format!(
                "claims {count} samples but is {} bytes long",
                bytes.len()
            )));
        }
        let body = bytes.len() - 8;
        if xxh3_64(&bytes[..body]) != word(body) {
            return Err(err("checksum mismatch: the index is corrupt".into()));
        }
        let shard_size = header.shard_size;
        let mut entries = Vec::with_capacity(count as usize);
        let mut next = 0u64;
        for i in 0..count as usize {
            let at = HEADER_LEN + i * RECORD_LEN;
            let e = IndexEntry {
                offset: word(at),
                len: word(at + 8),
                checksum: word(at + 16),
            };
            let end = e.offset.checked_add(e.len);
            if e.offset < next || e.len == 0 || end.is_none_or(|end| end > shard_size) {
                return Err(err(format!("sample {i} has an impossible range")));
            }
            next = e.offset + e.len;
            entries.push(e);
        }
        Ok(SampleIndex {
            shard_size,
            shard_checksum: header.shard_checksum,
            entries,
        })
    }

    /// What an index's fixed header says (the first [`INDEX_HEADER_LEN`] bytes), without
    /// reading its records: enough to learn a shard's checksum cheaply. `None` when the bytes
    /// are not a header this build reads.
    pub fn peek_header(head: &[u8]) -> Option<IndexHeader> {
        parse_header(head).ok()
    }

    pub fn write_file(&self, path: &Path) -> Result<()> {
        crate::write::replace(path, &self.encode())
    }

    /// Reads an index file, refusing one larger than `max_bytes`.
    pub fn read_file(path: &Path, max_bytes: u64) -> Result<Self> {
        let (bytes, name) = read_path_bounded(path, max_bytes)?;
        Self::decode(&bytes, &name)
    }
}

/// Reads the file at `path`, refusing one larger than `max_bytes`: its bytes and its name.
pub(crate) fn read_path_bounded(path: &Path, max_bytes: u64) -> Result<(Vec<u8>, String)> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| ShardError::Io {
        shard: name.clone(),
        offset: 0,
        source,
    })?;
    Ok((read_bounded(file, max_bytes, &name)?, name))
}

/// Reads a whole stream, refusing more than `max_bytes`.
pub fn read_bounded<R: Read>(r: R, max_bytes: u64, name: &str) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    r.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| ShardError::Io {
            shard: name.to_string(),
            offset: bytes.len() as u64,
            source,
        })?;
    if bytes.len() as u64 > max_bytes {
        return Err(ShardError::Index {
            path: name.to_string(),
            detail: format!("larger than the limit of {max_bytes} bytes"),
        });
    }
    Ok(bytes)
}

/// Counts and hashes the raw bytes of a shard file as they stream past.
struct FileTap<R> {
    inner: R,
    state: Arc<Mutex<(Xxh3, u64)>>,
}

impl<R: Read> Read for FileTap<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Ok(mut s) = self.state.lock() {
            s.0.update(&buf[..n]);
            s.1 += n as u64;
        }
        Ok(n)
    }
}

/// Where [`ScanTap`] sends the tar bytes passing through it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Headers and padding, until the next entry says which sample they belong to.
    Keep,
    /// A sample's data: straight into its hash.
    Hash,
    /// Data of an entry that belongs to no sample.
    Drop,
}

/// Hashes each sample's tar bytes as they stream past, without holding them: only the bytes
/// since the last entry's data (a header, pax or long-name records, padding: bounded by the
/// reader's metadata limit) wait until the next entry's key says where they belong.
struct ScanTap<R> {
    inner: R,
    route: Route,
    /// Tar bytes `[kept_from, kept_from + kept.len())`, routed later.
    kept: Vec<u8>,
    kept_from: u64,
    /// The open sample's hash.
    hasher: Xxh3,
    /// Tar bytes read so far.
    offset: u64,
}

impl<R: Read> Read for ScanTap<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        match self.route {
            Route::Keep => self.kept.extend_from_slice(&buf[..n]),
            Route::Hash => self.hasher.update(&buf[..n]),
            Route::Drop => {}
        }
        self.offset += n as u64;
        if self.route != Route::Keep && self.kept.is_empty() {
            self.kept_from = self.offset;
        }
        Ok(n)
    }
}

impl<R> ScanTap<R> {
    /// Routes the kept bytes before tar offset `to` into the open sample's hash (`hash`) or
    /// nowhere.
    fn settle(&mut self, to: u64, hash: bool) {
        let n = (to.saturating_sub(self.kept_from) as usize).min(self.kept.len());
        if hash {
            self.hasher.update(&self.kept[..n]);
        }
        self.kept.drain(..n);
        self.kept_from += n as u64;
    }
}

/// A sample as [`scan_shard`] saw it: its place in the shard and its fields' names and sizes
/// (its bytes were hashed as they passed, never held).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedSample {
    pub index: u64,
    pub key: String,
    /// Tar offsets of the sample's first byte and one past its last.
    pub start: u64,
    pub end: u64,
    /// (field name, bytes), in shard order.
    pub fields: Vec<(String, u64)>,
}

impl ScannedSample {
    /// Bytes of all its fields.
    pub fn payload_bytes(&self) -> u64 {
        self.fields.iter().map(|(_, n)| n).sum()
    }
}

/// Reads a whole shard (plain or gzip) from `raw` and describes it: the manifest entry (size,
/// sample count and checksum of the raw bytes) and the sidecar index. `url` names the shard.
/// Samples are grouped as [`crate::SampleReader`] groups them, and `on_sample` sees each; no
/// field's data is held, so memory does not grow with the size of a sample.
pub fn scan_shard<R: Read + Send + 'static>(
    raw: R,
    url: &str,
    options: &ReadOptions,
    mut on_sample: impl FnMut(&ScannedSample),
) -> Result<(ShardInfo, SampleIndex)> {
    let state = Arc::new(Mutex::new((Xxh3::new(), 0u64)));
    let tap = FileTap {
        inner: raw,
        state: state.clone(),
    };
    let io_err = |source| ShardError::Io {
        shard: url.to_string(),
        offset: 0,
        source,
    };
    let mut buffered = io::BufReader::with_capacity(1 << 20, tap);
    let head = io::BufRead::fill_buf(&mut buffered).map_err(io_err)?;
    if head.is_empty() {
        // GNU tar and Python's tarfile refuse a zero-byte file too: a copy that failed
        // half-way must not pass for an empty shard and drop out of training unseen.
        return Err(ShardError::Malformed {
            shard: url.to_string(),
            offset: 0,
            what: "shard",
            detail: "the file is empty (0 bytes), not a tar archive".into(),
        });
    }
    let compression = if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else {
        Compression::None
    };
    let stream = decompressed(buffered).map_err(io_err)?;
    let tap = ScanTap {
        inner: stream,
        route: Route::Keep,
        kept: Vec::new(),
        kept_from: options.start_offset,
        hasher: Xxh3::new(),
        offset: options.start_offset,
    };
    let mut reader = TarReader::new(tap, url, options);
    let mut entries = Vec::new();
    let mut open: Option<ScannedSample> = None;
    let mut next_index = options.first_index;
    let finish = |open: ScannedSample,
                  tap: &mut ScanTap<_>,
                  entries: &mut Vec<IndexEntry>,
                  on_sample: &mut dyn FnMut(&ScannedSample)| {
        tap.settle(open.end, true);
        entries.push(IndexEntry {
            offset: open.start,
            len: open.end - open.start,
            checksum: tap.hasher.digest(),
        });
        tap.hasher.reset();
        on_sample(&open);
    };
    // The open sample's hash as of its last entry, while the bytes after it (entries of no
    // sample, directories) are hashed on the chance that an entry of the sample follows
    // them: its range then covers them.
    let mut committed: Option<Xxh3> = None;
    while let Some(header) = reader.next_header()? {
        let tap = reader.get_mut();
        if let Some(o) = &open {
            if committed.is_none() {
                tap.settle(o.end, true);
                committed = Some(tap.hasher.clone());
            }
        }
        match split_key(&header.path) {
            None if open.is_none() => {
                tap.settle(header.data_offset, false);
                tap.route = Route::Drop;
            }
            None => {
                tap.settle(header.data_offset, true);
                tap.route = Route::Hash;
            }
            Some((key, field)) => {
                let continues = open.as_ref().is_some_and(|o| {
                    continues_sample(&o.key, o.fields.iter().map(|(f, _)| f.as_str()), key, field)
                });
                if !continues {
                    if let (Some(done), Some(at_end)) = (open.take(), committed.take()) {
                        tap.hasher = at_end;
                        finish(done, tap, &mut entries, &mut on_sample);
                    }
                    tap.settle(header.start, false);
                    open = Some(ScannedSample {
                        index: next_index,
                        key: key.to_string(),
                        start: header.start,
                        end: header.end(),
                        fields: Vec::new(),
                    });
                    next_index += 1;
                }
                committed = None;
                if let Some(o) = open.as_mut() {
                    o.end = header.end();
                    o.fields.push((field.to_string(), header.size));
                }
                tap.settle(header.data_offset, true);
                tap.route = Route::Hash;
            }
        }
        reader.skip_data()?;
        reader.get_mut().route = Route::Keep;
    }
    let tar_end = reader.offset();
    let tap = reader.get_mut();
    if let Some(done) = open.take() {
        if let Some(at_end) = committed.take() {
            tap.hasher = at_end;
        }
        finish(done, tap, &mut entries, &mut on_sample);
    }
    // Read to the end of the file (record padding after the end-of-archive blocks), so the
    // checksum covers every byte.
    let rest = io::copy(&mut tap.inner, &mut io::sink()).map_err(|source| ShardError::Io {
        shard: url.to_string(),
        offset: tar_end,
        source,
    })?;
    let (hasher, size) = {
        let s = state.lock().map_err(|_| ShardError::Index {
            path: url.to_string(),
            detail: "checksum state poisoned".into(),
        })?;
        (s.0.clone(), s.1)
    };
    let checksum = Checksum(hasher.digest());
    let tar_size = tap.offset + rest;
    let info = ShardInfo {
        url: url.to_string(),
        size,
        samples: entries.len() as u64,
        checksum,
        compression,
        replicas: Vec::new(),
    };
    let index = SampleIndex {
        shard_size: tar_size.max(tar_end),
        shard_checksum: checksum,
        entries,
    };
    Ok((info, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_index() -> SampleIndex {
        SampleIndex {
            shard_size: 10_240,
            shard_checksum: Checksum(42),
            entries: vec![
                IndexEntry {
                    offset: 0,
                    len: 1024,
                    checksum: 1,
                },
                IndexEntry {
                    offset: 1024,
                    len: 2048,
                    checksum: 2,
                },
                IndexEntry {
                    offset: 4096,
                    len: 512,
                    checksum: 3,
                },
            ],
        }
    }

    /// The streamed hashes are the hashes of the samples' byte ranges, with samples grouped
    /// as `SampleReader` groups them: across a directory entry and an entry of no sample
    /// inside a sample, and not over one after it.
    #[test]
    fn scanning_hashes_each_samples_range_as_the_reader_groups_it() {
        use crate::tar::header::ustar;
        let mut tar = Vec::new();
        for (name, size, kind) in [
            ("a.jpg", 700u64, b'0'),
            ("d/", 0, b'5'),
            ("a.cls", 1, b'0'),
            ("__meta__", 10, b'0'),
            ("a.txt", 5, b'0'),
            ("__x__", 3, b'0'),
            ("b.jpg", 2000, b'0'),
            ("b.jpg", 20, b'0'),
            ("c.txt", 4, b'0'),
            ("README", 9, b'0'),
        ] {
            tar.extend_from_slice(&ustar(name.as_bytes(), size, kind));
            let data: Vec<u8> = (0..size)
                .map(|i| (i * 7 + tar.len() as u64) as u8)
                .collect();
            tar.extend_from_slice(&data);
            tar.resize(tar.len().div_ceil(512) * 512, 0);
        }
        tar.extend_from_slice(&[0u8; 1024]);
        let mut seen = Vec::new();
        let (info, index) = scan_shard(
            io::Cursor::new(tar.clone()),
            "odd.tar",
            &ReadOptions::default(),
            |s| seen.push(s.clone()),
        )
        .unwrap();
        let read: Vec<crate::Sample> = crate::SampleReader::new(
            io::Cursor::new(tar.clone()),
            "odd.tar",
            &ReadOptions::default(),
        )
        .collect::<Result<_>>()
        .unwrap();
        assert_eq!(info.samples, 4);
        assert_eq!(read.len(), 4);
        for ((e, s), r) in index.entries.iter().zip(&seen).zip(&read) {
            assert_eq!((s.key.as_str(), s.index), (r.key.as_str(), r.index));
            assert_eq!((e.offset, e.offset + e.len), (r.start, r.end), "{}", r.key);
            let range = &tar[r.start as usize..r.end as usize];
            assert_eq!(e.checksum, xxh3_64(range), "{}", r.key);
            let fields: Vec<(String, u64)> = r
                .fields
                .iter()
                .map(|f| (f.name.clone(), f.data.len() as u64))
                .collect();
            assert_eq!(s.fields, fields);
        }
        assert_eq!(index.shard_size, tar.len() as u64);
    }

    #[test]
    fn round_trips_and_gives_byte_ranges() {
        let idx = sample_index();
        let back = SampleIndex::decode(&idx.encode(), "t.idx").unwrap();
        assert_eq!(back, idx);
        assert_eq!(idx.byte_range(0, 1), Some((0, 1024)));
        assert_eq!(idx.byte_range(1, 3), Some((1024, 3584)));
        assert_eq!(idx.byte_range(2, 2), None);
        assert_eq!(idx.byte_range(2, 4), None);
    }

    #[test]
    fn rejects_corrupt_or_lying_indexes() {
        let good = sample_index().encode();
        let mut flipped = good.clone();
        flipped[50] ^= 1;
        assert!(SampleIndex::decode(&flipped, "t.idx")
            .unwrap_err()
            .to_string()
            .contains("corrupt"));
        let mut huge = good.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        let msg = SampleIndex::decode(&huge, "t.idx").unwrap_err().to_string();
        assert!(msg.contains("t.idx") && msg.contains("claims"), "{msg}");
        assert!(SampleIndex::decode(&good[..20], "t.idx").is_err());
        assert!(
            SampleIndex::decode(b"not an index at all, not at all, no.....xxxxxxxx", "t.idx")
                .is_err()
        );
    }
}
