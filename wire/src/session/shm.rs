//! The same-host half of the worker's session: the order of the handshake on the Unix socket
//! (`Hello`, `OpenJob`, then `ShmAttach`), which segments a client may attach, the slots it
//! grants (each written once per grant), the places it gives in its batch arena (each written
//! at most once, only by the unit whose sample it names, and never after the job is
//! released) and the credit a sample written into its place gives back. The shell
//! (`sluice_cpu::same_host`, `sluice_cpu::slots`) checks the peer's credentials, passes the
//! descriptors, maps the segments and writes the bytes where this says.

use std::collections::{HashMap, VecDeque};

use super::{ConnId, Effect, Session, Transport, UnitId, Worker};
use crate::message::{ErrorCode, Message, Place, ShmAttach};

/// Slots a segment may have beyond `limits.max_credits`: the client keeps samples that
/// arrived before their turn in them (its default bound on those is 2,560).
const MAX_SPARE_SLOTS: u32 = 1 << 16;

/// Samples a client's batch arena may hold (its batches, back to back).
const MAX_PLACES: u32 = 1 << 16;

/// Where a unit's finished sample goes on a same-host connection ([`Worker::route`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Its place in the client's batch (it spends no credit: the one it took came back).
    Place(u32),
    /// The next slot the client granted (with the credit it took).
    Slot(u32),
}

/// A same-host job's segments as the session keeps them: the layout attached, the slots
/// granted and not yet written, and the places given for the units running here.
#[derive(Debug, Default)]
pub(super) struct Segments {
    /// Checked and handed to the shell to map; the layout once it reported success.
    attaching: Option<ShmAttach>,
    attached: Option<ShmAttach>,
    /// Slots granted and not yet written, in grant order; `held[i]`: `i` is one of them.
    free: VecDeque<u32>,
    held: Vec<bool>,
    /// The places given, by (unit, attempt), then sample index; kept only while the unit
    /// runs here, so a place that arrives after its unit ended is dropped.
    places: HashMap<(u64, u32), HashMap<u64, u32>>,
}

impl Segments {
    pub(super) fn attached(&self) -> bool {
        self.attached.is_some()
    }

    /// Whether the client shares its batches (its places are released when the job ends).
    pub(super) fn has_arena(&self) -> bool {
        self.attached.is_some_and(|a| a.places > 0)
    }

    /// Takes the client's grant: the number of new credits, or what is wrong with it.
    fn grant(&mut self, slots: &[u32]) -> Result<u32, String> {
        for &slot in slots {
            match self.held.get_mut(slot as usize) {
                None => {
                    return Err(format!(
                        "slot {slot} granted, the segment has {}",
                        self.held.len()
                    ))
                }
                Some(true) => return Err(format!("slot {slot} granted twice")),
                Some(h) => {
                    *h = true;
                    self.free.push_back(slot);
                }
            }
        }
        Ok(slots.len() as u32)
    }

    /// Takes the client's places, or says what is wrong with them.
    fn add_places(&mut self, places: &[Place]) -> Result<(), String> {
        let arena = self.attached.map_or(0, |a| a.places);
        if arena == 0 {
            return Err("sample places, but the client attached no batch arena".into());
        }
        for place in places {
            if place.place >= arena {
                return Err(format!(
                    "place {} for sample {} of unit {}, the arena has {arena}",
                    place.place, place.index, place.unit
                ));
            }
            if let Some(unit) = self.places.get_mut(&(place.unit, place.attempt)) {
                unit.insert(place.index, place.place);
            }
        }
        Ok(())
    }

    pub(super) fn unit_started(&mut self, key: (u64, u32)) {
        self.places.entry(key).or_default();
    }

    /// The unit ended: its places that were not used are forgotten.
    pub(super) fn unit_ended(&mut self, key: (u64, u32)) {
        self.places.remove(&key);
    }

    /// The place given for sample `index` of unit `key`, taken (it is used once).
    fn take_place(&mut self, key: (u64, u32), index: u64) -> Option<u32> {
        self.places.get_mut(&key)?.remove(&index)
    }

    /// The next granted slot, which the sample about to go out takes.
    fn take_slot(&mut self) -> Result<u32, String> {
        let slot = self
            .free
            .pop_front()
            .ok_or("a credit without a granted slot")?;
        self.held[slot as usize] = false;
        Ok(slot)
    }
}

