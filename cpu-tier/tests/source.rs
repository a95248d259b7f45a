//! Sources end to end over real files and a real loopback HTTP server: whole shards and sample
//! ranges (one Range request), replica failover, checksum verification, gzip shards, and the
//! engine consuming a unit while it streams.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sluice_cpu::{
    Engine, EngineConfig, Outcome, SampleContext, ShardLocation, ShardSource, SourceConfig,
    SourceError,
};
use sluice_shard::{scan_shard, ReadOptions, SampleIndex, ShardWriter, WriterConfig};

/// Writes one shard of `n` JPEG samples; returns its location (a local path).
fn make_shard(dir: &Path, n: u64) -> ShardLocation {
    make_shard_as(dir, n, "k", 120)
}

/// [`make_shard`] with keys `{prefix}000…` and images `width + i` pixels wide.
fn make_shard_as(dir: &Path, n: u64, prefix: &str, width: u32) -> ShardLocation {
    let mut w =
        ShardWriter::new(WriterConfig::new(format!("{}/s-%02d.tar", dir.display()))).unwrap();
    for i in 0..n {
        let j = common::jpeg(width + i as u32, 90, i as u32);
        w.write(
            &format!("{prefix}{i:03}"),
            &[("jpg", &j), ("cls", i.to_string().as_bytes())],
        )
        .unwrap();
    }
    let shard = w.finish().unwrap().remove(0);
    ShardLocation {
        tally: Default::default(),
        urls: vec![shard.path.display().to_string()],
        info: shard.info,
    }
}

/// [`make_shard`] and the index `sluice index` wrote beside it.
fn indexed_shard(dir: &Path, n: u64) -> (ShardLocation, SampleIndex) {
    let local = make_shard(dir, n);
    let index = SampleIndex::read_file(
        &SampleIndex::sidecar_path(Path::new(&local.urls[0])),
        1 << 20,
    )
    .unwrap();
    (local, index)
}

fn keys(
    source: &ShardSource,
    loc: &ShardLocation,
    start: u64,
    end: u64,
) -> Result<Vec<(u64, String)>, String> {
    let samples = source
        .open_unit(loc, start, end)
        .map_err(|e| e.to_string())?;
    samples
        .map(|s| s.map(|s| (s.index, s.key)).map_err(|e| e.to_string()))
        .collect()
}

#[test]
fn file_source_reads_whole_shards_and_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let loc = make_shard(dir.path(), 10);
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    let all = keys(&source, &loc, 0, 10).unwrap();
    assert_eq!(all.len(), 10);
    assert_eq!(all[9], (9, "k009".to_string()));
    assert_eq!(
        keys(&source, &loc, 3, 7).unwrap(),
        (3..7).map(|i| (i, format!("k{i:03}"))).collect::<Vec<_>>()
    );
    assert!(matches!(
        source.open_unit(&loc, 8, 11),
        Err(SourceError::Range { .. })
    ));
}

#[test]
fn a_checked_sample_carries_the_checksum_its_bytes_matched_and_an_unchecked_one_none() {
    let dir = tempfile::tempdir().unwrap();
    let (loc, index) = indexed_shard(dir.path(), 10);
    let checksums = |source: &ShardSource, start, end| -> Vec<Option<u64>> {
        source
            .open_unit(&loc, start, end)
            .unwrap()
            .map(|s| s.unwrap().checksum)
            .collect()
    };
    let want = |start: usize, end: usize| -> Vec<Option<u64>> {
        index.entries[start..end]
            .iter()
            .map(|e| Some(e.checksum))
            .collect()
    };
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    // A range (read through the index) and the whole shard.
    assert_eq!(checksums(&source, 3, 7), want(3, 7));
    assert_eq!(checksums(&source, 0, 10), want(0, 10));
    let lax = ShardSource::new(SourceConfig {
        verify: false,
        ..SourceConfig::default()
    })
    .unwrap();
    assert_eq!(checksums(&lax, 3, 7), vec![None; 4]);
}

