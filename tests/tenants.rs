//! Teams sharing one `sluice cpu` worker, each with its own token (`--tenants`), tried from
//! outside as a hostile team would: real `sluice loadgen` processes against a real worker,
//! read through its `/metrics`. A team's token decides its jobs' names and weights, so a job
//! named like another team's stays its own team's, at its own team's weight cap; a token of
//! no team is refused.

mod support;
mod system;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::path_str;
use system::{
    dataset, loadgen, metric, metrics_text, series_value, start_worker_with, trust_file, Worker,
    TOKEN,
};

const PIPELINE: &str = "decode | random_resized_crop 32";

/// The tenants file: team-a (weights up to 3) and team-b (up to 2), each token in its own
/// owner-only file beside it.
fn tenants(dir: &Path) -> PathBuf {
    for (team, token) in [("a", "team-a-token-1"), ("b", "team-b-token-2")] {
        let path = dir.join(format!("team-{team}.token"));
        std::fs::write(&path, format!("{token}\n")).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    }
    let file = dir.join("tenants.toml");
    std::fs::write(
        &file,
        "[[tenant]]\nname = \"team-a\"\ntoken_file = \"team-a.token\"\nmax_weight = 3\n\n\
         [[tenant]]\nname = \"team-b\"\ntoken_file = \"team-b.token\"\nmax_weight = 2\n",
    )
    .unwrap();
    file
}

/// A loadgen job on `token_file` asking to be `name` at `weight`, for `epochs` epochs.
fn job(
    data: &Path,
    worker: &Worker,
    trust: &Path,
    token_file: &Path,
    (name, weight): (&str, u32),
    epochs: u32,
) -> Command {
    let mut c = loadgen(data, &["--workers", &worker.addr], token_file, trust);
    c.args([
        "--pipeline",
        PIPELINE,
        "--batch-size",
        "8",
        "--credits",
        "16",
    ])
    .args(["--epochs", &epochs.to_string(), "--worker-wait", "5"])
    .args(["--job-name", name, "--job-weight", &weight.to_string()]);
    c
}

