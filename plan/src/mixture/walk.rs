//! The segments of a mixture's epoch, walked from its start: each one's draw as a recipe
//! (the sources' states before it, what the segment before handed back, each source's
//! share), drawn only where its samples are needed, so a walk through many rounds costs
//! a few counts per round.

use super::{
    apportion, settle, take_front, Ctx, Draw, Drawn, Mixture, SegmentWeights, SourceState,
};
use crate::{PlanError, Segment};

/// One segment of an epoch as [`Mixture::walk`] finds it.
#[derive(Clone, Debug)]
pub(super) struct Seg {
    /// The sources' states before its draw.
    state: Vec<SourceState>,
    /// What the segment before handed back, per source, drawn first.
    front: Vec<Vec<Drawn>>,
    /// Each source's samples in its draw.
    shares: Vec<u64>,
    /// Samples it and the rounds after it deliver (rounded for its world); its draw holds
    /// one round of them.
    pub(super) total: u64,
    world: u32,
    /// The weights its draw was apportioned by (what its [`Segment`] records).
    weights: Vec<u64>,
}

impl Seg {
    /// Samples in its draw (one round).
    pub(super) fn drawn(&self) -> u64 {
        self.shares.iter().sum()
    }

    /// Rounds come after this one.
    fn rounds_left(&self) -> bool {
        self.total > self.drawn()
    }
}

impl Mixture {
    /// Samples a segment draws at once in a world of `world`: `round_samples` a rank, in
    /// whole batches (at least one).
    fn round(&self, world: u32, ctx: &Ctx) -> u64 {
        let batch = ctx.batch_size.max(1);
        let per_rank = (self.round_samples / batch).max(1).saturating_mul(batch);
        per_rank.saturating_mul(u64::from(world.max(1)))
    }

    /// The first segment of an epoch whose sources stand at `start`.
    pub(super) fn opening(
        &self,
        start: &[SourceState],
        world: u32,
        weights: SegmentWeights<'_>,
        ctx: &Ctx,
    ) -> Seg {
        let total = Self::rounded(self.epoch_length(ctx.counts), world, ctx);
        let drawn = total.min(self.round(world, ctx));
        let weights = self.resolve(weights, drawn, world, 0, ctx);
        Seg {
            state: start.to_vec(),
            front: vec![Vec::new(); self.shards.len()],
            shares: apportion(drawn, &weights),
            total,
            world,
            weights,
        }
    }

    /// The segment after `prev`, whose world took `last.batches` batches of it after the
    /// segments `earlier` (`last` records `prev`), in a world of `world` drawing by
    /// `weights`: what `prev`'s world had not delivered of its draw goes back to its sources,
    /// and the rest of the epoch (that, and the rounds `prev` had not drawn), rounded for the
    /// new world, is drawn again.
    fn following(
        &self,
        prev: Seg,
        epoch: u64,
        (earlier, last): (&[Segment], &Segment),
        world: u32,
        weights: SegmentWeights<'_>,
        ctx: &Ctx,
    ) -> Result<Seg, PlanError> {
        let per_rank = prev.drawn() / u64::from(prev.world.max(1));
        let done = last.batches.saturating_mul(ctx.batch_size).min(per_rank);
        let mut front: Vec<Vec<Drawn>> = vec![Vec::new(); self.shards.len()];
        let state = match done < per_rank {
            false => self.advance(&prev),
            true => {
                let draw = self.materialize(&prev, ctx);
                let depth = earlier.len() as u32;
                for q in 0..prev.world {
                    let units = self.rank_units(&draw, epoch, depth, prev.world, q, ctx);
                    let sequence = self.sequence(&units, epoch, earlier, q, ctx)?;
                    let done = done.min(sequence.len());
                    for (group, piece) in crate::order::remaining_by_group(&units, &sequence, done)
                    {
                        let g = &draw.groups[group as usize];
                        front[g.source].push(Drawn {
                            pass: g.pass,
                            shard: piece.shard,
                            start: piece.start,
                            end: piece.end,
                        });
                    }
                }
                draw.next
            }
        };
        let left: Vec<u64> = front
            .iter()
            .map(|f| f.iter().map(Drawn::len).sum())
            .collect();
        let undrawn = prev.total - prev.drawn();
        let total = Self::rounded(left.iter().sum::<u64>() + undrawn, world, ctx);
        let drawn = total.min(self.round(world, ctx));
        let before = super::batches_of(earlier) + last.batches;
        let weights = self.resolve(weights, drawn, world, before, ctx);
        let shares = match (drawn < total, weights == prev.weights) {
            (true, _) => apportion(drawn, &weights),
            // The same weights: each source delivers what it had left (and its share of the
            // rounds not drawn), the rounding for the new world shared by weight.
            (false, true) => {
                let carried: Vec<u64> = left
                    .iter()
                    .zip(apportion(undrawn, &prev.weights))
                    .map(|(a, b)| a + b)
                    .collect();
                settle(&carried, total, &weights)
            }
            (false, false) => apportion(total, &weights),
        };
        Ok(Seg {
            state,
            front,
            shares,
            total,
            world,
            weights,
        })
    }

