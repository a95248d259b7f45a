//! The worker's shard cache: byte ranges of shards it has read, kept on local disk so later
//! epochs read them there instead of from the storage tier.
//!
//! - An entry is keyed by the shard's content as the manifest names it (checksum and size),
//!   never by its URL: a shard rewritten and re-indexed is another key, so a stale copy is
//!   never used, and the same shard at another URL (a replica, a moved mount) hits.
//! - One sparse file per shard (`<checksum>-<size>.shard`) holds the ranges read so far, and
//!   a sidecar (`.ranges`) lists them. The sidecar is rewritten (temp file, then rename) only
//!   after a range's bytes are on disk, so after a crash or a restart the cache holds what it
//!   says it holds.
//! - A unit's range is served from the cache only when the entry covers it whole. Bytes read
//!   from the cache go through the same checks as bytes from storage (each sample against
//!   its `.idx` checksum): a range damaged on disk is a damaged sample, which the source
//!   reads again from storage ([`super::ShardSource::open_unit_with_repair`]), dropping the
//!   shard's entry. A range of up to [`READ_INTO_MEMORY`] is read whole when the unit opens,
//!   so a failing disk shows there and the unit reads from storage instead, with a warning.
//! - Filling: bytes read from storage pass through to the parser and are written to the entry
//!   as they go; a write that fails (a full disk) drops that range and warns, once. The unit
//!   never fails for the cache.
//! - Size: at most `capacity` bytes of ranges; the shards used least recently are evicted
//!   whole to make room (entries being filled are never evicted).
//! - Ownership: the directory and every file are opened with no link followed and checked
//!   (`cache_dir.rs`); what the cache did not make is never read, written or removed.
//! - A fault in cached bytes (damage, a tar header that does not parse, a short read) is a
//!   miss: the source drops the entry ([`ShardCache::damaged`]) and reads the rest of the
//!   unit from storage, so a damaged cache costs no sample.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sluice_shard::ShardInfo;

use super::cache_dir::CacheDir;

/// Ranges up to this size are read into memory when a unit opens (a failing disk then shows
/// before any sample is parsed); longer ones are streamed from the file.
pub const READ_INTO_MEMORY: u64 = 64 << 20;

/// Where the cache is and how large it may grow (`sluice cpu --cache-dir --cache-size`).
#[derive(Clone, Debug)]
pub struct CacheConfig {
    pub dir: PathBuf,
    pub capacity: u64,
}

/// A shard's identity in the cache: its content as the manifest names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    checksum: u64,
    size: u64,
}

impl CacheKey {
    pub fn of(info: &ShardInfo) -> Self {
        CacheKey {
            checksum: info.checksum.0,
            size: info.size,
        }
    }

    fn stem(&self) -> String {
        format!("{:016x}-{}", self.checksum, self.size)
    }

    /// Its file with extension `ext` in the cache directory.
    fn name(&self, ext: &str) -> String {
        format!("{}.{ext}", self.stem())
    }
}

/// What the sidecar of an entry records.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Sidecar {
    /// Byte ranges `[start, end)` on disk, sorted and disjoint.
    covered: Vec<(u64, u64)>,
}

struct Entry {
    covered: Vec<(u64, u64)>,
    last_used: u64,
    /// Units filling it now: it is not evicted while any is.
    writers: usize,
}

impl Entry {
    fn bytes(&self) -> u64 {
        self.covered.iter().map(|(a, b)| b - a).sum()
    }

    fn covers(&self, start: u64, end: u64) -> bool {
        self.covered.iter().any(|&(a, b)| a <= start && end <= b)
    }
}

