//! The pixel ops (`brightness`, `contrast`, ... `grayscale`) on a uint8 RGB image in place,
//! as `torchvision.transforms.v2.functional` computes them on a uint8 tensor: float32
//! arithmetic, clamped to 0..=255 and truncated to uint8 where torchvision casts, rounded
//! where it rounds. An image is one frame: a clip's frames each take the ops alone, as
//! torchvision's video kernels do.
//!
//! Every op whose output value depends only on the input value and numbers known before the
//! pass (brightness, contrast once the mean is known, solarize, posterize, invert, equalize
//! and autocontrast once the histogram is) is a 256-entry table per channel, built with the
//! same float32 expression torchvision evaluates, so a table is exact and the pass is a
//! lookup per byte. Saturation, grayscale and hue mix a pixel's channels; sharpness and blur
//! its neighbours.
//!
//! The random ops (`color_jitter`, `random_grayscale`, `gaussian_blur`) draw torchvision's
//! parameters from a stream of the sample's own seed (drawn after its geometry), so a sample
//! gets the same pixels whichever worker makes it, and every frame of a clip the same draw.

use sluice_plan::rng::{stream, Domain, Stream};
use sluice_wire::spec::PixelOp;

/// Applies `ops` in order to the `w`×`h` RGB image in `hwc`; the random ones draw from the
/// stream of `seed` (the sample's [`crate::geometry::Geometry::pixel_seed`]).
pub(crate) fn apply(
    ops: &[PixelOp],
    hwc: &mut [u8],
    (w, h): (u32, u32),
    seed: u64,
    scratch: &mut Vec<u8>,
) {
    let mut draws = None;
    for op in ops {
        let rng = || stream(seed, Domain::PixelOps, 0, 0);
        match *op {
            PixelOp::ColorJitter {
                brightness,
                contrast,
                saturation,
                hue,
            } => {
                let rng = draws.get_or_insert_with(rng);
                for op in jitter([brightness, contrast, saturation, hue], rng) {
                    apply_fixed(&op, hwc, (w, h), scratch);
                }
            }
            PixelOp::RandomGrayscale(p) => {
                if draws.get_or_insert_with(rng).unit_f64() < p {
                    apply_fixed(&PixelOp::Grayscale, hwc, (w, h), scratch);
                }
            }
            PixelOp::GaussianBlur { kernel, sigma } => {
                let rng = draws.get_or_insert_with(rng);
                let s = uniform(rng, sigma);
                blur(hwc, (w as usize, h as usize), kernel as usize, s, scratch);
            }
            ref fixed => apply_fixed(fixed, hwc, (w, h), scratch),
        }
    }
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
            for px in hwc.chunks_exact_mut(3) {
                let g = cast(grey(px));
                px.fill(g);
            }
        }
        // Drawn in `apply`, which never passes them here.
        PixelOp::ColorJitter { .. }
        | PixelOp::RandomGrayscale(_)
        | PixelOp::GaussianBlur { .. } => {}
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
        scratch.extend(acc.iter().map(|v| cast(v.round_ties_even())));
    }
    hwc.copy_from_slice(scratch);
}

/// float32 to uint8 as torchvision's `.clamp_(0, 255).to(torch.uint8)`: clamped, then
/// truncated toward zero.
fn cast(v: f32) -> u8 {
    v.clamp(0.0, 255.0) as u8
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

/// A pixel's grey in float32: `r * 0.2989 + g * 0.587 + b * 0.114`, in torchvision's order.
fn grey(px: &[u8]) -> f32 {
    let [r, g, b] = [px[0], px[1], px[2]].map(f32::from);
    r * 0.2989 + g * 0.587 + b * 0.114
}

/// The mean of the floored greys (torchvision floors them for an integer image), as float32.
fn mean_grey(hwc: &[u8]) -> f32 {
    let n = hwc.len() / 3;
    if n == 0 {
        return 0.0;
    }
    let sum: f64 = hwc
        .chunks_exact(3)
        .map(|px| f64::from(grey(px).floor()))
        .sum();
    (sum / n as f64) as f32
}

fn saturation(hwc: &mut [u8], ratio: Ratio) {
    for px in hwc.chunks_exact_mut(3) {
        let g = grey(px).floor();
        for v in px.iter_mut() {
            *v = cast(ratio.blend(f32::from(*v), g));
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
    let (a, b) = (1.0f32 / 13.0, 5.0f32 / 13.0);
    let row = w * 3;
    for y in 1..h - 1 {
        let up = &src[(y - 1) * row..y * row];
        let mid = &src[y * row..(y + 1) * row];
        let down = &src[(y + 1) * row..(y + 2) * row];
        let out = &mut hwc[y * row..(y + 1) * row];
        // Byte `i` and its neighbours at `i ± 3` (the same channel), conv2d's sum in its order
        // (row by row).
        for (i, o) in out.iter_mut().enumerate().take(row - 3).skip(3) {
            let v = |r: &[u8], j: usize| f32::from(r[j]);
            let mut s = v(up, i - 3) * a;
            s += v(up, i) * a;
            s += v(up, i + 3) * a;
            s += v(mid, i - 3) * a;
            s += v(mid, i) * b;
            s += v(mid, i + 3) * a;
            s += v(down, i - 3) * a;
            s += v(down, i) * a;
            s += v(down, i + 3) * a;
            let x = v(mid, i);
            // `view.add_(blurred.sub_(view), alpha=1 - factor)`.
            *o = cast(x + (s.round_ties_even() - x) * ratio.alpha);
        }
    }
}

/// `adjust_hue`: to float32 in [0, 1], to HSV (torchvision's `_rgb_to_hsv`), the hue turned by
/// `f` (mod 1), back to RGB (`_hsv_to_rgb`), and to uint8 as `to_dtype`'s `x * 255.999`
/// truncated.
fn hue(hwc: &mut [u8], f: f32) {
    for px in hwc.chunks_exact_mut(3) {
        let [r, g, b] = [px[0], px[1], px[2]].map(|v| f32::from(v) * (1.0 / 255.0));
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
        // `x - floor(x)`): both exact as written here, and no libm call.
        let h = (hr + hg + hb) * (1.0 / 6.0) + 1.0;
        let h = h - h.floor();
        let h = h + f;
        let h = h - h.floor();
        let v = maxc;
        let h6 = h * 6.0;
        let i = h6.floor();
        let fr = h6 - i;
        let i = (i as i32).rem_euclid(6);
        let sxf = s * fr;
        let q = ((1.0 - sxf) * v).clamp(0.0, 1.0);
        let t = ((sxf + (1.0 - s)) * v).clamp(0.0, 1.0);
        let p = ((1.0 - s) * v).clamp(0.0, 1.0);
        let (r, g, b) = match i {
            0 => (v, t, p),
            1 => (q, v, p),
            2 => (p, v, t),
            3 => (p, q, v),
            4 => (t, p, v),
            _ => (v, p, q),
        };
        let out = |x: f32| (x * (255.0 + 1.0 - 1e-3)) as u8;
        px[0] = out(r);
        px[1] = out(g);
        px[2] = out(b);
    }
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
}
