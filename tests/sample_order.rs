//! Sample order as a contract, checked from outside with `--dump-ids`: class-sorted data
//! comes out mixed; the same seed gives the same batches line for line in process, over QUIC,
//! with or without the next epoch started early and with a worker killed mid-epoch; a checkpoint at 2 ranks resumes at 3 with exactly
//! the rest of the epoch, split equally; and `--shuffle none` is the manifest in order.

mod support;
mod system;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{local_job, mixing, path_str, shard_job, sluice, sluice_ok, synth_images};
use system::{dataset, start_worker, trust_file};

/// Class-sorted ImageFolder data sharded with and without `sluice shard`'s shuffle.
fn class_sorted(dir: &Path, shuffle: bool) -> std::path::PathBuf {
    let images = dir.join("images");
    if !images.exists() {
        synth_images(dir, 20, 12);
    }
    let name = if shuffle { "shuffled" } else { "sorted" };
    let manifest = dir.join(name).join("m.json");
    let pattern = dir.join(name).join("tr-%06d.tar");
    let mut args = shard_job(
        &images,
        &pattern,
        &["--max-count", "24", "--manifest", path_str(&manifest)],
    );
    if !shuffle {
        args.push("--no-shuffle");
    }
    sluice_ok(&args);
    manifest
}

fn loadgen(extra: &[&str]) -> String {
    let mut args = vec![
        "loadgen",
        "--batch-size",
        "16",
        "--seed",
        "3",
        "--pipeline",
        "decode | resize 32 | center_crop 32",
    ];
    args.extend(extra);
    sluice_ok(&args)
}

#[test]
fn class_sorted_data_comes_out_mixed_with_and_without_shuffled_shards() {
    let dir = tempfile::tempdir().unwrap();
    for (shuffle, floor) in [(true, 0.9), (false, 0.5)] {
        let manifest = class_sorted(dir.path(), shuffle);
        let report = loadgen(&["--dataset", path_str(&manifest), "--workers", "local"]);
        let (distinct, uniform) = mixing(&report);
        assert!(
            distinct >= floor * uniform,
            "shuffled shards {shuffle}: {distinct:.2} distinct labels per batch, uniform {uniform:.2}"
        );
    }
    // A unit read alone (no interleave, no buffer) from sorted shards is what the plan fixes.
    let manifest = dir.path().join("sorted").join("m.json");
    let report = loadgen(&[
        "--dataset",
        path_str(&manifest),
        "--workers",
        "local",
        "--mix-units",
        "1",
        "--mix-buffer",
        "0",
    ]);
    let (distinct, uniform) = mixing(&report);
    assert!(distinct < 0.5 * uniform, "{distinct:.2} vs {uniform:.2}");
}

/// `--shuffle none` (evaluation) from outside: at 3 ranks, rank after rank, the samples are
/// the manifest's in order, as `sluice inspect` lists each shard, in every epoch and for any
/// seed.
#[test]
fn shuffle_none_reads_the_manifest_in_order_for_any_seed() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = class_sorted(dir.path(), true);
    let text = std::fs::read_to_string(&manifest).unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut in_order = Vec::new();
    for shard in parsed["shards"].as_array().unwrap() {
        let url = shard["url"].as_str().unwrap();
        let path = manifest.parent().unwrap().join(url);
        for line in sluice_ok(&["inspect", path_str(&path)]).lines() {
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() == 3 && f[0].parse::<u64>().is_ok() {
                in_order.push(format!("{url}/{}", f[1]));
            }
        }
    }
    assert_eq!(in_order.len(), 240);
    let dump = |seed: &str| {
        let out = dir.path().join(format!("none-{seed}.tsv"));
        sluice_ok(&local_job(
            &manifest,
            &[
                "--ranks",
                "3",
                "--epochs",
                "2",
                "--batch-size",
                "16",
                "--seed",
                seed,
                "--shuffle",
                "none",
                "--pipeline",
                "decode | resize 32 | center_crop 32",
                "--dump-ids",
                path_str(&out),
            ],
        ));
        std::fs::read_to_string(&out).unwrap()
    };
    let first = dump("3");
    assert_eq!(first, dump("11"), "the seed changed a shuffle=none dump");
    for epoch in ["0", "1"] {
        let mut ranks = Vec::new();
        let got: Vec<String> = first
            .lines()
            .map(|l| l.split('\t').collect::<Vec<_>>())
            .filter(|f| f[0] == epoch)
            .map(|f| {
                ranks.push(f[1].to_string());
                format!("{}/{}", f[2], f[3])
            })
            .collect();
        assert_eq!(got, in_order, "epoch {epoch} is not the manifest in order");
        assert!(ranks.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(ranks.iter().filter(|r| *r == "1").count(), 80);
    }
}

