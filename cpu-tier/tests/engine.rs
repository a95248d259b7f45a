//! The engine on real and generated JPEGs: every corpus image decodes, outputs are
//! deterministic across thread counts, bad input becomes a reported skip (or a unit failure
//! under policy "fail"), and nothing panics.

mod common;

use common::{jpeg, sample};
use sluice_cpu::{
    BadSamplePolicy, DecodeError, Engine, EngineConfig, EngineError, Outcome, PipelineSpec,
    SampleContext,
};

fn engine(spec: &str, threads: usize) -> Engine {
    Engine::new(
        spec.parse::<PipelineSpec>().unwrap(),
        EngineConfig {
            threads,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

const RRC: &str = "decode | random_resized_crop 224 | hflip 0.5";
const CTX: SampleContext = SampleContext {
    seed: 7,
    epoch: 3,
    shard: 1,
};

fn tensors(outcomes: &[Outcome]) -> Vec<Vec<u8>> {
    outcomes
        .iter()
        .map(|o| match o {
            Outcome::Done(p) => p.tensor.data.clone(),
            Outcome::Skipped(e) => panic!("unexpected skip: {e}"),
        })
        .collect()
}

#[test]
fn every_corpus_image_decodes_and_augments() {
    let Some(files) = common::corpus() else {
        eprintln!("skipping: ../shared/data/imagenet-sample is absent");
        return;
    };
    let samples: Vec<_> = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            sample(
                i as u64,
                vec![
                    ("jpg", std::fs::read(f).unwrap()),
                    ("cls", i.to_string().into_bytes()),
                ],
            )
        })
        .collect();
    let e = engine("decode | random_resized_crop 224 | hflip 0.5 | normalize mean=0.485,0.456,0.406 std=0.229,0.224,0.225 dtype=f16 | chw", 2);
    let out = e.process_all(&samples, &CTX);
    assert_eq!(out.len(), 804);
    for (i, o) in out.iter().enumerate() {
        match o {
            Outcome::Done(p) => {
                assert_eq!(
                    (p.tensor.height, p.tensor.width, p.tensor.data.len()),
                    (224, 224, 224 * 224 * 3 * 2)
                );
                assert_eq!(p.label, Some(i as i64));
            }
            Outcome::Skipped(e) => panic!("{}: {e}", files[i].display()),
        }
    }
}

#[test]
fn outputs_are_identical_across_thread_counts_and_runs() {
    let samples: Vec<_> = match common::corpus() {
        Some(files) => files
            .iter()
            .step_by(8)
            .enumerate()
            .map(|(i, f)| sample(i as u64, vec![("jpg", std::fs::read(f).unwrap())]))
            .collect(),
        None => (0..40)
            .map(|i| {
                sample(
                    i,
                    vec![(
                        "jpg",
                        jpeg(300 + i as u32 * 7, 200 + i as u32 * 3, i as u32),
                    )],
                )
            })
            .collect(),
    };
    let one = tensors(&engine(RRC, 1).process_all(&samples, &CTX));
    let two = tensors(&engine(RRC, 2).process_all(&samples, &CTX));
    assert_eq!(one, two);
    // One sample processed alone gives the same bytes as in a batch.
    let alone = tensors(&engine(RRC, 2).process_all(&samples[5..6], &CTX));
    assert_eq!(alone[0], one[5]);
    // Another epoch draws other crops.
    let next = tensors(&engine(RRC, 2).process_all(&samples, &SampleContext { epoch: 4, ..CTX }));
    assert_ne!(one, next);
}

#[test]
fn recycled_output_buffers_give_the_same_bytes_as_fresh_ones() {
    // Small images under a larger center crop are padded (black outside the image); the
    // normalized pipeline converts through a second buffer. Dirty buffers of every size the
    // engine takes must not leak into either.
    let samples: Vec<_> = (0..12)
        .map(|i| sample(i, vec![("jpg", jpeg(150 + i as u32 * 5, 120, i as u32))]))
        .collect();
    for spec in [
        RRC,
        "decode | center_crop 224",
        "decode | center_crop 224 | normalize mean=0.5,0.5,0.5 std=0.25,0.25,0.25 dtype=f32 | chw",
        "decode | resize 64 | center_crop 64 | chw",
    ] {
        let fresh = tensors(&engine(spec, 1).process_all(&samples, &CTX));
        let e = engine(spec, 1);
        for len in [224 * 224 * 3, 224 * 224 * 3 * 4, 64 * 64 * 3] {
            for _ in 0..samples.len() {
                e.recycle(vec![0xA5; len]);
            }
        }
        let reused = tensors(&e.process_all(&samples, &CTX));
        assert_eq!(fresh, reused, "{spec}");
    }
}

fn skip_reason(e: &Engine, s: &sluice_shard::Sample) -> DecodeError {
    match e.process(s, &CTX) {
        Outcome::Skipped(err) => {
            assert_eq!(err.key, s.key);
            assert_eq!(err.shard, "test.tar");
            err.reason
        }
        Outcome::Done(_) => panic!("sample {} should be skipped", s.key),
    }
}

/// A baseline JPEG header claiming `w`×`h`, with no image data after it.
fn lying_header(w: u16, h: u16) -> Vec<u8> {
    let mut j = jpeg(16, 16, 1);
    // Patch the SOF0 frame size (FF C0, len, precision, height, width).
    let sof = j.windows(2).position(|x| x == [0xFF, 0xC0]).unwrap();
    j[sof + 5..sof + 7].copy_from_slice(&h.to_be_bytes());
    j[sof + 7..sof + 9].copy_from_slice(&w.to_be_bytes());
    j
}

/// `jpeg` without its frame header: its segments up to the first scan but SOF0, then either
/// the scan (`keep_scan`) or EOI at once (a tables-only stream).
fn without_sof(jpeg: &[u8], keep_scan: bool) -> Vec<u8> {
    let mut out = jpeg[..2].to_vec();
    let mut i = 2;
    loop {
        let code = jpeg[i + 1];
        if code == 0xDA {
            match keep_scan {
                true => out.extend_from_slice(&jpeg[i..]),
                false => out.extend_from_slice(&[0xFF, 0xD9]),
            }
            return out;
        }
        let len = usize::from(u16::from_be_bytes([jpeg[i + 2], jpeg[i + 3]]));
        if code != 0xC0 {
            out.extend_from_slice(&jpeg[i..i + 2 + len]);
        }
        i += 2 + len;
    }
}

/// Header state never leaks from one sample to the next: after a huge image, a stream with
/// no frame header is skipped for that (not with the huge image's size), and a normal image
/// after both decodes by its own header. One thread, so one decoder sees all three.
#[test]
fn each_image_is_judged_by_its_own_header() {
    let e = engine("decode | resize 40 | center_crop 32", 1);
    let normal = jpeg(120, 90, 5);
    for keep_scan in [false, true] {
        let huge = sample(1, vec![("jpg", lying_header(30000, 30000))]);
        assert!(matches!(
            skip_reason(&e, &huge),
            DecodeError::TooLarge { width: 30000, .. }
        ));
        let no_sof = sample(2, vec![("jpg", without_sof(&normal, keep_scan))]);
        let why = skip_reason(&e, &no_sof).to_string();
        assert!(
            !why.contains("30000") && !why.contains("-1x-1"),
            "a frame without SOF was judged by another header: {why}"
        );
        if !keep_scan {
            assert!(why.contains("SOF"), "{why}");
        }
        match e.process(&sample(3, vec![("jpg", normal.clone())]), &CTX) {
            Outcome::Done(p) => assert_eq!(p.geometry.source, (90, 120)),
            Outcome::Skipped(err) => panic!("the normal image after them was skipped: {err:?}"),
        }
    }
    // A clip: the same three as frames of three clips, through a clip pipeline.
    let e = engine("decode | clip 1 | resize 40 | center_crop 32", 1);
    let clip = |frame: Vec<u8>| sample(4, vec![("mjpeg", frame)]);
    let why = skip_reason(&e, &clip(lying_header(30000, 30000))).to_string();
    assert!(why.contains("30000"), "{why}");
    let why = skip_reason(&e, &clip(without_sof(&normal, false))).to_string();
    assert!(why.contains("SOF") && !why.contains("30000"), "{why}");
    assert!(matches!(e.process(&clip(normal), &CTX), Outcome::Done(_)));
}

#[test]
fn bad_images_are_skipped_with_a_reason() {
    let e = engine(RRC, 1);
    let good = jpeg(320, 240, 3);
    let truncated = good[..good.len() / 2].to_vec();
    let mut corrupt = good.clone();
    for b in corrupt[good.len() / 3..good.len() / 3 + 200].iter_mut() {
        *b = 0xFF;
    }
    assert_eq!(
        skip_reason(&e, &sample(1, vec![("jpg", truncated)])),
        DecodeError::Truncated
    );
    assert!(matches!(
        skip_reason(&e, &sample(2, vec![("jpg", lying_header(60000, 60000))])),
        DecodeError::TooLarge {
            width: 60000,
            height: 60000,
            ..
        }
    ));
    assert!(matches!(
        skip_reason(&e, &sample(2, vec![("jpg", lying_header(65535, 65535))])),
        DecodeError::Corrupt(_)
    ));
    assert!(matches!(
        skip_reason(&e, &sample(3, vec![("jpg", b"GIF89a not a jpeg".to_vec())])),
        DecodeError::Unsupported(_)
    ));
    assert!(matches!(
        skip_reason(&e, &sample(4, vec![("txt", b"hello".to_vec())])),
        DecodeError::NoImage { .. }
    ));
    assert!(matches!(
        skip_reason(
            &e,
            &sample(5, vec![("jpg", good.clone()), ("cls", b"seven".to_vec())])
        ),
        DecodeError::Label(_)
    ));
    assert!(matches!(
        skip_reason(&e, &sample(6, vec![("jpg", vec![0xFF, 0xD8, 0xFF])])),
        DecodeError::Corrupt(_)
    ));
    // Corrupt entropy data is either refused or decoded; it never panics or hangs.
    let _ = e.process(&sample(7, vec![("jpg", corrupt)]), &CTX);
    // And the decoder is still healthy afterwards.
    assert!(matches!(
        e.process(&sample(8, vec![("jpg", good)]), &CTX),
        Outcome::Done(_)
    ));
}

#[test]
fn grayscale_png_and_exif_rotated_images_become_rgb_of_the_right_shape() {
    let e = engine("decode | resize 20x30", 1);
    // Grayscale JPEG: three equal channels.
    let gray = image::GrayImage::from_fn(64, 48, |x, y| image::Luma([((x * 4 + y) % 256) as u8]));
    let mut gj = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut gj, 95)
        .encode_image(&gray)
        .unwrap();
    let Outcome::Done(p) = e.process(&sample(1, vec![("jpg", gj)]), &CTX) else {
        panic!("gray")
    };
    assert!(p
        .tensor
        .data
        .chunks(3)
        .all(|px| px[0] == px[1] && px[1] == px[2]));
    // PNG through the image crate.
    let mut png = Vec::new();
    image::RgbImage::from_pixel(40, 30, image::Rgb([10, 200, 30]))
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    let Outcome::Done(p) = e.process(&sample(2, vec![("png", png)]), &CTX) else {
        panic!("png")
    };
    assert_eq!((p.tensor.width, p.tensor.height), (30, 20));
    assert!(p.tensor.data.chunks(3).all(|px| px == [10, 200, 30]));

    // EXIF orientation 6 (rotate 90° clockwise): a 64x32 stored image, left half black,
    // right half white, displays 32 wide and 64 tall with black on top.
    let img = image::RgbImage::from_fn(64, 32, |x, _| {
        if x < 32 {
            image::Rgb([0, 0, 0])
        } else {
            image::Rgb([255, 255, 255])
        }
    });
    let mut j = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut j, 95)
        .encode_image(&img)
        .unwrap();
    let tiff: &[u8] = &[
        b'M', b'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0,
        0, 0,
    ];
    let mut app1 = vec![0xFF, 0xE1];
    app1.extend(((2 + 6 + tiff.len()) as u16).to_be_bytes());
    app1.extend(b"Exif\0\0");
    app1.extend(tiff);
    j.splice(2..2, app1);
    let e = engine("decode | resize 64x32", 1);
    let Outcome::Done(p) = e.process(&sample(3, vec![("jpg", j)]), &CTX) else {
        panic!("exif")
    };
    let px = |x: usize, y: usize| p.tensor.data[(y * 32 + x) * 3];
    assert!(
        px(16, 5) < 30 && px(16, 58) > 225,
        "top {} bottom {}",
        px(16, 5),
        px(16, 58)
    );
}