/// `ranges` with `[start, end)` added, sorted and merged.
fn merged(mut ranges: Vec<(u64, u64)>, start: u64, end: u64) -> Vec<(u64, u64)> {
    ranges.push((start, end));
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

struct State {
    entries: HashMap<CacheKey, Entry>,
    /// Bytes covered, plus bytes reserved by ranges being filled.
    used: u64,
    clock: u64,
}

/// The largest sidecar read (a shard's ranges: a few hundred bytes each).
const MAX_SIDECAR_BYTES: u64 = 4 << 20;

struct Inner {
    dir: CacheDir,
    capacity: u64,
    state: Mutex<State>,
    /// A write failed (a full or failing disk): said once.
    warned: AtomicBool,
}

/// The shard cache of one worker (see the module documentation). Cheap to clone.
#[derive(Clone)]
pub struct ShardCache(Arc<Inner>);

impl ShardCache {
    /// The cache in `dir` (made if missing), holding at most `capacity` bytes; what an
    /// earlier run left there is kept, less entries whose files do not match their sidecars.
    /// The directory is refused (by name) if it is a link, another user's, or writable by
    /// others.
    pub fn open(dir: &Path, capacity: u64) -> io::Result<Self> {
        let dir = CacheDir::open(dir)?;
        let mut entries = HashMap::new();
        let mut used = 0;
        for name in dir.names()? {
            let Some((stem, ext)) = name.rsplit_once('.') else {
                continue;
            };
            if ext == "tmp" {
                dir.remove(&name);
                continue;
            }
            if ext != "ranges" {
                continue;
            }
            match load_entry(&dir, stem) {
                Some((key, entry)) => {
                    used += entry.bytes();
                    entries.insert(key, entry);
                }
                None => {
                    tracing::warn!(sidecar = %dir.path(&name).display(), "shard cache: an \
                        entry that does not match its file is dropped");
                    remove_files(&dir, stem);
                }
            }
        }
        let clock = entries
            .values()
            .map(|e: &Entry| e.last_used)
            .max()
            .unwrap_or(0);
        let shown = dir.root().to_path_buf();
        let cache = ShardCache(Arc::new(Inner {
            dir,
            capacity,
            state: Mutex::new(State {
                entries,
                used,
                clock,
            }),
            warned: AtomicBool::new(false),
        }));
        if let Ok(mut s) = cache.0.state.lock() {
            cache.0.make_room(&mut s, 0, None);
            metrics::gauge!("sluice_cpu_cache_bytes").set(s.used as f64);
            tracing::info!(dir = %shown.display(), shards = s.entries.len(), bytes = s.used,
                capacity, "shard cache");
        }
        Ok(cache)
    }

    /// The bytes `offset..offset + len` of the shard `key` when the cache holds them all.
    pub fn read(&self, key: CacheKey, offset: u64, len: u64) -> Option<Box<dyn Read + Send>> {
        {
            let mut s = self.0.state.lock().ok()?;
            s.clock += 1;
            let now = s.clock;
            let entry = s.entries.get_mut(&key)?;
            if !entry.covers(offset, offset + len) {
                return None;
            }
            entry.last_used = now;
        }
        let name = key.name("shard");
        let read = || -> io::Result<Box<dyn Read + Send>> {
            let file = self.0.dir.read(&name)?;
            if len <= READ_INTO_MEMORY {
                let mut bytes = vec![0u8; len as usize];
                file.read_exact_at(&mut bytes, offset)?;
                return Ok(Box::new(io::Cursor::new(bytes)));
            }
            Ok(Box::new(RangeReader {
                file,
                at: offset,
                end: offset + len,
            }))
        };
        match read() {
            Ok(r) => {
                metrics::counter!("sluice_cpu_cache_hit_bytes_total").increment(len);
                Some(r)
            }
            Err(e) => {
                metrics::counter!("sluice_cpu_cache_errors_total").increment(1);
                tracing::warn!(file = %self.0.dir.path(&name).display(), "shard cache: cannot \
                    read a cached range ({e}); reading it from storage, and dropping the entry");
                self.forget(key);
                None
            }
        }
    }

    /// `body` (the bytes `offset..offset + len` of shard `key`, from storage), written to the
    /// cache as it is read; the range counts as cached once all of it was written.
    pub fn fill(
        &self,
        key: CacheKey,
        offset: u64,
        len: u64,
        body: Box<dyn Read + Send>,
    ) -> Box<dyn Read + Send> {
        metrics::counter!("sluice_cpu_cache_miss_bytes_total").increment(len);
        let Some(file) = self.0.reserve(key, len) else {
            return body;
        };
        Box::new(Filling {
            body,
            file: Some(file),
            cache: self.0.clone(),
            key,
            offset,
            len,
            written: 0,
        })
    }

    /// Drops the shard `key` (a damaged range was read from it).
    pub fn forget(&self, key: CacheKey) {
        if let Ok(mut s) = self.0.state.lock() {
            if let Some(e) = s.entries.remove(&key) {
                s.used = s.used.saturating_sub(e.bytes());
            }
            metrics::gauge!("sluice_cpu_cache_bytes").set(s.used as f64);
        }
        remove_files(&self.0.dir, &key.stem());
    }

    /// The cached copy of shard `key` (`shard` in logs) failed at sample `index` (`why`):
    /// the cache was wrong, not the shard. The entry is dropped, said and counted as the
    /// cache's; the caller reads the bytes again from storage.
    pub fn damaged(&self, key: CacheKey, shard: &str, index: u64, why: &str) {
        metrics::counter!("sluice_cpu_cache_damaged_total").increment(1);
        tracing::warn!(shard, sample = index, file = %self.0.dir.path(&key.name("shard")).display(),
            "shard cache: the cached copy is damaged ({why}); dropped it, reading the rest of \
             the unit from storage");
        self.forget(key);
    }

    /// Bytes cached now.
    pub fn bytes(&self) -> u64 {
        self.0.state.lock().map_or(0, |s| s.used)
    }
}

impl Inner {
    fn path(&self, key: CacheKey, ext: &str) -> PathBuf {
        self.dir.path(&key.name(ext))
    }

    /// Room for `len` more bytes of shard `key`, and its file open for writing; `None` when
    /// the range cannot be cached (larger than the cache, or the file cannot be made).
    fn reserve(&self, key: CacheKey, len: u64) -> Option<File> {
        {
            let mut s = self.state.lock().ok()?;
            if !self.make_room(&mut s, len, Some(key)) {
                return None;
            }
            s.used += len;
            s.clock += 1;
            let now = s.clock;
            let entry = s.entries.entry(key).or_insert(Entry {
                covered: Vec::new(),
                last_used: now,
                writers: 0,
            });
            entry.writers += 1;
        }
        let path = self.path(key, "shard");
        let opened = self.dir.write(&key.name("shard")).and_then(|f| {
            if f.metadata()?.len() != key.size {
                f.set_len(key.size)?;
            }
            Ok(f)
        });
        match opened {
            Ok(f) => Some(f),
            Err(e) => {
                self.failed(&path, &e);
                self.release(key, len, None);
                None
            }
        }
    }

    /// Evicts the shards used least recently, but `keep` and those being filled, until
    /// `need` more bytes fit; false when they cannot.
    fn make_room(&self, s: &mut State, need: u64, keep: Option<CacheKey>) -> bool {
        if need > self.capacity {
            return false;
        }
        while s.used + need > self.capacity {
            let victim = s
                .entries
                .iter()
                .filter(|(k, e)| Some(**k) != keep && e.writers == 0)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| *k);
            let Some(victim) = victim else {
                return false;
            };
            if let Some(e) = s.entries.remove(&victim) {
                s.used = s.used.saturating_sub(e.bytes());
            }
            remove_files(&self.dir, &victim.stem());
            metrics::counter!("sluice_cpu_cache_evictions_total").increment(1);
        }
        true
    }

    /// A filling of `len` bytes of `key` ended: the range `done` (when all of it was written)
    /// becomes cached, the reservation is released either way.
    fn release(&self, key: CacheKey, len: u64, done: Option<(u64, u64)>) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        s.used = s.used.saturating_sub(len);
        let Some(entry) = s.entries.get_mut(&key) else {
            return;
        };
        entry.writers = entry.writers.saturating_sub(1);
        if let Some((start, end)) = done {
            let before = entry.bytes();
            entry.covered = merged(std::mem::take(&mut entry.covered), start, end);
            let added = entry.bytes() - before;
            let sidecar = Sidecar {
                covered: entry.covered.clone(),
            };
            s.used += added;
            if let Err(e) = self.write_sidecar(key, &sidecar) {
                self.failed(&self.path(key, "ranges"), &e);
            }
        }
        let empty = s
            .entries
            .get(&key)
            .is_some_and(|e| e.writers == 0 && e.covered.is_empty());
        if empty {
            s.entries.remove(&key);
            remove_files(&self.dir, &key.stem());
        }
        metrics::gauge!("sluice_cpu_cache_bytes").set(s.used as f64);
    }

    fn write_sidecar(&self, key: CacheKey, sidecar: &Sidecar) -> io::Result<()> {
        use std::io::Write;
        let tmp = key.name("tmp");
        let text = serde_json::to_vec(sidecar).map_err(io::Error::other)?;
        self.dir.remove(&tmp);
        self.dir.create_new(&tmp)?.write_all(&text)?;
        self.dir.rename(&tmp, &key.name("ranges"))
    }

    fn failed(&self, path: &Path, e: &io::Error) {
        metrics::counter!("sluice_cpu_cache_errors_total").increment(1);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(file = %path.display(), "shard cache: cannot write ({e}); reading \
                from storage goes on uncached (said once)");
        }
    }
}

