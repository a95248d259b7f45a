//! One client connection: GET and HEAD are answered here, object bodies with `sendfile(2)`
//! from the page cache straight to the socket; everything else goes to hyper.
//!
//! hyper's body API makes every byte pass through user space: a `pread` into a buffer, then
//! a `write` of it, two copies and a fresh buffer per chunk. nginx sends from the page cache
//! with `sendfile` on a corked socket; sluice/nginx was 0.77–0.93 before this module. So each
//! request head is parsed here with `httparse` (the parser hyper itself uses), routed by the
//! same `routing::route` as the hyper path, and answered:
//! - a whole response (error, listing, redirect, HEAD) is written in one `send`;
//! - an object's head and body go out corked (`TCP_CORK`, as nginx's `tcp_nopush`), the
//!   body with `sendfile`, up to `read_size` bytes per round. Without the cork, sendfile
//!   measured 1.5–1.7 GB/s against nginx's 2.1–2.2 on loopback (a bare Python sendfile
//!   server too); corked, the same as nginx. A round whose window is in the page cache
//!   (`cachestat(2)`) runs on the runtime thread; one that would read the disk takes a
//!   disk slot and runs on the blocking pool, so a seeking spindle never stalls the runtime.
//!
//! A request this path does not take (one with a body or `Expect`, HTTP/1.0, an upgrade, an
//! absolute URI, a malformed or oversized head) hands the connection, with the bytes already
//! read, to hyper for the rest of its life, so uploads, chunked bodies and hyper's error
//! answers are unchanged. Limits: the first head must arrive within `header_read_secs` of
//! the accept (the slowloris guard), a later one within `idle_secs` of the last answer and
//! `header_read_secs` of its first byte; a body that makes no progress for `idle_secs` ends
//! the connection.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use http_body_util::BodyExt;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::mountpath::advise_sequential;
use crate::objects::{disk_slot, StreamMetrics};
use crate::routing::{error, record_request, route, serve_hyper, ObjectBody, Reply, State};

/// Most header lines in a head this path parses (hyper's default too); more go to hyper.
const MAX_HEADERS: usize = 100;

/// What the bytes read so far hold.
#[derive(Debug)]
pub enum Head {
    /// A complete head this path answers, and its length in bytes.
    Answer {
        request: Box<Request<()>>,
        len: usize,
    },
    /// Not a whole head yet.
    Partial,
    /// A head for hyper: a body, HTTP/1.0, `Expect`, an upgrade, an absolute URI, or bytes
    /// that are no head at all (hyper answers those with its own 400 or 431).
    Hyper,
}

/// Parses the start of `buf` as a request head, `max_len` bytes at most.
pub fn parse_head(buf: &[u8], max_len: usize) -> Head {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut lines);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len <= max_len => len,
        Ok(httparse::Status::Partial) if buf.len() < max_len => return Head::Partial,
        _ => return Head::Hyper,
    };
    let (Some(method), Some(path), Some(1)) = (parsed.method, parsed.path, parsed.version) else {
        return Head::Hyper;
    };
    let method = match method {
        "GET" => Method::GET,
        "HEAD" => Method::HEAD,
        _ => return Head::Hyper,
    };
    if !path.starts_with('/') {
        return Head::Hyper;
    }
    let Ok(uri) = path.parse::<Uri>() else {
        return Head::Hyper;
    };
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    let headers = request.headers_mut();
    for line in parsed.headers.iter() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(line.name.as_bytes()),
            HeaderValue::from_bytes(line.value),
        ) else {
            return Head::Hyper;
        };
        headers.append(name, value);
    }
    let no_body = headers
        .get_all(header::CONTENT_LENGTH)
        .iter()
        .all(|v| v.as_bytes() == b"0");
    if !no_body
        || headers.contains_key(header::TRANSFER_ENCODING)
        || headers.contains_key(header::EXPECT)
        || headers.contains_key(header::UPGRADE)
    {
        return Head::Hyper;
    }
    Head::Answer {
        request: Box::new(request),
        len,
    }
}

/// Whether the client asked to close the connection after this answer.
fn wants_close(request: &Request<()>) -> bool {
    request
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("close"))
}

