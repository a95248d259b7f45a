//! Delivery order: the bounded holding area between samples as they arrive and batches as
//! the plan defines them. Plain state (no IO, no clock), driven by the coordinator.
//!
//! - **Plan order** (the default): the epoch's [`Sequence`] names the sample at every
//!   position. A sample that arrives at its turn goes straight into the batch being filled;
//!   one that arrives early waits here, keyed by its position, until the positions before it
//!   are filled. A skip keeps its place the same way. So batch `b` is the same list of
//!   samples whichever worker answered first.
//! - **Arrival order**: arrivals pass through a seeded [`ShuffleBuffer`] and fill batches in
//!   the order it lets them out: mixed, but not reproducible.
//!
//! What bounds the holding area is the protocol's lookahead: it hands out a work unit only
//! when the unit's first position is within `lookahead` of the next position to fill, so
//! only samples of units near their turn can arrive early. At most about `lookahead +
//! buffer_samples + window_units × max_unit_samples` samples are held (by default 512 +
//! 1,024 + 16 × 64 ≈ 2,600, 385 MB at 224×224×3, in the worst case; typically the buffer
//! plus half the window); `EpochReport::reorder_peak` reports the most held at once. Held
//! QUIC payloads stay in buffers the loader reuses across epochs; same-host samples stay in
//! their slot while the segment has spare slots (the bound above, shared among the workers),
//! and are copied out past that, so a held sample never holds a credit's slot. The mixing
//! defaults come from `examples/order_training_check.py`: class-sorted shards needed the
//! 1,024-sample buffer to train as well as uniformly shuffled batches.

use std::collections::HashMap;
use std::sync::Arc;

use sluice_plan::{Sequence, ShuffleBuffer};

use crate::batch::{SampleId, SampleMeta};

/// A sample (its tensor a `P`: the shell's payload) or skip on its way to its place.
#[derive(Debug)]
pub(crate) enum Arrival<P> {
    Sample {
        id: SampleId,
        unit: u64,
        tensor: P,
        meta: SampleMeta,
    },
    Skip {
        id: SampleId,
        reason: String,
        unit: u64,
    },
}

/// Where an accepted arrival goes.
// A value returned and matched at once, never stored: boxing `Now` would allocate per
// sample for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Placement<P> {
    /// Into the batch being filled now (its turn has come).
    Now(Arrival<P>),
    /// Nowhere yet: it waits here.
    Held,
}

/// The order samples fill batches in.
pub(crate) enum Reorder<P> {
    Plan {
        sequence: Arc<Sequence>,
        /// The next position to fill.
        next: u64,
        early: HashMap<u64, Arrival<P>>,
        peak: usize,
        /// The farthest ahead of `next` a sample has arrived.
        reach: u64,
    },
    Arrival {
        buffer: Box<ShuffleBuffer<Arrival<P>>>,
        peak: usize,
    },
}

impl<P> Reorder<P> {
    /// Plan order from position `next` (`batches delivered × batch size` when resuming).
    pub(crate) fn plan(sequence: Arc<Sequence>, next: u64) -> Self {
        Reorder::Plan {
            sequence,
            next,
            early: HashMap::new(),
            peak: 0,
            reach: 0,
        }
    }

    pub(crate) fn arrival(buffer: ShuffleBuffer<Arrival<P>>) -> Self {
        Reorder::Arrival {
            buffer: Box::new(buffer),
            peak: 0,
        }
    }

    /// The next position to fill (plan order), for the lookahead and hedging.
    pub(crate) fn next_position(&self) -> Option<u64> {
        match self {
            Reorder::Plan { next, .. } => Some(*next),
            Reorder::Arrival { .. } => None,
        }
    }

    /// The (unit, index) the plan wants next, if it has not arrived yet.
    pub(crate) fn awaited(&self) -> Option<(u32, u64)> {
        match self {
            Reorder::Plan { sequence, next, .. } => sequence.at(*next),
            Reorder::Arrival { .. } => None,
        }
    }

    /// Plan order: the sequence, and whether the sample at `pos` is waiting here already.
    pub(crate) fn plan_holding(&self, pos: u64) -> Option<(&Sequence, bool)> {
        match self {
            Reorder::Plan {
                sequence, early, ..
            } => Some((sequence, early.contains_key(&pos))),
            Reorder::Arrival { .. } => None,
        }
    }

    /// Plan order: the farthest ahead of the next position a sample has arrived so far.
    pub(crate) fn reach(&self) -> u64 {
        match self {
            Reorder::Plan { reach, .. } => *reach,
            Reorder::Arrival { .. } => 0,
        }
    }

