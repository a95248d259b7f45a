//! torchvision's auto-augment family (`RandAugment`, `TrivialAugmentWide`, `AutoAugment`):
//! its op tables and magnitude bins, and one drawn op as a step of a sample's [`Plan`].

use sluice_plan::rng::Stream;
use sluice_wire::spec::PixelOp;

use super::{linspace, Affine, Plan, Step};

/// The ops of torchvision's auto-augment family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Aug {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
    Invert,
}

/// `RandAugment`'s and `TrivialAugmentWide`'s ops, in their `_AUGMENTATION_SPACE` order.
const WIDE: [Aug; 14] = [
    Aug::Identity,
    Aug::ShearX,
    Aug::ShearY,
    Aug::TranslateX,
    Aug::TranslateY,
    Aug::Rotate,
    Aug::Brightness,
    Aug::Color,
    Aug::Contrast,
    Aug::Sharpness,
    Aug::Posterize,
    Aug::Solarize,
    Aug::AutoContrast,
    Aug::Equalize,
];

/// `AutoAugmentPolicy.IMAGENET`: 25 pairs of (op, probability, magnitude bin of 10).
const IMAGENET_POLICY: [[(Aug, f64, Option<u32>); 2]; 25] = {
    use Aug::*;
    [
        [(Posterize, 0.4, Some(8)), (Rotate, 0.6, Some(9))],
        [(Solarize, 0.6, Some(5)), (AutoContrast, 0.6, None)],
        [(Equalize, 0.8, None), (Equalize, 0.6, None)],
        [(Posterize, 0.6, Some(7)), (Posterize, 0.6, Some(6))],
        [(Equalize, 0.4, None), (Solarize, 0.2, Some(4))],
        [(Equalize, 0.4, None), (Rotate, 0.8, Some(8))],
        [(Solarize, 0.6, Some(3)), (Equalize, 0.6, None)],
        [(Posterize, 0.8, Some(5)), (Equalize, 1.0, None)],
        [(Rotate, 0.2, Some(3)), (Solarize, 0.6, Some(8))],
        [(Equalize, 0.6, None), (Posterize, 0.4, Some(6))],
        [(Rotate, 0.8, Some(8)), (Color, 0.4, Some(0))],
        [(Rotate, 0.4, Some(9)), (Equalize, 0.6, None)],
        [(Equalize, 0.0, None), (Equalize, 0.8, None)],
        [(Invert, 0.6, None), (Equalize, 1.0, None)],
        [(Color, 0.6, Some(4)), (Contrast, 1.0, Some(8))],
        [(Rotate, 0.8, Some(8)), (Color, 1.0, Some(2))],
        [(Color, 0.8, Some(8)), (Solarize, 0.8, Some(7))],
        [(Sharpness, 0.4, Some(7)), (Invert, 0.6, None)],
        [(ShearX, 0.6, Some(5)), (Equalize, 1.0, None)],
        [(Color, 0.4, Some(0)), (Equalize, 0.6, None)],
        [(Equalize, 0.4, None), (Solarize, 0.2, Some(4))],
        [(Solarize, 0.6, Some(5)), (AutoContrast, 0.6, None)],
        [(Invert, 0.6, None), (Equalize, 1.0, None)],
        [(Color, 0.6, Some(4)), (Contrast, 1.0, Some(8))],
        [(Equalize, 0.8, None), (Equalize, 0.6, None)],
    ]
};

/// Whose magnitudes: RandAugment's (and AutoAugment's, the same), or TrivialAugmentWide's.
#[derive(Clone, Copy)]
pub(super) enum Space {
    Rand,
    Wide,
}

/// Op `kind`'s magnitude at `bin` of `bins` on a `w`×`h` image, as `_AUGMENTATION_SPACE`
/// computes it (float32, then a Python float); `None` for the ops without one.
pub(super) fn magnitude(
    space: Space,
    kind: Aug,
    bins: u32,
    bin: u32,
    (w, h): (u32, u32),
) -> Option<f64> {
    let wide = matches!(space, Space::Wide);
    let lin = |end: f64| Some(f64::from(linspace(0.0, end as f32, bins, bin)));
    match kind {
        Aug::ShearX | Aug::ShearY => lin(if wide { 0.99 } else { 0.3 }),
        Aug::TranslateX | Aug::TranslateY => {
            let side = f64::from(if kind == Aug::TranslateX { w } else { h });
            lin(if wide { 32.0 } else { 150.0 / 331.0 * side })
        }
        Aug::Rotate => lin(if wide { 135.0 } else { 30.0 }),
        Aug::Brightness | Aug::Color | Aug::Contrast | Aug::Sharpness => {
            lin(if wide { 0.99 } else { 0.9 })
        }
        // `(8 - (arange(bins) / ((bins - 1) / q))).round().int()`, in float32.
        Aug::Posterize => {
            let q = if wide { 6.0 } else { 4.0 };
            let v = 8.0f32 - bin as f32 / (((bins - 1) as f64 / q) as f32);
            Some(f64::from(v.round_ties_even()))
        }
        Aug::Solarize => Some(f64::from(linspace(1.0, 0.0, bins, bin))),
        Aug::Identity | Aug::AutoContrast | Aug::Equalize | Aug::Invert => None,
    }
}

