//! What the daemon subcommands (and the tools that talk to them) share: structured logs,
//! systemd readiness and watchdog, and a shutdown token cancelled by SIGTERM or SIGINT (the
//! cluster token file is read by `sluice_wire::token`).

use anyhow::Result;
use tokio_util::sync::CancellationToken;

/// Logs to stderr (`RUST_LOG` filters; default `info`).
pub fn init_logs() {
    init_logs_at("info");
}

/// Logs to stderr (`RUST_LOG` filters; default `level`).
pub fn init_logs_at(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

/// A token cancelled on SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> Result<CancellationToken> {
    use tokio::signal::unix::{signal, SignalKind};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // SIGHUP never ends a daemon (its default would): a worker reads its tenants and token
    // files again on it, through a stream of its own.
    let mut hangup = signal(SignalKind::hangup())?;
    tokio::spawn(async move { while hangup.recv().await.is_some() {} });
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: draining"),
            _ = int.recv() => tracing::info!("SIGINT: draining"),
        }
        t.cancel();
    });
    Ok(token)
}

/// Tells systemd we are ready (a no-op outside systemd) and pings its watchdog at half the
/// configured interval until `shutdown`.
pub fn notify_ready(shutdown: &CancellationToken) {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    if let Some(interval) = sd_notify::watchdog_enabled() {
        let token = shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval / 2);
            loop {
                tokio::select! {
                    _ = tick.tick() => { let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]); }
                    _ = token.cancelled() => break,
                }
            }
        });
    }
}

/// Tells systemd we are stopping.
pub fn notify_stopping() {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
}