/// Whether the client may attach `attach` to `job`, whose samples have `sample_bytes`.
fn check_attach(
    rules: &super::Rules,
    attach: &ShmAttach,
    job: u64,
    sample_bytes: u64,
) -> Result<(), String> {
    // Slots beyond the credits hold samples the client keeps until their turn.
    let max_credits = rules.max_credits;
    let refused = match attach {
        a if a.job != job => Some(format!("segment for job {}, the open job is {job}", a.job)),
        a if a.slot_bytes != sample_bytes => Some(format!(
            "slots of {} bytes, the job's samples have {sample_bytes}",
            a.slot_bytes
        )),
        a if a.slots == 0 || a.slots > max_credits.saturating_add(MAX_SPARE_SLOTS) => {
            Some(format!(
                "{} slots (limits.max_credits = {max_credits}, plus {MAX_SPARE_SLOTS} spare)",
                a.slots
            ))
        }
        a if a.places > MAX_PLACES => Some(format!(
            "a batch arena of {} samples (at most {MAX_PLACES})",
            a.places
        )),
        _ => None,
    };
    if let Some(why) = refused {
        return Err(why);
    }
    for (what, n) in [("segment", attach.slots), ("batch arena", attach.places)] {
        let bytes = u64::from(n).saturating_mul(attach.slot_bytes);
        if bytes > rules.max_segment_bytes {
            return Err(format!(
                "a {what} of {bytes} bytes exceeds same_host.max_segment_bytes = {}",
                rules.max_segment_bytes
            ));
        }
    }
    Ok(())
}

/// On a same-host connection, what `m` breaks of the handshake's order (`OpenJob`, then
/// `ShmAttach`, then nothing until `ShmAttached`), if anything.
pub(super) fn out_of_order(s: &Session, m: &Message) -> Option<String> {
    if s.transport != Transport::Slots {
        return matches!(m, Message::ShmAttach(_))
            .then(|| "ShmAttach on a connection without shared memory".into());
    }
    let job = s.jobs.values().next();
    let expected = match job.map(|j| &j.shm) {
        None if s.opening.is_empty() => "OpenJob",
        None => return Some(format!("{} before JobOpened", m.kind())),
        Some(shm) if shm.attached() => return None,
        Some(shm) if shm.attaching.is_some() => {
            return Some(format!("{} before ShmAttached", m.kind()))
        }
        Some(_) => "ShmAttach",
    };
    (m.kind() != expected).then(|| format!("expected {expected}, got {}", m.kind()))
}

impl<L: Clone> Worker<L> {
    /// A same-host frame of a connection past its handshake's order check: `ShmAttach`,
    /// `SlotCredit` or `ShmPlaces`. Why the connection ends, if it does.
    pub(super) fn handle_shm(&mut self, conn: ConnId, m: Message) -> Option<(ErrorCode, String)> {
        let s = self.sessions.get_mut(&conn)?;
        let bad = |m: String| Some((ErrorCode::BadRequest, m));
        match m {
            Message::ShmAttach(attach) => {
                let (&job, j) = s.jobs.iter_mut().next()?;
                if let Err(why) = check_attach(&self.rules, &attach, job, j.sample_bytes) {
                    return bad(why);
                }
                j.shm.attaching = Some(attach);
                s.effects.push_back(Effect::Attach(attach));
                None
            }
            Message::SlotCredit { job, slots } => {
                let j = s.jobs.get_mut(&job)?; // a job cancelled a moment ago
                if !j.shm.attached() {
                    return bad(format!("slot credits for job {job}, which has no segment"));
                }
                match j.shm.grant(&slots) {
                    Ok(n) => self.credit(conn, job, n),
                    Err(why) => return bad(why),
                }
                None
            }
            Message::ShmPlaces { job, places } => {
                let j = s.jobs.get_mut(&job)?; // a job cancelled a moment ago
                if !j.shm.attached() {
                    return bad(format!("sample places for job {job}, which has no segment"));
                }
                j.shm.add_places(&places).err().and_then(bad)
            }
            _ => None,
        }
    }

    /// The shell mapped (or could not map) the segments of the client's `ShmAttach` for
    /// `job`: slot credits may come once it did.
    pub fn attached(&mut self, conn: ConnId, job: u64, result: Result<(), String>) {
        let Some(j) = self.job_mut(conn, job) else {
            return;
        };
        let Some(attach) = j.shm.attaching.take() else {
            return;
        };
        if let Err(why) = result {
            return self.close(conn, ErrorCode::BadRequest, why);
        }
        j.shm.held = vec![false; attach.slots as usize];
        j.shm.attached = Some(attach);
        let s = self.sessions.get_mut(&conn).expect("the session attaching");
        s.effects
            .push_back(Effect::Send(Message::ShmAttached { job }));
    }

    /// Whether connection `conn` is still in its handshake: before `Welcome`, and on a
    /// same-host connection until its segments are attached.
    pub fn handshaking(&self, conn: ConnId) -> bool {
        let Some(s) = self.sessions.get(&conn) else {
            return false;
        };
        let attached = || s.jobs.values().any(|j| j.shm.attached());
        !s.closed && (!s.greeted || (s.transport == Transport::Slots && !attached()))
    }

