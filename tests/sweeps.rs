//! Sweeps that share one decode, from outside: real `sluice loadgen` jobs of one team with the
//! same data, pipeline and seed against real `sluice cpu` workers (one decode thread), read
//! through the workers' `/metrics` and `/proc`. Each job still gets every sample exactly once
//! in its own order (its `--dump-ids` equals its solo run's, line for line), a job with
//! another seed or of another team gets nothing of theirs, and a worker killed mid-sweep costs
//! no job a sample.

mod support;
mod system;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::path_str;
use system::{dataset, loadgen, metric, start_worker_with, trust_file, Dataset, Worker};

const PIPELINE: &str = "decode | random_resized_crop 32 | hflip 0.5";
/// Long enough that a job started 2 s after the others still finds them running.
const EPOCHS: &str = "4";

/// A job of the sweep: `name`, seed `seed`, its ids dumped to `dump`.
fn job(
    data: &Dataset,
    pool: &[&Worker],
    (token, trust): (&Path, &Path),
    (name, seed): (&str, u64),
    dump: &Path,
) -> Command {
    let addrs = pool
        .iter()
        .map(|w| w.addr.clone())
        .collect::<Vec<_>>()
        .join(",");
    let mut c = loadgen(&data.manifest_path, &["--workers", &addrs], token, trust);
    sweep_job(&mut c, (name, seed), dump);
    c
}