fn wait_for(worker: &Worker, series: &str) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = metric(worker, series) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "no {series} in the worker's metrics"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stop(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

#[test]
fn a_teams_token_decides_its_jobs_names_and_weights_and_no_team_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 40);
    let file = tenants(dir.path());
    let worker = start_worker_with(
        dir.path(),
        "w",
        &["--no-same-host", "--tenants", path_str(&file)],
    );
    assert!(worker.log_shows("tenants team-a, team-b", Duration::from_secs(10)));
    let trust = trust_file(dir.path(), &[&worker]);
    let run = |team: &str, name: &str, weight: u32| {
        let token = dir.path().join(format!("team-{team}.token"));
        job(
            &data.manifest_path,
            &worker,
            &trust,
            &token,
            (name, weight),
            10_000,
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
    };
    // Team A's job, then team B's named like it and asking for far more weight.
    let a = run("a", "resnet", 3);
    assert_eq!(
        wait_for(&worker, "sluice_cpu_job_weight{job=\"team-a/resnet\"}"),
        3.0
    );
    let b = run("b", "resnet", 16);
    assert_eq!(
        wait_for(&worker, "sluice_cpu_job_weight{job=\"team-b/resnet\"}"),
        2.0
    );
    // Even a name that spells out team A's stays under team B, at team B's cap.
    let b2 = run("b", "team-a/resnet", 16);
    let b2_weight = "sluice_cpu_job_weight{job=\"team-b/team-a/resnet\"}";
    assert_eq!(wait_for(&worker, b2_weight), 2.0);
    assert_eq!(
        metric(&worker, "sluice_cpu_job_weight{job=\"team-a/resnet\"}"),
        Some(3.0),
        "team A's job keeps its weight"
    );
    let samples = |job: &str| {
        metric(
            &worker,
            &format!("sluice_cpu_job_samples_total{{job=\"{job}\"}}"),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while samples("team-b/resnet").is_none() || samples("team-a/resnet").is_none() {
        assert!(
            Instant::now() < deadline,
            "both teams' jobs should be sent samples"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = metrics_text(&worker);
    assert!(
        !text.contains("job=\"resnet\""),
        "no job runs under the bare name it asked for:\n{text}"
    );
    for c in [a, b, b2] {
        stop(c);
    }

    // A client is told the weight its job runs at when it is capped.
    let token = dir.path().join("team-b.token");
    let out = job(
        &data.manifest_path,
        &worker,
        &trust,
        &token,
        ("told", 16),
        1,
    )
    .env("RUST_LOG", "info")
    .output()
    .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let told: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("lower weight"))
        .collect();
    assert_eq!(told.len(), 1, "{said}");
    assert!(
        told[0].contains("asked=16") && told[0].contains("weight=2"),
        "{}",
        told[0]
    );

    // The cluster token of a worker without tenants, and a made-up one: refused by name.
    let stranger = dir.path().join("stranger.token");
    for token in [TOKEN, "guess"] {
        std::fs::write(&stranger, format!("{token}\n")).unwrap();
        let out = job(&data.manifest_path, &worker, &trust, &stranger, ("x", 1), 1)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a token of no tenant was let in");
        assert!(stderr.contains("wrong tenant token"), "{stderr}");
    }
}

#[test]
fn a_bad_tenants_file_stops_the_worker_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    std::fs::write(dir.path().join("a.token"), "same\n").unwrap();
    std::fs::write(dir.path().join("b.token"), "same\n").unwrap();
    let both = "[[tenant]]\nname = \"a\"\ntoken_file = \"a.token\"\n\n\
                [[tenant]]\nname = \"b\"\ntoken_file = \"b.token\"\n";
    for (text, says) in [
        (both, "the same token"),
        (
            "[[tenant]]\nname = \"Team A\"\ntoken_file = \"a.token\"\n",
            "\"Team A\"",
        ),
        (
            "[[tenant]]\nname = \"a\"\ntoken_file = \"missing\"\n",
            "missing",
        ),
        (
            "[[tenant]]\nname = \"a\"\ntokenfile = \"a.token\"\n",
            "tokenfile",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([
                "cpu",
                "--listen",
                "127.0.0.1:0",
                "--no-same-host",
                "--tenants",
            ])
            .arg(&file)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}");
        assert!(stderr.contains(says), "{says}: {stderr}");
    }
}

/// Each named job's samples sent so far (0 for a job not seen yet).
fn sent(worker: &Worker, jobs: &[String]) -> Vec<f64> {
    let text = metrics_text(worker);
    jobs.iter()
        .map(|j| {
            let series = format!("sluice_cpu_job_samples_total{{job=\"{j}\"}}");
            series_value(&text, &series).unwrap_or(0.0)
        })
        .collect()
}

/// Each job's share of the next `samples` samples the worker sends them, once every one of
/// them has been sent some: a count, not a time, so a slow machine only takes longer.
fn shares(worker: &Worker, jobs: &[String], samples: f64) -> Vec<f64> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while sent(worker, jobs).contains(&0.0) {
        assert!(Instant::now() < deadline, "{jobs:?} never all ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = sent(worker, jobs);
    loop {
        let got: Vec<f64> = sent(worker, jobs)
            .iter()
            .zip(&before)
            .map(|(a, b)| a - b)
            .collect();
        let total: f64 = got.iter().sum();
        if total >= samples {
            return got.iter().map(|g| g / total).collect();
        }
        assert!(Instant::now() < deadline, "too few samples sent: {got:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A team's share of a worker is one share, however many jobs it opens: alpha (max_weight 8)
/// with one greedy job against beta (max_weight 2) with four keeps 8/10 of a busy one-thread
/// worker, not the 8/16 per-job queuing gave; a third team joining takes its share from both.
#[test]
fn a_team_that_opens_more_jobs_gets_no_larger_share() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 40);
    let mut text = String::new();
    for (team, weight) in [("alpha", 8), ("beta", 2), ("gamma", 10)] {
        let path = dir.path().join(format!("{team}.token"));
        std::fs::write(&path, format!("{team}-token-of-this-test\n")).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        text += &format!(
            "[[tenant]]\nname = \"{team}\"\ntoken_file = \"{team}.token\"\nmax_weight = \
             {weight}\n\n"
        );
    }
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, text).unwrap();
    let worker = start_worker_with(
        dir.path(),
        "w",
        &["--no-same-host", "--tenants", path_str(&file)],
    );
    let trust = trust_file(dir.path(), &[&worker]);
    let run = |team: &str, name: &str, weight: u32| {
        let token = dir.path().join(format!("{team}.token"));
        loadgen(
            &data.manifest_path,
            &["--workers", &worker.addr],
            &token,
            &trust,
        )
        .args([
            "--pipeline",
            PIPELINE,
            "--batch-size",
            "8",
            "--credits",
            "512",
        ])
        .args(["--epochs", "10000", "--worker-wait", "5"])
        .args(["--job-name", name, "--job-weight", &weight.to_string()])
        // Same data, pipeline and seed make a sweep, whose jobs share decodes
        // (tests/sweeps.rs); these stand for different trainings.
        .arg("--no-share")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
    };
    let mut jobs = vec![run("alpha", "train", 8)];
    let mut names = vec!["alpha/train".to_string()];
    for j in 0..4 {
        jobs.push(run("beta", &format!("sweep-{j}"), 2));
        names.push(format!("beta/sweep-{j}"));
    }
    let s = shares(&worker, &names, 1500.0);
    let alpha = s[0];
    eprintln!("alpha (8, one job) and beta (2, four jobs): {s:.3?}");
    assert!(
        alpha >= 0.72,
        "alpha's share {alpha:.3} against beta's four jobs: {s:?}"
    );
    // A third team at weight 10 takes half; alpha and beta keep 4:1 between them.
    jobs.push(run("gamma", "eval", 1));
    names.push("gamma/eval".to_string());
    let s = shares(&worker, &names, 2000.0);
    let beta: f64 = s[1..5].iter().sum();
    eprintln!("with gamma (10, one job of weight 1): {s:.3?}");
    for c in jobs {
        stop(c);
    }
    assert!((0.4..=0.6).contains(&s[5]), "gamma's share: {s:?}");
    assert!(
        s[0] / (s[0] + beta) >= 0.72,
        "alpha against beta with gamma there: {s:?}"
    );
}

/// Tenants rotated while a job runs, as an operator does on Kubernetes (a changed Secret, a
/// changed ConfigMap) and nothing restarted: the worker reads the tenants file again. A team
/// added is admitted, a removed team's new handshake is refused, and team A's job, admitted
/// before, runs every epoch to its end, each sample exactly once; a junk tenants file keeps
/// the last good set (said once, and shown on /metrics).
#[test]
fn tenants_rotated_while_a_job_runs_take_effect_without_a_restart() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 40);
    for team in ["a", "b", "c"] {
        std::fs::write(
            dir.path().join(format!("team-{team}.token")),
            format!("team-{team}-token-rotation\n"),
        )
        .unwrap();
    }
    let table = |team: &str| {
        format!("[[tenant]]\nname = \"team-{team}\"\ntoken_file = \"team-{team}.token\"\n\n")
    };
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, table("a") + &table("b")).unwrap();
    let worker = start_worker_with(
        dir.path(),
        "w",
        &["--no-same-host", "--tenants", path_str(&file)],
    );
    let trust = trust_file(dir.path(), &[&worker]);

    // Team A's job, epoch after epoch until the rotation is done, then two more.
    let rotated = Arc::new(AtomicBool::new(false));
    let running = system::epochs_until(
        sluice_client::Loader::builder()
            .dataset(data.manifest.clone())
            .token("team-a-token-rotation")
            .trust_cert(&trust)
            .same_host(sluice_client::SameHost::Off)
            .workers(vec![worker.addr.clone()])
            .pipeline(PIPELINE.into())
            .batch_size(8)
            .job_name("long"),
        data.manifest.clone(),
        rotated.clone(),
    );
    wait_for(&worker, "sluice_cpu_job_samples_total{job=\"team-a/long\"}");

    let one_epoch = |team: &str| {
        job(
            &data.manifest_path,
            &worker,
            &trust,
            &dir.path().join(format!("team-{team}.token")),
            ("short", 1),
            1,
        )
        .output()
        .unwrap()
    };
    // Replaced whole, as Kubernetes swaps a mounted file (a re-read never sees half of it).
    let replace = |text: &str| {
        let tmp = dir.path().join("tenants.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    };
    // Team C in, team B out.
    replace(&(table("a") + &table("c")));
    assert!(
        worker.log_shows("tenants team-a, team-c", Duration::from_secs(30)),
        "the worker never read the new tenants file"
    );
    let c = one_epoch("c");
    assert!(c.status.success(), "team C was not admitted: {c:?}");
    let b = one_epoch("b");
    assert!(!b.status.success(), "team B's removed token was admitted");
    assert!(String::from_utf8_lossy(&b.stderr).contains("wrong tenant token"));

    // A junk tenants file: the set in force stays, said once and shown.
    replace("[[tenant]\nname = ");
    assert!(
        worker.log_shows("keeping the tenants", Duration::from_secs(30)),
        "a broken tenants file went unsaid"
    );
    assert_eq!(
        metric(&worker, "sluice_cpu_admission_config_broken"),
        Some(1.0)
    );
    let c = one_epoch("c");
    assert!(c.status.success(), "the last good set was dropped: {c:?}");
    rotated.store(true, Ordering::SeqCst);
    let epochs = running.join().expect("team A's job failed");
    assert!(epochs >= 2, "team A's job ran {epochs} epochs");
    let warnings = worker
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("keeping the tenants"))
        .count();
    assert_eq!(warnings, 1, "a file that stays broken is said once");
}
