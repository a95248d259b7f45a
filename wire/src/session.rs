//! The worker's half of the protocol as a state machine with no IO, in the manner of
//! `quinn-proto`: a [`Worker`] takes what its clients say, what its units do and the time,
//! and says what to send, which units to start, wake or stop, and when to call it again. It
//! holds the worker's rules once: admission (the cluster token or a tenant's, a draining
//! worker: `admission`), opening jobs, credits, which assignments are accepted, fair sharing
//! of the unit slots across jobs ([`FairQueue`]), drain, heartbeats and client silence; and
//! on the same-host socket (`shm`) the handshake's order, which segments may attach, slot
//! grants, the places a client gives, where each sample goes ([`Worker::route`]) and the
//! credit a sample written into its place gives back.
//!
//! Three shells drive it: the QUIC daemon and its same-host socket (`sluice_cpu::server`,
//! `sluice_cpu::same_host`), and the client's in-process worker (`sluice_client`'s links);
//! the client's paired simulation drives it with no runtime at all. A shell keeps the worker
//! behind one lock, feeds it, and carries out:
//!
//! - per connection, [`Worker::poll_effect`]: frames to send, jobs to open with the runner,
//!   segments to receive and map (same-host), the session's end;
//! - for the whole worker, [`Worker::take_wakes`]: units to start (a slot is theirs),
//!   resume (after waiting for a slot or a credit) or stop (their job is gone). A unit asks
//!   [`Worker::next_sample`] (or [`Worker::next_shared`]) before each sample it sends, and
//!   reports its end with [`Worker::unit_ended`]; [`UnitThread`] is that loop for a unit on a
//!   thread of its own.
//!
//! A unit holds a slot while it decodes. Out of credit, it gives the slot back (a job whose
//! consumer does not read must not hold the slots the other jobs need) and queues for one
//! again when a credit comes; after each sample it decoded it keeps its slot unless another
//! job waits, in which case the job charged least gets it (a sample copied from a sweep's
//! decode keeps the slot: [`Worker::next_shared`]).

mod admission;
mod fair;
mod shm;
mod threads;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

pub use admission::{Admission, Rules, Tenant};
pub use fair::FairQueue;
pub use shm::Route;
pub use threads::{Parker, UnitThread};

use crate::message::{Assign, ErrorCode, JobSpec, Message, SampleShape, UnitFailed};
use crate::runner::{Charge, UnitEnd};

/// What one job asks of a worker ([`Worker::demand`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// Its units holding a decode slot.
    pub running: usize,
    /// Its units waiting for a slot (the worker is the bottleneck).
    pub waiting: usize,
    /// Its units waiting for a credit (its consumer is).
    pub starved: usize,
}

/// How a connection's samples reach its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Tensors travel in the frames; credits are counts (QUIC, in-process).
    Frames,
    /// Tensors are written into the client's shared-memory slots; one job per connection,
    /// credits are the slots granted (same-host).
    Slots,
}

/// A connection, as the worker numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId(u64);

/// A unit (one assignment), as the worker numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnitId(u64);

/// Why a session ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// The worker drained (SIGTERM) and the connection has nothing left to run.
    Drained,
    /// Close with this error (said to the client first).
    Error(ErrorCode, String),
}

/// What the shell must do for one connection, in order.
#[derive(Debug, PartialEq)]
pub enum Effect {
    Send(Message),
    /// Open this job with the runner and report it with [`Worker::opened`].
    Open(JobSpec),
    /// Same-host: receive the client's descriptors for the segments `ShmAttach` describes
    /// (its slots, then its batch arena if it has places), map them, and report with
    /// [`Worker::attached`].
    Attach(crate::message::ShmAttach),
    /// The client cancelled the job: drop what the shell keeps for it, and return once no
    /// write into its batch arena is under way (a `ShmReleased` may follow).
    Cancelled(u64),
    /// The session is over.
    Close(End),
}

/// What the shell must do for a unit, given the launch data it registered the unit with.
#[derive(Debug)]
pub enum Wake<L> {
    /// The unit has a slot: start it.
    Start(L),
    /// The unit waited (for a slot or a credit) and may go on: ask [`Worker::next_sample`].
    Resume(L),
    /// The unit's job is gone: it stops (its next [`Worker::next_sample`] says so).
    Stop(L),
}