/// The entry the sidecar `<stem>.ranges` describes, when its shard file is there (the
/// cache's own) at the key's size and every range lies inside it.
fn load_entry(dir: &CacheDir, stem: &str) -> Option<(CacheKey, Entry)> {
    let (checksum, size) = stem.split_once('-')?;
    let key = CacheKey {
        checksum: u64::from_str_radix(checksum, 16).ok()?,
        size: size.parse().ok()?,
    };
    let file = dir.read(&key.name("shard")).ok()?.metadata().ok()?;
    let mut text = Vec::new();
    dir.read(&key.name("ranges"))
        .ok()?
        .take(MAX_SIDECAR_BYTES)
        .read_to_end(&mut text)
        .ok()?;
    let record: Sidecar = serde_json::from_slice(&text).ok()?;
    let valid = file.len() == key.size
        && record.covered.iter().all(|&(a, b)| a < b && b <= key.size)
        && record.covered.windows(2).all(|w| w[0].1 < w[1].0);
    // Older entries were last written earlier: their order survives a restart.
    let last_used = file
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    valid.then_some((
        key,
        Entry {
            covered: record.covered,
            last_used,
            writers: 0,
        },
    ))
}

/// Removes an entry's shard file and its sidecar (only what the cache made).
fn remove_files(dir: &CacheDir, stem: &str) {
    dir.remove(&format!("{stem}.ranges"));
    dir.remove(&format!("{stem}.shard"));
}

