//! Routing: every request's head goes through [`route`], on the hyper path ([`serve_hyper`])
//! and on the sendfile path ([`crate::connection`]) alike, so both answer the same way. It
//! dispatches to the `/v1/` object path ([`crate::objects`]), listings ([`crate::listing`]),
//! the S3-compatible API ([`crate::s3`]) and the small endpoints (`/healthz`, `/metrics`,
//! `/auth`, `/cluster`); it also holds the server's shared [`State`] and response helpers.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use sluice_shard::Checksum;
use tokio_util::sync::CancellationToken;

use crate::config::StorageConfig;
use crate::listing::list;
use crate::mountpath::{valid_bucket, valid_key, Mountpath};
use crate::objects::{get, put, stream_object, token_ok};
use crate::s3::s3_route;

pub(crate) type Body = BoxBody<Bytes, io::Error>;

pub(crate) struct State {
    pub(crate) config: StorageConfig,
    /// The tokens that may upload now (`crate::upload_tokens`: the files read again).
    pub(crate) upload_tokens: Arc<crate::upload_tokens::UploadTokens>,
    pub(crate) mountpaths: Vec<Mountpath>,
    pub(crate) labels: Vec<String>,
    /// Checksums of objects uploaded here, by (path, size, mtime).
    pub(crate) uploaded: Mutex<HashMap<(String, u64, i64), Checksum>>,
    pub(crate) metrics: PrometheusHandle,
    pub(crate) shutdown: CancellationToken,
}

impl State {
    /// The mountpaths that cannot serve now, with why (see `Mountpath::probe`).
    pub(crate) fn unavailable(&self) -> Vec<(String, String)> {
        self.mountpaths
            .iter()
            .filter_map(|m| m.trouble().map(|t| (m.label.clone(), t)))
            .collect()
    }

    /// `/healthz`: draining (503), ok, degraded (some mountpaths cannot serve; 200, so the
    /// node keeps serving the others), or failed (none can; 503).
    pub(crate) fn health(&self) -> (StatusCode, String) {
        let bad = self.unavailable();
        if self.shutdown.is_cancelled() || bad.is_empty() {
            return sluice_daemon::admin_response(
                "/healthz",
                &self.metrics,
                self.shutdown.is_cancelled(),
            );
        }
        let all = bad.len() == self.mountpaths.len();
        let body = serde_json::json!({
            "status": if all { "failed" } else { "degraded" },
            "unavailable_mountpaths": bad
                .iter()
                .map(|(m, why)| serde_json::json!({"mountpath": m, "why": why}))
                .collect::<Vec<_>>(),
        });
        let status = if all {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        };
        (status, format!("{body}\n"))
    }

    /// Whether `bucket` is served (the config's `buckets`, or every bucket when that is empty).
    pub(crate) fn serves(&self, bucket: &str) -> bool {
        self.config.buckets.is_empty() || self.config.buckets.iter().any(|b| b == bucket)
    }
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

pub(crate) async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
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
        (&Method::GET, "/healthz") => {
            let (status, body) = state.health();
            return Reply::Ready(text(status, &body));
        }
        (&Method::GET, "/metrics") => {
            return Reply::Ready(text(StatusCode::OK, &state.metrics.render()))
        }
        (&Method::GET, "/livez") => {
            let (status, body) = sluice_daemon::admin_response("/livez", &state.metrics, false);
            return Reply::Ready(text(status, &body));
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

pub(crate) fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut r = Response::new(full(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

pub(crate) fn full(b: Bytes) -> Body {
    Full::new(b)
        .map_err(|never: Infallible| match never {})
        .boxed()
}

pub(crate) fn json(status: StatusCode, value: serde_json::Value) -> Response<Body> {
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
pub(crate) struct HttpError(pub(crate) StatusCode, pub(crate) &'static str);

impl From<HttpError> for Response<Body> {
    fn from(e: HttpError) -> Self {
        error(e.0, e.1)
    }
}