/// Serves one accepted connection until it closes, shutdown is asked for between requests,
/// or it is handed to hyper.
pub(crate) async fn serve(stream: TcpStream, state: Arc<State>, shutdown: CancellationToken) {
    let stream = Arc::new(stream);
    let limits = &state.config.limits;
    let timeouts = &state.config.timeouts;
    let max_head = limits.max_header_bytes.max(8192);
    let mut buf = BytesMut::with_capacity(8192);
    let mut first = true;
    loop {
        let wait = if first || !buf.is_empty() {
            timeouts.header_read()
        } else {
            timeouts.idle()
        };
        let head = tokio::select! {
            h = read_head(&stream, &mut buf, max_head, wait, timeouts.header_read()) => h,
            _ = shutdown.cancelled() => return,
        };
        first = false;
        let (request, len) = match head {
            Ok(Head::Answer { request, len }) => (request, len),
            Ok(Head::Hyper) => {
                // Every sendfile round has been awaited, so this is the socket's only owner.
                match Arc::try_unwrap(stream) {
                    Ok(stream) => {
                        let (read, write) = stream.into_split();
                        let replay = AsyncReadExt::chain(io::Cursor::new(buf.freeze()), read);
                        serve_hyper(tokio::io::join(replay, write), state, shutdown).await;
                    }
                    Err(_) => tracing::warn!("socket still shared at the hand-off; closing it"),
                }
                return;
            }
            Ok(Head::Partial) | Err(_) => return, // closed, timed out, or failed mid-head
        };
        buf.advance(len);
        let close = wants_close(&request) || shutdown.is_cancelled();
        match answer(&state, &stream, *request, close).await {
            Ok(()) if !close && !shutdown.is_cancelled() => {}
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(error = %e, "connection ended mid-answer");
                return;
            }
        }
    }
}

