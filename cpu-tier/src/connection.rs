//! The async shell around the worker's rules (`sluice_wire::session::Worker`), shared by the
//! QUIC and the same-host transports: a connection's task feeds the worker what its client
//! says and the time, writes what the worker says to send, and runs each unit the worker
//! starts on a blocking thread ([`UnitThread`]), whose outputs come back to the task as
//! frames. The rules themselves (admission, credits, fair sharing, drain, silence) are all in
//! the worker; nothing here decides.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sluice_wire::io::{FrameReader, IoError};
use sluice_wire::session::{
    ConnId, Effect, End, Parker, Route, Transport, UnitId, UnitThread, Waiting, Wake, Worker,
};
use sluice_wire::shm::Segment;
use sluice_wire::{Assign, ErrorCode, JobRunner, JobSpec, Message, Output, ShmAttach};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::slots::Slots;

/// What every connection of a worker shares: its config, its runner, and its rules.
pub(crate) struct State {
    pub(crate) config: crate::config::CpuConfig,
    pub(crate) runner: Arc<dyn sluice_wire::UnitRunner>,
    /// The worker's rules over every connection and unit (`sluice_wire::session`), with
    /// its assignments processed at once and shared fairly by job.
    pub(crate) rules: SharedWorker,
    /// Bounds the connections served at once (`limits.max_connections`).
    pub(crate) connections: Arc<tokio::sync::Semaphore>,
    pub(crate) draining: tokio_util::sync::CancellationToken,
    pub(crate) limits: sluice_wire::Limits,
    /// Same-host clients' segments, mapped once and kept a while (`crate::mappings`).
    pub(crate) mappings: crate::mappings::Mappings,
}

/// The worker's rules, behind the one lock its connections and units share.
pub(crate) type SharedWorker = Mutex<Worker<Arc<Launch>>>;

pub(crate) fn lock(rules: &SharedWorker) -> MutexGuard<'_, Worker<Arc<Launch>>> {
    rules.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a connection ended.
#[derive(Debug)]
pub(crate) enum Ended {
    ClientClosed,
    Worker(End),
}

/// A frame that could not be sent: the stream gone means the client left; a frame this side
/// could not encode (over a limit) is this worker's error, said to the client and logged,
/// never taken for a client leaving.
fn send_failed(e: SendError) -> Ended {
    match e {
        SendError::Encode(w) | SendError::Stream(IoError::Wire(w)) => Ended::Worker(End::Error(
            ErrorCode::Internal,
            format!("the worker could not send a frame: {w}"),
        )),
        SendError::Quic(_) | SendError::Stream(_) => Ended::ClientClosed,
    }
}