impl<L> Wake<L> {
    /// Carries out a resume or a stop on the unit's `parker`; the unit to start, if that is
    /// what the wake says.
    pub fn carry_out(self, parker: impl Fn(&L) -> &Parker) -> Option<L> {
        match self {
            Wake::Start(unit) => Some(unit),
            Wake::Resume(unit) => {
                parker(&unit).unpark();
                None
            }
            Wake::Stop(unit) => {
                parker(&unit).stop();
                None
            }
        }
    }
}

/// Whether a unit may send its next sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Go,
    /// Not yet: ask again after its [`Wake::Resume`] (or [`Wake::Stop`]).
    Wait(Waiting),
    /// Its job is gone: end it.
    Stop,
}

/// What a unit waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// A slot: the worker is busy with other units (the CPU tier is the bottleneck).
    Slot,
    /// A credit: its client has not asked for more (the consumer is).
    Credit,
}

struct Session {
    transport: Transport,
    jobs: HashMap<u64, Job>,
    /// Jobs handed to the shell to open and not yet reported.
    opening: HashSet<u64>,
    /// Units accepted and not yet finished ([`Worker::finished`]).
    running: usize,
    greeted: bool,
    /// Whom its token admitted it as (with tenants configured).
    tenant: Option<Arc<Tenant>>,
    draining: bool,
    closed: bool,
    connected: Instant,
    last_heard: Instant,
    next_heartbeat: Instant,
    seq: u64,
    effects: VecDeque<Effect>,
}

struct Job {
    name: Arc<str>,
    credits: u32,
    /// Units that gave their slot back for want of a credit, in the order they did.
    starved: VecDeque<UnitId>,
    /// A sample's tensor bytes (what a same-host slot must hold).
    sample_bytes: u64,
    /// Same-host: the client's segments, its slots and its places.
    shm: shm::Segments,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting in the fair queue for a slot.
    Queued,
    /// Holding a slot.
    Running,
    /// Waiting for a credit, with no slot.
    Starved,
}

struct Unit<L> {
    conn: ConnId,
    job: u64,
    /// The assignment's (unit, attempt).
    key: (u64, u32),
    name: Arc<str>,
    launch: L,
    state: State,
    /// A thread runs it (it was given a slot once).
    started: bool,
    /// Its job is gone: its next gate is [`Gate::Stop`].
    stopped: bool,
    /// It took its next sample's credit already.
    prepaid: bool,
    /// The slot's grant charged its job for the next sample already.
    charged: bool,
}

/// A CPU worker's rules over all its connections and units.
pub struct Worker<L> {
    rules: Rules,
    slots: usize,
    fair: FairQueue<UnitId>,
    sessions: HashMap<ConnId, Session>,
    units: HashMap<UnitId, Unit<L>>,
    wakes: Vec<Wake<L>>,
    next_conn: u64,
    next_unit: u64,
    draining: bool,
}

