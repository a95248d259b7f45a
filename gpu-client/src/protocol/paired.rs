//! The paired simulation: the client's real [`Protocol`] (one per training job) and its real
//! connection sessions (`crate::session::Session`, one per connection) against real worker
//! state machines (`sluice_wire::session::Worker`, one per worker process), with no async
//! runtime, no threads and no sockets: both halves of every rule (handshake, heartbeats,
//! silence, drain, generations, credits; on same-host connections the attach, slot grants,
//! places, the credit a placed sample gives back and the release) are the code the links and
//! daemons run. Everything between them is simulated and seeded: frames in flight on each
//! connection (in order, delivered at random moments), units that decode one output per step
//! on the slots their worker grants, a clock, and a pool that changes: workers join and leave
//! (drained), die and restart, stall past the clients' silence, drain for SIGTERM, and have
//! connections cut, while several jobs of different weights share them. Half the jobs speak
//! same-host, with a batch arena of their own (`same_host`).
//!
//! Every seed checks, from outside: each job's batches are the plan's (every planned sample
//! once, in the plan's order; in arrival order, exactly once), its reorder area within the
//! bound, no worker sends a sample without a credit, and no worker runs more units than its
//! slots; on same-host connections, that no place has two writers, that a placed sample
//! spends no credit, and that a released job's places are never written. Over all seeds:
//! where several jobs wait for one worker, each gets its weight's share of the samples
//! decoded. `SLUICE_SIM_SEEDS` sets the number of seeds.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_plan::rng::{stream, Domain, Stream};
use sluice_wire::session::{ConnId, Effect, End, Gate, Transport};
use sluice_wire::{ErrorCode, ErrorMessage, Hello, JobSpec, Message, UnitDone, UnitFailed};

use super::world::{bad, decoded, rejected, seeds, tensor, world, World, SHAPE};
use super::{Action, Protocol, Tensor};
use crate::reorder::Arrival;
use crate::session::{self, Command, Commanded, Ended, Received, Session, TensorAt};
use crate::stats::{EpochCounters, Stats};

/// A sample's tensor as the simulated client holds it: written into its place in the batch
/// arena (it spent no credit), or in a slot or a frame.
#[derive(Debug)]
struct SimTensor {
    #[allow(dead_code)]
    bytes: Vec<u8>,
    placed: bool,
}

impl Tensor for SimTensor {
    fn detach(self, _tensor_bytes: usize) -> Self {
        self
    }

    fn spent_credit(&self) -> bool {
        !self.placed
    }
}

/// How long either side waits for a frame before it declares the other gone, and between
/// heartbeats (the clients' and the workers' settings).
const SILENCE: Duration = Duration::from_secs(10);
const HEARTBEAT: Duration = Duration::from_secs(1);
const MAX_WORKERS: usize = 6;

mod pool;
mod same_host;
mod workers;
use same_host::{JobArena, ShmConn, ShmTally};
use workers::{Running, SimUnit, SimWorker};

/// A connection between a job's link and a worker, with what is in flight each way.
struct Conn {
    job: usize,
    link: usize,
    worker: usize,
    wconn: ConnId,
    generation: u64,
    /// The client's half.
    session: Session,
    to_worker: VecDeque<Message>,
    to_client: VecDeque<Message>,
    /// The worker ended it (its frames so far still arrive).
    worker_closed: bool,
    /// The client dropped it (the worker notices when it next runs).
    client_closed: bool,
    /// Credits the client granted on it, and samples the worker sent.
    granted: u64,
    sent: u64,
    /// A same-host connection's shell.
    shm: Option<ShmConn>,
}

/// A job's link to one worker.
struct Link {
    worker: usize,
    generation: u64,
    conn: Option<usize>,
    released: bool,
    /// Down until then (reconnect backoff).
    retry_at: Duration,
}

struct Job {
    id: u64,
    name: String,
    weight: u32,
    world: World,
    protocol: Protocol<SimTensor>,
    links: Vec<Link>,
    batches: Vec<Vec<(u32, u64)>>,
    filling: Vec<(u32, u64)>,
    counters: Arc<EpochCounters>,
    /// Its connections are same-host, sharing its batch arena.
    arena: Option<JobArena>,
}

