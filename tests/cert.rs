//! `sluice cert` as an operator uses it: one CA for a pool, a certificate per worker, and a
//! client that trusts only `ca.pem` reaching both workers for an epoch (loadgen checks it
//! exactly once), while a worker serving its own self-signed certificate is refused.

mod support;
mod system;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use support::{path_str, sluice, sluice_ok, succeed};
use system::{dataset, loadgen, start_worker_with, SMALL_BATCHES};

/// Loadgen's epoch of small batches from `worker`, trusting `trust`.
fn one_epoch(manifest: &Path, worker: &str, token: &Path, trust: &Path) -> std::process::Output {
    loadgen(manifest, &["--workers", worker], token, trust)
        .args(SMALL_BATCHES)
        .args(["--epochs", "1", "--worker-wait", "3"])
        .output()
        .unwrap()
}

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
    let refused = one_epoch(&data.manifest_path, &stranger.addr, &token, &trust);
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

/// Runs `args` as the unprivileged user 65534 (`setpriv`), as another user on the host would.
fn as_nobody(args: &[&str]) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(args)
        .output()
        .unwrap()
}

/// Whether this test can act as another user: root, with `setpriv`.
fn can_switch_users() -> bool {
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    let setpriv = std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !(root && setpriv) {
        eprintln!("skipped: needs root and setpriv to act as another user");
    }
    root && setpriv
}

/// The hostile tester's attack: another user plants links where `sluice cert` writes keys, in
/// an `--out` folder they can write. No key reaches them: the folder is refused by name, and
/// nothing is written through a link. In a folder only its owner writes, a link left at a
/// temporary name is refused too, never followed.
#[test]
fn keys_never_go_through_a_link_another_user_planted() {
    if !can_switch_users() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let stolen = shared.join("stolen");
    for name in [
        "ca.tmp",
        ".ca.key.tmp",
        "ca.key",
        "key.tmp",
        ".key.pem.tmp",
        "key.pem",
    ] {
        let out = as_nobody(&["ln", "-s", path_str(&stolen), path_str(&shared.join(name))]);
        assert!(out.status.success(), "{out:?}");
    }
    let out = sluice(&["cert", "ca", "--out", path_str(&shared)]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a CA was made in a folder others write"
    );
    assert!(
        said.contains(path_str(&shared)) && said.contains("other users"),
        "{said}"
    );
    // A CA made properly, then a worker certificate issued into the shared folder.
    let ca = dir.path().join("ca");
    sluice_ok(&["cert", "ca", "--out", path_str(&ca)]);
    let args = [
        "cert",
        "issue",
        "--ca",
        path_str(&ca),
        "--name",
        "w",
        "--san",
        "localhost",
    ];
    let out = sluice(&[&args[..], &["--out", path_str(&shared)]].concat());
    assert!(
        !out.status.success(),
        "a key was issued into a folder others write"
    );
    assert!(
        !stolen.exists(),
        "a private key went through the planted link"
    );

    // A folder of root's own with a link left at a temporary name: refused, not followed.
    let own = dir.path().join("own");
    std::fs::create_dir(&own).unwrap();
    std::os::unix::fs::symlink(&stolen, own.join(".key.pem.tmp")).unwrap();
    let out = sluice(&[&args[..], &["--out", path_str(&own)]].concat());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains(".key.pem.tmp"),
        "{said}"
    );
    assert!(!stolen.exists(), "a private key went through a link");
    assert!(!own.join("key.pem").exists());
}

/// A CA key others can read (or reached through a link) is refused by name: whoever read it
/// can issue certificates the pool trusts.
#[test]
fn a_ca_key_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    sluice_ok(&["cert", "ca", "--out", path_str(&ca)]);
    let key = ca.join("ca.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let issue = |ca: &Path, out: &str| {
        sluice(&[
            "cert",
            "issue",
            "--ca",
            path_str(ca),
            "--name",
            "w",
            "--san",
            "localhost",
            "--out",
            path_str(&dir.path().join(out)),
        ])
    };
    let out = issue(&ca, "w1");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a world-readable CA key was used");
    assert!(said.contains("ca.key") && said.contains("0644"), "{said}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let linked = dir.path().join("linked");
    std::fs::create_dir(&linked).unwrap();
    std::os::unix::fs::symlink(&key, linked.join("ca.key")).unwrap();
    let out = issue(&linked, "w2");
    assert!(!out.status.success(), "a CA key behind a link was used");
    assert!(String::from_utf8_lossy(&out.stderr).contains("link"));
    let out = issue(&ca, "w3");
    assert!(out.status.success(), "{out:?}");
}

