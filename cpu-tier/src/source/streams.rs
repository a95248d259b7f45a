//! The streams a unit is read through: timed (and given up on when it stalls), resumed on the
//! next replica when a read fails part way, and ended after the unit's last sample.

use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::replicas::Suspects;
use super::{ShardLocation, ShardSource, UnitSamples};

/// Time spent blocked on source bytes, summed over all readers (the "fetch" stage; the
/// engine's read time minus this is the tar parse).
static FETCH_NS: AtomicU64 = AtomicU64::new(0);

/// A unit's samples that go on from the next replica when a read fails part way: the
/// stream's error is a read error (not damage in the shard, which every replica would have
/// alike), so the unit is opened again from the sample after the last one it yielded.
pub(super) struct Resuming {
    pub(super) source: Arc<ShardSource>,
    pub(super) loc: ShardLocation,
    /// The first sample not yet yielded.
    pub(super) next: u64,
    pub(super) end: u64,
    pub(super) inner: UnitSamples,
    pub(super) resumes_left: usize,
    /// `inner` reads the worker's cached copy: any fault in it is the cache's.
    pub(super) from_cache: bool,
}

impl Iterator for Resuming {
    type Item = Result<sluice_shard::Sample, sluice_shard::ShardError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let item = self.inner.next()?;
            if self.from_cache {
                if let Err(e) = &item {
                    // Damage, a header that does not parse, a short read: the cache was
                    // wrong, not the shard. The rest comes from storage, from the sample that
                    // failed (or the first not yielded).
                    let at = match e {
                        sluice_shard::ShardError::DamagedSample { index, .. } => *index,
                        _ => self.next,
                    }
                    .max(self.next);
                    self.from_cache = false;
                    match self.source.uncache(&self.loc, at, self.end, &e.to_string()) {
                        Ok((rest, cached)) => {
                            self.next = at;
                            self.inner = rest;
                            self.from_cache = cached;
                            continue;
                        }
                        // Storage cannot serve the rest now: the unit fails (and is read
                        // again, here or elsewhere) rather than skip what the cache spoiled.
                        Err(reopen) => {
                            return Some(Err(sluice_shard::ShardError::Io {
                                shard: self.loc.name().into(),
                                offset: 0,
                                source: io::Error::other(format!(
                                    "the cached copy failed ({e}) and storage could not be \
                                     read instead: {reopen}"
                                )),
                            }))
                        }
                    }
                }
            }
            let failed_read = match &item {
                Ok(s) => {
                    self.next = s.index + 1;
                    false
                }
                Err(sluice_shard::ShardError::DamagedSample { index, .. }) => {
                    self.next = index + 1;
                    false
                }
                Err(sluice_shard::ShardError::Io { .. }) => true,
                Err(_) => false,
            };
            if !failed_read || self.next >= self.end || self.resumes_left == 0 {
                return Some(item);
            }
            self.resumes_left -= 1;
            let failed = self.loc.urls.first().cloned().unwrap_or_default();
            match self.source.reopen(&mut self.loc, self.next, self.end) {
                Ok((rest, cached)) => {
                    self.from_cache = cached;
                    metrics::counter!("sluice_cpu_source_resumes_total").increment(1);
                    if let Err(e) = &item {
                        tracing::warn!(shard = %self.loc.name(), sample = self.next, %failed,
                            "reading failed mid-unit ({e}); resuming on the next replica");
                    }
                    self.inner = rest;
                }
                // No replica can serve the rest: the read error stands, and the client
                // reassigns the unit.
                Err(_) => return Some(item),
            }
        }
    }
}

/// Nanoseconds spent waiting for source bytes since the process started.
pub fn fetch_nanos() -> u64 {
    FETCH_NS.load(Ordering::Relaxed)
}

