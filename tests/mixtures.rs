//! Mixtures checked from outside with `--dump-ids` (whose lines name each sample's source):
//! weights 3:1 hold in every window of 4 batches and over the epoch, the small source is
//! upsampled pass by pass, the order is the same in process and over QUIC with a worker
//! killed, a checkpoint at 2 ranks resumes at 3 with exactly the rest, and one resumed with
//! weights 1:1 continues each source's pass with nothing repeated or skipped.

mod support;
mod system;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{path_str, sluice_ok};
use system::{run_killing, start_worker, trust_file};

/// A source of `classes × per_class` generated JPEGs in shards of `per_shard`, named
/// `<name>-NNNNNN.tar`; returns its manifest.
fn source(dir: &Path, name: &str, classes: u32, per_class: u32, per_shard: u32) -> PathBuf {
    let root = dir.join(name);
    let images = support::synth_images(&root, classes, per_class);
    let manifest = root.join("m.json");
    let pattern = root.join(format!("{name}-%06d.tar"));
    support::shard_images(&images, path_str(&pattern), per_shard, Some(&manifest));
    manifest
}

/// A dump line: (epoch, rank, sample "shard/key", source).
type Line = (u64, u32, String, String);

fn read_dump(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 5, "a mixture's dump line names its source: {l:?}");
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                format!("{}/{}", f[2], f[3]),
                f[4].to_string(),
            )
        })
        .collect()
}

/// Each step's samples (batch `b` of every rank) of `epoch`, in step order.
fn steps(lines: &[Line], epoch: u64, batch: usize) -> Vec<Vec<Line>> {
    let mut ranks: HashMap<u32, Vec<Line>> = HashMap::new();
    for l in lines.iter().filter(|l| l.0 == epoch) {
        ranks.entry(l.1).or_default().push(l.clone());
    }
    let longest = ranks.values().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::new();
    for b in 0..longest.div_ceil(batch) {
        let mut step = Vec::new();
        for r in 0..ranks.len() as u32 {
            step.extend(ranks[&r].iter().skip(b * batch).take(batch).cloned());
        }
        out.push(step);
    }
    out
}

/// Per source, nothing delivered again before its pass ends and nothing skipped
/// (`sluice_plan::mixture::check_passes`); `sources` lists the sources' names and sizes.
fn assert_passes(steps: &[Vec<Line>], sources: &[(&str, u64)]) {
    let tagged: Vec<Vec<(usize, &str)>> = steps
        .iter()
        .map(|step| {
            step.iter()
                .map(|l| {
                    let s = sources.iter().position(|(name, _)| *name == l.3);
                    (s.expect("a source the run was given"), l.2.as_str())
                })
                .collect()
        })
        .collect();
    let sizes: Vec<u64> = sources.iter().map(|(_, n)| *n).collect();
    if let Err(e) = sluice_plan::mixture::check_passes(&tagged, &sizes) {
        panic!("{e}");
    }
}

/// `loadgen` on a mixture of `a` and `b` at `weights`.
fn loadgen_of<'a>(a: &'a Path, b: &'a Path, weights: &'a str) -> Vec<&'a str> {
    let (a, b) = (path_str(a), path_str(b));
    vec![
        "loadgen",
        "--dataset",
        a,
        "--dataset",
        b,
        "--weights",
        weights,
    ]
}

fn loadgen_mix(a: &Path, b: &Path, weights: &str, ranks: &str, dump: &Path, extra: &[&str]) {
    let mut args = loadgen_of(a, b, weights);
    args.extend([
        "--seed",
        "5",
        "--pipeline",
        "decode | resize 32 | center_crop 32",
        "--batch-size",
        "8",
        "--ranks",
        ranks,
        "--dump-ids",
        path_str(dump),
    ]);
    if !extra.contains(&"--workers") {
        args.extend(["--workers", "local"]);
    }
    args.extend(extra);
    sluice_ok(&args);
}

