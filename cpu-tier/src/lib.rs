//! The CPU tier engine: fetch a work unit's bytes, parse the tar stream as it arrives, decode
//! and augment each sample on a rayon pool, and hand back tensors.
//!
//! - [`source`]: where bytes come from (files, HTTP(S) with Range, replicas, checksums).
//! - [`spec`]: the pipeline spec (`decode | random_resized_crop 224 | hflip 0.5`).
//! - [`geometry`]: torchvision's crop/resize/flip parameters, composed into one window.
//! - [`jpeg`]: libjpeg-turbo region + DCT-scaled decoding, hardened.
//! - [`engine`]: the per-sample hot path and the pipelined work-unit runner.
//!
//! The network daemon (`sluice cpu`) wraps this library; nothing here opens a listening
//! socket.

pub mod engine;
pub mod error;
pub mod geometry;
pub mod jpeg;
pub mod source;
pub mod spec;

pub use engine::{
    BadSamplePolicy, Engine, EngineConfig, Outcome, Processed, SampleContext, Tensor, UnitStats,
};
pub use error::{DecodeError, EngineError, SampleError};
pub use source::{ShardLocation, ShardSource, SourceConfig, SourceError};
pub use spec::{DType, PipelineSpec};
