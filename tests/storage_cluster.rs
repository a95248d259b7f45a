//! Three storage nodes on loopback with `replicas = 2`: `sluice put` writes each object to its
//! two rendezvous owners, a non-owner answers 307 to an owner, and a reader with both owners'
//! URLs still gets every sample when one owner is stopped.

mod support;
mod system;

use std::time::Duration;

use sluice_cpu::{ShardLocation, ShardSource, SourceConfig};
use sluice_storage::StorageConfig;
use support::{local_job, path_str, signal, sluice_ok};

const TOKEN: &str = "cluster-token-0123456789";

struct Cluster {
    urls: Vec<String>,
    nodes: Vec<system::Storage>,
}

fn start_cluster(root: &std::path::Path, n: usize) -> Cluster {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let urls: Vec<String> = listeners
        .iter()
        .map(|l| format!("http://{}", l.local_addr().unwrap()))
        .collect();
    let nodes = listeners
        .into_iter()
        .enumerate()
        .map(|(i, listener)| {
            let dir = root.join(format!("node{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            let config = StorageConfig {
                mountpaths: vec![dir],
                upload_tokens: vec![TOKEN.into()],
                peers: urls.clone(),
                advertise: Some(urls[i].clone()),
                replicas: 2,
                ..StorageConfig::default()
            };
            system::run_storage(listener, config)
        })
        .collect();
    Cluster { urls, nodes }
}

#[test]
fn replicated_puts_redirects_and_failover() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(&dir.path().join("nodes"), 3);
    let images = support::synth_images(dir.path(), 3, 4);
    let pattern = format!("{}/out/s-%02d.tar", dir.path().display());
    support::shard_images(&images, &pattern, 2, None);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let shards = format!("{}/out/s-{{00..05}}.tar", dir.path().display());
    let out = sluice_ok(&[
        "put",
        &shards,
        "--to",
        &format!("{}/v1/train/", cluster.urls[0]),
        "--token-file",
        path_str(&token_file),
    ]);
    assert!(out.contains("(2 copies each)"), "{out}");

    let http = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let follow = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for i in 0..6 {
        let name = format!("s-{i:02}.tar");
        let owners = sluice_storage::placement::owners(&format!("train/{name}"), &cluster.urls, 2);
        // Exactly the two owners hold it.
        let held: Vec<bool> = (0..3)
            .map(|n| {
                dir.path()
                    .join(format!("nodes/node{n}/train/{name}"))
                    .exists()
            })
            .collect();
        for (n, url) in cluster.urls.iter().enumerate() {
            assert_eq!(
                held[n],
                owners.contains(&url.as_str()),
                "{name} on node {n}"
            );
        }
        // The non-owner redirects to the first owner; following the redirect gets the bytes.
        let other = cluster
            .urls
            .iter()
            .find(|u| !owners.contains(&u.as_str()))
            .unwrap();
        let r = http.get(format!("{other}/v1/train/{name}")).send().unwrap();
        assert_eq!(r.status(), 307);
        assert_eq!(
            r.headers()["location"],
            format!("{}/v1/train/{name}", owners[0]).as_str()
        );
        let body = follow
            .get(format!("{other}/v1/train/{name}"))
            .send()
            .unwrap()
            .bytes()
            .unwrap();
        assert_eq!(
            body.as_ref(),
            std::fs::read(dir.path().join(format!("out/{name}")))
                .unwrap()
                .as_slice()
        );
    }

    // Stop the first owner of s-00.tar: a reader with both owners still reads every sample.
    let name = "s-00.tar";
    let owners: Vec<String> =
        sluice_storage::placement::owners(&format!("train/{name}"), &cluster.urls, 2)
            .into_iter()
            .map(str::to_string)
            .collect();
    let first = cluster.urls.iter().position(|u| *u == owners[0]).unwrap();
    cluster.nodes[first].stop();
    std::thread::sleep(Duration::from_millis(300));
    let (info, _) = sluice_shard::scan_shard(
        std::fs::File::open(dir.path().join("out").join(name)).unwrap(),
        name,
        &Default::default(),
        |_| {},
    )
    .unwrap();
    let loc = ShardLocation {
        tally: Default::default(),
        urls: owners
            .iter()
            .map(|o| format!("{o}/v1/train/{name}"))
            .collect(),
        info,
    };
    let source = ShardSource::new(SourceConfig::default()).unwrap();
    let keys: Vec<String> = source
        .open_unit(&loc, 0, 2)
        .unwrap()
        .map(|s| s.unwrap().key)
        .collect();
    assert_eq!(keys.len(), 2);
    // A manifest that names another version of the object: the checksum header gives the
    // stale replica away before a byte of it is read.
    let mut stale = loc.clone();
    stale.info.checksum = sluice_shard::Checksum(stale.info.checksum.0 ^ 1);
    let lax = ShardSource::new(SourceConfig {
        verify: false,
        ..SourceConfig::default()
    })
    .unwrap();
    let err = lax
        .open_unit(&stale, 0, 2)
        .err()
        .expect("stale object refused")
        .to_string();
    assert!(err.contains("changed since it was indexed"), "{err}");
    drop(cluster);
}