/// A signed op's magnitude negated with probability 1/2 (`torch.rand(()) <= 0.5`); the
/// others' as they are.
fn signed(kind: Aug, magnitude: Option<f64>, rng: &mut Stream) -> Option<f64> {
    let sign = matches!(
        kind,
        Aug::ShearX
            | Aug::ShearY
            | Aug::TranslateX
            | Aug::TranslateY
            | Aug::Rotate
            | Aug::Brightness
            | Aug::Color
            | Aug::Contrast
            | Aug::Sharpness
    );
    let m = magnitude?;
    Some(match sign && rng.unit_f64() <= 0.5 {
        true => -m,
        false => m,
    })
}

/// `_apply_image_or_video_transform`: op `kind` at `magnitude` (0 where it has none) as a step.
fn augment(plan: &mut Plan, kind: Aug, magnitude: Option<f64>, size: (u32, u32)) {
    let m = magnitude.unwrap_or(0.0);
    let op = match kind {
        Aug::Identity => return,
        Aug::ShearX => PixelOp::ShearX(m),
        Aug::ShearY => PixelOp::ShearY(m),
        // `int(magnitude)`: toward zero.
        Aug::TranslateX => PixelOp::TranslateX(m as i32),
        Aug::TranslateY => PixelOp::TranslateY(m as i32),
        Aug::Rotate => PixelOp::Rotate(m),
        Aug::Brightness => PixelOp::Brightness(1.0 + m),
        Aug::Color => PixelOp::Saturation(1.0 + m),
        Aug::Contrast => PixelOp::Contrast(1.0 + m),
        Aug::Sharpness => PixelOp::Sharpness(1.0 + m),
        Aug::Posterize => PixelOp::Posterize(m as u8),
        Aug::Solarize => PixelOp::Solarize(255.0 * m),
        Aug::AutoContrast => PixelOp::Autocontrast,
        Aug::Equalize => PixelOp::Equalize,
        Aug::Invert => PixelOp::Invert,
    };
    match Affine::of(&op, size) {
        Some(a) => plan.steps.push(Step::Affine(a)),
        None if op.is_affine() => {}
        None => plan.steps.push(Step::Fixed(op)),
    }
}

/// One of `RandAugment`'s ops: drawn from its 14, at bin `m` of `bins`, its sign drawn.
pub(super) fn rand_augment_op(
    m: u32,
    bins: u32,
    size: (u32, u32),
    rng: &mut Stream,
) -> (Aug, Option<f64>) {
    let kind = WIDE[rng.below(WIDE.len() as u64) as usize];
    let mag = magnitude(Space::Rand, kind, bins, m, size);
    (kind, signed(kind, mag, rng))
}

/// `RandAugment(num_ops=n, magnitude=m, num_magnitude_bins=bins)` on a `w`×`h` image: its
/// `n` ops drawn, as steps of `plan`.
pub(super) fn rand_augment(
    plan: &mut Plan,
    (n, m, bins): (u32, u32, u32),
    size: (u32, u32),
    rng: &mut Stream,
) {
    for _ in 0..n {
        let (kind, mag) = rand_augment_op(m, bins, size, rng);
        augment(plan, kind, mag, size);
    }
}

/// `TrivialAugmentWide(num_magnitude_bins=bins)`: one op and one bin drawn, as a step.
pub(super) fn trivial_augment(plan: &mut Plan, bins: u32, size: (u32, u32), rng: &mut Stream) {
    let kind = WIDE[rng.below(WIDE.len() as u64) as usize];
    let mag = magnitude(Space::Wide, kind, bins, 0, size)
        .map(|_| rng.below(u64::from(bins)) as u32)
        .and_then(|bin| magnitude(Space::Wide, kind, bins, bin, size));
    augment(plan, kind, signed(kind, mag, rng), size);
}

/// `AutoAugment(IMAGENET)`: a pair drawn, each of its ops with its probability, as steps.
pub(super) fn auto_augment(plan: &mut Plan, size: (u32, u32), rng: &mut Stream) {
    let pair = IMAGENET_POLICY[rng.below(IMAGENET_POLICY.len() as u64) as usize];
    for (kind, p, bin) in pair {
        if rng.unit_f64() > p {
            continue;
        }
        let mag = bin.and_then(|b| magnitude(Space::Rand, kind, 10, b, size));
        augment(plan, kind, signed(kind, mag, rng), size);
    }
}
