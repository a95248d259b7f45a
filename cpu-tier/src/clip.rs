//! Clips: a field of concatenated JPEG frames (MJPEG, as WebDataset shards hold video: each
//! frame a whole JPEG, SOI to EOI). [`frames`] finds each frame's byte range without decoding
//! anything: it walks the marker segments by their lengths and, inside a scan's entropy-coded
//! data, passes over the byte pairs that only look like markers there (`FF 00` stuffing,
//! restart markers `FF D0`–`FF D7`, fill bytes `FF FF`), so a frame ends at its own EOI and
//! nowhere else. The engine then decodes only the frames a clip's window takes.

use std::ops::Range;

use crate::error::DecodeError;

/// The byte range of each frame of `data`, in order: at most `max_frames` (more is an error,
/// as is a stream that does not start with SOI, ends inside a frame, or has a segment that
/// runs past its end; zero bytes after the last frame are padding).
pub fn frames(data: &[u8], max_frames: u32) -> Result<Vec<Range<usize>>, DecodeError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        if data[at..].iter().all(|&b| b == 0) {
            break;
        }
        if out.len() as u64 >= u64::from(max_frames) {
            return Err(broken(
                out.len(),
                at,
                format!("the clip has more than {max_frames} frames (decode.max_clip_frames)"),
            ));
        }
        let end = frame_end(data, at).map_err(|why| broken(out.len(), at, why))?;
        out.push(at..end);
        at = end;
    }
    if out.is_empty() {
        return Err(DecodeError::Clip("the clip field holds no frame".into()));
    }
    Ok(out)
}

fn broken(frame: usize, at: usize, why: String) -> DecodeError {
    DecodeError::Clip(format!("frame {frame} (byte {at}): {why}"))
}

/// The end (one past EOI) of the frame that starts at `start`.
fn frame_end(data: &[u8], start: usize) -> Result<usize, String> {
    if data.get(start..start + 2) != Some(&[0xFF, 0xD8]) {
        return Err("no start-of-image marker (FF D8)".into());
    }
    let mut i = start + 2;
    loop {
        // A marker: FF, any fill FFs, then its code.
        if data.get(i) != Some(&0xFF) {
            return Err(match data.get(i) {
                None => "the stream ends inside the frame".into(),
                Some(b) => format!("byte {i} is {b:#04x} where a marker should start"),
            });
        }
        while data.get(i + 1) == Some(&0xFF) {
            i += 1;
        }
        let Some(&code) = data.get(i + 1) else {
            return Err("the stream ends inside a marker".into());
        };
        match code {
            0xD9 => return Ok(i + 2),
            0xD8 => {
                return Err(format!(
                    "a start-of-image marker inside the frame (byte {i})"
                ))
            }
            // Markers with no segment.
            0x01 | 0xD0..=0xD7 => i += 2,
            _ => {
                let len = match data.get(i + 2..i + 4) {
                    Some(b) => usize::from(u16::from_be_bytes([b[0], b[1]])),
                    None => return Err("the stream ends inside a segment's length".into()),
                };
                if len < 2 || i + 2 + len > data.len() {
                    return Err(format!(
                        "segment FF {code:02X} at byte {i} runs past the stream ({len} bytes)"
                    ));
                }
                i += 2 + len;
                if code == 0xDA {
                    i = entropy_end(data, i)?;
                }
            }
        }
    }
}

/// Where the entropy-coded data that starts at `i` ends: the next byte pair that is a real
/// marker (not stuffing, a restart marker or fill).
fn entropy_end(data: &[u8], mut i: usize) -> Result<usize, String> {
    loop {
        // memchr's SIMD search: the scan runs over every frame of the clip, so it must cost
        // little beside decoding the few frames a window takes.
        let Some(ff) = memchr::memchr(0xFF, &data[i..]) else {
            return Err("the stream ends inside a scan's entropy-coded data".into());
        };
        i += ff;
        match data.get(i + 1) {
            None => return Err("the stream ends inside a scan's entropy-coded data".into()),
            Some(0x00) | Some(0xD0..=0xD7) => i += 2,
            Some(0xFF) => i += 1,
            Some(_) => return Ok(i),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny JPEG-shaped frame: SOI, an APP0 segment, SOS with entropy bytes, EOI.
    fn frame(entropy: &[u8]) -> Vec<u8> {
        let mut f = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0xAA, 0xBB];
        f.extend([0xFF, 0xDA, 0x00, 0x03, 0x01]);
        f.extend(entropy);
        f.extend([0xFF, 0xD9]);
        f
    }

    #[test]
    fn frames_end_at_their_own_end_of_image_whatever_the_entropy_data_holds() {
        // Stuffed FF 00, a restart marker, fill bytes and an FF D9 inside an APP segment.
        let a = frame(&[0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD3, 0x56, 0xFF, 0xFF, 0x00]);
        let mut b = vec![0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x06, 0xFF, 0xD9, 0xFF, 0xD8];
        b.extend(&frame(&[0x01])[2..]);
        let c = frame(&[]);
        let data = [a.clone(), b.clone(), c.clone(), vec![0, 0, 0]].concat();
        let got = frames(&data, 10).unwrap();
        let (ea, eb) = (a.len(), a.len() + b.len());
        assert_eq!(got, vec![0..ea, ea..eb, eb..eb + c.len()]);
    }

    #[test]
    fn a_broken_stream_is_named_by_frame_and_byte() {
        let a = frame(&[1, 2, 3]);
        let err = |data: &[u8]| frames(data, 10).unwrap_err().to_string();
        assert!(err(&[]).contains("no frame"));
        assert!(err(&[a.clone(), vec![0x00, 0xD8]].concat()).contains("frame 1"));
        let cut = [a.clone(), a[..a.len() - 3].to_vec()].concat();
        assert!(err(&cut).contains("frame 1 (byte 18)"), "{}", err(&cut));
        assert!(err(&cut).contains("ends inside"));
        let mut nested = a.clone();
        nested.splice(8..8, [0xFF, 0xD8]);
        assert!(err(&nested).contains("start-of-image marker inside"));
        let mut long = a.clone();
        long[5] = 0x7F;
        assert!(err(&long).contains("runs past"));
        let many = a.repeat(11);
        assert!(err(&many).contains("more than 10 frames"));
    }
}
