//! Errors of the CPU tier: per-sample decode failures (which the bad-sample policy turns into
//! skips) and per-unit failures (a broken shard, a source that cannot be read).

/// Why one image could not be decoded or transformed.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("corrupt image: {0}")]
    Corrupt(String),
    #[error("truncated image: no end-of-image marker")]
    Truncated,
    #[error("image is {width}x{height}, over the limit of {limit} pixels")]
    TooLarge { width: u32, height: u32, limit: u64 },
    #[error("broken clip: {0}")]
    Clip(String),
    #[error("unsupported image format ({0})")]
    Unsupported(String),
    #[error("no image field (looked for {wanted}; the sample has {present})")]
    NoImage { wanted: String, present: String },
    #[error("decoder failure: {0}")]
    Decoder(String),
    #[error("the decoder panicked: {0}")]
    Panic(String),
    #[error("damaged in storage: {0}")]
    Damaged(String),
    #[error("label: {0}")]
    Label(String),
    #[error("field {field:?} is {bytes} bytes, over the limit of {limit} (max_field_bytes)")]
    FieldTooLarge {
        field: String,
        bytes: u64,
        limit: u64,
    },
}

/// A sample the engine could not process: which one, and why.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("sample {key:?} (#{index}) of shard {shard}: {reason}")]
pub struct SampleError {
    pub shard: String,
    pub key: String,
    pub index: u64,
    pub reason: DecodeError,
}

/// Why a work unit failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Shard(#[from] sluice_shard::ShardError),
    #[error(transparent)]
    Source(#[from] crate::source::SourceError),
    #[error("bad sample with policy \"fail\": {0}")]
    BadSample(SampleError),
    #[error("could not start the worker pool: {0}")]
    Pool(String),
}
