//! Sources: where a work unit's bytes come from, as a blocking byte stream that the tar reader
//! parses while it arrives (the engine's reader thread runs it, never a runtime thread).
//!
//! - local files (`/path`, `file:///path`);
//! - HTTP(S) URLs: any server, including a sluice storage node; a shard may list several
//!   replica URLs, tried in order when one is down or answers an error;
//! - `s3://bucket/key` through `object_store` (AWS S3 or any S3-compatible store: MinIO,
//!   AIStore, Ceph), with endpoint, region and credentials from [`S3Config`] or the usual
//!   `AWS_*` environment variables;
//! - a sample range is fetched with one `Range` request, located through the shard's `.idx`
//!   sidecar (the first replica's whose checksum is the manifest's, fetched once per shard and
//!   cached), and every sample's bytes are checked against the index's checksum as they
//!   stream past.
//!
//! No sample is delivered unverified (`verify.rs` says the rule). With an index, a sample is
//! delivered under an id only if the bytes parsed for it are exactly that id's indexed byte
//! range and that range matched its checksum (which covers the tar headers, so the key too).
//! Without a usable index on any replica, the whole shard is read and the unit's samples are
//! held until its last byte has matched the manifest's checksum; a replica whose bytes do not
//! is demoted, and when none does the unit's samples are skipped as changed, by name
//! (`source.verify = false` is the explicit opt-out). A replica whose `.idx` or bytes
//! disagree with the manifest where another's agree is demoted: tried last, logged once with
//! its URL, counted per replica. Anything else comes out as a `DamagedSample` error for that sample alone
//! (the engine reports it skipped, named; `open_unit_with_repair` first tries the other
//! replicas' copies) and reading goes on; a whole-shard checksum mismatch that such a sample
//! explains is not an error again. A shard whose size (or, from sluice storage, checksum
//! header) differs from the manifest's on every replica changed since it was indexed: the
//! unit's samples are skipped, named, with `ShardError::Changed`. A short body or any other
//! read error ends the unit (the client reassigns it).
//!
//! A replica that stops answering (a hung node, not a dead one) is given up on after
//! `stall_timeout` without a byte, and the read goes on from the next replica; a replica
//! that failed or stalled is tried last for `suspect_for`, so later units do not wait on it
//! again.

mod cache;
mod cache_dir;
mod open;
mod replicas;
mod s3;
mod streams;
mod together;
mod verify;

use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use object_store::ObjectStore;

use sluice_shard::{Checksum, ReadOptions, SampleIndex, ShardInfo};

pub use cache::{CacheConfig, CacheKey, ShardCache};
use replicas::Suspects;
pub use streams::fetch_nanos;
use streams::{Progress, Resuming, Timed};
pub use together::SharedSamples;

/// Why a source could not deliver.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: {detail}")]
    Request { url: String, detail: String },
    #[error("{url}: {source}")]
    Io {
        url: String,
        #[source]
        source: io::Error,
    },
    #[error("{url} changed since it was indexed: {detail}")]
    Changed { url: String, detail: String },
    #[error("every replica of {shard} failed: {}", errors.join("; "))]
    AllReplicasFailed { shard: String, errors: Vec<String> },
    /// The connection was refused or could not be made: the node is down or restarting.
    #[error("{url}: unreachable: {detail}")]
    Unreachable { url: String, detail: String },
    /// Every replica is down or restarting (503, refused connections): worth waiting for.
    #[error("every replica of {shard} is unavailable: {}", errors.join("; "))]
    Unavailable { shard: String, errors: Vec<String> },
    #[error("sample index of {shard}: {detail}")]
    Index { shard: String, detail: String },
    #[error("samples {start}..{end} are outside shard {shard} ({samples} samples)")]
    Range {
        shard: String,
        start: u64,
        end: u64,
        samples: u64,
    },
}

