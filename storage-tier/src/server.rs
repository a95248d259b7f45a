//! The HTTP/1.1 server: `GET`/`HEAD /v1/{bucket}/{key}` (one `Range`), `GET /v1/{bucket}?prefix=`
//! (JSON listing), `PUT /v1/{bucket}/{key}` (bearer token), `/healthz`, `/metrics`.
//!
//! Shape (mini-redis `server.rs`): [`run`] takes a bound listener, a config and a shutdown
//! token; connections are limited by a semaphore, every connection selects on the token, and
//! shutdown drains in-flight streams up to a deadline. Each connection starts in
//! [`crate::connection`], which answers GET and HEAD itself (bodies by sendfile) and hands
//! anything else to hyper here. Both paths route through `route`, which sees only the
//! request head. hyper's header-read timeout only works with a timer set, so both are set
//! (the slowloris guard). On the hyper path objects stream in `read_size` chunks through a
//! two-chunk channel: memory per stream is bounded whatever the object's size, and a client
//! that stops reading is dropped after the idle timeout.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sluice_shard::Checksum;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use xxhash_rust::xxh3::Xxh3;

use crate::config::StorageConfig;
use crate::mountpath::{advise_sequential, valid_bucket, valid_key, Mountpath};

pub(crate) type Body = BoxBody<Bytes, io::Error>;

/// Header carrying an object's xxh3 checksum (`xxh3:` + 16 hex digits).
pub const CHECKSUM_HEADER: &str = "x-sluice-checksum";

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("mountpath {path}: {source}")]
    Mountpath {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("accepting connections: {0}")]
    Accept(#[source] io::Error),
}

/// The process-wide Prometheus recorder (installed on first use).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (a test harness): then this handle
            // renders only what it records, which is nothing; harmless.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

pub(crate) struct State {
    pub(crate) config: StorageConfig,
    mountpaths: Vec<Mountpath>,
    labels: Vec<String>,
    /// Checksums of objects uploaded here, by (path, size, mtime).
    uploaded: Mutex<HashMap<(String, u64, i64), Checksum>>,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
}

impl State {
    /// Whether `bucket` is served (the config's `buckets`, or every bucket when that is empty).
    fn serves(&self, bucket: &str) -> bool {
        self.config.buckets.is_empty() || self.config.buckets.iter().any(|b| b == bucket)
    }
}