#[test]
fn shard_order_is_seeded_and_reproducible_for_folders_and_streams() {
    let dir = tempfile::tempdir().unwrap();
    let images = synth_images(dir.path(), 3, 4);
    let write = |name: &str, extra: &[&str]| -> Vec<u8> {
        let pattern = dir.path().join(name).join("s-%06d.tar");
        sluice_ok(&shard_job(&images, &pattern, extra));
        std::fs::read(dir.path().join(name).join("s-000000.tar")).unwrap()
    };
    let a = write("a", &[]);
    let b = write("b", &[]);
    let c = write("c", &["--seed", "9"]);
    let sorted = write("d", &["--no-shuffle"]);
    assert_eq!(a, b, "same input and seed: the same bytes");
    assert_ne!(a, c, "another seed, another order");
    assert_ne!(a, sorted);
    // A tar stream goes through the bounded shuffle buffer, reproducibly too.
    let stream = |name: &str, extra: &[&str]| -> Vec<u8> {
        let pattern = dir.path().join(name).join("s-%06d.tar");
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["shard", "--input", "-", "--output", path_str(&pattern)])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&sorted).unwrap();
        assert!(child.wait().unwrap().success());
        std::fs::read(dir.path().join(name).join("s-000000.tar")).unwrap()
    };
    let s1 = stream("e", &["--shuffle-buffer", "4"]);
    let s2 = stream("f", &["--shuffle-buffer", "4"]);
    let kept = stream("g", &["--no-shuffle"]);
    assert_eq!(s1, s2);
    assert_ne!(s1, sorted);
    assert_eq!(kept, sorted, "--no-shuffle re-shards a stream as it is");
}

/// Runs loadgen against `workers` with `connections` QUIC connections to each (and `extra`
/// arguments), and returns its `--dump-ids`, killing `victim` (SIGKILL) once the epoch is
/// under way.
#[allow(clippy::too_many_arguments)]
fn dump_with(
    dir: &Path,
    manifest: &Path,
    workers: &str,
    trust: Option<&Path>,
    victim: Option<&mut system::Worker>,
    name: &str,
    connections: u32,
    extra: &[&str],
) -> String {
    let ids = dir.join(format!("{name}.tsv"));
    let mut args: Vec<String> = [
        "loadgen",
        "--dataset",
        path_str(manifest),
        "--workers",
        workers,
        "--batch-size",
        "16",
        "--epochs",
        "2",
        "--seed",
        "11",
        "--step-ms",
        "40",
        "--pipeline",
        "decode | random_resized_crop 48 | hflip 0.5",
        "--dump-ids",
        path_str(&ids),
        "--connections-per-worker",
        &connections.to_string(),
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    if let Some(t) = trust {
        args.extend([
            "--trust-cert".into(),
            path_str(t).into(),
            "--token-file".into(),
            path_str(&dir.join("token")).into(),
        ]);
    }
    // Mid-epoch: the epoch takes ≥ 2 s of steps; the worker has been decoding for a while.
    system::run_killing(name, &args, victim, Duration::from_millis(700));
    std::fs::read_to_string(&ids).unwrap()
}

#[test]
fn dump_ids_match_line_for_line_in_process_over_quic_over_three_connections_and_with_a_worker_killed(
) {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 40);
    let local = dump_with(
        dir.path(),
        &data.manifest_path,
        "local",
        None,
        None,
        "local",
        1,
        &[],
    );
    assert!(local.lines().count() > 100, "{local}");
    let a = start_worker(dir.path(), "a");
    let b = start_worker(dir.path(), "b");
    let trust = trust_file(dir.path(), &[&a, &b]);
    let both = format!("{},{}", a.addr, b.addr);
    let over_both = |name: &str, connections: u32, extra: &[&str]| {
        let (manifest, trust) = (&data.manifest_path, Some(&*trust));
        dump_with(
            dir.path(),
            manifest,
            &both,
            trust,
            None,
            name,
            connections,
            extra,
        )
    };
    let quic = over_both("quic", 1, &[]);
    assert!(local == quic, "in-process and QUIC orders differ");
    let spread = over_both("three-connections", 3, &[]);
    assert!(
        local == spread,
        "three connections per worker changed the order"
    );
    // Epoch 1 started while epoch 0 drained (the default), or only when asked for.
    let unhurried = over_both("no-prefetch", 1, &["--no-prefetch-next-epoch"]);
    assert!(
        local == unhurried,
        "starting the next epoch early changed the order"
    );
    let mut victim = start_worker(dir.path(), "c");
    let d = start_worker(dir.path(), "d");
    let trust = trust_file(dir.path(), &[&victim, &d]);
    let pair = format!("{},{}", victim.addr, d.addr);
    let killed = dump_with(
        dir.path(),
        &data.manifest_path,
        &pair,
        Some(&trust),
        Some(&mut victim),
        "killed",
        1,
        &[],
    );
    assert!(local == killed, "a killed worker changed the order");
    // A different seed is a different order (the check above is not vacuous).
    let other = sluice_ok(&[
        "loadgen",
        "--dataset",
        path_str(&data.manifest_path),
        "--workers",
        "local",
        "--batch-size",
        "16",
        "--seed",
        "12",
        "--pipeline",
        "decode | resize 32 | center_crop 32",
        "--dump-ids",
        path_str(&dir.path().join("other.tsv")),
    ]);
    assert!(other.contains("mixing"));
    let other = std::fs::read_to_string(dir.path().join("other.tsv")).unwrap();
    let first_epoch: String = local
        .lines()
        .filter(|l| l.starts_with("0\t"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(first_epoch, other);
}

/// (rank, shard, key) lines of epoch 0 in a dump.
fn lines(path: &Path) -> Vec<(u32, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f[0] == "0").then(|| (f[1].parse().unwrap(), format!("{}/{}", f[2], f[3])))
        })
        .collect()
}