#[test]
fn corrupted_bytes_fail_the_checksum_of_that_sample_alone() {
    let dir = tempfile::tempdir().unwrap();
    let loc = make_shard(dir.path(), 10);
    let path = Path::new(&loc.urls[0]);
    let index = SampleIndex::read_file(&SampleIndex::sidecar_path(path), 1 << 20).unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    let at = (index.entries[5].offset + 600) as usize; // inside sample 5's JPEG data
    bytes[at] ^= 0x01;
    std::fs::write(path, &bytes).unwrap();
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    // A range read and a whole-shard read (whose file checksum fails too, explained by the
    // sample): sample 5 is reported damaged, by number, shard and byte; the others come.
    for (start, end) in [(3, 7), (0, 10)] {
        let results: Vec<Result<u64, String>> = source
            .open_unit(&loc, start, end)
            .unwrap()
            .map(|s| s.map(|s| s.index).map_err(|e| e.to_string()))
            .collect();
        let good: Vec<u64> = results.iter().filter_map(|r| r.clone().ok()).collect();
        let want: Vec<u64> = (start..end).filter(|&i| i != 5).collect();
        assert_eq!(good, want, "{results:?}");
        let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert_eq!(errors.len(), 1, "{results:?}");
        let err = errors[0];
        assert!(
            err.contains("sample #5")
                && err.contains("s-00.tar")
                && err.contains(&format!("byte {}", index.entries[5].offset))
                && err.contains("checksum mismatch"),
            "{err}"
        );
    }
    // A shard larger than the reader's buffer: its end (and the whole-shard checksum, which
    // fails) is read long after the damaged sample was reported; still one error only.
    let big = tempfile::tempdir().unwrap();
    let big_loc = make_shard(big.path(), 400);
    let big_path = Path::new(&big_loc.urls[0]);
    assert!(std::fs::metadata(big_path).unwrap().len() > 2 << 20);
    let big_index = SampleIndex::read_file(&SampleIndex::sidecar_path(big_path), 1 << 20).unwrap();
    let mut big_bytes = std::fs::read(big_path).unwrap();
    big_bytes[(big_index.entries[5].offset + 600) as usize] ^= 0x01;
    std::fs::write(big_path, &big_bytes).unwrap();
    let errors: Vec<String> = source
        .open_unit(&big_loc, 0, 400)
        .unwrap()
        .filter_map(|s| s.err().map(|e| e.to_string()))
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("sample #5"), "{errors:?}");
    // With verification off the flipped bit goes through (it is inside JPEG data).
    let lax = ShardSource::new(SourceConfig {
        verify: false,
        ..SourceConfig::default()
    })
    .unwrap();
    assert_eq!(keys(&lax, &loc, 3, 7).unwrap().len(), 4);
}

#[test]
fn a_damaged_sample_is_read_from_a_good_replica() {
    let dir = tempfile::tempdir().unwrap();
    let loc = make_shard(dir.path(), 10);
    let path = Path::new(&loc.urls[0]).to_path_buf();
    let copy_dir = dir.path().join("replica");
    std::fs::create_dir_all(&copy_dir).unwrap();
    let copy = copy_dir.join("s-00.tar");
    std::fs::copy(&path, &copy).unwrap();
    std::fs::copy(
        SampleIndex::sidecar_path(&path),
        SampleIndex::sidecar_path(&copy),
    )
    .unwrap();
    let index = SampleIndex::read_file(&SampleIndex::sidecar_path(&path), 1 << 20).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(index.entries[5].offset + 600) as usize] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let good = std::fs::read(&copy).unwrap();
    let source = Arc::new(ShardSource::new(SourceConfig::default()).unwrap());
    let both = ShardLocation {
        tally: Default::default(),
        urls: vec![path.display().to_string(), copy.display().to_string()],
        info: loc.info.clone(),
    };
    for (start, end) in [(3, 7), (0, 10)] {
        let samples: Vec<_> = source
            .open_unit_with_repair(&both, start, end)
            .unwrap()
            .map(|s| s.unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert_eq!(samples.len() as u64, end - start);
        let five = samples.iter().find(|s| s.index == 5).unwrap();
        let e = index.entries[5];
        let jpg = five.field("jpg").unwrap();
        let at = e.offset as usize..(e.offset + e.len) as usize;
        assert!(
            good[at.clone()].windows(jpg.len()).any(|w| w == jpg),
            "sample 5 came from the good copy"
        );
        assert!(!bytes[at].windows(jpg.len()).any(|w| w == jpg));
    }
    // One copy only: the damage is reported, as before.
    let only = ShardLocation {
        tally: Default::default(),
        urls: vec![path.display().to_string()],
        info: loc.info.clone(),
    };
    let errors = source
        .open_unit_with_repair(&only, 3, 7)
        .unwrap()
        .filter(|s| s.is_err())
        .count();
    assert_eq!(errors, 1);
}

#[test]
fn a_manifest_count_that_disagrees_with_the_index_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let mut loc = make_shard(dir.path(), 10);
    loc.info.samples = 4; // understated: six samples would never be planned
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    for (start, end) in [(0, 4), (1, 3)] {
        let err = match source.open_unit(&loc, start, end) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("samples {start}..{end} of a mis-counted shard opened"),
        };
        assert!(
            err.contains("s-00.tar") && err.contains("says 4") && err.contains("lists 10"),
            "{err}"
        );
    }
}

/// A loopback HTTP/1.1 server for `root` with single-range support; counts requests.
fn serve(root: std::path::PathBuf) -> (String, Arc<AtomicUsize>) {
    serve_cutting(root, None)
}

/// [`serve`], but with `cut: Some(n)` every `.tar` body stops after `n` bytes and the
/// connection closes (its `Content-Length` promised more): a node that dies mid-stream.
fn serve_cutting(root: std::path::PathBuf, cut: Option<usize>) -> (String, Arc<AtomicUsize>) {
    serve_with(root, cut, false, Misbehave::default())
}

/// How a test server misbehaves besides cutting or hanging.
#[derive(Clone, Copy, Default)]
struct Misbehave {
    /// `.tar` bodies after the cut come one byte at a time, this far apart (a dying disk, a
    /// throttled proxy), for at most a minute.
    drip: Option<std::time::Duration>,
    /// The first this many requests get a 503 (a node restarting).
    unavailable_first: usize,
}