/// Serves `/metrics` and `/healthz` only, on the separate `metrics_listen` address.
async fn serve_admin(
    listener: TcpListener,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => { tokio::time::sleep(std::time::Duration::from_millis(100)).await; continue }
            },
            _ = shutdown.cancelled() => return,
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let metrics = metrics.clone();
                async move {
                    Ok::<_, Infallible>(match req.uri().path() {
                        "/metrics" => text(StatusCode::OK, &metrics.render()),
                        "/healthz" => text(StatusCode::OK, "ok\n"),
                        _ => error(
                            StatusCode::NOT_FOUND,
                            "this address serves /metrics and /healthz",
                        ),
                    })
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Serves until `shutdown` is cancelled, then lets in-flight requests finish for up to the
/// configured drain time.
pub async fn run(
    listener: TcpListener,
    config: StorageConfig,
    shutdown: CancellationToken,
) -> Result<(), StorageError> {
    let mountpaths = config
        .mountpaths
        .iter()
        .map(|p| {
            Mountpath::open(p, config.limits.streams_per_mountpath).map_err(|source| {
                StorageError::Mountpath {
                    path: p.display().to_string(),
                    source,
                }
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    for m in &mountpaths {
        tracing::info!(mountpath = %m.label, rotational = m.rotational, streams = m.stream_limit, "mountpath ready");
    }
    let state = Arc::new(State {
        labels: mountpaths.iter().map(|m| m.label.clone()).collect(),
        mountpaths,
        uploaded: Mutex::new(HashMap::new()),
        metrics: metrics_handle(),
        shutdown: shutdown.clone(),
        config,
    });
    if let Some(addr) = state.config.metrics_listen {
        let admin = TcpListener::bind(addr)
            .await
            .map_err(StorageError::Accept)?;
        tracing::info!(metrics_listen = %addr, "serving /metrics and /healthz");
        tokio::spawn(serve_admin(admin, state.metrics.clone(), shutdown.clone()));
    }
    let connections = Arc::new(Semaphore::new(state.config.limits.max_connections));
    let drain = state.config.timeouts.drain();
    let tracker = TaskTracker::new();
    loop {
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = shutdown.cancelled() => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) if is_transient(&e) => { tracing::warn!(error = %e, "accept"); continue }
                Err(e) => return Err(StorageError::Accept(e)),
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(
            async move {
                crate::connection::serve(stream, state, shutdown).await;
                drop(permit);
            }
            .instrument(tracing::debug_span!("connection", %peer)),
        );
    }
    tracker.close();
    if tokio::time::timeout(drain, tracker.wait()).await.is_err() {
        tracing::warn!("drain deadline passed with streams still open");
    }
    Ok(())
}

/// Serves a connection with hyper until it closes; on shutdown, hyper finishes the request
/// in flight and closes.
pub(crate) async fn serve_hyper<I>(io: I, state: Arc<State>, shutdown: CancellationToken)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // hyper's smallest read buffer is 8 KiB.
    let max_buf = state.config.limits.max_header_bytes.max(8192);
    let header_timeout = state.config.timeouts.header_read();
    let service = hyper::service::service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(handle(state, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(max_buf)
        .serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r { tracing::debug!(error = %e, "connection ended") },
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE
                | libc::ENFILE
                | libc::ECONNABORTED
                | libc::EINTR
                | libc::ENOBUFS
                | libc::ENOMEM
        )
    )
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let method = req.method().clone();
    let (parts, body) = req.into_parts();
    let head = Request::from_parts(parts, ());
    let resp = match route(&state, &head).await {
        Reply::Ready(r) => r,
        Reply::Object(o) => stream_object(&state, o).await,
        Reply::Upload { bucket, key } => put(&state, &head, body, &bucket, &key).await,
    };
    record_request(&method, resp.status(), started);
    resp
}

/// Counts a request and how long its answer took to start.
pub(crate) fn record_request(method: &Method, status: StatusCode, started: Instant) {
    metrics::counter!("sluice_storage_requests_total", "method" => method.to_string(), "status" => status.as_str().to_string()).increment(1);
    metrics::histogram!("sluice_storage_request_seconds").record(started.elapsed().as_secs_f64());
}

/// What a request routes to. Routing sees only the request head, so the hyper path and the
/// sendfile path ([`crate::connection`]) answer every GET and HEAD the same way.
pub(crate) enum Reply {
    /// A whole response: errors, redirects, listings, HEAD answers, `/metrics`.
    Ready(Response<Body>),
    /// An object (or a range of it) to stream after `head`.
    Object(ObjectBody),
    /// A valid `PUT`: the body is to be written to `bucket/key`.
    Upload { bucket: String, key: String },
}

/// An object's response head and the file region its body is.
pub(crate) struct ObjectBody {
    pub head: Response<()>,
    pub file: std::fs::File,
    pub mountpath: usize,
    pub offset: u64,
    pub len: u64,
}

pub(crate) async fn route(state: &Arc<State>, req: &Request<()>) -> Reply {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => return Reply::Ready(text(StatusCode::OK, "ok\n")),
        (&Method::GET, "/metrics") => {
            return Reply::Ready(text(StatusCode::OK, &state.metrics.render()))
        }
        (&Method::GET, "/auth") => {
            // Lets an uploader check its token before streaming a large body that a refusal
            // would cut off mid-send.
            return Reply::Ready(match token_ok(state, req) {
                Ok(()) => json(StatusCode::OK, serde_json::json!({"upload": true})),
                Err(e) => e.into(),
            });
        }
        (&Method::GET, "/cluster") => {
            return Reply::Ready(json(
                StatusCode::OK,
                serde_json::json!({"peers": state.config.peers, "replicas": state.config.replicas, "advertise": state.config.advertise}),
            ))
        }
        _ => {}
    }
    let Some(rest) = path.strip_prefix("/v1/") else {
        return s3_route(state, req).await;
    };
    let Ok(rest) = percent_encoding::percent_decode_str(rest).decode_utf8() else {
        return Reply::Ready(error(StatusCode::BAD_REQUEST, "path is not UTF-8"));
    };
    let (bucket, key) = match rest.split_once('/') {
        Some((b, k)) => (b.to_string(), Some(k.to_string())),
        None => (rest.to_string(), None),
    };
    if !valid_bucket(&bucket) {
        return Reply::Ready(error(StatusCode::BAD_REQUEST, "invalid bucket name"));
    }
    if !state.serves(&bucket) {
        return Reply::Ready(error(StatusCode::NOT_FOUND, "no such bucket"));
    }
    match (req.method().clone(), key) {
        (Method::GET, None) => Reply::Ready(list(state, &bucket, &query).await),
        (Method::GET | Method::HEAD, Some(key)) if valid_key(&key) => {
            get(state, req, &bucket, &key)
        }
        (Method::PUT, Some(key)) if valid_key(&key) => Reply::Upload { bucket, key },
        (_, Some(key)) if !valid_key(&key) => Reply::Ready(error(
            StatusCode::BAD_REQUEST,
            "invalid object key (empty, absolute, or with . or .. components)",
        )),
        _ => Reply::Ready(error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed here",
        )),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut r = Response::new(full(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn full(b: Bytes) -> Body {
    Full::new(b)
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(full(Bytes::from(value.to_string() + "\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response<Body> {
    json(
        status,
        serde_json::json!({"error": message, "status": status.as_u16()}),
    )
}

/// An error response not yet rendered (small, so `Result`s carrying it stay small).
struct HttpError(StatusCode, &'static str);

impl From<HttpError> for Response<Body> {
    fn from(e: HttpError) -> Self {
        error(e.0, e.1)
    }
}

/// A `Range` header that cannot be satisfied for the object's size.
#[derive(Debug, PartialEq, Eq)]
pub struct Unsatisfiable;

/// Finds the object on the mountpaths.
fn open_object(
    state: &State,
    bucket: &str,
    key: &str,
) -> Result<(usize, std::fs::File), HttpError> {
    let rel = format!("{bucket}/{key}");
    for (i, m) in state.mountpaths.iter().enumerate() {
        match m.open_beneath(&rel, libc::O_RDONLY, 0) {
            Ok(f) => return Ok((i, f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EXDEV | libc::ELOOP)) => {
                return Err(HttpError(StatusCode::NOT_FOUND, "no such object"));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => continue,
            Err(e) => {
                tracing::warn!(mountpath = %m.label, object = %rel, error = %e, "open failed");
                return Err(HttpError(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "object could not be opened",
                ));
            }
        }
    }
    Err(HttpError(StatusCode::NOT_FOUND, "no such object"))
}

/// Parses a single `bytes=` range against `size`: `Ok(None)` for no (or an ignored
/// multi-part) range, `Err` for an unsatisfiable one.
pub fn parse_range(value: &str, size: u64) -> Result<Option<(u64, u64)>, Unsatisfiable> {
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return Err(Unsatisfiable);
    };
    if spec.contains(',') {
        return Ok(None); // multi-range: served whole, as RFC 9110 allows
    }
    let (a, b) = spec.split_once('-').ok_or(Unsatisfiable)?;
    let (a, b) = (a.trim(), b.trim());
    let num = |s: &str| s.parse::<u64>().map_err(|_| Unsatisfiable);
    let (start, end) = match (a.is_empty(), b.is_empty()) {
        (false, true) => (num(a)?, size.checked_sub(1).ok_or(Unsatisfiable)?),
        (false, false) => (num(a)?, num(b)?.min(size.saturating_sub(1))),
        (true, false) => {
            let n = num(b)?;
            if n == 0 {
                return Err(Unsatisfiable);
            }
            (
                size.saturating_sub(n),
                size.checked_sub(1).ok_or(Unsatisfiable)?,
            )
        }
        (true, true) => return Err(Unsatisfiable),
    };
    if start > end || start >= size {
        return Err(Unsatisfiable);
    }
    Ok(Some((start, end - start + 1)))
}

/// The object's checksum: from its `.idx` sidecar when that describes this file, or from an
/// upload to this node.
/// The key of an uploaded object's checksum: its path and the size and mtime it was
/// written with, so a later change to the file makes the entry miss.
fn upload_key(mountpath: &Mountpath, rel: &str, meta: &std::fs::Metadata) -> (String, u64, i64) {
    (
        format!("{}/{rel}", mountpath.label),
        meta.len(),
        meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
    )
}

fn checksum(
    state: &State,
    mountpath: &Mountpath,
    rel: &str,
    meta: &std::fs::Metadata,
) -> Option<Checksum> {
    let key = upload_key(mountpath, rel, meta);
    if let Some(c) = state
        .uploaded
        .lock()
        .ok()
        .and_then(|m| m.get(&key).copied())
    {
        return Some(c);
    }
    let mut f = mountpath
        .open_beneath(&format!("{rel}.idx"), libc::O_RDONLY, 0)
        .ok()?;
    let mut head = [0u8; sluice_shard::index::INDEX_HEADER_LEN];
    io::Read::read_exact(&mut f, &mut head).ok()?;
    let header = sluice_shard::SampleIndex::peek_header(&head)?;
    (header.shard_size == meta.len()).then_some(header.shard_checksum)
}

fn get(state: &Arc<State>, req: &Request<()>, bucket: &str, key: &str) -> Reply {
    let (mi, file) = match open_object(state, bucket, key) {
        Ok(x) => x,
        Err(e) if e.0 == StatusCode::NOT_FOUND => {
            return Reply::Ready(redirect_to_owner(state, bucket, key).unwrap_or_else(|| e.into()))
        }
        Err(e) => return Reply::Ready(e.into()),
    };
    let mountpath = &state.mountpaths[mi];
    let meta = match file.metadata() {
        Ok(m) if m.is_file() => m,
        _ => return Reply::Ready(error(StatusCode::NOT_FOUND, "no such object")),
    };
    let size = meta.len();
    let range = match req.headers().get(header::RANGE).map(|v| {
        v.to_str()
            .map_err(|_| Unsatisfiable)
            .and_then(|v| parse_range(v, size))
    }) {
        None => None,
        Some(Ok(r)) => r,
        Some(Err(Unsatisfiable)) => {
            let mut r = error(StatusCode::RANGE_NOT_SATISFIABLE, "unsatisfiable range");
            r.headers_mut().insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{size}"))
                    .unwrap_or(HeaderValue::from_static("bytes */0")),
            );
            return Reply::Ready(r);
        }
    };
    let (offset, len) = range.unwrap_or((0, size));
    let rel = format!("{bucket}/{key}");
    let mut builder = Response::builder()
        .status(if range.is_some() {
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        })
        .header(header::CONTENT_LENGTH, len)
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::ETAG, format!("\"{:x}-{:x}\"", size, meta.mtime()))
        .header(
            header::CONTENT_TYPE,
            if key.ends_with(".tar") {
                "application/x-tar"
            } else {
                "application/octet-stream"
            },
        );
    if range.is_some() {
        builder = builder.header(
            header::CONTENT_RANGE,
            format!("bytes {offset}-{}/{size}", offset + len - 1),
        );
    }
    if let Some(c) = checksum(state, mountpath, &rel, &meta) {
        builder = builder.header(CHECKSUM_HEADER, c.to_string());
    }
    if req.method() == Method::HEAD || len == 0 {
        return Reply::Ready(
            builder
                .body(full(Bytes::new()))
                .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "response")),
        );
    }
    match builder.body(()) {
        Ok(head) => Reply::Object(ObjectBody {
            head,
            file,
            mountpath: mi,
            offset,
            len,
        }),
        Err(_) => Reply::Ready(error(StatusCode::INTERNAL_SERVER_ERROR, "response")),
    }
}

/// Waits, in arrival order, for one of a disk's stream slots; the wait is a metric.
pub(crate) async fn disk_slot(state: &State, mountpath: usize) -> io::Result<OwnedSemaphorePermit> {
    let waited = Instant::now();
    let permit = state.mountpaths[mountpath]
        .streams
        .clone()
        .acquire_owned()
        .await
        .map_err(io::Error::other)?;
    metrics::histogram!("sluice_storage_queue_wait_seconds", "mountpath" => state.labels[mountpath].clone())
        .record(waited.elapsed().as_secs_f64());
    Ok(permit)
}

/// The per-mountpath stream metrics, held for the life of one object stream.
pub(crate) struct StreamMetrics {
    active: metrics::Gauge,
    pub sent: metrics::Counter,
    pub read_latency: metrics::Histogram,
}

impl StreamMetrics {
    pub fn start(state: &State, mountpath: usize) -> Self {
        let label = state.labels[mountpath].clone();
        let active = metrics::gauge!("sluice_storage_active_streams", "mountpath" => label.clone());
        active.increment(1.0);
        StreamMetrics {
            active,
            sent: metrics::counter!("sluice_storage_bytes_sent_total", "mountpath" => label.clone()),
            read_latency: metrics::histogram!("sluice_storage_read_seconds", "mountpath" => label),
        }
    }
}

impl Drop for StreamMetrics {
    fn drop(&mut self) {
        self.active.decrement(1.0);
    }
}

/// The hyper path's object body: `read_size` chunks read with pread on the blocking pool and
/// handed to hyper through a two-chunk channel, so memory per stream is bounded.
async fn stream_object(state: &Arc<State>, object: ObjectBody) -> Response<Body> {
    let shutting_down = || error(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    let permit = tokio::select! {
        p = disk_slot(state, object.mountpath) => match p { Ok(p) => p, Err(_) => return shutting_down() },
        _ = state.shutdown.cancelled() => return shutting_down(),
    };
    advise_sequential(&object.file, object.offset, object.len);
    let ObjectBody {
        head,
        file,
        mountpath,
        offset,
        len,
    } = object;
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, io::Error>>(2);
    let read_size = state.config.limits.read_size as u64;
    let idle = state.config.timeouts.idle();
    let stream_metrics = StreamMetrics::start(state, mountpath);
    tokio::spawn(async move {
        let _permit = permit;
        let m = stream_metrics;
        // Each chunk is read straight into the buffer that hyper sends (tokio::fs would copy
        // it once more through its own buffer).
        let file = Arc::new(file);
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let want = (end - pos).min(read_size) as usize;
            let t = Instant::now();
            let f = file.clone();
            let chunk = tokio::task::spawn_blocking(move || read_chunk(&f, pos, want)).await;
            m.read_latency.record(t.elapsed().as_secs_f64());
            let chunk = match chunk {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    let _ = tx.send(Err(e)).await;
                    break;
                }
                Err(e) => {
                    let _ = tx.send(Err(io::Error::other(e))).await;
                    break;
                }
            };
            pos += chunk.len() as u64;
            m.sent.increment(chunk.len() as u64);
            match tokio::time::timeout(idle, tx.send(Ok(Frame::data(chunk)))).await {
                Ok(Ok(())) => {}
                _ => break, // the client went away, or stopped reading for the idle timeout
            }
        }
    });
    let (parts, ()) = head.into_parts();
    Response::from_parts(parts, StreamBody::new(tokio_stream(rx)).boxed())
}

/// Reads exactly `len` bytes at `offset` (pread), failing if the object shrank.
fn read_chunk(file: &std::fs::File, offset: u64, len: usize) -> io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let mut buf = BytesMut::zeroed(len);
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "object shrank while being read",
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf.freeze())
}

/// For an object this node does not hold: a 307 to its first owner, when this node is not an
/// owner itself (an owner that lacks the object answers 404, so redirects cannot loop).
fn redirect_to_owner(state: &State, bucket: &str, key: &str) -> Option<Response<Body>> {
    let me = state.config.advertise.as_deref()?;
    let owners = sluice_shard::placement::owners(
        &format!("{bucket}/{key}"),
        &state.config.peers,
        state.config.replicas,
    );
    if owners.contains(&me) {
        return None;
    }
    let location = format!(
        "{}/v1/{bucket}/{key}",
        owners.first()?.trim_end_matches('/')
    );
    let mut r = error(
        StatusCode::TEMPORARY_REDIRECT,
        "object lives on another node",
    );
    r.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_str(&location).ok()?);
    Some(r)
}

/// An mpsc receiver as a `Stream` of frames.
fn tokio_stream(
    mut rx: mpsc::Receiver<Result<Frame<Bytes>, io::Error>>,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, io::Error>> + Send + Sync + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The S3-compatible read path (path-style `/{bucket}/{key}`), with S3's XML errors.
async fn s3_route(state: &Arc<State>, req: &Request<()>) -> Reply {
    let s3_error = |status: StatusCode, code: &str, message: &str| {
        let mut r = Response::new(full(Bytes::from(crate::s3::error_xml(code, message))));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/xml"),
        );
        r
    };
    if let (Some(key), Some(secret)) = (&state.config.s3_access_key, &state.config.s3_secret_key) {
        let headers = req.headers().clone();
        let lookup = move |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let signed = crate::s3::SignedRequest {
            method: req.method().as_str(),
            raw_path: req.uri().path(),
            raw_query: req.uri().query().unwrap_or(""),
            header: &lookup,
        };
        match crate::s3::verify(&signed, key, secret) {
            Ok(()) => {}
            Err(crate::s3::AuthError::UnknownKey) => {
                return Reply::Ready(s3_error(
                    StatusCode::FORBIDDEN,
                    "InvalidAccessKeyId",
                    "unknown access key",
                ))
            }
            Err(crate::s3::AuthError::Missing) => {
                return Reply::Ready(s3_error(
                    StatusCode::FORBIDDEN,
                    "AccessDenied",
                    "this store requires signed requests",
                ))
            }
            Err(_) => {
                return Reply::Ready(s3_error(
                    StatusCode::FORBIDDEN,
                    "SignatureDoesNotMatch",
                    "the request signature does not match",
                ))
            }
        }
    }
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let Ok(rest) = percent_encoding::percent_decode_str(path.trim_start_matches('/')).decode_utf8()
    else {
        return Reply::Ready(s3_error(
            StatusCode::BAD_REQUEST,
            "InvalidURI",
            "path is not UTF-8",
        ));
    };
    let (bucket, key) = match rest.split_once('/') {
        Some((b, k)) if !k.is_empty() => (b.to_string(), Some(k.to_string())),
        Some((b, _)) => (b.to_string(), None),
        None => (rest.to_string(), None),
    };
    if !valid_bucket(&bucket) {
        return Reply::Ready(s3_error(
            StatusCode::BAD_REQUEST,
            "InvalidBucketName",
            "invalid bucket name",
        ));
    }
    if !state.serves(&bucket) {
        return Reply::Ready(s3_error(
            StatusCode::NOT_FOUND,
            "NoSuchBucket",
            "the specified bucket does not exist",
        ));
    }
    match (req.method().clone(), key) {
        (Method::GET | Method::HEAD, Some(key)) => {
            if !valid_key(&key) {
                return Reply::Ready(s3_error(
                    StatusCode::BAD_REQUEST,
                    "InvalidArgument",
                    "invalid object key",
                ));
            }
            let resp = match get(state, req, &bucket, &key) {
                Reply::Ready(r) => r,
                other => return other,
            };
            let (code, message) = match resp.status() {
                StatusCode::NOT_FOUND => ("NoSuchKey", "the specified key does not exist"),
                StatusCode::RANGE_NOT_SATISFIABLE => {
                    ("InvalidRange", "the requested range is not satisfiable")
                }
                StatusCode::SERVICE_UNAVAILABLE => ("SlowDown", "the node is shutting down"),
                StatusCode::INTERNAL_SERVER_ERROR => {
                    ("InternalError", "the object could not be read")
                }
                _ => return Reply::Ready(resp),
            };
            let mut out = s3_error(resp.status(), code, message);
            if let Some(cr) = resp.headers().get(header::CONTENT_RANGE) {
                out.headers_mut().insert(header::CONTENT_RANGE, cr.clone());
            }
            Reply::Ready(out)
        }
        (Method::GET, None) if query_param(&query, "list-type").as_deref() == Some("2") => {
            let prefix = query_param(&query, "prefix").unwrap_or_default();
            let max = query_param(&query, "max-keys")
                .and_then(|m| m.parse::<usize>().ok())
                .unwrap_or(1000)
                .clamp(1, 1000);
            let token = query_param(&query, "continuation-token");
            let after = token.clone().or_else(|| query_param(&query, "start-after"));
            let Some(found) =
                collect_keys(state, &bucket, prefix.clone(), after.clone(), max + 1).await
            else {
                return Reply::Ready(s3_error(
                    StatusCode::NOT_FOUND,
                    "NoSuchBucket",
                    "the specified bucket does not exist",
                ));
            };
            let mut page: Vec<(String, u64)> = found.into_iter().collect();
            let next = (page.len() > max).then(|| {
                page.truncate(max);
                page.last().map(|(k, _)| k.clone()).unwrap_or_default()
            });
            let url_encoding = query_param(&query, "encoding-type").as_deref() == Some("url");
            let body = crate::s3::list_v2_xml(
                &bucket,
                &prefix,
                &page,
                max,
                next.as_deref(),
                token.as_deref(),
                url_encoding,
            );
            let mut r = Response::new(full(Bytes::from(body)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/xml"),
            );
            Reply::Ready(r)
        }
        _ if !state
            .mountpaths
            .iter()
            .any(|m| m.path.join(&bucket).is_dir()) =>
        {
            Reply::Ready(s3_error(
                StatusCode::NOT_FOUND,
                "NoSuchBucket",
                "the specified bucket does not exist",
            ))
        }
        _ => Reply::Ready(s3_error(
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            "this store serves GetObject, HeadObject and ListObjectsV2",
        )),
    }
}

/// A query parameter, percent-decoded.
fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then(|| {
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// The first `limit` objects of `bucket` (across mountpaths, sorted by key) whose key starts
/// with `prefix` and comes after `after`, with sizes; `None` when no mountpath has the bucket.
async fn collect_keys(
    state: &Arc<State>,
    bucket: &str,
    prefix: String,
    after: Option<String>,
    limit: usize,
) -> Option<std::collections::BTreeMap<String, u64>> {
    let roots: Vec<std::path::PathBuf> = state
        .mountpaths
        .iter()
        .map(|m| m.path.join(bucket))
        .collect();
    let listed = tokio::task::spawn_blocking(move || {
        let mut found = std::collections::BTreeMap::new();
        let mut any_bucket = false;
        for root in roots {
            if !root.is_dir() {
                continue;
            }
            any_bucket = true;
            let mut stack = vec![root.clone()];
            while let Some(dir) = stack.pop() {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.starts_with('.') {
                        continue; // temporary uploads and hidden files
                    }
                    let Ok(ft) = e.file_type() else { continue };
                    let path = e.path();
                    if ft.is_dir() {
                        stack.push(path);
                    } else if ft.is_file() {
                        let key = path
                            .strip_prefix(&root)
                            .map(|p| p.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        if key.starts_with(&prefix) && after.as_ref().is_none_or(|a| &key > a) {
                            let size = e.metadata().map(|m| m.len()).unwrap_or(0);
                            found.insert(key, size);
                            // Keep only the first `limit` keys: memory is bounded by the
                            // page, not by the bucket.
                            if found.len() > limit {
                                found.pop_last();
                            }
                        }
                    }
                }
            }
        }
        any_bucket.then_some(found)
    })
    .await;
    listed.ok().flatten()
}

async fn list(state: &Arc<State>, bucket: &str, query: &str) -> Response<Body> {
    let prefix = query_param(query, "prefix").unwrap_or_default();
    let max = state.config.limits.max_list_keys;
    let Some(found) = collect_keys(state, bucket, prefix, None, max + 1).await else {
        return error(StatusCode::NOT_FOUND, "no such bucket");
    };
    let truncated = found.len() > max;
    let objects: Vec<_> = found
        .into_iter()
        .take(max)
        .map(|(key, size)| serde_json::json!({"key": key, "size": size}))
        .collect();
    json(
        StatusCode::OK,
        serde_json::json!({"bucket": bucket, "objects": objects, "truncated": truncated}),
    )
}

fn token_ok(state: &State, req: &Request<()>) -> Result<(), HttpError> {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(given) = given else {
        return Err(HttpError(
            StatusCode::UNAUTHORIZED,
            "uploads need Authorization: Bearer <token>",
        ));
    };
    // Compare every configured token in full, without an early exit on the first byte.
    let ok = state.config.upload_tokens.iter().fold(false, |acc, t| {
        let same = t.len() == given.len()
            && t.bytes()
                .zip(given.bytes())
                .fold(0u8, |d, (a, b)| d | (a ^ b))
                == 0;
        acc | same
    });
    if ok {
        Ok(())
    } else {
        Err(HttpError(StatusCode::FORBIDDEN, "token refused"))
    }
}

async fn put(
    state: &Arc<State>,
    req: &Request<()>,
    mut body: Incoming,
    bucket: &str,
    key: &str,
) -> Response<Body> {
    if let Err(e) = token_ok(state, req) {
        return e.into();
    }
    let max = state.config.limits.max_upload_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "object larger than limits.max_upload_bytes",
        );
    }
    let rel = format!("{bucket}/{key}");
    // Keep an existing object on its disk; place a new one by rendezvous hashing.
    let mi = match open_object(state, bucket, key) {
        Ok((i, _)) => i,
        Err(_) => sluice_shard::placement::preference(&rel, &state.labels)[0],
    };
    let mountpath = &state.mountpaths[mi];
    let parent = std::path::Path::new(&rel)
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Err(e) = std::fs::create_dir_all(mountpath.path.join(&parent)) {
        tracing::warn!(object = %rel, error = %e, "creating folders");
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "could not create the object's folder",
        );
    }
    let file_name = rel.rsplit('/').next().unwrap_or("object");
    let tmp_rel = format!(
        "{parent}/.{file_name}.sluice-tmp-{:x}",
        xxhash_rust::xxh3::xxh3_64(format!("{rel}{:?}", Instant::now()).as_bytes())
    );
    let file = match mountpath.open_beneath(
        &tmp_rel,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o644,
    ) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            return error(StatusCode::BAD_REQUEST, "object path escapes the data root")
        }
        Err(e) => {
            tracing::warn!(object = %rel, error = %e, "creating upload file");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "could not create the object",
            );
        }
    };
    let tmp_path = mountpath.path.join(&tmp_rel);
    let final_path = mountpath.path.join(&rel);
    let mut out = tokio::fs::File::from_std(file);
    let mut hasher = Xxh3::new();
    let mut written = 0u64;
    let result: Result<(), Response<Body>> = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| error(StatusCode::BAD_REQUEST, "upload interrupted"))?;
            if let Ok(data) = frame.into_data() {
                written += data.len() as u64;
                if written > max {
                    return Err(error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "object larger than limits.max_upload_bytes",
                    ));
                }
                hasher.update(&data);
                out.write_all(&data)
                    .await
                    .map_err(|_| error(StatusCode::INSUFFICIENT_STORAGE, "write failed"))?;
            }
        }
        if declared.is_some_and(|n| n != written) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "body shorter than Content-Length",
            ));
        }
        out.sync_all()
            .await
            .map_err(|_| error(StatusCode::INSUFFICIENT_STORAGE, "fsync failed"))?;
        tokio::fs::rename(&tmp_path, &final_path)
            .await
            .map_err(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "rename failed"))?;
        if let Some(dir) = final_path.parent() {
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }
    .await;
    if let Err(r) = result {
        let _ = tokio::fs::remove_file(&tmp_path).await;
        return r;
    }
    let checksum = Checksum(hasher.digest());
    if let Ok(meta) = std::fs::metadata(&final_path) {
        if let Ok(mut m) = state.uploaded.lock() {
            m.insert(upload_key(mountpath, &rel, &meta), checksum);
        }
    }
    let mut r = json(
        StatusCode::CREATED,
        serde_json::json!({"bucket": bucket, "key": key, "size": written, "checksum": checksum.to_string()}),
    );
    if let Ok(v) = HeaderValue::from_str(&checksum.to_string()) {
        r.headers_mut().insert(CHECKSUM_HEADER, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::{parse_range, Unsatisfiable};

    #[test]
    fn ranges_parse_like_rfc_9110() {
        assert_eq!(parse_range("bytes=0-99", 1000), Ok(Some((0, 100))));
        assert_eq!(parse_range("bytes=900-", 1000), Ok(Some((900, 100))));
        assert_eq!(parse_range("bytes=-100", 1000), Ok(Some((900, 100))));
        assert_eq!(parse_range("bytes=990-2000", 1000), Ok(Some((990, 10))));
        assert_eq!(parse_range("bytes=0-1,5-6", 1000), Ok(None));
        for bad in [
            "bytes=1000-",
            "bytes=5-1",
            "bytes=-0",
            "bytes=-",
            "items=0-1",
            "bytes=a-b",
        ] {
            assert_eq!(parse_range(bad, 1000), Err(Unsatisfiable), "{bad}");
        }
        assert_eq!(parse_range("bytes=0-", 0), Err(Unsatisfiable));
    }
}
