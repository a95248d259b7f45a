//! What `sluice demo`, `loadgen` and `bench` run, as a library the CLI and the end-to-end
//! tests share:
//! - [`cluster`]: the tiers started in this process on loopback over real sockets, and the
//!   demo's datasets;
//! - [`consumers`]: synthetic GPU consumers (one client per rank) with the exactly-once audit,
//!   delivery-order dumps, mixing figures and checkpoints;
//! - [`sizing`]: each tier measured alone and the rule that names the bottleneck;
//! - [`transport`]: tensor throughput of QUIC and same-host links beside TCP and memcpy;
//! - [`host_cost`]: the client's CPU per sample on each transport beside its floor.

pub mod cluster;
pub mod consumers;
pub mod error;
pub mod host_cost;
pub mod sizing;
pub mod tier_cpu;
pub mod transport;

pub use error::{Result, TestbedError};
