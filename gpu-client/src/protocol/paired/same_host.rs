//! The paired simulation's same-host connections: the client's real session and its real
//! batch arena (`crate::arena`, whose owner per place is the client's half of the rule that
//! no place has two writers) against the worker session's same-host half
//! (`sluice_wire::session`'s attach, slot grants, places, routes and release). The shell
//! around them is simulated: slots are numbers the client gives and takes back as samples
//! arrive, places are reserved for the batches the job has bound (the next few after those
//! closed), and a worker "writes" a sample where its session routes it.
//!
//! Checked at every write, from outside the worker: a place is written only by the
//! connection the client handed it to, for the sample it was handed for (so never by two
//! writers), and never after the worker released the job; a slot only once per grant; a
//! sample in its place spends no credit (slot samples never outnumber the slots granted).

use std::sync::Arc;

use sluice_wire::session::Route;
use sluice_wire::{Assign, Message, Place, ShmAttach};

use super::{Sim, SimTensor};
use crate::arena::{Arena, PlaceGrant};
use crate::batch::HeapAllocator;
use crate::session::{Command, Commanded, TensorAt};

/// Batch buffers in a same-host job's arena.
const BUFFERS: u32 = 4;

/// A same-host job's batch arena.
pub(super) struct JobArena {
    arena: Arc<Arena>,
    batch: u32,
}

impl JobArena {
    pub(super) fn new(batch: u64) -> Self {
        let batch = batch as u32;
        let bytes = super::SHAPE.bytes();
        let arena = Arena::create((BUFFERS, batch, bytes, BUFFERS - 1), &HeapAllocator)
            .expect("an arena")
            .expect("heap memory adopts the arena");
        JobArena { arena, batch }
    }

    /// The first place of batch `b` when it is bound: one of the next [`BUFFERS`] batches
    /// after the `closed` ones.
    fn first(&self, closed: u64, b: u64) -> Option<u32> {
        (b >= closed && b < closed + u64::from(BUFFERS))
            .then(|| (b % u64::from(BUFFERS)) as u32 * self.batch)
    }
}

/// A same-host connection's shell, client side, and what its worker did with it.
#[derive(Default)]
pub(super) struct ShmConn {
    /// The client's free slots, and the credits waiting for one.
    free: Vec<u32>,
    owed: u32,
    /// Slots the worker holds (granted and not yet written).
    granted: Vec<u32>,
    /// The connection's writer in its job's arena.
    writer: u64,
    /// The worker released the job (the session's `Cancelled` was carried out).
    pub(super) released: bool,
    /// Samples written into slots, and slots granted.
    slot_samples: u64,
    slots_granted: u64,
}