    /// The segment after `resumed` of `epoch` (whose sources stand at `start`), in a world of
    /// `world` drawing by `weights`; each earlier segment drawn as it was (its world, the
    /// weights it recorded).
    pub(super) fn walk(
        &self,
        epoch: u64,
        start: &[SourceState],
        resumed: &[Segment],
        world: u32,
        weights: SegmentWeights<'_>,
        ctx: &Ctx,
    ) -> Result<Seg, PlanError> {
        // Older checkpoints recorded no weights: the mixture's then.
        let recorded = |s: &'_ Segment| -> Vec<u64> {
            match (s.weights.is_empty(), weights) {
                (false, _) => s.weights.clone(),
                (true, SegmentWeights::Fixed(w)) => w.to_vec(),
                (true, SegmentWeights::Scheduled { .. }) => self.weights.clone(),
            }
        };
        let mut seg = match resumed.first() {
            Some(s) => {
                let w = recorded(s);
                self.opening(start, s.world_size, SegmentWeights::Fixed(&w), ctx)
            }
            None => self.opening(start, world, weights, ctx),
        };
        for (i, last) in resumed.iter().enumerate() {
            let done = (&resumed[..i], last);
            seg = match resumed.get(i + 1) {
                Some(s) => {
                    let w = recorded(s);
                    let fixed = SegmentWeights::Fixed(&w);
                    self.following(seg, epoch, done, s.world_size, fixed, ctx)?
                }
                None => self.following(seg, epoch, done, world, weights, ctx)?,
            };
        }
        Ok(seg)
    }

    /// The sources' states at the end of `epoch`, whose segment `seg` (after `resumed`)
    /// starts at step `step`, once it and the rounds after it are drawn by `weights`; and
    /// the step the epoch after starts at.
    pub(super) fn finish(
        &self,
        epoch: u64,
        mut seg: Seg,
        mut resumed: Vec<Segment>,
        weights: SegmentWeights<'_>,
        step: u64,
        ctx: &Ctx,
    ) -> Result<(Vec<SourceState>, u64), PlanError> {
        let end = step + Self::rank_batches(seg.total, seg.world, ctx);
        while seg.rounds_left() {
            let world = seg.world;
            let last = Segment {
                world_size: world,
                batches: Self::rank_batches(seg.drawn(), world, ctx),
                weights: seg.weights.clone(),
            };
            seg = self.following(seg, epoch, (&resumed, &last), world, weights, ctx)?;
            resumed.push(last);
        }
        Ok((self.advance(&seg), end))
    }

    /// `seg`'s draw.
    pub(super) fn materialize(&self, seg: &Seg, ctx: &Ctx) -> Draw {
        self.draw(&seg.state, seg.front.clone(), &seg.shares, ctx)
    }

    /// The sources' states after `seg`'s draw, without drawing it.
    fn advance(&self, seg: &Seg) -> Vec<SourceState> {
        seg.state
            .iter()
            .zip(&seg.front)
            .zip(&seg.shares)
            .map(|((state, front), &n)| {
                let mut first = front.clone();
                first.extend(state.returned.iter().copied());
                take_front(first, state.cursor, n).1
            })
            .collect()
    }
}