/// Names a certificate cannot hold are refused by name, before anything is written.
#[test]
fn junk_names_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    sluice_ok(&["cert", "ca", "--out", path_str(&ca)]);
    for san in [
        "",
        "a,,b",
        "foo bar",
        "300.1.1.1",
        "-x.example",
        "a_b.example",
    ] {
        let out_dir = dir.path().join("w");
        let out = sluice(&[
            "cert",
            "issue",
            "--ca",
            path_str(&ca),
            "--name",
            "w",
            "--san",
            san,
            "--out",
            path_str(&out_dir),
        ]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--san {san:?} was accepted");
        assert!(said.contains("--san"), "{san:?}: {said}");
        assert!(
            !out_dir.join("key.pem").exists(),
            "{san:?}: a key was written"
        );
    }
}

/// The worker's certificate replaced while a job runs by one from another CA, its files
/// swapped as cert-manager renews a mounted Secret, and nothing restarted: new clients that
/// trust only the new CA connect, ones that trust only the old are refused, and the job that
/// was running (trusting both, as during a CA migration) runs every epoch exactly once.
#[test]
fn a_certificate_replaced_while_a_job_runs_is_served_without_a_restart() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 20);
    for (ca, tls) in [("ca1", "tls1"), ("ca2", "tls2")] {
        let ca = dir.path().join(ca);
        sluice_ok(&["cert", "ca", "--out", path_str(&ca)]);
        let out = dir.path().join(tls);
        let args = ["--name", "w", "--san", "127.0.0.1", "--out", path_str(&out)];
        sluice_ok(&[&["cert", "issue", "--ca", path_str(&ca)], &args[..]].concat());
    }
    let serve = dir.path().join("serve");
    std::fs::create_dir(&serve).unwrap();
    let swap_in = |from: &str| {
        for file in ["key.pem", "cert.pem"] {
            let tmp = serve.join(format!("{file}.new"));
            std::fs::copy(dir.path().join(from).join(file), &tmp).unwrap();
            std::fs::rename(&tmp, serve.join(file)).unwrap();
        }
    };
    swap_in("tls1");
    let (cert, key) = (serve.join("cert.pem"), serve.join("key.pem"));
    let worker = start_worker_with(
        dir.path(),
        "w",
        &[
            "--no-same-host",
            "--cert",
            path_str(&cert),
            "--key",
            path_str(&key),
        ],
    );
    let ca_pem = |ca: &str| std::fs::read_to_string(dir.path().join(ca).join("ca.pem")).unwrap();
    let both = dir.path().join("both.pem");
    std::fs::write(&both, ca_pem("ca1") + &ca_pem("ca2")).unwrap();

    let rotated = Arc::new(AtomicBool::new(false));
    let running = system::epochs_until(
        sluice_client::Loader::builder()
            .dataset(data.manifest.clone())
            .token(system::TOKEN)
            .trust_cert(&both)
            .same_host(sluice_client::SameHost::Off)
            .workers(vec![worker.addr.clone()])
            .pipeline("decode | random_resized_crop 32".into())
            .batch_size(8)
            .job_name("long"),
        data.manifest.clone(),
        rotated.clone(),
    );
    assert!(worker.log_shows("job", std::time::Duration::from_secs(30)));

    swap_in("tls2");
    assert!(
        worker.log_shows("certificate re-read", std::time::Duration::from_secs(30)),
        "the worker never served the new certificate"
    );
    let token = dir.path().join("token");
    let one_epoch = |ca: &str| {
        let trust = dir.path().join(ca).join("ca.pem");
        one_epoch(&data.manifest_path, &worker.addr, &token, &trust)
    };
    let new = one_epoch("ca2");
    assert!(
        new.status.success(),
        "a client trusting the new CA: {new:?}"
    );
    let old = one_epoch("ca1");
    assert!(
        !old.status.success(),
        "a client trusting only the old CA got in"
    );
    rotated.store(true, Ordering::SeqCst);
    let epochs = running.join().expect("the running job failed");
    assert!(epochs >= 2, "the running job ran {epochs} epochs");
}
