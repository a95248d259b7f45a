//! Links to workers: a task per worker that speaks the wire protocol and turns it into
//! [`Event`]s for the coordinator, and [`Command`]s back into frames.
//!
//! A remote link connects, says hello with the token, opens the epoch's job and then runs
//! until the connection drops or the worker falls silent for `silence`; it then reports the
//! loss and reconnects with backoff (each connection is a new `generation`, and commands meant
//! for an older one are dropped). Refusals (token, certificate, pipeline) are fatal: retrying
//! cannot fix a configuration. An in-process link (`crate::local`) runs the same
//! job in this process, under the same worker rules.
//!
//! A remote link goes over QUIC, or, for a worker on this machine that serves a same-host
//! socket, over that socket with the tensors in a shared-memory segment the loader gives the
//! connection (a kept one that no other process can write any more, or a new one;
//! [`crate::same_host`]): the frames are the same, credits become the slots the worker may
//! write, and a sample arrives as the slot it was written to.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_wire::io::{FrameReader, FrameWriter, IoError};
use sluice_wire::{
    Assign, BufferPool, ErrorCode, Hello, JobSpec, Limits, Message, SampleFields, SampleHeader,
    SamplePayload, SampleShape, SkippedSample, UnitDone, UnitFailed,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::arena::{Arena, PlaceGrant};
use crate::same_host::{Payload, Segments, SlotPool};

/// What links tell the coordinator.
pub(crate) enum Event {
    Ready {
        link: usize,
        generation: u64,
        shape: SampleShape,
        /// The worker keeps a shard cache (see `crate::affinity`).
        caches: bool,
    },
    Sample {
        link: usize,
        header: SampleHeader,
        payload: Payload,
        /// The fields the job asked for (the header's list moved into it).
        fields: SampleFields,
    },
    Skipped {
        skipped: SkippedSample,
    },
    UnitDone {
        link: usize,
        done: UnitDone,
    },
    UnitFailed {
        link: usize,
        failed: UnitFailed,
    },
    Lost {
        link: usize,
        generation: u64,
        error: String,
        /// A refusal that retrying cannot fix.
        fatal: Option<crate::ClientError>,
    },
    /// A worker joined the pool while the epoch ran (`crate::membership`): link `link` (the
    /// next number) goes to it, commanded through `commands`. Sent before the link's task
    /// starts, so it comes before anything the link says.
    Joined {
        link: usize,
        name: String,
        commands: mpsc::Sender<Command>,
    },
    /// Link `link`'s worker left the pool: drain it.
    Left {
        link: usize,
    },
}

/// What the coordinator tells a link, for one generation of its connection.
pub(crate) enum Command {
    Assign(u64, Assign),
    Credit(u64, u32),
    /// Its worker left the pool: its open units should finish, and a worker that left
    /// because it died must not keep them for the whole `silence`, so a short silence (three
    /// heartbeats) now declares it lost.
    Drain,
    /// Same-host connections with the batch arena: places for samples of their units.
    Places(u64, PlaceGrant),
}

/// Settings of a link to a `sluice cpu` daemon.
pub(crate) struct RemoteLink {
    pub link: usize,
    pub addr: SocketAddr,
    pub name: String,
    pub endpoint: quinn::Endpoint,
    pub client_config: quinn::ClientConfig,
    /// The worker's same-host socket, when it is on this machine and serves one.
    pub same_host: Option<SameHostRoute>,
    pub token: String,
    pub client: String,
    pub job: JobSpec,
    pub heartbeat: Duration,
    pub silence: Duration,
    pub connect_timeout: Duration,
    pub limits: Limits,
    /// Credits (and so same-host slots) per connection, as the coordinator sizes them.
    pub credits: u32,
    pub receive_window: u64,
    /// The loader's spare tensor buffers, for payloads read off the stream.
    pub buffers: Arc<BufferPool>,
    /// The loader's same-host segments, kept across connections and epochs.
    pub segments: Arc<Segments>,
    /// Same-host slots beyond the credits, for samples waiting for their turn.
    pub spare_slots: u32,
    /// The connection shares the batch arena: when the epoch ends it releases its places
    /// before it goes.
    pub releasing: AtomicBool,
}

/// The most bytes spare same-host slots make a segment (a quarter of what a worker maps by
/// default, `same_host.max_segment_bytes`); waiting samples past them are copied out.
const SPARE_SEGMENT_BYTES: u64 = 1 << 30;

/// The batch arena of a same-host connection, and the connection's writer id in it.
type Writer = (Arc<Arena>, u64);

/// Where a same-host worker listens, and whether QUIC may stand in when it refuses us.
#[derive(Clone, Debug)]
pub(crate) struct SameHostRoute {
    pub socket: PathBuf,
    pub required: bool,
    /// The user the worker must run as (`same_host_uid`); `None`: this process's.
    pub worker_uid: Option<u32>,
}

/// A connection's two halves as frame reader and writer, and what classifies its end.
struct Wire<R, W> {
    reader: FrameReader<R>,
    writer: FrameWriter<W>,
    /// QUIC's close reason explains an ended stream; a Unix socket has none.
    quic: Option<quinn::Connection>,
}

enum Ended {
    /// Worth reconnecting.
    Lost(String),
    /// The worker closed the connection because it is shutting down (a drain: its units go
    /// elsewhere, and it may come back at the same address).
    Left(String),
    Fatal(crate::ClientError),
    Cancelled,
}

impl RemoteLink {
    pub(crate) async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        events: mpsc::Sender<Event>,
        cancel: CancellationToken,
    ) {
        let mut generation = 0u64;
        let mut backoff = Duration::from_millis(100);
        // The worker drained: failing to reach it again is expected until it is back.
        let mut left = false;
        loop {
            generation += 1;
            let ended = {
                let session = self.session(generation, &mut commands, &events, &cancel);
                tokio::pin!(session);
                let mut cancelled = false;
                loop {
                    tokio::select! {
                        e = &mut session => break e,
                        // A connection sharing the batch arena ends itself: it first asks
                        // its worker to release the places it still holds (`release`,
                        // bounded).
                        _ = cancel.cancelled(), if !cancelled => {
                            if !self.releasing.load(Ordering::Relaxed) {
                                break Ended::Cancelled;
                            }
                            cancelled = true;
                        }
                    }
                }
            };
            let ended = match ended {
                // A same-host socket that will not take us (permissions, another user's
                // worker): QUIC reaches the same worker, unless same-host was required.
                Ended::Fatal(f) if self.same_host.as_ref().is_some_and(|r| !r.required) => {
                    tracing::warn!(worker = %self.name,
                        "same-host transport refused ({f}); using QUIC");
                    self.same_host = None;
                    Ended::Lost(f.to_string())
                }
                e => e,
            };
            // An epoch that ended (or a loader shutting down) takes its links with it, and a
            // link released (its worker left the pool) is not dialed again: a connection that
            // broke on the way is no news.
            if cancel.is_cancelled() || events.is_closed() || commands.is_closed() {
                return;
            }
            let (error, fatal, drained) = match ended {
                Ended::Cancelled => return,
                Ended::Left(reason) => (reason, None, true),
                Ended::Lost(e) => (e, None, false),
                Ended::Fatal(f) => (f.to_string(), Some(f), false),
            };
            let is_fatal = fatal.is_some();
            let reconnecting = error.starts_with("connect:") || error.starts_with("no answer in");
            if drained {
                tracing::info!(worker = %self.name, generation,
                    "worker left the pool ({error}): its units go to the other workers");
                left = true;
            } else if left && reconnecting {
                tracing::debug!(worker = %self.name, generation,
                    "a worker that left is not back yet: {error}");
            } else {
                left = false;
                tracing::warn!(worker = %self.name, generation, "worker lost: {error}");
            }
            let lost = Event::Lost {
                link: self.link,
                generation,
                error,
                fatal,
            };
            if events.send(lost).await.is_err() || is_fatal {
                return;
            }
            // Commands for the lost connection are void.
            while commands.try_recv().is_ok() {}
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = cancel.cancelled() => return,
            }
            if commands.is_closed() {
                return;
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    async fn session(
        &self,
        generation: u64,
        commands: &mut mpsc::Receiver<Command>,
        events: &mpsc::Sender<Event>,
        cancel: &CancellationToken,
    ) -> Ended {
        if let Some(route) = &self.same_host {
            return self
                .same_host_session(route, generation, commands, events, cancel)
                .await;
        }
        let worker = &self.name;
        let connecting = match self.endpoint.connect_with(
            self.client_config.clone(),
            self.addr,
            &server_name(&self.name),
        ) {
            Ok(c) => c,
            Err(e) => return Ended::Lost(format!("connect: {e}")),
        };
        let conn = match tokio::time::timeout(self.connect_timeout, connecting).await {
            Err(_) => return Ended::Lost(format!("no answer in {:?}", self.connect_timeout)),
            Ok(Err(e)) => return classify_connection_error(worker, e),
            Ok(Ok(c)) => c,
        };
        let (send, recv) = match conn.open_bi().await {
            Ok(s) => s,
            Err(e) => {
                conn.close(0u32.into(), b"done");
                return classify_connection_error(worker, e);
            }
        };
        let mut wire = Wire {
            writer: FrameWriter::new(send, self.limits),
            reader: FrameReader::new(recv, self.limits),
            quic: Some(conn.clone()),
        };
        let result = match self.open(&mut wire).await {
            Ok(opened) => {
                let to = (commands, events, cancel);
                self.talk(wire, opened, (None, None), generation, to).await
            }
            Err(e) => e,
        };
        // What the path gave this connection: packet size (6,500 where discovery found room,
        // see sluice_wire::quic), losses and the congestion backoffs they caused.
        let path = conn.stats().path;
        tracing::debug!(worker, mtu = path.current_mtu, lost = path.lost_packets,
            congestion_events = path.congestion_events, rtt = ?path.rtt, "QUIC connection ends");
        conn.close(0u32.into(), b"done");
        result
    }

    /// A connection over the worker's same-host socket: the job's slots live in a segment
    /// that no other process can write while this connection has it (a kept one only once
    /// its last worker can no longer write it, see `crate::same_host`).
    async fn same_host_session(
        &self,
        route: &SameHostRoute,
        generation: u64,
        commands: &mut mpsc::Receiver<Command>,
        events: &mpsc::Sender<Event>,
        cancel: &CancellationToken,
    ) -> Ended {
        let socket = route.socket.display();
        let connect = tokio::net::UnixStream::connect(&route.socket);
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Err(_) => {
                return Ended::Lost(format!(
                    "no answer on {socket} in {:?}",
                    self.connect_timeout
                ))
            }
            // Not allowed, or nobody listening (a socket file left by a killed worker): in
            // auto mode QUIC takes over; when same-host is required, the worker may be
            // restarting, so try again.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::PermissionDenied || !route.required => {
                return Ended::Fatal(crate::ClientError::Refused {
                    worker: self.name.clone(),
                    message: format!("same-host socket {socket}: {e}"),
                })
            }
            Ok(Err(e)) => return Ended::Lost(format!("same-host socket {socket}: {e}")),
            Ok(Ok(s)) => s,
        };
        // Nothing of this process (token, memory) goes to a peer it has not checked.
        if let Err(why) = crate::same_host::check_worker(&route.socket, &stream, route.worker_uid) {
            return Ended::Fatal(crate::ClientError::Refused {
                worker: self.name.clone(),
                message: format!("same-host socket {socket}: {why}"),
            });
        }
        // Watched from now: its segment may be used again once this process is gone.
        let watch = sluice_wire::shm::ProcessWatch::of_peer(&stream)
            .inspect_err(|e| tracing::debug!(worker = %self.name, "not watching the worker: {e}"))
            .ok();
        let arena_watch = sluice_wire::shm::ProcessWatch::of_peer(&stream).ok();
        let (rd, wr) = stream.into_split();
        let mut wire = Wire {
            reader: FrameReader::new(rd, self.limits),
            writer: FrameWriter::new(wr, self.limits),
            quic: None,
        };
        let (shape, caches) = match self.open(&mut wire).await {
            Ok(opened) => opened,
            Err(e) => return e,
        };
        let slots =
            crate::coordinator::credit_window(self.credits, self.receive_window, shape.bytes());
        let room = (SPARE_SEGMENT_BYTES / shape.bytes().max(1)).saturating_sub(u64::from(slots));
        let spare = self.spare_slots.min(room.min(u64::from(u32::MAX)) as u32);
        let segments = self.segments.clone();
        let pool =
            match SlotPool::create(slots, spare, shape.bytes(), self.buffers.clone(), segments) {
                Ok(p) => Arc::new(p),
                Err(e) => return Ended::Fatal(crate::ClientError::Allocate(e.to_string())),
            };
        if let Some(watch) = watch {
            pool.watch(watch);
        }
        let arena = self.segments.arena(shape.bytes());
        let attach = pool
            .segment()
            .attach(self.job.job, arena.as_ref().map(|a| a.segment()));
        if let Err(e) = wire.writer.send(&Message::ShmAttach(attach), &[]).await {
            return Ended::Lost(e.to_string());
        }
        let half: &tokio::net::unix::OwnedWriteHalf = wire.writer.get_mut();
        if let Err(e) = sluice_wire::shm::send_fd(half.as_ref(), pool.segment().fd()).await {
            return Ended::Lost(e.to_string());
        }
        if let Some(a) = &arena {
            if let Err(e) = sluice_wire::shm::send_fd(half.as_ref(), a.segment().fd()).await {
                return Ended::Lost(e.to_string());
            }
        }
        match self.expect(&mut wire).await {
            Ok(Message::ShmAttached { job }) if job == self.job.job => {}
            Ok(other) => return self.unexpected(other, "ShmAttached"),
            Err(e) => return e,
        }
        tracing::debug!(worker = %self.name, slots, spare, arena = arena.is_some(),
            "same-host segment attached");
        let writer = arena.map(|a| {
            let w = a.writer();
            (a, w)
        });
        // However this connection ends (even dropped), the places it still owns are settled
        // once its worker's process exits; until then it ends itself when the epoch does.
        let _ended = WriterEnd {
            releasing: &self.releasing,
            writer: writer.clone(),
            watch: arena_watch,
        };
        self.releasing.store(writer.is_some(), Ordering::Relaxed);
        self.talk(
            wire,
            (shape, caches),
            (Some(pool), writer),
            generation,
            (commands, events, cancel),
        )
        .await
    }

    /// Hello, then the job: the shape the worker will produce.
    /// The job's sample shape, and whether the worker keeps a shard cache.
    async fn open<R, W>(&self, wire: &mut Wire<R, W>) -> Result<(SampleShape, bool), Ended>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let hello = Message::Hello(Hello {
            token: self.token.clone(),
            client: self.client.clone(),
        });
        if let Err(e) = wire.writer.send(&hello, &[]).await {
            return Err(Ended::Lost(e.to_string()));
        }
        let caches = match self.expect(wire).await? {
            Message::Welcome(w) => w.caches,
            other => return Err(self.unexpected(other, "Welcome")),
        };
        if let Err(e) = wire
            .writer
            .send(&Message::OpenJob(self.job.clone()), &[])
            .await
        {
            return Err(Ended::Lost(e.to_string()));
        }
        match self.expect(wire).await? {
            Message::JobOpened { job, shape } if job == self.job.job => Ok((shape, caches)),
            other => Err(self.unexpected(other, "JobOpened")),
        }
    }

    async fn talk<R, W>(
        &self,
        wire: Wire<R, W>,
        (shape, caches): (SampleShape, bool),
        (pool, arena): (Option<Arc<SlotPool>>, Option<Writer>),
        generation: u64,
        (commands, events, cancel): (
            &mut mpsc::Receiver<Command>,
            &mpsc::Sender<Event>,
            &CancellationToken,
        ),
    ) -> Ended
    where
        R: TensorRead + Send + 'static,
        W: AsyncWrite + Unpin + Send,
    {
        let worker = &self.name;
        let Wire {
            reader,
            mut writer,
            quic,
        } = wire;
        if events
            .send(Event::Ready {
                link: self.link,
                generation,
                shape,
                caches,
            })
            .await
            .is_err()
        {
            return Ended::Cancelled;
        }
        // Reading is not cancel-safe mid-frame: it runs on its own task, which forwards
        // events itself (bounded), so a slow coordinator slows the reader and then QUIC.
        let (end_tx, mut end_rx) = mpsc::channel::<Ended>(1);
        let heard = Arc::new(Heard::new());
        let reader_task = tokio::spawn(read_frames(
            reader,
            ReadTo {
                heard: heard.clone(),
                link: self.link,
                worker: worker.clone(),
                shape,
                job: self.job.job,
                pool: pool.clone(),
                arena: arena.clone(),
                buffers: self.buffers.clone(),
                events: events.clone(),
                end: end_tx,
            },
        ));
        let _abort = AbortOnDrop(reader_task);
        let mut tick = tokio::time::interval(self.heartbeat);
        let mut seq = 0;
        let mut silence = self.silence;
        loop {
            tokio::select! {
                ended = end_rx.recv() => {
                    let ended = ended.unwrap_or(Ended::Lost("reader stopped".into()));
                    // A stream that broke because the worker closed for shutdown is a drain;
                    // any other end stays what the reader said.
                    let closed = quic.as_ref().and_then(|c| c.close_reason());
                    return match (ended, closed) {
                        (Ended::Lost(lost), Some(e)) => match classify_connection_error(worker, e) {
                            left @ Ended::Left(_) => left,
                            _ => Ended::Lost(lost),
                        },
                        (ended, _) => ended,
                    };
                }
                // Only a connection sharing the batch arena is let see this (`run`).
                _ = cancel.cancelled() => {
                    release(&mut writer, &arena, &heard, self.job.job).await;
                    return Ended::Cancelled;
                }
                command = commands.recv() => {
                    let frame = match (command, &pool) {
                        (None, _) => {
                            release(&mut writer, &arena, &heard, self.job.job).await;
                            return Ended::Cancelled;
                        }
                        (Some(Command::Drain), _) => {
                            silence = silence.min(self.heartbeat * 3);
                            continue;
                        }
                        (Some(Command::Assign(g, a)), pool) if g == generation => {
                            if let Some(p) = pool {
                                p.assigned(a.unit, a.attempt, a.end.saturating_sub(a.start));
                            }
                            Message::Assign(a)
                        }
                        (Some(Command::Credit(g, n)), None) if g == generation => {
                            Message::Credit { job: self.job.job, samples: n }
                        }
                        // Same-host credits are slots: those free now go at once, the rest
                        // as the batches they were copied into release them.
                        (Some(Command::Credit(g, n)), Some(p)) if g == generation => {
                            match p.grant(n, 1) {
                                Some(slots) => Message::SlotCredit { job: self.job.job, slots },
                                None => continue,
                            }
                        }
                        // Owned by this connection once handed, before the frame goes out:
                        // its answers may come back at once.
                        (Some(Command::Places(g, grant)), _) if g == generation => {
                            let handed = arena.as_ref().and_then(|(a, w)| grant.hand(a, *w));
                            match handed {
                                Some(places) => Message::ShmPlaces { job: self.job.job, places },
                                None => continue,
                            }
                        }
                        (Some(_), _) => continue,
                    };
                    if let Err(e) = writer.send(&frame, &[]).await {
                        return Ended::Lost(e.to_string());
                    }
                }
                _ = released(&pool) => {
                    if let Some(slots) = pool.as_ref().and_then(|p| p.regrant()) {
                        let frame = Message::SlotCredit { job: self.job.job, slots };
                        if let Err(e) = writer.send(&frame, &[]).await {
                            return Ended::Lost(e.to_string());
                        }
                    }
                }
                _ = tick.tick() => {
                    if heard.since() > silence {
                        return Ended::Lost(format!(
                            "no frame from the worker for {silence:?}"));
                    }
                    seq += 1;
                    if let Err(e) = writer.send(&Message::Heartbeat { seq }, &[]).await {
                        return Ended::Lost(e.to_string());
                    }
                }
            }
        }
    }

    async fn expect<R, W>(&self, wire: &mut Wire<R, W>) -> Result<Message, Ended>
    where
        R: AsyncRead + Unpin,
    {
        let reader = &mut wire.reader;
        let next = async {
            loop {
                match reader.next().await {
                    Ok(Some(Message::Heartbeat { .. })) => continue,
                    other => return other,
                }
            }
        };
        match tokio::time::timeout(self.connect_timeout, next).await {
            Err(_) => Err(Ended::Lost(format!(
                "no answer in {:?}",
                self.connect_timeout
            ))),
            Ok(Ok(Some(Message::Error(e)))) => Err(refusal(&self.name, e.code, e.message)),
            Ok(Ok(Some(m))) => Ok(m),
            Ok(Ok(None)) | Ok(Err(IoError::Io(_))) | Ok(Err(IoError::Truncated)) => {
                match wire.quic.as_ref().and_then(|c| c.close_reason()) {
                    Some(e) => Err(classify_connection_error(&self.name, e)),
                    None => Err(Ended::Lost("the worker closed the stream".into())),
                }
            }
            Ok(Err(e)) => Err(Ended::Fatal(crate::ClientError::Protocol {
                worker: self.name.clone(),
                detail: e.to_string(),
            })),
        }
    }

    fn unexpected(&self, got: Message, wanted: &str) -> Ended {
        Ended::Fatal(crate::ClientError::Protocol {
            worker: self.name.clone(),
            detail: format!("expected {wanted}, got {}", got.kind()),
        })
    }
}