/// Two sources of 480 and 120 samples at 3:1, one rank, batches of 64: the proportions in
/// every window of 4 batches, over the epoch, and the small source's passes; then the same
/// order over two QUIC workers, one of them killed mid-epoch.
#[test]
fn weights_hold_in_every_window_and_quic_with_a_worker_killed_matches_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let a = source(dir.path(), "a", 12, 40, 40);
    let b = source(dir.path(), "b", 4, 30, 20);
    let dump =
        |name: &str, workers: &str, trust: Option<&Path>, victim: Option<&mut system::Worker>| {
            let ids = dir.path().join(format!("{name}.tsv"));
            let mut args: Vec<String> = loadgen_of(&a, &b, "3,1")
                .into_iter()
                .chain([
                    "--workers",
                    workers,
                    "--batch-size",
                    "64",
                    "--epochs",
                    "2",
                    "--seed",
                    "5",
                    "--step-ms",
                    "60",
                    "--pipeline",
                    "decode | random_resized_crop 48 | hflip 0.5",
                    "--dump-ids",
                    path_str(&ids),
                ])
                .map(|s| s.to_string())
                .collect();
            if let Some(t) = trust {
                args.extend(["--trust-cert".into(), path_str(t).into()]);
                args.extend([
                    "--token-file".into(),
                    path_str(&dir.path().join("token")).into(),
                ]);
            }
            let report = run_killing(name, &args, victim, Duration::from_millis(500));
            (std::fs::read_to_string(&ids).unwrap(), report)
        };
    let (local, report) = dump("local", "local", None, None);
    assert!(report.contains("sources: delivered"), "{report}");
    let lines = read_dump(&dir.path().join("local.tsv"));
    let a_name = path_str(&a).to_string();
    let b_name = path_str(&b).to_string();
    for epoch in 0..2 {
        let epoch_lines: Vec<&Line> = lines.iter().filter(|l| l.0 == epoch).collect();
        // 600 samples an epoch: 450 of A (each at most once), 150 of B (all 120, then 30).
        assert_eq!(epoch_lines.len(), 600);
        let share =
            |ls: &[&Line]| ls.iter().filter(|l| l.3 == a_name).count() as f64 / ls.len() as f64;
        for w in epoch_lines.chunks(256).filter(|w| w.len() == 256) {
            let s = share(w);
            assert!(
                (s - 0.75).abs() <= 0.10,
                "a window of 4 batches has {s:.3} of A"
            );
        }
        assert!((share(&epoch_lines) - 0.75).abs() <= 0.05);
    }
    let sizes = [(a_name.as_str(), 480), (b_name.as_str(), 120)];
    let all: Vec<Vec<Line>> = (0..2).flat_map(|e| steps(&lines, e, 64)).collect();
    assert_passes(&all, &sizes);

    let mut victim = start_worker(dir.path(), "w1");
    let other = start_worker(dir.path(), "w2");
    let trust = trust_file(dir.path(), &[&victim, &other]);
    let pair = format!("{},{}", victim.addr, other.addr);
    let (killed, _) = dump("killed", &pair, Some(&trust), Some(&mut victim));
    assert!(
        local == killed,
        "a mixture's order differs over QUIC with a worker killed"
    );
}

/// A checkpoint at 2 ranks resumes at 3 with exactly the rest of the epoch; resumed with
/// weights 1:1 instead, each source's pass goes on through the rest of the epoch and the
/// next two with nothing repeated or skipped within a pass.
#[test]
fn a_mixture_checkpoint_resumes_at_three_ranks_and_with_new_weights() {
    let dir = tempfile::tempdir().unwrap();
    let a = source(dir.path(), "a", 10, 24, 30);
    let b = source(dir.path(), "b", 5, 12, 20);
    let a_name = path_str(&a).to_string();
    let b_name = path_str(&b).to_string();
    let d = |n: &str| dir.path().join(n);
    // 300 samples: 150 per rank; 6 batches of 8 each leave 204, 68 for each of 3 ranks.
    let state = d("state.json");
    let state = path_str(&state);
    let stop = ["--stop-after-batches", "6", "--save-state", state];
    loadgen_mix(&a, &b, "3,1", "2", &d("before.tsv"), &stop);
    loadgen_mix(&a, &b, "3,1", "2", &d("whole.tsv"), &[]);
    loadgen_mix(&a, &b, "3,1", "3", &d("after.tsv"), &["--resume", state]);
    let before = read_dump(&d("before.tsv"));
    let after = read_dump(&d("after.tsv"));
    assert_eq!(before.len(), 2 * 6 * 8);
    let mut per_rank: HashMap<u32, usize> = HashMap::new();
    for l in &after {
        *per_rank.entry(l.1).or_default() += 1;
    }
    assert!(
        per_rank.len() == 3 && per_rank.values().all(|&n| n == 68),
        "{per_rank:?}"
    );
    let mut resumed: Vec<String> = before.iter().chain(&after).map(|l| l.2.clone()).collect();
    let mut whole: Vec<String> = read_dump(&d("whole.tsv"))
        .into_iter()
        .map(|l| l.2)
        .collect();
    resumed.sort();
    whole.sort();
    assert!(
        resumed == whole,
        "the resumed epoch is not the uninterrupted one's samples"
    );

    // New weights at the checkpoint, and two more epochs under them.
    let more = ["--epochs", "3", "--resume", state];
    loadgen_mix(&a, &b, "1,1", "2", &d("reweighted.tsv"), &more);
    let reweighted = read_dump(&d("reweighted.tsv"));
    let rest: Vec<&Line> = reweighted.iter().filter(|l| l.0 == 0).collect();
    let share_a = rest.iter().filter(|l| l.3 == a_name).count() as f64 / rest.len() as f64;
    assert!(
        (share_a - 0.5).abs() <= 0.02,
        "{share_a:.3} of A after the new weights"
    );
    let mut all = steps(&before, 0, 8);
    for e in 0..3 {
        all.extend(steps(&reweighted, e, 8));
    }
    let sizes = [(a_name.as_str(), 240), (b_name.as_str(), 60)];
    assert_passes(&all, &sizes);
}

