use proptest::prelude::*;
use proptest::strategy::ValueTree;

use crate::codec::{decode_prefix, encode_header, PREFIX_LEN};
use crate::*;

fn sample(payload: usize, fields: Vec<(String, u64)>) -> Message {
    let tensor = payload as u64 - fields.iter().map(|f| f.1).sum::<u64>();
    Message::Sample(SampleHeader {
        job: 7,
        unit: 3,
        attempt: 1,
        shard: 2,
        index: 99,
        key: "n01440764/000099".into(),
        label: Some(-4),
        tensor_bytes: tensor,
        fields,
        geometry: Default::default(),
        has: Vec::new(),
    })
}

fn arb_message() -> impl Strategy<Value = Message> {
    let s = "[a-z0-9/._-]{0,40}";
    prop_oneof![
        (s, s).prop_map(|(token, client)| Message::Hello(Hello { token, client })),
        (s, any::<u32>(), any::<bool>()).prop_map(|(worker, threads, caches)| {
            Message::Welcome(Welcome {
                worker,
                threads,
                caches,
            })
        }),
        (
            any::<u64>(),
            s,
            s,
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<bool>()
        )
            .prop_map(
                |(job, dataset, pipeline, seed, epoch, rank, fail)| Message::OpenJob(JobSpec {
                    job,
                    dataset,
                    pipeline,
                    seed,
                    epoch,
                    rank,
                    world_size: rank.saturating_add(1),
                    batch_size: 256,
                    fail_on_bad_sample: fail,
                    fields: if fail {
                        crate::FieldSelection::All
                    } else {
                        crate::FieldSelection::Named(vec!["txt".into()])
                    },
                    label: crate::LabelSource::default(),
                    max_field_bytes: 1 << 20,
                    name: format!("job-{seed}"),
                    weight: rank % 8 + 1,
                    share: !fail,
                })
            ),
        (
            any::<u64>(),
            prop::collection::vec(s, 0..4),
            any::<u64>(),
            any::<bool>()
        )
            .prop_map(|(unit, urls, checksum, gzip)| Message::Assign(Assign {
                job: 1,
                unit,
                attempt: 2,
                shard: ShardRef {
                    index: 5,
                    urls,
                    size: 1 << 33,
                    samples: 1000,
                    checksum,
                    gzip
                },
                start: 10,
                end: 20,
            })),
        (any::<u64>(), any::<u32>()).prop_map(|(job, samples)| Message::Credit { job, samples }),
        (0usize..4096, prop::collection::vec((s, 0u64..64), 0..3)).prop_map(|(t, fields)| {
            let extra: u64 = fields.iter().map(|f| f.1).sum();
            sample(t + extra as usize, fields)
        }),
        (s, s).prop_map(|(key, reason)| Message::Skipped(SkippedSample {
            job: 1,
            unit: 2,
            attempt: 0,
            shard: 3,
            index: 4,
            key,
            reason
        })),
        any::<u64>().prop_map(|seq| Message::Heartbeat { seq }),
        any::<u64>().prop_map(|job| Message::Cancel { job }),
        s.prop_map(|message| Message::Error(ErrorMessage {
            code: ErrorCode::BadRequest,
            message
        })),
        (any::<u64>(), any::<u32>(), 0u64..1 << 30, any::<u32>()).prop_map(
            |(job, slots, slot_bytes, places)| {
                Message::ShmAttach(ShmAttach {
                    job,
                    slots,
                    slot_bytes,
                    places,
                })
            }
        ),
        any::<u64>().prop_map(|job| Message::ShmAttached { job }),
        any::<u64>().prop_map(|job| Message::ShmReleased { job }),
        (any::<u64>(), prop::collection::vec(any::<u32>(), 0..64))
            .prop_map(|(job, slots)| Message::SlotCredit { job, slots }),
        (any::<u32>(), 0u64..1 << 24, 0u64..512).prop_map(|(slot, tensor, field)| {
            let header = same_host_header(tensor, field);
            Message::ShmSample { slot, header }
        }),
        (
            any::<u64>(),
            prop::collection::vec(
                (any::<u64>(), any::<u32>(), any::<u64>(), any::<u32>()),
                0..64
            )
        )
            .prop_map(|(job, places)| Message::ShmPlaces {
                job,
                places: places
                    .into_iter()
                    .map(|(unit, attempt, index, place)| Place {
                        unit,
                        attempt,
                        index,
                        place
                    })
                    .collect()
            }),
        (any::<u32>(), 0u64..1 << 24, 0u64..512).prop_map(|(place, tensor, field)| {
            Message::ShmPlaced {
                place,
                header: same_host_header(tensor, field),
            }
        }),
    ]
}