#[test]
fn policy_fail_fails_the_unit_and_skip_reports() {
    let samples: Vec<_> = (0..20)
        .map(|i| {
            let data = if i == 11 {
                b"\xFF\xD8\xFFbroken".to_vec()
            } else {
                jpeg(200, 150, i as u32)
            };
            sample(i, vec![("jpg", data)])
        })
        .collect::<Vec<_>>();
    let skip = engine(RRC, 2);
    let mut skipped = Vec::new();
    let stats = skip
        .run_unit(samples.clone().into_iter().map(Ok), CTX, |o| {
            if let Outcome::Skipped(e) = o {
                skipped.push(e.index)
            }
            true
        })
        .unwrap();
    assert_eq!((stats.done, stats.skipped, skipped), (19, 1, vec![11]));

    let fail = Engine::new(
        RRC.parse().unwrap(),
        EngineConfig {
            threads: 2,
            policy: BadSamplePolicy::Fail,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let err = fail
        .run_unit(samples.into_iter().map(Ok), CTX, |_| true)
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::BadSample(e) if e.index == 11),
        "{err}"
    );
    assert!(err.to_string().contains("s0011"), "{err}");
}

#[test]
fn a_broken_stream_fails_the_unit_after_delivering_what_came_before() {
    let mut items: Vec<Result<sluice_shard::Sample, sluice_shard::ShardError>> = (0..5)
        .map(|i| Ok(sample(i, vec![("jpg", jpeg(100, 100, i as u32))])))
        .collect();
    items.push(Err(sluice_shard::ShardError::Truncated {
        shard: "test.tar".into(),
        offset: 9000,
        what: "data".into(),
        needed: 10,
    }));
    let mut delivered = 0;
    let err = engine(RRC, 2)
        .run_unit(items.into_iter(), CTX, |_| {
            delivered += 1;
            true
        })
        .unwrap_err();
    assert_eq!(delivered, 5);
    assert!(err.to_string().contains("byte 9000"), "{err}");
}

