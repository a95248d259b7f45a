//! What a CPU worker does with a job, as a trait: the QUIC daemon serves it to remote clients,
//! and a client runs it in its own process when no daemon is wanted. The client never names
//! the implementation (the CPU tier's engine), so it links no decoder unless its user does.

use crate::message::{Assign, JobSpec, SampleHeader, SampleShape, SkippedSample};

/// One result of an assignment, in the order the worker produced it.
#[derive(Debug)]
pub enum Output {
    /// The header and its payload: the tensor, then each field's bytes.
    Sample(SampleHeader, Vec<u8>),
    /// A sample whose tensor the runner wrote straight into its place in the client's batch
    /// (claimed from the job's [`Places`]), that place, and each field's bytes.
    Placed(SampleHeader, u32, Vec<u8>),
    Skipped(SkippedSample),
    /// A sample (`Sample` or `Placed`) whose tensor was decoded for another job of its sweep
    /// and copied from there: [`drive_unit`] hands on the sample, and the worker charges its
    /// job's fair share the copy it cost, not a decode ([`Charge::Shared`]).
    Shared(Box<Output>),
}

/// What a sample cost the worker's decode slots, for the fair share of its job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charge {
    /// Decoded for this job (and perhaps kept for its sweep).
    Decoded,
    /// Copied from a decode made for another job of its sweep.
    Shared,
}

/// Where a job's samples may be written straight into the client's batches (the same-host
/// batch arena): the transport hands it to the job's runner ([`JobRunner::share_places`]).
pub trait Places: Send + Sync {
    /// The place the client gave for sample `index` of `(unit, attempt)`, if it gave one and
    /// it holds a tensor of `len` bytes: claimed (used once), writable until the claim drops.
    fn claim(&self, unit: u64, attempt: u32, index: u64, len: usize) -> Option<PlaceClaim<'_>>;
}

/// A claimed place: the memory to write one tensor into, the client's until this is dropped
/// (the transport may hold a lock meanwhile, so that a cancelled job's places are released
/// only once no write into them is under way).
pub struct PlaceClaim<'a> {
    place: u32,
    memory: &'a mut [u8],
    _held: Box<dyn Held + 'a>,
}

/// Anything a claim holds until it drops (a lock guard).
pub trait Held {}

impl<T> Held for T {}

impl<'a> PlaceClaim<'a> {
    /// A claim of `place`, whose memory is `memory`, held by `held` until dropped.
    pub fn new(place: u32, memory: &'a mut [u8], held: Box<dyn Held + 'a>) -> Self {
        PlaceClaim {
            place,
            memory,
            _held: held,
        }
    }

    pub fn place(&self) -> u32 {
        self.place
    }

    pub fn memory(&mut self) -> &mut [u8] {
        self.memory
    }
}

/// Counts of a finished assignment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Finished {
    pub sent: u64,
    pub skipped: u64,
    /// Bytes of shard data read from the storage tier, and from the worker's shard cache.
    pub storage_bytes: u64,
    pub cached_bytes: u64,
}

/// The implementation's own error under a [`RunnerError`] (a decoder's, a storage source's),
/// kept whole: its message and causes reach the client, and a caller in the same process can
/// downcast it.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a worker refused a job or did not finish an assignment.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The job cannot run on this worker (a pipeline it cannot parse, or whose samples have
    /// no fixed size); the client should not retry it elsewhere unchanged.
    #[error("job refused: {0}")]
    Refused(#[source] Cause),
    /// The assignment's data could not be read (every replica failed, the network broke);
    /// the client reassigns the unit.
    #[error(transparent)]
    Source(Cause),
    /// The shard is damaged and the job asked to fail on bad samples.
    #[error("{0}")]
    Damaged(String),
    /// The worker produced something the job did not ask for (a tensor of the wrong size).
    #[error("{0}")]
    Broken(String),
    /// The client cancelled the assignment (its `emit` returned false).
    #[error("cancelled")]
    Cancelled,
}

impl RunnerError {
    /// A job refused for a reason given as text.
    pub fn refused(reason: impl Into<String>) -> Self {
        RunnerError::Refused(reason.into().into())
    }
}

/// A worker: opens jobs.
pub trait UnitRunner: Send + Sync {
    /// Checks the job (pipeline, geometry) and prepares to run its units.
    fn open_job(&self, spec: &JobSpec) -> Result<Box<dyn JobRunner>, RunnerError>;
    /// Decode threads, for logs and sizing.
    fn threads(&self) -> u32;
    /// Whether it keeps a shard cache (clients then send each shard's units to the worker
    /// that owns it).
    fn caches(&self) -> bool {
        false
    }
}

