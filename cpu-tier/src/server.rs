//! `sluice cpu`: the worker daemon. A QUIC endpoint (TLS 1.3, a cluster token in the first
//! frame) where each client connection carries one bidirectional stream of frames.
//!
//! Each connection is served by [`crate::connection`], the shell around the worker's rules
//! (`sluice_wire::session::Worker`, one for the whole worker): the Hello and its token,
//! jobs, credits, unit slots shared fairly by job, heartbeats both ways and client silence
//! (a client silent for `client_silence_secs`, or whose connection drops, has its jobs
//! cancelled, which stops its assignments and frees their buffers).
//!
//! SIGTERM (the `shutdown` token): stop accepting connections and assignments (new ones are
//! answered `UnitFailed`, so clients move them at once), let running ones finish for up to
//! `drain_secs`, then close.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_wire::io::{FrameReader, FrameWriter};
use sluice_wire::session::{self, End, Transport, Worker};
use sluice_wire::{ErrorCode, ErrorMessage, Limits, Message, UnitRunner, Welcome};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use crate::config::CpuConfig;
use crate::connection::{Connection, Ended, Outbound, SendError, State};
use crate::tls::{self, Identity, TlsError};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("QUIC endpoint: {0}")]
    Endpoint(#[source] std::io::Error),
    #[error("metrics listener: {0}")]
    Metrics(#[source] std::io::Error),
}

/// Why a worker could not be set up from its config.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("the state directory {} (state_dir in the config, or --state-dir): {source}", .dir.display())]
    StateDir {
        dir: std::path::PathBuf,
        #[source]
        source: TlsError,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Engine(#[from] crate::error::EngineError),
}

/// What a worker daemon runs with.
pub struct Setup {
    pub config: CpuConfig,
    pub identity: Identity,
    /// Its QUIC server settings (TLS from `identity`), made here so that a certificate and
    /// key that do not go together stop the daemon before it says it is serving.
    server: quinn::ServerConfig,
    /// Who may connect: the cluster token, the tenants' tokens, or (`no_auth`) anyone.
    pub admission: session::Admission,
    pub runner: Arc<dyn UnitRunner>,
    /// The same-host transport's Unix socket, when it is on ([`crate::same_host::bind`]).
    pub same_host: Option<crate::same_host::Listener>,
    /// Where `admission` was read from, to read again while serving
    /// ([`sluice_daemon::REREAD_EVERY`] and on SIGHUP); `None` keeps it as given.
    pub reload: Option<crate::admission::AdmissionSource>,
    /// The certificate served, replaced when its files change ([`crate::reload`]).
    certificate: tls::LiveCertificate,
    /// Whose jobs share sweeps' decodes, re-read with `admission` (`None`: a runner that
    /// shares nothing).
    share_scopes: Option<Arc<crate::share::Scopes>>,
}

impl Setup {
    /// A worker as its (validated) config describes it, serving clients with `token`: its
    /// identity (`cert` and `key`, else a self-signed certificate kept in `state_dir` for the
    /// names `listen` answers to), its decoder over the config's shard source, and, when
    /// `same_host.enabled`, its same-host socket for the QUIC `port` (registered with
    /// `runtime`; a worker that cannot make it says why and serves QUIC alone). The one way
    /// the binary, the test bed and the tests set a worker up. Call it off the runtime's
    /// threads: the shard source's HTTP client blocks.
    pub fn from_config(
        config: CpuConfig,
        admission: impl Into<session::Admission>,
        port: u16,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Setup, SetupError> {
        let source = crate::source::ShardSource::new(config.source())
            .map_err(crate::error::EngineError::from)?;
        // Whose jobs share is set from the admission `run` puts in force.
        let scopes = Arc::new(crate::share::Scopes::default());
        let worker = crate::worker::CpuWorker::new(config.engine(), source)?
            .with_max_sample_bytes(u64::from(config.limits.max_payload_bytes))
            .with_sharing(
                crate::share::Window::new(config.limits.share_window_bytes),
                scopes.clone(),
            );
        let mut setup = Setup::with_runner(config, admission, port, runtime, Arc::new(worker))?;
        setup.share_scopes = Some(scopes);
        Ok(setup)
    }

    /// [`Setup::from_config`] decoding with `runner` instead of the config's engine (a
    /// synthetic runner, for transport benchmarks).
    pub fn with_runner(
        config: CpuConfig,
        admission: impl Into<session::Admission>,
        port: u16,
        runtime: &tokio::runtime::Handle,
        runner: Arc<dyn UnitRunner>,
    ) -> Result<Setup, SetupError> {
        let identity = match (&config.cert, &config.key) {
            (Some(c), Some(k)) => tls::load(c, k)?,
            _ => {
                let names = certificate_names(config.listen);
                let id = tls::self_signed(&config.state_dir, &names).map_err(|source| {
                    SetupError::StateDir {
                        dir: config.state_dir.clone(),
                        source,
                    }
                })?;
                info!(cert = %id.cert_path.display(),
                    "using the self-signed certificate; clients pin it with --trust-cert");
                id
            }
        };
        let same_host = match config.same_host.enabled {
            false => None,
            true => {
                let _in_runtime = runtime.enter();
                match crate::same_host::bind(&config.same_host, port) {
                    Ok(l) => {
                        info!(socket = %l.path().display(), "same-host transport on");
                        Some(l)
                    }
                    Err(e) => {
                        warn!("same-host transport off: {e}");
                        None
                    }
                }
            }
        };
        let (server, certificate) = tls::server_config(&identity, transport(&config))?;
        Ok(Setup {
            server,
            config,
            identity,
            admission: admission.into(),
            runner,
            same_host,
            reload: None,
            certificate,
            share_scopes: None,
        })
    }
}

/// The worker's rules from its config.
fn rules(config: &CpuConfig, admission: session::Admission, welcome: Welcome) -> session::Rules {
    let t = &config.timeouts;
    session::Rules {
        admission,
        welcome,
        max_credits: config.limits.max_credits,
        max_units_per_connection: config.limits.max_units_per_connection,
        max_job_weight: config.limits.max_job_weight,
        heartbeat: t.heartbeat(),
        client_silence: t.client_silence(),
        handshake: t.handshake(),
        max_segment_bytes: config.same_host.max_segment_bytes,
    }
}

/// The QUIC transport settings. A worker receives only small control frames, so its receive
/// windows are small; what it sends is bounded by the client's windows and credits.
fn transport(config: &CpuConfig) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(1u32.into());
    t.max_concurrent_uni_streams(0u32.into());
    t.stream_receive_window((1u32 << 20).into());
    t.receive_window((2u32 << 20).into());
    t.keep_alive_interval(Some(config.timeouts.heartbeat()));
    // Tensors are large: let path MTU discovery find jumbo frames and loopback, up to what
    // one GSO send carries; black-hole detection falls back where the path is smaller.
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(sluice_wire::quic::MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    t.send_window(64 << 20);
    t.max_idle_timeout(config.timeouts.client_silence().try_into().ok());
    t
}

/// Serves clients on `socket` until `shutdown`, then drains. `metrics` (when given) serves
/// `/metrics` (the recorder the caller installed, `sluice_daemon::metrics_handle`: the
/// library installs none) and `/healthz`.
pub async fn run(
    socket: std::net::UdpSocket,
    metrics: Option<(tokio::net::TcpListener, sluice_daemon::PrometheusHandle)>,
    setup: Setup,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    let Setup {
        config,
        identity,
        server,
        admission,
        runner,
        same_host,
        reload,
        certificate,
        share_scopes,
    } = setup;
    // The admission in force decides who shares.
    if let Some(scopes) = &share_scopes {
        scopes.set(&admission);
    }
    // The per-job series expire as the config says (the process's first worker decides).
    sluice_daemon::job_series(Some(config.timeouts.job_series()));
    let endpoint = endpoint(socket, server)?;
    let active = match config.limits.max_active_units {
        0 => (runner.threads() as usize * 2).max(2),
        n => n,
    };
    let name = endpoint
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let welcome = Welcome {
        worker: name,
        threads: runner.threads(),
        caches: runner.caches(),
    };
    // Every counter and gauge from the first scrape (an autoscaler's gauge included).
    crate::metrics::register(active);
    let state = Arc::new(State {
        limits: Limits {
            max_header: config.limits.max_header_bytes,
            max_payload: config.limits.max_payload_bytes,
        },
        rules: Mutex::new(Worker::new(rules(&config, admission, welcome), active)),
        connections: Arc::new(Semaphore::new(config.limits.max_connections)),
        draining: CancellationToken::new(),
        mappings: crate::mappings::Mappings::default(),
        runner,
        config,
    });
    let mut tasks = JoinSet::new();
    let admin_stop = CancellationToken::new();
    let _stop_admin = admin_stop.clone().drop_guard();
    if same_host.is_some() {
        tasks.spawn(sweep_mappings(state.clone(), admin_stop.clone()));
    }
    if let Some(source) = reload.filter(|s| s.has_files()) {
        tasks.spawn(crate::reload::reread_admission(
            source,
            state.clone(),
            share_scopes,
            admin_stop.clone(),
        ));
    }
    // The certificate's expiry is watched whatever it is; a configured one is also read
    // again when its files change (cert-manager's renewals).
    let files = state.config.cert.clone().zip(state.config.key.clone());
    tasks.spawn(crate::reload::watch_certificate(
        identity,
        files,
        certificate,
        admin_stop.clone(),
    ));
    if let Some((listener, handle)) = metrics {
        // /healthz turns 503 when the drain starts and answers until the worker stops.
        tasks.spawn(sluice_daemon::serve_admin(
            listener,
            handle,
            state.draining.clone(),
            admin_stop.clone(),
        ));
    }
    loop {
        tokio::select! {
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let Ok(permit) = state.connections.clone().try_acquire_owned() else {
                    metrics::counter!("sluice_cpu_connections_refused_total").increment(1);
                    incoming.refuse();
                    continue;
                };
                let state = state.clone();
                let peer = incoming.remote_address();
                tasks.spawn(
                    async move {
                        serve_connection(incoming, state).await;
                        drop(permit);
                    }
                    .instrument(tracing::info_span!("client", %peer)),
                );
            }
            accepted = accept_same_host(same_host.as_ref()) => {
                let Some(stream) = accepted else { continue };
                let Ok(permit) = state.connections.clone().try_acquire_owned() else {
                    metrics::counter!("sluice_cpu_connections_refused_total").increment(1);
                    continue;
                };
                let state = state.clone();
                tasks.spawn(
                    async move {
                        crate::same_host::serve(stream, state).await;
                        drop(permit);
                    }
                    .instrument(tracing::info_span!("same_host_client")),
                );
            }
            _ = shutdown.cancelled() => break,
        }
        while tasks.try_join_next().is_some() {}
    }
    // No new same-host clients either (the socket file goes with the listener).
    drop(same_host);
    drain(&state, &endpoint, tasks).await;
    Ok(())
}

/// The worker's QUIC endpoint on `socket`.
fn endpoint(
    socket: std::net::UdpSocket,
    server_config: quinn::ServerConfig,
) -> Result<quinn::Endpoint, ServerError> {
    let mut endpoint_config = quinn::EndpointConfig::default();
    endpoint_config
        .max_udp_payload_size(sluice_wire::quic::MAX_UDP_PAYLOAD)
        .map_err(|e| ServerError::Endpoint(std::io::Error::other(e)))?;
    // A send buffer that holds GSO bursts while the client's ACKs catch up.
    if let Some(why) = sluice_wire::quic::grow_buffer(&socket, sluice_wire::quic::Buffer::Send) {
        tracing::debug!("{why}");
    }
    quinn::Endpoint::new(
        endpoint_config,
        Some(server_config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(ServerError::Endpoint)
}

/// Unmaps same-host clients' segments that no connection has used for
/// [`crate::mappings::KEEP_IDLE`], until `stop`.
async fn sweep_mappings(state: Arc<State>, stop: CancellationToken) {
    let every = crate::mappings::KEEP_IDLE / 4;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        state
            .mappings
            .sweep(std::time::Instant::now(), crate::mappings::KEEP_IDLE);
    }
}

/// The drain: new clients and assignments are refused from now; each connection closes once
/// its running units are done (the session's rule), or at the drain deadline.
async fn drain(state: &State, endpoint: &quinn::Endpoint, mut tasks: JoinSet<()>) {
    crate::connection::lock(&state.rules).drain();
    state.draining.cancel();
    endpoint.set_server_config(None);
    let drain = state.config.timeouts.drain();
    info!(
        connections = state.config.limits.max_connections - state.connections.available_permits(),
        "draining for up to {drain:?}"
    );
    let deadline = tokio::time::sleep(drain);
    tokio::pin!(deadline);
    loop {
        // Connection tasks end when their units do (the admin task, when the worker stops).
        let busy = state.config.limits.max_connections - state.connections.available_permits();
        if busy == 0 {
            break;
        }
        tokio::select! {
            _ = &mut deadline => {
                warn!(connections = busy, "drain deadline passed; closing");
                break;
            }
            _ = tasks.join_next() => {}
        }
    }
    endpoint.close(0u32.into(), b"shutting down");
    tasks.abort_all();
    let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
}

/// The next same-host client; never, without the transport.
async fn accept_same_host(
    listener: Option<&crate::same_host::Listener>,
) -> Option<tokio::net::UnixStream> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// An application close code for each refusal, so the client's error says why.
fn close_code(code: ErrorCode) -> u32 {
    match code {
        ErrorCode::Unauthorized => 1,
        ErrorCode::BadRequest => 2,
        ErrorCode::Unavailable => 3,
        ErrorCode::Internal => 4,
    }
}

async fn serve_connection(incoming: quinn::Incoming, state: Arc<State>) {
    let handshake = state.config.timeouts.handshake();
    let conn = match tokio::time::timeout(handshake, incoming).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            metrics::counter!("sluice_cpu_handshake_failures_total").increment(1);
            if e.to_string().contains("error 120") {
                warn!(
                    "TLS handshake failed: the client offered no protocol version this worker \
                     speaks ({}, as TLS ALPN): upgrade workers and clients together ({e})",
                    String::from_utf8_lossy(sluice_wire::message::ALPN)
                );
            } else {
                warn!("TLS handshake failed: {e}");
            }
            return;
        }
        Err(_) => {
            warn!("TLS handshake timed out");
            return;
        }
    };
    let (send, recv) = match tokio::time::timeout(handshake, conn.accept_bi()).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            debug!("connection closed before a stream: {e}");
            return;
        }
        Err(_) => {
            conn.close(
                close_code(ErrorCode::BadRequest).into(),
                b"no stream opened",
            );
            return;
        }
    };
    let reader = FrameReader::new(recv, state.limits);
    let mut out = QuicOut::new(FrameWriter::new(send, state.limits), state.limits);
    // The session checks the Hello (and its time), opens jobs, and runs them.
    let mut connection = Connection::new(state.clone(), Transport::Frames);
    metrics::gauge!("sluice_cpu_connections").increment(1.0);
    let ended = connection.run(reader, &mut out).await;
    // The session's last frames (a drain's, an error's) are written but not flushed.
    let _ = out.flush().await;
    let client = connection.client().to_string();
    drop(connection);
    metrics::gauge!("sluice_cpu_connections").decrement(1.0);
    let mut writer = out.writer;
    match ended {
        Ended::ClientClosed => info!(client = %client, "client left"),
        Ended::Worker(End::Drained) => {
            let _ = writer.get_mut().finish();
            conn.close(
                close_code(ErrorCode::Unavailable).into(),
                b"worker is draining",
            );
            info!(client = %client, "closed for shutdown");
        }
        Ended::Worker(End::Error(code, msg)) => {
            refused(code, &client, &msg);
            refuse(&conn, &mut writer, code, &msg).await;
        }
    }
}

