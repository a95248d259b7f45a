//! Links to workers: a task per worker that carries out what its connection's
//! [`Session`](crate::session::Session) decides, turning frames into [`Event`]s for the
//! coordinator and its [`Command`]s into frames.
//!
//! A remote link dials its worker, drives a session over the connection until it ends
//! (dropped, silent, refused, or the epoch over), reports the loss and dials again with the
//! backoff [`Redial`] says (each connection a new generation; commands for an older one are
//! void). Every rule of the connection is the session's; this module owns the sockets, the
//! clock and the memory frames point into. An in-process link (`crate::local`) runs the same
//! job in this process, under the same worker rules.
//!
//! A remote link goes over QUIC, or, for a worker on this machine that serves a same-host
//! socket, over that socket with the tensors in a shared-memory segment the loader gives the
//! connection (a kept one that no other process can write any more, or a new one;
//! [`crate::same_host`]): the frames are the same, credits become the slots the worker may
//! write, and a sample arrives as the slot it was written to.

mod read;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sluice_wire::io::{FrameReader, FrameWriter, IoError};
use sluice_wire::{
    BufferPool, Hello, JobSpec, Limits, Message, SampleFields, SampleHeader, SampleShape,
    SkippedSample, UnitDone, UnitFailed,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::arena::Arena;
use crate::clock::{fired, now, sleep_until};
use crate::same_host::{Payload, Segments, SlotPool};
use crate::session::{
    closed_by_worker, credit_window, Command, Commanded, Ended, Received, Redial, Session,
    Settings, Tone, Transport,
};
use read::{read_frames, ReadTo, TensorRead};

/// What links tell the coordinator.
// Nearly every event is a `Sample`: boxing it would allocate per sample to save bytes on
// the rare small ones.
#[allow(clippy::large_enum_variant)]
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
        fatal: Option<crate::error::ClientError>,
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

/// Settings of a link to a `sluice cpu` daemon.
pub(crate) struct RemoteLink {
    pub link: usize,
    pub addr: SocketAddr,
    pub name: String,
    pub endpoint: crate::quic::Endpoint,
    pub client_config: quinn_proto::ClientConfig,
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
    /// A connection of this link got through its handshake since the last loss.
    pub answered: AtomicBool,
    /// What this loader's links said of their workers, so each thing is said once a loader
    /// (its links of every epoch share it).
    pub said: Arc<Said>,
}

/// What a loader's links said once, and since when each worker of the pool has gone
/// unanswered: each epoch dials its workers again (and an epoch may end before a dial times
/// out), so one line a loader says a worker never answered, or that it capped the job's
/// weight.
#[derive(Debug, Default)]
pub(crate) struct Said {
    said: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Workers dialled and not answered yet, since the first dial.
    silent: std::sync::Mutex<std::collections::HashMap<SocketAddr, std::time::Instant>>,
}

impl Said {
    /// Whether `what` is news.
    pub(crate) fn first(&self, what: String) -> bool {
        self.said
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(what)
    }

    /// A link dials `addr`: unanswered from now, unless it was already, or it ever answered
    /// (a worker lost later is a loss, not a silence).
    fn dialling(&self, addr: SocketAddr) {
        if self
            .said
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&format!("reached {addr}"))
        {
            return;
        }
        let mut silent = self.silent.lock().unwrap_or_else(|e| e.into_inner());
        silent.entry(addr).or_insert_with(std::time::Instant::now);
    }

    /// A connection to `addr` got through its handshake.
    fn answered(&self, addr: SocketAddr) {
        self.silent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&addr);
        self.first(format!("reached {addr}"));
    }

    /// How long `addr` has gone unanswered, over every epoch's links.
    fn silent_for(&self, addr: SocketAddr) -> Option<Duration> {
        let silent = self.silent.lock().unwrap_or_else(|e| e.into_inner());
        silent.get(&addr).map(std::time::Instant::elapsed)
    }
}

