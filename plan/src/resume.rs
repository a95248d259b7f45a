//! Resume arithmetic: a rank's plan cut to whole batches, and the rest of an epoch that an
//! earlier world left part way, split across a new world.
//!
//! In plan order the samples a rank was handed in its first `b` batches are exactly the first
//! `b × batch_size` positions of its [`Sequence`] (DDP ranks step together, so every rank of a
//! world stopped at the same `b`). The rest of the epoch is therefore known from `b` alone:
//! every old rank's unseen positions, gathered rank by rank ([`remaining_pieces`]), are laid
//! end to end and cut into the new world's equal runs ([`crate::resume_plan`]). A resume of a
//! resume repeats this one level deeper ([`Segment`]s oldest first).

use serde::{Deserialize, Serialize};

use crate::assign::{self, Piece};
use crate::mixture::{Ctx, Mixture, SourceState};
use crate::order::remaining_by_group;
use crate::{Mixing, PlanConfig, PlanError, Sequence, WorkUnit};

/// What happens to the epoch's last, incomplete batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LastBatch {
    /// Deliver the remainder as a smaller batch.
    #[default]
    Partial,
    /// Drop the remainder (its samples are not even fetched).
    Drop,
}

/// How a rank's samples of an epoch fall into batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    /// Samples in those batches (the rank's samples, less a dropped last batch).
    pub samples: u64,
    pub batch_size: u64,
    pub batches: u64,
}

impl BatchPlan {
    pub fn new(samples_per_rank: u64, batch_size: u64, last: LastBatch) -> Self {
        let batches = match last {
            LastBatch::Partial => samples_per_rank.div_ceil(batch_size),
            LastBatch::Drop => samples_per_rank / batch_size,
        };
        BatchPlan {
            samples: samples_per_rank.min(batches * batch_size),
            batch_size,
            batches,
        }
    }

    /// Target size of batch `k`.
    pub fn target(&self, k: u64) -> usize {
        (self.samples - k * self.batch_size).min(self.batch_size) as usize
    }
}

/// An earlier part of an epoch: a world of `world_size` ranks each took `batches` batches
/// of its plan-order sequence, then the job stopped and resumed at another world size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub world_size: u32,
    pub batches: u64,
    /// A mixture's weights in that segment (parts of [`crate::mixture::WEIGHT_SCALE`]);
    /// empty for a single dataset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<u64>,
}

/// Everything that decides which samples a rank is handed in an epoch, and in which order,
/// for any world size: the dataset's shard sample counts and the job's plan settings.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochPlanner {
    pub counts: Vec<u64>,
    /// The job's plan (its `world_size` is the current world's; each call names its world).
    pub config: PlanConfig,
    pub mixing: Mixing,
    pub batch_size: u64,
    pub last_batch: LastBatch,
    /// Several sources drawn by weight (`counts` lists each source's shards in turn).
    pub mixture: Option<Mixture>,
}