proptest! {
    #[test]
    fn frames_round_trip(messages in prop::collection::vec(arb_message(), 1..8)) {
        let limits = Limits::default();
        let mut buf = Vec::new();
        let mut payloads = Vec::new();
        for m in &messages {
            let payload: Vec<u8> = (0..m.payload_len()).map(|i| i as u8).collect();
            encode_frame(m, &payload, &limits, &mut buf).unwrap();
            payloads.push(payload);
        }
        let mut at = 0;
        for (m, p) in messages.iter().zip(&payloads) {
            // Every strict prefix of a frame asks for more bytes.
            let (frame, used) = decode_frame(&buf[at..], &limits).unwrap().unwrap();
            prop_assert_eq!(decode_frame(&buf[at..at + used - 1], &limits).unwrap(), None);
            prop_assert_eq!(&frame.message, m);
            prop_assert_eq!(frame.payload, &p[..]);
            at += used;
        }
        prop_assert_eq!(at, buf.len());
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_frame(&bytes, &Limits::default());
    }

    #[test]
    fn corrupted_headers_are_errors_or_frames(msg in arb_message(), at in 0usize..64, bit in 0u8..8) {
        let mut buf = Vec::new();
        let payload = vec![0u8; msg.payload_len() as usize];
        encode_frame(&msg, &payload, &Limits::default(), &mut buf).unwrap();
        let i = at % buf.len();
        buf[i] ^= 1 << bit;
        let _ = decode_frame(&buf, &Limits::default());
    }
}

#[test]
fn lengths_are_bounded_before_allocation() {
    let limits = Limits {
        max_header: 64,
        max_payload: 1000,
    };
    let mut buf = Vec::new();
    encode_frame(&Message::Heartbeat { seq: 1 }, &[], &limits, &mut buf).unwrap();
    let mut huge = buf.clone();
    huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        decode_frame(&huge, &limits).unwrap_err(),
        WireError::TooLarge {
            what: "header",
            len: u32::MAX as u64,
            limit: 64
        }
    );
    let mut huge = buf.clone();
    huge[8..12].copy_from_slice(&5000u32.to_le_bytes());
    assert!(matches!(
        decode_frame(&huge, &limits),
        Err(WireError::TooLarge {
            what: "payload",
            ..
        })
    ));
    // A header whose strings announce more than the header holds is refused, not allocated.
    let mut lying = Vec::new();
    encode_frame(&Message::Cancel { job: 1 }, &[], &limits, &mut lying).unwrap();
    let mut h = Vec::new();
    h.extend_from_slice(&0u32.to_le_bytes()); // variant 0 = Hello
    h.extend_from_slice(&(1u64 << 40).to_le_bytes()); // token length
    let mut frame = lying[..PREFIX_LEN].to_vec();
    frame[4..8].copy_from_slice(&(h.len() as u32).to_le_bytes());
    frame.extend_from_slice(&h);
    assert!(matches!(
        decode_frame(&frame, &limits),
        Err(WireError::Header { .. })
    ));
}

#[test]
fn version_and_magic_are_checked() {
    let buf = heartbeat_frame();
    let mut v = buf.clone();
    v[3] = VERSION + 1;
    assert_eq!(
        decode_frame(&v, &Limits::default()).unwrap_err(),
        WireError::Version { found: VERSION + 1 }
    );
    let msg = decode_frame(&v, &Limits::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains(&format!("version {}", VERSION + 1)), "{msg}");
    let mut m = buf.clone();
    m[0] = b'G';
    assert!(matches!(
        decode_frame(&m, &Limits::default()),
        Err(WireError::Magic(_))
    ));
    let head: [u8; PREFIX_LEN] = buf[..PREFIX_LEN].try_into().unwrap();
    assert!(decode_prefix(&head, &Limits::default()).is_ok());
}

