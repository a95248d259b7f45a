//! The order of a rank's samples within an epoch: part of the plan, so batch `b` of rank `r`
//! in epoch `e` is a fixed list of sample ids whichever workers, transports, failures or
//! resumes produced it.
//!
//! The mixing model has two stages, both pure functions of (units, seed, epoch, rank):
//! 1. **Interleave.** A window of `window_units` work units is open at once, taken in the
//!    plan's unit order. Each step picks one open unit uniformly (a seeded draw) and takes its
//!    next sample; a unit that runs out is replaced by the next unit of the plan. Within a
//!    unit samples stay in shard order, so every unit is still read start to end.
//! 2. **Shuffle buffer.** The interleaved stream passes through a seeded [`ShuffleBuffer`] of
//!    `buffer_samples`: once full, each new sample displaces a uniformly chosen resident.
//!    This is the mixing WebDataset's and tf.data's shuffle buffers give, computed ahead
//!    instead of driven by arrival times.
//!
//! Memory at run time: the client holds samples that arrived before their turn. In the
//! steady state that is about `buffer_samples` (the buffer's residents) plus the unread rest
//! of the open window (up to `window_units × unit size`), plus whatever the client's
//! lookahead lets workers decode early; see the client's reorder settings.

use serde::{Deserialize, Serialize};

use crate::assign::Piece;
use crate::rng::{stream, Domain};
use crate::{PlanError, ShuffleBuffer, WorkUnit};

/// The knobs of the mixing model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Mixing {
    /// Work units open at once whose samples are interleaved (at least 1).
    pub window_units: u32,
    /// Samples in the shuffle buffer after the interleave (0: none).
    pub buffer_samples: u32,
}

impl Default for Mixing {
    fn default() -> Self {
        Mixing {
            window_units: 16,
            buffer_samples: 1024,
        }
    }
}

/// A rank's samples for one epoch in delivery order.
///
/// Samples are named by their *slot*: the unit's offset in the plan's unit list plus the
/// sample's place in the unit, so the whole order is two `u32` arrays.
#[derive(Clone, Debug)]
pub struct Sequence {
    /// First slot of each unit (prefix sums of unit lengths), one extra at the end.
    base: Vec<u64>,
    /// First sample index (in its shard) of each unit.
    starts: Vec<u64>,
    /// The slot delivered at each position.
    order: Vec<u32>,
    /// The position of each slot (the inverse of `order`).
    position: Vec<u32>,
    /// The earliest position of any sample of each unit.
    first: Vec<u32>,
}

impl Sequence {
    /// The order of `units` (ids `0..n` in plan order) under `mixing`, for (seed, epoch, rank).
    pub fn new(
        units: &[WorkUnit],
        mixing: Mixing,
        seed: u64,
        epoch: u64,
        rank: u32,
    ) -> Result<Self, PlanError> {
        let base = slots(units)?;
        let pick = stream(seed, Domain::Interleave, epoch, u64::from(rank));
        let buffer = stream(seed, Domain::MixBuffer, epoch, u64::from(rank));
        let order = interleave(units, &base, 0..units.len(), mixing, pick, buffer);
        Ok(Self::from_order(units, base, order))
    }

    /// A sequence whose slot order was computed elsewhere (a mixture's, see
    /// [`crate::mixture`]): `order` holds every slot of `units` once.
    pub(crate) fn from_order(units: &[WorkUnit], base: Vec<u64>, order: Vec<u32>) -> Self {
        let mut position = vec![0u32; order.len()];
        let mut first = vec![u32::MAX; units.len()];
        for (pos, &slot) in order.iter().enumerate() {
            position[slot as usize] = pos as u32;
            let unit = base.partition_point(|&b| b <= u64::from(slot)) - 1;
            first[unit] = first[unit].min(pos as u32);
        }
        Sequence {
            base,
            starts: units.iter().map(|u| u.start).collect(),
            order,
            position,
            first,
        }
    }