impl SourceError {
    /// The node is down or restarting rather than the object missing or wrong: a 502, 503
    /// or 504, or a connection that could not be made. Worth waiting for.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            SourceError::Status {
                status: 502..=504,
                ..
            } | SourceError::Unreachable { .. }
                | SourceError::Unavailable { .. }
        )
    }
}

/// A shard as a source sees it: its replicas and what the manifest says of it.
#[derive(Clone, Debug)]
pub struct ShardLocation {
    /// Replica URLs or paths, in order of preference.
    pub urls: Vec<String>,
    pub info: ShardInfo,
    /// Where the bytes read for it came from (shared by its clones: one unit's reads).
    pub tally: Arc<ReadTally>,
}

/// Bytes of shard data a unit read from the storage tier and from the worker's shard cache.
#[derive(Debug, Default)]
pub struct ReadTally {
    pub storage: AtomicU64,
    pub cached: AtomicU64,
}

impl ReadTally {
    /// (storage, cached) bytes so far.
    pub fn get(&self) -> (u64, u64) {
        (
            self.storage.load(Ordering::Relaxed),
            self.cached.load(Ordering::Relaxed),
        )
    }
}

impl ShardLocation {
    /// The same shard at the one URL `url` (a replica, or its `.idx`).
    fn only(&self, url: String) -> ShardLocation {
        ShardLocation {
            urls: vec![url],
            info: self.info.clone(),
            tally: self.tally.clone(),
        }
    }

    pub fn name(&self) -> &str {
        self.info.name()
    }
}

/// Where `s3://` URLs go. Unset fields fall back to the `AWS_*` environment variables.
#[derive(Clone, Debug, Default)]
pub struct S3Config {
    /// Endpoint of an S3-compatible store (`http://minio:9000`); unset for AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Allow a plain-HTTP endpoint.
    pub allow_http: bool,
}

/// Settings shared by sources.
#[derive(Clone, Debug)]
pub struct SourceConfig {
    /// Verify per-sample and whole-shard checksums.
    pub verify: bool,
    /// Largest `.idx` accepted.
    pub max_index_bytes: u64,
    /// Sidecar indexes kept in memory.
    pub index_cache: usize,
    pub read_options: ReadOptions,
    /// Connect timeout for HTTP.
    pub connect_timeout: std::time::Duration,
    /// An HTTP read (the response head, or any read of the body) that makes no progress for
    /// this long fails, and the unit goes on from the next replica.
    pub stall_timeout: std::time::Duration,
    /// How long a replica that failed or stalled is tried after the others.
    pub suspect_for: std::time::Duration,
    /// The least progress a read must make: bytes a second of waiting, over `slow_window` of
    /// waiting (0 turns it off). A replica that drips fails over like one that stalls.
    pub min_bytes_per_sec: u64,
    pub slow_window: std::time::Duration,
    /// How long a unit whose every replica is unavailable (503, refused connections: a node
    /// restarting) is tried again, with exponential backoff, before it fails.
    pub unavailable_for: std::time::Duration,
    pub s3: S3Config,
    /// Keep what is read on local disk for later epochs (see [`ShardCache`]).
    pub cache: Option<CacheConfig>,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            verify: true,
            max_index_bytes: 256 << 20,
            index_cache: 1024,
            read_options: ReadOptions::default(),
            connect_timeout: std::time::Duration::from_secs(5),
            stall_timeout: std::time::Duration::from_secs(10),
            suspect_for: std::time::Duration::from_secs(60),
            min_bytes_per_sec: 64 << 10,
            slow_window: std::time::Duration::from_secs(10),
            unavailable_for: std::time::Duration::from_secs(30),
            s3: S3Config::default(),
            cache: None,
        }
    }
}

/// Samples of a unit, as the engine consumes them.
pub type UnitSamples =
    Box<dyn Iterator<Item = Result<sluice_shard::Sample, sluice_shard::ShardError>> + Send>;

