//! The HTTP/1.1 server's accept loop and lifecycle. Requests are routed in
//! [`crate::routing`] to the object path ([`crate::objects`]), listings ([`crate::listing`])
//! and the S3 API ([`crate::s3`]).
//!
//! Shape (mini-redis `server.rs`): [`run`] takes a bound listener, a config and a shutdown
//! token; connections are limited by a semaphore, every connection selects on the token, and
//! shutdown drains in-flight streams up to a deadline. Each connection starts in
//! [`crate::connection`], which answers GET and HEAD itself (bodies by sendfile) and hands
//! anything else to hyper ([`crate::routing::serve_hyper`]). Both paths route through
//! `route`, which sees only the request head. hyper's header-read timeout only works with a timer set, so both are set
//! (the slowloris guard). On the hyper path objects stream in `read_size` chunks through a
//! two-chunk channel: memory per stream is bounded whatever the object's size, and a client
//! that stops reading is dropped after the idle timeout.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::StorageConfig;
use crate::mountpath::Mountpath;
use crate::routing::State;

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
    #[error("{0}")]
    UploadTokens(String),
}

/// Serves until `shutdown` is cancelled, then lets in-flight requests finish for up to the
/// configured drain time. `/metrics` renders `metrics`, the recorder the caller installed
/// (`sluice_daemon::metrics_handle`): the library installs none.
pub async fn run(
    listener: TcpListener,
    config: StorageConfig,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
) -> Result<(), StorageError> {
    let admin_stop = CancellationToken::new();
    let _stop_admin = admin_stop.clone().drop_guard();
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
        metrics::gauge!("sluice_storage_mountpath_healthy", "mountpath" => m.label.clone())
            .set(1.0);
    }
    // Tokens from the config and its token files; the files are read again while serving.
    let tokens = crate::upload_tokens::read(&config.upload_tokens, &config.upload_token_files)
        .map_err(StorageError::UploadTokens)?;
    let upload_tokens = Arc::new(crate::upload_tokens::UploadTokens::new(tokens));
    if !config.upload_token_files.is_empty() {
        tokio::spawn(crate::upload_tokens::reread(
            upload_tokens.clone(),
            config.upload_tokens.clone(),
            config.upload_token_files.clone(),
            admin_stop.clone(),
        ));
    }
    let state = Arc::new(State {
        upload_tokens,
        labels: mountpaths.iter().map(|m| m.label.clone()).collect(),
        mountpaths,
        uploaded: Mutex::new(HashMap::new()),
        metrics,
        shutdown: shutdown.clone(),
        config,
    });
    tokio::spawn(check_mountpaths(state.clone(), admin_stop.clone()));
    if let Some(addr) = state.config.metrics_listen {
        let admin = TcpListener::bind(addr)
            .await
            .map_err(StorageError::Accept)?;
        tracing::info!(metrics_listen = %addr, "serving /metrics and /healthz");
        // /healthz turns 503 when the drain starts and answers until the node stops.
        // The same /healthz as the main port's: draining, or mountpaths unavailable.
        let health_of = state.clone();
        tokio::spawn(sluice_daemon::serve_admin_with_health(
            admin,
            state.metrics.clone(),
            shutdown.clone(),
            admin_stop.clone(),
            Some(std::sync::Arc::new(move || health_of.health())),
        ));
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

/// Checks every `timeouts.mountpath_check_secs` that each mountpath is still the directory
/// opened at start and readable; a change is logged once each way, and exported as
/// `sluice_storage_mountpath_healthy` (1 or 0, by mountpath).
async fn check_mountpaths(state: Arc<State>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(state.config.timeouts.mountpath_check());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let checked = state.clone();
        // stat and readdir block (a hung disk may block them for long): off the runtime.
        let Ok(changes) = tokio::task::spawn_blocking(move || {
            checked
                .mountpaths
                .iter()
                .map(|m| (m.label.clone(), m.check()))
                .collect::<Vec<_>>()
        })
        .await
        else {
            continue;
        };
        for (label, change) in changes {
            match change {
                Some(Some(why)) => {
                    tracing::error!(mountpath = %label, "mountpath unavailable: {why}; its \
                        objects answer 503 until it is back");
                    metrics::gauge!("sluice_storage_mountpath_healthy", "mountpath" => label)
                        .set(0.0);
                }
                Some(None) => {
                    tracing::info!(mountpath = %label, "mountpath available again");
                    metrics::gauge!("sluice_storage_mountpath_healthy", "mountpath" => label)
                        .set(1.0);
                }
                None => {}
            }
        }
    }
}
