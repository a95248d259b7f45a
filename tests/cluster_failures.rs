//! Failures across the tiers: workers killed with SIGKILL at random points of an epoch (and
//! one stopped with SIGTERM) lose and repeat nothing; refused tokens and untrusted
//! certificates fail clearly on both sides; no worker at all is an error, not a hang; and the
//! in-process mode needs no daemon and reports bad samples without breaking equal steps.

mod support;
mod system;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_client::{Loader, ShortBatch};
use support::{path_str, signal, synth_images};
use system::{
    assert_exactly_once, bed, dataset, planned, start_worker, trust_file, SMALL_BATCHES, TOKEN,
};

fn loader(
    data: &system::Dataset,
    workers: Vec<String>,
    trust: &std::path::Path,
    token: &str,
) -> Loader {
    Loader::builder()
        .dataset(data.manifest.clone())
        .workers(workers)
        .token(token)
        .trust_cert(trust)
        .pipeline("decode | random_resized_crop 64".into())
        .batch_size(8)
        .max_unit_samples(64)
        // A narrow mixing window and lookahead keep workers from decoding the whole epoch
        // ahead of the consumer, so a kill mid-epoch lands on units still in flight.
        .mixing(sluice_client::Mixing {
            window_units: 2,
            buffer_samples: 16,
        })
        .lookahead(16)
        .heartbeat(Duration::from_millis(300))
        .silence(Duration::from_millis(1500))
        .worker_wait(Duration::from_secs(20))
        .seed(5)
        .build()
        .unwrap()
}

#[test]
fn killed_and_stopped_workers_lose_and_repeat_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 60);
    let mut workers = [start_worker(dir.path(), "a"), start_worker(dir.path(), "b")];
    // Kill points as fractions of the epoch, from a fixed seed so a failure can be replayed.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..4u64 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let victim = (round % 2) as usize;
        let trust = trust_file(dir.path(), &[&workers[0], &workers[1]]);
        let l = loader(
            &data,
            workers.iter().map(|w| w.addr.clone()).collect(),
            &trust,
            TOKEN,
        );
        let batches = l.batches_per_epoch();
        let kill_at = 2 + state % (batches / 2);
        let mut got = Vec::new();
        let mut epoch = l.epoch(round).unwrap();
        let mut n = 0;
        let sigterm = round == 3;
        for batch in epoch.by_ref() {
            let batch = batch.unwrap_or_else(|e| panic!("round {round}: {e}"));
            got.extend(batch.ids().iter().map(|id| (id.shard, id.index)));
            n += 1;
            if n == kill_at {
                if sigterm {
                    signal(workers[victim].child.id(), "-TERM");
                } else {
                    workers[victim].kill9();
                }
            }
            // Give the failure time to land mid-epoch.
            std::thread::sleep(Duration::from_millis(15));
        }
        let report = epoch.report();
        assert_eq!(n, batches, "round {round}: every batch arrives");
        assert_exactly_once(
            &format!("round {round} (worker {victim} stopped after batch {kill_at})"),
            planned(&data.manifest, 5, 1, 0, round),
            got,
        );
        assert_eq!(report.delivered, data.manifest.total_samples());
        eprintln!(
            "round {round}: stopped worker {victim} after batch {kill_at}/{batches}: {report:?}"
        );
        if !sigterm {
            assert!(
                report.reassigned > 0,
                "round {round}: the killed worker's units moved"
            );
        }
        if sigterm {
            let status = workers[victim].child.wait().unwrap();
            assert!(
                status.success(),
                "SIGTERM should drain and exit 0: {status}"
            );
            assert!(workers[victim].log_shows("draining", Duration::from_secs(10)));
        }
        // Bring the worker back (a new port, the same certificate) for the next round.
        let name = if victim == 0 { "a" } else { "b" };
        workers[victim] = start_worker(dir.path(), name);
    }
}