/// [`serve`] with a misbehaviour.
fn serve_misbehaving(
    root: std::path::PathBuf,
    cut: Option<usize>,
    how: Misbehave,
) -> (String, Arc<AtomicUsize>) {
    serve_with(root, cut, false, how)
}

/// [`serve_cutting`], but the connection stays open after the cut and nothing more comes: a
/// node that hangs mid-stream (SIGSTOP, a stuck disk), not one that died.
fn serve_hanging(root: std::path::PathBuf, cut: usize) -> (String, Arc<AtomicUsize>) {
    serve_with(root, Some(cut), true, Misbehave::default())
}

fn serve_with(
    root: std::path::PathBuf,
    cut: Option<usize>,
    hang: bool,
    how: Misbehave,
) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let nth = counter.fetch_add(1, Ordering::SeqCst);
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut request = String::new();
            let _ = reader.read_line(&mut request);
            let mut range = None;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(r) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    let (a, b) = r.trim().split_once('-').unwrap();
                    range = Some((a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap()));
                }
            }
            let path = request
                .split_whitespace()
                .nth(1)
                .unwrap_or("/")
                .trim_start_matches('/')
                .to_string();
            let resp = match std::fs::read(root.join(&path)) {
                _ if nth < how.unavailable_first => {
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_vec()
                }
                Ok(body) => {
                    match range {
                        Some((a, b)) => {
                            let part = &body[a..=b.min(body.len() - 1)];
                            let mut r = format!("HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {a}-{}/{}\r\nConnection: close\r\n\r\n", part.len(), a + part.len() - 1, body.len()).into_bytes();
                            r.extend_from_slice(part);
                            r
                        }
                        None => {
                            let mut r = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).into_bytes();
                            r.extend(body);
                            r
                        }
                    }
                }
                Err(_) => {
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_vec()
                }
            };
            let full = resp.clone();
            let resp = match cut {
                Some(n) if path.ends_with(".tar") => {
                    let head = resp
                        .windows(4)
                        .position(|w| w == b"\r\n\r\n")
                        .map_or(0, |p| p + 4);
                    resp[..(head + n).min(resp.len())].to_vec()
                }
                _ => resp,
            };
            let _ = conn.write_all(&resp);
            if let (Some(every), true) = (how.drip, path.ends_with(".tar")) {
                let rest = full[resp.len()..].to_vec();
                std::thread::spawn(move || {
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                    for b in rest {
                        if std::time::Instant::now() > deadline || conn.write_all(&[b]).is_err() {
                            break;
                        }
                        std::thread::sleep(every);
                    }
                });
                continue;
            }
            if hang && path.ends_with(".tar") {
                std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_secs(600));
                    drop(conn);
                });
            }
        }
    });
    (base, count)
}

/// A replica that hangs (answers nothing more, its connection open) costs a unit one stall
/// timeout, not the hang: the unit goes on from the next replica from where it stopped, and
/// later units read from the healthy replica first. Both ways a hung node shows: a body that
/// stops mid-unit, and a socket that accepts but never answers (a SIGSTOPped node's listen
/// backlog).
#[test]
fn a_replica_that_hangs_is_given_up_after_the_stall_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (local, index) = indexed_shard(dir.path(), 12);
    let config = SourceConfig {
        stall_timeout: std::time::Duration::from_millis(300),
        ..SourceConfig::default()
    };
    let every = |source: &Arc<ShardSource>, loc: &ShardLocation, start: u64, end: u64| {
        source
            .open_unit_with_repair(loc, start, end)
            .unwrap()
            .map(|s| s.map(|s| (s.index, s.key)).unwrap())
            .collect::<Vec<_>>()
    };
    let want = |start: u64, end: u64| {
        (start..end)
            .map(|i| (i, format!("k{i:03}")))
            .collect::<Vec<_>>()
    };

    // Mid-body: about three and a half samples of the unit arrive, then nothing.
    let cut = (index.entries[5].offset - index.entries[2].offset) as usize + 300;
    let (hanging, hanging_requests) = serve_hanging(dir.path().to_path_buf(), cut);
    let (healthy, _) = serve(dir.path().to_path_buf());
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![format!("{hanging}/s-00.tar"), format!("{healthy}/s-00.tar")],
        info: local.info.clone(),
    };
    let source = Arc::new(ShardSource::new(config.clone()).unwrap());
    assert_eq!(
        every(&source, &loc, 2, 10),
        want(2, 10),
        "every sample once, in order"
    );
    let before = hanging_requests.load(Ordering::SeqCst);
    assert_eq!(every(&source, &loc, 10, 12), want(10, 12));
    assert_eq!(
        hanging_requests.load(Ordering::SeqCst),
        before,
        "the next unit did not wait on the hung replica again"
    );

    // A socket that accepts (the kernel's backlog) and never answers: no response head.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![
            format!("http://{}/s-00.tar", silent.local_addr().unwrap()),
            format!("{healthy}/s-00.tar"),
        ],
        info: local.info.clone(),
    };
    let source = Arc::new(ShardSource::new(config).unwrap());
    assert_eq!(every(&source, &loc, 0, 12), want(0, 12));
    assert_eq!(every(&source, &loc, 3, 7), want(3, 7));
    drop(silent);
}

