//! Configuration that goes bad for a moment costs nothing: a workers file that is junk (not
//! UTF-8), holds a bad line, or is deleted for a few seconds at a time while a job runs
//! (across epoch boundaries, when each epoch reads it afresh) leaves the job running on the
//! last good list, with `--dump-ids` identical to decoding in process. Only a job that never
//! had a list fails, and loadgen still writes its table and dump when it does.

mod support;
mod system;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use support::{path_str, succeed};
use system::bed;

fn job(dir: &Path, manifest: &Path, pool: &[&str], dump: &Path, trust: &Path) -> Command {
    let mut c = system::loadgen(manifest, pool, &dir.join("token"), trust);
    c.args([
        "--pipeline",
        "decode | resize 40 | center_crop 32",
        "--batch-size",
        "8",
    ])
    .args([
        "--step-ms",
        "20",
        "--seed",
        "9",
        "--epochs",
        "9",
        "--worker-wait",
        "10",
    ])
    .args(["--dump-ids", path_str(dump)])
    .env("RUST_LOG", "warn");
    c
}

/// A worker and a dataset of 40 samples, and the reference: the job's `--dump-ids` decoded in
/// process, which every run through the pool must equal.
fn bed_with_reference() -> (
    tempfile::TempDir,
    system::Dataset,
    system::Worker,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let (dir, data, [w], trust) = bed(40, ["w"]);
    let reference = dir.path().join("reference.txt");
    succeed(job(
        dir.path(),
        &data.manifest_path,
        &["--workers", "local"],
        &reference,
        &trust,
    ));
    (dir, data, w, trust, reference)
}

/// The bad spells, by the epochs whose end begins and ends each (the job runs epochs 0 to 8).
const SPELLS: [(u64, u64); 3] = [(0, 2), (3, 5), (6, 8)];

/// The epoch a line of loadgen's stderr says rank 0 finished (`rank 0 epoch 3: ...`).
fn epoch_done(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("rank 0 epoch ")?;
    rest.split(':').next()?.parse().ok()
}

#[test]
fn a_workers_file_that_goes_bad_for_moments_across_epochs_changes_nothing() {
    let (dir, data, w, trust, reference) = bed_with_reference();
    let manifest = &data.manifest_path;

    let file = dir.path().join("workers");
    let good = format!("# the pool\n{}\n", w.addr);
    std::fs::write(&file, &good).unwrap();
    let dump = dir.path().join("dump.txt");
    let pool = [
        "--workers-file",
        path_str(&file),
        "--workers-refresh",
        "0.1",
    ];
    let mut job = job(dir.path(), manifest, &pool, &dump, &trust)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The spells follow the job's epochs, not the clock: each begins when the job says an
    // epoch ended and lasts until two more have, so the epoch after them starts inside it
    // (started early, it begins while the one before drains) on a machine of any speed.
    let stderr = job.stderr.take().unwrap();
    let flipper = std::thread::spawn(move || {
        let spells: [&dyn Fn(&Path); 3] = [
            &|f| std::fs::write(f, b"\xff\xfe\x00 not text \xc3\x28").unwrap(),
            &|f| std::fs::write(f, "cpu-7 7100\n").unwrap(),
            &|f| std::fs::remove_file(f).unwrap(),
        ];
        let (mut spells_done, mut lines) = (0, Vec::new());
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(epoch) = epoch_done(&line) {
                match SPELLS.iter().position(|&(from, _)| from == epoch) {
                    Some(i) => spells[i](&file),
                    None if SPELLS.iter().any(|&(_, to)| to == epoch) => {
                        std::fs::write(&file, &good).unwrap();
                        spells_done += 1;
                    }
                    None => {}
                }
            }
            lines.push(line);
        }
        (spells_done, lines.join("\n"))
    });
    let status = job.wait().unwrap();
    let (spells, stderr) = flipper.join().unwrap();
    assert!(
        status.success(),
        "the job failed for a workers file blip:\n{stderr}"
    );
    assert!(
        spells >= 3,
        "only {spells} bad spells happened while the job ran"
    );
    assert!(
        stderr.contains("the workers' source") && stderr.contains("stay"),
        "the blips went unsaid:\n{stderr}"
    );
    // One warning per change of state, not one per read (the file is read ten times a
    // second).
    let warnings = stderr.matches("the workers' source:").count();
    assert!(
        warnings <= 2 * spells + 2,
        "{warnings} warnings for {spells} spells:\n{stderr}"
    );
    assert!(
        std::fs::read_to_string(&dump).unwrap() == std::fs::read_to_string(&reference).unwrap(),
        "the batches changed while the workers file blipped"
    );
}

#[test]
fn a_job_that_never_had_a_list_fails_and_still_writes_its_table_and_dump() {
    let (dir, data, [_w], trust) = bed(40, ["w"]);
    let file = dir.path().join("workers");
    std::fs::write(&file, "cpu-7 7100\n").unwrap();
    let dump = dir.path().join("dump.txt");
    let json = dir.path().join("report.json");
    let out = job(
        dir.path(),
        &data.manifest_path,
        &["--workers-file", path_str(&file)],
        &dump,
        &trust,
    )
    .args(["--json", path_str(&json)])
    .output()
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success());
    assert!(
        stderr.contains("workers_file") && stderr.contains("line 1"),
        "{stderr}"
    );
    assert!(stdout.contains("delivered"), "no table:\n{stdout}");
    assert!(dump.exists(), "no --dump-ids");
    assert!(json.exists(), "no --json");
}

/// A worker listed in the pool that never answers (nothing listens at its port) is said once,
/// with its address, and counted; the job runs on the other worker with every batch the
/// in-process engine's.
#[test]
fn a_listed_worker_that_never_answers_is_said_once_and_the_job_runs_on_the_others() {
    let (dir, data, w, trust, reference) = bed_with_reference();
    let manifest = &data.manifest_path;
    // A port nothing listens on: bound for a moment, then let go.
    let dead = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let pool = format!("{},{dead}", w.addr);
    let dump = dir.path().join("dump.txt");
    let out = job(dir.path(), manifest, &["--workers", &pool], &dump, &trust)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("never answered"))
        .collect();
    assert_eq!(said.len(), 1, "one warning in 9 epochs:\n{stderr}");
    assert!(said[0].contains(&dead), "{}", said[0]);
    assert!(
        std::fs::read_to_string(&dump).unwrap() == std::fs::read_to_string(&reference).unwrap(),
        "the batches changed beside a worker that never answered"
    );
}