/// Storage node loss, end to end: `sluice put --manifest` names each shard's two owners, and
/// consumers reading through an in-process worker lose no sample, repeat none and skip none
/// when an owner is down before the run or stops during it (between or within units: the
/// worker's source goes on from the next owner; `cpu-tier/tests/source.rs` cuts a unit
/// mid-stream).
#[test]
fn a_lost_storage_node_costs_no_sample() {
    let dir = tempfile::tempdir().unwrap();
    let images = support::synth_images(dir.path(), 4, 12);
    let pattern = format!("{}/out/s-%02d.tar", dir.path().display());
    support::shard_images(&images, &pattern, 4, None);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    for (round, stop_during) in [(0, false), (1, true)] {
        let cluster = start_cluster(&dir.path().join(format!("nodes{round}")), 3);
        let manifest = dir.path().join(format!("put{round}.json"));
        let out = sluice_ok(&[
            "put",
            &format!("{}/out/s-{{00..11}}.tar", dir.path().display()),
            "--to",
            &format!("{}/v1/train/", cluster.urls[0]),
            "--token-file",
            path_str(&token_file),
            "--manifest",
            path_str(&manifest),
        ]);
        assert!(out.contains("12 shards, each on 2 owners"), "{out}");
        let m = sluice_shard::Manifest::load(&manifest, 1 << 20).unwrap();
        for s in &m.shards {
            assert_eq!(s.replicas.len(), 1, "{}: a second owner", s.url);
            assert_ne!(s.url, s.replicas[0]);
        }
        if !stop_during {
            cluster.nodes[0].stop();
        }
        let dump = dir.path().join(format!("ids{round}.tsv"));
        let report = dir.path().join(format!("report{round}.json"));
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(local_job(
                &manifest,
                &[
                    "--ranks",
                    "2",
                    "--batch-size",
                    "8",
                    "--epochs",
                    "3",
                    "--step-ms",
                    "60",
                    "--dump-ids",
                    path_str(&dump),
                    "--json",
                    path_str(&report),
                ],
            ))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        if stop_during {
            std::thread::sleep(Duration::from_millis(500));
            cluster.nodes[1].stop();
        }
        let out = std::thread::spawn(move || child.wait_with_output().unwrap())
            .join()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "round {round}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        for r in report["ranks"].as_array().unwrap() {
            assert_eq!(r["skipped"], 0, "round {round}: {stdout}");
            assert_eq!(r["planned"], r["delivered"], "round {round}: {stdout}");
        }
        assert_eq!(
            distinct_samples(&dump, &format!("round {round}")),
            3 * 48,
            "round {round}: every sample of 3 epochs, once"
        );
    }
}

