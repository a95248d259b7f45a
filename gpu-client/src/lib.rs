//! The GPU client: the library inside each training process. It plans each epoch from the
//! manifest (no coordinator), hands work units to CPU workers a few at a time under credits,
//! accepts every planned sample exactly once (the [`ledger`]), assembles batches in a bounded
//! ring of reusable host buffers, and checkpoints what it delivered.
//!
//! ```no_run
//! # fn main() -> Result<(), sluice_client::ClientError> {
//! # let manifest: sluice_shard::Manifest = todo!();
//! let loader = sluice_client::Loader::builder()
//!     .dataset(manifest)
//!     .workers(["cpu-0:7100", "cpu-1:7100"])
//!     .trust_cert("/etc/sluice/cert.pem")
//!     .token("…")
//!     .batch_size(256)
//!     .seed(42)
//!     .rank(0)
//!     .world_size(8)
//!     .build()?;
//! for batch in loader.epoch(0)? {
//!     let batch = batch?;
//!     let _pixels: &[u8] = batch.images(); // N×H×W×3 uint8
//! }
//! # Ok(()) }
//! ```
//!
//! Modules: [`loader`] (builder, epochs, checkpoints), `coordinator` (assignment, credits,
//! reassignment), [`ledger`] (exactly-once), [`batch`] (ring, allocator, short batches),
//! `link` (QUIC, same-host and in-process workers), [`same_host`] (shared-memory slots for
//! workers on this machine), `tls` (certificate pinning), [`stats`].
//!
//! Links no image decoder: in-process decoding takes a [`sluice_wire::UnitRunner`] from the
//! caller (the CPU tier's `CpuWorker`).

mod affinity;
mod arena;
mod assembly;
pub mod batch;
mod buffers;
mod clock;
pub mod config;
mod coordinator;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod error;
pub mod ledger;
mod link;
pub mod loader;
mod local;
mod membership;
pub mod metrics;
#[cfg(feature = "cuda")]
mod nvrtc;
mod protocol;
mod quic;
mod reorder;
pub mod same_host;
mod session;
pub mod stats;
#[cfg(test)]
mod testing;
mod tls;

pub use batch::{
    Adopted, Batch, HeapAllocator, HostAllocator, HostMemory, LastBatch, SampleId, ShortBatch,
};
pub use config::{
    check_pipeline, LabelRange, LoaderConfig, Order, PlanSettings, ValidConfig, DECODED_PER_STORED,
};
pub use error::ClientError;
pub use loader::{Checkpoint, Epoch, Loader, LoaderBuilder, PlanRecord, Workers};
pub use same_host::SameHost;
pub use sluice_plan::{Mixing, Remainder, Segment, ShufflePolicy};
pub use sluice_wire::{FieldSelection, LabelSource, SampleFields, SampleGeometry, SampleShape};
pub use stats::{EpochReport, StatsSnapshot, WorkerStats};