/// Why a frame could not reach a client.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    #[error("encoding a frame: {0}")]
    Encode(#[from] sluice_wire::WireError),
    #[error("QUIC stream: {0}")]
    Quic(#[from] quinn::WriteError),
    #[error(transparent)]
    Stream(#[from] IoError),
}

/// Where a connection's frames go.
pub(crate) trait Outbound: Send {
    /// Buffers one frame, taking its payload over, until [`Outbound::flush`] (the connection
    /// flushes when no more are queued, or [`Outbound::flush_delay`] later for samples).
    async fn frame(&mut self, message: &Message, payload: bytes::Bytes) -> Result<(), SendError>;

    /// Sends what `frame` buffered.
    async fn flush(&mut self) -> Result<(), SendError>;

    /// How long a sample's frame may wait for the next ones once no more are queued.
    fn flush_delay(&self) -> Duration {
        FLUSH_DELAY
    }
}

/// What a unit's thread sends to its connection. Nearly every one is a frame (a sample
/// each): boxing it would allocate once a sample to save a few bytes on the rare `Finished`.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Produced {
    Frame(Message, bytes::Bytes),
    /// The unit ended (its `UnitDone`/`UnitFailed`, if any, is the frame before).
    Finished,
}

/// What the shell keeps for an open job.
pub(crate) struct Job {
    runner: Arc<dyn JobRunner>,
    /// The training job's name on this worker (its tenant's prefix included) and weight.
    name: Arc<str>,
    weight: u32,
    /// Samples sent for the training job (`sluice_cpu_job_samples_total{job}`).
    sent: metrics::Counter,
    /// Same-host jobs: the client's segment and the slots it granted.
    slots: Option<Arc<crate::slots::Slots>>,
}

/// What a unit runs with, registered with the worker when it accepts the assignment.
pub(crate) struct Launch {
    id: UnitId,
    assign: Assign,
    job: Arc<Job>,
    out: mpsc::Sender<Produced>,
    /// Where its thread waits; stopped (see [`Wake::Stop`]) once its job is gone.
    parker: Parker,
    accepted: Instant,
}

/// Carries out the worker's wakes: a unit given a slot starts on a blocking thread; one
/// waiting is unparked; one whose job is gone stops.
pub(crate) fn wake(state: &Arc<State>, wakes: Vec<Wake<Arc<Launch>>>) {
    for launch in wakes.into_iter().filter_map(|w| w.carry_out(|l| &l.parker)) {
        metrics::histogram!("sluice_cpu_unit_queue_seconds")
            .record(launch.accepted.elapsed().as_secs_f64());
        let state = state.clone();
        // Not on the runtime's threads: decoding blocks.
        tokio::task::spawn_blocking(move || run_unit(&state, &launch));
    }
}

/// A unit on its blocking thread: its outputs go to its connection, each sample once the
/// worker's gate lets it.
fn run_unit(state: &Arc<State>, launch: &Arc<Launch>) {
    let assign = &launch.assign;
    let span = tracing::info_span!(
        "unit",
        job = assign.job,
        unit = assign.unit,
        attempt = assign.attempt,
        shard = assign.shard.index
    );
    let _enter = span.enter();
    let job = &launch.job;
    let dead = AtomicBool::new(false);
    let forward = |output: Output| -> bool {
        let frame = match output {
            Output::Sample(h, payload) => match &job.slots {
                None => {
                    let runner = job.runner.clone();
                    let payload = bytes::Bytes::from_owner(Returning { payload, runner });
                    Produced::Frame(Message::Sample(h), payload)
                }
                Some(segment) => match segment.write(launch.id, h, &payload) {
                    Ok(Some((m, fields))) => {
                        job.runner.recycle(payload);
                        Produced::Frame(m, fields.into())
                    }
                    // Its job is gone: the unit stops, sending nothing more.
                    Ok(None) => return false,
                    Err(e) => {
                        // The unit fails (and is reassigned); the connection lives.
                        warn!("same-host slot: {e}");
                        return false;
                    }
                },
            },
            Output::Placed(h, place, fields) => match &job.slots {
                Some(slots) => Produced::Frame(slots.placed(launch.id, h, place), fields.into()),
                None => {
                    warn!("a sample in a batch place on a connection without one");
                    return false;
                }
            },
            Output::Skipped(s) => Produced::Frame(Message::Skipped(s), bytes::Bytes::new()),
            // `drive_unit` hands on the sample inside, never this.
            Output::Shared(_) => {
                warn!("a sample shared twice over");
                return false;
            }
        };
        let sample = matches!(
            frame,
            Produced::Frame(
                Message::Sample(_) | Message::ShmSample { .. } | Message::ShmPlaced { .. },
                _
            )
        );
        if launch.parker.stopped() || launch.out.blocking_send(frame).is_err() {
            dead.store(true, Ordering::Relaxed);
            return false;
        }
        if sample {
            job.sent.increment(1);
        }
        true
    };
    let unit = UnitThread {
        worker: &state.rules,
        id: launch.id,
        parker: &launch.parker,
        runner: &*job.runner,
        assign,
    };
    let end = unit.run(
        forward,
        |wakes| wake(state, wakes),
        |why, waited| {
            if why == Waiting::Credit {
                metrics::histogram!("sluice_cpu_credit_wait_seconds").record(waited.as_secs_f64());
            }
        },
    );
    match &end {
        Some(Message::UnitDone(_)) => {
            metrics::counter!("sluice_cpu_units_total", "result" => "done").increment(1);
        }
        Some(Message::UnitFailed(failed)) => {
            metrics::counter!("sluice_cpu_units_total", "result" => "failed").increment(1);
            warn!("assignment failed: {}", failed.error);
        }
        _ => {}
    }
    if let Some(frame) = end.filter(|_| !dead.load(Ordering::Relaxed)) {
        let _ = launch
            .out
            .blocking_send(Produced::Frame(frame, bytes::Bytes::new()));
    }
    let _ = launch.out.blocking_send(Produced::Finished);
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

/// What drives a connection's session one step.
enum Input {
    /// Boxed: a sample header's geometry makes a message ten times the other inputs.
    Message(Box<Message>),
    Timeout,
    /// A unit ended and its frames went out.
    Finished,
    /// The worker started draining.
    Drain,
    /// Nothing new: carry out what the session says.
    Effects,
}

/// One client connection, as the worker's session sees it. Dropping it disconnects the
/// session: its jobs are cancelled and its units stop.
pub(crate) struct Connection {
    state: Arc<State>,
    conn: ConnId,
    transport: Transport,
    client: String,
    jobs: HashMap<u64, Arc<Job>>,
    out_tx: mpsc::Sender<Produced>,
    out_rx: mpsc::Receiver<Produced>,
    /// Same-host: the segments the client's `ShmAttach` describes, to map
    /// ([`Connection::take_attach`]).
    attaching: Option<ShmAttach>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let wakes = {
            let mut w = lock(&self.state.rules);
            w.disconnect(self.conn);
            // Its jobs' demand now: 0 unless another connection runs the same job.
            for job in self.jobs.values() {
                publish_demand(&w, &job.name);
            }
            w.take_wakes()
        };
        wake(&self.state, wakes);
    }
}

/// Job `name`'s units holding a slot, waiting for one and waiting for their client's credit,
/// over every connection, as the worker's rules count them now: set at every heartbeat, and
/// when a job ends (to 0, unless another connection runs it), so an ended job's gauges never
/// freeze at what it last asked while they wait to expire.
fn publish_demand(w: &Worker<Arc<Launch>>, name: &str) {
    let series = sluice_daemon::job_series(None);
    let d = w.demand(name);
    series
        .gauge("sluice_cpu_job_units_running", name)
        .set(d.running as f64);
    series
        .gauge("sluice_cpu_job_units_waiting", name)
        .set(d.waiting as f64);
    series
        .gauge("sluice_cpu_job_units_starved", name)
        .set(d.starved as f64);
}

impl Connection {
    pub(crate) fn new(state: Arc<State>, transport: Transport) -> Self {
        let (out_tx, out_rx) = mpsc::channel(64);
        let conn = lock(&state.rules).connect(transport, Instant::now());
        Connection {
            state,
            conn,
            transport,
            client: String::new(),
            jobs: HashMap::new(),
            out_tx,
            out_rx,
            attaching: None,
        }
    }

    /// Same-host: the segments the session asks the shell to receive and map, once.
    pub(crate) fn take_attach(&mut self) -> Option<ShmAttach> {
        self.attaching.take()
    }

    /// The client's name, once it said Hello.
    pub(crate) fn client(&self) -> &str {
        &self.client
    }

    /// Same-host: the open job's segments as the shell mapped them for the client's
    /// `ShmAttach` (or why it could not): the session answers `ShmAttached` (or closes),
    /// frames to send.
    pub(crate) fn attached(
        &mut self,
        job: u64,
        segments: Result<(Arc<Segment>, Option<Arc<Segment>>), String>,
    ) -> Result<Vec<Message>, End> {
        let result = match (segments, self.jobs.get_mut(&job)) {
            (Ok(segments), Some(j)) => {
                let session = Box::new(self.state.clone());
                let slots = Slots::new(segments, session, self.conn, job);
                let slots = Arc::new(slots);
                if slots.has_arena() {
                    j.runner.share_places(slots.clone());
                }
                *j = Arc::new(Job {
                    runner: j.runner.clone(),
                    name: j.name.clone(),
                    weight: j.weight,
                    sent: j.sent.clone(),
                    slots: Some(slots),
                });
                Ok(())
            }
            (Ok(_), None) => Err(format!("job {job} is not open")),
            (Err(why), _) => Err(why),
        };
        lock(&self.state.rules).attached(self.conn, job, result);
        self.handshake(None)
    }

    /// Whether the session is still in its handshake (same-host: until `ShmAttached`).
    pub(crate) fn handshaking(&self) -> bool {
        lock(&self.state.rules).handshaking(self.conn)
    }

    /// Feeds the session one message (a handshake step, outside [`Connection::run`]), or
    /// only collects what it says: the frames to send and the segments to attach, or why
    /// the connection ends.
    pub(crate) fn handshake(&mut self, message: Option<Message>) -> Result<Vec<Message>, End> {
        let input = match message {
            Some(m) => Input::Message(Box::new(m)),
            None => Input::Effects,
        };
        let (send, end) = self.step(input);
        match end {
            Some(end) => Err(end),
            None => Ok(send),
        }
    }

    /// Serves the connection until it ends.
    pub(crate) async fn run<R, W>(&mut self, mut reader: FrameReader<R>, writer: &mut W) -> Ended
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
        let draining = self.state.draining.clone();
        let mut drain_seen = false;
        let mut held = Held::default();
        loop {
            let deadline = lock(&self.state.rules)
                .poll_timeout(self.conn)
                .map(tokio::time::Instant::from_std);
            let input = tokio::select! {
                incoming = in_rx.recv() => match incoming {
                    None => return Ended::ClientClosed,
                    Some(Err(IoError::Wire(w))) => {
                        return Ended::Worker(End::Error(ErrorCode::BadRequest, w.to_string()));
                    }
                    Some(Err(_)) => return Ended::ClientClosed,
                    Some(Ok(m)) => Input::Message(Box::new(m)),
                },
                Some(produced) = self.out_rx.recv() => match produced {
                    Produced::Frame(m, payload) => {
                        count_sent(&m, payload.len());
                        if let Err(e) = writer.frame(&m, payload).await {
                            return send_failed(e);
                        }
                        if self.out_rx.is_empty() {
                            held.sample(tokio::time::Instant::now(), writer.flush_delay());
                        }
                        continue;
                    }
                    Produced::Finished => Input::Finished,
                },
                _ = sleep_until(held.due()), if held.due().is_some() => {
                    held.flushed();
                    if writer.flush().await.is_err() {
                        return Ended::ClientClosed;
                    }
                    continue;
                }
                _ = sleep_until(deadline) => Input::Timeout,
                _ = draining.cancelled(), if !drain_seen => {
                    drain_seen = true;
                    Input::Drain
                }
            };
            let (send, end) = self.step(input);
            for m in send {
                if let Err(e) = writer.frame(&m, bytes::Bytes::new()).await {
                    return send_failed(e);
                }
            }
            if let Some(end) = end {
                return Ended::Worker(end);
            }
            // Frames queued behind this one go out in the same write.
            if self.out_rx.is_empty() {
                held.flushed();
                if writer.flush().await.is_err() {
                    return Ended::ClientClosed;
                }
            }
        }
    }

    /// Feeds the session one input and carries out what it says: the frames to send, and the
    /// end if the session is over.
    fn step(&mut self, input: Input) -> (Vec<Message>, Option<End>) {
        let state = self.state.clone();
        let mut send = Vec::new();
        let mut end = None;
        let wakes = {
            let mut w = lock(&state.rules);
            let now = Instant::now();
            match input {
                Input::Message(m) => {
                    let m = *m;
                    if let Message::Hello(h) = &m {
                        self.client.clone_from(&h.client);
                    }
                    let (jobs, out) = (&self.jobs, &self.out_tx);
                    w.handle(self.conn, m, now, |id, assign| {
                        launch(id, assign, jobs, out)
                    });
                }
                Input::Timeout => {
                    w.handle_timeout(self.conn, now);
                    self.publish_jobs(&w);
                }
                Input::Finished => w.finished(self.conn),
                Input::Drain => w.drain(),
                Input::Effects => {}
            }
            while let Some(effect) = w.poll_effect(self.conn) {
                match effect {
                    Effect::Send(m) => {
                        // (A same-host client is logged once its segment is attached.)
                        if matches!(m, Message::Welcome(_)) && self.transport == Transport::Frames {
                            info!(client = %self.client, "client connected");
                        }
                        send.push(m);
                    }
                    Effect::Open(spec) => {
                        let opened = self.open_job(&spec);
                        let shape = opened
                            .as_ref()
                            .map(|j| j.runner.shape())
                            .map_err(Clone::clone);
                        if let Some(weight) = w.opened(self.conn, &spec, shape) {
                            let mut job = opened.expect("opened");
                            info!(job = spec.job, name = %spec.name, weight, dataset = %spec.dataset,
                                  pipeline = %spec.pipeline, epoch = spec.epoch, rank = spec.rank,
                                  transport = ?self.transport, "job opened");
                            job.weight = weight;
                            self.jobs.insert(spec.job, Arc::new(job));
                            self.publish_jobs(&w);
                        }
                    }
                    Effect::Attach(attach) => {
                        // Outside the session's lock: the descriptors come over the socket.
                        self.attaching = Some(attach);
                    }
                    Effect::Cancelled(job) => {
                        // A client sharing its batches hears when no unit writes them any more.
                        let removed = self.jobs.remove(&job);
                        if let Some(j) = &removed {
                            publish_demand(&w, &j.name);
                        }
                        // No write into its batch arena is under way past this (the
                        // session's `ShmReleased` follows).
                        if let Some(slots) = removed.and_then(|j| j.slots.clone()) {
                            slots.release();
                        }
                        info!(job, "job cancelled by the client");
                    }
                    Effect::Close(e) => {
                        end = Some(e);
                        break;
                    }
                }
            }
            let (slots, waiting) = w.slots();
            publish(slots, waiting);
            w.take_wakes()
        };
        wake(&state, wakes);
        (send, end)
    }

    /// Opens a job with the worker's runner.
    fn open_job(&mut self, spec: &JobSpec) -> Result<Job, String> {
        let runner: Arc<dyn JobRunner> = self
            .state
            .runner
            .open_job(spec)
            .map_err(|e| sluice_wire::error_chain(&e))?
            .into();
        let series = sluice_daemon::job_series(None);
        Ok(Job {
            runner,
            name: spec.name.as_str().into(),
            weight: 0,
            sent: series.counter("sluice_cpu_job_samples_total", &spec.name),
            slots: None,
        })
    }

    /// This connection's jobs' series: weight, and what each asks of the worker beside what
    /// it gets (units holding a slot, waiting for one, waiting for their client's credit).
    /// Set at every heartbeat, which also keeps a running job's series from expiring.
    fn publish_jobs(&self, w: &Worker<Arc<Launch>>) {
        let series = sluice_daemon::job_series(None);
        for job in self.jobs.values() {
            let name = &*job.name;
            series
                .counter("sluice_cpu_job_samples_total", name)
                .increment(0);
            series
                .gauge("sluice_cpu_job_weight", name)
                .set(f64::from(job.weight));
            publish_demand(w, name);
        }
    }
}

