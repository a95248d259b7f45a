//! The CPU tier engine (`sluice cpu`): fetch, untar, decode and augment samples.
//!
//! Empty on purpose: the engine is built by the CPU-tier issue. Nothing here yet.
