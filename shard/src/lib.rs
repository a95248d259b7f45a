//! The WebDataset shard format, as every Sluice tier reads and writes it.
//!
//! - [`tar`]: a sans-IO tar decoder (ustar, GNU, pax), strict where other readers are lax.
//! - [`read`]: a blocking reader over it, with streaming gzip; no seeking, so shards
//!   can be parsed while they arrive over the network.
//! - [`sample`]: grouping entries into samples by the WebDataset key rule.
//! - [`write`]: deterministic shard writing with size/count limits and sidecar indexes.
//! - [`spares`]: field buffers handed back for the next reads.
//! - [`index`]: the per-shard `.idx` sidecar (byte range and checksum of every sample).
//! - [`manifest`]: the dataset manifest (shards, sizes, counts, checksums).
//! - [`pattern`]: brace notation for shard lists.
//!
//! This crate is pure format logic plus a blocking reader: it depends on no network client,
//! clock, metrics or runtime.

pub mod error;
pub mod index;
pub mod manifest;
pub mod pattern;
pub mod read;
pub mod sample;
pub mod spares;
pub mod tar;
pub mod write;

pub use error::{Result, ShardError};
pub use index::{scan_shard, IndexEntry, SampleIndex, ScannedSample};
pub use manifest::{resolve_url, Checksum, Compression, Manifest, ShardInfo};
pub use pattern::expand;
pub use read::{open_shard, Entry, ReadOptions, SampleReader, TarReader};
pub use sample::{escaped_key, split_key, Field, Sample, SampleGrouper};
pub use spares::Spares;
pub use tar::Limits;
pub use write::{encode_sample, format_pattern, ShardWriter, WriterConfig, WrittenShard};