    /// The place the client gave for sample `index` of unit `(unit, attempt)` of `job`,
    /// taken out of the table (a place is used once); `None` without one; an error once the
    /// job is gone (cancelled: its places may be the client's again).
    pub fn take_place(
        &mut self,
        conn: ConnId,
        job: u64,
        (unit, attempt): (u64, u32),
        index: u64,
    ) -> Result<Option<u32>, String> {
        let j = self.job_mut(conn, job).ok_or("the job was cancelled")?;
        Ok(j.shm.take_place((unit, attempt), index))
    }

    /// Where unit `id`'s sample `index` goes: its place in the client's batch when the
    /// client gave one and `fits` (the tensor is a place's size), its credit given back; else
    /// the next granted slot. `None`: nowhere, the unit is stopping (its job was cancelled or
    /// its client left), which is no fault.
    pub fn route(&mut self, id: UnitId, index: u64, fits: bool) -> Result<Option<Route>, String> {
        let Some(u) = self.units.get(&id).filter(|u| !u.stopped) else {
            return Ok(None);
        };
        let (conn, job, key) = (u.conn, u.job, u.key);
        let Some(j) = self.job_mut(conn, job) else {
            return Ok(None);
        };
        let place = match fits {
            true => j.shm.take_place(key, index),
            false => None,
        };
        let Some(place) = place else {
            return j.shm.take_slot().map(|slot| Some(Route::Slot(slot)));
        };
        self.placed(id);
        Ok(Some(Route::Place(place)))
    }

    /// Unit `id` sent a sample that spends no credit (written straight into its place in the
    /// client's batch, which the place bounds): the credit it took comes back.
    pub fn placed(&mut self, id: UnitId) {
        if let Some((conn, job)) = self.units.get(&id).map(|u| (u.conn, u.job)) {
            self.credit(conn, job, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_sizes_are_checked() {
        let rules = super::super::Rules::new(None, Default::default());
        let a = |slots, slot_bytes| ShmAttach {
            job: 1,
            slots,
            slot_bytes,
            places: 0,
        };
        let check = |a: &ShmAttach, job, bytes| check_attach(&rules, a, job, bytes);
        assert!(check(&a(8, 100), 1, 100).is_ok());
        let e = |r: Result<(), String>| r.unwrap_err();
        assert!(e(check(&a(8, 99), 1, 100)).contains("samples have 100"));
        let max = rules.max_credits;
        assert!(check(&a(max + 1, 100), 1, 100).is_ok(), "spare slots");
        let over = max + MAX_SPARE_SLOTS + 1;
        assert!(e(check(&a(over, 100), 1, 100)).contains("max_credits"));
        assert!(e(check(&a(8, 100), 2, 100)).contains("open job is 2"));
        let huge = rules.max_segment_bytes / 4 + 1;
        assert!(e(check(&a(4, huge), 1, huge)).contains("max_segment_bytes"));
        let arena = ShmAttach {
            places: MAX_PLACES + 1,
            ..a(8, 100)
        };
        assert!(e(check(&arena, 1, 100)).contains("at most"));
    }

    #[test]
    fn slots_are_granted_once_and_places_kept_only_for_running_units() {
        let mut s = Segments {
            attached: Some(ShmAttach {
                job: 1,
                slots: 2,
                slot_bytes: 4,
                places: 4,
            }),
            held: vec![false; 2],
            ..Segments::default()
        };
        assert!(s.take_slot().is_err(), "nothing granted");
        assert_eq!(s.grant(&[1]), Ok(1));
        assert!(s.grant(&[1]).unwrap_err().contains("twice"));
        assert!(s.grant(&[2]).unwrap_err().contains("has 2"));
        assert_eq!(s.take_slot(), Ok(1));
        assert_eq!(s.grant(&[1]), Ok(1), "a written slot may be granted again");
        let place = |unit, index, place| Place {
            unit,
            attempt: 0,
            index,
            place,
        };
        s.unit_started((7, 0));
        assert!(s
            .add_places(&[place(7, 0, 4)])
            .unwrap_err()
            .contains("arena has 4"));
        // Unit 8 is not running here: its place is dropped.
        s.add_places(&[place(7, 0, 3), place(8, 0, 2)]).unwrap();
        assert_eq!(s.take_place((8, 0), 0), None);
        assert_eq!(s.take_place((7, 0), 0), Some(3));
        assert_eq!(s.take_place((7, 0), 0), None, "used once");
        s.unit_ended((7, 0));
        s.add_places(&[place(7, 0, 1)]).unwrap();
        assert!(s.places.is_empty(), "no place kept after its unit ended");
        let mut no_arena = Segments::default();
        assert!(no_arena.add_places(&[place(7, 0, 0)]).is_err());
    }
}
