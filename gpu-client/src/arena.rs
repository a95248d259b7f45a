//! The batch arena: on the same-host transport, batch buffers live in one shared-memory
//! segment that the client's same-host workers map, so a worker writes a sample's tensor
//! straight into its place in its batch and the client copies nothing.
//!
//! A *place* is one tensor of the arena (a batch buffer is `batch` places back to back). The
//! coordinator binds buffers to the batches ahead of the one being filled and asks the worker
//! that holds each of their samples to write it into its place ([`sluice_wire::Place`]).
//! Everything else a sample may take (a slot, a QUIC packet) is unchanged, and is copied
//! into the batch as before.
//!
//! Safety: a place has at most one writer, recorded here as its owner:
//! - the coordinator *reserves* a place before telling the link (no owner process yet);
//! - the link *hands* it to its connection as it sends the frame (or cancels it, if the
//!   connection it was meant for is gone);
//! - it is *settled*, and has no owner again, once that connection answered the sample
//!   (placed, in a slot, or skipped), reported the sample's unit ended, or its worker's
//!   process exited ([`ProcessWatch`]).
//!
//! The client writes an owned place never, and hands the consumer a batch with an owned place
//! never: such a batch is copied into a fresh buffer, and the arena buffer is retired until
//! every place in it is settled. A connection that ends with places owned (its worker stalled,
//! was declared lost, or was cut off mid-unit) keeps them owned until its process exits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sluice_wire::shm::{ProcessWatch, Segment};
use sluice_wire::Place;

use crate::batch::{Adopted, HostAllocator, HostMemory};

/// The batch arena of a loader's same-host connections.
pub(crate) struct Arena {
    /// What made the mapping fit for batches (page-locked for CUDA); undone before the
    /// segment is unmapped (fields drop in order).
    _adopted: Adopted,
    segment: Segment,
    /// Places per batch buffer.
    batch: u32,
    /// Batches a ring from this arena binds ahead of the one being filled.
    ahead: u32,
    sample_bytes: usize,
    state: Mutex<State>,
    writers: AtomicU64,
    /// How far ahead of the batch being filled (in batches) samples have arrived in this
    /// arena's epochs so far: an epoch binds that far from its start, so the samples of its
    /// first units find their places instead of waiting in slots while it learns the reach.
    reach: AtomicU64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Owner {
    /// The connection it was handed to; `None` while only reserved.
    writer: Option<u64>,
    unit: u64,
    attempt: u32,
    index: u64,
}

#[derive(Default)]
struct Writer {
    /// Its owned places by (unit, attempt, index).
    places: HashMap<(u64, u32, u64), u32>,
    /// Its connection ended: its places are settled when its process exits.
    ended: bool,
    watch: Option<ProcessWatch>,
}

struct State {
    free: Vec<u32>,
    /// Whether each place's pages were made by this process.
    populated: Vec<bool>,
    /// Buffers given back while a place in them was owned.
    retired: Vec<u32>,
    owner: Vec<Option<Owner>>,
    writers: HashMap<u64, Writer>,
}

impl State {
    fn settle(&mut self, writer: u64, key: (u64, u32, u64)) {
        if let Some(w) = self.writers.get_mut(&writer) {
            if let Some(place) = w.places.remove(&key) {
                self.owner[place as usize] = None;
            }
        }
    }

