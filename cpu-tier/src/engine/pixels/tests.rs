//! The pixel ops' unit tests: known values, the draws, the rounding helpers and the
//! affine records (`python/tests/test_pixel_ops.py` compares them with torchvision).

use super::affine::grid_index;
use super::augment::{magnitude, rand_augment_op, Aug, Space};
use super::*;

fn image() -> (Vec<u8>, u32, u32) {
    let (w, h) = (7u32, 5u32);
    let data = (0..w * h * 3)
        .map(|i| ((i * 37 + (i / 3) * 11) % 256) as u8)
        .collect();
    (data, w, h)
}

fn run(op: PixelOp) -> Vec<u8> {
    let (mut img, w, h) = image();
    apply(&[op], &mut img, (w, h), 0, &mut Vec::new());
    img
}

fn on(op: PixelOp, px: &mut [u8], w: u32, h: u32) {
    apply(&[op], px, (w, h), 0, &mut Vec::new());
}

#[test]
fn the_identities_are_identities() {
    let (img, _, _) = image();
    for op in [
        PixelOp::Brightness(1.0),
        PixelOp::Contrast(1.0),
        PixelOp::Saturation(1.0),
        PixelOp::Sharpness(1.0),
        PixelOp::Posterize(8),
        PixelOp::Solarize(256.0),
    ] {
        assert_eq!(run(op), img, "{op}");
    }
    // Hue 0 goes through HSV and back: exact on every value but the truncation's.
    let turned = run(PixelOp::Hue(0.0));
    assert!(
        turned.iter().zip(&img).all(|(a, b)| a.abs_diff(*b) <= 1),
        "hue 0"
    );
}

#[test]
fn each_op_does_what_torchvision_says_on_known_values() {
    // brightness 1.5 of 200 saturates; of 101 is 151.5, truncated.
    let mut px = vec![200, 101, 0];
    on(PixelOp::Brightness(1.5), &mut px, 1, 1);
    assert_eq!(px, [255, 151, 0]);
    let mut px = vec![10, 128, 250];
    on(PixelOp::Solarize(128.0), &mut px, 1, 1);
    assert_eq!(px, [10, 127, 5]);
    let mut px = vec![0b1011_0111, 255, 3];
    on(PixelOp::Posterize(3), &mut px, 1, 1);
    assert_eq!(px, [0b1010_0000, 0b1110_0000, 0]);
    let mut px = vec![0, 100, 255];
    on(PixelOp::Invert, &mut px, 1, 1);
    assert_eq!(px, [255, 155, 0]);
    // grey of (255, 0, 0): 76.2195, truncated.
    let mut px = vec![255, 0, 0];
    on(PixelOp::Grayscale, &mut px, 1, 1);
    assert_eq!(px, [76, 76, 76]);
    // Pure red turned by a third is pure green; by -1/3 pure blue.
    let mut px = vec![255, 0, 0, 255, 0, 0];
    on(PixelOp::Hue(1.0 / 3.0), &mut px[..3], 1, 1);
    on(PixelOp::Hue(-1.0 / 3.0), &mut px[3..], 1, 1);
    assert_eq!(px, [0, 255, 0, 0, 0, 255]);
}

#[test]
fn autocontrast_stretches_each_channel_and_equalize_spreads_it() {
    // Red spans 50..=150, green one value, blue the full range.
    let mut img = vec![50, 7, 0, 100, 7, 128, 150, 7, 255];
    on(PixelOp::Autocontrast, &mut img, 3, 1);
    // 150 maps to 100 / (100 * f32(1/255)) = 254.99998 in float32, truncated to 254, as
    // torchvision's does; blue's 255 to 255 / (255 * f32(1/255)) = 255.0.
    assert_eq!(img, [0, 7, 0, 127, 7, 128, 254, 7, 255]);
    // 300 pixels of value v = i % 3 in red: step = 200 / 255 = 0, so unchanged; with
    // 1,000 pixels spread over four values the table spreads them.
    let mut img: Vec<u8> = (0..1000).flat_map(|i| [(i % 4) as u8 * 10, 0, 0]).collect();
    on(PixelOp::Equalize, &mut img, 1000, 1);
    let values: std::collections::BTreeSet<u8> = img.chunks(3).map(|p| p[0]).collect();
    // cum = 250, 500, 750 over step = 750 / 255 = 2: (250 + 1) / 2 = 125, 250, 375 -> 255.
    assert_eq!(values.into_iter().collect::<Vec<_>>(), [0, 125, 250, 255]);
}

