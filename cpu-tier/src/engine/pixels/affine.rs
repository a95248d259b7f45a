//! Rotate, shear and translate: torchvision's matrices for a step, and the one
//! nearest-neighbour pass (`grid_sample`'s arithmetic, or row copies where it reduces to them)
//! that applies it.

use sluice_wire::spec::PixelOp;

/// Rotate, shear or translate on a `w`×`h` image: torchvision's matrices for the image
/// (inverse, centred coordinates) and for boxes (forward, pixel-edge coordinates).
#[derive(Clone, Copy, Debug)]
pub(super) struct Affine {
    pub(super) inverse: [f64; 6],
    pub(super) forward: [f64; 6],
    /// Counter-clockwise quarter turns done by `rot90` (torchvision's fast path: 180°, and 90°
    /// or 270° on a square image).
    pub(super) quarters: Option<u8>,
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
    pub(super) fn of(op: &PixelOp, (w, h): (u32, u32)) -> Option<Affine> {
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
pub(super) fn warp(hwc: &mut [u8], (w, h): (usize, usize), a: &Affine, scratch: &mut Vec<u8>) {
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
pub(super) fn grid_index(v: f32) -> i32 {
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