    /// Settles the places of ended writers whose process has exited.
    fn reap(&mut self) {
        let gone: Vec<u64> = self
            .writers
            .iter()
            .filter(|(_, w)| {
                w.ended && (w.places.is_empty() || w.watch.as_ref().is_some_and(|p| p.exited()))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some(w) = self.writers.remove(&id) {
                for place in w.places.into_values() {
                    self.owner[place as usize] = None;
                }
            }
        }
    }

    fn owned(&self, places: std::ops::Range<u32>) -> bool {
        self.owner[places.start as usize..places.end as usize]
            .iter()
            .any(Option::is_some)
    }
}

impl Arena {
    /// An arena of `buffers` batch buffers of `batch` tensors of `sample_bytes`.
    /// An arena of `buffers` batch buffers of `batch` tensors of `sample_bytes`, with
    /// `ahead` of them bound ahead of the batch being filled; `allocator` adopts its memory
    /// (`None`: it cannot, and batches stay in its own buffers).
    pub(crate) fn create(
        (buffers, batch, sample_bytes, ahead): (u32, u32, u64, u32),
        allocator: &dyn HostAllocator,
    ) -> Result<Option<Arc<Arena>>, String> {
        let places = buffers.saturating_mul(batch);
        let segment =
            Segment::create("sluice-batches", places, sample_bytes).map_err(|e| e.to_string())?;
        let (ptr, len) = segment.as_raw();
        let Some(adopted) = allocator.adopt(ptr, len).transpose()? else {
            return Ok(None);
        };
        Ok(Some(Arc::new(Arena {
            _adopted: adopted,
            segment,
            batch,
            ahead,
            sample_bytes: sample_bytes as usize,
            state: Mutex::new(State {
                free: (0..buffers).rev().collect(),
                populated: vec![false; places as usize],
                retired: Vec::new(),
                owner: vec![None; places as usize],
                writers: HashMap::new(),
            }),
            writers: AtomicU64::new(0),
            reach: AtomicU64::new(0),
        })))
    }

    /// Batches a ring from this arena binds ahead of the one being filled.
    pub(crate) fn ahead(&self) -> usize {
        self.ahead as usize
    }

    /// Gives `places` their pages, once each, from this process: the batches are its
    /// memory, charged to it, not to the worker that writes first (as for slots,
    /// `crate::same_host`). Done as places are reserved for samples, so memory follows the
    /// samples on their way (as slots did), not every batch bound ahead; the rest of a batch
    /// gets its pages as the batch is filled.
    pub(crate) fn populate(&self, places: &[Place]) {
        let fresh: Vec<u32> = match self.state.lock() {
            Ok(mut s) => places
                .iter()
                .filter(|p| !std::mem::replace(&mut s.populated[p.place as usize], true))
                .map(|p| p.place)
                .collect(),
            Err(_) => return,
        };
        for place in fresh {
            if let Err(e) = self.segment.populate(place) {
                tracing::debug!("batch place {place}: {e}");
            }
        }
    }

    /// How far ahead samples have arrived in earlier epochs, with `now` (this epoch's) noted.
    pub(crate) fn reach(&self, now: u64) -> u64 {
        self.reach.fetch_max(now, Ordering::Relaxed).max(now)
    }

    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }

    pub(crate) fn fits(&self, batch: u32, sample_bytes: u64) -> bool {
        self.batch == batch && self.sample_bytes as u64 == sample_bytes
    }

    fn buffer_bytes(&self) -> usize {
        self.batch as usize * self.sample_bytes
    }

    /// The first place of the arena buffer `memory` is, if it is one.
    pub(crate) fn first_place(&self, memory: &[u8]) -> Option<u32> {
        let (base, len) = self.segment.as_raw();
        let at = (memory.as_ptr() as usize).checked_sub(base as usize)?;
        (at < len && at % self.buffer_bytes() == 0 && memory.len() == self.buffer_bytes())
            .then(|| (at / self.sample_bytes) as u32)
    }

    /// A free batch buffer, if the arena has one.
    pub(crate) fn take(self: &Arc<Self>) -> Option<ArenaBuffer> {
        let mut s = self.state.lock().ok()?;
        s.reap();
        let mut i = 0;
        while i < s.retired.len() {
            let b = s.retired[i];
            if s.owned(b * self.batch..(b + 1) * self.batch) {
                i += 1;
            } else {
                s.retired.swap_remove(i);
                s.free.push(b);
            }
        }
        let index = s.free.pop()?;
        Some(ArenaBuffer {
            arena: self.clone(),
            index,
        })
    }

