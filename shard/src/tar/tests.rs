//! Decoder rules, exercised through the blocking reader over in-memory bytes.

use std::sync::Arc;

use proptest::prelude::*;

use super::header::{pax_record, set_checksum, ustar};
use super::*;
use crate::read::{ReadOptions, SampleReader, TarReader};
use crate::write::encode_sample;
use crate::ShardError;

fn entries(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>, u64)>> {
    let mut r = TarReader::new(bytes, "t.tar", &ReadOptions::default());
    let mut out = Vec::new();
    while let Some(e) = r.next_entry()? {
        out.push((e.header.path, e.data, e.header.start));
    }
    Ok(out)
}

fn file(name: &str, data: &[u8]) -> Vec<u8> {
    let mut out = ustar(name.as_bytes(), data.len() as u64, b'0').to_vec();
    out.extend_from_slice(data);
    out.resize(
        out.len() + (padded(data.len() as u64) as usize - data.len()),
        0,
    );
    out
}

fn meta(typeflag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = ustar(b"././@LongLink", payload.len() as u64, typeflag).to_vec();
    out.extend_from_slice(payload);
    out.resize(
        out.len() + (padded(payload.len() as u64) as usize - payload.len()),
        0,
    );
    out
}

fn end() -> Vec<u8> {
    vec![0; 1024]
}

#[test]
fn reads_plain_ustar_entries_with_offsets() {
    let mut t = file("a.jpg", b"hello");
    t.extend(file("a.cls", b"7"));
    t.extend(end());
    let got = entries(&t).unwrap();
    assert_eq!(
        got,
        vec![
            ("a.jpg".into(), b"hello".to_vec(), 0),
            ("a.cls".into(), b"7".to_vec(), 1024)
        ]
    );
}

#[test]
fn clean_end_of_stream_at_a_header_boundary_ends_the_archive() {
    let t = file("a.jpg", b"x");
    assert_eq!(entries(&t).unwrap().len(), 1);
    assert!(entries(&[]).unwrap().is_empty());
}

#[test]
fn a_zero_block_ends_the_archive_and_nothing_after_is_read() {
    let mut t = file("a.jpg", b"x");
    t.extend(vec![0; 512]);
    t.extend(file("b.jpg", b"y"));
    assert_eq!(entries(&t).unwrap().len(), 1);
}

#[test]
fn pax_path_and_size_override_the_ustar_header() {
    let long = format!("{}/{}.jpg", "d".repeat(120), "k".repeat(40));
    let mut records = pax_record("path", long.as_bytes());
    records.extend(pax_record("size", b"3"));
    records.extend(pax_record("mtime", b"1700000000.5"));
    let mut t = meta(b'x', &records);
    // The ustar header claims 1000 bytes; pax says 3 and is authoritative.
    let mut h = ustar(b"short.jpg", 1000, b'0');
    set_checksum(&mut h);
    t.extend_from_slice(&h);
    t.extend_from_slice(b"abc");
    t.resize(t.len() + 509, 0);
    t.extend(file("next.jpg", b"n"));
    let got = entries(&t).unwrap();
    assert_eq!(got[0], (long, b"abc".to_vec(), 0));
    assert_eq!(got[1].0, "next.jpg");
}

#[test]
fn gnu_long_names_apply_to_the_next_entry() {
    let long = format!("{}.txt", "n".repeat(200));
    let mut payload = long.clone().into_bytes();
    payload.push(0);
    let mut t = meta(b'L', &payload);
    t.extend(file("trunc", b"data"));
    let got = entries(&t).unwrap();
    assert_eq!(got, vec![(long, b"data".to_vec(), 0)]);
}

#[test]
fn ustar_prefix_is_joined_and_gnu_magic_ignores_it() {
    let mut h = ustar(b"name.txt", 1, b'0');
    h[345..348].copy_from_slice(b"pre");
    set_checksum(&mut h);
    let mut t = h.to_vec();
    t.extend_from_slice(b"z");
    t.resize(1024, 0);
    assert_eq!(entries(&t).unwrap()[0].0, "pre/name.txt");

    h[257..265].copy_from_slice(b"ustar  \0");
    set_checksum(&mut h);
    t[..512].copy_from_slice(&h);
    assert_eq!(entries(&t).unwrap()[0].0, "name.txt");
}

#[test]
fn base256_sizes_are_read() {
    let mut h = ustar(b"big.bin", 0, b'0');
    h[124..136].fill(0);
    h[124] = 0x80;
    h[135] = 2;
    set_checksum(&mut h);
    let mut t = h.to_vec();
    t.extend_from_slice(b"ok");
    t.resize(1024, 0);
    assert_eq!(entries(&t).unwrap()[0].1, b"ok");
}