/// The slots' questions, answered by the worker's session under its lock; the wakes an
/// answer makes (a credit given back) are carried out.
impl crate::slots::Routes for Arc<State> {
    fn route(&self, id: UnitId, index: u64, fits: bool) -> Result<Option<Route>, String> {
        let (route, wakes) = {
            let mut w = lock(&self.rules);
            (w.route(id, index, fits), w.take_wakes())
        };
        wake(self, wakes);
        route
    }

    fn placed(&self, id: UnitId) {
        let wakes = {
            let mut w = lock(&self.rules);
            w.placed(id);
            w.take_wakes()
        };
        wake(self, wakes);
    }

    fn take_place(&self, conn: ConnId, job: u64, unit: (u64, u32), index: u64) -> Option<u32> {
        lock(&self.rules)
            .take_place(conn, job, unit, index)
            .ok()
            .flatten()
    }
}

fn launch(
    id: UnitId,
    assign: &Assign,
    jobs: &HashMap<u64, Arc<Job>>,
    out: &mpsc::Sender<Produced>,
) -> Arc<Launch> {
    let job = jobs
        .get(&assign.job)
        .cloned()
        .expect("the worker accepts assignments only for jobs this connection opened");
    Arc::new(Launch {
        id,
        assign: assign.clone(),
        job,
        out: out.clone(),
        parker: Parker::new(),
        accepted: Instant::now(),
    })
}