    fn release(&self, index: u32) {
        let Ok(mut s) = self.state.lock() else { return };
        if s.owned(index * self.batch..(index + 1) * self.batch) {
            tracing::debug!(
                buffer = index,
                "batch buffer retired until its writers are done"
            );
            s.retired.push(index);
        } else {
            s.free.push(index);
        }
    }

    /// A new connection that may be handed places.
    pub(crate) fn writer(&self) -> u64 {
        let id = self.writers.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.state.lock() {
            s.writers.insert(id, Writer::default());
        }
        id
    }

    /// Reserves the places that no one owns: those returned are the caller's to hand out.
    pub(crate) fn reserve(&self, places: Vec<Place>) -> Vec<Place> {
        let Ok(mut s) = self.state.lock() else {
            return Vec::new();
        };
        places
            .into_iter()
            .filter(|p| {
                let slot = &mut s.owner[p.place as usize];
                let free = slot.is_none();
                if free {
                    *slot = Some(Owner {
                        writer: None,
                        unit: p.unit,
                        attempt: p.attempt,
                        index: p.index,
                    });
                }
                free
            })
            .collect()
    }

    /// The reserved `places` go to connection `writer` (its frame is about to be sent).
    pub(crate) fn hand(&self, writer: u64, places: &[Place]) {
        let Ok(mut s) = self.state.lock() else { return };
        for p in places {
            if let Some(o) = s.owner[p.place as usize].as_mut() {
                o.writer = Some(writer);
            }
            if let Some(w) = s.writers.get_mut(&writer) {
                w.places.insert((p.unit, p.attempt, p.index), p.place);
            }
        }
    }

    /// The reserved `places` were never sent.
    pub(crate) fn cancel(&self, places: &[Place]) {
        let Ok(mut s) = self.state.lock() else { return };
        for p in places {
            let slot = &mut s.owner[p.place as usize];
            if slot.is_some_and(|o| o.writer.is_none()) {
                *slot = None;
            }
        }
    }

    /// Connection `writer` says it wrote sample `index` of `(unit, attempt)` into `place`:
    /// settled, if the place was that sample's and handed to it; else what is wrong.
    pub(crate) fn placed(
        &self,
        writer: u64,
        place: u32,
        (unit, attempt, index): (u64, u32, u64),
    ) -> Result<(), String> {
        let mut s = self.state.lock().map_err(|_| "arena state poisoned")?;
        let want = Some(Owner {
            writer: Some(writer),
            unit,
            attempt,
            index,
        });
        if s.owner.get(place as usize) != Some(&want) {
            return Err(format!(
                "sample {index} of unit {unit} (attempt {attempt}) in batch place {place}, \
                 which was not given to it"
            ));
        }
        s.settle(writer, (unit, attempt, index));
        Ok(())
    }

    /// Connection `writer` answered sample `index` of `(unit, attempt)` another way (a slot, a
    /// skip): its place, if it had one, will not be written.
    pub(crate) fn answered(&self, writer: u64, (unit, attempt, index): (u64, u32, u64)) {
        if let Ok(mut s) = self.state.lock() {
            s.settle(writer, (unit, attempt, index));
        }
    }

