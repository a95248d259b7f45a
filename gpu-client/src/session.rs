//! One connection's client half of the worker protocol as a state machine with no IO and no
//! clock, in the manner of `quinn-proto` and of the worker's half (`sluice_wire::session`):
//! frames and the time go in ([`Session::handle`], [`Session::handle_timeout`]), commands
//! from the coordinator too ([`Session::command`]); frames to send
//! ([`Session::poll_transmit`]), what each frame means for the epoch ([`Received`]), the next
//! deadline ([`Session::poll_timeout`]) and the session's end ([`Session::take_end`]) come out.
//!
//! It holds every rule of the client's side of one connection, once: the handshake's order
//! (`Hello`, `Welcome`, `OpenJob`, `JobOpened`, and on the same-host socket `ShmAttach`,
//! `ShmAttached`), each answer within `handshake`; heartbeats, and a worker silent for
//! `silence` declared lost (a reader waiting for room in the coordinator's queue is not
//! listening, so its worker is not silent); a drained worker's shorter silence; which
//! generation a command is for; credits as frames (counted over QUIC, slots on the same-host
//! socket); every check a frame header gets (transport, job, tensor size, fields' length);
//! refusals and what they mean (retry or give up); and an epoch's end on a connection that
//! shares the batch arena (`Cancel`, then `ShmReleased` or a bounded wait).
//!
//! [`Redial`] is the link's rule between connections: each a new generation, backoff, and
//! which ends are worth another try.
//!
//! Two shells drive it: `crate::link` (QUIC and the same-host socket, on tokio) and the paired
//! simulation (`crate::protocol::paired`, against real `sluice_wire::session::Worker`s, with
//! no runtime at all). The shells own the memory a frame points into (same-host slots, the
//! batch arena) and carry out what the session says about it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use sluice_wire::{
    Assign, ErrorCode, Hello, JobSpec, Message, Place, SampleHeader, SampleShape, SkippedSample,
    UnitDone, UnitFailed,
};

use crate::arena::PlaceGrant;
use crate::error::ClientError;

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

/// How a connection ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// Worth reconnecting.
    Lost(String),
    /// The worker closed the connection because it is shutting down (a drain: its units go
    /// elsewhere, and it may come back at the same address).
    Left(String),
    /// A refusal that retrying cannot fix.
    Fatal(ClientError),
    /// The epoch ended (or the loader is shutting down).
    Cancelled,
}

/// How the connection carries samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// QUIC: tensors in the frames, credits counted.
    Frames,
    /// The same-host socket: tensors in a shared-memory segment's slots, credits as slots,
    /// and, where the segments attached include the batch arena, samples written straight
    /// into their places in the batches.
    SameHost,
}

/// What a session is for, fixed for its connection.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// The worker, as errors name it.
    pub worker: String,
    pub hello: Hello,
    pub job: JobSpec,
    pub transport: Transport,
    pub heartbeat: Duration,
    pub silence: Duration,
    /// How long each answer of the handshake may take.
    pub handshake: Duration,
}

/// How long a connection whose epoch ended waits for its worker to release the places it
/// still owns in the batch arena (its units were cut mid-way). Past it, they stay owned until
/// that worker's process exits.
pub(crate) const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// Slots granted and not yet filled at once on a connection sharing the batch arena. There a
/// sample takes a slot only when it arrives before its batch is bound: loadgen's first epoch
/// (no reach learned yet) filled 24 at most, the epochs after about 8.
const ARENA_SLOTS_GRANTED: u32 = 32;

/// Most slots granted and not yet filled at once on a same-host connection whose credit
/// window is `window` slots: all of them, or with the batch arena (`arena`) a few, since its
/// samples mostly go straight into their places (the pool doubles the bound, up to the
/// window, for a worker that fills them all).
pub(crate) fn slot_bound(arena: bool, window: u32) -> u32 {
    match arena {
        true => ARENA_SLOTS_GRANTED.min(window),
        false => window,
    }
}

/// Where a sample's tensor is, as its frame says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TensorAt {
    /// In the frame's payload, before the fields (QUIC).
    Stream,
    /// In a same-host slot the worker was granted.
    Slot(u32),
    /// In its place in the batch arena; it spends no credit.
    Placed { place: u32 },
}

