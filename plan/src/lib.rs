//! Epoch planning: which samples each rank reads in an epoch, in which work units, in which
//! order. Pure functions of (manifest, seed, epoch, rank, world size, policy): every rank
//! computes its own plan with no coordinator, and a restarted job computes the same plan.
//!
//! The planner works on sample counts only (it never opens a shard):
//! 1. Shards are laid end to end in a seeded order (a new order every epoch for `global`; a
//!    fixed one for `local` and `partial:Q`; manifest order for `none`) and the line of
//!    samples is cut into `world_size`
//!    runs of equal length (±1). Shards that straddle a cut are split into sample ranges, so
//!    uneven shard sizes still give balanced ranks.
//! 2. `partial:Q` then exchanges a fraction Q of every rank's samples with other ranks (a new
//!    seeded choice each epoch, always from the fixed assignment; see [`assign`]).
//! 3. The ±1 remainder is settled by the [`Remainder`] policy: `drop` removes one seeded
//!    sample from each longer rank, `pad` repeats one seeded sample on each shorter rank
//!    (marked as padding). Every rank ends with exactly [`samples_per_rank`] samples. Under
//!    `none` nothing is drawn: `drop` removes each longer rank's last sample, `pad` repeats
//!    each shorter rank's first one.
//! 4. Each rank's ranges are cut into work units of at most `max_unit_samples` and put in a
//!    seeded order (in manifest order under `none`).
//! 5. [`order::Sequence`] interleaves a window of those units and runs the result through a
//!    seeded shuffle buffer: the order samples are delivered in, as a pure function.
//!
//! All randomness comes from [`rng`], keyed by the job seed and the choice's coordinates.

pub mod assign;
pub mod mixture;
pub mod order;
pub mod resume;
pub mod rng;
pub mod schedule;
pub mod shuffle;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sluice_shard::Manifest;

pub use mixture::{MixBase, Mixture, SourceState};
pub use order::{Mixing, Sequence};
pub use resume::{BatchPlan, EpochPlanner, LastBatch, Segment};
pub use rng::sample_seed;
pub use schedule::{Interpolate, Schedule, SchedulePoint, ScheduleSpec};
pub use shuffle::ShuffleBuffer;

/// How shards move between ranks from one epoch to the next.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum ShufflePolicy {
    /// A new shard order every epoch, split across ranks: each rank sees different shards.
    Global,
    /// Each rank keeps the same samples every epoch (node-local caches hit), in a new order.
    Local,
    /// Like `Local`, but each epoch a fraction Q of every rank's samples comes from other
    /// ranks (partial local shuffling; Q of 0.1–0.3 matches global shuffling accuracy): a
    /// new seeded Q of its home samples is exchanged every epoch.
    Partial(f64),
    /// No shuffling, for evaluation: the shards in manifest order are cut into one contiguous
    /// run per rank (as `DistributedSampler(shuffle=False)` shares a dataset, but in runs, so
    /// reads stay sequential), and units and samples keep that order. The same plan for every
    /// epoch and seed. Spelled `none`.
    Sequential,
}

impl ShufflePolicy {
    /// Whether the plan is drawn at all (everything but `none`).
    pub fn shuffles(&self) -> bool {
        !matches!(self, ShufflePolicy::Sequential)
    }
}

impl fmt::Display for ShufflePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShufflePolicy::Global => f.write_str("global"),
            ShufflePolicy::Local => f.write_str("local"),
            ShufflePolicy::Partial(q) => write!(f, "partial:{q}"),
            ShufflePolicy::Sequential => f.write_str("none"),
        }
    }
}

impl FromStr for ShufflePolicy {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self, PlanError> {
        let bad = || PlanError::Policy(s.to_string());
        match s {
            "global" => Ok(ShufflePolicy::Global),
            "local" => Ok(ShufflePolicy::Local),
            "none" => Ok(ShufflePolicy::Sequential),
            _ => {
                let q: f64 = s
                    .strip_prefix("partial:")
                    .ok_or_else(bad)?
                    .parse()
                    .map_err(|_| bad())?;
                if (0.0..=1.0).contains(&q) {
                    Ok(ShufflePolicy::Partial(q))
                } else {
                    Err(bad())
                }
            }
        }
    }
}