fn refusal(worker: &str, code: ErrorCode, message: String) -> Ended {
    match code {
        // A draining or full worker may take us later.
        ErrorCode::Unavailable | ErrorCode::Internal => Ended::Lost(message),
        ErrorCode::Unauthorized | ErrorCode::BadRequest => {
            Ended::Fatal(crate::ClientError::Refused {
                worker: worker.to_string(),
                message,
            })
        }
    }
}

fn classify_connection_error(worker: &str, e: quinn::ConnectionError) -> Ended {
    use quinn::ConnectionError as C;
    match &e {
        // TLS alert 120, no_application_protocol: the worker speaks another protocol version.
        C::TransportError(_) | C::ConnectionClosed(_) if e.to_string().contains("error 120") => {
            Ended::Fatal(crate::ClientError::Refused {
                worker: worker.to_string(),
                message: format!(
                    "it does not speak this client's protocol version ({}, offered as TLS \
                     ALPN): upgrade workers and clients together ({e})",
                    String::from_utf8_lossy(sluice_wire::message::ALPN)
                ),
            })
        }
        C::TransportError(_)
            if e.to_string().contains("cryptographic handshake")
                || e.to_string().contains("certificate") =>
        {
            Ended::Fatal(crate::ClientError::Tls {
                worker: worker.to_string(),
                detail: e.to_string(),
            })
        }
        C::ApplicationClosed(a) => {
            let reason = String::from_utf8_lossy(&a.reason).into_owned();
            match u64::from(a.error_code) {
                1 => refusal(worker, ErrorCode::Unauthorized, reason),
                2 => refusal(worker, ErrorCode::BadRequest, reason),
                // Unavailable: the worker is draining for a shutdown or restart.
                3 if reason.contains("draining") => Ended::Left(reason),
                _ => Ended::Lost(format!("closed by the worker: {reason}")),
            }
        }
        _ => Ended::Lost(e.to_string()),
    }
}

