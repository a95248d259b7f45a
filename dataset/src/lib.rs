//! Dataset tools beside the shard format, used by the `sluice` CLI (`synth`, `shard`,
//! `index`), the demo and the test bed:
//! - [`synth`]: a seeded synthetic ImageFolder of real JPEGs (photograph-like content);
//! - [`write`]: an ImageFolder, a flat folder with a labels TSV, or a tar stream written as
//!   WebDataset shards in a seeded random order, with their `.idx` and a manifest;
//! - [`locate`]: shards named by path, `file://` or `http(s)://` URL and brace pattern,
//!   indexed into a manifest, or a manifest loaded with its shard URLs made absolute.
//!
//! Progress is reported through [`Progress`], so the CLI draws bars and tests stay quiet.

pub mod error;
pub mod locate;
pub mod mixture;
pub mod synth;
pub mod write;

pub use error::{DatasetError, Result};

/// Receives progress from the long-running tools: samples done and their payload bytes.
pub trait Progress {
    fn add(&mut self, samples: u64, bytes: u64);
    /// Something the user should know that is not an error (files skipped, rows missing).
    fn note(&mut self, message: &str) {
        let _ = message;
    }
}

/// Progress that goes nowhere.
pub struct Quiet;

impl Progress for Quiet {
    fn add(&mut self, _samples: u64, _bytes: u64) {}
}
