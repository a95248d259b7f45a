//! What every Sluice daemon (the storage node, the CPU worker) shares, written once:
//! - [`DaemonConfig`] ([`read_config`], [`parse_config`]): a TOML config file read into the
//!   tier's config type, errors naming the file, then checked by the tier; [`Rereads`], the
//!   turns on which a daemon reads rotated files again;
//! - [`metrics_handle`]: the process's one Prometheus recorder, which every tier in the
//!   process (the demo runs them all) records into;
//! - [`serve_admin`]: the admin listener (`metrics_listen`), with one meaning of health for
//!   every tier: `/healthz` answers 200 `{"status":"ok"}` while the daemon serves and 503
//!   `{"status":"draining"}` from the moment it starts draining, so a load balancer or a
//!   Kubernetes readiness probe stops sending work before the process exits.

use std::convert::Infallible;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusBuilder;
pub use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

/// Why a daemon's configuration is unusable: the file, or a key (named) with a bad value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Parse { path: String, detail: String },
    #[error("config key {key}: {detail}")]
    Invalid { key: &'static str, detail: String },
}

/// Parses TOML text; `origin` names it in errors.
pub fn parse_config<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: origin.to_string(),
        detail: e.to_string(),
    })
}

/// Reads a TOML config file (not validated: the tier applies command-line overrides first).
pub fn read_config<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_config(&text, &path.display().to_string())
}

/// A daemon's TOML config: read from a file or text, then validated key by key. A tier
/// implements [`DaemonConfig::check`]; reading is the same for every tier.
pub trait DaemonConfig: serde::de::DeserializeOwned {
    /// Checks every key; the error names the first bad one.
    fn check(&self) -> Result<(), ConfigError>;

    /// Parses and validates TOML text; `origin` names it in errors.
    fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: Self = parse_config(text, origin)?;
        config.check()?;
        Ok(config)
    }

    /// Takes every relative path the config holds as relative to `dir`, the folder of the
    /// file it came from (not the working directory, which a service manager chooses).
    fn relative_to(&mut self, dir: &Path);

    /// Reads a config file without validating it, so command-line overrides can be applied
    /// first (then [`DaemonConfig::check`]); its relative paths are the file's.
    fn read(path: &Path) -> Result<Self, ConfigError> {
        let mut config: Self = read_config(path)?;
        config.relative_to(path.parent().unwrap_or(Path::new("")));
        Ok(config)
    }
}

/// `path` taken as relative to `dir` when it is relative (an absolute one stays).
pub fn rebase(dir: &Path, path: &mut std::path::PathBuf) {
    if path.is_relative() {
        *path = dir.join(&*path);
    }
}

/// How often a daemon reads the files a rotation changes (tokens, tenants, certificates)
/// again: Kubernetes updates a mounted Secret within about a minute, by swapping a link, and
/// reading a few small files every two seconds costs nothing measurable.
pub const REREAD_EVERY: Duration = Duration::from_secs(2);

/// The turns of a loop that reads a daemon's files again: every [`REREAD_EVERY`], and at once
/// on SIGHUP.
pub struct Rereads {
    hangup: Option<tokio::signal::unix::Signal>,
}

impl Rereads {
    /// Turns on the clock and on SIGHUP (where a SIGHUP handler cannot be installed, on the
    /// clock alone).
    pub fn new() -> Self {
        Rereads {
            hangup: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        }
    }

    /// Turns on the clock alone: a loop with nothing to read again that SIGHUP should not wake.
    pub fn on_the_clock() -> Self {
        Rereads { hangup: None }
    }

    /// Waits for the next turn: `Some(false)` after [`REREAD_EVERY`], `Some(true)` on a SIGHUP,
    /// `None` once `stop` is cancelled.
    pub async fn next(&mut self, stop: &tokio_util::sync::CancellationToken) -> Option<bool> {
        let hup = async {
            match self.hangup.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => None,
            _ = tokio::time::sleep(REREAD_EVERY) => Some(false),
            _ = hup => Some(true),
        }
    }
}

impl Default for Rereads {
    fn default() -> Self {
        Rereads::new()
    }
}

