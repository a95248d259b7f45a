//! The planned epochs the client's simulations run (`crate::coordinator::simulation`,
//! `super::paired`): a seeded world of shards, units and a delivery order, the samples its
//! simulated workers send and reject, and the check of an epoch's batches against the plan.

use std::sync::Arc;
use std::time::Duration;

use sluice_plan::rng::{stream, Domain, Stream};
use sluice_plan::{Mixing, Sequence, WorkUnit};
use sluice_shard::{Checksum, Compression, Manifest, ShardInfo};
use sluice_wire::{Assign, SampleHeader, SampleShape, SkippedSample};

use crate::batch::{BatchPlan, LastBatch, ShortBatch};
use crate::config::{EpochSettings, LoaderConfig};
use crate::ledger::Ledger;
use crate::reorder::Reorder;

pub(crate) const SHAPE: SampleShape = SampleShape::image_u8(1, 1, 4);

/// The decoder rejects these samples, whichever worker decodes them.
pub(crate) fn bad(shard: u32, index: u64) -> bool {
    (u64::from(shard) * 31 + index) % 41 == 7
}

/// A sample's tensor: its identity, so a torn or misplaced copy shows.
pub(crate) fn tensor(shard: u32, index: u64) -> Vec<u8> {
    let mut t = (index as u16).to_le_bytes().to_vec();
    t.extend((shard as u16).to_le_bytes());
    t
}

/// The header a simulated worker sends for sample `index` of assignment `a`.
pub(crate) fn decoded(a: &Assign, index: u64) -> SampleHeader {
    let shard = a.shard.index;
    SampleHeader {
        job: a.job,
        unit: a.unit,
        attempt: a.attempt,
        shard,
        index,
        key: format!("{shard}/{index}"),
        label: Some(i64::from(shard)),
        tensor_bytes: 4,
        fields: Vec::new(),
        geometry: Default::default(),
        has: Vec::new(),
    }
}

/// What a simulated worker says of sample `index` of `a` when its decoder rejects it.
pub(crate) fn rejected(a: &Assign, index: u64) -> SkippedSample {
    let shard = a.shard.index;
    SkippedSample {
        key: format!("{shard}/{index}"),
        reason: "simulated decode failure".into(),
        shard,
        index,
        job: a.job,
        unit: a.unit,
        attempt: a.attempt,
    }
}

