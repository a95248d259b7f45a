//! The CPU workers' shard caches from outside: with two `sluice cpu --cache-dir` workers the
//! second epoch of a `global` run (a new shard order) reads almost nothing from the storage
//! node (its own metrics), since each shard's units go to the worker that cached it, in the
//! same order and with the same mixing as a run without caches; a cached range damaged on
//! disk, a cache smaller than a unit and a cache disk that fills up all deliver exactly once.

mod support;
mod system;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{path_str, sluice_ok};
use system::{dataset, start_worker_with, trust_file, Worker};

const PIPELINE: &str = "decode | resize 40 | center_crop 32";

/// Bytes the storage node at `url` has sent from the mountpath `data`, by its own metrics
/// (the test process's storage nodes share one recorder; the mountpath label tells them
/// apart).
fn storage_bytes(url: &str, data: &Path) -> f64 {
    let text = reqwest::blocking::get(format!("{url}/metrics"))
        .unwrap()
        .text()
        .unwrap();
    let mountpath = format!("mountpath=\"{}", data.display());
    text.lines()
        .filter(|l| l.starts_with("sluice_storage_bytes_sent_total") && l.contains(&mountpath))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One epoch (`epoch`) of two ranks on `workers` (or `local`), its `--dump-ids` and report.
fn epoch(dir: &Path, manifest: &Path, workers: &str, epoch: u64, trust: &Path) -> (String, String) {
    let dump = dir.join(format!("dump-{workers}-{epoch}.txt").replace([':', ','], "_"));
    let report = sluice_ok(&[
        "loadgen",
        "--dataset",
        path_str(manifest),
        "--workers",
        workers,
        "--token-file",
        path_str(&dir.join("token")),
        "--trust-cert",
        path_str(trust),
        "--ranks",
        "2",
        "--batch-size",
        "16",
        // A consumer that trains (as a job does), so workers can stay ahead of it.
        "--step-ms",
        "20",
        "--seed",
        "5",
        "--pipeline",
        PIPELINE,
        "--first-epoch",
        &epoch.to_string(),
        "--epochs",
        "1",
        "--dump-ids",
        path_str(&dump),
    ]);
    (std::fs::read_to_string(&dump).unwrap(), report)
}

fn mixing_line(report: &str) -> String {
    report
        .lines()
        .find(|l| l.starts_with("mixing:"))
        .unwrap_or_default()
        .to_string()
}

fn cached_worker(dir: &Path, name: &str, cache: &Path, size: &str) -> Worker {
    start_worker_with(
        dir,
        name,
        &[
            "--no-same-host",
            "--cache-dir",
            path_str(cache),
            "--cache-size",
            size,
        ],
    )
}

/// Flips bytes in the middle of the largest cached shard file of `cache`.
fn damage_largest(cache: &Path) {
    let largest = std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "shard"))
        .max_by_key(|p| {
            let ranges: serde_json::Value =
                serde_json::from_slice(&std::fs::read(p.with_extension("ranges")).unwrap())
                    .unwrap();
            ranges["covered"].as_array().map_or(0, |r| r.len() as u64)
        })
        .expect("the worker cached nothing");
    let ranges: serde_json::Value =
        serde_json::from_slice(&std::fs::read(largest.with_extension("ranges")).unwrap()).unwrap();
    let (start, end) = (
        ranges["covered"][0][0].as_u64().unwrap(),
        ranges["covered"][0][1].as_u64().unwrap(),
    );
    let mut bytes = std::fs::read(&largest).unwrap();
    let mid = ((start + end) / 2) as usize;
    for b in &mut bytes[mid..(mid + 4096).min(end as usize)] {
        *b ^= 0x5a;
    }
    std::fs::write(&largest, bytes).unwrap();
}

