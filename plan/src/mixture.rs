//! Mixtures: a dataset made of several sources (manifests) drawn by weight.
//!
//! **Each source is an endless line of passes.** Pass `p` of a source is its shards in a
//! seeded order for `(seed, source, p)` (manifest order under `none`), laid end to end. A
//! source's [`SourceState`] says where its line stands: `cursor` (the next position of the
//! line) and `returned`, samples drawn earlier but not delivered, which the source hands out
//! first, oldest pass first. So within a source every sample is delivered once per pass, and
//! a source that runs out starts its next pass: a small source is upsampled by its weight.
//!
//! **An epoch of a mixture** has `L` samples: `epoch_samples` if given, else the sum of the
//! sources' samples; `L` is rounded to a multiple of the world size (down under remainder
//! `drop`, up under `pad`; to whole batches of every rank under `drop_last`), so nothing is
//! dropped or padded: a mixture never skips or repeats a sample to even out ranks. Source
//! `s` gets `n_s` of the `L` samples (its weight's share, largest remainder), taken from its
//! line. Each (source, pass) drawn is a *group*; every group is cut across the ranks (a
//! rotating start keeps the ranks' totals equal), and each rank's part of a group into
//! units in a seeded order.
//!
//! **Order.** A rank's sequence merges its sources by their counts (source `s`'s `j`-th
//! sample lands at about `(j + ½) × T / c_s`), so the proportions hold within every window of
//! a few samples, not only over the epoch; within a source, groups come pass by pass, each
//! mixed like a single dataset's plan (a window of units and a shuffle buffer, both scaled
//! to the source's share).
//!
//! **Resumes and new weights.** A checkpoint resumed at another world size or with other
//! weights starts a new segment of the epoch ([`crate::Segment`], carrying its weights): the
//! old segment's undelivered samples go back to their sources, the rest of the epoch (as
//! many samples as were left, rounded for the new world) is apportioned by the new weights,
//! and each source draws again from what it got back, then its line. Each source's pass thus
//! goes on where it was: nothing delivered in the pass comes again before the pass ends, and
//! nothing is skipped. The epoch keeps its length; only its proportions change.
//!
//! **Rounds.** A segment of more than [`Mixture::round_samples`] samples a rank is drawn a
//! round at a time: its first round (that many a rank, whole batches) is drawn as above,
//! and once every rank has taken it the rest of the segment is the next segment, in the same
//! world and by the same weights, with nothing handed back. So a plan holds one round,
//! whatever `epoch_samples` is: memory and the time to a first batch do not grow with the
//! epoch. A round's draw leaves each source where the next round's starts, so passes run on
//! across rounds as across segments; a segment of one round is planned as it always was.
//!
//! Everything here is integer arithmetic on counts (weights are parts per billion), so every
//! rank computes the same plan.

mod walk;

use serde::{Deserialize, Serialize};

use crate::assign::{self, Piece};
use crate::order::{interleave, slots};
use crate::rng::{stream, Domain};
use crate::schedule::Schedule;
pub use crate::schedule::{scale_weights, WEIGHT_SCALE};
use crate::{
    LastBatch, Mixing, PlanConfig, PlanError, Remainder, Segment, Sequence, ShufflePolicy, WorkUnit,
};

/// Samples of one shard drawn in one pass of its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drawn {
    pub pass: u64,
    pub shard: u32,
    pub start: u64,
    pub end: u64,
}

impl Drawn {
    fn len(&self) -> u64 {
        self.end - self.start
    }
}

/// Where one source's line stands (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceState {
    /// Samples of the line drawn so far (pass `cursor / samples`, at `cursor % samples`).
    pub cursor: u64,
    /// Samples drawn before but not delivered, handed out first, oldest pass first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub returned: Vec<Drawn>,
}

/// The sources' states at the start of `epoch`, and the segments that epoch already had
/// (a checkpoint's), from which later epochs' states follow.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MixBase {
    pub epoch: u64,
    pub state: Vec<SourceState>,
    pub resumed: Vec<Segment>,
    /// The training step at which `epoch` starts (a weight schedule's clock).
    #[serde(default)]
    pub step: u64,
}

