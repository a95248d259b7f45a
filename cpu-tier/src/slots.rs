//! A same-host job's slots on the worker's side: which slots of the client's segment the
//! worker may write (those granted and not yet filled), and, with the client's batch arena,
//! the places it gave for samples of the units running here, each written once.

use std::sync::{Arc, Mutex};

use sluice_wire::shm::Segment;
use sluice_wire::{Message, Place, PlaceClaim, Places, SampleHeader, SamplePayload};

/// A same-host job's segment and which of its slots the worker may write; with the client's
/// batch arena, the places it gave for samples of the units running here.
pub(crate) struct Slots {
    segment: Arc<Segment>,
    /// Slots granted and not yet filled, in grant order; `held[i]` says whether `i` is one.
    state: Mutex<(std::collections::VecDeque<u32>, Vec<bool>)>,
    /// The client's batches, when it shares them.
    arena: Option<Arc<Segment>>,
    places: Mutex<PlaceTable>,
    /// Set once the client cancelled the job: no write into the arena starts after, and
    /// setting it waits for those under way (they hold it shared).
    released: std::sync::RwLock<bool>,
}

/// The places a client gave, kept only while their unit runs here: a place that arrives
/// after its unit ended is dropped, so the table never outgrows the units in flight.
#[derive(Default)]
struct PlaceTable {
    /// By (unit, attempt), then sample index.
    running: std::collections::HashMap<(u64, u32), std::collections::HashMap<u64, u32>>,
}

impl Slots {
    pub(crate) fn new(segment: Arc<Segment>, arena: Option<Arc<Segment>>) -> Self {
        let n = segment.slots() as usize;
        Slots {
            segment,
            state: Mutex::new((std::collections::VecDeque::with_capacity(n), vec![false; n])),
            arena,
            places: Mutex::default(),
            released: std::sync::RwLock::new(false),
        }
    }

    /// The client cancelled the job: returns once no sample is being written into its batch
    /// arena, and none will be (the client may then use every place it gave again).
    pub(crate) fn release(&self) {
        if let Ok(mut r) = self.released.write() {
            *r = true;
        }
    }

    /// Whether the client shares its batches (and so waits to hear they are released).
    pub(crate) fn has_arena(&self) -> bool {
        self.arena.is_some()
    }

    /// Takes the client's grant; the number of new credits, or what is wrong with it.
    pub(crate) fn grant(&self, slots: &[u32]) -> Result<usize, String> {
        let mut guard = self.state.lock().map_err(|_| "slot state poisoned")?;
        let (free, held) = &mut *guard;
        for &slot in slots {
            match held.get_mut(slot as usize) {
                None => {
                    return Err(format!(
                        "slot {slot} granted, the segment has {}",
                        self.segment.slots()
                    ))
                }
                Some(true) => return Err(format!("slot {slot} granted twice")),
                Some(h) => {
                    *h = true;
                    free.push_back(slot);
                }
            }
        }
        Ok(slots.len())
    }

    /// Unit `(unit, attempt)` starts here: places may come for its samples.
    pub(crate) fn unit_started(&self, unit: u64, attempt: u32) {
        if let Ok(mut p) = self.places.lock() {
            p.running.entry((unit, attempt)).or_default();
        }
    }

    /// Unit `(unit, attempt)` ended: its places that were not used are forgotten.
    pub(crate) fn unit_ended(&self, unit: u64, attempt: u32) {
        if let Ok(mut p) = self.places.lock() {
            p.running.remove(&(unit, attempt));
        }
    }

    /// Takes the client's places, or says what is wrong with them.
    pub(crate) fn add_places(&self, places: &[Place]) -> Result<(), String> {
        let arena = self
            .arena
            .as_ref()
            .ok_or("sample places, but the client attached no batch arena")?;
        let mut p = self.places.lock().map_err(|_| "place table poisoned")?;
        for place in places {
            if place.place >= arena.slots() {
                return Err(format!(
                    "place {} for sample {} of unit {}, the arena has {}",
                    place.place,
                    place.index,
                    place.unit,
                    arena.slots()
                ));
            }
            if let Some(unit) = p.running.get_mut(&(place.unit, place.attempt)) {
                unit.insert(place.index, place.place);
            }
        }
        Ok(())
    }

    /// The next granted slot, which the sample about to go out takes (with its credit).
    fn next_slot(&self) -> Result<u32, String> {
        let mut guard = self.state.lock().map_err(|_| "slot state poisoned")?;
        let (free, held) = &mut *guard;
        let slot = free.pop_front().ok_or("a credit without a granted slot")?;
        held[slot as usize] = false;
        Ok(slot)
    }

