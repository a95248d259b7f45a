//! Which samples of the batches bound to buffers get a place in the batch arena, and which
//! worker connection writes each: the protocol's half of batch assembly (the coordinator's
//! is `crate::assembly`).

use sluice_wire::{Assign, Place};

use super::{Protocol, Tensor};
use crate::ledger::Verdict;

impl<P: Tensor> Protocol<P> {
    /// Where the samples of batch `batch` could be written straight into it (its buffer's
    /// places start at `first`): for each sample not yet arrived that exactly one link's open
    /// piece holds, that link, its connection and the place. A sample two attempts hold (a
    /// hedge) gets none: no place ever has two writers.
    pub(crate) fn batch_places(&self, batch: u64, first: u32) -> Vec<(usize, u64, Place)> {
        let plan = &self.settings.batch_plan;
        let start = batch.saturating_mul(plan.batch_size);
        (0..plan.target(batch))
            .filter_map(|j| self.place_at(start + j as u64, first + j as u32))
            .collect()
    }

    /// The places for the samples of a piece just assigned whose batches are bound (`bound`
    /// gives a batch's first place), as [`Protocol::batch_places`] decides them.
    pub(crate) fn piece_places(
        &self,
        assign: &Assign,
        bound: impl Fn(u64) -> Option<u32>,
    ) -> Vec<Place> {
        let plan = &self.settings.batch_plan;
        let Some((sequence, _)) = self.reorder.plan_holding(0) else {
            return Vec::new();
        };
        let Ok(unit) = u32::try_from(assign.unit) else {
            return Vec::new();
        };
        (assign.start..assign.end)
            .filter_map(|index| {
                let pos = sequence.position(unit, index)?;
                let batch = pos / plan.batch_size.max(1);
                let j = pos % plan.batch_size.max(1);
                let first = bound(batch)?;
                if j >= plan.target(batch) as u64 {
                    return None;
                }
                self.place_at(pos, first + j as u32).map(|(_, _, p)| p)
            })
            .collect()
    }

    /// The place `place` for the sample at plan position `pos`, with the link and connection
    /// that would write it: only for a sample not yet here, held by one open piece.
    fn place_at(&self, pos: u64, place: u32) -> Option<(usize, u64, Place)> {
        let (sequence, held) = self.reorder.plan_holding(pos)?;
        let (unit, index) = sequence.at(pos)?;
        let unit = u64::from(unit);
        let shard = self.ledger.unit(unit)?.shard;
        if held || self.ledger.check(unit, shard, index) != Verdict::Accept {
            return None;
        }
        let mut holders = self.links.iter().enumerate().flat_map(|(i, l)| {
            l.open
                .iter()
                .filter(move |p| p.unit == unit && (p.start..p.end).contains(&index))
                .map(move |p| (i, l.generation, p.attempt))
        });
        let (link, generation, attempt) = holders.next()?;
        if holders.next().is_some() {
            return None;
        }
        let place = Place {
            unit,
            attempt,
            index,
            place,
        };
        Some((link, generation?, place))
    }
}
