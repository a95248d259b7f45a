//! Restart markers as a seek index into a JPEG's entropy-coded data.
//!
//! Without restart markers, reaching a pixel of a JPEG means Huffman-decoding every MCU
//! before it: libjpeg-turbo's `jpeg_skip_scanlines` and `jpeg_crop_scanline` skip the
//! inverse DCT and colour conversion of what lies outside a window, not its entropy
//! decoding, which is two thirds of the engine's time. The DC predictors reset at each
//! restart marker, so the data between two markers (an *interval*) decodes on its own. When
//! the intervals tile the image (each a whole number of MCU rows, or an equal share of one
//! MCU row), [`sub_image`] writes the intervals a window touches as a JPEG of their own (the
//! same headers with a smaller width and height, the intervals' data back to back, markers
//! renumbered from RST0), which libjpeg-turbo then decodes as usual: the rows above and
//! below the window, and the columns beside it, are never entropy-decoded.
//!
//! `sluice shard` adds such markers losslessly at shard time (libjpeg-turbo's transform, the
//! same coefficients: the pixels do not change), up to 32 intervals per MCU row. Files without
//! them, or that are progressive, arithmetic-coded or non-interleaved, are decoded as before.
//!
//! Everything here reads untrusted bytes: every offset is checked, and anything unexpected
//! means "no seek index" (the caller decodes the whole file and reports its errors).

/// How a baseline JPEG's restart intervals tile it: a grid of `cols` × `rows` cells of
/// `cell_w` × `cell_h` pixels (the last column and row cut by the image's edge).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Offset of the frame header's 16-bit height (its width follows).
    height_at: usize,
    pub width: u32,
    pub height: u32,
    /// Offset of the first entropy-coded byte (after the scan header).
    scan_start: usize,
    /// Pixels of one interval: whole MCUs across, whole MCU rows down.
    pub cell_w: u32,
    pub cell_h: u32,
    /// Intervals across a row of them, and rows of them.
    pub cols: u32,
    pub rows: u32,
}

fn be16(data: &[u8], at: usize) -> Option<u32> {
    let b = data.get(at..at + 2)?;
    Some(u32::from(b[0]) << 8 | u32::from(b[1]))
}

/// The layout of `data` when it is a single-scan Huffman JPEG whose restart intervals tile
/// it (an interval is a whole number of MCU rows, or divides one evenly); `None` otherwise.
pub fn layout(data: &[u8]) -> Option<Layout> {
    if data.get(..2)? != [0xFF, 0xD8] {
        return None;
    }
    let mut at = 2;
    let mut frame = None; // (height_at, height, width, components, max h, max v)
    let mut interval = 0u32;
    loop {
        // A marker, after any fill bytes.
        if *data.get(at)? != 0xFF {
            return None;
        }
        while *data.get(at + 1)? == 0xFF {
            at += 1;
        }
        let marker = *data.get(at + 1)?;
        let len = be16(data, at + 2)? as usize;
        if len < 2 {
            return None;
        }
        let body = at + 4;
        match marker {
            // Baseline and extended sequential, Huffman-coded.
            0xC0 | 0xC1 => {
                if *data.get(body)? != 8 {
                    return None;
                }
                let height = be16(data, body + 1)?;
                let width = be16(data, body + 3)?;
                let n = usize::from(*data.get(body + 5)?);
                let (mut h, mut v) = (1u32, 1u32);
                for c in 0..n {
                    let hv = *data.get(body + 6 + 3 * c + 1)?;
                    h = h.max(u32::from(hv >> 4));
                    v = v.max(u32::from(hv & 15));
                }
                if height == 0 || width == 0 || n == 0 || h > 4 || v > 4 {
                    return None;
                }
                frame = Some((body + 1, height, width, n, h, v));
            }
            // Every other frame type: progressive, lossless, arithmetic, hierarchical.
            0xC2 | 0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => return None,
            0xDD => interval = be16(data, body)?,
            0xDA => {
                let (height_at, height, width, n, h, v) = frame?;
                // One interleaved scan of every component (or a grey image).
                if usize::from(*data.get(body)?) != n || interval == 0 {
                    return None;
                }
                let (mcu_w, mcu_h) = (8 * h, 8 * v);
                let mcus_per_row = width.div_ceil(mcu_w);
                let mcu_rows = height.div_ceil(mcu_h);
                let (cell_w, cell_h, cols) = if interval % mcus_per_row == 0 {
                    let k = interval / mcus_per_row;
                    (mcus_per_row * mcu_w, k * mcu_h, 1)
                } else if mcus_per_row % interval == 0 {
                    (interval * mcu_w, mcu_h, mcus_per_row / interval)
                } else {
                    return None;
                };
                let scan_start = at + 2 + len;
                // The frame header's height and width lie before the scan (a malformed
                // header could make them overlap it).
                if height_at + 4 > scan_start {
                    return None;
                }
                return Some(Layout {
                    height_at,
                    width,
                    height,
                    scan_start,
                    cell_w,
                    cell_h,
                    cols,
                    rows: (mcu_rows * mcu_h).div_ceil(cell_h),
                });
            }
            0xD8 | 0xD9 | 0xD0..=0xD7 | 0x01 => return None,
            _ => {}
        }
        at += 2 + len;
    }
}