/// What happens to the samples left over when the dataset does not divide by the world size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Remainder {
    /// Each epoch, drop up to `world_size - 1` samples (different ones each epoch).
    #[default]
    Drop,
    /// Each epoch, repeat up to `world_size - 1` samples, marked as padding.
    Pad,
}

impl FromStr for Remainder {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self, PlanError> {
        match s {
            "drop" => Ok(Remainder::Drop),
            "pad" => Ok(Remainder::Pad),
            _ => Err(PlanError::Remainder(s.to_string())),
        }
    }
}

/// The job-wide inputs of a plan (everything but the epoch and the rank).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanConfig {
    pub seed: u64,
    pub world_size: u32,
    pub policy: ShufflePolicy,
    pub remainder: Remainder,
    /// Largest work unit, in samples: smaller units spread a rank's work over more workers
    /// and lose less on a worker failure; larger ones mean fewer, longer sequential reads.
    pub max_unit_samples: u64,
}

impl PlanConfig {
    pub fn new(seed: u64, world_size: u32, policy: ShufflePolicy) -> Self {
        PlanConfig {
            seed,
            world_size,
            policy,
            remainder: Remainder::Drop,
            max_unit_samples: 64,
        }
    }
}

/// A range of samples of one shard: the unit a CPU worker is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkUnit {
    /// Position in this rank's plan for the epoch.
    pub id: u32,
    /// Index of the shard in the manifest.
    pub shard: u32,
    /// First sample index in the shard.
    pub start: u64,
    /// One past the last sample index.
    pub end: u64,
    /// The unit repeats a sample to even out ranks (remainder policy `pad`).
    pub padding: bool,
    /// A mixture's draw group (one source's samples of one pass, see [`mixture`]) the unit
    /// belongs to; 0 for a single dataset.
    #[serde(default)]
    pub group: u32,
}

impl WorkUnit {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// Why a plan cannot be made.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("world_size must be at least 1")]
    NoRanks,
    #[error("rank {rank} is outside world_size {world_size}")]
    RankOutOfRange { rank: u32, world_size: u32 },
    #[error("the dataset has no samples")]
    EmptyDataset,
    #[error("the dataset has {samples} samples, fewer than the {world_size} ranks: with remainder policy \"drop\" every rank would get none (use \"pad\" or fewer ranks)")]
    TooFewSamples { samples: u64, world_size: u32 },
    #[error("max_unit_samples must be at least 1")]
    NoUnitSize,
    #[error("shuffle policy {0:?} is not \"global\", \"local\", \"partial:Q\" with Q in [0, 1] or \"none\"")]
    Policy(String),
    #[error("remainder policy {0:?} is not \"drop\" or \"pad\"")]
    Remainder(String),
    #[error("work unit {at} does not carry id {at}: a sequence needs the plan's units in order")]
    UnitIds { at: u64 },
    #[error("mixture weights {0} are not one finite, non-negative weight per source, not all 0")]
    Weights(String),
    #[error("weight schedule: {0}")]
    Schedule(String),
    #[error("source {index} of the mixture has no samples")]
    EmptySource { index: usize },
    #[error("a mixture's sources are known from epoch {known} on (its checkpoint's), not at epoch {epoch}")]
    MixtureEpoch { epoch: u64, known: u64 },
    #[error(
        "a rank of {samples} samples in one epoch is more than the planner orders (4294967294)"
    )]
    RankTooLarge { samples: u64 },
}

/// The number of samples every rank receives per epoch.
pub fn samples_per_rank(total: u64, world_size: u32, remainder: Remainder) -> u64 {
    let w = u64::from(world_size.max(1));
    match remainder {
        Remainder::Drop => total / w,
        Remainder::Pad => total.div_ceil(w),
    }
}

/// The work units of `rank` in `epoch`, in the order the rank should consume them.
pub fn plan(
    manifest: &Manifest,
    config: &PlanConfig,
    epoch: u64,
    rank: u32,
) -> Result<Vec<WorkUnit>, PlanError> {
    let counts: Vec<u64> = manifest.shards.iter().map(|s| s.samples).collect();
    plan_counts(&counts, config, epoch, rank)
}