#[test]
fn http_ranges_fail_over_between_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let local = make_shard(dir.path(), 12);
    let (base, requests) = serve(dir.path().to_path_buf());
    // A replica nobody listens on comes first.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}/s-00.tar", dead.local_addr().unwrap());
    drop(dead);
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![dead_url.clone(), format!("{base}/s-00.tar")],
        info: local.info.clone(),
    };
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    assert_eq!(keys(&source, &loc, 2, 9).unwrap().len(), 7);
    let after_first = requests.load(Ordering::SeqCst);
    assert_eq!(
        after_first, 2,
        "one request for the .idx, one Range request for the unit"
    );
    assert_eq!(keys(&source, &loc, 9, 12).unwrap().len(), 3);
    assert_eq!(
        requests.load(Ordering::SeqCst),
        after_first + 1,
        "the index is cached"
    );

    // Every replica down: a clear error listing each.
    let gone = ShardLocation {
        tally: Default::default(),
        urls: vec![dead_url, format!("{base}/missing.tar")],
        info: local.info.clone(),
    };
    let err = ShardSource::new(SourceConfig::default())
        .unwrap()
        .open_unit(&gone, 0, 12)
        .err()
        .unwrap();
    assert!(
        matches!(&err, SourceError::AllReplicasFailed { errors, .. } if errors.len() == 2),
        "{err}"
    );
    assert!(err.to_string().contains("404"), "{err}");
}

#[test]
fn a_replica_that_dies_mid_unit_is_resumed_on_the_next_from_the_sample_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (local, index) = indexed_shard(dir.path(), 12);
    // The first replica sends the .idx whole but cuts every shard body after about three
    // and a half samples of the unit; the second is healthy.
    let cut = (index.entries[5].offset - index.entries[2].offset) as usize + 300;
    let (dying, _) = serve_cutting(dir.path().to_path_buf(), Some(cut));
    let (healthy, healthy_requests) = serve(dir.path().to_path_buf());
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![format!("{dying}/s-00.tar"), format!("{healthy}/s-00.tar")],
        info: local.info.clone(),
    };
    let source = Arc::new(ShardSource::new(SourceConfig::default()).unwrap());
    let got: Vec<(u64, String)> = source
        .open_unit_with_repair(&loc, 2, 10)
        .unwrap()
        .map(|s| s.map(|s| (s.index, s.key)).unwrap())
        .collect();
    assert_eq!(
        got,
        (2..10).map(|i| (i, format!("k{i:03}"))).collect::<Vec<_>>(),
        "every sample once, in order, across the failover"
    );
    assert_eq!(
        healthy_requests.load(Ordering::SeqCst),
        2,
        "the rest came from the healthy replica in one Range request (and its .idx, which is \
         cached per replica URL)"
    );

    // Both replicas dying: the read error stands (the client reassigns the unit).
    let (dying2, _) = serve_cutting(dir.path().to_path_buf(), Some(cut));
    let both = ShardLocation {
        tally: Default::default(),
        urls: vec![format!("{dying}/s-00.tar"), format!("{dying2}/s-00.tar")],
        info: local.info.clone(),
    };
    let results: Vec<_> = source
        .open_unit_with_repair(&both, 2, 10)
        .unwrap()
        .collect();
    assert!(
        results.iter().any(|r| r.is_err()),
        "a unit no replica can finish fails"
    );
    let read: Vec<u64> = results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|s| s.index)
        .collect();
    let mut sorted = read.clone();
    sorted.dedup();
    assert_eq!(read, sorted, "no sample twice: {read:?}");
}

#[test]
fn a_stale_index_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let loc = make_shard(dir.path(), 6);
    let mut other = loc.clone();
    other.info.checksum = sluice_shard::Checksum(1);
    let err = ShardSource::new(SourceConfig::default())
        .unwrap()
        .index(&other)
        .unwrap_err();
    assert!(err.to_string().contains("different shard"), "{err}");
}

#[test]
fn gzip_shards_stream_whole_and_skip_to_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let loc = make_shard(dir.path(), 8);
    let tar = std::fs::read(&loc.urls[0]).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let tgz = dir.path().join("s.tgz");
    std::fs::write(&tgz, gz.finish().unwrap()).unwrap();
    let (info, index) = scan_shard(
        std::fs::File::open(&tgz).unwrap(),
        "s.tgz",
        &ReadOptions::default(),
        |_| {},
    )
    .unwrap();
    index.write_file(&SampleIndex::sidecar_path(&tgz)).unwrap();
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![tgz.display().to_string()],
        info,
    };
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    assert_eq!(
        keys(&source, &loc, 5, 8).unwrap(),
        vec![(5, "k005".into()), (6, "k006".into()), (7, "k007".into())]
    );
}

