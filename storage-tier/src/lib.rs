//! The storage tier (`sluice storage`): serves shards from local disks over HTTP/1.1 with
//! Range, at the disks' sequential speed.
//!
//! - [`config`]: the TOML config and its validation.
//! - [`connection`]: one connection: GET/HEAD parsed here and object bodies sent with
//!   `sendfile`; anything else handed to hyper.
//! - [`mountpath`]: per-disk folders, `openat2(RESOLVE_BENEATH)` opening, stream limits.
//! - [`s3`]: the S3-compatible read path's SigV4 check and XML bodies.
//! - [`server`]: the HTTP server (`run(listener, config, shutdown)`), handlers, metrics.

pub mod config;
pub mod connection;
pub mod mountpath;
pub mod s3;
pub mod server;

pub use config::{ConfigError, StorageConfig};
pub use server::{metrics_handle, run, StorageError, CHECKSUM_HEADER};