/// The TLS name to ask for: the host part of `host:port`.
fn server_name(worker: &str) -> String {
    // A link's label: `name`, `name (address)` for one of a DNS name's workers, and ` #n`
    // after either for one of several connections.
    let worker = worker.split(" (").next().unwrap_or(worker);
    let worker = worker.split(" #").next().unwrap_or(worker);
    let host = worker.rsplit_once(':').map_or(worker, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        "localhost".into()
    } else {
        host.to_string()
    }
}

/// When the reader last got a frame.
/// While the reader waits for room in the coordinator's queue (a slow consumer), the worker
/// is not silent, only unread.
struct Heard {
    base: Instant,
    nanos: std::sync::atomic::AtomicU64,
    waiting: std::sync::atomic::AtomicBool,
    /// The worker released the job's batch places (`ShmReleased`).
    released: tokio::sync::Notify,
}

impl Heard {
    fn new() -> Self {
        Heard {
            base: Instant::now(),
            nanos: std::sync::atomic::AtomicU64::new(0),
            waiting: std::sync::atomic::AtomicBool::new(false),
            released: tokio::sync::Notify::new(),
        }
    }

    fn now(&self) {
        let n = self.base.elapsed().as_nanos() as u64;
        self.nanos.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    fn waiting(&self, yes: bool) {
        self.waiting
            .store(yes, std::sync::atomic::Ordering::Relaxed);
        self.now();
    }

    fn since(&self) -> Duration {
        if self.waiting.load(std::sync::atomic::Ordering::Relaxed) {
            return Duration::ZERO;
        }
        let then = Duration::from_nanos(self.nanos.load(std::sync::atomic::Ordering::Relaxed));
        self.base.elapsed().saturating_sub(then)
    }
}

/// Where the reader task sends what it reads.
struct ReadTo {
    heard: Arc<Heard>,
    link: usize,
    worker: String,
    shape: SampleShape,
    job: u64,
    /// Same-host connections: the segment samples arrive in.
    pool: Option<Arc<SlotPool>>,
    /// Same-host connections with the batch arena: it, and this connection's writer there.
    arena: Option<Writer>,
    buffers: Arc<BufferPool>,
    events: mpsc::Sender<Event>,
    end: mpsc::Sender<Ended>,
}

/// How a transport's stream hands over a sample's tensor.
trait TensorRead: AsyncRead + Unpin + Sized {
    /// The next `len` bytes of the frame's payload, as the sample's tensor.
    fn tensor<'a>(
        reader: &'a mut FrameReader<Self>,
        len: usize,
        buffers: &'a Arc<BufferPool>,
    ) -> impl std::future::Future<Output = Result<Payload, IoError>> + Send + 'a;
}

