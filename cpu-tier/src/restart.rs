//! Restart markers as a seek index into a JPEG's entropy-coded data.
//!
//! Without restart markers, reaching a row of a JPEG means Huffman-decoding every row above
//! it: libjpeg-turbo's `jpeg_skip_scanlines` skips the inverse DCT and colour conversion of
//! those rows, not their entropy decoding, which is two thirds of the engine's time. A JPEG
//! with a restart marker at every MCU row can be entered at any row: the DC predictors reset
//! at each marker, so the data after one is a complete scan for the rows below it.
//! [`sub_image`] writes that as a JPEG of its own (the same headers, a smaller height, the
//! entropy data from one interval on, markers renumbered from RST0), which libjpeg-turbo then
//! decodes as usual.
//!
//! `sluice shard --restart-markers` adds the markers losslessly at shard time (libjpeg-turbo's
//! transform, the same coefficients: the pixels do not change). Files without them, or that
//! are progressive, arithmetic-coded or non-interleaved, are decoded as before.
//!
//! Everything here reads untrusted bytes: every offset is checked, and anything unexpected
//! means "no seek index" (the caller decodes the whole file and reports its errors).

/// Where a baseline JPEG's rows are, as far as restart markers tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Offset of the frame header's 16-bit height.
    height_at: usize,
    pub height: u32,
    /// Offset of the first entropy-coded byte (after the scan header).
    scan_start: usize,
    /// Pixel rows between two restart markers (whole MCU rows).
    pub interval_rows: u32,
}

fn be16(data: &[u8], at: usize) -> Option<u32> {
    let b = data.get(at..at + 2)?;
    Some(u32::from(b[0]) << 8 | u32::from(b[1]))
}

/// The layout of `data` when it is a single-scan Huffman JPEG whose restart interval is a
/// whole number of MCU rows; `None` otherwise.
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
                let mcus_per_row = width.div_ceil(8 * h);
                if interval % mcus_per_row != 0 {
                    return None;
                }
                return Some(Layout {
                    height_at,
                    height,
                    scan_start: at + 2 + len,
                    interval_rows: interval / mcus_per_row * 8 * v,
                });
            }
            0xD8 | 0xD9 | 0xD0..=0xD7 | 0x01 => return None,
            _ => {}
        }
        at += 2 + len;
    }
}

/// The offset just after the `k`-th restart marker (k ≥ 1) of the scan at `from`, or `None`
/// when the data ends or another marker comes first.
fn after_marker(data: &[u8], from: usize, k: u32) -> Option<usize> {
    let mut seen = 0;
    let mut at = from;
    loop {
        at += memchr::memchr(0xFF, data.get(at..)?)?;
        match *data.get(at + 1)? {
            0x00 => at += 2,
            0xFF => at += 1,
            0xD0..=0xD7 => {
                seen += 1;
                at += 2;
                if seen == k {
                    return Some(at);
                }
            }
            _ => return None,
        }
    }
}

/// A JPEG of the rows from `first_row` down (which must be a multiple of the layout's
/// interval) written into `out`: the headers of `data` with the height lowered, then the
/// entropy data from that interval on with its restart markers renumbered from RST0. `None`
/// when the data does not have the markers its layout promises.
pub fn sub_image(data: &[u8], layout: &Layout, first_row: u32, out: &mut Vec<u8>) -> Option<()> {
    if first_row == 0 || first_row % layout.interval_rows != 0 || first_row >= layout.height {
        return None;
    }
    let k = first_row / layout.interval_rows;
    let start = after_marker(data, layout.scan_start, k)?;
    out.clear();
    out.extend_from_slice(data.get(..layout.scan_start)?);
    let height = (layout.height - first_row) as u16;
    out[layout.height_at..layout.height_at + 2].copy_from_slice(&height.to_be_bytes());
    let body = out.len();
    out.extend_from_slice(data.get(start..)?);
    // The decoder expects RST0, RST1, … from the scan's start: shift every number by k.
    let shift = (k % 8) as u8;
    if shift != 0 {
        let mut at = body;
        while let Some(i) = memchr::memchr(0xFF, &out[at..]) {
            at += i;
            match out.get(at + 1).copied() {
                Some(m @ 0xD0..=0xD7) => {
                    out[at + 1] = 0xD0 + (m - 0xD0 + 8 - shift) % 8;
                    at += 2;
                }
                Some(0xFF) => at += 1,
                Some(_) => at += 2,
                None => break,
            }
        }
    }
    Some(())
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
