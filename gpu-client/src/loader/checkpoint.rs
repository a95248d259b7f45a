//! Checkpoints: what a rank has been handed in an epoch, the dataset's identity, and the
//! checks and arithmetic that resume one, at the same world size or another, from this rank's
//! state or any other rank's (the resume arithmetic itself is `sluice_plan::resume`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_plan::{BatchPlan, EpochPlanner, MixBase, Segment, SourceState, WorkUnit};
use sluice_shard::Manifest;

use super::Loader;
use crate::config::{Order, PlanSettings};
use crate::error::ClientError;
use crate::ledger::{Ledger, LedgerRecord, Verdict};

/// A compact record of an epoch in progress: restoring it delivers exactly the rest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    /// A hash of the manifest's shards' content (size, samples, checksum, in order; version 1
    /// hashed their URLs too).
    pub dataset: u64,
    /// Each shard's content digest (its low 32 bits), for datasets of up to 65,536 shards:
    /// a mismatch then names the first shard that differs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<u32>,
    pub seed: u64,
    pub world_size: u32,
    pub rank: u32,
    pub shuffle: String,
    /// The delivery order it was taken under (`plan` or `arrival`).
    #[serde(default = "Order::legacy")]
    pub order: Order,
    pub batch_size: u32,
    /// The plan's other settings (remainder, unit size, last batch, mixing), which must
    /// match too.
    #[serde(default)]
    pub plan: PlanRecord,
    pub epoch: u64,
    /// Earlier worlds of this epoch, oldest first, when it was resumed at another world size.
    #[serde(default)]
    pub resumed: Vec<Segment>,
    /// Batches already handed to the consumer (in the current segment).
    pub batches: u64,
    /// Samples in those batches (delivered or skipped).
    pub ledger: LedgerRecord,
    /// A mixture's sources: where each stood at the start of `epoch`, and the weights of the
    /// current segment (a loader with other weights goes on from here by its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixture: Option<MixRecord>,
}

/// What a checkpoint of a mixture records beside a single dataset's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MixRecord {
    /// Shards of each source, in manifest order.
    pub sources: Vec<u32>,
    pub epoch_samples: Option<u64>,
    /// The current segment's weights (parts of `sluice_plan::mixture::WEIGHT_SCALE`).
    pub weights: Vec<u64>,
    /// Each source's state at the start of `epoch`.
    pub state: Vec<SourceState>,
    /// The training step at which `epoch` started (a weight schedule's clock).
    #[serde(default)]
    pub step: u64,
    /// The weight schedule the epoch was planned by (its segments' sequences follow it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<sluice_plan::Schedule>,
}

/// A checkpoint's plan settings: typed (version 3), or the text versions 1 and 2 wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PlanRecord {
    Typed(PlanSettings),
    /// `remainder=Drop unit=64 last=Partial mix=16x1024`; empty in the oldest checkpoints.
    Text(String),
}

impl Default for PlanRecord {
    fn default() -> Self {
        PlanRecord::Text(String::new())
    }
}

impl Checkpoint {
    /// What every state of one job at one step shares, each as (name, value), in the order
    /// a difference is named.
    fn identity(&self) -> Vec<(&'static str, String)> {
        vec![
            ("dataset", self.dataset.to_string()),
            ("seed", self.seed.to_string()),
            ("world_size", self.world_size.to_string()),
            ("shuffle", self.shuffle.clone()),
            ("order", self.order.to_string()),
            ("batch_size", self.batch_size.to_string()),
            ("plan", format!("{:?}", self.plan)),
            ("epoch", self.epoch.to_string()),
            ("resumed", format!("{:?}", self.resumed)),
        ]
    }

