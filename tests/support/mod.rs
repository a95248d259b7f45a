//! Shared helpers for the end-to-end tests: running the real `sluice` binary, finding
//! `../shared` data and a Python with `webdataset`, and generating datasets.

#![allow(dead_code)]

pub mod podman;
mod run;
#[allow(unused_imports)] // each test file uses some
pub use run::{python_with, succeed};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `sluice` with `args`; returns its output whatever the exit status.
pub fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("running the sluice binary")
}

/// Runs `sluice` and insists on success; returns stdout.
pub fn sluice_ok(args: &[&str]) -> String {
    let out = succeed(Command::new(env!("CARGO_BIN_EXE_sluice")).args(args));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `text` to `path` (a config file, a token); returns the path.
pub fn write_file(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

/// `../shared/data/<name>` when it exists.
pub fn shared_data(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data")
        .join(name);
    p.exists().then_some(p)
}

/// A Python interpreter with the `webdataset` package: `$SLUICE_TEST_PYTHON`, else the repo's
/// `.venv`. `None` (the caller skips) unless `SLUICE_REQUIRE_PYTHON` is set, as CI sets it.
pub fn webdataset_python() -> Option<PathBuf> {
    python_with("webdataset")
}

/// Retries `f` for up to `secs` seconds, a fifth of a second apart; whether it held.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    false
}

/// Shards the real ImageNet sample (`../shared/data/imagenet-sample`, with its labels) into
/// `pattern`, `per_shard` samples a shard; without it, 400 generated JPEGs in 10 classes
/// (made under `dir`), saying so.
pub fn shard_sample_images(dir: &Path, pattern: &Path, per_shard: u32) {
    let (images, labels) = match shared_data("imagenet-sample") {
        Some(real) => (real.clone(), Some(real.join("labels.tsv"))),
        None => {
            eprintln!("../shared/data/imagenet-sample absent: using generated JPEGs");
            (synth_images(dir, 10, 40), None)
        }
    };
    let per_shard = per_shard.to_string();
    let mut args = vec!["shard", "--input", path_str(&images)];
    if let Some(l) = &labels {
        args.extend(["--labels", path_str(l)]);
    }
    args.extend(["--output", path_str(pattern), "--max-count", &per_shard]);
    sluice_ok(&args);
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// A minimal static HTTP/1.1 file server on loopback (until the storage tier can stand in):
/// serves files under `root` for GET, 404 otherwise, one connection at a time, closing each.
/// Runs until the test process ends.
pub fn serve_dir(root: PathBuf) -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().expect("clone socket"));
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if line == "\r\n" => break,
                    Ok(_) => {}
                }
            }
            let path = request
                .split_whitespace()
                .nth(1)
                .unwrap_or("/")
                .trim_start_matches('/');
            let file = root.join(path);
            let response = match std::fs::read(&file) {
                Ok(body) if !path.contains("..") => {
                    let mut r = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    r.extend(body);
                    r
                }
                _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_vec(),
            };
            let _ = conn.write_all(&response);
        }
    });
    addr
}

/// Generates a synthetic ImageFolder dataset under `dir/images` with the real binary.
pub fn synth_images(dir: &Path, classes: u32, per_class: u32) -> PathBuf {
    let images = dir.join("images");
    sluice_ok(&[
        "synth",
        "--output",
        path_str(&images),
        "--classes",
        &classes.to_string(),
        "--per-class",
        &per_class.to_string(),
    ]);
    images
}

/// Shards an image folder with the real binary (`sluice shard`): `max_count` samples per
/// shard into `pattern`, with a manifest when one is named; returns what the command printed.
pub fn shard_images(
    images: &Path,
    pattern: &str,
    max_count: u32,
    manifest: Option<&Path>,
) -> String {
    let max_count = max_count.to_string();
    let mut args = vec![
        "shard",
        "--input",
        path_str(images),
        "--output",
        pattern,
        "--max-count",
        &max_count,
    ];
    if let Some(m) = manifest {
        args.extend(["--manifest", path_str(m)]);
    }
    sluice_ok(&args)
}

/// The `.tar` files directly in `dir`, sorted.
pub fn shard_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("listing shards")
        .map(|e| e.expect("listing shards").path())
        .filter(|p| p.extension().is_some_and(|e| e == "tar"))
        .collect();
    v.sort();
    v
}

/// Sends `sig` (`-STOP`, `-CONT`, `-TERM`, …) to process `pid` with kill(1), asserting that
/// it was delivered.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Resident memory of process `pid`, KiB (0 once it is gone).
pub fn rss_kb(pid: u32) -> u64 {
    status_kb(pid, "VmRSS:")
}

/// A KiB figure of `/proc/<pid>/status` (`field` with its colon: `VmHWM:`, the peak
/// resident memory), 0 once the process is gone.
pub fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The (distinct labels per batch, uniform expectation) figures of a loadgen report's
/// `mixing:` line.
pub fn mixing(report: &str) -> (f64, f64) {
    let line = report
        .lines()
        .find(|l| l.starts_with("mixing:"))
        .unwrap_or_else(|| panic!("no mixing line in:\n{report}"));
    let nums: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (nums[0], nums[1])
}

/// The arguments of `sluice shard` from `input` to shards named by `pattern`, then `rest`.
pub fn shard_job<'a>(input: &'a Path, pattern: &'a Path, rest: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "shard",
        "--input",
        path_str(input),
        "--output",
        path_str(pattern),
    ];
    args.extend_from_slice(rest);
    args
}

/// The arguments of `sluice loadgen` on `manifest` with in-process workers, then `rest`.
pub fn local_job<'a>(manifest: &'a Path, rest: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "loadgen",
        "--dataset",
        path_str(manifest),
        "--workers",
        "local",
    ];
    args.extend_from_slice(rest);
    args
}
