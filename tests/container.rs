//! The image as an operator runs it: `configs/container/build.sh` builds it from scratch
//! around the binary under test, then a storage node, a CPU worker and loadgen run as three
//! containers (host network, uid 10001) for an epoch, which loadgen checks exactly once.
//! Skips with a message where podman is missing or cannot run a container at all (unless
//! `SLUICE_REQUIRE_CONTAINERS` is set).

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::podman::{skip, Image};

/// The containers this test started, removed however it ends (before the image).
struct Containers<'a> {
    image: &'a Image,
    names: Vec<String>,
}

impl Drop for Containers<'_> {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = self.image.run(&["rm", "-f", n]);
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn storage_a_worker_and_loadgen_run_an_epoch_as_containers() {
    let image = match Image::build("test") {
        Ok(image) => image,
        Err(why) => return skip(&why),
    };
    let mut running = Containers {
        image: &image,
        names: Vec::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    // Everything the containers read or write lives in folders uid 10001 may use.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let data = dir.path().join("data");
    let images = support::synth_images(dir.path(), 2, 12);
    support::shard_images(
        &images,
        &format!("{}/train/s-%02d.tar", data.display()),
        8,
        None,
    );
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    // The worker's user (10001 in the image) owns its state directory, as a StateDirectory or
    // a volume's fsGroup gives it: it writes its key only where no other user can.
    std::os::unix::fs::chown(&state, Some(10001), Some(10001)).unwrap();
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(
        dir.path().join("token"),
        "container-test-token-0123456789\n",
    )
    .unwrap();
    let (http, quic) = (free_port(), free_port());
    let vol = |host: &Path, at: &str| format!("{}:{at}", host.display());
    let start = |name: &str, args: &[&str]| {
        let mut all = vec!["run", "-d", "--name", name, "--network", "host"];
        all.extend_from_slice(args);
        image.ok(&all);
    };
    let tag_ref = image.tag.as_str();
    let storage = format!("sluice-storage-{quic}");
    start(
        &storage,
        &[
            "-v",
            &vol(&data, "/data"),
            tag_ref,
            "storage",
            "--data",
            "/data",
            "--listen",
            &format!("127.0.0.1:{http}"),
        ],
    );
    running.names.push(storage);
    wait_for_port(http);
    // The manifest names the shards by their URLs on the storage container.
    let manifest = dir.path().join("manifest.json");
    support::succeed(
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([
                "index",
                &format!("http://127.0.0.1:{http}/v1/train/s-{{00..02}}.tar"),
                "--output",
            ])
            .arg(&manifest),
    );
    let worker = format!("sluice-cpu-{quic}");
    start(
        &worker,
        &[
            "-v",
            &vol(dir.path(), "/job"),
            "-v",
            &vol(&state, "/state"),
            tag_ref,
            "cpu",
            "--listen",
            &format!("127.0.0.1:{quic}"),
            "--state-dir",
            "/state",
            "--token-file",
            "/job/token",
            "--no-same-host",
            "--threads",
            "1",
        ],
    );
    running.names.push(worker);
    let cert = state.join("cert.pem");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cert.exists() {
        if Instant::now() > deadline {
            let logs = image.run(&["logs", &running.names[1]]);
            panic!(
                "the worker made no certificate: {}",
                String::from_utf8_lossy(&logs.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let loadgen = image.run(&[
        "run",
        "--rm",
        "--network",
        "host",
        "-v",
        &vol(dir.path(), "/job"),
        "-v",
        &vol(&state, "/state"),
        tag_ref,
        "loadgen",
        "--dataset",
        "/job/manifest.json",
        "--workers",
        &format!("127.0.0.1:{quic}"),
        "--token-file",
        "/job/token",
        "--trust-cert",
        "/state/cert.pem",
        "--same-host",
        "off",
        "--pipeline",
        "decode | random_resized_crop 32",
        "--batch-size",
        "4",
        "--epochs",
        "1",
        "--json",
        "/job/report.json",
    ]);
    assert!(
        loadgen.status.success(),
        "loadgen: {}",
        String::from_utf8_lossy(&loadgen.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["ranks"][0]["delivered"], 24, "{report}");
}