/// Opens shards from local paths, HTTP(S) and S3 URLs. Blocking: call it from a thread that
/// is not a tokio runtime worker (the engine's reader thread, or `spawn_blocking`).
pub struct ShardSource {
    config: SourceConfig,
    http: reqwest::blocking::Client,
    /// Sidecar indexes by (first URL, the manifest's checksum and size of the shard): a
    /// shard updated in place and re-indexed is a new key, never a stale hit.
    indexes: Mutex<HashMap<(String, Checksum, u64), Arc<SampleIndex>>>,
    /// Shards said to have no usable index (each said once).
    unindexed: Mutex<std::collections::HashSet<String>>,
    /// Replica origins that failed or stalled, and when.
    suspects: Arc<Suspects>,
    /// Started on the first `s3://` request: drives object_store's async IO.
    runtime: OnceLock<tokio::runtime::Runtime>,
    buckets: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
    cache: Option<ShardCache>,
    /// Field buffers of samples done with, read into again ([`ShardSource::spares`]).
    spares: Arc<sluice_shard::Spares>,
    /// Reads that units of a sweep share ([`ShardSource::open_unit_together`]).
    together: together::Together,
}

/// The field buffers a source keeps for reuse: a few hundred images' worth, about what its
/// units hold read ahead of the decoders.
const SPARE_FIELD_BYTES: usize = 128 << 20;

impl ShardSource {
    /// Whether it keeps a shard cache on local disk.
    pub fn caches(&self) -> bool {
        self.cache.is_some()
    }

    pub fn new(config: SourceConfig) -> Result<Self, SourceError> {
        let http = reqwest::blocking::Client::builder()
            .connect_timeout(config.connect_timeout)
            // reqwest's blocking timeout bounds each wait (the response head, then every
            // body read), not the whole transfer: a stall timeout, not a deadline.
            .timeout(config.stall_timeout)
            .build()
            .map_err(|e| {
                let cause = std::error::Error::source(&e)
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default();
                SourceError::Request {
                    url: "(any shard URL)".into(),
                    detail: format!(
                        "the HTTP client for shard reads could not be made ({e}{cause}); it \
                         needs the machine's CA certificates (/etc/ssl/certs)"
                    ),
                }
            })?;
        // A cache directory that cannot be used costs its hits, never the worker: it is
        // said (naming the directory and why) and shards are read from storage.
        let cache = config.cache.as_ref().and_then(|c| {
            ShardCache::open(&c.dir, c.capacity)
                .inspect_err(|e| {
                    metrics::counter!("sluice_cpu_cache_errors_total").increment(1);
                    tracing::error!(dir = %c.dir.display(), "shard cache off: the cache \
                        directory {} cannot be used ({e}); reading from storage uncached",
                        c.dir.display());
                })
                .ok()
        });
        Ok(ShardSource {
            cache,
            suspects: Arc::new(Suspects::new(config.suspect_for)),
            config,
            http,
            indexes: Mutex::new(HashMap::new()),
            unindexed: Mutex::new(Default::default()),
            runtime: OnceLock::new(),
            buckets: Mutex::new(HashMap::new()),
            spares: Arc::new(sluice_shard::Spares::new(SPARE_FIELD_BYTES)),
            together: together::Together::new(together::TOGETHER_BYTES),
        })
    }

    /// At most `bytes` of samples held for the units of a sweep's shared reads that have not
    /// taken them yet ([`ShardSource::open_unit_together`]; 64 MiB unless set): a unit
    /// further behind reads on its own.
    pub fn with_together_bytes(mut self, bytes: u64) -> Self {
        self.together.set_max_bytes(bytes);
        self
    }

    /// Where the samples it reads should go once done with: their fields' buffers are
    /// read into again rather than fresh pages ([`sluice_shard::spares`]).
    pub fn spares(&self) -> &Arc<sluice_shard::Spares> {
        &self.spares
    }

    /// The samples `start..end` of a shard, streamed and checked.
    pub fn open_unit(
        &self,
        loc: &ShardLocation,
        start: u64,
        end: u64,
    ) -> Result<UnitSamples, SourceError> {
        self.open_unit_from(loc, start, end)
            .map(|(samples, _)| samples)
    }