/// What the same-host connections exercised over the seeds, by name: `connections`,
/// `grants` (slot frames), `places` (handed), `placed` (samples written into their place,
/// each credit given back), `claimed` (of those, claimed by the engine first), `late writes`
/// (places written after the client dropped the connection), `releases`.
#[derive(Default)]
pub(super) struct ShmTally(pub(super) std::collections::BTreeMap<&'static str, u64>);

impl ShmTally {
    fn count(&mut self, what: &'static str, n: u64) {
        *self.0.entry(what).or_default() += n;
    }

    pub(super) fn get(&self, what: &str) -> u64 {
        self.0.get(what).copied().unwrap_or(0)
    }

    pub(super) fn add(&mut self, t: &ShmTally) {
        for (what, n) in &t.0 {
            self.count(what, *n);
        }
    }
}

impl Sim {
    /// A new same-host connection of job `j`: its writer in the job's arena and its slots.
    pub(super) fn shm_conn(&mut self, j: usize) -> Option<ShmConn> {
        let arena = self.jobs[j].arena.as_ref()?;
        self.shm_tally.count("connections", 1);
        let slots = 1 + self.rng.below(24) as u32;
        Some(ShmConn {
            free: (0..slots).rev().collect(),
            writer: arena.arena.writer(),
            ..ShmConn::default()
        })
    }

    /// The client's session says the job is open: the shell sends `ShmAttach` with its
    /// slots and the batch arena.
    pub(super) fn attach(&mut self, c: usize) {
        let now = self.at();
        let j = self.conns[c].job;
        let places = self.jobs[j].arena.as_ref().map_or(0, |a| a.batch * BUFFERS);
        let conn = &mut self.conns[c];
        let slots = conn.shm.as_ref().map_or(0, |s| s.free.len() as u32);
        conn.to_worker.push_back(Message::ShmAttach(ShmAttach {
            job: self.jobs[j].id,
            slots,
            slot_bytes: super::SHAPE.bytes(),
            places,
        }));
        conn.session.attach_sent(true, now);
    }

    /// What a command asks of the shell beyond its frames: slots for credits, places handed.
    pub(super) fn commanded(&mut self, c: usize, commanded: Commanded) {
        let conn = &mut self.conns[c];
        let Some(shm) = conn.shm.as_mut() else {
            panic!("same-host work on a connection of frames");
        };
        match commanded {
            Commanded::Nothing | Commanded::Assigned { .. } => {}
            Commanded::Grant(n) => {
                shm.owed += n;
                grant(shm, &mut conn.session);
            }
            Commanded::Hand(grant) => {
                let arena = &self.jobs[conn.job].arena.as_ref().expect("an arena").arena;
                let places = grant.hand(arena, shm.writer).expect("the job's arena");
                self.shm_tally.count("places", places.len() as u64);
                conn.session.places(places);
            }
        }
    }

    /// Job `j` assigned a unit on link `l`: the places of its samples in bound batches go
    /// with it.
    pub(super) fn place_piece(&mut self, j: usize, l: usize, generation: u64, assign: &Assign) {
        let job = &self.jobs[j];
        let Some(arena) = &job.arena else { return };
        let closed = job.batches.len() as u64;
        let places = job
            .protocol
            .piece_places(assign, |b| arena.first(closed, b));
        self.send_places(j, l, generation, places);
    }

    /// Job `j` closed a batch: the batch now bound last gets its samples' places.
    pub(super) fn bind_next(&mut self, j: usize) {
        let job = &self.jobs[j];
        let Some(arena) = &job.arena else { return };
        let closed = job.batches.len() as u64;
        let b = closed + u64::from(BUFFERS) - 1;
        if b >= job.world.batch_plan.batches {
            return;
        }
        let Some(first) = arena.first(closed, b) else {
            return;
        };
        let mut by_link: Vec<((usize, u64), Vec<Place>)> = Vec::new();
        for (l, generation, place) in job.protocol.batch_places(b, first) {
            match by_link.iter_mut().find(|(k, _)| *k == (l, generation)) {
                Some((_, v)) => v.push(place),
                None => by_link.push(((l, generation), vec![place])),
            }
        }
        for ((l, generation), places) in by_link {
            self.send_places(j, l, generation, places);
        }
    }

    /// Reserves `places` in job `j`'s arena and commands link `l` to hand them over.
    fn send_places(&mut self, j: usize, l: usize, generation: u64, places: Vec<Place>) {
        let Some(arena) = &self.jobs[j].arena else {
            return;
        };
        let reserved = arena.arena.reserve(places);
        if !reserved.is_empty() {
            let grant = PlaceGrant::new(arena.arena.clone(), reserved);
            self.command(j, l, Command::Places(generation, grant));
        }
    }

    /// The worker's session routes a sample unit `u` of connection `c` may send: the frame
    /// that says where it was written, checked against the client's arena.
    pub(super) fn write(&mut self, c: usize, unit: &super::SimUnit, index: u64) -> Message {
        let w = self.conns[c].worker;
        let (key, job) = ((unit.assign.unit, unit.assign.attempt), unit.assign.job);
        let header = sluice_wire::SampleHeader {
            tensor_bytes: super::SHAPE.bytes(),
            ..super::decoded(&unit.assign, index)
        };
        let rules = &mut self.workers[w].rules;
        // Half the time the engine claims the place before it decodes (and reports it).
        let claimed = match self.rng.below(2) {
            0 => rules
                .take_place(unit.conn, job, key, index)
                .expect("the job is open"),
            _ => None,
        };
        let route = match claimed {
            Some(place) => {
                rules.placed(unit.id);
                self.shm_tally.count("claimed", 1);
                Route::Place(place)
            }
            None => (rules.route(unit.id, index, true))
                .expect("a slot per credit")
                .expect("the unit's job is open"),
        };
        self.workers[w].wake();
        let conn = &mut self.conns[c];
        let shm = conn.shm.as_mut().expect("a same-host connection");
        match route {
            Route::Place(place) => {
                assert!(!shm.released, "a place written after the job was released");
                let arena = &self.jobs[conn.job].arena.as_ref().expect("an arena").arena;
                assert_eq!(
                    arena.owner(place),
                    Some((Some(shm.writer), (key.0, key.1, index))),
                    "place {place} written by writer {} for sample {index} of unit {key:?}",
                    shm.writer
                );
                self.shm_tally.count("placed", 1);
                if conn.client_closed || conn.worker_closed {
                    self.shm_tally.count("late writes", 1);
                }
                Message::ShmPlaced { place, header }
            }
            Route::Slot(slot) => {
                let at = shm.granted.iter().position(|&s| s == slot);
                let at = at.unwrap_or_else(|| panic!("slot {slot} written, not granted"));
                shm.granted.swap_remove(at);
                super::spend(&mut shm.slot_samples, shm.slots_granted, "slots");
                Message::ShmSample { slot, header }
            }
        }
    }

    /// A same-host sample reached the client: the arena settles its place, a slot goes back
    /// (and to a credit waiting for one). The tensor, for the protocol.
    pub(super) fn received(
        &mut self,
        c: usize,
        header: &sluice_wire::SampleHeader,
        at: TensorAt,
    ) -> SimTensor {
        let conn = &mut self.conns[c];
        let shm = conn.shm.as_mut().expect("a same-host connection");
        let arena = &self.jobs[conn.job].arena.as_ref().expect("an arena").arena;
        let key = (header.unit, header.attempt, header.index);
        let placed = match at {
            TensorAt::Placed { place } => {
                arena.placed(shm.writer, place, key).expect("its own place");
                true
            }
            TensorAt::Slot(slot) => {
                arena.answered(shm.writer, key);
                shm.free.push(slot);
                grant(shm, &mut conn.session);
                false
            }
            TensorAt::Stream => panic!("a sample in the frame over the same-host socket"),
        };
        SimTensor {
            bytes: super::tensor(header.shard, header.index),
            placed,
        }
    }

    /// The client heard that connection `c`'s unit ended, or that the worker released the
    /// job: the places it held are settled.
    pub(super) fn settled(&mut self, c: usize, unit: Option<(u64, u32)>) {
        let conn = &self.conns[c];
        let (Some(shm), Some(arena)) = (&conn.shm, &self.jobs[conn.job].arena) else {
            return;
        };
        match unit {
            Some((unit, attempt)) => arena.arena.unit_ended(shm.writer, unit, attempt),
            None => arena.arena.released(shm.writer),
        }
    }

    /// The worker's shell carried out `Cancelled` for connection `c`: nothing more is
    /// written into the job's places.
    pub(super) fn released(&mut self, c: usize) {
        if let Some(shm) = self.conns[c].shm.as_mut() {
            shm.released = true;
            self.shm_tally.count("releases", 1);
        }
    }

    /// The job let go of connection `c` (its worker left the pool): a same-host one whose
    /// worker still owns places cancels the job and waits for the release; any other is
    /// dropped.
    pub(super) fn release(&mut self, c: usize) {
        let now = self.at();
        let conn = &mut self.conns[c];
        let owns = match (&conn.shm, &self.jobs[conn.job].arena) {
            (Some(shm), Some(arena)) => arena.arena.owns_any(shm.writer),
            _ => false,
        };
        if owns && !conn.worker_closed && !conn.client_closed {
            conn.session.close(true, now);
            return self.flush(c);
        }
        conn.client_closed = true;
        conn.to_client.clear();
    }

    /// Whether connection `c` was let go of by its job and waits for its worker's release.
    pub(super) fn releasing(&self, c: usize) -> bool {
        let conn = &self.conns[c];
        conn.shm.is_some()
            && !conn.client_closed
            && !conn.worker_closed
            && self.jobs[conn.job].links[conn.link].conn != Some(c)
    }

    /// Job `j`'s epoch is over: its links let go of their connections (same-host ones whose
    /// worker still owns places ask for them back first).
    pub(super) fn end_epoch(&mut self, j: usize) {
        for l in 0..self.jobs[j].links.len() {
            let link = &mut self.jobs[j].links[l];
            link.released = true;
            if let Some(c) = link.conn.take() {
                self.release(c);
            }
        }
    }

    /// The release deadlines of connections waiting for one.
    pub(super) fn release_timers(&mut self) {
        let now = self.at();
        for c in 0..self.conns.len() {
            if !self.releasing(c) {
                continue;
            }
            let session = &mut self.conns[c].session;
            if session.poll_timeout().is_some_and(|t| t <= now) {
                session.handle_timeout(now);
                self.flush(c);
            }
        }
    }

    /// A slot frame the client sent: the worker holds those slots now.
    pub(super) fn slots_sent(&mut self, c: usize, slots: &[u32]) {
        if let Some(shm) = self.conns[c].shm.as_mut() {
            shm.granted.extend_from_slice(slots);
            shm.slots_granted += slots.len() as u64;
            self.shm_tally.count("grants", 1);
        }
    }
}

/// Free slots to the credits waiting for one.
fn grant(shm: &mut ShmConn, session: &mut crate::session::Session) {
    let n = (shm.owed as usize).min(shm.free.len());
    if n > 0 {
        shm.owed -= n as u32;
        let slots = shm.free.split_off(shm.free.len() - n);
        session.slots(slots);
    }
}