#[test]
fn sharpness_keeps_the_border_and_a_flat_image() {
    let mut flat = vec![90u8; 5 * 4 * 3];
    on(PixelOp::Sharpness(3.0), &mut flat, 5, 4);
    assert!(flat.iter().all(|&v| v == 90));
    let (img, w, h) = image();
    let sharp = run(PixelOp::Sharpness(2.0));
    let row = w as usize * 3;
    for y in 0..h as usize {
        for x in 0..w as usize {
            if y == 0 || x == 0 || y == h as usize - 1 || x == w as usize - 1 {
                let at = y * row + x * 3;
                assert_eq!(sharp[at..at + 3], img[at..at + 3]);
            }
        }
    }
    assert_ne!(sharp, img);
}

#[test]
fn random_ops_draw_from_their_seed_alone() {
    let (img, w, h) = image();
    let ops = [
        PixelOp::ColorJitter {
            brightness: 0.4,
            contrast: 0.4,
            saturation: 0.4,
            hue: 0.1,
        },
        PixelOp::RandomGrayscale(0.5),
        PixelOp::GaussianBlur {
            kernel: 3,
            sigma: (0.1, 2.0),
        },
    ];
    let with = |seed: u64| {
        let mut x = img.clone();
        apply(&ops, &mut x, (w, h), seed, &mut Vec::new());
        x
    };
    // The same seed, the same pixels (a clip's frames each run apply with it); another
    // seed, others.
    assert_eq!(with(7), with(7));
    let distinct: std::collections::BTreeSet<Vec<u8>> = (0..8).map(with).collect();
    assert!(distinct.len() >= 7, "{} distinct of 8", distinct.len());
    // Amounts of 0 leave every op out; p 0 and 1 never and always.
    let none = PixelOp::ColorJitter {
        brightness: 0.0,
        contrast: 0.0,
        saturation: 0.0,
        hue: 0.0,
    };
    assert_eq!(run(none), img);
    assert_eq!(run(PixelOp::RandomGrayscale(0.0)), img);
    assert_eq!(run(PixelOp::RandomGrayscale(1.0)), run(PixelOp::Grayscale));
}

#[test]
fn jitter_draws_every_order_and_factors_in_range() {
    let mut orders = std::collections::BTreeSet::new();
    for seed in 0..400 {
        let mut rng = stream(seed, Domain::PixelOps, 0, 0);
        let ops = jitter([0.5, 0.2, 0.0, 0.1], &mut rng);
        assert_eq!(ops.len(), 3, "saturation 0 is left out");
        for op in &ops {
            match *op {
                PixelOp::Brightness(f) => assert!((0.5..=1.5).contains(&f)),
                PixelOp::Contrast(f) => assert!((0.8..=1.2).contains(&f)),
                PixelOp::Hue(f) => assert!((-0.1..=0.1).contains(&f)),
                ref other => panic!("{other}"),
            }
        }
        orders.insert(ops.iter().map(PixelOp::name).collect::<Vec<_>>());
    }
    assert_eq!(orders.len(), 6, "every order of three ops");
}

#[test]
fn a_blur_keeps_a_flat_image_and_smooths_an_edge() {
    let mut flat = vec![77u8; 6 * 5 * 3];
    blur(&mut flat, (6, 5), 5, 1.5, &mut Vec::new());
    assert!(flat.iter().all(|&v| v == 77));
    // A vertical edge, 0 then 255: blurred, the values across it rise monotonically.
    let mut edge: Vec<u8> = (0..8 * 3)
        .flat_map(|i| {
            let v = if i % 8 < 4 { 0 } else { 255 };
            [v, v, v]
        })
        .collect();
    blur(&mut edge, (8, 3), 5, 1.0, &mut Vec::new());
    let row: Vec<u8> = edge[..8 * 3].chunks(3).map(|p| p[0]).collect();
    assert!(row.windows(2).all(|p| p[0] <= p[1]), "{row:?}");
    assert!(row[3] > 0 && row[4] < 255, "{row:?}");
}

fn spec(text: &str) -> PipelineSpec {
    format!("decode | center_crop 8 | {text}").parse().unwrap()
}

/// A black `w`×`h` image with one white pixel at (x, y).
fn dot(w: u32, h: u32, (x, y): (u32, u32)) -> Vec<u8> {
    let mut img = vec![0u8; (w * h * 3) as usize];
    let at = ((y * w + x) * 3) as usize;
    img[at..at + 3].fill(255);
    img
}