    /// [`ShardSource::open_unit`] that survives a replica failing mid-unit, and rot on one
    /// copy:
    /// - a read that fails part way (the node died, the link was cut) resumes on the next
    ///   replica from the sample after the last one read, so the unit goes on instead of
    ///   failing (each replica is tried once more at most; samples already read are not read
    ///   again);
    /// - a sample whose bytes fail their checksum is read again from each of the shard's
    ///   replicas in turn before it is reported damaged;
    /// - any fault in bytes from the worker's cache (a damaged sample, a tar header that does
    ///   not parse, a short or failed read) is a cache miss: the entry is dropped and the
    ///   unit goes on from storage at the sample that failed. Only damage that storage holds
    ///   is a skip.
    pub fn open_unit_with_repair(
        self: &Arc<Self>,
        loc: &ShardLocation,
        start: u64,
        end: u64,
    ) -> Result<UnitSamples, SourceError> {
        let (first, from_cache) = self.open_waiting(loc, start, end)?;
        // With one replica only a cached copy can be read again (from storage).
        if loc.urls.len() < 2 && self.cache.is_none() {
            return Ok(first);
        }
        let samples: UnitSamples = Box::new(Resuming {
            source: self.clone(),
            loc: loc.clone(),
            next: start,
            end,
            inner: first,
            resumes_left: loc.urls.len(),
            from_cache,
        });
        let (source, loc) = (self.clone(), loc.clone());
        Ok(Box::new(samples.map(move |item| {
            // (Damage in cached bytes never gets here: `Resuming` read them from storage.)
            if let Err(sluice_shard::ShardError::DamagedSample { index, detail, .. }) = &item {
                if let Some(good) = source.repair(&loc, *index) {
                    tracing::warn!(shard = %loc.name(), index, "sample {index} was damaged \
                        ({detail}); a replica's copy is good and was used");
                    return Ok(good);
                }
            }
            item
        })))
    }

    /// [`ShardSource::open_unit`], tried again while every replica is unavailable (a storage
    /// node restarting, a mountpath swapped), with exponential backoff from 100 ms to 5 s, for
    /// up to `unavailable_for`: a blip costs a pause, not the unit.
    fn open_waiting(
        &self,
        loc: &ShardLocation,
        start: u64,
        end: u64,
    ) -> Result<(UnitSamples, bool), SourceError> {
        let started = std::time::Instant::now();
        let mut wait = std::time::Duration::from_millis(100);
        loop {
            match self.open_unit_from(loc, start, end) {
                Err(e)
                    if e.is_unavailable()
                        && started.elapsed() + wait < self.config.unavailable_for =>
                {
                    metrics::counter!("sluice_cpu_source_unavailable_waits_total").increment(1);
                    tracing::warn!(shard = %loc.name(), "{e}; trying again in {wait:?} (for up \
                        to {:?} in all, source.unavailable_secs)", self.config.unavailable_for);
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(std::time::Duration::from_secs(5));
                }
                other => return other,
            }
        }
    }

    /// Opens `next..end` again for [`Resuming`], the replica list turned by one so that the
    /// replica after the one that failed is tried first.
    fn reopen(
        &self,
        loc: &mut ShardLocation,
        next: u64,
        end: u64,
    ) -> Result<(UnitSamples, bool), SourceError> {
        loc.urls.rotate_left(1);
        self.open_unit_from(loc, next, end)
    }

    /// The cached copy of `loc` failed at sample `next` (`why`): the entry is dropped, and
    /// `next..end` is opened again, from storage (into the cache again as it is read).
    fn uncache(
        &self,
        loc: &ShardLocation,
        next: u64,
        end: u64,
        why: &str,
    ) -> Result<(UnitSamples, bool), SourceError> {
        if let Some(cache) = &self.cache {
            cache.damaged(CacheKey::of(&loc.info), loc.name(), next, why);
        }
        self.open_unit_from(loc, next, end)
    }

