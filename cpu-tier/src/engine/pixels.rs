//! The pixel ops (`brightness`, `contrast`, ... `random_erasing`) on a uint8 RGB image in
//! place, as `torchvision.transforms.v2.functional` computes them on a uint8 tensor: float32
//! arithmetic, clamped to 0..=255 and truncated to uint8 where torchvision casts, rounded
//! where it rounds. An image is one frame: a clip's frames each take the ops alone, as
//! torchvision's video kernels do.
//!
//! Every op whose output value depends only on the input value and numbers known before the
//! pass (brightness, contrast once the mean is known, solarize, posterize, invert, equalize
//! and autocontrast once the histogram is) is a 256-entry table per channel, built with the
//! same float32 expression torchvision evaluates, so a table is exact and the pass is a
//! lookup per byte. Saturation, grayscale and hue mix a pixel's channels; sharpness and blur
//! its neighbours; rotate, shear and translate are one nearest-neighbour pass through
//! torchvision's inverse matrix and `grid_sample`'s arithmetic.
//!
//! The random ops (`color_jitter`, `random_grayscale`, `gaussian_blur`, `rand_augment`,
//! `trivial_augment`, `auto_augment`, `random_erasing`) are drawn first, into a [`Plan`] of
//! fixed steps, from a stream of the sample's own seed (drawn after its geometry): a sample
//! gets the same pixels whichever worker makes it, every frame of a clip the same draw, and
//! the sample's geometry record the affine transform its steps compose to. No draw depends
//! on the pixels, only on the output size, as in torchvision.

use sluice_plan::rng::{stream, Domain, Stream};
use sluice_wire::spec::{EraseValue, Erasing, Normalize, PipelineSpec, PixelOp};

/// A sample's pixel ops with their draws made.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    /// On the uint8 HWC output, in order.
    steps: Vec<Step>,
    /// `random_erasing` after `normalize`, on the finished tensor.
    after: Option<Erase>,
}

/// One op with nothing left to draw.
#[derive(Clone, Debug)]
enum Step {
    /// A colour op that draws nothing (never a random one, never an affine one).
    Fixed(PixelOp),
    Blur {
        kernel: u32,
        sigma: f64,
    },
    Affine(Affine),
    Erase(Erase),
    /// The sample's `hflip`, written after pixel ops that came before it.
    Flip,
}

/// Rotate, shear or translate on a `w`×`h` image: torchvision's matrices for the image
/// (inverse, centred coordinates) and for boxes (forward, pixel-edge coordinates).
#[derive(Clone, Copy, Debug)]
struct Affine {
    inverse: [f64; 6],
    forward: [f64; 6],
    /// Counter-clockwise quarter turns done by `rot90` (torchvision's fast path: 180°, and 90°
    /// or 270° on a square image).
    quarters: Option<u8>,
}

/// A rectangle of the image to erase and what goes there.
#[derive(Clone, Copy, Debug)]
struct Erase {
    x: usize,
    y: usize,
    w: usize,
    h: usize,
    fill: Fill,
}

#[derive(Clone, Copy, Debug)]
enum Fill {
    Constant(f64),
    /// N(0, 1) per channel and pixel, from this seed's stream, in torchvision's C×H×W order.
    Noise(u64),
}

impl Plan {
    /// The affine transform the steps compose to, on pixel-edge coordinates of the
    /// `w`×`h` output (`[a, b, c, d, e, f]`: x' = a·x + b·y + c, y' = d·x + e·y + f); `None`
    /// when no step moves a pixel.
    ///
    /// A geometry record says: the crop, its flip, then this transform. A flip written after
    /// moving steps (A, then the flip F) is recorded as F·A·F: the same points, in that order.
    pub(crate) fn affine(&self, (w, _h): (u32, u32)) -> Option<[f32; 6]> {
        let mut total: Option<[f64; 6]> = None;
        for step in &self.steps {
            if let (Step::Flip, Some(t)) = (step, total.as_mut()) {
                // F = F⁻¹: x -> W - x. F·T·F negates the x row's y and constant parts'
                // signs around W, and the y row's x part.
                let wf = f64::from(w);
                *t = [
                    t[0],
                    -t[1],
                    wf - t[2] - t[0] * wf,
                    -t[3],
                    t[4],
                    t[5] + t[3] * wf,
                ];
            }
            if let Step::Affine(a) = step {
                let m = a.forward;
                total = Some(match total {
                    None => m,
                    // m after t: [m00 m01 m02; m10 m11 m12] · [t00 t01 t02; t10 t11 t12; 0 0 1].
                    Some(t) => [
                        m[0] * t[0] + m[1] * t[3],
                        m[0] * t[1] + m[1] * t[4],
                        m[0] * t[2] + m[1] * t[5] + m[2],
                        m[3] * t[0] + m[4] * t[3],
                        m[3] * t[1] + m[4] * t[4],
                        m[3] * t[2] + m[4] * t[5] + m[5],
                    ],
                });
            }
        }
        total.map(|t| t.map(|v| v as f32))
    }

    /// Runs the steps on the `w`×`h` RGB image in `hwc`; `normalize` is the pipeline's, for
    /// noise erased before it.
    pub(crate) fn run(
        &self,
        hwc: &mut [u8],
        (w, h): (u32, u32),
        normalize: Option<&Normalize>,
        scratch: &mut Vec<u8>,
    ) {
        let size = (w as usize, h as usize);
        for step in &self.steps {
            match step {
                Step::Fixed(op) => apply_fixed(op, hwc, (w, h), scratch),
                Step::Blur { kernel, sigma } => blur(hwc, size, *kernel as usize, *sigma, scratch),
                Step::Affine(a) => warp(hwc, size, a, scratch),
                Step::Erase(e) => erase_bytes(hwc, size, e, normalize),
                Step::Flip => {
                    for row in hwc.chunks_exact_mut(size.0 * 3) {
                        super::render::mirror_rgb(row);
                    }
                }
            }
        }
    }

