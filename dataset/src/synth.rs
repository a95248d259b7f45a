//! A synthetic ImageFolder dataset of real JPEG files, for demos, tests and load generation on
//! machines without a dataset. Images are 320–512 pixels a side, smooth colour fields with
//! shapes and grain (so they compress and decode like photographs rather than like flat colour
//! or noise), a hue per class. The same seed gives the same files.

use std::path::Path;

use image::codecs::jpeg::JpegEncoder;
use image::{ExtendedColorType, ImageEncoder};

use crate::error::{DatasetError, Result};

/// A tiny seeded generator (splitmix64) for test content; not used for planning.
struct Rand(u64);

impl Rand {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next() % u64::from(hi - lo + 1)) as u32
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Renders one image as RGB bytes.
pub fn render(seed: u64, class: u32, classes: u32) -> (u32, u32, Vec<u8>) {
    let mut r = Rand(seed);
    let (w, h) = (r.range(320, 512), r.range(256, 512));
    let hue = class as f32 / classes.max(1) as f32 * std::f32::consts::TAU;
    let base = [
        hue.cos() * 0.5 + 0.5,
        (hue + 2.1).cos() * 0.5 + 0.5,
        (hue + 4.2).cos() * 0.5 + 0.5,
    ];
    let (fx, fy, phase) = (
        r.unit() * 0.05 + 0.005,
        r.unit() * 0.05 + 0.005,
        r.unit() * 6.0,
    );
    let shapes: Vec<(f32, f32, f32, [f32; 3])> = (0..r.range(2, 6))
        .map(|_| {
            let c = [r.unit(), r.unit(), r.unit()];
            (
                r.unit() * w as f32,
                r.unit() * h as f32,
                20.0 + r.unit() * 120.0,
                c,
            )
        })
        .collect();
    let mut px = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let (xf, yf) = (x as f32, y as f32);
            let wave = ((xf * fx + phase).sin() * (yf * fy).cos()) * 0.25;
            let mut c = [base[0] + wave, base[1] - wave, base[2] + wave * 0.5];
            for (cx, cy, rad, col) in &shapes {
                let d = ((xf - cx).powi(2) + (yf - cy).powi(2)).sqrt();
                if d < *rad {
                    let t = 1.0 - d / rad;
                    for k in 0..3 {
                        c[k] = c[k] * (1.0 - t) + col[k] * t;
                    }
                }
            }
            for v in c {
                let grain = (r.next() % 17) as f32 - 8.0;
                px.push((v * 255.0 + grain).clamp(0.0, 255.0) as u8);
            }
        }
    }
    (w, h, px)
}

/// Encodes one image as JPEG.
pub fn encode_jpeg(w: u32, h: u32, rgb: &[u8], quality: u8) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, quality).write_image(
        rgb,
        w,
        h,
        ExtendedColorType::Rgb8,
    )?;
    Ok(out)
}

/// Writes `classes × per_class` JPEGs under `output/class_NNN/`; returns the file count.
pub fn generate(
    output: &Path,
    classes: u32,
    per_class: u32,
    seed: u64,
    quality: u8,
) -> Result<u64> {
    if classes == 0 || per_class == 0 {
        return Err(DatasetError::Input(
            "classes and images per class must be at least 1".into(),
        ));
    }
    if !(1..=100).contains(&quality) {
        return Err(DatasetError::Input(format!(
            "JPEG quality {quality} is not in 1-100"
        )));
    }
    let jobs: Vec<(u32, u32)> = (0..classes)
        .flat_map(|c| (0..per_class).map(move |i| (c, i)))
        .collect();
    for c in 0..classes {
        let dir = output.join(format!("class_{c:03}"));
        std::fs::create_dir_all(&dir).map_err(DatasetError::io("creating", &dir))?;
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = jobs.len().div_ceil(threads);
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = jobs
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || -> Result<()> {
                    for &(c, i) in part {
                        let img_seed = seed
                            ^ (u64::from(c) << 32 | u64::from(i))
                                .wrapping_mul(0x2545_f491_4f6c_dd1d);
                        let (w, h, px) = render(img_seed, c, classes);
                        let jpeg = encode_jpeg(w, h, &px, quality)?;
                        let path = output.join(format!("class_{c:03}/img_{c:03}_{i:05}.jpg"));
                        std::fs::write(&path, jpeg).map_err(DatasetError::io("writing", &path))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| DatasetError::Input("a generator thread panicked".into()))??;
        }
        Ok(())
    })?;
    Ok(jobs.len() as u64)
}