/// What a frame means, for the shell to carry out.
#[derive(Debug)]
pub(crate) enum Received {
    Nothing,
    /// The handshake is done: tell the coordinator.
    Ready {
        shape: SampleShape,
        caches: bool,
    },
    /// Same-host: the job is open; the shell sends `ShmAttach` and the segments' descriptors,
    /// then calls [`Session::attach_sent`].
    Attach(SampleShape),
    /// A sample of the job: read its tensor (if in the frame) and fields.
    Sample {
        header: SampleHeader,
        at: TensorAt,
    },
    /// A sample of another job (a late frame of an earlier epoch's): skip its payload.
    SkipPayload,
    Skipped(SkippedSample),
    UnitDone(UnitDone),
    UnitFailed(UnitFailed),
    /// The worker writes none of the job's batch places any more.
    Released,
}

/// What a command asks of the shell beyond the frames it queued.
pub(crate) enum Commanded {
    Nothing,
    /// Same-host: unit `(unit, attempt)` of `samples` samples may write slots until it ends.
    Assigned {
        unit: u64,
        attempt: u32,
        samples: u64,
    },
    /// Same-host: turn these credits into free slots, then [`Session::slots`].
    Grant(u32),
    /// Same-host with the batch arena: hand the grant's places to this connection's writer,
    /// then [`Session::places`].
    Hand(PlaceGrant),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Welcome,
    JobOpened,
    /// Same-host: the job is open, the segments not yet sent.
    Attaching,
    Attached,
    Running,
    /// The epoch ended with batch places owned: waiting for `ShmReleased`.
    Releasing,
    Done,
}

/// One connection's client half (see the module documentation).
pub(crate) struct Session {
    settings: Settings,
    generation: u64,
    phase: Phase,
    caches: bool,
    shape: Option<SampleShape>,
    /// The weight the worker runs the job at (its caps applied), once it opened it.
    weight: Option<u32>,
    /// Same-host: the batch arena is among the segments attached.
    arena: bool,
    /// The handshake's next answer, or the release, is due by then.
    due: Instant,
    heard: Instant,
    /// The reader waits for room in the coordinator's queue: the worker is not silent.
    waiting: bool,
    silence: Duration,
    next_beat: Instant,
    seq: u64,
    transmit: VecDeque<Message>,
    end: Option<Ended>,
}

impl Session {
    /// The weight the worker runs the job at, when it is lower than the one asked (its cap,
    /// or its tenant's): `(asked, given)`.
    pub(crate) fn capped(&self) -> Option<(u32, u32)> {
        let asked = self.settings.job.weight;
        self.weight.filter(|&w| w < asked).map(|w| (asked, w))
    }

    /// Connection `generation`, just made: its first frame (`Hello`) is queued.
    pub(crate) fn new(settings: Settings, generation: u64, now: Instant) -> Self {
        let hello = Message::Hello(settings.hello.clone());
        Session {
            generation,
            phase: Phase::Welcome,
            caches: false,
            shape: None,
            weight: None,
            arena: false,
            due: now + settings.handshake,
            heard: now,
            waiting: false,
            silence: settings.silence,
            next_beat: now + settings.heartbeat,
            seq: 0,
            transmit: VecDeque::from([hello]),
            end: None,
            settings,
        }
    }