    /// 3: typed plan settings (2: content fingerprint; 1: URLs in the fingerprint).
    pub const VERSION: u32 = 3;

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ClientError> {
        if bytes.len() > 256 << 20 {
            return Err(ClientError::Checkpoint(format!(
                "{} bytes is too large",
                bytes.len()
            )));
        }
        let c: Checkpoint = serde_json::from_slice(bytes).map_err(|e| {
            // serde's "at line 1 column 299" means nothing to whoever saved the state.
            let text = e.to_string();
            let what = text
                .rsplit_once(" at line ")
                .map_or(text.as_str(), |(w, _)| w);
            ClientError::Checkpoint(format!(
                "this is not a Sluice loader's state_dict() ({what})"
            ))
        })?;
        if !(1..=Self::VERSION).contains(&c.version) {
            return Err(ClientError::Checkpoint(format!(
                "version {} (this build reads {})",
                c.version,
                Self::VERSION
            )));
        }
        Ok(c)
    }
}

/// A loaded checkpoint, waiting for `epoch(e)`.
pub(super) struct Pending {
    pub epoch: u64,
    pub resumed: Vec<Segment>,
    pub batches: u64,
    /// The ledger of this rank (same world size); `None` for an elastic resume, which starts
    /// a new segment with nothing delivered.
    pub ledger: Option<LedgerRecord>,
}

/// The dataset's identity for checkpoints: each shard's content (size, sample count,
/// checksum) in manifest order, and not where it lives, so a checkpoint resumes after the
/// shards moved to another directory, mount, cluster or storage node.
pub(super) fn fingerprint(manifest: &Manifest) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for s in &manifest.shards {
        h.update(&shard_digest(s).to_le_bytes());
    }
    h.digest()
}

/// One shard's content, for naming the first shard that differs from a checkpoint's.
fn shard_digest(s: &sluice_shard::ShardInfo) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&s.size.to_le_bytes());
    h.update(&s.samples.to_le_bytes());
    h.update(&s.checksum.0.to_le_bytes());
    h.digest()
}

/// Checkpoints of version 1 hashed each shard's URL too.
fn fingerprint_v1(manifest: &Manifest) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for s in &manifest.shards {
        h.update(s.url.as_bytes());
        h.update(&s.size.to_le_bytes());
        h.update(&s.samples.to_le_bytes());
        h.update(&s.checksum.0.to_le_bytes());
    }
    h.digest()
}

/// Shards up to which a checkpoint lists each shard's digest (4 bytes a shard: 256 KiB of
/// JSON at most), so a mismatch can name the first shard that differs.
const DIGESTS_LISTED: usize = 65_536;