/// How many seeds a simulation runs: `SLUICE_SIM_SEEDS`, else `default`.
pub(crate) fn seeds(default: u64) -> u64 {
    std::env::var("SLUICE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The planned epoch a simulation runs.
pub(crate) struct World {
    pub(crate) manifest: Arc<Manifest>,
    units: Vec<WorkUnit>,
    sequence: Arc<Sequence>,
    pub(crate) batch_plan: BatchPlan,
    lookahead: u64,
    mixing: Mixing,
    max_unit: u64,
    /// Arrival order: exactly once, but in no fixed order.
    pub(crate) arrival: bool,
    /// The workers keep shard caches: shard affinity decides where units run.
    pub(crate) caches: bool,
}

impl World {
    /// An epoch of this world as rank 0 of job `job` sees it, with a loader config drawn
    /// from `rng` (`ring_batches` ring buffers).
    pub(crate) fn settings(
        &self,
        rng: &mut Stream,
        job: u64,
        ring_batches: usize,
    ) -> EpochSettings {
        EpochSettings {
            config: Arc::new(LoaderConfig {
                short_batch: ShortBatch::Deliver,
                credits_per_worker: 1 + rng.below(12) as u32,
                receive_window: 1 << 20,
                units_per_worker: 1 + rng.below(3) as usize,
                ring_batches,
                worker_wait: Duration::from_secs(600),
                max_unit_attempts: 1000,
                lookahead: self.lookahead,
                hedge_after: Duration::from_secs(3),
                labels: Default::default(),
                ..LoaderConfig::default()
            }),
            job,
            epoch: 0,
            batch_plan: self.batch_plan,
            first_batch: 0,
        }
    }

    /// The ledger and the delivery order an epoch starts with.
    pub(crate) fn order<P>(&self, seed: u64) -> (Ledger, Reorder<P>) {
        let reorder = match self.arrival {
            true => Reorder::arrival(sluice_plan::ShuffleBuffer::new(
                self.mixing.buffer_samples as usize,
                seed,
                0,
                0,
            )),
            false => Reorder::plan(self.sequence.clone(), 0),
        };
        (Ledger::new(&self.units), reorder)
    }

    /// Checks an epoch's batches against the plan (`what` names the run in a failure) and
    /// its reorder area against its bound; the area's peak.
    pub(crate) fn check(
        &self,
        got: &[Vec<(u32, u64)>],
        report: &crate::stats::EpochReport,
        what: &str,
    ) -> u64 {
        let want = expected(self);
        if self.arrival {
            let sorted = |b: &[Vec<(u32, u64)>]| {
                let mut v: Vec<(u32, u64)> = b.iter().flatten().copied().collect();
                v.sort_unstable();
                v
            };
            assert_eq!(got.len(), want.len(), "{what}: batch count");
            assert_eq!(sorted(got), sorted(&want), "{what}: not exactly once");
        } else {
            assert_eq!(got, want, "{what}: batches differ from the plan");
        }
        let peak = report.reorder_peak;
        // What can wait for its turn: units started within the lookahead, plus those the
        // shuffle buffer and the open window still hold samples of, each at most a unit.
        let bound = (self.lookahead
            + u64::from(self.mixing.buffer_samples)
            + u64::from(self.mixing.window_units))
            * self.max_unit;
        assert!(peak <= bound, "{what}: {peak} held, bound {bound}");
        peak
    }
}

pub(crate) fn world(seed: u64) -> World {
    let mut rng = stream(seed, Domain::Sample, 0, 3);
    let shards = 1 + rng.below(6) as usize;
    let counts: Vec<u64> = (0..shards).map(|_| 1 + rng.below(60)).collect();
    let max_unit = 1 + rng.below(24);
    let config = sluice_plan::PlanConfig {
        max_unit_samples: max_unit,
        ..sluice_plan::PlanConfig::new(seed, 1, sluice_plan::ShufflePolicy::Global)
    };
    let units = sluice_plan::plan_counts(&counts, &config, 0, 0).expect("plan");
    let mixing = Mixing {
        window_units: 1 + rng.below(6) as u32,
        buffer_samples: rng.below(40) as u32,
    };
    let sequence = Arc::new(Sequence::new(&units, mixing, seed, 0, 0).expect("sequence"));
    let batch_size = 1 + rng.below(16);
    let total: u64 = counts.iter().sum();
    let manifest = Manifest::new(
        counts
            .iter()
            .enumerate()
            .map(|(s, &n)| ShardInfo {
                url: format!("file:///s{s}.tar"),
                size: 1,
                samples: n,
                checksum: Checksum(s as u64),
                compression: Compression::None,
                replicas: Vec::new(),
            })
            .collect(),
    );
    World {
        manifest: Arc::new(manifest),
        units,
        sequence,
        batch_plan: BatchPlan::new(total, batch_size, LastBatch::Partial),
        lookahead: batch_size + rng.below(64),
        mixing,
        max_unit,
        arrival: seed % 4 == 3,
        caches: seed % 3 != 0,
    }
}

/// The batches the plan defines: positions cut into batches, skipped samples left out.
fn expected(world: &World) -> Vec<Vec<(u32, u64)>> {
    let bs = world.batch_plan.batch_size;
    (0..world.batch_plan.batches)
        .map(|b| {
            (b * bs..((b + 1) * bs).min(world.sequence.len()))
                .filter_map(|p| {
                    let (u, i) = world.sequence.at(p)?;
                    let shard = world.units[u as usize].shard;
                    (!bad(shard, i)).then_some((shard, i))
                })
                .collect()
        })
        .collect()
}