    /// The worker, as errors name it.
    pub(crate) fn worker(&self) -> &str {
        &self.settings.worker
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The next frame to send.
    pub(crate) fn poll_transmit(&mut self) -> Option<Message> {
        self.transmit.pop_front()
    }

    /// How the session ended, once it has (taken once).
    pub(crate) fn take_end(&mut self) -> Option<Ended> {
        self.end.take()
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.phase == Phase::Done
    }

    /// When to call [`Session::handle_timeout`] next.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Done => None,
            Phase::Running if self.waiting => Some(self.next_beat),
            Phase::Running => Some(self.next_beat.min(self.heard + self.silence)),
            Phase::Attaching => None,
            _ => Some(self.due),
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::Welcome | Phase::JobOpened | Phase::Attached if now >= self.due => {
                let wait = self.settings.handshake;
                self.finish(Ended::Lost(format!("no answer in {wait:?}")));
            }
            Phase::Running => {
                if !self.waiting && now.saturating_duration_since(self.heard) > self.silence {
                    let silence = self.silence;
                    self.finish(Ended::Lost(format!(
                        "no frame from the worker for {silence:?}"
                    )));
                } else if now >= self.next_beat {
                    self.seq += 1;
                    self.transmit
                        .push_back(Message::Heartbeat { seq: self.seq });
                    self.next_beat = now + self.settings.heartbeat;
                }
            }
            Phase::Releasing if now >= self.due => {
                tracing::debug!(worker = %self.settings.worker,
                    "the worker did not release its batch places in time");
                self.finish(Ended::Cancelled);
            }
            _ => {}
        }
    }

    /// The reader waits (`true`) for room in the coordinator's queue, or has room again.
    pub(crate) fn waiting(&mut self, yes: bool, now: Instant) {
        self.waiting = yes;
        self.heard = now;
    }

    /// A frame from the worker.
    pub(crate) fn handle(&mut self, m: Message, now: Instant) -> Received {
        if self.phase == Phase::Done {
            return Received::Nothing;
        }
        self.heard = now;
        match (self.phase, m) {
            (_, Message::Heartbeat { .. }) => Received::Nothing,
            (_, Message::Error(e)) => {
                self.finish(refusal(&self.settings.worker, e.code, e.message));
                Received::Nothing
            }
            (Phase::Welcome, Message::Welcome(w)) => {
                self.caches = w.caches;
                let open = Message::OpenJob(self.settings.job.clone());
                self.transmit.push_back(open);
                self.expect(Phase::JobOpened, now);
                Received::Nothing
            }
            (Phase::JobOpened, Message::JobOpened { job, shape, weight })
                if job == self.settings.job.job =>
            {
                self.shape = Some(shape);
                self.weight = Some(weight);
                match self.settings.transport {
                    Transport::Frames => self.ready(now),
                    Transport::SameHost => {
                        self.phase = Phase::Attaching;
                        Received::Attach(shape)
                    }
                }
            }
            (Phase::Attached, Message::ShmAttached { job }) if job == self.settings.job.job => {
                self.ready(now)
            }
            (Phase::Welcome, m) => self.unexpected(&m, "Welcome"),
            (Phase::JobOpened, m) => self.unexpected(&m, "JobOpened"),
            (Phase::Attaching | Phase::Attached, m) => self.unexpected(&m, "ShmAttached"),
            (Phase::Running | Phase::Releasing, m) => self.running(m),
            (Phase::Done, _) => Received::Nothing,
        }
    }

    /// The shell sent `ShmAttach` and the descriptors, the batch arena's among them if
    /// `arena`: the worker's answer is due.
    pub(crate) fn attach_sent(&mut self, arena: bool, now: Instant) {
        if self.phase == Phase::Attaching {
            self.arena = arena;
            self.expect(Phase::Attached, now);
        }
    }

    /// A command of the coordinator's: frames queued, and what the shell must do besides.
    /// Commands for another generation are void.
    pub(crate) fn command(&mut self, c: Command) -> Commanded {
        let job = self.settings.job.job;
        let same_host = self.settings.transport == Transport::SameHost;
        if matches!(self.phase, Phase::Releasing | Phase::Done) {
            return Commanded::Nothing;
        }
        match c {
            Command::Drain => {
                self.silence = self.silence.min(self.settings.heartbeat * 3);
                Commanded::Nothing
            }
            Command::Assign(g, a) if g == self.generation => {
                let (unit, attempt, samples) = (a.unit, a.attempt, a.end.saturating_sub(a.start));
                self.transmit.push_back(Message::Assign(a));
                match same_host {
                    true => Commanded::Assigned {
                        unit,
                        attempt,
                        samples,
                    },
                    false => Commanded::Nothing,
                }
            }
            Command::Credit(g, samples) if g == self.generation => match same_host {
                // Same-host credits are slots: those free now go at once, the rest as the
                // batches they were copied into release them.
                true => Commanded::Grant(samples),
                false => {
                    self.transmit.push_back(Message::Credit { job, samples });
                    Commanded::Nothing
                }
            },
            // Owned by this connection once handed, before the frame goes out: its answers
            // may come back at once.
            Command::Places(g, grant) if g == self.generation && self.arena => {
                Commanded::Hand(grant)
            }
            _ => Commanded::Nothing,
        }
    }

    /// Same-host: free slots for the worker, one credit each.
    pub(crate) fn slots(&mut self, slots: Vec<u32>) {
        if !slots.is_empty() && self.phase == Phase::Running {
            let job = self.settings.job.job;
            self.transmit.push_back(Message::SlotCredit { job, slots });
        }
    }

    /// Same-host with the batch arena: places handed to this connection's writer.
    pub(crate) fn places(&mut self, places: Vec<Place>) {
        if !places.is_empty() && self.phase == Phase::Running {
            let job = self.settings.job.job;
            self.transmit.push_back(Message::ShmPlaces { job, places });
        }
    }

    /// The epoch ended (or the loader is shutting down). A connection that shares the batch
    /// arena and whose worker still owns places in it (`owns_places`) cancels the job and
    /// waits (at most [`RELEASE_WAIT`]) for the worker to say it writes none of them any more,
    /// so they need not wait for its process to exit; any other ends now.
    pub(crate) fn close(&mut self, owns_places: bool, now: Instant) {
        if self.arena && owns_places && self.phase == Phase::Running {
            let job = self.settings.job.job;
            self.transmit.push_back(Message::Cancel { job });
            self.phase = Phase::Releasing;
            self.due = now + RELEASE_WAIT;
        } else if self.phase != Phase::Releasing {
            self.finish(Ended::Cancelled);
        }
    }

    /// The transport says the connection ended: `ended` is its verdict, unless the session
    /// had already come to one.
    pub(crate) fn fail(&mut self, ended: Ended) {
        self.finish(ended);
    }

    /// A sample's fields add up to what its frame still holds (`pending` bytes).
    pub(crate) fn check_fields(header: &SampleHeader, pending: u64) -> Result<(), Ended> {
        let len = header.fields_len();
        if len != pending {
            return Err(Ended::Lost(format!(
                "sample {:?}: its fields add up to {len} bytes, its frame holds {pending} more",
                header.key
            )));
        }
        Ok(())
    }

    fn running(&mut self, m: Message) -> Received {
        let job = self.settings.job.job;
        let same_host = self.settings.transport == Transport::SameHost;
        let arena = self.arena;
        let checked = match m {
            Message::ShmSample { slot, header } if same_host => {
                self.same_host_header(&header).map(|()| Received::Sample {
                    header,
                    at: TensorAt::Slot(slot),
                })
            }
            Message::ShmSample { .. } => Err("a shared-memory sample over QUIC".into()),
            Message::ShmPlaced { place, header } if arena => {
                self.same_host_header(&header).map(|()| Received::Sample {
                    header,
                    at: TensorAt::Placed { place },
                })
            }
            Message::ShmPlaced { .. } => {
                Err("a sample in a batch place, but no batch arena".into())
            }
            Message::Sample(_) if same_host => {
                Err("a sample in the frame over the same-host socket".into())
            }
            Message::Sample(header) => self.frame_header(header),
            Message::Skipped(s) => Ok(Received::Skipped(s)),
            Message::UnitDone(d) => Ok(Received::UnitDone(d)),
            Message::UnitFailed(f) => Ok(Received::UnitFailed(f)),
            // The job is cancelled: its places in the batch arena are this process's again.
            Message::ShmReleased { job: j } if j == job => {
                if self.phase == Phase::Releasing {
                    self.finish(Ended::Cancelled);
                }
                Ok(Received::Released)
            }
            other => Err(format!("a worker does not send {}", other.kind())),
        };
        checked.unwrap_or_else(|detail| {
            self.protocol(detail);
            Received::Nothing
        })
    }

    /// A sample in its frame: the job's tensor size; another job's (an earlier epoch's late
    /// frame) is passed over.
    fn frame_header(&self, header: SampleHeader) -> Result<Received, String> {
        let bytes = self.shape.map_or(0, |s| s.bytes());
        if header.tensor_bytes != bytes {
            return Err(format!(
                "sample {:?} has {} tensor bytes, the job's shape has {bytes}",
                header.key, header.tensor_bytes
            ));
        }
        if header.job != self.settings.job.job {
            return Ok(Received::SkipPayload);
        }
        Ok(Received::Sample {
            header,
            at: TensorAt::Stream,
        })
    }

    /// A same-host sample's header names the connection's job and its shape's tensor size.
    fn same_host_header(&self, header: &SampleHeader) -> Result<(), String> {
        let (job, bytes) = (self.settings.job.job, self.shape.map_or(0, |s| s.bytes()));
        if header.tensor_bytes != bytes || header.job != job {
            return Err(format!(
                "sample {:?} of job {} with {} tensor bytes; the job is {job} with {bytes}",
                header.key, header.job, header.tensor_bytes
            ));
        }
        Ok(())
    }

    fn ready(&mut self, now: Instant) -> Received {
        self.phase = Phase::Running;
        self.heard = now;
        self.next_beat = now + self.settings.heartbeat;
        match self.shape {
            Some(shape) => Received::Ready {
                shape,
                caches: self.caches,
            },
            None => Received::Nothing,
        }
    }

    fn expect(&mut self, phase: Phase, now: Instant) {
        self.phase = phase;
        self.due = now + self.settings.handshake;
    }

    fn unexpected(&mut self, got: &Message, wanted: &str) -> Received {
        self.protocol(format!("expected {wanted}, got {}", got.kind()));
        Received::Nothing
    }

    fn protocol(&mut self, detail: String) {
        let worker = self.settings.worker.clone();
        self.finish(Ended::Fatal(ClientError::Protocol { worker, detail }));
    }

    /// The first verdict stands.
    fn finish(&mut self, ended: Ended) {
        if self.phase != Phase::Done {
            self.phase = Phase::Done;
            self.end = Some(ended);
        }
    }
}