/// Whether a unit may feed its decoder now: its turn on the worker's decode slots. A runner
/// that decodes ahead of what it sends (the CPU engine) hands samples to the shared decode
/// pool only while the unit holds its slot ([`Turn::wait`]), so a unit waiting for a slot does
/// not decode ahead and take the share of the jobs whose turn it is.
/// [`crate::session::UnitThread`] keeps it: paused while the unit waits for a slot, going
/// otherwise (a unit waiting for a credit may still fill its bounded queue).
#[derive(Debug, Default)]
pub struct Turn {
    paused: std::sync::Mutex<bool>,
    signal: std::sync::Condvar,
}

impl Turn {
    pub fn pause(&self) {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = true;
    }

    /// Whether the unit waits for its turn now.
    pub fn paused(&self) -> bool {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn resume(&self) {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.signal.notify_all();
    }

    /// Blocks while the turn is paused, looking every `poll` at `cancelled` (true ends the
    /// wait too: a runner that gave up must not wait for a turn nobody will give).
    pub fn wait(&self, poll: std::time::Duration, cancelled: impl Fn() -> bool) {
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        while *paused && !cancelled() {
            paused = self
                .signal
                .wait_timeout(paused, poll)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// An open job.
pub trait JobRunner: Send + Sync {
    /// The shape of every sample tensor.
    fn shape(&self) -> SampleShape;
    /// Processes an assignment, blocking, handing each result to `emit` (which blocks while
    /// the client has no credit, and returns `false` to cancel). `Err` says what failed.
    fn run(
        &self,
        assign: &Assign,
        emit: &mut dyn FnMut(Output) -> bool,
    ) -> Result<Finished, RunnerError>;
    /// [`JobRunner::run`], feeding its decoder only while `turn` says the unit holds its slot
    /// (a runner that decodes nothing ahead of what it emits needs no more than `run`).
    fn run_paced(
        &self,
        assign: &Assign,
        emit: &mut dyn FnMut(Output) -> bool,
        _turn: &Turn,
    ) -> Result<Finished, RunnerError> {
        self.run(assign, emit)
    }
    /// Takes back a sample's payload once the transport has sent or copied it, for the
    /// runner to write a later sample into (the default drops it).
    fn recycle(&self, _payload: Vec<u8>) {}
    /// The client shares its batches: a runner that can write a sample's tensor straight
    /// into its place claims it there and emits [`Output::Placed`] (the default ignores it,
    /// and the transport copies each tensor into its place).
    fn share_places(&self, _places: std::sync::Arc<dyn Places>) {}
}

/// How a unit driven by [`drive_unit`] ended: the frame that reports it to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitEnd {
    Done(crate::message::UnitDone),
    Failed(crate::message::UnitFailed),
}

/// Runs one assignment of an open job: the unit driver the `sluice cpu` daemon and the
/// client's in-process mode share. Before each sample goes out, `take_credit` must grant it
/// a credit, told what the sample cost (it blocks while the client has none; `false` cancels
/// the unit); `forward` hands each output on (`false` cancels too), never an
/// [`Output::Shared`]: its sample. Returns the frame that ends the unit.
pub fn drive_unit(
    runner: &dyn JobRunner,
    assign: &Assign,
    turn: &Turn,
    mut take_credit: impl FnMut(Charge) -> bool,
    mut forward: impl FnMut(Output) -> bool,
) -> UnitEnd {
    let mut emit = |output: Output| -> bool {
        let (output, charge) = match output {
            Output::Shared(inner) => (*inner, Charge::Shared),
            other => (other, Charge::Decoded),
        };
        if matches!(output, Output::Sample(..) | Output::Placed(..)) && !take_credit(charge) {
            return false;
        }
        forward(output)
    };
    match runner.run_paced(assign, &mut emit, turn) {
        Ok(f) => UnitEnd::Done(crate::message::UnitDone {
            job: assign.job,
            unit: assign.unit,
            attempt: assign.attempt,
            sent: f.sent,
            skipped: f.skipped,
            storage_bytes: f.storage_bytes,
            cached_bytes: f.cached_bytes,
        }),
        Err(error) => UnitEnd::Failed(crate::message::UnitFailed {
            job: assign.job,
            unit: assign.unit,
            attempt: assign.attempt,
            error: error_chain(&error),
        }),
    }
}

/// Runs `a` as a synthetic unit (benchmarks' and tests' workers, which decode nothing): one
/// output per sample index, what `output` makes of the sample's header (key `index` in 8
/// digits, label 0, no tensor bytes until `output` sets them), each handed to `emit`.
pub fn synthetic_unit(
    a: &Assign,
    emit: &mut dyn FnMut(Output) -> bool,
    mut output: impl FnMut(SampleHeader) -> Output,
) -> Result<Finished, RunnerError> {
    for index in a.start..a.end {
        let header = SampleHeader {
            job: a.job,
            unit: a.unit,
            attempt: a.attempt,
            shard: a.shard.index,
            index,
            key: format!("{index:08}"),
            label: Some(0),
            tensor_bytes: 0,
            fields: Vec::new(),
            geometry: Default::default(),
            has: Vec::new(),
        };
        if !emit(output(header)) {
            return Err(RunnerError::Cancelled);
        }
    }
    Ok(Finished {
        sent: a.end - a.start,
        ..Finished::default()
    })
}

/// An error and its causes as one line, each said once (the frame that reports a failed
/// unit carries text: the client may be on another host).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !text.contains(&c_text) {
            text.push_str(": ");
            text.push_str(&c_text);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ShardRef;

    /// Emits samples `start..end`, skipping index 2; fails when asked for sample 99.
    struct Counting;

    impl JobRunner for Counting {
        fn shape(&self) -> SampleShape {
            SampleShape::image_u8(1, 1, 1)
        }

        fn run(
            &self,
            assign: &Assign,
            emit: &mut dyn FnMut(Output) -> bool,
        ) -> Result<Finished, RunnerError> {
            let mut f = Finished::default();
            for index in assign.start..assign.end {
                if index == 99 {
                    return Err(RunnerError::Broken("sample 99 is cursed".into()));
                }
                let out = if index == 2 {
                    f.skipped += 1;
                    Output::Skipped(SkippedSample {
                        job: assign.job,
                        unit: assign.unit,
                        attempt: assign.attempt,
                        shard: 0,
                        index,
                        key: index.to_string(),
                        reason: "bad".into(),
                    })
                } else {
                    f.sent += 1;
                    Output::Sample(
                        SampleHeader {
                            job: assign.job,
                            unit: assign.unit,
                            attempt: assign.attempt,
                            shard: 0,
                            index,
                            key: index.to_string(),
                            label: None,
                            tensor_bytes: 1,
                            fields: Vec::new(),
                            geometry: Default::default(),
                            has: Vec::new(),
                        },
                        vec![index as u8],
                    )
                };
                if !emit(out) {
                    return Err(RunnerError::Cancelled);
                }
            }
            Ok(f)
        }
    }

    fn assign(start: u64, end: u64) -> Assign {
        Assign {
            job: 7,
            unit: 3,
            attempt: 1,
            shard: ShardRef {
                index: 0,
                urls: vec![],
                size: 0,
                samples: 200,
                checksum: 0,
                gzip: false,
            },
            start,
            end,
        }
    }

    #[test]
    fn samples_take_credits_skips_do_not_and_the_end_names_the_attempt() {
        let (mut credits, mut seen) = (0, Vec::new());
        let end = drive_unit(
            &Counting,
            &assign(0, 5),
            &Turn::default(),
            |_| {
                credits += 1;
                true
            },
            |o| {
                seen.push(matches!(o, Output::Sample(..)));
                true
            },
        );
        assert_eq!(credits, 4, "one credit per sample, none for the skip");
        assert_eq!(seen, [true, true, false, true, true]);
        let UnitEnd::Done(d) = end else {
            panic!("{end:?}")
        };
        assert_eq!(
            (d.job, d.unit, d.attempt, d.sent, d.skipped),
            (7, 3, 1, 4, 1)
        );
        // No credit: the unit stops and reports a failure.
        let turn = Turn::default();
        let end = drive_unit(&Counting, &assign(0, 5), &turn, |_| false, |_| true);
        assert!(matches!(end, UnitEnd::Failed(f) if f.error == "cancelled"));
        let end = drive_unit(&Counting, &assign(98, 100), &turn, |_| true, |_| true);
        assert!(matches!(end, UnitEnd::Failed(f) if f.error.contains("cursed")));
    }
}