#[test]
fn directories_and_links_are_skipped_not_followed() {
    let mut t = ustar(b"dir/", 0, b'5').to_vec();
    let mut link = ustar(b"evil.jpg", 0, b'2');
    link[157..168].copy_from_slice(b"/etc/passwd");
    set_checksum(&mut link);
    t.extend_from_slice(&link);
    t.extend_from_slice(&ustar(b"hard.jpg", 0, b'1'));
    t.extend(file("dir/a.jpg", b"x"));
    t.extend(end());
    let got = entries(&t).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "dir/a.jpg");
}

#[test]
fn unknown_entry_types_are_skipped_over_their_data() {
    let mut t = ustar(b"vol", 600, b'V').to_vec();
    t.extend(vec![7u8; 1024]);
    t.extend(file("a.jpg", b"x"));
    assert_eq!(entries(&t).unwrap()[0].0, "a.jpg");
}

fn expect_err(bytes: &[u8]) -> ShardError {
    entries(bytes).expect_err("should fail")
}

#[test]
fn a_bad_checksum_is_an_error_with_its_offset() {
    let mut t = file("a.jpg", b"x");
    let mut second = file("b.jpg", b"y");
    second[0] = b'c';
    t.extend(second);
    let e = expect_err(&t);
    assert!(
        matches!(e, ShardError::BadChecksum { offset: 1024, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("t.tar"), "{e}");
}

#[test]
fn non_tar_input_is_an_error_not_an_empty_shard() {
    let e = expect_err(&[b'G'; 4096]);
    assert!(
        matches!(e, ShardError::BadChecksum { offset: 0, .. }),
        "{e}"
    );
}

#[test]
fn truncation_is_an_error_naming_entry_and_offset() {
    let t = file("a.jpg", &[1u8; 2000]);
    let e = expect_err(&t[..1500]);
    match &e {
        ShardError::Truncated {
            offset,
            what,
            needed,
            ..
        } => {
            assert_eq!(*offset, 512);
            assert!(what.contains("a.jpg"), "{what}");
            assert_eq!(*needed, 2000 - 988);
        }
        other => panic!("{other}"),
    }
    // In the padding, and in a header.
    assert!(matches!(
        expect_err(&t[..2530]),
        ShardError::Truncated { offset: 2512, .. }
    ));
    let mut two = file("a.jpg", b"x");
    two.extend_from_slice(&[1u8; 100]);
    assert!(matches!(
        expect_err(&two),
        ShardError::Truncated { offset: 1024, .. }
    ));
}

#[test]
fn sizes_over_the_limit_fail_before_allocating() {
    let mut h = ustar(b"huge.jpg", 0, b'0');
    h[124..136].fill(0);
    h[124] = 0x80;
    h[128..136].copy_from_slice(&(1u64 << 60).to_be_bytes());
    set_checksum(&mut h);
    let e = expect_err(&h);
    assert!(
        matches!(e, ShardError::TooLarge { size, .. } if size == 1 << 60),
        "{e}"
    );

    let records = pax_record("size", b"99999999999999999");
    let mut t = meta(b'x', &records);
    t.extend(file("a.jpg", b"x"));
    assert!(matches!(expect_err(&t), ShardError::TooLarge { .. }));

    let t = ustar(b"././@LongLink", 1 << 30, b'L');
    assert!(matches!(expect_err(&t), ShardError::TooLarge { .. }));
}

#[test]
fn malformed_pax_records_are_errors() {
    for bad in [
        &b"5 path=abc\n"[..], // length says 5, record is longer
        b"11 path=abc",       // no newline
        b"x path=abc\n",      // no number
        b"12 pathabc\n\n",    // no '='
        b"9999 path=a\n",     // longer than the payload
        b"12 size=1a2\n",     // size not a number
        b"11 size=-1\n",      // negative size
    ] {
        let mut t = meta(b'x', bad);
        t.extend(file("a.jpg", b"x"));
        let e = expect_err(&t);
        assert!(
            matches!(e, ShardError::Malformed { .. }),
            "{:?}: {e}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn sparse_files_and_global_path_overrides_are_refused() {
    let mut t = ustar(b"s.bin", 0, b'S').to_vec();
    t.extend(end());
    assert!(matches!(expect_err(&t), ShardError::Unsupported { .. }));

    let mut t = meta(b'g', &pax_record("path", b"all.jpg"));
    t.extend(file("a.jpg", b"x"));
    assert!(matches!(expect_err(&t), ShardError::Unsupported { .. }));

    let mut t = meta(b'x', &pax_record("GNU.sparse.major", b"1"));
    t.extend(file("a.jpg", b"x"));
    assert!(matches!(expect_err(&t), ShardError::Unsupported { .. }));

    // A global header with harmless records is fine.
    let mut t = meta(b'g', &pax_record("comment", b"hi"));
    t.extend(file("a.jpg", b"x"));
    assert_eq!(entries(&t).unwrap().len(), 1);
}

#[test]
fn a_metadata_header_without_its_entry_is_an_error() {
    let t = meta(b'x', &pax_record("path", b"a.jpg"));
    assert!(matches!(expect_err(&t), ShardError::Truncated { .. }));
    let mut t = meta(b'L', b"a.jpg\0");
    t.extend(end());
    assert!(matches!(expect_err(&t), ShardError::Malformed { .. }));
}

#[test]
fn bad_octal_is_an_error() {
    let mut h = ustar(b"a.jpg", 1, b'0');
    h[124..136].copy_from_slice(b"00000000009\0");
    set_checksum(&mut h);
    assert!(matches!(expect_err(&h), ShardError::Malformed { .. }));
}

#[test]
fn reading_from_an_offset_reports_shard_offsets() {
    let mut t = Vec::new();
    for i in 0..3 {
        encode_sample(&format!("s{i}"), &[("jpg", &[i as u8; 700])], &mut t).unwrap();
    }
    let opts = ReadOptions {
        start_offset: 1536,
        first_index: 1,
        ..ReadOptions::default()
    };
    let samples: Vec<_> = SampleReader::new(&t[1536..], "t.tar", &opts)
        .collect::<Result<_>>()
        .unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!(
        (samples[0].index, samples[0].start, samples[0].key.as_str()),
        (1, 1536, "s1")
    );
    assert_eq!(samples[1].start, 3072);
}

/// Samples as (key, [(field, bytes)]).
type Samples = Vec<(String, Vec<(String, Vec<u8>)>)>;

fn arb_samples() -> impl Strategy<Value = Samples> {
    let field = (
        "[a-z]{1,6}(\\.[a-z]{1,4})?",
        proptest::collection::vec(any::<u8>(), 0..1500),
    );
    let sample = (
        "[a-z0-9_]{1,12}(/[a-z0-9_]{1,130})?",
        proptest::collection::vec(field, 1..4),
    )
        .prop_map(|(key, mut fields)| {
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            fields.dedup_by(|a, b| a.0 == b.0);
            (key, fields)
        });
    proptest::collection::vec(sample, 0..12).prop_map(|mut v| {
        // Consecutive samples with equal keys would merge: make keys unique.
        for (i, s) in v.iter_mut().enumerate() {
            s.0 = format!("{}{i}", s.0);
        }
        v
    })
}

fn encode_all(samples: &Samples) -> Vec<u8> {
    let mut t = Vec::new();
    for (key, fields) in samples {
        let f: Vec<(&str, &[u8])> = fields
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        encode_sample(key, &f, &mut t).unwrap();
    }
    t.extend(end());
    t
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn written_samples_read_back_identically(samples in arb_samples()) {
        let t = encode_all(&samples);
        let read: Vec<_> = SampleReader::new(&t[..], "p.tar", &ReadOptions::default())
            .collect::<Result<_>>()
            .unwrap();
        prop_assert_eq!(read.len(), samples.len());
        for (i, (s, (key, fields))) in read.iter().zip(&samples).enumerate() {
            prop_assert_eq!(&s.key, key);
            prop_assert_eq!(s.index, i as u64);
            let got: Vec<_> = s.fields.iter().map(|f| (f.name.clone(), f.data.clone())).collect();
            prop_assert_eq!(&got, fields);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = entries(&bytes);
    }

    #[test]
    fn corrupted_shards_fail_cleanly_or_read(
        samples in arb_samples(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut t = encode_all(&samples);
        if t.is_empty() { return Ok(()); }
        for (at, v) in flips {
            let i = at.index(t.len());
            t[i] = v;
        }
        let len = cut.index(t.len() + 1);
        let limits = Limits { max_entry_size: 4096, max_meta_size: 4096 };
        let opts = ReadOptions { limits, ..ReadOptions::default() };
        for s in SampleReader::new(&t[..len], Arc::<str>::from("c.tar"), &opts) {
            if let Err(e) = s {
                prop_assert!(e.to_string().contains("c.tar"));
            }
        }
    }
}