#[test]
fn a_unit_feeds_the_pool_only_on_its_turn_and_delivers_every_sample_once() {
    let samples: Vec<_> = (0..24)
        .map(|i| Ok(sample(i, vec![("jpg", jpeg(120, 90, i as u32))])))
        .collect();
    let turn = sluice_wire::Turn::default();
    turn.pause();
    let resumed = std::sync::atomic::AtomicBool::new(false);
    let e = engine(RRC, 2);
    let mut seen = Vec::new();
    let stats = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(300));
            resumed.store(true, std::sync::atomic::Ordering::SeqCst);
            turn.resume();
        });
        e.run_unit_to(samples.into_iter(), CTX, None, Some(&turn), |o| {
            assert!(
                resumed.load(std::sync::atomic::Ordering::SeqCst),
                "a sample was decoded before the unit's turn"
            );
            match o {
                Outcome::Done(p) => seen.push(p.index),
                Outcome::Skipped(e) => panic!("unexpected skip: {e}"),
            }
            true
        })
        .unwrap()
    });
    seen.sort_unstable();
    assert_eq!(seen, (0..24).collect::<Vec<_>>());
    assert_eq!((stats.done, stats.skipped), (24, 0));
}

#[test]
fn a_sink_that_stops_ends_the_unit_without_reading_the_rest() {
    // An endless stream: the unit ends only if stopping reaches the reader.
    let read = std::sync::atomic::AtomicU64::new(0);
    let endless = (0u64..).map(|i| {
        read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(sample(i, vec![("jpg", jpeg(64, 48, i as u32))]))
    });
    let mut taken = 0;
    let stats = engine(RRC, 2)
        .run_unit(endless, CTX, |_| {
            taken += 1;
            taken < 10
        })
        .unwrap();
    let read = read.load(std::sync::atomic::Ordering::Relaxed);
    assert!(stats.done >= 10, "{stats:?}");
    // What was read: at most the pool's tasks and the reader's queue (readahead) beyond.
    let readahead = EngineConfig::default().readahead as u64;
    assert!(
        read <= stats.done + 2 * readahead + 2,
        "read {read} samples for {} done",
        stats.done
    );
}
