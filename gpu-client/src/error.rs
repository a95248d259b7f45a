//! The client's errors: each says which setting, worker, unit or shard it is about.

use std::time::Duration;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    #[error("loader setting {key}: {detail}")]
    Config { key: &'static str, detail: String },
    #[error(
        "every sample of epoch {epoch} was skipped ({skipped} samples), so no batch held \
             any; the first: {first}"
    )]
    AllSkipped {
        epoch: u64,
        skipped: u64,
        first: String,
    },
    #[error(
        "the first {skipped} samples of epoch {epoch} were all skipped, so no batch could hold \
         any: {reasons} (does every sample have the label and fields asked for? label=None \
         reads no label)"
    )]
    FirstSamplesSkipped {
        epoch: u64,
        skipped: u64,
        reasons: String,
    },
    #[error(transparent)]
    Plan(#[from] sluice_plan::PlanError),
    #[error("worker {worker}: {detail}")]
    Resolve { worker: String, detail: String },
    #[error("worker {worker} refused: {message}")]
    Refused { worker: String, message: String },
    #[error(
        "worker {worker}: TLS: {detail} (does --trust-cert hold the worker's cert.pem or its CA?)"
    )]
    Tls { worker: String, detail: String },
    #[error("worker {worker} broke the protocol: {detail}")]
    Protocol { worker: String, detail: String },
    #[error("workers {workers:?} disagree on the sample shape: {detail}")]
    Shape {
        workers: Vec<String>,
        detail: String,
    },
    #[error("no worker reachable for {waited:?}; last errors: {detail}")]
    WorkersLost { waited: Duration, detail: String },
    #[error("unit {unit} (samples {start}..{end} of shard {shard}) failed {attempts} times; last error: {error}")]
    UnitFailed {
        unit: u64,
        shard: String,
        start: u64,
        end: u64,
        attempts: u32,
        error: String,
    },
    #[error("the consumer holds all {ring_batches} ring buffers and waits for another batch: release batches (and tensors made from them) sooner, or raise ring_batches")]
    RingExhausted { ring_batches: usize },
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("the consumer went away")]
    ConsumerGone,
    #[error("the client's runtime: {0}")]
    Runtime(String),
    #[error("allocating batch buffers: {0}")]
    Allocate(String),
    #[error("CUDA upload: {0}")]
    Cuda(String),
}