#[test]
fn a_second_epoch_comes_from_the_workers_caches_in_the_same_order() {
    let dir = tempfile::tempdir().unwrap();
    // Shards of 8 samples: enough units that the few an owner gives away when it is busy
    // are a small part of the epoch.
    let data = dataset(dir.path(), 8);
    let (a_cache, b_cache) = (dir.path().join("cache-a"), dir.path().join("cache-b"));
    let a = cached_worker(dir.path(), "a", &a_cache, "1G");
    let b = cached_worker(dir.path(), "b", &b_cache, "1G");
    let trust = trust_file(dir.path(), &[&a, &b]);
    let manifest = &data.manifest_path;
    let (reference, local) = epoch(dir.path(), manifest, "local", 1, &trust);

    let pool = format!("{},{}", a.addr, b.addr);
    let read = || storage_bytes(&data.storage.url, &dir.path().join("data"));
    let before = read();
    epoch(dir.path(), manifest, &pool, 0, &trust);
    let first = read() - before;
    let (cached, report) = epoch(dir.path(), manifest, &pool, 1, &trust);
    let second = read() - before - first;
    eprintln!("storage bytes: epoch 0 {first}, epoch 1 (cached) {second}");
    eprintln!(
        "{}",
        report
            .lines()
            .filter(|l| l.starts_with("worker caches"))
            .collect::<String>()
    );
    assert!(
        second <= 0.10 * first,
        "the second epoch read {second} bytes from storage, the first {first}"
    );
    assert_eq!(
        cached, reference,
        "the cached epoch's order differs from a run without caches"
    );
    assert_eq!(mixing_line(&report), mixing_line(&local));
    // The loader says so too: the workers told it where each unit's byte ranges came from
    // (ranges as asked for: a few more bytes than the storage node ends up sending).
    let hits: f64 = report
        .lines()
        .find_map(|l| l.strip_prefix("worker caches: "))
        .and_then(|l| l.split('%').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no worker caches line in:\n{report}"));
    assert!(
        hits >= 85.0,
        "the loader saw {hits}% of shard bytes come from the caches"
    );
    // On the real ImageNet sample the plan mixes as uniform sampling does (the generated
    // fallback's shards hold runs of one class, which the plan mixes to about 0.96).
    let (distinct, uniform) = support::mixing(&report);
    if support::shared_data("imagenet-sample").is_some() {
        assert!(
            (distinct / uniform - 1.0).abs() <= 0.02,
            "{distinct:.2} distinct labels per batch against {uniform:.2} under uniform sampling"
        );
    }

    // A cached range damaged on disk: detected by its samples' checksums, read again from
    // storage, never delivered.
    damage_largest(&a_cache);
    damage_largest(&b_cache);
    let (repaired, _) = epoch(dir.path(), manifest, &pool, 1, &trust);
    assert_eq!(
        repaired, reference,
        "a damaged cache changed what was delivered"
    );
    assert!(
        a.log_shows("damaged", Duration::from_secs(10)) || b.log_contains("damaged"),
        "neither worker noticed the damage"
    );
}

#[test]
fn a_cache_too_small_or_a_full_cache_disk_still_delivers_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 24);
    let manifest = &data.manifest_path;
    // Smaller than one unit's range: every range passes through, evicting as it goes.
    let tiny = cached_worker(dir.path(), "tiny", &dir.path().join("cache-tiny"), "64K");
    let trust = trust_file(dir.path(), &[&tiny]);
    let (reference, _) = epoch(dir.path(), manifest, "local", 1, &trust);
    for e in 0..2 {
        let (got, _) = epoch(dir.path(), manifest, &tiny.addr, 1, &trust);
        assert_eq!(got, reference, "run {e} with a tiny cache");
    }
    drop(tiny);

    // A cache disk that fills up (a 256 KiB tmpfs under a cache that thinks it has 1 GiB):
    // writes fail, the worker says so and reads from storage.
    let mount = dir.path().join("small-disk");
    std::fs::create_dir_all(&mount).unwrap();
    let mounted = Command::new("mount")
        // Owner-only, as a cache dir must be (a tmpfs root is 1777 by default).
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=256k,mode=0700",
            "tmpfs",
            path_str(&mount),
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipping the full-disk case: cannot mount a tmpfs (needs root)");
        return;
    }
    let full = cached_worker(dir.path(), "full", &mount, "1G");
    let trust = trust_file(dir.path(), &[&full]);
    let outcome = std::panic::catch_unwind(|| {
        for _ in 0..2 {
            let (got, _) = epoch(dir.path(), manifest, &full.addr, 1, &trust);
            assert_eq!(
                got, reference,
                "a full cache disk changed what was delivered"
            );
        }
        assert!(
            full.log_shows("cannot write", Duration::from_secs(10)),
            "the worker did not say its disk is full"
        );
    });
    drop(full);
    let _ = Command::new("umount").arg(path_str(&mount)).status();
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
}

/// Flips one byte in every `every` of each cached shard file in `cache` (tar headers and
/// padding as much as sample bytes); returns how many it flipped.
fn rot(cache: &Path, every: usize) -> usize {
    let mut flipped = 0;
    for entry in std::fs::read_dir(cache).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "shard") {
            continue;
        }
        let mut bytes = std::fs::read(&path).unwrap();
        // Sparse files: only bytes that were written are worth flipping.
        for i in (every / 2..bytes.len()).step_by(every) {
            if bytes[i] != 0 || i % 512 < 257 {
                bytes[i] ^= 0x20;
                flipped += 1;
            }
        }
        std::fs::write(&path, bytes).unwrap();
    }
    flipped
}

/// Whether a loadgen report says samples were skipped.
fn skipped(report: &str) -> Option<&str> {
    report.lines().find(|l| l.starts_with("skipped "))
}

