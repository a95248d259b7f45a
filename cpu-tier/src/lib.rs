//! The CPU tier engine: fetch a work unit's bytes, parse the tar stream as it arrives, decode
//! and augment each sample on a rayon pool, and hand back tensors.
//!
//! - [`source`]: where bytes come from (files, HTTP(S) with Range, replicas, checksums).
//! - [`geometry`]: torchvision's crop/resize/flip parameters, composed into one window.
//! - [`jpeg`]: libjpeg-turbo region + DCT-scaled decoding, hardened.
//! - [`engine`]: the per-sample hot path and the pipelined work-unit runner.
//! - [`fields`]: a sample's label (from the field a job names) and the fields sent beside it.
//!
//! - [`worker`]: the engine as a wire-protocol worker (jobs sharing one pool).
//! - [`server`]: the `sluice cpu` daemon: QUIC, TLS, its start-up and drain.
//! - `connection`: the shell that serves a connection by the worker's rules (tokens,
//!   credits, fair slots, heartbeats: `sluice_wire::session`), running units on threads.
//! - [`same_host`]: its Unix-socket transport for clients on the same machine (tensors
//!   written into the client's shared memory).
//! - [`config`], [`tls`], [`tenants`]: its configuration, TLS identity and the teams it
//!   admits ([`admission`]: read again while it runs); `key_files`: private keys written and read never through a link.

pub mod admission;
pub mod clip;
pub mod config;
mod connection;
pub mod engine;
pub mod error;
pub mod fields;
pub mod geometry;
pub mod jpeg;
mod key_files;
mod mappings;
pub mod metrics;
mod reload;
pub mod restart;
pub mod same_host;
pub mod server;
pub mod share;
mod slots;
pub mod source;
pub mod tenants;
mod tensor;
pub mod tls;
pub mod worker;

pub use engine::{
    BadSamplePolicy, Engine, EngineConfig, Outcome, Processed, SampleContext, Tensor, UnitStats,
};
pub use error::{DecodeError, EngineError, SampleError};
pub use fields::FieldSpec;
/// The pipeline spec's grammar lives in `sluice_wire::spec`, where clients check it too.
pub use sluice_wire::spec::{DType, PipelineSpec};
pub use source::{ShardLocation, ShardSource, SharedSamples, SourceConfig, SourceError};
pub use worker::CpuWorker;