/// A dataset of several sources, as the planner sees it: the combined manifest lists each
/// source's shards in turn.
#[derive(Clone, Debug, PartialEq)]
pub struct Mixture {
    /// Shards of each source, in the combined manifest's order.
    pub shards: Vec<u32>,
    /// Each source's weight for the segment being planned, in parts of [`WEIGHT_SCALE`].
    pub weights: Vec<u64>,
    /// Samples in an epoch (before rounding to the world); `None`: all sources' samples.
    pub epoch_samples: Option<u64>,
    pub base: MixBase,
    /// Weights by step, in place of `weights` (see [`crate::schedule`]).
    pub schedule: Option<Schedule>,
    /// Samples each rank draws at most at once (see "Rounds" above), before rounding down
    /// to whole batches (at least one).
    pub round_samples: u64,
}

/// The default of [`Mixture::round_samples`]: a round's plan takes about 40 MB a rank.
pub const DEFAULT_ROUND_SAMPLES: u64 = 1 << 20;

/// The weights a segment is drawn by: fixed (a checkpoint's, or a mixture without a
/// schedule), or its schedule's, summed over the steps the segment spans from the epoch's
/// first step `epoch_start`.
#[derive(Clone, Copy, Debug)]
enum SegmentWeights<'a> {
    Fixed(&'a [u64]),
    Scheduled { epoch_start: u64 },
}

/// `total` split by `weights` (largest remainder; ties to the earlier source).
pub fn apportion(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<(u64, u128)> = weights
        .iter()
        .map(|&w| {
            let x = u128::from(total) * u128::from(w);
            ((x / sum) as u64, x % sum)
        })
        .collect();
    let mut out: Vec<u64> = exact.iter().map(|e| e.0).collect();
    let short = total - out.iter().sum::<u64>();
    let mut by_rest: Vec<usize> = (0..weights.len()).collect();
    by_rest.sort_by(|&a, &b| exact[b].1.cmp(&exact[a].1).then(a.cmp(&b)));
    for &s in by_rest.iter().take(short as usize) {
        out[s] += 1;
    }
    out
}

/// What a source hands out of `n` samples: first from `front` (oldest pass first), then
/// from its line at `cursor`. Returns what it drew of `front`, in pass order, and its state
/// after (its line drawn up to the new `cursor`).
fn take_front(mut front: Vec<Drawn>, cursor: u64, n: u64) -> (Vec<Drawn>, SourceState) {
    front.sort_by_key(|d| d.pass);
    let mut drawn = Vec::new();
    let mut left = n;
    let mut returned = Vec::new();
    for d in front {
        if left == 0 {
            returned.push(d);
        } else if d.len() <= left {
            left -= d.len();
            drawn.push(d);
        } else {
            let cut = d.start + left;
            drawn.push(Drawn { end: cut, ..d });
            returned.push(Drawn { start: cut, ..d });
            left = 0;
        }
    }
    let after = SourceState {
        cursor: cursor + left,
        returned,
    };
    (drawn, after)
}

/// The batches each rank took in the segments `resumed`.
fn batches_of(resumed: &[Segment]) -> u64 {
    resumed.iter().map(|s| s.batches).sum()
}

/// `left` brought to `total` samples: the difference taken from (or added to) the sources
/// by `weights`, never taking a source below 0.
fn settle(left: &[u64], total: u64, weights: &[u64]) -> Vec<u64> {
    let have: u64 = left.iter().sum();
    if total >= have {
        let more = apportion(total - have, weights);
        return left.iter().zip(more).map(|(a, b)| a + b).collect();
    }
    let mut out = left.to_vec();
    let mut excess = have - total;
    while excess > 0 {
        let fewer = apportion(excess, weights);
        let mut cut = 0;
        for (o, f) in out.iter_mut().zip(fewer) {
            let c = f.min(*o);
            *o -= c;
            cut += c;
        }
        if cut == 0 {
            // What is left lies in sources of weight 0: take it from the largest.
            if let Some(o) = out.iter_mut().max() {
                let c = excess.min(*o);
                *o -= c;
                cut = c;
            }
        }
        excess -= cut;
    }
    out
}

/// One source's samples of one pass, in a segment's draw.
#[derive(Clone, Debug, PartialEq)]
struct Group {
    source: usize,
    pass: u64,
    pieces: Vec<Piece>,
}