/// What every job of the sweep asks for: `name`, seed `seed`, its ids dumped to `dump`.
fn sweep_job(c: &mut Command, (name, seed): (&str, u64), dump: &Path) {
    c.args(["--pipeline", PIPELINE, "--batch-size", "16"])
        .args(["--epochs", EPOCHS, "--seed", &seed.to_string()])
        .args(["--job-name", name, "--worker-wait", "10"])
        .args(["--dump-ids", path_str(dump)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
}

fn finish(name: &str, child: Child) {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run(name: &str, mut c: Command) {
    finish(name, c.spawn().unwrap());
}

/// The value of the unlabelled series `name` on `worker`'s `/metrics`.
fn value(worker: &Worker, name: &str) -> f64 {
    metric(worker, name).unwrap_or_else(|| panic!("no {name} on the worker's /metrics"))
}

/// Waits until `worker` serves no client: jobs that finished are closed there too, so a job
/// started next cannot meet them.
fn idle(worker: &Worker) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while value(worker, "sluice_cpu_connections") > 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker still serves clients that ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The worker's samples served from a sweep's decodes, decodes kept for one, and samples
/// taken from another job's read.
fn share_counts(worker: &Worker) -> (f64, f64, f64) {
    (
        value(worker, "sluice_cpu_share_hits_total"),
        value(worker, "sluice_cpu_share_kept_total"),
        value(worker, "sluice_cpu_share_read_samples_total"),
    )
}

/// The CPU time the worker's process has used, in clock ticks (utime + stime).
fn cpu_ticks(worker: &Worker) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", worker.child.id())).unwrap();
    // After the command name's closing parenthesis: fields 3 onward; utime and stime are the
    // 14th and 15th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

fn token(dir: &Path) -> PathBuf {
    dir.join("token")
}

/// A temporary directory, the dataset (100 samples a shard) and a worker serving QUIC.
struct Bed {
    dir: tempfile::TempDir,
    data: Dataset,
    worker: Worker,
    trust: PathBuf,
    token: PathBuf,
}

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let data = dataset(dir.path(), 100);
        let worker = start_worker_with(dir.path(), "w", &["--no-same-host"]);
        let trust = trust_file(dir.path(), &[&worker]);
        let token = token(dir.path());
        Bed {
            dir,
            data,
            worker,
            trust,
            token,
        }
    }
}

#[test]
fn a_sweep_decodes_once_and_each_job_keeps_its_own_order() {
    let bed = Bed::new();
    let (d, data, worker) = (bed.dir.path(), &bed.data, &bed.worker);
    let auth = (bed.token.as_path(), bed.trust.as_path());
    let pool = [worker];

    // One job alone: its order, and what the worker spends on it.
    let before = cpu_ticks(worker);
    run("solo", job(data, &pool, auth, ("solo", 7), &d.join("solo")));
    let alone = cpu_ticks(worker) - before;
    let samples = read(&d.join("solo")).lines().count() as f64;
    assert_eq!(
        share_counts(worker),
        (0.0, 0.0, 0.0),
        "a job alone shares nothing"
    );

    // The sweep: three jobs together, a fourth 2 s later.
    let before = cpu_ticks(worker);
    let mut sweep: Vec<(String, Child)> = (1..=3)
        .map(|i| {
            let name = format!("lr-{i}");
            let child = job(data, &pool, auth, (&name, 7), &d.join(&name))
                .spawn()
                .unwrap();
            (name, child)
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let late = job(data, &pool, auth, ("lr-late", 7), &d.join("lr-late"));
    sweep.push(("lr-late".into(), { late }.spawn().unwrap()));
    for (name, child) in sweep {
        finish(&name, child);
    }
    let shared = cpu_ticks(worker) - before;
    let solo = read(&d.join("solo"));
    for name in ["lr-1", "lr-2", "lr-3", "lr-late"] {
        assert!(
            read(&d.join(name)) == solo,
            "{name}: its samples, in its order, are its solo run's"
        );
    }
    let (hits, kept, reads) = share_counts(worker);
    eprintln!(
        "sweep of 4: worker CPU {shared} ticks against {alone} for one job alone ({:.2}x); \
         {kept} decodes kept for the sweep, {hits} samples served from them, of {samples} a \
         job; {reads} samples taken from another job's read",
        shared as f64 / alone.max(1) as f64
    );
    // Each sample decoded at most once for the four and kept, and most of the others'
    // samples served from those decodes (those a job asked for before the others had opened
    // are decoded alone): without sharing, nothing is served and the worker decodes
    // 4 x samples.
    assert!(kept <= samples, "{kept} decodes kept for {samples} samples");
    assert!(
        hits >= 1.5 * samples,
        "{hits} samples served from {kept} kept decodes, for four jobs of {samples} samples"
    );
    // The three started together read their units together (which of them reads each sample
    // first is up to the threads; that some samples were not read again is not).
    assert!(
        reads > 0.0,
        "no sample of the sweep was read once for several jobs"
    );

    // A job with another seed beside one of the sweep's: its own tensors, its own order.
    idle(worker);
    let before = share_counts(worker);
    let other = job(data, &pool, auth, ("other", 8), &d.join("other"))
        .spawn()
        .unwrap();
    let again = job(data, &pool, auth, ("again", 7), &d.join("again"))
        .spawn()
        .unwrap();
    finish("other", other);
    finish("again", again);
    run(
        "other alone",
        job(
            data,
            &pool,
            auth,
            ("other-alone", 8),
            &d.join("other-alone"),
        ),
    );
    assert_eq!(read(&d.join("other")), read(&d.join("other-alone")));
    assert_eq!(read(&d.join("again")), solo);
    assert_ne!(read(&d.join("other")), solo);
    assert_eq!(
        before,
        share_counts(worker),
        "two jobs with different seeds share nothing"
    );

    // --no-share: decoded alone, though a sweep runs beside it.
    idle(worker);
    let a = job(data, &pool, auth, ("a", 7), &d.join("a"))
        .spawn()
        .unwrap();
    let mut c = job(data, &pool, auth, ("b", 7), &d.join("b"));
    c.arg("--no-share");
    let b = c.spawn().unwrap();
    finish("a", a);
    finish("b", b);
    assert_eq!(read(&d.join("b")), solo);
    assert_eq!(
        before,
        share_counts(worker),
        "a job that opts out neither takes nor keeps"
    );
}

/// team-a and team-b, each token in its own owner-only file; `group` puts both in one share
/// group.
fn tenants(dir: &Path, group: bool) -> PathBuf {
    for team in ["a", "b"] {
        let path = dir.join(format!("team-{team}.token"));
        std::fs::write(&path, format!("team-{team}-token-77\n")).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    }
    let grouped = if group {
        "share_group = \"vision\"\n"
    } else {
        ""
    };
    let file = dir.join("tenants.toml");
    let text = format!(
        "[[tenant]]\nname = \"team-a\"\ntoken_file = \"team-a.token\"\n{grouped}\n\
         [[tenant]]\nname = \"team-b\"\ntoken_file = \"team-b.token\"\n{grouped}"
    );
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn teams_share_decodes_only_where_the_tenants_file_groups_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = dataset(d, 100);
    let file = tenants(d, false);
    let worker = start_worker_with(d, "w", &["--no-same-host", "--tenants", path_str(&file)]);
    let trust = trust_file(d, &[&worker]);
    let pool = [&worker];
    let both = |round: &str| {
        let jobs: Vec<(String, Child)> = ["a", "b"]
            .iter()
            .map(|team| {
                let token = d.join(format!("team-{team}.token"));
                let name = format!("{round}-{team}");
                let c = job(&data, &pool, (&token, &trust), (&name, 7), &d.join(&name));
                (name, { c }.spawn().unwrap())
            })
            .collect();
        for (name, child) in jobs {
            finish(&name, child);
        }
        assert_eq!(
            read(&d.join(format!("{round}-a"))),
            read(&d.join(format!("{round}-b")))
        );
    };
    both("apart");
    assert_eq!(
        share_counts(&worker),
        (0.0, 0.0, 0.0),
        "two teams with the same data, pipeline and seed share nothing by default, reads \
         included"
    );
    // The operator groups them; the worker reads the file again while it serves.
    tenants(d, true);
    assert!(
        worker.log_shows("admission re-read", Duration::from_secs(30)),
        "the tenants file was not read again"
    );
    both("grouped");
    assert!(
        value(&worker, "sluice_cpu_share_hits_total") > 0.0,
        "teams of one share group share their sweeps' decodes"
    );
}

#[test]
fn a_worker_killed_mid_sweep_leaves_every_job_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = dataset(d, 50);
    let mut a = start_worker_with(d, "a", &["--no-same-host"]);
    let b = start_worker_with(d, "b", &["--no-same-host"]);
    let trust = trust_file(d, &[&a, &b]);
    let tok = token(d);
    let auth = (tok.as_path(), trust.as_path());
    run(
        "solo",
        job(&data, &[&a, &b], auth, ("solo", 7), &d.join("solo")),
    );
    let sweep: Vec<(String, Child)> = (1..=3)
        .map(|i| {
            let name = format!("lr-{i}");
            let c = job(&data, &[&a, &b], auth, (&name, 7), &d.join(&name));
            (name, { c }.spawn().unwrap())
        })
        .collect();
    assert!(a.log_shows("job", Duration::from_secs(30)));
    std::thread::sleep(Duration::from_millis(700));
    a.kill9();
    // loadgen fails its run on any sample missing or repeated; the order is the plan's,
    // whichever worker delivered.
    for (name, child) in sweep {
        finish(&name, child);
        assert!(
            read(&d.join(&name)) == read(&d.join("solo")),
            "{name}: its order, whatever failed"
        );
    }
    assert!(value(&b, "sluice_cpu_share_hits_total") > 0.0);
}

#[test]
fn a_same_host_sweep_writes_one_decode_into_each_jobs_own_batches() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = dataset(d, 100);
    let sockets = d.join("sockets");
    let worker = start_worker_with(d, "w", &["--same-host-dir", path_str(&sockets)]);
    let trust = trust_file(d, &[&worker]);
    let tok = token(d);
    // Each job's samples go straight into its own batches in its own memory (its arena).
    let same_host = |name: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
        c.args(["loadgen", "--dataset", path_str(&data.manifest_path)])
            .args(["--workers", &worker.addr, "--token-file", path_str(&tok)])
            .args(["--trust-cert", path_str(&trust), "--same-host", "require"])
            .args(["--same-host-dir", path_str(&sockets)]);
        sweep_job(&mut c, (name, 7), &d.join(name));
        c
    };
    run("solo", same_host("solo"));
    let jobs: Vec<(&str, Child)> = ["lr-1", "lr-2", "lr-3"]
        .into_iter()
        .map(|name| (name, same_host(name).spawn().unwrap()))
        .collect();
    for (name, child) in jobs {
        finish(name, child);
        assert!(read(&d.join(name)) == read(&d.join("solo")), "{name}");
    }
    let (kept, hits) = (
        value(&worker, "sluice_cpu_share_kept_total"),
        value(&worker, "sluice_cpu_share_hits_total"),
    );
    assert!(kept > 0.0 && hits >= kept, "{kept} kept, {hits} served");
    assert!(value(&worker, "sluice_cpu_placed_samples_total") > 0.0);
}

