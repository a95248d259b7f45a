//! The decode entry point on arbitrary bytes: whatever the bytes, the engine returns a sample
//! or a reported skip. A panic inside the engine is caught and reported as a skip with reason
//! `Panic`; here that is turned back into a crash so the fuzzer finds it.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice_cpu::{DecodeError, Engine, EngineConfig, Outcome, SampleContext};
use sluice_shard::{Field, Sample};

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let spec = "decode | random_resized_crop 64 | hflip 0.5".parse().expect("spec");
        // A small pixel limit keeps each input cheap, as a daemon's limit does.
        let mut config = EngineConfig { threads: 1, ..EngineConfig::default() };
        config.limits.max_pixels = 4_000_000;
        Engine::new(spec, config).expect("engine")
    })
}

fuzz_target!(|data: &[u8]| {
    let sample = Sample {
        shard: "fuzz.tar".into(),
        key: "k".into(),
        index: data.len() as u64,
        start: 0,
        end: 0,
        fields: vec![Field { name: "jpg".into(), data: data.to_vec() }],
    };
    if let Outcome::Skipped(e) = engine().process(&sample, &SampleContext { seed: 1, epoch: 0, shard: 0 }) {
        if let DecodeError::Panic(msg) = e.reason {
            panic!("the decoder panicked: {msg}");
        }
    }
});
