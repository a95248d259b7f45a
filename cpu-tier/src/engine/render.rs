//! Rendering one sample: an image (a JPEG decoded over its crop window at a DCT scale, or
//! another format decoded whole) or a clip (only its window's frames), resampled once into
//! the output (or straight into its place in the client's batch), then normalized and laid
//! out as the pipeline asks.

use std::time::Instant;

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions};
use sluice_wire::spec::DType;
use sluice_wire::SampleGeometry;

use super::pixels::Plan;
use super::{Dest, Engine, Tensor, Workspace};
use crate::error::DecodeError;
use crate::geometry::{compose, dct_scale, Geometry, RectF};
use crate::jpeg::{exif_orientation, Rect};

impl Engine {
    /// The sample's geometry, then the seed of its random pixel ops, from its stream, and
    /// its pixel ops with their draws made on its output size: drawn once, for every frame,
    /// the tensor and the geometry it reports.
    pub(super) fn geometry(
        &self,
        w: u32,
        h: u32,
        rng: &mut sluice_plan::rng::Stream,
    ) -> (Geometry, Plan) {
        let mut g = compose(&self.spec.ops, w, h, rng);
        if self.spec.draws_pixels() {
            g.pixel_seed = rng.next_u64();
        }
        let plan = match self.spec.pixels.is_empty() && self.spec.erasing.is_none() {
            true => Plan::default(),
            false => super::pixels::plan(&self.spec, (g.out_w, g.out_h), g.pixel_seed, g.flip),
        };
        (g, plan)
    }

    /// The geometry a sample reports: what [`compose`] chose on a `w`×`h` source, and the
    /// affine transform of its pixel ops.
    pub(super) fn reported(&self, w: u32, h: u32, g: &Geometry, plan: &Plan) -> SampleGeometry {
        SampleGeometry {
            affine: plan.affine((g.out_w, g.out_h)),
            ..reported(w, h, g)
        }
    }

    pub(super) fn render_jpeg(
        &self,
        ws: &mut Workspace,
        data: &[u8],
        rng: &mut sluice_plan::rng::Stream,
        t0: Instant,
        dest: Dest<'_>,
    ) -> Result<(Tensor, u64, SampleGeometry), DecodeError> {
        let header = ws.jpeg.header(data)?;
        let orientation = exif_orientation(data);
        if orientation != 1 {
            // Rare: decode everything, orient, then crop from the oriented image.
            let full = Rect {
                x: 0,
                y: 0,
                w: header.width,
                h: header.height,
            };
            let mut region = std::mem::take(&mut ws.region);
            let decoded = ws.jpeg.decode_region(data, &header, full, 8, &mut region);
            let decoded = match decoded {
                Ok(d) => d,
                Err(e) => {
                    ws.region = region;
                    return Err(e);
                }
            };
            let (w, h) = orient(
                &region,
                decoded.rect.w,
                decoded.rect.h,
                orientation,
                &mut ws.oriented,
            );
            ws.region = region;
            let (g, plan) = self.geometry(w, h, rng);
            let decode_ns = t0.elapsed().as_nanos() as u64;
            let buf = std::mem::take(&mut ws.oriented);
            let t = self.resample(ws, (&buf, w, h), g.src, (&g, &plan), dest);
            ws.oriented = buf;
            return Ok((t?, decode_ns, self.reported(w, h, &g, &plan)));
        }
        let (g, plan) = self.geometry(header.width, header.height, rng);
        let scale = if self.config.dct_scaling {
            dct_scale(&g)
        } else {
            8
        };
        let want = self.window(&g, header.width, header.height);
        let mut region = std::mem::take(&mut ws.region);
        let decoded = ws
            .jpeg
            .decode_region(data, &header, want, scale, &mut region);
        let decode_ns = t0.elapsed().as_nanos() as u64;
        let result = decoded.and_then(|d| {
            let crop = scaled_crop(&g, &d);
            self.resample(ws, (&region, d.rect.w, d.rect.h), crop, (&g, &plan), dest)
        });
        ws.region = region;
        Ok((
            result?,
            decode_ns,
            self.reported(header.width, header.height, &g, &plan),
        ))
    }