    /// Connection `writer` reported `(unit, attempt)` ended: it writes none of its places.
    pub(crate) fn unit_ended(&self, writer: u64, unit: u64, attempt: u32) {
        let Ok(mut s) = self.state.lock() else { return };
        let keys: Vec<_> = s
            .writers
            .get(&writer)
            .map(|w| {
                w.places
                    .keys()
                    .filter(|(u, a, _)| (*u, *a) == (unit, attempt))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        for key in keys {
            s.settle(writer, key);
        }
    }

    /// Whether connection `writer` owns a place.
    pub(crate) fn owns_any(&self, writer: u64) -> bool {
        self.state
            .lock()
            .is_ok_and(|s| s.writers.get(&writer).is_some_and(|w| !w.places.is_empty()))
    }

    /// Connection `writer`'s worker said it writes none of its places any more (it released
    /// the job): every place it owns is settled.
    pub(crate) fn released(&self, writer: u64) {
        let Ok(mut s) = self.state.lock() else { return };
        let places: Vec<u32> = s
            .writers
            .get_mut(&writer)
            .map(|w| w.places.drain().map(|(_, p)| p).collect())
            .unwrap_or_default();
        for place in places {
            s.owner[place as usize] = None;
        }
    }

    /// Connection `writer` ended: its places still owned stay so until `watch` says its
    /// process exited (for ever, without one).
    pub(crate) fn writer_ended(&self, writer: u64, watch: Option<ProcessWatch>) {
        let Ok(mut s) = self.state.lock() else { return };
        if let Some(w) = s.writers.get_mut(&writer) {
            w.ended = true;
            w.watch = watch;
        }
        s.reap();
    }

    /// Whether any place of `places` may still be written by a worker.
    pub(crate) fn owned(&self, places: std::ops::Range<u32>) -> bool {
        self.state.lock().map_or(true, |mut s| {
            s.reap();
            s.owned(places)
        })
    }

    /// Copies the tensor in `place` (settled) into `dst`.
    pub(crate) fn read(&self, place: u32, dst: &mut [u8]) {
        if let Err(e) = self.segment.read(place, dst) {
            tracing::error!("batch place {place}: {e}");
        }
    }

    /// The address of `place`.
    pub(crate) fn place_ptr(&self, place: u32) -> *const u8 {
        self.segment
            .slot_raw(place)
            .map_or(std::ptr::null(), |p| p as *const u8)
    }

    /// Who owns `place`: the connection it was handed to (`None` while only reserved) and
    /// the sample it is for; `None` when no one does.
    #[cfg(test)]
    pub(crate) fn owner(&self, place: u32) -> Option<(Option<u64>, (u64, u32, u64))> {
        let s = self.state.lock().ok()?;
        let o = s.owner.get(place as usize).copied().flatten()?;
        Some((o.writer, (o.unit, o.attempt, o.index)))
    }

    /// (free, retired) buffers, for tests and logs.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        self.state
            .lock()
            .map(|s| (s.free.len(), s.retired.len()))
            .unwrap_or_default()
    }
}

/// Places reserved for one connection, on their way to its link: the link hands them to its
/// connection as it sends them; dropped unsent (the link or its connection is gone), they
/// are given back.
pub(crate) struct PlaceGrant {
    arena: Arc<Arena>,
    places: Vec<Place>,
    handed: bool,
}

impl PlaceGrant {
    pub(crate) fn new(arena: Arc<Arena>, places: Vec<Place>) -> Self {
        PlaceGrant {
            arena,
            places,
            handed: false,
        }
    }

    pub(crate) fn places(&self) -> &[Place] {
        &self.places
    }