    /// Sample `index` of `loc` from the first replica whose copy passes its checksum; the
    /// replicas whose copies failed it before that one are demoted (they serve wrong bytes
    /// where another serves right ones).
    fn repair(&self, loc: &ShardLocation, index: u64) -> Option<sluice_shard::Sample> {
        let mut bad: Vec<(String, String)> = Vec::new();
        for url in self.suspects.order(&loc.urls) {
            let one = loc.only(url.clone());
            match self.open_unit(&one, index, index + 1).map(|mut s| s.next()) {
                Ok(Some(Ok(sample))) => {
                    metrics::counter!("sluice_cpu_repaired_samples_total").increment(1);
                    for (url, detail) in bad {
                        self.suspects.demote(
                            &url,
                            &format!("its copy of sample {index} of {} {detail}", loc.name()),
                        );
                    }
                    return Some(sample);
                }
                Ok(Some(Err(e))) if e.is_damage() => bad.push((url, e.to_string())),
                _ => {}
            }
        }
        None
    }

    /// The shard's sidecar index (fetched once, then cached): the first replica's `.idx`, in
    /// replica order, that describes the manifest's shard. A replica whose `.idx` describes
    /// another version of the shard (or is not an index) is demoted; one that has no `.idx`
    /// is not.
    pub fn index(&self, loc: &ShardLocation) -> Result<Arc<SampleIndex>, SourceError> {
        let key = (
            loc.urls.first().cloned().unwrap_or_default(),
            loc.info.checksum,
            loc.info.size,
        );
        if let Some(i) = self.indexes.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(i);
        }
        let mut errors = Vec::new();
        for url in self.suspects.order(&loc.urls) {
            match self.index_from(loc, &url) {
                Ok(index) => {
                    let index = Arc::new(index);
                    if let Ok(mut m) = self.indexes.lock() {
                        if m.len() >= self.config.index_cache {
                            m.clear();
                        }
                        m.insert(key, index.clone());
                    }
                    return Ok(index);
                }
                Err((e, stale)) => {
                    if stale && loc.urls.len() > 1 {
                        self.suspects.demote(&url, &format!("its index {e}"));
                    }
                    errors.push(e);
                }
            }
        }
        Err(SourceError::Index {
            shard: loc.name().into(),
            detail: format!("no replica has a usable .idx: {}", errors.join("; ")),
        })
    }

    /// The `.idx` beside replica `url`, if it describes the manifest's shard; else why not,
    /// and whether it is another version's (`true`) rather than missing or unreachable.
    fn index_from(&self, loc: &ShardLocation, url: &str) -> Result<SampleIndex, (String, bool)> {
        let idx_url = SampleIndex::sidecar_url(url);
        // The index's bytes are not the unit's shard data: not in its tally.
        let one = ShardLocation {
            tally: Default::default(),
            ..loc.only(idx_url.clone())
        };
        let (body, _) = self
            .fetch(&one, None, Expect::default())
            .map_err(|e| (e.to_string(), false))?;
        let bytes = sluice_shard::index::read_bounded(body, self.config.max_index_bytes, &idx_url)
            .map_err(|e| (e.to_string(), false))?;
        let index = SampleIndex::decode(&bytes, &idx_url).map_err(|e| (e.to_string(), true))?;
        // A stale index (another version of the shard) is unusable; one of these very bytes
        // whose count disagrees with the manifest is checked by `open_unit`, which refuses.
        if index.shard_checksum != loc.info.checksum {
            return Err((
                format!(
                    "{idx_url} describes a different shard ({} samples, {}) than the manifest \
                     ({} samples, {})",
                    index.entries.len(),
                    index.shard_checksum,
                    loc.info.samples,
                    loc.info.checksum
                ),
                true,
            ));
        }
        Ok(index)
    }

    /// Says once per shard (while the index cache holds it) that it is read without an index.
    fn warn_unindexed(&self, loc: &ShardLocation, why: &SourceError) {
        let Ok(mut warned) = self.unindexed.lock() else {
            return;
        };
        if warned.len() >= self.config.index_cache {
            warned.clear();
        }
        if warned.insert(loc.name().to_string()) {
            tracing::warn!(shard = %loc.name(), "{why}: each unit is read with the whole shard \
                and delivered only once the shard matches the manifest's checksum");
        }
    }

    /// Opens the bytes `range` (offset, len) of an object, trying each replica in turn, those
    /// that failed or stalled lately last. A replica whose object is not what `expect` says
    /// (another size, or a checksum header, sluice storage's `X-Sluice-Checksum`, naming
    /// another version) is skipped as changed before any byte is read; when every replica
    /// is, the error is `Changed`.
    fn fetch(
        &self,
        loc: &ShardLocation,
        range: Option<(u64, u64)>,
        expect: Expect,
    ) -> Result<(Box<dyn Read + Send>, bool), SourceError> {
        let (offset, len) = range.unwrap_or((0, loc.info.size));
        let Some(cache) = self.cache.as_ref().filter(|_| expect.cached) else {
            let body = self.fetch_replicas(loc, range, expect)?;
            loc.tally.storage.fetch_add(len, Ordering::Relaxed);
            return Ok((body, false));
        };
        let key = CacheKey::of(&loc.info);
        if let Some(cached) = cache.read(key, offset, len) {
            loc.tally.cached.fetch_add(len, Ordering::Relaxed);
            return Ok((cached, true));
        }
        let body = self.fetch_replicas(loc, range, expect)?;
        loc.tally.storage.fetch_add(len, Ordering::Relaxed);
        Ok((cache.fill(key, offset, len, body), false))
    }

    /// [`ShardSource::fetch`] from the shard's replicas.
    fn fetch_replicas(
        &self,
        loc: &ShardLocation,
        range: Option<(u64, u64)>,
        expect: Expect,
    ) -> Result<Box<dyn Read + Send>, SourceError> {
        let mut errors = Vec::new();
        let mut changed = 0;
        let urls = self.suspects.order(&loc.urls);
        for (i, url) in urls.iter().enumerate() {
            match self.fetch_one(url, range, expect) {
                Ok(r) => {
                    return Ok(Box::new(Timed {
                        inner: r,
                        url: url.clone(),
                        suspects: self.suspects.clone(),
                        slow: Progress::new(self.config.min_bytes_per_sec, self.config.slow_window),
                    }))
                }
                Err(e) => {
                    metrics::counter!("sluice_cpu_source_failovers_total").increment(1);
                    match &e {
                        SourceError::Changed { .. } => changed += 1,
                        // The node answered: this object is missing there, the node is not
                        // down or hung (a 503, an unavailable mountpath, does make it suspect).
                        SourceError::Status {
                            status: 404 | 416, ..
                        } => {}
                        _ => self.suspects.failed(url, &e.to_string()),
                    }
                    if i + 1 < urls.len() {
                        tracing::warn!(shard = %loc.name(), %url, "{e}; trying the next replica");
                    }
                    errors.push(e);
                }
            }
        }
        if changed == errors.len() && changed > 0 {
            return Err(errors.swap_remove(0));
        }
        if !errors.is_empty() && errors.iter().all(SourceError::is_unavailable) {
            return Err(SourceError::Unavailable {
                shard: loc.name().into(),
                errors: errors.iter().map(ToString::to_string).collect(),
            });
        }
        let mut errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
        if errors.len() == 1 {
            return Err(SourceError::Request {
                url: loc.urls[0].clone(),
                detail: errors.remove(0),
            });
        }
        Err(SourceError::AllReplicasFailed {
            shard: loc.name().into(),
            errors,
        })
    }

    fn fetch_one(
        &self,
        url: &str,
        range: Option<(u64, u64)>,
        expect: Expect,
    ) -> Result<Box<dyn Read + Send>, SourceError> {
        let changed = |detail: String| SourceError::Changed {
            url: url.into(),
            detail,
        };
        // The object's total size as this replica has it, against the manifest's.
        let check_size = |size: u64| match expect.size {
            Some(want) if want != size => Err(changed(format!(
                "it is {size} bytes, the manifest says {want}"
            ))),
            _ => Ok(()),
        };
        if let Some(rest) = url.strip_prefix("s3://") {
            return self.fetch_s3(url, rest, range);
        }
        if url.starts_with("http://") || url.starts_with("https://") {
            let mut req = self.http.get(url);
            if let Some((offset, len)) = range {
                req = req.header(
                    reqwest::header::RANGE,
                    format!("bytes={}-{}", offset, offset + len - 1),
                );
            }
            let resp = req.send().map_err(|e| {
                if e.is_connect() {
                    return SourceError::Unreachable {
                        url: url.into(),
                        detail: e.to_string(),
                    };
                }
                SourceError::Request {
                    url: url.into(),
                    detail: if e.is_timeout() {
                        metrics::counter!("sluice_cpu_source_stalls_total").increment(1);
                        format!(
                            "no response in {:.1} s (source.stall_timeout_secs)",
                            self.config.stall_timeout.as_secs_f64()
                        )
                    } else {
                        e.to_string()
                    },
                }
            })?;
            let status = resp.status().as_u16();
            let stated = resp
                .headers()
                .get("x-sluice-checksum")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<Checksum>().ok());
            if let (Some(stated), Some(want)) = (stated, expect.checksum) {
                if stated != want && (200..300).contains(&status) {
                    return Err(changed(format!(
                        "the server has {stated}, the manifest says {want}"
                    )));
                }
            }
            // The whole object's size: a 200's length, or a 206's `Content-Range` total.
            let total = match status {
                200 => resp.content_length(),
                206 => resp
                    .headers()
                    .get(reqwest::header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.rsplit_once('/'))
                    .and_then(|(_, total)| total.parse().ok()),
                _ => None,
            };
            if let Some(total) = total {
                check_size(total)?;
            }
            match (range, status) {
                (Some(_), 206) | (None, 200) => Ok(Box::new(resp)),
                (Some((offset, len)), 200) => {
                    // The server ignored Range: skip to the offset ourselves.
                    let mut resp = resp;
                    io::copy(&mut (&mut resp).take(offset), &mut io::sink()).map_err(|source| {
                        SourceError::Io {
                            url: url.into(),
                            source,
                        }
                    })?;
                    Ok(Box::new(resp.take(len)))
                }
                _ => Err(SourceError::Status {
                    url: url.into(),
                    status,
                }),
            }
        } else {
            let path = url.strip_prefix("file://").unwrap_or(url);
            let mut file = std::fs::File::open(path).map_err(|source| SourceError::Io {
                url: url.into(),
                source,
            })?;
            let size = file.metadata().map_err(|source| SourceError::Io {
                url: url.into(),
                source,
            })?;
            check_size(size.len())?;
            match range {
                Some((offset, len)) => {
                    use std::io::Seek;
                    file.seek(io::SeekFrom::Start(offset))
                        .map_err(|source| SourceError::Io {
                            url: url.into(),
                            source,
                        })?;
                    Ok(Box::new(file.take(len)))
                }
                None => Ok(Box::new(file)),
            }
        }
    }
}

/// What an object fetched must be, checked before its first byte is read.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Expect {
    /// Its whole size.
    pub size: Option<u64>,
    /// Its checksum, where the server states one.
    pub checksum: Option<Checksum>,
    /// Its bytes are checked sample by sample against the shard's index, so they may come
    /// from (and go to) the worker's shard cache.
    pub cached: bool,
}

/// A unit of a shard that changed since it was indexed on every replica: one `Changed`
/// error, so the worker reports each of the unit's samples skipped with it.
pub(super) fn changed(loc: &ShardLocation, detail: String) -> UnitSamples {
    metrics::counter!("sluice_cpu_changed_shards_total").increment(1);
    Box::new(std::iter::once(Err(sluice_shard::ShardError::Changed {
        shard: loc.name().into(),
        detail,
    })))
}