/// Credits per worker connection: never more than the connection's receive window holds.
/// A same-host connection makes exactly this many slots, so a credit always has a slot
/// behind it.
pub(crate) fn credit_window(credits: u32, receive_window: u64, sample_bytes: u64) -> u32 {
    let fit = (receive_window / sample_bytes.max(1)).max(1);
    u64::from(credits).min(fit) as u32
}

/// What a worker's `Error` frame (or its connection close with that code) means.
pub(crate) fn refusal(worker: &str, code: ErrorCode, message: String) -> Ended {
    match code {
        // A draining or full worker may take us later.
        ErrorCode::Unavailable | ErrorCode::Internal => Ended::Lost(message),
        ErrorCode::Unauthorized | ErrorCode::BadRequest => Ended::Fatal(ClientError::Refused {
            worker: worker.to_string(),
            message,
        }),
    }
}

/// What a worker's close of the connection with application code `code` means: the codes of
/// [`ErrorCode`], and 3 with "draining" a worker that shuts down (a drain).
pub(crate) fn closed_by_worker(worker: &str, code: u64, reason: String) -> Ended {
    match code {
        1 => refusal(worker, ErrorCode::Unauthorized, reason),
        2 => refusal(worker, ErrorCode::BadRequest, reason),
        3 if reason.contains("draining") => Ended::Left(reason),
        _ => Ended::Lost(format!("closed by the worker: {reason}")),
    }
}