/// QUIC: the stream's own chunks (its decrypted packets), not copied into a buffer first;
/// the coordinator copies them once, into the batch.
impl TensorRead for quinn::RecvStream {
    async fn tensor(
        reader: &mut FrameReader<Self>,
        len: usize,
        _buffers: &Arc<BufferPool>,
    ) -> Result<Payload, IoError> {
        let stream = reader.take_payload(len as u64)?;
        let mut chunks = Vec::with_capacity(len / 1200 + 1);
        let mut left = len;
        while left > 0 {
            match stream.read_chunk(left, true).await {
                Ok(Some(chunk)) => {
                    left -= chunk.bytes.len().min(left);
                    chunks.push(chunk.bytes);
                }
                Ok(None) => return Err(IoError::Truncated),
                Err(e) => return Err(IoError::Io(e.into())),
            }
        }
        Ok(Payload::Chunks(chunks))
    }
}

/// The same-host socket carries tensors in slots; one in a frame (a protocol error the
/// reader reports before asking) would be read into a reused buffer.
impl TensorRead for tokio::net::unix::OwnedReadHalf {
    async fn tensor(
        reader: &mut FrameReader<Self>,
        len: usize,
        buffers: &Arc<BufferPool>,
    ) -> Result<Payload, IoError> {
        let mut payload = crate::buffers::take(buffers, len);
        reader.payload_part_into(&mut payload).await?;
        Ok(Payload::Bytes(payload))
    }
}

