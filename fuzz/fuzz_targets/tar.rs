//! The tar reader and sample grouping on arbitrary bytes: every input ends in samples or a
//! typed error, never a panic, and no read allocates past the limits.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_shard::{Limits, ReadOptions, SampleReader};

fuzz_target!(|data: &[u8]| {
    let options = ReadOptions {
        limits: Limits { max_entry_size: 1 << 20, max_meta_size: 64 << 10 },
        ..ReadOptions::default()
    };
    for sample in SampleReader::new(data, "fuzz.tar", &options) {
        if sample.is_err() {
            break;
        }
    }
});