/// A link's rule between its connections: each is a new generation; after a loss the next
/// dial waits a backoff that doubles to 2 s; a refusal ends the link.
pub(crate) struct Redial {
    generation: u64,
    backoff: Duration,
    /// The worker drained: failing to reach it again is expected until it is back.
    left: bool,
    /// A connection got through its handshake, once at least.
    answered: bool,
}

/// How a link reports a connection's end (see [`Redial::ended`]).
#[derive(Debug)]
pub(crate) struct Loss {
    pub error: String,
    pub fatal: Option<ClientError>,
    pub tone: Tone,
    /// Dial again after this long (`None`: the link ends).
    pub retry_in: Option<Duration>,
}

/// How loud a loss is in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tone {
    /// The worker left the pool (INFO).
    Left,
    /// A worker that left is not back yet (DEBUG).
    NotBack,
    /// A worker lost (WARN).
    Lost,
    /// A worker of the pool that has never answered (WARN once a loader, else DEBUG).
    NeverAnswered,
}

impl Default for Redial {
    fn default() -> Self {
        Redial {
            generation: 0,
            backoff: Duration::from_millis(100),
            left: false,
            answered: false,
        }
    }
}

impl Redial {
    /// The next connection's generation.
    pub(crate) fn dial(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    /// A connection got through its handshake: the worker answers.
    pub(crate) fn answered(&mut self) {
        self.answered = true;
    }

    /// Connection `generation` ended: what to report, or `None` when the epoch is over.
    pub(crate) fn ended(&mut self, ended: Ended) -> Option<Loss> {
        let (error, fatal, drained) = match ended {
            Ended::Cancelled => return None,
            Ended::Left(reason) => (reason, None, true),
            Ended::Lost(e) => (e, None, false),
            Ended::Fatal(f) => (f.to_string(), Some(f), false),
        };
        let reconnecting = error.starts_with("connect:") || error.starts_with("no answer");
        let tone = if drained {
            self.left = true;
            Tone::Left
        } else if self.left && reconnecting {
            Tone::NotBack
        } else if !self.answered && reconnecting && fatal.is_none() {
            // Listed but never reached: the shell says it once a loader.
            Tone::NeverAnswered
        } else {
            self.left = false;
            Tone::Lost
        };
        let retry_in = fatal.is_none().then_some(self.backoff);
        self.backoff = (self.backoff * 2).min(Duration::from_secs(2));
        Some(Loss {
            error,
            fatal,
            tone,
            retry_in,
        })
    }
}

#[cfg(test)]
mod tests;
