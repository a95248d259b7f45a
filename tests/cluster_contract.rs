//! The contract across all three tiers on loopback: a storage node, two `sluice cpu`
//! processes and clients. Every planned sample arrives exactly once per rank and epoch,
//! checkpoints resume exactly the rest, two workers make the same bytes, and a slow consumer
//! keeps every process's memory bounded.

mod support;
mod system;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sluice_client::{Checkpoint, Loader};
use support::{path_str, sluice_ok};
use system::{assert_exactly_once, bed, planned, TOKEN};

const PIPELINE: &str = "decode | random_resized_crop 96 | hflip 0.5";

#[test]
fn loadgen_gets_every_planned_sample_once_per_rank_and_epoch() {
    let (dir, data, [a, b], trust) = bed(50, ["a", "b"]);
    let ids = dir.path().join("ids.tsv");
    let json = dir.path().join("loadgen.json");
    let workers = format!("{},{}", a.addr, b.addr);
    sluice_ok(&[
        "loadgen",
        "--dataset",
        path_str(&data.manifest_path),
        "--workers",
        &workers,
        "--ranks",
        "2",
        "--batch-size",
        "32",
        "--epochs",
        "2",
        "--seed",
        "7",
        "--pipeline",
        PIPELINE,
        "--token-file",
        path_str(&dir.path().join("token")),
        "--trust-cert",
        path_str(&trust),
        "--json",
        path_str(&json),
        "--dump-ids",
        path_str(&ids),
    ]);
    // Checked from outside: the dump against the planner.
    let key_to_index: Vec<HashMap<&str, u64>> = data
        .keys
        .iter()
        .map(|ks| {
            ks.iter()
                .enumerate()
                .map(|(i, k)| (k.as_str(), i as u64))
                .collect()
        })
        .collect();
    let name_to_shard: HashMap<&str, u32> = data
        .manifest
        .shards
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name(), i as u32))
        .collect();
    let text = std::fs::read_to_string(&ids).unwrap();
    let mut arrived: HashMap<(u64, u32), Vec<(u32, u64)>> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let shard = name_to_shard[f[2]];
        let index = key_to_index[shard as usize][f[3]];
        arrived
            .entry((f[0].parse().unwrap(), f[1].parse().unwrap()))
            .or_default()
            .push((shard, index));
    }
    let total = data.manifest.total_samples();
    for epoch in 0..2 {
        for rank in 0..2 {
            let got = arrived.remove(&(epoch, rank)).unwrap_or_default();
            assert_eq!(got.len() as u64, total / 2, "rank {rank} epoch {epoch}");
            assert_exactly_once(
                &format!("rank {rank} epoch {epoch}"),
                planned(&data.manifest, 7, 2, rank, epoch),
                got,
            );
        }
    }
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let ranks = report["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    for r in ranks {
        assert_eq!(r["planned"], r["delivered"]);
        assert_eq!(r["epochs"], 2);
        assert_eq!(r["skipped"], 0);
        assert_eq!(r["batches"], ranks[0]["batches"], "equal steps per rank");
        assert!(r["samples_per_s"].as_f64().unwrap() > 0.0);
        assert!(r["starved_fraction"].as_f64().is_some());
    }
    // The workers counted what they sent, and say they are healthy.
    for w in [&a, &b] {
        let health = reqwest::blocking::get(format!("http://{}/healthz", w.metrics)).unwrap();
        assert_eq!(health.status(), 200);
        let metrics = reqwest::blocking::get(format!("http://{}/metrics", w.metrics))
            .unwrap()
            .text()
            .unwrap();
        assert!(
            metrics.contains("sluice_cpu_samples_sent_total"),
            "{metrics}"
        );
    }
    let _ = TOKEN;
}

fn loader(data: &system::Dataset, workers: &[&str], trust: &std::path::Path) -> Loader {
    Loader::builder()
        .dataset(data.manifest.clone())
        .workers(workers.iter().map(|s| s.to_string()))
        .token(TOKEN)
        .trust_cert(trust)
        .pipeline(PIPELINE.into())
        .batch_size(16)
        .seed(11)
        .build()
        .unwrap()
}

