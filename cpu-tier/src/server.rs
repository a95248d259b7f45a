//! `sluice cpu`: the worker daemon. A QUIC endpoint (TLS 1.3, a cluster token in the first
//! frame) where each client connection carries one bidirectional stream of frames.
//!
//! Per connection: a reader task turns the stream into messages; the connection task opens
//! jobs, starts each assignment on a blocking thread once a unit slot is free (one FIFO
//! semaphore for the whole worker, so clients share the decode pool in arrival order), and
//! writes what the assignments produce. A sample leaves only against a credit: credits are a
//! semaphore per job that the client's `Credit` frames fill. Heartbeats go both ways; a client
//! silent for `client_silence_secs` (or whose connection drops) has its jobs cancelled, which
//! stops its assignments and frees their buffers.
//!
//! SIGTERM (the `shutdown` token): stop accepting connections and assignments (new ones are
//! answered `UnitFailed`, so clients move them at once), let running ones finish for up to
//! `drain_secs`, then close.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_wire::io::{FrameReader, FrameWriter, IoError};
use sluice_wire::{
    drive_unit, Assign, ErrorCode, ErrorMessage, JobRunner, Limits, Message, Output, UnitEnd,
    UnitFailed, UnitRunner, Welcome,
};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use crate::config::CpuConfig;
use crate::fair::{FairSlots, JobShare};
use crate::tls::{self, Identity, TlsError};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Tls(#[from] TlsError),
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
    /// The cluster token clients must present; `None` only with `no_auth`.
    pub token: Option<String>,
    pub runner: Arc<dyn UnitRunner>,
    /// The same-host transport's Unix socket, when it is on ([`crate::same_host::bind`]).
    pub same_host: Option<crate::same_host::Listener>,
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
        token: Option<String>,
        port: u16,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Setup, SetupError> {
        let source = crate::source::ShardSource::new(config.source())
            .map_err(crate::error::EngineError::from)?;
        let worker = crate::worker::CpuWorker::new(config.engine(), source)?
            .with_max_sample_bytes(u64::from(config.limits.max_payload_bytes));
        Setup::with_runner(config, token, port, runtime, Arc::new(worker))
    }

    /// [`Setup::from_config`] decoding with `runner` instead of the config's engine (a
    /// synthetic runner, for transport benchmarks).
    pub fn with_runner(
        config: CpuConfig,
        token: Option<String>,
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
        Ok(Setup {
            config,
            identity,
            token,
            runner,
            same_host,
        })
    }
}