/// A range of a cached shard file, streamed.
struct RangeReader {
    file: File,
    at: u64,
    end: u64,
}

impl Read for RangeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (self.end - self.at).min(buf.len() as u64) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.at)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the cached shard file is shorter than its range",
            ));
        }
        self.at += n as u64;
        Ok(n)
    }
}

/// Bytes from storage on their way to the parser, written to the cache as they pass.
struct Filling {
    body: Box<dyn Read + Send>,
    /// `None` once a write failed: the rest passes through uncached.
    file: Option<File>,
    cache: Arc<Inner>,
    key: CacheKey,
    offset: u64,
    len: u64,
    written: u64,
}

impl Read for Filling {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.body.read(buf)?;
        self.write_through(&buf[..n]);
        Ok(n)
    }
}

impl Filling {
    /// Writes `bytes`, the next ones read, to the cache; the range is cached once whole.
    fn write_through(&mut self, bytes: &[u8]) {
        let Some(file) = &self.file else {
            return;
        };
        let room = (self.len - self.written).min(bytes.len() as u64) as usize;
        match file.write_all_at(&bytes[..room], self.offset + self.written) {
            Ok(()) => self.written += room as u64,
            Err(e) => {
                self.cache.failed(&self.cache.path(self.key, "shard"), &e);
                self.file = None;
                self.cache.release(self.key, self.len, None);
                return;
            }
        }
        if self.written == self.len {
            self.file = None;
            let range = (self.offset, self.offset + self.len);
            self.cache.release(self.key, self.len, Some(range));
        }
    }
}

/// A range whose reader stopped at most this short of its end (the parser needs no bytes
/// after the last sample's: the tar padding) is read to its end when dropped, so it is cached.
const FINISH_ON_DROP: u64 = 1 << 20;

