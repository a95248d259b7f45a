//! Links to workers: a task per worker that speaks the wire protocol and turns it into
//! [`Event`]s for the coordinator, and [`Command`]s back into frames.
//!
//! A QUIC link connects, says hello with the token, opens the epoch's job and then runs until
//! the connection drops or the worker falls silent for `silence`; it then reports the loss
//! and reconnects with backoff (each connection is a new `generation`, and commands meant for
//! an older one are dropped). Refusals (token, certificate, pipeline) are fatal: retrying
//! cannot fix a configuration. An in-process link runs the same job through a
//! [`UnitRunner`] on blocking threads, under the same credits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_wire::io::{FrameReader, FrameWriter, IoError};
use sluice_wire::{
    Assign, ErrorCode, Hello, JobRunner, JobSpec, Limits, Message, Output, SampleHeader,
    SampleShape, SkippedSample, UnitDone, UnitFailed, UnitRunner,
};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

/// What links tell the coordinator.
pub(crate) enum Event {
    Ready {
        link: usize,
        generation: u64,
        shape: SampleShape,
    },
    Sample {
        link: usize,
        header: SampleHeader,
        payload: Vec<u8>,
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
}

/// What the coordinator tells a link, for one generation of its connection.
pub(crate) enum Command {
    Assign(u64, Assign),
    Credit(u64, u32),
}

/// Settings of a QUIC link.
pub(crate) struct QuicLink {
    pub link: usize,
    pub addr: SocketAddr,
    pub name: String,
    pub endpoint: quinn::Endpoint,
    pub client_config: quinn::ClientConfig,
    pub token: String,
    pub client: String,
    pub job: JobSpec,
    pub heartbeat: Duration,
    pub silence: Duration,
    pub connect_timeout: Duration,
    pub limits: Limits,
}

enum Ended {
    /// Worth reconnecting.
    Lost(String),
    Fatal(crate::ClientError),
    Cancelled,
}

impl QuicLink {
    pub(crate) async fn run(
        self,
        mut commands: mpsc::Receiver<Command>,
        events: mpsc::Sender<Event>,
        cancel: CancellationToken,
    ) {
        let mut generation = 0u64;
        let mut backoff = Duration::from_millis(100);
        loop {
            generation += 1;
            let ended = tokio::select! {
                e = self.session(generation, &mut commands, &events) => e,
                _ = cancel.cancelled() => Ended::Cancelled,
            };
            let (error, fatal) = match ended {
                Ended::Cancelled => return,
                Ended::Lost(e) => (e, None),
                Ended::Fatal(f) => (f.to_string(), Some(f)),
            };
            let is_fatal = fatal.is_some();
            tracing::warn!(worker = %self.name, generation, "worker lost: {error}");
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
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    async fn session(
        &self,
        generation: u64,
        commands: &mut mpsc::Receiver<Command>,
        events: &mpsc::Sender<Event>,
    ) -> Ended {
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
        let result = self.talk(&conn, generation, commands, events).await;
        conn.close(0u32.into(), b"done");
        result
    }

    async fn talk(
        &self,
        conn: &quinn::Connection,
        generation: u64,
        commands: &mut mpsc::Receiver<Command>,
        events: &mpsc::Sender<Event>,
    ) -> Ended {
        let worker = &self.name;
        let (send, recv) = match conn.open_bi().await {
            Ok(s) => s,
            Err(e) => return classify_connection_error(worker, e),
        };
        let mut writer = FrameWriter::new(send, self.limits);
        let mut reader = FrameReader::new(recv, self.limits);
        let hello = Message::Hello(Hello {
            token: self.token.clone(),
            client: self.client.clone(),
        });
        if let Err(e) = writer.send(&hello, &[]).await {
            return Ended::Lost(e.to_string());
        }
        match self.expect(conn, &mut reader).await {
            Ok(Message::Welcome(_)) => {}
            Ok(other) => return self.unexpected(other, "Welcome"),
            Err(e) => return e,
        }
        if let Err(e) = writer.send(&Message::OpenJob(self.job.clone()), &[]).await {
            return Ended::Lost(e.to_string());
        }
        let shape = match self.expect(conn, &mut reader).await {
            Ok(Message::JobOpened { job, shape }) if job == self.job.job => shape,
            Ok(other) => return self.unexpected(other, "JobOpened"),
            Err(e) => return e,
        };
        if events
            .send(Event::Ready {
                link: self.link,
                generation,
                shape,
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
                events: events.clone(),
                end: end_tx,
            },
        ));
        let _abort = AbortOnDrop(reader_task);
        let mut tick = tokio::time::interval(self.heartbeat);
        let mut seq = 0;
        loop {
            tokio::select! {
                ended = end_rx.recv() => {
                    return ended.unwrap_or(Ended::Lost("reader stopped".into()));
                }
                command = commands.recv() => {
                    let frame = match command {
                        None => return Ended::Cancelled,
                        Some(Command::Assign(g, a)) if g == generation => Message::Assign(a),
                        Some(Command::Credit(g, n)) if g == generation => {
                            Message::Credit { job: self.job.job, samples: n }
                        }
                        Some(_) => continue,
                    };
                    if let Err(e) = writer.send(&frame, &[]).await {
                        return Ended::Lost(e.to_string());
                    }
                }
                _ = tick.tick() => {
                    if heard.since() > self.silence {
                        return Ended::Lost(format!(
                            "no frame from the worker for {:?}", self.silence));
                    }
                    seq += 1;
                    if let Err(e) = writer.send(&Message::Heartbeat { seq }, &[]).await {
                        return Ended::Lost(e.to_string());
                    }
                }
            }
        }
    }

    async fn expect(
        &self,
        conn: &quinn::Connection,
        reader: &mut FrameReader<quinn::RecvStream>,
    ) -> Result<Message, Ended> {
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
                match conn.close_reason() {
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
                _ => Ended::Lost(format!("closed by the worker: {reason}")),
            }
        }
        _ => Ended::Lost(e.to_string()),
    }
}

/// The TLS name to ask for: the host part of `host:port`.
fn server_name(worker: &str) -> String {
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
}

impl Heard {
    fn new() -> Self {
        Heard {
            base: Instant::now(),
            nanos: std::sync::atomic::AtomicU64::new(0),
            waiting: std::sync::atomic::AtomicBool::new(false),
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
    events: mpsc::Sender<Event>,
    end: mpsc::Sender<Ended>,
}

async fn read_frames(mut reader: FrameReader<quinn::RecvStream>, to: ReadTo) {
    let ReadTo {
        heard,
        link,
        worker,
        shape,
        job,
        events,
        end,
    } = to;
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
                // Bounded by the frame limits before this allocation.
                let mut payload = vec![0u8; header.payload_len() as usize];
                if let Err(e) = reader.payload_into(&mut payload).await {
                    break Ended::Lost(e.to_string());
                }
                Event::Sample {
                    link,
                    header,
                    payload,
                }
            }
            Message::Skipped(skipped) => Event::Skipped { skipped },
            Message::UnitDone(done) => Event::UnitDone { link, done },
            Message::UnitFailed(failed) => Event::UnitFailed { link, failed },
            Message::Error(e) => break refusal(&worker, e.code, e.message),
            other => break protocol(format!("a worker does not send {}", other.kind())),
        };
        heard.waiting(true);
        let sent = events.send(event).await;
        heard.waiting(false);
        if sent.is_err() {
            break Ended::Cancelled;
        }
    };
    let _ = end.send(ended).await;
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A worker in this process: the job runs on blocking threads, under the same credits.
pub(crate) async fn run_local(
    link: usize,
    runner: Arc<dyn UnitRunner>,
    job: JobSpec,
    mut commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<Event>,
    cancel: CancellationToken,
) {
    let opened: Result<Arc<dyn JobRunner>, String> = {
        let runner = runner.clone();
        let job = job.clone();
        tokio::task::spawn_blocking(move || runner.open_job(&job).map(Arc::from))
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
    };
    let job_runner = match opened {
        Ok(r) => r,
        Err(message) => {
            let fatal = crate::ClientError::Refused {
                worker: "in-process".into(),
                message,
            };
            let _ = events
                .send(Event::Lost {
                    link,
                    generation: 1,
                    error: fatal.to_string(),
                    fatal: Some(fatal),
                })
                .await;
            return;
        }
    };
    let ready = Event::Ready {
        link,
        generation: 1,
        shape: job_runner.shape(),
    };
    if events.send(ready).await.is_err() {
        return;
    }
    let credits = Arc::new(Semaphore::new(0));
    let _stop = cancel.clone().drop_guard();
    loop {
        let command = tokio::select! {
            c = commands.recv() => c,
            _ = cancel.cancelled() => None,
        };
        match command {
            None => return,
            Some(Command::Credit(_, n)) => credits.add_permits(n as usize),
            Some(Command::Assign(_, assign)) => {
                let (runner, credits, events, cancel) = (
                    job_runner.clone(),
                    credits.clone(),
                    events.clone(),
                    cancel.clone(),
                );
                let rt = tokio::runtime::Handle::current();
                tokio::task::spawn_blocking(move || {
                    run_local_unit(link, &*runner, &assign, &credits, &events, &cancel, &rt)
                });
            }
        }
    }
}

fn run_local_unit(
    link: usize,
    runner: &dyn JobRunner,
    assign: &Assign,
    credits: &Semaphore,
    events: &mpsc::Sender<Event>,
    cancel: &CancellationToken,
    rt: &tokio::runtime::Handle,
) {
    let mut emit = |output: Output| -> bool {
        let event = match output {
            Output::Sample(header, payload) => {
                let got = rt.block_on(async {
                    tokio::select! {
                        p = credits.acquire() => p.map(|p| p.forget()).is_ok(),
                        _ = cancel.cancelled() => false,
                    }
                });
                if !got {
                    return false;
                }
                Event::Sample {
                    link,
                    header,
                    payload,
                }
            }
            Output::Skipped(skipped) => Event::Skipped { skipped },
        };
        !cancel.is_cancelled() && events.blocking_send(event).is_ok()
    };
    let started = Instant::now();
    let event = match runner.run(assign, &mut emit) {
        Ok(f) => Event::UnitDone {
            link,
            done: UnitDone {
                job: assign.job,
                unit: assign.unit,
                attempt: assign.attempt,
                sent: f.sent,
                skipped: f.skipped,
            },
        },
        Err(error) => Event::UnitFailed {
            link,
            failed: UnitFailed {
                job: assign.job,
                unit: assign.unit,
                attempt: assign.attempt,
                error,
            },
        },
    };
    tracing::debug!(
        unit = assign.unit,
        "in-process unit took {:?}",
        started.elapsed()
    );
    if !cancel.is_cancelled() {
        let _ = events.blocking_send(event);
    }
}
