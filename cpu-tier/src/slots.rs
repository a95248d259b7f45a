//! A same-host job's segments on the worker's side: the memory of the client's slots and
//! batch arena, written where the worker's session (`sluice_wire::session`, its `shm` half)
//! routes each sample. Which slots are granted, which places are given and to whom, and the
//! credit a placed sample gives back are the session's; this maps and writes.

use std::sync::{Arc, RwLock};

use sluice_wire::session::{ConnId, Route, UnitId};
use sluice_wire::shm::Segment;
use sluice_wire::{Message, PlaceClaim, Places, SampleHeader, SamplePayload};

/// The worker's session as the slots ask it (`crate::connection` answers, under the session's
/// lock, and carries out the wakes each answer makes).
pub(crate) trait Routes: Send + Sync {
    /// `sluice_wire::session::Worker::route`.
    fn route(&self, id: UnitId, index: u64, fits: bool) -> Result<Option<Route>, String>;
    /// `sluice_wire::session::Worker::placed`.
    fn placed(&self, id: UnitId);
    /// `sluice_wire::session::Worker::take_place`.
    fn take_place(&self, conn: ConnId, job: u64, unit: (u64, u32), index: u64) -> Option<u32>;
}

/// A same-host job's segment, its batch arena (when the client shares its batches), and
/// the session that routes its samples.
pub(crate) struct Slots {
    segment: Arc<Segment>,
    /// The client's batches, when it shares them.
    arena: Option<Arc<Segment>>,
    /// Set once the client cancelled the job: no write into the arena starts after, and
    /// setting it waits for those under way (they hold it shared).
    released: RwLock<bool>,
    session: Box<dyn Routes>,
    conn: ConnId,
    job: u64,
}

impl Slots {
    pub(crate) fn new(
        (segment, arena): (Arc<Segment>, Option<Arc<Segment>>),
        session: Box<dyn Routes>,
        conn: ConnId,
        job: u64,
    ) -> Self {
        Slots {
            segment,
            arena,
            released: RwLock::new(false),
            session,
            conn,
            job,
        }
    }

    /// The client cancelled the job: returns once no sample is being written into its batch
    /// arena, and none will be (the client may then use every place it gave again).
    pub(crate) fn release(&self) {
        if let Ok(mut r) = self.released.write() {
            *r = true;
        }
    }

    /// Whether the client shares its batches (the engine may resize into their places).
    pub(crate) fn has_arena(&self) -> bool {
        self.arena.is_some()
    }

    /// Writes unit `id`'s finished sample where the session routes it (its place in the
    /// client's batch, or the next granted slot): the frame to send and its payload (the
    /// fields only); `None` when the unit is stopping (its job is gone).
    pub(crate) fn write(
        &self,
        id: UnitId,
        header: SampleHeader,
        payload: &[u8],
    ) -> Result<Option<(Message, Vec<u8>)>, String> {
        if header.tensor_bytes != self.segment.slot_bytes() {
            return Err(format!(
                "sample {:?}: {} tensor bytes for slots of {}",
                header.key,
                header.tensor_bytes,
                self.segment.slot_bytes()
            ));
        }
        let (tensor, fields) = SamplePayload::parts(&header, payload)?;
        let fits = self
            .arena
            .as_ref()
            .is_some_and(|a| tensor.len() as u64 == a.slot_bytes());
        let Some(route) = self.session.route(id, header.index, fits)? else {
            return Ok(None);
        };
        let message = match route {
            Route::Place(place) => {
                // Held while the place is written, taken after the session's lock (a release
                // holds that lock while it waits for this one).
                let released = self.released.read().map_err(|_| "arena state poisoned")?;
                if *released {
                    return Ok(None); // cancelled since: the unit is stopping
                }
                let memory = self.place_memory(place, tensor.len())?;
                memory.copy_from_slice(tensor);
                Message::ShmPlaced { place, header }
            }
            Route::Slot(slot) => {
                self.segment
                    .write(slot, tensor)
                    .map_err(|e| e.to_string())?;
                Message::ShmSample { slot, header }
            }
        };
        Ok(Some((message, fields.to_vec())))
    }

    /// A sample the engine wrote into the place it claimed: the frame to send (its credit
    /// comes back: it takes no slot).
    pub(crate) fn placed(&self, id: UnitId, header: SampleHeader, place: u32) -> Message {
        self.session.placed(id);
        Message::ShmPlaced { place, header }
    }

    /// Place `place` of the arena, `len` bytes, to write.
    #[allow(clippy::mut_from_ref)]
    fn place_memory(&self, place: u32, len: usize) -> Result<&mut [u8], String> {
        let arena = self.arena.as_ref().ok_or("a place without a batch arena")?;
        let ptr = arena.slot_raw(place).map_err(|e| e.to_string())?;
        // SAFETY: the place lies in the mapping (the session checked it against the arena's
        // size when it was given) and is this sample's alone: the client gave it once, for
        // this sample, and the session handed it out once. The client reads it only after
        // the frame that names it, and not after it cancelled the job (writes hold
        // `released` shared, and a release waits for them).
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }
}

/// The engine resizes a sample straight into its place when the client gave one before the
/// sample was decoded: no tensor is copied on either side.
impl Places for Slots {
    fn claim(&self, unit: u64, attempt: u32, index: u64, len: usize) -> Option<PlaceClaim<'_>> {
        let arena = self.arena.as_ref()?;
        if len as u64 != arena.slot_bytes() {
            return None;
        }
        let place = (self.session).take_place(self.conn, self.job, (unit, attempt), index)?;
        // After the session's lock, as in `write`.
        let released = self.released.read().ok().filter(|r| !**r)?;
        let memory = self.place_memory(place, len).ok()?;
        Some(PlaceClaim::new(place, memory, Box::new(released)))
    }
}
