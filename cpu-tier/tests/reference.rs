//! Pixels against a reference decoder: Pillow (its own libjpeg-turbo build) on the real
//! corpus. Full decodes must agree within max |Δ| ≤ 1 (mean < 0.01; measured: identical), and
//! the torchvision eval geometry (`Resize(256)` then `CenterCrop(224)`, PIL bilinear) within
//! max |Δ| ≤ 2, mean < 0.3 (measured: max 1, worst mean 0.24): we resample the crop window once
//! where torchvision resizes the whole image and then crops. Also a CMYK JPEG written by
//! Pillow. Skips without a Python that has Pillow (CI provides one).

mod common;

use std::path::PathBuf;
use std::process::Command;

use sluice_cpu::jpeg::{DecodeLimits, JpegDecoder, Rect};
use sluice_cpu::{Engine, EngineConfig, Outcome, SampleContext};

const PILLOW: &str = r#"
import sys
from PIL import Image
out = sys.argv[1]
cm = Image.open(sys.argv[2]).convert("CMYK")
cm.save(out + "/cmyk.jpg", quality=95)
paths = sys.argv[2:] + [out + "/cmyk.jpg"]
for i, p in enumerate(paths):
    im = Image.open(p).convert("RGB")
    w, h = im.size
    open(f"{out}/{i}.full", "wb").write(im.tobytes())
    if w <= h:
        nw, nh = 256, int(256 * h / w)
    else:
        nw, nh = int(256 * w / h), 256
    r = im.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - 224) / 2.0)), int(round((nw - 224) / 2.0))
    open(f"{out}/{i}.crop", "wb").write(r.crop((left, top, left + 224, top + 224)).tobytes())
    print(p, w, h)
"#;

fn diff(a: &[u8], b: &[u8]) -> (u8, f64) {
    assert_eq!(a.len(), b.len());
    let mut max = 0u8;
    let mut sum = 0u64;
    for (x, y) in a.iter().zip(b) {
        let d = x.abs_diff(*y);
        max = max.max(d);
        sum += u64::from(d);
    }
    (max, sum as f64 / a.len() as f64)
}

#[test]
fn decodes_and_center_crops_like_pillow() {
    let Some(python) = common::python_with("PIL") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = match common::corpus() {
        Some(f) => f.into_iter().step_by(8).collect(),
        None => {
            eprintln!("../shared/data/imagenet-sample is absent: comparing generated JPEGs");
            (0..20u32)
                .map(|i| {
                    let p = dir.path().join(format!("g{i}.jpg"));
                    std::fs::write(&p, common::jpeg(300 + i * 13, 250 + i * 7, i)).unwrap();
                    p
                })
                .collect()
        }
    };
    let out = common::succeed(
        Command::new(&python)
            .arg("-c")
            .arg(PILLOW)
            .arg(dir.path())
            .args(&files),
    );
    let listing = String::from_utf8(out.stdout).unwrap();
    let engine = Engine::new(
        "decode | resize 256 | center_crop 224".parse().unwrap(),
        EngineConfig {
            threads: 1,
            dct_scaling: false,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let mut decoder = JpegDecoder::new(DecodeLimits::default()).unwrap();
    let (mut worst_full, mut worst_crop) = ((0u8, 0f64), (0u8, 0f64));
    for (i, line) in listing.lines().enumerate() {
        let mut parts = line.rsplitn(3, ' ');
        let (h, w, path) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        let (w, h): (u32, u32) = (w.parse().unwrap(), h.parse().unwrap());
        let data = std::fs::read(path).unwrap();
        let header = decoder.header(&data).unwrap();
        assert_eq!((header.width, header.height), (w, h), "{path}");
        let mut rgb = Vec::new();
        decoder
            .decode_region(&data, &header, Rect { x: 0, y: 0, w, h }, 8, &mut rgb)
            .unwrap();
        let full = diff(
            &rgb,
            &std::fs::read(dir.path().join(format!("{i}.full"))).unwrap(),
        );
        assert!(
            full.0 <= 1 && full.1 < 0.01,
            "{path}: full decode differs from Pillow by max {} mean {:.3}",
            full.0,
            full.1
        );
        let sample = common::sample(i as u64, vec![("jpg", data)]);
        let Outcome::Done(p) = engine.process(
            &sample,
            &SampleContext {
                seed: 0,
                epoch: 0,
                shard: 0,
            },
        ) else {
            panic!("{path}")
        };
        let crop = diff(
            &p.tensor.data,
            &std::fs::read(dir.path().join(format!("{i}.crop"))).unwrap(),
        );
        assert!(
            crop.0 <= 2 && crop.1 < 0.3,
            "{path}: resize+center crop differs from Pillow by max {} mean {:.3}",
            crop.0,
            crop.1
        );
        worst_full = (worst_full.0.max(full.0), worst_full.1.max(full.1));
        worst_crop = (worst_crop.0.max(crop.0), worst_crop.1.max(crop.1));
    }
    eprintln!(
        "{} images: full decode max |Δ| {} (worst mean {:.4}); resize+center crop max |Δ| {} (worst mean {:.4})",
        listing.lines().count(),
        worst_full.0,
        worst_full.1,
        worst_crop.0,
        worst_crop.1
    );
}