/// The end of the interval whose data starts at `from`: the offset of the restart marker
/// after it (`true`) or of the image's EOI (`false`); `None` when the data ends first or
/// another marker comes.
fn interval_end(data: &[u8], from: usize) -> Option<(usize, bool)> {
    let mut at = from;
    loop {
        at += memchr::memchr(0xFF, data.get(at..)?)?;
        match *data.get(at + 1)? {
            0x00 => at += 2,
            0xFF => at += 1,
            0xD0..=0xD7 => return Some((at, true)),
            0xD9 => return Some((at, false)),
            _ => return None,
        }
    }
}

/// A JPEG of the intervals that cover the pixels `x0..x1` × `y0..y1` of `data`, written into
/// `out`: its headers with the width and height of those intervals, then their entropy data
/// in order, markers renumbered from RST0. Returns where the sub image starts in the image
/// (pixels); `None` when the window needs the whole image, or the data does not have the
/// markers its layout promises.
pub fn sub_image(
    data: &[u8],
    layout: &Layout,
    (x0, y0, x1, y1): (u32, u32, u32, u32),
    out: &mut Vec<u8>,
) -> Option<(u32, u32)> {
    let l = layout;
    if x0 >= l.width || y0 >= l.height {
        return None;
    }
    let (c0, c1) = (x0 / l.cell_w, x1.div_ceil(l.cell_w).min(l.cols));
    let (r0, r1) = (y0 / l.cell_h, y1.div_ceil(l.cell_h).min(l.rows));
    if c0 >= c1 || r0 >= r1 || (c0, r0, c1, r1) == (0, 0, l.cols, l.rows) {
        return None;
    }
    let (left, top) = (c0 * l.cell_w, r0 * l.cell_h);
    let width = (c1 * l.cell_w).min(l.width) - left;
    let height = (r1 * l.cell_h).min(l.height) - top;
    out.clear();
    out.extend_from_slice(data.get(..l.scan_start)?);
    out[l.height_at..l.height_at + 2].copy_from_slice(&(height as u16).to_be_bytes());
    out[l.height_at + 2..l.height_at + 4].copy_from_slice(&(width as u16).to_be_bytes());
    let last = (r1 - 1) * l.cols + c1 - 1;
    let (mut at, mut written) = (l.scan_start, 0u32);
    for index in 0..=last {
        let (end, marker) = interval_end(data, at)?;
        let (row, col) = (index / l.cols, index % l.cols);
        if row >= r0 && (c0..c1).contains(&col) {
            if written > 0 {
                // The decoder expects RST0, RST1, … from the scan's start.
                out.extend_from_slice(&[0xFF, 0xD0 + (written - 1) as u8 % 8]);
            }
            out.extend_from_slice(data.get(at..end)?);
            written += 1;
        }
        if index < last {
            if !marker {
                return None; // the image ended before the window's last interval
            }
            at = end + 2;
        }
    }
    out.extend_from_slice(&[0xFF, 0xD9]);
    Some((left, top))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_plain_jpegs_have_no_seek_index() {
        assert_eq!(layout(b""), None);
        assert_eq!(layout(&[0xFF, 0xD8, 0xFF]), None);
        assert_eq!(layout(&[0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x01]), None);
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new(&mut jpeg)
            .encode_image(&image::RgbImage::new(64, 48))
            .unwrap();
        assert_eq!(layout(&jpeg), None, "no DRI segment, no index");
    }

    #[test]
    fn a_frame_header_overlapping_the_scan_is_handled_without_panic() {
        // SOI, DRI (interval 1), an SOF0 of length 3 whose height, width and components are
        // the SOS segment after it.
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xDD, 0x00, 0x04, 0x00, 0x01];
        jpeg.extend_from_slice(&[0xFF, 0xC0, 0x00, 0x03, 0x08]);
        jpeg.extend_from_slice(&[0xFF, 0xDA, 0x00, 0x02, 0x01, 0x00, 0x11, 0xFF, 0xD9]);
        if let Some(l) = layout(&jpeg) {
            let mut out = Vec::new();
            let _ = sub_image(&jpeg, &l, (0, 0, 1, 1), &mut out);
        }
    }

    #[test]
    fn truncated_headers_never_read_past_the_end() {
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new(&mut jpeg)
            .encode_image(&image::RgbImage::new(64, 48))
            .unwrap();
        for n in 0..jpeg.len() {
            let _ = layout(&jpeg[..n]);
        }
    }
}