    /// The part of a `w`×`h` image to decode for geometry `g`: the crop window (with ROI
    /// decoding), or all of it.
    fn window(&self, g: &Geometry, w: u32, h: u32) -> Rect {
        if !self.config.roi_decode {
            return Rect { x: 0, y: 0, w, h };
        }
        // The resampling filter reaches past the crop's edges (bilinear: one output pixel's
        // width in source pixels, as torchvision resizes the whole image): decode that
        // margin too, so edge pixels match a full decode.
        let mx = (g.src.w / f64::from(g.out_w)).max(1.0).ceil() + 1.0;
        let my = (g.src.h / f64::from(g.out_h)).max(1.0).ceil() + 1.0;
        let x0 = (g.src.x - mx).max(0.0).floor() as u32;
        let y0 = (g.src.y - my).max(0.0).floor() as u32;
        let x1 = ((g.src.x + g.src.w + mx).ceil().max(0.0) as u32).min(w);
        let y1 = ((g.src.y + g.src.h + my).ceil().max(0.0) as u32).min(h);
        Rect {
            x: x0.min(w - 1),
            y: y0.min(h - 1),
            w: x1.saturating_sub(x0).max(1),
            h: y1.saturating_sub(y0).max(1),
        }
    }

    /// A clip: its frames found without decoding them ([`crate::clip::frames`]), the window's
    /// start drawn (or centred), and only the window's frames decoded, each with the ROI and
    /// DCT scale an image gets; the crop and flip are drawn once, from the first frame taken,
    /// and applied to every frame. A frame repeated past a short clip's end is copied.
    pub(super) fn render_clip(
        &self,
        ws: &mut Workspace,
        data: &[u8],
        clip: sluice_wire::spec::Clip,
        rng: &mut sluice_plan::rng::Stream,
        dest: Dest<'_>,
    ) -> Result<(Tensor, u64, SampleGeometry), DecodeError> {
        let frames = crate::clip::frames(data, self.config.limits.max_clip_frames)?;
        let total = frames.len() as u32;
        let window = clip.window(total, |n| rng.below(n));
        let taken: Vec<u32> = window.indices().collect();
        let f0 = &data[frames[taken[0] as usize].clone()];
        let header = ws.jpeg.header(f0)?;
        let (w, h) = (header.width, header.height);
        let (g, plan) = self.geometry(w, h, rng);
        let scale = if self.config.dct_scaling {
            dct_scale(&g)
        } else {
            8
        };
        let want = self.window(&g, w, h);
        let frame_len = g.out_w as usize * g.out_h as usize * 3;
        let len = frame_len * taken.len();
        let (mut claim, mut owned) = self.output(dest, len);
        let out: &mut [u8] = match claim.as_mut() {
            Some(c) => c.memory(),
            None => &mut owned,
        };
        let mut decode_ns = 0;
        let mut region = std::mem::take(&mut ws.region);
        let mut result = Ok(());
        for (t, &k) in taken.iter().enumerate() {
            if t > 0 && taken[t - 1] == k {
                out.copy_within((t - 1) * frame_len..t * frame_len, t * frame_len);
                continue;
            }
            let started = Instant::now();
            let frame = &data[frames[k as usize].clone()];
            let decoded = ws.jpeg.header(frame).and_then(|fh| {
                if (fh.width, fh.height) != (w, h) {
                    return Err(DecodeError::Clip(format!(
                        "frame {k} is {}x{}, frame {} is {w}x{h}",
                        fh.width, fh.height, taken[0]
                    )));
                }
                ws.jpeg.decode_region(frame, &fh, want, scale, &mut region)
            });
            decode_ns += started.elapsed().as_nanos() as u64;
            let to = &mut out[t * frame_len..(t + 1) * frame_len];
            result = decoded.and_then(|d| {
                let crop = scaled_crop(&g, &d);
                self.resample_into(ws, (&region, d.rect.w, d.rect.h), crop, (&g, &plan), to)
            });
            if result.is_err() {
                break;
            }
        }
        ws.region = region;
        result?;
        let mut geometry = self.reported(w, h, &g, &plan);
        geometry.frames = Some(window);
        let frames_out = taken.len() as u32;
        if let Some(c) = claim {
            let tensor = Tensor {
                frames: frames_out,
                height: g.out_h,
                width: g.out_w,
                dtype: self.spec.dtype(),
                chw: false,
                data: Vec::new(),
                placed: Some(c.place()),
            };
            return Ok((tensor, decode_ns, geometry));
        }
        let data = match self.spec.normalize.is_none() && !self.spec.chw {
            true => owned,
            // Normalized or channels first, frame by frame (T×3×H×W with chw).
            false => {
                let mut data = Vec::with_capacity(len * self.spec.dtype().size());
                for f in owned.chunks_exact(frame_len) {
                    let one = self.convert(f.to_vec(), &g, &plan).data;
                    data.extend_from_slice(&one);
                    self.outputs.give_back(one);
                }
                self.outputs.give_back(owned);
                data
            }
        };
        let tensor = Tensor {
            frames: frames_out,
            height: g.out_h,
            width: g.out_w,
            dtype: self.spec.dtype(),
            chw: self.spec.chw,
            data,
            placed: None,
        };
        Ok((tensor, decode_ns, geometry))
    }