#[test]
fn the_engine_consumes_a_unit_as_it_streams() {
    let dir = tempfile::tempdir().unwrap();
    let loc = make_shard(dir.path(), 30);
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    let engine = Engine::new(
        "decode | random_resized_crop 64 | hflip".parse().unwrap(),
        EngineConfig {
            threads: 2,
            readahead: 4,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let mut labels = Vec::new();
    let stats = engine
        .run_unit(
            source.open_unit(&loc, 4, 30).unwrap(),
            SampleContext {
                seed: 1,
                epoch: 0,
                shard: 0,
            },
            |o| {
                if let Outcome::Done(p) = o {
                    assert_eq!(p.label, Some(p.index as i64));
                    labels.push(p.index);
                }
                true
            },
        )
        .unwrap();
    labels.sort_unstable();
    assert_eq!(stats.done, 26);
    assert_eq!(labels, (4..30).collect::<Vec<_>>());
}

/// A shard updated in place and re-indexed (`sluice put` of a new version, then `sluice
/// index`) reads as its new version from a source that cached the old version's `.idx`: the
/// cache is keyed by the manifest's checksum and size too, not the URL alone. Both a new
/// version with another sample count and one with the same count.
#[test]
fn a_reindexed_shard_is_read_with_its_new_index_not_a_cached_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let old = make_shard_as(dir.path(), 12, "old", 120);
    let (base, _) = serve(dir.path().to_path_buf());
    let url = format!("{base}/s-00.tar");
    let at = |loc: &ShardLocation| ShardLocation {
        tally: Default::default(),
        urls: vec![url.clone()],
        info: loc.info.clone(),
    };
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    let keys_of = |loc: &ShardLocation, start, end| {
        keys(&source, &at(loc), start, end)
            .unwrap()
            .into_iter()
            .map(|(_, k)| k)
            .collect::<Vec<_>>()
    };
    assert_eq!(keys_of(&old, 2, 4), ["old002", "old003"]);
    for (n, prefix) in [(9, "new"), (12, "two")] {
        let new = make_shard_as(dir.path(), n, prefix, 150);
        let got = keys_of(&new, 2, 4);
        assert_eq!(
            got,
            [format!("{prefix}002"), format!("{prefix}003")],
            "{n} samples"
        );
    }
}

/// Without an index nothing can be checked sample by sample before it is delivered, so a
/// shard whose size is not the manifest's is refused whole, each sample of the unit named
/// with why: it changed since it was indexed.
#[test]
fn without_an_index_a_shard_of_another_size_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let indexed = make_shard(dir.path(), 6);
    let path = Path::new(&indexed.urls[0]);
    std::fs::remove_file(SampleIndex::sidecar_path(path)).unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    bytes.extend_from_slice(&[0u8; 1024]);
    std::fs::write(path, bytes).unwrap();
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    let items: Vec<_> = source.open_unit(&indexed, 0, 6).unwrap().collect();
    assert_eq!(items.len(), 1, "one error for the unit, no sample");
    let e = items[0].as_ref().err().unwrap();
    assert!(
        e.is_damage(),
        "skipped by the worker, not retried elsewhere: {e}"
    );
    let e = e.to_string();
    assert!(
        e.contains("changed since it was indexed") && e.contains("manifest says"),
        "{e}"
    );
}

/// No sample of a shard without a usable index is delivered before the whole shard matched
/// the manifest's checksum: bit rot in a shard whose `.idx` was deleted skips the unit's
/// samples as changed, by name, and delivers none; the intact shard is read whole, each unit.
#[test]
fn without_an_index_bit_rot_is_never_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let loc = make_shard(dir.path(), 8);
    let path = Path::new(&loc.urls[0]).to_path_buf();
    std::fs::remove_file(SampleIndex::sidecar_path(&path)).unwrap();
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    let got = keys(&source, &loc, 2, 5).unwrap();
    assert_eq!(
        got,
        [(2, "k002".into()), (3, "k003".into()), (4, "k004".into())]
    );
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x55;
    std::fs::write(&path, bytes).unwrap();
    for (start, end) in [(0, 8), (6, 8)] {
        let items: Vec<_> = source.open_unit(&loc, start, end).unwrap().collect();
        assert_eq!(items.len(), 1, "one error for the unit, no sample");
        let e = items[0].as_ref().err().unwrap();
        assert!(e.is_damage(), "skipped, named: {e}");
        let e = e.to_string();
        assert!(
            e.contains("no replica has a usable .idx")
                && e.contains("does not match the manifest's checksum"),
            "{e}"
        );
    }
}

/// A shard and its `.idx` rewritten in place (re-running `sluice shard` into the same folder),
/// read through a plain HTTP server by a worker that never cached the old index: the new
/// `.idx` describes another shard, so the unit is read without one, and the new bytes fail the
/// manifest's checksum: nothing is delivered under the old ids.
#[test]
fn a_shard_and_index_rewritten_in_place_deliver_no_foreign_sample() {
    let dir = tempfile::tempdir().unwrap();
    let old = make_shard_as(dir.path(), 10, "old", 120);
    let (base, _) = serve(dir.path().to_path_buf());
    make_shard_as(dir.path(), 10, "new", 150);
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    for urls in [vec![format!("{base}/s-00.tar")], old.urls.clone()] {
        let at = ShardLocation {
            tally: Default::default(),
            urls,
            info: old.info.clone(),
        };
        for (start, end) in [(0, 10), (3, 7)] {
            let items: Vec<_> = source.open_unit(&at, start, end).unwrap().collect();
            assert!(items.iter().all(Result::is_err), "a sample was delivered");
            let e = items[0].as_ref().err().unwrap().to_string();
            assert!(e.contains("describes a different shard"), "{e}");
        }
    }
}