/// An epoch of 1,200 samples read in rounds of 5 batches a rank (30 rounds at 2 ranks): every
/// pass whole, the weights in every window, and the same order over a QUIC worker; a
/// checkpoint in the middle of a round and one at a round's end resume at 2 ranks with the
/// uninterrupted order, and at 3 ranks with every pass still whole.
#[test]
fn an_epoch_read_in_rounds_keeps_its_order_across_rounds_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let a = source(dir.path(), "a", 8, 30, 30);
    let b = source(dir.path(), "b", 4, 15, 20);
    let (a_name, b_name) = (path_str(&a).to_string(), path_str(&b).to_string());
    let sizes = [(a_name.as_str(), 240), (b_name.as_str(), 60)];
    let d = |n: &str| dir.path().join(n);
    let rounds = ["--epoch-samples", "1200", "--mixture-round-samples", "40"];
    let with = |more: &[&str]| -> Vec<String> {
        rounds
            .iter()
            .chain(more)
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let run = |ranks: &str, dump: &str, more: &[&str]| {
        let args = with(more);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        loadgen_mix(&a, &b, "3,1", ranks, &d(dump), &args);
        read_dump(&d(dump))
    };
    let whole = run("2", "whole.tsv", &[]);
    assert_eq!(whole.len(), 1200);
    let all = steps(&whole, 0, 8);
    for w in all.chunks(8) {
        let ids: Vec<&Line> = w.iter().flatten().collect();
        let share = ids.iter().filter(|l| l.3 == a_name).count() as f64 / ids.len() as f64;
        assert!((share - 0.75).abs() <= 0.1, "{share:.3} of A in 8 steps");
    }
    assert_passes(&all, &sizes);

    let worker = start_worker(dir.path(), "w");
    let trust = trust_file(dir.path(), &[&worker]);
    let token = d("token");
    let quic = [
        "--workers",
        worker.addr.as_str(),
        "--trust-cert",
        path_str(&trust),
        "--token-file",
        path_str(&token),
    ];
    let over_quic = run("2", "quic.tsv", &quic);
    assert!(
        over_quic == whole,
        "rounds over QUIC differ from in process"
    );

    for (stop, name) in [("23", "mid"), ("25", "end")] {
        let state = d(&format!("{name}.json"));
        let state = path_str(&state);
        let first = run(
            "2",
            &format!("{name}-before.tsv"),
            &["--stop-after-batches", stop, "--save-state", state],
        );
        let rest = run("2", &format!("{name}-after.tsv"), &["--resume", state]);
        let mut resumed = steps(&first, 0, 8);
        resumed.extend(steps(&rest, 0, 8));
        assert!(
            resumed == all,
            "resumed after {stop} batches, the order differs"
        );
        let three = run("3", &format!("{name}-three.tsv"), &["--resume", state]);
        let mut resumed = steps(&first, 0, 8);
        resumed.extend(steps(&three, 0, 8));
        let delivered: usize = resumed.iter().map(Vec::len).sum();
        assert!(1200 - delivered < 3, "{delivered} samples in the epoch");
        assert_passes(&resumed, &sizes);
    }
}

/// Peak resident memory (KiB) of a `sluice` run with `args`, read while it runs; and its
/// report.
fn peak_rss_kb(args: &[&str]) -> (u64, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        peak = peak.max(support::status_kb(child.id(), "VmHWM:"));
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{args:?} failed: {report}");
    (peak, report)
}

/// A mixture epoch of 10^9 samples (and one of 10^12) reaches its first batches in the
/// memory an epoch of 10^5 takes: the plan holds one round, not the epoch.
#[test]
fn an_epoch_of_a_billion_samples_starts_in_the_memory_of_a_small_one() {
    let dir = tempfile::tempdir().unwrap();
    let a = source(dir.path(), "a", 4, 30, 30);
    let b = source(dir.path(), "b", 2, 15, 15);
    let run = |samples: &str| {
        let started = std::time::Instant::now();
        let mut args = loadgen_of(&a, &b, "3,1");
        args.extend([
            "--epoch-samples",
            samples,
            "--workers",
            "local",
            "--batch-size",
            "16",
            "--stop-after-batches",
            "20",
            "--pipeline",
            "decode | resize 32 | center_crop 32",
        ]);
        let (peak, report) = peak_rss_kb(&args);
        assert!(report.contains("20 batches"), "{report}");
        println!(
            "epoch of {samples}: 20 batches in {:.1} s, peak RSS {} MiB",
            started.elapsed().as_secs_f64(),
            peak / 1024
        );
        peak
    };
    let small = run("100000");
    for samples in ["1000000000", "1000000000000"] {
        let huge = run(samples);
        assert!(
            huge < small + 64 * 1024,
            "an epoch of {samples} samples peaked at {} MiB, one of 10^5 at {} MiB",
            huge / 1024,
            small / 1024
        );
    }
}
