//! The loader: the builder users configure, epochs as iterators of batches, and checkpoints.
//!
//! Each epoch computes this rank's plan (no coordinator: every rank does the same from the
//! manifest, seed, epoch and world size), opens a job on every worker (QUIC links, or the
//! engine in this process), and runs a [`crate::coordinator::Coordinator`] on the loader's
//! own small tokio runtime. The consumer's thread only waits on a bounded queue of finished
//! batches; while it holds them, their ring buffers stay out of the ring, which stops
//! credits, which stops the workers: memory stays bounded whatever the step time.
//!
//! - `builder`: [`LoaderBuilder`], which validates a [`LoaderConfig`] and builds the loader.
//! - `start`: starting an epoch (plan, links, coordinator) and the next one early.
//! - `epoch`: [`Epoch`], the iterator the consumer reads.
//! - `checkpoint`: [`Checkpoint`], `state_dict` and the checks that resume one.

mod builder;
mod checkpoint;
mod epoch;
mod start;
#[cfg(test)]
mod tests;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use sluice_plan::{BatchPlan, EpochPlanner, Segment, WorkUnit};
use sluice_shard::Manifest;
use sluice_wire::{BufferPool, UnitRunner};

pub use builder::LoaderBuilder;
pub use checkpoint::{Checkpoint, PlanRecord};
#[cfg_attr(not(feature = "cuda"), allow(unused_imports))]
pub(crate) use epoch::blocking_iterator;
pub use epoch::Epoch;

use crate::batch::HostAllocator;
use crate::config::LoaderConfig;
use crate::error::ClientError;
use crate::stats::{Stats, StatsSnapshot};

/// Where samples are decoded.
#[derive(Clone)]
pub enum Workers {
    /// `sluice cpu` daemons, as `host:port` (a name may resolve to several workers, as a
    /// Kubernetes headless Service does).
    Remote(Vec<String>),
    /// In this process, with no daemon (e.g. `sluice_cpu::CpuWorker`).
    InProcess(Arc<dyn UnitRunner>),
}

/// The client: yields this rank's batches, epoch after epoch.
pub struct Loader {
    config: Arc<LoaderConfig>,
    manifest: Arc<Manifest>,
    fingerprint: u64,
    /// A mixture's sources' names (empty for a single dataset).
    source_names: Vec<String>,
    /// The first shard of each source in the manifest, one extra at the end (empty for a
    /// single dataset).
    source_bounds: Arc<[u32]>,
    /// Replaced when a checkpoint of a mixture is loaded (its sources' states).
    planner: Mutex<Arc<EpochPlanner>>,
    /// The planner as built, for [`Loader::restart`].
    initial_planner: Arc<EpochPlanner>,
    batch_plan: BatchPlan,
    workers: Workers,
    token: Option<String>,
    quic: Option<(crate::quic::Endpoint, quinn_proto::ClientConfig)>,
    /// Always `Some` until drop.
    runtime: Option<tokio::runtime::Runtime>,
    /// The settings' allocator, keeping finished epochs' ring buffers for the next ones.
    allocator: Arc<dyn HostAllocator>,
    /// Spare tensor buffers for samples between arrival and batch, kept across epochs.
    buffers: Arc<BufferPool>,
    /// Same-host segments of finished connections, for the next ones.
    segments: Arc<crate::same_host::Segments>,
    /// The workers' source's last good list, kept across epochs.
    last_pool: Arc<crate::membership::LastGood>,
    progress: Arc<Mutex<Option<epoch::Progress>>>,
    resume: Mutex<Option<checkpoint::Pending>>,
    /// The checkpoint loaded last, until the next epoch starts: what `state_dict()` gives
    /// meanwhile (a state saved right after a load resumes the same).
    loaded: Mutex<Option<checkpoint::Checkpoint>>,
    /// The epoch after the current one, started early.
    next: Mutex<Option<start::Early>>,
    /// The epoch `epoch()` was last called for.
    last_epoch: Mutex<Option<u64>>,
    /// The number of `Epoch`s handed out (each one's `pass`).
    passes: AtomicU64,
    stats: Arc<Stats>,
}

