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

mod affine;
mod augment;

use affine::{warp, Affine};

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
                augment::rand_augment(&mut plan, (n, m, bins), (w, h), &mut rng)
            }
            PixelOp::TrivialAugment { bins } => {
                augment::trivial_augment(&mut plan, bins, (w, h), &mut rng)
            }
            PixelOp::AutoAugment => augment::auto_augment(&mut plan, (w, h), &mut rng),
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
    let sigma = sigma as f32;
    let xs: Vec<f32> = (0..k as u32)
        .map(|i| linspace(-lim, lim, k as u32, i))
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
mod tests;