/// Reads until `buf` starts with a whole head (or something that is none): the first bytes
/// within `wait`, the rest within `header_read` of them.
async fn read_head(
    stream: &TcpStream,
    buf: &mut BytesMut,
    max_head: usize,
    wait: Duration,
    header_read: Duration,
) -> io::Result<Head> {
    let mut deadline = tokio::time::Instant::now() + wait;
    loop {
        match parse_head(buf, max_head) {
            Head::Partial => {}
            head => return Ok(head),
        }
        let was_empty = buf.is_empty();
        buf.reserve(4096);
        loop {
            tokio::time::timeout_at(deadline, stream.readable())
                .await
                .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
            match stream.try_read_buf(buf) {
                Ok(0) => return Ok(Head::Partial),
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        if was_empty {
            deadline = tokio::time::Instant::now() + header_read;
        }
    }
}

/// Routes one request and writes its answer.
async fn answer(
    state: &Arc<State>,
    stream: &Arc<TcpStream>,
    request: Request<()>,
    close: bool,
) -> io::Result<()> {
    let started = Instant::now();
    let idle = state.config.timeouts.idle();
    let whole = |response: Response<crate::routing::Body>| {
        record_request(request.method(), response.status(), started);
        send_whole(
            stream,
            response,
            request.method() == Method::HEAD,
            close,
            idle,
        )
    };
    let object = match route(state, &request).await {
        Reply::Object(o) => o,
        Reply::Ready(r) => return whole(r).await,
        // `parse_head` passes no request with a body, so no upload comes here.
        Reply::Upload { .. } => {
            return whole(error(StatusCode::BAD_REQUEST, "an upload needs a body")).await
        }
    };
    let ObjectBody {
        head,
        file,
        mountpath,
        offset,
        len,
    } = object;
    record_request(request.method(), head.status(), started);
    let mut out = Vec::with_capacity(512);
    write_head(&mut out, &head, close);
    // Corked, the head rides in the body's first segment and only full segments leave;
    // uncorking pushes the last one out. See the module comment for what it measured.
    cork(stream, true)?;
    send(stream, &out, idle).await?;
    advise_sequential(&file, offset, len);
    let body = FileBody {
        file: Arc::new(file),
        mountpath,
        end: offset + len,
        metrics: StreamMetrics::start(state, mountpath),
    };
    body.send(state, stream, offset).await?;
    cork(stream, false)
}

/// Sets or clears `TCP_CORK` (nginx's `tcp_nopush`): while set, only full segments leave.
fn cork(stream: &TcpStream, on: bool) -> io::Result<()> {
    let value: libc::c_int = on.into();
    // SAFETY: a valid socket and a live c_int of the size given.
    let r = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Writes a whole response, head and body, in one `send`.
async fn send_whole(
    stream: &TcpStream,
    response: Response<crate::routing::Body>,
    head_only: bool,
    close: bool,
    idle: Duration,
) -> io::Result<()> {
    let (parts, body) = response.into_parts();
    // Every whole response's body is in memory already (`Full`), so this does not wait.
    let body = body.collect().await?.to_bytes();
    let mut head = Response::from_parts(parts, ());
    if !head.headers().contains_key(header::CONTENT_LENGTH) {
        head.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    let mut out = Vec::with_capacity(512 + body.len());
    write_head(&mut out, &head, close);
    if !head_only {
        out.extend_from_slice(&body);
    }
    send(stream, &out, idle).await
}

/// Appends an HTTP/1.1 response head (with `date`, and `connection: close` when closing).
fn write_head(out: &mut Vec<u8>, head: &Response<()>, close: bool) {
    let status = head.status();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in head.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"date: ");
    out.extend_from_slice(httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes());
    out.extend_from_slice(b"\r\n");
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Sends all of `data`, waiting at most `idle` each time the socket is full.
async fn send(stream: &TcpStream, mut data: &[u8], idle: Duration) -> io::Result<()> {
    let flags = libc::MSG_NOSIGNAL;
    while !data.is_empty() {
        writable(stream, idle).await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            // SAFETY: a valid socket and a live buffer of `data.len()` bytes.
            let n =
                unsafe { libc::send(stream.as_raw_fd(), data.as_ptr().cast(), data.len(), flags) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match sent {
            Ok(n) => data = &data[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn writable(stream: &TcpStream, idle: Duration) -> io::Result<()> {
    tokio::time::timeout(idle, stream.writable())
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "client stopped reading"))?
}

/// An object body being sent.
struct FileBody {
    file: Arc<File>,
    mountpath: usize,
    end: u64,
    metrics: StreamMetrics,
}

impl FileBody {
    /// Sends `file[offset..end)` with sendfile: each round waits for the socket, then sends
    /// what it takes of the next `read_size` bytes. A round that would read the disk takes
    /// one of the disk's stream slots for that one large sequential read, on the blocking
    /// pool; a round served from the page cache needs none, so a hot object never queues
    /// behind a disk it does not touch, and a long object never holds a slot while its
    /// client is slow.
    async fn send(
        &self,
        state: &State,
        stream: &Arc<TcpStream>,
        mut offset: u64,
    ) -> io::Result<()> {
        let window = state.config.limits.read_size as u64;
        let idle = state.config.timeouts.idle();
        while offset < self.end {
            writable(stream, idle).await?;
            let want = (self.end - offset).min(window);
            let t = Instant::now();
            let (sent, result) = if cached(&self.file, offset, want) {
                send_round(stream, &self.file, offset, want)
            } else {
                let slot = disk_slot(state, self.mountpath).await?;
                let (s, f) = (stream.clone(), self.file.clone());
                let round = tokio::task::spawn_blocking(move || send_round(&s, &f, offset, want));
                let done = round.await.map_err(io::Error::other)?;
                drop(slot);
                done
            };
            self.metrics.read_latency.record(t.elapsed().as_secs_f64());
            self.metrics.sent.increment(sent);
            offset += sent;
            result?;
        }
        Ok(())
    }
}

/// Sends up to `want` bytes from `offset` until the socket is full (`WouldBlock` clears the
/// stream's write readiness, so the next `writable()` really waits); returns the bytes sent.
fn send_round(stream: &TcpStream, file: &File, offset: u64, want: u64) -> (u64, io::Result<()>) {
    let mut sent = 0u64;
    while sent < want {
        let r = stream.try_io(Interest::WRITABLE, || {
            let mut off = (offset + sent) as libc::off_t;
            let count = (want - sent).min(1 << 30) as usize;
            // SAFETY: valid descriptors; `off` is a live off_t the kernel advances.
            let n =
                unsafe { libc::sendfile(stream.as_raw_fd(), file.as_raw_fd(), &mut off, count) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as u64)
            }
        });
        match r {
            Ok(0) => {
                let e = io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "object shrank while being sent",
                );
                return (sent, Err(e));
            }
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (sent, Ok(())),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (sent, Err(e)),
        }
    }
    (sent, Ok(()))
}

/// Whether `[offset, offset+len)` of `file` is in the page cache. `cachestat(2)` (Linux 6.5)
/// counts the cached pages without touching them; older kernels get a probe read of the
/// range's first and last byte with `RWF_NOWAIT`, which fails with `EAGAIN` rather than wait
/// for the disk (and also when it would start readahead, so it errs towards the blocking
/// pool).
fn cached(file: &File, offset: u64, len: u64) -> bool {
    static NO_CACHESTAT: AtomicBool = AtomicBool::new(false);
    if !NO_CACHESTAT.load(Ordering::Relaxed) {
        match cachestat_pages(file, offset, len) {
            Ok(pages) => {
                let first = offset / PAGE;
                let last = (offset + len - 1) / PAGE;
                return pages > last - first;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                NO_CACHESTAT.store(true, Ordering::Relaxed)
            }
            Err(_) => return false,
        }
    }
    let probe = |at: u64| {
        let mut byte = 0u8;
        let iov = libc::iovec {
            iov_base: (&mut byte as *mut u8).cast(),
            iov_len: 1,
        };
        // SAFETY: one iovec over a live byte; a valid descriptor.
        let n = unsafe {
            libc::preadv2(
                file.as_raw_fd(),
                &iov,
                1,
                at as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        n == 1
    };
    probe(offset) && probe(offset + len - 1)
}

/// The page size `cachestat` counts in (4 KiB pages on every Linux this runs on; a larger
/// page only makes `cached` answer false, which is safe).
const PAGE: u64 = 4096;

/// The pages of `[offset, offset+len)` in the page cache, by `cachestat(2)`.
fn cachestat_pages(file: &File, offset: u64, len: u64) -> io::Result<u64> {
    // The syscall's number is 451 on every architecture (it came after the tables were
    // unified); libc does not name it for x86_64 yet.
    const SYS_CACHESTAT: libc::c_long = 451;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let range = Range { off: offset, len };
    let mut stat = Stat::default();
    // SAFETY: a valid descriptor and live, correctly laid out range and stat structs.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(stat.nr_cache)
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_head, Head};

    fn answer(raw: &str) -> hyper::Request<()> {
        match parse_head(raw.as_bytes(), 16 << 10) {
            Head::Answer { request, len } => {
                assert_eq!(len, raw.len());
                *request
            }
            other => panic!("{raw:?} gave {other:?}"),
        }
    }

    #[test]
    fn gets_and_heads_without_bodies_are_answered_here() {
        let r = answer("GET /v1/b/a.tar HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\n\r\n");
        assert_eq!(r.uri().path(), "/v1/b/a.tar");
        assert_eq!(r.headers()["range"], "bytes=0-9");
        let r = answer("HEAD /b/k?x-id=1 HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(r.uri().query(), Some("x-id=1"));
        assert!(super::wants_close(&answer(
            "GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n"
        )));
    }

    #[test]
    fn everything_else_goes_to_hyper() {
        for raw in [
            "PUT /v1/b/k HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            "GET /v1/b/k HTTP/1.0\r\n\r\n",
            "GET /v1/b/k HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
            "GET /v1/b/k HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET /v1/b/k HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            "GET /v1/b/k HTTP/1.1\r\nUpgrade: h2c\r\n\r\n",
            "GET http://x/v1/b/k HTTP/1.1\r\n\r\n",
            "GET /v1/b/k HTTP/1.1\r\nBad Header: x\r\n\r\n",
            "\u{1}\u{2} garbage\r\n\r\n",
        ] {
            assert!(
                matches!(parse_head(raw.as_bytes(), 16 << 10), Head::Hyper),
                "{raw:?}"
            );
        }
        let many: String = (0..101).map(|i| format!("X-{i}: y\r\n")).collect();
        let raw = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert!(matches!(parse_head(raw.as_bytes(), 16 << 10), Head::Hyper));
    }

    #[test]
    fn a_file_just_written_and_read_is_cached() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 100_000]).unwrap();
        let _ = std::fs::read(&path).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        assert!(super::cached(&f, 0, 100_000));
        assert!(super::cached(&f, 4095, 2));
    }

    #[test]
    fn partial_heads_wait_until_the_limit() {
        let raw = b"GET /v1/b/k HTTP/1.1\r\nHost: x\r\n";
        assert!(matches!(parse_head(raw, 16 << 10), Head::Partial));
        assert!(matches!(parse_head(b"", 16 << 10), Head::Partial));
        assert!(matches!(parse_head(raw, 16), Head::Hyper));
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(100));
        assert!(matches!(parse_head(big.as_bytes(), 64), Head::Hyper));
    }
}
