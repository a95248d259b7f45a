//! The shard crate's error type. Every variant that comes from reading a shard names the shard
//! and the byte offset (in the uncompressed tar stream) where the problem starts, so an
//! operator can find it with `dd` or `tar -tv`, and a daemon can log it and move on.

use std::io;

/// An error reading, writing or describing a shard.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("truncated shard {shard}: {what} at byte {offset} needs {needed} more bytes, but the stream ended")]
    Truncated {
        shard: String,
        offset: u64,
        what: String,
        needed: u64,
    },

    #[error("bad tar header checksum at byte {offset} of shard {shard} (stored {stored:?}, computed {computed:o}); not a tar file or a corrupt one")]
    BadChecksum {
        shard: String,
        offset: u64,
        stored: String,
        computed: u64,
    },

    #[error("tar entry {entry:?} at byte {offset} of shard {shard} is {size} bytes, over the limit of {limit} (raise the entry-size limit if this is intended)")]
    TooLarge {
        shard: String,
        offset: u64,
        entry: String,
        size: u64,
        limit: u64,
    },

    #[error("malformed {what} at byte {offset} of shard {shard}: {detail}")]
    Malformed {
        shard: String,
        offset: u64,
        what: &'static str,
        detail: String,
    },

    #[error("unsupported {what} at byte {offset} of shard {shard}: {detail}")]
    Unsupported {
        shard: String,
        offset: u64,
        what: &'static str,
        detail: String,
    },

    #[error("sample #{index} at byte {offset} of shard {shard} is damaged: {detail}")]
    DamagedSample {
        shard: String,
        offset: u64,
        index: u64,
        key: String,
        detail: String,
    },

    /// The bytes read are not the ones `sluice index` described (the file was rewritten,
    /// replaced or resized in place since): nothing of it is delivered under the old ids.
    #[error("shard {shard} changed since it was indexed: {detail}; re-run sluice index")]
    Changed { shard: String, detail: String },

    #[error("I/O error on shard {shard} at byte {offset}: {source}")]
    Io {
        shard: String,
        offset: u64,
        #[source]
        source: io::Error,
    },

    #[error("invalid sample {key:?} for shard writer: {detail}")]
    InvalidSample { key: String, detail: String },

    #[error("invalid shard pattern {pattern:?}: {detail}")]
    Pattern { pattern: String, detail: String },

    #[error("invalid manifest {path}: {detail}")]
    Manifest { path: String, detail: String },

    #[error("invalid sample index {path}: {detail}")]
    Index { path: String, detail: String },
}

impl ShardError {
    /// The shard's bytes are wrong (its structure or a sample's checksum), as opposed to the
    /// reading of them failing (`Io`): trying the same bytes again cannot help.
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            ShardError::Truncated { .. }
                | ShardError::BadChecksum { .. }
                | ShardError::Malformed { .. }
                | ShardError::DamagedSample { .. }
                | ShardError::Changed { .. }
        )
    }

    /// The byte offset in the shard where a read error starts, when there is one.
    pub fn offset(&self) -> Option<u64> {
        match self {
            ShardError::Truncated { offset, .. }
            | ShardError::BadChecksum { offset, .. }
            | ShardError::TooLarge { offset, .. }
            | ShardError::Malformed { offset, .. }
            | ShardError::Unsupported { offset, .. }
            | ShardError::DamagedSample { offset, .. }
            | ShardError::Io { offset, .. } => Some(*offset),
            _ => None,
        }
    }
}

pub type Result<T, E = ShardError> = std::result::Result<T, E>;