async fn read_frames<R: TensorRead>(mut reader: FrameReader<R>, to: ReadTo) {
    let ReadTo {
        heard,
        link,
        worker,
        shape,
        job,
        pool,
        arena,
        buffers,
        events,
        end,
    } = to;
    let answered = |unit: u64, attempt: u32, index: u64| {
        if let Some((a, w)) = &arena {
            a.answered(*w, (unit, attempt, index));
        }
    };
    let protocol = |detail: String| {
        Ended::Fatal(crate::ClientError::Protocol {
            worker: worker.clone(),
            detail,
        })
    };
    let ended = loop {
        let message = match reader.next().await {
            Ok(Some(m)) => {
                heard.now();
                m
            }
            Ok(None) => break Ended::Lost("the worker closed the stream".into()),
            Err(IoError::Wire(w)) => break protocol(w.to_string()),
            Err(e) => break Ended::Lost(e.to_string()),
        };
        let event = match message {
            Message::Heartbeat { .. } => continue,
            Message::ShmSample { slot, header } => {
                let Some(pool) = &pool else {
                    break protocol("a shared-memory sample over QUIC".into());
                };
                if let Err(e) = same_host_header(&header, job, shape) {
                    break protocol(e);
                }
                let slot = match pool.filled(slot) {
                    Ok(s) => s,
                    Err(e) => break protocol(e),
                };
                pool.answered(header.unit, header.attempt);
                answered(header.unit, header.attempt, header.index);
                // The tensor is in the slot; the fields ride in the frame.
                match sample(link, &mut reader, header, Payload::Slot(slot)).await {
                    Ok(event) => event,
                    Err(e) => break e,
                }
            }
            Message::ShmPlaced {
                slot,
                place,
                header,
            } => {
                let (Some(pool), Some((arena, writer))) = (&pool, &arena) else {
                    break protocol("a sample in a batch place, but no batch arena".into());
                };
                if let Err(e) = same_host_header(&header, job, shape) {
                    break protocol(e);
                }
                // The credit's slot comes back unused.
                if let Err(e) = pool.filled(slot) {
                    break protocol(e);
                }
                pool.answered(header.unit, header.attempt);
                let key = (header.unit, header.attempt, header.index);
                if let Err(e) = arena.placed(*writer, place, key) {
                    break protocol(e);
                }
                let payload = Payload::Placed {
                    arena: arena.clone(),
                    place,
                };
                match sample(link, &mut reader, header, payload).await {
                    Ok(event) => event,
                    Err(e) => break e,
                }
            }
            Message::Sample(_) if pool.is_some() => {
                break protocol("a sample in the frame over the same-host socket".into());
            }
            Message::Sample(header) => {
                if header.tensor_bytes != shape.bytes() {
                    break protocol(format!(
                        "sample {:?} has {} tensor bytes, the job's shape has {}",
                        header.key,
                        header.tensor_bytes,
                        shape.bytes()
                    ));
                }
                if header.job != job {
                    if let Err(e) = reader.skip_payload().await {
                        break Ended::Lost(e.to_string());
                    }
                    continue;
                }
                // Bounded by the frame limits before these allocations: the tensor as the
                // transport hands it over, the fields (if any) into their own buffer.
                let tensor_bytes = header.tensor_bytes as usize;
                let payload = match R::tensor(&mut reader, tensor_bytes, &buffers).await {
                    Ok(p) => p,
                    Err(e) => break Ended::Lost(e.to_string()),
                };
                match sample(link, &mut reader, header, payload).await {
                    Ok(event) => event,
                    Err(e) => break e,
                }
            }
            Message::Skipped(skipped) => {
                if let Some(p) = &pool {
                    p.answered(skipped.unit, skipped.attempt);
                }
                answered(skipped.unit, skipped.attempt, skipped.index);
                Event::Skipped { skipped }
            }
            Message::UnitDone(done) => {
                if let Some(p) = &pool {
                    p.unit_ended(done.unit, done.attempt);
                }
                if let Some((a, w)) = &arena {
                    a.unit_ended(*w, done.unit, done.attempt);
                }
                Event::UnitDone { link, done }
            }
            Message::UnitFailed(failed) => {
                if let Some(p) = &pool {
                    p.unit_ended(failed.unit, failed.attempt);
                }
                if let Some((a, w)) = &arena {
                    a.unit_ended(*w, failed.unit, failed.attempt);
                }
                Event::UnitFailed { link, failed }
            }
            Message::Error(e) => break refusal(&worker, e.code, e.message),
            // The job is cancelled: its places in the batch arena are this process's again.
            Message::ShmReleased { job: j } if j == job => {
                if let Some((a, w)) = &arena {
                    a.released(*w);
                }
                heard.released.notify_one();
                continue;
            }
            other => break protocol(format!("a worker does not send {}", other.kind())),
        };
        heard.waiting(true);
        let sent = events.send(event).await;
        heard.waiting(false);
        // The epoch is over. A connection sharing the batch arena keeps reading (the samples'
        // answers settle their places) until its worker releases the rest; the link ends it.
        if sent.is_err() && arena.is_none() {
            break Ended::Cancelled;
        }
    };
    let _ = end.send(ended).await;
}

