//! Damaged data is a named skip, never a dead run or a silent loss: a sample whose bytes rot
//! after `sluice index` and a shard cut short both leave the epoch complete, every other
//! sample delivered once, and the damage listed in loadgen's summary.

mod support;

use std::collections::HashSet;
use std::path::Path;

use sluice_shard::SampleIndex;
use support::{local_job, path_str, sluice, synth_images};

/// Shards of `per_shard` samples from 4 classes of 30, with their `.idx` and manifest.
fn indexed(dir: &Path, per_shard: u32) -> std::path::PathBuf {
    let images = dir.join("images");
    if !images.exists() {
        synth_images(dir, 4, 30);
    }
    let out = dir.join(format!("s{per_shard}"));
    let pattern = out.join("s-%06d.tar");
    let manifest = out.join("m.json");
    support::shard_images(&images, path_str(&pattern), per_shard, Some(&manifest));
    manifest
}

/// Runs loadgen on one rank in process; returns (stdout, dumped ids).
fn run(manifest: &Path, dump: &Path) -> (String, Vec<String>) {
    let out = sluice(&[
        "loadgen",
        "--dataset",
        path_str(manifest),
        "--workers",
        "local",
        "--batch-size",
        "16",
        "--pipeline",
        "decode | resize 32 | center_crop 32",
        "--dump-ids",
        path_str(dump),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "loadgen failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids = std::fs::read_to_string(dump)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    (stdout, ids)
}

fn flip_middle_of_sample(shard: &Path, sample: usize) {
    let idx = SampleIndex::read_file(&SampleIndex::sidecar_path(shard), 1 << 20).unwrap();
    let e = idx.entries[sample];
    let mut bytes = std::fs::read(shard).unwrap();
    let at = (e.offset + e.len / 2) as usize;
    for b in &mut bytes[at..at + 16] {
        *b ^= 0xff;
    }
    std::fs::write(shard, bytes).unwrap();
}

#[test]
fn a_sample_that_rots_after_indexing_is_skipped_by_name_and_the_rest_delivered() {
    let dir = tempfile::tempdir().unwrap();
    // Units of 64: shards of 40 are read whole (the file checksum fails too, explained by
    // the sample), shards of 120 by ranges.
    for per_shard in [40, 120] {
        let manifest = indexed(dir.path(), per_shard);
        let shard = manifest.parent().unwrap().join("s-000000.tar");
        flip_middle_of_sample(&shard, 20);
        let (report, ids) = run(&manifest, &dir.path().join("ids.tsv"));
        assert_eq!(ids.len(), 119, "shards of {per_shard}: {report}");
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 119, "{report}");
        assert!(
            report.contains("skipped 1 samples")
                && report.contains("s-000000.tar")
                && report.contains("checksum mismatch"),
            "shards of {per_shard}: {report}"
        );
    }
}

#[test]
fn a_truncated_shard_skips_what_it_cannot_yield_and_the_epoch_completes() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = indexed(dir.path(), 60);
    let shard = manifest.parent().unwrap().join("s-000000.tar");
    let bytes = std::fs::read(&shard).unwrap();
    let idx = SampleIndex::read_file(&SampleIndex::sidecar_path(&shard), 1 << 20).unwrap();
    // Cut inside sample 23. Samples 0..22 stay readable; sample 22 itself may be lost with
    // it, since the reader knows a sample has ended only once it has read the next entry.
    let cut = idx.entries[23].offset + idx.entries[23].len / 2;
    std::fs::write(&shard, &bytes[..cut as usize]).unwrap();
    let (report, ids) = run(&manifest, &dir.path().join("ids.tsv"));
    let from_cut = ids.iter().filter(|l| l.contains("s-000000.tar")).count();
    assert!(
        (22..=23).contains(&from_cut),
        "{from_cut} delivered: {report}"
    );
    assert_eq!(ids.len(), 60 + from_cut, "the other shard whole: {report}");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
    assert!(
        report.contains(&format!("skipped {} samples", 60 - from_cut))
            && report.contains("truncated shard")
            && report.contains("s-000000.tar"),
        "{report}"
    );
}