/// A segment's draw: its groups in (source, pass) order and the sources' states after it.
#[derive(Clone, Debug)]
struct Draw {
    groups: Vec<Group>,
    next: Vec<SourceState>,
}

/// The inputs of a mixture plan besides the mixture: the planner's own.
pub(crate) struct Ctx<'a> {
    pub counts: &'a [u64],
    pub config: &'a PlanConfig,
    pub mixing: Mixing,
    pub batch_size: u64,
    pub last_batch: LastBatch,
}

impl Mixture {
    /// The source shard `shard` (an index in the combined manifest) belongs to.
    pub fn source_of(&self, shard: u32) -> usize {
        let mut end = 0u32;
        for (s, &n) in self.shards.iter().enumerate() {
            end += n;
            if shard < end {
                return s;
            }
        }
        self.shards.len().saturating_sub(1)
    }

    /// The first shard of each source in the combined manifest, one extra at the end.
    fn offsets(&self) -> Vec<u32> {
        let mut out = vec![0u32];
        for &n in &self.shards {
            out.push(out[out.len() - 1] + n);
        }
        out
    }

    /// Samples per pass of each source.
    pub fn source_samples(&self, counts: &[u64]) -> Vec<u64> {
        let off = self.offsets();
        (0..self.shards.len())
            .map(|s| counts[off[s] as usize..off[s + 1] as usize].iter().sum())
            .collect()
    }

    /// The checks a mixture needs beyond a single dataset's.
    pub fn validate(&self, counts: &[u64], config: &PlanConfig) -> Result<(), PlanError> {
        if self.shards.len() != self.weights.len() || self.shards.is_empty() {
            return Err(PlanError::Weights(format!(
                "{} weights for {} sources",
                self.weights.len(),
                self.shards.len()
            )));
        }
        if self.shards.iter().map(|&n| n as usize).sum::<usize>() != counts.len() {
            return Err(PlanError::Weights(format!(
                "the sources have {} shards in all, the dataset {}",
                self.shards.iter().sum::<u32>(),
                counts.len()
            )));
        }
        if let Some(s) = self.source_samples(counts).iter().position(|&n| n == 0) {
            return Err(PlanError::EmptySource { index: s });
        }
        if matches!(
            config.policy,
            ShufflePolicy::Local | ShufflePolicy::Partial(_)
        ) {
            return Err(PlanError::Policy(format!(
                "{} (a mixture is shuffled \"global\" or not at all, \"none\")",
                config.policy
            )));
        }
        Ok(())
    }

    /// An epoch's samples before rounding (`L`).
    pub fn epoch_length(&self, counts: &[u64]) -> u64 {
        self.epoch_samples
            .unwrap_or_else(|| self.source_samples(counts).iter().sum())
    }

    /// `samples` rounded so that `world` ranks get equal shares (and whole batches under
    /// `drop_last`): the samples a segment of a mixture delivers.
    pub(crate) fn rounded(samples: u64, world: u32, ctx: &Ctx) -> u64 {
        let w = u64::from(world.max(1));
        if ctx.last_batch == LastBatch::Drop {
            let step = w * ctx.batch_size.max(1);
            return samples / step * step;
        }
        match ctx.config.remainder {
            Remainder::Drop => samples / w * w,
            Remainder::Pad => samples.div_ceil(w) * w,
        }
    }

    /// Pass `pass` of source `s`: its shards (combined indexes) in the pass's order.
    fn pass_order(&self, s: usize, pass: u64, config: &PlanConfig) -> Vec<u32> {
        let off = self.offsets();
        let mut order: Vec<u32> = (off[s]..off[s + 1]).collect();
        if config.policy.shuffles() {
            stream(config.seed, Domain::MixPass, pass, s as u64).shuffle(&mut order);
        }
        order
    }

    /// Positions `from..to` of source `s`'s line, as drawn pieces in line order.
    fn line(&self, s: usize, from: u64, to: u64, per_pass: u64, ctx: &Ctx) -> Vec<Drawn> {
        let mut out = Vec::new();
        let mut at = from;
        while at < to {
            let pass = at / per_pass;
            let pass_end = ((pass + 1) * per_pass).min(to);
            let (lo, hi) = (at - pass * per_pass, pass_end - pass * per_pass);
            let mut offset = 0u64;
            for shard in self.pass_order(s, pass, ctx.config) {
                let n = ctx.counts[shard as usize];
                let (a, b) = (lo.max(offset), hi.min(offset + n));
                if a < b {
                    out.push(Drawn {
                        pass,
                        shard,
                        start: a - offset,
                        end: b - offset,
                    });
                }
                offset += n;
                if offset >= hi {
                    break;
                }
            }
            at = pass_end;
        }
        out
    }