/// A stale replica listed first on a plain HTTP server, with its own consistent `.idx`: its
/// index is refused, it is demoted, and every sample comes from the good replica; later
/// units do not ask the stale replica for shard bytes at all.
#[test]
fn a_stale_replica_listed_first_is_demoted_and_the_good_one_read() {
    let stale_dir = tempfile::tempdir().unwrap();
    let good_dir = tempfile::tempdir().unwrap();
    make_shard_as(stale_dir.path(), 10, "old", 120);
    let good = make_shard_as(good_dir.path(), 10, "new", 150);
    let (stale, stale_requests) = serve(stale_dir.path().to_path_buf());
    let (fresh, _) = serve(good_dir.path().to_path_buf());
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![format!("{stale}/s-00.tar"), format!("{fresh}/s-00.tar")],
        info: good.info.clone(),
    };
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    let mut all = Vec::new();
    for (start, end) in [(0, 4), (4, 7), (7, 10)] {
        all.extend(keys(&source, &loc, start, end).unwrap());
    }
    let expected: Vec<_> = (0..10).map(|i| (i, format!("new{i:03}"))).collect();
    assert_eq!(all, expected);
    assert_eq!(
        stale_requests.load(Ordering::SeqCst),
        1,
        "only the stale .idx was asked for"
    );
}

/// A replica that serves wrong bytes under a right index (rot on one copy) is repaired from
/// the good one, and then demoted: later units read the good replica first.
#[test]
fn a_replica_serving_wrong_bytes_is_demoted_after_a_repair() {
    let bad_dir = tempfile::tempdir().unwrap();
    let good_dir = tempfile::tempdir().unwrap();
    let good = make_shard(good_dir.path(), 10);
    let bad = make_shard(bad_dir.path(), 10);
    let path = Path::new(&bad.urls[0]);
    let index = SampleIndex::read_file(&SampleIndex::sidecar_path(path), 1 << 20).unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    let e = index.entries[1];
    bytes[(e.offset + e.len / 2) as usize] ^= 0x55;
    std::fs::write(path, bytes).unwrap();
    let (bad_url, bad_requests) = serve(bad_dir.path().to_path_buf());
    let (good_url, _) = serve(good_dir.path().to_path_buf());
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![
            format!("{bad_url}/s-00.tar"),
            format!("{good_url}/s-00.tar"),
        ],
        info: good.info.clone(),
    };
    let source = Arc::new(ShardSource::new(SourceConfig::default()).unwrap());
    let first: Vec<_> = source
        .open_unit_with_repair(&loc, 0, 5)
        .unwrap()
        .map(|s| s.unwrap().key)
        .collect();
    assert_eq!(first, ["k000", "k001", "k002", "k003", "k004"]);
    let before = bad_requests.load(Ordering::SeqCst);
    let rest: Vec<_> = source
        .open_unit_with_repair(&loc, 5, 10)
        .unwrap()
        .map(|s| s.unwrap().key)
        .collect();
    assert_eq!(rest.len(), 5);
    assert_eq!(
        bad_requests.load(Ordering::SeqCst),
        before,
        "the demoted replica was read again"
    );
}

/// A replica that drips (a byte a second: never a stall, since each read gets a byte) is
/// given up on once its reads have waited a slow window with too little to show, and the
/// unit goes on from the healthy replica beside it.
#[test]
fn a_dripping_replica_costs_a_slow_window_not_the_unit() {
    let slow_dir = tempfile::tempdir().unwrap();
    let good_dir = tempfile::tempdir().unwrap();
    let loc = make_shard(slow_dir.path(), 10);
    make_shard(good_dir.path(), 10);
    let drip = Misbehave {
        drip: Some(std::time::Duration::from_millis(500)),
        ..Misbehave::default()
    };
    let (slow, _) = serve_misbehaving(slow_dir.path().to_path_buf(), Some(2000), drip);
    let (good, _) = serve(good_dir.path().to_path_buf());
    let config = SourceConfig {
        slow_window: std::time::Duration::from_secs(2),
        ..SourceConfig::default()
    };
    let source = Arc::new(ShardSource::new(config).unwrap());
    let alone = ShardLocation {
        tally: Default::default(),
        urls: vec![format!("{slow}/s-00.tar")],
        info: loc.info.clone(),
    };
    let items: Vec<_> = source.open_unit(&alone, 0, 10).unwrap().collect();
    let e = items
        .last()
        .unwrap()
        .as_ref()
        .expect_err("the drip was read to its end");
    assert!(e.to_string().contains("too slow"), "{e}");
    let both = ShardLocation {
        tally: Default::default(),
        urls: vec![format!("{slow}/s-00.tar"), format!("{good}/s-00.tar")],
        info: loc.info.clone(),
    };
    let source = Arc::new(
        ShardSource::new(SourceConfig {
            slow_window: std::time::Duration::from_secs(2),
            ..SourceConfig::default()
        })
        .unwrap(),
    );
    let keys: Vec<_> = source
        .open_unit_with_repair(&both, 0, 10)
        .unwrap()
        .map(|s| s.unwrap().key)
        .collect();
    assert_eq!(keys.len(), 10);
}