#[test]
fn payload_must_match_the_header() {
    let msg = sample(100, vec![("json".into(), 10)]);
    let mut buf = Vec::new();
    assert!(matches!(
        encode_header(&msg, 99, &Limits::default(), &mut buf),
        Err(WireError::PayloadMismatch {
            announced: 100,
            actual: 99,
            ..
        })
    ));
    assert!(buf.is_empty());
    encode_frame(&msg, &[0; 100], &Limits::default(), &mut buf).unwrap();
    buf[8..12].copy_from_slice(&90u32.to_le_bytes());
    buf.truncate(buf.len() - 10);
    assert!(matches!(
        decode_frame(&buf, &Limits::default()),
        Err(WireError::PayloadMismatch { .. })
    ));
    // A heartbeat with a payload is malformed too.
    let mut hb = heartbeat_frame();
    hb[8..12].copy_from_slice(&4u32.to_le_bytes());
    hb.extend_from_slice(&[1, 2, 3, 4]);
    assert!(matches!(
        decode_frame(&hb, &Limits::default()),
        Err(WireError::PayloadMismatch { .. })
    ));
}

#[cfg(feature = "io")]
#[tokio::test]
async fn async_reader_reads_payloads_in_place_and_spots_truncation() {
    use crate::io::{FrameReader, FrameWriter, IoError};
    let msg = sample(6, vec![]);
    let mut w = FrameWriter::new(Vec::new(), Limits::default());
    w.send(&msg, &[b"abc", b"def"]).await.unwrap();
    w.send(&Message::Heartbeat { seq: 2 }, &[]).await.unwrap();
    w.send(&msg, &[b"ghijkl"]).await.unwrap();
    let bytes = w.into_inner();
    let mut r = FrameReader::new(&bytes[..], Limits::default());
    assert_eq!(r.next().await.unwrap(), Some(msg.clone()));
    let mut dst = [0u8; 6];
    r.payload_into(&mut dst).await.unwrap();
    assert_eq!(&dst, b"abcdef");
    assert_eq!(r.next().await.unwrap(), Some(Message::Heartbeat { seq: 2 }));
    // An unread payload is skipped by the next call.
    assert_eq!(r.next().await.unwrap(), Some(msg));
    assert_eq!(r.next().await.unwrap(), None);
    let cut = &bytes[..bytes.len() - 3];
    let mut r = FrameReader::new(cut, Limits::default());
    r.next().await.unwrap();
    r.next().await.unwrap();
    r.next().await.unwrap();
    let mut dst = [0u8; 6];
    assert!(matches!(
        r.payload_into(&mut dst).await,
        Err(IoError::Truncated)
    ));
}

/// Writes one frame of each message kind to `$SLUICE_FRAME_SEEDS` (a fuzzing corpus).
#[test]
fn write_fuzz_seeds_when_asked() {
    let Some(dir) = std::env::var_os("SLUICE_FRAME_SEEDS") else {
        return;
    };
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for i in 0..64 {
        let m = arb_message().new_tree(&mut runner).unwrap().current();
        let mut buf = Vec::new();
        encode_frame(
            &m,
            &vec![7u8; m.payload_len() as usize],
            &Limits::default(),
            &mut buf,
        )
        .unwrap();
        std::fs::write(std::path::Path::new(&dir).join(format!("seed-{i:02}")), buf).unwrap();
    }
}

/// A heartbeat (`seq` 1) as a whole frame, to be spoiled byte by byte.
fn heartbeat_frame() -> Vec<u8> {
    let mut frame = Vec::new();
    let heartbeat = Message::Heartbeat { seq: 1 };
    encode_frame(&heartbeat, &[], &Limits::default(), &mut frame).unwrap();
    frame
}

/// A same-host sample's header: `tensor` bytes in shared memory, one `json` field of
/// `field` bytes in the frame.
fn same_host_header(tensor: u64, field: u64) -> SampleHeader {
    let Message::Sample(mut header) = sample(field as usize, vec![("json".into(), field)]) else {
        unreachable!()
    };
    header.tensor_bytes = tensor;
    header
}
