//! The vendored libjpeg-turbo's patch (`vendor/README.md`): its fast Huffman path also runs in
//! scans with restart markers. Held against upstream's behaviour in the same process
//! (`restart_fast_path(false)` runs the thread's decoder as upstream has it): the same DCT
//! coefficients, the same pixels and the same errors, on every JPEG with markers as `sluice
//! shard` writes them and on hostile variants of them (flipped bytes, stray bytes or fill
//! before a marker, wrong, missing or extra markers, truncation).

mod common;

use sluice_cpu::jpeg::{
    coefficients, restart_fast_path, with_restart_markers, DecodeLimits, JpegDecoder, Rect,
};

/// The corpus when present (every JPEG), else generated ones of awkward sizes: one MCU an
/// interval, several, and a marker every row.
fn marked_inputs() -> Vec<(String, Vec<u8>)> {
    let originals: Vec<(String, Vec<u8>)> = match common::corpus() {
        Some(files) => files
            .iter()
            .map(|p| (p.display().to_string(), std::fs::read(p).unwrap()))
            .collect(),
        None => {
            eprintln!("../shared/data/imagenet-sample is absent: testing generated JPEGs");
            [
                (500, 375),
                (333, 500),
                (97, 203),
                (640, 17),
                (1024, 40),
                (16, 16),
            ]
            .into_iter()
            .enumerate()
            .map(|(i, (w, h))| (format!("generated {w}x{h}"), common::jpeg(w, h, i as u32)))
            .collect()
        }
    };
    originals
        .into_iter()
        .filter_map(|(name, data)| {
            let marked = with_restart_markers(&data, DecodeLimits::default()).unwrap()?;
            Some((name, marked))
        })
        .collect()
}

/// What a thread's decoder makes of `data`, upstream's (`fast` false) or patched.
struct Decode {
    /// Its coefficients (a digest), read through damage, and the warning if any.
    coefficients: Result<(usize, u64, Option<String>), String>,
    /// The engine's full-size decode (which stops at a warning) and its pixels' digest.
    pixels: Result<(String, u64), String>,
}

fn decode(data: &[u8], fast: bool, dec: &mut JpegDecoder) -> Decode {
    restart_fast_path(fast);
    let coefficients = coefficients(data)
        .map(|(c, warning)| (c.len(), hash(&c), warning))
        .map_err(|e| e.to_string());
    let mut pixels = Vec::new();
    let decoded = dec.header(data).and_then(|h| {
        let all = Rect {
            x: 0,
            y: 0,
            w: h.width,
            h: h.height,
        };
        dec.decode_region(data, &h, all, 8, &mut pixels)
    });
    restart_fast_path(true);
    let pixels = decoded
        .map(|d| (format!("{d:?}"), xxhash_rust::xxh3::xxh3_64(&pixels)))
        .map_err(|e| e.to_string());
    Decode {
        coefficients,
        pixels,
    }
}

/// Upstream warns of bytes between an interval's last code and its marker ("N extraneous
/// bytes before marker") only when it next finds a marker by scanning rather than through
/// its bit reader, which depends on how far that reader had read ahead. The patched decoder
/// reads ahead further, so it may name a later or earlier marker, or warn where upstream
/// happens not to, or not where upstream happens to: of damage that is there either way,
/// with the same coefficients. (Upstream is no steadier: the same stray bytes before
/// another marker can be warned of or not.)
fn extraneous(warning: &str) -> bool {
    warning.contains("extraneous bytes before marker")
}