/// The (epoch, shard, key) samples a `--dump-ids` file holds, each asserted to come once.
fn distinct_samples(dump: &std::path::Path, what: &str) -> usize {
    let lines = std::fs::read_to_string(dump).unwrap();
    let mut seen = std::collections::HashSet::new();
    for l in lines.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        assert!(
            seen.insert((f[0].to_string(), f[2].to_string(), f[3].to_string())),
            "{what}: twice: {l}"
        );
    }
    seen.len()
}

/// Waits until `addr` answers `GET /healthz` with 200.
fn wait_healthy(addr: std::net::SocketAddr) {
    use std::io::{Read, Write};
    for _ in 0..200 {
        if let Ok(mut c) = std::net::TcpStream::connect(addr) {
            let _ = c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut head = [0u8; 12];
            if c.read_exact(&mut head).is_ok() && head.ends_with(b"200") {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("storage node at {addr} never became healthy");
}

/// A storage node that hangs (SIGSTOP: its socket still accepts, nothing answers) with a
/// healthy replica beside it costs the job one stall timeout, not the hang: the node is
/// stopped in the first epoch and never resumed, and loadgen still delivers every sample of
/// 5 epochs (each reads every shard again) once, the worker naming the replica it gave up on. Before the fix the job waited for as
/// long as the node hung: here, forever.
#[test]
fn a_hung_storage_node_fails_over_to_its_replica() {
    let dir = tempfile::tempdir().unwrap();
    let images = support::synth_images(dir.path(), 4, 12);
    let out = dir.path().join("out");
    let local = dir.path().join("local.json");
    support::shard_images(
        &images,
        &format!("{}/s-%02d.tar", out.display()),
        4,
        Some(&local),
    );
    for node in ["a", "b"] {
        let bucket = dir.path().join(node).join("train");
        std::fs::create_dir_all(&bucket).unwrap();
        for f in std::fs::read_dir(&out).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, bucket.join(f.file_name().unwrap())).unwrap();
        }
    }
    // Node a: the real binary, so it can be stopped; node b: in process.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a_addr = port.local_addr().unwrap();
    drop(port);
    let mut a = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["storage", "--data"])
        .arg(dir.path().join("a"))
        .args(["--listen", &a_addr.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let b = system::start_storage(&dir.path().join("b"));
    wait_healthy(a_addr);
    let mut m = sluice_shard::Manifest::load(&local, 1 << 20).unwrap();
    for s in &mut m.shards {
        let name = s.name().to_string();
        s.url = format!("http://{a_addr}/v1/train/{name}");
        s.replicas = vec![format!("{}/v1/train/{name}", b.url)];
    }
    let manifest = dir.path().join("replicated.json");
    m.save(&manifest).unwrap();

    let dump = dir.path().join("ids.tsv");
    let started = std::time::Instant::now();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(local_job(&manifest, &[]))
        .args([
            "--ranks",
            "2",
            "--batch-size",
            "8",
            "--epochs",
            "5",
            "--step-ms",
            "100",
        ])
        .args(["--dump-ids", path_str(&dump)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    signal(a.id(), "-STOP");
    // A guard against the hang this test is about: loadgen is killed after 120 s.
    let pid = child.id();
    let guard = std::thread::spawn(move || {
        for _ in 0..1200 {
            std::thread::sleep(Duration::from_millis(100));
            if std::fs::metadata(format!("/proc/{pid}")).is_err() {
                return false;
            }
        }
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
        true
    });
    let output = child.wait_with_output().unwrap();
    let elapsed = started.elapsed();
    let hung = guard.join().unwrap();
    signal(a.id(), "-CONT");
    let _ = a.kill();
    let _ = a.wait();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !hung,
        "loadgen still waiting on the stopped node after 120 s:\n{stdout}\n{stderr}"
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    eprintln!(
        "5 epochs with one replica stopped mid-run: {:.1} s",
        elapsed.as_secs_f64()
    );
    assert_eq!(
        distinct_samples(&dump, "hung node"),
        5 * 48,
        "every sample of 5 epochs, once:\n{stdout}"
    );
    assert!(
        stderr.contains(&a_addr.to_string()) && stderr.contains("other replicas"),
        "the worker says which replica it gave up on:\n{stderr}"
    );
}
