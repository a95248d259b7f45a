//! `sluice cert` as an operator uses it: one CA for a pool, a certificate per worker, and a
//! client that trusts only `ca.pem` reaching both workers for an epoch (loadgen checks it
//! exactly once), while a worker serving its own self-signed certificate is refused.

mod support;
mod system;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use support::{path_str, sluice, sluice_ok, succeed};
use system::{dataset, loadgen, start_worker_with, SMALL_BATCHES};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn one_ca_trusts_a_pool_and_no_other_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 20);
    let ca = dir.path().join("ca");
    sluice_ok(&["cert", "ca", "--out", path_str(&ca)]);
    assert_eq!(mode(&ca.join("ca.key")), 0o600, "the CA key is owner-only");
    let again = sluice(&["cert", "ca", "--out", path_str(&ca)]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists already"));

    let mut workers = Vec::new();
    for name in ["a", "b"] {
        let out = dir.path().join(format!("{name}-tls"));
        sluice_ok(&[
            "cert",
            "issue",
            "--ca",
            path_str(&ca),
            "--name",
            name,
            "--san",
            "127.0.0.1,localhost",
            "--out",
            path_str(&out),
        ]);
        assert_eq!(
            mode(&out.join("key.pem")),
            0o600,
            "a worker key is owner-only"
        );
        let (cert, key) = (out.join("cert.pem"), out.join("key.pem"));
        workers.push(start_worker_with(
            dir.path(),
            name,
            &[
                "--no-same-host",
                "--cert",
                path_str(&cert),
                "--key",
                path_str(&key),
            ],
        ));
    }
    let pool = format!("{},{}", workers[0].addr, workers[1].addr);
    let token = dir.path().join("token");
    let trust = ca.join("ca.pem");
    succeed(
        loadgen(&data.manifest_path, &["--workers", &pool], &token, &trust)
            .args(SMALL_BATCHES)
            .args(["--epochs", "1"]),
    );

    // A worker with its own self-signed certificate is not in the pool the CA vouches for.
    let stranger = start_worker_with(dir.path(), "stranger", &["--no-same-host"]);
    let refused = loadgen(
        &data.manifest_path,
        &["--workers", &stranger.addr],
        &token,
        &trust,
    )
    .args(SMALL_BATCHES)
    .args(["--epochs", "1", "--worker-wait", "3"])
    .output()
    .unwrap();
    assert!(
        !refused.status.success(),
        "a client trusting only the CA reached a stranger"
    );
    let said = String::from_utf8_lossy(&refused.stderr).to_lowercase();
    assert!(
        said.contains("certificate") || said.contains("tls"),
        "{said}"
    );
}

/// A worker given a key that is not its certificate's stops before it says it is serving
/// (and before systemd hears READY=1), naming the certificate.
#[test]
fn a_key_that_is_not_the_certificate_s_stops_the_worker_before_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    sluice_ok(&["cert", "ca", "--out", path_str(&ca)]);
    for name in ["a", "b"] {
        let out = dir.path().join(name);
        let args = [
            "--name",
            name,
            "--san",
            "127.0.0.1",
            "--out",
            path_str(&out),
        ];
        sluice_ok(&[&["cert", "issue", "--ca", path_str(&ca)], &args[..]].concat());
    }
    let token = support::write_file(
        &dir.path().join("token"),
        "a-cluster-token-of-32-characters\n",
    );
    let (cert, key) = (dir.path().join("a/cert.pem"), dir.path().join("b/key.pem"));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "cpu",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--no-same-host",
        ])
        .args(["--state-dir", path_str(&dir.path().join("state"))])
        .args(["--token-file", path_str(&token), "--cert", path_str(&cert)])
        .args(["--key", path_str(&key)])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a mismatched key was served: {said}");
    assert!(
        !said.contains("serving"),
        "it said it was serving first: {said}"
    );
    assert!(
        said.contains(path_str(&cert)),
        "the error names no certificate: {said}"
    );
}