/// Logs (and counts) why a client was turned away or closed.
pub(crate) fn refused(code: ErrorCode, client: &str, why: &str) {
    if code == ErrorCode::Unauthorized {
        metrics::counter!("sluice_cpu_auth_failures_total").increment(1);
        warn!(client = %client, "refused: {why}");
    } else {
        warn!(client = %client, "closing: {why}");
    }
}

async fn refuse(
    conn: &quinn::Connection,
    writer: &mut FrameWriter<quinn::SendStream>,
    code: ErrorCode,
    message: &str,
) {
    let frame = Message::Error(ErrorMessage {
        code,
        message: message.to_string(),
    });
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = writer.send(&frame, &[]).await;
        let _ = writer.get_mut().finish();
        let _ = writer.get_mut().stopped().await;
    })
    .await;
    conn.close(close_code(code).into(), message.as_bytes());
}

/// A QUIC stream: frames are held (their payload buffers as they are, no copy) and handed to
/// quinn on [`Outbound::flush`], so frames a worker finishes close together go out together
/// and wake the client once; at most [`QuicOut::HOLD_BYTES`] are held.
pub(crate) struct QuicOut {
    writer: FrameWriter<quinn::SendStream>,
    limits: Limits,
    held: Vec<bytes::Bytes>,
    held_bytes: usize,
}