    pub(super) fn decode_other(&self, data: &[u8]) -> Result<image::RgbImage, DecodeError> {
        let format = image::guess_format(data)
            .map_err(|_| DecodeError::Unsupported("not JPEG, PNG or WebP".into()))?;
        if !matches!(format, image::ImageFormat::Png | image::ImageFormat::WebP) {
            return Err(DecodeError::Unsupported(format!("{format:?}")));
        }
        let mut reader = image::ImageReader::with_format(std::io::Cursor::new(data), format);
        let mut limits = image::Limits::default();
        limits.max_alloc = Some(self.config.limits.max_pixels.saturating_mul(4));
        reader.limits(limits.clone());
        let (w, h) = reader
            .into_dimensions()
            .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
        if u64::from(w) * u64::from(h) > self.config.limits.max_pixels {
            return Err(DecodeError::TooLarge {
                width: w,
                height: h,
                limit: self.config.limits.max_pixels,
            });
        }
        let mut reader = image::ImageReader::with_format(std::io::Cursor::new(data), format);
        reader.limits(limits);
        let img = reader
            .decode()
            .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
        Ok(img.into_rgb8())
    }

    /// Resamples `crop` (in `buf`'s pixel coordinates, `bw`×`bh` RGB) to the output size,
    /// black where the crop lies outside the image, then flips and converts.
    /// When the result is the resize's own output (uint8, H×W×3) and `dest` names a place
    /// the client gave for the sample, the resize writes there: no copy on either side.
    pub(super) fn resample(
        &self,
        ws: &mut Workspace,
        (buf, bw, bh): (&[u8], u32, u32),
        crop: RectF,
        (g, plan): (&Geometry, &Plan),
        dest: Dest<'_>,
    ) -> Result<Tensor, DecodeError> {
        let (ow, oh) = (g.out_w, g.out_h);
        let len = ow as usize * oh as usize * 3;
        let (mut claim, mut owned) = self.output(dest, len);
        let out: &mut [u8] = match claim.as_mut() {
            Some(c) => c.memory(),
            None => &mut owned,
        };
        self.resample_into(ws, (buf, bw, bh), crop, (g, plan), out)?;
        if let Some(c) = claim {
            return Ok(Tensor {
                frames: 1,
                height: oh,
                width: ow,
                dtype: self.spec.dtype(),
                chw: false,
                data: Vec::new(),
                placed: Some(c.place()),
            });
        }
        Ok(self.convert(owned, g, plan))
    }