fn white(img: &[u8], w: u32) -> Vec<(u32, u32)> {
    img.chunks(3)
        .enumerate()
        .filter(|(_, p)| p[0] == 255)
        .map(|(i, _)| (i as u32 % w, i as u32 / w))
        .collect()
}

#[test]
fn translate_moves_by_whole_pixels_and_fills_black() {
    let (w, h) = (9, 7);
    let mut img = dot(w, h, (2, 3));
    on(PixelOp::TranslateX(3), &mut img, w, h);
    assert_eq!(white(&img, w), [(5, 3)]);
    on(PixelOp::TranslateY(-3), &mut img, w, h);
    assert_eq!(white(&img, w), [(5, 0)]);
    on(PixelOp::TranslateY(-1), &mut img, w, h);
    assert!(img.iter().all(|&v| v == 0), "moved out: all fill");
}

#[test]
fn quarter_turns_are_rot90_and_a_whole_turn_nothing() {
    let (w, h) = (5, 5);
    let turned = |angle: f64| {
        let mut img = dot(w, h, (1, 0));
        on(PixelOp::Rotate(angle), &mut img, w, h);
        white(&img, w)
    };
    // Counter-clockwise: the top row's second pixel goes to the left column, second from
    // the bottom.
    assert_eq!(turned(90.0), [(0, 3)]);
    assert_eq!(turned(180.0), [(3, 4)]);
    assert_eq!(turned(-90.0), [(4, 1)]);
    assert_eq!(turned(360.0), [(1, 0)]);
}

#[test]
fn the_recorded_affine_maps_a_point_where_its_pixel_went() {
    let (w, h) = (64u32, 48u32);
    for text in [
        "rotate 30",
        "rotate -115",
        "shear_x 0.3",
        "shear_y -0.25",
        "translate_x 7",
        "rotate 20 | shear_x 0.2 | translate_y -5",
    ] {
        let spec = spec(text);
        let plan = plan(&spec, (w, h), 0, false);
        let m = plan.affine((w, h)).expect(text);
        for at in [(30u32, 20u32), (40, 30), (25, 28)] {
            let mut img = dot(w, h, at);
            plan.run(&mut img, (w, h), None, &mut Vec::new());
            let (x, y) = (at.0 as f32 + 0.5, at.1 as f32 + 0.5);
            let to = (m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]);
            // Nearest neighbour may copy the pixel to a neighbour of its exact place, or
            // twice; every copy lies within a pixel and a half of the mapped centre.
            let got = white(&img, w);
            assert!(!got.is_empty(), "{text}: {at:?} vanished (to {to:?})");
            for (gx, gy) in got {
                let (dx, dy) = (gx as f32 + 0.5 - to.0, gy as f32 + 0.5 - to.1);
                assert!(
                    dx.abs() <= 1.5 && dy.abs() <= 1.5,
                    "{text}: {at:?} at {gx},{gy}, mapped {to:?}"
                );
            }
        }
    }
    assert_eq!(
        plan(&spec("invert | equalize"), (w, h), 0, false).affine((w, h)),
        None
    );
    // A flip after a rotation: the record is crop, flip, then the transform, so the
    // point flipped first (x -> W - x) and then mapped lands where the pixel went.
    let late = spec("rotate 30 | hflip 1 | translate_x 4");
    assert_eq!(late.flip_after, Some(1));
    let plan = plan(&late, (w, h), 0, true);
    let m = plan.affine((w, h)).unwrap();
    for at in [(30u32, 20u32), (40, 30)] {
        let mut img = dot(w, h, at);
        plan.run(&mut img, (w, h), None, &mut Vec::new());
        let (x, y) = (w as f32 - (at.0 as f32 + 0.5), at.1 as f32 + 0.5);
        let to = (m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]);
        assert!(!white(&img, w).is_empty(), "{at:?} vanished (to {to:?})");
        for (gx, gy) in white(&img, w) {
            let (dx, dy) = (gx as f32 + 0.5 - to.0, gy as f32 + 0.5 - to.1);
            assert!(
                dx.abs() <= 1.5 && dy.abs() <= 1.5,
                "{at:?} at {gx},{gy}, mapped {to:?}"
            );
        }
    }
}