/// Every replica answering 503 for a while (a node restarting) is waited out with backoff;
/// past `unavailable_for` the error names the outage.
#[test]
fn a_replica_unavailable_for_a_while_costs_a_pause_not_the_unit() {
    let dir = tempfile::tempdir().unwrap();
    let local = make_shard(dir.path(), 6);
    let blip = Misbehave {
        unavailable_first: 4,
        ..Misbehave::default()
    };
    let (base, _) = serve_misbehaving(dir.path().to_path_buf(), None, blip);
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![format!("{base}/s-00.tar")],
        info: local.info.clone(),
    };
    let source = Arc::new(ShardSource::new(SourceConfig::default()).unwrap());
    let keys: Vec<_> = source
        .open_unit_with_repair(&loc, 0, 6)
        .unwrap()
        .map(|s| s.unwrap().key)
        .collect();
    assert_eq!(keys.len(), 6);
    let down = Misbehave {
        unavailable_first: usize::MAX,
        ..Misbehave::default()
    };
    let (base, _) = serve_misbehaving(dir.path().to_path_buf(), None, down);
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![format!("{base}/s-00.tar")],
        info: local.info.clone(),
    };
    let source = Arc::new(
        ShardSource::new(SourceConfig {
            unavailable_for: std::time::Duration::from_secs(1),
            ..SourceConfig::default()
        })
        .unwrap(),
    );
    let err = source.open_unit_with_repair(&loc, 0, 6).err().unwrap();
    assert!(err.is_unavailable(), "{err}");
    assert!(err.to_string().contains("503"), "{err}");
}

/// Each unit's samples (or its errors, as text) from a sweep's shared read.
type Taken = Vec<Result<Arc<sluice_shard::Sample>, String>>;

/// Takes `n` items from `unit` into `into`.
fn take(unit: &mut sluice_cpu::SharedSamples, n: usize, into: &mut Taken) {
    into.extend(unit.by_ref().take(n).map(|s| s.map_err(|e| e.to_string())));
}

/// What a lone read of `loc`'s samples `start..end` gives, for comparing with a shared one.
fn alone(loc: &ShardLocation, start: u64, end: u64) -> Vec<Result<sluice_shard::Sample, String>> {
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    (source.open_unit(loc, start, end).unwrap())
        .map(|s| s.map_err(|e| e.to_string()))
        .collect()
}

fn owned(taken: &Taken) -> Vec<Result<sluice_shard::Sample, String>> {
    taken
        .iter()
        .map(|s| s.clone().map(|s| (*s).clone()))
        .collect()
}

/// Two units of one sweep opening the same samples read them once: whichever asks first
/// reads each sample for both, and both take every sample, the same one (not a copy), in
/// order, equal to a lone read's. Another group, or a unit opened once the read is over,
/// reads on its own.
#[test]
fn units_of_a_sweep_reading_the_same_samples_read_them_once() {
    let dir = tempfile::tempdir().unwrap();
    let local = make_shard(dir.path(), 12);
    let (base, requests) = serve(dir.path().to_path_buf());
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![format!("{base}/s-00.tar")],
        info: local.info.clone(),
    };
    let want = alone(&local, 2, 10);
    let source = Arc::new(ShardSource::new(SourceConfig::default()).unwrap());
    let mut a = source.open_unit_together(&loc, 2, 10, 7).unwrap();
    let mut b = source.open_unit_together(&loc, 2, 10, 7).unwrap();
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    // `a` reads three ahead, `b` takes those and reads the next two, then they alternate.
    take(&mut a, 3, &mut got_a);
    take(&mut b, 5, &mut got_b);
    while got_a.len() < 8 || got_b.len() < 8 {
        take(&mut a, 1, &mut got_a);
        take(&mut b, 1, &mut got_b);
    }
    assert!(a.next().is_none() && b.next().is_none());
    assert_eq!(owned(&got_a), want);
    assert_eq!(owned(&got_b), want);
    for (x, y) in got_a.iter().zip(&got_b) {
        let (Ok(x), Ok(y)) = (x, y) else {
            panic!("an error in a healthy shard")
        };
        assert!(Arc::ptr_eq(x, y), "sample {}: one read, shared", x.index);
    }
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "the .idx and one Range request for both units"
    );

    // Another group reads on its own; so does a unit that opens once the read is over.
    let mut other = source.open_unit_together(&loc, 2, 10, 8).unwrap();
    let mut got = Vec::new();
    take(&mut other, 8, &mut got);
    assert_eq!(owned(&got), want);
    assert_eq!(requests.load(Ordering::SeqCst), 3);
    drop((a, b, other));
    let mut later = source.open_unit_together(&loc, 2, 10, 7).unwrap();
    let mut got = Vec::new();
    take(&mut later, 8, &mut got);
    assert_eq!(owned(&got), want);
    assert_eq!(requests.load(Ordering::SeqCst), 4);
}

