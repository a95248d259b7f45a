//! The three tiers started for real on loopback: an in-process storage node serving shards
//! over HTTP, `sluice cpu` processes (the real binary, so they can be killed), and clients.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_plan::{PlanConfig, ShufflePolicy};
use sluice_shard::{Manifest, ReadOptions, SampleReader};
use sluice_storage::StorageConfig;
use tokio_util::sync::CancellationToken;

use crate::support::{path_str, sluice_ok};

pub const TOKEN: &str = "system-test-cluster-token-42";

/// A `sluice cpu` process.
pub struct Worker {
    pub child: Child,
    pub addr: String,
    pub metrics: String,
    pub state: PathBuf,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Worker {
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Whether the log shows `needle` within `wait`: a thread reads the worker's stderr, so a
    /// line the worker wrote may reach the test a moment after what it sent on a socket.
    pub fn log_shows(&self, needle: &str, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        while !self.log_contains(needle) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    pub fn rss_kb(&self) -> u64 {
        rss_kb(self.child.id())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub use crate::support::rss_kb;

fn field(line: &str, key: &str) -> Option<String> {
    let at = line.find(key)? + key.len();
    Some(
        line[at..]
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != ')')
            .collect(),
    )
}

/// Starts `sluice cpu` on ports chosen by the kernel, with the test token and its own state
/// directory (so its own self-signed certificate), serving QUIC only.
/// A worker's Prometheus text, from its `/metrics`.
pub fn metrics_text(worker: &Worker) -> String {
    scrape(&worker.metrics)
}

/// The value of the series `series` (`name` or `name{labels}`, as written) in the
/// Prometheus `text`.
pub fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(series))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
}

/// The value of the series `series` on `worker`'s `/metrics`.
pub fn metric(worker: &Worker, series: &str) -> Option<f64> {
    series_value(&metrics_text(worker), series)
}

/// `GET /metrics` from `addr`: the whole response.
pub fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

pub fn start_worker(dir: &Path, name: &str) -> Worker {
    start_worker_with(dir, name, &["--no-same-host"])
}

/// [`start_worker`] with more arguments (`--same-host-dir DIR` to serve same-host clients).
pub fn start_worker_with(dir: &Path, name: &str, extra: &[&str]) -> Worker {
    let state = dir.join(name);
    let token = dir.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    // A worker of tenants takes their tokens instead of the cluster token.
    let auth: &[&str] = match extra.contains(&"--tenants") {
        true => &[],
        false => &["--token-file", path_str(&token)],
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "cpu",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--state-dir",
            path_str(&state),
        ])
        .args(auth)
        .args(extra)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let lines = log.clone();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("sluice cpu serving") {
                if let (Some(addr), Some(metrics), Some(tx)) = (
                    field(&line, "listen="),
                    field(&line, "metrics=Some("),
                    tx.take(),
                ) {
                    let _ = tx.send((addr, metrics));
                }
            }
            lines.lock().unwrap().push(line);
        }
    });
    let (addr, metrics) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("sluice cpu did not log its address");
    Worker {
        child,
        addr,
        metrics,
        state,
        log,
    }
}

/// A pipeline and batch size for jobs whose tensors do not matter: small and quick.
pub const SMALL_BATCHES: [&str; 4] = [
    "--pipeline",
    "decode | random_resized_crop 32",
    "--batch-size",
    "8",
];

/// `sluice loadgen` on the dataset `manifest`, its workers given by `pool` (`--workers ADDR`,
/// `--workers-file FILE`, ...), over QUIC with `token_file` and the certificates in `trust`:
/// what every test's job shares. Add the pipeline, batch size, epochs and the rest.
pub fn loadgen(manifest: &Path, pool: &[&str], token_file: &Path, trust: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.args(["loadgen", "--dataset", path_str(manifest)])
        .args(pool)
        .args(["--token-file", path_str(token_file)])
        .args(["--trust-cert", path_str(trust), "--same-host", "off"]);
    c
}

/// Runs `sluice` with `args` and, once `victim` got its job and about `after` has passed,
/// kills it (SIGKILL) mid-run; fails the test, with `name` and the stderr, unless the run
/// succeeds. Returns its stdout.
pub fn run_killing(
    name: &str,
    args: &[String],
    victim: Option<&mut Worker>,
    after: Duration,
) -> String {
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(w) = victim {
        let started = Instant::now();
        assert!(
            w.log_shows("job", Duration::from_secs(30)),
            "worker never got the job"
        );
        std::thread::sleep(after.saturating_sub(started.elapsed()));
        w.kill9();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A PEM file pinning every given worker's certificate.
pub fn trust_file(dir: &Path, workers: &[&Worker]) -> PathBuf {
    let mut pem = String::new();
    for w in workers {
        pem.push_str(&std::fs::read_to_string(w.state.join("cert.pem")).unwrap());
    }
    let path = dir.join("trust.pem");
    std::fs::write(&path, pem).unwrap();
    path
}

/// An in-process storage node serving `root` (one bucket per subfolder).
pub struct Storage {
    pub url: String,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Storage {
    /// Stops the node (as a crash would, for readers: new connections are refused).
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

/// Serves one node of `config` on `listener` in this process, on a runtime of its own.
pub fn run_storage(listener: std::net::TcpListener, config: StorageConfig) -> Storage {
    let url = format!("http://{}", listener.local_addr().unwrap());
    config.validate().unwrap();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            listener.set_nonblocking(true).unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            sluice_storage::run(listener, config, sluice_daemon::metrics_handle(), token)
                .await
                .unwrap();
        });
    });
    Storage {
        url,
        stop,
        thread: Some(thread),
    }
}