fn hash(c: &[i16]) -> u64 {
    let bytes: Vec<u8> = c.iter().flat_map(|v| v.to_le_bytes()).collect();
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// The entropy-coded bytes of the (single) scan: after the SOS header, up to the EOI.
fn scan(data: &[u8]) -> std::ops::Range<usize> {
    // Marker segments from the SOI on, each FF, its code and a length, up to the SOS.
    let mut i = 2;
    while data[i + 1] != 0xDA {
        assert_eq!(data[i], 0xFF, "a marker segment at {i}");
        i += 2 + usize::from(u16::from_be_bytes([data[i + 2], data[i + 3]]));
    }
    let start = i + 2 + usize::from(u16::from_be_bytes([data[i + 2], data[i + 3]]));
    let end = data.len() - 2;
    assert_eq!(&data[end..], &[0xFF, 0xD9], "EOI last");
    start..end
}

/// Where the RST markers of the scan are.
fn markers(data: &[u8]) -> Vec<usize> {
    let s = scan(data);
    (s.start..s.end - 1)
        .filter(|&i| data[i] == 0xFF && (0xD0..=0xD7).contains(&data[i + 1]))
        .collect()
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// A hostile variant of a marked JPEG, the `kind`th of the kinds below.
fn mutate(data: &[u8], kind: usize, rng: &mut Rng) -> (String, Vec<u8>) {
    let s = scan(data);
    let rst = markers(data);
    let mut v = data.to_vec();
    let at = s.start + rng.below(s.len());
    let marker = rst.get(rng.below(rst.len())).copied().unwrap_or(at);
    let what = match kind % 9 {
        0 => {
            v[at] ^= 1 << rng.below(8);
            format!("bit flipped at {at}")
        }
        1 => {
            v[at] = rng.below(256) as u8;
            format!("byte replaced at {at}")
        }
        2 => {
            let n = 1 + rng.below(3);
            let stray: Vec<u8> = (0..n).map(|_| 1 + rng.below(0xFE) as u8).collect();
            v.splice(marker..marker, stray);
            format!("{n} stray bytes before the marker at {marker}")
        }
        3 => {
            v.splice(marker..marker, [0xFF, 0xFF]);
            format!("fill bytes before the marker at {marker}")
        }
        4 => {
            if v[marker] == 0xFF {
                v[marker + 1] = 0xD0 + (v[marker + 1] - 0xD0 + 1 + rng.below(6) as u8) % 8;
            }
            format!("wrong marker number at {marker}")
        }
        5 => {
            if v[marker] == 0xFF {
                v.drain(marker..marker + 2);
            }
            format!("marker at {marker} removed")
        }
        6 => {
            v.splice(at..at, [0xFF, 0xD0 + rng.below(8) as u8]);
            format!("marker inserted at {at}")
        }
        7 => {
            let n = 1 + rng.below(40).min(s.end - at - 1);
            v.drain(at..at + n);
            format!("{n} bytes removed at {at}")
        }
        _ => {
            v.truncate(at);
            v.extend_from_slice(&[0xFF, 0xD9]);
            format!("scan cut at {at}")
        }
    };
    (what, v)
}

#[test]
fn the_fast_path_gives_upstreams_coefficients_and_pixels_on_marked_jpegs() {
    let mut dec = JpegDecoder::new(DecodeLimits::default()).unwrap();
    let inputs = marked_inputs();
    let mut counts = std::collections::BTreeSet::new();
    for (i, (name, data)) in inputs.iter().enumerate() {
        let rst = markers(data).len();
        counts.insert(rst);
        assert!(rst > 0, "{name}: no restart markers");
        let fast = decode(data, true, &mut dec);
        let upstream = decode(data, false, &mut dec);
        let (_, _, warning) = fast.coefficients.as_ref().unwrap();
        assert_eq!(warning, &None, "{name}");
        assert_eq!(
            fast.coefficients, upstream.coefficients,
            "{name}: coefficients"
        );
        // Every JPEG's coefficients; every fourth one's pixels as well (the slow part).
        if i % 4 == 0 {
            assert_eq!(fast.pixels, upstream.pixels, "{name}: pixels");
        }
    }
    eprintln!(
        "{} marked JPEGs, {} distinct marker counts",
        inputs.len(),
        counts.len()
    );
}

#[test]
fn the_fast_path_gives_upstreams_results_on_hostile_marked_jpegs() {
    let mut dec = JpegDecoder::new(DecodeLimits::default()).unwrap();
    let inputs = marked_inputs();
    let step = (inputs.len() / 60).max(1);
    let mut rng = Rng(0x05ee_d1e5_50dd_ba11);
    let (mut cases, mut refused, mut apart, mut decided_apart) = (0, 0, 0, 0);
    for (name, data) in inputs.iter().step_by(step) {
        for kind in 0..45 {
            let (what, bad) = mutate(data, kind, &mut rng);
            let fast = decode(&bad, true, &mut dec);
            let upstream = decode(&bad, false, &mut dec);
            cases += 1;
            refused += usize::from(fast.pixels.is_err());
            match (&fast.coefficients, &upstream.coefficients) {
                (Ok((n, h, w)), Ok((un, uh, uw))) => {
                    // The same coefficients, always.
                    assert_eq!((n, h), (un, uh), "{name}, {what}: coefficients");
                    if w == uw {
                        assert_eq!(fast.pixels, upstream.pixels, "{name}, {what}: pixels");
                        continue;
                    }
                    // Only the extraneous-bytes warning may differ ([`extraneous`]).
                    let either = [w, uw].map(|w| w.as_deref().is_none_or(extraneous));
                    assert_eq!(either, [true, true], "{name}, {what}: {w:?} / {uw:?}");
                    if let (Ok(f), Ok(u)) = (&fast.pixels, &upstream.pixels) {
                        assert_eq!(f, u, "{name}, {what}: pixels");
                    }
                    apart += 1;
                    decided_apart += usize::from(fast.pixels.is_ok() != upstream.pixels.is_ok());
                }
                (f, u) => assert_eq!(f, u, "{name}, {what}: coefficients"),
            }
        }
    }
    eprintln!(
        "{cases} hostile variants: {refused} refused by the engine's decoder, {apart} \
         with the extraneous-bytes warning at another marker or from one decoder only, \
         {decided_apart} of them refused by one decoder only"
    );
    // The variants must reach the decoder's error paths, not only its happy one.
    assert!(
        refused > cases / 10 && refused < cases,
        "{refused} of {cases} refused"
    );
}