/// A same-host sample's header names the connection's job and its shape's tensor size.
fn same_host_header(header: &SampleHeader, job: u64, shape: SampleShape) -> Result<(), String> {
    if header.tensor_bytes != shape.bytes() || header.job != job {
        return Err(format!(
            "sample {:?} of job {} with {} tensor bytes; the job is {job} with {}",
            header.key,
            header.job,
            header.tensor_bytes,
            shape.bytes()
        ));
    }
    Ok(())
}

/// A sample whose tensor is in `payload`: the rest of its frame's payload, its fields, is read
/// into a buffer of their own, the header's list of (name, length) moved into them. The
/// lengths are checked against what the frame still holds (bounded by the frame limits)
/// before anything is allocated.
async fn sample<R: AsyncRead + Unpin>(
    link: usize,
    reader: &mut FrameReader<R>,
    mut header: SampleHeader,
    payload: Payload,
) -> Result<Event, Ended> {
    let len = header.fields_len();
    let pending = reader.pending_payload();
    if len != pending {
        return Err(Ended::Lost(format!(
            "sample {:?}: its fields add up to {len} bytes, its frame holds {pending} more",
            header.key
        )));
    }
    let mut bytes = vec![0u8; len as usize];
    if len > 0 {
        reader
            .payload_into(&mut bytes)
            .await
            .map_err(|e| Ended::Lost(e.to_string()))?;
    }
    let fields = SamplePayload::fields(&mut header, bytes).map_err(Ended::Lost)?;
    Ok(Event::Sample {
        link,
        header,
        payload,
        fields,
    })
}

