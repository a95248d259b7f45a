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
//!   sidecar (fetched once per shard and cached), and every sample's bytes are checked against
//!   the index's checksum as they stream past; a whole shard is also checked against the
//!   manifest's checksum when its last byte has arrived.
//!
//! A sample is delivered under an id only if the bytes parsed for it are exactly that id's
//! indexed byte range and that range matched its checksum (which covers the tar headers, so
//! the key too). Anything else comes out as a `DamagedSample` error for that sample alone
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

use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore};

use sluice_shard::read::decompressed;
use sluice_shard::{Checksum, Compression, ReadOptions, SampleIndex, SampleReader, ShardInfo};
use xxhash_rust::xxh3::Xxh3;

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

/// A shard as a source sees it: its replicas and what the manifest says of it.
#[derive(Clone, Debug)]
pub struct ShardLocation {
    /// Replica URLs or paths, in order of preference.
    pub urls: Vec<String>,
    pub info: ShardInfo,
}

impl ShardLocation {
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
    pub s3: S3Config,
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
            s3: S3Config::default(),
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
    /// Replica origins that failed or stalled, and when.
    suspects: Arc<Suspects>,
    /// Started on the first `s3://` request: drives object_store's async IO.
    runtime: OnceLock<tokio::runtime::Runtime>,
    buckets: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

impl ShardSource {
    pub fn new(config: SourceConfig) -> Result<Self, SourceError> {
        let http = reqwest::blocking::Client::builder()
            .connect_timeout(config.connect_timeout)
            // reqwest's blocking timeout bounds each wait (the response head, then every
            // body read), not the whole transfer: a stall timeout, not a deadline.
            .timeout(config.stall_timeout)
            .build()
            .map_err(|e| SourceError::Request {
                url: String::new(),
                detail: e.to_string(),
            })?;
        Ok(ShardSource {
            suspects: Arc::new(Suspects::new(config.suspect_for)),
            config,
            http,
            indexes: Mutex::new(HashMap::new()),
            runtime: OnceLock::new(),
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// The samples `start..end` of a shard, streamed and checked.
    pub fn open_unit(
        &self,
        loc: &ShardLocation,
        start: u64,
        end: u64,
    ) -> Result<UnitSamples, SourceError> {
        if start >= end || end > loc.info.samples {
            return Err(SourceError::Range {
                shard: loc.name().into(),
                start,
                end,
                samples: loc.info.samples,
            });
        }
        let whole = start == 0 && end == loc.info.samples;
        let ranged = !whole && loc.info.compression == Compression::None;
        // Without a usable index the unit still reads, from the start of the shard, checked
        // against the manifest's whole-shard checksum; the counter tells an operator.
        let index = if self.config.verify || ranged {
            self.index(loc)
                .map_err(|_| metrics::counter!("sluice_cpu_index_unavailable_total").increment(1))
                .ok()
        } else {
            None
        };
        // A manifest that understates (or overstates) a shard would silently leave samples
        // out of training (or ask for ones that are not there): the index is the shard's own
        // count, so a disagreement is an error naming both.
        if let Some(index) = &index {
            if index.entries.len() as u64 != loc.info.samples {
                return Err(SourceError::Index {
                    shard: loc.name().into(),
                    detail: format!(
                        "the manifest says {} samples, the shard's index lists {}: re-run \
                         sluice index",
                        loc.info.samples,
                        index.entries.len()
                    ),
                });
            }
        }
        let name: Arc<str> = loc.name().into();
        let damage = Damage::default();
        let (stream, options): (Box<dyn Read + Send>, ReadOptions) = match (&index, ranged) {
            (Some(index), true) => {
                let (offset, len) =
                    index
                        .byte_range(start, end)
                        .ok_or_else(|| SourceError::Index {
                            shard: loc.name().into(),
                            detail: format!("has no samples {start}..{end}"),
                        })?;
                let expect = Expect {
                    size: None,
                    checksum: Some(loc.info.checksum),
                };
                let body = match self.fetch(loc, Some((offset, len)), expect) {
                    Err(SourceError::Changed { detail, .. }) => return Ok(changed(loc, detail)),
                    other => other?,
                };
                let checks = &index.entries[start as usize..end as usize];
                let body: Box<dyn Read + Send> = if self.config.verify {
                    Box::new(Verified::new(
                        body,
                        name.clone(),
                        offset,
                        start,
                        checks,
                        None,
                        &damage,
                    ))
                } else {
                    Box::new(body.take(len))
                };
                let options = ReadOptions {
                    start_offset: offset,
                    first_index: start,
                    ..self.config.read_options.clone()
                };
                (body, options)
            }
            _ => {
                // A whole shard, a gzip shard, or no index: stream from the start, and skip
                // to the range. The file checksum covers the stored (maybe compressed) bytes;
                // sample checksums cover the tar stream.
                // Without an index no sample can be checked before it is delivered: a shard
                // whose size is not the manifest's is refused whole. With one, each sample
                // is admitted on its own (a shard cut short still yields its intact prefix).
                let expect = Expect {
                    size: index.is_none().then_some(loc.info.size),
                    checksum: Some(loc.info.checksum),
                };
                let body = match self.fetch(loc, None, expect) {
                    Err(SourceError::Changed { detail, .. }) => return Ok(changed(loc, detail)),
                    other => other?,
                };
                let verify = self.config.verify;
                let body: Box<dyn Read + Send> = if verify {
                    Box::new(Verified::new(
                        body,
                        name.clone(),
                        0,
                        0,
                        &[],
                        Some(loc.info.checksum),
                        &damage,
                    ))
                } else {
                    body
                };
                let tar = decompressed(io::BufReader::with_capacity(1 << 20, body)).map_err(
                    |source| SourceError::Io {
                        url: loc.name().into(),
                        source,
                    },
                )?;
                let tar: Box<dyn Read + Send> = match (&index, verify) {
                    (Some(index), true) => Box::new(Verified::new(
                        tar,
                        name.clone(),
                        0,
                        0,
                        &index.entries,
                        None,
                        &damage,
                    )),
                    _ => tar,
                };
                (tar, self.config.read_options.clone())
            }
        };
        let reader = SampleReader::new(stream, name, &options);
        let admission = Admission { index, damage };
        Ok(Box::new(
            reader
                .map(move |s| admission.admit(s))
                .filter(move |s| match s {
                    Ok(s) => s.index >= start,
                    Err(sluice_shard::ShardError::DamagedSample { index, .. }) => *index >= start,
                    Err(_) => true,
                })
                .take_while_inclusive_end(end),
        ))
    }

    /// [`ShardSource::open_unit`] that survives a replica failing mid-unit, and rot on one
    /// copy:
    /// - a read that fails part way (the node died, the link was cut) resumes on the next
    ///   replica from the sample after the last one read, so the unit goes on instead of
    ///   failing (each replica is tried once more at most; samples already read are not read
    ///   again);
    /// - a sample whose bytes fail their checksum is read again from each of the shard's
    ///   replicas in turn before it is reported damaged.
    pub fn open_unit_with_repair(
        self: &Arc<Self>,
        loc: &ShardLocation,
        start: u64,
        end: u64,
    ) -> Result<UnitSamples, SourceError> {
        let first = self.open_unit(loc, start, end)?;
        if loc.urls.len() < 2 {
            return Ok(first);
        }
        let samples: UnitSamples = Box::new(Resuming {
            source: self.clone(),
            loc: loc.clone(),
            next: start,
            end,
            inner: first,
            resumes_left: loc.urls.len(),
        });
        let (source, loc) = (self.clone(), loc.clone());
        Ok(Box::new(samples.map(move |item| {
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

    /// Opens `next..end` again for [`Resuming`], the replica list turned by one so that the
    /// replica after the one that failed is tried first.
    fn reopen(
        &self,
        loc: &mut ShardLocation,
        next: u64,
        end: u64,
    ) -> Result<UnitSamples, SourceError> {
        loc.urls.rotate_left(1);
        self.open_unit(loc, next, end)
    }

    /// Sample `index` of `loc` from the first replica whose copy passes its checksum.
    fn repair(&self, loc: &ShardLocation, index: u64) -> Option<sluice_shard::Sample> {
        loc.urls.iter().find_map(|url| {
            let one = ShardLocation {
                urls: vec![url.clone()],
                info: loc.info.clone(),
            };
            let sample = self.open_unit(&one, index, index + 1).ok()?.next()?.ok()?;
            metrics::counter!("sluice_cpu_repaired_samples_total").increment(1);
            Some(sample)
        })
    }

    /// The shard's sidecar index (fetched once, then cached).
    pub fn index(&self, loc: &ShardLocation) -> Result<Arc<SampleIndex>, SourceError> {
        let key = (
            loc.urls.first().cloned().unwrap_or_default(),
            loc.info.checksum,
            loc.info.size,
        );
        if let Some(i) = self.indexes.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(i);
        }
        let idx_loc = ShardLocation {
            urls: loc
                .urls
                .iter()
                .map(|u| SampleIndex::sidecar_url(u))
                .collect(),
            info: loc.info.clone(),
        };
        let body = self.fetch(&idx_loc, None, Expect::default())?;
        let bytes =
            sluice_shard::index::read_bounded(body, self.config.max_index_bytes, &idx_loc.urls[0])
                .map_err(|e| SourceError::Index {
                    shard: loc.name().into(),
                    detail: e.to_string(),
                })?;
        let index =
            SampleIndex::decode(&bytes, &idx_loc.urls[0]).map_err(|e| SourceError::Index {
                shard: loc.name().into(),
                detail: e.to_string(),
            })?;
        // A stale index (another version of the shard) is unusable; one of these very bytes
        // whose count disagrees with the manifest is checked by `open_unit`, which refuses.
        if index.shard_checksum != loc.info.checksum {
            return Err(SourceError::Index {
                shard: loc.name().into(),
                detail: format!(
                    "describes a different shard ({} samples, {}) than the manifest ({} samples, {})",
                    index.entries.len(),
                    index.shard_checksum,
                    loc.info.samples,
                    loc.info.checksum
                ),
            });
        }
        let index = Arc::new(index);
        if let Ok(mut m) = self.indexes.lock() {
            if m.len() >= self.config.index_cache {
                m.clear();
            }
            m.insert(key, index.clone());
        }
        Ok(index)
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
            let resp = req.send().map_err(|e| SourceError::Request {
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

impl ShardSource {
    fn runtime(&self) -> Result<&tokio::runtime::Runtime, SourceError> {
        if let Some(rt) = self.runtime.get() {
            return Ok(rt);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sluice-s3")
            .enable_all()
            .build()
            .map_err(|e| SourceError::Request {
                url: "s3://".into(),
                detail: format!("starting the S3 runtime: {e}"),
            })?;
        Ok(self.runtime.get_or_init(|| rt))
    }

    fn bucket(&self, name: &str) -> Result<Arc<dyn ObjectStore>, SourceError> {
        let mut buckets = self.buckets.lock().map_err(|_| SourceError::Request {
            url: format!("s3://{name}"),
            detail: "bucket cache poisoned".into(),
        })?;
        if let Some(b) = buckets.get(name) {
            return Ok(b.clone());
        }
        let c = &self.config.s3;
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(name)
            .with_allow_http(c.allow_http);
        if let Some(e) = &c.endpoint {
            builder = builder.with_endpoint(e);
        }
        if let Some(r) = &c.region {
            builder = builder.with_region(r);
        }
        if let Some(k) = &c.access_key_id {
            builder = builder.with_access_key_id(k);
        }
        if let Some(k) = &c.secret_access_key {
            builder = builder.with_secret_access_key(k);
        }
        let store: Arc<dyn ObjectStore> =
            Arc::new(builder.build().map_err(|e| SourceError::Request {
                url: format!("s3://{name}"),
                detail: e.to_string(),
            })?);
        buckets.insert(name.to_string(), store.clone());
        Ok(store)
    }

    fn fetch_s3(
        &self,
        url: &str,
        bucket_key: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Box<dyn Read + Send>, SourceError> {
        let (bucket, key) = bucket_key
            .split_once('/')
            .filter(|(b, k)| !b.is_empty() && !k.is_empty())
            .ok_or_else(|| SourceError::Request {
                url: url.into(),
                detail: "expected s3://bucket/key".into(),
            })?;
        let store = self.bucket(bucket)?;
        let rt = self.runtime()?;
        let options = GetOptions {
            range: range.map(|(o, l)| GetRange::Bounded(o..o + l)),
            ..GetOptions::default()
        };
        let path = ObjectPath::from(key);
        let result =
            rt.block_on(store.get_opts(&path, options))
                .map_err(|e| SourceError::Request {
                    url: url.into(),
                    detail: e.to_string(),
                })?;
        Ok(Box::new(S3Body {
            runtime: rt.handle().clone(),
            stream: result.into_stream(),
            chunk: bytes::Bytes::new(),
        }))
    }
}

/// An object_store byte stream read as a blocking `Read`.
struct S3Body {
    runtime: tokio::runtime::Handle,
    stream: futures_util::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
    chunk: bytes::Bytes,
}

impl Read for S3Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use futures_util::StreamExt;
        while self.chunk.is_empty() {
            match self.runtime.block_on(self.stream.next()) {
                Some(Ok(b)) => self.chunk = b,
                Some(Err(e)) => return Err(io::Error::other(e)),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

/// What an object fetched must be, checked before its first byte is read.
#[derive(Clone, Copy, Debug, Default)]
struct Expect {
    /// Its whole size.
    size: Option<u64>,
    /// Its checksum, where the server states one.
    checksum: Option<Checksum>,
}

/// A unit of a shard that changed since it was indexed on every replica: one `Changed`
/// error, so the worker reports each of the unit's samples skipped with it.
fn changed(loc: &ShardLocation, detail: String) -> UnitSamples {
    metrics::counter!("sluice_cpu_changed_shards_total").increment(1);
    Box::new(std::iter::once(Err(sluice_shard::ShardError::Changed {
        shard: loc.name().into(),
        detail,
    })))
}

/// Replica origins (`http://host:port`) that failed or stalled lately. A hung node answers
/// nothing until the stall timeout; trying it last keeps every later unit from waiting on it
/// again, and it is tried first again once `suspect_for` has passed.
struct Suspects {
    suspect_for: std::time::Duration,
    failed: Mutex<HashMap<String, Instant>>,
}

impl Suspects {
    fn new(suspect_for: std::time::Duration) -> Self {
        Suspects {
            suspect_for,
            failed: Mutex::new(HashMap::new()),
        }
    }

    /// `http://host:port` of a URL; local paths have none.
    fn origin(url: &str) -> Option<&str> {
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))?;
        let end = rest
            .find('/')
            .map_or(url.len(), |i| url.len() - rest.len() + i);
        Some(&url[..end])
    }

    fn failed(&self, url: &str, why: &str) {
        let Some(origin) = Self::origin(url) else {
            return;
        };
        if let Ok(mut m) = self.failed.lock() {
            let fresh = m.insert(origin.to_string(), Instant::now()).is_none();
            if fresh {
                tracing::warn!(
                    replica = origin,
                    "{why}: reading from its other replicas \
                    first for {:.0} s",
                    self.suspect_for.as_secs_f64()
                );
            }
        }
    }

    /// `urls`, those whose origin failed within `suspect_for` moved last (order kept).
    fn order(&self, urls: &[String]) -> Vec<String> {
        let Ok(mut m) = self.failed.lock() else {
            return urls.to_vec();
        };
        m.retain(|_, at| at.elapsed() < self.suspect_for);
        if m.is_empty() {
            return urls.to_vec();
        }
        let suspect = |u: &String| Self::origin(u).is_some_and(|o| m.contains_key(o));
        let (mut good, bad): (Vec<String>, Vec<String>) =
            urls.iter().cloned().partition(|u| !suspect(u));
        good.extend(bad);
        good
    }
}

/// Time spent blocked on source bytes, summed over all readers (the "fetch" stage; the
/// engine's read time minus this is the tar parse).
static FETCH_NS: AtomicU64 = AtomicU64::new(0);

/// A unit's samples that go on from the next replica when a read fails part way: the
/// stream's error is a read error (not damage in the shard, which every replica would have
/// alike), so the unit is opened again from the sample after the last one it yielded.
struct Resuming {
    source: Arc<ShardSource>,
    loc: ShardLocation,
    /// The first sample not yet yielded.
    next: u64,
    end: u64,
    inner: UnitSamples,
    resumes_left: usize,
}

impl Iterator for Resuming {
    type Item = Result<sluice_shard::Sample, sluice_shard::ShardError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let item = self.inner.next()?;
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
                Ok(rest) => {
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
/// a cut) makes its replica a suspect.
struct Timed<R> {
    inner: R,
    url: String,
    suspects: Arc<Suspects>,
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
        let ns = started.elapsed().as_nanos() as u64;
        FETCH_NS.fetch_add(ns, Ordering::Relaxed);
        metrics::counter!("sluice_cpu_fetch_nanoseconds_total").increment(ns);
        metrics::counter!("sluice_cpu_fetched_bytes_total").increment(n as u64);
        Ok(n)
    }
}

/// Ends a sample stream after the sample with index `end - 1`, without reading further.
trait TakeUntilEnd:
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

struct UntilEnd<I> {
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

/// Checks bytes as they stream past: each sample's range against its index checksum, and
/// optionally the whole file against the manifest's checksum at the end.
struct Verified<R> {
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
struct Damage(Arc<Mutex<(HashMap<u64, String>, bool)>>);

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
struct Admission {
    index: Option<Arc<SampleIndex>>,
    damage: Damage,
}

impl Admission {
    /// A sample parsed as number `i` is sample `i` only if it lies exactly on index entry
    /// `i`'s byte range (and, verifying, that range matched its checksum, recorded in
    /// `damage` by the time the parser has read past the sample's end). A sample parsed
    /// elsewhere is another sample (the shard was rewritten or shifted): it is reported
    /// damaged under the id, never delivered as it.
    fn admit(
        &self,
        sample: Result<sluice_shard::Sample, sluice_shard::ShardError>,
    ) -> Result<sluice_shard::Sample, sluice_shard::ShardError> {
        let s = sample?;
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
        }
        match self.damage.take(s.index) {
            Some(detail) => damaged(s, detail),
            None => Ok(s),
        }
    }
}

impl<R: Read> Verified<R> {
    fn new(
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
