//! The vendored libjpeg-turbo's fast Huffman path in scans with restart markers (see
//! `vendor/README.md`) against upstream's slow path, on arbitrary bytes: the same DCT
//! coefficients, or the same refusal. Seed it with JPEGs that have markers (`sluice shard`'s
//! output, or `sluice_cpu::jpeg::with_restart_markers` of any JPEG); the fuzzer mutates their
//! scans. Only the "extraneous bytes before marker" warning may differ
//! (`cpu-tier/tests/huffman_fast_path.rs` says why), so warnings are not compared.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_cpu::jpeg::{coefficients, restart_fast_path};

fuzz_target!(|data: &[u8]| {
    // Large frames cost the fuzzer time and find nothing new.
    if data.len() > 1 << 20 {
        return;
    }
    restart_fast_path(true);
    let fast = coefficients(data).map(|(c, _)| c).map_err(|e| e.to_string());
    restart_fast_path(false);
    let upstream = coefficients(data).map(|(c, _)| c).map_err(|e| e.to_string());
    restart_fast_path(true);
    assert!(fast == upstream, "the fast path differs from upstream's");
});