    /// Connection `writer` of `arena` owns them from now: its frame naming them is next.
    /// `false` (and they are given back) if they are of another arena.
    pub(crate) fn hand(mut self, arena: &Arc<Arena>, writer: u64) -> Option<Vec<Place>> {
        if !Arc::ptr_eq(arena, &self.arena) {
            return None;
        }
        self.arena.hand(writer, &self.places);
        self.handed = true;
        Some(std::mem::take(&mut self.places))
    }
}

impl Drop for PlaceGrant {
    fn drop(&mut self) {
        if !self.handed {
            self.arena.cancel(&self.places);
        }
    }
}

/// A batch buffer in the arena; it goes back when dropped (retired while a worker may still
/// write a place in it).
pub(crate) struct ArenaBuffer {
    arena: Arc<Arena>,
    index: u32,
}

impl HostMemory for ArenaBuffer {
    fn as_slice(&self) -> &[u8] {
        let len = self.arena.buffer_bytes();
        let ptr = self.arena.place_ptr(self.index * self.arena.batch);
        // SAFETY: the buffer lies in the mapping, which the `Arc` keeps; the protocol keeps
        // workers off every place this process reads (see the module's safety rules).
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.arena.buffer_bytes();
        let ptr = self.arena.place_ptr(self.index * self.arena.batch) as *mut u8;
        // SAFETY: as above; this process writes only places no worker owns.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    }
}

impl Drop for ArenaBuffer {
    fn drop(&mut self) {
        self.arena.release(self.index);
    }
}

/// Batch buffers from the arena while it has free ones, else from `fallback`.
pub(crate) struct ArenaAllocator {
    pub(crate) arena: Arc<Arena>,
    pub(crate) fallback: Arc<dyn HostAllocator>,
}

impl HostAllocator for ArenaAllocator {
    fn allocate(&self, bytes: usize) -> Result<Box<dyn HostMemory>, String> {
        if bytes == self.arena.buffer_bytes() {
            if let Some(b) = self.arena.take() {
                return Ok(Box::new(b));
            }
            tracing::debug!("batch arena exhausted: a plain buffer, filled by copies");
        }
        self.fallback.allocate(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(unit: u64, index: u64, place: u32) -> Place {
        Place {
            unit,
            attempt: 0,
            index,
            place,
        }
    }

    /// An arena of `buffers` buffers of two 4-byte places, and its first buffer, taken.
    fn arena(buffers: u32) -> (Arc<Arena>, ArenaBuffer) {
        let arena = Arena::create((buffers, 2, 4, 1), &crate::batch::HeapAllocator)
            .unwrap()
            .unwrap();
        let b = arena.take().unwrap();
        (arena, b)
    }

    #[test]
    fn a_place_has_one_writer_until_it_is_settled() {
        let (arena, b) = arena(2);
        let first = arena.first_place(b.as_slice()).unwrap();
        let w = arena.writer();
        let got = arena.reserve(vec![place(1, 0, first), place(1, 1, first + 1)]);
        assert_eq!(got.len(), 2);
        assert!(
            arena.reserve(vec![place(2, 0, first)]).is_empty(),
            "a reserved place is not reserved again"
        );
        arena.hand(w, &got);
        assert!(arena.owned(first..first + 2));
        assert!(
            arena.placed(w, first, (1, 1, 0)).is_err(),
            "another sample's place"
        );
        assert!(
            arena.placed(w + 1, first, (1, 0, 0)).is_err(),
            "another writer"
        );
        arena.placed(w, first, (1, 0, 0)).unwrap();
        assert!(arena.owned(first..first + 2), "one place still owned");
        // Dropped while owned: retired, not free.
        drop(b);
        assert_eq!(arena.counts(), (1, 1));
        arena.answered(w, (1, 0, 1));
        assert!(!arena.owned(first..first + 2));
        let _a = arena.take().unwrap();
        let _b = arena.take().unwrap();
        assert!(
            arena.take().is_none(),
            "the retired buffer came back once settled"
        );
    }

    #[test]
    fn a_writer_that_ends_mid_unit_keeps_its_places_until_its_process_exits() {
        let (arena, b) = arena(1);
        let w = arena.writer();
        arena.hand(w, &arena.reserve(vec![place(1, 0, 0), place(2, 0, 1)]));
        arena.unit_ended(w, 2, 0);
        assert!(!arena.owned(1..2) && arena.owned(0..1));
        let mut worker = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let watch = ProcessWatch::of_pid(worker.id() as i32).unwrap();
        arena.writer_ended(w, Some(watch));
        assert!(arena.owned(0..1), "its process lives");
        drop(b);
        assert!(arena.take().is_none());
        worker.kill().unwrap();
        worker.wait().unwrap();
        assert!(!arena.owned(0..1));
        assert!(arena.take().is_some(), "its process exited");

        // Reserved but never sent: cancelled.
        let r = arena.reserve(vec![place(3, 0, 0)]);
        assert!(arena.owned(0..1));
        arena.cancel(&r);
        assert!(!arena.owned(0..1));
    }
}