    /// Samples waiting here now, and at most so far.
    pub(crate) fn held(&self) -> (usize, usize) {
        match self {
            Reorder::Plan { early, peak, .. } => (early.len(), *peak),
            Reorder::Arrival { buffer, peak } => (buffer.len(), *peak),
        }
    }

    /// Plan order: true (and the turn is taken) when sample `index` of `unit` fills the next
    /// position, so the caller puts it straight into the batch. Always false in arrival order.
    pub(crate) fn take_turn(&mut self, unit: u64, index: u64) -> bool {
        let Reorder::Plan { sequence, next, .. } = self else {
            return false;
        };
        let due = u32::try_from(unit)
            .ok()
            .and_then(|u| sequence.position(u, index))
            == Some(*next);
        if due {
            *next += 1;
        }
        due
    }

    /// Takes an accepted arrival of `unit`, sample `index`. Plan order: `Now` when it is the
    /// next position's sample, else it is held. Arrival order: the shuffle buffer decides.
    pub(crate) fn offer(&mut self, unit: u64, index: u64, arrival: Arrival<P>) -> Placement<P> {
        match self {
            Reorder::Plan {
                sequence,
                next,
                early,
                peak,
                reach,
            } => {
                let pos = u32::try_from(unit)
                    .ok()
                    .and_then(|u| sequence.position(u, index));
                match pos {
                    Some(p) if p == *next => {
                        *next += 1;
                        Placement::Now(arrival)
                    }
                    Some(p) if p > *next => {
                        *reach = (*reach).max(p - *next);
                        early.insert(p, arrival);
                        *peak = (*peak).max(early.len());
                        Placement::Held
                    }
                    // The ledger accepted it, so it is planned and new: a position behind
                    // `next` or none means the plan and the ledger disagree; fill it now
                    // rather than lose it.
                    _ => Placement::Now(arrival),
                }
            }
            Reorder::Arrival { buffer, peak } => {
                let out = buffer.push(arrival);
                *peak = (*peak).max(buffer.len());
                match out {
                    Some(a) => Placement::Now(a),
                    None => Placement::Held,
                }
            }
        }
    }

    /// The held arrival whose turn has come, if any (plan order), or, once `draining` (every
    /// planned sample arrived), the shuffle buffer's residents one by one (arrival order).
    pub(crate) fn release(&mut self, draining: bool) -> Option<Arrival<P>> {
        match self {
            Reorder::Plan { next, early, .. } => {
                let a = early.remove(next)?;
                *next += 1;
                Some(a)
            }
            Reorder::Arrival { buffer, .. } => draining.then(|| buffer.pop()).flatten(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_plan::{Mixing, WorkUnit};

    fn skip(unit: u64, index: u64) -> Arrival<()> {
        Arrival::Skip {
            id: SampleId { shard: 0, index },
            reason: String::new(),
            unit,
        }
    }

    fn index_of(a: &Arrival<()>) -> u64 {
        match a {
            Arrival::Sample { id, .. } | Arrival::Skip { id, .. } => id.index,
        }
    }

    /// Whatever order arrivals come in, plan order lets them out in the sequence's order.
    #[test]
    fn plan_order_releases_the_sequence_whatever_the_arrival_order() {
        let units: Vec<WorkUnit> = (0..5)
            .map(|i| WorkUnit {
                id: i,
                shard: 0,
                start: u64::from(i) * 10,
                end: u64::from(i) * 10 + 10,
                padding: false,
                group: 0,
            })
            .collect();
        let seq = Arc::new(Sequence::new(&units, Mixing::default(), 4, 0, 0).unwrap());
        let want: Vec<u64> = (0..seq.len()).map(|p| seq.at(p).unwrap().1).collect();
        let mut arrivals: Vec<(u64, u64)> = units
            .iter()
            .flat_map(|u| (u.start..u.end).map(move |i| (u64::from(u.id), i)))
            .collect();
        arrivals.reverse();
        let mut r = Reorder::plan(seq.clone(), 0);
        let mut out = Vec::new();
        for (u, i) in arrivals {
            if let Placement::Now(a) = r.offer(u, i, skip(u, i)) {
                out.push(index_of(&a));
                while let Some(a) = r.release(false) {
                    out.push(index_of(&a));
                }
            }
        }
        assert_eq!(out, want);
        assert_eq!(r.held().0, 0);
        assert!(r.held().1 > 0);
    }
}