    /// `random_erasing` after `normalize`, on one finished frame: `elem` bytes a value (1: a
    /// byte, 2: f16, 4: f32, little-endian), channels first when `chw`.
    pub(crate) fn erase_finished(
        &self,
        frame: &mut [u8],
        (w, h): (u32, u32),
        elem: usize,
        chw: bool,
    ) {
        let Some(e) = self.after else {
            return;
        };
        let (w, h) = (w as usize, h as usize);
        let mut noise = e.noise();
        for c in 0..3 {
            for y in e.y..e.y + e.h {
                for x in e.x..e.x + e.w {
                    let v = match e.fill {
                        Fill::Constant(v) => v as f32,
                        Fill::Noise(_) => noise.as_mut().map_or(0.0, Normal::next),
                    };
                    let at = match chw {
                        true => (c * h + y) * w + x,
                        false => (y * w + x) * 3 + c,
                    } * elem;
                    match elem {
                        1 => frame[at] = v.clamp(0.0, 255.0) as u8,
                        2 => {
                            frame[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes())
                        }
                        _ => frame[at..at + 4].copy_from_slice(&v.to_le_bytes()),
                    }
                }
            }
        }
    }
}

/// The sample's plan for `spec`'s pixel ops on its `w`×`h` output, drawn from `seed` (its
/// [`crate::geometry::Geometry::pixel_seed`]); `flip`: the geometry drew a flip, done here
/// when the pipeline writes it after pixel ops.
pub(crate) fn plan(spec: &PipelineSpec, (w, h): (u32, u32), seed: u64, flip: bool) -> Plan {
    let mut rng = stream(seed, Domain::PixelOps, 0, 0);
    let mut plan = Plan::default();
    let flip_at = spec.flip_after.filter(|_| flip);
    for (i, op) in spec.pixels.iter().enumerate() {
        if flip_at == Some(i) {
            plan.steps.push(Step::Flip);
        }
        match *op {
            PixelOp::ColorJitter {
                brightness,
                contrast,
                saturation,
                hue,
            } => {
                let ops = jitter([brightness, contrast, saturation, hue], &mut rng);
                plan.steps.extend(ops.into_iter().map(Step::Fixed));
            }
            PixelOp::RandomGrayscale(p) => {
                if rng.unit_f64() < p {
                    plan.steps.push(Step::Fixed(PixelOp::Grayscale));
                }
            }
            PixelOp::GaussianBlur { kernel, sigma } => {
                let sigma = uniform(&mut rng, sigma);
                plan.steps.push(Step::Blur { kernel, sigma });
            }
            PixelOp::RandAugment { n, m, bins } => {
                for _ in 0..n {
                    let (kind, mag) = rand_augment_op(m, bins, (w, h), &mut rng);
                    augment(&mut plan, kind, mag, (w, h));
                }
            }
            PixelOp::TrivialAugment { bins } => {
                let kind = WIDE[rng.below(WIDE.len() as u64) as usize];
                let mag = magnitude(Space::Wide, kind, bins, 0, (w, h))
                    .map(|_| rng.below(u64::from(bins)) as u32)
                    .and_then(|bin| magnitude(Space::Wide, kind, bins, bin, (w, h)));
                augment(&mut plan, kind, signed(kind, mag, &mut rng), (w, h));
            }
            PixelOp::AutoAugment => {
                let pair = IMAGENET_POLICY[rng.below(IMAGENET_POLICY.len() as u64) as usize];
                for (kind, p, bin) in pair {
                    if rng.unit_f64() > p {
                        continue;
                    }
                    let mag = bin.and_then(|b| magnitude(Space::Rand, kind, 10, b, (w, h)));
                    augment(&mut plan, kind, signed(kind, mag, &mut rng), (w, h));
                }
            }
            PixelOp::RandomErasing(e) => {
                if let Some(e) = erasing(&e, (w, h), &mut rng) {
                    plan.steps.push(Step::Erase(e));
                }
            }
            ref moves if moves.is_affine() => {
                // None: a whole turn, which moves nothing.
                if let Some(a) = Affine::of(moves, (w, h)) {
                    plan.steps.push(Step::Affine(a));
                }
            }
            fixed => plan.steps.push(Step::Fixed(fixed)),
        }
    }
    if flip_at == Some(spec.pixels.len()) {
        plan.steps.push(Step::Flip);
    }
    if let Some(e) = &spec.erasing {
        plan.after = erasing(e, (w, h), &mut rng);
    }
    plan
}

/// Applies `ops` alone (no `normalize` after them) to the `w`×`h` RGB image in `hwc`, drawn
/// from `seed`: what the engine does, for tests.
#[cfg(test)]
pub(crate) fn apply(
    ops: &[PixelOp],
    hwc: &mut [u8],
    (w, h): (u32, u32),
    seed: u64,
    scratch: &mut Vec<u8>,
) {
    let spec = PipelineSpec {
        field: None,
        clip: None,
        ops: Vec::new(),
        pixels: ops.to_vec(),
        flip_after: None,
        normalize: None,
        erasing: None,
        chw: false,
    };
    plan(&spec, (w, h), seed, false).run(hwc, (w, h), None, scratch);
}