#[test]
fn a_checkpoint_at_two_ranks_resumes_at_three_with_exactly_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    // 240 samples: 120 per rank; 6 batches of 8 each leave 144, 48 for each of 3 new ranks.
    let manifest = class_sorted(dir.path(), true);
    let state = dir.path().join("state.json");
    let before = dir.path().join("before.tsv");
    let after = dir.path().join("after.tsv");
    let common = local_job(
        &manifest,
        &[
            "--batch-size",
            "8",
            "--seed",
            "4",
            "--pipeline",
            "decode | resize 32 | center_crop 32",
        ],
    );
    let mut first = common.to_vec();
    first.extend([
        "--ranks",
        "2",
        "--stop-after-batches",
        "6",
        "--save-state",
        path_str(&state),
        "--dump-ids",
        path_str(&before),
    ]);
    sluice_ok(&first);
    let mut second = common.to_vec();
    second.extend([
        "--ranks",
        "3",
        "--resume",
        path_str(&state),
        "--dump-ids",
        path_str(&after),
    ]);
    let report = sluice_ok(&second);
    let before = lines(&before);
    let after = lines(&after);
    assert_eq!(before.len(), 2 * 6 * 8);
    let mut per_rank: HashMap<u32, usize> = HashMap::new();
    for (r, _) in &after {
        *per_rank.entry(*r).or_default() += 1;
    }
    assert_eq!(per_rank.len(), 3, "{report}");
    assert!(per_rank.values().all(|&n| n == 48), "{per_rank:?}");
    let mut seen: HashSet<&String> = HashSet::new();
    for (_, id) in before.iter().chain(&after) {
        assert!(seen.insert(id), "{id} delivered twice across the resume");
    }
    assert_eq!(seen.len(), 240, "every sample of the epoch exactly once");

    // Resuming the same state twice gives the same batches (the rest is planned, not raced).
    let again = dir.path().join("again.tsv");
    let mut third = common.to_vec();
    third.extend([
        "--ranks",
        "3",
        "--resume",
        path_str(&state),
        "--dump-ids",
        path_str(&again),
    ]);
    sluice_ok(&third);
    assert_eq!(lines(&again), after);

    // Checkpoints of ranks at different steps are refused, naming the field.
    let text = std::fs::read_to_string(&state).unwrap();
    let mut states: serde_json::Value = serde_json::from_str(&text).unwrap();
    states[1]["batches"] = serde_json::json!(5);
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, serde_json::to_vec(&states).unwrap()).unwrap();
    let mut fourth = common.to_vec();
    fourth.extend(["--ranks", "3", "--resume", path_str(&bad)]);
    let out = sluice(&fourth);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("batches (the global step)"), "{err}");
}

#[test]
fn an_impossible_world_is_refused_before_any_rank_starts() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = class_sorted(dir.path(), true);
    let out = sluice(&local_job(&manifest, &["--ranks", "4000"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--ranks") && err.contains("240 samples, fewer than the 4000 ranks"),
        "{err}"
    );
}
