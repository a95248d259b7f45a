//! Several training jobs on one `sluice cpu` worker share its decode slots fairly by weight,
//! measured from outside: real `sluice loadgen` processes (each a job of its own name) against
//! one real worker over QUIC, and the worker's per-job sample counters
//! (`sluice_cpu_job_samples_total{job=...}`) read from its `/metrics` while they all run.

mod support;
mod system;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use system::{bed, loadgen, metrics_text, series_value, Worker};

const PIPELINE: &str = "decode | random_resized_crop 64 | hflip 0.5";

/// Samples in flight a greedy job asks for, and a light one.
const GREEDY: u32 = 512;
const LIGHT: u32 = 16;

/// A job of `name` and `weight` that reads for as long as it lives, with `credits` samples in
/// flight.
fn job(
    data: &Path,
    dir: &Path,
    worker: &Worker,
    trust: &Path,
    name: &str,
    weight: u32,
    credits: u32,
) -> Child {
    let token = dir.join("token");
    loadgen(data, &["--workers", &worker.addr], &token, trust)
        .args([
            "--pipeline",
            PIPELINE,
            "--batch-size",
            "8",
            "--epochs",
            "10000",
        ])
        .args(["--credits", &credits.to_string(), "--job-name", name])
        .args(["--job-weight", &weight.to_string()])
        // Same data, pipeline and seed make a sweep, whose jobs share decodes
        // (tests/sweeps.rs); these stand for different trainings.
        .arg("--no-share")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Samples the worker sent each named job so far.
fn sent(worker: &Worker, names: &[&str]) -> Vec<f64> {
    let text = metrics_text(worker);
    names
        .iter()
        .map(|n| {
            let series = format!("sluice_cpu_job_samples_total{{job=\"{n}\"}}");
            text.lines()
                .filter(|l| l.starts_with(&series))
                .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                .sum()
        })
        .collect()
}

/// Waits until every named job has been sent samples.
fn wait_running(worker: &Worker, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while sent(worker, names).contains(&0.0) {
        assert!(Instant::now() < deadline, "{names:?} never all ran");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each job's share of the samples the worker sent over `window`, while all of them run.
fn shares(worker: &Worker, names: &[&str], window: Duration) -> Vec<f64> {
    let before = sent(worker, names);
    std::thread::sleep(window);
    let after = sent(worker, names);
    let got: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let total: f64 = got.iter().sum();
    assert!(total > 100.0, "too few samples to measure: {got:?}");
    got.iter().map(|g| g / total).collect()
}

fn stop(jobs: Vec<Child>) {
    for mut j in jobs {
        let _ = j.kill();
        let _ = j.wait();
    }
}

#[test]
fn jobs_share_a_worker_by_weight_and_a_late_one_gets_its_share_at_once() {
    let (dir, data, [worker], trust) = bed(40, ["w"]);
    let run = |name: &str, weight: u32, credits: u32| {
        job(
            &data.manifest_path,
            dir.path(),
            &worker,
            &trust,
            name,
            weight,
            credits,
        )
    };

    // Equal weights: a job with 512 samples in flight and one with 16 get half each.
    let jobs = vec![run("greedy", 1, GREEDY), run("light", 1, LIGHT)];
    wait_running(&worker, &["greedy", "light"]);
    let s = shares(&worker, &["greedy", "light"], Duration::from_secs(4));
    eprintln!("equal weights, greedy and light: {s:.3?}");
    stop(jobs);
    assert!((0.4..=0.6).contains(&s[1]), "the light job's share: {s:?}");

    // Weights 3:1, and a third job of weight 1 that joins later: 3/4 of the worker, then
    // 3/5 : 1/5 : 1/5 within a few seconds of the third's start.
    let mut jobs = vec![run("greedy-3", 3, GREEDY), run("light-1", 1, LIGHT)];
    wait_running(&worker, &["greedy-3", "light-1"]);
    let s = shares(&worker, &["greedy-3", "light-1"], Duration::from_secs(4));
    eprintln!("weights 3:1: {s:.3?}");
    assert!((0.65..=0.85).contains(&s[0]), "weight 3 against 1: {s:?}");
    jobs.push(run("late-1", 1, LIGHT));
    let names = ["greedy-3", "light-1", "late-1"];
    wait_running(&worker, &names);
    let s = shares(&worker, &names, Duration::from_secs(3));
    eprintln!("weights 3:1:1 after the third joined: {s:.3?}");
    // What an autoscaler reads: the slots, and units queued for them (three busy jobs on two
    // slots keep some waiting).
    let text = metrics_text(&worker);
    let gauge = |name: &str| -> f64 {
        series_value(&text, name).unwrap_or_else(|| panic!("no {name} in the worker's metrics"))
    };
    assert_eq!(gauge("sluice_cpu_unit_slots"), 2.0);
    let per_slot = gauge("sluice_cpu_units_waiting_per_slot");
    eprintln!("units waiting per slot with three busy jobs: {per_slot}");
    assert!(
        per_slot > 0.0,
        "three busy jobs on two slots leave none waiting?"
    );
    stop(jobs);
    assert!((0.1..=0.3).contains(&s[2]), "the late job's share: {s:?}");
    assert!((0.5..=0.7).contains(&s[0]), "weight 3 of 5: {s:?}");
}
