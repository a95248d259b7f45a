//! The `/v1/{bucket}/{key}` object path: `GET`/`HEAD` with one `Range` (bodies streamed in
//! `read_size` chunks through a two-chunk channel on the hyper path, or by sendfile in
//! [`crate::connection`]), checksums, redirects to an object's owners in a cluster, and token
//! `PUT`s written to a temporary file and renamed into place.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use sluice_shard::Checksum;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use xxhash_rust::xxh3::Xxh3;

use crate::mountpath::{advise_sequential, Mountpath};
use crate::routing::{error, full, json, Body, HttpError, ObjectBody, Reply, State};

/// Header carrying an object's xxh3 checksum (`xxh3:` + 16 hex digits).
pub const CHECKSUM_HEADER: &str = "x-sluice-checksum";

/// A `Range` header that cannot be satisfied for the object's size.
#[derive(Debug, PartialEq, Eq)]
pub struct Unsatisfiable;

/// Finds the object on the mountpaths.
pub(crate) fn open_object(
    state: &State,
    bucket: &str,
    key: &str,
) -> Result<(usize, std::fs::File), HttpError> {
    let rel = format!("{bucket}/{key}");
    let mut unavailable = false;
    for (i, m) in state.mountpaths.iter().enumerate() {
        if m.trouble().is_some() {
            // What it holds now is not what this node indexed: neither served nor denied.
            unavailable = true;
            continue;
        }
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
    if unavailable {
        // It may be on the mountpath that cannot serve: a reader should try another replica.
        return Err(HttpError(
            StatusCode::SERVICE_UNAVAILABLE,
            "a mountpath of this node is unavailable; try another replica",
        ));
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
pub(crate) fn upload_key(
    mountpath: &Mountpath,
    rel: &str,
    meta: &std::fs::Metadata,
) -> (String, u64, i64) {
    (
        format!("{}/{rel}", mountpath.label),
        meta.len(),
        meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
    )
}

pub(crate) fn checksum(
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

pub(crate) fn get(state: &Arc<State>, req: &Request<()>, bucket: &str, key: &str) -> Reply {
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
pub(crate) async fn stream_object(state: &Arc<State>, object: ObjectBody) -> Response<Body> {
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
pub(crate) fn read_chunk(file: &std::fs::File, offset: u64, len: usize) -> io::Result<Bytes> {
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
pub(crate) fn redirect_to_owner(state: &State, bucket: &str, key: &str) -> Option<Response<Body>> {
    let me = state.config.advertise.as_deref()?;
    let owners = crate::placement::owners(
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
pub(crate) fn tokio_stream(
    mut rx: mpsc::Receiver<Result<Frame<Bytes>, io::Error>>,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, io::Error>> + Send + Sync + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

pub(crate) fn token_ok(state: &State, req: &Request<()>) -> Result<(), HttpError> {
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
    let ok = state.upload_tokens.admits(given);
    if ok {
        Ok(())
    } else {
        Err(HttpError(StatusCode::FORBIDDEN, "token refused"))
    }
}

pub(crate) async fn put(
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
        Err(HttpError(StatusCode::SERVICE_UNAVAILABLE, why)) => {
            return error(StatusCode::SERVICE_UNAVAILABLE, why)
        }
        Err(_) => crate::placement::preference(&rel, &state.labels)[0],
    };
    let mountpath = &state.mountpaths[mi];
    // A disk that cannot hold the object says so before a byte is written.
    if let (Some(n), Ok(free)) = (declared, mountpath.available_bytes()) {
        if n > free {
            tracing::warn!(object = %rel, bytes = n, free, "upload refused: the disk is full");
            drain(&mut body, n).await;
            return error(
                StatusCode::INSUFFICIENT_STORAGE,
                &format!("the object is {n} bytes and its disk has {free} bytes free"),
            );
        }
    }
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
                if let Err(e) = out.write_all(&data).await {
                    return Err(write_failed(&rel, &e, &mut body, max - written).await);
                }
            }
        }
        if declared.is_some_and(|n| n != written) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "body shorter than Content-Length",
            ));
        }
        if let Err(e) = out.sync_all().await {
            return Err(write_failed(&rel, &e, &mut body, 0).await);
        }
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

/// The answer to an upload whose bytes could not be written: 507 for a full disk or quota,
/// 500 otherwise, with the system's reason. What is left of the body (up to `rest` bytes) is
/// read first, so the client, still sending, reads the answer instead of a reset connection.
async fn write_failed(rel: &str, e: &io::Error, body: &mut Incoming, rest: u64) -> Response<Body> {
    tracing::warn!(object = %rel, error = %e, "upload failed");
    drain(body, rest).await;
    let full = matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT));
    let status = if full {
        StatusCode::INSUFFICIENT_STORAGE
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    error(status, &format!("writing the object failed: {e}"))
}

/// How long an upload that is refused mid-body may keep sending before the answer.
const DRAIN_TIME: Duration = Duration::from_secs(60);

/// Reads and discards up to `limit` more bytes of a request body, for at most [`DRAIN_TIME`].
/// An HTTP/1 client sends its whole body before it reads the answer; closing on it mid-body
/// resets the connection and the client sees "connection reset", not why.
async fn drain(body: &mut Incoming, limit: u64) {
    let mut read = 0u64;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while read <= limit {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        read += data.len() as u64;
                    }
                }
                _ => break,
            }
        }
    })
    .await;
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