    /// A tensor decoded for another job of the sweep, as this sample's: written into its
    /// place when `dest` has one for it (where a decode would have written it), else copied
    /// into a buffer of ours.
    pub(super) fn copied(&self, kept: &Tensor, dest: Dest<'_>) -> Tensor {
        if let Some(placed) = self.to_place(kept, dest) {
            return placed;
        }
        let mut data = self.outputs.take(kept.data.len());
        data.copy_from_slice(&kept.data);
        Tensor {
            data,
            placed: None,
            ..kept.clone_header()
        }
    }

    /// `tensor` copied into this sample's place, if `dest` has one it goes to as it is.
    pub(super) fn to_place(&self, tensor: &Tensor, dest: Dest<'_>) -> Option<Tensor> {
        dest?;
        let (claim, owned) = self.output(dest, tensor.data.len());
        let Some(mut claim) = claim else {
            self.outputs.give_back(owned);
            return None;
        };
        claim.memory().copy_from_slice(&tensor.data);
        Some(Tensor {
            data: Vec::new(),
            placed: Some(claim.place()),
            ..tensor.clone_header()
        })
    }

    /// Where a tensor of `len` bytes is written: its place in the client's batch, when it has
    /// one and the tensor goes there as it is (no normalize, no chw), else a buffer of ours.
    fn output<'d>(
        &self,
        dest: Dest<'d>,
        len: usize,
    ) -> (Option<sluice_wire::PlaceClaim<'d>>, Vec<u8>) {
        let claim = match dest {
            Some((t, index)) if self.spec.normalize.is_none() && !self.spec.chw => {
                t.places.claim(t.unit, t.attempt, index, len)
            }
            _ => None,
        };
        match claim {
            Some(c) => (Some(c), Vec::new()),
            None => (None, self.outputs.take(len)),
        }
    }

    /// Resamples `crop` of the `bw`×`bh` image in `buf` to the output size into `out`
    /// (black where the crop reaches past the image), mirrored if the geometry flips, then
    /// the pipeline's pixel ops.
    fn resample_into(
        &self,
        ws: &mut Workspace,
        (buf, bw, bh): (&[u8], u32, u32),
        crop: RectF,
        (g, plan): (&Geometry, &Plan),
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        let (ow, oh) = (g.out_w, g.out_h);
        let src = ImageRef::new(bw, bh, buf, PixelType::U8x3)
            .map_err(|e| DecodeError::Decoder(e.to_string()))?;
        let alg = ResizeAlg::Convolution(FilterType::Bilinear);
        let (bwf, bhf) = (f64::from(bw), f64::from(bh));
        let eps = 1e-6;
        let inside = crop.x >= -eps
            && crop.y >= -eps
            && crop.x + crop.w <= bwf + eps
            && crop.y + crop.h <= bhf + eps;
        if inside {
            let (x, y) = (crop.x.clamp(0.0, bwf), crop.y.clamp(0.0, bhf));
            let opts = ResizeOptions::new().resize_alg(alg).crop(
                x,
                y,
                crop.w.min(bwf - x),
                crop.h.min(bhf - y),
            );
            let mut dst = Image::from_slice_u8(ow, oh, out, PixelType::U8x3)
                .map_err(|e| DecodeError::Decoder(e.to_string()))?;
            ws.resizer
                .resize(&src, &mut dst, &opts)
                .map_err(|e| DecodeError::Decoder(e.to_string()))?;
        } else {
            // Padding: resample the part inside the image into its place in a black output.
            out.fill(0);
            let (kx, ky) = (f64::from(ow) / crop.w, f64::from(oh) / crop.h);
            let vx0 = crop.x.max(0.0);
            let vy0 = crop.y.max(0.0);
            let vx1 = (crop.x + crop.w).min(bwf);
            let vy1 = (crop.y + crop.h).min(bhf);
            let ox0 = (((vx0 - crop.x) * kx).round() as u32).min(ow);
            let oy0 = (((vy0 - crop.y) * ky).round() as u32).min(oh);
            let ox1 = (((vx1 - crop.x) * kx).round() as u32).min(ow);
            let oy1 = (((vy1 - crop.y) * ky).round() as u32).min(oh);
            if vx1 > vx0 && vy1 > vy0 && ox1 > ox0 && oy1 > oy0 {
                let (pw, ph) = (ox1 - ox0, oy1 - oy0);
                ws.tmp.clear();
                ws.tmp.resize(pw as usize * ph as usize * 3, 0);
                let opts =
                    ResizeOptions::new()
                        .resize_alg(alg)
                        .crop(vx0, vy0, vx1 - vx0, vy1 - vy0);
                let mut dst = Image::from_slice_u8(pw, ph, &mut ws.tmp, PixelType::U8x3)
                    .map_err(|e| DecodeError::Decoder(e.to_string()))?;
                ws.resizer
                    .resize(&src, &mut dst, &opts)
                    .map_err(|e| DecodeError::Decoder(e.to_string()))?;
                let row = pw as usize * 3;
                for r in 0..ph as usize {
                    let at = ((oy0 as usize + r) * ow as usize + ox0 as usize) * 3;
                    out[at..at + row].copy_from_slice(&ws.tmp[r * row..(r + 1) * row]);
                }
            }
        }
        // A flip written after pixel ops is theirs to do, in its place.
        if g.flip && self.spec.flip_after.is_none() {
            for row in out.chunks_exact_mut(ow as usize * 3) {
                mirror_rgb(row);
            }
        }
        plan.run(out, (ow, oh), self.spec.normalize.as_ref(), &mut ws.tmp);
        Ok(())
    }

    /// Applies normalization and layout, then a `random_erasing` that follows them.
    fn convert(&self, hwc: Vec<u8>, g: &Geometry, plan: &Plan) -> Tensor {
        let (w, h) = (g.out_w, g.out_h);
        let chw = self.spec.chw;
        let plane = w as usize * h as usize;
        let index = |p: usize, c: usize| if chw { c * plane + p } else { p * 3 + c };
        let data = match &self.spec.normalize {
            None if !chw => hwc,
            None => {
                let mut out = self.outputs.take(hwc.len());
                for (p, px) in hwc.chunks_exact(3).enumerate() {
                    for c in 0..3 {
                        out[index(p, c)] = px[c];
                    }
                }
                self.outputs.give_back(hwc);
                out
            }
            Some(n) => {
                let scale: [f32; 3] = std::array::from_fn(|c| 1.0 / (255.0 * n.std[c]));
                let shift: [f32; 3] = std::array::from_fn(|c| -n.mean[c] / n.std[c]);
                let value = |c: usize, v: usize| v as f32 * scale[c] + shift[c];
                let mut out = self.outputs.take(hwc.len() * n.dtype.size());
                // A byte has 256 values: each channel's outputs as a table of their bytes,
                // and the pass is a copy per value.
                match n.dtype {
                    DType::F16 => {
                        let lut: [[[u8; 2]; 256]; 3] = std::array::from_fn(|c| {
                            std::array::from_fn(|v| half::f16::from_f32(value(c, v)).to_le_bytes())
                        });
                        normalize_into(&hwc, &mut out, &lut, chw);
                    }
                    _ => {
                        let lut: [[[u8; 4]; 256]; 3] = std::array::from_fn(|c| {
                            std::array::from_fn(|v| value(c, v).to_le_bytes())
                        });
                        normalize_into(&hwc, &mut out, &lut, chw);
                    }
                }
                self.outputs.give_back(hwc);
                out
            }
        };
        let mut data = data;
        plan.erase_finished(&mut data, (w, h), self.spec.dtype().size(), chw);
        Tensor {
            frames: 1,
            height: h,
            width: w,
            dtype: self.spec.dtype(),
            chw,
            data,
            placed: None,
        }
    }
}