/// A uniform draw from `[lo, hi]`, as torchvision's `torch.empty(1).uniform_(lo, hi)`.
fn uniform(rng: &mut Stream, (lo, hi): (f64, f64)) -> f64 {
    lo + rng.unit_f64() * (hi - lo)
}

/// `ColorJitter`'s draw: the order of the four ops (`randperm(4)`), then each present op's
/// factor in turn (brightness, contrast, saturation from `[max(0, 1 - x), 1 + x]`, hue from
/// `[-x, x]`); the ops in that order, an amount of 0 leaving its op out.
fn jitter(amounts: [f64; 4], rng: &mut Stream) -> Vec<PixelOp> {
    let mut order = [0usize, 1, 2, 3];
    rng.shuffle(&mut order);
    let factors: [Option<f64>; 4] = std::array::from_fn(|i| {
        let x = amounts[i];
        (x > 0.0).then(|| match i {
            3 => uniform(rng, (-x, x)),
            _ => uniform(rng, ((1.0 - x).max(0.0), 1.0 + x)),
        })
    });
    order
        .iter()
        .filter_map(|&i| {
            factors[i].map(|f| match i {
                0 => PixelOp::Brightness(f),
                1 => PixelOp::Contrast(f),
                2 => PixelOp::Saturation(f),
                _ => PixelOp::Hue(f),
            })
        })
        .collect()
}