/// Units on threads of their own, as a worker runs them, taking one read's samples at their
/// own pace: each gets every sample once, in order, the same samples as alone.
#[test]
fn units_on_their_own_threads_each_take_every_sample_of_a_shared_read() {
    let dir = tempfile::tempdir().unwrap();
    let local = make_shard(dir.path(), 40);
    let want = alone(&local, 0, 40);
    let source = Arc::new(ShardSource::new(SourceConfig::default()).unwrap());
    let units: Vec<_> = (0..4)
        .map(|_| source.open_unit_together(&local, 0, 40, 5).unwrap())
        .collect();
    std::thread::scope(|scope| {
        for (i, mut unit) in units.into_iter().enumerate() {
            let want = &want;
            scope.spawn(move || {
                let mut got = Vec::new();
                for s in unit.by_ref() {
                    got.push(s.map_err(|e| e.to_string()));
                    if got.len() % (i + 2) == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                }
                assert_eq!(owned(&got), *want, "unit {i}");
            });
        }
    });
}

/// A unit further behind than the shared read may hold (its byte bound) reads the rest on
/// its own from the first sample it has not taken: every sample once, in order.
#[test]
fn a_unit_behind_a_shared_read_by_more_than_its_bound_reads_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let local = make_shard(dir.path(), 12);
    let (base, requests) = serve(dir.path().to_path_buf());
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![format!("{base}/s-00.tar")],
        info: local.info.clone(),
    };
    let want = alone(&local, 0, 12);
    // Room for three samples, not four.
    let largest = (want
        .iter()
        .map(|s| s.as_ref().unwrap().fields[0].data.len())
        .max())
    .unwrap_or_default();
    let bound = 3 * largest as u64 + 100;
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    let source = Arc::new(source.with_together_bytes(bound));
    let mut ahead = source.open_unit_together(&loc, 0, 12, 1).unwrap();
    let mut behind = source.open_unit_together(&loc, 0, 12, 1).unwrap();
    let (mut got_ahead, mut got_behind) = (Vec::new(), Vec::new());
    take(&mut behind, 1, &mut got_behind);
    take(&mut ahead, 3, &mut got_ahead);
    take(&mut behind, 1, &mut got_behind);
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "within the bound, one read"
    );
    take(&mut ahead, 9, &mut got_ahead);
    take(&mut behind, 10, &mut got_behind);
    assert_eq!(owned(&got_ahead), want);
    assert_eq!(owned(&got_behind), want, "every sample once, in order");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        3,
        "the unit left behind read the rest itself, in one Range request"
    );
}

/// A damaged sample in a shared read is reported by every unit of it, as each would alone. A
/// read that fails (its only replica dies mid-unit) fails the unit that read it, which ends
/// there as a unit reading alone does; the others read on on their own from where they are,
/// each sample once.
#[test]
fn a_shared_read_reports_damage_to_every_unit_and_a_failed_read_to_its_reader() {
    let dir = tempfile::tempdir().unwrap();
    let (local, index) = indexed_shard(dir.path(), 10);
    let path = Path::new(&local.urls[0]);
    let mut bytes = std::fs::read(path).unwrap();
    bytes[(index.entries[5].offset + 600) as usize] ^= 0x01;
    std::fs::write(path, &bytes).unwrap();
    let want = alone(&local, 0, 10);
    assert!(want[5].as_ref().is_err_and(|e| e.contains("sample #5")));
    let source = Arc::new(ShardSource::new(SourceConfig::default()).unwrap());
    let mut a = source.open_unit_together(&local, 0, 10, 3).unwrap();
    let mut b = source.open_unit_together(&local, 0, 10, 3).unwrap();
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    take(&mut a, 10, &mut got_a);
    take(&mut b, 10, &mut got_b);
    assert_eq!(owned(&got_a), want);
    assert_eq!(owned(&got_b), want);
    drop((a, b));

    // A replica that cuts the unit's body after about three and a half samples.
    let healthy = tempfile::tempdir().unwrap();
    let (local, index) = indexed_shard(healthy.path(), 10);
    let cut = (index.entries[3].offset + 300) as usize;
    let (dying, requests) = serve_cutting(healthy.path().to_path_buf(), Some(cut));
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec![format!("{dying}/s-00.tar")],
        info: local.info.clone(),
    };
    let mut a = source.open_unit_together(&loc, 0, 10, 3).unwrap();
    let mut b = source.open_unit_together(&loc, 0, 10, 3).unwrap();
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    take(&mut b, 2, &mut got_b);
    take(&mut a, 10, &mut got_a);
    take(&mut b, 10, &mut got_b);
    // `a` read on for both from sample 2 and failed there (a sample ends where the next
    // one's header starts, and the cut leaves sample 3's short); `b` had read 0 and 1 for
    // both, read on from 2 on its own, and failed where its own body was cut, in sample 4.
    for (got, want) in [(&got_a, &[0, 1][..]), (&got_b, &[0, 1, 2, 3][..])] {
        let read: Vec<u64> = got
            .iter()
            .filter_map(|s| s.as_ref().ok())
            .map(|s| s.index)
            .collect();
        assert_eq!(read, want);
        let errors: Vec<&String> = got.iter().filter_map(|s| s.as_ref().err()).collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(got.last().is_some_and(|s| s.is_err()), "{errors:?}");
    }
    assert_eq!(
        requests.load(Ordering::SeqCst),
        3,
        "the .idx, the shared read, and the second unit's own read of the rest"
    );
}