/// Marks the end of a same-host connection that shared the batch arena (see `run`).
struct WriterEnd<'a> {
    releasing: &'a AtomicBool,
    writer: Option<Writer>,
    watch: Option<sluice_wire::shm::ProcessWatch>,
}

impl Drop for WriterEnd<'_> {
    fn drop(&mut self) {
        self.releasing.store(false, Ordering::Relaxed);
        if let Some((arena, w)) = self.writer.take() {
            arena.writer_ended(w, self.watch.take());
        }
    }
}

/// How long a link whose epoch ended waits for its worker to release the places it still
/// owns in the batch arena (its units were cut mid-way). Past it, they stay owned until that
/// worker's process exits.
const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// The epoch ended with places of the batch arena owned by this connection (an epoch left
/// early): cancels the job and waits for the worker to say it writes none of them any more,
/// so they need not wait for its process to exit.
async fn release<W: AsyncWrite + Unpin + Send>(
    writer: &mut FrameWriter<W>,
    arena: &Option<Writer>,
    heard: &Heard,
    job: u64,
) {
    let Some((a, w)) = arena.as_ref().filter(|(a, w)| a.owns_any(*w)) else {
        return;
    };
    let released = heard.released.notified();
    if writer.send(&Message::Cancel { job }, &[]).await.is_err() {
        return;
    }
    if tokio::time::timeout(RELEASE_WAIT, released).await.is_err() {
        tracing::debug!("the worker did not release its batch places in time");
    }
    tracing::debug!(still_owned = a.owns_any(*w), "batch places released");
}

/// Resolves when the consumer gave slots back (never on a QUIC link).
async fn released(pool: &Option<Arc<SlotPool>>) {
    match pool {
        Some(p) => p.released().await,
        None => std::future::pending().await,
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
