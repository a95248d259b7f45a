//! The wire frame decoder on arbitrary bytes: every input decodes into frames or a typed
//! error, never a panic, and a decoded frame re-encodes to the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::{decode_frame, encode_frame, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_header: 4096, max_payload: 1 << 16 };
    let mut rest = data;
    while let Ok(Some((frame, used))) = decode_frame(rest, &limits) {
        let mut again = Vec::new();
        encode_frame(&frame.message, frame.payload, &limits, &mut again)
            .expect("a decoded frame encodes");
        let (back, _) = decode_frame(&again, &limits).unwrap().unwrap();
        assert_eq!(back.message, frame.message);
        rest = &rest[used..];
    }
});