impl QuicOut {
    /// About seven 224×224×3 tensors: past this, the frames go out without waiting.
    const HOLD_BYTES: usize = 1 << 20;

    fn new(writer: FrameWriter<quinn::SendStream>, limits: Limits) -> Self {
        QuicOut {
            writer,
            limits,
            held: Vec::new(),
            held_bytes: 0,
        }
    }
}

impl Outbound for QuicOut {
    async fn frame(&mut self, message: &Message, payload: bytes::Bytes) -> Result<(), SendError> {
        let mut head = Vec::with_capacity(128);
        sluice_wire::codec::encode_header(message, payload.len() as u64, &self.limits, &mut head)?;
        self.held_bytes += head.len() + payload.len();
        self.held.push(bytes::Bytes::from(head));
        if !payload.is_empty() {
            self.held.push(payload);
        }
        if self.held_bytes >= Self::HOLD_BYTES {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), SendError> {
        self.held_bytes = 0;
        let stream = self.writer.get_mut();
        for chunk in self.held.drain(..) {
            stream.write_chunk(chunk).await?;
        }
        Ok(())
    }
}

/// The names a self-signed certificate should cover for a listen address.
pub fn certificate_names(listen: SocketAddr) -> Vec<String> {
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if !listen.ip().is_unspecified() && !listen.ip().is_loopback() {
        names.push(listen.ip().to_string());
    }
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let host = host.trim();
        if !host.is_empty() {
            names.push(host.to_string());
        }
    }
    names
}
