//! What a CPU worker does with a job, as a trait: the QUIC daemon serves it to remote clients,
//! and a client runs it in its own process when no daemon is wanted. The client never names
//! the implementation (the CPU tier's engine), so it links no decoder unless its user does.

use crate::message::{Assign, JobSpec, SampleHeader, SampleShape, SkippedSample};

/// One result of an assignment, in the order the worker produced it.
#[derive(Debug)]
pub enum Output {
    /// The header and its payload: the tensor, then each field's bytes.
    Sample(SampleHeader, Vec<u8>),
    Skipped(SkippedSample),
}

/// Counts of a finished assignment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Finished {
    pub sent: u64,
    pub skipped: u64,
}

/// A worker: opens jobs.
pub trait UnitRunner: Send + Sync {
    /// Checks the job (pipeline, geometry) and prepares to run its units.
    fn open_job(&self, spec: &JobSpec) -> Result<Box<dyn JobRunner>, String>;
    /// Decode threads, for logs and sizing.
    fn threads(&self) -> u32;
}

/// An open job.
pub trait JobRunner: Send + Sync {
    /// The shape of every sample tensor.
    fn shape(&self) -> SampleShape;
    /// Processes an assignment, blocking, handing each result to `emit` (which blocks while
    /// the client has no credit, and returns `false` to cancel). `Err` names what failed.
    fn run(
        &self,
        assign: &Assign,
        emit: &mut dyn FnMut(Output) -> bool,
    ) -> Result<Finished, String>;
}