#[test]
fn a_job_resumed_mid_epoch_beside_its_sweep_gets_exactly_the_rest_in_order() {
    let bed = Bed::new();
    let (d, data, worker) = (bed.dir.path(), &bed.data, &bed.worker);
    let auth = (bed.token.as_path(), bed.trust.as_path());
    let pool = [worker];
    run("solo", job(data, &pool, auth, ("solo", 7), &d.join("solo")));
    // A job stopped after 10 batches of its first epoch, its checkpoint saved ...
    let state = d.join("state.json");
    let mut first = job(data, &pool, auth, ("resumed", 7), &d.join("first"));
    first.args([
        "--stop-after-batches",
        "10",
        "--save-state",
        path_str(&state),
    ]);
    run("first part", first);
    // ... resumes while another job of its sweep runs from the start: it shares where their
    // positions meet, and gets exactly the rest of its run, in its order.
    let other = job(data, &pool, auth, ("other", 7), &d.join("other"))
        .spawn()
        .unwrap();
    let mut rest = job(data, &pool, auth, ("resumed", 7), &d.join("rest"));
    rest.args(["--resume", path_str(&state)]);
    run("rest", rest);
    finish("other", other);
    let solo = read(&d.join("solo"));
    assert_eq!(read(&d.join("first")).lines().count(), 160);
    assert!(
        read(&d.join("first")) + &read(&d.join("rest")) == solo,
        "the first part and the rest are the uninterrupted run"
    );
    assert!(read(&d.join("other")) == solo);
}