/// Counts the time reads of a source body take; a read that fails (a stall past the timeout,
/// a cut) makes its replica a suspect. So does a body that makes too little progress: once
/// reads have waited `slow.window` in all, they must have brought `slow.min_rate` bytes a
/// second of that waiting, or the read fails as a stall would (a replica that drips a byte
/// every few seconds never trips the stall timeout). Only time spent waiting inside `read`
/// counts, so a slow consumer never makes a source look slow.
pub(super) struct Timed<R> {
    pub(super) inner: R,
    pub(super) url: String,
    pub(super) suspects: Arc<Suspects>,
    pub(super) slow: Progress,
}

/// The least progress a source body must make (see [`Timed`]), and what it made so far in
/// the current window.
#[derive(Clone, Copy, Debug)]
pub(super) struct Progress {
    /// Bytes a second of waiting; 0 turns the check off.
    pub(super) min_rate: u64,
    pub(super) window: Duration,
    waited: Duration,
    bytes: u64,
}

impl Progress {
    pub(super) fn new(min_rate: u64, window: Duration) -> Self {
        Progress {
            min_rate,
            window,
            waited: Duration::ZERO,
            bytes: 0,
        }
    }

    /// Counts a read; `Err` with the figures once a window's waiting brought too little.
    fn record(&mut self, waited: Duration, bytes: usize) -> Result<(), String> {
        if self.min_rate == 0 {
            return Ok(());
        }
        self.waited += waited;
        self.bytes += bytes as u64;
        if self.waited < self.window {
            return Ok(());
        }
        let secs = self.waited.as_secs_f64();
        let (got, waited) = (self.bytes, self.waited);
        self.waited = Duration::ZERO;
        self.bytes = 0;
        if (got as f64) < self.min_rate as f64 * secs {
            return Err(format!(
                "{got} bytes in {:.1} s of waiting, under source.min_bytes_per_sec = {}",
                waited.as_secs_f64(),
                self.min_rate
            ));
        }
        Ok(())
    }
}

impl<R: Read> Read for Timed<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let started = Instant::now();
        let n = self.inner.read(buf).inspect_err(|e| {
            if e.kind() == io::ErrorKind::TimedOut || e.to_string().contains("timed out") {
                metrics::counter!("sluice_cpu_source_stalls_total").increment(1);
            }
            self.suspects
                .failed(&self.url, &format!("reading {} failed ({e})", self.url));
        })?;
        let waited = started.elapsed();
        let ns = waited.as_nanos() as u64;
        FETCH_NS.fetch_add(ns, Ordering::Relaxed);
        metrics::counter!("sluice_cpu_fetch_nanoseconds_total").increment(ns);
        metrics::counter!("sluice_cpu_fetched_bytes_total").increment(n as u64);
        if let Err(why) = self.slow.record(waited, n) {
            metrics::counter!("sluice_cpu_source_stalls_total").increment(1);
            let why = format!("reading {} is too slow: {why}", self.url);
            self.suspects.failed(&self.url, &why);
            return Err(io::Error::new(io::ErrorKind::TimedOut, why));
        }
        Ok(n)
    }
}

/// Ends a sample stream after the sample with index `end - 1`, without reading further.
pub(super) trait TakeUntilEnd:
    Iterator<Item = Result<sluice_shard::Sample, sluice_shard::ShardError>> + Sized
{
    fn take_while_inclusive_end(self, end: u64) -> UntilEnd<Self> {
        UntilEnd {
            inner: self,
            end,
            done: false,
        }
    }
}

impl<I: Iterator<Item = Result<sluice_shard::Sample, sluice_shard::ShardError>>> TakeUntilEnd
    for I
{
}

pub(super) struct UntilEnd<I> {
    inner: I,
    end: u64,
    done: bool,
}

impl<I: Iterator<Item = Result<sluice_shard::Sample, sluice_shard::ShardError>>> Iterator
    for UntilEnd<I>
{
    type Item = I::Item;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.inner.next()?;
        match &item {
            Ok(s) if s.index + 1 >= self.end => self.done = true,
            Err(sluice_shard::ShardError::DamagedSample { index, .. }) => {
                self.done = *index + 1 >= self.end;
            }
            Err(_) => self.done = true,
            _ => {}
        }
        Some(item)
    }
}