/// `hwc`'s values through each channel's table of output bytes into `out`, channels first
/// when `chw`.
fn normalize_into<const N: usize>(
    hwc: &[u8],
    out: &mut [u8],
    lut: &[[[u8; N]; 256]; 3],
    chw: bool,
) {
    if chw {
        let plane = hwc.len() / 3 * N;
        for (c, (dst, lut)) in out.chunks_exact_mut(plane).zip(lut).enumerate() {
            for (o, px) in dst.chunks_exact_mut(N).zip(hwc.chunks_exact(3)) {
                o.copy_from_slice(&lut[px[c] as usize]);
            }
        }
    } else {
        for (o, px) in out.chunks_exact_mut(3 * N).zip(hwc.chunks_exact(3)) {
            o[..N].copy_from_slice(&lut[0][px[0] as usize]);
            o[N..2 * N].copy_from_slice(&lut[1][px[1] as usize]);
            o[2 * N..].copy_from_slice(&lut[2][px[2] as usize]);
        }
    }
}

/// Mirrors a row of RGB pixels in place, a pixel (three bytes) at a time.
pub(super) fn mirror_rgb(row: &mut [u8]) {
    let n = row.len() / 3;
    let (left, right) = row.split_at_mut(n / 2 * 3);
    // Pixel i swaps with pixel n-1-i: the left half from its start, the right from its end
    // (its first pixel, the middle one of an odd row, stays). No index arithmetic or bounds
    // checks in the loop: half the time of indexing the right half (42 → 20 µs a 224×224
    // image here).
    for (a, b) in left.chunks_exact_mut(3).zip(right.rchunks_exact_mut(3)) {
        let (x, y) = ([a[0], a[1], a[2]], [b[0], b[1], b[2]]);
        a.copy_from_slice(&y);
        b.copy_from_slice(&x);
    }
}