impl Drop for Filling {
    fn drop(&mut self) {
        if self.file.is_none() {
            return;
        }
        let left = self.len - self.written;
        if left <= FINISH_ON_DROP {
            let mut rest = Vec::new();
            let read = (&mut self.body).take(left).read_to_end(&mut rest);
            if read.is_ok() && rest.len() as u64 == left {
                self.write_through(&rest);
            }
        }
        // Read only in part (the unit was cancelled, or the read failed): nothing is cached.
        if self.file.take().is_some() {
            self.cache.release(self.key, self.len, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(size: u64) -> CacheKey {
        CacheKey {
            checksum: 0xabc,
            size,
        }
    }

    fn fill(cache: &ShardCache, k: CacheKey, offset: u64, bytes: &[u8]) {
        let body: Box<dyn Read + Send> = Box::new(io::Cursor::new(bytes.to_vec()));
        let mut r = cache.fill(k, offset, bytes.len() as u64, body);
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        assert_eq!(out, bytes, "filling passes the bytes through unchanged");
    }

    fn read(cache: &ShardCache, k: CacheKey, offset: u64, len: u64) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        cache.read(k, offset, len)?.read_to_end(&mut out).unwrap();
        Some(out)
    }

    #[test]
    fn ranges_read_once_are_served_again_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ShardCache::open(dir.path(), 1 << 20).unwrap();
        let k = key(100);
        assert!(read(&cache, k, 10, 20).is_none());
        fill(&cache, k, 10, &[7; 20]);
        fill(&cache, k, 30, &[8; 10]);
        assert_eq!(read(&cache, k, 10, 20).unwrap(), vec![7; 20]);
        // Two ranges filled apart serve a range that spans both.
        let mut spanning = vec![7; 15];
        spanning.extend([8; 5]);
        assert_eq!(read(&cache, k, 15, 20).unwrap(), spanning);
        assert!(read(&cache, k, 35, 10).is_none(), "40..45 was never read");
        assert_eq!(cache.bytes(), 30);
        drop(cache);
        let again = ShardCache::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(again.bytes(), 30);
        assert_eq!(read(&again, k, 30, 10).unwrap(), vec![8; 10]);
        // Another checksum is another shard.
        let other = CacheKey {
            checksum: 0xdef,
            size: 100,
        };
        assert!(read(&again, other, 10, 10).is_none());
    }

    #[test]
    fn the_least_recently_used_shards_make_room_and_a_partial_read_caches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ShardCache::open(dir.path(), 100).unwrap();
        let (a, b, c) = (key(1000), key(2000), key(3000));
        fill(&cache, a, 0, &[1; 40]);
        fill(&cache, b, 0, &[2; 40]);
        assert!(read(&cache, a, 0, 40).is_some(), "a is now the more recent");
        fill(&cache, c, 0, &[3; 40]);
        assert!(read(&cache, b, 0, 40).is_none(), "b was evicted");
        assert!(read(&cache, a, 0, 40).is_some() && read(&cache, c, 0, 40).is_some());
        assert!(cache.bytes() <= 100);
        // More than the whole cache: passed through, not cached.
        fill(&cache, key(500), 0, &[4; 200]);
        assert!(read(&cache, key(500), 0, 200).is_none());
        // A reader that stops just short of the end (the tar padding after the last
        // sample) still caches the range.
        let body: Box<dyn Read + Send> = Box::new(io::Cursor::new(vec![6u8; 30]));
        let mut r = cache.fill(key(5000), 0, 30, body);
        let mut most = [0u8; 25];
        r.read_exact(&mut most).unwrap();
        drop(r);
        assert_eq!(read(&cache, key(5000), 0, 30).unwrap(), vec![6; 30]);
        // A read that failed part way (the connection dropped) leaves nothing behind.
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("connection reset"))
            }
        }
        let body: Box<dyn Read + Send> = Box::new(io::Cursor::new(vec![5u8; 10]).chain(Broken));
        let mut r = cache.fill(key(4000), 0, 30, body);
        let mut first = [0u8; 10];
        r.read_exact(&mut first).unwrap();
        drop(r);
        assert!(read(&cache, key(4000), 0, 10).is_none());
        assert!(cache.bytes() <= 100);
    }

    #[test]
    fn an_entry_whose_file_does_not_match_its_sidecar_is_dropped_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ShardCache::open(dir.path(), 1 << 20).unwrap();
        fill(&cache, key(100), 0, &[9; 50]);
        drop(cache);
        let file = dir.path().join(format!("{}.shard", key(100).stem()));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(60)
            .unwrap();
        let again = ShardCache::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(again.bytes(), 0);
        assert!(!file.exists());
    }
}
