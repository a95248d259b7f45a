//! The storage tier (`sluice storage`): serves shards from local disks over HTTP/1.1 with
//! Range, at the disks' sequential speed.
//!
//! - [`config`]: the TOML config and its validation.
//! - [`mountpath`]: per-disk folders, `openat2(RESOLVE_BENEATH)` opening, stream limits.
//! - [`server`]: the HTTP server (`run(listener, config, shutdown)`), handlers, metrics.

pub mod config;
pub mod mountpath;
pub mod server;

pub use config::{ConfigError, StorageConfig};
pub use server::{metrics_handle, run, StorageError, CHECKSUM_HEADER};
