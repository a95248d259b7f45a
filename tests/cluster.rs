//! Sluice across hosts: every daemon on a host of its own (a network namespace, see
//! `tests/netbed`), real faults on the way, exactly-once checked from outside with
//! `--dump-ids`. Storage node loss: three storage nodes with `replicas = 2`, two CPU workers
//! and a client with two ranks; a clean run, then one storage node SIGKILLed mid-run and
//! started again, then another node's link cut mid-run and restored; corruption on a storage
//! host; and CPU workers killed and restarted over and over. Each faulty run must deliver
//! every sample of every epoch once (a sample rotten on every copy: skipped by name, never
//! delivered), and its figures are printed (`bash bench/cluster.sh` collects them). The
//! `#[ignore]`d ones are benchmarks: lossy links, floods, and scaling with nodes.
//!
//! Needs root for the namespaces; skips with a message elsewhere.

mod netbed;
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netbed::Bed;
use support::{eventually, path_str, rss_kb, synth_images};

const TOKEN: &str = "cluster-token-0123456789";
const SAMPLES: usize = 120;
const EPOCHS: usize = 4;

/// Runs `sluice args...` in `host` to completion; (success, stdout, stderr).
fn run_in(bed: &Bed, host: &str, args: &[&str]) -> (bool, String, String) {
    let out = bed
        .command(host, Path::new(env!("CARGO_BIN_EXE_sluice")))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `sluice storage` on host `s{i}`, one of the three owners' cluster.
fn start_storage(bed: &mut Bed, dir: &Path, i: usize) {
    let urls: Vec<String> = (0..3)
        .map(|n| format!("http://{}:7000", bed.host(&format!("s{n}")).addr))
        .collect();
    let data = dir.join(format!("node{i}"));
    std::fs::create_dir_all(data.join("train")).unwrap();
    let config = dir.join(format!("storage{i}.toml"));
    std::fs::write(
        &config,
        format!(
            "listen = \"{}:7000\"\nmountpaths = [\"{}\"]\nupload_tokens = [\"{TOKEN}\"]\n\
             peers = {:?}\nadvertise = \"{}\"\nreplicas = 2\n",
            bed.host(&format!("s{i}")).addr,
            data.display(),
            urls,
            urls[i]
        ),
    )
    .unwrap();
    let log = dir.join(format!(
        "storage{i}-{}.log",
        Instant::now().elapsed().as_nanos()
    ));
    bed.start(
        &format!("s{i}"),
        &format!("storage{i}"),
        &["storage", "--config", path_str(&config)],
        &log,
    );
}

/// `sluice cpu` on host `c{i}`; returns its certificate.
fn start_worker(bed: &mut Bed, dir: &Path, i: usize) -> PathBuf {
    start_worker_as(bed, dir, i, &format!("worker{i}"), None)
}

/// `sluice cpu` on host `c{i}` with its state (certificate) and log under `dir/name`, pinned
/// to one core with `taskset` when given; started as the bed's daemon `worker{i}`.
fn start_worker_as(
    bed: &mut Bed,
    dir: &Path,
    i: usize,
    name: &str,
    core: Option<usize>,
) -> PathBuf {
    let state = dir.join(name);
    let token = dir.join("token");
    let listen = format!("{}:7100", bed.host(&format!("c{i}")).addr);
    let sluice = env!("CARGO_BIN_EXE_sluice");
    let core = core.map(|c| c.to_string());
    let mut args: Vec<&str> = match &core {
        Some(c) => vec!["-c", c, sluice],
        None => Vec::new(),
    };
    args.extend([
        "cpu",
        "--listen",
        &listen,
        "--threads",
        "1",
        "--token-file",
        path_str(&token),
        "--state-dir",
        path_str(&state),
        "--no-same-host",
    ]);
    let program = if core.is_some() { "taskset" } else { sluice };
    bed.start_program(
        &format!("c{i}"),
        &format!("worker{i}"),
        Path::new(program),
        &args,
        &dir.join(format!("{name}.log")),
    );
    state.join("cert.pem")
}

/// What a loadgen run delivered.
struct Delivered {
    secs: f64,
    /// (epoch, shard, key) of every delivered sample; each at most once (checked).
    ids: std::collections::HashSet<(String, String, String)>,
    skipped: u64,
    stdout: String,
    /// The client process's largest resident memory while it ran, KiB.
    client_peak_rss_kb: u64,
}

/// One loadgen run of `epochs` from the client host, consumers taking a batch every
/// `step_ms`; `fault` runs while it goes. Checks that no sample came twice and that
/// delivered + skipped is what was planned.
fn run_epochs(
    bed: &mut Bed,
    dir: &Path,
    name: &str,
    epochs: usize,
    step_ms: u32,
    fault: impl FnOnce(&mut Bed),
) -> Delivered {
    run_epochs_via(bed, dir, name, epochs, step_ms, 7100, &[], fault)
}

/// [`run_epochs`] with the workers reached on `port` of their hosts (a relay's, say) and
/// more loadgen arguments.
#[allow(clippy::too_many_arguments)]
fn run_epochs_via(
    bed: &mut Bed,
    dir: &Path,
    name: &str,
    epochs: usize,
    step_ms: u32,
    port: u16,
    extra: &[&str],
    fault: impl FnOnce(&mut Bed),
) -> Delivered {
    let dump = dir.join(format!("{name}.ids"));
    let report = dir.join(format!("{name}.json"));
    let workers = format!(
        "{}:{port},{}:{port}",
        bed.host("c0").addr,
        bed.host("c1").addr
    );
    let mut loadgen = bed
        .command("g0", Path::new(env!("CARGO_BIN_EXE_sluice")))
        .args([
            "loadgen",
            "--dataset",
            path_str(&dir.join("put.json")),
            "--workers",
            &workers,
            "--ranks",
            "2",
            "--batch-size",
            "8",
            "--epochs",
            &epochs.to_string(),
            "--step-ms",
            &step_ms.to_string(),
            "--token-file",
            path_str(&dir.join("token")),
            "--trust-cert",
            path_str(&dir.join("trust.pem")),
            "--dump-ids",
            path_str(&dump),
            "--json",
            path_str(&report),
        ])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    // The client's resident memory, sampled until it exits.
    let pid = loadgen.id();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kb(pid));
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        })
    };
    fault(bed);
    let status = loadgen.wait().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let client_peak_rss_kb = sampler.join().unwrap_or(0);
    let secs = started.elapsed().as_secs_f64();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    {
        use std::io::Read;
        if let Some(mut o) = loadgen.stdout.take() {
            let _ = o.read_to_string(&mut stdout);
        }
        if let Some(mut e) = loadgen.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
    }
    assert!(status.success(), "{name}: loadgen failed: {stdout}{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let (mut skipped, mut samples) = (0, 0);
    for r in report["ranks"].as_array().unwrap() {
        let (planned, delivered) = (r["planned"].as_u64(), r["delivered"].as_u64());
        let s = r["skipped"].as_u64().unwrap_or(0);
        assert_eq!(planned, delivered.map(|d| d + s), "{name}: {r}");
        skipped += s;
        samples += planned.unwrap_or(0);
    }
    // What the client process itself used, over every sample and after every rank's first
    // epoch (what `bench/host_cost_outside.sh` reports).
    let (whole, later) = (&report["process"], &report["process_after_first_epoch"]);
    assert_eq!(whole["samples"].as_u64(), Some(samples), "{name}: {whole}");
    let cpu =
        |u: &serde_json::Value| u["user_secs"].as_f64().unwrap() + u["sys_secs"].as_f64().unwrap();
    assert!(cpu(whole) > 0.0, "{name}: {whole}");
    if epochs > 1 {
        let n = later["samples"].as_u64().unwrap();
        assert!(n > 0 && n < samples, "{name}: {later}");
        assert!(cpu(later) < cpu(whole), "{name}: {later} within {whole}");
    }
    let mut ids = std::collections::HashSet::new();
    for l in std::fs::read_to_string(&dump).unwrap().lines() {
        let f: Vec<&str> = l.split('\t').collect();
        assert!(
            ids.insert((f[0].to_string(), f[2].to_string(), f[3].to_string())),
            "{name}: delivered twice: {l}"
        );
    }
    Delivered {
        secs,
        ids,
        skipped,
        stdout,
        client_peak_rss_kb,
    }
}