/// How often the recorder folds recorded histogram values into its summaries.
pub const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// The process-wide Prometheus recorder, installed on first use: the binary (or a test bed)
/// calls it and hands the handle to the tiers it runs, which never install one themselves.
/// Every tier and client in the process records into it, so one `/metrics` shows them all. If something else installed a
/// global recorder first (a test harness), this handle renders only its own (empty) registry.
///
/// A thread folds recorded histogram values into their summaries every [`METRICS_UPKEEP`]:
/// the recorder otherwise keeps every value until `/metrics` is rendered, so a daemon nobody
/// scrapes grew by the values of its per-sample histograms (about 20 MB per 800,000 samples
/// on a worker).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            let _ = metrics::set_global_recorder(recorder);
            let upkeep = handle.clone();
            let started = std::thread::Builder::new()
                .name("sluice-metrics".into())
                .spawn(move || loop {
                    std::thread::sleep(METRICS_UPKEEP);
                    upkeep.run_upkeep();
                    // Rendering is what drops the ended jobs' series.
                    let _ = job_series(None).render();
                });
            if let Err(e) = started {
                tracing::warn!("no metrics upkeep thread ({e}): histograms grow until scraped");
            }
            handle
        })
        .clone()
}

/// Serves this process's `/metrics` (and `/healthz`) on `addr` from a thread of its own, for
/// a process that is not a daemon (`sluice loadgen`, a training process through the Python
/// binding): installs the recorder ([`metrics_handle`]) and returns the bound address.
pub fn serve_metrics_in_background(
    addr: std::net::SocketAddr,
) -> std::io::Result<std::net::SocketAddr> {
    let handle = metrics_handle();
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("sluice-metrics-http".into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => {
                        let never = CancellationToken::new();
                        serve_admin(listener, handle, never.clone(), never).await
                    }
                    Err(e) => tracing::warn!("metrics on {bound}: {e}"),
                }
            })
        })?;
    Ok(bound)
}

/// How long a job's series stay on `/metrics` after its last update, unless the daemon says
/// otherwise ([`job_series`]).
pub const JOB_SERIES_TTL: Duration = Duration::from_secs(300);

/// The series a daemon keeps per training job (`{job="..."}`): a registry of their own, so
/// they, and only they, expire once their job has ended. A running job's shell refreshes its
/// series at every heartbeat ([`JobSeries::counter`], [`JobSeries::gauge`] again), so only a
/// job gone for the TTL leaves `/metrics`, and a worker that served 2,000 short jobs shows
/// what it showed before them. `/metrics` renders them after the process's recorder.
pub struct JobSeries {
    recorder: metrics_exporter_prometheus::PrometheusRecorder,
    handle: PrometheusHandle,
}

impl JobSeries {
    /// The counter `name{job="<job>"}` (made when missing, or again after it expired).
    pub fn counter(&self, name: &'static str, job: &str) -> metrics::Counter {
        metrics::with_local_recorder(
            &self.recorder,
            || metrics::counter!(name, "job" => job.to_string()),
        )
    }

    /// The gauge `name{job="<job>"}` (made when missing, or again after it expired).
    pub fn gauge(&self, name: &'static str, job: &str) -> metrics::Gauge {
        metrics::with_local_recorder(
            &self.recorder,
            || metrics::gauge!(name, "job" => job.to_string()),
        )
    }

    /// The series in Prometheus text; expired ones are dropped as this renders.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

/// The process's per-job series, made on first use with series that expire `ttl` after
/// their last update (`None`: [`JOB_SERIES_TTL`]); later calls get the same, whatever `ttl`
/// they give. The upkeep thread renders them every [`METRICS_UPKEEP`], so expired series
/// are dropped even where nobody scrapes.
pub fn job_series(ttl: Option<Duration>) -> &'static JobSeries {
    static SERIES: OnceLock<JobSeries> = OnceLock::new();
    SERIES.get_or_init(|| {
        let all = metrics_util::MetricKindMask::ALL;
        let recorder = PrometheusBuilder::new()
            .idle_timeout(all, Some(ttl.unwrap_or(JOB_SERIES_TTL)))
            .build_recorder();
        let handle = recorder.handle();
        JobSeries { recorder, handle }
    })
}

