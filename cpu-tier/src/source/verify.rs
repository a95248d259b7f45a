//! The verification rule: what may be delivered under a sample's id.
//!
//! No sample is delivered unverified. With an index whose checksum is the manifest's, a
//! sample is delivered under id `i` only if its bytes are exactly index entry `i`'s range and
//! that range matched its checksum ([`Verified`], [`Admission`]). Without a usable index, the
//! unit's samples are held until the whole shard has matched the manifest's checksum
//! ([`read_whole_checked`]). Reading without either is `source.verify = false`, an explicit
//! opt-out.

use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::{Arc, Mutex};

use sluice_shard::read::decompressed;
use sluice_shard::{Checksum, ReadOptions, Sample, SampleIndex, SampleReader, ShardError};
use xxhash_rust::xxh3::Xxh3;

/// Why a whole-shard read did not give its samples.
#[derive(Debug)]
pub(super) enum Whole {
    /// The stored bytes are not the manifest's (another version, or rot).
    Mismatch(String),
    /// The read failed before the last byte.
    Read(String),
    /// The replica is down or restarting.
    Unavailable(String),
}

/// A reader shared by the tar parser and the drain that follows it, on one thread.
struct Shared<R>(Arc<Mutex<R>>);

impl<R> Clone for Shared<R> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<R: Read> Read for Shared<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("shard reader poisoned"))?
            .read(buf)
    }
}

/// Hashes every byte that passes.
struct Hashing<R> {
    inner: R,
    hash: Xxh3,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Reads a whole shard (its stored bytes, gzip or not) keeping the samples `start..end` and
/// their errors, and gives them only if the stored bytes, read to the last, hash to
/// `checksum`. Memory: the unit's samples; time: the whole shard, whatever the unit.
pub(super) fn read_whole_checked(
    body: Box<dyn Read + Send>,
    shard: Arc<str>,
    checksum: Checksum,
    (start, end): (u64, u64),
    options: &ReadOptions,
) -> Result<Vec<Result<Sample, ShardError>>, Whole> {
    let raw = Shared(Arc::new(Mutex::new(Hashing {
        inner: body,
        hash: Xxh3::new(),
    })));
    let tar = decompressed(io::BufReader::with_capacity(1 << 20, raw.clone()))
        .map_err(|e| Whole::Read(e.to_string()))?;
    let mut kept = Vec::new();
    for item in SampleReader::new(tar, shard, options) {
        let index = match &item {
            Ok(s) => Some(s.index),
            Err(ShardError::DamagedSample { index, .. }) => Some(*index),
            Err(ShardError::Io { .. }) => {
                return Err(Whole::Read(
                    item.err().map(|e| e.to_string()).unwrap_or_default(),
                ))
            }
            Err(_) => None,
        };
        match index {
            Some(i) if i < start => {}
            Some(i) if i >= end => break,
            _ => kept.push(item),
        }
    }
    // The parser stops at the unit's end or the archive's: the rest still counts.
    io::copy(&mut raw.clone(), &mut io::sink()).map_err(|e| Whole::Read(e.to_string()))?;
    let got = raw
        .0
        .lock()
        .map(|h| Checksum(h.hash.digest()))
        .map_err(|_| Whole::Read("shard reader poisoned".into()))?;
    if got != checksum {
        metrics::counter!("sluice_cpu_shard_checksum_mismatches_total").increment(1);
        return Err(Whole::Mismatch(format!(
            "does not match the manifest's checksum (manifest {checksum}, read {got})"
        )));
    }
    Ok(kept)
}

/// Checks bytes as they stream past: each sample's range against its index checksum, and
/// optionally the whole file against the manifest's checksum at the end.
pub(super) struct Verified<R> {
    inner: R,
    shard: Arc<str>,
    /// Stream position as a shard offset.
    pos: u64,
    checks: Vec<sluice_shard::IndexEntry>,
    /// Sample index of `checks[0]`.
    first_index: u64,
    next_check: usize,
    sample_hash: Xxh3,
    file_hash: Option<(Xxh3, Checksum)>,
    damage: Damage,
}

/// Samples whose bytes failed their checksum, by index, with what was found: shared by the
/// verifying readers that find them and the sample iterator that reports them. Whether any
/// was found stays true after they are reported, for the whole-shard check at the end.
#[derive(Clone, Default)]
pub(super) struct Damage(Arc<Mutex<(HashMap<u64, String>, bool)>>);

impl Damage {
    fn record(&self, index: u64, detail: String) {
        if let Ok(mut m) = self.0.lock() {
            m.0.insert(index, detail);
            m.1 = true;
        }
    }

    fn take(&self, index: u64) -> Option<String> {
        self.0.lock().ok()?.0.remove(&index)
    }

