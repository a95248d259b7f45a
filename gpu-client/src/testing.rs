//! Test helpers shared by the crate's unit tests.

use sluice_wire::{Assign, Finished, Output, RunnerError};

/// Runs `a` as a worker in process would: one sample per index, whose label and tensor
/// `sample(index)` gives, each emitted against the caller's credit.
pub(crate) fn emit_unit(
    a: &Assign,
    emit: &mut dyn FnMut(Output) -> bool,
    sample: impl Fn(u64) -> (i64, Vec<u8>),
) -> Result<Finished, RunnerError> {
    sluice_wire::synthetic_unit(a, emit, |mut header| {
        let (label, tensor) = sample(header.index);
        header.label = Some(label);
        header.tensor_bytes = tensor.len() as u64;
        Output::Sample(header, tensor)
    })
}
