//! Helpers for the engine's integration tests: corpus and Python lookup, image generation.

#![allow(dead_code)]

#[path = "../../../tests/support/run.rs"]
mod run;
#[allow(unused_imports)] // each test file uses some
pub use run::{python_with, succeed};

use std::path::{Path, PathBuf};

use sluice_shard::{Field, Sample};

/// `../shared/data/imagenet-sample`'s JPEGs (sorted), or `None` when absent.
pub fn corpus() -> Option<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/imagenet-sample");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "JPEG"))
        .collect();
    files.sort();
    (!files.is_empty()).then_some(files)
}

/// A JPEG of a smooth test pattern, `w`×`h`, seeded.
pub fn jpeg(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let v = (x * 3 + y * 5 + seed * 17) % 256;
        image::Rgb([
            v as u8,
            ((x * 7 + seed) % 256) as u8,
            ((y * 11 + seed * 3) % 256) as u8,
        ])
    });
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
        .encode_image(&img)
        .unwrap();
    out
}

/// A sample with these fields, and a `cls` label (its index) when they have none: the
/// engine's default job reads labels from `cls` and skips a sample without one.
pub fn sample(index: u64, fields: Vec<(&str, Vec<u8>)>) -> Sample {
    let mut fields: Vec<Field> = fields
        .into_iter()
        .map(|(n, d)| Field {
            name: n.into(),
            data: d,
        })
        .collect();
    if !fields.iter().any(|f| f.name == "cls") {
        fields.push(Field {
            name: "cls".into(),
            data: index.to_string().into_bytes(),
        });
    }
    Sample {
        shard: "test.tar".into(),
        key: format!("s{index:04}"),
        index,
        start: 0,
        end: 0,
        fields,
        checksum: None,
    }
}