impl Loader {
    pub fn builder() -> LoaderBuilder {
        LoaderBuilder::default()
    }

    /// The settings this loader was built with (validated).
    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    /// The dataset's content fingerprint (each shard's size, sample count and checksum, in
    /// manifest order): every rank of a job must have the same, or their plans disagree.
    pub fn dataset_fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// (rank, world size) this loader plans for.
    pub fn rank_and_world(&self) -> (u32, u32) {
        (self.config.rank, self.config.world_size)
    }

    /// Batches every rank yields per epoch.
    pub fn batches_per_epoch(&self) -> u64 {
        self.batch_plan.batches
    }

    /// Batches of `epoch` as a training loop counts them. Usually [`Self::batches_per_epoch`];
    /// for an epoch resumed at another world size, the batches each rank was handed before
    /// (in every earlier world, and a mixture's earlier rounds) plus this world's share of
    /// the rest, so a loop that restored
    /// its step count from the same checkpoint (Lightning's) runs exactly to the epoch's end.
    pub fn batches_in_epoch(&self, epoch: u64) -> u64 {
        let pending = self.resume.lock().ok().and_then(|r| {
            r.as_ref()
                .filter(|p| p.epoch == epoch)
                .map(|p| p.resumed.clone())
        });
        let resumed = pending
            .or_else(|| {
                let progress = self.progress.lock().ok()?;
                progress
                    .as_ref()
                    .filter(|p| p.epoch == epoch)
                    .map(|p| p.resumed.clone())
            })
            .unwrap_or_default();
        if resumed.is_empty() {
            return self.batch_plan.batches;
        }
        let before: u64 = resumed.iter().map(|seg| seg.batches).sum();
        let (_, world) = self.rank_and_world();
        match self.planner().rest_plan(epoch, &resumed, world) {
            Ok(plan) => before + plan.batches,
            Err(_) => self.batch_plan.batches,
        }
    }

    /// Samples every rank is planned per epoch (after the last-batch policy).
    pub fn samples_per_epoch(&self) -> u64 {
        self.batch_plan.samples
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// A mixture's sources' names, in the order weights and source numbers refer to (empty
    /// for a single dataset).
    pub fn source_names(&self) -> &[String] {
        &self.source_names
    }

    /// The source (of a mixture) shard `shard` of the manifest belongs to; 0 for a single
    /// dataset.
    pub fn source_of(&self, shard: u32) -> u32 {
        source_of(&self.source_bounds, shard)
    }

    fn planner_mut(&self) -> std::sync::MutexGuard<'_, Arc<EpochPlanner>> {
        match self.planner.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn planner(&self) -> Arc<EpochPlanner> {
        match self.planner.lock() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// This rank's work units for `epoch`, cut to the samples that make whole batches under
    /// the last-batch policy: of a mixture read in rounds, its first round's
    /// ([`Loader::pending`] lists every round's).
    pub fn plan(&self, epoch: u64) -> Result<Vec<WorkUnit>, ClientError> {
        let (rank, world) = self.rank_and_world();
        Ok(self.segment(epoch, &[], world, rank)?.0)
    }

    /// Rank `rank`'s units (cut to whole batches) and batch plan for `epoch` in a world of
    /// `world` ranks, after the earlier segments `resumed` (none: the epoch as planned).
    fn segment(
        &self,
        epoch: u64,
        resumed: &[Segment],
        world: u32,
        rank: u32,
    ) -> Result<(Vec<WorkUnit>, BatchPlan), ClientError> {
        Ok(self.planner().segment(epoch, resumed, world, rank)?)
    }
}

/// The source of `shard` given each source's first shard (see `Loader::source_bounds`).
pub(crate) fn source_of(bounds: &[u32], shard: u32) -> u32 {
    bounds
        .partition_point(|&b| b <= shard)
        .saturating_sub(1)
        .min(bounds.len().saturating_sub(2)) as u32
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Dropping a runtime blocks on its threads, which panics inside another runtime's
        // async context (a user's tokio task): let it wind down in the background instead.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