pub(crate) struct State {
    pub(crate) config: CpuConfig,
    token: Option<String>,
    runner: Arc<dyn UnitRunner>,
    /// Assignments processed at once, over every client, shared fairly by job.
    unit_slots: Arc<FairSlots>,
    connections: Arc<Semaphore>,
    pub(crate) draining: CancellationToken,
    pub(crate) limits: Limits,
    name: String,
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
        token,
        runner,
        same_host,
    } = setup;
    let server_config = tls::server_config(&identity, transport(&config))?;
    let mut endpoint_config = quinn::EndpointConfig::default();
    endpoint_config
        .max_udp_payload_size(sluice_wire::quic::MAX_UDP_PAYLOAD)
        .map_err(|e| ServerError::Endpoint(std::io::Error::other(e)))?;
    // A send buffer that holds GSO bursts while the client's ACKs catch up.
    if let Some(why) = sluice_wire::quic::grow_buffer(&socket, sluice_wire::quic::Buffer::Send) {
        tracing::debug!("{why}");
    }
    let endpoint = quinn::Endpoint::new(
        endpoint_config,
        Some(server_config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(ServerError::Endpoint)?;
    let active = match config.limits.max_active_units {
        0 => (runner.threads() as usize * 2).max(2),
        n => n,
    };
    let name = endpoint
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let state = Arc::new(State {
        limits: Limits {
            max_header: config.limits.max_header_bytes,
            max_payload: config.limits.max_payload_bytes,
        },
        unit_slots: FairSlots::new(active),
        connections: Arc::new(Semaphore::new(config.limits.max_connections)),
        draining: CancellationToken::new(),
        token,
        runner,
        name,
        config,
    });
    let mut tasks = JoinSet::new();
    let admin_stop = CancellationToken::new();
    let _stop_admin = admin_stop.clone().drop_guard();
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
    Ok(())
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

/// Checks a client's Hello: its token, and that the worker still takes clients.
pub(crate) fn admit(state: &State, hello: &sluice_wire::Hello) -> Result<(), (ErrorCode, String)> {
    if let Some(expected) = &state.token {
        if !token_matches(expected, &hello.token) {
            metrics::counter!("sluice_cpu_auth_failures_total").increment(1);
            let why = if hello.token.is_empty() {
                "no cluster token given"
            } else {
                "wrong cluster token"
            };
            warn!(client = %hello.client, "refused: {why}");
            return Err((ErrorCode::Unauthorized, why.into()));
        }
    }
    if state.draining.is_cancelled() {
        return Err((ErrorCode::Unavailable, "worker is draining".into()));
    }
    Ok(())
}

/// The worker's Welcome.
pub(crate) fn welcome(state: &State) -> Message {
    Message::Welcome(Welcome {
        worker: state.name.clone(),
        threads: state.runner.threads(),
        caches: state.runner.caches(),
    })
}

/// Constant-time comparison, so a token cannot be guessed byte by byte from timings.
fn token_matches(expected: &str, given: &str) -> bool {
    let (a, b) = (expected.as_bytes(), given.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
    let mut reader = FrameReader::new(recv, state.limits);
    let mut writer = FrameWriter::new(send, state.limits);
    let hello = match tokio::time::timeout(handshake, reader.next()).await {
        Ok(Ok(Some(Message::Hello(h)))) => h,
        Ok(Ok(Some(other))) => {
            let msg = format!("expected Hello first, got {}", other.kind());
            refuse(&conn, &mut writer, ErrorCode::BadRequest, &msg).await;
            return;
        }
        Ok(Ok(None)) => return,
        Ok(Err(e)) => {
            refuse(&conn, &mut writer, ErrorCode::BadRequest, &e.to_string()).await;
            return;
        }
        Err(_) => {
            refuse(
                &conn,
                &mut writer,
                ErrorCode::BadRequest,
                "no Hello in time",
            )
            .await;
            return;
        }
    };
    if let Err((code, why)) = admit(&state, &hello) {
        refuse(&conn, &mut writer, code, &why).await;
        return;
    }
    if writer.send(&welcome(&state), &[]).await.is_err() {
        return;
    }
    info!(client = %hello.client, "client connected");
    metrics::gauge!("sluice_cpu_connections").increment(1.0);
    let mut session = Session::new(state.clone(), Transport::Quic);
    let mut out = QuicOut(writer, state.limits);
    let reason = session.run(reader, &mut out).await;
    let mut writer = out.0;
    session.close_all();
    metrics::gauge!("sluice_cpu_connections").decrement(1.0);
    match reason {
        End::ClientClosed => info!(client = %hello.client, "client left"),
        End::Drained => {
            let _ = writer.get_mut().finish();
            conn.close(
                close_code(ErrorCode::Unavailable).into(),
                b"worker is draining",
            );
            info!(client = %hello.client, "closed for shutdown");
        }
        End::Error(code, msg) => {
            warn!(client = %hello.client, "closing: {msg}");
            refuse(&conn, &mut writer, code, &msg).await;
        }
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

pub(crate) enum End {
    ClientClosed,
    Drained,
    Error(ErrorCode, String),
}

/// A frame that could not be sent: the stream gone means the client left; a frame this side
/// could not encode (over a limit) is this worker's error, said to the client and logged,
/// never taken for a client leaving.
fn send_failed(e: SendError) -> End {
    match e {
        SendError::Encode(w) | SendError::Stream(sluice_wire::io::IoError::Wire(w)) => End::Error(
            ErrorCode::Internal,
            format!("the worker could not send a frame: {w}"),
        ),
        SendError::Quic(_) | SendError::Stream(_) => End::ClientClosed,
    }
}

/// What an assignment thread sends to its connection. Nearly every one is a frame (a sample
/// each): boxing it would allocate once a sample to save a few bytes on the rare `Finished`.
#[allow(clippy::large_enum_variant)]
enum Produced {
    Frame(Message, bytes::Bytes),
    /// The assignment ended (its `UnitDone`/`UnitFailed` is the frame before).
    Finished,
}

/// Why a frame could not reach a client.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    #[error("encoding a frame: {0}")]
    Encode(#[from] sluice_wire::WireError),
    #[error("QUIC stream: {0}")]
    Quic(#[from] quinn::WriteError),
    #[error(transparent)]
    Stream(#[from] sluice_wire::io::IoError),
}

/// Where a session's frames go.
pub(crate) trait Outbound: Send {
    /// Sends one frame, taking its payload over (a buffered transport may hold it until
    /// [`Outbound::flush`]).
    async fn frame(&mut self, message: &Message, payload: bytes::Bytes) -> Result<(), SendError>;

    /// Sends what `frame` buffered.
    async fn flush(&mut self) -> Result<(), SendError> {
        Ok(())
    }
}

/// A QUIC stream: payloads are handed to quinn as they are (no copy into its buffers).
pub(crate) struct QuicOut(FrameWriter<quinn::SendStream>, Limits);

impl Outbound for QuicOut {
    async fn frame(&mut self, message: &Message, payload: bytes::Bytes) -> Result<(), SendError> {
        send_owned(&mut self.0, message, payload, &self.1).await
    }
}

/// How a session's samples reach its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// Tensors travel in the frames.
    Quic,
    /// Tensors are written into the client's shared-memory slots; one job per connection.
    SameHost,
}

pub(crate) struct Job {
    runner: Arc<dyn JobRunner>,
    credits: Arc<Semaphore>,
    cancel: CancellationToken,
    /// Its place in the worker's fair sharing (left when the job closes).
    share: JobShare,
    /// Samples sent for the training job (`sluice_cpu_job_samples_total{job}`).
    sent: metrics::Counter,
    /// Same-host jobs: the client's segment and the slots it granted.
    slots: Option<Arc<crate::same_host::Slots>>,
}

/// A job dropped in any way (its session ended, the server stopped) cancels its units: one
/// blocked on credit would otherwise hold a blocking thread, and the runtime's shutdown with it.
impl Drop for Job {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub(crate) struct Session {
    state: Arc<State>,
    transport: Transport,
    jobs: HashMap<u64, Job>,
    running: usize,
    out_tx: mpsc::Sender<Produced>,
    out_rx: mpsc::Receiver<Produced>,
}

impl Session {
    pub(crate) fn new(state: Arc<State>, transport: Transport) -> Self {
        let (out_tx, out_rx) = mpsc::channel(64);
        Session {
            state,
            transport,
            jobs: HashMap::new(),
            running: 0,
            out_tx,
            out_rx,
        }
    }

    /// Opens a job: its pipeline is checked and its shape returned.
    pub(crate) fn open_job(
        &mut self,
        spec: &sluice_wire::JobSpec,
    ) -> Result<sluice_wire::SampleShape, (ErrorCode, String)> {
        let bad = |msg: String| Err((ErrorCode::BadRequest, msg));
        if self.jobs.contains_key(&spec.job) {
            return bad(format!("job {} is already open", spec.job));
        }
        if self.transport == Transport::SameHost && !self.jobs.is_empty() {
            return bad("a same-host connection carries one job".into());
        }
        if spec.name.is_empty() || spec.name.len() > 128 || spec.name.chars().any(char::is_control)
        {
            return bad(format!(
                "job {}: its name {:?} must be 1 to 128 printable characters",
                spec.job, spec.name
            ));
        }
        let runner: Arc<dyn JobRunner> = match self.state.runner.open_job(spec) {
            Ok(r) => r.into(),
            Err(e) => {
                let why = sluice_wire::error_chain(&e);
                return bad(format!("job {} ({}): {why}", spec.job, spec.dataset));
            }
        };
        let shape = runner.shape();
        // Not `clamp`: a hand-made config's cap of 0 must not panic here.
        let weight = spec
            .weight
            .min(self.state.config.limits.max_job_weight)
            .max(1);
        info!(job = spec.job, name = %spec.name, weight, dataset = %spec.dataset,
              pipeline = %spec.pipeline, epoch = spec.epoch, rank = spec.rank,
              transport = ?self.transport, "job opened");
        let label = spec.name.clone();
        metrics::gauge!("sluice_cpu_job_weight", "job" => label.clone()).set(f64::from(weight));
        self.jobs.insert(
            spec.job,
            Job {
                runner,
                credits: Arc::new(Semaphore::new(0)),
                cancel: CancellationToken::new(),
                share: self
                    .state
                    .unit_slots
                    .open(spec.name.as_str().into(), weight),
                sent: metrics::counter!("sluice_cpu_job_samples_total", "job" => label),
                slots: None,
            },
        );
        Ok(shape)
    }

    /// Gives a same-host job its client's segment.
    pub(crate) fn attach(&mut self, job: u64, slots: Arc<crate::same_host::Slots>) -> bool {
        match self.jobs.get_mut(&job) {
            Some(j) => {
                j.slots = Some(slots);
                true
            }
            None => false,
        }
    }

    pub(crate) async fn run<R, W>(&mut self, mut reader: FrameReader<R>, writer: &mut W) -> End
    where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
        W: Outbound,
    {
        // The reader is not cancel-safe mid-frame, so it runs on its own task.
        let (in_tx, mut in_rx) = mpsc::channel::<Result<Message, IoError>>(16);
        let reader_task = tokio::spawn(async move {
            loop {
                let next = reader.next().await;
                let end = !matches!(next, Ok(Some(_)));
                let item = match next {
                    Ok(Some(m)) => Ok(m),
                    Ok(None) => break,
                    Err(e) => Err(e),
                };
                if in_tx.send(item).await.is_err() || end {
                    break;
                }
            }
        });
        let _abort = AbortOnDrop(reader_task);
        let timeouts = self.state.config.timeouts.clone();
        let mut tick = tokio::time::interval(timeouts.heartbeat());
        let mut last_heard = Instant::now();
        let mut seq = 0u64;
        let mut draining = false;
        loop {
            tokio::select! {
                incoming = in_rx.recv() => {
                    last_heard = Instant::now();
                    match incoming {
                        None => return End::ClientClosed,
                        Some(Err(e)) => {
                            return match e {
                                IoError::Wire(w) => End::Error(ErrorCode::BadRequest, w.to_string()),
                                _ => End::ClientClosed,
                            };
                        }
                        Some(Ok(m)) => {
                            if let Err((code, msg)) = self.handle(m, writer, draining).await {
                                return End::Error(code, msg);
                            }
                        }
                    }
                }
                Some(produced) = self.out_rx.recv() => {
                    match produced {
                        Produced::Frame(m, payload) => {
                            if let Message::Sample(_) = &m {
                                metrics::counter!("sluice_cpu_samples_sent_total").increment(1);
                                metrics::counter!("sluice_cpu_bytes_sent_total").increment(payload.len() as u64);
                            }
                            if let Message::ShmSample { header, .. } = &m {
                                metrics::counter!("sluice_cpu_same_host_samples_total").increment(1);
                                metrics::counter!("sluice_cpu_bytes_sent_total")
                                    .increment(header.payload_len());
                            }
                            if let Err(e) = writer.frame(&m, payload).await {
                                return send_failed(e);
                            }
                        }
                        Produced::Finished => {
                            self.running -= 1;
                            if draining && self.running == 0 {
                                return End::Drained;
                            }
                        }
                    }
                }
                _ = tick.tick() => {
                    if last_heard.elapsed() > timeouts.client_silence() {
                        return End::Error(ErrorCode::BadRequest, format!(
                            "no frame from the client for {:?}", timeouts.client_silence()));
                    }
                    seq += 1;
                    if writer.frame(&Message::Heartbeat { seq }, bytes::Bytes::new()).await.is_err() {
                        return End::ClientClosed;
                    }
                }
                _ = self.state.draining.cancelled(), if !draining => {
                    draining = true;
                    if self.running == 0 {
                        return End::Drained;
                    }
                }
            }
            // Frames queued behind this one go out in the same write.
            if self.out_rx.is_empty() && writer.flush().await.is_err() {
                return End::ClientClosed;
            }
        }
    }

    /// Handles one client frame; `Err` closes the connection with that code.
    async fn handle<W: Outbound>(
        &mut self,
        message: Message,
        writer: &mut W,
        draining: bool,
    ) -> Result<(), (ErrorCode, String)> {
        let bad = |msg: String| Err((ErrorCode::BadRequest, msg));
        match message {
            Message::Heartbeat { .. } => Ok(()),
            Message::OpenJob(spec) => {
                let shape = self.open_job(&spec)?;
                let opened = Message::JobOpened {
                    job: spec.job,
                    shape,
                };
                writer
                    .frame(&opened, bytes::Bytes::new())
                    .await
                    .map_err(|e| (ErrorCode::Internal, e.to_string()))
            }
            Message::SlotCredit { job, slots } => {
                let Some(j) = self.jobs.get(&job) else {
                    return Ok(()); // a job cancelled a moment ago
                };
                let Some(pool) = &j.slots else {
                    return bad(format!("slot credits for job {job}, which has no segment"));
                };
                let n = pool.grant(&slots).map_err(|e| (ErrorCode::BadRequest, e))?;
                j.credits.add_permits(n);
                Ok(())
            }
            Message::Credit { job, samples } => {
                let Some(j) = self.jobs.get(&job) else {
                    return Ok(()); // a job cancelled a moment ago
                };
                if j.slots.is_some() {
                    return bad(format!("job {job} takes slot credits, not counts"));
                }
                let max = self.state.config.limits.max_credits as usize;
                let room = max.saturating_sub(j.credits.available_permits());
                j.credits.add_permits((samples as usize).min(room));
                Ok(())
            }
            Message::Assign(assign) => {
                let Some(job) = self.jobs.get(&assign.job) else {
                    return bad(format!(
                        "assignment for job {}, which is not open",
                        assign.job
                    ));
                };
                if draining {
                    let failed = Message::UnitFailed(UnitFailed {
                        job: assign.job,
                        unit: assign.unit,
                        attempt: assign.attempt,
                        error: "worker is draining".into(),
                    });
                    return writer
                        .frame(&failed, bytes::Bytes::new())
                        .await
                        .map_err(|e| (ErrorCode::Internal, e.to_string()));
                }
                if self.running >= self.state.config.limits.max_units_per_connection {
                    return bad(format!(
                        "more than limits.max_units_per_connection = {} assignments at once",
                        self.state.config.limits.max_units_per_connection
                    ));
                }
                if self.transport == Transport::SameHost && job.slots.is_none() {
                    return bad(format!("job {} has no segment attached", assign.job));
                }
                if assign.start >= assign.end || assign.end > assign.shard.samples {
                    return bad(format!(
                        "unit {}: samples {}..{} of a {}-sample shard",
                        assign.unit, assign.start, assign.end, assign.shard.samples
                    ));
                }
                self.running += 1;
                spawn_unit(
                    assign,
                    job,
                    self.state.unit_slots.clone(),
                    self.out_tx.clone(),
                );
                Ok(())
            }
            Message::Cancel { job } => {
                if let Some(j) = self.jobs.remove(&job) {
                    j.cancel.cancel();
                    info!(job, "job cancelled by the client");
                }
                Ok(())
            }
            Message::Error(e) => Err((e.code, format!("the client reported: {}", e.message))),
            other => bad(format!("a client does not send {}", other.kind())),
        }
    }

    pub(crate) fn close_all(&mut self) {
        for (_, job) in self.jobs.drain() {
            job.cancel.cancel();
        }
    }
}

/// Sends a frame whose payload buffer QUIC takes over as is (no copy into its send buffer).
async fn send_owned(
    writer: &mut FrameWriter<quinn::SendStream>,
    message: &Message,
    payload: bytes::Bytes,
    limits: &Limits,
) -> Result<(), SendError> {
    let mut head = Vec::with_capacity(128);
    sluice_wire::codec::encode_header(message, payload.len() as u64, limits, &mut head)?;
    let stream = writer.get_mut();
    stream.write_chunk(bytes::Bytes::from(head)).await?;
    if !payload.is_empty() {
        stream.write_chunk(payload).await?;
    }
    Ok(())
}

/// A sample's payload on its way out over QUIC: returned to the job's runner for reuse when
/// quinn has sent it and lets go of it.
struct Returning {
    payload: Vec<u8>,
    runner: Arc<dyn JobRunner>,
}

impl AsRef<[u8]> for Returning {
    fn as_ref(&self) -> &[u8] {
        &self.payload
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        self.runner.recycle(std::mem::take(&mut self.payload));
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs an assignment on a blocking thread once a unit slot is free; its outputs go to the
/// connection, each sample against one credit.
///
/// A unit out of credit gives its slot back while it waits and queues for one again when the
/// credit comes: a job whose consumer does not read (a paused trainer, the next epoch opened
/// early) must not hold the worker's slots against the jobs that do. Held, two such units on a
/// one-thread worker stopped another job's epoch for good.
fn spawn_unit(assign: Assign, job: &Job, slots: Arc<FairSlots>, out: mpsc::Sender<Produced>) {
    let (runner, credits, cancel) = (job.runner.clone(), job.credits.clone(), job.cancel.clone());
    let (name, sent) = (job.share.name().clone(), job.sent.clone());
    let segment = job.slots.clone();
    let rt = tokio::runtime::Handle::current();
    tokio::spawn(async move {
        let queued = Instant::now();
        let permit = tokio::select! {
            p = slots.clone().acquire(name.clone()) => p,
            _ = cancel.cancelled() => None,
        };
        metrics::histogram!("sluice_cpu_unit_queue_seconds").record(queued.elapsed().as_secs_f64());
        let Some(permit) = permit else {
            let _ = out.send(Produced::Finished).await;
            return;
        };
        let unit = assign.unit;
        let span = tracing::info_span!(
            "unit",
            job = assign.job,
            unit,
            attempt = assign.attempt,
            shard = assign.shard.index
        );
        let out_done = out.clone();
        let result = tokio::task::spawn_blocking(move || {
            let _enter = span.enter();
            let dead = AtomicBool::new(false);
            let mut held = Some(permit);
            let take_credit = || {
                if let Ok(credit) = credits.try_acquire() {
                    credit.forget();
                    // Another job waiting for a slot may be owed this one's turn.
                    let Some(permit) = held.take() else {
                        return false;
                    };
                    if slots.keep(&permit) {
                        held = Some(permit);
                        return true;
                    }
                    held = rt.block_on(async {
                        tokio::select! {
                            p = slots.clone().reschedule(permit) => p,
                            _ = cancel.cancelled() => None,
                        }
                    });
                    return held.is_some();
                }
                held = None;
                let waited = Instant::now();
                let again = rt.block_on(async {
                    let credit = tokio::select! {
                        p = credits.acquire() => p.map(|p| p.forget()).is_ok(),
                        _ = cancel.cancelled() => false,
                    };
                    if !credit {
                        return None;
                    }
                    tokio::select! {
                        p = slots.clone().acquire(name.clone()) => p,
                        _ = cancel.cancelled() => None,
                    }
                });
                metrics::histogram!("sluice_cpu_credit_wait_seconds")
                    .record(waited.elapsed().as_secs_f64());
                held = again;
                held.is_some()
            };
            let forward = |output: Output| -> bool {
                let frame = match output {
                    Output::Sample(h, payload) => match &segment {
                        None => {
                            let runner = runner.clone();
                            let payload = bytes::Bytes::from_owner(Returning { payload, runner });
                            Produced::Frame(Message::Sample(h), payload)
                        }
                        Some(segment) => match segment.place(h, &payload) {
                            Ok((m, fields)) => {
                                runner.recycle(payload);
                                Produced::Frame(m, fields.into())
                            }
                            Err(e) => {
                                // The unit fails (and is reassigned); the connection lives.
                                warn!("same-host slot: {e}");
                                return false;
                            }
                        },
                    },
                    Output::Skipped(s) => Produced::Frame(Message::Skipped(s), bytes::Bytes::new()),
                };
                let sample = matches!(
                    frame,
                    Produced::Frame(Message::Sample(_) | Message::ShmSample { .. }, _)
                );
                if cancel.is_cancelled() || out.blocking_send(frame).is_err() {
                    dead.store(true, Ordering::Relaxed);
                    return false;
                }
                if sample {
                    sent.increment(1);
                }
                true
            };
            let end = match drive_unit(&*runner, &assign, take_credit, forward) {
                UnitEnd::Done(done) => {
                    metrics::counter!("sluice_cpu_units_total", "result" => "done").increment(1);
                    Message::UnitDone(done)
                }
                UnitEnd::Failed(failed) => {
                    if !cancel.is_cancelled() {
                        metrics::counter!("sluice_cpu_units_total", "result" => "failed")
                            .increment(1);
                        warn!("assignment failed: {}", failed.error);
                    }
                    Message::UnitFailed(failed)
                }
            };
            if !dead.load(Ordering::Relaxed) && !cancel.is_cancelled() {
                let _ = out.blocking_send(Produced::Frame(end, bytes::Bytes::new()));
            }
        })
        .await;
        match result {
            Err(e) if e.is_panic() => warn!(unit, "assignment thread panicked"),
            // Never started: the runtime shut down first.
            Err(_) => tracing::debug!(unit, "assignment dropped at shutdown"),
            Ok(()) => {}
        }
        let _ = out_done.send(Produced::Finished).await;
    });
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