impl<L: Clone> Worker<L> {
    /// A worker decoding `slots` units at once.
    pub fn new(rules: Rules, slots: usize) -> Self {
        Worker {
            rules,
            slots: slots.max(1),
            fair: FairQueue::new(slots.max(1)),
            sessions: HashMap::new(),
            units: HashMap::new(),
            wakes: Vec::new(),
            next_conn: 0,
            next_unit: 0,
            draining: false,
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Admits clients as `admission` says from now on (a tenants or token file re-read): new
    /// handshakes use it at once; connections already admitted keep their tenant, and their
    /// jobs run on (a removed token ends only new handshakes).
    pub fn set_admission(&mut self, admission: Admission) {
        self.rules.admission = admission;
    }

    /// The unit slots, and the units waiting for one over every job (what a pool scales on).
    pub fn slots(&self) -> (usize, usize) {
        (self.slots, self.fair.waiting())
    }

    /// What job `name` asks of this worker now: its units holding a slot, waiting for one,
    /// and waiting for a credit from their client (over every connection). A job with none
    /// waiting for a slot takes less than its weight's share because it asks for less (its
    /// client reads slowly, or assigns few units), not because its weight is not honoured.
    pub fn demand(&self, name: &str) -> Demand {
        let (running, waiting) = self
            .fair
            .jobs()
            .find(|(n, ..)| *n == name)
            .map_or((0, 0), |(_, _, r, w)| (r, w));
        let starved = self
            .sessions
            .values()
            .flat_map(|s| s.jobs.values())
            .filter(|j| &*j.name == name)
            .map(|j| j.starved.len())
            .sum();
        Demand {
            running,
            waiting,
            starved,
        }
    }

    /// The jobs waiting for a slot, by name, with their weights.
    pub fn backlogged(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        self.fair.backlogged()
    }

    /// A client connected at `now`; it must say `Hello` within the handshake time.
    pub fn connect(&mut self, transport: Transport, now: Instant) -> ConnId {
        self.next_conn += 1;
        let conn = ConnId(self.next_conn);
        let session = Session {
            transport,
            jobs: HashMap::new(),
            opening: HashSet::new(),
            running: 0,
            greeted: false,
            tenant: None,
            draining: self.draining,
            closed: false,
            connected: now,
            last_heard: now,
            next_heartbeat: now + self.rules.heartbeat,
            seq: 0,
            effects: VecDeque::new(),
        };
        self.sessions.insert(conn, session);
        conn
    }

    /// The connection is gone (or its shell stops serving it): its jobs are cancelled and
    /// its units stopped.
    pub fn disconnect(&mut self, conn: ConnId) {
        let Some(session) = self.sessions.remove(&conn) else {
            return;
        };
        for job in session.jobs.values() {
            self.fair.close(&job.name);
        }
        let units: Vec<UnitId> = self
            .units
            .iter()
            .filter(|(_, u)| u.conn == conn)
            .map(|(id, _)| *id)
            .collect();
        for id in units {
            self.stop(id);
        }
    }

    /// What the client said. `launch` makes the shell's handle for an assignment the worker
    /// accepts (called only then).
    pub fn handle(
        &mut self,
        conn: ConnId,
        message: Message,
        now: Instant,
        launch: impl FnOnce(UnitId, &Assign) -> L,
    ) {
        let Some(s) = self.sessions.get_mut(&conn) else {
            return;
        };
        if s.closed {
            return;
        }
        s.last_heard = now;
        if !s.greeted {
            let hello = match message {
                Message::Hello(h) => h,
                other => {
                    let why = format!("expected Hello first, got {}", other.kind());
                    return self.close(conn, ErrorCode::BadRequest, why);
                }
            };
            let tenant = match admission::admit(&self.rules.admission, &hello) {
                Ok(tenant) => tenant,
                Err((code, why)) => return self.close(conn, code, why),
            };
            let s = self.sessions.get_mut(&conn).expect("the session handling");
            s.tenant = tenant;
            if self.draining {
                let why = "worker is draining".into();
                return self.close(conn, ErrorCode::Unavailable, why);
            }
            s.greeted = true;
            let welcome = Message::Welcome(self.rules.welcome.clone());
            s.effects.push_back(Effect::Send(welcome));
            return;
        }
        if let Some(why) = shm::out_of_order(s, &message) {
            return self.close(conn, ErrorCode::BadRequest, why);
        }
        let bad = |m: String| (ErrorCode::BadRequest, m);
        let refusal = match message {
            Message::Heartbeat { .. } => None,
            Message::OpenJob(spec) => self.open(conn, spec).err(),
            Message::Credit { job, samples } => {
                let Some(j) = s.jobs.get_mut(&job) else {
                    return; // a job cancelled a moment ago
                };
                if s.transport == Transport::Slots {
                    Some(bad(format!("job {job} takes slot credits, not counts")))
                } else {
                    let cap = match &s.tenant {
                        Some(t) => t.max_credits.min(self.rules.max_credits),
                        None => self.rules.max_credits,
                    };
                    let room = cap.saturating_sub(j.credits);
                    j.credits += samples.min(room);
                    self.feed(conn, job);
                    None
                }
            }
            m
            @ (Message::ShmAttach(_) | Message::SlotCredit { .. } | Message::ShmPlaces { .. }) => {
                self.handle_shm(conn, m)
            }
            Message::Assign(assign) => self.assign(conn, assign, launch).err(),
            Message::Cancel { job } => {
                self.cancel(conn, job);
                None
            }
            Message::Error(e) => Some((e.code, format!("the client reported: {}", e.message))),
            other => Some(bad(format!("a client does not send {}", other.kind()))),
        };
        if let Some((code, why)) = refusal {
            self.close(conn, code, why);
        }
    }

    /// The shell opened (or could not open) a job the client asked for: the weight it runs
    /// with, if it is open now.
    pub fn opened(
        &mut self,
        conn: ConnId,
        spec: &JobSpec,
        result: Result<SampleShape, String>,
    ) -> Option<u32> {
        let s = self.sessions.get_mut(&conn)?;
        if !s.opening.remove(&spec.job) || s.closed {
            return None;
        }
        let shape = match result {
            Ok(shape) => shape,
            Err(why) => {
                let why = format!("job {} ({}): {why}", spec.job, spec.dataset);
                self.close(conn, ErrorCode::BadRequest, why);
                return None;
            }
        };
        // Not `clamp`: a hand-made config's cap of 0 must not panic here.
        let cap = match &s.tenant {
            Some(t) => t.max_weight.min(self.rules.max_job_weight),
            None => self.rules.max_job_weight,
        };
        let weight = spec.weight.min(cap).max(1);
        let name: Arc<str> = spec.name.as_str().into();
        // A tenant's jobs share one share, its largest weight's, however many it opens; a
        // job's own weight orders it among its team's jobs only.
        match &s.tenant {
            Some(t) => self.fair.open_in(&t.name, cap.max(1), &name, weight),
            None => self.fair.open(&name, weight),
        }
        s.jobs.insert(
            spec.job,
            Job {
                name,
                credits: 0,
                starved: VecDeque::new(),
                sample_bytes: shape.bytes(),
                shm: shm::Segments::default(),
            },
        );
        let opened = Message::JobOpened {
            job: spec.job,
            shape,
            weight,
        };
        s.effects.push_back(Effect::Send(opened));
        Some(weight)
    }

    /// `n` credits for `job` (same-host: the slots a grant placed).
    pub fn credit(&mut self, conn: ConnId, job: u64, n: u32) {
        let job_state = self.job_mut(conn, job);
        if let Some(j) = job_state {
            j.credits = j.credits.saturating_add(n);
            self.feed(conn, job);
        }
    }

    /// The worker stops taking clients and assignments (SIGTERM): each connection ends once
    /// its running units have finished.
    pub fn drain(&mut self) {
        self.draining = true;
        for s in self.sessions.values_mut() {
            s.draining = true;
            if s.running == 0 && !s.closed {
                s.closed = true;
                s.effects.push_back(Effect::Close(End::Drained));
            }
        }
    }

    /// Whether [`Worker::drain`] was called.
    pub fn draining(&self) -> bool {
        self.draining
    }

    /// The next thing to do for `conn`.
    pub fn poll_effect(&mut self, conn: ConnId) -> Option<Effect> {
        self.sessions.get_mut(&conn)?.effects.pop_front()
    }

    /// Units to start, resume or stop, over every connection.
    pub fn take_wakes(&mut self) -> Vec<Wake<L>> {
        std::mem::take(&mut self.wakes)
    }

    /// When [`Worker::handle_timeout`] must be called for `conn`.
    pub fn poll_timeout(&self, conn: ConnId) -> Option<Instant> {
        let s = self.sessions.get(&conn)?;
        if s.closed {
            return None;
        }
        if !s.greeted {
            return Some(s.connected + self.rules.handshake);
        }
        Some(
            s.next_heartbeat
                .min(s.last_heard + self.rules.client_silence),
        )
    }

    /// Time has reached `conn`'s deadline: a heartbeat is due, or the client said nothing
    /// for too long.
    pub fn handle_timeout(&mut self, conn: ConnId, now: Instant) {
        let Some(s) = self.sessions.get_mut(&conn) else {
            return;
        };
        if s.closed {
            return;
        }
        // Neither is a refusal: the client may have been paused (a stopped process, or this
        // worker was itself frozen and reads its backlog late) and is welcome back.
        if !s.greeted {
            if now >= s.connected + self.rules.handshake {
                self.close(conn, ErrorCode::Unavailable, "no Hello in time".into());
            }
            return;
        }
        let silence = self.rules.client_silence;
        if now >= s.last_heard + silence {
            let why = format!("no frame from the client for {silence:?}");
            return self.close(conn, ErrorCode::Unavailable, why);
        }
        if now >= s.next_heartbeat {
            s.seq += 1;
            s.next_heartbeat = now + self.rules.heartbeat;
            let beat = Message::Heartbeat { seq: s.seq };
            s.effects.push_back(Effect::Send(beat));
        }
    }

    /// Unit `id` is about to send a sample it decoded: whether it may.
    pub fn next_sample(&mut self, id: UnitId) -> Gate {
        self.gate(id, Charge::Decoded)
    }

    /// Unit `id` is about to send a sample it copied from a decode made for another job of
    /// its sweep: whether it may. Its job is charged the copy, not a decode
    /// ([`fair::FairQueue::copied`]), and a unit that holds its slot keeps it, whoever waits:
    /// the copy held it for microseconds beside a decode's milliseconds, and handing the slot
    /// on at each one made a sweep's every sample a context switch per job.
    pub fn next_shared(&mut self, id: UnitId) -> Gate {
        self.gate(id, Charge::Shared)
    }

    /// [`Worker::next_sample`] and [`Worker::next_shared`]: whether unit `id` may send a
    /// sample that cost `charge`.
    fn gate(&mut self, id: UnitId, charge: Charge) -> Gate {
        let Some(u) = self.units.get_mut(&id) else {
            return Gate::Stop;
        };
        if u.stopped {
            return Gate::Stop;
        }
        match u.state {
            State::Running => {}
            State::Queued => return Gate::Wait(Waiting::Slot),
            State::Starved => return Gate::Wait(Waiting::Credit),
        }
        if !u.prepaid {
            let session = self.sessions.get_mut(&u.conn);
            let Some(j) = session.and_then(|s| s.jobs.get_mut(&u.job)) else {
                return Gate::Stop; // its session went with its job; `stop` follows
            };
            if j.credits == 0 {
                // Out of credit: the slot goes to whoever waits, and back when credit comes.
                u.state = State::Starved;
                j.starved.push_back(id);
                let name = u.name.clone();
                self.release_slot(&name);
                return Gate::Wait(Waiting::Credit);
            }
            j.credits -= 1;
        }
        u.prepaid = false;
        let charged = std::mem::take(&mut u.charged);
        if charge == Charge::Shared {
            // Charged a decode by its grant: the difference goes back.
            match charged {
                true => self.fair.served_shared(&u.name),
                false => self.fair.copied(&u.name),
            }
            return Gate::Go;
        }
        if charged || self.fair.keep(&u.name) {
            return Gate::Go;
        }
        // Another job waits: the slot goes to the job charged least, this one included.
        u.state = State::Queued;
        u.prepaid = true;
        let name = u.name.clone();
        let next = self.fair.requeue(&name, id, queued(&self.units));
        match next {
            Some(n) if n == id => {
                let u = self.units.get_mut(&id).expect("the unit asking");
                u.state = State::Running;
                u.prepaid = false;
                Gate::Go
            }
            next => {
                if let Some(n) = next {
                    self.hand(n);
                }
                Gate::Wait(Waiting::Slot)
            }
        }
    }

    /// Unit `id` ended (its runner returned): the frame that reports it, unless its job is
    /// gone. Send it, then call [`Worker::finished`].
    pub fn unit_ended(&mut self, id: UnitId, end: UnitEnd) -> Option<Message> {
        let u = self.units.remove(&id)?;
        self.forget_places(&u);
        if u.state == State::Running {
            self.release_slot(&u.name);
        }
        let open = self
            .sessions
            .get(&u.conn)
            .is_some_and(|s| !s.closed && s.jobs.contains_key(&u.job));
        if u.stopped || !open {
            return None;
        }
        Some(match end {
            UnitEnd::Done(done) => Message::UnitDone(done),
            UnitEnd::Failed(failed) => Message::UnitFailed(failed),
        })
    }

    /// A unit of `conn` has ended and its frames are sent: a draining session with nothing
    /// left closes.
    pub fn finished(&mut self, conn: ConnId) {
        let Some(s) = self.sessions.get_mut(&conn) else {
            return;
        };
        s.running = s.running.saturating_sub(1);
        if s.draining && s.running == 0 && !s.closed {
            s.closed = true;
            s.effects.push_back(Effect::Close(End::Drained));
        }
    }

    fn close(&mut self, conn: ConnId, code: ErrorCode, why: String) {
        if let Some(s) = self.sessions.get_mut(&conn) {
            if !s.closed {
                s.closed = true;
                s.effects.push_back(Effect::Close(End::Error(code, why)));
            }
        }
    }

    /// Checks an `OpenJob` and hands it to the shell to open, under its tenant's name.
    fn open(&mut self, conn: ConnId, mut spec: JobSpec) -> Result<(), (ErrorCode, String)> {
        let s = self.sessions.get_mut(&conn).expect("the session handling");
        let bad = |msg: String| Err((ErrorCode::BadRequest, msg));
        if s.jobs.contains_key(&spec.job) || s.opening.contains(&spec.job) {
            return bad(format!("job {} is already open", spec.job));
        }
        if s.transport == Transport::Slots && !(s.jobs.is_empty() && s.opening.is_empty()) {
            return bad("a same-host connection carries one job".into());
        }
        if spec.name.is_empty() || spec.name.len() > 128 || spec.name.chars().any(char::is_control)
        {
            return bad(format!(
                "job {}: its name {:?} must be 1 to 128 printable characters",
                spec.job, spec.name
            ));
        }
        if let Some(t) = &s.tenant {
            spec.name = t.job_name(&spec.name);
        }
        s.opening.insert(spec.job);
        s.effects.push_back(Effect::Open(spec));
        Ok(())
    }

    /// Checks an assignment and queues it for a slot (or, draining, fails it at once).
    fn assign(
        &mut self,
        conn: ConnId,
        assign: Assign,
        launch: impl FnOnce(UnitId, &Assign) -> L,
    ) -> Result<(), (ErrorCode, String)> {
        let s = self.sessions.get_mut(&conn).expect("the session handling");
        let bad = |msg: String| Err((ErrorCode::BadRequest, msg));
        let Some(job) = s.jobs.get(&assign.job) else {
            return bad(format!(
                "assignment for job {}, which is not open",
                assign.job
            ));
        };
        if s.draining {
            let failed = Message::UnitFailed(UnitFailed {
                job: assign.job,
                unit: assign.unit,
                attempt: assign.attempt,
                error: "worker is draining".into(),
            });
            s.effects.push_back(Effect::Send(failed));
            return Ok(());
        }
        let max = self.rules.max_units_per_connection;
        if s.running >= max {
            return bad(format!(
                "more than limits.max_units_per_connection = {max} assignments at once"
            ));
        }
        if s.transport == Transport::Slots && !job.shm.attached() {
            return bad(format!("job {} has no segment attached", assign.job));
        }
        if assign.start >= assign.end || assign.end > assign.shard.samples {
            return bad(format!(
                "unit {}: samples {}..{} of a {}-sample shard",
                assign.unit, assign.start, assign.end, assign.shard.samples
            ));
        }
        s.running += 1;
        let name = job.name.clone();
        let key = (assign.unit, assign.attempt);
        if let Some(j) = s.jobs.get_mut(&assign.job) {
            j.shm.unit_started(key);
        }
        self.next_unit += 1;
        let id = UnitId(self.next_unit);
        let unit = Unit {
            conn,
            job: assign.job,
            key,
            name: name.clone(),
            launch: launch(id, &assign),
            state: State::Queued,
            started: false,
            stopped: false,
            prepaid: false,
            charged: false,
        };
        self.units.insert(id, unit);
        if let Some(granted) = self.fair.request(&name, id) {
            self.hand(granted);
        }
        Ok(())
    }

    /// The client cancelled `job`: its units stop.
    fn cancel(&mut self, conn: ConnId, job: u64) {
        let Some(s) = self.sessions.get_mut(&conn) else {
            return;
        };
        let Some(j) = s.jobs.remove(&job) else {
            return;
        };
        s.effects.push_back(Effect::Cancelled(job));
        // A client sharing its batches hears when no unit writes them any more: the shell
        // has waited out the writes under way when it carried out `Cancelled`.
        if j.shm.has_arena() {
            let released = Message::ShmReleased { job };
            s.effects.push_back(Effect::Send(released));
        }
        self.fair.close(&j.name);
        let units: Vec<UnitId> = self
            .units
            .iter()
            .filter(|(_, u)| u.conn == conn && u.job == job)
            .map(|(id, _)| *id)
            .collect();
        for id in units {
            self.stop(id);
        }
    }

    /// A unit's job is gone. One that never started is forgotten (its slot request lapses);
    /// one that runs is told to stop, and gives its slot back when it ends.
    fn stop(&mut self, id: UnitId) {
        let Some(u) = self.units.get_mut(&id) else {
            return;
        };
        if u.started {
            u.stopped = true;
            self.wakes.push(Wake::Stop(u.launch.clone()));
            return;
        }
        let conn = u.conn;
        if let Some(u) = self.units.remove(&id) {
            self.forget_places(&u);
        }
        self.finished(conn);
    }

    /// Job `job` of connection `conn`, while both are open.
    fn job_mut(&mut self, conn: ConnId, job: u64) -> Option<&mut Job> {
        self.sessions.get_mut(&conn)?.jobs.get_mut(&job)
    }

    /// A unit ended (or was forgotten): the places its client gave for it are dropped.
    fn forget_places(&mut self, u: &Unit<L>) {
        let job = self.job_mut(u.conn, u.job);
        if let Some(j) = job {
            j.shm.unit_ended(u.key);
        }
    }

    /// Credits came for `job`: units that starved for want of them queue for a slot again,
    /// each with its credit taken.
    fn feed(&mut self, conn: ConnId, job: u64) {
        loop {
            let session = self.sessions.get_mut(&conn);
            let Some(j) = session.and_then(|s| s.jobs.get_mut(&job)) else {
                return;
            };
            if j.credits == 0 {
                return;
            }
            let Some(id) = j.starved.pop_front() else {
                return;
            };
            let Some(u) = self.units.get_mut(&id) else {
                continue;
            };
            if u.stopped || u.state != State::Starved {
                continue;
            }
            j.credits -= 1;
            u.prepaid = true;
            u.state = State::Queued;
            let name = u.name.clone();
            if let Some(granted) = self.fair.request(&name, id) {
                self.hand(granted);
            }
        }
    }

    /// A unit of `name` gave its slot back: the next waiter gets it.
    fn release_slot(&mut self, name: &str) {
        if let Some(next) = self.fair.release(name, queued(&self.units)) {
            self.hand(next);
        }
    }

    /// Unit `id` was granted a slot (and its job charged for its next sample).
    fn hand(&mut self, id: UnitId) {
        let Some(u) = self.units.get_mut(&id) else {
            return;
        };
        u.state = State::Running;
        u.charged = true;
        let wake = match std::mem::replace(&mut u.started, true) {
            false => Wake::Start(u.launch.clone()),
            true => Wake::Resume(u.launch.clone()),
        };
        self.wakes.push(wake);
    }
}

/// Whether a fair-queue waiter still wants its slot (it may have stopped or ended since).
fn queued<L>(units: &HashMap<UnitId, Unit<L>>) -> impl Fn(&UnitId) -> bool + '_ {
    |id| {
        units
            .get(id)
            .is_some_and(|u| u.state == State::Queued && !u.stopped)
    }
}

#[cfg(test)]
mod tests;