impl Job {
    fn spec(&self) -> JobSpec {
        JobSpec {
            job: self.id,
            name: self.name.clone(),
            weight: self.weight,
            share: true,
            ..JobSpec::default()
        }
    }
}

/// Samples decoded where several jobs waited for the worker: what each weight got, and what
/// its share of those moments promised.
#[derive(Default)]
struct Shares {
    got: HashMap<u32, f64>,
    promised: HashMap<u32, f64>,
}

#[derive(Default)]
struct Tally {
    joined: usize,
    left: usize,
    killed: usize,
    stalled: usize,
    drained: usize,
    cut: usize,
    hedged: u64,
    reassigned: u64,
    steps: u64,
}

struct Sim {
    rng: Stream,
    base: Instant,
    now: Duration,
    workers: Vec<SimWorker>,
    conns: Vec<Conn>,
    jobs: Vec<Job>,
    shares: Shares,
    tally: Tally,
    shm_tally: ShmTally,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = stream(seed, Domain::Sample, 0, 7);
        let base = Instant::now();
        let n_workers = 1 + rng.below(3) as usize;
        let workers: Vec<SimWorker> = (0..n_workers).map(|_| SimWorker::new(&mut rng)).collect();
        let n_jobs = 1 + rng.below(3) as usize;
        let mut jobs = Vec::new();
        for j in 0..n_jobs {
            let world = world(seed * 7 + j as u64);
            let counters = Arc::new(EpochCounters::default());
            let settings = world.settings(&mut rng, j as u64 + 1, 2);
            let names = (0..n_workers).map(|w| format!("w{w}")).collect();
            let protocol = Protocol::new(
                settings,
                world.manifest.clone(),
                world.order(seed),
                names,
                (counters.clone(), Arc::new(Stats::new())),
                base,
            );
            let links = (0..n_workers).map(Link::new).collect();
            let same_host = rng.below(2) == 0;
            let arena = same_host.then(|| JobArena::new(world.batch_plan.batch_size));
            jobs.push(Job {
                id: j as u64 + 1,
                name: format!("job{j}"),
                weight: [1, 1, 3][rng.below(3) as usize],
                world,
                protocol,
                links,
                batches: Vec::new(),
                filling: Vec::new(),
                counters,
                arena,
            });
        }
        Sim {
            rng,
            base,
            now: Duration::ZERO,
            workers,
            conns: Vec::new(),
            jobs,
            shares: Shares::default(),
            tally: Tally::default(),
            shm_tally: ShmTally::default(),
        }
    }

    fn at(&self) -> Instant {
        self.base + self.now
    }

    fn run(&mut self, seed: u64) {
        for j in 0..self.jobs.len() {
            self.act(j);
        }
        let mut ended = vec![false; self.jobs.len()];
        let mut all_ended = None;
        loop {
            for (j, ended) in ended.iter_mut().enumerate() {
                if !*ended && self.jobs[j].protocol.finished() {
                    *ended = true;
                    self.end_epoch(j);
                }
            }
            if ended.iter().all(|e| *e) {
                // Same-host connections asking for their places back get their answer (or
                // give up waiting for it).
                let since = *all_ended.get_or_insert(self.now);
                let releasing = (0..self.conns.len()).any(|c| self.releasing(c));
                if !releasing || self.now > since + Duration::from_secs(30) {
                    break;
                }
            }
            self.tally.steps += 1;
            assert!(
                self.now < Duration::from_secs(3600),
                "seed {seed}: the epochs never finished"
            );
            let busy = self.step();
            self.now += match busy {
                true => Duration::from_micros(self.rng.below(2000)),
                false => Duration::from_millis(100),
            };
            self.timers();
            self.release_timers();
            self.change_pool();
        }
    }

    /// One random thing happens: a frame arrives, or a unit decodes its next output.
    /// Whether there was anything to do.
    fn step(&mut self) -> bool {
        let pending: Vec<usize> = (0..self.conns.len())
            .filter(|&c| {
                let conn = &self.conns[c];
                let worker_runs = self.workers[conn.worker].active(self.now);
                let worker_side = !conn.worker_closed
                    && worker_runs
                    && (!conn.to_worker.is_empty() || conn.client_closed);
                (!conn.to_client.is_empty() && !conn.client_closed) || worker_side
            })
            .collect();
        let busy_workers: Vec<usize> = (0..self.workers.len())
            .filter(|&w| self.workers[w].active(self.now) && !self.workers[w].running.is_empty())
            .collect();
        if pending.is_empty() && busy_workers.is_empty() {
            return false;
        }
        let frames = !pending.is_empty() && (busy_workers.is_empty() || self.rng.below(2) == 0);
        if frames {
            let c = pending[self.rng.below(pending.len() as u64) as usize];
            self.deliver(c);
        } else {
            let w = busy_workers[self.rng.below(busy_workers.len() as u64) as usize];
            self.decode(w);
        }
        true
    }

    /// One frame on connection `c`, one way or the other.
    fn deliver(&mut self, c: usize) {
        let conn = &mut self.conns[c];
        let worker_runs = self.workers[conn.worker].active(self.now) && !conn.worker_closed;
        let to_client = !conn.to_client.is_empty()
            && !conn.client_closed
            && (!worker_runs || conn.to_worker.is_empty() || self.rng.below(2) == 0);
        if to_client {
            let m = conn.to_client.pop_front().expect("a frame");
            return self.arrive(c, m);
        }
        let (w, wconn) = (conn.worker, conn.wconn);
        if !worker_runs {
            return;
        }
        if conn.client_closed {
            conn.to_worker.clear();
            conn.client_closed = false;
            conn.worker_closed = true;
            self.workers[w].rules.disconnect(wconn);
            self.workers[w].wake();
            return;
        }
        let Some(m) = conn.to_worker.pop_front() else {
            return;
        };
        let now = self.at();
        let worker = &mut self.workers[w];
        worker.rules.handle(wconn, m, now, |id, assign| SimUnit {
            id,
            conn: wconn,
            assign: assign.clone(),
        });
        self.worker_effects(c);
    }

    /// Carries out what a worker's session says for connection `c`.
    fn worker_effects(&mut self, c: usize) {
        let (w, wconn, job) = (self.conns[c].worker, self.conns[c].wconn, self.conns[c].job);
        while let Some(effect) = self.workers[w].rules.poll_effect(wconn) {
            match effect {
                Effect::Send(m) => self.conns[c].to_client.push_back(m),
                Effect::Open(spec) => {
                    let weight = self.workers[w].rules.opened(wconn, &spec, Ok(SHAPE));
                    assert_eq!(weight, Some(self.jobs[job].weight));
                }
                Effect::Attach(attach) => {
                    // The shell maps the segments the client sent.
                    self.workers[w].rules.attached(wconn, attach.job, Ok(()));
                }
                Effect::Cancelled(_) => self.released(c),
                Effect::Close(end) => {
                    // The client reads the worker's last word after its other frames.
                    let (code, message) = match end {
                        End::Error(code, message) => (code, message),
                        End::Drained => (ErrorCode::Unavailable, "worker is draining".into()),
                    };
                    let conn = &mut self.conns[c];
                    let last = Message::Error(ErrorMessage { code, message });
                    conn.to_client.push_back(last);
                    conn.worker_closed = true;
                    conn.to_worker.clear();
                    self.workers[w].rules.disconnect(wconn);
                    break;
                }
            }
        }
        self.workers[w].wake();
    }

    /// A frame reaches the client: its session makes of it what the link would.
    fn arrive(&mut self, c: usize, m: Message) {
        let now = self.at();
        let (j, l, generation) = (
            self.conns[c].job,
            self.conns[c].link,
            self.conns[c].generation,
        );
        let received = self.conns[c].session.handle(m, now);
        let unit_end = match &received {
            Received::UnitDone(d) => Some((d.unit, d.attempt)),
            Received::UnitFailed(f) => Some((f.unit, f.attempt)),
            _ => None,
        };
        if unit_end.is_some() || matches!(received, Received::Released) {
            self.settled(c, unit_end);
        }
        let tensor = match &received {
            Received::Sample { header, at } if *at != TensorAt::Stream => {
                Some(self.received(c, header, *at))
            }
            _ => None,
        };
        // A connection the job let go of, waiting for its worker's release: nothing more
        // reaches the job.
        if self.jobs[j].links[l].conn != Some(c) {
            return self.flush(c);
        }
        let job = &mut self.jobs[j];
        let p = &mut job.protocol;
        match received {
            Received::Nothing | Received::SkipPayload | Received::Released => {}
            Received::Ready { shape, .. } => {
                p.ready(l, generation, shape, job.world.caches)
                    .expect("ready");
            }
            Received::Sample { header, .. } => {
                let t = tensor.unwrap_or_else(|| SimTensor {
                    bytes: super::world::tensor(header.shard, header.index),
                    placed: false,
                });
                p.sample(l, header, t, Default::default(), now);
            }
            Received::Skipped(s) => p.skipped(s, now),
            Received::UnitDone(d) => p.piece_ended(l, d.unit, d.attempt, None).expect("done"),
            Received::UnitFailed(f) => {
                p.piece_ended(l, f.unit, f.attempt, Some(f.error))
                    .expect("failed");
            }
            Received::Attach(_) => {
                self.attach(c);
            }
        }
        self.flush(c);
        self.act(j);
    }

    /// Sends what connection `c`'s session queued, and, once the session has ended, takes
    /// the link down (the worker refused or closed, or fell silent: the link retries).
    fn flush(&mut self, c: usize) {
        while let Some(m) = self.conns[c].session.poll_transmit() {
            let conn = &mut self.conns[c];
            if let Message::Credit { samples, .. } = &m {
                conn.granted += u64::from(*samples);
            }
            if conn.client_closed {
                continue;
            }
            if let Message::SlotCredit { slots, .. } = &m {
                let slots = slots.clone();
                conn.to_worker.push_back(m);
                self.slots_sent(c, &slots);
            } else {
                conn.to_worker.push_back(m);
            }
        }
        let conn = &mut self.conns[c];
        let (j, l) = (conn.job, conn.link);
        let Some(ended) = conn.session.take_end() else {
            return;
        };
        if self.jobs[j].links[l].conn != Some(c) {
            // A connection released at the job's request has ended: it is dropped.
            let conn = &mut self.conns[c];
            if !conn.worker_closed {
                conn.client_closed = true;
            }
            return;
        }
        let why = match ended {
            Ended::Fatal(f) => panic!("an unexpected refusal: {f}"),
            Ended::Lost(why) | Ended::Left(why) => why,
            Ended::Cancelled => "cancelled".into(),
        };
        if self.jobs[j].links[l].conn == Some(c) {
            self.lose(j, l, why);
        }
    }

    /// Link `l` of job `j` is down: its connection is dropped, its pieces go back.
    fn lose(&mut self, j: usize, l: usize, why: String) {
        let now = self.at();
        let link = &mut self.jobs[j].links[l];
        if let Some(c) = link.conn.take() {
            let conn = &mut self.conns[c];
            conn.to_client.clear();
            if !conn.worker_closed {
                conn.client_closed = true;
            }
        }
        link.retry_at = self.now + Duration::from_millis(100 + self.rng.below(900));
        let generation = link.generation;
        self.jobs[j].protocol.lost(l, generation, why, now);
        self.act(j);
    }

    /// Unit work on worker `w`: a running unit sends its next output, or ends.
    fn decode(&mut self, w: usize) {
        let worker = &mut self.workers[w];
        let holding = worker.running.iter().filter(|r| r.holds).count();
        assert!(
            holding <= worker.slots,
            "worker {w} runs {holding} units on {} slots",
            worker.slots
        );
        let r = self.rng.below(worker.running.len() as u64) as usize;
        let running = &mut worker.running[r];
        let unit = running.unit.clone();
        let c = self
            .conns
            .iter()
            .rposition(|c| c.worker == w && c.wconn == unit.conn)
            .expect("the unit's connection");
        let a = &unit.assign;
        let (shard, index) = (a.shard.index, running.next);
        if running.stopped {
            let r = worker.running.swap_remove(r);
            return self.end_unit(c, r, None);
        }
        let output = match bad(shard, index) {
            true => Some(Message::Skipped(rejected(a, index))),
            false => {
                let backlog: Vec<(String, u32)> = worker
                    .rules
                    .backlogged()
                    .map(|(n, w)| (n.to_string(), w))
                    .collect();
                match worker.rules.next_sample(unit.id) {
                    Gate::Go => {
                        self.count_share(&backlog, a.job);
                        match self.conns[c].shm.is_some() {
                            true => Some(self.write(c, &unit, index)),
                            false => Some(Message::Sample(decoded(a, index))),
                        }
                    }
                    Gate::Wait(_) => {
                        let worker = &mut self.workers[w];
                        let r = worker.running.swap_remove(r);
                        worker.parked.insert(unit.id, r);
                        worker.wake();
                        return;
                    }
                    Gate::Stop => {
                        let r = self.workers[w].running.swap_remove(r);
                        return self.end_unit(c, r, None);
                    }
                }
            }
        };
        let worker = &mut self.workers[w];
        worker.wake();
        let conn = &mut self.conns[c];
        if let Some(m) = output {
            if matches!(m, Message::Sample(_)) {
                spend(&mut conn.sent, conn.granted, "credits");
            }
            if !conn.worker_closed {
                conn.to_client.push_back(m);
            }
        }
        let Some(pos) = worker.running.iter().position(|r| r.unit.id == unit.id) else {
            return;
        };
        worker.running[pos].next += 1;
        if worker.running[pos].next == a.end {
            let r = worker.running.swap_remove(pos);
            let done = UnitDone {
                job: a.job,
                unit: a.unit,
                attempt: a.attempt,
                sent: 0,
                skipped: 0,
                storage_bytes: 0,
                cached_bytes: 0,
            };
            self.end_unit(c, r, Some(sluice_wire::UnitEnd::Done(done)));
        }
    }

    /// A unit's thread returns (`None`: it was stopped).
    fn end_unit(&mut self, c: usize, r: Running, end: Option<sluice_wire::UnitEnd>) {
        let w = self.conns[c].worker;
        let a = &r.unit.assign;
        let end = end.unwrap_or_else(|| {
            sluice_wire::UnitEnd::Failed(UnitFailed {
                job: a.job,
                unit: a.unit,
                attempt: a.attempt,
                error: "cancelled".into(),
            })
        });
        let worker = &mut self.workers[w];
        let frame = worker.rules.unit_ended(r.unit.id, end);
        worker.wake();
        if let Some(m) = frame {
            if !self.conns[c].worker_closed {
                self.conns[c].to_client.push_back(m);
            }
        }
        self.workers[w].rules.finished(r.unit.conn);
        self.worker_effects(c);
    }

    /// Where the unit's worker had several jobs waiting, a decoded sample of job `job` counts
    /// against its weight's share.
    fn count_share(&mut self, backlog: &[(String, u32)], job: u64) {
        let j = &self.jobs[job as usize - 1];
        let mut active = backlog.to_vec();
        if !active.iter().any(|(n, _)| *n == j.name) {
            active.push((j.name.clone(), j.weight));
        }
        if active.len() < 2 {
            return;
        }
        let total: u32 = active.iter().map(|(_, w)| w).sum();
        for (name, weight) in &active {
            let promised = f64::from(*weight) / f64::from(total);
            *self.shares.promised.entry(*weight).or_default() += promised;
            if *name == j.name {
                *self.shares.got.entry(*weight).or_default() += 1.0;
            }
        }
    }

    /// The protocol's actions for job `j`.
    fn act(&mut self, j: usize) {
        while let Some(action) = self.jobs[j].protocol.poll_action() {
            let job = &mut self.jobs[j];
            match action {
                Action::Assign(l, generation, assign) => {
                    let piece = assign.clone();
                    self.command(j, l, Command::Assign(generation, assign));
                    self.place_piece(j, l, generation, &piece);
                }
                Action::Credit(l, generation, n) => {
                    self.command(j, l, Command::Credit(generation, n));
                }
                Action::Ring(_) => {}
                Action::Fill(Arrival::Sample { id, .. }) => job.filling.push((id.shard, id.index)),
                Action::Fill(Arrival::Skip { .. }) => {}
                Action::Close => {
                    let batch = std::mem::take(&mut job.filling);
                    job.batches.push(batch);
                    self.bind_next(j);
                }
                Action::Drain(l) => self.command(j, l, Command::Drain),
                Action::Release(l) => {
                    let link = &mut job.links[l];
                    link.released = true;
                    if let Some(c) = link.conn.take() {
                        self.release(c);
                    }
                }
            }
        }
    }

    /// A command of job `j`'s protocol to its link `l`, carried out by the link's session
    /// (which drops what was meant for an earlier connection).
    fn command(&mut self, j: usize, l: usize, command: Command) {
        let Some(c) = self.jobs[j].links[l].conn else {
            return;
        };
        match self.conns[c].session.command(command) {
            Commanded::Nothing => {}
            other => self.commanded(c, other),
        }
        self.flush(c);
    }

    /// What happens at its time: sessions beat and notice silence, links redial; workers
    /// beat and notice silent clients; stalls end; the protocols hedge.
    fn timers(&mut self) {
        let now = self.at();
        for j in 0..self.jobs.len() {
            for l in 0..self.jobs[j].links.len() {
                let link = &self.jobs[j].links[l];
                let w = link.worker;
                if link.released {
                    continue;
                }
                match link.conn {
                    None if self.now >= link.retry_at && self.workers[w].alive => {
                        self.connect(j, l);
                    }
                    None => {}
                    Some(c) => {
                        let session = &mut self.conns[c].session;
                        if session.poll_timeout().is_some_and(|t| t <= now) {
                            session.handle_timeout(now);
                            self.flush(c);
                        }
                    }
                }
            }
            if self.jobs[j]
                .protocol
                .poll_timeout()
                .is_some_and(|t| t <= now)
            {
                self.jobs[j]
                    .protocol
                    .timeout(now)
                    .expect("no epoch fails here");
                self.act(j);
            }
        }
        for c in 0..self.conns.len() {
            let conn = &self.conns[c];
            if conn.worker_closed || !self.workers[conn.worker].active(self.now) {
                continue;
            }
            let (w, wconn) = (conn.worker, conn.wconn);
            if self.workers[w]
                .rules
                .poll_timeout(wconn)
                .is_some_and(|t| t <= now)
            {
                self.workers[w].rules.handle_timeout(wconn, now);
                self.worker_effects(c);
            }
        }
    }

    /// Link `l` of job `j` dials its worker: a new connection (generation).
    fn connect(&mut self, j: usize, l: usize) {
        let now = self.at();
        let w = self.jobs[j].links[l].worker;
        let shm = self.shm_conn(j);
        let (transport, client_transport) = match shm.is_some() {
            true => (Transport::Slots, session::Transport::SameHost),
            false => (Transport::Frames, session::Transport::Frames),
        };
        let wconn = self.workers[w].rules.connect(transport, now);
        let settings = session::Settings {
            worker: format!("w{w}"),
            hello: Hello {
                token: "t".into(),
                client: "sim".into(),
            },
            job: self.jobs[j].spec(),
            transport: client_transport,
            heartbeat: HEARTBEAT,
            silence: SILENCE,
            handshake: SILENCE,
        };
        let link = &mut self.jobs[j].links[l];
        link.generation += 1;
        self.conns.push(Conn {
            job: j,
            link: l,
            worker: w,
            wconn,
            generation: link.generation,
            session: Session::new(settings, link.generation, now),
            to_worker: VecDeque::new(),
            to_client: VecDeque::new(),
            worker_closed: false,
            client_closed: false,
            granted: 0,
            sent: 0,
            shm,
        });
        let c = self.conns.len() - 1;
        link.conn = Some(c);
        self.flush(c);
    }
}