/// A single storage node serving `root` (one bucket per subfolder).
pub fn start_storage(root: &Path) -> Storage {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = StorageConfig {
        mountpaths: vec![root.to_path_buf()],
        ..StorageConfig::default()
    };
    run_storage(listener, config)
}

/// A dataset served by a storage node: the 804 real ImageNet JPEGs when `../shared` is
/// here, else 400 generated ones; shards of `per_shard` samples in bucket `train`.
pub struct Dataset {
    pub storage: Storage,
    pub manifest: Manifest,
    pub manifest_path: PathBuf,
    /// Keys of each shard's samples, by shard index.
    pub keys: Vec<Vec<String>>,
}

pub fn dataset(dir: &Path, per_shard: u32) -> Dataset {
    let bucket = dir.join("data").join("train");
    std::fs::create_dir_all(&bucket).unwrap();
    crate::support::shard_sample_images(dir, &bucket.join("train-%06d.tar"), per_shard);
    let storage = start_storage(&dir.join("data"));
    let shards = crate::support::shard_files(&bucket);
    let last = shards.len() - 1;
    let manifest_path = dir.join("manifest.json");
    sluice_ok(&[
        "index",
        &format!("{}/v1/train/train-{{000000..{last:06}}}.tar", storage.url),
        "--output",
        path_str(&manifest_path),
    ]);
    let manifest = Manifest::load(&manifest_path, 1 << 30).unwrap();
    let keys = shards
        .iter()
        .map(|p| {
            SampleReader::new(
                std::fs::File::open(p).unwrap(),
                path_str(p),
                &ReadOptions::default(),
            )
            .map(|s| s.unwrap().key)
            .collect()
        })
        .collect();
    Dataset {
        storage,
        manifest,
        manifest_path,
        keys,
    }
}

/// The multiset of (shard, index) a rank is planned in an epoch, from the planner alone.
pub fn planned(
    manifest: &Manifest,
    seed: u64,
    world_size: u32,
    rank: u32,
    epoch: u64,
) -> HashMap<(u32, u64), i64> {
    let config = PlanConfig::new(seed, world_size, ShufflePolicy::Global);
    let mut m = HashMap::new();
    for u in sluice_plan::plan(manifest, &config, epoch, rank).unwrap() {
        for i in u.start..u.end {
            *m.entry((u.shard, i)).or_insert(0) += 1;
        }
    }
    m
}

/// Compares what arrived with the plan; the message lists missing and repeated samples
/// separately.
pub fn assert_exactly_once(
    what: &str,
    mut plan: HashMap<(u32, u64), i64>,
    arrived: impl IntoIterator<Item = (u32, u64)>,
) {
    for id in arrived {
        *plan.entry(id).or_insert(0) -= 1;
    }
    let mut missing: Vec<_> = plan
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, _)| *k)
        .collect();
    let mut repeated: Vec<_> = plan
        .iter()
        .filter(|(_, n)| **n < 0)
        .map(|(k, _)| *k)
        .collect();
    missing.sort();
    repeated.sort();
    assert!(
        missing.is_empty() && repeated.is_empty(),
        "{what}: {} missing {:?}…, {} repeated or unplanned {:?}…",
        missing.len(),
        &missing[..missing.len().min(5)],
        repeated.len(),
        &repeated[..repeated.len().min(5)]
    );
}

/// What most cluster tests start from: a temporary directory, a [`dataset`] of `per_shard`
/// samples a shard, a worker for each of `names` (started in that order) and a trust file
/// pinning their certificates.
pub fn bed<const N: usize>(
    per_shard: u32,
    names: [&str; N],
) -> (tempfile::TempDir, Dataset, [Worker; N], PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), per_shard);
    let workers = names.map(|name| start_worker(dir.path(), name));
    let trust = trust_file(dir.path(), &workers.iter().collect::<Vec<_>>());
    (dir, data, workers, trust)
}

/// A job that runs epoch after epoch, built from `builder` (seed 3, one rank), each epoch
/// checked exactly once against its plan, until `stop` is set and then two more: what a test
/// keeps running while it changes the world under it (rotated tokens or certificates).
/// Returns the epochs it ran; panics, naming the epoch, on any error.
pub fn epochs_until(
    builder: sluice_client::LoaderBuilder,
    manifest: Manifest,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let l = builder.seed(3).build().unwrap();
        let (mut epoch, mut after) = (0, 0);
        while after < 2 {
            if stop.load(std::sync::atomic::Ordering::SeqCst) {
                after += 1;
            }
            let mut got = Vec::new();
            for batch in l.epoch(epoch).unwrap() {
                let batch = batch.unwrap_or_else(|e| panic!("epoch {epoch}: {e}"));
                got.extend(batch.ids().iter().map(|id| (id.shard, id.index)));
            }
            assert_exactly_once(
                &format!("the running job's epoch {epoch}"),
                planned(&manifest, 3, 1, 0, epoch),
                got,
            );
            epoch += 1;
        }
        epoch
    })
}