    /// Source `s` hands out `n` samples: first from `front` (oldest pass first), then from
    /// its line. Returns what it drew, in pass order, and its state after.
    fn take(
        &self,
        s: usize,
        front: Vec<Drawn>,
        cursor: u64,
        n: u64,
        per_pass: u64,
        ctx: &Ctx,
    ) -> (Vec<Drawn>, SourceState) {
        let (mut drawn, after) = take_front(front, cursor, n);
        drawn.extend(self.line(s, cursor, after.cursor, per_pass, ctx));
        (drawn, after)
    }

    /// Draws `shares[s]` samples from each source, starting with `front[s]` (then its
    /// state's returned samples), then its line.
    fn draw(
        &self,
        state: &[SourceState],
        front: Vec<Vec<Drawn>>,
        shares: &[u64],
        ctx: &Ctx,
    ) -> Draw {
        let per_pass = self.source_samples(ctx.counts);
        let mut groups = Vec::new();
        let mut next = Vec::with_capacity(state.len());
        for (s, mut first) in front.into_iter().enumerate() {
            first.extend(state[s].returned.iter().copied());
            let (drawn, after) = self.take(s, first, state[s].cursor, shares[s], per_pass[s], ctx);
            for d in drawn {
                let piece = Piece {
                    shard: d.shard,
                    start: d.start,
                    end: d.end,
                    padding: false,
                };
                match groups.last_mut() {
                    Some(Group {
                        source,
                        pass,
                        pieces,
                    }) if *source == s && *pass == d.pass => pieces.push(piece),
                    _ => groups.push(Group {
                        source: s,
                        pass: d.pass,
                        pieces: vec![piece],
                    }),
                }
            }
            next.push(after);
        }
        Draw { groups, next }
    }

    /// The training step at which `epoch` starts: the base's, then each epoch's batches as
    /// its ranks take them (the base epoch's earlier segments' and its last segment's at the
    /// planner's world size).
    pub(crate) fn epoch_step(&self, epoch: u64, ctx: &Ctx) -> Result<u64, PlanError> {
        Ok(self.start_of(epoch, ctx)?.1)
    }

    /// Batches each rank takes of a segment of `samples` (already rounded for `world`).
    fn rank_batches(samples: u64, world: u32, ctx: &Ctx) -> u64 {
        (samples / u64::from(world.max(1))).div_ceil(ctx.batch_size.max(1))
    }

    /// The weights `weights` give a segment of `samples` samples in a world of `world` that
    /// starts `before` batches into its epoch (its earlier segments').
    fn resolve(
        &self,
        weights: SegmentWeights<'_>,
        samples: u64,
        world: u32,
        before: u64,
        ctx: &Ctx,
    ) -> Vec<u64> {
        match (weights, &self.schedule) {
            (SegmentWeights::Fixed(w), _) => w.to_vec(),
            (SegmentWeights::Scheduled { epoch_start }, Some(schedule)) => {
                // Each step weighs as many samples as a rank takes in it (the last, short
                // step fewer), as the merge places them.
                let start = epoch_start + before;
                let per_rank = samples / u64::from(world.max(1));
                let batch = ctx.batch_size.max(1);
                let (full, rest) = (per_rank / batch, per_rank % batch);
                let last = schedule.at(start + full);
                schedule
                    .integrated(start, full)
                    .into_iter()
                    .zip(last)
                    .map(|(w, l)| w.saturating_mul(batch).saturating_add(l * rest))
                    .collect()
            }
            (SegmentWeights::Scheduled { .. }, None) => self.weights.clone(),
        }
    }