#[test]
fn rand_augment_picks_its_fourteen_ops_uniformly() {
    let mut counts = std::collections::BTreeMap::new();
    for seed in 0..10_000 {
        let mut rng = stream(seed, Domain::PixelOps, 0, 0);
        for _ in 0..2 {
            let (kind, _) = rand_augment_op(9, 31, (224, 224), &mut rng);
            *counts.entry(kind).or_insert(0u32) += 1;
        }
    }
    assert_eq!(counts.len(), 14, "{counts:?}");
    let expect = 20_000.0 / 14.0;
    for (kind, n) in &counts {
        let off = (f64::from(*n) - expect).abs() / expect;
        assert!(
            off <= 0.05,
            "{kind:?}: {n} of 20,000, {:.1}% off uniform",
            off * 100.0
        );
    }
}

#[test]
fn magnitudes_are_torchvisions_bins() {
    // RandAugment at m=9 of 31: linspace(0, 0.3, 31)[9] in float32, 9 degrees, 7 bits,
    // and TranslateX's 150/331 of the width.
    let m = |kind, size| magnitude(Space::Rand, kind, 31, 9, size).unwrap();
    assert_eq!(m(Aug::ShearX, (224, 224)), f64::from(0.09f32));
    assert_eq!(m(Aug::Rotate, (224, 224)), 9.0);
    assert_eq!(m(Aug::Posterize, (224, 224)), 7.0);
    let t = m(Aug::TranslateX, (331, 10));
    assert!((t - 45.0).abs() < 1e-4, "{t}");
    assert!((m(Aug::Solarize, (1, 1)) - 0.7).abs() < 1e-6);
    // TrivialAugmentWide's last bins: 135 degrees, posterize 2 bits.
    assert_eq!(
        magnitude(Space::Wide, Aug::Rotate, 31, 30, (1, 1)),
        Some(135.0)
    );
    assert_eq!(
        magnitude(Space::Wide, Aug::Posterize, 31, 30, (1, 1)),
        Some(2.0)
    );
    assert_eq!(magnitude(Space::Rand, Aug::Equalize, 31, 9, (1, 1)), None);
}

#[test]
fn erasing_fills_a_rectangle_in_range_or_nothing() {
    let (w, h) = (40u32, 30u32);
    let mut erased = 0;
    for seed in 0..200 {
        let mut img = vec![200u8; (w * h * 3) as usize];
        let ops = [PixelOp::RandomErasing(Erasing {
            p: 0.5,
            scale: (0.02, 0.33),
            ratio: (0.3, 3.3),
            value: EraseValue::Constant(0.0),
        })];
        apply(&ops, &mut img, (w, h), seed, &mut Vec::new());
        let zeros = white_or(&img, 0);
        if zeros.is_empty() {
            continue;
        }
        erased += 1;
        let (x0, x1) = (
            zeros.iter().map(|p| p.0).min().unwrap(),
            zeros.iter().map(|p| p.0).max().unwrap(),
        );
        let (y0, y1) = (
            zeros.iter().map(|p| p.1).min().unwrap(),
            zeros.iter().map(|p| p.1).max().unwrap(),
        );
        let area = (x1 - x0 + 1) * (y1 - y0 + 1);
        assert_eq!(area as usize, zeros.len(), "seed {seed}: a rectangle");
        let share = f64::from(area) / f64::from(w * h);
        assert!((0.01..=0.36).contains(&share), "seed {seed}: {share}");
    }
    assert!(
        (70..=130).contains(&erased),
        "p=0.5: {erased} of 200 erased"
    );
}

fn white_or(img: &[u8], v: u8) -> Vec<(u32, u32)> {
    img.chunks(3)
        .enumerate()
        .filter(|(_, p)| p.iter().all(|&c| c == v))
        .map(|(i, _)| (i as u32 % 40, i as u32 / 40))
        .collect()
}

#[test]
fn erasing_after_normalize_writes_the_tensors_dtype_and_layout() {
    let spec: PipelineSpec = "decode | center_crop 6x5 | normalize mean=0.5,0.5,0.5 \
                              std=0.5,0.5,0.5 | chw | random_erasing p=1 value=random"
        .parse()
        .unwrap();
    let (w, h) = (5u32, 6u32);
    let plan = plan(&spec, (w, h), 3, false);
    let e = plan.after.expect("p=1 erases");
    let mut frame = vec![0u8; (w * h * 3 * 4) as usize];
    plan.erase_finished(&mut frame, (w, h), 4, true);
    let values: Vec<f32> = frame
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let touched = values.iter().filter(|v| **v != 0.0).count();
    assert_eq!(
        touched,
        e.w * e.h * 3,
        "every channel of the rectangle, nothing else"
    );
    // Channels first: the rectangle's first pixel in each plane.
    for c in 0..3 {
        assert_ne!(values[(c * h as usize + e.y) * w as usize + e.x], 0.0);
    }
}