impl EpochPlanner {
    pub(crate) fn ctx(&self) -> Ctx<'_> {
        Ctx {
            counts: &self.counts,
            config: &self.config,
            mixing: self.mixing,
            batch_size: self.batch_size,
            last_batch: self.last_batch,
        }
    }

    /// The samples each rank gets in an epoch as planned in a world of `world` ranks
    /// (before the last-batch policy).
    pub fn samples_per_rank(&self, world: u32) -> u64 {
        match &self.mixture {
            Some(m) => {
                let ctx = self.ctx();
                Mixture::rounded(m.epoch_length(&self.counts), world, &ctx)
                    / u64::from(world.max(1))
            }
            None => crate::samples_per_rank(self.counts.iter().sum(), world, self.config.remainder),
        }
    }

    /// The weights of the current segment after `resumed` of an epoch that starts at step
    /// `epoch_start` ([`Self::mixture_start`]), in a world of `world` whose ranks take
    /// `samples` samples each: a mixture's (its schedule's, summed over the steps the segment
    /// spans); empty for a single dataset. What a checkpoint records.
    pub fn segment_weights(
        &self,
        epoch_start: u64,
        resumed: &[Segment],
        world: u32,
        samples: u64,
    ) -> Vec<u64> {
        match &self.mixture {
            Some(m) => m.segment_weights(epoch_start, resumed, world, samples, &self.ctx()),
            None => Vec::new(),
        }
    }

    /// A mixture's sources' states and the training step at the start of `epoch`, computed
    /// together (`None` for a single dataset).
    pub fn mixture_start(&self, epoch: u64) -> Result<Option<(Vec<SourceState>, u64)>, PlanError> {
        match &self.mixture {
            Some(m) => Ok(Some(m.start_of(epoch, &self.ctx())?)),
            None => Ok(None),
        }
    }

    /// The training step at which `epoch` starts (a mixture's weight schedule's clock; 0 for
    /// a single dataset).
    pub fn epoch_step(&self, epoch: u64) -> Result<u64, PlanError> {
        match &self.mixture {
            Some(m) => m.epoch_step(epoch, &self.ctx()),
            None => Ok(0),
        }
    }

    /// Rank `rank`'s units (cut to whole batches) and batch plan for `epoch` in a world of
    /// `world` ranks, after the earlier segments `resumed` (none: the epoch as planned).
    pub fn segment(
        &self,
        epoch: u64,
        resumed: &[Segment],
        world: u32,
        rank: u32,
    ) -> Result<(Vec<WorkUnit>, BatchPlan), PlanError> {
        let (units, batch_plan, _) = self.segment_and_rest(epoch, resumed, world, rank)?;
        Ok((units, batch_plan))
    }

    /// [`Self::segment`], and with it [`Self::rest_plan`], planned once: the segment has
    /// rounds after it where the rest holds more samples than it does.
    pub fn segment_and_rest(
        &self,
        epoch: u64,
        resumed: &[Segment],
        world: u32,
        rank: u32,
    ) -> Result<(Vec<WorkUnit>, BatchPlan, BatchPlan), PlanError> {
        let config = PlanConfig {
            world_size: world,
            ..self.config.clone()
        };
        if let Some(m) = &self.mixture {
            let (units, (round, rest)) = m.segment(epoch, resumed, world, rank, &self.ctx())?;
            let batch_plan = BatchPlan::new(round, self.batch_size, self.last_batch);
            let rest = BatchPlan::new(rest, self.batch_size, self.last_batch);
            return Ok((first_samples(units, batch_plan.samples), batch_plan, rest));
        }
        let (units, samples) = match resumed.split_last() {
            None => {
                let units = crate::plan_counts(&self.counts, &config, epoch, rank)?;
                let total = self.counts.iter().sum();
                (
                    units,
                    crate::samples_per_rank(total, world, config.remainder),
                )
            }
            Some((last, earlier)) => {
                let rest = self.rest(epoch, earlier, last)?;
                let remaining = assign::total(&rest);
                let depth = resumed.len() as u32;
                let units = crate::resume_plan(rest, &self.counts, &config, epoch, rank, depth)?;
                let per_rank = crate::samples_per_rank(remaining, world, config.remainder);
                (units, per_rank)
            }
        };
        let batch_plan = BatchPlan::new(samples, self.batch_size, self.last_batch);
        Ok((
            first_samples(units, batch_plan.samples),
            batch_plan,
            batch_plan,
        ))
    }

    /// How each rank's rest of `epoch` after `resumed`, in a world of `world`, falls into
    /// batches: its current segment and, for a mixture drawn in rounds, the rounds after it.
    pub fn rest_plan(
        &self,
        epoch: u64,
        resumed: &[Segment],
        world: u32,
    ) -> Result<BatchPlan, PlanError> {
        let samples = match &self.mixture {
            Some(m) => m.span(epoch, resumed, world, &self.ctx())?.1,
            None => return Ok(self.segment(epoch, resumed, world, 0)?.1),
        };
        Ok(BatchPlan::new(samples, self.batch_size, self.last_batch))
    }

    /// The segments after `resumed` once every rank of `world` has taken the round they lead
    /// to whole (a mixture's round, with rounds after it where [`Self::segment_and_rest`]'s
    /// rest holds more samples than the segment): `resumed` and that round, with
    /// the weights it was drawn by.
    pub fn after_round(
        &self,
        epoch: u64,
        resumed: &[Segment],
        world: u32,
    ) -> Result<Vec<Segment>, PlanError> {
        let samples = match &self.mixture {
            Some(m) => m.span(epoch, resumed, world, &self.ctx())?.0,
            None => self.segment(epoch, resumed, world, 0)?.1.samples,
        };
        let plan = BatchPlan::new(samples, self.batch_size, self.last_batch);
        let step = self.epoch_step(epoch)?;
        let mut out = resumed.to_vec();
        out.push(Segment {
            world_size: world,
            batches: plan.batches,
            weights: self.segment_weights(step, resumed, world, samples),
        });
        Ok(out)
    }

    /// The delivery order of `units` (rank `rank`'s plan for `epoch` after the segments
    /// `resumed`: earlier worlds, or a mixture's earlier rounds).
    pub fn sequence(
        &self,
        units: &[WorkUnit],
        epoch: u64,
        resumed: &[Segment],
        rank: u32,
    ) -> Result<Sequence, PlanError> {
        if let Some(m) = &self.mixture {
            return m.sequence(units, epoch, resumed, rank, &self.ctx());
        }
        let seed = crate::segment_seed(self.config.seed, resumed.len() as u32);
        Sequence::new(units, self.mixing, seed, epoch, rank)
    }

    /// The positions of `sequence` handed out in its first `batches` batches.
    pub fn delivered(&self, sequence: &Sequence, batches: u64) -> u64 {
        (batches * self.batch_size).min(sequence.len())
    }

    /// What a world of `last.world_size` ranks (after the segments `earlier`) had not handed
    /// out when each of its ranks had taken `last.batches` batches: rank by rank, each rank's
    /// unseen samples grouped by unit.
    pub fn rest(
        &self,
        epoch: u64,
        earlier: &[Segment],
        last: &Segment,
    ) -> Result<Vec<Piece>, PlanError> {
        let mut rest = Vec::new();
        for q in 0..last.world_size {
            let (units, _) = self.segment(epoch, earlier, last.world_size, q)?;
            let sequence = self.sequence(&units, epoch, earlier, q)?;
            let done = self.delivered(&sequence, last.batches);
            rest.extend(remaining_pieces(&units, &sequence, done));
        }
        Ok(rest)
    }
}

/// The first `samples` samples of `units`, ids renumbered in order.
pub fn first_samples(units: Vec<WorkUnit>, samples: u64) -> Vec<WorkUnit> {
    let mut left = samples;
    let mut out = Vec::with_capacity(units.len());
    for mut u in units {
        if left == 0 {
            break;
        }
        if u.len() > left {
            u.end = u.start + left;
        }
        left -= u.len();
        u.id = out.len() as u32;
        out.push(u);
    }
    out
}

/// The samples at positions `done..` of `sequence`, as pieces: per unit (in unit order),
/// runs of consecutive indexes.
pub fn remaining_pieces(units: &[WorkUnit], sequence: &Sequence, done: u64) -> Vec<Piece> {
    remaining_by_group(units, sequence, done)
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

#[cfg(test)]
mod tests;