/// The geometry a sample reports: what [`compose`] chose, on a `w`×`h` source.
fn reported(w: u32, h: u32, g: &Geometry) -> SampleGeometry {
    let r = g.src;
    SampleGeometry {
        source: (h, w),
        crop: (
            r.x as f32,
            r.y as f32,
            (r.x + r.w) as f32,
            (r.y + r.h) as f32,
        ),
        size: (g.out_h, g.out_w),
        flip: g.flip,
        frames: None,
        affine: None,
    }
}

/// The crop `g` takes, in the pixels of a region decoded at a DCT scale.
fn scaled_crop(g: &Geometry, d: &crate::jpeg::Decoded) -> RectF {
    let s = f64::from(d.scale_num) / 8.0;
    RectF {
        x: g.src.x * s - f64::from(d.rect.x),
        y: g.src.y * s - f64::from(d.rect.y),
        w: g.src.w * s,
        h: g.src.h * s,
    }
}

/// Applies EXIF orientation `o` (2–8) to a `w`×`h` RGB image into `out`; returns the new size.
fn orient(src: &[u8], w: u32, h: u32, o: u8, out: &mut Vec<u8>) -> (u32, u32) {
    let (w, h) = (w as usize, h as usize);
    let swap = o >= 5;
    let (nw, nh) = if swap { (h, w) } else { (w, h) };
    out.clear();
    out.resize(nw * nh * 3, 0);
    for y in 0..nh {
        for x in 0..nw {
            // Source pixel for destination (x, y), per the EXIF orientation definitions.
            let (sx, sy) = match o {
                2 => (w - 1 - x, y),
                3 => (w - 1 - x, h - 1 - y),
                4 => (x, h - 1 - y),
                5 => (y, x),
                6 => (y, h - 1 - x),
                7 => (w - 1 - y, h - 1 - x),
                8 => (w - 1 - y, x),
                _ => (x, y),
            };
            let (d, s) = ((y * nw + x) * 3, (sy * w + sx) * 3);
            out[d..d + 3].copy_from_slice(&src[s..s + 3]);
        }
    }
    (nw as u32, nh as u32)
}

#[cfg(test)]
mod tests {
    #[test]
    fn mirroring_reverses_the_pixels_and_keeps_their_bytes() {
        for n in 0..6u8 {
            let row: Vec<u8> = (0..n * 3).collect();
            let mut m = row.clone();
            super::mirror_rgb(&mut m);
            let want: Vec<u8> = row.chunks(3).rev().flatten().copied().collect();
            assert_eq!(m, want, "{n} pixels");
        }
    }
}