#[test]
fn the_rounding_helpers_are_the_methods() {
    let mut x = -1000.0f32;
    while x < 1000.0 {
        for v in [x, x + 0.5, x - 0.5, x + 0.25] {
            assert_eq!(round_even(v), v.round_ties_even(), "{v}");
            assert_eq!(floor(v), v.floor(), "{v}");
        }
        x += 0.37;
    }
    assert_eq!(round_even(-0.5), -0.0);
    assert_eq!(round_even(2.5), 2.0);
    assert_eq!(round_even(1e30), 1e30);
}

/// Per-op time on a 224×224 photo-like image, for tuning (`cargo test --release -p
/// sluice-cpu --lib op_timings -- --ignored --nocapture`); `sluice bench cpu --per-op`
/// is the measurement that counts.
#[test]
#[ignore]
fn op_timings() {
    let (w, h) = (224u32, 224u32);
    let img: Vec<u8> = (0..w * h * 3)
        .map(|i| ((i % 673) as f32 * 0.37 + (i / 672) as f32 * 0.11) as u8)
        .collect();
    for text in [
        "shear_x 0.09",
        "rotate 9",
        "translate_x 40",
        "brightness 1.3",
        "saturation 1.3",
        "contrast 1.3",
        "sharpness 1.3",
        "posterize 7",
        "solarize 178",
        "autocontrast",
        "equalize",
        "hue 0.1",
        "gaussian_blur 23 sigma=1,1",
        "rand_augment",
        "trivial_augment",
        "auto_augment",
        "random_erasing p=1",
    ] {
        let spec = spec(text);
        let mut scratch = Vec::new();
        let mut x = img.clone();
        let t = std::time::Instant::now();
        let n = 300;
        for seed in 0..n {
            x.copy_from_slice(&img);
            plan(&spec, (w, h), seed, false).run(&mut x, (w, h), None, &mut scratch);
        }
        println!(
            "{text:>28}: {:.3} ms",
            t.elapsed().as_secs_f64() * 1000.0 / n as f64
        );
    }
}

#[test]
fn grid_indices_round_half_to_even() {
    for (v, want) in [
        (0.5, 0),
        (1.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (2.49, 2),
        (-7.51, -8),
        (1e9, 4_000_000),
        (-1e9, -4_000_000),
    ] {
        assert_eq!(grid_index(v), want, "{v}");
    }
    // The matrices are finite, so no NaN reaches it; one would still land outside any
    // image (sides are at most 16384), never on a pixel.
    assert!(!(0..16384).contains(&grid_index(f32::NAN)));
}

#[test]
fn sharpness_integer_rounding_is_the_float32_sums() {
    // torchvision's float32 sum of the nine products, in conv2d's order, rounded half to
    // even, against the integer rounding `sharpness` uses, on a million neighbourhoods
    // (the extremes among them).
    let (a, b) = (1.0f32 / 13.0, 5.0f32 / 13.0);
    let mut rng = stream(1, Domain::PixelOps, 0, 0);
    for i in 0..1_000_000u32 {
        let n: [u16; 9] = std::array::from_fn(|_| match i % 4 {
            0 => 255,
            1 => rng.below(2) as u16 * 255,
            _ => rng.below(256) as u16,
        });
        let mut s = 0.0f32;
        for (j, &v) in n.iter().enumerate() {
            s += f32::from(v) * if j == 4 { b } else { a };
        }
        let around: u16 = n.iter().sum::<u16>() - n[4];
        let exact = (2 * (around + 5 * n[4]) + 13) / 26;
        assert_eq!(s.round_ties_even(), f32::from(exact), "{n:?}");
    }
}

#[test]
fn cast_clamps_and_truncates_as_torch() {
    for (v, want) in [
        (0.0, 0),
        (0.99, 0),
        (1.0, 1),
        (1.5, 1),
        (2.5, 2),
        (254.999, 254),
        (255.0, 255),
        (300.0, 255),
        (-0.5, 0),
        (-7.0, 0),
        (f32::NAN, 0),
        (f32::INFINITY, 255),
    ] {
        assert_eq!(cast(v), want, "{v}");
    }
    let mut v = -3.0f32;
    while v < 260.0 {
        assert_eq!(cast(v), v.clamp(0.0, 255.0) as u8, "{v}");
        v += 0.013;
    }
}
