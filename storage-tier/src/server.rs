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
}

/// The process-wide Prometheus recorder every tier in the process shares.
pub use sluice_daemon::metrics_handle;

/// Serves until `shutdown` is cancelled, then lets in-flight requests finish for up to the
/// configured drain time.
pub async fn run(
    listener: TcpListener,
    config: StorageConfig,
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
        // /healthz turns 503 when the drain starts and answers until the node stops.
        tokio::spawn(sluice_daemon::serve_admin(
            admin,
            state.metrics.clone(),
            shutdown.clone(),
            admin_stop.clone(),
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