/// The keys each shard held when it was indexed, by shard file name.
fn keys_by_shard(manifest: &Path) -> std::collections::HashMap<String, HashSet<String>> {
    let m = sluice_shard::Manifest::load(manifest, 1 << 20).unwrap();
    m.shards
        .iter()
        .map(|s| {
            let path = manifest.parent().unwrap().join(s.name());
            let file = std::fs::File::open(&path).unwrap();
            let reader = sluice_shard::SampleReader::new(
                file,
                std::sync::Arc::<str>::from(s.name()),
                &sluice_shard::ReadOptions::default(),
            );
            let keys = reader.map(|s| s.unwrap().key).collect();
            (s.name().to_string(), keys)
        })
        .collect()
}

/// A shard rewritten in place after `sluice index` (a `cp` over it, `rsync --inplace`, a
/// re-run of `sluice shard` into the same path) delivers nothing under its old ids: a plain
/// copy of another shard (another size) is refused whole as changed; one padded to the same
/// size is caught sample by sample, since no sample lies on its indexed byte range. Read
/// whole (shards of 40) and by ranges (shards of 100, units of 64). Checked from outside:
/// every delivered key was in that shard when it was indexed.
#[test]
fn a_shard_rewritten_in_place_delivers_no_sample_under_its_old_ids() {
    let dir = tempfile::tempdir().unwrap();
    for per_shard in [40, 100] {
        for same_size in [false, true] {
            let manifest = indexed(dir.path(), per_shard);
            let folder = manifest.parent().unwrap();
            let keys = keys_by_shard(&manifest);
            let (big, small) = {
                let a = folder.join("s-000000.tar");
                let b = folder.join("s-000001.tar");
                let (la, lb) = (
                    std::fs::metadata(&a).unwrap().len(),
                    std::fs::metadata(&b).unwrap().len(),
                );
                assert_ne!(la, lb, "the two shards differ in size");
                if la > lb {
                    (a, b)
                } else {
                    (b, a)
                }
            };
            let mut bytes = std::fs::read(&small).unwrap();
            if same_size {
                // Zero blocks past the end-of-archive: still a valid tar, of the old size.
                bytes.resize(std::fs::metadata(&big).unwrap().len() as usize, 0);
            }
            std::fs::write(&big, &bytes).unwrap();
            let big_name = big.file_name().unwrap().to_str().unwrap().to_string();
            let planned = keys[&big_name].len();

            let (report, ids) = run(&manifest, &dir.path().join("ids.tsv"));
            let case = format!("shards of {per_shard}, same size {same_size}");
            let mut seen = HashSet::new();
            for line in &ids {
                let f: Vec<&str> = line.split('\t').collect();
                let (shard, key) = (f[2], f[3]);
                assert!(
                    keys[shard].contains(key),
                    "{case}: {key:?} delivered as a sample of {shard}, which never held it:\n{report}"
                );
                assert!(seen.insert((shard, key)), "{case}: {line} twice");
            }
            let from_big = ids.iter().filter(|l| l.contains(big_name.as_str())).count();
            assert_eq!(from_big, 0, "{case}: {report}");
            let total: usize = keys.values().map(HashSet::len).sum();
            assert_eq!(
                ids.len(),
                total - planned,
                "{case}: every other shard whole: {report}"
            );
            assert!(
                report.contains(&format!("skipped {planned} samples"))
                    && report.contains("changed since it was indexed")
                    && report.contains(&big_name),
                "{case}: {report}"
            );
            std::fs::remove_dir_all(folder).unwrap();
        }
    }
}

/// A run that fails (here at once: a label no sample has) still writes its report and dump,
/// and says why it failed; it never reports a rate for nothing.
#[test]
fn a_failed_loadgen_run_writes_what_it_has_and_names_the_failure() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = indexed(dir.path(), 40);
    let (dump, json) = (dir.path().join("ids.tsv"), dir.path().join("run.json"));
    let out = sluice(&local_job(
        &manifest,
        &[
            "--batch-size",
            "8",
            "--label",
            "json:category_id",
            "--pipeline",
            "decode | resize 32 | center_crop 32",
            "--dump-ids",
            path_str(&dump),
            "--json",
            path_str(&json),
        ],
    ));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("failed: rank 0, epoch 0: the first 32 samples of epoch 0 were all skipped")
            && err.contains("no \"json\" field"),
        "{err}"
    );
    assert!(
        dump.exists() && json.exists(),
        "the dump and report were written"
    );
}