    /// Samples in the epoch.
    pub fn len(&self) -> u64 {
        self.order.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The (unit id, index in shard) delivered at `pos`.
    pub fn at(&self, pos: u64) -> Option<(u32, u64)> {
        let slot = u64::from(*self.order.get(usize::try_from(pos).ok()?)?);
        let unit = self.base.partition_point(|&b| b <= slot) - 1;
        Some((unit as u32, self.starts[unit] + slot - self.base[unit]))
    }

    /// The position of sample `index` (in its shard) of unit `unit`, if it is in the unit.
    pub fn position(&self, unit: u32, index: u64) -> Option<u64> {
        let u = unit as usize;
        let (start, lo, hi) = (*self.starts.get(u)?, self.base[u], self.base[u + 1]);
        let slot = lo + index.checked_sub(start)?;
        (slot < hi).then(|| u64::from(self.position[slot as usize]))
    }

    /// The earliest position of any sample of `unit` (`None` for an empty or unknown unit).
    pub fn first_position(&self, unit: u32) -> Option<u64> {
        self.first
            .get(unit as usize)
            .filter(|&&p| p != u32::MAX)
            .map(|&p| u64::from(p))
    }

    /// The earliest position among samples `start..end` of `unit`.
    pub fn first_position_in(&self, unit: u32, start: u64, end: u64) -> Option<u64> {
        (start..end).filter_map(|i| self.position(unit, i)).min()
    }
}

/// The first slot of each unit (prefix sums of unit lengths), one extra at the end; the
/// units must carry their plan positions as ids.
pub(crate) fn slots(units: &[WorkUnit]) -> Result<Vec<u64>, PlanError> {
    let mut base = Vec::with_capacity(units.len() + 1);
    let mut total = 0u64;
    for (i, u) in units.iter().enumerate() {
        if u.id as usize != i {
            return Err(PlanError::UnitIds { at: i as u64 });
        }
        base.push(total);
        total += u.len();
    }
    base.push(total);
    if total >= u64::from(u32::MAX) {
        return Err(PlanError::RankTooLarge { samples: total });
    }
    Ok(base)
}

/// The slots of `units[range]` in the order the mixing model gives them: a window of units
/// interleaved by `pick`, then a shuffle buffer drawing from `buffer` (see the module
/// documentation).
pub(crate) fn interleave(
    units: &[WorkUnit],
    base: &[u64],
    range: std::ops::Range<usize>,
    mixing: Mixing,
    mut pick: crate::rng::Stream,
    buffer: crate::rng::Stream,
) -> Vec<u32> {
    let n = (base[range.end] - base[range.start]) as usize;
    let mut order = Vec::with_capacity(n);
    let window = mixing.window_units.max(1) as usize;
    let mut buffer = (mixing.buffer_samples > 0)
        .then(|| ShuffleBuffer::from_stream(mixing.buffer_samples as usize, buffer));
    // Open units as (unit, next offset); empty units are passed over.
    let mut open: Vec<(usize, u64)> = Vec::with_capacity(window);
    let mut next_unit = range.start;
    let mut refill = |open: &mut Vec<(usize, u64)>, at: Option<usize>| {
        while next_unit < range.end && units[next_unit].is_empty() {
            next_unit += 1;
        }
        let fresh = (next_unit < range.end).then(|| {
            next_unit += 1;
            (next_unit - 1, 0)
        });
        match (at, fresh) {
            (Some(i), Some(f)) => open[i] = f,
            (Some(i), None) => {
                open.swap_remove(i);
            }
            (None, Some(f)) => open.push(f),
            (None, None) => {}
        }
        fresh.is_some()
    };
    while open.len() < window && refill(&mut open, None) {}
    while !open.is_empty() {
        let i = pick.below(open.len() as u64) as usize;
        let (unit, offset) = open[i];
        let slot = (base[unit] + offset) as u32;
        if offset + 1 == units[unit].len() {
            refill(&mut open, Some(i));
        } else {
            open[i].1 += 1;
        }
        match buffer.as_mut() {
            Some(b) => order.extend(b.push(slot)),
            None => order.push(slot),
        }
    }
    if let Some(b) = buffer.as_mut() {
        order.extend(std::iter::from_fn(|| b.pop()));
    }
    order
}

/// The samples at positions `done..` of `sequence` as pieces (per unit, in unit order, runs
/// of consecutive indexes), each with its unit's mixture group.
pub(crate) fn remaining_by_group(
    units: &[WorkUnit],
    sequence: &Sequence,
    done: u64,
) -> Vec<(u32, Piece)> {
    let mut left: Vec<Vec<u64>> = vec![Vec::new(); units.len()];
    for p in done..sequence.len() {
        if let Some((u, i)) = sequence.at(p) {
            left[u as usize].push(i);
        }
    }
    let mut out: Vec<(u32, Piece)> = Vec::new();
    for (u, mut idx) in units.iter().zip(left) {
        idx.sort_unstable();
        for i in idx {
            match out.last_mut() {
                Some((g, p))
                    if *g == u.group
                        && p.shard == u.shard
                        && p.end == i
                        && p.padding == u.padding =>
                {
                    p.end += 1
                }
                _ => out.push((
                    u.group,
                    Piece {
                        shard: u.shard,
                        start: i,
                        end: i + 1,
                        padding: u.padding,
                    },
                )),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn units(lens: &[u64]) -> Vec<WorkUnit> {
        lens.iter()
            .enumerate()
            .map(|(i, &n)| WorkUnit {
                id: i as u32,
                shard: i as u32 % 3,
                start: 10 * i as u64,
                end: 10 * i as u64 + n,
                padding: false,
                group: 0,
            })
            .collect()
    }

    proptest! {
        #[test]
        fn every_sample_has_one_position_and_units_stay_in_shard_order_before_the_buffer(
            lens in proptest::collection::vec(0u64..40, 0..30), window in 1u32..10,
            buffer in 0u32..64, seed in any::<u64>(), epoch in 0u64..4, rank in 0u32..4,
        ) {
            let units = units(&lens);
            let mixing = Mixing { window_units: window, buffer_samples: buffer };
            let seq = Sequence::new(&units, mixing, seed, epoch, rank).unwrap();
            let total: u64 = lens.iter().sum();
            prop_assert_eq!(seq.len(), total);
            let mut seen = std::collections::HashSet::new();
            for pos in 0..seq.len() {
                let (u, i) = seq.at(pos).unwrap();
                prop_assert!(seen.insert((u, i)), "({}, {}) twice", u, i);
                prop_assert_eq!(seq.position(u, i), Some(pos));
                prop_assert!(seq.first_position(u).unwrap() <= pos);
            }
            prop_assert!(seq.at(total).is_none());
            let again = Sequence::new(&units, mixing, seed, epoch, rank).unwrap();
            prop_assert_eq!(&again.order, &seq.order);
            if buffer == 0 {
                for u in &units {
                    let pos: Vec<u64> = (u.start..u.end).map(|i| seq.position(u.id, i).unwrap()).collect();
                    prop_assert!(pos.windows(2).all(|w| w[0] < w[1]), "unit {} out of order", u.id);
                }
            }
        }
    }

    #[test]
    fn unit_ids_must_be_plan_positions() {
        let mut u = units(&[3, 3]);
        u[1].id = 5;
        assert_eq!(
            Sequence::new(&u, Mixing::default(), 1, 0, 0).unwrap_err(),
            PlanError::UnitIds { at: 1 }
        );
    }

    /// Mean distinct classes per batch of `batch` for samples whose class is `class(unit, i)`.
    fn distinct_per_batch(seq: &Sequence, batch: u64, class: impl Fn(u32, u64) -> u64) -> f64 {
        let mut sum = 0.0;
        let batches = seq.len() / batch;
        for b in 0..batches {
            let set: std::collections::HashSet<u64> = (b * batch..(b + 1) * batch)
                .map(|p| {
                    let (u, i) = seq.at(p).unwrap();
                    class(u, i)
                })
                .collect();
            sum += set.len() as f64;
        }
        sum / batches as f64
    }

    /// The class-sorted case: 20 classes of 100 in shards of 200, one rank, batches
    /// of 64: uniform sampling gives about 19.3 classes per batch, a unit read alone about 1.5,
    /// the default mixing about 18.
    #[test]
    fn class_sorted_shards_are_mixed_by_the_plan_alone() {
        let cfg = crate::PlanConfig {
            max_unit_samples: 64,
            ..crate::PlanConfig::new(3, 1, crate::ShufflePolicy::Global)
        };
        let plan = crate::plan_counts(&[200; 10], &cfg, 0, 0).unwrap();
        let class = |u: u32, i: u64| u64::from(plan[u as usize].shard) * 2 + i / 100;
        let unmixed = Mixing {
            window_units: 1,
            buffer_samples: 0,
        };
        let seq = Sequence::new(&plan, unmixed, 3, 0, 0).unwrap();
        assert!(distinct_per_batch(&seq, 64, class) < 2.5);
        let seq = Sequence::new(&plan, Mixing::default(), 3, 0, 0).unwrap();
        let mixed = distinct_per_batch(&seq, 64, class);
        assert!(mixed >= 0.5 * 19.3, "{mixed:.2} classes per batch");
    }
}