#[test]
fn wrong_tokens_and_untrusted_certificates_are_refused_on_both_sides() {
    let (dir, data, [w], trust) = bed(100, ["a"]);
    let first_error = |l: Loader| -> String {
        let mut epoch = l.epoch(0).unwrap();
        match epoch.next() {
            Some(Err(e)) => e.to_string(),
            other => panic!(
                "expected an error, got {:?}",
                other.map(|b| b.map(|b| b.len()))
            ),
        }
    };
    let e = first_error(loader(&data, vec![w.addr.clone()], &trust, "not-the-token"));
    assert!(
        e.contains("refused") && e.contains("wrong cluster token"),
        "{e}"
    );
    let e = first_error(loader(&data, vec![w.addr.clone()], &trust, ""));
    assert!(e.contains("no cluster token"), "{e}");
    // A certificate the client does not trust: another worker's.
    let other = start_worker(dir.path(), "other");
    let other_trust = dir.path().join("other.pem");
    std::fs::copy(other.state.join("cert.pem"), &other_trust).unwrap();
    let e = first_error(loader(&data, vec![w.addr.clone()], &other_trust, TOKEN));
    assert!(e.contains("TLS") && e.contains("certificate"), "{e}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(w.log_contains("wrong cluster token") && w.log_contains("TLS handshake failed"))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(w.log_contains("refused: wrong cluster token"));
    assert!(w.log_contains("refused: no cluster token given"));
    assert!(w.log_contains("TLS handshake failed"));
    // The worker still serves a client that gets it right.
    let l = loader(&data, vec![w.addr.clone()], &trust, TOKEN);
    let n: usize = l.epoch(0).unwrap().map(|b| b.unwrap().len()).sum();
    assert_eq!(n as u64, data.manifest.total_samples());
}

#[test]
fn no_worker_at_all_is_an_error_after_the_wait_not_a_hang() {
    let (_dir, data, [w], trust) = bed(100, ["a"]);
    let addr = w.addr.clone();
    drop(w); // killed: nothing listens there now
    let l = Loader::builder()
        .dataset(data.manifest.clone())
        .workers([addr.clone()])
        .token(TOKEN)
        .trust_cert(&trust)
        .connect_timeout(Duration::from_millis(500))
        .worker_wait(Duration::from_secs(2))
        .build()
        .unwrap();
    let started = Instant::now();
    let mut epoch = l.epoch(0).unwrap();
    let e = match epoch.next() {
        Some(Err(e)) => e.to_string(),
        _ => panic!("expected an error"),
    };
    assert!(
        e.contains("no worker reachable") && e.contains(&addr),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(epoch.next().is_none(), "the iterator ends after its error");
}

#[test]
fn in_process_mode_needs_no_daemon_and_reports_bad_samples() {
    let dir = tempfile::tempdir().unwrap();
    let images = synth_images(dir.path(), 3, 30);
    // Two damaged JPEGs: one cut in half, one not a JPEG at all.
    let victim = std::fs::read_dir(images.join("class_001"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .min()
        .unwrap();
    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(
        images.join("class_002").join("zz_garbage.jpg"),
        b"\xff\xd8\xffgarbage",
    )
    .unwrap();
    let manifest_path = dir.path().join("shards").join("manifest.json");
    support::shard_images(
        &images,
        path_str(&dir.path().join("shards").join("s-%06d.tar")),
        20,
        Some(&manifest_path),
    );
    let manifest = sluice_shard::Manifest::load(&manifest_path, 1 << 20).unwrap();
    let total = manifest.total_samples();
    assert_eq!(total, 91);
    let mut manifest = manifest;
    for s in &mut manifest.shards {
        s.url = path_str(&dir.path().join("shards").join(&s.url)).to_string();
    }
    let source = sluice_cpu::ShardSource::new(sluice_cpu::SourceConfig::default()).unwrap();
    let engine = sluice_cpu::EngineConfig {
        threads: 2,
        ..Default::default()
    };
    let worker = Arc::new(sluice_cpu::CpuWorker::new(engine, source).unwrap());
    for (policy, expect_len) in [(ShortBatch::Deliver, 89), (ShortBatch::TopUp, 91)] {
        let l = Loader::builder()
            .dataset(manifest.clone())
            .in_process(worker.clone())
            .pipeline("decode | resize 40 | center_crop 32".into())
            .batch_size(10)
            .ring_batches(3)
            .short_batch(policy)
            .build()
            .unwrap();
        assert_eq!(l.batches_per_epoch(), 10);
        let mut epoch = l.epoch(0).unwrap();
        let (mut len, mut skipped, mut batches) = (0, Vec::new(), 0);
        let mut buffers = std::collections::HashSet::new();
        for batch in epoch.by_ref() {
            let batch = batch.unwrap();
            assert_eq!(batch.dims()[1..], [32, 32, 3]);
            assert_eq!(batch.images().len(), batch.len() * 32 * 32 * 3);
            buffers.insert(batch.as_ptr() as usize);
            len += batch.len();
            skipped.extend(batch.skipped().iter().map(|(_, why)| why.clone()));
            batches += 1;
        }
        assert_eq!(
            batches, 10,
            "{policy:?}: the same number of batches whatever is skipped"
        );
        assert_eq!(len, expect_len, "{policy:?}");
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(
            skipped.iter().any(|s| s.contains("zz_garbage")),
            "{skipped:?}"
        );
        assert!(buffers.len() <= 3, "batch buffers are reused from the ring");
        let r = epoch.report();
        assert_eq!((r.delivered, r.skipped, r.planned), (89, 2, 91));
    }
}

/// A rolling restart as clients see it: a worker stopped with SIGTERM drains, and the client
/// says it left the pool, at INFO, while its units go to the other worker; no "worker lost"
/// warning, and the epoch still arrives exactly once (loadgen checks it).
#[test]
fn a_drained_worker_left_the_pool_and_is_not_reported_lost() {
    let (dir, data, workers, trust) = bed(100, ["a", "b"]);
    let pool = format!("{},{}", workers[0].addr, workers[1].addr);
    let run = system::loadgen(
        &data.manifest_path,
        &["--workers", &pool],
        &dir.path().join("token"),
        &trust,
    )
    .args(SMALL_BATCHES)
    .args(["--epochs", "2", "--step-ms", "20"])
    .env("RUST_LOG", "info")
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    signal(workers[0].child.id(), "-TERM");
    let out = run.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("left the pool"), "{said}");
    assert!(
        !said.contains("worker lost"),
        "a drain was reported as a lost worker:\n{said}"
    );
}