/// How long a sample's frame may wait in the transport's buffer for the next ones once no more
/// are queued, so that one write (and one wake-up of the client) carries several. A trainer
/// takes samples a few thousand a second, one frame each; tokio's timer rounds the wait up to
/// the next millisecond. Against a separate `sluice cpu --threads 2`, loadgen's CPU per sample
/// went from 43.5–46.3 to 37.9–38.9 µs over same-host (about 1,600 samples/s) and from
/// 117.4–125.8 to 112.6–114.9 µs over QUIC (about 1,500), three alternated runs of 80 epochs
/// each; `bench host-cost`, where frames queue anyway, did not change. The wait is small
/// beside a batch (20 ms for 32 samples there) and the credit window. Frames the session sends
/// (unit ends, errors, heartbeats) flush everything at once.
const FLUSH_DELAY: Duration = Duration::from_millis(1);

/// When the transport writes the sample frames it holds ([`FLUSH_DELAY`]).
#[derive(Default)]
struct Held {
    due: Option<tokio::time::Instant>,
}

impl Held {
    /// A sample's frame was buffered with none queued behind it: it goes out at the latest
    /// `delay` after the first frame held, however many follow it.
    fn sample(&mut self, now: tokio::time::Instant, delay: Duration) {
        self.due.get_or_insert(now + delay);
    }