/// The ops of torchvision's auto-augment family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Aug {
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
pub(crate) const WIDE: [Aug; 14] = [
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
enum Space {
    Rand,
    Wide,
}

/// torchvision's `torch.linspace(start, end, n)[i]` in float32: from the start for the first
/// half, from the end for the rest.
fn linspace(start: f32, end: f32, n: u32, i: u32) -> f32 {
    if n <= 1 {
        return start;
    }
    let step = (end - start) / (n - 1) as f32;
    match i < n / 2 {
        true => start + step * i as f32,
        false => end - step * (n - 1 - i) as f32,
    }
}

/// Op `kind`'s magnitude at `bin` of `bins` on a `w`×`h` image, as `_AUGMENTATION_SPACE`
/// computes it (float32, then a Python float); `None` for the ops without one.
fn magnitude(space: Space, kind: Aug, bins: u32, bin: u32, (w, h): (u32, u32)) -> Option<f64> {
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
fn rand_augment_op(m: u32, bins: u32, size: (u32, u32), rng: &mut Stream) -> (Aug, Option<f64>) {
    let kind = WIDE[rng.below(WIDE.len() as u64) as usize];
    let mag = magnitude(Space::Rand, kind, bins, m, size);
    (kind, signed(kind, mag, rng))
}

/// torchvision's `_get_inverse_affine_matrix(center, angle, translate, 1.0, shear, inverted)`.
fn affine_matrix(
    (cx, cy): (f64, f64),
    angle: f64,
    (tx, ty): (f64, f64),
    (shear_x, shear_y): (f64, f64),
    inverted: bool,
) -> [f64; 6] {
    let rot = angle.to_radians();
    let sx = shear_x.to_radians();
    let sy = shear_y.to_radians();
    let a = (rot - sy).cos() / sy.cos();
    let b = -(a * sx.tan() + rot.sin());
    let c = (rot - sy).sin() / sy.cos();
    let d = rot.cos() - c * sx.tan();
    let (cxt, cyt) = (cx + tx, cy + ty);
    if inverted {
        let mut m = [d, -b, 0.0, -c, a, 0.0];
        m[2] += cx - m[0] * cxt - m[1] * cyt;
        m[5] += cy - m[3] * cxt - m[4] * cyt;
        m
    } else {
        let mut m = [a, b, 0.0, c, d, 0.0];
        m[2] += cxt - m[0] * cx - m[1] * cy;
        m[5] += cyt - m[3] * cx - m[4] * cy;
        m
    }
}

impl Affine {
    /// The step of a rotate, shear or translate on a `w`×`h` image, as torchvision's
    /// `rotate` and RandAugment's `affine` calls make it; `None` for other ops and for a
    /// rotation by a whole turn (torchvision copies the image).
    fn of(op: &PixelOp, (w, h): (u32, u32)) -> Option<Affine> {
        let (wf, hf) = (f64::from(w), f64::from(h));
        let centre = (wf * 0.5, hf * 0.5);
        let (inverse, forward, quarters) = match *op {
            PixelOp::Rotate(angle) => {
                let turn = angle.rem_euclid(360.0);
                let quarters = match turn {
                    0.0 => return None,
                    180.0 => Some(2),
                    90.0 if w == h => Some(1),
                    270.0 if w == h => Some(3),
                    _ => None,
                };
                (
                    affine_matrix((0.0, 0.0), -turn, (0.0, 0.0), (0.0, 0.0), true),
                    affine_matrix(centre, -angle, (0.0, 0.0), (0.0, 0.0), false),
                    quarters,
                )
            }
            PixelOp::ShearX(s) | PixelOp::ShearY(s) => {
                let deg = s.atan().to_degrees();
                let shear = match op {
                    PixelOp::ShearX(_) => (deg, 0.0),
                    _ => (0.0, deg),
                };
                (
                    affine_matrix((-centre.0, -centre.1), 0.0, (0.0, 0.0), shear, true),
                    affine_matrix((0.0, 0.0), 0.0, (0.0, 0.0), shear, false),
                    None,
                )
            }
            PixelOp::TranslateX(t) | PixelOp::TranslateY(t) => {
                let t = f64::from(t);
                let by = match op {
                    PixelOp::TranslateX(_) => (t, 0.0),
                    _ => (0.0, t),
                };
                (
                    affine_matrix((0.0, 0.0), 0.0, by, (0.0, 0.0), true),
                    affine_matrix(centre, 0.0, by, (0.0, 0.0), false),
                    None,
                )
            }
            _ => return None,
        };
        Some(Affine {
            inverse,
            forward,
            quarters,
        })
    }
}

/// The image through `a`, nearest neighbour, 0 outside: `rot90` for its quarter turns, else
/// torchvision's `_affine_grid` and `grid_sample(mode="nearest", align_corners=False)` in
/// float32: output pixel (x, y) centred, through the inverse matrix scaled to [-1, 1], back to
/// source pixels and rounded half to even.
fn warp(hwc: &mut [u8], (w, h): (usize, usize), a: &Affine, scratch: &mut Vec<u8>) {
    if w == 0 || h == 0 {
        return;
    }
    scratch.clear();
    scratch.extend_from_slice(hwc);
    let src = &scratch[..];
    let px = |x: usize, y: usize| (y * w + x) * 3;
    if let Some(q) = a.quarters {
        for y in 0..h {
            for x in 0..w {
                // rot90(k) on (H, W): k=1 out[y][x] = in[x][W-1-y], k=2 in[H-1-y][W-1-x],
                // k=3 in[H-1-x][y] (k = 1, 3 only on a square).
                let (sx, sy) = match q {
                    1 => (w - 1 - y, x),
                    2 => (w - 1 - x, h - 1 - y),
                    _ => (y, h - 1 - x),
                };
                let (o, i) = (px(x, y), px(sx, sy));
                hwc[o..o + 3].copy_from_slice(&src[i..i + 3]);
            }
        }
        return;
    }
    let m = a.inverse;
    if let ([1.0, 0.0, tx, 0.0, 1.0, ty], true) = (m, m[2].fract() == 0.0 && m[5].fract() == 0.0) {
        // A translation by whole pixels: the grid lands on pixel centres (no rounding to
        // decide), so it is a shift of rows and of each row's pixels.
        shift(hwc, src, (w, h), (-tx as isize, -ty as isize));
        return;
    }
    let t = m.map(|v| v as f32);
    let (hw, hh) = (0.5 * w as f32, 0.5 * h as f32);
    let (r00, r10, r20) = (t[0] / hw, t[1] / hw, t[2] / hw);
    let (r01, r11, r21) = (t[3] / hh, t[4] / hh, t[5] / hh);
    let (wf, hf) = (w as f32, h as f32);
    let (x0, y0) = ((1.0 - wf) * 0.5, (1.0 - hf) * 0.5);
    // `bx * r00` and `bx * r01` of each column, once: the products the grid sums per pixel.
    let (cxs, cys): (Vec<f32>, Vec<f32>) = (0..w)
        .map(|x| {
            let bx = x0 + x as f32;
            (bx * r00, bx * r01)
        })
        .unzip();
    let (mut ixs, mut iys) = (vec![0i32; w], vec![0i32; w]);
    for y in 0..h {
        let by = y0 + y as f32;
        let (ry, ryy) = (by * r10, by * r11);
        // The row's source positions first (float arithmetic only: four pixels at a time),
        // then its pixels.
        for (((ix, iy), &cx), &cy) in ixs.iter_mut().zip(iys.iter_mut()).zip(&cxs).zip(&cys) {
            let gx = cx + ry + r20;
            let gy = cy + ryy + r21;
            *ix = grid_index(((gx + 1.0) * wf - 1.0) * 0.5);
            *iy = grid_index(((gy + 1.0) * hf - 1.0) * 0.5);
        }
        let row = &mut hwc[y * w * 3..(y + 1) * w * 3];
        // A row that reads one source row at one offset (a shear along x, away from a
        // half-pixel tie) is a shifted copy of it.
        let (dx, sy) = (ixs[0], iys[0]);
        let straight = iys.iter().all(|&v| v == sy)
            && ixs.iter().enumerate().all(|(x, &v)| v == x as i32 + dx);
        if straight {
            match usize::try_from(sy).ok().filter(|&sy| sy < h) {
                Some(sy) => {
                    let line = &src[sy * w * 3..(sy + 1) * w * 3];
                    shift(row, line, (w, 1), (-(dx as isize), 0));
                }
                None => row.fill(0),
            }
            continue;
        }
        for ((out, &ix), &iy) in row.chunks_exact_mut(3).zip(&ixs).zip(&iys) {
            if (ix as u32) < w as u32 && (iy as u32) < h as u32 {
                let i = px(ix as usize, iy as usize);
                out.copy_from_slice(&src[i..i + 3]);
            } else {
                out.fill(0);
            }
        }
    }
}

/// `grid_sample`'s nearest index of source position `v`: rounded half to even, as an
/// integer; far outside the image (where it is only out of bounds) clamped first. Adding
/// 1.5·2^23 to a magnitude below 2^22 leaves no fraction bits, so the FPU rounds it, and the
/// sum's mantissa is then the integer (plus a constant): integer arithmetic on the bits, four
/// lanes at a time, where a float-to-int conversion would be a saturating one per value.
#[inline]
fn grid_index(v: f32) -> i32 {
    const BIG: f32 = 12_582_912.0;
    let v = v.clamp(-4_000_000.0, 4_000_000.0);
    (v + BIG).to_bits() as i32 - BIG.to_bits() as i32
}

/// `src` moved by (`dx`, `dy`) whole pixels into `hwc`, 0 where nothing lands.
fn shift(hwc: &mut [u8], src: &[u8], (w, h): (usize, usize), (dx, dy): (isize, isize)) {
    let row = w * 3;
    for y in 0..h {
        let out = &mut hwc[y * row..(y + 1) * row];
        let sy = y as isize - dy;
        if sy < 0 || sy >= h as isize {
            out.fill(0);
            continue;
        }
        let line = &src[sy as usize * row..(sy as usize + 1) * row];
        // Output x takes source x - dx: the overlap, and 0 on either side of it.
        let lo = dx.clamp(0, w as isize) as usize;
        let hi = (w as isize + dx).clamp(0, w as isize) as usize;
        out[..lo * 3].fill(0);
        out[hi * 3..].fill(0);
        if hi > lo {
            let from = (lo as isize - dx) as usize;
            out[lo * 3..hi * 3].copy_from_slice(&line[from * 3..(from + hi - lo) * 3]);
        }
    }
}

/// `RandomErasing.make_params` on a `w`×`h` image: applied with probability `p`; ten tries at
/// an area and a log-uniform aspect ratio whose rounded sides fit inside, then the corner; no
/// erasing when none fits.
fn erasing(e: &Erasing, (w, h): (u32, u32), rng: &mut Stream) -> Option<Erase> {
    if rng.unit_f64() >= e.p {
        return None;
    }
    let area = f64::from(w) * f64::from(h);
    let log_ratio = (e.ratio.0.ln(), e.ratio.1.ln());
    for _ in 0..10 {
        let erase_area = area * uniform(rng, e.scale);
        let aspect = uniform(rng, log_ratio).exp();
        let eh = (erase_area * aspect).sqrt().round_ties_even();
        let ew = (erase_area / aspect).sqrt().round_ties_even();
        if !(eh < f64::from(h) && ew < f64::from(w)) {
            continue;
        }
        let (eh, ew) = (eh as u32, ew as u32);
        let fill = match e.value {
            EraseValue::Constant(v) => Fill::Constant(v),
            EraseValue::Random => Fill::Noise(rng.next_u64()),
        };
        let y = rng.below(u64::from(h - eh) + 1) as usize;
        let x = rng.below(u64::from(w - ew) + 1) as usize;
        return Some(Erase {
            x,
            y,
            w: ew as usize,
            h: eh as usize,
            fill,
        });
    }
    None
}

impl Erase {
    fn noise(&self) -> Option<Normal> {
        match self.fill {
            Fill::Noise(seed) => Some(Normal {
                rng: stream(seed, Domain::PixelOps, 1, 0),
                spare: None,
            }),
            Fill::Constant(_) => None,
        }
    }
}

/// Standard normal draws (Box–Muller, both of each pair used).
struct Normal {
    rng: Stream,
    spare: Option<f32>,
}

impl Normal {
    fn next(&mut self) -> f32 {
        if let Some(v) = self.spare.take() {
            return v;
        }
        // u1 in (0, 1]: the log stays finite.
        let u1 = 1.0 - self.rng.unit_f64();
        let u2 = self.rng.unit_f64();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        self.spare = Some((r * s) as f32);
        (r * c) as f32
    }
}

/// `random_erasing` before `normalize`, on bytes: the constant, or the bytes `normalize`
/// takes to the noise (`(n·std + mean)·255`, rounded and clamped).
fn erase_bytes(hwc: &mut [u8], (w, _h): (usize, usize), e: &Erase, normalize: Option<&Normalize>) {
    let mut noise = e.noise();
    for c in 0..3 {
        let (mean, std) = normalize.map_or((0.0, 1.0), |n| (n.mean[c], n.std[c]));
        for y in e.y..e.y + e.h {
            for x in e.x..e.x + e.w {
                let v = match (&mut noise, e.fill) {
                    (Some(n), _) => ((n.next() * std + mean) * 255.0).round(),
                    (None, Fill::Constant(v)) => v as f32,
                    (None, Fill::Noise(_)) => 0.0,
                };
                hwc[(y * w + x) * 3 + c] = v.clamp(0.0, 255.0) as u8;
            }
        }
    }
}

/// One op that draws nothing.
fn apply_fixed(op: &PixelOp, hwc: &mut [u8], (w, h): (u32, u32), scratch: &mut Vec<u8>) {
    match *op {
        PixelOp::Brightness(f) => {
            let f = f as f32;
            lookup_all(hwc, &table(|x| x * f));
        }
        PixelOp::Contrast(f) => {
            let mean = mean_grey(hwc);
            let ratio = Ratio::of(f);
            lookup_all(hwc, &table(|x| ratio.blend(x, mean)));
        }
        PixelOp::Saturation(f) => saturation(hwc, Ratio::of(f)),
        PixelOp::Hue(f) => hue(hwc, f as f32),
        PixelOp::Solarize(t) => {
            let t = t as f32;
            let solarized: [u8; 256] = std::array::from_fn(|x| {
                if x as f32 >= t {
                    255 - x as u8
                } else {
                    x as u8
                }
            });
            lookup_all(hwc, &solarized);
        }
        PixelOp::Posterize(bits) => {
            let mask = match bits {
                8.. => 0xff,
                b => (((1u16 << b) - 1) << (8 - b)) as u8,
            };
            hwc.iter_mut().for_each(|v| *v &= mask);
        }
        PixelOp::Equalize => {
            let tables = per_channel(hwc, equalized);
            lookup_channels(hwc, &tables);
        }
        PixelOp::Autocontrast => {
            let tables = per_channel(hwc, stretched);
            lookup_channels(hwc, &tables);
        }
        PixelOp::Sharpness(f) => sharpness(hwc, (w as usize, h as usize), Ratio::of(f), scratch),
        PixelOp::Invert => hwc.iter_mut().for_each(|v| *v = !*v),
        PixelOp::Grayscale => {
            let greys = Greys::new();
            for px in hwc.chunks_exact_mut(3) {
                let g = greys.floor(px);
                px.fill(g);
            }
        }
        // The random and affine ops: `plan` draws or moves them, and never makes one a
        // fixed step.
        _ => debug_assert!(op.is_random() || op.is_affine(), "{op} as a fixed step"),
    }
}

/// `gaussian_blur` with a `k`×`k` kernel of `sigma` on uint8: the image padded by reflection,
/// each channel convolved in float32 with torchvision's kernel (below; the 2-D kernel is its
/// outer product), rounded half to even. The convolution runs as two 1-D passes, a row then a column: the same
/// sum as the 2-D kernel's, in another order, so a value may differ from torchvision's by one
/// where the float32 sum lands on a half.
fn blur(hwc: &mut [u8], (w, h): (usize, usize), k: usize, sigma: f64, scratch: &mut Vec<u8>) {
    if k <= 1 || w == 0 || h == 0 {
        return;
    }
    // torchvision: `x = linspace(-lim, lim, k)` (float32, filled from both ends),
    // `lim = (k - 1) / (2√2)`, and `softmax(-(x / sigma)²)`.
    let lim = ((k - 1) as f64 / (2.0 * 2f64.sqrt())) as f32;
    let step = (2.0 * lim) / (k - 1) as f32;
    let sigma = sigma as f32;
    let xs: Vec<f32> = (0..k)
        .map(|i| match i < k / 2 {
            true => -lim + step * i as f32,
            false => lim - step * (k - 1 - i) as f32,
        })
        .map(|x| -((x / sigma) * (x / sigma)))
        .collect();
    let top = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = xs.iter().map(|x| (x - top).exp()).collect();
    let sum: f32 = exps.iter().sum();
    let kernel: Vec<f32> = exps.iter().map(|e| e / sum).collect();
    let half = k / 2;
    // Reflection without repeating the edge (torch's "reflect"), folded again for images
    // smaller than the kernel (where torch refuses).
    let reflect = |i: isize, n: usize| -> usize {
        let n = n as isize;
        if n == 1 {
            return 0;
        }
        let period = 2 * (n - 1);
        let m = i.rem_euclid(period);
        (if m < n { m } else { period - m }) as usize
    };
    // Rows first, each padded by reflection, into float32; each sum in the kernel's order.
    let row = w * 3;
    let mut padded = vec![0f32; (w + 2 * half) * 3];
    let mut rows = vec![0f32; row * h];
    for y in 0..h {
        let line = &hwc[y * row..(y + 1) * row];
        for (p, px) in padded.chunks_exact_mut(3).enumerate() {
            let sx = reflect(p as isize - half as isize, w);
            for (c, v) in px.iter_mut().enumerate() {
                *v = f32::from(line[sx * 3 + c]);
            }
        }
        let out = &mut rows[y * row..(y + 1) * row];
        for (t, &kv) in kernel.iter().enumerate() {
            for (o, &v) in out.iter_mut().zip(&padded[t * 3..t * 3 + row]) {
                *o += v * kv;
            }
        }
    }
    // Then columns: row `y` sums rows `y - half ..= y + half`, reflected at the ends.
    scratch.clear();
    let mut acc = vec![0f32; row];
    for y in 0..h {
        acc.fill(0.0);
        for (t, &kv) in kernel.iter().enumerate() {
            let sy = reflect(y as isize + t as isize - half as isize, h);
            for (o, &v) in acc.iter_mut().zip(&rows[sy * row..(sy + 1) * row]) {
                *o += v * kv;
            }
        }
        scratch.extend(acc.iter().map(|v| cast(round_even(*v))));
    }
    hwc.copy_from_slice(scratch);
}

/// `x.round_ties_even()` without libm: on x86-64's baseline (no SSE4.1 `roundss`) the method is
/// a function call per value, a third of a blur's or a warp's time. Adding 2^23 to a
/// magnitude below it leaves no bits for a fraction, so the FPU rounds it, to nearest even.
#[inline]
fn round_even(x: f32) -> f32 {
    const BIG: f32 = 8_388_608.0;
    if x.abs() < BIG {
        ((x.abs() + BIG) - BIG).copysign(x)
    } else {
        x
    }
}

/// `x.floor()` without libm for `|x| < 2^22`.
#[inline]
fn floor(x: f32) -> f32 {
    // Rounded to nearest by adding 1.5·2^23 (see `grid_index`), less one where that rounded
    // up: selects, no conversion.
    const BIG: f32 = 12_582_912.0;
    let r = (x + BIG) - BIG;
    if r > x {
        r - 1.0
    } else {
        r
    }
}

/// float32 to uint8 as torchvision's `.clamp_(0, 255).to(torch.uint8)`: clamped, then
/// truncated toward zero.
#[inline]
fn cast(v: f32) -> u8 {
    // Without a float-to-int conversion, which is a scalar, saturating one per value: the
    // value clamped (`max` first, so a NaN is 0), rounded by adding 1.5·2^23 (see
    // `grid_index`), one less where that rounded up, and the integer read from the sum's
    // mantissa. Four values at a time where a loop calls it.
    const BIG: f32 = 12_582_912.0;
    #[allow(clippy::manual_clamp)] // clamp keeps a NaN; this makes it 0
    let v = v.max(0.0).min(255.0);
    let r = (v + BIG) - BIG;
    let t = if r > v { r - 1.0 } else { r };
    ((t + BIG).to_bits() - BIG.to_bits()) as u8
}

/// A blend's factor and its complement, each as torchvision passes it to float32 arithmetic
/// (`1 - ratio` is taken in double, then rounded).
#[derive(Clone, Copy)]
struct Ratio {
    ratio: f32,
    alpha: f32,
}

impl Ratio {
    fn of(f: f64) -> Ratio {
        Ratio {
            ratio: f as f32,
            alpha: (1.0 - f) as f32,
        }
    }

    /// torchvision's `_blend` before its cast: `image1.mul(ratio).add_(image2, alpha=1 - ratio)`.
    fn blend(self, x: f32, other: f32) -> f32 {
        x * self.ratio + other * self.alpha
    }
}

/// The table of `f(value)` cast to uint8, for every value.
fn table(f: impl Fn(f32) -> f32) -> [u8; 256] {
    std::array::from_fn(|x| cast(f(x as f32)))
}

fn lookup_all(hwc: &mut [u8], t: &[u8; 256]) {
    hwc.iter_mut().for_each(|v| *v = t[*v as usize]);
}

fn lookup_channels(hwc: &mut [u8], t: &[[u8; 256]; 3]) {
    for px in hwc.chunks_exact_mut(3) {
        px[0] = t[0][px[0] as usize];
        px[1] = t[1][px[1] as usize];
        px[2] = t[2][px[2] as usize];
    }
}

/// A pixel's grey in float32, `r * 0.2989 + g * 0.587 + b * 0.114` in torchvision's order,
/// from a table of each product (one float32 rounding each, as the multiplication's): the
/// same value, without three conversions and multiplications a pixel.
struct Greys([[f32; 256]; 3]);

impl Greys {
    fn new() -> Greys {
        Greys([0.2989f32, 0.587, 0.114].map(|k| std::array::from_fn(|v| v as f32 * k)))
    }

    /// The grey, floored (truncated: it is never negative, and at most 254.97).
    #[inline]
    fn floor(&self, px: &[u8]) -> u8 {
        let [r, g, b] = &self.0;
        ((r[px[0] as usize] + g[px[1] as usize]) + b[px[2] as usize]) as u8
    }
}

/// The mean of the floored greys (torchvision floors them for an integer image), as float32.
fn mean_grey(hwc: &[u8]) -> f32 {
    let n = hwc.len() / 3;
    if n == 0 {
        return 0.0;
    }
    let greys = Greys::new();
    let sum: u64 = hwc
        .chunks_exact(3)
        .map(|px| u64::from(greys.floor(px)))
        .sum();
    (sum as f64 / n as f64) as f32
}

/// `adjust_saturation`: each value blended with its pixel's floored grey, `x * ratio + g *
/// (1 - ratio)`, each product from a table (the same float32 roundings).
fn saturation(hwc: &mut [u8], ratio: Ratio) {
    let greys = Greys::new();
    let own: [f32; 256] = std::array::from_fn(|x| x as f32 * ratio.ratio);
    let grey: [f32; 256] = std::array::from_fn(|g| g as f32 * ratio.alpha);
    for px in hwc.chunks_exact_mut(3) {
        let g = grey[greys.floor(px) as usize];
        for v in px.iter_mut() {
            *v = cast(own[*v as usize] + g);
        }
    }
}

/// Each channel's histogram, then its table by `make`.
fn per_channel(hwc: &[u8], make: fn(&[u32; 256], u32) -> [u8; 256]) -> [[u8; 256]; 3] {
    let mut hist = [[0u32; 256]; 3];
    for px in hwc.chunks_exact(3) {
        hist[0][px[0] as usize] += 1;
        hist[1][px[1] as usize] += 1;
        hist[2][px[2] as usize] += 1;
    }
    let n = (hwc.len() / 3) as u32;
    [0, 1, 2].map(|c| make(&hist[c], n))
}

/// `equalize`: PIL's table, `lut[k] = (cum[k-1] + step / 2) / step` with `step` the count of
/// the pixels not of the channel's largest value over 255; the identity when `step` is 0.
fn equalized(hist: &[u32; 256], n: u32) -> [u8; 256] {
    let last = hist.iter().rposition(|&c| c > 0).unwrap_or(0);
    let step = (n - hist[last]) / 255;
    if step == 0 {
        return std::array::from_fn(|x| x as u8);
    }
    let mut lut = [0u8; 256];
    let mut cum = 0u32;
    for k in 1..256 {
        cum += hist[k - 1];
        lut[k] = ((cum + step / 2) / step).min(255) as u8;
    }
    lut
}

/// `autocontrast`: `(x - min) / ((max - min) * (1 / 255))` in float32, clamped and cast; the
/// identity for a channel of one value.
fn stretched(hist: &[u32; 256], _n: u32) -> [u8; 256] {
    let lo = hist.iter().position(|&c| c > 0).unwrap_or(0);
    let hi = hist.iter().rposition(|&c| c > 0).unwrap_or(0);
    if lo == hi {
        return std::array::from_fn(|x| x as u8);
    }
    let (lo, hi) = (lo as f32, hi as f32);
    let inv_scale = (hi - lo) * (1.0 / 255.0);
    table(|x| (x - lo) / inv_scale)
}

/// `adjust_sharpness`: inside a one-pixel border, each value blended with its 3x3 smoothing
/// (weights 1/13 around, 5/13 in the middle, rounded half to even) by the factor; the border
/// stays. Images of 2 pixels or less across are left as they are.
fn sharpness(hwc: &mut [u8], (w, h): (usize, usize), ratio: Ratio, scratch: &mut Vec<u8>) {
    if w <= 2 || h <= 2 {
        return;
    }
    scratch.clear();
    scratch.extend_from_slice(hwc);
    let src = &scratch[..];
    let row = w * 3;
    for y in 1..h - 1 {
        let up = &src[(y - 1) * row..y * row];
        let mid = &src[y * row..(y + 1) * row];
        let down = &src[(y + 1) * row..(y + 2) * row];
        let out = &mut hwc[y * row..(y + 1) * row];
        // Byte `i` and its neighbours at `i ± 3` (the same channel): nine slices of one
        // length, so the loop has no bounds checks and runs several bytes at a time.
        let n = row - 6;
        let [u0, u1, u2, m0, m1, m2, d0, d1, d2] = [
            (up, 0),
            (up, 3),
            (up, 6),
            (mid, 0),
            (mid, 3),
            (mid, 6),
            (down, 0),
            (down, 3),
            (down, 6),
        ]
        .map(|(r, at): (&[u8], usize)| &r[at..at + n]);
        let out = &mut out[3..3 + n];
        for k in 0..n {
            // torchvision sums the nine products in float32 and rounds half to even. The exact
            // sum is (S + 5c) / 13 for integers S (the eight around) and c (the centre): never
            // within 1/26 of a half, while the float32 sum is within 3e-4 of it, so both round
            // to the same integer, which integer arithmetic finds exactly.
            let v = |r: &[u8]| u16::from(r[k]);
            let around = v(u0) + v(u1) + v(u2) + v(m0) + v(m2) + v(d0) + v(d1) + v(d2);
            let blurred = f32::from((2 * (around + 5 * v(m1)) + 13) / 26);
            let x = f32::from(m1[k]);
            // `view.add_(blurred.sub_(view), alpha=1 - factor)`, in float32.
            out[k] = cast(x + (blurred - x) * ratio.alpha);
        }
    }
}

/// `adjust_hue`: to float32 in [0, 1], to HSV (torchvision's `_rgb_to_hsv`), the hue turned by
/// `f` (mod 1), back to RGB (`_hsv_to_rgb`), and to uint8 as `to_dtype`'s `x * 255.999`
/// truncated. A block of pixels at a time, its channels apart: every step of the arithmetic
/// is a select, not a branch, so the loop runs four pixels at a time.
fn hue(hwc: &mut [u8], f: f32) {
    const BLOCK: usize = 256;
    let mut planes = [[0f32; BLOCK]; 3];
    for block in hwc.chunks_mut(BLOCK * 3) {
        for (i, px) in block.chunks_exact(3).enumerate() {
            for c in 0..3 {
                planes[c][i] = f32::from(px[c]) * (1.0 / 255.0);
            }
        }
        let [r, g, b] = &mut planes;
        for k in 0..BLOCK {
            (r[k], g[k], b[k]) = turned(r[k], g[k], b[k], f);
        }
        for (i, px) in block.chunks_exact_mut(3).enumerate() {
            for c in 0..3 {
                px[c] = cast(planes[c][i] * (255.0 + 1.0 - 1e-3));
            }
        }
    }
}

/// One pixel's hue turned by `f`, in torchvision's float32 steps.
#[inline]
fn turned(r: f32, g: f32, b: f32, f: f32) -> (f32, f32, f32) {
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    let eqc = maxc == minc;
    let range = maxc - minc;
    let s = range / if eqc { 1.0 } else { maxc };
    let div = if eqc { 1.0 } else { range };
    let (rc, gc, bc) = ((maxc - r) / div, (maxc - g) / div, (maxc - b) / div);
    let hr = if maxc == r { bc - gc } else { 0.0 };
    let hg = if maxc == g && maxc != r {
        rc + 2.0 - bc
    } else {
        0.0
    };
    let hb = if maxc != r && maxc != g {
        gc + 4.0 - rc
    } else {
        0.0
    };
    // `fmod_(1.0)` of a positive value, then `add_(f).remainder_(1.0)` (Python's modulo,
    // `x - floor(x)`): both exact as written here.
    let h = (hr + hg + hb) * (1.0 / 6.0) + 1.0;
    let h = h - floor(h);
    let h = h + f;
    let h = h - floor(h);
    let v = maxc;
    let h6 = h * 6.0;
    let i = floor(h6);
    let fr = h6 - i;
    // `i % 6`: `h` is in [0, 1), so `i` in 0..=6 at most.
    let i = if i >= 6.0 { i - 6.0 } else { i };
    let sxf = s * fr;
    let q = ((1.0 - sxf) * v).clamp(0.0, 1.0);
    let t = ((sxf + (1.0 - s)) * v).clamp(0.0, 1.0);
    let p = ((1.0 - s) * v).clamp(0.0, 1.0);
    let pick = |k: [f32; 6]| {
        let x = if i == 4.0 { k[4] } else { k[5] };
        let x = if i == 3.0 { k[3] } else { x };
        let x = if i == 2.0 { k[2] } else { x };
        let x = if i == 1.0 { k[1] } else { x };
        if i == 0.0 {
            k[0]
        } else {
            x
        }
    };
    (
        pick([v, q, p, p, t, v]),
        pick([t, v, v, q, p, p]),
        pick([p, p, t, v, v, q]),
    )
}

#[cfg(test)]
mod tests {
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
}