/// [`plan`] over bare per-shard sample counts.
pub fn plan_counts(
    counts: &[u64],
    config: &PlanConfig,
    epoch: u64,
    rank: u32,
) -> Result<Vec<WorkUnit>, PlanError> {
    check(counts, config, rank)?;
    let pieces = assign::rank_pieces(counts, config, epoch, rank);
    let pieces = assign::settle_remainder(pieces, counts, config, epoch, rank);
    Ok(assign::into_units(pieces, config, epoch, rank))
}

/// Rank `rank`'s units for the rest of an epoch that an earlier world left unfinished.
///
/// `rest` is every sample the earlier world had not delivered, as pieces in a fixed order
/// (each earlier rank's remaining samples, rank by rank, grouped by unit into index ranges).
/// The line is cut into `config.world_size` equal runs, the remainder settled by
/// `config.remainder` (drop: up to `world_size − 1` of the rest are not delivered this epoch;
/// pad: repeats marked as padding), and each run cut into units in a seeded order. `depth`
/// (1 for the first resume of the epoch, 2 for a resume of that, …) keeps the draws of
/// successive resumes apart.
pub fn resume_plan(
    rest: Vec<assign::Piece>,
    counts: &[u64],
    config: &PlanConfig,
    epoch: u64,
    rank: u32,
    depth: u32,
) -> Result<Vec<WorkUnit>, PlanError> {
    check_world(config, rank)?;
    let remaining = assign::total(&rest);
    let target = samples_per_rank(remaining, config.world_size, config.remainder);
    let mut runs = assign::cut_pieces(rest, config.world_size);
    let mine = std::mem::take(&mut runs[rank as usize]);
    if !config.policy.shuffles() {
        let pieces = assign::settle_in_order(mine, target, counts, config.remainder);
        return Ok(assign::cut_units(pieces, config.max_unit_samples));
    }
    let key = (u64::from(depth) << 32) | u64::from(rank);
    let settle = rng::stream(config.seed, rng::Domain::Resume, epoch, key);
    let pieces = assign::settle_to(mine, target, counts, config.remainder, settle);
    let order = rng::stream(config.seed, rng::Domain::Resume, epoch, key ^ (1 << 63));
    Ok(assign::into_units_with(
        pieces,
        config.max_unit_samples,
        order,
    ))
}

/// The seed of the delivery order of an epoch's `depth`-th resumed segment (0: the epoch as
/// planned), so a resumed segment does not replay the draws of the one before.
pub fn segment_seed(seed: u64, depth: u32) -> u64 {
    if depth == 0 {
        seed
    } else {
        rng::stream(seed, rng::Domain::Resume, u64::from(depth), u64::MAX).next_u64()
    }
}

/// The checks every plan needs: a world, a rank in it, a unit size.
fn check_world(config: &PlanConfig, rank: u32) -> Result<(), PlanError> {
    if config.world_size == 0 {
        return Err(PlanError::NoRanks);
    }
    if rank >= config.world_size {
        return Err(PlanError::RankOutOfRange {
            rank,
            world_size: config.world_size,
        });
    }
    if config.max_unit_samples == 0 {
        return Err(PlanError::NoUnitSize);
    }
    Ok(())
}

/// Checks that `config` can plan `counts` for `rank` (world size, rank, unit size, policy,
/// enough samples for every rank), in time linear in the shard count and before any per-rank
/// work: what a loader checks when it is built.
pub fn validate(counts: &[u64], config: &PlanConfig, rank: u32) -> Result<(), PlanError> {
    check(counts, config, rank)
}

fn check(counts: &[u64], config: &PlanConfig, rank: u32) -> Result<(), PlanError> {
    check_world(config, rank)?;
    if let ShufflePolicy::Partial(q) = config.policy {
        if !(0.0..=1.0).contains(&q) {
            return Err(PlanError::Policy(config.policy.to_string()));
        }
    }
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return Err(PlanError::EmptyDataset);
    }
    if config.remainder == Remainder::Drop && total < u64::from(config.world_size) {
        return Err(PlanError::TooFewSamples {
            samples: total,
            world_size: config.world_size,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