#[test]
fn a_checkpoint_resumes_exactly_the_rest_and_workers_agree_byte_for_byte() {
    let (_dir, data, [a, b], trust) = bed(100, ["a", "b"]);

    // Checkpoint after 9 batches, drop the client, resume in a new one.
    let first = loader(&data, &[&a.addr, &b.addr], &trust);
    let batches = first.batches_per_epoch();
    let mut got = Vec::new();
    let mut epoch = first.epoch(3).unwrap();
    for _ in 0..9 {
        let batch = epoch.next().unwrap().unwrap();
        got.extend(batch.ids().iter().map(|id| (id.shard, id.index)));
    }
    let saved = first.state_dict().unwrap().to_bytes();
    drop(epoch);
    drop(first);
    let second = loader(&data, &[&a.addr, &b.addr], &trust);
    let checkpoint = Checkpoint::from_bytes(&saved).unwrap();
    assert_eq!((checkpoint.epoch, checkpoint.batches), (3, 9));
    second.load_state_dict(checkpoint).unwrap();
    let mut resumed_batches = 0;
    for batch in second.epoch(3).unwrap() {
        let batch = batch.unwrap();
        resumed_batches += 1;
        got.extend(batch.ids().iter().map(|id| (id.shard, id.index)));
    }
    assert_eq!(9 + resumed_batches, batches);
    assert_exactly_once(
        "checkpointed epoch",
        planned(&data.manifest, 11, 1, 0, 3),
        got,
    );

    // A checkpoint from another job is refused with the reason.
    let other = Loader::builder()
        .dataset(data.manifest.clone())
        .workers([a.addr.clone()])
        .trust_cert(&trust)
        .batch_size(16)
        .seed(12)
        .build()
        .unwrap();
    let err = other
        .load_state_dict(Checkpoint::from_bytes(&saved).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("seed 11") && err.contains("12"), "{err}");
    assert!(Checkpoint::from_bytes(b"{\"version\": 9}").is_err());

    // The same samples decoded by each worker alone: identical tensors.
    let digest = |worker: &str| -> HashMap<(u32, u64), u64> {
        let l = loader(&data, &[worker], &trust);
        let mut m = HashMap::new();
        for batch in l.epoch(1).unwrap() {
            let batch = batch.unwrap();
            let n = batch.shape().bytes() as usize;
            for (i, id) in batch.ids().iter().enumerate() {
                let t = &batch.images()[i * n..(i + 1) * n];
                m.insert((id.shard, id.index), xxhash_rust::xxh3::xxh3_64(t));
            }
        }
        m
    };
    let from_a = digest(&a.addr);
    let from_b = digest(&b.addr);
    assert_eq!(from_a.len() as u64, data.manifest.total_samples());
    assert!(
        from_a == from_b,
        "workers made different tensors for the same samples"
    );
}

#[test]
fn a_slow_consumer_keeps_every_process_bounded() {
    let (dir, data, [a, b], trust) = bed(100, ["a", "b"]);
    let workers = format!("{},{}", a.addr, b.addr);
    // 224×224×3 tensors (150 KB): unbounded buffering would grow by tens of MB a second.
    let token = dir.path().join("token");
    let mut client = system::loadgen(
        &data.manifest_path,
        &["--workers", &workers],
        &token,
        &trust,
    )
    .args(["--batch-size", "8", "--step-ms", "100", "--credits", "32"])
    .args(["--epochs", "5"])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let pid = client.id();
    let sample = || [system::rss_kb(pid), a.rss_kb(), b.rss_kb()];
    std::thread::sleep(Duration::from_secs(3));
    let warm = sample();
    let mut peak = warm;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(250));
        for (p, now) in peak.iter_mut().zip(sample()) {
            *p = (*p).max(now);
        }
    }
    let _ = client.kill();
    let _ = client.wait();
    for (name, (w, p)) in ["loadgen", "worker a", "worker b"]
        .iter()
        .zip(warm.iter().zip(peak))
    {
        eprintln!("{name}: {w} kB once warm, at most {p} kB");
        assert!(*w > 0, "{name}: no RSS reading");
        assert!(
            p < w + 48 * 1024,
            "{name} grew from {w} kB to {p} kB while its consumer was slow"
        );
    }
}