    /// The weights of the current segment after `resumed` of an epoch that starts at step
    /// `epoch_start`, in a world of `world` whose ranks take `samples` each: the mixture's, or
    /// its schedule's over the steps the segment spans.
    pub(crate) fn segment_weights(
        &self,
        epoch_start: u64,
        resumed: &[Segment],
        world: u32,
        samples: u64,
        ctx: &Ctx,
    ) -> Vec<u64> {
        let weights = SegmentWeights::Scheduled { epoch_start };
        let total = samples * u64::from(world.max(1));
        self.resolve(weights, total, world, batches_of(resumed), ctx)
    }

    /// The sources' states and the training step at the start of `epoch`: the base's, carried
    /// through the base epoch's segments and every whole epoch after it (at the planner's
    /// world size and the current weights).
    pub(crate) fn start_of(
        &self,
        epoch: u64,
        ctx: &Ctx,
    ) -> Result<(Vec<SourceState>, u64), PlanError> {
        let base = &self.base;
        if epoch < base.epoch {
            return Err(PlanError::MixtureEpoch {
                epoch,
                known: base.epoch,
            });
        }
        let state = match base.state.len() == self.shards.len() {
            true => base.state.clone(),
            false => vec![SourceState::default(); self.shards.len()],
        };
        if epoch == base.epoch {
            return Ok((state, base.step));
        }
        let world = ctx.config.world_size;
        let ours = SegmentWeights::Scheduled {
            epoch_start: base.step,
        };
        let seg = self.walk(base.epoch, &state, &base.resumed, world, ours, ctx)?;
        let step = base.step + batches_of(&base.resumed);
        let resumed = base.resumed.clone();
        let (mut state, mut step) = self.finish(base.epoch, seg, resumed, ours, step, ctx)?;
        for e in base.epoch + 1..epoch {
            let weights = SegmentWeights::Scheduled { epoch_start: step };
            let seg = self.opening(&state, world, weights, ctx);
            (state, step) = self.finish(e, seg, Vec::new(), weights, step, ctx)?;
        }
        Ok((state, step))
    }

    /// Rank `rank`'s units of a draw in a world of `world` ranks: each group cut across the
    /// ranks (the extra samples of uneven groups go to the ranks in turn), each rank's part
    /// cut into units in a seeded order, groups in (source, pass) order.
    fn rank_units(
        &self,
        draw: &Draw,
        epoch: u64,
        depth: u32,
        world: u32,
        rank: u32,
        ctx: &Ctx,
    ) -> Vec<WorkUnit> {
        let w = u64::from(world.max(1));
        let mut turn = 0u64;
        let mut units = Vec::new();
        for (g, group) in draw.groups.iter().enumerate() {
            let n = assign::total(&group.pieces);
            let (base, extra) = (n / w, n % w);
            let gets = |r: u64| base + u64::from((r + w - turn) % w < extra);
            let skip: u64 = (0..u64::from(rank)).map(gets).sum();
            let (_, tail) = assign::split_off_samples(group.pieces.clone(), skip);
            let (mine, _) = assign::split_off_samples(tail, gets(u64::from(rank)));
            turn = (turn + extra) % w;
            let mut part = assign::cut_units(mine, ctx.config.max_unit_samples);
            if ctx.config.policy.shuffles() {
                let key = (u64::from(depth) << 48) | (u64::from(rank) << 24) | g as u64;
                stream(ctx.config.seed, Domain::MixUnits, epoch, key).shuffle(&mut part);
            }
            units.extend(part.into_iter().map(|u| WorkUnit {
                group: g as u32,
                ..u
            }));
        }
        for (i, u) in units.iter_mut().enumerate() {
            u.id = i as u32;
        }
        units
    }

    /// Rank `rank`'s units for `epoch` after the segments `resumed`, in a world of `world`
    /// ranks drawing by the mixture's current weights (one round of them), and the samples
    /// each rank gets of that round and of the rest of the epoch (see [`Self::span`]).
    pub(crate) fn segment(
        &self,
        epoch: u64,
        resumed: &[Segment],
        world: u32,
        rank: u32,
        ctx: &Ctx,
    ) -> Result<(Vec<WorkUnit>, (u64, u64)), PlanError> {
        let seg = self.current(epoch, resumed, world, ctx)?;
        let draw = self.materialize(&seg, ctx);
        let depth = resumed.len() as u32;
        let units = self.rank_units(&draw, epoch, depth, world, rank, ctx);
        let w = u64::from(world.max(1));
        Ok((units, (seg.drawn() / w, seg.total / w)))
    }