/// The answer to an admin request: `/metrics`, `/healthz` (by `draining`), `/livez` (always
/// 200 while the process answers), or 404.
pub fn admin_response(
    path: &str,
    metrics: &PrometheusHandle,
    draining: bool,
) -> (StatusCode, String) {
    match path {
        "/metrics" => (
            StatusCode::OK,
            metrics.render() + &job_series(None).render(),
        ),
        "/healthz" if draining => (
            StatusCode::SERVICE_UNAVAILABLE,
            "{\"status\":\"draining\"}\n".into(),
        ),
        "/healthz" => (StatusCode::OK, "{\"status\":\"ok\"}\n".into()),
        // Liveness: the process answers. Never 503 for a drain or a bad disk, so a
        // liveness probe restarts only a daemon that stopped answering (readiness probes
        // /healthz).
        "/livez" => (StatusCode::OK, "{\"status\":\"alive\"}\n".into()),
        _ => (
            StatusCode::NOT_FOUND,
            "{\"error\":\"this address serves /metrics, /healthz and /livez\"}\n".into(),
        ),
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until `stop` is cancelled; `/healthz` turns
/// 503 once `draining` is. A connection gets 5 s to send its head and 30 s in all.
pub async fn serve_admin(
    listener: tokio::net::TcpListener,
    metrics: PrometheusHandle,
    draining: CancellationToken,
    stop: CancellationToken,
) {
    serve_admin_with_health(listener, metrics, draining, stop, None).await
}

/// A daemon's own answer to `/healthz` (status and JSON body), for health that is more than
/// serving or draining: a storage node's unavailable mountpaths.
pub type Health = std::sync::Arc<dyn Fn() -> (StatusCode, String) + Send + Sync>;

/// [`serve_admin`], with `/healthz` answered by `health` when given, so the admin listener
/// (where probes go) says what the daemon's main port says.
pub async fn serve_admin_with_health(
    listener: tokio::net::TcpListener,
    metrics: PrometheusHandle,
    draining: CancellationToken,
    stop: CancellationToken,
    health: Option<Health>,
) {
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                // Out of descriptors and the like: back off rather than spin.
                Err(_) => { tokio::time::sleep(Duration::from_millis(100)).await; continue }
            },
            _ = stop.cancelled() => return,
        };
        let metrics = metrics.clone();
        let draining = draining.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (status, body) = match &health {
                    Some(h) if req.uri().path() == "/healthz" => h(),
                    _ => admin_response(req.uri().path(), &metrics, draining.is_cancelled()),
                };
                let mut response = Response::new(Full::new(Bytes::from(body)));
                *response.status_mut() = status;
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = tokio::time::timeout(
                Duration::from_secs(30),
                hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(5))
                    .serve_connection(TokioIo::new(stream), service),
            )
            .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_means_the_same_for_every_tier() {
        let m = metrics_handle();
        assert_eq!(admin_response("/healthz", &m, false).0, StatusCode::OK);
        let (status, body) = admin_response("/healthz", &m, true);
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("draining"));
        assert_eq!(admin_response("/other", &m, false).0, StatusCode::NOT_FOUND);
    }

    #[test]
    fn config_errors_name_the_file() {
        #[derive(serde::Deserialize, Debug)]
        struct C {
            #[allow(dead_code)]
            port: u16,
        }
        let e = parse_config::<C>("port = 'x'", "cpu.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cpu.toml: "), "{e}");
        let e = read_config::<C>(Path::new("/nonexistent/cpu.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("reading /nonexistent/cpu.toml"), "{e}");
    }

    #[test]
    fn the_admin_listener_answers_and_stops() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (draining, stop) = (CancellationToken::new(), CancellationToken::new());
            let task = tokio::spawn(serve_admin(
                listener,
                metrics_handle(),
                draining.clone(),
                stop.clone(),
            ));
            let get = |path: &'static str| async move {
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.write_all(
                    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await
                .unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).await.unwrap();
                out
            };
            assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
            draining.cancel();
            assert!(get("/healthz").await.starts_with("HTTP/1.1 503"));
            stop.cancel();
            task.await.unwrap();
        });
    }
}