/// Damage in the cache is the cache's, never the data's: bytes flipped all over the cached
/// files (tar headers included) and cached files swapped for other shards' cost no sample,
/// epoch after epoch: each fault drops the entry and the unit goes on from storage.
#[test]
fn flipped_bytes_and_swapped_files_in_the_cache_cost_no_sample() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 8);
    let cache = dir.path().join("cache");
    let w = cached_worker(dir.path(), "w", &cache, "1G");
    let trust = trust_file(dir.path(), &[&w]);
    let manifest = &data.manifest_path;
    let (reference, _) = epoch(dir.path(), manifest, "local", 1, &trust);
    let (filled, _) = epoch(dir.path(), manifest, &w.addr, 1, &trust);
    assert_eq!(filled, reference);

    let flipped = rot(&cache, 5000);
    assert!(flipped > 10, "only {flipped} bytes flipped");
    for run in 0..2 {
        let (got, report) = epoch(dir.path(), manifest, &w.addr, 1, &trust);
        assert_eq!(got, reference, "run {run} after the cache rotted");
        assert_eq!(skipped(&report), None, "run {run}: {report}");
    }
    assert!(w.log_shows("the cached copy is damaged", Duration::from_secs(5)));
    assert!(
        !w.log_contains("a replica's copy is good"),
        "the cache's damage was blamed on storage"
    );

    // Every cached file replaced by another shard's (same names, other bytes).
    let files: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "shard"))
        .collect();
    assert!(files.len() > 2);
    let first = std::fs::read(&files[0]).unwrap();
    for f in &files[1..] {
        let len = std::fs::metadata(f).unwrap().len() as usize;
        let mut other = first.clone();
        other.resize(len, 0);
        std::fs::write(f, other).unwrap();
    }
    let (got, report) = epoch(dir.path(), manifest, &w.addr, 1, &trust);
    assert_eq!(
        got, reference,
        "swapped cache files changed what was delivered"
    );
    assert_eq!(skipped(&report), None, "{report}");
    let text = system::metrics_text(&w);
    assert!(
        text.lines()
            .any(|l| l.starts_with("sluice_cpu_cache_damaged_total") && !l.ends_with(" 0")),
        "the cache's damage is not counted as the cache's"
    );
}

/// The cache owns its files: links planted in the cache directory under entries' names
/// (before the worker starts, and in place of its files while it runs) are never followed,
/// written through or removed, and the epochs deliver exactly once all the same. A cache
/// directory that is itself a link, or that others can write, is refused by name, and the
/// worker reads from storage.
#[test]
fn links_in_the_cache_dir_are_never_written_through() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 8);
    let manifest = &data.manifest_path;
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let stems: Vec<String> = data
        .manifest
        .shards
        .iter()
        .map(|s| format!("{:016x}-{}", s.checksum.0, s.size))
        .collect();
    // Half the shards: a link as the data file; the other half: as the sidecar's temp file.
    for (i, stem) in stems.iter().enumerate() {
        let ext = if i % 2 == 0 { "shard" } else { "tmp" };
        symlink(&victim, cache.join(format!("{stem}.{ext}"))).unwrap();
    }
    let w = cached_worker(dir.path(), "w", &cache, "1G");
    let trust = trust_file(dir.path(), &[&w]);
    let (reference, _) = epoch(dir.path(), manifest, "local", 1, &trust);
    for run in 0..2 {
        let (got, _) = epoch(dir.path(), manifest, &w.addr, 1, &trust);
        assert_eq!(got, reference, "run {run} with links in the cache dir");
    }
    // Files the worker made, swapped for links while it runs.
    for entry in std::fs::read_dir(&cache).unwrap() {
        let path = entry.unwrap().path();
        let is_file = std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_file();
        if is_file && path.extension().is_some_and(|e| e == "shard") {
            std::fs::remove_file(&path).unwrap();
            symlink(&victim, &path).unwrap();
        }
    }
    let (got, _) = epoch(dir.path(), manifest, &w.addr, 1, &trust);
    assert_eq!(got, reference, "links put in place of cached files");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert_eq!(
        std::fs::metadata(&victim).unwrap().len(),
        9,
        "the victim was resized"
    );
    let links = std::fs::read_dir(&cache)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_symlink())
        .count();
    assert!(
        links >= stems.len(),
        "the worker removed links it did not make"
    );
    assert!(
        w.log_shows("not a file this worker made", Duration::from_secs(10)),
        "the links went unmentioned"
    );
    drop(w);

    // A cache dir that is a link, or writable by others: refused, and the worker serves.
    let link = dir.path().join("cache-link");
    symlink(&cache, &link).unwrap();
    let open = dir.path().join("cache-open");
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    for (bad, says) in [(&link, "symbolic link"), (&open, "other users can write")] {
        let w = cached_worker(dir.path(), "bad", bad, "1G");
        let trust = trust_file(dir.path(), &[&w]);
        assert!(w.log_shows("shard cache off", Duration::from_secs(5)));
        assert!(w.log_contains(says), "{says}");
        let (got, _) = epoch(dir.path(), manifest, &w.addr, 1, &trust);
        assert_eq!(got, reference);
    }
}
