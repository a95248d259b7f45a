//! Test helpers shared by the crate's unit tests.

use sluice_wire::{Assign, Finished, Output, RunnerError, SampleHeader};

/// Runs `a` as a worker in process would: one sample per index, whose label and tensor
/// `sample(index)` gives, each emitted against the caller's credit.
pub(crate) fn emit_unit(
    a: &Assign,
    emit: &mut dyn FnMut(Output) -> bool,
    sample: impl Fn(u64) -> (i64, Vec<u8>),
) -> Result<Finished, RunnerError> {
    for index in a.start..a.end {
        let (label, tensor) = sample(index);
        let header = SampleHeader {
            job: a.job,
            unit: a.unit,
            attempt: a.attempt,
            shard: a.shard.index,
            index,
            key: format!("{index}"),
            label: Some(label),
            tensor_bytes: tensor.len() as u64,
            fields: Vec::new(),
            geometry: Default::default(),
            has: Vec::new(),
        };
        if !emit(Output::Sample(header, tensor)) {
            return Err(RunnerError::Cancelled);
        }
    }
    Ok(Finished {
        sent: a.end - a.start,
        ..Finished::default()
    })
}