/// Says, once a loader and worker, that the worker runs the job at a lower weight than it
/// asked for (its `limits.max_job_weight`, or the tenant's `max_weight`).
fn say_capped(said: &Said, worker: &str, session: &Session) {
    if let Some((asked, given)) = session.capped() {
        if said.first(format!("capped {worker} {given}")) {
            tracing::info!(%worker, asked, weight = given,
                "the worker runs this job at a lower weight than asked: its cap, or the team's \
                 max_weight");
        }
    }
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
    quic: Option<crate::quic::Connection>,
}

/// What a same-host connection shares with its worker: its slots, and the batch arena.
type Shared = (Option<Arc<SlotPool>>, Option<Writer>);

/// Where a connection's session reports to, and what ends it from outside.
type Outside<'a> = (
    &'a mut mpsc::Receiver<Command>,
    &'a mpsc::Sender<Event>,
    &'a CancellationToken,
);

impl RemoteLink {
    pub(crate) async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        events: mpsc::Sender<Event>,
        cancel: CancellationToken,
    ) {
        let mut redial = Redial::default();
        self.said.dialling(self.addr);
        loop {
            let generation = redial.dial();
            let ended = {
                let session = self.connection(generation, &mut commands, &events, &cancel);
                tokio::pin!(session);
                let mut cancelled = false;
                loop {
                    tokio::select! {
                        e = &mut session => break e,
                        // A connection sharing the batch arena ends itself: it first asks
                        // its worker to release the places it still holds (bounded).
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
            if self.answered.swap(false, Ordering::Relaxed) {
                redial.answered();
            }
            if cancel.is_cancelled() || events.is_closed() || commands.is_closed() {
                // An epoch shorter than a dial's timeout still counts towards the silence.
                self.say_silent("the epoch ended first");
                return;
            }
            let Some(loss) = redial.ended(ended) else {
                return;
            };
            let (worker, error) = (&self.name, &loss.error);
            match loss.tone {
                Tone::NeverAnswered if self.say_silent(error) => {}
                Tone::NeverAnswered => tracing::debug!(%worker, generation,
                    "a worker of the pool has still not answered: {error}"),
                Tone::Left => tracing::info!(%worker, generation,
                    "worker left the pool ({error}): its units go to the other workers"),
                Tone::NotBack => tracing::debug!(%worker, generation,
                    "a worker that left is not back yet: {error}"),
                Tone::Lost => tracing::warn!(%worker, generation, "worker lost: {error}"),
            }
            let lost = Event::Lost {
                link: self.link,
                generation,
                error: loss.error,
                fatal: loss.fatal,
            };
            let Some(backoff) = loss.retry_in else {
                let _ = events.send(lost).await;
                return;
            };
            if events.send(lost).await.is_err() {
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
        }
    }

    /// Warns, once a loader, that this link's worker has never answered, when it has gone
    /// unanswered for a dial's timeout at least, over every epoch's links: whether it did.
    fn say_silent(&self, error: &str) -> bool {
        let Some(silent) = self.said.silent_for(self.addr) else {
            return false;
        };
        if silent < self.connect_timeout || !self.said.first(format!("unanswered {}", self.addr)) {
            return false;
        }
        metrics::counter!("sluice_client_workers_unanswered_total").increment(1);
        tracing::warn!(worker = %self.name, addr = %self.addr, since = ?silent,
            "a worker of the pool has never answered ({error}): epochs run on the others, and \
             it is dialled again (said once)");
        true
    }

    /// The session's settings for a connection over `transport`.
    fn settings(&self, transport: Transport) -> Settings {
        Settings {
            worker: self.name.clone(),
            hello: Hello {
                token: self.token.clone(),
                client: self.client.clone(),
            },
            job: self.job.clone(),
            transport,
            heartbeat: self.heartbeat,
            silence: self.silence,
            handshake: self.connect_timeout,
        }
    }

    async fn connection(
        &self,
        generation: u64,
        commands: &mut mpsc::Receiver<Command>,
        events: &mpsc::Sender<Event>,
        cancel: &CancellationToken,
    ) -> Ended {
        if let Some(route) = &self.same_host {
            return self
                .same_host_session(route, generation, (commands, events, cancel))
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
        let mut session = Session::new(self.settings(Transport::Frames), generation, now());
        let result = match handshake(&mut wire, &mut session).await {
            Ok(Received::Ready { shape, caches }) => {
                self.answered.store(true, Ordering::Relaxed);
                self.said.answered(self.addr);
                say_capped(&self.said, worker, &session);
                let outside = (commands, events, cancel);
                self.talk(wire, session, (shape, caches), (None, None), outside)
                    .await
            }
            Ok(_) => Ended::Lost("the handshake ended early".into()),
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
        outside: Outside<'_>,
    ) -> Ended {
        let socket = route.socket.display();
        let refused = |message: String| {
            Ended::Fatal(crate::error::ClientError::Refused {
                worker: self.name.clone(),
                message,
            })
        };
        let connect = tokio::net::UnixStream::connect(&route.socket);
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Err(_) => {
                let wait = self.connect_timeout;
                return Ended::Lost(format!("no answer on {socket} in {wait:?}"));
            }
            // Not allowed, or nobody listening (a socket file left by a killed worker): in
            // auto mode QUIC takes over; when same-host is required, the worker may be
            // restarting, so try again.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::PermissionDenied || !route.required => {
                return refused(format!("same-host socket {socket}: {e}"))
            }
            Ok(Err(e)) => return Ended::Lost(format!("same-host socket {socket}: {e}")),
            Ok(Ok(s)) => s,
        };
        // Nothing of this process (token, memory) goes to a peer it has not checked.
        if let Err(why) = crate::same_host::check_worker(&route.socket, &stream, route.worker_uid) {
            return refused(format!("same-host socket {socket}: {why}"));
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
        let mut session = Session::new(self.settings(Transport::SameHost), generation, now());
        let shape = match handshake(&mut wire, &mut session).await {
            Ok(Received::Attach(shape)) => shape,
            Ok(_) => return Ended::Lost("the handshake ended early".into()),
            Err(e) => return e,
        };
        let (pool, arena) = match self.attach(&mut wire, shape, watch).await {
            Ok(shared) => shared,
            Err(e) => return e,
        };
        session.attach_sent(arena.is_some(), now());
        let caches = match handshake(&mut wire, &mut session).await {
            Ok(Received::Ready { caches, .. }) => {
                self.answered.store(true, Ordering::Relaxed);
                self.said.answered(self.addr);
                say_capped(&self.said, &self.name, &session);
                caches
            }
            Ok(_) => return Ended::Lost("the handshake ended early".into()),
            Err(e) => return e,
        };
        // From here the socket is read through a buffer and registered for reading only
        // (`sluice_wire::unix`): the worker's reads of this side's frames wake nobody here.
        let Wire { reader, writer, .. } = wire;
        let wire = match sluice_wire::unix::split_halves(reader.into_inner(), writer.into_inner()) {
            Ok((rd, wr)) => Wire {
                reader: FrameReader::new(rd, self.limits),
                writer: FrameWriter::new(wr, self.limits),
                quic: None,
            },
            Err(e) => return Ended::Lost(format!("same-host socket {socket}: {e}")),
        };
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
        let shared = (Some(pool), writer);
        self.talk(wire, session, (shape, caches), shared, outside)
            .await
    }

    /// The job's slots in a segment (and the batch arena, where the loader has one for the
    /// shape), sent to the worker: `ShmAttach`, then the descriptors.
    async fn attach(
        &self,
        wire: &mut Wire<tokio::net::unix::OwnedReadHalf, tokio::net::unix::OwnedWriteHalf>,
        shape: SampleShape,
        watch: Option<sluice_wire::shm::ProcessWatch>,
    ) -> Result<(Arc<SlotPool>, Option<Arc<Arena>>), Ended> {
        let slots = credit_window(self.credits, self.receive_window, shape.bytes());
        let room = (SPARE_SEGMENT_BYTES / shape.bytes().max(1)).saturating_sub(u64::from(slots));
        let spare = self.spare_slots.min(room.min(u64::from(u32::MAX)) as u32);
        let segments = self.segments.clone();
        let arena = self.segments.arena(shape.bytes());
        let bound = crate::session::slot_bound(arena.is_some(), slots);
        let pool = SlotPool::create(slots, spare, shape.bytes(), self.buffers.clone(), segments)
            .map(|p| Arc::new(p.granting_at_most(bound)))
            .map_err(|e| Ended::Fatal(crate::error::ClientError::Allocate(e.to_string())))?;
        if let Some(watch) = watch {
            pool.watch(watch);
        }
        let attach = pool
            .segment()
            .attach(self.job.job, arena.as_ref().map(|a| a.segment()));
        let lost = |e: &dyn std::fmt::Display| Ended::Lost(e.to_string());
        wire.writer
            .send(&Message::ShmAttach(attach), &[])
            .await
            .map_err(|e| lost(&e))?;
        let half: &tokio::net::unix::OwnedWriteHalf = wire.writer.get_mut();
        sluice_wire::shm::send_fd(half.as_ref(), pool.segment().fd())
            .await
            .map_err(|e| lost(&e))?;
        if let Some(a) = &arena {
            sluice_wire::shm::send_fd(half.as_ref(), a.segment().fd())
                .await
                .map_err(|e| lost(&e))?;
        }
        tracing::debug!(worker = %self.name, slots, spare, arena = arena.is_some(),
            "same-host segment attached");
        Ok((pool, arena))
    }

    /// The connection, open: frames read on a task of their own go to the session and on to
    /// the coordinator; commands, slots freed and the session's deadlines are carried out
    /// here, until the session ends.
    async fn talk<R, W>(
        &self,
        wire: Wire<R, W>,
        session: Session,
        (shape, caches): (SampleShape, bool),
        (pool, arena): Shared,
        (commands, events, cancel): Outside<'_>,
    ) -> Ended
    where
        R: TensorRead + Send + 'static,
        W: AsyncWrite + Unpin + Send,
    {
        let Wire {
            reader,
            mut writer,
            quic,
        } = wire;
        let generation = session.generation();
        let ready = Event::Ready {
            link: self.link,
            generation,
            shape,
            caches,
        };
        if events.send(ready).await.is_err() {
            return Ended::Cancelled;
        }
        let session = Arc::new(Mutex::new(session));
        let wake = Arc::new(Notify::new());
        // Reading is not cancel-safe mid-frame: it runs on its own task, which forwards
        // events itself (bounded), so a slow coordinator slows the reader and then QUIC.
        let reader_task = tokio::spawn(read_frames(
            reader,
            ReadTo {
                session: session.clone(),
                wake: wake.clone(),
                link: self.link,
                pool: pool.clone(),
                arena: arena.clone(),
                buffers: self.buffers.clone(),
                events: events.clone(),
            },
        ));
        let _abort = AbortOnDrop(reader_task);
        let mut closing = false;
        loop {
            loop {
                let Some(frame) = lock(&session).poll_transmit() else {
                    break;
                };
                if let Err(e) = writer.send(&frame, &[]).await {
                    lock(&session).fail(Ended::Lost(e.to_string()));
                }
            }
            if let Some(ended) = lock(&session).take_end() {
                return with_close_reason(&self.name, ended, quic.as_ref());
            }
            let deadline = lock(&session).poll_timeout();
            let owns = || arena.as_ref().is_some_and(|(a, w)| a.owns_any(*w));
            tokio::select! {
                _ = wake.notified() => {}
                // Only a connection sharing the batch arena is let see this (`run`).
                _ = cancel.cancelled(), if !closing => {
                    closing = true;
                    lock(&session).close(owns(), now());
                }
                command = commands.recv(), if !closing => match command {
                    None => {
                        closing = true;
                        lock(&session).close(owns(), now());
                    }
                    Some(c) => {
                        let commanded = lock(&session).command(c);
                        carry_out(commanded, &session, &pool, &arena);
                    }
                },
                _ = released(&pool) => {
                    if let Some(slots) = pool.as_ref().and_then(|p| p.regrant()) {
                        lock(&session).slots(slots);
                    }
                }
                _ = sleep_until(deadline) => lock(&session).handle_timeout(fired(deadline)),
            }
        }
    }
}

/// Runs the handshake until the session says what it got (ready, or a same-host job to
/// attach), or ends.
async fn handshake<R, W>(wire: &mut Wire<R, W>, session: &mut Session) -> Result<Received, Ended>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        while let Some(frame) = session.poll_transmit() {
            if let Err(e) = wire.writer.send(&frame, &[]).await {
                session.fail(Ended::Lost(e.to_string()));
            }
        }
        if let Some(ended) = session.take_end() {
            return Err(ended);
        }
        let deadline = session.poll_timeout();
        let next = tokio::select! {
            next = wire.reader.next() => next,
            _ = sleep_until(deadline) => {
                // Nothing was read: the reader's frame is not cut.
                session.handle_timeout(fired(deadline));
                continue;
            }
        };
        match next {
            Ok(Some(m)) => match session.handle(m, now()) {
                Received::Nothing => {}
                got => return Ok(got),
            },
            Ok(None) | Err(IoError::Io(_)) | Err(IoError::Truncated) => {
                session.fail(match wire.quic.as_ref().and_then(|c| c.close_reason()) {
                    Some(e) => classify_connection_error(session.worker(), e),
                    None => Ended::Lost("the worker closed the stream".into()),
                })
            }
            Err(e) => session.fail(Ended::Fatal(crate::error::ClientError::Protocol {
                worker: session.worker().to_string(),
                detail: e.to_string(),
            })),
        }
    }
}

/// Carries out what a command asks beyond its frames: slots granted for credits, places
/// handed to this connection's writer, units that may write slots.
fn carry_out(
    commanded: Commanded,
    session: &Mutex<Session>,
    pool: &Option<Arc<SlotPool>>,
    arena: &Option<Writer>,
) {
    match (commanded, pool) {
        (Commanded::Nothing, _) => {}
        (
            Commanded::Assigned {
                unit,
                attempt,
                samples,
            },
            Some(p),
        ) => p.assigned(unit, attempt, samples),
        (Commanded::Grant(n), Some(p)) => {
            if let Some(slots) = p.grant(n, 1) {
                lock(session).slots(slots);
            }
        }
        (Commanded::Hand(grant), _) => {
            if let Some(places) = arena.as_ref().and_then(|(a, w)| grant.hand(a, *w)) {
                lock(session).places(places);
            }
        }
        (Commanded::Assigned { .. } | Commanded::Grant(_), None) => {}
    }
}

/// A stream that broke because the worker closed the connection for shutdown is a drain;
/// any other end stays what the session said.
fn with_close_reason(worker: &str, ended: Ended, quic: Option<&crate::quic::Connection>) -> Ended {
    match (ended, quic.and_then(|c| c.close_reason())) {
        (Ended::Lost(lost), Some(e)) => match classify_connection_error(worker, e) {
            left @ Ended::Left(_) => left,
            _ => Ended::Lost(lost),
        },
        (ended, _) => ended,
    }
}

/// The session, whichever task held it last (its state stays whole: no lock is held
/// across a panic that could leave it half changed).
fn lock(session: &Mutex<Session>) -> MutexGuard<'_, Session> {
    session.lock().unwrap_or_else(|p| p.into_inner())
}

fn classify_connection_error(worker: &str, e: quinn_proto::ConnectionError) -> Ended {
    use quinn_proto::ConnectionError as C;
    match &e {
        // TLS alert 120, no_application_protocol: the worker speaks another protocol version.
        C::TransportError(_) | C::ConnectionClosed(_) if e.to_string().contains("error 120") => {
            Ended::Fatal(crate::error::ClientError::Refused {
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
            Ended::Fatal(crate::error::ClientError::Tls {
                worker: worker.to_string(),
                detail: e.to_string(),
            })
        }
        C::ApplicationClosed(a) => {
            let reason = String::from_utf8_lossy(&a.reason).into_owned();
            closed_by_worker(worker, u64::from(a.error_code), reason)
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