    /// The samples each rank takes of the segment after `resumed` (its round), and of the
    /// rest of the epoch (that round and the rounds after it).
    pub(crate) fn span(
        &self,
        epoch: u64,
        resumed: &[Segment],
        world: u32,
        ctx: &Ctx,
    ) -> Result<(u64, u64), PlanError> {
        let seg = self.current(epoch, resumed, world, ctx)?;
        let w = u64::from(world.max(1));
        Ok((seg.drawn() / w, seg.total / w))
    }

    /// The segment after `resumed` of `epoch` in a world of `world`, drawn by the mixture's
    /// current weights.
    fn current(
        &self,
        epoch: u64,
        resumed: &[Segment],
        world: u32,
        ctx: &Ctx,
    ) -> Result<walk::Seg, PlanError> {
        let (start, epoch_start) = self.start_of(epoch, ctx)?;
        let weights = SegmentWeights::Scheduled { epoch_start };
        self.walk(epoch, &start, resumed, world, weights, ctx)
    }

    /// The delivery order of a rank's mixture units (see the module documentation).
    pub(crate) fn sequence(
        &self,
        units: &[WorkUnit],
        epoch: u64,
        resumed: &[Segment],
        rank: u32,
        ctx: &Ctx,
    ) -> Result<Sequence, PlanError> {
        let depth = resumed.len() as u32;
        let base = slots(units)?;
        let seed = crate::segment_seed(ctx.config.seed, depth);
        let total = base[units.len()];
        // Per source, its groups' unit ranges in (pass) order.
        let mut ranges: Vec<Vec<(u32, std::ops::Range<usize>)>> =
            vec![Vec::new(); self.shards.len()];
        let mut i = 0;
        while i < units.len() {
            let g = units[i].group;
            let j = i + units[i..].iter().take_while(|u| u.group == g).count();
            ranges[self.source_of(units[i].shard)].push((g, i..j));
            i = j;
        }
        let mut per_source: Vec<Vec<u32>> = Vec::with_capacity(ranges.len());
        for groups in &ranges {
            let count: u64 = groups
                .iter()
                .map(|(_, r)| base[r.end] - base[r.start])
                .sum();
            let scaled = |x: u32| (u64::from(x) * count).div_ceil(total.max(1)) as u32;
            let mixing = Mixing {
                window_units: scaled(ctx.mixing.window_units).max(1),
                buffer_samples: scaled(ctx.mixing.buffer_samples),
            };
            let mut order = Vec::with_capacity(count as usize);
            for (g, r) in groups {
                let key = (u64::from(rank) << 32) | u64::from(*g);
                let pick = stream(seed, Domain::MixInterleave, epoch, key);
                let buffer = stream(seed, Domain::MixGroupBuffer, epoch, key);
                order.extend(interleave(units, &base, r.clone(), mixing, pick, buffer));
            }
            per_source.push(order);
        }
        let order = match &self.schedule {
            None => merge(per_source),
            Some(schedule) => {
                let before = batches_of(resumed);
                let start = self.epoch_step(epoch, ctx)? + before;
                merge_scheduled(per_source, start, ctx.batch_size, schedule)
            }
        };
        Ok(Sequence::from_order(units, base, order))
    }
}

