//! The restart-marker fast path ([`sluice_cpu::restart`]) against the plain decode: a JPEG
//! given restart markers at shard time decodes every window, at every DCT scale, to exactly
//! the bytes the original gives, whether the decoder entered it at a marker or not.

mod common;

use sluice_cpu::jpeg::{with_restart_markers, DecodeLimits, JpegDecoder, Rect};
use sluice_cpu::restart;

/// The corpus when present, else generated JPEGs of awkward sizes (4:2:0, as the image crate
/// writes them), and a grey one.
fn inputs() -> Vec<(String, Vec<u8>)> {
    if let Some(files) = common::corpus() {
        return files
            .iter()
            .step_by(8)
            .map(|p| (p.display().to_string(), std::fs::read(p).unwrap()))
            .collect();
    }
    eprintln!("../shared/data/imagenet-sample is absent: testing generated JPEGs");
    let mut v: Vec<(String, Vec<u8>)> = [(500, 375), (333, 500), (97, 203), (640, 17)]
        .into_iter()
        .enumerate()
        .map(|(i, (w, h))| (format!("generated {w}x{h}"), common::jpeg(w, h, i as u32)))
        .collect();
    let grey = image::GrayImage::from_fn(300, 211, |x, y| image::Luma([((x * y) % 251) as u8]));
    let mut g = Vec::new();
    image::codecs::jpeg::JpegEncoder::new(&mut g)
        .encode_image(&grey)
        .unwrap();
    v.push(("generated grey 300x211".into(), g));
    v
}

#[test]
fn windows_decode_to_the_same_bytes_with_and_without_restart_markers() {
    let mut dec = JpegDecoder::new(DecodeLimits::default()).unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut seed = 0x9e37_79b9u32;
    let mut next = |n: u32| {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed % n.max(1)
    };
    let (mut entered, mut files, mut tiled) = (0, 0, 0);
    for (name, original) in inputs() {
        let Some(marked) = with_restart_markers(&original, DecodeLimits::default()).unwrap() else {
            continue; // progressive: left as it is
        };
        files += 1;
        let layout = restart::layout(&marked).unwrap_or_else(|| panic!("{name}: no layout"));
        tiled += usize::from(layout.cols > 1);
        assert!(restart::layout(&original).is_none());
        let header = dec.header(&original).unwrap();
        assert_eq!(dec.header(&marked).unwrap(), header, "{name}");
        for i in 0..16 {
            let w = 1 + next(header.width);
            let h = 1 + next(header.height);
            let mut y = next(header.height - h + 1);
            let mut x = next(header.width - w + 1);
            if i % 2 == 0 {
                // Just inside an interval's edge, where the upsampling context matters most.
                y = (y / layout.cell_h * layout.cell_h + next(20)).min(header.height - h);
                x = (x / layout.cell_w * layout.cell_w + next(20)).min(header.width - w);
            }
            let want = Rect { x, y, w, h };
            for scale in [1, 2, 4, 8] {
                let da = dec
                    .header(&original)
                    .and_then(|hd| dec.decode_region(&original, &hd, want, scale, &mut a));
                let db = dec
                    .header(&marked)
                    .and_then(|hd| dec.decode_region(&marked, &hd, want, scale, &mut b));
                assert_eq!(da.unwrap(), db.unwrap(), "{name} {want:?} at {scale}/8");
                assert!(a == b, "{name}: {want:?} at {scale}/8 differs");
            }
            let around = (want.x, want.y, want.x + want.w, want.y + want.h);
            let mut sub = Vec::new();
            if restart::sub_image(&marked, &layout, around, &mut sub).is_some() {
                entered += 1;
            }
        }
    }
    assert!(files > 0);
    assert!(entered > 0, "no window was decoded from a sub image");
    assert!(tiled > 0, "no file was given intervals across its rows");
}

#[test]
fn sub_images_refuse_what_the_data_does_not_support() {
    let (_, jpeg) = inputs().swap_remove(0);
    let marked = with_restart_markers(&jpeg, DecodeLimits::default())
        .unwrap()
        .unwrap();
    let l = restart::layout(&marked).unwrap();
    let mut out = Vec::new();
    let (w, h) = (l.width, l.height);
    // The whole image, or nothing of it: no sub image.
    assert!(restart::sub_image(&marked, &l, (0, 0, w, h), &mut out).is_none());
    assert!(restart::sub_image(&marked, &l, (w, h, w + 9, h + 9), &mut out).is_none());
    // The last row of intervals alone.
    let last = (h - 1) / l.cell_h * l.cell_h;
    assert_eq!(
        restart::sub_image(&marked, &l, (0, last, w, h), &mut out),
        Some((0, last))
    );
    // Cut an eighth of the way in: the middle rows' intervals are not there.
    let cut = &marked[..marked.len() / 8];
    if let Some(l) = restart::layout(cut) {
        let middle = l.height / 2;
        assert!(restart::sub_image(cut, &l, (0, middle, w, middle + 1), &mut out).is_none());
    }
    // Marked twice is marked once.
    assert!(with_restart_markers(&marked, DecodeLimits::default())
        .unwrap()
        .is_none());
}

/// Damaged marked JPEGs (bytes flipped in the headers or the entropy data, markers lost,
/// truncation) give a decode error or pixels, never a panic or a read out of bounds, whether
/// the decoder enters them at a marker or not.
#[test]
fn damaged_marked_jpegs_fail_cleanly() {
    let mut dec = JpegDecoder::new(DecodeLimits::default()).unwrap();
    let mut out = Vec::new();
    let mut seed = 0x2545_f491u32;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed as usize % n.max(1)
    };
    for (_, original) in inputs().into_iter().take(6) {
        let Some(marked) = with_restart_markers(&original, DecodeLimits::default()).unwrap() else {
            continue;
        };
        for round in 0..60 {
            let mut bad = marked.clone();
            match round % 3 {
                0 => {
                    for _ in 0..4 {
                        let i = next(bad.len().min(700));
                        bad[i] ^= 1 << next(8);
                    }
                }
                1 => {
                    let i = next(bad.len());
                    bad[i] = [0xFF, 0xD0 + next(8) as u8, 0x00][next(3)];
                }
                _ => bad.truncate(next(bad.len())),
            }
            let Ok(header) = dec.header(&bad) else {
                continue;
            };
            let (x, y) = (next(header.width as usize) as u32, header.height / 2);
            let want = Rect {
                x,
                y,
                w: header.width - x,
                h: header.height - y,
            };
            let _ = dec.decode_region(&bad, &header, want, [1, 2, 4, 8][next(4)], &mut out);
            let mut sub = Vec::new();
            if let Some(l) = restart::layout(&bad) {
                let (x0, y0) = (
                    next(l.width as usize) as u32,
                    next(l.height as usize) as u32,
                );
                let around = (x0, y0, x0 + 1 + next(64) as u32, y0 + 1 + next(64) as u32);
                let _ = restart::sub_image(&bad, &l, around, &mut sub);
            }
        }
    }
}
