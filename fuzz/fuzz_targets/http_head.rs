//! The storage server's request-head parser on arbitrary bytes: it never panics, a head it
//! answers lies within the bytes and the limit, and a request it answers has no body.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_storage::connection::{parse_head, Head};

fuzz_target!(|data: &[u8]| {
    let max = 4096;
    if let Head::Answer { request, len } = parse_head(data, max) {
        assert!(len <= data.len() && len <= max);
        assert!(matches!(request.method().as_str(), "GET" | "HEAD"));
        assert!(!request.headers().contains_key("transfer-encoding"));
    }
});