/// Checks a mixture's promise about passes from outside, on what was delivered: `steps` holds
/// each step's samples (batch `b` of every rank) as (source, sample), `sizes` each source's
/// samples. Per source, the `k+1`-th delivery of any sample comes no earlier than one step
/// before the last `k`-th delivery of any other (nothing is delivered again before its pass
/// ends), and every sample was delivered ⌊T/N⌋ or ⌈T/N⌉ times (nothing skipped). Says what
/// broke, naming the source and steps.
pub fn check_passes<K: std::hash::Hash + Eq>(
    steps: &[Vec<(usize, K)>],
    sizes: &[u64],
) -> Result<(), String> {
    for (s, &size) in sizes.iter().enumerate() {
        let mut seen: std::collections::HashMap<&K, u64> = std::collections::HashMap::new();
        // Pass k: (the first step with a k-th delivery, the last one).
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for (t, step) in steps.iter().enumerate() {
            for (_, id) in step.iter().filter(|(source, _)| *source == s) {
                let k = seen.entry(id).or_insert(0);
                if spans.len() <= *k as usize {
                    spans.push((t, t));
                }
                spans[*k as usize].1 = t;
                *k += 1;
            }
        }
        if let Some(k) = (1..spans.len()).find(|&k| spans[k].0 + 1 < spans[k - 1].1) {
            return Err(format!(
                "source {s}: pass {k} began at step {} before pass {} ended at step {}",
                spans[k].0,
                k - 1,
                spans[k - 1].1
            ));
        }
        let total: u64 = seen.values().sum();
        let (lo, hi) = (total / size.max(1), total.div_ceil(size.max(1)));
        if lo > 0 && (seen.len() as u64) < size {
            let missing = size - seen.len() as u64;
            return Err(format!("source {s}: {missing} samples never delivered"));
        }
        if !seen.values().all(|&n| n == lo || n == hi) {
            return Err(format!(
                "source {s}: {total} deliveries of {size} samples, some outside {lo}..={hi}"
            ));
        }
    }
    Ok(())
}

/// Merges the sources' orders by the schedule's weight at each step: the rank's `t`-th
/// position is in step `start + t / batch`, and source `s`'s `j`-th item goes where its
/// weight summed from the start reaches `(j + ½) / c_s` of its sum over the sequence (ties to
/// the earlier source), so each batch holds the sources in the proportions of its own step,
/// and a source keeps its items' order. Weights all 0 for a source spread it evenly.
fn merge_scheduled(
    sources: Vec<Vec<u32>>,
    start: u64,
    batch: u64,
    schedule: &Schedule,
) -> Vec<u32> {
    let total: usize = sources.iter().map(Vec::len).sum();
    let batch = batch.max(1);
    let steps = (total as u64).div_ceil(batch);
    let weights: Vec<Vec<u64>> = (0..steps).map(|k| schedule.at(start + k)).collect();
    // Positions in step k.
    let width = |k: u64| (total as u64 - k * batch).min(batch) as f64;
    let mut due: Vec<(f64, usize, usize)> = Vec::with_capacity(total);
    for (s, items) in sources.iter().enumerate() {
        let c = items.len();
        let w = |k: u64| weights[k as usize].get(s).copied().unwrap_or(0) as f64;
        let sum: f64 = (0..steps).map(|k| w(k) * width(k)).sum();
        let (mut k, mut acc) = (0u64, 0.0f64);
        for j in 0..c {
            if sum <= 0.0 {
                due.push(((j as f64 + 0.5) * total as f64 / c as f64, s, j));
                continue;
            }
            let target = (j as f64 + 0.5) * sum / c as f64;
            while k + 1 < steps && acc + w(k) * width(k) < target {
                acc += w(k) * width(k);
                k += 1;
            }
            let into = match w(k) > 0.0 {
                true => ((target - acc) / w(k)).min(width(k)),
                false => 0.0,
            };
            due.push(((k * batch) as f64 + into, s, j));
        }
    }
    due.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    due.into_iter().map(|(_, s, j)| sources[s][j]).collect()
}

/// Merges the sources' orders by their counts: source `s`'s `j`-th item goes at about
/// `(j + ½) / c_s` of the way (ties to the earlier source), so every window holds each source
/// in proportion, ±1.
fn merge(sources: Vec<Vec<u32>>) -> Vec<u32> {
    let total: usize = sources.iter().map(Vec::len).sum();
    let mut next = vec![0usize; sources.len()];
    let mut out = Vec::with_capacity(total);
    for _ in 0..total {
        // The source whose next item is due first: the least (2j + 1) / c.
        let mut best: Option<usize> = None;
        for (s, items) in sources.iter().enumerate() {
            if next[s] == items.len() {
                continue;
            }
            let due = |s: usize| (2 * next[s] as u128 + 1, sources[s].len() as u128);
            best = match best {
                Some(b) => {
                    let ((a1, c1), (a2, c2)) = (due(s), due(b));
                    if a1 * c2 < a2 * c1 {
                        Some(s)
                    } else {
                        Some(b)
                    }
                }
                None => Some(s),
            };
        }
        let Some(s) = best else { break };
        out.push(sources[s][next[s]]);
        next[s] += 1;
    }
    out
}

#[cfg(test)]
mod tests;