    /// A sample the runner wrote into its claimed place: the frame to send (it takes no slot)
    /// and its payload (the fields).
    pub(crate) fn placed(
        &self,
        header: SampleHeader,
        place: u32,
        fields: Vec<u8>,
    ) -> Result<(Message, Vec<u8>), String> {
        Ok((Message::ShmPlaced { place, header }, fields))
    }

    /// Writes a sample's tensor into its place in the client's batch, if it has one, else into
    /// the next granted slot: the frame to send and its payload (the fields only). A placed
    /// sample takes no slot (and the connection gives its credit back).
    pub(crate) fn place(
        &self,
        header: SampleHeader,
        payload: &[u8],
    ) -> Result<(Message, Vec<u8>), String> {
        if header.tensor_bytes != self.segment.slot_bytes() {
            return Err(format!(
                "sample {:?}: {} tensor bytes for slots of {}",
                header.key,
                header.tensor_bytes,
                self.segment.slot_bytes()
            ));
        }
        let (tensor, fields) = SamplePayload::parts(&header, payload)?;
        let sample = (header.unit, header.attempt, header.index);
        if let Some(mut claim) = self.take_place(sample, tensor.len())? {
            claim.memory().copy_from_slice(tensor);
            let place = claim.place();
            return Ok((Message::ShmPlaced { place, header }, fields.to_vec()));
        }
        let slot = self.next_slot()?;
        self.segment
            .write(slot, tensor)
            .map_err(|e| e.to_string())?;
        Ok((Message::ShmSample { slot, header }, fields.to_vec()))
    }
}

impl Slots {
    /// The place the client gave for sample `index` of `(unit, attempt)`, taken out of the
    /// table (used once) and writable until the claim drops; `None` without one (or for a
    /// tensor of another size), an error once the job was released. The engine resizes into
    /// it ([`Places`]), or `place` copies a finished tensor there.
    fn take_place(
        &self,
        (unit, attempt, index): (u64, u32, u64),
        len: usize,
    ) -> Result<Option<PlaceClaim<'_>>, String> {
        let Some(arena) = self.arena.as_ref().filter(|a| len as u64 == a.slot_bytes()) else {
            return Ok(None);
        };
        let place = self
            .places
            .lock()
            .ok()
            .and_then(|mut p| p.running.get_mut(&(unit, attempt))?.remove(&index));
        let Some(place) = place else { return Ok(None) };
        let released = self.released.read().map_err(|_| "arena state poisoned")?;
        if *released {
            return Err("the job was cancelled".into());
        }
        let ptr = arena.slot_raw(place).map_err(|e| e.to_string())?;
        // SAFETY: the place lies in the mapping (checked when it was given) and is this
        // sample's alone: the client gave it once, for this sample, and this took it out of
        // the table. The client reads it only after the frame that names it.
        let memory = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        Ok(Some(PlaceClaim::new(place, memory, Box::new(released))))
    }
}

/// The engine resizes a sample straight into its place when the client gave one before the
/// sample was decoded: no tensor is copied on either side.
impl Places for Slots {
    fn claim(&self, unit: u64, attempt: u32, index: u64, len: usize) -> Option<PlaceClaim<'_>> {
        self.take_place((unit, attempt, index), len).ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use sluice_wire::ShmAttach;

    use super::*;

    #[test]
    fn slots_are_written_only_when_granted() {
        let slots = Slots::new(
            Arc::new(Segment::create("sluice-test", 2, 4).unwrap()),
            None,
        );
        let header = |key: &str| SampleHeader {
            job: 1,
            unit: 0,
            attempt: 0,
            shard: 0,
            index: 0,
            key: key.into(),
            label: None,
            tensor_bytes: 4,
            fields: vec![("txt".into(), 2)],
            geometry: Default::default(),
            has: Vec::new(),
        };
        assert!(slots.place(header("a"), &[1, 2, 3, 4, 9, 9]).is_err());
        assert_eq!(slots.grant(&[1]), Ok(1));
        assert!(slots.grant(&[1]).unwrap_err().contains("twice"));
        assert!(slots.grant(&[2]).unwrap_err().contains("has 2"));
        let (m, fields) = slots.place(header("a"), &[1, 2, 3, 4, 9, 9]).unwrap();
        assert!(matches!(m, Message::ShmSample { slot: 1, .. }));
        assert_eq!(fields, [9, 9]);
        let mut got = [0u8; 4];
        slots.segment.read(1, &mut got).unwrap();
        assert_eq!(got, [1, 2, 3, 4]);
        assert!(slots.place(header("b"), &[0; 6]).is_err(), "no slot left");
        assert_eq!(
            slots.grant(&[1]),
            Ok(1),
            "filled slots may be granted again"
        );
    }