/// A clean run: every sample of every epoch once, none skipped.
fn assert_whole(name: &str, d: &Delivered, epochs: usize) {
    assert_eq!(d.skipped, 0, "{name}: {}", d.stdout);
    assert_eq!(d.ids.len(), epochs * SAMPLES, "{name}: every sample, once");
}

/// Flips one bit inside sample `sample` of the stored shard `path`, keeping the file's
/// modification time (as rot on a disk would): the node still serves it as the object it
/// uploaded. The sample's place comes from the original shard's `.idx` in `out/` (a
/// cluster places the `.idx` by its own name, maybe on other nodes). Returns the byte offset.
fn rot(path: &Path, out: &Path, sample: usize) -> u64 {
    let original = out.join(path.file_name().unwrap());
    let index = sluice_shard::SampleIndex::read_file(
        &sluice_shard::SampleIndex::sidecar_path(&original),
        1 << 20,
    )
    .unwrap();
    let e = &index.entries[sample];
    let at = e.offset + e.len / 2;
    let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x10;
    std::fs::write(path, &bytes).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(mtime).unwrap();
    at
}

/// Distinct (shard, sample) repairs the workers logged.
fn repairs(dir: &Path) -> std::collections::HashSet<String> {
    (0..2)
        .flat_map(|i| {
            std::fs::read_to_string(dir.join(format!("worker{i}.log")))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("was damaged") && l.contains("a replica's copy is good"))
                .filter_map(|l| {
                    let shard = l.split("shard=").nth(1)?.split_whitespace().next()?;
                    let index = l.split("index=").nth(1)?.split_whitespace().next()?;
                    Some(format!("{shard}#{index}"))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The scenarios' cluster: three storage nodes (`s0..s2`, `replicas = 2`) holding the
/// shards `sluice put --manifest` uploaded from the client host `g0` (manifest `put.json`),
/// and two CPU workers (`c0`, `c1`) whose certificates `trust.pem` pins. `None` (after a
/// message) where no test bed can be made.
fn cluster() -> Option<(Bed, tempfile::TempDir)> {
    let mut bed = Bed::new(&["s0", "s1", "s2", "c0", "c1", "g0"])?;
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path();
    std::fs::write(dir.join("token"), format!("{TOKEN}\n")).unwrap();
    let images = synth_images(dir, 4, (SAMPLES / 4) as u32);
    let pattern = format!("{}/out/s-%02d.tar", dir.display());
    support::shard_images(&images, &pattern, 4, None);

    for i in 0..3 {
        start_storage(&mut bed, dir, i);
    }
    // Upload from the client host once the first node answers.
    let to = format!("http://{}:7000/v1/train/", bed.host("s0").addr);
    let shards = format!("{}/out/s-{{00..{:02}}}.tar", dir.display(), SAMPLES / 4 - 1);
    let manifest = dir.join("put.json");
    let token = dir.join("token");
    let put = [
        "put",
        shards.as_str(),
        "--to",
        &to,
        "--token-file",
        path_str(&token),
        "--manifest",
        path_str(&manifest),
    ];
    let mut last = String::new();
    assert!(
        eventually(20, || {
            let (ok, out, err) = run_in(&bed, "g0", &put);
            last = format!("{out}{err}");
            ok
        }),
        "sluice put across hosts: {last}"
    );
    let certs = [
        start_worker(&mut bed, dir, 0),
        start_worker(&mut bed, dir, 1),
    ];
    assert!(
        Bed::pin_certificates(&certs, &dir.join("trust.pem"), 30),
        "workers did not start"
    );
    Some((bed, temp))
}

/// [`cluster`], or the end of the test (after its message) where no test bed can be made.
macro_rules! cluster_or_skip {
    () => {
        match cluster() {
            Some(c) => c,
            None => return,
        }
    };
}

#[test]
fn storage_node_loss_across_hosts_costs_no_sample() {
    let (mut bed, temp) = cluster_or_skip!();
    let dir = temp.path();
    let clean = run_epochs(&mut bed, dir, "clean", EPOCHS, 60, |_| {});
    assert_whole("clean", &clean, EPOCHS);
    let killed = run_epochs(&mut bed, dir, "kill9", EPOCHS, 60, |bed| {
        std::thread::sleep(Duration::from_millis(700));
        bed.kill9("storage1");
        std::thread::sleep(Duration::from_millis(1500));
        start_storage(bed, dir, 1);
    });
    assert_whole("kill9", &killed, EPOCHS);
    let cut = run_epochs(&mut bed, dir, "cut", EPOCHS, 60, |bed| {
        std::thread::sleep(Duration::from_millis(700));
        bed.link("s2", false);
        std::thread::sleep(Duration::from_millis(2000));
        bed.link("s2", true);
    });
    assert_whole("cut", &cut, EPOCHS);
    let (clean, killed, cut) = (clean.secs, killed.secs, cut.secs);
    println!(
        "cluster storage-loss: clean {clean:.1}s; node SIGKILLed and restarted: {killed:.1}s (stall {:.1}s); link cut 2s: {cut:.1}s (stall {:.1}s); 0 lost, 0 repeated, 0 skipped",
        (killed - clean).max(0.0),
        (cut - clean).max(0.0)
    );
}

#[test]
fn a_flipped_bit_on_a_storage_host_is_detected_and_read_from_the_other_owner() {
    let (mut bed, temp) = cluster_or_skip!();
    let dir = temp.path();
    // Corruption: one bit flipped in 20 samples of shards read from node 0 first, each
    // detected by its checksum and read from the other owner; then one sample rotten on both owners,
    // reported skipped by shard and offset, never delivered.
    let manifest = sluice_shard::Manifest::load(&dir.join("put.json"), 1 << 20).unwrap();
    // Shards whose first owner (where workers read first) is node 0.
    let node0 = format!("http://{}:7000/", bed.host("s0").addr);
    let on_node0: Vec<String> = manifest
        .shards
        .iter()
        .filter(|s| s.url.starts_with(&node0))
        .map(|s| s.name().to_string())
        .collect();
    assert!(
        on_node0.len() >= 5,
        "node 0 comes first for {} shards",
        on_node0.len()
    );
    let mut flipped = Vec::new();
    for k in 0..20 {
        let shard = &on_node0[k % on_node0.len()];
        let sample = k / on_node0.len();
        rot(
            &dir.join("node0/train").join(shard),
            &dir.join("out"),
            sample,
        );
        flipped.push(format!("{shard}#{sample}"));
    }
    let rotten = run_epochs(&mut bed, dir, "rot20", 1, 60, |_| {});
    assert_whole("rot20", &rotten, 1);
    let repaired = repairs(dir);
    let detected = flipped.iter().filter(|f| repaired.contains(*f)).count();
    assert_eq!(detected, 20, "flips detected and repaired: {repaired:?}");

    let (shard, other) = {
        let s = manifest
            .shards
            .iter()
            .find(|s| s.name() == on_node0[0])
            .unwrap();
        let other = s
            .urls()
            .iter()
            .map(|u| {
                u.split("//")
                    .nth(1)
                    .unwrap_or("")
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .map(|ip| (0..3).find(|n| bed.host(&format!("s{n}")).addr.to_string() == ip))
            .find(|n| *n != Some(0))
            .flatten()
            .unwrap();
        (s.name().to_string(), other)
    };
    let offset = rot(
        &dir.join(format!("node{other}/train")).join(&shard),
        &dir.join("out"),
        0,
    );
    let both = run_epochs(&mut bed, dir, "rot-both", 1, 60, |_| {});
    assert_eq!(both.skipped, 1, "{}", both.stdout);
    assert_eq!(both.ids.len(), SAMPLES - 1);
    assert!(
        both.stdout.contains(&shard) && both.stdout.contains("at byte"),
        "the skip names the shard and the offset: {}",
        both.stdout
    );
    println!(
        "cluster corruption: 20 of 20 bit flips detected and read from the other owner; a sample rotten on both owners ({shard}, byte {offset}) reported skipped, never delivered"
    );
}

#[test]
fn worker_churn_across_hosts_loses_and_repeats_nothing() {
    let (mut bed, temp) = cluster_or_skip!();
    let dir = temp.path();
    // Kill a worker (SIGKILL) every 400 ms and start it again 250 ms later, alternating
    // between the two; the fourth round drains one first (SIGTERM) and kills it mid-drain.
    // Resident memory of every worker is sampled throughout.
    let epochs = 12;
    let mut kills = 0;
    let mut peak_rss_kb = 0;
    let run = run_epochs(&mut bed, dir, "churn", epochs, 100, |bed| {
        for round in 0..12 {
            std::thread::sleep(Duration::from_millis(400));
            let i = round % 2;
            let tag = format!("worker{i}");
            peak_rss_kb = peak_rss_kb
                .max(bed.rss_kb("worker0"))
                .max(bed.rss_kb("worker1"));
            if round == 3 {
                bed.sigterm(&tag);
                std::thread::sleep(Duration::from_millis(150));
            }
            bed.kill9(&tag);
            kills += 1;
            std::thread::sleep(Duration::from_millis(250));
            start_worker(bed, dir, i);
        }
    });
    assert_whole("churn", &run, epochs);
    assert!(kills >= 10);
    assert!(
        peak_rss_kb < 512 * 1024,
        "a worker or storage node grew to {peak_rss_kb} KiB under churn"
    );
    assert!(
        run.client_peak_rss_kb < 1024 * 1024,
        "the client grew to {} KiB under churn",
        run.client_peak_rss_kb
    );
    println!(
        "cluster worker-churn: {kills} worker kills (one mid-drain) over {epochs} epochs in {:.1}s: 0 lost, 0 repeated, 0 skipped; peak resident memory: workers and storage nodes {} MiB, client {} MiB",
        run.secs,
        peak_rss_kb / 1024,
        run.client_peak_rss_kb / 1024
    );
}

#[test]
#[ignore = "a benchmark (1,000 connections held 10 s): bash bench/cluster.sh runs it"]
fn slow_clients_and_garbage_datagrams_do_not_stop_an_epoch() {
    let (mut bed, temp) = cluster_or_skip!();
    let dir = temp.path();
    // 1,000 connections that send half a request head and stall, against the node workers
    // read from first for a third of the shards, and 20,000 random datagrams at a worker's
    // QUIC port; an epoch runs meanwhile. The node's header-read timeout is its default, 10 s.
    let header_timeout = 10.0;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/netbed/flood.py");
    let (s0, c0) = (
        bed.host("s0").addr.to_string(),
        bed.host("c0").addr.to_string(),
    );
    let out = dir.join("flood.out");
    bed.start_program(
        "g0",
        "flood",
        Path::new("python3"),
        &[
            path_str(&script),
            &s0,
            "7000",
            "1000",
            &c0,
            "7100",
            "20000",
            &(header_timeout * 2.0 + 10.0).to_string(),
        ],
        &out,
    );
    std::thread::sleep(Duration::from_millis(1500));
    let run = run_epochs(&mut bed, dir, "flood", EPOCHS, 60, |_| {});
    assert_whole("flood", &run, EPOCHS);
    assert!(bed.wait("flood", 60), "the flood script did not finish");
    let text = std::fs::read_to_string(&out).unwrap();
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("{text}"));
    let flood: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(
        flood["closed"], flood["opened"],
        "every slow connection closed: {flood}"
    );
    let slowest = flood["slowest_close_s"].as_f64().unwrap();
    assert!(
        slowest <= header_timeout + 3.0,
        "slow connections were closed after {slowest:.1}s (timeout {header_timeout}s)"
    );
    println!(
        "cluster floods: 1000 slow connections to a storage node and 20000 garbage datagrams to a worker during {EPOCHS} epochs ({:.1}s): 0 lost, 0 repeated, 0 skipped; every slow connection closed, the slowest after {slowest:.1}s (header timeout {header_timeout}s)",
        run.secs
    );
}

/// Runs `iptables args...` in `host`.
fn iptables(bed: &Bed, host: &str, args: &[&str]) {
    let mut all = vec!["iptables"];
    all.extend_from_slice(args);
    if let Err(e) = bed.exec(host, &all) {
        panic!("{e}");
    }
}

/// A seeded UDP relay on each worker host, port 7101 to the worker's 7100, that delays every
/// datagram 50 ms each way and holds `reorder_percent` of them longer.
fn start_relays(bed: &mut Bed, dir: &Path, reorder_percent: u32) {
    let relay = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/netbed/relay.py");
    let reorder = reorder_percent.to_string();
    for (i, seed) in [(0, "1"), (1, "2")] {
        let host = format!("c{i}");
        let addr = bed.host(&host).addr.to_string();
        bed.start_program(
            &host,
            &format!("relay{i}"),
            Path::new("python3"),
            &[
                path_str(&relay),
                &addr,
                "7101",
                &addr,
                "7100",
                "50",
                &reorder,
                seed,
            ],
            &dir.join(format!("relay{i}.log")),
        );
    }
    std::thread::sleep(Duration::from_millis(500));
}

#[test]
#[ignore = "a benchmark (about a minute): bash bench/cluster.sh runs it"]
fn quic_over_lossy_slow_links_and_a_blackhole_keeps_every_sample() {
    let (mut bed, temp) = cluster_or_skip!();
    let dir = temp.path();
    if std::process::Command::new("iptables")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: iptables is not installed (the loss is its statistic match)");
        return;
    }
    // Smaller tensors keep the Python relay (50 ms each way, 1% reordered) off the critical
    // path; the clean run uses the same.
    let small = ["--pipeline", "decode | random_resized_crop 64"];
    let clean = run_epochs_via(&mut bed, dir, "quic-clean", EPOCHS, 0, 7100, &small, |_| {});
    assert_whole("quic-clean", &clean, EPOCHS);
    start_relays(&mut bed, dir, 1);
    // 5% of UDP datagrams lost both ways on the client's host (iptables' statistic match).
    for chain in ["INPUT", "OUTPUT"] {
        iptables(
            &bed,
            "g0",
            &[
                "-A",
                chain,
                "-p",
                "udp",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                "0.05",
                "-j",
                "DROP",
            ],
        );
    }
    let lossy = run_epochs_via(&mut bed, dir, "quic-lossy", EPOCHS, 0, 7101, &small, |_| {});
    assert_whole("quic-lossy", &lossy, EPOCHS);
    iptables(&bed, "g0", &["-F"]);
    // A 5-second blackhole between client and workers, then the link back.
    let dark = run_epochs_via(
        &mut bed,
        dir,
        "quic-blackhole",
        EPOCHS,
        60,
        7101,
        &small,
        |bed| {
            std::thread::sleep(Duration::from_millis(700));
            iptables(bed, "g0", &["-A", "INPUT", "-p", "udp", "-j", "DROP"]);
            iptables(bed, "g0", &["-A", "OUTPUT", "-p", "udp", "-j", "DROP"]);
            std::thread::sleep(Duration::from_secs(5));
            iptables(bed, "g0", &["-F"]);
        },
    );
    assert_whole("quic-blackhole", &dark, EPOCHS);
    let rate = |d: &Delivered| (EPOCHS * SAMPLES) as f64 / d.secs;
    println!(
        "cluster lossy-links: clean {:.0} samples/s; 5% loss + 50 ms delay + 1% reordering {:.0} samples/s ({:.2} of clean); a 5 s blackhole mid-run: done in {:.1}s; 0 lost, 0 repeated, 0 skipped",
        rate(&clean),
        rate(&lossy),
        rate(&lossy) / rate(&clean),
        dark.secs
    );
}

#[test]
#[ignore = "a benchmark (about 30 s): bash bench/cluster.sh runs it"]
fn the_next_epoch_started_early_hides_a_slow_links_epoch_boundaries() {
    let (mut bed, temp) = cluster_or_skip!();
    let dir = temp.path();
    // Workers reached through relays that delay every datagram 50 ms each way: each epoch's
    // start (handshake, job, first units and samples) costs round trips.
    start_relays(&mut bed, dir, 0);
    const MANY: usize = 8;
    const PORT: u16 = 7101; // the relays'
    let small = ["--pipeline", "decode | random_resized_crop 64"];
    let late = [&small[..], &["--no-prefetch-next-epoch"]].concat();
    let asked = run_epochs_via(&mut bed, dir, "epochs-asked", MANY, 0, PORT, &late, |_| {});
    assert_whole("epochs-asked", &asked, MANY);
    let early = run_epochs_via(&mut bed, dir, "epochs-early", MANY, 0, PORT, &small, |_| {});
    assert_whole("epochs-early", &early, MANY);
    let rate = |d: &Delivered| (MANY * SAMPLES) as f64 / d.secs;
    println!(
        "cluster epoch-boundaries: {MANY} epochs of {SAMPLES} samples over 50 ms links: each epoch started when asked {:.0} samples/s, the next started early {:.0} samples/s ({:.2}x); 0 lost, 0 repeated",
        rate(&asked),
        rate(&early),
        rate(&early) / rate(&asked)
    );
}

/// A bed of hosts `{prefix}0..{prefix}{n-1}` and `others`.
fn bed_of(prefix: &str, n: usize, others: &[&str]) -> Option<Bed> {
    let mut names: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    names.extend(others.iter().map(|o| o.to_string()));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    Bed::new(&refs)
}

/// A standalone storage node on `host` serving `data` (no peers), its egress capped.
fn start_plain_storage(bed: &mut Bed, dir: &Path, host: &str, data: &Path, cap: Option<&str>) {
    let config = dir.join(format!("{host}.toml"));
    std::fs::write(
        &config,
        format!(
            "listen = \"{}:7000\"\nmountpaths = [\"{}\"]\n",
            bed.host(host).addr,
            data.display()
        ),
    )
    .unwrap();
    bed.start(
        host,
        host,
        &["storage", "--config", path_str(&config)],
        &dir.join(format!("{host}.log")),
    );
    if let Some(rate) = cap {
        bed.cap(host, rate);
    }
}

/// The JSON line a helper script printed last into `out`.
fn last_json(out: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(out).unwrap();
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no result in {}: {text}", out.display()));
    serde_json::from_str(line).unwrap()
}

#[test]
#[ignore = "a benchmark: bash bench/cluster.sh runs it"]
fn throughput_grows_with_storage_nodes_and_with_workers() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path();
    let images = synth_images(dir, 4, 60);
    let data = dir.join("data");
    support::shard_images(
        &images,
        &format!("{}/train/s-%03d.tar", data.display()),
        10,
        None,
    );
    let shards: Vec<String> = support::shard_files(&data.join("train"))
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();

    // Storage: whole-shard reads by 16 readers, each node's link capped at 200 Mbit/s.
    let readers = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/netbed/readers.py");
    let mut storage = Vec::new();
    for nodes in [1usize, 2, 4] {
        let Some(mut bed) = bed_of("s", nodes, &["r0"]) else {
            return;
        };
        for i in 0..nodes {
            start_plain_storage(&mut bed, dir, &format!("s{i}"), &data, Some("200mbit"));
        }
        std::thread::sleep(Duration::from_millis(1000));
        let urls: Vec<String> = shards
            .iter()
            .enumerate()
            .map(|(j, name)| {
                format!(
                    "http://{}:7000/v1/train/{name}",
                    bed.host(&format!("s{}", j % nodes)).addr
                )
            })
            .collect();
        let out = dir.join(format!("readers{nodes}.out"));
        let mut args = vec![path_str(&readers).to_string(), "4".into(), "16".into()];
        args.extend(urls);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        bed.start_program("r0", "readers", Path::new("python3"), &args, &out);
        assert!(bed.wait("readers", 60), "the readers did not finish");
        storage.push((nodes, last_json(&out)["bytes_per_s"].as_f64().unwrap()));
    }
    let one = storage[0].1;
    let line: Vec<String> = storage
        .iter()
        .map(|(n, b)| {
            format!(
                "{n} node{}: {:.1} MB/s ({:.0}% of linear)",
                if *n == 1 { "" } else { "s" },
                b / 1e6,
                b / (one * *n as f64) * 100.0
            )
        })
        .collect();
    println!(
        "cluster storage-scaling (200 Mbit/s per node, 16 readers): {}",
        line.join(", ")
    );

    // The chain: 1, 2, 3 worker hosts, each worker pinned to one core, against the CPU
    // engine alone on as many threads (on this machine's cores).
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut chain = Vec::new();
    for workers in [1usize, 2, 3] {
        let Some(mut bed) = bed_of("c", workers, &["s0", "g0"]) else {
            return;
        };
        start_plain_storage(&mut bed, dir, "s0", &data, None);
        std::fs::write(dir.join("token"), format!("{TOKEN}\n")).unwrap();
        let certs: Vec<PathBuf> = (0..workers)
            .map(|i| {
                let name = format!("scale{workers}-worker{i}");
                start_worker_as(&mut bed, dir, i, &name, Some(i % cores))
            })
            .collect();
        assert!(Bed::pin_certificates(&certs, &dir.join("trust.pem"), 30));
        let s0 = bed.host("s0").addr;
        let dataset = format!(
            "http://{s0}:7000/v1/train/s-{{000..{:03}}}.tar",
            shards.len() - 1
        );
        let workers_arg: Vec<String> = (0..workers)
            .map(|i| format!("{}:7100", bed.host(&format!("c{i}")).addr))
            .collect();
        let started = Instant::now();
        let (ok, out, err) = run_in(
            &bed,
            "g0",
            &[
                "loadgen",
                "--dataset",
                &dataset,
                "--workers",
                &workers_arg.join(","),
                "--ranks",
                "2",
                "--batch-size",
                "16",
                "--epochs",
                "2",
                "--token-file",
                path_str(&dir.join("token")),
                "--trust-cert",
                path_str(&dir.join("trust.pem")),
            ],
        );
        assert!(ok, "{workers} workers: {out}{err}");
        chain.push((
            workers,
            (2 * shards.len() * 10) as f64 / started.elapsed().as_secs_f64(),
        ));
    }
    let bench = support::sluice_ok(&[
        "bench",
        "cpu",
        "--images",
        path_str(&images),
        "--threads",
        "1,2,3",
        "--seconds",
        "3",
    ]);
    let alone: Vec<f64> = bench
        .lines()
        .filter(|l| l.starts_with("cpu\t"))
        .filter_map(|l| {
            l.split('\t')
                .nth(2)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    let line: Vec<String> = chain
        .iter()
        .zip(&alone)
        .map(|((w, rate), engine)| {
            format!(
                "{w} worker{}: {rate:.0} samples/s ({:.2} of the engine alone on {w} thread{})",
                if *w == 1 { "" } else { "s" },
                rate / engine,
                if *w == 1 { "" } else { "s" }
            )
        })
        .collect();
    println!(
        "cluster chain-scaling ({cores} cores; each worker pinned to one, the client and storage share them): {}",
        line.join(", ")
    );
}