/// The first setting named in both lists whose values differ: (name, `a`'s, `b`'s).
fn first_difference(
    a: &[(&'static str, String)],
    b: &[(&'static str, String)],
) -> Option<(&'static str, String, String)> {
    a.iter().find_map(|(name, x)| {
        let (_, y) = b.iter().find(|(n, _)| n == name)?;
        (x != y).then(|| (*name, x.clone(), y.clone()))
    })
}

/// Checks that the states given together were taken by one job at one step, and returns
/// their ranks (sorted).
fn agreeing_ranks(checkpoints: &[Checkpoint]) -> Result<Vec<u32>, ClientError> {
    let Some(first) = checkpoints.first() else {
        return Err(ClientError::Checkpoint("no checkpoint given".into()));
    };
    for c in &checkpoints[1..] {
        if let Some((field, a, b)) = first_difference(&first.identity(), &c.identity()) {
            return Err(ClientError::Checkpoint(format!(
                "ranks {} and {} disagree on {field}: {a} and {b}",
                first.rank, c.rank
            )));
        }
        if first.batches != c.batches {
            return Err(ClientError::Checkpoint(format!(
                "ranks {} and {} disagree on batches (the global step): {} and {}; states \
                 given together must be taken at the same step on every rank (as DDP steps \
                 together), or pass this rank's own state alone",
                first.rank, c.rank, first.batches, c.batches
            )));
        }
    }
    let mut ranks: Vec<u32> = checkpoints.iter().map(|c| c.rank).collect();
    ranks.sort_unstable();
    if let Some(w) = ranks.windows(2).find(|w| w[0] == w[1]) {
        return Err(ClientError::Checkpoint(format!(
            "rank {} is given twice",
            w[0]
        )));
    }
    if let Some(r) = ranks.iter().find(|&&r| r >= first.world_size) {
        return Err(ClientError::Checkpoint(format!(
            "rank {r} is outside its world_size {}",
            first.world_size
        )));
    }
    Ok(ranks)
}

impl Loader {
    /// The state of the current epoch: restoring it with [`Loader::load_state_dict`] (in a
    /// new process too) and reading the epoch it names delivers exactly the rest; a state
    /// taken once the epoch's last batch was handed out resumes at the next epoch's start.
    /// Between a load and the next epoch's start it is the checkpoint loaded (`None` after
    /// [`Loader::restart`], and before the first epoch).
    pub fn state_dict(&self) -> Option<Checkpoint> {
        if let Some(loaded) = self.loaded.lock().ok()?.clone() {
            return Some(loaded);
        }
        let progress = self.progress.lock().ok()?;
        let p = progress.as_ref()?;
        let c = &self.config;
        let shards = &self.manifest.shards;
        Some(Checkpoint {
            version: Checkpoint::VERSION,
            dataset: self.fingerprint,
            shards: match shards.len() <= DIGESTS_LISTED {
                true => shards.iter().map(|s| shard_digest(s) as u32).collect(),
                false => Vec::new(),
            },
            seed: c.seed,
            world_size: c.world_size,
            rank: c.rank,
            shuffle: c.shuffle.to_string(),
            order: c.order,
            batch_size: c.batch_size,
            plan: PlanRecord::Typed(c.plan_settings()),
            epoch: p.epoch,
            resumed: p.resumed.clone(),
            batches: p.batches,
            ledger: p.ledger.to_record(),
            mixture: self.mix_record(p.epoch, &p.resumed, p.samples),
        })
    }

    /// The mixture's record for a checkpoint of `epoch` after the segments `resumed` (`None`
    /// for a single dataset). Under a schedule the weights are the current segment's (its
    /// schedule's summed over the steps it spans), so another world can draw it again.
    fn mix_record(&self, epoch: u64, resumed: &[Segment], samples: u64) -> Option<MixRecord> {
        let planner = self.planner();
        let m = planner.mixture.as_ref()?;
        let (state, step) = planner.mixture_start(epoch).ok()??;
        Some(MixRecord {
            sources: m.shards.clone(),
            epoch_samples: m.epoch_samples,
            weights: planner.segment_weights(step, resumed, self.config.world_size, samples),
            state,
            step,
            schedule: m.schedule.clone(),
        })
    }

    /// The planner `first` was taken under: this loader's, with a mixture's sources where the
    /// checkpoint says and its weights. Errors when the mixtures differ.
    fn planner_of(&self, first: &Checkpoint) -> Result<EpochPlanner, ClientError> {
        let mut planner = (*self.planner()).clone();
        match (planner.mixture.as_mut(), &first.mixture) {
            (None, None) => {}
            (Some(m), Some(r)) => {
                if m.shards != r.sources || m.epoch_samples != r.epoch_samples {
                    return Err(ClientError::Checkpoint(format!(
                        "it was taken on a mixture of sources of {:?} shards (epoch_samples \
                         {:?}), this loader's has {:?} ({:?})",
                        r.sources, r.epoch_samples, m.shards, m.epoch_samples
                    )));
                }
                check_mix_record(r, &first.resumed)?;
                m.weights = r.weights.clone();
                m.schedule = r.schedule.clone();
                m.base = MixBase {
                    epoch: first.epoch,
                    state: r.state.clone(),
                    resumed: first.resumed.clone(),
                    step: r.step,
                };
            }
            (ours, _) => {
                let what = |mixed: bool| match mixed {
                    true => "a mixture of several sources",
                    false => "a single dataset",
                };
                return Err(ClientError::Checkpoint(format!(
                    "it was taken on {}, this loader reads {}",
                    what(first.mixture.is_some()),
                    what(ours.is_some())
                )));
            }
        }
        Ok(planner)
    }

    /// Restores a checkpoint and returns the epoch to read next: the checkpoint's, whose rest
    /// the next `epoch()` of it delivers, or the one after it when the checkpoint's epoch had
    /// handed out every batch (a state saved at an epoch's end, as Lightning's default
    /// `ModelCheckpoint` saves it), which then starts from its beginning. Errors say what does
    /// not match this loader.
    pub fn load_state_dict(&self, checkpoint: Checkpoint) -> Result<u64, ClientError> {
        self.load_state_dicts(std::slice::from_ref(&checkpoint))
    }

    /// Forgets any loaded checkpoint and what was read: the plan as built, every epoch from
    /// its start (what loading the state taken before the first batch means). An epoch
    /// started early is dropped.
    pub fn restart(&self) {
        if let Ok(mut r) = self.resume.lock() {
            r.take();
        }
        if let Ok(mut l) = self.loaded.lock() {
            l.take();
        }
        if let Ok(mut n) = self.next.lock() {
            n.take();
        }
        if let Ok(mut p) = self.progress.lock() {
            p.take();
        }
        *self.planner_mut() = self.initial_planner.clone();
    }

    /// Restores the checkpoints of a job's ranks, taken at the same step; the next
    /// `epoch(e)` delivers exactly the rest of their epoch.
    ///
    /// At the same world size this rank's own checkpoint is used; without it (a framework
    /// that saved rank 0's state only), in plan order any rank's checkpoint gives this rank's
    /// place too, since DDP ranks are handed the same number of batches. At another world size
    /// (plan order only) the rest of the epoch, what every old rank had not yet delivered,
    /// is split equally across the new ranks; one checkpoint is enough, since in plan order
    /// an old rank's delivered samples are its sequence's first `batches × batch_size`. The
    /// checkpoints given must agree on dataset, seed, world_size, shuffle, order, batch_size,
    /// plan settings, epoch, earlier segments and `batches` (the global step: DDP ranks stop
    /// together); each error names the field. Returns the epoch to read next (see
    /// [`Loader::load_state_dict`]).
    pub fn load_state_dicts(&self, checkpoints: &[Checkpoint]) -> Result<u64, ClientError> {
        let ranks = agreeing_ranks(checkpoints)?;
        let first = &checkpoints[0];
        self.check_taken_here(first)?;
        // The checks run under the checkpoint's plan (a mixture's weights and states), the
        // rest of the epoch under this loader's.
        let theirs = Arc::new(self.planner_of(first)?);
        let ours = std::mem::replace(&mut *self.planner_mut(), theirs.clone());
        // The checkpoint's own segment, planned once for every check below.
        let checked = (|| {
            let (units, plan, rest) = theirs.segment_and_rest(
                first.epoch,
                &first.resumed,
                first.world_size,
                first.rank,
            )?;
            let taken = (units, plan);
            let same_weights = self.same_weights(&ours, first, taken.1.samples)?;
            let pending = self.check_and_place(first, checkpoints, &ranks, same_weights, &taken)?;
            match first.batches == taken.1.batches {
                false => Ok((Some(pending), None, taken.1)),
                // A mixture's round taken whole: the epoch goes on with the next one.
                true if rest.samples > plan.samples => {
                    Ok((Some(Self::after(first)), None, taken.1))
                }
                true => Self::after_whole_epoch(&theirs, first).map(|b| (None, Some(b), taken.1)),
            }
        })();
        let (pending, next_base, taken) = match checked {
            Ok(placed) => placed,
            Err(e) => {
                *self.planner_mut() = ours;
                return Err(e);
            }
        };
        let mut planner = (*ours).clone();
        if let (Some(m), Some(t)) = (planner.mixture.as_mut(), theirs.mixture.as_ref()) {
            m.base = match (&pending, next_base) {
                (Some(p), _) => MixBase {
                    resumed: p.resumed.clone(),
                    ..t.base.clone()
                },
                (None, Some(Some(base))) => base,
                (None, _) => t.base.clone(),
            };
        }
        *self.planner_mut() = Arc::new(planner);
        let next = match &pending {
            Some(p) => p.epoch,
            None => {
                tracing::info!(
                    epoch = first.epoch,
                    "the checkpoint was taken at the end of epoch {}: reading resumes at the \
                     start of epoch {}",
                    first.epoch,
                    first.epoch + 1
                );
                first.epoch + 1
            }
        };
        if let Some(p) = pending.as_ref().filter(|p| p.ledger.is_none()) {
            self.log_rounding(first, &taken, p);
        }
        if let Ok(mut r) = self.resume.lock() {
            *r = pending;
        }
        if let Ok(mut l) = self.loaded.lock() {
            *l = Some(first.clone());
        }
        // An epoch started early would not resume the checkpoint.
        if let Ok(mut n) = self.next.lock() {
            n.take();
        }
        Ok(next)
    }

    /// Says how many of the samples the old world left this new world reads: the rest is
    /// shared equally (whole batches under `drop_last`), so a few may be left out of the epoch
    /// or repeated as padding.
    fn log_rounding(&self, first: &Checkpoint, old: &BatchPlan, pending: &Pending) {
        let c = &self.config;
        let Ok((_, new)) = self.segment(first.epoch, &pending.resumed, c.world_size, c.rank) else {
            return;
        };
        let done = (first.batches * old.batch_size).min(old.samples);
        let left = u64::from(first.world_size) * (old.samples - done);
        let read = u64::from(c.world_size) * new.samples;
        let why = match (c.last_batch, c.remainder) {
            (sluice_plan::LastBatch::Drop, _) => "drop_last: whole batches on every rank",
            (_, sluice_plan::Remainder::Drop) => "remainder \"drop\": equal shares",
            (_, sluice_plan::Remainder::Pad) => "remainder \"pad\": equal shares",
        };
        if read < left {
            tracing::warn!(
                "epoch {} resumed at world_size {} (from {}): of the {left} samples left, {read} \
                 are read and {} are left out of this epoch ({why})",
                first.epoch,
                c.world_size,
                first.world_size,
                left - read
            );
        } else if read > left {
            tracing::info!(
                "epoch {} resumed at world_size {} (from {}): the {left} samples left are read, \
                 {} of them twice as padding ({why})",
                first.epoch,
                c.world_size,
                first.world_size,
                read - left
            );
        }
    }

    /// A mixture's sources where they stand after `first`'s epoch, which handed out all of
    /// its batches: that epoch's last segment drawn as it was (its world, its weights), so
    /// the next epoch draws from where the uninterrupted run's would.
    fn after_whole_epoch(
        theirs: &EpochPlanner,
        first: &Checkpoint,
    ) -> Result<Option<MixBase>, ClientError> {
        if theirs.mixture.is_none() {
            return Ok(None);
        }
        let mut planner = theirs.clone();
        planner.config.world_size = first.world_size;
        let (state, step) = planner.mixture_start(first.epoch + 1)?.unwrap_or_default();
        Ok(Some(MixBase {
            epoch: first.epoch + 1,
            state,
            resumed: Vec::new(),
            step,
        }))
    }

    /// Whether `ours` (this loader's planner) would draw `first`'s segment by the weights it
    /// recorded, and place its samples by the same schedule: then this world size goes on
    /// in the checkpoint's own plan; otherwise the rest of the epoch is drawn anew.
    fn same_weights(
        &self,
        ours: &EpochPlanner,
        first: &Checkpoint,
        samples: u64,
    ) -> Result<bool, ClientError> {
        let (Some(m), Some(r)) = (&ours.mixture, &first.mixture) else {
            return Ok(true);
        };
        if m.schedule.is_none() && r.schedule.is_none() {
            return Ok(m.weights == r.weights);
        }
        let step = ours.epoch_step(first.epoch)?;
        if m.schedule != r.schedule || step != r.step {
            return Ok(false);
        }
        let w = ours.segment_weights(step, &first.resumed, first.world_size, samples);
        Ok(w == r.weights)
    }

    /// This rank's place in the epoch `first` (and the other `checkpoints` of its step)
    /// records, checked against the plan they were taken under (`taken`: `first`'s segment,
    /// its units and batch plan).
    fn check_and_place(
        &self,
        first: &Checkpoint,
        checkpoints: &[Checkpoint],
        ranks: &[u32],
        same_weights: bool,
        (units, batch_plan): &(Vec<WorkUnit>, BatchPlan),
    ) -> Result<Pending, ClientError> {
        if first.batches > batch_plan.batches {
            return Err(ClientError::Checkpoint(format!(
                "{} batches delivered, more than the epoch's {}",
                first.batches, batch_plan.batches
            )));
        }
        let c = &self.config;
        let pending = if first.world_size == c.world_size && same_weights {
            match checkpoints.iter().find(|s| s.rank == c.rank) {
                Some(mine) => self.own_rank(mine),
                None => self.another_rank(first, ranks),
            }
        } else {
            self.another_world(first, units)
        }?;
        Ok(pending)
    }

    /// Checks that `first` was taken with this loader's dataset and settings.
    fn check_taken_here(&self, first: &Checkpoint) -> Result<(), ClientError> {
        let c = &self.config;
        let ours = if first.version == 1 {
            fingerprint_v1(&self.manifest)
        } else {
            self.fingerprint
        };
        if first.dataset != ours {
            return Err(ClientError::Checkpoint(self.dataset_mismatch(first, ours)));
        }
        let plan = c.plan_settings();
        let plan_differs = match &first.plan {
            PlanRecord::Typed(theirs) => first_difference(&theirs.named(), &plan.named()),
            PlanRecord::Text(t) if t.is_empty() => None,
            PlanRecord::Text(t) => (*t != plan.version2_text())
                .then(|| ("plan settings", t.clone(), plan.version2_text())),
        };
        let ours = [
            ("seed", c.seed.to_string()),
            ("shuffle", c.shuffle.to_string()),
            ("batch_size", c.batch_size.to_string()),
            ("order", c.order.to_string()),
        ];
        match first_difference(&first.identity(), &ours).or(plan_differs) {
            Some((what, theirs, ours)) => Err(ClientError::Checkpoint(format!(
                "it was taken with {what} {theirs}, this loader has {ours}"
            ))),
            None => Ok(()),
        }
    }

    /// Why `checkpoint` was taken on another dataset than this loader's, as precisely as it
    /// allows: the first shard that differs, or how many shards and samples each has.
    fn dataset_mismatch(&self, checkpoint: &Checkpoint, ours: u64) -> String {
        let m = &self.manifest;
        let head = format!(
            "it was taken on another dataset (fingerprint {:016x}; this loader's manifest gives \
             {ours:016x})",
            checkpoint.dataset
        );
        if checkpoint.version == 1 {
            return format!(
                "{head}: checkpoints of version 1 hash shard URLs too, so shards that moved \
                 cannot resume them; a new checkpoint (version 2) can"
            );
        }
        if checkpoint.shards.is_empty() {
            return format!(
                "{head}: some shard's size, sample count or checksum differs, or the shards \
                 are in another order ({} shards, {} samples here)",
                m.shards.len(),
                m.total_samples()
            );
        }
        let differs = checkpoint
            .shards
            .iter()
            .zip(&m.shards)
            .position(|(theirs, s)| *theirs != shard_digest(s) as u32);
        match differs {
            Some(i) => format!(
                "{head}: shard #{i} ({}) is not the shard it had there (its size, sample count \
                 or checksum differs: was it rewritten, or the list reordered?)",
                m.shards[i].url
            ),
            None => format!(
                "{head}: it had {} shards, this manifest has {}",
                checkpoint.shards.len(),
                m.shards.len()
            ),
        }
    }

    /// The ledger `c` records over `units` (its rank's plan), checked in plan order to be
    /// the plan's first `c.batches` batches.
    fn checked_ledger(&self, c: &Checkpoint, units: &[WorkUnit]) -> Result<Ledger, ClientError> {
        let mut ledger = Ledger::new(units);
        ledger.apply(&c.ledger).map_err(ClientError::Checkpoint)?;
        if self.config.order == Order::Plan {
            let at = (c.epoch, c.resumed.as_slice(), c.rank);
            self.check_plan_prefix(units, at, c.batches, &ledger)?;
        }
        Ok(ledger)
    }

    /// This rank's own checkpoint at the same world size: its ledger, checked against the plan.
    fn own_rank(&self, mine: &Checkpoint) -> Result<Pending, ClientError> {
        let c = &self.config;
        let (units, _) = self.segment(mine.epoch, &mine.resumed, c.world_size, c.rank)?;
        self.checked_ledger(mine, &units)?;
        Ok(Pending {
            epoch: mine.epoch,
            resumed: mine.resumed.clone(),
            batches: mine.batches,
            ledger: Some(mine.ledger.clone()),
        })
    }

    /// Another rank's checkpoint at the same world size (a framework that saves rank 0's state
    /// only, as Lightning and Accelerate do). In plan order every rank had been handed the
    /// first `batches` batches of its own sequence (DDP ranks step together), so that rank's
    /// checkpoint, checked against its own plan, gives this rank's ledger too: the first
    /// `batches × batch_size` positions of this rank's sequence.
    fn another_rank(&self, theirs: &Checkpoint, ranks: &[u32]) -> Result<Pending, ClientError> {
        let c = &self.config;
        if c.order != Order::Plan {
            return Err(ClientError::Checkpoint(format!(
                "this is rank {}, and the checkpoint is rank {ranks:?}'s: in order \"arrival\" a \
                 checkpoint names only its own rank's samples, so each rank must load its own \
                 state (save every rank's state_dict, or use order=\"plan\", where any one \
                 rank's state resumes every rank)",
                c.rank
            )));
        }
        let (their_units, _) =
            self.segment(theirs.epoch, &theirs.resumed, c.world_size, theirs.rank)?;
        self.checked_ledger(theirs, &their_units)?;
        let (units, _) = self.segment(theirs.epoch, &theirs.resumed, c.world_size, c.rank)?;
        let sequence = self
            .planner()
            .sequence(&units, theirs.epoch, &theirs.resumed, c.rank)?;
        let mut ledger = Ledger::new(&units);
        for (u, i) in
            (0..self.planner().delivered(&sequence, theirs.batches)).filter_map(|p| sequence.at(p))
        {
            if let Some(w) = units.get(u as usize) {
                ledger.record(u64::from(u), w.shard, i);
            }
        }
        Ok(Pending {
            epoch: theirs.epoch,
            resumed: theirs.resumed.clone(),
            batches: theirs.batches,
            ledger: Some(ledger.to_record()),
        })
    }

    /// A checkpoint taken at another world size (plan order only): this epoch goes on as a
    /// new segment, this rank's share of what the old world had not delivered.
    fn another_world(
        &self,
        first: &Checkpoint,
        units: &[WorkUnit],
    ) -> Result<Pending, ClientError> {
        let c = &self.config;
        if c.order != Order::Plan {
            return Err(ClientError::Checkpoint(format!(
                "it was taken at world_size {} (weights {:?}), this loader has {} ({:?}): a \
                 new world size or new weights need order \"plan\" (in arrival order a \
                 checkpoint names only its own rank's samples)",
                first.world_size,
                first.mixture.as_ref().map(|m| &m.weights),
                c.world_size,
                self.config.weights
            )));
        }
        self.checked_ledger(first, units)?;
        Ok(Self::after(first))
    }

    /// The rest of `first`'s epoch as a new segment after the one it was taken in, which
    /// its world left after `first.batches` batches.
    fn after(first: &Checkpoint) -> Pending {
        let mut resumed = first.resumed.clone();
        resumed.push(Segment {
            world_size: first.world_size,
            batches: first.batches,
            weights: first
                .mixture
                .as_ref()
                .map(|m| m.weights.clone())
                .unwrap_or_default(),
        });
        Pending {
            epoch: first.epoch,
            resumed,
            batches: 0,
            ledger: None,
        }
    }

    /// In plan order, the samples in the first `batches` batches are exactly the sequence's
    /// first `batches × batch_size` positions: a checkpoint that says otherwise was not
    /// taken under this plan.
    fn check_plan_prefix(
        &self,
        units: &[WorkUnit],
        (epoch, resumed, rank): (u64, &[Segment], u32),
        batches: u64,
        ledger: &Ledger,
    ) -> Result<(), ClientError> {
        let sequence = self.planner().sequence(units, epoch, resumed, rank)?;
        let prefix = self.planner().delivered(&sequence, batches);
        let in_prefix = (0..prefix).filter_map(|p| sequence.at(p)).all(|(u, i)| {
            units
                .get(u as usize)
                .is_some_and(|w| ledger.check(u64::from(u), w.shard, i) == Verdict::Duplicate)
        });
        if !in_prefix || ledger.accounted() != prefix {
            return Err(ClientError::Checkpoint(format!(
                "the {} samples it records are not the first {batches} batches of this \
                 loader's plan: it was taken with other settings (mixing, unit size, pipeline \
                 order) or by another version of sluice",
                ledger.accounted()
            )));
        }
        Ok(())
    }

    /// What this rank will deliver in `epoch` from now: the plan, or the rest of a loaded
    /// checkpoint's epoch (this rank's share of it after a change of world size). An epoch
    /// read in rounds (a mixture's, see [`crate::LoaderConfig::mixture_round_samples`]) lists
    /// every round's units, as many as the epoch has samples.
    pub fn pending(&self, epoch: u64) -> Result<Vec<WorkUnit>, ClientError> {
        let c = &self.config;
        let planner = self.planner();
        let (mut resumed, record) = {
            let resume = self.resume.lock().ok();
            match resume
                .as_ref()
                .and_then(|r| r.as_ref())
                .filter(|p| p.epoch == epoch)
            {
                Some(p) => (p.resumed.clone(), p.ledger.clone()),
                None => (Vec::new(), None),
            }
        };
        let (units, mut plan, mut rest) =
            planner.segment_and_rest(epoch, &resumed, c.world_size, c.rank)?;
        let mut out = match record {
            None => units,
            Some(record) => {
                let mut ledger = Ledger::new(&units);
                ledger.apply(&record).map_err(ClientError::Checkpoint)?;
                units
                    .iter()
                    .flat_map(|u| {
                        ledger
                            .missing(u64::from(u.id), u.start, u.end)
                            .into_iter()
                            .map(move |(start, end)| WorkUnit { start, end, ..*u })
                    })
                    .collect()
            }
        };
        // Rounds after it: each the segment after the one before, taken whole.
        while rest.samples > plan.samples {
            resumed = planner.after_round(epoch, &resumed, c.world_size)?;
            let units;
            (units, plan, rest) =
                planner.segment_and_rest(epoch, &resumed, c.world_size, c.rank)?;
            out.extend(units);
        }
        Ok(out)
    }
}

/// A mixture checkpoint's record is whole before a planner uses it: a weight and a state per
/// source, weights that draw something, each earlier segment's weights one per source (or
/// none). A checkpoint edited by hand or cut short is refused by name, never a panic.
fn check_mix_record(r: &MixRecord, resumed: &[Segment]) -> Result<(), ClientError> {
    let n = r.sources.len();
    let bad = |detail: String| Err(ClientError::Checkpoint(detail));
    if r.weights.len() != n {
        return bad(format!(
            "its mixture has {n} sources but {} weights ({:?})",
            r.weights.len(),
            r.weights
        ));
    }
    if r.weights.iter().all(|&w| w == 0) {
        return bad("its mixture's weights are all 0".into());
    }
    if r.state.len() != n {
        return bad(format!(
            "its mixture has {n} sources but {} source states",
            r.state.len()
        ));
    }
    for (i, seg) in resumed.iter().enumerate() {
        if !seg.weights.is_empty() && seg.weights.len() != n {
            return bad(format!(
                "its earlier segment {i} has {} weights for {n} sources",
                seg.weights.len()
            ));
        }
        if !seg.weights.is_empty() && seg.weights.iter().all(|&w| w == 0) {
            return bad(format!("its earlier segment {i}'s weights are all 0"));
        }
    }
    Ok(())
}
