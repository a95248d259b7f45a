//! The storage tier (`sluice storage`): serves shards from local disks over HTTP/1.1 with
//! Range, at the disks' sequential speed.
//!
//! - [`config`]: the TOML config and its validation.
//! - [`connection`]: one connection: GET/HEAD parsed here and object bodies sent with
//!   `sendfile`; anything else handed to hyper.
//! - [`mountpath`]: per-disk folders, `openat2(RESOLVE_BENEATH)` opening, stream limits.
//! - [`server`]: the accept loop and lifecycle (`run(listener, config, shutdown)`), drain.
//! - [`routing`]: every request head routed to its handler; shared state, response helpers.
//! - [`objects`]: the `/v1/{bucket}/{key}` path: GET/HEAD with Range, redirects, PUT.
//! - [`listing`]: `/v1/{bucket}?prefix=` listings and the key walk S3 listings share.
//! - [`s3`]: the S3-compatible read path: routing, SigV4 check and XML bodies.
//! - [`placement`]: rendezvous hashing of objects onto the cluster's nodes.

pub mod config;
pub mod connection;
pub mod listing;
pub mod metrics;
pub mod mountpath;
pub mod objects;
pub mod placement;
pub mod routing;
pub mod s3;
pub mod server;
mod upload_tokens;

pub use config::{ConfigError, StorageConfig};
pub use objects::CHECKSUM_HEADER;
pub use server::{run, StorageError};