    #[test]
    fn a_placed_sample_goes_into_the_clients_batch_and_takes_no_slot() {
        let arena = Segment::create("sluice-test", 4, 4).unwrap();
        let view = Segment::open_arena(
            arena.fd().try_clone_to_owned().unwrap(),
            &ShmAttach {
                job: 1,
                slots: 2,
                slot_bytes: 4,
                places: 4,
            },
        )
        .unwrap();
        let slots = Slots::new(
            Arc::new(Segment::create("sluice-test", 2, 4).unwrap()),
            Some(Arc::new(view)),
        );
        let header = |unit, index| SampleHeader {
            job: 1,
            unit,
            attempt: 0,
            shard: 0,
            index,
            key: format!("{unit}/{index}"),
            label: None,
            tensor_bytes: 4,
            fields: vec![("txt".into(), 1)],
            geometry: Default::default(),
            has: Vec::new(),
        };
        let place = |unit, index, place| Place {
            unit,
            attempt: 0,
            index,
            place,
        };
        slots.unit_started(7, 0);
        assert!(
            slots
                .add_places(&[place(7, 0, 4)])
                .unwrap_err()
                .contains("arena has 4"),
            "outside the arena"
        );
        // Unit 8 is not running here: its place is dropped, and its sample takes a slot.
        slots.add_places(&[place(7, 0, 3), place(8, 0, 2)]).unwrap();
        slots.grant(&[0, 1]).unwrap();
        let (m, fields) = slots.place(header(7, 0), &[1, 2, 3, 4, 9]).unwrap();
        assert!(matches!(m, Message::ShmPlaced { place: 3, .. }), "{m:?}");
        assert_eq!(fields, [9]);
        let mut got = [0u8; 4];
        arena.read(3, &mut got).unwrap();
        assert_eq!(got, [1, 2, 3, 4], "written into the client's batch");
        // A placed sample took no slot: the next one takes the first granted.
        let (m, _) = slots.place(header(8, 0), &[5, 6, 7, 8, 9]).unwrap();
        assert!(matches!(m, Message::ShmSample { slot: 0, .. }), "{m:?}");
        arena.read(2, &mut got).unwrap();
        assert_eq!(
            got, [0; 4],
            "a place for a unit not running here is never written"
        );
        // A place is used once; after its unit ends, none is kept.
        slots.grant(&[0]).unwrap();
        let (m, _) = slots.place(header(7, 0), &[0; 5]).unwrap();
        assert!(matches!(m, Message::ShmSample { .. }), "{m:?}");
        slots.unit_ended(7, 0);
        slots.add_places(&[place(7, 0, 1)]).unwrap();
        assert!(slots.places.lock().unwrap().running.is_empty());
        // The engine claims a place and resizes into it; the frame then names it.
        slots.unit_started(10, 0);
        slots.add_places(&[place(10, 0, 2)]).unwrap();
        assert!(slots.claim(10, 0, 0, 3).is_none(), "the wrong size");
        assert!(
            slots.claim(10, 0, 1, 4).is_none(),
            "no place for that sample"
        );
        {
            let mut claim = slots.claim(10, 0, 0, 4).expect("its place");
            assert_eq!(claim.place(), 2);
            claim.memory().copy_from_slice(&[4, 3, 2, 1]);
        }
        assert!(slots.claim(10, 0, 0, 4).is_none(), "claimed once");
        arena.read(2, &mut got).unwrap();
        assert_eq!(got, [4, 3, 2, 1]);
        slots.grant(&[1]).unwrap();
        let (m, fields) = slots.placed(header(10, 0), 2, vec![5]).unwrap();
        assert!(matches!(m, Message::ShmPlaced { place: 2, .. }), "{m:?}");
        assert_eq!(fields, [5]);
        assert!(
            slots.grant(&[1]).is_err(),
            "slot 1 is still granted: the placed took none"
        );
        // Released: a place is never written again.
        slots.unit_started(9, 0);
        slots.add_places(&[place(9, 0, 0)]).unwrap();
        slots.release();
        assert!(slots.place(header(9, 0), &[7; 5]).is_err());
        arena.read(0, &mut got).unwrap();
        assert_eq!(got, [0; 4]);
        let no_arena = Slots::new(
            Arc::new(Segment::create("sluice-test", 1, 4).unwrap()),
            None,
        );
        assert!(no_arena.add_places(&[place(7, 0, 0)]).is_err());
    }
}