/// A worker sent one more sample against what its client granted (`credits`, or same-host
/// `slots`): never more than granted.
fn spend(sent: &mut u64, granted: u64, what: &str) {
    *sent += 1;
    assert!(
        *sent <= granted,
        "a worker sent {sent} samples on {granted} {what}"
    );
}

impl Link {
    fn new(worker: usize) -> Self {
        Link {
            worker,
            generation: 0,
            conn: None,
            released: false,
            retry_at: Duration::ZERO,
        }
    }
}

#[test]
fn the_protocol_against_real_worker_sessions_keeps_every_jobs_plan_and_shares() {
    let seeds = seeds(1000);
    let mut tally = Tally::default();
    let mut shares = Shares::default();
    let mut jobs = 0;
    let mut shm = ShmTally::default();
    for seed in 0..seeds {
        let mut sim = Sim::new(seed);
        sim.run(seed);
        for job in &sim.jobs {
            let report = job.counters.report(0, 0);
            job.world
                .check(&job.batches, &report, &format!("seed {seed}, {}", job.name));
            tally.hedged += report.hedged;
            tally.reassigned += report.reassigned;
            jobs += 1;
        }
        shm.add(&sim.shm_tally);
        let t = &sim.tally;
        tally.joined += t.joined;
        tally.left += t.left;
        tally.killed += t.killed;
        tally.stalled += t.stalled;
        tally.drained += t.drained;
        tally.cut += t.cut;
        tally.steps += t.steps;
        for (w, g) in sim.shares.got {
            *shares.got.entry(w).or_default() += g;
        }
        for (w, p) in sim.shares.promised {
            *shares.promised.entry(w).or_default() += p;
        }
    }
    let mut weights: Vec<u32> = shares.promised.keys().copied().collect();
    weights.sort_unstable();
    let ratios: Vec<String> = weights
        .iter()
        .map(|w| {
            let (g, p) = (
                shares.got.get(w).copied().unwrap_or(0.0),
                shares.promised[w],
            );
            format!(
                "weight {w}: {g:.0} samples for {p:.0} promised ({:.3})",
                g / p
            )
        })
        .collect();
    eprintln!(
        "{seeds} seeds, {jobs} jobs, {} steps: {} workers joined, {} left, {} drained for \
         SIGTERM, {} killed, {} stalled, {} connections cut; {} hedged units, {} reassigned pieces; where jobs \
         waited together, {}",
        tally.steps,
        tally.joined,
        tally.left,
        tally.drained,
        tally.killed,
        tally.stalled,
        tally.cut,
        tally.hedged,
        tally.reassigned,
        ratios.join(", ")
    );
    let said: Vec<String> = shm.0.iter().map(|(k, v)| format!("{v} {k}")).collect();
    eprintln!("same-host: {}", said.join(", "));
    if seeds >= 200 {
        for what in [
            "grants",
            "places",
            "placed",
            "claimed",
            "late writes",
            "releases",
        ] {
            assert!(shm.get(what) > 0, "no {what} over {seeds} seeds");
        }
        assert!(tally.joined > 0 && tally.left > 0 && tally.killed > 0 && tally.stalled > 0);
        assert!(tally.drained > 0 && tally.hedged > 0 && tally.reassigned > 0);
        for w in &weights {
            let (g, p) = (
                shares.got.get(w).copied().unwrap_or(0.0),
                shares.promised[w],
            );
            assert!(
                (0.9..=1.1).contains(&(g / p)),
                "weight {w}: got {g:.0} of {p:.0} promised"
            );
        }
    }
}