    fn due(&self) -> Option<tokio::time::Instant> {
        self.due
    }

    /// Everything buffered went out.
    fn flushed(&mut self) {
        self.due = None;
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn count_sent(m: &Message, payload: usize) {
    match m {
        Message::Sample(_) => {
            metrics::counter!("sluice_cpu_samples_sent_total").increment(1);
            metrics::counter!("sluice_cpu_bytes_sent_total").increment(payload as u64);
        }
        Message::ShmSample { header, .. } | Message::ShmPlaced { header, .. } => {
            if matches!(m, Message::ShmPlaced { .. }) {
                metrics::counter!("sluice_cpu_placed_samples_total").increment(1);
            }
            metrics::counter!("sluice_cpu_same_host_samples_total").increment(1);
            metrics::counter!("sluice_cpu_bytes_sent_total").increment(header.payload_len());
        }
        _ => {}
    }
}

/// Units waiting for a slot, as a gauge and per slot: "jobs wait for this worker", the
/// figure a pool scales on (`configs/kubernetes/cpu.yaml`'s autoscaler).
fn publish(slots: usize, waiting: usize) {
    // Set here, not once at start: the recorder may be installed after the worker is made.
    metrics::gauge!("sluice_cpu_unit_slots").set(slots as f64);
    metrics::gauge!("sluice_cpu_units_waiting").set(waiting as f64);
    metrics::gauge!("sluice_cpu_units_waiting_per_slot").set(waiting as f64 / slots.max(1) as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_frames_go_out_at_most_the_delay_after_the_first() {
        let t0 = tokio::time::Instant::now();
        let ms = FLUSH_DELAY;
        let mut held = Held::default();
        assert_eq!(held.due(), None);
        held.sample(t0, ms);
        held.sample(t0 + ms / 2, ms); // a steady stream
        assert_eq!(held.due(), Some(t0 + ms), "does not put the write off");
        held.flushed();
        assert_eq!(held.due(), None);
        held.sample(t0 + 3 * ms, ms);
        assert_eq!(held.due(), Some(t0 + 4 * ms));
    }
}