    fn any(&self) -> bool {
        self.0.lock().map(|m| m.1).unwrap_or(false)
    }
}

/// Decides whether a parsed sample may be delivered under its id.
pub(super) struct Admission {
    pub(super) index: Option<Arc<SampleIndex>>,
    pub(super) damage: Damage,
    /// Each sample's bytes were checked against its index entry's checksum as they passed
    /// ([`Verified`]): an admitted sample carries that checksum.
    pub(super) checked: bool,
}

impl Admission {
    /// A sample parsed as number `i` is sample `i` only if it lies exactly on index entry
    /// `i`'s byte range (and, verifying, that range matched its checksum, recorded in
    /// `damage` by the time the parser has read past the sample's end). A sample parsed
    /// elsewhere is another sample (the shard was rewritten or shifted): it is reported
    /// damaged under the id, never delivered as it.
    pub(super) fn admit(
        &self,
        sample: Result<sluice_shard::Sample, sluice_shard::ShardError>,
    ) -> Result<sluice_shard::Sample, sluice_shard::ShardError> {
        let mut s = sample?;
        let damaged = |s: sluice_shard::Sample, detail: String| {
            Err(sluice_shard::ShardError::DamagedSample {
                shard: s.shard.to_string(),
                offset: s.start,
                index: s.index,
                key: s.key,
                detail,
            })
        };
        if let Some(index) = &self.index {
            let Some(e) = index.entries.get(s.index as usize) else {
                let detail = format!(
                    "the shard changed since it was indexed: it has a sample {:?} past the \
                     index's {} (re-run sluice index)",
                    s.key,
                    index.entries.len()
                );
                metrics::counter!("sluice_cpu_damaged_samples_total").increment(1);
                return damaged(s, detail);
            };
            if (s.start, s.end) != (e.offset, e.offset + e.len) {
                let detail = format!(
                    "the shard changed since it was indexed: {:?} was read at bytes {}..{}, \
                     the index has sample {} at {}..{} (re-run sluice index)",
                    s.key,
                    s.start,
                    s.end,
                    s.index,
                    e.offset,
                    e.offset + e.len
                );
                // Its range's checksum mismatch, if one was recorded (and counted), is part
                // of the same story.
                if self.damage.take(s.index).is_none() {
                    metrics::counter!("sluice_cpu_damaged_samples_total").increment(1);
                }
                return damaged(s, detail);
            }
            if self.checked {
                s.checksum = Some(e.checksum);
            }
        }
        match self.damage.take(s.index) {
            Some(detail) => damaged(s, detail),
            None => Ok(s),
        }
    }
}

impl<R: Read> Verified<R> {
    pub(super) fn new(
        inner: R,
        shard: Arc<str>,
        start: u64,
        first_index: u64,
        checks: &[sluice_shard::IndexEntry],
        whole: Option<Checksum>,
        damage: &Damage,
    ) -> Self {
        Verified {
            inner,
            shard,
            pos: start,
            checks: checks.to_vec(),
            first_index,
            next_check: 0,
            sample_hash: Xxh3::new(),
            file_hash: whole.map(|c| (Xxh3::new(), c)),
            damage: damage.clone(),
        }
    }

    fn bad(&self, what: String) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} at byte {} of shard {}", what, self.pos, self.shard),
        )
    }
}

impl<R: Read> Read for Verified<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 {
            if let Some((hash, expected)) = &self.file_hash {
                let got = Checksum(hash.digest());
                // A damaged sample, already reported, explains a whole-shard mismatch.
                if got != *expected && !self.damage.any() {
                    return Err(self.bad(format!(
                        "shard checksum mismatch (manifest {expected}, read {got})"
                    )));
                }
                self.file_hash = None;
            }
            return Ok(0);
        }
        if let Some((hash, _)) = &mut self.file_hash {
            hash.update(&buf[..n]);
        }
        // Hash the parts of `buf` that fall inside sample ranges, checking each range as it
        // completes. Bytes between samples (directories, the end-of-archive) are not covered.
        let mut at = 0usize;
        while at < n {
            let Some(check) = self.checks.get(self.next_check).copied() else {
                break;
            };
            let here = self.pos + at as u64;
            let check_end = check.offset + check.len;
            if here < check.offset {
                at += ((check.offset - here) as usize).min(n - at);
                continue;
            }
            let take = ((check_end - here) as usize).min(n - at);
            self.sample_hash.update(&buf[at..at + take]);
            at += take;
            if self.pos + at as u64 == check_end {
                let got = self.sample_hash.digest();
                if got != check.checksum {
                    // The sample alone is lost; the stream (and the other samples) go on.
                    metrics::counter!("sluice_cpu_damaged_samples_total").increment(1);
                    self.damage.record(
                        self.first_index + self.next_check as u64,
                        format!(
                            "checksum mismatch (index {:016x}, read {got:016x}) in bytes {}..{check_end}",
                            check.checksum, check.offset
                        ),
                    );
                }
                self.sample_hash.reset();
                self.next_check += 1;
            }
        }
        self.pos += n as u64;
        Ok(n)
    }
}
